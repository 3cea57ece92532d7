"""Agents' spools through the ledger (local transport): every event accepted, D exact.

Two implementations of one spec meet here: the events the agent signs and spools are
folded by the ledger, which must accept every one of them (restarts and faults included)
and price exactly the healthy, allocated GPU time the events report.
"""

from __future__ import annotations

from pathlib import Path

from devtools import builders
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.envelope import open_envelope
from proto.records import PlacementTerms, Statement, UsageEvent
from transport.local import node_source, publish_local, publisher_source
from transport.spool import read_spool

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000


def _expected_delivered(terms: PlacementTerms, events: list[UsageEvent]) -> int:
    """SPEC 7.1, from the events alone (no reclaim: effective_end = window_end)."""
    share = {g.uuid: g.share_milli for g in terms.gpus}
    total = 0
    for event in events:
        overlap = max(
            0,
            min(event.end_ms, terms.window_end_ms) - max(event.start_ms, terms.window_start_ms),
        )
        total += sum(share[s.uuid] * overlap for s in event.samples if s.allocated and s.healthy)
    return total


def test_agent_spools_fold_in_the_ledger(tmp_path: Path) -> None:
    local = tmp_path / "local"
    cast = builders.make_cast("meter-ledger")
    gpus = [builders.gpu("n1", 0), builders.gpu("n1", 1, share_milli=500), builders.gpu("n2", 0)]
    terms = builders.make_terms(cast, "ml1", gpus, T0, T0 + HOUR_MS + 12_345)
    publish_local(local, publisher_source("desk"), [builders.signed_terms(cast, terms)])

    specs = {
        "n1": "seed=3,unhealthy=GPU-n1-0@600000-900000,vanish=GPU-n1-1@1800000",
        "n2": "seed=4",
    }
    clock = SimClock(T0)
    for node_id, spec in specs.items():
        devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, node_id)]
        config = AgentConfig(
            node_id, cast.node_key(node_id), (terms,), local / node_source(node_id)
        )

        def start(
            spec: str = spec, devices: list[SimDevice] = devices, config: AgentConfig = config
        ) -> Agent:
            return Agent(config, Simulator(parse_sim_spec(spec), devices, T0), clock)

        clock.set(T0)
        agent = start()
        clock.advance(20 * MINUTE_MS + 30_000)
        agent.tick()
        agent.close()  # restart half a minute later: contiguous
        agent = start()
        clock.advance(5 * HOUR_MS)
        agent.tick()
        agent.close()

    events: list[UsageEvent] = []
    for node_id in specs:
        for entry in read_spool(local / node_source(node_id)):
            record = open_envelope(entry.data).record
            assert isinstance(record, UsageEvent)
            events.append(record)
    assert len(events) == 2 * 61

    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store,
        cast.ledger,
        ledger_id="ledger-1",
        local_dir=local,
        clock=fixed_clock(T0 + 10 * HOUR_MS),
    )
    try:
        run = service.run_until_idle()
        assert run.closed == ["ml1"]
        statuses = store.query(
            "SELECT status, reason, count(*) FROM inputs WHERE kind = 'usage' GROUP BY 1, 2"
        )
        assert statuses == [("accepted", "", len(events))]
        assert store.quarantine_counts() == {}
        (envelope,) = [
            bytes(e) for (e,) in store.query("SELECT envelope FROM statements WHERE final")
        ]
        statement = open_envelope(envelope).record
        assert isinstance(statement, Statement)
        assert statement.totals.delivered_mgms == _expected_delivered(terms, events)
        # The faults cost delivery: less than every GPU healthy for the whole window.
        window = terms.window_end_ms - terms.window_start_ms
        assert statement.totals.delivered_mgms < 2500 * window
    finally:
        service.close()
