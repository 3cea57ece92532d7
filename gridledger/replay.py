"""`gridledger replay TRACE_DIR --workdir DIR`: a production GPU trace through the system.

    trace (CSV)  ->  plan (first-fit)  ->  keys + signed terms  ->  node agents (meter)
    ->  transport (local spools | Kafka)  ->  ledger (fold, close)  ->  exports  ->  verifier

1. Read the trace strictly (``gridledger.trace``) and compute its own GPU usage.
2. Plan one placement per GPU task that ran (``gridledger.placement_plan``).
3. Derive the keys from the seed, sign every placement's terms (``gridledger.replay_terms``),
   write ``DIR/trust.json``.
4. Step a simulated clock through the trace, ``STEP_MS`` at a time. Each step: publish the
   terms of the placements that start in it, tick every node agent
   (``gridledger.replay_cluster``) to the step's end, hand the events to the transport
   (local: the agents' spools are the transport; Kafka: sent keyed by placement and
   acknowledged, each stating the step's simulated time on a ``CreateTime`` topic to a
   ledger with ``arrival = "sender"``: the same arrival times as the local run's intake
   clock, SPEC §6.6), then let the ledger consume everything and close, at the step's end,
   each placement whose ``window_end + late_grace`` has passed.
5. Export every placement to ``DIR/exports/<placement>.duckdb`` and verify each export
   with the verifier against ``DIR/trust.json``; a verified export is then removed unless
   ``keep_exports`` (``--keep-exports``): the store holds everything and writes any
   placement's export again on demand (``gridledger ledger export``), and a failed one
   is kept for inspection. Over Kafka with the ledger in a process of its own (the
   default), this runs beside the steps: the ledger process exports each placement
   right after the step that closed it, the replay hands the export to the verifier's
   workers at once and counts the verdict when it comes; the replay process never opens
   the store.
6. Report: placements, events, delivered GPU-hours (total, by QoS, by GPU model), gross,
   fees and what each side owes or receives, the verdicts — and the trace's own GPU-hours
   computed from the CSV, which the delivered total must equal exactly.

The exact rule where interval boundaries cut a task: a placement's window is
[scheduled_time, deletion_time) of its task (seconds -> ms after 2026-01-01T00:00:00Z);
its node's agent emits one event per interval [start + k x I, min(start + (k + 1) x I,
end)) — the last interval is clipped at the window end — so the intervals tile the window
with nothing cut off and nothing counted twice, and with every GPU healthy and allocated
the delivered milli-GPU-ms are exactly num_gpu x gpu_milli x duration_ms.

Crash safety: kill the replay at any point and run it again with the same arguments and
workdir. Keys and terms are derived again (same bytes); agents recover their heads from
their spools; in Kafka mode, spooled events past the acknowledged position (the
shipper's ``SHIPPED`` file in each spool, ``meter.shipper``) are sent again; the ledger
resumes from its stored offsets and drops exact re-deliveries. The totals are the same as
an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import resource
import shutil
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog

from gridledger.placement_plan import Placement, Plan, plan_placements
from gridledger.replay_cluster import ReplayCluster
from gridledger.replay_limits import (
    DEFAULT_INTERVAL_S,
    EXPORT_CHUNK,
    LEDGER_IDLE_POLL_MS,
    LEDGER_PROCESS_EXIT_S,
    LEDGER_STEP_DEADLINE_S,
    MAX_LEDGER_LAG_EVENTS,
    MAX_LEDGER_STEPS_AHEAD,
    MAX_VERIFY_IN_FLIGHT,
    PROGRESS_EVERY_S,
    STEP_MS,
    TRACE_EPOCH_MS,
    UNPLACEABLE_SHOWN,
    VERIFY_POOL,
    VERIFY_WORKERS,
)
from gridledger.replay_terms import (
    PriceTable,
    ReplayCast,
    load_price_table,
    make_replay_cast,
    signed_placement_terms,
)
from gridledger.trace import Task, TraceUsage, read_trace, trace_usage
from ledger.config import KafkaConfig
from ledger.export import ExportedAll, export_all
from ledger.service import KafkaLedgerService, LedgerService
from ledger.store import Store
from meter.durable import write_atomic
from meter.shipper import Shipper
from proto.invariant import present
from proto.keys import SigningKey
from proto.money import format_gpu_hours, format_minor
from proto.records import PlacementTerms
from proto.trust import TrustFile, dump_trust
from transport.kafka import KafkaSettings, make_producer, publish_kafka
from transport.local import publish_local, publisher_source
from verifier.limits import VERIFY_BATCH_EXPORTS

if TYPE_CHECKING:
    from verifier.state import ExportReport

__all__ = [
    "REPORT_FORMAT",
    "LedgerProcessError",
    "ReplayOptions",
    "ReplayReport",
    "planned_events",
    "prefix_budgets",
    "register",
    "run_replay",
    "select_tasks",
]

log = structlog.get_logger("gridledger.replay")

REPORT_FORMAT: Final = "gridledger-replay-report/v1"
LEDGER_ID: Final = "ledger-1"
PUBLISHER: Final = "replay"
DEFAULT_SEED: Final = "openb"
DEFAULT_BUYERS: Final = 4
DEFAULT_TOPIC: Final = "gridledger.replay"
DEFAULT_PARTITIONS: Final = 8


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
    Measured (issue 15, 400 small placements of the trace's store, alternated, load 6-7):
    12.5-13.7 against 17.4-21.2 ms of the ledger's CPU per export and 0.38 against 2.81 MB
    of disk; the verifier's CPU per export the same within the noise. Only placements of
    at most COMPACT_MAX_RECORDS records: the verifier reads a large compact file 5-10 %
    slower (the trace's largest, ~200k records: 5.1-5.7 against 4.8-5.0 s of CPU), which
    over the whole trace took back what the ledger saved."""
    import duckdb

    major, minor = (int(part) for part in duckdb.__version__.split(".")[:2])
    return (major, minor) >= (1, 2)


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay run depends on (the same options give the same result)."""

    trace_dir: Path
    workdir: Path
    kafka: str | None = None
    topic: str = DEFAULT_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    interval_s: int = DEFAULT_INTERVAL_S
    limit: int | None = None
    max_events: int | None = None
    prices: Path | None = None
    seed: str = DEFAULT_SEED
    buyers: int = DEFAULT_BUYERS
    step_ms: int = STEP_MS
    ledger_process: bool = True
    """Kafka: the ledger in a process of its own (False: in the replay's process)."""
    keep_exports: bool = False
    """Keep every export in DIR/exports (False: an export that verified is removed once
    its verdict is counted; one that failed is kept for inspection). The store keeps
    everything; ``gridledger ledger export`` writes any placement's export again."""
    progress: Callable[[str], None] | None = None
    """Where progress lines go (the CLI: stderr), at most one per PROGRESS_EVERY_S."""


# The money fields of a placement's final totals that a replay adds up (minor units).
MONEY_FIELDS: Final = (
    "gross_minor",
    "credits_minor",
    "net_minor",
    "fee_minor",
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
)


@dataclass
class Money:
    """Sums of one currency at one scale, in minor units."""

    currency: str
    scale: int
    gross_minor: int = 0
    credits_minor: int = 0
    net_minor: int = 0
    fee_minor: int = 0
    buyer_owes_minor: int = 0
    operator_receives_minor: int = 0
    desk_receives_minor: int = 0

    def add(self, totals: dict[str, int]) -> None:
        """Add one placement's final totals."""
        for name in MONEY_FIELDS:
            setattr(self, name, getattr(self, name) + totals[name])

    def to_json(self) -> dict[str, Any]:
        """Exact integers and their decimal rendering."""
        out: dict[str, Any] = {"currency": self.currency, "currency_scale": self.scale}
        for name in MONEY_FIELDS:
            value = getattr(self, name)
            out[name] = value
            out[name.removesuffix("_minor")] = format_minor(value, self.scale)
        return out


VERIFIER_SIZE_CLASSES: Final = (
    ("<=256", 256),  # one chain read (verifier.pricing.CHAIN_ROWS_MAX)
    ("<=4096", 4_096),  # compact files (COMPACT_MAX_RECORDS)
    ("<=10000", 10_000),  # ~20,000 rows: the verifier's threads above (MIN_ROWS_FOR_POOL)
    (">10000", 2**62),
)
"""Export size classes (LedgerRecords at most) the report splits the verifier's CPU by."""


@dataclass
class ReplayReport:
    """What a replay did and found (``to_json`` / ``render``)."""

    trace_dir: str
    transport: str
    interval_s: int
    tasks: int = 0
    trace: TraceUsage | None = None
    placements: int = 0
    unplaceable: list[tuple[str, str]] = field(default_factory=list)
    nodes: int = 0
    events_generated: int = 0
    events_accepted: int = 0
    inputs_rejected: int = 0
    delivered_mgms: int = 0
    delivered_by_qos_mgms: dict[str, int] = field(default_factory=dict)
    delivered_by_model_mgms: dict[str, int] = field(default_factory=dict)
    money: dict[str, Money] = field(default_factory=dict)
    verified: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    exports_kept: int = 0
    """Export files left in DIR/exports (all with keep_exports, else the failed ones)."""
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    peak_rss_mib_by_process: dict[str, float] = field(default_factory=dict)
    """The replay process's own peak and, over Kafka, its ledger process's; and
    ``ledger_duckdb``: the most DuckDB memory the ledger's store held after a step."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU (user + system) by process over Kafka: ``replay`` (agents, shippers, this
    process's own work), ``ledger`` (the ledger process; of it ``ledger_fold`` and
    ``ledger_export``, the process's CPU during its steps and its exports),
    ``ledger_workers`` (its signature worker), ``verifier`` (the verifier's workers, per
    export verified). Where the trace's CPU goes when both cores are full."""

    verifier_by_records: dict[str, list[float]] = field(default_factory=dict)
    """The verifier's CPU by the export's size: for each class of VERIFIER_SIZE_CLASSES
    (records at most), [exports, records, CPU-seconds]: which exports the verifier's
    CPU goes to."""

    verifier_batches: dict[int, int] = field(default_factory=dict)
    """Small exports handed to the verifier together: batch size -> batches (a batch of
    one is verified alone)."""

    def count_verifier_cpu(self, records: int, cpu_s: float) -> None:
        """Add one export's verification CPU to its size class."""
        label = next(
            (name for name, most in VERIFIER_SIZE_CLASSES if records <= most),
            VERIFIER_SIZE_CLASSES[-1][0],
        )
        row = self.verifier_by_records.setdefault(label, [0, 0, 0.0])
        row[0] += 1
        row[1] += records
        row[2] += cpu_s

    @property
    def delivered_equals_trace(self) -> bool:
        """The delivered total equals the trace's own weighted total, exactly."""
        return self.trace is not None and self.delivered_mgms == self.trace.weighted_mgms

    @property
    def ok(self) -> bool:
        """Every export verified and the delivered total equals the trace's."""
        return (
            self.delivered_equals_trace
            and not self.failed
            and not self.unplaceable
            and self.verified == self.placements
        )

    def rate(self, phase: str) -> float:
        """Accepted events per second of a phase (0 when it took no time)."""
        seconds = self.seconds.get(phase, 0.0)
        return self.events_accepted / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The machine-readable report."""
        trace = self.trace
        return {
            "format": REPORT_FORMAT,
            "trace_dir": self.trace_dir,
            "transport": self.transport,
            "interval_s": self.interval_s,
            "tasks": self.tasks,
            "trace": None
            if trace is None
            else {
                "gpu_tasks": trace.gpu_tasks,
                "gpu_tasks_by_qos": trace.gpu_tasks_by_qos,
                "ran_tasks": trace.ran_tasks,
                "whole_mgms": trace.whole_mgms,
                "whole_gpu_hours": format_gpu_hours(trace.whole_mgms),
                "weighted_mgms": trace.weighted_mgms,
                "weighted_gpu_hours": format_gpu_hours(trace.weighted_mgms),
            },
            "placements": self.placements,
            "unplaceable": [{"task": t, "reason": r} for t, r in self.unplaceable],
            "nodes": self.nodes,
            "events_generated": self.events_generated,
            "events_accepted": self.events_accepted,
            "inputs_rejected": self.inputs_rejected,
            "delivered_mgms": self.delivered_mgms,
            "delivered_gpu_hours": format_gpu_hours(self.delivered_mgms),
            "delivered_by_qos": _hours_json(self.delivered_by_qos_mgms),
            "delivered_by_model": _hours_json(self.delivered_by_model_mgms),
            "delivered_equals_trace": self.delivered_equals_trace,
            "money": [m.to_json() for _, m in sorted(self.money.items())],
            "verdicts": {"verified": self.verified, "failed": len(self.failed)},
            "exports_kept": self.exports_kept,
            "failed": [{"placement": p, "why": w} for p, w in self.failed],
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "events_per_s": {
                "ledger": round(self.rate("ledger"), 1),
                "verifier_busy": round(self.rate("verify_busy"), 1),
                "agents": round(self.rate("agents"), 1),
            },
            "cpu_seconds": {k: round(v, 3) for k, v in sorted(self.cpu_seconds.items())},
            "verifier_cpu_by_records": {
                label: {"exports": int(n), "records": int(r), "cpu_s": round(c, 3)}
                for label, _ in VERIFIER_SIZE_CLASSES
                if label in self.verifier_by_records
                for n, r, c in [self.verifier_by_records[label]]
            },
            "verifier_batches": {str(k): v for k, v in sorted(self.verifier_batches.items())},
            "cpu_us_per_event": {
                k: round(v / self.events_accepted * 1e6, 1)
                for k, v in sorted(self.cpu_seconds.items())
                if self.events_accepted > 0
            },
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "peak_rss_mib_by_process": {
                k: round(v, 1) for k, v in sorted(self.peak_rss_mib_by_process.items())
            },
            "ok": self.ok,
        }

    def render(self) -> list[str]:
        """The human report, one line per fact."""
        lines = [f"replay of {self.trace_dir} ({self.transport}, interval {self.interval_s} s)"]
        trace = self.trace
        if trace is not None:
            lines.append(
                f"trace: {self.tasks} tasks, {trace.gpu_tasks} GPU tasks, {trace.ran_tasks} ran; "
                f"GPU-hours whole {format_gpu_hours(trace.whole_mgms)}, "
                f"weighted {format_gpu_hours(trace.weighted_mgms)} "
                f"({trace.weighted_mgms} milli-GPU-ms)"
            )
        lines.append(
            f"placements: {self.placements} on {self.nodes} nodes; "
            f"unplaceable: {len(self.unplaceable)}"
        )
        for task, reason in self.unplaceable[:UNPLACEABLE_SHOWN]:
            lines.append(f"  unplaceable {task}: {reason}")
        lines.append(
            f"events: {self.events_generated} signed by the agents this run, "
            f"{self.events_accepted} accepted by the ledger, {self.inputs_rejected} rejected"
        )
        lines.append(
            f"delivered: {format_gpu_hours(self.delivered_mgms)} GPU-hours "
            f"({self.delivered_mgms} milli-GPU-ms)"
        )
        for qos, mgms in sorted(self.delivered_by_qos_mgms.items()):
            lines.append(f"  QoS {qos}: {format_gpu_hours(mgms)} GPU-hours")
        for model, mgms in sorted(self.delivered_by_model_mgms.items()):
            lines.append(f"  model {model}: {format_gpu_hours(mgms)} GPU-hours")
        for _, m in sorted(self.money.items()):
            lines.append(
                f"money ({m.currency}): gross {format_minor(m.gross_minor, m.scale)}, "
                f"credits {format_minor(m.credits_minor, m.scale)}, "
                f"fees {format_minor(m.fee_minor, m.scale)}; "
                f"buyers owe {format_minor(m.buyer_owes_minor, m.scale)}, "
                f"operator receives {format_minor(m.operator_receives_minor, m.scale)}, "
                f"desk receives {format_minor(m.desk_receives_minor, m.scale)}"
            )
        lines.append(
            f"verdicts: {self.verified} verified, {len(self.failed)} failed; "
            f"{self.exports_kept} export(s) kept in exports/"
            + ("" if self.exports_kept == self.placements else " (--keep-exports keeps all)")
        )
        for placement, why in self.failed[:UNPLACEABLE_SHOWN]:
            lines.append(f"  FAIL {placement}: {why}")
        lines.append(f"delivered_equals_trace: {str(self.delivered_equals_trace).lower()}")
        timing = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        by_process = ", ".join(
            f"{k} {v:.0f} MiB" for k, v in sorted(self.peak_rss_mib_by_process.items())
        )
        lines.append(
            f"time: {timing}; peak RSS {self.peak_rss_mib:.0f} MiB"
            + (f" ({by_process})" if by_process else "")
        )
        lines.append(
            ("OK: " if self.ok else "FAIL: ")
            + "replay "
            + ("checks out" if self.ok else "does not check out")
        )
        return lines


def _hours_json(by: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {k: {"mgms": v, "gpu_hours": format_gpu_hours(v)} for k, v in sorted(by.items())}


def select_tasks(
    tasks: Sequence[Task],
    limit: int | None,
    *,
    max_events: int | None = None,
    interval_ms: int = DEFAULT_INTERVAL_S * 1000,
) -> tuple[Task, ...]:
    """The tasks a run replays: the GPU tasks that ran, by (scheduled_time, file line).

    ``limit``: at most the first ``limit`` of them. ``max_events``: the longest such
    prefix whose usage events (``planned_events``) stay within ``max_events`` — a bound
    on the work, since the cost of a task is its duration, not its count (the trace's
    first tasks run for months). Without either: every task of the trace.
    """
    if limit is None and max_events is None:
        return tuple(tasks)
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be positive, got {limit}")
    if max_events is not None and max_events < 1:
        raise ValueError(f"--max-events must be positive, got {max_events}")
    ran = sorted((t for t in tasks if t.ran), key=lambda t: (t.scheduled_time_s, t.line))
    if limit is not None:
        ran = ran[:limit]
    if max_events is None:
        return tuple(ran)
    chosen: list[Task] = []
    events = 0
    for task in ran:
        events += planned_events((task,), interval_ms)
        if events > max_events:
            break
        chosen.append(task)
    return tuple(chosen)


def prefix_budgets(
    tasks: Sequence[Task], percents: Sequence[int], interval_ms: int
) -> list[int | None]:
    """The ``max_events`` of prefixes holding ``percents`` of the trace's usage events
    (``select_tasks`` then takes the longest prefix in scheduled order within each);
    100 is the whole trace (None: no bound)."""
    total = planned_events(tasks, interval_ms)
    out: list[int | None] = []
    for percent in percents:
        if not 0 < percent <= 100:
            raise ValueError(f"a prefix is a percentage in 1..100, got {percent}")
        out.append(None if percent == 100 else max(1, total * percent // 100))
    return out


def planned_events(tasks: Sequence[Task], interval_ms: int) -> int:
    """Usage events the replay's agents sign for ``tasks`` (one per interval of each
    task's window, the last one clipped), so a run's size is known before it starts."""
    total = 0
    for task in tasks:
        if task.ran:
            start = present(task.scheduled_time_s, "a task that ran has a start")
            end = present(task.deletion_time_s, "a task that ran has an end")
            total += -(-(end - start) * 1000 // interval_ms)
    return total


class _Progress:
    """One line per PROGRESS_EVERY_S: simulated day, events, rate and time left."""

    def __init__(self, emit: Callable[[str], None] | None, total_events: int) -> None:
        self.emit = emit
        self.total = total_events
        self.started = time.monotonic()
        self.last = self.started

    def step(
        self, events: int, day: int, days: int, *, final: bool = False, lag: int | None = None
    ) -> None:
        """``lag``: records the ledger process has yet to fold (Kafka), shown when given."""
        if self.emit is None:
            return
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        elapsed = now - self.started
        rate = events / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - events)
        eta = (
            "done"
            if final or left == 0
            else (f"ETA {_duration(left / rate)}" if rate > 0 else "ETA unknown")
        )
        self.emit(
            f"replay: day {day} of {days} · {events:,} of {self.total:,} events · "
            f"{rate:,.0f} events/s · "
            + ("" if lag is None else f"ledger {lag:,} records behind · ")
            + f"{_duration(elapsed)} elapsed · {eta}"
        )


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def peak_rss_mib() -> float:
    """Peak resident memory of this process and its waited-for children, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024  # Linux reports KiB


def own_peak_rss_mib() -> float:
    """Peak resident memory of this process alone, in MiB: VmHWM of /proc/self/status
    (``ru_maxrss`` survives exec on Linux, so a spawned child would report its parent's
    peak until it passed it); ``ru_maxrss`` where /proc has no such line."""
    with (
        contextlib.suppress(OSError),
        open("/proc/self/status", encoding="ascii", errors="replace") as status,
    ):
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """CPU seconds (user + system) of this process, all its threads (``RUSAGE_SELF``), or
    of its children it has waited for (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _Timer:
    def __init__(self, seconds: dict[str, float], phase: str) -> None:
        self.seconds = seconds
        self.phase = phase
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + elapsed


# ---- the run -------------------------------------------------------------------------------


class _ReplayRun:
    """State of one replay run (see the module docstring for the steps)."""

    def __init__(self, options: ReplayOptions) -> None:
        self.options = options
        self.workdir = Path(options.workdir)
        self.report = ReplayReport(
            trace_dir=str(options.trace_dir),
            transport="kafka" if options.kafka else "local",
            interval_s=options.interval_s,
        )
        self.seconds = self.report.seconds
        self.plan: Plan | None = None
        self.cast: ReplayCast = make_replay_cast(options.seed, options.buyers)
        self.prices: PriceTable = load_price_table(options.prices)
        self.terms: dict[str, PlacementTerms] = {}
        # Signed terms not yet published: each is dropped once published (memory).
        self.terms_envelopes: dict[str, bytes] = {}
        self.by_qos: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()
        self.planned_events = 0

    # 1-3: trace, plan, keys and terms
    def prepare(self) -> Plan:
        with _Timer(self.seconds, "plan"):
            trace = read_trace(self.options.trace_dir)
            tasks = select_tasks(
                trace.tasks,
                self.options.limit,
                max_events=self.options.max_events,
                interval_ms=self.options.interval_s * 1000,
            )
            self.planned_events = planned_events(tasks, self.options.interval_s * 1000)
            self.report.tasks = len(tasks)
            self.report.trace = trace_usage(tasks)
            plan = plan_placements(
                trace.nodes, tasks, epoch_ms=TRACE_EPOCH_MS, buyers=self.options.buyers
            )
            self.report.placements = len(plan.placements)
            self.report.unplaceable = [(u.task.name, u.reason) for u in plan.unplaceable]
            self.report.nodes = len(plan.nodes_used)
        with _Timer(self.seconds, "terms"):
            for placement in plan.placements:
                terms, envelope = signed_placement_terms(placement, self.cast, self.prices)
                self.terms[placement.placement_id] = terms
                self.terms_envelopes[placement.placement_id] = envelope
            self.workdir.mkdir(parents=True, exist_ok=True)
            # A replay is a simulation (a Kafka one takes arrival from its senders): its
            # trust file admits one (SPEC §6.6, §9).
            trust = self.cast.trust(simulations=True)
            write_atomic(self.workdir / "trust.json", dump_trust(trust))
        self.plan = plan
        return plan

    def steps(self, plan: Plan) -> list[int]:
        """The step ends: from the first window start to past the last close."""
        if not plan.placements:
            return []
        start = min(p.window_start_ms for p in plan.placements)
        grace = max(t.late_grace_ms for t in self.terms.values())
        last = max(p.window_end_ms for p in plan.placements) + grace
        count = -(-(last - start) // self.options.step_ms)
        return [start + (k + 1) * self.options.step_ms for k in range(count)]

    def start_progress(self, plan: Plan, steps: Sequence[int]) -> _Progress:
        """Say what the run will do, then report progress against it."""
        progress = _Progress(self.options.progress, self.planned_events)
        if progress.emit is not None:
            progress.emit(
                f"replay: {len(plan.placements):,} placements on {len(plan.nodes_used):,} "
                f"nodes, {self.planned_events:,} events over {len(steps)} simulated days "
                f"(one per {self.options.interval_s} s interval)"
            )
        return progress

    def cluster(self, plan: Plan, spool_root: Path, *, local: bool = False) -> ReplayCluster:
        start = min((p.window_start_ms for p in plan.placements), default=TRACE_EPOCH_MS)
        return ReplayCluster(
            plan,
            self.terms,
            self.cast,
            self.prices,
            spool_root,
            interval_ms=self.options.interval_s * 1000,
            start_ms=start,
            collect_read=local,
        )

    def starting(self, plan: Plan, after_ms: int | None, until_ms: int) -> list[Placement]:
        """Placements whose window starts before ``until_ms`` (and not before ``after_ms``)."""
        return [
            p
            for p in plan.placements
            if p.window_start_ms < until_ms and (after_ms is None or p.window_start_ms >= after_ms)
        ]

    # 4 (local): the agents' spools are the transport
    def run_local(self, plan: Plan) -> None:
        local_dir = self.workdir / "local"
        local_dir.mkdir(parents=True, exist_ok=True)
        store = Store(self.workdir / "ledger.duckdb", ledger_public_key=self.cast.ledger.public_key)
        now = _ClockHolder()
        service = LedgerService(
            store, self.cast.ledger, ledger_id=LEDGER_ID, local_dir=local_dir, clock=now.read
        )
        cluster = self.cluster(plan, local_dir, local=True)
        try:
            previous: int | None = None
            steps = self.steps(plan)
            progress = self.start_progress(plan, steps)
            for day, until in enumerate(steps, 1):
                starting = self.starting(plan, previous, until)
                if starting:
                    publish_local(
                        local_dir,
                        publisher_source(PUBLISHER),
                        [self.terms_envelopes.pop(p.placement_id) for p in starting],
                    )
                with _Timer(self.seconds, "agents"):
                    for _, envelopes in cluster.tick_to(previous or 0, until):
                        self.report.events_generated += len(envelopes)
                now.value = until
                with _Timer(self.seconds, "ledger"):
                    service.run_until_idle()
                previous = until
                progress.step(self.report.events_generated, day, len(steps))
            progress.step(self.report.events_generated, len(steps), len(steps), final=True)
            self.finish(plan, store)
        finally:
            cluster.close()
            service.close()

    # 4 (kafka): events sent keyed by placement, acknowledged, then consumed
    async def run_kafka(self, plan: Plan) -> None:
        from transport.kafka import SIMULATION_TOPIC_CONFIG, create_topic_async

        bootstrap = present(self.options.kafka, "the bootstrap of a Kafka replay")
        settings = KafkaSettings(bootstrap=bootstrap, topic=self.options.topic)
        # A simulation (months of trace in minutes): each record states the simulated
        # time it is sent at — a usage event when its interval ends (the agent's
        # ``simulated_send_ms``), terms when their step starts — and the ledger takes
        # arrival from it (SPEC §6.6 arrival = "sender").
        await create_topic_async(
            settings.bootstrap,
            settings.topic,
            self.options.partitions,
            exist_ok=True,
            config=SIMULATION_TOPIC_CONFIG,
        )
        steps = self.steps(plan)
        db = self.workdir / "ledger.duckdb"
        if self.options.ledger_process:
            await self.kafka_with_ledger_process(plan, steps, settings)
            return
        ledger = _InProcessLedger(
            Store(db, ledger_public_key=self.cast.ledger.public_key),
            self.cast,
            settings,
            self.seconds,
        )
        try:
            await self.kafka_steps(plan, steps, settings, ledger)
            await ledger.stop()
        finally:
            await ledger.close()
        # Not a process: the part of the ledger's RSS that is its store's DuckDB memory
        # (the buffer pool grows with the store up to ledger.limits.STORE_MEMORY_LIMIT).
        self.report.peak_rss_mib_by_process["ledger_duckdb"] = ledger.duckdb_peak_mib
        store = Store(db, ledger_public_key=self.cast.ledger.public_key)
        try:
            self.finish(plan, store)
        finally:
            store.close()

    async def kafka_with_ledger_process(
        self, plan: Plan, steps: Sequence[int], settings: KafkaSettings
    ) -> None:
        """Steps 4-6 over Kafka with the ledger in a process of its own, overlapped: the
        ledger process exports each placement closed by a step right after that step,
        and the replay hands the export to the verifier's workers at once (at most
        MAX_VERIFY_IN_FLIGHT out) and counts verdicts as they come in, while the agents,
        shippers and ledger go on with the next steps. The replay process never opens
        the store (DuckDB): its memory does not grow with the store."""
        exports = self.reset_exports()
        job = _LedgerJob(
            db=str(self.workdir / "ledger.duckdb"),
            seed=self.options.seed,
            buyers=self.options.buyers,
            bootstrap=settings.bootstrap,
            topic=self.options.topic,
            max_commands=len(steps) + 1,
            exports=str(exports),
        )
        with self.verify_pool() as pool:
            verdicts = _Verdicts(self, exports, pool, plan.placements)
            ledger = _LedgerProcess(job, self.seconds, on_exported=verdicts.exported)
            try:
                await self.kafka_steps(plan, steps, settings, ledger, verdicts)
                await ledger.stop()
            finally:
                await ledger.close()
            self.report.peak_rss_mib_by_process["ledger"] = ledger.peak_rss_mib
            self.report.cpu_seconds.update(ledger.cpu)
            self.report.peak_rss_mib_by_process["ledger_duckdb"] = ledger.duckdb_peak_mib
            for phase, mib in ledger.peak_by_phase.items():
                self.report.peak_rss_mib_by_process[f"ledger_peak_in_{phase}"] = mib
            self.report.events_accepted, self.report.inputs_rejected = ledger.counts
            started = time.perf_counter()  # what is left after the last step
            verdicts.drain()
            self.seconds["export_and_verify"] = time.perf_counter() - started
        for placement in plan.placements:
            if placement.placement_id not in verdicts.handed:
                self.report.failed.append((placement.placement_id, "never closed"))
        self.sum_up()

    async def kafka_steps(
        self,
        plan: Plan,
        steps: Sequence[int],
        settings: KafkaSettings,
        ledger: _InProcessLedger | _LedgerProcess,
        verdicts: _Verdicts | None = None,
    ) -> None:
        """Step 4 over Kafka: terms, agents, shippers; the ledger told each step's end
        (``verdicts``: the verifier's queue the ledger process's exports go to)."""
        cluster = self.cluster(plan, self.workdir / "spools")
        producer = make_producer(settings, linger_ms=5)
        try:
            await producer.start()
            await ledger.start()
            # One shipper per node spool, the meter's own (one producer shared by all).
            shippers = cluster.shippers(settings, producer)
            shipping = 0.0
            started = time.perf_counter()
            resent = await _ship(list(shippers.values()))
            if resent:
                log.info("resent_unacked", events=resent)
            shipping += time.perf_counter() - started
            previous: int | None = None
            progress = self.start_progress(plan, steps)
            for day, until in enumerate(steps, 1):
                starting = [
                    (p.placement_id, self.terms_envelopes.pop(p.placement_id))
                    for p in self.starting(plan, previous, until)
                ]
                if starting:
                    # Published when the step starts (before their windows open), stating
                    # that simulated time (SPEC §6.6 arrival = "sender").
                    await publish_kafka(
                        settings,
                        starting,
                        producer=producer,
                        timestamps_ms=[until - self.options.step_ms] * len(starting),
                    )
                touched: dict[str, Shipper] = {}
                with _Timer(self.seconds, "agents"):
                    for node, envelopes in cluster.tick_to(previous or 0, until):
                        self.report.events_generated += len(envelopes)
                        touched[node.node_id] = shippers[node.node_id]
                started = time.perf_counter()
                shipped = await _ship(list(touched.values()))
                shipping += time.perf_counter() - started
                # Everything of this step is acknowledged: the ledger may fold it and
                # close, at the step's end, what is due.
                await ledger.step(until, resent + shipped + len(starting))
                resent = 0
                previous = until
                if verdicts is not None:
                    verdicts.settle_ready()
                progress.step(
                    self.report.events_generated, day, len(steps), lag=ledger.lag_records()
                )
            await ledger.drain()
            progress.step(self.report.events_generated, len(steps), len(steps), final=True)
            self.seconds["ship"] = shipping
        finally:
            cluster.close()
            await producer.stop()

    # 5-6: exports, verifier, report
    def finish(self, plan: Plan, store: Store) -> None:
        """Export the closed placements, EXPORT_CHUNK at a time with ``export_all``, and
        verify each export in worker processes while the next chunk is written."""
        exports = self.reset_exports()
        self.report.events_accepted, self.report.inputs_rejected = store_counts(store)
        closed = closed_placements(store)
        to_export: list[Placement] = []
        for placement in plan.placements:
            if placement.placement_id in closed:
                to_export.append(placement)
            else:
                self.report.failed.append((placement.placement_id, "never closed"))
        del closed
        started = time.perf_counter()
        with self.verify_pool() as pool:
            verdicts = _Verdicts(self, exports, pool)
            for at in range(0, len(to_export), EXPORT_CHUNK):
                chunk = to_export[at : at + EXPORT_CHUNK]
                with _Timer(self.seconds, "export"):
                    done = export_chunk(
                        store, exports, self.cast.ledger, [p.placement_id for p in chunk]
                    )
                for placement in chunk:
                    pid = placement.placement_id
                    if pid not in done.written:
                        why = done.skipped.get(pid, "not exported")
                        self.report.failed.append((pid, f"not exported: {why}"))
                        continue
                    verdicts.submit(placement)
            verdicts.drain()
        self.seconds["export_and_verify"] = time.perf_counter() - started
        self.sum_up()

    def sum_up(self) -> None:
        """The report's delivered totals by QoS and by model, once every verdict is in."""
        self.report.delivered_by_qos_mgms = dict(sorted(self.by_qos.items()))
        self.report.delivered_by_model_mgms = dict(sorted(self.by_model.items()))

    def verify_pool(self) -> ProcessPoolExecutor:
        """The verifier's worker processes (spawned: never fork a process holding DuckDB)."""
        context = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(VERIFY_WORKERS, mp_context=context)

    def reset_exports(self) -> Path:
        """An empty DIR/exports (a rerun writes every export again)."""
        exports = self.workdir / "exports"
        if exports.exists():
            shutil.rmtree(exports)
        exports.mkdir(parents=True)
        return exports

    def settle_export(self, exports: Path, placement: Placement, summary: VerifySummary) -> None:
        """Count one export's verdict, then keep its file or (verified, and exports not
        kept) remove it: the disk holds the store, not a second copy of every placement."""
        self.count_verdict(placement, summary)
        path = exports / f"{placement.placement_id}.duckdb"
        if self.options.keep_exports or summary.why or summary.totals is None:
            self.report.exports_kept += int(path.exists())
        else:
            path.unlink(missing_ok=True)

    def count_verdict(self, placement: Placement, summary: VerifySummary) -> None:
        """Add one export's verdict and, when verified, its recomputed totals."""
        self.seconds["verify_busy"] = self.seconds.get("verify_busy", 0.0) + summary.elapsed_s
        cpu = self.report.cpu_seconds
        cpu["verifier"] = cpu.get("verifier", 0.0) + summary.cpu_s
        self.report.count_verifier_cpu(summary.records, summary.cpu_s)
        totals = summary.totals
        if summary.why or totals is None:
            self.report.failed.append((placement.placement_id, summary.why or "no totals"))
            return
        self.report.verified += 1
        delivered = totals["delivered_mgms"]
        self.report.delivered_mgms += delivered
        self.by_qos[placement.task.qos] += delivered
        self.by_model[placement.model] += delivered
        money = self.report.money.setdefault(
            f"{summary.currency}/{summary.currency_scale}",
            Money(summary.currency, summary.currency_scale),
        )
        money.add(totals)


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
        # of CPU each in session 14 against ~22 in batches).
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


