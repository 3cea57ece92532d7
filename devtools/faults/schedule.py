"""When faults happen (pure, seeded): the fault classes and one seed's schedule.

``make_schedule`` turns a scenario and a number of cycles into an ordered list of faults
in three phases (``early``: while the agents work; ``before_close``: the ledger's clock
past every close; ``after_close``: late usage and records), and the pace that keeps the
agents busy enough for the kills to find them running.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Final, Literal

from devtools.faults.scenario import INTERVAL_MS, Scenario

__all__ = [
    "MAX_CYCLES",
    "MIN_CYCLES",
    "Fault",
    "FaultKind",
    "FaultPhase",
    "Schedule",
    "make_schedule",
]

MIN_CYCLES: Final = 8
"""Fewest cycles a schedule can have (one of each kind and the phases' ledger kills)."""

MAX_CYCLES: Final = 10_000
"""Most cycles one seed may ask for (a soak runs many seeds rather than one huge one)."""

FaultPhase = Literal["early", "before_close", "after_close"]


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
