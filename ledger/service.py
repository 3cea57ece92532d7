"""The ledger service loop: consume a batch -> fold -> commit; close what is due.

Two entry points share one core (``Ingestor``, ``Closer``):

* ``LedgerService`` — the local transport, synchronous: ``run_until_idle()`` consumes
  everything the spools hold now — appended first to the ledger's intake log
  (``transport.intake``, ``<local_dir>/.intake-<ledger id>/``), the one order the fold
  sees (SPEC §6.4) —
  folds and commits it, publishes the closes the clock makes due (into
  ``local_dir/ledger-<ledger_id>/``, which it then reads like any spool), and repeats
  until nothing is left. ``run_forever(stop)`` keeps polling.
* ``KafkaLedgerService`` — the Kafka transport, asyncio: ``run_until(...)`` runs until a
  condition holds (given placements closed, caught up and nothing left to close) or a
  deadline passes; ``run_forever(stop)`` is the daemon.

Time comes in through ``clock`` (milliseconds): the real clock in production, a fixed or
simulated one in tests and replays, so a run can be reproduced byte for byte. Inputs'
arrival times (SPEC §6.6) come from the log (``arrival = "log"``): the broker's
log-append time, or the intake log's clock. ``arrival = "sender"`` (simulations only)
takes the time each sender stated instead, and the ledger states its own closes at
``closed_at_ms``.

Closes: when ``clock() >= window_end_ms + late_grace_ms`` of an open placement, the
ledger signs a PlacementClosed(closed_at_ms = clock()), records it in the store, then
publishes it into the placement's stream; the fold sees it in stream order. A close
recorded but not known to be published is republished after a restart with the same
bytes, which the fold drops as a duplicate if the first copy did arrive. On Kafka, closes
are signed only once the shard has read its partitions to their end offsets
(``close_when_caught_up``): a shard rebuilding from offset 0 with the real clock then
finds the closes its predecessor published instead of signing new ones (with another
``closed_at_ms``) on an empty poll half way through, and reaches identical heads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from ledger.capacity_gate import KafkaCapacityLog, claim_batch, release_owed
from ledger.capacity_log import PendingRelease
from ledger.capacity_owed import release_owed_at_start
from ledger.config import Arrival, KafkaConfig, LedgerConfig
from ledger.consume import KafkaSource, LocalSource
from ledger.ingest import BatchReport, Folded, Ingestor, Prepared
from ledger.inputs import Item
from ledger.limits import (
    AHEAD_BATCHES,
    CLOSE_PUBLISH_ATTEMPTS,
    CLOSE_PUBLISH_BACKOFF_S,
    DEFAULT_BATCH_MAX_RECORDS,
    MAX_IDLE_PASSES,
    POLL_AHEAD_MS,
    POLL_TIMEOUT_MS,
)
from ledger.metrics import LedgerMetrics
from ledger.store import Store, StoreError
from proto.attestation import AttestationRoot
from proto.envelope import open_envelope, seal
from proto.invariant import of_type
from proto.keys import SigningKey, load_signing_key
from proto.limits import MAX_CLOCK_SKEW_MS
from proto.records import PlacementClosed
from transport.intake import intake_dir_for
from transport.kafka import publish_kafka
from transport.local import ledger_source, publish_local

log = structlog.get_logger("ledger.service")

Clock = Callable[[], int]


def real_clock() -> int:
    """Wall-clock milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def fixed_clock(now_ms: int) -> Clock:
    """A clock that always reads ``now_ms`` (tests, replays)."""
    return lambda: now_ms


@dataclass(slots=True)
class RunReport:
    """Totals of a run of the loop."""

    batches: int = 0
    inputs: int = 0
    chained: int = 0
    quarantined: int = 0
    dropped: int = 0
    closes_published: int = 0
    closed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, report: BatchReport) -> None:
        """Count one batch."""
        self.batches += 1
        self.inputs += report.inputs
        self.chained += report.chained
        self.quarantined += report.quarantined
        self.dropped += report.dropped
        self.closed.extend(report.closed)


