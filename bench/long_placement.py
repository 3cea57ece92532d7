"""A long placement settled period by period: does each period cost what it holds?

    .venv/bin/python bench/long_placement.py [--quick] [--gpus 1000] [--periods 36]
        [--events 250] [--gpus-per-node 8] [--batch 2000]

One placement of ``--gpus`` GPUs (``--gpus-per-node`` a node, each event a sample of
every GPU of its node) on a simulated clock: each period (a "month", compressed to
``--events`` one-minute intervals per node) is folded by the ledger's real ingest path
(``Ingestor.ingest``, one DuckDB commit per ``--batch`` inputs), then exported since the
checkpoint of the period before (``export_placement(..., since=NOTE)``, SPEC §8.5; the
first period whole) and verified by ``python -m verifier`` in a child process from the
state it kept at that checkpoint (``--state``/``--state-out``; the first period whole).

Printed per period: the ledger's CPU for the period's inputs (this process's CPU over
the ingest), the export's wall time (statement, checkpoint and file), the verifier
child's CPU (its whole run, the interpreter's start included), the ledger's RSS (this
process: the verifier runs elsewhere; DuckDB's own share, ``duckdb_memory()``, beside it),
the store's size (file + WAL) and the export's.
The last two lines:

    period_cost_ratio last/first R     (ledger CPU + export + verify, last period / first)
    ledger_rss_growth_mib M            (ledger RSS after the last period - after the first)

``--quick``: 64 GPUs, 12 periods, 250 intervals a period (minutes on this machine). A
benchmark, not a test: it asserts nothing. Goal (BENCHMARKS.md): R <= 1.1, M <= 64 MiB.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms  # noqa: E402
from ledger.export import export_placement  # noqa: E402
from ledger.ingest import Ingestor  # noqa: E402
from ledger.inputs import Item  # noqa: E402
from ledger.store import Store  # noqa: E402
from proto.trust import dump_trust  # noqa: E402

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000
PID = "long-0"


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def last_note(path: Path) -> str:
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        row = con.execute("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--periods", type=int, default=36)
    parser.add_argument("--events", type=int, default=250, help="intervals per node a period")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.quick:
        args.gpus, args.periods = 64, 12
    nodes = -(-args.gpus // args.gpus_per_node)
    cast = make_cast("long")
    gpus = [gpu(f"{PID}-n{j:04d}", k) for j in range(nodes) for k in range(args.gpus_per_node)]
    gpus = gpus[: args.gpus]
    period_ms = args.events * INTERVAL_MS
    end_ms = T0_MS + args.periods * period_ms
    terms = signed_terms(cast, make_terms(cast, PID, gpus, T0_MS, end_ms))
    by_node: dict[str, list] = {}
    for g in gpus:
        by_node.setdefault(g.node_id, []).append(g)
    writers = [(StreamWriter(cast.node_key(n), PID, n), gs) for n, gs in sorted(by_node.items())]
    print(
        f"# gpus={args.gpus} nodes={nodes} periods={args.periods} intervals/period={args.events} "
        f"events/period={args.events * nodes} load {os.getloadavg()[0]:.1f} "
        f"cores {os.cpu_count()}",
        flush=True,
    )
    n = 0

    def item(raw: bytes, at: int) -> Item:
        nonlocal n
        n += 1
        return Item(raw, f"kafka:long:0:{n}", PID, "kafka:long:0", str(n + 1), at)

    costs: list[float] = []
    rss: list[float] = []
    with tempfile.TemporaryDirectory(prefix="long-placement-") as tmp_name:
        tmp = Path(tmp_name)
        trust = tmp / "trust.json"
        trust.write_bytes(dump_trust(cast.trust()))
        state = tmp / "state.json"
        db = tmp / "ledger.duckdb"
        store = Store(db, ledger_public_key=cast.ledger.public_key)
        ingestor = Ingestor(store, cast.ledger)
        since: str | None = None
        try:
            ingestor.ingest([item(terms, T0_MS)])
            for p in range(args.periods):
                start = T0_MS + p * period_ms
                inputs = []
                for e in range(args.events):
                    s = start + e * INTERVAL_MS
                    for w, gs in writers:
                        raw = w.event(s, s + INTERVAL_MS, [sample(g) for g in gs])
                        inputs.append(item(raw, s + INTERVAL_MS))
                cpu = time.process_time()
                for b in range(0, len(inputs), args.batch):
                    ingestor.ingest(inputs[b : b + args.batch])
                ledger_cpu = time.process_time() - cpu
                out = tmp / f"period-{p:03d}.duckdb"
                wall = time.perf_counter()
                export_placement(store, PID, out, key=cast.ledger, since=since)
                export_s = time.perf_counter() - wall
                command = [sys.executable, "-m", "verifier", str(out), "--trust", str(trust)]
                if since is not None:
                    command += ["--state", str(state)]
                command += ["--state-out", str(state), "--pool", "inline"]
                child = children_cpu()
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                verify_s = children_cpu() - child
                if done.returncode not in (0, 3):
                    print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
                    raise SystemExit(f"period {p}: verify exited {done.returncode}")
                since = last_note(out)
                wal = Path(f"{db}.wal")
                disk = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
                row = store._rows("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
                duck = int(row[0][0] or 0) / 2**20
                costs.append(ledger_cpu + export_s + verify_s)
                rss.append(rss_mib())
                print(
                    f"period {p:3d} events {len(inputs):7d} ledger_cpu {ledger_cpu:7.2f}s "
                    f"export {export_s:6.2f}s verify {verify_s:6.2f}s "
                    f"ledger_rss {rss[-1]:7.1f} MiB (duckdb {duck:6.1f}) "
                    f"store {disk / 2**20:7.1f} MiB "
                    f"export_file {out.stat().st_size / 2**20:6.1f} MiB",
                    flush=True,
                )
                out.unlink()
        finally:
            ingestor.close()
            store.close()
    print(f"# load {os.getloadavg()[0]:.1f} at the end", flush=True)
    print(f"period_cost_ratio last/first {costs[-1] / costs[0]:.2f}")
    print(f"ledger_rss_growth_mib {rss[-1] - rss[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
