"""NVML readings through a fake NVML patched into pynvml: values, health, vanished GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from devtools import builders
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.nvml import NvmlSource
from proto.envelope import open_envelope
from proto.records import UsageEvent

T0 = 1_700_000_000_000
MINUTE_MS = 60_000
MIB = 1024 * 1024


@dataclass
class FakeDevice:
    uuid: str
    name: str = "A100-80GB"
    used_mib: int = 40_000
    total_mib: int = 81_920
    util_pct: int = 80
    power_mw: int | None = 300_000  # None: not supported
    energy_mj: int = 1_000_000
    ecc: int | None = 0
    retire_pending: int = 0
    retired_pages: int | None = 0  # None: not supported (Ampere and later)
    remapped_rows: tuple[int, int] | None = None  # (corrected, uncorrected); None: pre-Ampere
    lost: bool = False
    clock_events: int = 0  # nvmlClocksEventReason* bits
    mig: list[FakeMig] | None = None  # None: no MIG support; a list: MIG mode on
    mig_slices: int = 7  # nvmlDeviceGetMaxMigDeviceCount


@dataclass
class FakeMig:
    """A MIG instance as NVML's MIG device handle shows it."""

    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    slices: int
    used_mib: int = 1_000
    total_mib: int = 19_968
    lost: bool = False


@dataclass
class FakeNvml:
    """The subset of NVML the agent uses, with the real pynvml error classes."""

    devices: list[FakeDevice] = field(default_factory=list)
    events: list[FakeDevice | tuple[FakeDevice, int]] = field(default_factory=list)
    registered: set[str] = field(default_factory=set)
    initialised: int = 0

    def _dev(self, handle: Any) -> Any:
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return handle

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def init() -> None:
            self.initialised += 1

        def shutdown() -> None:
            self.initialised -= 1

        def power(h: FakeDevice) -> int:
            d = self._dev(h)
            if d.power_mw is None:
                raise pynvml.NVMLError_NotSupported()
            return d.power_mw

        def ecc(h: FakeDevice, error_type: int, counter: int) -> int:
            assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            assert counter == pynvml.NVML_VOLATILE_ECC
            d = self._dev(h)
            if d.ecc is None:
                raise pynvml.NVMLError_NotSupported()
            return d.ecc

        def register(h: FakeDevice, kinds: int, event_set: Any) -> None:
            assert kinds & pynvml.nvmlEventTypeXidCriticalError
            self.registered.add(self._dev(h).uuid)

        def wait(event_set: Any, timeout_ms: int) -> Any:
            assert timeout_ms == 0  # never blocks the agent
            if not self.events:
                raise pynvml.NVMLError_Timeout()
            event = self.events.pop(0)
            device, code = event if isinstance(event, tuple) else (event, 79)
            return SimpleNamespace(device=device, eventData=code)

        def retired_pages(h: FakeDevice, cause: int) -> list[int]:
            d = self._dev(h)
            if d.retired_pages is None:
                raise pynvml.NVMLError_NotSupported()
            # Single-bit cause: the first page; double-bit: the rest (addresses).
            if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
                return [0x1000] * min(1, d.retired_pages)
            assert cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            return [0x2000] * max(0, d.retired_pages - 1)

        def remapped_rows(h: FakeDevice) -> tuple[int, int, int, int]:
            d = self._dev(h)
            if d.remapped_rows is None:
                raise pynvml.NVMLError_NotSupported()
            return (*d.remapped_rows, 0, 0)

        def mig_mode(h: FakeDevice) -> list[int]:
            if self._dev(h).mig is None:
                raise pynvml.NVMLError_NotSupported()
            return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

        def mig_count(h: FakeDevice) -> int:
            if self._dev(h).mig is None:
                raise pynvml.NVMLError_NotSupported()
            return int(h.mig_slices)

        def mig_handle(h: FakeDevice, index: int) -> FakeMig:
            instances = self._dev(h).mig or []
            if index >= len(instances):
                raise pynvml.NVMLError_NotFound()
            return instances[index]

        def memory(h: Any) -> Any:
            d = self._dev(h)
            return SimpleNamespace(used=d.used_mib * MIB, total=d.total_mib * MIB)

        functions = {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": lambda: len(self.devices),
            "nvmlDeviceGetHandleByIndex": lambda i: self.devices[i],
            "nvmlDeviceGetUUID": lambda h: self._dev(h).uuid.encode(),
            "nvmlDeviceGetName": lambda h: self._dev(h).name,
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(
                gpu=self._dev(h).util_pct, memory=10
            ),
            "nvmlDeviceGetPowerUsage": power,
            "nvmlDeviceGetTotalEnergyConsumption": lambda h: self._dev(h).energy_mj,
            "nvmlDeviceGetTotalEccErrors": ecc,
            "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: self._dev(h).retire_pending,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlEventSetFree": lambda s: None,
            "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait_v2": wait,
            "nvmlDeviceGetRetiredPages": retired_pages,
            "nvmlDeviceGetRemappedRows": remapped_rows,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: self._dev(h).clock_events,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": mig_count,
            "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
            "nvmlDeviceGetGpuInstanceId": lambda h: self._dev(h).gpu_instance_id,
            "nvmlDeviceGetComputeInstanceId": lambda h: self._dev(h).compute_instance_id,
            "nvmlDeviceGetAttributes": lambda h: SimpleNamespace(
                gpuInstanceSliceCount=self._dev(h).slices,
                computeInstanceSliceCount=self._dev(h).slices,
                memorySizeMB=self._dev(h).total_mib,
            ),
        }
        for name, fn in functions.items():
            assert hasattr(pynvml, name), name  # the real module has it: same names
            monkeypatch.setattr(pynvml, name, fn)


