"""Signed envelopes (SPEC.md, "Envelopes"): the exact signed bytes plus signatures.

An envelope is canonical JSON ``{"payload": base64(signed bytes), "signatures": [...]}``
with signatures sorted by key id, one per key. Verification reads the payload bytes as
received; nothing is re-encoded before a signature is checked.

Two tiers, as in python-tuf: ``check_signatures`` returns a report and never raises;
``require_signatures`` raises ProtoError naming the first rule broken.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Final

import msgspec
from msgspec import Meta, Struct

from proto import limits
from proto.canonical import canonical_json, decode_kind_payload, signed_bytes
from proto.errors import ProtoError
from proto.keys import SigningKey, verify
from proto.reasons import Reason
from proto.records import Record


class Signature(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One Ed25519 signature over the payload, with the key id of its signer."""

    keyid: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}$(?!\n)")]
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]


class Envelope(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """The wire form of every signed record."""

    payload: Annotated[bytes, Meta(min_length=1, max_length=limits.MAX_PAYLOAD_BYTES)]
    signatures: Annotated[list[Signature], Meta(max_length=limits.MAX_SIGNATURES)]


_ENVELOPE_DECODER: Final = msgspec.json.Decoder(Envelope)


# ``decode_envelope``'s common case without msgspec's pattern check of ``keyid`` (a
# ``re.Pattern.search`` call from C, ~0.5 us per envelope): the same shape
# without that pattern, then the pattern by hand (``proto.canonical``'s usage fast path
# explains the idea; tests/test_fuzz_decoders.py checks both paths agree).
class _LooseSignature(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    keyid: str
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]


class _LooseEnvelope(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    payload: Annotated[bytes, Meta(min_length=1, max_length=limits.MAX_PAYLOAD_BYTES)]
    signatures: Annotated[list[_LooseSignature], Meta(max_length=limits.MAX_SIGNATURES)]


_LOOSE_ENVELOPE_DECODER: Final = msgspec.json.Decoder(_LooseEnvelope)
_IS_KEYID: Final = re.compile(r"[0-9a-f]{16}").fullmatch


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256, the form of every hash in records."""
    return hashlib.sha256(data).hexdigest()


class Opened(Struct, frozen=True, gc=False):
    """An envelope that decoded and whose payload is canonical. Signatures not yet checked.

    ``input_hash`` identifies the input (SHA-256 of the envelope bytes as received);
    ``record_hash`` identifies the record (SHA-256 of the signed payload bytes) and is
    what ``prev`` links point to. (A frozen Struct, not a frozen dataclass: one is built
    per input, and a frozen dataclass sets each field through ``object.__setattr__``.)
    """

    raw: bytes
    envelope: Envelope
    record: Record
    kind: str
    input_hash: str
    record_hash: str

    @property
    def payload(self) -> bytes:
        """The signed bytes."""
        return self.envelope.payload


def encode_envelope(envelope: Envelope) -> bytes:
    """Canonical envelope bytes."""
    return canonical_json(envelope)


def seal(record: Record, keys: Iterable[SigningKey]) -> bytes:
    """Sign ``record`` with every key and return the canonical envelope bytes."""
    payload = signed_bytes(record)
    return encode_envelope(sign_payload(payload, keys))


def sign_payload(payload: bytes, keys: Iterable[SigningKey]) -> Envelope:
    """An envelope over existing signed bytes, signed by ``keys``."""
    return add_signatures(Envelope(payload=payload, signatures=[]), keys)


def add_signatures(envelope: Envelope, keys: Iterable[SigningKey]) -> Envelope:
    """The envelope with one more signature per key; a key that already signed is replaced."""
    by_id = {s.keyid: s for s in envelope.signatures}
    for key in keys:
        by_id[key.key_id] = Signature(keyid=key.key_id, sig=key.sign(envelope.payload))
    return Envelope(payload=envelope.payload, signatures=[by_id[k] for k in sorted(by_id)])


def decode_envelope(raw: bytes) -> Envelope:
    """Decode envelope bytes, strictly: size, schema, canonical form, signature order."""
    if len(raw) > limits.MAX_ENVELOPE_BYTES:
        raise ProtoError(
            Reason.OVERSIZE, f"envelope is {len(raw)} bytes, limit {limits.MAX_ENVELOPE_BYTES}"
        )
    fast = decode_envelope_fast(raw)
    if fast is not None:
        return fast
    try:
        envelope = _ENVELOPE_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "unknown field" in message:
            raise ProtoError(Reason.UNKNOWN_FIELD, f"envelope: {exc}") from exc
        if "got `float`" in message:
            raise ProtoError(Reason.FLOAT, f"envelope: {exc}") from exc
        if "$.payload" in message and "length <=" in message:
            raise ProtoError(Reason.OVERSIZE, f"envelope: {exc}") from exc
        if "length" in message:
            raise ProtoError(Reason.OUT_OF_RANGE, f"envelope: {exc}") from exc
        raise ProtoError(Reason.MALFORMED, f"envelope: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ProtoError(Reason.MALFORMED, f"envelope: {exc}") from exc
    signatures = envelope.signatures
    if len(signatures) > 1:
        keyids = [s.keyid for s in signatures]
        if len(set(keyids)) != len(keyids):
            raise ProtoError(Reason.SIG_DUPLICATE, "envelope: a key id signs twice")
        if keyids != sorted(keyids):
            raise ProtoError(Reason.NON_CANONICAL, "envelope: bytes differ from canonical form")
    if canonical_json(envelope) != raw:
        raise ProtoError(Reason.NON_CANONICAL, "envelope: bytes differ from canonical form")
    return envelope


def decode_envelope_fast(raw: bytes) -> Envelope | None:
    """``decode_envelope`` of bytes within MAX_ENVELOPE_BYTES, for the common case: the
    envelope when it decodes, is canonical and has at most one signature (so no order or
    duplicate to check); None otherwise (``decode_envelope`` then names the reason).
    Decoded without msgspec's pattern check of ``keyid``, then checked by hand."""
    try:
        loose = _LOOSE_ENVELOPE_DECODER.decode(raw)
    except Exception:  # whatever it is, the strict decoder names it
        return None
    signatures = loose.signatures
    if len(signatures) > 1 or canonical_json(loose) != raw:
        return None
    if not signatures:
        return Envelope(loose.payload, [])
    signature = signatures[0]
    if _IS_KEYID(signature.keyid) is None:
        return None
    return Envelope(loose.payload, [Signature(signature.keyid, signature.sig)])


def open_envelope(raw: bytes) -> Opened:
    """Decode an envelope and its payload. Raises ProtoError; signatures are not checked."""
    envelope = decode_envelope(raw)
    payload = envelope.payload
    kind, record = decode_kind_payload(payload)
    sha256 = hashlib.sha256
    return Opened(raw, envelope, record, kind, sha256(raw).hexdigest(), sha256(payload).hexdigest())


@dataclass(slots=True)
class SignatureReport:
    """Who signed validly, who is missing, who signed but was not asked, who signed badly."""

    valid: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not (self.invalid or self.missing or self.unexpected)

    def failure(self) -> ProtoError | None:
        """The error ``require_signatures`` raises for this report, or None when it passes."""
        if self.invalid:
            return ProtoError(Reason.SIG_INVALID, f"bad signature by key {self.invalid[0]}")
        if self.unexpected:
            return ProtoError(Reason.SIG_SURPLUS, f"unexpected signer {self.unexpected[0]}")
        if self.missing:
            signed = len(self.valid)
            wanted = signed + len(self.missing)
            return ProtoError(
                Reason.SIG_MISSING,
                f"signed by {signed}/{wanted} required keys; missing {', '.join(self.missing)}",
            )
        return None


def check_signatures(envelope: Envelope, required: Mapping[str, bytes]) -> SignatureReport:
    """Check every signature against ``required`` (key id -> public key). Never raises."""
    report = SignatureReport()
    for signature in envelope.signatures:
        public_key = required.get(signature.keyid)
        if public_key is None:
            report.unexpected.append(signature.keyid)
        elif verify(public_key, envelope.payload, signature.sig):
            report.valid.append(signature.keyid)
        else:
            report.invalid.append(signature.keyid)
    present = {s.keyid for s in envelope.signatures}
    report.missing = [keyid for keyid in required if keyid not in present]
    return report


def require_signatures(envelope: Envelope, required: Mapping[str, bytes]) -> None:
    """Raise ProtoError unless exactly the ``required`` keys signed, each validly."""
    error = check_signatures(envelope, required).failure()
    if error is not None:
        raise error
