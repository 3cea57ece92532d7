"""Consumed inputs -> fold -> one committed batch. The application layer of the ledger.

``Ingestor.ingest`` applies every input of a batch to the fold, gathers what the fold
produced (records, quarantined inputs, duplicate counts, the state of every placement
the batch touched, a final statement for each placement the batch closed) together with
the sources' next positions, and commits it all in one store transaction. Only then are
closed placements evicted from memory (the fold reloads one from the store if a late
input arrives for it) and the usage events the batch accepted looked up in the store.

If the commit fails, the fold's memory is ahead of the store: the Ingestor refuses any
further batch, and the owner rebuilds it from the store (which is what a restart does).
The same holds when the fold itself fails half way (e.g. the signature worker died).

``Ingestor.prepare`` opens a batch and hands its signature checks to the crypto pool
before the batch before it is folded (the Kafka service's pipeline, ``ledger.service``);
``ingest`` then folds the prepared batch. With ``crypto_worker`` the checks run in one
worker process (``ledger.crypto.CryptoWorker``) instead of threads.

The Kafka service also folds batch N+1 while batch N commits on another thread
(``commit_on``): the fold's memory is then one batch ahead of the store. A fold reads the
store only through ``_settled`` (a placement evicted earlier, an accepted usage event of
an earlier batch), which first waits for the commit under way, so it reads what one batch
at a time would read. Which placements changed is taken with the batch at the end of its
fold (``Fold.clear_dirty``), before the next batch folds.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Literal, ParamSpec, TypeVar

import structlog

from ledger.crypto import CryptoWorker
from ledger.fold import Fold, FoldInput, Opening, Outcome
from ledger.inputs import Item
from ledger.limits import CRYPTO_THREADS, LOG_INPUT_LINES_PER_BATCH
from ledger.metrics import LedgerMetrics
from ledger.statements import make_statement
from ledger.store import Batch, ChainedRow, HeldRow, QuarantineRow, StateRow, Store
from proto.attestation import AttestationRoot
from proto.invariant import present
from proto.keys import SigningKey, key_id
from proto.records import PlacementTerms, UsageEvent

log = structlog.get_logger("ledger.ingest")

# The fold allocates some fifty objects per input, nearly all freed by reference counting
# within the input; CPython's default first-generation threshold (700) runs a cyclic
# collection every ~15 inputs, which re-traverses the young survivors (states, records
# of the batch) each time: ~9 us per input of the fold's ~60 (bench/fold_micro.py,
# BENCHMARKS.md). A larger threshold runs it every ~1000 inputs instead.
# Nothing is freed later than it would be otherwise except cyclic garbage (none on
# the hot path).
GC_THRESHOLD: Final = (50_000, 20, 10)


def tune_gc() -> None:
    """Raise the cyclic collector's thresholds to ``GC_THRESHOLD`` (never lower them)."""
    current = gc.get_threshold()
    if current[0] < GC_THRESHOLD[0]:
        gc.set_threshold(*GC_THRESHOLD)


def pause_collector() -> bool:
    """Turn the cyclic collector off for a batch; return whether it was on (for
    ``resume_collector``).

    A batch keeps every input's outcome, record and row alive until its commit, so a
    collection inside it (one per ~50,000 allocations even with ``GC_THRESHOLD``)
    traverses tens of thousands of young objects that reference counting frees a moment
    later anyway: 2.9-4.3 us of the main thread per input, nothing collected
    (measured with ``gc.callbacks``). After the batch its objects are freed and CPython's
    young-generation count falls with them, so paused collections are not simply moved
    to the end. Cyclic garbage made inside a batch still counts: once enough of it
    survives, the next allocation outside a batch collects it (bounded by the threshold).
    The collector is process-wide: other threads' cyclic garbage waits out the batch too.
    """
    enabled = gc.isenabled()
    gc.disable()
    return enabled


def resume_collector(was_enabled: bool) -> None:
    """Put the collector back as ``pause_collector`` found it."""
    if was_enabled:
        gc.enable()


def collect_if_due() -> None:
    """While the collector stays paused across batches (the Kafka service folds one batch
    while the one before it commits: no moment between batches), what it would do at its
    next allocation if it were on: collect the oldest generation whose count passed its
    threshold, at most one. Called once per batch (``Ingestor.finish``), so cyclic garbage
    stays bounded by the thresholds as with the collector on. (CPython also defers a full
    collection until a quarter of the long-lived objects are new; not visible from
    Python: a full collection here follows the count thresholds alone.)"""
    threshold = gc.get_threshold()
    if threshold[0] == 0:  # thresholds of 0: the collector is off
        return
    count = gc.get_count()
    for generation in (2, 1, 0):
        if count[generation] > threshold[generation]:
            gc.collect(generation)
            return


