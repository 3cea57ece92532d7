"""The records of the capacity log (SPEC §6.5 "Across shards: the capacity log").

Claims on one GPU are decided in their own ordered stream, keyed by the GPU's canonical
uuid: a shard publishes a ``CapRequest`` per GPU of terms it is deciding, a ``CapRelease``
when the terms were rejected, reclaimed or amended away from the GPU, and a ``CapTick``
to move the log's time on an idle key. Each record reaches the fold as a ``CapEntry``:
the record with the place and time (``log_ms``, the broker's append time) the log gave
it. Only the schemas live here; the fold is implemented apart by the ledger
(``ledger/capacity_log.py``) and the verifier (``verifier/capacity_log.py``).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
from msgspec import Struct

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


CapRecord = CapRequest | CapRelease | CapTick


class CapEntry(Struct, frozen=True, forbid_unknown_fields=True):
    """One record of a capacity partition with the key, offset and time the log gave it."""

    key: Identifier
    offset: NonNegInt
    log_ms: TimeMs
    record: CapRecord


_DECODER: Final = msgspec.json.Decoder(CapEntry)
_RECORD_DECODER: Final = msgspec.json.Decoder(CapRecord)


def decode_entry(raw: bytes) -> CapEntry:
    """A capacity-log entry from JSON; msgspec's error names the field that was wrong."""
    return _DECODER.decode(raw)


def decode_record(raw: bytes) -> CapRecord:
    """A capacity-log record (a message's value) from JSON; msgspec's error names the field."""
    return _RECORD_DECODER.decode(raw)