def test_readings_map_to_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeDevice("GPU-a"), FakeDevice("GPU-b", power_mw=None, ecc=None)])
    fake.install(monkeypatch)
    source = NvmlSource()
    assert fake.initialised == 1 and fake.registered == {"GPU-a", "GPU-b"}
    fake.devices[0].energy_mj += 18_000_000
    readings = source.read(T0, T0 + MINUTE_MS)
    a, b = readings["GPU-a"], readings["GPU-b"]
    assert (a.model, a.utilisation_pct, a.memory_used_mib, a.memory_total_mib) == (
        "A100-80GB",
        80,
        40_000,
        81_920,
    )
    assert (a.power_mw, a.energy_mj, a.healthy) == (300_000, 18_000_000, True)
    # Not supported: zero, and not a reason to call the GPU unhealthy.
    assert (b.power_mw, b.ecc_errors, b.energy_mj, b.healthy) == (0, 0, 0, True)
    source.close()
    assert fake.initialised == 0


def _terms_and_agent(tmp_path: Path, clock: SimClock) -> tuple[list[str], Agent]:
    cast = builders.make_cast("nvml")
    gpus = [builders.gpu("n1", i) for i in range(4)]
    terms = builders.make_terms(cast, "p1", gpus, T0, T0 + 3_600_000)
    config = AgentConfig("n1", cast.node_key("n1"), (terms,), tmp_path / "spool")
    return [g.uuid for g in gpus], Agent(config, NvmlSource(), clock)


def _samples(envelopes: list[bytes]) -> dict[str, Any]:
    assert len(envelopes) == 1
    event = open_envelope(envelopes[0]).record
    assert isinstance(event, UsageEvent)
    return {s.uuid: s for s in event.samples}


def test_unhealthy_and_vanished_gpus_in_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uuids = [f"GPU-n1-{i}" for i in range(4)]
    fake = FakeNvml([FakeDevice(u) for u in uuids] + [FakeDevice("GPU-not-in-terms")])
    fake.devices[3].ecc = 5  # counts before the agent started are not this interval's
    fake.install(monkeypatch)
    clock = SimClock(T0)
    terms_uuids, agent = _terms_and_agent(tmp_path, clock)
    assert terms_uuids == uuids

    # Interval 1: all well; energy is the counter's delta over the interval.
    for d in fake.devices:
        d.energy_mj += 1000 * (1 + fake.devices.index(d))
    clock.advance(MINUTE_MS)
    s = _samples(agent.tick())
    assert sorted(s) == uuids  # the device outside the terms is not reported
    assert all(x.healthy and x.allocated for x in s.values())
    assert [s[u].energy_mj for u in uuids] == [1000, 2000, 3000, 4000]

    # Interval 2: an XID on GPU 1, an uncorrected ECC error on GPU 3, GPU 2 lost.
    fake.events.append(fake.devices[1])
    fake.devices[3].ecc = 6
    fake.devices[2].lost = True
    clock.advance(MINUTE_MS)
    s = _samples(agent.tick())
    assert (s["GPU-n1-1"].healthy, s["GPU-n1-1"].xid_errors) == (False, 1)
    assert (s["GPU-n1-3"].healthy, s["GPU-n1-3"].ecc_errors) == (False, 1)
    lost = s["GPU-n1-2"]
    assert (lost.healthy, lost.utilisation_pct, lost.power_mw, lost.model) == (
        False,
        0,
        0,
        "A100-80GB",
    )
    assert s["GPU-n1-0"].healthy

    # Interval 3: errors stopped; GPU 2 fell off the bus (no longer enumerated); GPU 0
    # has pages pending retirement.
    fake.devices = [d for d in fake.devices if d.uuid != "GPU-n1-2"]
    fake.devices[0].retire_pending = pynvml.NVML_FEATURE_ENABLED
    clock.advance(MINUTE_MS)
    s = _samples(agent.tick())
    assert s["GPU-n1-1"].healthy and s["GPU-n1-3"].healthy
    assert not s["GPU-n1-2"].healthy and s["GPU-n1-2"].energy_mj == 0
    assert not s["GPU-n1-0"].healthy
    agent.close()


