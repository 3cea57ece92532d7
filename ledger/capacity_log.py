"""The capacity fold: grants and denials of claims across shards (SPEC §6.5, capacity log).

Terms for one GPU may reach two ordered streams (two partitions, two ledger processes), so
the claims of ``ledger/capacity.py`` (one stream) cannot see each other. Claims are then
decided in the capacity log, keyed by canonical GPU uuid: every record of one device lies
in one partition, in one order. ``CapacityFold`` folds that order, one record at a time;
a decision depends only on the records of its key before it, so each shard, a rebuild
from offset 0 and a verifier derive the same grants, and nobody issues one.

Every record is signed by the ledger key it names (``ledger_key``), one of the shards'
ledger keys the fold is given (``[kafka] capacity_ledger_keys`` with the shard's own): an
unsigned or badly signed record, or one of a key the fold does not know, is INVALID, so
nobody who can merely write to the topic can claim, or free, a shard's GPU.

State per key: the granted claims, at most one per (placement, requesting ledger key), and
the decision of every request seen (rule 2: a republished request is decided as the
first). ``fold_capacity`` is the pure function over a whole sequence; a fold resumed after
``state()``/``CapacityFold(state)`` decides as one run over the whole sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from proto import limits
from proto.capacity_log import (
    DENIED,
    GRANTED,
    IGNORED,
    INVALID,
    RELEASED,
    TICK,
    CapEntry,
    CapRecord,
    CapRelease,
    CapRequest,
    open_capacity,
)
from proto.envelope import check_signatures
from proto.errors import ProtoError
from proto.keys import key_id
from proto.reasons import Reason
from proto.terms import canonical_uuid

WHOLE_GPU: Final = 1000  # share-milli of one whole GPU


class Granted(msgspec.Struct, frozen=True):
    """A granted claim: which request (its offset) holds what share over which window."""

    placement_id: str
    terms_hash: str
    ledger_key: bytes
    offset: int
    start_ms: int
    end_ms: int
    share_milli: int


class Decision(msgspec.Struct, frozen=True):
    """The fold's decision on one entry. ``collided`` (a denial for OVERSOLD): the offsets
    of the granted claims covering ``at_ms``, the first moment the request does not fit;
    ``duplicate_of``: the offset of the request that decided a republished one."""

    offset: int
    outcome: str
    reason: str | None = None
    at_ms: int | None = None
    collided: tuple[int, ...] = ()
    duplicate_of: int | None = None


class PendingRelease(msgspec.Struct, frozen=True):
    """A release the ledger owes the capacity log after a batch commits (rule 6): the
    placement's claims under ``terms_hash`` on ``uuids`` end at ``end_ms``."""

    placement_id: str
    terms_hash: str
    uuids: tuple[str, ...]
    end_ms: int
    because: str
    record_hash: str


class KeyState(msgspec.Struct):
    """What the fold holds for one key (one GPU)."""

    claims: list[Granted] = msgspec.field(default_factory=list)
    latest_ms: int = 0  # the latest log_ms of any entry of the key so far (rule 3)
    # every grant by the offset of its request, to name the claim a denial collided with
    grants: dict[int, Granted] = msgspec.field(default_factory=dict)
    # (placement_id, terms_hash, ledger_key) of each request seen -> its decision
    requests: dict[tuple[str, str, bytes], Decision] = msgspec.field(default_factory=dict)


