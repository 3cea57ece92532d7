"""The seeded fault harness (issue 8): meter -> real Kafka -> ledger, with faults injected.

For a seed, ``generate_scenario`` draws a small scenario (1-3 placements on 1-3 nodes,
terms within the SPEC bounds, GPUs unhealthy or vanishing for a while, maybe a reclaim,
a key rotation by NodeKeyBinding, adjustments, a clock-skewed node whose last intervals
arrive after the close, late records after the close, terms that arrive mid-stream so
inputs are held) and ``make_schedule`` a fault schedule. ``run_seed`` then runs it for
real: ``gridledger meter run`` subprocesses (one per node) ship to a Kafka topic, a
``gridledger ledger run`` subprocess folds it, and the faults land while they work:

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

A *cycle* is one injected fault, its recovery and a check: after a meter kill the spool
must hold a byte-exact, contiguous run of what the fault-free agent signs and the
acknowledged position must not move back; after a ledger kill every chain in the store
must be whole (indices 0..n-1, prev links, record hashes, sources matching the chained
inputs), no input chained twice, and every decision equal to the fault-free run's; after
an outage every agent must ship again. At the end of a run (``compare_final``):

(a) every event that reached a spool (all spool contents seen across the run) is one the
    fault-free agent signs, and every one of those is chained exactly once in the store,
    accepted or rejected with the same reason as in the fault-free run; per placement,
    messages in the topic = chained inputs + dropped duplicates (nothing lost, nothing
    counted twice, nothing quarantined);
(b) chain heads, final statements and dropped counts equal those of a fault-free ledger
    over the same stream, and decisions and final totals equal those of the fault-free
    run of the seed (below);
(c) ``verify`` accepts the export of every placement (exit 0).

**Why the comparison in (b) is sound.** A chain is a pure function of the order of its
placement's inputs in one partition. That order is fixed by construction wherever it
changes a decision: the harness publishes in phases separated by barriers — terms, key
bindings, early reclaims and adjustments before the agents start; reclaims and
adjustments "after the usage" only once every agent exited 0 (all acknowledged); the
ledger gets a clock past every close only then, so its closes land after all usage;
late records, and the skewed node's remaining intervals, only once every close is in
the topic. What stays free is (i) where re-deliveries fall (dropped, never chained),
(ii) where held inputs wait (released in arrival order right after the terms, which is
the order a single source produced them), and (iii) how the streams of *different*
nodes of one placement interleave. So two references are used:

* *same stream*: the faulty topic is read back and each partition's exact sequence
  (re-deliveries included) is folded by a fault-free ledger (local transport, one spool
  per partition, same key and clock). Its heads, final statements and dropped counts
  must equal the faulty run's byte for byte: kill -9, restarts and outages changed
  nothing the stream did not dictate.
* *fault-free run of the seed*: the agents run in-process on simulated clocks (the same
  ``build_agent`` and simulator the CLI uses, so the same bytes) and everything is
  folded in the canonical phase order from one ordered spool. Decisions per input and
  final totals must be equal for every placement (with the phases above they do not
  depend on how node streams interleave), and for a placement on one node — one ordered
  source — heads and final statements must be equal byte for byte as well.

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
import enum
import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol

import structlog
import tomli_w

from devtools import builders
from ledger.config import KafkaConfig
from ledger.export import export_placement
from ledger.service import KafkaLedgerService, LedgerService, fixed_clock
from ledger.store import Store
from meter.cli import build_agent
from meter.clock import SimClock
from meter.config import load_meter_config
from meter.metrics import MeterMetrics
from meter.shipper import load_shipped
from meter.sim import parse_sim_spec
from proto.envelope import open_envelope, sha256_hex
from proto.errors import ProtoError
from proto.keys import SigningKey, write_key_pair
from proto.limits import MAX_SAFE_INTEGER
from proto.records import (
    GpuSpec,
    LedgerRecord,
    PlacementTerms,
    Statement,
    Totals,
    UsageEvent,
)
from proto.terms import CURRENCY_MINOR_UNITS, validate_terms
from proto.trust import dump_trust
from transport.kafka import KafkaSettings, client_kwargs, publish_kafka
from transport.local import publish_local
from transport.positions import SpoolPosition
from transport.spool import SpoolError, list_segments, read_spool, segment_path

__all__ = [
    "CYCLES_ENV",
    "DEFAULT_CYCLES_PER_SEED",
    "DEFAULT_SEEDS",
    "SEEDS_ENV",
    "SEED_ENV",
    "BrokerControl",
    "Fault",
    "FaultFailure",
    "FaultKind",
    "FaultReport",
    "LedgerState",
    "Reference",
    "Scenario",
    "Schedule",
    "build_reference",
    "check_spool",
    "check_store",
    "compare_final",
    "env_int",
    "fold_partitions",
    "generate_scenario",
    "make_schedule",
    "read_ledger_state",
    "read_topic",
    "rebuild_local",
    "remove_store",
    "replay_command",
    "run_seed",
    "suite_seeds",
    "write_node_configs",
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

MIN_CYCLES: Final = 8
"""Fewest cycles a schedule can have (one of each kind and the phases' ledger kills)."""

MAX_CYCLES: Final = 10_000
"""Most cycles one seed may ask for (a soak runs many seeds rather than one huge one)."""

INTERVAL_MS: Final = 60_000
"""Usage interval of every simulated agent: one event per stream per simulated minute."""

BASE_MS: Final = 1_767_225_600_000
"""2026-01-01T00:00:00Z: windows start within a day after it."""

MAX_PLACEMENTS: Final = 3
"""Placements per scenario (at least one)."""

MAX_NODES: Final = 3
"""Nodes per scenario (at least one)."""

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

KAFKA_IO_TIMEOUT_S: Final = 60.0
"""Longest one read of the whole topic or one publish may take."""

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

Phase = Literal["early", "late"]
FaultPhase = Literal["early", "before_close", "after_close"]


class FaultFailure(AssertionError):
    """An invariant did not hold; the message names the seed and the replay command."""


def replay_command(seed: int, cycles: int) -> str:
    """The command that replays one seed's scenario and fault schedule."""
    return (
        f"{SEED_ENV}={seed} {CYCLES_ENV}={cycles} "
        ".venv/bin/python -m pytest tests/test_faults.py -k replay"
    )


# ---- the scenario (pure, seeded) ------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One run of a node's agent: signing with ``key`` up to ``until_ms``, in ``phase``."""

    key: Literal["k0", "k1"]
    until_ms: int
    phase: Phase


@dataclass(frozen=True)
class NodePlan:
    """What one node's agent does: its simulator spec and its runs in order."""

    node_id: str
    sim_spec: str
    segments: tuple[Segment, ...]
    rotation_ms: int | None
    skew_ms: int


@dataclass(frozen=True)
class Scenario:
    """Everything one seed describes before any process runs."""

    seed: int
    cast: builders.Cast
    terms: tuple[PlacementTerms, ...]
    nodes: tuple[NodePlan, ...]
    pre: tuple[tuple[str, bytes], ...]
    post: tuple[tuple[str, bytes], ...]
    late: tuple[tuple[str, bytes], ...]
    late_terms: str | None
    early_clock_ms: int
    late_clock_ms: int
    partitions: int
    segment_max_bytes: int
    batch_max_records: int
    features: tuple[str, ...]

    @property
    def placement_ids(self) -> list[str]:
        """The placements, in order."""
        return [t.placement_id for t in self.terms]

    def nodes_of(self, placement_id: str) -> list[str]:
        """The nodes hosting GPUs of a placement."""
        terms = next(t for t in self.terms if t.placement_id == placement_id)
        return sorted({g.node_id for g in terms.gpus})

    def single_source(self, placement_id: str) -> bool:
        """True when one agent produces all of the placement's usage (one ordered source)."""
        return len(self.nodes_of(placement_id)) == 1

    def node_terms(self, node_id: str) -> list[PlacementTerms]:
        """The terms of the placements a node hosts."""
        return [t for t in self.terms if any(g.node_id == node_id for g in t.gpus)]

    def rotated_key(self, node_id: str) -> SigningKey:
        """The key a node rotates to (``Segment.key == "k1"``)."""
        return rotated_key(self.seed, node_id)

    def describe(self) -> str:
        """One line for logs and failures."""
        nodes = ",".join(
            f"{n.node_id}[{'+'.join(f'{s.key}<={s.until_ms}/{s.phase}' for s in n.segments)}]"
            for n in self.nodes
        )
        return (
            f"seed {self.seed}: {len(self.terms)} placement(s), nodes {nodes}, "
            f"{self.partitions} partition(s); {', '.join(self.features) or 'plain'}"
        )


_MODELS: Final = ("A100-80GB", "H100-80GB", "L40S")


def rotated_key(seed: int, node_id: str) -> SigningKey:
    """The key node ``node_id`` of seed ``seed`` rotates to (deterministic)."""
    return SigningKey.from_seed_text(f"{node_id}-k1", f"faults-{seed}/rotated/{node_id}")


def _grid(t0: int, k: int) -> int:
    return t0 + k * INTERVAL_MS


def _currency(rng: random.Random) -> tuple[str, int]:
    currency = rng.choice(sorted(CURRENCY_MINOR_UNITS))
    minor = CURRENCY_MINOR_UNITS[currency]
    return currency, rng.randint(minor, min(9, minor + 3))


def _terms(
    rng: random.Random,
    cast: builders.Cast,
    placement_id: str,
    gpus: list[GpuSpec],
    start_ms: int,
    end_ms: int,
) -> PlacementTerms:
    window_ms = end_ms - start_ms
    currency, scale = _currency(rng)
    increment_ms = min(window_ms, rng.choice([1, 1000, 60_000, 900_000, 3_600_000]))
    terms = builders.make_terms(
        cast,
        placement_id,
        gpus,
        start_ms,
        end_ms,
        rate_per_gpu_hour_minor=rng.choice([0, 1, 250, 99_999, rng.randint(1, 10**8)]),
        currency=currency,
        currency_scale=scale,
        increment_ms=increment_ms,
        minimum_duration_ms=rng.choice([0, rng.randint(0, window_ms)]),
        desk_fee_bps=rng.choice([0, 250, 500, rng.randint(0, 10_000)]),
        fee_payer=rng.choice(["operator", "buyer"]),
        interruptible=rng.random() < 0.5,
        reclaim_notice_ms=rng.choice([0, 300_000, 600_000, rng.randint(0, window_ms)]),
        reclaim_penalty_bps=rng.randint(0, 10_000),
        sla_availability_target_bps=rng.choice([0, 9_000, 9_900, 10_000]),
        sla_credit_bps=rng.randint(0, 10_000),
        settlement_period_ms=rng.choice([3_600_000, window_ms]),
        late_grace_ms=rng.choice([0, 60_000, 300_000]),
    )
    problems = validate_terms(terms)
    if problems:  # the generator's own bug: the scenario must be valid
        raise AssertionError(f"generated invalid terms for {placement_id}: {problems}")
    return terms


def _adjustment(
    rng: random.Random, cast: builders.Cast, placement_id: str, number: int, when_ms: int
) -> bytes:
    return builders.adjustment(
        cast,
        placement_id,
        f"{placement_id}-adj{number}",
        rng.choice(["credit", "charge"]),
        rng.randint(1, 50_000),
        when_ms,
        reference=f"{placement_id}/statement",
    )


def generate_scenario(seed: int) -> Scenario:
    """The scenario of ``seed``: a pure function of the seed (same seed, same bytes)."""
    rng = random.Random(f"gridledger-faults/{seed}/scenario")
    cast = builders.make_cast(f"faults-{seed}")
    node_ids = [f"f{seed}-n{j}" for j in range(rng.randint(1, MAX_NODES))]
    t0 = _grid(BASE_MS, rng.randrange(0, 24 * 60))
    features: list[str] = []
    gpu_index: Counter[str] = Counter()
    terms_list: list[PlacementTerms] = []
    for i in range(rng.randint(1, MAX_PLACEMENTS)):
        placement_id = f"f{seed}-p{i}"
        hosts = sorted(rng.sample(node_ids, rng.randint(1, len(node_ids))))
        gpus = []
        for node_id in hosts:
            for _ in range(rng.randint(1, 2)):
                gpus.append(
                    builders.gpu(
                        node_id,
                        gpu_index[node_id],
                        model=rng.choice(_MODELS),
                        share_milli=rng.choice([1000, 1000, 500, 250, rng.randint(1, 1000)]),
                    )
                )
                gpu_index[node_id] += 1
        start_ms = _grid(t0, rng.randint(0, 10))
        # Most windows end on the agents' grid; some end inside an interval (clipped).
        end_ms = _grid(start_ms, rng.randint(30, 75)) + rng.choice([0, 0, 12_345])
        terms_list.append(_terms(rng, cast, placement_id, gpus, start_ms, end_ms))
    by_id = {t.placement_id: t for t in terms_list}
    late_clock_ms = max(t.window_end_ms + t.late_grace_ms for t in terms_list) + 1_000
    early_clock_ms = min(t.window_start_ms for t in terms_list)

    pre: list[tuple[str, bytes]] = []
    post: list[tuple[str, bytes]] = []
    late: list[tuple[str, bytes]] = []
    for terms in terms_list:
        pre.append((terms.placement_id, builders.signed_terms(cast, terms)))

    # Nodes: simulator faults, a key rotation, a skewed clock.
    rotated = rng.choice(node_ids) if rng.random() < 0.4 else None
    skewed = rng.choice(node_ids) if rng.random() < 0.4 else None
    plans: list[NodePlan] = []
    for node_id in node_ids:
        mine = [t for t in terms_list if any(g.node_id == node_id for g in t.gpus)]
        if not mine:
            continue
        epoch_ms = min(t.window_start_ms for t in mine)
        end_ms = max(t.window_end_ms for t in mine)
        span_ms = end_ms - epoch_ms
        uuids = sorted(g.uuid for t in mine for g in t.gpus if g.node_id == node_id)
        spec = [f"seed={rng.randint(0, 10**6)}"]
        if rng.random() < 0.6:
            a = rng.randrange(0, span_ms // 2)
            spec.append(f"unhealthy={rng.choice(uuids)}@{a}-{a + rng.randint(1, span_ms // 3)}")
            features.append(f"{node_id} GPU unhealthy")
        if rng.random() < 0.3:
            a = rng.randrange(span_ms // 3, span_ms)
            until = f"-{a + rng.randint(1, span_ms)}" if rng.random() < 0.5 else ""
            spec.append(f"vanish={rng.choice(uuids)}@{a}{until}")
            features.append(f"{node_id} GPU vanishes")
        rotation_ms: int | None = None
        if node_id == rotated:
            rotation_ms = _grid(epoch_ms, rng.randint(3, max(3, span_ms // INTERVAL_MS - 3)))
            features.append(f"{node_id} key rotated at {rotation_ms}")
            key0, key1 = cast.node_key(node_id), rotated_key(seed, node_id)
            for t in mine:
                # Revoke the terms' key from the rotation on, bind the new one from then.
                pre.append(
                    (
                        t.placement_id,
                        builders.key_binding(
                            cast, t.placement_id, node_id, key0, 0, rotation_ms, t.created_at_ms
                        ),
                    )
                )
                pre.append(
                    (
                        t.placement_id,
                        builders.key_binding(
                            cast,
                            t.placement_id,
                            node_id,
                            key1,
                            rotation_ms,
                            MAX_SAFE_INTEGER,
                            t.created_at_ms,
                        ),
                    )
                )
        skew_ms = 0
        early_until = end_ms
        if node_id == skewed:
            grace = max(t.late_grace_ms for t in terms_list)
            skew_ms = grace + rng.randint(1, 12) * INTERVAL_MS + rng.choice([0, 7_000])
            early_until = min(end_ms, late_clock_ms - skew_ms)
            if early_until < end_ms:
                features.append(f"{node_id} clock {skew_ms} ms behind: late usage")
        segments: list[Segment] = []
        key: Literal["k0", "k1"] = "k0"
        if rotation_ms is not None and rotation_ms < early_until:
            segments.append(Segment("k0", rotation_ms, "early"))
            key = "k1"
        segments.append(Segment(key, early_until, "early"))
        if rotation_ms is not None and early_until <= rotation_ms < end_ms:
            segments.append(Segment("k0", rotation_ms, "late"))
            key = "k1"
        if early_until < end_ms:
            segments.append(Segment(key, end_ms, "late"))
        plans.append(NodePlan(node_id, ",".join(spec), tuple(segments), rotation_ms, skew_ms))

    # Operator and desk records around the usage.
    for terms in terms_list:
        pid = terms.placement_id
        window_intervals = (terms.window_end_ms - terms.window_start_ms) // INTERVAL_MS
        adjustments = 0

        reclaimed = False
        if rng.random() < 0.3:
            effective = _grid(terms.window_start_ms, rng.randint(1, window_intervals - 1))
            issued = max(0, effective - rng.randint(0, 2 * max(1, terms.reclaim_notice_ms)))
            pre.append((pid, builders.reclaim(cast, terms, issued, effective, f"{pid}-r1")))
            features.append(f"{pid} reclaimed")
            reclaimed = True
        if rng.random() < 0.3:
            adjustments += 1
            pre.append((pid, _adjustment(rng, cast, pid, adjustments, terms.window_start_ms)))
        if not reclaimed and rng.random() < 0.25:
            # Issued after the usage was folded: RECLAIM_BEHIND_USAGE unless none was.
            effective = _grid(terms.window_start_ms, 1)
            post.append((pid, builders.reclaim(cast, terms, effective, effective, f"{pid}-r2")))
            features.append(f"{pid} reclaim behind usage")
        if rng.random() < 0.35:
            adjustments += 1
            post.append((pid, _adjustment(rng, cast, pid, adjustments, terms.window_end_ms)))
        if rng.random() < 0.5:
            adjustments += 1  # folded after the close:
            late.append((pid, _adjustment(rng, cast, pid, adjustments, late_clock_ms)))
            features.append(f"{pid} late adjustment")
            if rng.random() < 0.3:
                # the same adjustment_id again, other bytes: ADJUSTMENT_DUPLICATE
                again = _adjustment(rng, cast, pid, adjustments, late_clock_ms + 1)
                late.append((pid, again))
        if rng.random() < 0.25:
            late.append(
                (
                    pid,
                    builders.reclaim(
                        cast, terms, late_clock_ms, terms.window_end_ms - 1, f"{pid}-late"
                    ),
                )
            )
            features.append(f"{pid} reclaim after close")
        if rng.random() < 0.2:
            node_id = terms.gpus[0].node_id
            late.append(
                (
                    pid,
                    builders.key_binding(
                        cast, pid, node_id, cast.node_key(node_id), 0, 1, late_clock_ms
                    ),
                )
            )
            features.append(f"{pid} key binding after close")
    late_terms = rng.choice(list(by_id)) if rng.random() < 0.3 else None
    if late_terms is not None:
        features.append(f"{late_terms} terms arrive mid-stream (inputs held)")
    return Scenario(
        seed=seed,
        cast=cast,
        terms=tuple(terms_list),
        nodes=tuple(plans),
        pre=tuple(pre),
        post=tuple(post),
        late=tuple(late),
        late_terms=late_terms,
        early_clock_ms=early_clock_ms,
        late_clock_ms=late_clock_ms,
        partitions=rng.randint(1, 4),
        segment_max_bytes=rng.choice([4096, 16_384, 1 << 20]),
        batch_max_records=rng.choice([1, 3, 8, 32]),
        features=tuple(features),
    )


# ---- the fault schedule (pure, seeded) -------------------------------------------------


class FaultKind(enum.StrEnum):
    """The classes of faults the harness injects."""

    METER_KILL = "meter_kill"
    LEDGER_KILL = "ledger_kill"
    BROKER_KILL = "broker_kill"
    BROKER_RESTART = "broker_restart"
    DUPLICATES = "duplicates"
    STORE_LOST = "store_lost"


@dataclass(frozen=True)
class Fault:
    """One fault: what, whom, when (``delay_s`` after it is due), and how much."""

    phase: FaultPhase
    kind: FaultKind
    target: str = ""
    delay_s: float = 0.0
    wait_progress: bool = False
    count: int = 0

    def describe(self) -> str:
        """A short human description."""
        who = f" {self.target}" if self.target else ""
        extra = f" x{self.count}" if self.count else ""
        wait = " after progress" if self.wait_progress else ""
        return f"{self.phase}:{self.kind.value}{who}{extra} +{self.delay_s:.2f}s{wait}"


@dataclass(frozen=True)
class Schedule:
    """The faults of one seed, in order, and the pacing that keeps agents killable."""

    faults: tuple[Fault, ...]
    terms_after: int
    pace_ms: int

    def of_phase(self, phase: FaultPhase) -> list[Fault]:
        """The faults of one phase, in order."""
        return [f for f in self.faults if f.phase == phase]


def make_schedule(scenario: Scenario, cycles: int) -> Schedule:
    """The fault schedule of a scenario with ``cycles`` faults (pure, seeded)."""
    if not MIN_CYCLES <= cycles <= MAX_CYCLES:
        raise ValueError(f"cycles {cycles} is outside {MIN_CYCLES}..{MAX_CYCLES}")
    rng = random.Random(f"gridledger-faults/{scenario.seed}/schedule/{cycles}")
    nodes = [n.node_id for n in scenario.nodes]
    late_nodes = [n.node_id for n in scenario.nodes if any(s.phase == "late" for s in n.segments)]
    outages = max(1, cycles // 25)
    duplicates = max(2, cycles // 10)
    before_close = max(2, cycles // 8)
    after_close = max(1, cycles // 10)
    store_lost = 1
    early = cycles - outages - duplicates - before_close - after_close - store_lost
    if early < 1:
        raise ValueError(f"{cycles} cycles are too few for this schedule")

    def kill(phase: FaultPhase, candidates: list[str]) -> Fault:
        if candidates and rng.random() < 0.6:
            return Fault(
                phase,
                FaultKind.METER_KILL,
                rng.choice(candidates),
                delay_s=round(rng.uniform(0.05, 1.0), 3),
                wait_progress=rng.random() < 0.5,
            )
        startup = rng.random() < 0.25
        return Fault(
            phase,
            FaultKind.LEDGER_KILL,
            delay_s=round(rng.uniform(0.0, 0.6) if startup else rng.uniform(0.0, 0.5), 3),
            wait_progress=not startup,
        )

    def dup(phase: FaultPhase) -> Fault:
        return Fault(phase, FaultKind.DUPLICATES, count=rng.randint(3, 20))

    early_faults = [kill("early", nodes) for _ in range(early)]
    for _ in range(outages):
        kind = FaultKind.BROKER_KILL if rng.random() < 0.5 else FaultKind.BROKER_RESTART
        # Not first: the agents should be spooling while the broker is away.
        early_faults.insert(
            rng.randint(1, len(early_faults)),
            Fault("early", kind, delay_s=round(rng.uniform(0.2, 2.5), 3)),
        )
    early_dups = duplicates // 2
    for _ in range(early_dups):
        early_faults.insert(rng.randint(1, len(early_faults)), dup("early"))
    late_faults: list[Fault] = [kill("before_close", []) for _ in range(before_close)]
    late_faults.insert(rng.randint(0, len(late_faults)), dup("before_close"))
    after = [kill("after_close", late_nodes) for _ in range(after_close)]
    for _ in range(duplicates - early_dups - 1):
        after.insert(rng.randint(0, len(after)), dup("after_close"))
    # Last: the ledger's store is lost and rebuilt (from offset 0; the local reference
    # from its intake log) while the late agents may still be shipping.
    after.append(Fault("after_close", FaultKind.STORE_LOST))
    faults = (*early_faults, *late_faults, *after)
    # Pace the agents so their work spans most of the early phase (kills find them busy).
    steps = 1
    for plan in scenario.nodes:
        epoch_ms = min(t.window_start_ms for t in scenario.node_terms(plan.node_id))
        steps = max(steps, (max(s.until_ms for s in plan.segments) - epoch_ms) // INTERVAL_MS)
    # Kills cost a restart (~0.6 s) and an outage ~10 s on this machine; err on slow agents:
    # a kill that finds no agent running becomes a ledger kill.
    early_s = sum(f.delay_s + 0.6 for f in early_faults) + 10.0 * outages
    pace_ms = max(5, min(400, int(900 * early_s / steps)))
    terms_after = rng.randint(1, max(1, len(early_faults) - 1))
    return Schedule(faults, terms_after, pace_ms)


# ---- the fault-free references ---------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What a ledger decided for one chained input."""

    placement_id: str
    kind: str
    status: str
    reason: str


@dataclass
class NodeReference:
    """What a node's agent signs without faults, in spool order, with each event's phase."""

    envelopes: list[bytes] = field(default_factory=list)
    phase: dict[bytes, Phase] = field(default_factory=dict)

    def of_phase(self, phase: Phase) -> list[bytes]:
        """The envelopes signed in one phase, in order."""
        return [e for e in self.envelopes if self.phase[e] == phase]


@dataclass(frozen=True)
class LedgerState:
    """What a stopped ledger's store holds, for comparisons."""

    heads: dict[str, tuple[int, str]]
    final_statements: dict[str, bytes]
    final_totals: dict[str, tuple[int, Totals]]
    decisions: dict[str, Decision]
    chained: Counter[str]
    dropped: dict[str, int]
    quarantined: int


@dataclass(frozen=True)
class Reference:
    """The fault-free run of a seed: the agents' events and the canonical ledger."""

    nodes: dict[str, NodeReference]
    ledger: LedgerState

    def events(self) -> dict[bytes, str]:
        """Every event a fault-free agent signs -> its node."""
        return {e: node for node, ref in self.nodes.items() for e in ref.envelopes}


def run_reference_agent(
    plan: NodePlan, configs: Mapping[str, Path], spool_dir: Path
) -> NodeReference:
    """Run a node's segments in-process on a simulated clock, as ``meter run --until-ms``
    does (same ``build_agent``, same simulator, same loop), spooling to ``spool_dir``."""
    out = NodeReference()
    spec = parse_sim_spec(plan.sim_spec)
    for segment in plan.segments:
        config = dataclasses.replace(
            load_meter_config(configs[segment.key]), spool_dir=spool_dir, transport="local"
        )
        terms = [
            t for t in _load_terms(config.terms) if any(n.node_id == plan.node_id for n in t.nodes)
        ]
        clock = SimClock(min(t.window_start_ms for t in terms))  # the CLI's epoch
        agent = build_agent(config, spec, clock, MeterMetrics())
        try:
            while True:
                due = agent.next_due_ms()
                if due is None or due > segment.until_ms:
                    clock.set(max(clock.now_ms(), segment.until_ms))
                    emitted = agent.tick()
                else:
                    clock.set(max(clock.now_ms(), due))
                    emitted = agent.tick()
                for envelope in emitted:
                    out.envelopes.append(envelope)
                    out.phase[envelope] = segment.phase
                if due is None or due > segment.until_ms:
                    break
        finally:
            agent.close()
    return out


def _load_terms(paths: Sequence[Path]) -> list[PlacementTerms]:
    from meter.cli import load_terms

    return list(load_terms(tuple(paths)))


def fold_local(
    key: SigningKey,
    directory: Path,
    clock_ms: int,
    batches: Sequence[Mapping[str, Sequence[bytes]]],
    *,
    batch_max_records: int = 64,
) -> LedgerState:
    """A fault-free ledger (local transport) over spools written batch by batch.

    Each batch maps a source name to envelopes appended to that spool; the ledger runs
    until idle (consumes all, then closes what is due) after each batch.
    """
    local = directory / "spool"
    db = directory / "ledger.duckdb"
    directory.mkdir(parents=True, exist_ok=True)
    store = Store(db, ledger_public_key=key.public_key)
    service = LedgerService(
        store,
        key,
        ledger_id="reference",
        local_dir=local,
        clock=fixed_clock(clock_ms),
        batch_max_records=batch_max_records,
    )
    try:
        for batch in batches:
            for source, envelopes in batch.items():
                if envelopes:
                    publish_local(local, source, list(envelopes))
            service.run_until_idle()
    finally:
        service.close()
    return read_ledger_state(db)


def remove_store(db: Path) -> None:
    """Lose a ledger's DuckDB store (the file and its WAL); the streams stay."""
    for path in (db, db.with_name(db.name + ".wal")):
        path.unlink(missing_ok=True)


def rebuild_local(
    key: SigningKey, directory: Path, clock_ms: int, *, batch_max_records: int = 64
) -> LedgerState:
    """Lose the store of a ``fold_local`` ledger and rebuild it from the same files (its
    intake log first, then whatever the spools hold beyond it)."""
    db = directory / "ledger.duckdb"
    remove_store(db)
    store = Store(db, ledger_public_key=key.public_key)
    service = LedgerService(
        store,
        key,
        ledger_id="reference",
        local_dir=directory / "spool",
        clock=fixed_clock(clock_ms),
        batch_max_records=batch_max_records,
    )
    try:
        service.run_until_idle()
    finally:
        service.close()
    return read_ledger_state(db)


def build_reference(
    scenario: Scenario, configs: Mapping[str, Mapping[str, Path]], directory: Path
) -> Reference:
    """The fault-free run of the seed, in-process: agents, then the canonical fold.

    ``configs[node][key]`` is the meter.toml a node's agent runs with for key ``k0``/``k1``.
    """
    nodes = {
        plan.node_id: run_reference_agent(
            plan, configs[plan.node_id], directory / "agents" / plan.node_id
        )
        for plan in scenario.nodes
    }
    early = [*(e for _, e in scenario.pre)]
    for plan in scenario.nodes:
        early.extend(nodes[plan.node_id].of_phase("early"))
    early.extend(e for _, e in scenario.post)
    late = [e for _, e in scenario.late]
    for plan in scenario.nodes:
        late.extend(nodes[plan.node_id].of_phase("late"))
    ledger = fold_local(
        scenario.cast.ledger,
        directory / "canonical",
        scenario.late_clock_ms,
        [{"publish-canonical": early}, {"publish-canonical": late}],
    )
    return Reference(nodes, ledger)


def write_node_configs(
    scenario: Scenario, directory: Path, bootstrap: str, topic: str
) -> dict[str, dict[str, Path]]:
    """Each node's key files, signed terms and meter.toml files (Kafka transport):
    ``result[node]["k0"]`` signs with the terms' key, ``["k1"]`` with the rotated key."""
    from devtools.scenario import write_meter_setup

    configs: dict[str, dict[str, Path]] = {}
    for plan in scenario.nodes:
        k0 = write_meter_setup(
            directory,
            scenario.cast,
            plan.node_id,
            scenario.node_terms(plan.node_id),
            transport="kafka",
            interval_s=INTERVAL_MS / 1000,
            kafka={"bootstrap": bootstrap, "topic": topic},
            segment_max_bytes=scenario.segment_max_bytes,
        )
        node_dir = k0.parent
        private, _ = write_key_pair(scenario.rotated_key(plan.node_id), node_dir / "keys")
        data = tomllib.loads(k0.read_text())
        data["key_file"] = str(private.relative_to(node_dir))
        k1 = node_dir / "meter-k1.toml"
        k1.write_text(tomli_w.dumps(data))
        configs[plan.node_id] = {"k0": k0, "k1": k1}
    return configs


# ---- reading a ledger's store ---------------------------------------------------------


def read_ledger_state(db: Path) -> LedgerState:
    """Heads, final statements, decisions and counters of a stopped ledger's store."""
    with Store(db) as store:
        heads = store.heads()
        finals: dict[str, bytes] = {}
        totals: dict[str, tuple[int, Totals]] = {}
        for placement_id, envelope in store.query(
            "SELECT placement_id, envelope FROM statements WHERE final"
        ):
            statement = open_envelope(bytes(envelope)).record
            assert isinstance(statement, Statement)
            finals[str(placement_id)] = bytes(envelope)
            totals[str(placement_id)] = (statement.through_index, statement.totals)
        decisions: dict[str, Decision] = {}
        chained: Counter[str] = Counter()
        for placement_id, input_hash, kind, status, reason in store.query(
            "SELECT placement_id, input_hash, kind, status, reason FROM inputs"
        ):
            key = f"{placement_id}/{input_hash}"
            chained[key] += 1
            decisions[key] = Decision(str(placement_id), str(kind), str(status), str(reason))
        dropped = {
            str(p): int(n) for p, n in store.query("SELECT placement_id, count FROM dropped")
        }
        quarantined = int(store.query("SELECT count(*) FROM quarantine")[0][0])
    return LedgerState(heads, finals, totals, decisions, chained, dropped, quarantined)


def check_store(db: Path, reference: Reference) -> tuple[list[str], LedgerState | None]:
    """Problems of a stopped ledger's store (whole chains, inputs once, decisions as in
    the fault-free run), and its state. Used after every ledger kill and at the end."""
    problems: list[str] = []
    if not db.exists():
        return problems, None
    try:
        with Store(db) as store:
            records = store.query(
                "SELECT placement_id, chain_index, envelope, record_hash FROM records "
                "ORDER BY placement_id, chain_index"
            )
            inputs = {
                (str(p), int(i)): (str(h), str(k), str(s), str(r))
                for p, i, h, k, s, r in store.query(
                    "SELECT placement_id, chain_index, input_hash, kind, status, reason FROM inputs"
                )
            }
            input_rows = int(store.query("SELECT count(*) FROM inputs")[0][0])
    except Exception as exc:  # a store a kill -9 made unreadable is the finding itself
        return [f"the store cannot be read: {type(exc).__name__}: {exc}"], None
    if input_rows != len(inputs):
        problems.append(f"{input_rows} input rows for {len(inputs)} (placement, index) pairs")
    expected_index: dict[str, int] = defaultdict(int)
    previous: dict[str, str] = {}
    for placement_id, index, envelope, record_hash in records:
        pid = str(placement_id)
        where = f"{pid}[{index}]"
        if index != expected_index[pid]:
            problems.append(f"{where}: index {index}, expected {expected_index[pid]}")
        expected_index[pid] = int(index) + 1
        try:
            opened = open_envelope(bytes(envelope))
        except ProtoError as exc:
            problems.append(f"{where}: record does not open: {exc}")
            continue
        record = opened.record
        if not isinstance(record, LedgerRecord):
            problems.append(f"{where}: a {opened.kind} in the records table")
            continue
        if opened.record_hash != record_hash:
            problems.append(f"{where}: record_hash column differs from the payload's hash")
        if record.prev != previous.get(pid, "0" * 64):
            problems.append(f"{where}: prev does not link to the previous record")
        previous[pid] = opened.record_hash
        chained = inputs.get((pid, int(index)))
        if chained is None:
            problems.append(f"{where}: no chained input")
            continue
        input_hash, kind, status, reason = chained
        if (record.source, record.kind, record.status, record.reason) != (
            input_hash,
            kind,
            status,
            reason,
        ):
            problems.append(f"{where}: record and input row disagree")
        expected = reference.ledger.decisions.get(f"{pid}/{input_hash}")
        if expected is None:
            problems.append(
                f"{where}: chained input {input_hash[:16]} the fault-free run never saw"
            )
        elif (expected.kind, expected.status, expected.reason) != (kind, status, reason):
            problems.append(
                f"{where}: {kind} {input_hash[:16]} {status} {reason or '-'}; the fault-free "
                f"run: {expected.status} {expected.reason or '-'}"
            )
    seen: Counter[str] = Counter(f"{pid}/{h}" for (pid, _), (h, *_r) in inputs.items())
    problems.extend(f"input {key} chained {n} times" for key, n in seen.items() if n > 1)
    if len(inputs) != sum(expected_index.values()):
        problems.append(f"{len(inputs)} chained inputs for {sum(expected_index.values())} records")
    if problems:
        return problems, None
    return problems, read_ledger_state(db)


def check_spool(
    spool_dir: Path, node_id: str, reference: Reference
) -> tuple[list[str], list[bytes]]:
    """Problems of a stopped agent's spool (only events the fault-free agent signs, each
    stream a contiguous run), and the envelopes it holds."""
    problems: list[str] = []
    try:
        held = [e.data for e in read_spool(spool_dir)] if spool_dir.exists() else []
    except SpoolError as exc:
        return [f"spool of {node_id} cannot be read: {exc}"], []
    signed = reference.nodes[node_id]
    known = set(signed.envelopes)
    last_seq: dict[tuple[str, str], int] = {}
    for data in held:
        if data not in known:
            problems.append(
                f"spool of {node_id} holds {sha256_hex(data)[:16]}, which the fault-free agent "
                "never signs (re-signed or damaged event)"
            )
            continue
        event = open_envelope(data).record
        assert isinstance(event, UsageEvent)
        stream = (event.placement_id, event.node_id)
        if stream in last_seq and event.seq != last_seq[stream] + 1:
            problems.append(
                f"spool of {node_id}: {stream} seq {event.seq} after {last_seq[stream]}"
            )
        last_seq[stream] = event.seq
    return problems, held


# ---- Kafka helpers ----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicMessage:
    """One message of the topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes


async def _read_topic(settings: KafkaSettings, partitions: int) -> list[TopicMessage]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(
        **client_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(settings.topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[TopicMessage] = []
        async with asyncio.timeout(KAFKA_IO_TIMEOUT_S):
            while True:
                behind = [tp for tp in tps if await consumer.position(tp) < end[tp]]
                if not behind:
                    break
                batches = await consumer.getmany(*behind, timeout_ms=200)
                for tp, records in batches.items():
                    out.extend(
                        TopicMessage(tp.partition, r.offset, r.key, r.value or b"")
                        for r in records
                        if r.offset < end[tp]
                    )
        return sorted(out, key=lambda m: (m.partition, m.offset))
    finally:
        await consumer.stop()


def read_topic(settings: KafkaSettings, partitions: int) -> list[TopicMessage]:
    """Every message of the topic up to its end offsets now, by partition and offset."""
    return asyncio.run(_read_topic(settings, partitions))


def _publish(settings: KafkaSettings, items: Sequence[tuple[str, bytes]]) -> None:
    if items:
        asyncio.run(publish_kafka(settings, items, timeout_s=KAFKA_IO_TIMEOUT_S))


def fold_partitions(
    key: SigningKey, directory: Path, clock_ms: int, messages: Sequence[TopicMessage]
) -> LedgerState:
    """The *same stream* reference: each partition's exact sequence folded fault-free
    (one local spool per partition: a placement lives in one partition, so its inputs
    keep their order)."""
    by_partition: dict[str, list[bytes]] = defaultdict(list)
    for message in messages:
        by_partition[f"partition-{message.partition}"].append(message.value)
    return fold_local(key, directory, clock_ms, [by_partition])


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
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    log_offset: int = 0
    not_before: float = 0.0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, cmd: list[str]) -> None:
        assert not self.alive()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
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


class _Run:
    """One seed's run (see the module docstring); ``execute`` returns the report."""

    def __init__(
        self,
        seed: int,
        cycles: int,
        bootstrap: str,
        broker: BrokerControl,
        workdir: Path,
    ) -> None:
        self.seed = seed
        self.cycles = cycles
        self.bootstrap = bootstrap
        self.broker = broker
        self.workdir = workdir
        self.scenario = generate_scenario(seed)
        self.schedule = make_schedule(self.scenario, cycles)
        self.report = FaultReport(seed, cycles, scenario=self.scenario.describe())
        self.rng = random.Random(f"gridledger-faults/{seed}/runner")
        self.topic = f"faults.{seed}.{cycles}.{os.getpid()}.{int(time.time() * 1000)}"
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
        (self.workdir / "trust.json").write_bytes(dump_trust(scenario.cast.trust()))
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
                sys.executable,
                "-m",
                "gridledger",
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
                sys.executable,
                "-m",
                "gridledger",
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
                code = process.popen.returncode
                process.popen = None
                if code == 0:
                    meter.segment += 1
                    self._check_meter(meter)
                else:
                    self._unexpected(process, code)
            if process.popen is None and self._meter_due(meter) and now >= process.not_before:
                self._start_meter(meter)
        if self.ledger.popen is not None and self.ledger.popen.poll() is not None:
            code = self.ledger.popen.returncode
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
        _publish(self.settings, items)
        self.cycle(FaultKind.DUPLICATES, f"{len(items)} re-delivered of {len(messages)}")

    # -- the run --

    def execute(self) -> FaultReport:
        """Run the seed: setup, reference, the faulty run, final checks."""
        timings = self.report.timings_s
        mark = time.monotonic()
        configs = self._setup()
        self.reference = build_reference(self.scenario, configs, self.workdir / "reference")
        timings["reference"] = time.monotonic() - mark
        from transport.kafka import create_topic

        create_topic(self.bootstrap, self.topic, self.scenario.partitions)
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
        _publish(self.settings, [(p, e) for p, e in scenario.pre if not self._held_terms(p, e)])
        self.meter_phase = "early"
        self.supervise()  # starts the ledger and the agents
        terms_published = scenario.late_terms is None
        for index, fault in enumerate(schedule.of_phase("early")):
            if not terms_published and index == schedule.terms_after:
                _publish(self.settings, self._late_terms())
                terms_published = True
                self.note(f"terms of {scenario.late_terms} published (held inputs released)")
            self.inject(fault)
        if not terms_published:
            _publish(self.settings, self._late_terms())
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
        _publish(self.settings, list(scenario.post))
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
        _publish(self.settings, list(scenario.late))
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
        """The last recovery: an in-process ledger catches up with everything."""

        async def go() -> None:
            store = Store(self.db, ledger_public_key=self.scenario.cast.ledger.public_key)
            service = KafkaLedgerService(
                store,
                self.scenario.cast.ledger,
                KafkaConfig(settings=self.settings),
                clock=fixed_clock(self.scenario.late_clock_ms),
                batch_max_records=self.scenario.batch_max_records,
            )
            try:
                await service.start()
                try:
                    await service.run_until(deadline_s=FINAL_RUN_TIMEOUT_S, idle_poll_ms=200)
                finally:
                    await service.stop()
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
        import os

        from ledger.http import LedgerApi, LedgerHttpServer
        from ledger.metrics import LedgerMetrics
        from proto.delivery import DELIVERY_LOG_FILE
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
                (known / "terms.signed.json").write_bytes(terms_file.read_bytes())
                at_ns = terms.created_at_ms * 1_000_000
                os.utime(known / "terms.signed.json", ns=(at_ns, at_ns))
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


def compare_final(
    scenario: Scenario,
    reference: Reference,
    faulty: LedgerState,
    same_stream: LedgerState,
    messages: Sequence[TopicMessage],
    observed: set[bytes],
) -> list[str]:
    """The end-of-run invariants (a) and (b) of the module docstring, as problems."""
    problems: list[str] = []
    canonical = reference.ledger
    signed = reference.events()
    # (a) every spooled event is one the fault-free agent signs ...
    for data in observed:
        if data not in signed:
            problems.append(f"a spooled event {sha256_hex(data)[:16]} no fault-free agent signs")
    # ... and every one of those is chained exactly once, decided as without faults.
    for data, node in signed.items():
        event = open_envelope(data).record
        assert isinstance(event, UsageEvent)
        key = f"{event.placement_id}/{sha256_hex(data)}"
        if faulty.chained[key] != 1:
            problems.append(
                f"usage {event.placement_id}/{node} seq {event.seq} chained "
                f"{faulty.chained[key]} times"
            )
    more = sorted(set(faulty.decisions) - set(canonical.decisions))
    fewer = sorted(set(canonical.decisions) - set(faulty.decisions))
    problems.extend(f"chained, but not by the fault-free run: {k}" for k in more[:10])
    problems.extend(f"chained by the fault-free run only: {k}" for k in fewer[:10])
    for key in sorted(set(faulty.decisions) & set(canonical.decisions)):
        if faulty.decisions[key] != canonical.decisions[key]:
            problems.append(
                f"decision on {key}: {faulty.decisions[key]} vs {canonical.decisions[key]}"
            )
    problems.extend(f"input {k} chained {n} times" for k, n in faulty.chained.items() if n > 1)
    if faulty.quarantined:
        problems.append(f"{faulty.quarantined} inputs quarantined (none are malformed)")
    per_placement: Counter[str] = Counter(m.key.decode() for m in messages if m.key is not None)
    chained_per: Counter[str] = Counter(d.placement_id for d in faulty.decisions.values())
    for placement_id in scenario.placement_ids:
        accounted = chained_per[placement_id] + faulty.dropped.get(placement_id, 0)
        if per_placement[placement_id] != accounted:
            problems.append(
                f"{placement_id}: {per_placement[placement_id]} messages in the topic, "
                f"{chained_per[placement_id]} chained + "
                f"{faulty.dropped.get(placement_id, 0)} dropped"
            )
    # (b) the same stream folded without faults: byte-identical results.
    if faulty.heads != same_stream.heads:
        problems.append(f"heads {faulty.heads} != same-stream heads {same_stream.heads}")
    if faulty.final_statements != same_stream.final_statements:
        problems.append("final statements differ from the same-stream fold")
    if faulty.dropped != same_stream.dropped:
        problems.append(f"dropped {faulty.dropped} != same-stream dropped {same_stream.dropped}")
    # (b) the fault-free run of the seed: totals for all, bytes for one-source placements.
    for placement_id in scenario.placement_ids:
        got, want = faulty.final_totals.get(placement_id), canonical.final_totals.get(placement_id)
        if got != want:
            problems.append(f"{placement_id}: final (index, totals) {got} != fault-free {want}")
        got_len = faulty.heads.get(placement_id, (-1, ""))[0]
        want_len = canonical.heads.get(placement_id, (-1, ""))[0]
        if got_len != want_len:
            problems.append(f"{placement_id}: head index {got_len} != fault-free {want_len}")
        if scenario.single_source(placement_id):
            if faulty.heads.get(placement_id) != canonical.heads.get(placement_id):
                problems.append(f"{placement_id}: head differs from the fault-free run")
            if faulty.final_statements.get(placement_id) != canonical.final_statements.get(
                placement_id
            ):
                problems.append(f"{placement_id}: final statement differs from the fault-free run")
    return problems


def run_seed(
    seed: int,
    *,
    bootstrap: str,
    broker: BrokerControl,
    workdir: Path,
    cycles: int = DEFAULT_CYCLES_PER_SEED,
) -> FaultReport:
    """Run one seed's scenario and fault schedule; raise FaultFailure when an invariant
    does not hold (the message names the seed and the replay command)."""
    return _Run(seed, cycles, bootstrap, broker, workdir).execute()


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
