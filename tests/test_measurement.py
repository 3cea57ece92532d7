"""SPEC §5.3 metering terms, §7.1.2 allocation / degradation / MIG, and the versioned XID
table of §7.1.1: from the scheduler's answer (fake kubelet PodResources and Slurm of the
real shapes) through the agent, the ledger's fold, the export and the verifier.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_meter_nvml import FakeDevice, FakeMig, FakeNvml
from test_verifier_exports import HOUR, MINUTE, T0, explain

from billview.build import terms_summary
from billview.doc import BillDoc
from devtools.builders import (
    StreamWriter,
    assignment,
    gpu,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger.bill import bill_doc
from ledger.export import export_placement
from ledger.fold import Fold
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.allocation import (
    KubeletSource,
    SlurmPrologSource,
    SlurmSource,
    allocations_for,
    build_allocation_source,
    expand_hostlist,
    holder_matches,
)
from meter.clock import SimClock
from meter.config import ConfigError, parse_meter_config
from meter.mig import profile_of, share_milli_of
from meter.nvml import NvmlSource
from meter.podresources import decode_list_response, encode_list_response
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.canonical import signed_bytes
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.records import GpuSpec, Metering, PlacementTerms, UsageEvent, Workload
from proto.terms import validate_terms
from proto.trust import TrustedKey
from proto.xids import DEGRADING_CLOCK_EVENTS, XID_TABLES, attribution, unhealthy_xids
from transport.local import node_source, publish_local, publisher_source
from transport.spool import read_spool
from verifier.terms_rules import broken_rules
from verifier.verify import verify_export


def _metering(**changes: Any) -> Metering:
    fields: dict[str, Any] = {
        "xid_table": 2,
        "idle_billed": True,
        "holders": ["k8s:team-a", "slurm:acme"],
        "degraded_bps": 10_000,
    }
    fields.update(changes)
    return Metering(**fields)


def _terms(name: str, gpus: list[GpuSpec], metering: Metering | None, **kw: Any) -> Any:
    cast = make_cast(name)
    return cast, make_terms(cast, name, gpus, T0, T0 + HOUR, metering=metering, **kw)


def _pod(name: str, namespace: str, *device_ids: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "containers": [
            {
                "name": "main",
                "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": list(device_ids)}],
            }
        ],
    }


def _kubelet(*pods: dict[str, Any]) -> KubeletSource:
    """A kubelet whose List answers these pods, as protobuf bytes off the socket."""
    wire = encode_list_response({"pod_resources": list(pods)})
    return KubeletSource(lambda: decode_list_response(wire))


def _pipeline(
    tmp_path: Path,
    cast: Any,
    terms: PlacementTerms,
    spec: str = "seed=3",
    allocation: Any = None,
    source: Any = None,
) -> tuple[list[UsageEvent], dict[str, int]]:
    """Meter an hour on node-a, fold it in a ledger, export, verify: the events and the
    verifier's own totals (equal to every ledger record's: ``report.ok``)."""
    local = tmp_path / "local"
    publish_local(local, publisher_source("desk"), [signed_terms(cast, terms)])
    if source is None:
        devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, "node-a")]
        source = Simulator(parse_sim_spec(spec), devices, T0)
    config = AgentConfig("node-a", cast.node_key("node-a"), (terms,), local / node_source("node-a"))
    clock = SimClock(T0)
    agent = Agent(config, source, clock, allocation=allocation)
    for _ in range(60):  # the scheduler is asked at each interval's end
        clock.advance(MINUTE)
        agent.tick()
    agent.close()
    events = [open_envelope(e.data).record for e in read_spool(local / node_source("node-a"))]
    assert len(events) == 60 and all(isinstance(e, UsageEvent) for e in events)
    totals = _ledger_export_verify(tmp_path, cast, terms, local)
    return [e for e in events if isinstance(e, UsageEvent)], totals


BILLS: dict[str, BillDoc] = {}  # the last pipeline's bill, by placement (one test each)


def _ledger_export_verify(
    tmp_path: Path, cast: Any, terms: PlacementTerms, local: Path, trust: Any = None
) -> dict[str, int]:
    """Fold what ``local`` holds in a ledger, close, export, verify: the verifier's own
    totals (equal to every ledger record's: ``report.ok``). The ledger's bill and the
    verifier's, from its own recomputation, are the same and derive every figure."""
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=local, clock=fixed_clock(T0 + 3 * HOUR)
    )
    try:
        assert service.run_until_idle().closed == [terms.placement_id]
        out = tmp_path / "export.duckdb"
        export_placement(store, terms.placement_id, out, key=cast.ledger)
        ledger_bill = bill_doc(store, cast.ledger, terms.placement_id)
    finally:
        service.close()
    report = verify_export(out, cast.trust() if trust is None else trust, bill=True)
    assert report.ok, explain(report)
    assert report.totals is not None  # ok: every record's totals are the verifier's own
    assert report.bill is not None
    mine = report.bill.doc(report)
    assert mine.checks == [] and ledger_bill.checks == []
    assert (mine.lines, mine.gpus) == (ledger_bill.lines, ledger_bill.gpus)
    BILLS[terms.placement_id] = mine
    return report.totals


