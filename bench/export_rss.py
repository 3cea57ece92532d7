"""Benchmark: the memory of ``export_all`` on large placements (issue 15, "peak RSS flat").

    .venv/bin/python bench/export_rss.py --store LEDGER.duckdb [--skip 1] [--count 3]
        [--calls one|each] [--pairs 2] [--against DIR] [--workdir DIR] [--clones N]

``--store``: a ledger store (e.g. ``REPLAY/ledger.duckdb`` of ``bench/replay_trace.py
--prefixes 10``; the replay's ledger key). It is copied once and every chosen placement
attested once there (statements and checkpoints issued), then each run exports again from
a fresh copy of that, in a fresh process: the ``--count`` largest placements after the
``--skip`` largest, in one ``export_all`` call (``--calls one``) or one call each.

Each run reports its wall and CPU seconds, the process's RSS at start, its high-water mark
(VmHWM) over the export, and the RSS peak seen while each placement's file was written
(a sampler thread, every 20 ms). ``--against DIR`` runs the same in another checkout
(``git archive main | tar -x -C DIR``), alternating, in the same minutes, and checks the
exports of both are equal row for row. No asserts: a benchmark reports, the tests judge.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.02
RUN_TIMEOUT_S = 1800.0


def _status(field: str) -> int:
    """A VmXXX field of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(args: argparse.Namespace) -> int:
    """One measured run, in this process: export, print one JSON line."""
    import resource
    import threading

    sys.path.insert(0, str(args.tree))
    from gridledger.replay import DEFAULT_SEED
    from gridledger.replay_terms import make_replay_cast
    from ledger.export import export_all
    from ledger.store import Store

    key = make_replay_cast(DEFAULT_SEED, 1).ledger
    ids: list[str] = json.loads(args.ids)
    out = Path(args.out)
    samples: list[tuple[float, int, int]] = []  # (t, rss KiB, files written)
    stop = threading.Event()

    def sample() -> None:
        for _ in range(int(RUN_TIMEOUT_S / SAMPLE_S)):
            if stop.wait(SAMPLE_S):
                return
            done = sum(1 for p in ids if (out / f"{p}.duckdb").exists())
            samples.append((time.perf_counter(), _status("VmRSS"), done))

    start_rss = _status("VmRSS")
    with Store(args.db, ledger_public_key=key.public_key) as store:
        opened_rss = _status("VmRSS")
        sampler = threading.Thread(target=sample, daemon=True)
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        sampler.start()
        calls = [ids] if args.calls == "one" else [[p] for p in ids]
        for call in calls:
            exported = export_all(store, out, key=key, placement_ids=call)
            if set(exported.written) != set(call):
                raise RuntimeError(f"not exported: {exported.skipped}")
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        after_rss = _status("VmRSS")
    per_file: list[int] = [0] * len(ids)
    for _, rss, done in samples:
        if done < len(ids):
            per_file[done] = max(per_file[done], rss)
    print(
        json.dumps(
            {
                "ledger": str(Path(sys.modules["ledger.export"].__file__ or "").parent),
                "wall_s": round(wall, 2),
                "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2),
                "start_mib": start_rss // 1024,
                "opened_mib": opened_rss // 1024,
                "hwm_mib": _status("VmHWM") // 1024,
                "after_mib": after_rss // 1024,
                "per_file_peak_mib": [v // 1024 for v in per_file],
            }
        )
    )
    return 0


def clone(db: Path, clones: int) -> None:
    """Add ``clones`` copies of the store's largest placement (``<id>-c<k>``), written in
    the same batches as it (the same commit range): a store with several large placements
    (a 10 % prefix of the trace has one), each read over every copy's rows as in a store
    whose large placements are open for most of its batches."""
    import duckdb

    con = duckdb.connect(str(db))
    try:
        row = con.execute(
            "SELECT placement_id FROM record_rows GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
        assert row is not None
        pid = str(row[0])
        con.execute("BEGIN")
        for k in range(1, clones + 1):
            new = f"'{pid}-c{k}'"
            for table in (
                "record_rows",
                "input_rows",
                "placement_commits",
                "statements",
                "checkpoints",
                "placement_state",
                "placement_seen",
                "closes",
            ):
                con.execute(
                    f"INSERT INTO {table} SELECT * REPLACE ({new} AS placement_id) "
                    f"FROM {table} WHERE placement_id = ?",
                    [pid],
                )
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    finally:
        con.close()


def tables(path: Path) -> dict[str, Any]:
    """Every table of an export file, its rows in file order (to compare two exports)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        return {n: con.execute(f'SELECT * FROM "{n}"').fetchall() for n in sorted(names)}
    finally:
        con.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--skip", type=int, default=1)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--calls", choices=("one", "each"), default="one")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--against", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--no-compare", action="store_true")
    parser.add_argument("--clones", type=int, default=0, help="copies of the largest placement")
    # the measured run (internal)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.store is None:
        parser.error("--store is required")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="export-rss-"))
    work.mkdir(parents=True, exist_ok=True)
    prepared = work / "prepared.duckdb"
    sys.path.insert(0, str(ROOT))
    from gridledger.replay import DEFAULT_SEED
    from gridledger.replay_terms import make_replay_cast
    from ledger.issuer import attest_all
    from ledger.store import Store

    key = make_replay_cast(DEFAULT_SEED, 1).ledger
    if not prepared.exists():
        shutil.copyfile(args.store, work / "prepared.tmp")
        if args.clones:
            clone(work / "prepared.tmp", args.clones)
        with Store(work / "prepared.tmp", ledger_public_key=key.public_key) as store:
            sizes = store.query(
                "SELECT placement_id, max(chain_index) + 1 AS n FROM record_rows "
                "GROUP BY placement_id ORDER BY n DESC, placement_id LIMIT 64"
            )
            attest_all(store, key, [str(r[0]) for r in sizes])
        (work / "sizes.json").write_text(json.dumps([[str(p), int(n)] for p, n in sizes]))
        os.replace(work / "prepared.tmp", prepared)
    sizes = json.loads((work / "sizes.json").read_text())
    chosen = sizes[args.skip : args.skip + args.count]
    ids = [p for p, _ in chosen]
    print(f"placements: {', '.join(f'{p} ({n:,})' for p, n in chosen)}; calls: {args.calls}")
    print(f"load average: {os.getloadavg()}")
    trees = {"this": ROOT}
    if args.against is not None:
        trees["other"] = args.against.resolve()
    failed: set[str] = set()
    for i in range(args.pairs):
        order = list(trees) if i % 2 == 0 else list(trees)[::-1]
        for name in order:
            db = work / "run.duckdb"
            shutil.copyfile(prepared, db)
            out = work / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run(
                [
                    *(sys.executable, __file__, "--child", "--tree", str(trees[name])),
                    *("--db", str(db), "--ids", json.dumps(ids), "--out", str(out)),
                    *("--calls", args.calls),
                ],
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
            if proc.returncode != 0:  # reported, and the runs go on (main can run out)
                error = [line for line in proc.stderr.splitlines() if "Error" in line]
                failed.add(name)
                print(f"{time.strftime('%H:%M:%S')} {name:5} FAILED: {error[-1:]}", flush=True)
            else:
                print(f"{time.strftime('%H:%M:%S')} {name:5} {proc.stdout.strip()}", flush=True)
            db.unlink()
            Path(str(db) + ".wal").unlink(missing_ok=True)
    print(f"load average: {os.getloadavg()}")
    if args.against is not None and not args.no_compare and not failed:
        for pid in ids:
            same = tables(work / "out-this" / f"{pid}.duckdb") == tables(
                work / "out-other" / f"{pid}.duckdb"
            )
            print(f"{pid}: exports {'equal row for row' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
