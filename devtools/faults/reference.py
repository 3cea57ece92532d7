"""The fault-free references a faulty run is compared with, and how a store is read.

**Why the comparison with them is sound** (invariant (b), ``checks.py``). A chain is a
pure function of the order of its placement's inputs in one partition. That order is
fixed by construction wherever it changes a decision: the harness publishes in phases
separated by barriers — terms, new key bindings, early reclaims and adjustments before
the agents start; revocations of rotated keys, reclaims and adjustments "after the
usage" only once every agent exited 0 (all acknowledged); the ledger gets a clock past
every close only then, so its closes land after all usage; late records, and the skewed
node's remaining intervals, only once every close is in the topic. What stays free is
(i) where re-deliveries fall (dropped, never chained), (ii) where held inputs wait
(released in arrival order right after the terms, which is the order a single source
produced them), and (iii) how the streams of *different* nodes of one placement
interleave. Arrival times (SPEC §6.6) are the ones the senders state (``scenario.py``:
fixed per record, the same on both transports and for every re-send), and a held input's
record carries its own, so they follow the same order. So two references are used:

* *same stream*: the faulty topic is read back and each partition's exact sequence
  (re-deliveries included) is folded by a fault-free ledger (local transport, one spool
  per partition, each message stating its topic timestamp, same key and clock). Its
  heads, final statements and dropped counts must equal the faulty run's byte for byte:
  kill -9, restarts and outages changed nothing the stream did not dictate.
* *fault-free run of the seed*: the agents run in-process on simulated clocks (the same
  ``build_agent`` and simulator the CLI uses, so the same bytes) and everything is
  folded in the canonical phase order from one ordered spool. Decisions per input and
  final totals must be equal for every placement (with the phases above they do not
  depend on how node streams interleave), and for a placement on one node — one ordered
  source — heads and final statements must be equal byte for byte as well.

"Final statement" is a placement's latest one (the greatest ``through_index`` with
``final``): a ledger that runs as ``ledger run`` does attests every ``attest_interval_s``
and once more when it stops (``ledger/attest_loop.py``), so after a late record it holds
the final statement of each later period it saw (SPEC §8 "Statement periods") — how many
depends on wall-clock timing, the last one (at the head, issued on the way out) does
not. The references issue that one the same way (``attest_once``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devtools.faults.scenario import NodePlan, Phase, Scenario
from devtools.faults.topic import TopicMessage
from ledger.attest_loop import attest_once
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from meter.cli import build_agent
from meter.clock import SimClock
from meter.config import load_meter_config
from meter.metrics import MeterMetrics
from meter.shipper import simulated_send_ms
from meter.sim import parse_sim_spec
from proto.envelope import open_envelope
from proto.invariant import present
from proto.keys import SigningKey
from proto.records import PlacementTerms, Statement, Totals
from transport.local import publish_local

__all__ = [
    "LedgerState",
    "NodeReference",
    "Reference",
    "ReferenceDecision",
    "build_reference",
    "fold_local",
    "fold_partitions",
    "read_ledger_state",
    "rebuild_local",
    "remove_store",
    "run_reference_agent",
]

# ---- the fault-free references ---------------------------------------------------------


@dataclass(frozen=True)
class ReferenceDecision:
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
    sent_ms: dict[bytes, int] = field(default_factory=dict)

    def of_phase(self, phase: Phase) -> list[tuple[bytes, int]]:
        """The envelopes signed in one phase, in order, with the time the agent states."""
        return [(e, self.sent_ms[e]) for e in self.envelopes if self.phase[e] == phase]


@dataclass(frozen=True)
class LedgerState:
    """What a stopped ledger's store holds, for comparisons."""

    heads: dict[str, tuple[int, str]]
    final_statements: dict[str, bytes]
    final_totals: dict[str, tuple[int, Totals]]
    decisions: dict[str, ReferenceDecision]
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
                    # what the CLI's shipper states (meter run --until-ms)
                    out.sent_ms[envelope] = present(
                        simulated_send_ms(envelope, spec.skew_ms), "a usage event's send time"
                    )
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
    batches: Sequence[Mapping[str, Sequence[tuple[bytes, int]]]],
    *,
    batch_max_records: int = 64,
) -> LedgerState:
    """A fault-free ledger (local transport, ``arrival = "sender"``) over spools written
    batch by batch.

    Each batch maps a source name to (envelope, stated time) pairs appended to that spool
    as stamped frames; the ledger runs until idle (consumes all, then closes what is
    due) after each batch. At the end it issues what ``ledger run`` issues on its way out
    (``attest_once``, SPEC §8.4 (a)): a statement at every head without one, so a
    placement with records after its close has the final statement of its latest period
    (SPEC §8 "Statement periods") as the faulty run's ledger has.
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
        arrival="sender",
    )
    try:
        for batch in batches:
            for source, stamped in batch.items():
                if stamped:
                    publish_local(
                        local, source, [e for e, _ in stamped], stamps_ms=[t for _, t in stamped]
                    )
            service.run_until_idle()
        # A stopping ledger attests each head its loop has not yet (SPEC §8.4), as the
        # faulty run's ledger did when it was stopped.
        attest_once(store, key)
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
        arrival="sender",
    )
    try:
        service.run_until_idle()
        attest_once(store, key)  # as fold_local's ledger did when it stopped
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
    early = [(e, scenario.early_clock_ms) for _, e in scenario.pre]
    for plan in scenario.nodes:
        early.extend(nodes[plan.node_id].of_phase("early"))
    early.extend((e, scenario.post_clock_ms) for _, e in scenario.post)
    late = [(e, scenario.late_clock_ms) for _, e in scenario.late]
    for plan in scenario.nodes:
        late.extend(nodes[plan.node_id].of_phase("late"))
    ledger = fold_local(
        scenario.cast.ledger,
        directory / "canonical",
        scenario.late_clock_ms,
        [{"publish-canonical": early}, {"publish-canonical": late}],
    )
    return Reference(nodes, ledger)


# ---- reading a ledger's store ---------------------------------------------------------


def read_ledger_state(db: Path) -> LedgerState:
    """Heads, final statements, decisions and counters of a stopped ledger's store."""
    with Store(db) as store:
        heads = store.heads()
        finals: dict[str, bytes] = {}
        totals: dict[str, tuple[int, Totals]] = {}
        for placement_id, envelope in store.query(
            "SELECT placement_id, envelope FROM statements WHERE final"
            " ORDER BY placement_id, through_index"
        ):  # the latest final statement of each placement
            statement = open_envelope(bytes(envelope)).record
            assert isinstance(statement, Statement)
            finals[str(placement_id)] = bytes(envelope)
            totals[str(placement_id)] = (statement.through_index, statement.totals)
        decisions: dict[str, ReferenceDecision] = {}
        chained: Counter[str] = Counter()
        for placement_id, input_hash, kind, status, reason in store.query(
            "SELECT placement_id, input_hash, kind, status, reason FROM inputs"
        ):
            key = f"{placement_id}/{input_hash}"
            chained[key] += 1
            decisions[key] = ReferenceDecision(
                str(placement_id), str(kind), str(status), str(reason)
            )
        dropped = {
            str(p): int(n) for p, n in store.query("SELECT placement_id, count FROM dropped")
        }
        quarantined = int(store.query("SELECT count(*) FROM quarantine")[0][0])
    return LedgerState(heads, finals, totals, decisions, chained, dropped, quarantined)


def fold_partitions(
    key: SigningKey, directory: Path, clock_ms: int, messages: Sequence[TopicMessage]
) -> LedgerState:
    """The *same stream* reference: each partition's exact sequence folded fault-free
    (one local spool per partition: a placement lives in one partition, so its inputs
    keep their order)."""
    by_partition: dict[str, list[tuple[bytes, int]]] = defaultdict(list)
    for message in messages:
        by_partition[f"partition-{message.partition}"].append((message.value, message.timestamp_ms))
    return fold_local(key, directory, clock_ms, [by_partition])
