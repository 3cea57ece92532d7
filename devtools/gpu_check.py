"""The meter against a real NVIDIA GPU, in one go (SPEC §7.1.1, §7.1.2; run where a GPU
is at hand: ``devtools/gpu_check.sh`` says how).

    python -m devtools.gpu_check --seconds 120 --interval-s 10 --out OUT/gpu_check.json

1. NVML as it is (pynvml only, no other dependency): driver, and per GPU index, uuid, name,
   memory, power and its limit, clocks (SM, memory, graphics: current and max), clock-event
   reasons (current and supported), MIG mode and, where MIG is on, its instances. MIG mode
   is never changed here: a card is measured as its operator left it.
2. The agent: terms naming every GPU (and MIG instance) NVML lists, as NVML names them,
   signed by generated keys; ``meter.agent.Agent`` with ``meter.nvml.NvmlSource`` and the
   wall clock, one interval every ``--interval-s``, for ``--seconds``; optional load (a
   matrix multiply with PyTorch when it is installed and sees the GPU) so power and
   utilisation move.
3. Checks, each an ``OK:`` or ``FAIL:`` line: every event opens (signature, canonical bytes)
   and chains (seq, prev); every sample's uuid and model are NVML's; memory total equals
   NVML's; power is above 0 on a whole GPU; the samples are present and healthy; the
   ledger's fold accepts every event and delivers what the samples say.

Writes the facts and the checks as JSON (``--out``); exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # each fact is reported, missing or not
        return f"unavailable: {type(exc).__name__}"


def nvml_facts(nvml: Any) -> dict[str, Any]:
    """Part 1: what NVML says of every GPU (and MIG instance), read only."""
    facts: dict[str, Any] = {
        "driver": _try(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
        "nvml": _try(lambda: _text(nvml.nvmlSystemGetNVMLVersion())),
        "gpus": [],
    }
    clocks = {"sm": nvml.NVML_CLOCK_SM, "mem": nvml.NVML_CLOCK_MEM, "graphics": 0}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
        gpu: dict[str, Any] = {
            "index": index,
            "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
            "name": _text(nvml.nvmlDeviceGetName(h)),
            "memory_total_mib": int(memory.total) // MIB,
            "memory_used_mib": int(memory.used) // MIB,
            "power_mw": _try(nvml.nvmlDeviceGetPowerUsage, h),
            "power_limit_mw": _try(nvml.nvmlDeviceGetEnforcedPowerLimit, h),
            "energy_mj": _try(nvml.nvmlDeviceGetTotalEnergyConsumption, h),
            "clocks_mhz": {k: _try(nvml.nvmlDeviceGetClockInfo, h, v) for k, v in clocks.items()},
            "max_clocks_mhz": {
                k: _try(nvml.nvmlDeviceGetMaxClockInfo, h, v) for k, v in clocks.items()
            },
            "clock_events": _try(nvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            "clock_events_supported": _try(nvml.nvmlDeviceGetSupportedClocksEventReasons, h),
            "mig_mode": _try(nvml.nvmlDeviceGetMigMode, h),
            "remapped_rows": _try(nvml.nvmlDeviceGetRemappedRows, h),
        }
        facts["gpus"].append(gpu)
    return facts


def _load(seconds: float, stop: threading.Event) -> str:
    """A matrix multiply on the GPU while ``stop`` is clear (PyTorch, when it sees one)."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "no load: PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no load: PyTorch sees no GPU"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    return "load: bf16 8192x8192 matrix multiply"