# ---- allocation from the scheduler (§7.1.2) ---------------------------------------------


@pytest.mark.parametrize("idle_billed", [True, False])
def test_another_tenants_pod_is_not_delivered_and_idle_follows_the_terms(
    tmp_path: Path, idle_billed: bool
) -> None:
    gpus = [gpu("node-a", i) for i in range(3)]
    cast, terms = _terms("alloc-k8s", gpus, _metering(idle_billed=idle_billed))
    kubelet = _kubelet(
        _pod("trainer-0", "team-a", "GPU-node-a-0"),  # the buyer's namespace
        _pod("other-0", "team-b", "GPU-node-a-1"),  # another tenant
    )  # GPU 2: nobody
    events, totals = _pipeline(tmp_path, cast, terms, allocation=kubelet)
    by_uuid = {s.uuid: s for s in events[-1].samples}
    assert [by_uuid[f"GPU-node-a-{i}"].allocation for i in range(3)] == ["buyer", "other", "idle"]
    assert not by_uuid["GPU-node-a-1"].allocated
    assert by_uuid["GPU-node-a-2"].allocated is idle_billed
    whole_hour = 1000 * HOUR
    assert totals["delivered_mgms"] == whole_hour * (2 if idle_billed else 1)
    bill = BILLS[terms.placement_id]
    assert [g.allocation_unknown_ms for g in bill.gpus] == [0, 0, 0]  # the scheduler answered
    assert bill.gpus[1].ms["unallocated"] == HOUR


@pytest.mark.parametrize("idle_billed", [True, False])
def test_the_allocation_decides_whatever_the_flag_says(tmp_path: Path, idle_billed: bool) -> None:
    # Every sample flagged allocated; its allocation evidence decides (§7.1.2), in the
    # ledger's fold and, recomputed from the export, in the verifier.
    g = gpu("node-a", 0)
    cast, terms = _terms("alloc-flag", [g], _metering(idle_billed=idle_billed))
    minutes = [[sample(g, allocation=a)] for a in ("buyer", "other", "idle", "unknown", "buyer")]
    held = 1000 * MINUTE
    idle = held if idle_billed else 0
    assert _fold_minutes(terms, cast, minutes, tmp_path) == [held, 0, idle, idle, held]


def test_without_a_scheduler_every_sample_says_unknown_and_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    gpus = [gpu("node-a", i) for i in range(2)]
    cast, terms = _terms("alloc-none", gpus, None)
    events, totals = _pipeline(tmp_path, cast, terms)
    assert all(s.allocation == "unknown" and s.allocated for e in events for s in e.samples)
    # Omitted at its default: the bytes of an agent that predates the field.
    assert b'"allocation"' not in signed_bytes(events[0])
    assert totals["delivered_mgms"] == 2 * 1000 * HOUR
    # The bill says which delivered time no scheduler vouched for: all of it here.
    bill = BILLS[terms.placement_id]
    assert [g.allocation_unknown_ms for g in bill.gpus] == [HOUR, HOUR]
    line = next(x for x in bill.lines if x.key == "gpu:GPU-node-a-0")
    assert "1 h allocation unknown" in line.derivation


