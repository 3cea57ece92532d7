"""Held inputs (SPEC §6.2) on the ledger's real ingest path: memory, bytes and time.

    .venv/bin/python bench/held_growth.py [--held 100000] [--placements 1] [--batch 5000]
        [--kind terms|stream|rejected] [--release] [--max-seconds 600] [--report-every 10000]

``--kind terms``: usage events of placements whose terms never came (held before the
terms); ``--kind stream``: terms, then one node's events from seq 1 on (seq 0 never
comes: every event is held in its stream); ``--kind rejected``: terms, then events of a
node the terms do not list (each rejected NODE_UNKNOWN and chained: nothing is held, its
input hash is seen, SPEC §6.1 (2), with ``--held`` inputs of it). ``--gpus``: GPUs of each
placement (one node), each event a sample of every GPU (a larger envelope).
``--placements``: the events spread
round-robin over that many placements. Every input is timed (``arrived_ms``, as on
Kafka with time from the log, SPEC §6.6). ``--release``: then the terms (``terms``) or
the missing seq 0 (``stream``), folded as one more batch, timed.

Each batch is ``Ingestor.ingest`` (fold + one DuckDB commit) on a fresh store, as the
service does. Printed every ``--report-every`` inputs: the batch's wall time, the
mean fold and commit time per batch over the last span, the main thread's CPU per input
over it, the snapshot bytes the batch wrote,
bytes of snapshots written so far, the held-input rows' raw bytes the batch wrote
(``held_inputs``, store version 4), the bytes the fold holds over all placements (the
ledger-wide bound's count), DuckDB's memory (``duckdb_memory()``), the process RSS, the
store file + WAL size, and the inputs quarantined so far (the hold bounds, SPEC §6.2).
Stops after ``--max-seconds`` of ingest (a benchmark, not a test: it reports and
asserts nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms  # noqa: E402
from ledger.ingest import Ingestor  # noqa: E402
from ledger.inputs import Item  # noqa: E402
from ledger.store import Store  # noqa: E402

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--placements", type=int, default=1)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--kind", choices=("terms", "stream", "rejected"), default="terms")
    parser.add_argument("--release", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--report-every", type=int, default=10_000)
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs per placement: samples per event (envelope size)"
    )
    args = parser.parse_args()

    cast = make_cast("held")
    per = -(-args.held // args.placements)
    window_ms = (per + 4) * INTERVAL_MS
    writers, terms_raw = [], []
    for i in range(args.placements):
        pid = f"held-{i:05d}"
        gs = [gpu(f"{pid}-n0", k) for k in range(args.gpus)]
        terms_raw.append(signed_terms(cast, make_terms(cast, pid, gs, T0_MS, T0_MS + window_ms)))
        if args.kind == "rejected":  # a node of its own, not in the terms
            gs = [gpu(f"{pid}-x0", k) for k in range(args.gpus)]
        writers.append((pid, StreamWriter(cast.node_key(gs[0].node_id), pid, gs[0].node_id), gs))
    seq0: list[tuple[str, bytes]] = []
    if args.kind == "stream":
        for pid, w, gs in writers:
            seq0.append((pid, w.event(T0_MS, T0_MS + INTERVAL_MS, [sample(g) for g in gs])))
    t0 = time.perf_counter()
    events: list[tuple[str, bytes, int]] = []
    for e in range(per):
        start = T0_MS + (e + 1) * INTERVAL_MS
        for pid, w, gs in writers:
            if len(events) == args.held:
                break
            raw = w.event(start, start + INTERVAL_MS, [sample(g) for g in gs])
            events.append((pid, raw, start))
    n = 0

    def item(pid: str, raw: bytes, at: int) -> Item:
        nonlocal n
        n += 1
        return Item(raw, f"kafka:held:0:{n}", pid, "kafka:held:0", str(n + 1), at)

    print(
        f"# kind={args.kind} held={args.held} placements={args.placements} batch={args.batch} "
        f"envelope={len(events[0][1])} B, generated in {time.perf_counter() - t0:.1f}s, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="held-growth-") as tmp:
        path = Path(tmp) / "held.duckdb"
        store = Store(path, ledger_public_key=cast.ledger.public_key)
        ingestor = Ingestor(store, cast.ledger)
        snap_total = rows_total = quarantined = 0
        try:
            if args.kind in ("stream", "rejected"):
                ingestor.ingest(
                    [
                        item(pid, raw, T0_MS)
                        for pid, raw in zip([w[0] for w in writers], terms_raw, strict=True)
                    ]
                )
            started = time.perf_counter()
            span_cpu, span_n = time.thread_time(), 0
            span_fold = span_commit = 0.0
            span_batches = 0
            done = 0
            label = "chained" if args.kind == "rejected" else "held"
            for b in range(0, len(events), args.batch):
                chunk = [item(pid, raw, at) for pid, raw, at in events[b : b + args.batch]]
                bt = time.perf_counter()
                folded = ingestor.fold_batch(chunk)
                snap = sum(len(s.snapshot) for s in folded.batch.states)
                rows = sum(len(getattr(h, "raw", b"")) for h in folded.batch.held)
                if args.kind == "rejected":  # the input hashes seen (placement_seen rows)
                    rows = sum(len(r.input_hash) for r in folded.batch.chained)
                ft = time.perf_counter()
                ingestor.commit(folded)
                report = ingestor.finish(folded)
                ct = time.perf_counter()
                span_fold += ft - bt
                span_commit += ct - ft
                span_batches += 1
                snap_total += snap
                rows_total += rows
                quarantined += report.quarantined
                done += report.chained if args.kind == "rejected" else report.held
                span_n += len(chunk)
                seen = b + len(chunk)
                if seen % args.report_every < args.batch or b + args.batch >= len(events):
                    cpu = (time.thread_time() - span_cpu) / span_n * 1e6
                    row = store._rows("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
                    duck = int(row[0][0] or 0) / 2**20
                    wal = Path(str(path) + ".wal")
                    disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
                    holding = getattr(ingestor.fold, "held_bytes", None)
                    holding_mb = "   -" if holding is None else f"{holding / 2**20:6.1f}"
                    print(
                        f"in {seen:7d} {label} {done:7d}  batch fold {ft - bt:6.2f}s "
                        f"commit {ct - ft:6.2f}s (mean {span_fold / span_batches:5.2f}s + "
                        f"{span_commit / span_batches:5.2f}s)  main CPU {cpu:7.1f} us/input  "
                        f"snapshot {snap / 2**20:7.3f} MB (written {snap_total / 2**20:8.1f} MB)  "
                        f"rows {rows / 2**20:6.2f} MB (written {rows_total / 2**20:7.1f} MB)  "
                        f"holding {holding_mb} MB  duckdb {duck:6.1f} MB  "
                        f"rss {rss_mb():6.0f} MB  disk {disk / 2**20:7.1f} MB  "
                        f"quarantined {quarantined}",
                        flush=True,
                    )
                    span_cpu, span_n = time.thread_time(), 0
                    span_fold = span_commit = 0.0
                    span_batches = 0
                if time.perf_counter() - started > args.max_seconds:
                    print(f"# stopped after {args.max_seconds}s at {done} held", flush=True)
                    break
            print(f"# ingest total {time.perf_counter() - started:.1f}s", flush=True)
            if args.release and args.kind != "rejected":
                if args.kind == "terms":
                    rel = [item(w[0], t, T0_MS) for w, t in zip(writers, terms_raw, strict=True)]
                else:
                    rel = [item(pid, raw, T0_MS + INTERVAL_MS) for pid, raw in seq0]
                rt = time.perf_counter()
                rc = time.thread_time()
                report = ingestor.ingest(rel)
                print(
                    f"# release: {time.perf_counter() - rt:.1f}s wall, "
                    f"{time.thread_time() - rc:.1f}s main CPU, chained {report.chained}, "
                    f"rss {rss_mb():.0f} MB",
                    flush=True,
                )
        finally:
            ingestor.close()
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