class CapacityFold:
    """The capacity fold over entries in partition order (one key's order is what counts)."""

    def __init__(
        self, ledger_keys: Iterable[bytes], state: dict[str, KeyState] | None = None
    ) -> None:
        self._ledger_keys: dict[bytes, dict[str, bytes]] = {k: {key_id(k): k} for k in ledger_keys}
        self._keys: dict[str, KeyState] = {} if state is None else state

    def state(self) -> dict[str, KeyState]:
        """The fold's state, to resume from (the caller stores it with its position)."""
        return self._keys

    def claims(self, key: str) -> tuple[Granted, ...]:
        """The claims granted on ``key`` now, in grant order."""
        state = self._keys.get(key)
        return () if state is None else tuple(state.claims)

    def held_by(self, ledger_key: bytes) -> list[tuple[str, Granted]]:
        """Every claim granted to ``ledger_key`` and not released, with its key (uuid)."""
        return [
            (key, claim)
            for key, state in sorted(self._keys.items())
            for claim in state.claims
            if claim.ledger_key == ledger_key
        ]

    def granted_at(self, key: str, offset: int) -> Granted | None:
        """The claim granted to the request at ``offset`` of ``key`` (as granted)."""
        state = self._keys.get(key)
        return None if state is None else state.grants.get(offset)

    def latest_ms(self, key: str) -> int:
        """The latest ``log_ms`` of any entry of ``key`` read so far (0: none)."""
        state = self._keys.get(key)
        return 0 if state is None else state.latest_ms

    def decision_of(self, key: str, request: CapRequest) -> Decision | None:
        """The decision on ``request`` if the fold has read it, else None."""
        state = self._keys.get(key)
        if state is None:
            return None
        return state.requests.get((request.placement_id, request.terms_hash, request.ledger_key))

    def apply(self, entry: CapEntry) -> Decision:
        """SPEC §6.5 capacity fold rules 1-6 on one entry."""
        if canonical_uuid(entry.key) != entry.key:
            return Decision(entry.offset, INVALID)
        state = self._keys.setdefault(entry.key, KeyState())
        state.latest_ms = max(state.latest_ms, entry.log_ms)  # the key's time moves first
        record = self._signed(entry)
        if record is None or record.uuid != entry.key:
            return Decision(entry.offset, INVALID)
        if isinstance(record, CapRequest):
            return self._request(entry, record)
        if isinstance(record, CapRelease):
            return self._release(entry, record)
        return Decision(entry.offset, TICK)

    def _signed(self, entry: CapEntry) -> CapRecord | None:
        """The entry's record when it is signed by exactly the known ledger key it names."""
        try:
            record = open_capacity(entry.envelope)
        except ProtoError:
            return None
        required = self._ledger_keys.get(record.ledger_key)
        if required is None or check_signatures(entry.envelope, required).failure() is not None:
            return None
        return record

    def _request(self, entry: CapEntry, request: CapRequest) -> Decision:
        if not 1 <= request.share_milli <= WHOLE_GPU or request.start_ms >= request.end_ms:
            return Decision(entry.offset, INVALID)
        state = self._keys[entry.key]
        identity = (request.placement_id, request.terms_hash, request.ledger_key)
        first = state.requests.get(identity)
        if first is not None:  # rule 2: the first request decides
            return msgspec.structs.replace(first, offset=entry.offset, duplicate_of=first.offset)
        decision = self._decide(entry, request, state)
        state.requests[identity] = decision
        return decision

    def _decide(self, entry: CapEntry, request: CapRequest, state: KeyState) -> Decision:
        if state.latest_ms > request.terms_arrived_ms + limits.MAX_CAPACITY_WAIT_MS:
            return Decision(entry.offset, DENIED, Reason.CAPACITY_LATE.value)
        amended = (request.placement_id, request.ledger_key, request.supersedes)
        others = [
            c for c in state.claims if (c.placement_id, c.ledger_key, c.terms_hash) != amended
        ]
        clash = first_clash(others, request.start_ms, request.end_ms, request.share_milli)
        if clash is not None:
            at, covering = clash
            offsets = tuple(c.offset for c in covering)
            return Decision(entry.offset, DENIED, Reason.OVERSOLD.value, at, offsets)
        claim = Granted(
            request.placement_id,
            request.terms_hash,
            request.ledger_key,
            entry.offset,
            request.start_ms,
            request.end_ms,
            request.share_milli,
        )
        state.claims.append(claim)  # rule 5: beside the amended terms' claim until released
        state.grants[entry.offset] = claim
        return Decision(entry.offset, GRANTED)

    def _release(self, entry: CapEntry, release: CapRelease) -> Decision:
        state = self._keys.get(entry.key)
        claims = [] if state is None else state.claims
        for n, claim in enumerate(claims):
            if (claim.placement_id, claim.terms_hash, claim.ledger_key) != (
                release.placement_id,
                release.terms_hash,
                release.ledger_key,
            ):
                continue
            end = max(claim.start_ms, min(claim.end_ms, release.end_ms))
            if end == claim.start_ms:
                del claims[n]
            else:
                claims[n] = msgspec.structs.replace(claim, end_ms=end)
            return Decision(entry.offset, RELEASED)
        return Decision(entry.offset, IGNORED)


def first_clash(
    claims: Sequence[Granted], start_ms: int, end_ms: int, share_milli: int
) -> tuple[int, list[Granted]] | None:
    """The first moment of ``[start_ms, end_ms)`` at which ``share_milli`` plus the claims
    covering it pass one GPU, with those claims in grant order; None when it fits.

    The sum of covering claims changes only where a claim starts, so the first such
    moment is ``start_ms`` or the start of a claim inside the window.
    """
    overlapping = [c for c in claims if c.start_ms < end_ms and start_ms < c.end_ms]
    moments = sorted({start_ms} | {c.start_ms for c in overlapping if c.start_ms > start_ms})
    for at in moments:
        covering = [c for c in overlapping if c.start_ms <= at < c.end_ms]
        if share_milli + sum(c.share_milli for c in covering) > WHOLE_GPU:
            return at, sorted(covering, key=lambda c: c.offset)
    return None


def fold_capacity(entries: Iterable[CapEntry], ledger_keys: Iterable[bytes]) -> list[Decision]:
    """The decision on every entry, in order (a fresh fold: SPEC §6.5 is a pure function)."""
    fold = CapacityFold(ledger_keys)
    return [fold.apply(entry) for entry in entries]
