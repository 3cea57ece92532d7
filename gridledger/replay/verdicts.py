"""The replay's verdicts: exports handed to the verifier's workers as they are written,
their verdicts counted in the order handed (``_Verdicts``)."""

from __future__ import annotations

import resource
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from gridledger.placement_plan import Placement
from gridledger.replay.measure import cpu_seconds, quiet_logs
from gridledger.replay_limits import MAX_VERIFY_IN_FLIGHT, VERIFY_POOL
from proto.trust import TrustFile, dump_trust
from verifier.limits import VERIFY_BATCH_EXPORTS

if TYPE_CHECKING:
    from gridledger.replay.run import _ReplayRun
    from verifier.state import ExportReport


@dataclass(frozen=True)
class VerifySummary:
    """What the replay keeps of one export's verification (small, picklable)."""

    why: str
    totals: dict[str, int] | None
    currency: str
    currency_scale: int
    elapsed_s: float
    cpu_s: float = 0.0
    """The worker's CPU for this export, its own threads and any process it waited for."""
    records: int = 0
    """The export's LedgerRecords (its report's count; 0 when unusable)."""


_TRUST_CACHE: dict[bytes, TrustFile] = {}


def verify_one(path: str, trust_bytes: bytes) -> VerifySummary:
    """Verify one export (in a worker process); ``why`` is empty when it verified, final."""
    from verifier.verify import small_export, verify_export
    from verifier.workers import OpenPool

    trust = _worker_trust(trust_bytes)
    started = time.perf_counter()
    cpu_before = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN)
    try:
        # a big export's ranges read in this thread (a small one's: its rows, as planned)
        with OpenPool[Any](VERIFY_POOL, reads_ranges=not small_export(Path(path))) as pool:
            result = verify_export(Path(path), trust, pool=pool)
    except Exception as exc:  # a verifier crash is a failed verdict, named
        why = f"verifier raised {type(exc).__name__}: {exc}"
        return VerifySummary(why, None, "", 0, time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before
    return _summary(result, elapsed, cpu)


def _worker_trust(trust_bytes: bytes) -> TrustFile:
    """The trust file a worker process verifies with (decoded once per process), its logs
    quieted."""
    quiet_logs()
    trust = _TRUST_CACHE.get(trust_bytes)
    if trust is None:
        trust = msgspec.json.decode(trust_bytes, type=TrustFile)
        _TRUST_CACHE[trust_bytes] = trust
    return trust


def _summary(result: ExportReport, elapsed: float, cpu: float) -> VerifySummary:
    """A report as the replay counts it: ``why`` empty when it verified, final."""
    records = int(result.counts.get("records", 0))
    if not result.ok or result.totals is None or not result.final:
        kept = result.findings.kept
        why = result.error or (kept[0].line() if kept else f"{result.verdict}, not final")
        return VerifySummary(why, None, "", 0, elapsed, cpu, records)
    return VerifySummary(
        "", result.totals, result.currency, result.currency_scale, elapsed, cpu, records
    )


class _Verdicts:
    """Exports handed to the verifier's workers as they are written, their verdicts
    counted in the order handed (``_ReplayRun.settle_export``): at most
    MAX_VERIFY_IN_FLIGHT in flight, the caller waits for the oldest beyond that.

    Small exports (``verifier.limits.SMALL_EXPORT_BYTES``) wait in ``queue`` and go to a
    worker BATCH at a time (``verifier.verify.verify_exports``: the obligation's SQL once
    per batch, each report as the export's alone): a batch goes when full, when its
    oldest export has waited BATCH_WAIT_S (checked as exports come and after each step),
    before a big export (the order handed is kept), and at the drain; at the in-flight
    bound the caller waits for the oldest verdict handed out (the queue only goes when
    nothing else is out)."""

    BATCH: Final = VERIFY_BATCH_EXPORTS  # what `verify` hands verify_exports at a time
    BATCH_WAIT_S: Final = 2.0

    def __init__(
        self,
        run: _ReplayRun,
        exports: Path,
        pool: ProcessPoolExecutor,
        placements: Sequence[Placement] = (),
    ) -> None:
        self.run = run
        self.exports = exports
        self.pool = pool
        self.trust = dump_trust(run.cast.trust(simulations=True))  # a simulation: §6.6
        # (placement, its future, its position in the future's batch; None: verify_one's)
        self.pending: deque[tuple[Placement, Future[Any], int | None]] = deque()
        self.queue: list[Placement] = []  # small exports not handed to a worker yet
        self.queued_at = 0.0  # when the oldest of them came (time.monotonic)
        self.handed: set[str] = set()
        self.placements = {p.placement_id: p for p in placements}

    def submit(self, placement: Placement) -> None:
        """Verify the export of ``placement`` (written to DIR/exports)."""
        from verifier.verify import small_export

        self.handed.add(placement.placement_id)
        out = self.exports / f"{placement.placement_id}.duckdb"
        if small_export(out):  # (no file: not small, the verifier says so alone)
            if not self.queue:
                self.queued_at = time.monotonic()
            self.queue.append(placement)
            if len(self.queue) >= self.BATCH:
                self.flush()
        else:
            self.flush()  # the small ones handed before it go first
            future = self.pool.submit(verify_one, str(out), self.trust)
            self.pending.append((placement, future, None))
        # The verifier may lag the exports by at most MAX_VERIFY_IN_FLIGHT: beyond it the
        # caller waits for the oldest verdict handed out. The queue is not handed out for
        # it: when the verifier lags, that would make every batch a batch of one (each
        # export then costs its own SQL pass: the whole trace's small exports cost 56 ms
        # of CPU each one by one against ~22 in batches).
        while len(self.pending) + len(self.queue) > MAX_VERIFY_IN_FLIGHT:
            if not self.pending:
                self.flush()
            self._settle_oldest()

    def flush(self) -> None:
        """Hand the queued small exports to a worker, as one batch (one alone: as a big
        one, a batch of one saves nothing)."""
        batch, self.queue = self.queue, []
        if batch:
            sizes = self.run.report.verifier_batches
            sizes[len(batch)] = sizes.get(len(batch), 0) + 1
        if len(batch) == 1:
            out = self.exports / f"{batch[0].placement_id}.duckdb"
            self.pending.append(
                (batch[0], self.pool.submit(verify_one, str(out), self.trust), None)
            )
        elif batch:
            paths = [str(self.exports / f"{p.placement_id}.duckdb") for p in batch]
            future = self.pool.submit(_Verdicts.verify_batch, paths, self.trust)
            self.pending.extend((p, future, k) for k, p in enumerate(batch))

    @staticmethod
    def verify_batch(paths: list[str], trust_bytes: bytes) -> list[VerifySummary]:
        """``verify_one`` of each path, as one batch (in a worker process); the batch's
        wall and CPU time shared evenly between its exports."""
        from verifier.verify import verify_exports

        trust = _worker_trust(trust_bytes)
        started = time.perf_counter()
        cpu_before = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN)
        try:
            results = verify_exports([Path(p) for p in paths], trust)
        except Exception:  # each alone, to name which one raised
            return [verify_one(p, trust_bytes) for p in paths]
        elapsed = (time.perf_counter() - started) / len(paths)
        cpu = (cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before) / len(paths)
        return [_summary(result, elapsed, cpu) for result in results]

    def exported(self, written: Sequence[tuple[str, str]]) -> None:
        """What the ledger process exported after a step: (placement, why not) each, an
        empty why for a file written. Submitted, then every verdict already in counted."""
        for pid, why in written:
            placement = self.placements.get(pid)
            if placement is None or pid in self.handed:
                continue  # not a placement of this plan, or handed already
            if why:
                self.handed.add(pid)
                self.run.report.failed.append((pid, f"not exported: {why}"))
            else:
                self.submit(placement)
        self.settle_ready()

    def settle_ready(self) -> None:
        """Count the verdicts already in, oldest first, without waiting; the queued small
        exports go once the oldest has waited BATCH_WAIT_S."""
        while self.pending and self.pending[0][1].done():
            self._settle_oldest()
        if self.queue and time.monotonic() - self.queued_at >= self.BATCH_WAIT_S:
            self.flush()

    def drain(self) -> None:
        """Wait for and count every verdict still out."""
        self.flush()
        while self.pending:
            self._settle_oldest()

    def _settle_oldest(self) -> None:
        placement, future, position = self.pending.popleft()
        result = future.result()
        summary = result if position is None else result[position]
        self.run.settle_export(self.exports, placement, summary)
