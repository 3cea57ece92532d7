"""The seeded fault harness (issue 8): meter -> real Kafka -> ledger, with faults injected.

For a seed, ``generate_scenario`` (``scenario.py``) draws a small scenario and
``make_schedule`` (``schedule.py``) a fault schedule. ``run_seed`` then runs it for
real: ``gridledger meter run`` processes (one per node) ship to a Kafka topic, a
``gridledger ledger run`` process folds it, and the faults land while they work (each
process forked from a fork server that imported the package once, ``launch.py``, so a
restart costs no imports; ``GRIDLEDGER_FAULT_LAUNCH=exec`` runs ``python -m gridledger``):

* ``meter_kill`` — SIGKILL of a node agent at a seeded moment (during start-up and
  recovery, or once it made progress), then a restart that resumes from its spool;
* ``ledger_kill`` — SIGKILL of the ledger (during start-up or mid-batch), then a restart
  that resumes from the offsets committed with its records;
* ``broker_kill`` / ``broker_restart`` — the broker SIGKILLed (data kept) and started
  again after a pause, or stopped cleanly and restarted, while agents keep spooling;
* ``duplicates`` — envelopes already in the topic are published again (re-delivery);
* ``store_lost`` — the ledger's store is lost and rebuilt, on both transports: on Kafka
  the ledger is killed, its DuckDB file deleted and the topic replayed from offset 0
  (every lost chain must be a prefix of the rebuilt one); on the embedded transport the
  canonical reference ledger (whose spools include its own close spool) loses its store
  and rebuilds it from its intake log (identical heads, statements, decisions).

A *cycle* is one injected fault, its recovery and a check (``checks.py``); the run
ends with the end-of-run invariants against the fault-free references
(``reference.py``) and the parties' witnesses.

Running it: ``run_seed(seed, bootstrap=..., broker=..., workdir=..., cycles=...)``
returns a ``FaultReport`` (cycles by class, timings, counts) or raises ``FaultFailure``.
The agents are paced (``pace_ms``) so the kills find them busy; once a phase's faults
are done, agents still working are restarted unpaced. A process that exits by itself is
restarted (as a supervisor would) and reported; only ``KNOWN_EXIT_MARKERS`` are
tolerated by the tests. ``tests/test_faults.py`` runs ``DEFAULT_SEEDS`` (more with
``GRIDLEDGER_FAULT_SEEDS``), ``bench/fault_soak.py`` long soaks on a broker of its own.

Determinism: the scenario, the keys (``devtools.builders`` seed text), the readings, the
fault schedule and every choice the runner makes come from ``random.Random`` seeded by
the seed. The moments the operating system schedules processes do not; the invariants
must hold whatever they are, and a failure names the seed and the command that replays
the scenario and its schedule (``replay_command``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import structlog
import tomli_w

from devtools import builders
from devtools.faults.checks import check_spool, check_store, compare_final
from devtools.faults.launch import Launched, launch
from devtools.faults.reference import (
    Reference,
    build_reference,
    fold_partitions,
    rebuild_local,
    remove_store,
)
from devtools.faults.scenario import NodePlan, Phase, Segment, generate_scenario, write_node_configs
from devtools.faults.schedule import Fault, FaultKind, Schedule, make_schedule
from devtools.faults.topic import publish, read_topic
from ledger.attest_loop import attest_once
from ledger.config import KafkaConfig
from ledger.export import export_placement
from ledger.service import KafkaLedgerService, fixed_clock
from ledger.store import Store
from meter.shipper import load_shipped
from proto.envelope import open_envelope
from proto.keys import write_key_pair
from proto.trust import dump_trust
from transport.kafka import KafkaSettings
from transport.positions import SpoolPosition
from transport.spool import list_segments, segment_path

__all__ = [
    "CYCLES_ENV",
    "DEFAULT_CYCLES_PER_SEED",
    "DEFAULT_SEEDS",
    "SEEDS_ENV",
    "SEED_ENV",
    "BrokerControl",
    "FaultFailure",
    "FaultReport",
    "env_int",
    "replay_command",
    "run_seed",
    "suite_seeds",
]

_log = structlog.get_logger("devtools.faults")

# ---- named limits and defaults --------------------------------------------------------

SEED_ENV: Final = "GRIDLEDGER_FAULT_SEED"
"""Environment variable naming the one seed to replay (``-k replay``)."""

SEEDS_ENV: Final = "GRIDLEDGER_FAULT_SEEDS"
"""Environment variable: how many seeds the suite runs (default ``len(DEFAULT_SEEDS)``)."""

CYCLES_ENV: Final = "GRIDLEDGER_FAULT_CYCLES"
"""Environment variable: fault cycles per seed (default ``DEFAULT_CYCLES_PER_SEED``)."""

DEFAULT_SEEDS: Final[tuple[int, ...]] = (96, 162, 5, 1, 153)
"""The seeds the suite runs by default: together they draw every scenario feature and
both broker faults (tests/test_faults.py checks it)."""

DEFAULT_CYCLES_PER_SEED: Final = 22
"""Fault cycles per seed by default: 5 seeds x 22 = 110 cycles in the suite."""


PROCESS_START_TIMEOUT_S: Final = 30.0
"""Longest wait for a ledger subprocess to assign its partitions."""

PROGRESS_TIMEOUT_S: Final = 15.0
"""Longest wait for a restarted agent to spool or ship something before it is killed."""

PHASE_TIMEOUT_S: Final = 180.0
"""Longest wait for the agents to finish a phase, or for every close to reach the topic."""

RECOVERY_TIMEOUT_S: Final = 90.0
"""Longest wait for every running agent to ship again after a broker outage."""

STOP_TIMEOUT_S: Final = 30.0
"""Longest wait for a process to exit after SIGTERM / SIGKILL."""

FINAL_RUN_TIMEOUT_S: Final = 120.0
"""Longest the in-process ledger may take to catch up at the end of a run."""

POLL_S: Final = 0.02
"""Pause of the supervision loop between two looks at the processes."""

TOPIC_POLL_S: Final = 0.3
"""Pause between two reads of the topic while waiting for the closes."""

MAX_UNEXPECTED_EXITS: Final = 20
"""Processes that exit by themselves (not killed by the harness) before a run gives up."""

CRASH_RESTART_PAUSE_S: Final = 1.0
"""A process that exited by itself is started again no sooner than this."""

LOG_TAIL_BYTES: Final = 4000
"""Bytes of a process log quoted in a failure."""

KNOWN_EXIT_MARKERS: Final[tuple[str, ...]] = ()
"""Exits by themselves the harness would tolerate: none. (``ledger run`` started while the
broker was away used to exit 1 with a traceback; it now waits with a bounded backoff.)"""


class FaultFailure(AssertionError):
    """An invariant did not hold; the message names the seed and the replay command."""


def replay_command(seed: int, cycles: int) -> str:
    """The command that replays one seed's scenario and fault schedule."""
    return (
        f"{SEED_ENV}={seed} {CYCLES_ENV}={cycles} "
        ".venv/bin/python -m pytest tests/test_faults.py -k replay"
    )


