"""The records of the capacity log (SPEC §6.5 "Across shards: the capacity log").

Claims on one GPU are decided in their own ordered stream, keyed by the GPU's canonical
uuid: a shard publishes a ``CapRequest`` per GPU of terms it is deciding, a ``CapRelease``
when the terms were rejected, reclaimed or amended away from the GPU, and a ``CapTick``
to move the log's time on an idle key. Each record travels in an envelope (the message
value, ``proto/envelope.py``) signed by the publishing shard's ledger key, over the bytes
``gridledger/<type>/v1\n`` + the record's canonical JSON, and reaches the fold as a
``CapEntry``: the envelope with the place and time (``log_ms``, the broker's append time)
the log gave it. Only the schemas and the bytes live here; the fold, signatures included,
is implemented apart by the ledger (``ledger/capacity_log.py``) and the verifier
(``verifier/capacity_log.py``).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
from msgspec import Struct

from proto.canonical import canonical_json
from proto.envelope import Envelope, decode_envelope, encode_envelope, sign_payload
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.reasons import Reason
from proto.records import ZERO_HASH, Hash, Identifier, NonNegInt, PublicKey, ShareMilli, TimeMs

# The decisions of the fold on one record, as written in the vector.
GRANTED: Final = "GRANTED"
DENIED: Final = "DENIED"
RELEASED: Final = "RELEASED"
IGNORED: Final = "IGNORED"
INVALID: Final = "INVALID"
TICK: Final = "TICK"

ReleaseCause = Literal["rejected", "reclaimed", "amended"]


class CapRequest(Struct, frozen=True, forbid_unknown_fields=True, tag="capreq", tag_field="type"):
    """A shard asks for ``share_milli`` of GPU ``uuid`` over ``[start_ms, end_ms)``."""

    placement_id: Identifier
    terms_hash: Hash
    uuid: Identifier
    share_milli: ShareMilli
    start_ms: TimeMs
    end_ms: TimeMs
    terms_arrived_ms: TimeMs
    ledger_key: PublicKey
    # the terms these amend (their record hash; ZERO_HASH for first terms): the one claim
    # the request does not collide with (SPEC §6.5 capacity fold rule 4)
    supersedes: Hash = ZERO_HASH


class CapRelease(Struct, frozen=True, forbid_unknown_fields=True, tag="caprel", tag_field="type"):
    """The requesting shard ends its granted claim at ``end_ms``, for ``because``."""

    placement_id: Identifier
    terms_hash: Hash
    uuid: Identifier
    end_ms: TimeMs
    because: ReleaseCause
    record_hash: Hash
    ledger_key: PublicKey


class CapTick(Struct, frozen=True, forbid_unknown_fields=True, tag="captick", tag_field="type"):
    """Nothing but a time on the key: the broker stamps it as it appends it."""

    uuid: Identifier
    ledger_key: PublicKey


CapRecord = CapRequest | CapRelease | CapTick


class CapEntry(Struct, frozen=True, forbid_unknown_fields=True):
    """One message of a capacity partition: its envelope (signatures not yet checked) with
    the key, offset and time the log gave it."""

    key: Identifier
    offset: NonNegInt
    log_ms: TimeMs
    envelope: Envelope


_DECODER: Final = msgspec.json.Decoder(CapEntry)
_RECORD_DECODER: Final = msgspec.json.Decoder(CapRecord)
_PREFIXES: Final = {
    t: f"gridledger/{t.__struct_config__.tag}/v1\n".encode()
    for t in (CapRequest, CapRelease, CapTick)
}


def capacity_bytes(record: CapRecord) -> bytes:
    """The exact bytes a shard signs for ``record``: its prefix line, then canonical JSON."""
    return _PREFIXES[type(record)] + canonical_json(record)


def seal_capacity(record: CapRecord, key: SigningKey) -> bytes:
    """The message value for ``record``: canonical envelope bytes signed by ``key``."""
    return encode_envelope(sign_payload(capacity_bytes(record), [key]))


def sealed_entry(key: str, offset: int, log_ms: int, record: CapRecord, by: SigningKey) -> CapEntry:
    """A ``CapEntry`` for ``record`` signed by ``by`` (tests and vectors)."""
    return CapEntry(key, offset, log_ms, sign_payload(capacity_bytes(record), [by]))


def entry_from_message(key: bytes, offset: int, log_ms: int, value: bytes) -> CapEntry:
    """A consumed message as an entry; ProtoError when its key or value is no envelope
    (such a message is no entry of the log; counted by the reader, never folded)."""
    try:
        text = key.decode()
    except UnicodeDecodeError as exc:
        raise ProtoError(Reason.MALFORMED, "capacity message: key is not UTF-8") from exc
    return CapEntry(text, offset, log_ms, decode_envelope(value))


def open_capacity(envelope: Envelope) -> CapRecord:
    """The capacity record an envelope carries; ProtoError when the payload is not one
    canonical capacity record under its own prefix line. Signatures are not checked."""
    line, sep, body = envelope.payload.partition(b"\n")
    try:
        record = _RECORD_DECODER.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtoError(Reason.MALFORMED, f"capacity record: {exc}") from exc
    if not sep or capacity_bytes(record) != envelope.payload:
        raise ProtoError(
            Reason.NON_CANONICAL, f"capacity record: prefix {line[:48]!r} or body not canonical"
        )
    return record


def decode_entry(raw: bytes) -> CapEntry:
    """A capacity-log entry from JSON; msgspec's error names the field that was wrong."""
    return _DECODER.decode(raw)
