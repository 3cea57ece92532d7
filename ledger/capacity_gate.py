"""A shard's decision on terms through the capacity log (SPEC §6.5 "A shard's decision").

``requests_for`` and ``outcome`` are pure: the requests a shard publishes for terms, and
the terms' capacity outcome from what the capacity fold (``ledger/capacity_log.py``) has
read: accepted when every GPU's request is granted; ``OVERSOLD`` naming the granted claim
the first denied GPU collided with; ``CAPACITY_LATE``; or None while a request is neither
read nor past its deadline. ``KafkaCapacityLog`` is the I/O around them: it publishes the
requests (keyed by canonical uuid, idempotent producer), folds the capacity topic from
offset 0 (a restarted or rebuilt shard finds its earlier requests: rule 2, the first
decides), ticks idle keys past the deadline, and gives up after a bound with
``CapacityUnavailable`` (the caller leaves the terms unfolded: nothing is lost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ledger import limits as ledger_limits
from ledger.capacity_log import WHOLE_GPU, CapacityFold, Decision, PendingRelease
from ledger.fold import Fold
from ledger.inputs import Item
from proto import limits
from proto.capacity_log import (
    DENIED,
    GRANTED,
    CapEntry,
    CapRecord,
    CapRelease,
    CapRequest,
    CapTick,
    ReleaseCause,
    entry_from_message,
    seal_capacity,
)
from proto.envelope import Envelope, check_signatures, open_envelope
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.reasons import Reason
from proto.records import PlacementTerms
from proto.terms import canonical_uuid, party_keys


class CapacityUnavailable(Exception):
    """The capacity log did not answer within its bound: the terms are not decided."""


class CapacityOutcome(msgspec.Struct, frozen=True):
    """The capacity decision on terms: ``reason`` None when accepted; ``granted``: the
    keys whose request was granted (to release when the terms are rejected)."""

    reason: str | None
    detail: str
    granted: tuple[str, ...]

    @property
    def accepted(self) -> bool:
        """Every GPU's request was granted."""
        return self.reason is None


def requests_for(
    terms: PlacementTerms, terms_hash: str, arrived_ms: int, ledger_key: bytes
) -> list[CapRequest]:
    """One claim request per GPU of ``terms``, in terms order."""
    return [
        CapRequest(
            terms.placement_id,
            terms_hash,
            canonical_uuid(gpu.uuid),
            gpu.share_milli,
            terms.window_start_ms,
            terms.window_end_ms,
            arrived_ms,
            ledger_key,
            terms.supersedes,
        )
        for gpu in terms.gpus
    ]


def decision_for(fold: CapacityFold, request: CapRequest) -> Decision | None:
    """The fold's decision on ``request``; a late denial once the key's time passed its
    deadline unread (rule 3 denies it whenever it is read); None while neither."""
    decided = fold.decision_of(request.uuid, request)
    if decided is not None:
        return decided
    if fold.latest_ms(request.uuid) > request.terms_arrived_ms + limits.MAX_CAPACITY_WAIT_MS:
        return Decision(-1, DENIED, Reason.CAPACITY_LATE.value)  # no offset: not read
    return None


def outcome(fold: CapacityFold, requests: Sequence[CapRequest]) -> CapacityOutcome | None:
    """The terms' outcome once every request is decided, else None."""
    decided: list[tuple[CapRequest, Decision]] = []
    for request in requests:
        decision = decision_for(fold, request)
        if decision is None:
            return None
        decided.append((request, decision))
    granted = tuple(r.uuid for r, d in decided if d.outcome == GRANTED)
    for request, decision in decided:
        if decision.outcome != GRANTED:
            return CapacityOutcome(decision.reason, _detail(fold, request, decision), granted)
    return CapacityOutcome(None, "", granted)