def test_nvml_failure_to_enumerate_reports_every_gpu_unhealthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml([FakeDevice(f"GPU-n1-{i}") for i in range(4)])
    fake.install(monkeypatch)
    clock = SimClock(T0)
    _, agent = _terms_and_agent(tmp_path, clock)

    def broken() -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken)
    clock.advance(MINUTE_MS)
    s = _samples(agent.tick())  # the agent keeps running and says what it knows
    assert len(s) == 4 and not any(x.healthy for x in s.values())
    agent.close()


def test_health_evidence_fields_from_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SPEC §7.1.1: XID codes from the event set, the uncorrected ECC delta, retired pages
    # (pre-Ampere) or remapped rows (Ampere and later), present; power from the energy
    # counter when the device has no power reading.
    uuids = [f"GPU-n1-{i}" for i in range(4)]
    fake = FakeNvml([FakeDevice(u) for u in uuids])
    fake.devices[0].retired_pages = 2  # before the agent started: the baseline
    fake.devices[1].retired_pages = None
    fake.devices[1].remapped_rows = (1, 0)
    fake.devices[3].power_mw = None
    fake.install(monkeypatch)
    clock = SimClock(T0)
    _, agent = _terms_and_agent(tmp_path, clock)

    clock.advance(MINUTE_MS)
    fake.devices[3].energy_mj += 300 * MINUTE_MS  # 300 W over the minute
    s = _samples(agent.tick())
    # A row remapped for a correctable error is evidence, not a retired page (§7.1.2).
    assert [s[u].retired_pages for u in uuids] == [2, 0, 0, 0]
    assert [s[u].remapped_correctable for u in uuids] == [0, 1, 0, 0]
    assert all(x.xids == [] and x.ecc_uncorrectable == 0 and x.present for x in s.values())
    assert s["GPU-n1-3"].power_mw == 300_000

    # Interval 2: XIDs 79 and 13 (twice) on GPU 0, 2 uncorrected ECC errors and a remapped
    # row on GPU 1, a retired page on GPU 0; GPU 2 lost.
    fake.events += [(fake.devices[0], 13), (fake.devices[0], 79), (fake.devices[0], 13)]
    fake.devices[1].ecc = 2
    fake.devices[1].remapped_rows = (1, 1)
    fake.devices[0].retired_pages = 3
    fake.devices[2].lost = True
    clock.advance(MINUTE_MS)
    s = _samples(agent.tick())
    a0, a1, a2 = s["GPU-n1-0"], s["GPU-n1-1"], s["GPU-n1-2"]
    assert (a0.xids, a0.xid_errors, a0.retired_pages) == ([13, 79], 3, 3)
    assert (a1.ecc_uncorrectable, a1.ecc_errors, a1.retired_pages) == (2, 2, 1)
    assert a1.remapped_correctable == 1
    assert (a2.present, a2.healthy, a2.power_mw) == (False, False, 0)
    assert s["GPU-n1-3"].power_mw == 0  # no energy used: 0 W, and §7.1.1 says unhealthy
    agent.close()


def test_xid_storm_keeps_the_critical_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeDevice("GPU-a")])
    fake.install(monkeypatch)
    source = NvmlSource()
    codes = [*range(100, 130), 95, 48]
    fake.events += [(fake.devices[0], c) for c in codes]
    reading = source.read(T0, T0 + MINUTE_MS)["GPU-a"]
    assert len(reading.xids) == 16 and {48, 95} <= set(reading.xids)
    assert list(reading.xids) == sorted(reading.xids) and reading.xid_errors == len(codes)
    source.close()


