"""SPEC §7.1.1, health from evidence: a sample flagged healthy whose own evidence says the
GPU was not working is not delivered — in the ledger's fold and, re-derived, in the
verifier; a ledger that bills it anyway is caught.

Every attack is built with the node's key only (the party that signs usage): the node
flags the sample healthy and reports what NVML saw. The dishonest ledger is an export
whose records are signed with the ledger key but priced on the flag alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_verifier_exports import HOUR, MINUTE, T0, ExportBuilder, explain, verify
from test_verifier_ledger import _ledger_export

from devtools.builders import (
    StreamWriter,
    closed,
    gpu,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger import health
from ledger.export import export_placement
from ledger.fold import Fold
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.records import GpuSample, GpuSpec, UsageEvent
from transport.local import node_source, publish_local, publisher_source
from transport.spool import read_spool
from verifier import pricing as verifier_pricing

CRITICAL = [48, 63, 64, 74, 79, 92, 94, 95]


def _evidence(kind: str, g: GpuSpec) -> GpuSample:
    """The second event's sample of the GPU: flagged healthy, carrying ``kind``."""
    if kind.startswith("xid_"):
        return sample(g, xids=[13, int(kind[4:])], retired_pages=1)
    return {
        "ecc_uncorrectable": sample(g, ecc_uncorrectable=3, retired_pages=1),
        "retired_page_growth": sample(g, retired_pages=2),
        "not_present": sample(g, present=False, retired_pages=1),
        "zero_power": sample(g, power_mw=0, retired_pages=1),
        # The fall off the bus of the issue: every symptom at once.
        "xid79_ecc_0pct_0w": sample(
            g, xids=[79], ecc_uncorrectable=40, utilisation_pct=0, power_mw=0, retired_pages=1
        ),
    }[kind]


ATTACKS = [f"xid_{x}" for x in CRITICAL] + [
    "ecc_uncorrectable",
    "retired_page_growth",
    "not_present",
    "zero_power",
    "xid79_ecc_0pct_0w",
]


def _scenario(name: str, middle: GpuSample | None) -> tuple[Any, Any, list[bytes]]:
    """Terms, three one-minute events of one whole GPU (the middle one carries the evidence;
    the first sets the retired baseline at 1 page), a close. Usage signed by the node only."""
    cast = make_cast(f"health-{name}")
    g = gpu("node-a", 0)
    terms = make_terms(cast, f"h-{name}", [g], T0, T0 + HOUR)
    node = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    raws = [signed_terms(cast, terms)]
    samples = [sample(g, retired_pages=1), middle or sample(g, retired_pages=1), sample(g)]
    for i, s in enumerate(samples):
        assert s.healthy  # the node's claim
        raws.append(node.event(T0 + i * MINUTE, T0 + (i + 1) * MINUTE, [s]))
    raws.append(closed(cast, terms.placement_id, terms.window_end_ms + terms.late_grace_ms))
    return cast, terms, raws


def _export(tmp: Path, cast: Any, terms: Any, raws: list[bytes], *, dishonest: bool) -> Path:
    b = ExportBuilder(cast, terms, trust_the_flag=dishonest)
    for raw in raws:
        b.add(raw)
    b.statements_at = [len(b.items) - 1]
    b.checkpoints_at = [len(b.items)]
    return b.write(tmp / f"{terms.placement_id}-{'dishonest' if dishonest else 'honest'}.duckdb")


@pytest.mark.parametrize("kind", ATTACKS)
def test_flagged_healthy_with_evidence_is_not_delivered(tmp_path: Path, kind: str) -> None:
    cast, terms, raws = _scenario(kind, _evidence(kind, gpu("node-a", 0)))

    # (a) the ledger's fold accepts the event (it is well-formed) and delivers nothing.
    fold = Fold(cast.ledger)
    delivered = []
    for i, raw in enumerate(raws):
        (outcome,) = fold.apply(raw, f"t:{i}", None)
        assert outcome.status == "accepted", (i, outcome.reason)
        delivered.append(outcome.record.delivered_mgms if outcome.record else None)
    assert delivered[1:4] == [1000 * MINUTE, 0, 1000 * MINUTE]
    totals = fold.totals(terms.placement_id)
    assert totals is not None and totals.delivered_mgms == 2000 * MINUTE

    # The real ledger's export verifies, with the same D.
    out = _ledger_export(tmp_path, cast.ledger, terms.placement_id, raws)
    trust = cast.trust()
    report = verify(out, trust)
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == 2000 * MINUTE

    # An honest hand-written export (SPEC read plainly) verifies too.
    honest = verify(_export(tmp_path, cast, terms, raws, dishonest=False), trust)
    assert honest.ok, explain(honest)

    # (b) a ledger that bills the flag is caught: D and the event's own delivered differ.
    dishonest = verify(_export(tmp_path, cast, terms, raws, dishonest=True), trust)
    assert not dishonest.ok
    rules = {f.rule for f in dishonest.findings.kept}
    assert {"TOTAL_EVENT_DELIVERED_MGMS", "TOTAL_DELIVERED_MGMS"} <= rules, explain(dishonest)
    assert dishonest.totals is not None and dishonest.totals["delivered_mgms"] == 2000 * MINUTE