def test_a_failing_or_unmatched_scheduler_reads_unknown() -> None:
    gpus = [gpu("node-a", i) for i in range(2)]
    _, terms = _terms("alloc-fail", gpus, _metering())

    def broken() -> Mapping[str, Any]:
        raise ConnectionRefusedError("/var/lib/kubelet/pod-resources/kubelet.sock")

    assert KubeletSource(broken).holders() is None
    assert set(allocations_for(terms, gpus, None).values()) == {"unknown"}
    # Terms that name no holder: nothing to match against, so unknown too.
    _, bare = _terms("alloc-bare", gpus, _metering(holders=[]))
    assert set(allocations_for(bare, gpus, {"GPU-node-a-0": "k8s:x"}).values()) == {"unknown"}
    with pytest.raises(ValueError, match=r"truncated|runs past"):
        decode_list_response(encode_list_response({"pod_resources": [_pod("p", "n", "G")]})[:-3])


SCONTROL = (
    "JobId=11 JobName=train UserId=al(1) Account=acme QOS=normal JobState=RUNNING "
    "Reason=None Partition=gpu NumNodes=2 NodeList=gpu[01-02] Nodes=gpu01 CPU_IDs=0-7 "
    "Mem=0 GRES=gpu:a100:2(IDX:0,2) Nodes=gpu02 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:1(IDX:1) "
    "TresPerNode=gres:gpu:2\n"
    "JobId=12 JobName=sim UserId=bo(2) Account=rival QOS=normal JobState=RUNNING "
    "Reason=None Partition=gpu NumNodes=1 NodeList=gpu01 Nodes=gpu01 CPU_IDs=8-9 Mem=0 "
    "GRES=gpu:a100:1(IDX:1)\n"
    "JobId=13 JobName=done UserId=al(1) Account=acme JobState=COMPLETED Partition=gpu "
    "Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:3)\n"
)


def test_slurm_jobs_of_the_buyers_account_and_of_another() -> None:
    gpus = [gpu("node-a", i) for i in range(4)]
    _, terms = _terms("alloc-slurm", gpus, _metering(holders=["slurm:acme"]))
    source = SlurmSource("gpu01", lambda i: f"GPU-node-a-{i}", run=lambda: SCONTROL)
    holders = source.holders()
    assert holders == {
        "GPU-node-a-0": "slurm:acme/gpu",
        "GPU-node-a-2": "slurm:acme/gpu",
        "GPU-node-a-1": "slurm:rival/gpu",
    }
    assert allocations_for(terms, gpus, holders) == {
        "GPU-node-a-0": "buyer",
        "GPU-node-a-1": "other",
        "GPU-node-a-2": "buyer",
        "GPU-node-a-3": "idle",  # job 13 has completed
    }
    assert holder_matches("slurm:acme/gpu", ["slurm:acme/gpu"])
    assert not holder_matches("slurm:acme/debug", ["slurm:acme/gpu"])
    assert not holder_matches("slurm:acmex/gpu", ["slurm:acme"])
    assert expand_hostlist("gpu[08-10,12]") == ["gpu08", "gpu09", "gpu10", "gpu12"]

    def missing() -> str:
        raise FileNotFoundError("scontrol")

    assert SlurmSource("gpu01", lambda i: None, run=missing).holders() is None


# ---- degradation (§7.1.2) and the XID table (§7.1.1) ---------------------------------------


def _fold_minutes(
    terms: PlacementTerms, cast: Any, minutes: list[list[Any]], tmp_path: Path | None = None
) -> list[int]:
    """Each event's delivered_mgms, one event per minute with these samples, by the
    ledger's fold; with ``tmp_path``, the verifier recomputes the same from an export."""
    writer = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    fold = Fold(cast.ledger)
    fold.apply(signed_terms(cast, terms), "t", None)
    out = []
    raws = []
    for i, samples in enumerate(minutes):
        raw = writer.event(T0 + i * MINUTE, T0 + (i + 1) * MINUTE, samples)
        raws.append(raw)
        (outcome,) = fold.apply(raw, f"u{i}", None)
        assert outcome.status == "accepted" and outcome.record is not None
        out.append(outcome.record.delivered_mgms)
    if tmp_path is not None:
        local = tmp_path / "local"
        publish_local(local, publisher_source("desk"), [signed_terms(cast, terms)])
        publish_local(local, node_source("node-a"), raws)
        totals = _ledger_export_verify(tmp_path, cast, terms, local)
        assert totals["delivered_mgms"] == sum(out)
    return out