class IngestBroken(RuntimeError):
    """A batch failed to commit; this Ingestor's memory no longer matches the store."""


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What one batch did."""

    inputs: int
    chained: int
    quarantined: int
    dropped: int
    held: int
    closed: tuple[str, ...]
    seconds: float


class Prepared:
    """A batch opened ahead of its fold, its signature checks under way (``prepare``)."""

    __slots__ = ("inputs", "items", "opening")

    def __init__(self, items: Sequence[Item], inputs: list[FoldInput], opening: Opening) -> None:
        self.items = items
        self.inputs = inputs  # ``items`` as the fold takes them (``_fold_inputs``)
        self.opening = opening


def _fold_inputs(items: Sequence[Item]) -> list[FoldInput]:
    return [(item.data, item.position, item.stream_key, item.arrived_ms) for item in items]


@dataclass(slots=True)
class Folded:
    """A batch folded and not yet committed (``Ingestor.fold_batch``)."""

    batch: Batch
    inputs: int
    held: int
    closed: tuple[str, ...]
    started: float


_P = ParamSpec("_P")
_R = TypeVar("_R")


class Ingestor:
    """Folds batches of inputs into the store; see the module docstring."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        metrics: LedgerMetrics | None = None,
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
        *,
        crypto_worker: bool = False,
        max_held_bytes: int | None = None,
    ) -> None:
        """``max_held_bytes``: the ledger-wide bound on held inputs (SPEC §6.2; None:
        ``proto.limits.MAX_HELD_BYTES_LEDGER``), smaller in tests."""
        self.store = store
        self.key = key
        self.metrics = metrics
        self._arrival_mode: Literal["log", "sender"] | None = None
        tune_gc()
        # The commit running on another thread while the next batch folds (``commit_on``).
        self._committing: Future[None] | None = None
        # Batches folded and not finished, and the collector's state before the first.
        self._in_flight = 0
        self._collector_was_enabled = False
        self.fold = Fold(
            key,
            lookup=self._settled(store.lookup_usage),
            load_state=self._settled(store.load_state),
            attestation_roots=attestation_roots,
            max_held_bytes=max_held_bytes,
        )
        # Ed25519 checks run on these threads beside the fold, or in a worker process.
        if crypto_worker and multiprocessing.current_process().daemon:
            # A daemonic process (a test harness's, the replay's) may not have children.
            log.info("crypto_worker_unavailable", why="a daemonic process", using="threads")
            crypto_worker = False
        self._crypto: ThreadPoolExecutor | CryptoWorker = (
            CryptoWorker()
            if crypto_worker
            else ThreadPoolExecutor(CRYPTO_THREADS, thread_name_prefix="ledger-crypto")
        )
        self._broken = False
        # Lines naming one input each that this batch may still log, and those it did not
        # (event:reason -> count): ``_may_log``, ``LOG_INPUT_LINES_PER_BATCH``.
        self._lines_left = LOG_INPUT_LINES_PER_BATCH
        self._not_logged: Counter[str] = Counter()
        restored = 0
        for placement_id, snapshot in store.open_states():
            self.fold.restore(placement_id, snapshot)
            restored += 1
        self.fold.restore_capacity(store.capacity_claims())
        # SPEC §7.7: a placement whose stored state cannot be used is reported by name and
        # its inputs quarantined; it never stops the ledger for the others.
        for placement_id, why in sorted(self.fold.faulted.items()):
            log.error("placement_faulted", placement=placement_id, why=why)
        log.info("fold_restored", placements=restored - len(self.fold.faulted))

    @property
    def crypto_worker(self) -> CryptoWorker | None:
        """The signature worker process, if this Ingestor checks signatures in one."""
        return self._crypto if isinstance(self._crypto, CryptoWorker) else None

    def start(self) -> None:
        """Start the crypto worker process now, if there is one (else on first use)."""
        if isinstance(self._crypto, CryptoWorker):
            self._crypto.start()

    def close(self) -> None:
        """Stop the crypto threads or worker (the store is the owner's to close)."""
        if isinstance(self._crypto, CryptoWorker):
            self._crypto.close()
        else:
            self._crypto.shutdown(wait=True)

    def prepare(self, items: Sequence[Item], ahead_of: Sequence[Prepared] = ()) -> Prepared:
        """Open ``items`` and start their signature checks; ``ahead_of``: the prepared
        batches before them not folded yet (``Fold.open_batch``)."""
        if self._broken:
            raise IngestBroken("an earlier batch failed to fold or commit; rebuild from the store")
        inputs = _fold_inputs(items)
        opening = self.fold.open_batch(inputs, self._crypto, [p.opening for p in ahead_of])
        return Prepared(items, inputs, opening)

    def ingest(self, items: Sequence[Item] | Prepared) -> BatchReport:
        """Fold ``items`` (or a batch ``prepare`` opened) in order and commit the batch
        with the sources' next positions."""
        folded = self.fold_batch(items)
        self.commit(folded)
        return self.finish(folded)

    def fold_batch(self, items: Sequence[Item] | Prepared) -> Folded:
        """The first half of ``ingest``: fold the batch and gather what to store. The
        cyclic collector stays paused (``pause_collector``) until ``finish`` — until the
        last batch in flight finishes, when the next one folds while this one commits."""
        if self._broken:
            raise IngestBroken("an earlier batch failed to fold or commit; rebuild from the store")
        started = time.perf_counter()
        if self._in_flight == 0:
            self._collector_was_enabled = pause_collector()
        self._in_flight += 1
        try:
            return self._fold(items, started)
        except BaseException:
            self._fail()
            raise

    def commit(self, folded: Folded) -> None:
        """Commit a folded batch to the store (may run on another thread while the caller
        polls, opens and folds the next batches: it touches the store only, never the
        fold)."""
        try:
            self.store.commit_batch(folded.batch)
        except BaseException:
            self._fail()
            raise

    def commit_on(self, executor: Executor, folded: Folded) -> Future[None]:
        """``commit`` on ``executor``; until it is done, the fold's reads of the store
        (``_settled``) wait for it. The caller waits for the future before ``finish``."""
        committing = executor.submit(self.commit, folded)
        self._committing = committing
        return committing

    def finish(self, folded: Folded) -> BatchReport:
        """After ``commit``: evict closed placements, report; the collector back as it was
        before the first batch in flight (a due collection now if others still are)."""
        if self._committing is not None and self._committing.done():
            self._committing = None
        try:
            report = self._finish(folded)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                resume_collector(self._collector_was_enabled)
            elif self._collector_was_enabled:
                collect_if_due()
        self._log(report)
        return report

    def discard(self, folded: Folded) -> None:
        """Drop a folded batch that will not be committed (the service stopping with one
        folded ahead): the fold's memory is then ahead of the store, so this Ingestor
        refuses further batches; the store resumes from its offsets, as after a kill."""
        del folded
        self._fail()

    def _fail(self) -> None:
        """A batch failed (or was dropped) part way: refuse further batches and put the
        collector back as it was before the batches in flight."""
        self._broken = True
        self._committing = None
        if self._in_flight:
            self._in_flight = 0
            resume_collector(self._collector_was_enabled)

    def _arrival(self) -> Literal["log", "sender"]:
        """The store's arrival mode (SPEC §6.6), which every statement signs; read once
        (a store never changes it: ``Store.note_arrival``)."""
        if self._arrival_mode is None:
            self._arrival_mode = "sender" if self.store.arrival() == "sender" else "log"
        return self._arrival_mode

    def _settled(self, read: Callable[_P, _R]) -> Callable[_P, _R]:
        """``read`` of the store once the commit under way (``commit_on``), if any, is
        done: the fold of batch N+1 reads the store only as it is after batch N."""

        def settled(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            committing = self._committing
            if committing is not None:
                committing.result()
            return read(*args, **kwargs)

        return settled

    def _fold(self, prepared: Sequence[Item] | Prepared, started: float) -> Folded:
        if isinstance(prepared, Prepared):
            items, inputs, opening = prepared.items, prepared.inputs, prepared.opening
        else:
            items, inputs, opening = prepared, _fold_inputs(prepared), None
        batch = Batch()
        held = 0
        closes: dict[str, ChainedRow] = {}
        self._lines_left = LOG_INPUT_LINES_PER_BATCH
        self._not_logged.clear()
        try:
            outcomes = self.fold.apply_batch(inputs, self._crypto, opening)
        except BaseException:
            self._broken = True  # the fold's memory is part way through the batch
            raise
        # SPEC §6.2: rows of ``held_inputs`` to write (the inputs still held at the end of
        # the batch that were not before it) and to delete (held before, released now).
        # An outcome at a position that is not one of this batch's inputs is a release of
        # an input held by an earlier batch (its row goes; held again in its stream, a
        # new row replaces it). Each input of the batch has one outcome, and releases
        # more: with no more outcomes than inputs, nothing was released.
        holding: dict[tuple[str, str], Outcome] = {}
        released: list[tuple[str, str]] = []
        positions = {item.position for item in items} if len(outcomes) > len(items) else None
        for outcome in outcomes:
            if outcome.decision == "held":
                held += 1
            else:
                self._collect(batch, outcome, closes)
            placement_id = outcome.placement_id
            if placement_id is None or (positions is None and outcome.decision != "held"):
                continue  # never held; or nothing released in this batch (no row goes)
            key = (placement_id, outcome.position)
            if positions is not None and outcome.position not in positions:
                released.append(key)
            if outcome.decision == "held":
                holding[key] = outcome
            elif holding:
                holding.pop(key, None)
        batch.released = released
        for (placement_id, position), outcome in holding.items():
            batch.held.append(self._held_row(placement_id, position, outcome))
        offsets = batch.offsets
        for item in items:  # in order: the last input of each source wins
            offsets[item.source] = item.next_position
            if item.fed_by:
                offsets.update(item.fed_by)
        for placement_id in sorted(self.fold.dirty()):
            batch.states.append(
                StateRow(
                    placement_id=placement_id,
                    # Without its held inputs and seen hashes: they are rows (batch.held;
                    # placement_seen, from batch.chained), written once.
                    snapshot=self.fold.snapshot(placement_id, holds=False, seen=False),
                    closed=self.fold.is_closed(placement_id),
                    close_due_ms=self.fold.close_due_ms(placement_id),
                )
            )
        batch.claims = self.fold.capacity_rows()
        batch.claims_gone = self.fold.capacity_gone()
        for placement_id, row in sorted(closes.items()):
            # The final statement is through the close record itself, not the batch's last
            # record of the placement: batch boundaries differ between runs, this does not.
            terms = self._terms(placement_id)
            batch.statements.append(
                make_statement(
                    row.record, row.record_hash, terms, True, self.key, arrival=self._arrival()
                )
            )
        # What changed is in the batch now: the next batch may fold before it commits.
        self.fold.clear_dirty()
        if self._not_logged:
            log.warning(
                "inputs_not_logged",
                count=sum(self._not_logged.values()),
                by_event_reason=dict(sorted(self._not_logged.items())),
                why=f"at most {LOG_INPUT_LINES_PER_BATCH} lines per batch name an input; "
                "each is stored (quarantine table, chained records) and counted",
            )
        return Folded(batch, len(items), held, tuple(sorted(closes)), started)

    def _held_row(self, placement_id: str, position: str, outcome: Outcome) -> HeldRow:
        """The row of an input still held at the end of the batch: its held arrival as the
        fold keeps it, and for a stream hold (the placement has terms) its node and seq."""
        state = present(self.fold.state(placement_id), "state of a placement holding inputs")
        node_id: str | None = None
        seq: int | None = None
        if state.terms is not None:
            event = present(outcome.opened, "a held input's envelope").record
            if not isinstance(event, UsageEvent):
                raise AssertionError(f"a {outcome.kind} input held in a stream at {position}")
            node_id, seq = event.node_id, event.seq
        return HeldRow(
            placement_id,
            position,
            state.held_arrived.get(position),
            outcome.raw,
            node_id,
            seq,
        )

    def _finish(self, folded: Folded) -> BatchReport:
        batch = folded.batch
        # The events accepted since the last commit: in the store now (and a batch folded
        # since then, if any, finds its own in the store once its commit is done).
        self.fold.forget_accepted()
        # A closed placement leaves memory (reloaded, through ``_settled``, if a late
        # input comes: also when the batch folded since then changed it).
        closed_now = tuple(sorted(s.placement_id for s in batch.states if s.closed))
        for placement_id in closed_now:
            self.fold.evict(placement_id)
        seconds = time.perf_counter() - folded.started
        report = BatchReport(
            inputs=folded.inputs,
            chained=len(batch.chained),
            quarantined=len(batch.quarantined),
            dropped=sum(batch.dropped.values()),
            held=folded.held,
            closed=folded.closed,
            seconds=seconds,
        )
        self._count(batch, report)
        return report

    def _log(self, report: BatchReport) -> None:
        if report.inputs:
            log.info(
                "batch_folded",
                inputs=report.inputs,
                chained=report.chained,
                quarantined=report.quarantined,
                dropped=report.dropped,
                held=report.held,
                closed=len(report.closed),
                seconds=round(report.seconds, 3),
            )

    def _collect(self, batch: Batch, outcome: Outcome, closes: dict[str, ChainedRow]) -> None:
        if outcome.decision == "dropped":
            batch.dropped[present(outcome.placement_id, "placement of a dropped input")] += 1
        elif outcome.decision == "quarantined":
            reason = outcome.reason.value if outcome.reason is not None else "MALFORMED"
            batch.quarantined.append(
                QuarantineRow(
                    position=outcome.position,
                    raw=outcome.raw,
                    reason=reason,
                    detail=outcome.detail,
                    placement_id=outcome.placement_id,
                )
            )
            if self._may_log("input_quarantined", reason):
                log.info("input_quarantined", position=outcome.position, reason=reason)
        elif outcome.decision == "chained":
            record = outcome.record
            opened = outcome.opened
            if (
                record is None
                or opened is None
                or outcome.record_payload is None
                or outcome.record_hash is None
            ):
                raise AssertionError(f"chained outcome at {outcome.position} lacks its record")
            row = ChainedRow(  # positional: one per chained input
                record,
                outcome.record_hash,  # record_hash
                outcome.position,  # position
                outcome.raw,  # raw
                outcome.input_hash,  # input_hash
                opened.record_hash,  # payload_hash
                opened.record,  # input_record
                outcome.record_payload,  # record_payload
                opened.envelope,  # input_envelope
            )
            batch.chained.append(row)
            if record.kind == "terms" and record.status == "rejected":
                reason = outcome.reason.value if outcome.reason is not None else ""
                if self._may_log("terms_rejected", reason):
                    self._terms_rejected(outcome, opened.record)
            if record.kind == "closed" and record.status == "accepted":
                closes[record.placement_id] = row

    def _may_log(self, event: str, reason: str) -> bool:
        """Whether this batch may still log a line naming one input; if not, count it."""
        if self._lines_left > 0:
            self._lines_left -= 1
            return True
        self._not_logged[f"{event}:{reason}"] += 1
        return False

    def _terms_rejected(self, outcome: Outcome, terms: object) -> None:
        """Every rejected terms input, with its reason, at warning: a placement whose terms
        the ledger refuses is otherwise silent until someone asks for its statement."""
        extra: dict[str, str] = {}
        if isinstance(terms, PlacementTerms) and terms.ledger_key != self.key.public_key:
            extra = {
                "terms_ledger_key": key_id(terms.ledger_key),
                "this_ledger_key": self.key.key_id,
                "hint": "the terms name another ledger: this ledger's key file is not the "
                "terms' ledger_key",
            }
        log.warning(
            "terms_rejected",
            placement=outcome.placement_id,
            reason=outcome.reason.value if outcome.reason is not None else "",
            detail=outcome.detail,
            position=outcome.position,
            **extra,
        )

    def _terms(self, placement_id: str) -> PlacementTerms:
        terms = self.fold.terms(placement_id)
        if terms is None:
            terms = self._settled(self.store.terms)(placement_id)
        if terms is None:
            raise AssertionError(f"placement {placement_id} closed without accepted terms")
        return terms

    def _count(self, batch: Batch, report: BatchReport) -> None:
        m = self.metrics
        if m is None:
            return
        m.batch_seconds.observe(report.seconds)
        m.inputs.labels("chained").inc(report.chained)
        m.inputs.labels("quarantined").inc(report.quarantined)
        m.inputs.labels("dropped").inc(report.dropped)
        m.inputs.labels("held").inc(report.held)
        m.duplicates.inc(report.dropped)
        statuses = Counter(row.record.status for row in batch.chained)
        for status, n in statuses.items():
            m.records.labels(status).inc(n)
        rejected = Counter(r.record.reason for r in batch.chained if r.record.status == "rejected")
        for reason, n in rejected.items():
            m.rejected.labels(reason).inc(n)
        for reason, n in Counter(q.reason for q in batch.quarantined).items():
            m.quarantined.labels(reason).inc(n)
        m.open_placements.set(len(self.fold.open_placements()))
