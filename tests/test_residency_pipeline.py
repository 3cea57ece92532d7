"""SPEC §5.1-§5.2 through the real pipeline: meter agents (simulated GPUs) spool signed
events, the embedded transport carries them, the ledger folds, exports, and the verifier
re-derives every decision and amount from the export alone.

The placement carries workload, delivery and residency terms: node n1 (region eu:de)
carries the GPUs; node gw (region us:east) is listed without GPUs (a gateway). gw's agent
sends usage anyway: every event is rejected RESIDENCY, and nothing already settled moves.

Hand-computed bill (SPEC §7; rate 2.50 USD/GPU-h, S = 1.5 GPU, window 60 min, every GPU
delivered healthy and allocated for the whole window, fee 5 % paid by the operator):

    delivered  (1000 + 500) milli-GPU × 60 min = 5 400 000 000 milli-GPU-ms (1.5 GPU-h)
    gross      1.5 GPU-h × 250 = 375;  availability 100 % >= 99 %: no SLA credit
    fee        5 % of 375 = 18.75 -> 18
    buyer owes 375, operator receives 357, desk receives 18
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_verifier_exports import explain, verify

from devtools import builders
from ledger.export import export_placement
from ledger.service import LedgerService
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.envelope import open_envelope
from proto.records import (
    Delivery,
    LedgerRecord,
    NodeSpec,
    PlacementTerms,
    Residency,
    Workload,
)
from proto.terms import validate_terms
from transport.local import node_source, publish_local, publisher_source

T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z: arrival time required (SPEC §6.6)
MIN = 60_000
HOUR = 3_600_000
PID = "pl-residency-1"
EXPECTED = {
    "delivered_mgms": 1500 * HOUR,
    "billable_mgms": 1500 * HOUR,
    "gross_minor": 375,
    "reclaim_credit_minor": 0,
    "sla_credit_minor": 0,
    "adjustment_credit_minor": 0,
    "adjustment_charge_minor": 0,
    "credits_minor": 0,
    "net_minor": 375,
    "fee_minor": 18,
    "buyer_owes_minor": 375,
    "operator_receives_minor": 357,
    "desk_receives_minor": 18,
}


def _terms(cast: builders.Cast, pid: str, n1_region: str) -> PlacementTerms:
    nodes = [
        NodeSpec("gw", cast.node_key("gw").public_key, "us:east", "ethernet"),
        NodeSpec("n1", cast.node_key("n1").public_key, n1_region, "nvlink"),
    ]
    return builders.make_terms(
        cast,
        pid,
        [builders.gpu("n1", 0), builders.gpu("n1", 1, share_milli=500)],
        T0,
        T0 + HOUR,
        nodes=nodes,
        rate_per_gpu_hour_minor=250,
        desk_fee_bps=500,
        fee_payer="operator",
        created_at_ms=T0 - HOUR,
        workload=Workload("inference", "oci:llm-serve:1.4", "shared", "prompts stay in eu:de"),
        delivery=Delivery("op GmbH", "noc@op.example", "24x7", ["ssh access"], "drain"),
        residency=Residency(allowed_regions=["eu:de"], jurisdictions=["EU"]),
    )


def _agent(
    cast: builders.Cast, terms: PlacementTerms, node_id: str, spool: Path, clock: SimClock
) -> Agent:
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, node_id)]
    config = AgentConfig(node_id, cast.node_key(node_id), (terms,), spool / node_source(node_id))
    return Agent(config, Simulator(parse_sim_spec("seed=5"), devices, T0), clock)


def _settled(store: Store) -> list[tuple[int, str, str, str, str]]:
    """The placement's chain so far: index, kind, status, reason, record hash."""
    return [
        (int(i), str(k), str(s), str(r), str(h))
        for i, k, s, r, h in store.query(
            "SELECT r.chain_index, r.kind, r.status, i.reason, r.record_hash FROM records r "
            "JOIN inputs i USING (placement_id, chain_index) WHERE placement_id = ? "
            "ORDER BY r.chain_index",
            [PID],
        )
    ]


def _latest_totals(store: Store) -> tuple[int, dict[str, int]]:
    """The totals of the chain's last record (the ledger's signed LedgerRecord)."""
    rows = store.query(
        "SELECT envelope FROM records WHERE placement_id = ? ORDER BY chain_index DESC LIMIT 1",
        [PID],
    )
    record = open_envelope(bytes(rows[0][0])).record
    assert isinstance(record, LedgerRecord)
    return record.index, {k: getattr(record.totals, k) for k in EXPECTED}