# ---- the runner ---------------------------------------------------------------------------


class BrokerControl(Protocol):
    """What the harness needs of the broker (``devtools.kafka_broker.KafkaBroker``)."""

    def kill(self) -> None:
        """SIGKILL the broker, keeping its data."""

    def restart(self, *, hard: bool = False) -> None:
        """Stop and start again: same port, same data."""


@dataclass
class FaultReport:
    """What one seed's run did and found."""

    seed: int
    cycles_asked: int
    scenario: str = ""
    cycles: Counter[str] = field(default_factory=Counter)
    retargeted: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    topic_messages: int = 0
    duplicates_dropped: int = 0
    spooled_seen: int = 0
    exports_verified: int = 0

    def unexplained_exits(self) -> list[str]:
        """Unexpected exits other than the known finding KNOWN_EXIT_MARKERS names."""
        return [
            text
            for text in self.unexpected_exits
            if not any(marker in text for marker in KNOWN_EXIT_MARKERS)
        ]

    @property
    def total_cycles(self) -> int:
        """Faults injected, recovered from and checked."""
        return sum(self.cycles.values())

    def summary(self) -> str:
        """One paragraph for logs and the soak's output."""
        kinds = ", ".join(f"{k}={n}" for k, n in sorted(self.cycles.items()))
        timings = ", ".join(f"{k}={v:.1f}s" for k, v in self.timings_s.items())
        return (
            f"seed {self.seed}: {self.total_cycles} cycles ({kinds}); "
            f"{self.topic_messages} messages, {self.duplicates_dropped} duplicates dropped, "
            f"{self.spooled_seen} spooled events seen, {self.exports_verified} exports "
            f"verified; {self.retargeted} kills retargeted; unexpected exits "
            f"{len(self.unexpected_exits)}; {timings}\n"
            f"  {self.scenario}"
        )


@dataclass
class _Process:
    name: str
    log_path: Path
    popen: Launched | None = None
    started_at: float = 0.0
    log_offset: int = 0
    not_before: float = 0.0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, argv: list[str]) -> None:
        """``gridledger ARGV`` (``launch``: forked from the fork server by default)."""
        assert not self.alive()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.popen = launch(argv, self.log_path)
        self.started_at = time.monotonic()

    def kill9(self) -> int:
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGKILL)
        code = self.popen.wait(timeout=STOP_TIMEOUT_S)
        self.popen = None
        return code

    def log_since_start(self) -> bytes:
        if not self.log_path.exists():
            return b""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read()

    def tail(self) -> str:
        if not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-LOG_TAIL_BYTES:]
        return data.decode("utf-8", "replace")