class Closer:
    """Decides which placements are due to close and remembers the closes it signed."""

    def __init__(self, store: Store, ingestor: Ingestor, key: SigningKey, clock: Clock) -> None:
        self.store = store
        self.ingestor = ingestor
        self.key = key
        self.clock = clock
        self._recorded = store.closes_recorded()
        # Whether the store may hold a close not yet published: a restart may have left
        # some, a new close sets it, a read that finds none clears it (then the store is
        # not asked again until a close is recorded).
        self._unpublished = True

    def pending(self) -> list[tuple[str, bytes]]:
        """(placement_id, envelope) of every close to publish now, new or not yet published."""
        now = self.clock()
        fold = self.ingestor.fold
        new: list[tuple[str, bytes]] = []
        dues: list[int] = []
        for placement_id in fold.open_placements():
            if placement_id in self._recorded:
                continue
            due = fold.close_due_ms(placement_id)
            if due is None or now < due:
                continue
            record = PlacementClosed(placement_id=placement_id, closed_at_ms=now)
            new.append((placement_id, seal(record, [self.key])))
            dues.append(due)
        if new:
            self.store.add_closes(new)
            self._recorded.update(placement_id for placement_id, _ in new)
            self._unpublished = True
            for (placement_id, _), due in zip(new, dues, strict=True):
                log.info("close_due", placement=placement_id, closed_at_ms=now, due_ms=due)
        if not self._unpublished:
            return []
        pending = self.store.unpublished_closes()
        self._unpublished = bool(pending)
        return pending

    def published(self, placement_ids: Iterable[str]) -> None:
        """Note that these closes reached the stream."""
        self.store.mark_closes_published(placement_ids)


def _open(config: LedgerConfig) -> tuple[Store, SigningKey]:
    key = load_signing_key(config.key_file)
    config.db.parent.mkdir(parents=True, exist_ok=True)
    return Store(config.db, ledger_public_key=key.public_key), key


def clock_of(config: LedgerConfig) -> Clock:
    """The clock a config asks for: fixed ``clock_ms`` if set, else the real one."""
    return real_clock if config.clock_ms is None else fixed_clock(config.clock_ms)


# ---- local transport ------------------------------------------------------------------------