def run_agent(seconds: float, interval_ms: int, workdir: Path, load: bool) -> dict[str, Any]:
    """Part 2 and 3: meter the node's GPUs for ``seconds``; the events and the checks."""
    from devtools import builders
    from ledger.fold import Fold
    from meter.agent import Agent, AgentConfig
    from meter.clock import RealClock
    from meter.nvml import NvmlSource
    from proto.envelope import open_envelope
    from proto.records import GpuSpec, UsageEvent

    source = NvmlSource()
    listed = source.read(0, 0)  # the devices and MIG instances NVML enumerates now
    mig = {m.uuid: m for m in source.mig_instances()}
    gpus = [
        GpuSpec(
            "gpu-node",
            uuid,
            reading.model,
            mig[uuid].share_milli if uuid in mig else 1000,
            reading.memory_total_mib,
        )
        for uuid, reading in sorted(listed.items())
        if uuid not in {m.parent_uuid for m in mig.values()}  # a MIG parent is sold as slices
    ]
    cast = builders.make_cast("gpu-check")
    now = RealClock().now_ms()
    terms = builders.make_terms(cast, "gpu-check", gpus, now, now + 3_600_000)
    config = AgentConfig(
        "gpu-node", cast.node_key("gpu-node"), (terms,), workdir / "spool", interval_ms=interval_ms
    )
    stop = threading.Event()
    load_note: list[str] = []
    loader = threading.Thread(target=lambda: load_note.append(_load(seconds, stop)), daemon=True)
    if load:
        loader.start()
    agent = Agent(config, source, RealClock())
    envelopes: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(min(interval_ms / 1000, max(0.0, deadline - time.monotonic())) + 0.05)
            envelopes += agent.tick()
    finally:
        stop.set()
        agent.close()
        if load:
            loader.join(timeout=30)
    fold = Fold(cast.ledger)
    outcomes = fold.apply(builders.signed_terms(cast, terms), "terms", None)
    checks: list[tuple[bool, str]] = [(all(o.status == "accepted" for o in outcomes), "terms")]
    events = []
    delivered = 0
    for i, raw in enumerate(envelopes):
        event = open_envelope(raw).record
        assert isinstance(event, UsageEvent)
        events.append(event)
        (outcome,) = fold.apply(raw, f"usage:{i}", None)
        accepted = outcome.status == "accepted" and outcome.record is not None
        checks.append((accepted, f"event seq {event.seq} accepted ({outcome.reason})"))
        if accepted and outcome.record is not None:
            delivered += outcome.record.delivered_mgms
    checks.append((len(events) >= 2, f"{len(events)} events signed"))
    names = {g.uuid: g.model for g in gpus}
    memory = {g.uuid: g.memory_mib for g in gpus}
    for event in events:
        for s in event.samples:
            where = f"seq {event.seq} {s.uuid}"
            checks.append(
                (s.uuid in names and s.model == names[s.uuid], f"{where}: model {s.model!r}")
            )
            checks.append((s.memory_total_mib == memory[s.uuid], f"{where}: memory total"))
            checks.append((s.present and s.healthy, f"{where}: present and healthy"))
            checks.append((s.power_mw > 0, f"{where}: power {s.power_mw} mW"))
    checks.append((delivered > 0, f"delivered {delivered} milli-GPU-ms"))
    return {
        "gpus": [{"uuid": g.uuid, "model": g.model, "share_milli": g.share_milli} for g in gpus],
        "mig_instances": [
            {
                "uuid": m.uuid,
                "parent": m.parent_uuid,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "profile": m.profile,
                "share_milli": m.share_milli,
            }
            for m in mig.values()
        ],
        "load": load_note[0] if load_note else "no load",
        "samples": [
            [
                {
                    "uuid": s.uuid,
                    "utilisation_pct": s.utilisation_pct,
                    "memory_used_mib": s.memory_used_mib,
                    "power_mw": s.power_mw,
                    "energy_mj": s.energy_mj,
                    "clock_events": s.clock_events,
                    "xids": s.xids,
                    "retired_pages": s.retired_pages,
                    "remapped_correctable": s.remapped_correctable,
                }
                for s in e.samples
            ]
            for e in events
        ],
        "delivered_mgms": delivered,
        "checks": [{"ok": ok, "what": what} for ok, what in checks],
    }


def main(argv: list[str] | None = None) -> int:
    """Run parts 1-3; one line per check; exit 0 when all passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gridledger-gpu-check"))
    parser.add_argument("--no-load", action="store_true")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"python": sys.version.split()[0], "machine": platform.node()}
    try:
        import pynvml

        pynvml.nvmlInit()
        result["nvml"] = nvml_facts(pynvml)
        pynvml.nvmlShutdown()
    except Exception as exc:
        print(f"FAIL: NVML: {type(exc).__name__}: {exc}")
        args.out.write_text(json.dumps(result, indent=1, default=str))
        return 1
    print(f"OK: NVML {result['nvml']['driver']}: {len(result['nvml']['gpus'])} GPU(s)")
    for gpu in result["nvml"]["gpus"]:
        print(f"     {gpu['index']} {gpu['uuid']} {gpu['name']!r} mig {gpu['mig_mode']}")
    try:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result["agent"] = run_agent(
            args.seconds, int(args.interval_s * 1000), args.workdir, not args.no_load
        )
    except Exception as exc:
        print(f"FAIL: the agent: {type(exc).__name__}: {exc}")
        args.out.write_text(json.dumps(result, indent=1, default=str))
        return 1
    failed = [c for c in result["agent"]["checks"] if not c["ok"]]
    for c in failed[:40]:
        print(f"FAIL: {c['what']}")
    print(
        f"{'FAIL' if failed else 'OK'}: {len(result['agent']['checks']) - len(failed)} of "
        f"{len(result['agent']['checks'])} checks; {result['agent']['load']}"
    )
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