@pytest.mark.parametrize(
    ("metering", "expected"),
    [
        (None, [1000 * MINUTE] * 3),  # no metering: throttling is evidence only
        (_metering(degraded_bps=2_500), [1000 * MINUTE, 250 * MINUTE, 1000 * MINUTE]),
        (_metering(degraded_bps=0), [1000 * MINUTE, 0, 1000 * MINUTE]),
    ],
)
def test_throttled_time_is_priced_per_terms(
    tmp_path: Path, metering: Metering | None, expected: list[int]
) -> None:
    g = gpu("node-a", 0)
    cast, terms = _terms("throttle", [g], metering)
    minutes = [
        [sample(g)],
        [sample(g, clock_events=0x40 | 0x01)],  # hardware thermal slowdown (and idle)
        [sample(g, clock_events=0x04 | 0x02)],  # the power cap, app clocks: a normal GPU
    ]
    assert _fold_minutes(terms, cast, minutes, tmp_path) == expected


def test_throttle_priced_the_same_by_the_ledger_and_the_verifier(tmp_path: Path) -> None:
    gpus = [gpu("node-a", i) for i in range(2)]
    cast, terms = _terms("throttle-e2e", gpus, _metering(degraded_bps=5_000))
    spec = "seed=4,throttle=GPU-node-a-1@600000-1800000"  # 20 minutes throttled
    events, totals = _pipeline(tmp_path, cast, terms, spec)
    throttled = [e for e in events if e.samples[1].clock_events & DEGRADING_CLOCK_EVENTS]
    assert len(throttled) == 20 and all(e.samples[1].healthy for e in throttled)
    assert totals["delivered_mgms"] == 2 * 1000 * HOUR - 500 * 20 * MINUTE
    bill = BILLS[terms.placement_id]
    assert [g.degraded_ms for g in bill.gpus] == [0, 20 * MINUTE]
    assert [g.delivered_mgms for g in bill.gpus] == [1000 * HOUR, 1000 * HOUR - 500 * 20 * MINUTE]


def test_the_xid_table_attributes_and_the_terms_choose_it(tmp_path: Path) -> None:
    assert unhealthy_xids(1) == {48, 63, 64, 74, 79, 92, 94, 95}
    assert attribution(2, 13) == attribution(2, 31) == attribution(2, 43) == "application"
    assert attribution(2, 79) == "hardware" and attribution(2, 119) == "driver"
    assert attribution(2, 999) == "unknown"
    # Only driver or hardware codes are ever unhealthy.
    for table in XID_TABLES.values():
        assert all(e.attribution != "application" for e in table.values() if e.unhealthy)
    g = gpu("node-a", 0)
    minutes = [
        [sample(g, xids=[13, 31])],  # the job crashed: the GPU is fine
        [sample(g, xids=[63], remapped_correctable=2)],  # a row remapped, repaired
        [sample(g, xids=[79])],  # fell off the bus
    ]
    cast, v1 = _terms("xid-v1", [g], None)
    assert _fold_minutes(v1, cast, minutes, tmp_path / "v1") == [1000 * MINUTE, 0, 0]
    cast, v2 = _terms("xid-v2", [g], _metering())
    assert _fold_minutes(v2, cast, minutes, tmp_path / "v2") == [1000 * MINUTE, 1000 * MINUTE, 0]