async def _ship(shippers: Sequence[Shipper]) -> int:
    """Ship what each spool holds, the spools side by side; return how many records."""
    counts = await asyncio.gather(*(shipper.ship_available() for shipper in shippers))
    return sum(counts)


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


def run_replay(options: ReplayOptions) -> ReplayReport:
    """Run a whole replay (module docstring) and return its report. Never exits."""
    started = time.perf_counter()
    run = _ReplayRun(options)
    plan = run.prepare()
    if options.kafka:
        asyncio.run(run.run_kafka(plan))
    else:
        run.run_local(plan)
    run.seconds["total"] = time.perf_counter() - started
    run.report.peak_rss_mib = peak_rss_mib()
    run.report.peak_rss_mib_by_process["replay"] = own_peak_rss_mib()
    if options.kafka:  # the local transport's ledger and exports are this process's too
        run.report.cpu_seconds["replay"] = cpu_seconds()
    return run.report


# ---- CLI ---------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gridledger replay`."""
    parser = subparsers.add_parser(
        "replay",
        help="meter, settle and verify a production GPU cluster trace (OpenB CSV format)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument(
        "trace_dir", type=Path, metavar="TRACE_DIR", help="the OpenB trace directory (CSV files)"
    )
    parser.add_argument(
        "--workdir", type=Path, required=True, metavar="DIR", help="where keys, spools, DB go"
    )
    parser.add_argument("--kafka", metavar="HOST:PORT", help="use Kafka (default: local spools)")
    parser.add_argument(
        "--topic", default=DEFAULT_TOPIC, help=f"Kafka topic to create (default {DEFAULT_TOPIC})"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help=f"partitions of the topic (default {DEFAULT_PARTITIONS})",
    )
    parser.add_argument(
        "--interval-s",
        type=int,
        default=DEFAULT_INTERVAL_S,
        metavar="N",
        help=f"usage interval of every agent, seconds (default {DEFAULT_INTERVAL_S})",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="replay only the first N GPU tasks that ran (by scheduled time); a task's "
        "cost is its duration: the trace's first tasks run for months",
    )
    parser.add_argument(
        "--max-events",
        type=int,
        metavar="N",
        help="replay the first GPU tasks that ran while their usage events stay within N "
        "(bounds the work; combines with --limit)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (the report only)"
    )
    parser.add_argument(
        "--keep-exports",
        action="store_true",
        help="keep every export in DIR/exports (default: an export that verified is "
        "removed; one that failed is kept; `gridledger ledger export` writes any again). "
        "The replay writes them compact: DuckDB 1.2 and later read them",
    )
    parser.add_argument("--prices", type=Path, metavar="FILE", help="price table (TOML)")
    parser.add_argument("--seed", default=DEFAULT_SEED, help="seed text of every key")
    parser.add_argument(
        "--buyers",
        type=int,
        default=DEFAULT_BUYERS,
        help=f"buyers the placements are spread over (default {DEFAULT_BUYERS})",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.set_defaults(handler=_handle)


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def quiet_logs(level: int = logging.WARNING) -> None:
    """Per-placement info logs (thousands of them) off: the report says what matters."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


def _handle(args: argparse.Namespace) -> int:
    from gridledger.replay_terms import PriceTableError
    from gridledger.trace import TraceError

    quiet_logs()
    options = ReplayOptions(
        trace_dir=args.trace_dir,
        workdir=args.workdir,
        kafka=args.kafka,
        topic=args.topic,
        partitions=args.partitions,
        interval_s=args.interval_s,
        limit=args.limit,
        max_events=args.max_events,
        prices=args.prices,
        seed=args.seed,
        buyers=args.buyers,
        progress=None if args.quiet else _stderr_line,
        keep_exports=args.keep_exports,
    )
    try:
        report = run_replay(options)
    except (TraceError, PriceTableError, ValueError, LedgerProcessError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 2
    emit: Callable[[str], None] = print
    if args.json:
        emit(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for line in report.render():
            emit(line)
    return 0 if report.ok else 1
