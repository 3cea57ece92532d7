"""An example: a placement of MIG slices, measured with the scheduler's word, end to end.

    python -m devtools.mig_example OUT_DIR

An operator sells two slices of one H100 (a ``3g.40gb`` and a ``1g.10gb`` instance, each
under its own ``MIG-…`` uuid, ``share_milli`` from the profile: 428 and 142) and a whole
H100 beside them, under terms with ``metering`` (SPEC §5.3): XID table 2, idle time not
billed, the buyer's Kubernetes namespace ``team-a``, throttled time at half. The node's
kubelet says the buyer's pod holds both slices and the whole GPU for the first 40 minutes,
then another tenant's pod takes the whole GPU; the whole GPU throttles (hardware thermal
slowdown) for 10 minutes. The simulator models the slices as NVML reads them (no
utilisation of their own). The ledger folds the hour, closes, exports; the verifier
recomputes the bill from the export alone and writes ``OUT_DIR/bill.txt``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from billview import render
from devtools.builders import make_cast, make_terms, signed_terms
from ledger.export import export_placement
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.mig import share_milli_of
from meter.sim import SimDevice, Simulator, parse_sim_spec
from proto.records import GpuSpec, Metering, Workload
from transport.local import node_source, publish_local, publisher_source
from verifier.verify import verify_export

T0: Final = 1_796_083_200_000  # 2026-12-01T00:00:00Z
MINUTE: Final = 60_000
H100: Final = "NVIDIA H100 80GB HBM3"
GPUS: Final = (
    GpuSpec("node-a", "MIG-5c1e2f0a-3g40", f"{H100} MIG 3g.40gb", share_milli_of(3, 7), 40_192),
    GpuSpec("node-a", "MIG-9b0d4e7c-1g10", f"{H100} MIG 1g.10gb", share_milli_of(1, 7), 9_728),
    GpuSpec("node-a", "GPU-7f3a9c1e-whole", H100, 1000, 81_559),
)


class Kubelet:
    """The node's PodResources answers, by the simulated clock (see the docstring)."""

    def __init__(self, clock: SimClock) -> None:
        self._clock = clock

    def holders(self) -> Mapping[str, str]:
        """Device id -> ``k8s:<namespace>``, as ``meter.allocation.KubeletSource`` gives."""
        whole = "k8s:team-a" if self._clock.now_ms() <= T0 + 40 * MINUTE else "k8s:team-b"
        return {GPUS[0].uuid: "k8s:team-a", GPUS[1].uuid: "k8s:team-a", GPUS[2].uuid: whole}


def run(out: Path) -> str:
    """Run the example into ``out``; the verifier's bill as text."""
    out.mkdir(parents=True, exist_ok=True)
    cast = make_cast("mig-example")
    metering = Metering(xid_table=2, idle_billed=False, holders=["k8s:team-a"], degraded_bps=5000)
    workload = Workload("training", "oci:trainer:1 (containerd)", "shared", "object store")
    terms = make_terms(
        cast, "pl-mig-0001", list(GPUS), T0, T0 + 60 * MINUTE, metering=metering, workload=workload
    )
    local = out / "local"
    publish_local(local, publisher_source("desk"), [signed_terms(cast, terms)])
    clock = SimClock(T0)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in GPUS]
    spec = parse_sim_spec(f"seed=41,throttle={GPUS[2].uuid}@600000-1200000")
    config = AgentConfig("node-a", cast.node_key("node-a"), (terms,), local / node_source("node-a"))
    agent = Agent(config, Simulator(spec, devices, T0), clock, allocation=Kubelet(clock))
    for _ in range(60):  # the kubelet is asked at the end of every minute
        clock.advance(MINUTE)
        agent.tick()
    agent.close()
    store = Store(out / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store,
        cast.ledger,
        ledger_id="ledger-1",
        local_dir=local,
        clock=fixed_clock(T0 + 3 * 3_600_000),
    )
    try:
        service.run_until_idle()
        export_placement(store, terms.placement_id, out / "export.duckdb", key=cast.ledger)
    finally:
        service.close()
    report = verify_export(out / "export.duckdb", cast.trust(), bill=True)
    if not report.ok or report.bill is None:
        raise SystemExit(f"FAIL: the example's export did not verify: {report.verdict}")
    text = render.to_text(report.bill.doc(report))
    (out / "bill.txt").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.mig_example OUT_DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m devtools.mig_example OUT_DIR")
        return 2
    print(run(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