def test_metering_terms_are_checked_and_omitted_when_absent() -> None:
    g = gpu("node-a", 0)
    _, terms = _terms("m1", [g], _metering(holders=["k8s:a", "k8s:a"]))
    assert any("M1" in p for p in validate_terms(terms))
    assert any("M1" in p for p in broken_rules(terms))
    _, plain = _terms("m1-plain", [g], None)
    assert b"metering" not in signed_bytes(plain)
    assert not any(label == "metering" for label, _ in terms_summary(plain))
    _, metered = _terms("m1-shown", [g], _metering(idle_billed=False, degraded_bps=2_500))
    shown = dict(terms_summary(metered))  # terms show, and every statement page
    assert shown["metering"].startswith("XID table 2; idle GPUs not billed")
    assert shown["buyer's workloads"] == "k8s:team-a, slurm:acme"
    assert shown["degraded time"] == "counted at 25.00 %"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**msgspec.to_builtins(_metering()), "xid_table": 3}, Metering)


def test_a_resold_gpus_throttled_time_is_weighed_for_the_new_buyer_too(tmp_path: Path) -> None:
    # SPEC §7.10 counts the assigned GPU's delivered time as §7.1 does: at its weight.
    g = gpu("node-a", 0)
    cast, terms = _terms("resale-throttle", [g], _metering(degraded_bps=5_000))
    buyer2 = SigningKey.from_seed_text("buyer-2", "measurement/buyer-2")
    resale = assignment(cast, terms, "as-1", buyer2, T0, [g.uuid], 400)
    writer = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    usage = [
        writer.event(T0, T0 + MINUTE, [sample(g, allocation="buyer")]),
        writer.event(
            T0 + MINUTE, T0 + 2 * MINUTE, [sample(g, allocation="buyer", clock_events=0x08)]
        ),
    ]
    fold = Fold(cast.ledger)
    for i, raw in enumerate([signed_terms(cast, terms), resale, *usage]):
        (outcome,) = fold.apply(raw, f"in{i}", None)
        assert outcome.status == "accepted", outcome.reason
    state = fold.state("resale-throttle")
    assert state is not None and [a.delivered_mgms for a in state.assignments] == [1500 * MINUTE]
    local = tmp_path / "local"
    # The resale reaches the ledger before the window starts (its handover is then the
    # window's start); the usage after the window, when the ledger also closes.
    publish_local(local, publisher_source("desk"), [signed_terms(cast, terms), resale])
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    early = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=local, clock=fixed_clock(T0 - 1)
    )
    try:
        early.run_until_idle()
    finally:
        early.close()
    publish_local(local, node_source("node-a"), usage)
    trust = cast.trust()
    keys = [*trust.keys, TrustedKey(id="buyer-2", role="buyer", key=buyer2.public_key)]
    totals = _ledger_export_verify(
        tmp_path, cast, terms, local, msgspec.structs.replace(trust, keys=keys)
    )
    assert totals["delivered_mgms"] == 1500 * MINUTE
    resold = BILLS[terms.placement_id].resale
    assert [r.delivered_mgms for r in resold] == [1500 * MINUTE]


# ---- MIG slices as units of sale (§5.3, §7.1.2) -----------------------------------------