def test_out_of_region_usage_is_rejected_and_the_bill_is_the_hand_computed_one(
    tmp_path: Path,
) -> None:
    cast = builders.make_cast("residency-pipeline")
    terms = _terms(cast, PID, "eu:de")
    assert validate_terms(terms) == []
    spool = tmp_path / "spool"
    publish_local(spool, publisher_source("desk"), [builders.signed_terms(cast, terms)])
    clock = SimClock(T0)
    n1 = _agent(cast, terms, "n1", spool, clock)
    gw = _agent(cast, terms, "gw", spool, clock)
    now = [T0 + 31 * MIN]
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=spool, clock=lambda: now[0]
    )
    try:
        # Minutes 0-30: n1 meters, the ledger folds.
        clock.advance(30 * MIN)
        n1.tick()
        service.run_until_idle()
        before = _settled(store)
        assert before and all(row[2] == "accepted" for row in before)
        before_head = _latest_totals(store)
        half = 1500 * 30 * MIN
        assert before_head[1]["delivered_mgms"] == half
        # The gateway's agent (outside eu:de, no GPUs) sends usage: RESIDENCY, every event,
        # none held; what was settled before is untouched.
        gw.tick()
        now[0] = T0 + 32 * MIN
        service.run_until_idle()
        after = _settled(store)
        assert after[: len(before)] == before
        rejected = after[len(before) :]
        assert len(rejected) >= 2
        assert all(row[1:4] == ("usage", "rejected", "RESIDENCY") for row in rejected)
        index, totals = _latest_totals(store)
        assert index == len(after) - 1 and totals == before_head[1]
        # The rest of the window, then the close.
        clock.advance(40 * MIN)
        n1.tick()
        gw.close()
        n1.close()
        now[0] = T0 + 3 * HOUR
        run = service.run_until_idle()
        assert run.closed == [PID]
        final = _settled(store)
        assert final[: len(after)] == after
        assert [r for r in final if r[3] == "RESIDENCY"] == rejected  # gw stopped sending
        _, totals = _latest_totals(store)
        assert totals == EXPECTED
        out = tmp_path / "export.duckdb"
        export_placement(store, PID, out, key=cast.ledger)
    finally:
        service.close()
    # The verifier re-derives every decision (RESIDENCY included) and the bill.
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    assert report.final
    assert {k: report.totals[k] for k in EXPECTED} == EXPECTED
    con = duckdb.connect(str(out), read_only=True)
    try:
        reasons = con.execute(
            "SELECT reason, count(*) FROM usage_events WHERE status = 'rejected' GROUP BY 1"
        ).fetchall()
    finally:
        con.close()
    assert reasons == [("RESIDENCY", len(rejected))]


def test_a_verifier_catches_a_ledger_that_folds_out_of_region_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier's own rule, not the ledger's: an export whose ledger accepted gw's
    usage (here: a ledger built without the check) fails verification."""
    from ledger import rules

    cast = builders.make_cast("residency-pipeline")
    terms = _terms(cast, PID, "eu:de")
    spool = tmp_path / "spool"
    publish_local(spool, publisher_source("desk"), [builders.signed_terms(cast, terms)])
    gw = builders.StreamWriter(cast.node_key("gw"), PID, "gw")
    publish_local(spool, node_source("gw"), [gw.event(T0, T0 + 10 * MIN, [])])
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=spool, clock=lambda: T0 + 3 * HOUR
    )
    # a ledger without R2 (the only change; signatures and everything else are real)
    monkeypatch.setattr(rules, "node_inside_residency", lambda terms, region: True)
    try:
        service.run_until_idle()
        out = tmp_path / "export.duckdb"
        export_placement(store, PID, out, key=cast.ledger)
    finally:
        service.close()
    monkeypatch.undo()
    report = verify(out, cast.trust())
    assert not report.ok
    assert "expected rejected RESIDENCY, actual accepted" in explain(report), explain(report)


def test_terms_placing_a_gpu_outside_the_residency_are_refused_at_admission(
    tmp_path: Path,
) -> None:
    """R1 at the ledger: TERMS_INVALID, the detail naming the node; the node's events wait
    for terms that never come (held), nothing is priced."""
    from ledger.fold import Fold

    cast = builders.make_cast("residency-pipeline")
    terms = _terms(cast, "pl-residency-2", "us:west")
    problems = validate_terms(terms)
    assert problems == [
        "R1: node n1 carries GPUs in region 'us:west', outside the allowed regions eu:de"
    ]
    (outcome,) = Fold(cast.ledger).apply(builders.signed_terms(cast, terms), "t:0", None, T0)
    assert (outcome.status, outcome.reason) == ("rejected", "TERMS_INVALID")
    assert "node n1" in outcome.detail and "us:west" in outcome.detail
