"""The fold state of one placement: immutable values that ``decide`` reads and replaces.

Nothing here changes after it is built: ``decide`` (ledger/rules.py) returns a new
``PlacementState`` (``msgspec.structs.replace``) and leaves the one it was given as it
was. Mappings are never mutated once built; a change builds a new mapping (copy on
write — they are small: one entry per node). The sets and the held list that grow with
every input are persistent structures (ledger/immutable.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from ledger.immutable import PLog, PMap, PSet
from ledger.pricing import ZERO_TOTALS
from proto import limits
from proto.keys import key_id
from proto.records import ZERO_HASH, GpuSpec, Party, PlacementTerms, Totals

# Binding window of the node keys the terms list (SPEC §6.3 terms): [0, 2^53 - 1).
FOREVER: Final = (0, limits.MAX_SAFE_INTEGER)

# node_id -> public key -> [valid_from_ms, valid_until_ms).
Bindings = Mapping[str, Mapping[bytes, tuple[int, int]]]


class StreamState(msgspec.Struct, frozen=True):
    """One (placement, node) usage stream (SPEC §6.3 usage): what the next event must be."""

    next_seq: int = 0
    last_hash: str = ZERO_HASH
    last_end_ms: int = 0
    last_input_hash: str = ""
    # SPEC §7.1: GPU uuid -> highest retired-page count of the stream's accepted events
    # (non-zero counts only; absent = 0).
    retired: Mapping[str, int] = msgspec.field(default_factory=dict)


NEW_STREAM: Final = StreamState()

# Key ids of bound public keys (a SHA-256 each; ``key_for`` asks for them per usage event).
_KEY_IDS: dict[bytes, str] = {}
_KEY_IDS_MAX: Final = 1 << 16


def _key_id(public_key: bytes) -> str:
    found = _KEY_IDS.get(public_key)
    if found is None:
        found = key_id(public_key)
        if len(_KEY_IDS) >= _KEY_IDS_MAX:
            _KEY_IDS.clear()
        _KEY_IDS[public_key] = found
    return found


class AssignmentState(msgspec.Struct, frozen=True):
    """An accepted assignment (SPEC §6.8): who bought which GPUs from when, at what rate,
    and the milli-GPU-ms delivered on them since (D_k of SPEC §7.10)."""

    assignment_id: str
    new_buyer: Party
    handover_ms: int  # the effective handover h
    gpus: frozenset[str]
    rate_per_gpu_hour_minor: int
    delivered_mgms: int = 0


class Attestation(msgspec.Struct, frozen=True):
    """SPEC §6.9: accepted hardware evidence for one node key."""

    gpus: tuple[str, ...]
    attester: str  # the root that signed it; "" when the ledger has no root configured
    iss: str
    iat: int
    record_index: int


# node_id -> public key -> its accepted evidence.
Attested = Mapping[str, Mapping[bytes, Attestation]]

NO_HASHES: Final[PSet[str]] = PSet()
NO_HELD: Final[PLog[tuple[bytes, str]]] = PLog()
NO_ARRIVALS: Final[PMap[str, int]] = PMap()
# One stream's held events: seq -> (raw, position, input hash).
StreamHolds = PMap[int, tuple[bytes, str, str]]
NO_STREAM_HOLDS: Final[StreamHolds] = PMap()


class PlacementState(msgspec.Struct, frozen=True):
    """Everything the fold knows about one placement between two inputs."""

    placement_id: str
    terms: PlacementTerms | None = None
    terms_payload: bytes | None = None
    terms_record_hash: str = ""
    gpus: Mapping[str, GpuSpec] = msgspec.field(default_factory=dict)
    # The chain: records so far and the record hash of the last one.
    next_index: int = 0
    head: str = ZERO_HASH
    totals: Totals = ZERO_TOTALS
    streams: Mapping[str, StreamState] = msgspec.field(default_factory=dict)
    bindings: Bindings = msgspec.field(default_factory=dict)
    closed: bool = False
    effective_end_ms: int = 0
    reclaimed: bool = False
    max_usage_end_ms: int = 0
    adjustment_ids: PSet[str] = NO_HASHES
    # Input hashes of every chained input except accepted usage events (those are
    # recognised by their stream position, SPEC §6.3 usage (3)).
    seen: PSet[str] = NO_HASHES
    # Inputs held before the terms (SPEC §6.2), in arrival order: (raw, position); its
    # ``weight`` is their raw bytes (as each stream hold's, ``held_bytes``).
    held: PLog[tuple[bytes, str]] = NO_HELD
    held_hashes: PSet[str] = NO_HASHES
    # Usage events held in their stream until the seqs before them arrive (SPEC §6.2):
    # node_id -> seq -> (raw, position, input hash). The outer mapping is small (a node
    # each) and copied on write; each stream's holds are persistent (up to
    # MAX_HELD_PER_PLACEMENT: copying them per held event would be quadratic).
    stream_held: Mapping[str, StreamHolds] = msgspec.field(default_factory=dict)
    # Seqs of a stream taken by a rejected event (SPEC §6.3 usage (3)): node_id -> seqs.
    taken: Mapping[str, frozenset[int]] = msgspec.field(default_factory=dict)
    # SPEC §6.6: arrived_ms of the last chained record (None: none yet, or untimed), and
    # the keys revoked per node (a usage event signed by one is NODE_KEY_REVOKED).
    arrived_ms: int | None = None
    revoked: Mapping[str, frozenset[bytes]] = msgspec.field(default_factory=dict)
    # SPEC §6.6: when each held input (before the terms, or in its stream) arrived, by
    # its position; its record, chained on release, carries max(a_prev, that). Persistent:
    # one entry per held input, up to MAX_HELD_PER_PLACEMENT.
    held_arrived: PMap[str, int] = NO_ARRIVALS
    # SPEC §6.8: accepted assignments in chain order.
    assignments: tuple[AssignmentState, ...] = ()
    # SPEC §6.7: the end e of the accepted buyer release (None: not released).
    release_end_ms: int | None = None
    # SPEC §6.9: the node keys with accepted hardware evidence.
    attested: Attested = msgspec.field(default_factory=dict)

    def held_count(self) -> int:
        """Inputs held before the terms plus usage events held in their streams."""
        return len(self.held) + sum(len(h) for h in self.stream_held.values())

    def held_bytes(self) -> int:
        """Envelope bytes of the inputs ``held_count`` counts (SPEC §6.2): the weights of
        the persistent holds (each hold's raw length, given when it was held)."""
        return self.held.weight + sum(h.weight for h in self.stream_held.values())

    def key_for(self, node_id: str, keyid: str) -> bytes | None:
        """The public key with this key id bound to the node (any validity), if any."""
        return key_among(self.bindings.get(node_id, ()), keyid)

    def close_due_ms(self) -> int | None:
        """window_end_ms + late_grace_ms; None without accepted terms."""
        if self.terms is None:
            return None
        return self.terms.window_end_ms + self.terms.late_grace_ms


def key_among(keys: Iterable[bytes], keyid: str) -> bytes | None:
    """The public key among ``keys`` (a node's bindings) with this key id, if any."""
    for public_key in keys:
        if _key_id(public_key) == keyid:
            return public_key
    return None


def empty(placement_id: str) -> PlacementState:
    """A placement the fold has seen nothing of."""
    return PlacementState(placement_id)


def terms_fields(terms: PlacementTerms, payload: bytes, record_hash: str) -> dict[str, Any]:
    """The fields accepted terms set (SPEC §6.3 terms, "Accepted"): the placement's GPUs,
    each node's key bound for [0, 2^53 - 1), ``effective_end = window_end_ms``. (Every
    stream starts at seq 0 with ``prev`` = ZERO_HASH: ``NEW_STREAM``.)"""
    return {
        "terms": terms,
        "terms_payload": payload,
        "terms_record_hash": record_hash,
        "gpus": {g.uuid: g for g in terms.gpus},
        "bindings": {n.node_id: {n.key: FOREVER} for n in terms.nodes},
        "revoked": {},
        "attested": {},
        "effective_end_ms": terms.window_end_ms,
    }
