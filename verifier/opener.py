"""Open envelopes and check their signatures: the CPU-heavy part, run in worker processes.

``open_chunk`` is a pure function of its arguments, so it runs the same inline, in a
thread or in another process. For every envelope it decodes strictly (SPEC §2-§3 via
``proto.envelope.open_envelope``), hashes, and checks each signature against the keys
the caller lists for that key id. It does not decide anything: whether a key was bound
or required is the fold's business (``verifier/decisions.py``), which is why the result
says, per signature, which candidate key verified — if any.

Results may cross process boundaries, so they are plain named tuples holding the decoded
record (msgspec Structs pickle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

import msgspec

from proto import limits as proto_limits
from proto.canonical import canonical_json
from proto.envelope import decode_envelope_fast, open_envelope, sha256_hex
from proto.errors import ProtoError
from proto.keys import key_id, verify
from proto.merkle import leaf_hash
from proto.reasons import Reason
from proto.records import Assignment, LedgerRecord, PlacementTerms, Record, UsageEvent

# Signature outcomes.
SIG_VALID: Final = 1
SIG_INVALID: Final = 0
SIG_UNKNOWN_KEY: Final = -1

Keyring = Mapping[str, Sequence[bytes]]
"""Key id -> the public keys with that id that an envelope may be signed by."""


class SigResult(NamedTuple):
    """One signature of an envelope: its key id, the outcome, and the key that verified."""

    keyid: str
    outcome: int
    key: bytes


class OpenResult(NamedTuple):
    """What one envelope turned out to be. ``error`` is '' or the SPEC reason code."""

    tag: int
    error: str
    detail: str
    kind: str
    input_hash: str
    record_hash: str
    leaf: bytes
    record: Record | None
    sigs: tuple[SigResult, ...]


def _terms_keys(record: Record) -> dict[str, list[bytes]]:
    """A terms envelope is signed by keys named inside it, which no keyring can know; so
    is an assignment (its new buyer's key, SPEC §6.8)."""
    if isinstance(record, Assignment):
        return {key_id(record.new_buyer.key): [record.new_buyer.key]}
    if not isinstance(record, PlacementTerms):
        return {}
    extra: dict[str, list[bytes]] = {}
    for party in (record.operator, record.buyer, record.desk):
        extra.setdefault(key_id(party.key), []).append(party.key)
    return extra


def open_one(tag: int, raw: bytes, keyring: Keyring) -> OpenResult:
    """Open one envelope; never raises (anything unexpected is MALFORMED with a detail)."""
    try:
        opened = open_envelope(raw)
    except ProtoError as exc:
        return OpenResult(tag, exc.reason.value, exc.detail, "", sha256_hex(raw), "", b"", None, ())
    except Exception as exc:  # a decoder bug must not stop the run; report it as input
        detail = f"{type(exc).__name__}: {exc}"
        return OpenResult(
            tag, Reason.MALFORMED.value, detail, "", sha256_hex(raw), "", b"", None, ()
        )
    payload = opened.envelope.payload
    extra = _terms_keys(opened.record)
    sigs: list[SigResult] = []
    for signature in opened.envelope.signatures:
        keyid = signature.keyid
        candidates = keyring.get(keyid, ())
        if extra:  # a terms or assignment envelope: the keys it names come after
            candidates = [*candidates, *extra.get(keyid, ())]
        if not candidates:
            sigs.append(SigResult(keyid, SIG_UNKNOWN_KEY, b""))
            continue
        good = None
        sig = signature.sig
        for key in candidates:  # the first that verifies
            if verify(key, payload, sig):
                good = key
                break
        if good is None:
            sigs.append(SigResult(keyid, SIG_INVALID, b""))
        else:
            sigs.append(SigResult(keyid, SIG_VALID, good))
    return OpenResult(
        tag,
        "",
        "",
        opened.kind,
        opened.input_hash,
        opened.record_hash,
        leaf_hash(payload),
        opened.record,
        tuple(sigs),
    )


# The kinds ``open_plain`` opens (neither names keys of its own: ``_terms_keys``): each
# kind's own decoder, which accepts no other ``type`` (as ``proto.canonical``'s).
_USAGE_PREFIX: Final = b"gridledger/usage/v1"
_RECORD_PREFIX: Final = b"gridledger/record/v1"
_USAGE_DECODER: Final = msgspec.json.Decoder(UsageEvent)
_RECORD_DECODER: Final = msgspec.json.Decoder(LedgerRecord)


def open_plain(tag: int, raw: bytes, kind: str, keyring: Keyring) -> OpenResult | None:
    """``open_one`` of an envelope expected to hold a ``kind`` ("usage" or "record") whose
    bytes are canonical and whose signatures are at most one: the same OpenResult, in one
    function instead of the layers of ``open_envelope`` (the same decoders and re-encoding
    checks, no ``Opened`` in between). None when anything is off (too large, not decoding,
    not canonical, another kind, several signatures): ``open_one`` then says what."""
    if len(raw) > proto_limits.MAX_ENVELOPE_BYTES:
        return None
    envelope = decode_envelope_fast(raw)
    if envelope is None:
        return None
    payload = envelope.payload
    line, _, body = payload.partition(b"\n")
    record: Record
    try:
        if kind == "usage" and line == _USAGE_PREFIX:
            record = _USAGE_DECODER.decode(body)
        elif kind == "record" and line == _RECORD_PREFIX:
            record = _RECORD_DECODER.decode(body)
        else:
            return None
    except Exception:  # whatever it is, open_one names it
        return None
    if canonical_json(record) != body:
        return None
    sigs: tuple[SigResult, ...] = ()
    if envelope.signatures:
        signature = envelope.signatures[0]
        keyid = signature.keyid
        candidates = keyring.get(keyid, ())
        if not candidates:
            sigs = (SigResult(keyid, SIG_UNKNOWN_KEY, b""),)
        else:
            sigs = (SigResult(keyid, SIG_INVALID, b""),)
            sig = signature.sig
            for key in candidates:  # the first that verifies
                if verify(key, payload, sig):
                    sigs = (SigResult(keyid, SIG_VALID, key),)
                    break
    sha256 = hashlib.sha256
    return OpenResult(
        tag,
        "",
        "",
        kind,
        sha256(raw).hexdigest(),
        sha256(payload).hexdigest(),
        sha256(b"\x00" + payload).digest(),  # proto.merkle.leaf_hash
        record,
        sigs,
    )


def open_chunk(rows: Sequence[tuple[int, bytes]], keyring: Keyring) -> list[OpenResult]:
    """Open every (tag, envelope bytes) row; the tag comes back unchanged."""
    return [open_one(tag, raw, keyring) for tag, raw in rows]