@pytest.mark.parametrize(
    "middle",
    [
        pytest.param(
            sample(gpu("node-a", 0), xids=[13, 31, 43], retired_pages=1), id="benign_xids"
        ),
        pytest.param(sample(gpu("node-a", 0), retired_pages=1), id="retired_unchanged"),
        pytest.param(sample(gpu("node-a", 0), retired_pages=0), id="retired_lower"),
        pytest.param(sample(gpu("node-a", 0), utilisation_pct=0), id="idle_but_powered"),
    ],
)
def test_evidence_that_is_not_a_fault_is_delivered(tmp_path: Path, middle: GpuSample) -> None:
    cast, terms, raws = _scenario("benign", middle)
    out = _ledger_export(tmp_path, cast.ledger, terms.placement_id, raws)
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == 3000 * MINUTE


def test_the_first_event_sets_the_retired_baseline_and_drops_stay_baselines(
    tmp_path: Path,
) -> None:
    # Pages retired before the placement (5 at seq 0) are no fault; a lower reading later
    # (a vanished device reports 0) does not lower the baseline: 5 again is no growth,
    # 6 is.
    cast = make_cast("health-baseline")
    g = gpu("node-a", 0)
    terms = make_terms(cast, "h-baseline", [g], T0, T0 + HOUR)
    node = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    pages = [5, 0, 5, 6, 6]
    raws = [signed_terms(cast, terms)]
    for i, n in enumerate(pages):
        raws.append(
            node.event(T0 + i * MINUTE, T0 + (i + 1) * MINUTE, [sample(g, retired_pages=n)])
        )
    fold = Fold(cast.ledger)
    own = [fold.apply(raw, f"t:{i}", None)[0] for i, raw in enumerate(raws)]
    assert [o.record.delivered_mgms for o in own[1:] if o.record] == [
        1000 * MINUTE,
        1000 * MINUTE,
        1000 * MINUTE,
        0,
        1000 * MINUTE,
    ]
    out = _ledger_export(tmp_path, cast.ledger, terms.placement_id, raws)
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == 4000 * MINUTE


def test_critical_xid_sets_agree() -> None:
    # Two implementations, one SPEC set (and the vectors carry it for a third).
    assert set(CRITICAL) == health.CRITICAL_XIDS == set(verifier_pricing.CRITICAL_XIDS)
    vectors = msgspec.json.decode(
        (Path(__file__).parent.parent / "proto/vectors/health.json").read_bytes()
    )
    assert vectors["critical_xids"] == CRITICAL


def test_events_without_evidence_fields_decode_unchanged() -> None:
    # An event as agents wrote it before §7.1.1 (no evidence keys): it decodes to the
    # defaults and re-encodes to the same bytes, so its signature and hash still hold.
    old = (
        b'gridledger/usage/v1\n{"end_ms":2,"node_id":"n","placement_id":"p","prev":"'
        + b"0" * 64
        + b'","samples":[{"allocated":true,"ecc_errors":0,"energy_mj":0,"healthy":true,'
        b'"memory_total_mib":1,"memory_used_mib":0,"model":"A100","power_mw":1,'
        b'"utilisation_pct":9,"uuid":"GPU-0","xid_errors":0}],"seq":0,"start_ms":1,'
        b'"type":"usage"}'
    )
    event = decode_payload(old)
    assert isinstance(event, UsageEvent)
    s = event.samples[0]
    assert (s.xids, s.ecc_uncorrectable, s.retired_pages, s.present) == ([], 0, 0, True)
    assert signed_bytes(event) == old
    # A default written out is not canonical; a present evidence field is kept.
    with pytest.raises(ProtoError) as err:
        decode_payload(old.replace(b'"power_mw":1,', b'"power_mw":1,"present":true,'))
    assert err.value.reason.value == "NON_CANONICAL"
    with_xid = old.replace(b'"xid_errors":0}', b'"xid_errors":1,"xids":[79]}')
    again = decode_payload(with_xid)
    assert isinstance(again, UsageEvent) and again.samples[0].xids == [79]
    assert signed_bytes(again) == with_xid


# ---- the simulator through meter -> ledger -> export -> verify ---------------------------