def _detail(fold: CapacityFold, request: CapRequest, decision: Decision) -> str:
    if decision.reason != Reason.OVERSOLD.value:
        return (
            f"GPU {request.uuid}: the claim request reached the capacity log after "
            f"{request.terms_arrived_ms + limits.MAX_CAPACITY_WAIT_MS} (terms arrived "
            f"{request.terms_arrived_ms} + MAX_CAPACITY_WAIT_MS)"
        )
    named = []
    for offset in decision.collided:
        claim = fold.granted_at(request.uuid, offset)
        if claim is not None:
            named.append(
                f"placement {claim.placement_id} (capacity request at offset {offset}, "
                f"[{claim.start_ms}, {claim.end_ms}) at {claim.share_milli} share-milli)"
            )
    return (
        f"GPU {request.uuid} is granted to {', '.join(named)} at {decision.at_ms}: "
        f"{request.share_milli} more share-milli pass {WHOLE_GPU}"
    )


def entry_of(message: Any) -> CapEntry | None:
    """A consumed capacity-topic message as a fold entry; None when its key or value is no
    envelope (such a message is no record of the log: SPEC §6.5 rule 1). A record that is
    an envelope but unsigned, badly signed or of another payload is the fold's INVALID."""
    if not isinstance(message.key, bytes) or not isinstance(message.value, bytes):
        return None
    try:
        return entry_from_message(message.key, message.offset, message.timestamp, message.value)
    except ProtoError:
        return None


