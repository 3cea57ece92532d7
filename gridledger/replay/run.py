"""One replay run (``run_replay``): its options, the tasks it replays, the simulated clock
stepped through the trace (package docstring)."""

from __future__ import annotations

import asyncio
import multiprocessing
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from gridledger.placement_plan import Placement, Plan, plan_placements
from gridledger.replay.ledger_process import (
    _ClockHolder,
    _InProcessLedger,
    _LedgerJob,
    _LedgerProcess,
    closed_placements,
    export_chunk,
    store_counts,
)
from gridledger.replay.measure import (
    _Progress,
    _Timer,
    _VerifyProgress,
    cpu_seconds,
    own_peak_rss_mib,
    peak_rss_mib,
)
from gridledger.replay.report import Money, ReplayReport
from gridledger.replay.verdicts import VerifySummary, _Verdicts
from gridledger.replay_cluster import ReplayCluster
from gridledger.replay_limits import (
    DEFAULT_INTERVAL_S,
    EXPORT_CHUNK,
    STEP_MS,
    TRACE_EPOCH_MS,
    VERIFY_WORKERS,
)
from gridledger.replay_terms import (
    PriceTable,
    ReplayCast,
    load_price_table,
    make_replay_cast,
    signed_placement_terms,
)
from gridledger.trace import Task, read_trace, trace_usage
from ledger.service import LedgerService
from ledger.store import Store
from meter.durable import write_atomic
from meter.shipper import Shipper
from proto.invariant import present
from proto.records import PlacementTerms
from proto.trust import dump_trust
from transport.kafka import KafkaSettings, make_producer, publish_kafka
from transport.local import publish_local, publisher_source

log = structlog.get_logger("gridledger.replay")

LEDGER_ID: Final = "ledger-1"
PUBLISHER: Final = "replay"
DEFAULT_SEED: Final = "openb"
DEFAULT_BUYERS: Final = 4
DEFAULT_TOPIC: Final = "gridledger.replay"
DEFAULT_PARTITIONS: Final = 8


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
    if ran and not chosen:
        raise ValueError(
            f"--max-events {max_events:,} selects no task: the first GPU task that ran is "
            f"{events:,} usage events alone; give --max-events {events} or more"
        )
    return tuple(chosen)


def _subset(every: Sequence[Task], chosen: Sequence[Task], options: ReplayOptions) -> str:
    """How the replayed tasks relate to the trace ("" when they are all of it)."""
    if options.limit is None and options.max_events is None:
        return ""
    ran = sum(1 for t in every if t.ran)
    bounds = [
        f"--{name} {value}"
        for name, value in (("limit", options.limit), ("max-events", options.max_events))
        if value is not None
    ]
    return f"the first {len(chosen):,} of the {ran:,} GPU tasks that ran ({', '.join(bounds)})"


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


class _ReplayRun:
    """State of one replay run (see the package docstring for the steps)."""

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
        # Export and verification progress (set once their number is known).
        self.verify_progress = _VerifyProgress(None, 0)
        self.settled = 0  # exports with a verdict

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
            self.report.subset = _subset(trace.tasks, tasks, self.options)
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
        self.verify_progress = _VerifyProgress(self.options.progress, len(plan.placements))
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
        self.verify_progress = _VerifyProgress(self.options.progress, len(to_export))
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
        self.settled += 1
        self.verify_progress.step(self.settled)
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


async def _ship(shippers: Sequence[Shipper]) -> int:
    """Ship what each spool holds, the spools side by side; return how many records."""
    counts = await asyncio.gather(*(shipper.ship_available() for shipper in shippers))
    return sum(counts)


def run_replay(options: ReplayOptions) -> ReplayReport:
    """Run a whole replay (package docstring) and return its report. Never exits."""
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