SIM_FAULTS = {
    # fault item -> the 10-minute slot (relative minutes) it covers
    "xid=79/GPU-node-a-0@600000-1200000": (10, 20),
    "ecc=GPU-node-a-0@1800000-2400000": (30, 40),
    "retire=GPU-node-a-1@1500000": (25, 26),
    "nopower=GPU-node-a-1@3000000-3600000": (50, 60),
    "vanish=GPU-node-a-2@2400000-3000000": (40, 50),
}


def test_simulated_faults_through_meter_ledger_export_verify(tmp_path: Path) -> None:
    local = tmp_path / "local"
    cast = make_cast("health-sim")
    gpus = [gpu("node-a", i) for i in range(3)]
    terms = make_terms(cast, "h-sim", gpus, T0, T0 + HOUR)
    publish_local(local, publisher_source("desk"), [signed_terms(cast, terms)])
    # claim_healthy=1: the agent flags every sample healthy; only the evidence tells.
    spec = "seed=5,claim_healthy=1," + ",".join(SIM_FAULTS)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, "node-a")]
    config = AgentConfig("node-a", cast.node_key("node-a"), (terms,), local / node_source("node-a"))
    clock = SimClock(T0)
    agent = Agent(config, Simulator(parse_sim_spec(spec), devices, T0), clock)
    clock.advance(HOUR)
    agent.tick()
    agent.close()
    events = [open_envelope(e.data).record for e in read_spool(local / node_source("node-a"))]
    assert len(events) == 60 and all(isinstance(e, UsageEvent) for e in events)

    # Each fault shows in its own evidence field, flagged healthy all the same (except
    # the vanished GPU, which the agent itself reports unhealthy and not present).
    seen: dict[str, set[int]] = {k: set() for k in ("xid", "ecc", "retire", "nopower", "vanish")}
    for e in events:
        assert isinstance(e, UsageEvent)
        minute = (e.start_ms - T0) // MINUTE
        by = {s.uuid: s for s in e.samples}
        a0, a1, a2 = by["GPU-node-a-0"], by["GPU-node-a-1"], by["GPU-node-a-2"]
        if 79 in a0.xids:
            seen["xid"].add(minute)
        if a0.ecc_uncorrectable:
            seen["ecc"].add(minute)
        if a1.retired_pages:
            seen["retire"].add(minute)
        if a1.power_mw == 0:
            seen["nopower"].add(minute)
        if not a2.present:
            assert not a2.healthy
            seen["vanish"].add(minute)
        else:
            assert a0.healthy and a1.healthy and a2.healthy
    assert seen["xid"] == set(range(10, 20)) and seen["ecc"] == set(range(30, 40))
    assert seen["retire"] == set(range(25, 60))  # cumulative; it grew at minute 25 only
    assert seen["nopower"] == set(range(50, 60)) and seen["vanish"] == set(range(40, 50))

    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=local, clock=fixed_clock(T0 + 3 * HOUR)
    )
    try:
        run = service.run_until_idle()
        assert run.closed == ["h-sim"]
        out = tmp_path / "h-sim.duckdb"
        export_placement(store, "h-sim", out, key=cast.ledger)
    finally:
        service.close()
    # Lost GPU-minutes: 10 (XID) + 10 (ECC) + 1 (retire) + 10 (0 W) + 10 (vanished).
    expected = (3 * 60 - 41) * 1000 * MINUTE
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == expected


def test_sim_evidence_faults_parse_and_reject() -> None:
    spec = parse_sim_spec(
        "xid=79/GPU-a@5-10,xid=48/GPU-b:1@0-1,ecc=GPU-a@1-2,retire=GPU-a@7,"
        "nopower=GPU-c@3-4,claim_healthy=1"
    )
    assert [(c, f.uuid, f.start_ms, f.end_ms) for c, f in spec.xid] == [
        (79, "GPU-a", 5, 10),
        (48, "GPU-b:1", 0, 1),
    ]
    assert [(f.uuid, f.start_ms, f.end_ms) for f in spec.retire] == [("GPU-a", 7, None)]
    assert [f.uuid for f in spec.ecc] == ["GPU-a"] and [f.uuid for f in spec.nopower] == ["GPU-c"]
    assert spec.claim_healthy and not parse_sim_spec("seed=1").claim_healthy
    from meter.sim import SimSpecError

    for bad in (
        "xid=GPU-a@5-10",
        "xid=x/GPU-a@5-10",
        "xid=79/GPU-a@5",
        "ecc=GPU-a@5",
        "retire=GPU-a@5-6",
        "nopower=GPU-a@6-5",
        "claim_healthy=2",
    ):
        with pytest.raises(SimSpecError):
            parse_sim_spec(bad)