class KafkaCapacityLog:
    """One shard's view of the capacity topic: publish, fold, decide (asyncio)."""

    def __init__(
        self,
        settings: Any,
        key: SigningKey,
        ledger_keys: Sequence[bytes] = (),
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._settings = settings
        self._key = key
        self._ledger_key = key.public_key
        self.ledger_key = key.public_key  # the shard's ledger key: the owner of its claims
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        # the shards whose records count (SPEC §6.5): this shard's and the pinned others'
        self.fold = CapacityFold({key.public_key, *ledger_keys})
        self.skipped = 0  # messages that are no capacity record (counted, never folded)
        self._producer: Any = None
        self._consumer: Any = None

    async def start(self) -> None:
        """Producer and consumer up; the consumer reads every partition from offset 0."""
        from aiokafka.structs import TopicPartition

        from transport.kafka import make_consumer, make_producer, topic_partition_ids

        self._producer = make_producer(self._settings, client_id="gridledger-capacity")
        self._consumer = make_consumer(self._settings)
        await self._producer.start()
        await self._consumer.start()
        parts = await topic_partition_ids(self._consumer, self._settings.topic) or []
        if not parts:
            raise CapacityUnavailable(f"capacity topic {self._settings.topic!r} has no partitions")
        assigned = [TopicPartition(self._settings.topic, p) for p in parts]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_beginning(*assigned)
        await self._catch_up(assigned)

    async def _catch_up(self, assigned: list[Any]) -> None:
        """Fold every partition up to its end offset now, so a restarted shard finds the
        requests it published before (bounded like a decision)."""
        ends = await self._consumer.end_offsets(assigned)
        give_up = time.monotonic() + ledger_limits.CAPACITY_GIVE_UP_MARGIN_S
        while [tp for tp, end in ends.items() if await self._consumer.position(tp) < end]:
            if time.monotonic() > give_up:
                raise CapacityUnavailable(
                    f"capacity topic {self._settings.topic!r}: not read to its end within "
                    f"{ledger_limits.CAPACITY_GIVE_UP_MARGIN_S:.0f} s"
                )
            await self._read()

    async def stop(self) -> None:
        """Close both clients (each in turn, whatever the other did)."""
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()
        self._producer = self._consumer = None

    async def _send(self, records: Sequence[CapRecord]) -> None:
        sent = [
            await self._producer.send(
                self._settings.topic, seal_capacity(r, self._key), key=r.uuid.encode()
            )
            for r in records
        ]
        await asyncio.gather(*sent)

    async def _read(self) -> None:
        batches = await self._consumer.getmany(
            timeout_ms=100, max_records=ledger_limits.CAPACITY_POLL_RECORDS
        )
        for _, messages in sorted(batches.items(), key=lambda kv: kv[0].partition):
            for message in messages:
                entry = entry_of(message)
                if entry is None:
                    self.skipped += 1
                    continue
                self.fold.apply(entry)

    async def decide(
        self, terms: PlacementTerms, terms_hash: str, arrived_ms: int
    ) -> CapacityOutcome:
        """SPEC §6.5: publish the terms' requests (unless the log already decided them),
        read until every one is decided, tick past the deadline; bounded."""
        requests = requests_for(terms, terms_hash, arrived_ms, self._ledger_key)
        bound_s = (
            ledger_limits.CAPACITY_GIVE_UP_MARGIN_S
            + (limits.MAX_CAPACITY_WAIT_MS + limits.MAX_CLOCK_SKEW_MS) / 1000
        )
        give_up = time.monotonic() + bound_s
        await self._read()
        if outcome(self.fold, requests) is None:
            await self._send([r for r in requests if decision_for(self.fold, r) is None])
        ticked_at = 0.0
        while (found := outcome(self.fold, requests)) is None:
            now = time.monotonic()
            if now > give_up:
                raise CapacityUnavailable(
                    f"placement {terms.placement_id}: the capacity log decided no request "
                    f"within {bound_s:.0f} s"
                )
            deadline = arrived_ms + limits.MAX_CAPACITY_WAIT_MS
            if (
                self._clock_ms() > deadline
                and now - ticked_at >= ledger_limits.CAPACITY_TICK_INTERVAL_S
            ):
                undecided = [r.uuid for r in requests if decision_for(self.fold, r) is None]
                await self._send([CapTick(uuid, self._ledger_key) for uuid in undecided])
                ticked_at = now
            await self._read()
        return found

    async def release(self, owed: PendingRelease) -> None:
        """End this shard's claims of ``owed.terms_hash`` on its GPUs (rule 6)."""
        because: ReleaseCause = "rejected"
        if owed.because in ("reclaimed", "amended"):
            because = "reclaimed" if owed.because == "reclaimed" else "amended"
        await self._send(
            [
                CapRelease(
                    owed.placement_id,
                    owed.terms_hash,
                    canonical_uuid(uuid),
                    owed.end_ms,
                    because,
                    owed.record_hash,
                    self._ledger_key,
                )
                for uuid in owed.uuids
            ]
        )


async def claim_batch(capacity: KafkaCapacityLog, fold: Fold, items: Sequence[Item]) -> None:
    """SPEC §6.5 across shards: decide every terms input of a batch through the capacity
    log before the fold reads it; the fold takes the refusal (or None) by record hash."""
    refusals = fold.capacity_refusals
    if refusals is None:
        refusals = fold.capacity_refusals = {}
    for item in items:
        try:
            opened = open_envelope(item.data)
        except ProtoError:
            continue  # the fold names what is wrong with it
        terms = opened.record
        if not isinstance(terms, PlacementTerms) or opened.record_hash in refusals:
            continue
        if not _claimable(terms, opened.envelope, capacity.ledger_key):
            continue  # the fold rejects it for that, before any claim is compared
        arrived = terms.created_at_ms if item.arrived_ms is None else item.arrived_ms
        found = await capacity.decide(terms, opened.record_hash, arrived)
        refusal = None if found.reason is None else (Reason(found.reason), found.detail)
        refusals[opened.record_hash] = refusal


def _claimable(terms: PlacementTerms, envelope: Envelope, ledger_key: bytes) -> bool:
    """Terms for this ledger, signed by exactly their three parties: nobody without the
    parties' keys can make a shard claim (and so hold back) a GPU."""
    if terms.ledger_key != ledger_key:
        return False
    return check_signatures(envelope, party_keys(terms)).failure() is None


async def release_owed(capacity: KafkaCapacityLog, owed: Sequence[PendingRelease]) -> int:
    """Publish the releases a committed batch's decisions owe the capacity log; how many."""
    for release in owed:
        await capacity.release(release)
    return len(owed)