def test_mig_share_follows_the_profile() -> None:
    assert profile_of("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert profile_of("NVIDIA A100-SXM4-40GB") == ""
    assert [share_milli_of(g, 7) for g in (1, 2, 3, 4, 7)] == [142, 285, 428, 571, 1000]
    assert share_milli_of(2, 4) == 500  # A30: 4 slices
    with pytest.raises(ValueError):
        share_milli_of(8, 7)


def test_a_mig_placement_through_nvml_ledger_export_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "NVIDIA A100-SXM4-40GB"
    fake = FakeNvml(
        [
            FakeDevice(
                "GPU-parent",
                name=name,
                mig=[
                    FakeMig("MIG-aaaa", f"{name} MIG 3g.20gb", 1, 0, 3),
                    FakeMig("MIG-bbbb", f"{name} MIG 1g.5gb", 7, 0, 1, total_mib=4_864),
                ],
            )
        ]
    )
    fake.install(monkeypatch)
    source = NvmlSource()
    # The operator writes the terms from what NVML lists: uuid, name, share from profile.
    gpus = [
        GpuSpec("node-a", m.uuid, m.name, m.share_milli, m.memory_mib)
        for m in source.mig_instances()
    ]
    workload = Workload("training", "oci:trainer", "mig", "s3://bucket")
    cast, terms = _terms("mig-e2e", gpus, _metering(), workload=workload)
    assert validate_terms(terms) == []
    assert [g.share_milli for g in terms.gpus] == [428, 142]
    kubelet = _kubelet(_pod("trainer-0", "team-a", "MIG-aaaa", "MIG-bbbb"))
    events, totals = _pipeline(tmp_path, cast, terms, allocation=kubelet, source=source)
    s = {x.uuid: x for x in events[5].samples}
    assert s["MIG-bbbb"].model == f"{name} MIG 1g.5gb" and s["MIG-bbbb"].allocation == "buyer"
    assert totals["delivered_mgms"] == (428 + 142) * HOUR


def test_meter_toml_names_the_scheduler(tmp_path: Path) -> None:
    base: dict[str, Any] = {
        "node_id": "node-a",
        "key_file": "node.key",
        "terms": ["t.json"],
        "transport": "local",
        "local_dir": str(tmp_path),
    }
    path = tmp_path / "meter.toml"
    assert parse_meter_config(base, path).allocation == "none"
    config = parse_meter_config({**base, "allocation": "slurm", "slurm_node": "gpu01"}, path)
    source = build_allocation_source(
        config.allocation,
        kubelet_socket=config.kubelet_socket,
        slurm_node=config.slurm_node,
        uuid_of_index=lambda i: None,
    )
    assert isinstance(source, SlurmSource)
    kubelet = parse_meter_config({**base, "allocation": "kubelet"}, path)
    assert kubelet.kubelet_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    with pytest.raises(ConfigError, match="allocation must be one of 'none', 'kubelet'"):
        parse_meter_config({**base, "allocation": "yarn"}, path)
    prolog = parse_meter_config({**base, "allocation": "slurm-prolog"}, path)
    assert prolog.slurm_prolog_dir == "/run/gridledger/slurm-jobs"


def test_slurm_prolog_files_say_who_holds_the_gpus(tmp_path: Path) -> None:
    # What deploy/slurm-prolog.sh writes of the prolog's environment, one file per job.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "11.env").write_text(
        "SLURM_JOB_ID=11\nSLURM_JOB_ACCOUNT=acme\nSLURM_JOB_PARTITION=gpu\nSLURM_JOB_GPUS=0,2\n"
    )
    (jobs / "12.env").write_text(
        "SLURM_JOB_ID=12\nSLURM_JOB_ACCOUNT=rival\nSLURM_JOB_PARTITION=gpu\nSLURM_JOB_GPUS=1\n"
    )
    source = SlurmPrologSource(jobs, lambda i: f"GPU-node-a-{i}" if i < 4 else None)
    assert source.holders() == {
        "GPU-node-a-0": "slurm:acme/gpu",
        "GPU-node-a-2": "slurm:acme/gpu",
        "GPU-node-a-1": "slurm:rival/gpu",
    }
    (jobs / "12.env").unlink()  # the epilog ran
    assert source.holders() == {"GPU-node-a-0": "slurm:acme/gpu", "GPU-node-a-2": "slurm:acme/gpu"}
    (jobs / "13.env").write_bytes(b"x" * 70_000)  # not a prolog's file: unknown, not a guess
    assert source.holders() is None
    assert SlurmPrologSource(tmp_path / "missing", lambda i: None).holders() is None


def test_the_mig_example_runs_and_its_bill_shows_slices_and_degraded_time(tmp_path: Path) -> None:
    from devtools import mig_example

    text = mig_example.run(tmp_path)
    assert "MIG-5c1e2f0a-3g40 (NVIDIA H100 80GB HBM3 MIG 3g.40gb)" in text
    assert "1 h delivered × share 428/1000" in text and "share 142/1000" in text
    # The whole GPU: the buyer's for 40 minutes, 10 of them throttled at half; then
    # another tenant's pod (unallocated): (30 + 10 / 2) min = 0.583 GPU-h.
    assert (
        "20 min unallocated" in text and "10 min degraded (throttled), counted at 50.00 %" in text
    )
    assert "0.583 GPU-h" in text and (tmp_path / "bill.txt").read_text() == text