class _ServiceCore:
    """What both transports share: the store, the key, the fold (Ingestor) and the closer."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        *,
        clock: Clock,
        batch_max_records: int,
        close: bool,
        metrics: LedgerMetrics | None,
        arrival: Arrival,
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
        crypto_worker: bool = False,
    ) -> None:
        self.store = store
        self.arrival = arrival
        try:
            store.note_arrival(arrival)
        except StoreError:
            store.close()  # the refusing ledger leaves the store as it found it
            raise
        if attestation_roots is None:
            log.info(
                "attestation_unchecked",
                note="SPEC 6.9: no attestation_roots configured; the signatures of "
                "hardware evidence are not judged",
            )
        if arrival == "sender":
            log.warning(
                "arrival_from_senders",
                note="SPEC 6.6: arrival times are the ones the senders state; "
                "for simulations on a simulated clock only, never production",
            )
        self.key = key
        self.batch_max_records = batch_max_records
        self.close_enabled = close
        self.metrics = metrics or LedgerMetrics()
        self.ingestor = Ingestor(
            store, key, self.metrics, attestation_roots, crypto_worker=crypto_worker
        )
        self.closer = Closer(store, self.ingestor, key, clock)

    def close_stamps(self, pending: list[tuple[str, bytes]]) -> list[int] | None:
        """Under ``arrival = "sender"`` the time the ledger states for each close it
        publishes (its ``closed_at_ms``); None under ``"log"`` (the log's time)."""
        if self.arrival == "log":
            return None
        stamps: list[int] = []
        for _, envelope in pending:
            record = of_type(open_envelope(envelope).record, PlacementClosed, "a close")
            stamps.append(record.closed_at_ms)
        return stamps

    def close(self) -> None:
        """Stop the crypto threads and close the store (for Kafka: after ``stop``)."""
        self.ingestor.close()
        self.store.close()


class LedgerService(_ServiceCore):
    """The ledger over local spool directories (synchronous)."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        *,
        ledger_id: str,
        local_dir: Path,
        clock: Clock = real_clock,
        batch_max_records: int = DEFAULT_BATCH_MAX_RECORDS,
        close: bool = True,
        metrics: LedgerMetrics | None = None,
        intake_dir: Path | None = None,
        arrival: Arrival = "log",
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
    ) -> None:
        super().__init__(
            store,
            key,
            clock=clock,
            batch_max_records=batch_max_records,
            close=close,
            metrics=metrics,
            arrival=arrival,
            attestation_roots=attestation_roots,
        )
        self.ledger_id = ledger_id
        self.local_dir = local_dir
        self.intake_dir = intake_dir_for(local_dir, ledger_id) if intake_dir is None else intake_dir
        try:
            self.source = LocalSource(
                local_dir, store.offsets(), intake_dir=self.intake_dir, clock=clock, arrival=arrival
            )
        except BaseException:
            self.ingestor.close()
            raise

    def close(self) -> None:
        """Release the intake log, stop the crypto threads, close the store."""
        self.source.close()
        super().close()

    @classmethod
    def from_config(cls, config: LedgerConfig, clock: Clock | None = None) -> LedgerService:
        """A service for a ledger.toml with transport = "local" (opens store and key)."""
        if config.local_dir is None:
            raise ValueError("transport 'local' needs local_dir")
        store, key = _open(config)
        try:
            return cls(
                store,
                key,
                ledger_id=config.ledger_id,
                local_dir=config.local_dir,
                clock=clock or clock_of(config),
                batch_max_records=config.batch_max_records,
                close=config.close,
                arrival=config.arrival,
                attestation_roots=config.attestation_roots,
            )
        except BaseException:
            store.close()
            raise

    def step(self) -> BatchReport | None:
        """Consume, fold and commit one batch; None when no source had anything."""
        items = self.source.poll(self.batch_max_records)
        if not items:
            return None
        report = self.ingestor.ingest(items)
        self.source.advance(items)
        return report

    def close_due(self) -> int:
        """Publish every due close into the ledger's own spool; return how many."""
        if not self.close_enabled:
            return 0
        pending = self.closer.pending()
        if not pending:
            return 0
        publish_local(
            self.local_dir,
            ledger_source(self.ledger_id),
            [e for _, e in pending],
            stamps_ms=self.close_stamps(pending),
        )
        self.closer.published(p for p, _ in pending)
        self.metrics.closes.inc(len(pending))
        return len(pending)

    def run_until_idle(self, max_passes: int = MAX_IDLE_PASSES) -> RunReport:
        """Consume everything available, close what is due, repeat until nothing is left."""
        started = time.perf_counter()
        run = RunReport()
        for _ in range(max_passes):
            report = self.step()
            if report is not None:
                run.add(report)
                continue
            published = self.close_due()
            run.closes_published += published
            if published == 0:
                break
        else:
            raise RuntimeError(f"run_until_idle did not settle in {max_passes} passes")
        run.seconds = time.perf_counter() - started
        return run

    def run_forever(self, stop: threading.Event, idle_sleep_s: float = 0.2) -> RunReport:
        """Poll until ``stop`` is set (the daemon of transport = "local")."""
        run = RunReport()
        while not stop.is_set():
            report = self.step()
            if report is not None:
                run.add(report)
                continue
            run.closes_published += self.close_due()
            stop.wait(idle_sleep_s)
        return run


# ---- Kafka transport -------------------------------------------------------------------------


class KafkaLedgerService(_ServiceCore):
    """The ledger over the shard's Kafka partitions (asyncio)."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        kafka: KafkaConfig,
        *,
        clock: Clock = real_clock,
        batch_max_records: int = DEFAULT_BATCH_MAX_RECORDS,
        close: bool = True,
        metrics: LedgerMetrics | None = None,
        arrival: Arrival = "log",
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
        crypto_worker: bool = True,
    ) -> None:
        super().__init__(
            store,
            key,
            clock=clock,
            batch_max_records=batch_max_records,
            close=close,
            metrics=metrics,
            arrival=arrival,
            attestation_roots=attestation_roots,
            crypto_worker=crypto_worker,
        )
        self.kafka = kafka
        # SPEC §6.5 across shards: terms claim their GPUs through the capacity topic.
        self.capacity: KafkaCapacityLog | None = None
        if kafka.capacity_topic is not None:
            settings = replace(kafka.settings, topic=kafka.capacity_topic)
            self.capacity = KafkaCapacityLog(settings, key, kafka.capacity_ledger_keys)
        # Wall-clock ms when every owned partition was last read to its end offset (and
        # committed): a checkpoint served to witnesses while behind would be followed by
        # records appended to the log before the witnesses' cosignature (SPEC §8.4).
        self.caught_up_ms: int | None = None
        try:
            self.source = KafkaSource(
                kafka, store.offsets(), max_poll_records=batch_max_records, arrival=arrival
            )
        except BaseException:
            self.ingestor.close()
            raise
        # The next batches (at most two), polled and opened, their signatures being
        # checked in the worker while the current one folds and commits; not committed,
        # so not in the store's offsets: dropped on stop, read again after a restart.
        self._ahead: deque[Prepared] = deque()
        # The next batch, folded while the step before committed (not committed either:
        # the next step commits it; dropped on stop like the batches ahead).
        self._folded: tuple[Folded, Sequence[Item]] | None = None
        # SPEC §6.5 rule 6: the capacity releases the folded-ahead batch owes, published
        # only once that batch is committed (the fold's list holds the next batch's too)
        self._folded_owed: list[PendingRelease] = []
        # A batch's store commit runs here (DuckDB releases the GIL) while the event loop
        # polls and opens the batch after next and folds the next; joined before the step
        # returns.
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="ledger-commit")

    def close(self) -> None:
        """Stop the commit thread, the crypto worker; close the store (after ``stop``)."""
        self._committer.shutdown(wait=True)
        super().close()

    @classmethod
    def from_config(cls, config: LedgerConfig, clock: Clock | None = None) -> KafkaLedgerService:
        """A service for a ledger.toml with transport = "kafka" (opens store and key)."""
        if config.kafka is None:
            raise ValueError("transport 'kafka' needs [kafka]")
        store, key = _open(config)
        return cls(
            store,
            key,
            config.kafka,
            clock=clock or clock_of(config),
            batch_max_records=config.batch_max_records,
            close=config.close,
            arrival=config.arrival,
            attestation_roots=config.attestation_roots,
            crypto_worker=config.crypto_worker,
        )

    async def start(self) -> None:
        """Start the signature worker, connect the consumer (assign partitions, seek to
        stored offsets)."""
        self.ingestor.start()
        await self.source.start()
        if self.capacity is not None:
            await self.capacity.start()
            # SPEC §6.5 rule 6: releases a shard killed after a commit did not publish
            owed = await release_owed_at_start(self.capacity, self.store)
            if owed:
                log.info("capacity_releases_owed_at_start", releases=owed)

    async def stop(self) -> None:
        """Disconnect the consumer (batches polled or folded ahead are dropped: not
        committed; with one folded, the Ingestor refuses further batches)."""
        self._ahead.clear()
        if self._folded is not None:
            folded, self._folded = self._folded, None
            self.ingestor.discard(folded[0])
            self._folded_owed = []  # its releases with it: owed only once it is committed
        await self.source.stop()
        if self.capacity is not None:
            await self.capacity.stop()

    async def step(self, timeout_ms: int = POLL_TIMEOUT_MS) -> BatchReport | None:
        """Commit one batch: the one the step before folded ahead, else the next one
        polled ahead by earlier steps, else one polled now (None when nothing arrived in
        time), folded now.

        While this batch's commit runs on the commit thread, the batch after next is
        polled (waiting at most ``POLL_AHEAD_MS`` when nothing is ahead) and opened, its
        signatures sent to the worker process, and the next batch is folded (its reads
        of the store wait for this commit: ``Ingestor._settled``). Only committed batches
        move the stored offsets; the step returns once this one is."""
        ahead = self._ahead
        ingestor = self.ingestor
        if self._folded is not None:
            (folded, items), self._folded = self._folded, None
            owed, self._folded_owed = self._folded_owed, []
        else:
            if ahead:
                prepared = ahead.popleft()
            else:
                polled = await self.source.poll(self.batch_max_records, timeout_ms)
                if not polled:
                    return None
                prepared = ingestor.prepare(polled)
            if not ahead:
                await self._poll_ahead([prepared], POLL_AHEAD_MS)
            await self._claim(prepared.items)
            folded, items = ingestor.fold_batch(prepared), prepared.items
            owed = self._take_owed()
        commit = ingestor.commit_on(self._committer, folded)
        try:
            if len(ahead) < AHEAD_BATCHES:
                await self._poll_ahead(list(ahead), POLL_AHEAD_MS if not ahead else 0)
            if ahead:
                following = ahead.popleft()
                await self._claim(following.items)
                self._folded = (ingestor.fold_batch(following), following.items)
                self._folded_owed = self._take_owed()
        finally:
            commit.result()  # never leave the store to the thread (also if cancelled)
        report = ingestor.finish(folded)
        self.source.advance(items)
        if self.capacity is not None:
            await release_owed(self.capacity, owed)
        return report

    def _take_owed(self) -> list[PendingRelease]:
        """The capacity releases the batch just folded owes (taken from the fold)."""
        fold = self.ingestor.fold
        owed, fold.capacity_releases = fold.capacity_releases, []
        return owed

    async def _claim(self, items: Sequence[Item]) -> None:
        """SPEC §6.5 across shards: the batch's terms decided by the capacity log."""
        if self.capacity is not None:
            await claim_batch(self.capacity, self.ingestor.fold, items)

    async def _poll_ahead(self, unfolded: list[Prepared], timeout_ms: int) -> None:
        """Poll a batch and open it (its checks to the worker) behind ``unfolded``."""
        items = await self.source.poll(self.batch_max_records, timeout_ms)
        if items:
            self._ahead.append(self.ingestor.prepare(items, ahead_of=unfolded))

    def pending_ahead(self) -> int:
        """Inputs polled ahead of the next step (opened or folded, not committed)."""
        folded = 0 if self._folded is None else len(self._folded[1])
        return folded + sum(len(p.items) for p in self._ahead)

    async def close_due(self) -> int:
        """Publish every due close into its placement's partition; return how many."""
        if not self.close_enabled:
            return 0
        pending = self.closer.pending()
        if not pending:
            return 0
        for attempt in range(1, CLOSE_PUBLISH_ATTEMPTS + 1):
            try:
                await publish_kafka(
                    self.kafka.settings, pending, timestamps_ms=self.close_stamps(pending)
                )
                break
            except Exception as exc:  # a broker outage: retry, then leave it for next round
                log.warning("close_publish_failed", attempt=attempt, error=repr(exc))
                if attempt == CLOSE_PUBLISH_ATTEMPTS:
                    return 0
                await asyncio.sleep(CLOSE_PUBLISH_BACKOFF_S * attempt)
        self.closer.published(p for p, _ in pending)
        self.metrics.closes.inc(len(pending))
        return len(pending)

    async def close_when_caught_up(self) -> int:
        """``close_due`` once every owned partition is read to its end offset (0 until
        then): a placement's close may already be further down its partition."""
        if await self.update_lag() > 0:
            return 0
        return await self.close_due()

    async def update_lag(self) -> int:
        """Refresh the lag gauges; return the total lag."""
        total = 0
        for lag in await self.source.lag():
            behind = max(0, lag.end_offset - lag.next_offset)
            self.metrics.lag.labels(f"{self.kafka.topic}:{lag.partition}").set(behind)
            total += behind
        if total == 0:
            self.caught_up_ms = int(time.time() * 1000)
        return total

    def behind_log(self) -> str | None:
        """SPEC §8.4: why no checkpoint is served to witnesses now — None when every owned
        partition was read to its end within MAX_CLOCK_SKEW_MS / 2 (the other half of the
        skew is the witness's clock against the broker's)."""
        if self.caught_up_ms is None:
            return "the ledger has not read its partitions to their end yet"
        age = int(time.time() * 1000) - self.caught_up_ms
        if age > MAX_CLOCK_SKEW_MS // 2:
            return f"the ledger was last caught up with its log {age} ms ago"
        return None

    async def run_until(
        self,
        done: Callable[[], bool] | None = None,
        *,
        deadline_s: float,
        idle_poll_ms: int = POLL_TIMEOUT_MS,
    ) -> RunReport:
        """Run until ``done()`` holds — or, without ``done``, until caught up with nothing
        left to close — or raise TimeoutError at ``deadline_s`` seconds from now."""
        started = time.perf_counter()
        run = RunReport()
        deadline = time.monotonic() + deadline_s
        while True:
            if done is not None and done():
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"ledger run did not finish within {deadline_s} s")
            report = await self.step(idle_poll_ms)
            if report is not None:
                run.add(report)
                continue
            if await self.update_lag() > 0:
                continue  # an empty poll with more to read: not idle, closes wait
            published = await self.close_due()
            run.closes_published += published
            if published:
                continue
            if done is None:
                break
        run.seconds = time.perf_counter() - started
        return run

    async def run_forever(self, stop: asyncio.Event) -> RunReport:
        """Consume until ``stop`` is set (the daemon of transport = "kafka")."""
        run = RunReport()
        last_lag = 0.0
        while not stop.is_set():
            report = await self.step()
            if report is not None:
                run.add(report)
            else:
                run.closes_published += await self.close_when_caught_up()
                last_lag = time.monotonic()  # close_when_caught_up refreshed the gauges
            if time.monotonic() - last_lag >= 1.0:
                await self.update_lag()
                last_lag = time.monotonic()
        return run