def test_application_xids_leave_the_gpu_healthy_and_throttling_is_evidence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SPEC §7.1.1 table 2: 13/31/43 are the application's; 79 the hardware's. §7.1.2: the
    # clock-event reasons are carried as NVML reports them.
    fake = FakeNvml([FakeDevice("GPU-a"), FakeDevice("GPU-b"), FakeDevice("GPU-c")])
    fake.install(monkeypatch)
    source = NvmlSource()
    fake.events += [(fake.devices[0], 13), (fake.devices[0], 31), (fake.devices[1], 79)]
    fake.devices[2].clock_events = (
        pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    )
    r = source.read(T0, T0 + MINUTE_MS)
    assert (r["GPU-a"].healthy, r["GPU-a"].xids, r["GPU-a"].xid_errors) == (True, (13, 31), 2)
    assert (r["GPU-b"].healthy, r["GPU-b"].xids) == (False, (79,))
    assert r["GPU-c"].healthy and r["GPU-c"].clock_events == 0x44
    assert r["GPU-a"].clock_events == 0
    source.close()


def _mig_parent() -> FakeDevice:
    return FakeDevice(
        "GPU-parent",
        name="NVIDIA A100-SXM4-40GB",
        mig=[
            FakeMig("MIG-aaaa", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 1, 0, 3),
            FakeMig("MIG-bbbb", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 2, 0, 2, total_mib=9_856),
            FakeMig("MIG-cccc", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 7, 0, 1, total_mib=4_864),
        ],
    )


def test_mig_instances_are_listed_and_read(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([_mig_parent(), FakeDevice("GPU-whole")])
    fake.install(monkeypatch)
    source = NvmlSource()
    listed = source.mig_instances()
    assert [
        (m.uuid, m.parent_uuid, m.gpu_instance_id, m.profile, m.share_milli) for m in listed
    ] == [
        ("MIG-aaaa", "GPU-parent", 1, "3g.20gb", 428),
        ("MIG-bbbb", "GPU-parent", 2, "2g.10gb", 285),
        ("MIG-cccc", "GPU-parent", 7, "1g.5gb", 142),
    ]
    assert listed[1].memory_mib == 9_856 and listed[0].parent_slices == 7
    fake.events.append((fake.devices[0], 94))  # a contained ECC error on the parent
    r = source.read(T0, T0 + MINUTE_MS)
    assert sorted(r) == ["GPU-parent", "GPU-whole", "MIG-aaaa", "MIG-bbbb", "MIG-cccc"]
    slice_ = r["MIG-bbbb"]
    assert (slice_.model, slice_.memory_total_mib, slice_.utilisation_pct) == (
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
        9_856,
        0,
    )
    # The parent's power and its health evidence, on every instance.
    assert slice_.power_mw == 300_000 and slice_.xids == (94,) and not slice_.healthy
    assert r["GPU-whole"].healthy
    source.close()


def test_the_gpu_check_script_runs_against_the_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # devtools/gpu_check.py is run on a real GPU by a later session; here it must run,
    # whole GPUs and MIG slices alike, against the fake of the same shapes.
    import json

    from devtools import gpu_check

    fake = FakeNvml([_mig_parent(), FakeDevice("GPU-whole")])
    fake.install(monkeypatch)
    out = tmp_path / "gpu_check.json"
    args = ["--seconds", "0.25", "--interval-s", "0.1", "--no-load"]
    code = gpu_check.main([*args, "--out", str(out), "--workdir", str(tmp_path / "w")])
    result = json.loads(out.read_text())
    assert code == 0, [c for c in result["agent"]["checks"] if not c["ok"]]
    assert [g["uuid"] for g in result["agent"]["gpus"]] == [
        "GPU-whole",
        "MIG-aaaa",
        "MIG-bbbb",
        "MIG-cccc",
    ]  # the MIG parent is sold as its slices
    assert [m["share_milli"] for m in result["agent"]["mig_instances"]] == [428, 285, 142]
    assert result["nvml"]["gpus"][0]["name"] == "NVIDIA A100-SXM4-40GB"
    fake.devices[1].power_mw = 0  # a check that can fail does
    assert gpu_check.main([*args, "--out", str(out), "--workdir", str(tmp_path / "x")]) == 1


def test_at_most_max_mig_per_gpu_instances_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    # MAX_MIG_PER_GPU bounds the MIG device handles the source asks NVML for per GPU: a
    # driver reporting more (none does today: an A100/H100 has at most 7) lists the first
    # MAX_MIG_PER_GPU, never an unbounded loop.
    from meter.nvml import MAX_MIG_PER_GPU

    many = [
        FakeMig(f"MIG-{i:04x}", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", i + 1, 0, 1)
        for i in range(MAX_MIG_PER_GPU + 1)
    ]
    parent = FakeDevice("GPU-parent", name="NVIDIA A100-SXM4-40GB", mig=many, mig_slices=64)
    FakeNvml([parent]).install(monkeypatch)
    source = NvmlSource()
    listed = source.mig_instances()
    assert [m.uuid for m in listed] == [m.uuid for m in many[:MAX_MIG_PER_GPU]]
    source.close()