@dataclass
class _Meter:
    plan: NodePlan
    configs: dict[str, Path]
    spool: Path
    process: _Process
    segment: int = 0
    start_bytes: int = 0
    start_shipped: SpoolPosition | None = None
    last_shipped: SpoolPosition | None = None

    def current(self) -> Segment | None:
        return self.plan.segments[self.segment] if self.segment < len(self.plan.segments) else None


def _spool_bytes(spool: Path) -> int:
    total = 0
    for number in list_segments(spool) if spool.exists() else []:
        with contextlib.suppress(FileNotFoundError):
            total += segment_path(spool, number).stat().st_size
    return total


class _SeedRun:
    """One seed's run (see the module docstring); ``execute`` returns the report."""

    def __init__(
        self,
        seed: int,
        cycles: int,
        bootstrap: str,
        broker: BrokerControl,
        workdir: Path,
        *,
        schedule: Schedule | None = None,
        topic: str | None = None,
        replication_factor: int = 1,
    ) -> None:
        self.seed = seed
        self.cycles = cycles
        self.bootstrap = bootstrap
        self.broker = broker
        self.workdir = workdir
        self.scenario = generate_scenario(seed)
        self.schedule = make_schedule(self.scenario, cycles) if schedule is None else schedule
        self.report = FaultReport(seed, cycles, scenario=self.scenario.describe())
        self.rng = random.Random(f"gridledger-faults/{seed}/runner")
        self.topic = topic or f"faults.{seed}.{cycles}.{os.getpid()}.{int(time.time() * 1000)}"
        self.replication_factor = replication_factor
        self.settings = KafkaSettings(bootstrap=bootstrap, topic=self.topic)
        self.meters: dict[str, _Meter] = {}
        self.meter_phase: Phase | None = None
        self.ledger = _Process("ledger", workdir / "logs" / "ledger.log")
        self.ledger_config: Path = workdir / "ledger-early.toml"
        self.db = workdir / "ledger.duckdb"
        self.observed: set[bytes] = set()
        self.reference: Reference | None = None
        self.started = time.monotonic()
        self.pace_ms = self.schedule.pace_ms

    # -- failure and bookkeeping --

    def fail(self, what: str, problems: Iterable[str] = ()) -> FaultFailure:
        """A failure that names the seed, its replay command and what was seen."""
        lines = [
            f"fault harness, seed {self.seed}: {what}",
            *(f"  - {p}" for p in list(problems)[:40]),
            f"  scenario: {self.scenario.describe()}",
            f"  replay: {replay_command(self.seed, self.cycles)}",
            f"  faults so far: {'; '.join(self.report.log[-12:])}",
            f"  workdir: {self.workdir}",
        ]
        return FaultFailure("\n".join(lines))

    def note(self, text: str) -> None:
        stamp = f"t={time.monotonic() - self.started:.1f}s {text}"
        self.report.log.append(stamp)
        _log.info("fault_harness", seed=self.seed, what=text)

    def cycle(self, kind: FaultKind, text: str) -> None:
        self.report.cycles[kind.value] += 1
        self.note(f"{kind.value}: {text}")

    # -- setup --

    def _setup(self) -> dict[str, dict[str, Path]]:
        scenario = self.scenario
        self.workdir.mkdir(parents=True, exist_ok=True)
        key_file, _ = write_key_pair(scenario.cast.ledger, self.workdir / "keys")
        # A simulation (arrival = "sender"): its trust file admits one (SPEC §6.6, §9).
        trust = scenario.cast.trust(simulations=True)
        (self.workdir / "trust.json").write_bytes(dump_trust(trust))
        for name, clock_ms in (
            ("early", scenario.early_clock_ms),
            ("late", scenario.late_clock_ms),
        ):
            config = {
                "ledger_id": "faults",
                "key_file": str(key_file),
                "db": str(self.db),
                "transport": "kafka",
                "batch_max_records": scenario.batch_max_records,
                "http": "off",
                "clock_ms": clock_ms,
                # A simulation: arrival times are the ones the senders state (SPEC §6.6).
                "arrival": "sender",
                "kafka": {"bootstrap": self.bootstrap, "topic": self.topic},
            }
            (self.workdir / f"ledger-{name}.toml").write_text(tomli_w.dumps(config))
        configs = write_node_configs(scenario, self.workdir / "meters", self.bootstrap, self.topic)
        for plan in scenario.nodes:
            self.meters[plan.node_id] = _Meter(
                plan,
                configs[plan.node_id],
                configs[plan.node_id]["k0"].parent / "spool",
                _Process(f"meter {plan.node_id}", self.workdir / "logs" / f"{plan.node_id}.log"),
            )
        return configs

    # -- processes --

    def _start_meter(self, meter: _Meter) -> None:
        segment = meter.current()
        assert segment is not None
        spec = f"{meter.plan.sim_spec},pace_ms={self.pace_ms}"
        meter.start_bytes = _spool_bytes(meter.spool)
        meter.start_shipped = load_shipped(meter.spool) if meter.spool.exists() else None
        meter.process.start(
            [
                "meter",
                "run",
                "--config",
                str(meter.configs[segment.key]),
                "--simulate",
                spec,
                "--until-ms",
                str(segment.until_ms),
            ]
        )

    def _start_ledger(self) -> None:
        self.ledger.start(
            [
                "ledger",
                "run",
                "--config",
                str(self.ledger_config),
            ]
        )

    def _meter_due(self, meter: _Meter) -> bool:
        segment = meter.current()
        return segment is not None and segment.phase == self.meter_phase

    def supervise(self) -> None:
        """Start what is due, restart what died by itself (counted as unexpected)."""
        now = time.monotonic()
        for meter in self.meters.values():
            process = meter.process
            if process.popen is not None and process.popen.poll() is not None:
                code = process.popen.wait()  # it has exited: returns at once
                process.popen = None
                if code == 0:
                    meter.segment += 1
                    self._check_meter(meter)
                else:
                    self._unexpected(process, code)
            if process.popen is None and self._meter_due(meter) and now >= process.not_before:
                self._start_meter(meter)
        if self.ledger.popen is not None and self.ledger.popen.poll() is not None:
            code = self.ledger.popen.wait()  # it has exited: returns at once
            self.ledger.popen = None
            self._unexpected(self.ledger, code)
            self._check_ledger()
        if self.ledger.popen is None and now >= self.ledger.not_before:
            self._start_ledger()

    def _unexpected(self, process: _Process, code: int) -> None:
        text = f"{process.name} exited {code} by itself: {process.tail()[-1500:]}"
        self.report.unexpected_exits.append(text)
        self.note(f"UNEXPECTED {process.name} exit {code}")
        process.not_before = time.monotonic() + CRASH_RESTART_PAUSE_S
        if len(self.report.unexpected_exits) > MAX_UNEXPECTED_EXITS:
            raise self.fail("processes keep exiting by themselves", self.report.unexpected_exits)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Supervise until ``condition()`` holds; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                raise self.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
            self.supervise()
            time.sleep(POLL_S)

    def pause(self, seconds: float) -> None:
        """Let the processes run for a seeded moment (the fault's timing), supervising."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.supervise()
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    # -- checks after a cycle --

    def _check_meter(self, meter: _Meter) -> None:
        assert self.reference is not None
        problems, held = check_spool(meter.spool, meter.plan.node_id, self.reference)
        self.observed.update(held)
        shipped = load_shipped(meter.spool) if meter.spool.exists() else None
        if meter.last_shipped is not None and (shipped is None or shipped < meter.last_shipped):
            problems.append(
                f"acknowledged position of {meter.plan.node_id} moved back: "
                f"{meter.last_shipped} -> {shipped}"
            )
        meter.last_shipped = shipped
        if problems:
            raise self.fail(f"spool of {meter.plan.node_id} after a kill", problems)

    def _check_ledger(self) -> None:
        assert self.reference is not None
        problems, _ = check_store(self.db, self.reference)
        if problems:
            raise self.fail("the ledger's store after a kill", problems)

    # -- faults --

    def inject(self, fault: Fault) -> None:
        """Inject one fault, recover, check; retarget a kill whose target is gone."""
        if fault.kind is FaultKind.METER_KILL:
            if not self._kill_meter(fault):
                self.report.retargeted += 1
                self._kill_ledger(dataclasses.replace(fault, kind=FaultKind.LEDGER_KILL))
        elif fault.kind is FaultKind.LEDGER_KILL:
            self._kill_ledger(fault)
        elif fault.kind is FaultKind.STORE_LOST:
            self._store_lost()
        elif fault.kind in (FaultKind.BROKER_KILL, FaultKind.BROKER_RESTART):
            self._outage(fault)
        else:
            self._duplicates(fault)

    def _kill_meter(self, fault: Fault) -> bool:
        meters = [self.meters[fault.target]] if fault.target in self.meters else []
        meters += [m for n, m in sorted(self.meters.items()) if n != fault.target]
        meter = next((m for m in meters if m.process.alive()), None)
        if meter is None:
            return False
        if fault.wait_progress:
            self.wait_for(
                lambda: (
                    not meter.process.alive()
                    or _spool_bytes(meter.spool) > meter.start_bytes
                    or load_shipped(meter.spool) != meter.start_shipped
                ),
                PROGRESS_TIMEOUT_S,
                f"progress of {meter.process.name}",
            )
        self.pause(fault.delay_s)
        if not meter.process.alive():
            return self._kill_meter(dataclasses.replace(fault, wait_progress=False, delay_s=0))
        ran_s = time.monotonic() - meter.process.started_at
        code = meter.process.kill9()
        if code != -signal.SIGKILL:
            # It finished (or died) on its own just before the signal: not this cycle.
            if code == 0:
                meter.segment += 1
            else:
                self._unexpected(meter.process, code)
            self._check_meter(meter)
            return self._kill_meter(dataclasses.replace(fault, wait_progress=False, delay_s=0))
        self._check_meter(meter)
        self.cycle(
            FaultKind.METER_KILL,
            f"{meter.plan.node_id} after {ran_s:.2f}s, spool {_spool_bytes(meter.spool)} B, "
            f"acked {meter.last_shipped}",
        )
        self.supervise()  # restarts it
        return True

    def _kill_ledger(self, fault: Fault) -> None:
        if not self.ledger.alive():
            self.wait_for(self.ledger.alive, PROCESS_START_TIMEOUT_S, "the ledger to start")
        when = "startup"
        if fault.wait_progress:
            self.wait_for(
                lambda: (
                    not self.ledger.alive() or b"kafka_assigned" in self.ledger.log_since_start()
                ),
                PROCESS_START_TIMEOUT_S,
                "the ledger to assign its partitions",
            )
            when = "running"
            self.pause(fault.delay_s)
        else:
            self.pause(max(0.0, self.ledger.started_at + fault.delay_s - time.monotonic()))
            if time.monotonic() - self.ledger.started_at > 1.0:
                when = "running"
        if not self.ledger.alive():
            self.wait_for(self.ledger.alive, PROCESS_START_TIMEOUT_S, "the ledger to restart")
        ran_s = time.monotonic() - self.ledger.started_at
        code = self.ledger.kill9()
        if code != -signal.SIGKILL:
            self._unexpected(self.ledger, code)
        self._check_ledger()
        self.cycle(FaultKind.LEDGER_KILL, f"{when} after {ran_s:.2f}s")
        self.ledger.not_before = 0.0
        self.supervise()

    def _store_lost(self) -> None:
        """The store is lost on both transports and rebuilt from the stream.

        Kafka: the ledger is killed, its DuckDB file deleted, and a ledger replays the
        topic from offset 0: every chain of the lost store must be a prefix of the
        rebuilt one (the stream has grown since), and the store whole. Local: the
        canonical reference ledger's store is deleted and rebuilt from its intake log
        (its spools include its own close spool): identical to what was lost.
        """
        assert self.reference is not None
        if self.ledger.alive():
            code = self.ledger.kill9()
            if code != -signal.SIGKILL:
                self._unexpected(self.ledger, code)
        lost: dict[str, list[bytes]] = {}
        if self.db.exists():
            with Store(self.db) as store:
                lost = {p: store.record_envelopes(p) for p in store.placements()}
        remove_store(self.db)
        self._final_run()
        problems, _ = check_store(self.db, self.reference)
        with Store(self.db) as store:
            for placement_id, envelopes in sorted(lost.items()):
                rebuilt = store.record_envelopes(placement_id)
                if rebuilt[: len(envelopes)] != envelopes:
                    problems.append(
                        f"{placement_id}: the chain rebuilt from offset 0 does not extend the "
                        f"lost one ({len(envelopes)} records, {len(rebuilt)} rebuilt)"
                    )
        if problems:
            raise self.fail("the store rebuilt from offset 0", problems)
        canonical = self.workdir / "reference" / "canonical"
        rebuilt_local = rebuild_local(
            self.scenario.cast.ledger, canonical, self.scenario.late_clock_ms
        )
        if rebuilt_local != self.reference.ledger:
            raise self.fail(
                "the local store rebuilt from its intake log differs from the lost one",
                [f"heads {rebuilt_local.heads} != {self.reference.ledger.heads}"],
            )
        records = sum(len(e) for e in lost.values())
        self.cycle(
            FaultKind.STORE_LOST,
            f"kafka: {records} records rebuilt from offset 0; local: "
            f"{sum(i + 1 for i, _ in rebuilt_local.heads.values())} records from the intake log",
        )
        self.ledger.not_before = 0.0
        self.supervise()

    def _outage(self, fault: Fault) -> None:
        running = {n: m for n, m in self.meters.items() if m.process.alive()}
        before = {n: load_shipped(m.spool) for n, m in running.items()}
        error: list[BaseException] = []

        def restart() -> None:
            try:
                if fault.kind is FaultKind.BROKER_KILL:
                    self.broker.kill()
                    time.sleep(fault.delay_s)  # the outage itself (seeded length)
                    self.broker.restart()
                else:
                    self.broker.restart(hard=False)
            except BaseException as exc:
                error.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=restart, name="broker-outage")
        thread.start()
        while thread.is_alive():
            self.supervise()
            thread.join(POLL_S)
        if error:
            raise self.fail(f"the broker did not come back: {error[0]!r}")
        down_s = time.monotonic() - started

        def shipping_again() -> bool:
            for node, meter in running.items():
                if meter.process.alive() and load_shipped(meter.spool) == before[node]:
                    return False
            return True

        self.wait_for(shipping_again, RECOVERY_TIMEOUT_S, "the agents to ship after the outage")
        self.cycle(
            fault.kind,
            f"down {down_s:.1f}s, {len(running)} agent(s) shipping again after "
            f"{time.monotonic() - started - down_s:.1f}s",
        )

    def _duplicates(self, fault: Fault) -> None:
        messages = read_topic(self.settings, self.scenario.partitions)
        keyed = [m for m in messages if m.key is not None]
        rng = random.Random(f"gridledger-faults/{self.seed}/dup/{self.report.total_cycles}")
        picked = [keyed[rng.randrange(len(keyed))] for _ in range(fault.count)] if keyed else []
        items = [(m.key.decode(), m.value) for m in picked if m.key is not None]
        # Re-delivered as sent: stating the time the first copy stated.
        publish(self.settings, items, [m.timestamp_ms for m in picked if m.key is not None])
        self.cycle(FaultKind.DUPLICATES, f"{len(items)} re-delivered of {len(messages)}")

    # -- the run --

    def execute(self) -> FaultReport:
        """Run the seed: setup, reference, the faulty run, final checks."""
        timings = self.report.timings_s
        mark = time.monotonic()
        configs = self._setup()
        self.reference = build_reference(self.scenario, configs, self.workdir / "reference")
        timings["reference"] = time.monotonic() - mark
        from transport.kafka import (
            SIMULATION_TOPIC_CONFIG,
            create_topic,
            replicated_topic_config,
        )

        rf = self.replication_factor
        # A simulation's topic (records state their simulated time, SPEC §6.6), with the
        # replicated settings on a cluster.
        config = {**replicated_topic_config(rf), **SIMULATION_TOPIC_CONFIG}
        if rf == 1:
            config.pop("min.insync.replicas")
        create_topic(
            self.bootstrap,
            self.topic,
            self.scenario.partitions,
            replication_factor=rf,
            config=config,
        )
        self.note(f"topic {self.topic}; {self.scenario.describe()}")
        try:
            self._faulty_run()
            mark = time.monotonic()
            self._final_checks()
        finally:
            for process in [self.ledger, *(m.process for m in self.meters.values())]:
                if process.alive():
                    process.kill9()
            (self.workdir / "faults.log").write_text("\n".join(self.report.log) + "\n")
        timings["checks"] = time.monotonic() - mark
        timings["total"] = time.monotonic() - self.started
        return self.report

    def _faulty_run(self) -> None:
        scenario, schedule = self.scenario, self.schedule
        timings = self.report.timings_s
        mark = time.monotonic()
        self._publish(
            [(p, e) for p, e in scenario.pre if not self._held_terms(p, e)],
            scenario.early_clock_ms,
        )
        self.meter_phase = "early"
        self.supervise()  # starts the ledger and the agents
        terms_published = scenario.late_terms is None
        for index, fault in enumerate(schedule.of_phase("early")):
            if not terms_published and index == schedule.terms_after:
                self._publish(self._late_terms(), scenario.early_clock_ms)
                terms_published = True
                self.note(f"terms of {scenario.late_terms} published (held inputs released)")
            self.inject(fault)
        if not terms_published:
            self._publish(self._late_terms(), scenario.early_clock_ms)
        self._hurry()
        self.wait_for(
            lambda: all(
                not self._meter_due(m) and not m.process.alive() for m in self.meters.values()
            ),
            PHASE_TIMEOUT_S,
            "the agents to finish the early phase",
        )
        timings["early"] = time.monotonic() - mark
        mark = time.monotonic()
        self._publish(list(scenario.post), scenario.post_clock_ms)
        # The ledger's clock moves past every close: restart it with the late clock.
        if self.ledger.alive():
            self.ledger.kill9()
        self.ledger_config = self.workdir / "ledger-late.toml"
        self.meter_phase = None
        self.supervise()
        for fault in schedule.of_phase("before_close"):
            self.inject(fault)
        self._wait_for_closes()
        timings["close"] = time.monotonic() - mark
        mark = time.monotonic()
        self._publish(list(scenario.late), scenario.late_clock_ms)
        self.meter_phase = "late"
        self.pace_ms = schedule.pace_ms
        self.supervise()
        for fault in schedule.of_phase("after_close"):
            self.inject(fault)
        self._hurry()
        self.wait_for(
            lambda: all(
                not self._meter_due(m) and not m.process.alive() for m in self.meters.values()
            ),
            PHASE_TIMEOUT_S,
            "the agents to finish the late phase",
        )
        # A clean stop: SIGTERM once it runs (during start-up Python's default handler
        # would end it before the ledger installs its own).
        self.wait_for(
            lambda: self.ledger.alive() and b"ledger_running" in self.ledger.log_since_start(),
            PROCESS_START_TIMEOUT_S,
            "the ledger to run before it is stopped",
        )
        if self.ledger.popen is not None:
            self.ledger.popen.send_signal(signal.SIGTERM)
            try:
                code = self.ledger.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = self.ledger.kill9()
            self.ledger.popen = None
            if code != 0:
                self.report.unexpected_exits.append(f"ledger exited {code} on SIGTERM")
        for meter in self.meters.values():
            self._check_meter(meter)
        timings["late"] = time.monotonic() - mark

    def _publish(self, items: list[tuple[str, bytes]], stated_ms: int) -> None:
        """Publish records of one phase, each stating the phase's simulated time."""
        publish(self.settings, items, [stated_ms] * len(items))

    def _hurry(self) -> None:
        """The phase's faults are done: agents still pacing are killed (checked like any
        kill, not counted as a cycle) and restarted at full speed to finish the phase."""
        self.pace_ms = 0
        for meter in self.meters.values():
            if meter.process.alive():
                code = meter.process.kill9()
                if code == 0:
                    meter.segment += 1
                elif code != -signal.SIGKILL:
                    self._unexpected(meter.process, code)
                self._check_meter(meter)
                self.note(f"hurry: {meter.plan.node_id} restarted unpaced")
        self.supervise()

    def _held_terms(self, placement_id: str, envelope: bytes) -> bool:
        return placement_id == self.scenario.late_terms and open_envelope(envelope).kind == "terms"

    def _late_terms(self) -> list[tuple[str, bytes]]:
        return [(p, e) for p, e in self.scenario.pre if self._held_terms(p, e)]

    def _wait_for_closes(self) -> None:
        wanted = set(self.scenario.placement_ids)
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            closed = {
                m.key.decode()
                for m in read_topic(self.settings, self.scenario.partitions)
                if m.key is not None and open_envelope(m.value).kind == "closed"
            }
            if wanted <= closed:
                self.note("every close is in the topic")
                return
            if time.monotonic() >= deadline:
                raise self.fail(f"closes missing from the topic: {sorted(wanted - closed)}")
            self.pause(TOPIC_POLL_S)

    def _final_run(self) -> None:
        """The last recovery: an in-process ledger catches up with everything and attests
        at the heads on its way out, as ``ledger run`` does."""

        async def go() -> None:
            store = Store(self.db, ledger_public_key=self.scenario.cast.ledger.public_key)
            service = KafkaLedgerService(
                store,
                self.scenario.cast.ledger,
                KafkaConfig(settings=self.settings),
                clock=fixed_clock(self.scenario.late_clock_ms),
                batch_max_records=self.scenario.batch_max_records,
                arrival="sender",
            )
            try:
                await service.start()
                try:
                    await service.run_until(deadline_s=FINAL_RUN_TIMEOUT_S, idle_poll_ms=200)
                finally:
                    await service.stop()
                # As a stopping `ledger run` does (its attest loop's last round, SPEC §8.4):
                # each head gets its statement and checkpoint.
                attest_once(store, self.scenario.cast.ledger)
            finally:
                service.close()

        asyncio.run(go())

    def _final_checks(self) -> None:
        scenario, reference = self.scenario, self.reference
        assert reference is not None
        self._final_run()
        problems, faulty = check_store(self.db, reference)
        if faulty is None:
            raise self.fail("the ledger's store at the end", problems)
        messages = read_topic(self.settings, scenario.partitions)
        self.report.topic_messages = len(messages)
        self.report.duplicates_dropped = sum(faulty.dropped.values())
        self.report.spooled_seen = len(self.observed)
        same_stream = fold_partitions(
            scenario.cast.ledger, self.workdir / "same-stream", scenario.late_clock_ms, messages
        )
        problems = compare_final(scenario, reference, faulty, same_stream, messages, self.observed)
        if problems:
            raise self.fail("invariants at the end of the run", problems)
        self._witness()
        self.report.exports_verified = self._verify_exports()

    def _witness(self) -> None:
        """The operator's and the buyer's witnesses check every placement's log through the
        ledger's API (SPEC §8.3), as the parties would: the operator with its agents'
        delivery logs, the buyer with the terms it signed. However faulty the run (kills,
        broker restarts, duplicates, a lost store), an honest ledger is never refused."""

        from ledger.http import LedgerApi, LedgerHttpServer
        from ledger.metrics import LedgerMetrics
        from proto.delivery import DELIVERY_LOG_FILE
        from witness.known import keep
        from witness.runner import EXIT_OK, witness_once

        cast = self.scenario.cast
        base = self.workdir / "witness"
        keys = base / "keys"
        for party in (cast.operator, cast.buyer):
            if not (keys / f"{party.name}.key").exists():
                write_key_pair(party, keys)
        logs = sorted(
            {
                m.spool / DELIVERY_LOG_FILE
                for m in self.meters.values()
                if (m.spool / DELIVERY_LOG_FILE).exists()
            }
        )
        store = Store(self.db, ledger_public_key=cast.ledger.public_key)
        server = LedgerHttpServer(LedgerApi(store, cast.ledger, LedgerMetrics()), "127.0.0.1", 0)
        server.start()
        try:
            for terms in self.scenario.terms:
                pid = terms.placement_id
                terms_file = base / f"{pid}.terms.signed.json"
                terms_file.write_bytes(builders.signed_terms(cast, terms))
                known = base / f"{pid}.buyer-known"
                known.mkdir(parents=True, exist_ok=True)
                # The buyer published its terms at the simulated time they state.
                keep(
                    known,
                    terms_file.read_bytes(),
                    self.scenario.early_clock_ms,
                    name="terms.signed.json",
                )
                for role, key, delivery_logs, known_dir in (
                    ("operator", cast.operator, logs, None),
                    ("buyer", cast.buyer, [], known),
                ):
                    result = witness_once(
                        ledger_url=server.url,
                        terms_path=terms_file,
                        key_path=keys / f"{key.name}.key",
                        state_dir=base / role,
                        delivery_logs=delivery_logs,
                        known_dir=known_dir,
                        now_s=int(time.time()),
                        simulation=True,  # arrival = "sender" (SPEC §6.6)
                    )
                    if result.code != EXIT_OK:
                        raise self.fail(
                            f"the {role}'s witness refused an honest run", [result.line]
                        )
                    self.note(f"witness {role}: {result.line}")
        finally:
            server.stop()
            store.close()

    def _verify_exports(self) -> int:
        from verifier.cli import main as verify_main

        trust = self.workdir / "trust.json"
        verified = 0
        for placement_id in self.scenario.placement_ids:
            out = self.workdir / "exports" / f"{placement_id}.duckdb"
            export_placement(self.db, placement_id, out, key=self.scenario.cast.ledger)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = verify_main([str(out), "--trust", str(trust)])
            if code != 0:
                raise self.fail(
                    f"verify {out} exited {code}", printed.getvalue().splitlines()[-30:]
                )
            verified += 1
        return verified


