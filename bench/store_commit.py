"""Micro-benchmark of the store's commit path alone: ``Store.commit_batch`` of real batches.

    .venv/bin/python bench/store_commit.py [--events 100000] [--placements 200]
        [--repeat 3] [--root DIR] [--set NAME=VALUE ...] [--row-group N]

Folds ``--events`` signed usage events (round-robin over placements, after their terms;
``bench/fold_micro.py``'s generator) through ``ledger.ingest.Ingestor`` once, keeping
every ``Batch`` it commits; then replays those batches into a fresh store ``--repeat``
times, timing each ``commit_batch`` (process CPU: DuckDB's threads included; and the
calling thread's) and the closing checkpoint. ``--root`` runs another checkout's
``ledger`` (an A/B: the same script, each tree's store). ``--set`` applies DuckDB settings
to the store's connection after it opens (hypotheses). Prints CPU per input, the store's
file size after close, and the peak RSS. No asserts: a benchmark reports.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--row-group",
        type=int,
        action="append",
        default=[],
        help="the store's STORE_ROW_GROUP_ROWS instead (several: alternated, same batches)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    sys.path.insert(1, str(Path(__file__).resolve().parent))

    from fold_micro import as_inputs, generate

    from ledger.ingest import Ingestor, tune_gc
    from ledger.store import Batch, Store

    tune_gc()
    cast, items = generate(args.events, args.placements)
    inputs = as_inputs(items)
    batches: list[Batch] = []
    with tempfile.TemporaryDirectory(prefix="store-commit-") as tmp:
        store = Store(Path(tmp) / "gen.duckdb", ledger_public_key=cast.ledger.public_key)
        original = store.commit_batch

        def keep(batch: Batch) -> None:
            batches.append(batch)
            original(batch)

        store.commit_batch = keep  # type: ignore[method-assign]
        ingestor = Ingestor(store, cast.ledger)
        try:
            for start in range(0, len(inputs), args.batch):
                ingestor.ingest(inputs[start : start + args.batch])
        finally:
            ingestor.close()
            store.close()
    chained = sum(len(b.chained) for b in batches)
    print(f"root {args.root}: {len(batches)} batches, {chained} chained inputs, set {args.set}")
    for run in range(args.repeat * max(1, len(args.row_group))):
        if args.row_group:
            rows = args.row_group[run % len(args.row_group)]
            # The module that defines Store reads it (ledger/store.py or ledger/store/store.py
            # at older or newer roots).
            sys.modules[Store.__module__].STORE_ROW_GROUP_ROWS = rows
            print(f"row groups of {rows} rows: ", end="")
        with tempfile.TemporaryDirectory(prefix="store-commit-") as tmp:
            path = Path(tmp) / "replay.duckdb"
            store = Store(path, ledger_public_key=cast.ledger.public_key)
            con = store._con
            for setting in args.set:
                name, value = setting.split("=", 1)
                con.execute(f"SET {name} = '{value}'")
            cpu = thread = 0.0
            worst = 0.0
            started_wall = time.perf_counter()
            for batch in batches:
                p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
                store.commit_batch(batch)
                cpu += time.process_time() - p0
                thread += time.thread_time() - t0
                worst = max(worst, time.perf_counter() - w0)
            wall = time.perf_counter() - started_wall
            p0 = time.process_time()
            store.close()
            closing = time.process_time() - p0
            size = os.path.getsize(path)
            wal = Path(f"{path}.wal")
            wal_size = wal.stat().st_size if wal.exists() else 0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"commit_batch {cpu / chained * 1e6:6.1f} us process CPU/input "
            f"(thread {thread / chained * 1e6:5.1f}), close {closing / chained * 1e6:4.1f}, "
            f"wall {wall:5.2f} s (worst batch {worst:4.2f} s), "
            f"store {size / 1e6:5.1f} MB (+wal {wal_size / 1e6:.1f}), peak RSS {rss:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
