"""The replay's ledger: in the replay's process (``_InProcessLedger``) or in a process of
its own (``_LedgerProcess``, ``ledger_main``), and the exports it writes of closed
placements."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import structlog

from gridledger.replay.measure import _Timer, cpu_seconds, own_peak_rss_mib, quiet_logs
from gridledger.replay_limits import (
    EXPORT_CHUNK,
    LEDGER_IDLE_POLL_MS,
    LEDGER_PROCESS_EXIT_S,
    LEDGER_STEP_DEADLINE_S,
    MAX_LEDGER_LAG_EVENTS,
    MAX_LEDGER_STEPS_AHEAD,
)
from gridledger.replay_terms import ReplayCast, make_replay_cast
from ledger.config import KafkaConfig
from ledger.export import ExportedAll, export_all
from ledger.service import KafkaLedgerService
from ledger.store import Store
from proto.keys import SigningKey
from transport.kafka import KafkaSettings

log = structlog.get_logger("gridledger.replay")

# The largest placement the replay exports compact (see compact_exports).
COMPACT_MAX_RECORDS: Final = 4096


def export_chunk(
    store: Store, exports: Path, key: SigningKey, placement_ids: list[str]
) -> ExportedAll:
    """``export_all`` of ``placement_ids``: those of at most COMPACT_MAX_RECORDS records
    compact (where the DuckDB writes that format), the others in the portable format, in
    one pass (``export_all`` knows each chain's size from its attestation)."""
    limit = COMPACT_MAX_RECORDS if compact_exports() else None
    return export_all(
        store, exports, key=key, placement_ids=placement_ids, compact_max_records=limit
    )


def compact_exports() -> bool:
    """Whether the replay writes its small exports compact (proto/EXPORT.md "Readers":
    DuckDB 1.2's storage format, 16 KiB blocks): yes wherever the DuckDB running writes
    that format.

    Each export is written for this package's verifier and removed once it verified (the
    store writes any again, in the portable format, with ``gridledger ledger export``).
    Measured (400 small placements of the trace's store, alternated, load 6-7):
    12.5-13.7 against 17.4-21.2 ms of the ledger's CPU per export and 0.38 against 2.81 MB
    of disk; the verifier's CPU per export the same within the noise. Only placements of
    at most COMPACT_MAX_RECORDS records: the verifier reads a large compact file 5-10 %
    slower (the trace's largest, ~200k records: 5.1-5.7 against 4.8-5.0 s of CPU), which
    over the whole trace took back what the ledger saved."""
    import duckdb

    major, minor = (int(part) for part in duckdb.__version__.split(".")[:2])
    return (major, minor) >= (1, 2)


def store_counts(store: Store) -> tuple[int, int]:
    """(usage events accepted, inputs rejected) of a replay's store."""
    counts = store.query("SELECT status, count(*) FROM records WHERE kind = 'usage' GROUP BY 1")
    accepted = {str(s): int(n) for s, n in counts}.get("accepted", 0)
    rejected = int(store.query("SELECT count(*) FROM records WHERE status = 'rejected'")[0][0])
    return accepted, rejected


def closed_placements(store: Store) -> set[str]:
    """Placements the store holds an accepted close of."""
    return {
        str(row[0])
        for row in store.query(
            "SELECT DISTINCT placement_id FROM records "
            "WHERE kind = 'closed' AND status = 'accepted'"
        )
    }


def export_closed(
    store: Store, key: SigningKey, exports: Path, exported: set[str]
) -> tuple[list[tuple[str, str]], float]:
    """Export the placements closed in ``store`` and not in ``exported`` yet, EXPORT_CHUNK
    at a time with ``export_all``, and add them to ``exported``; return (placement, why
    not) for each (an empty why: written to ``exports/<placement>.duckdb``) and the
    seconds it took. A closed placement is final: its export is its settled chain."""
    started = time.perf_counter()
    fresh = sorted(closed_placements(store) - exported)
    out: list[tuple[str, str]] = []
    for at in range(0, len(fresh), EXPORT_CHUNK):
        chunk = fresh[at : at + EXPORT_CHUNK]
        done = export_chunk(store, exports, key, chunk)
        for pid in chunk:
            exported.add(pid)
            out.append((pid, "" if pid in done.written else done.skipped.get(pid, "not exported")))
    return out, time.perf_counter() - started


class _ClockHolder:
    """The ledger's simulated clock: the end of the step the replay has reached."""

    def __init__(self) -> None:
        self.value = 0

    def read(self) -> int:
        return self.value


class _InProcessLedger:
    """The ledger of a Kafka replay in the replay's own process, one step at a time."""

    def __init__(
        self, store: Store, cast: ReplayCast, settings: KafkaSettings, seconds: dict[str, float]
    ) -> None:
        self.now = _ClockHolder()
        self.seconds = seconds
        self.service = KafkaLedgerService(
            store,
            cast.ledger,
            KafkaConfig(settings=settings),
            clock=self.now.read,
            arrival="sender",
        )
        self.store = store
        self.started = False
        self.duckdb_peak_mib = 0.0

    async def start(self) -> None:
        await self.service.start()
        self.started = True

    def sample_duckdb(self) -> None:
        """Note the store's DuckDB memory now (its buffer pool, capped by the store)."""
        rows = self.store.query("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
        used = int(rows[0][0] or 0) if rows else 0
        self.duckdb_peak_mib = max(self.duckdb_peak_mib, used / 2**20)

    async def step(self, until_ms: int, records: int) -> None:
        del records  # folded before the next step starts: nothing in flight
        self.now.value = until_ms
        with _Timer(self.seconds, "ledger"):
            await self.service.run_until(
                deadline_s=LEDGER_STEP_DEADLINE_S, idle_poll_ms=LEDGER_IDLE_POLL_MS
            )
        self.sample_duckdb()

    def lag_records(self) -> int | None:
        """Nothing in flight once ``step`` returns: no lag to show."""
        return None

    async def drain(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def close(self) -> None:
        """Stop the consumer and close the store (the exports reopen it)."""
        try:
            if self.started:
                await self.service.stop()
        finally:
            self.service.close()


class LedgerProcessError(RuntimeError):
    """The replay's ledger process failed, ended or fell silent (one line, for the CLI)."""


@dataclass(frozen=True)
class _LedgerJob:
    """What the ledger process of a Kafka replay needs (picklable)."""

    db: str
    seed: str
    buyers: int
    bootstrap: str
    topic: str
    max_commands: int
    exports: str = ""
    """Where the ledger process exports each placement once closed, after the step that
    closed it (empty: it does not export; the replay exports at the end)."""


class _LedgerProcess:
    """The ledger of a Kafka replay in a process of its own (``ledger_main``): the agents
    and shippers and the ledger on separate cores, Kafka the queue between them.

    The replay tells it each step's end once the step's records are acknowledged; the
    ledger sets its clock there, folds until caught up and closes what is due, then says
    so. The replay runs ahead by at most MAX_LEDGER_STEPS_AHEAD steps and, beyond one
    step, MAX_LEDGER_LAG_EVENTS records: the lag is bounded in events.

    With ``job.exports`` the ledger process (the store's one writer) also exports every
    placement closed by a step right after it and names them in its answer, which the
    replay hands to ``on_exported`` (the verifier's queue): exports and verification run
    while later steps do, not after the last one.

    The process is not daemonic, so the ledger service in it checks signatures in its
    own worker process (``ledger.crypto.CryptoWorker``; a daemonic process may have no
    children, and would keep them on threads). It never outlives the replay all the same:
    ``close`` (always reached, in a ``finally``) ends it if it was not told to stop, with
    SIGKILL after ``LEDGER_PROCESS_EXIT_S`` if SIGTERM did not; a replay killed outright
    closes the pipe, and the ledger process ends at its next read (``ledger_main``); its
    worker ends with it (its input ends: ``ledger.crypto_worker``).
    """

    def __init__(
        self,
        job: _LedgerJob,
        seconds: dict[str, float],
        on_exported: Callable[[Sequence[tuple[str, str]]], None] | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process holding DuckDB
        self.conn, child = context.Pipe()
        self.seconds = seconds
        self.outstanding: deque[int] = deque()
        self.peak_rss_mib = 0.0
        self.duckdb_peak_mib = 0.0
        # phase -> the peak RSS the ledger process reached during it (_PhasePeaks)
        self.peak_by_phase: dict[str, float] = {}
        self.process = context.Process(
            target=ledger_main, args=(child, job), name="replay-ledger", daemon=False
        )
        self.process.start()
        child.close()
        self.stopped = False
        self.reported_failure = False
        self.on_exported = on_exported
        self.counts: tuple[int, int] = (0, 0)
        """(usage events accepted, inputs rejected) of the store, reported on stop."""
        self.crypto_worker = False
        """Whether the ledger checked signatures in a worker process, reported on stop."""
        self.cpu: dict[str, float] = {}
        """CPU seconds of the ledger process (ReplayReport.cpu_seconds's ledger keys)."""

    async def start(self) -> None:
        self._expect("ready")

    def lag_records(self) -> int:
        """Records acknowledged by Kafka whose step the ledger has not finished yet."""
        return sum(self.outstanding)

    async def step(self, until_ms: int, records: int) -> None:
        self.conn.send(("step", until_ms))
        self.outstanding.append(records)
        with _Timer(self.seconds, "ledger_wait"):
            while len(self.outstanding) > MAX_LEDGER_STEPS_AHEAD or (
                len(self.outstanding) > 1 and self.lag_records() > MAX_LEDGER_LAG_EVENTS
            ):
                self._wait_one()

    async def drain(self) -> None:
        with _Timer(self.seconds, "ledger_wait"):
            while self.outstanding:
                self._wait_one()

    async def stop(self) -> None:
        """Drain, then let the ledger close its store and end."""
        await self.drain()
        self.conn.send(("stop", 0))
        _, duckdb_mib, rss_mib, export_s, exported, counts, reached, worker, cpu = self._expect(
            "stopped"
        )
        self.crypto_worker = bool(worker)
        own, workers = cpu
        self.cpu["ledger"] = float(own)
        self.cpu["ledger_workers"] = float(workers)
        self.peak_rss_mib = float(rss_mib)
        self.peak_by_phase = {str(k): float(v) for k, v in reached.items()}
        self.duckdb_peak_mib = float(duckdb_mib)
        self.counts = (int(counts[0]), int(counts[1]))
        self._exported(float(export_s), exported)
        self.process.join(LEDGER_PROCESS_EXIT_S)
        self.stopped = True
        if self.process.exitcode != 0:
            raise LedgerProcessError(
                f"the ledger process ended with exit code {self.process.exitcode}"
            )

    async def close(self) -> None:
        """After ``stop``, or after the process reported its own failure (it exits by
        itself): wait for it; else (the replay failed) end it, then wait."""
        if not (self.stopped or self.reported_failure) and self.process.is_alive():
            self.process.terminate()
        self.process.join(LEDGER_PROCESS_EXIT_S)
        if self.process.is_alive():  # not daemonic: never leave it to the interpreter's exit
            log.error("ledger_process_killed", pid=self.process.pid, waited_s=LEDGER_PROCESS_EXIT_S)
            self.process.kill()
            self.process.join(LEDGER_PROCESS_EXIT_S)
        self.conn.close()

    def _wait_one(self) -> None:
        _, _, ledger_s, export_s, exported, fold_cpu, export_cpu = self._expect("done")
        self.outstanding.popleft()
        self.seconds["ledger"] = self.seconds.get("ledger", 0.0) + float(ledger_s)
        self.cpu["ledger_fold"] = self.cpu.get("ledger_fold", 0.0) + float(fold_cpu)
        self.cpu["ledger_export"] = self.cpu.get("ledger_export", 0.0) + float(export_cpu)
        self._exported(float(export_s), exported)

    def _exported(self, export_s: float, exported: Sequence[tuple[str, str]]) -> None:
        if export_s > 0:
            self.seconds["export"] = self.seconds.get("export", 0.0) + export_s
        if exported and self.on_exported is not None:
            self.on_exported(exported)

    def _expect(self, kind: str) -> tuple[Any, ...]:
        if not self.conn.poll(LEDGER_STEP_DEADLINE_S):
            raise LedgerProcessError(
                f"the ledger process said nothing in {LEDGER_STEP_DEADLINE_S} s"
            )
        try:
            reply: tuple[Any, ...] = self.conn.recv()
        except EOFError:
            self.process.join(LEDGER_PROCESS_EXIT_S)
            raise LedgerProcessError(
                f"the ledger process ended (exit code {self.process.exitcode})"
            ) from None
        if reply[0] == "error":
            self.reported_failure = True
            raise LedgerProcessError(f"the ledger process failed: {reply[1]}")
        if reply[0] != kind:
            raise LedgerProcessError(f"the ledger process said {reply[0]!r}, expected {kind!r}")
        return reply


class _PhasePeaks:
    """Which phase of the ledger process set its peak RSS: the high-water mark
    (``own_peak_rss_mib``) read before and after each phase; a phase during which it rose is
    where it was reached (the process's transients, e.g. a big export, show up here where
    a sample between phases would miss them)."""

    def __init__(self) -> None:
        self.reached: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = own_peak_rss_mib()
        try:
            yield
        finally:
            after = own_peak_rss_mib()
            if after > before:
                self.reached[name] = max(self.reached.get(name, 0.0), after)


def ledger_main(conn: Connection, job: _LedgerJob) -> None:
    """The ledger process of a Kafka replay (``_LedgerProcess``): the ledger service on
    the replay's topic with arrival = "sender", its clock set to each step's end."""
    quiet_logs()
    try:
        asyncio.run(_ledger_loop(conn, job))
    except EOFError:
        return  # the replay is gone: the store is the ledger's own, kill-safe as ever
    except Exception as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}", 0.0))
        raise SystemExit(1) from None


async def _ledger_loop(conn: Connection, job: _LedgerJob) -> None:
    cast = make_replay_cast(job.seed, job.buyers)
    settings = KafkaSettings(bootstrap=job.bootstrap, topic=job.topic)
    ledger = _InProcessLedger(
        Store(Path(job.db), ledger_public_key=cast.ledger.public_key), cast, settings, {}
    )
    exports = Path(job.exports) if job.exports else None
    exported: set[str] = set()
    peaks = _PhasePeaks()

    def export() -> tuple[list[tuple[str, str]], float]:
        if exports is None:
            return [], 0.0
        with peaks.phase("export"):
            written = export_closed(ledger.store, cast.ledger, exports, exported)
        ledger.sample_duckdb()
        return written

    try:
        with peaks.phase("start"):
            await ledger.start()
        conn.send(("ready", 0, 0.0))
        for _ in range(job.max_commands):
            # Waits and exports run on a thread: the event loop stays free for the Kafka
            # consumer's fetches (a fetch left unanswered past its request timeout fails
            # and is retried; a minutes-long export of a big placement did that).
            if not await asyncio.to_thread(conn.poll, LEDGER_STEP_DEADLINE_S):
                raise TimeoutError(f"no word from the replay in {LEDGER_STEP_DEADLINE_S} s")
            command, until_ms = conn.recv()
            if command == "stop":
                break
            started, cpu_started = time.perf_counter(), cpu_seconds()
            with peaks.phase("fold"):
                await ledger.step(int(until_ms), 0)
            ledger_s = time.perf_counter() - started
            cpu_folded = cpu_seconds()
            written, export_s = await asyncio.to_thread(export)
            fold_cpu, export_cpu = cpu_folded - cpu_started, cpu_seconds() - cpu_folded
            conn.send(("done", until_ms, ledger_s, export_s, written, fold_cpu, export_cpu))
        else:
            raise RuntimeError(f"more than {job.max_commands} commands")
        # every step's closes were exported after it
        written, export_s = await asyncio.to_thread(export)
        counts = store_counts(ledger.store)
    finally:
        with peaks.phase("stop"):
            await ledger.close()
    conn.send(
        (
            "stopped",
            ledger.duckdb_peak_mib,
            own_peak_rss_mib(),
            export_s,
            written,
            counts,
            peaks.reached,
            ledger.service.ingestor.crypto_worker is not None,
            # its own CPU; its signature worker's, ended and waited for by ledger.close()
            (cpu_seconds(), cpu_seconds(resource.RUSAGE_CHILDREN)),
        )
    )