def run_seed(
    seed: int,
    *,
    bootstrap: str,
    broker: BrokerControl,
    workdir: Path,
    cycles: int = DEFAULT_CYCLES_PER_SEED,
    schedule: Schedule | None = None,
    topic: str | None = None,
    replication_factor: int = 1,
) -> FaultReport:
    """Run one seed's scenario and fault schedule; raise FaultFailure when an invariant
    does not hold (the message names the seed and the replay command).

    ``schedule`` replaces the seed's own (``make_schedule``), e.g. broker faults alone on
    a cluster; ``topic`` names the topic (else a fresh name), created with
    ``replication_factor`` replicas (above 1: ``replicated_topic_config``)."""
    return _SeedRun(
        seed,
        cycles,
        bootstrap,
        broker,
        workdir,
        schedule=schedule,
        topic=topic,
        replication_factor=replication_factor,
    ).execute()


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """An integer from the environment (the suite's knobs), with a clear error."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ValueError(f"{name}={value!r} is not a non-negative integer")
    return int(value)


EXTRA_SEEDS_START: Final = 1000
"""Seeds past the defaults (``GRIDLEDGER_FAULT_SEEDS`` > 5) are 1000, 1001, ..."""


def suite_seeds(environ: Mapping[str, str] | None = None) -> list[int]:
    """The seeds the test suite runs: ``GRIDLEDGER_FAULT_SEED`` alone when set (replay),
    else ``GRIDLEDGER_FAULT_SEEDS`` of them (the defaults first, then 1000, 1001, ...)."""
    env = os.environ if environ is None else environ
    if env.get(SEED_ENV, "").strip():
        return [env_int(SEED_ENV, 0, env)]
    count = env_int(SEEDS_ENV, len(DEFAULT_SEEDS), env)
    extra = range(EXTRA_SEEDS_START, EXTRA_SEEDS_START + max(0, count - len(DEFAULT_SEEDS)))
    return [*DEFAULT_SEEDS[:count], *extra]
