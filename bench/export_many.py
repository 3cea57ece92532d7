"""Benchmark: export thousands of placements from one ledger store, beside a full read.

    .venv/bin/python bench/export_many.py [--events 600000] [--trace DIR]
        [--mode each|all|both|steps] [--sample N] [--verify N] [--workdir DIR] [--threads N]
        [--compact]

1. Builds (once; cached under ~/.cache/gridledger/bench/) a ledger store shaped like the
   OpenB trace: one placement per GPU task that ran (6,203), in the trace's order, each
   with its terms, its usage events (the trace's per-task event count scaled so that the
   whole store holds about ``--events``) at the times the trace gives, and its close at
   window end + grace. Inputs go through the ledger's own fold and store (``Ingestor``) in
   batches of 5,000, so the store's rows are interleaved the way a real ledger writes
   them: at most a few dozen placements open at once, a few open for most of the trace.
2. Measures two floors in the same run: one sequential read of every row of the store's
   ``records`` and ``inputs`` tables (every column an export copies; exporting every
   placement cannot read less than that), and the cost of one export file to DuckDB
   (``file_floor``: a file with one row in each table a small placement fills, written
   the way ``export_all`` writes one; no export of a placement can cost less).
3. Exports: ``each`` calls ``export_placement`` once per placement (what the HTTP API and
   ``ledger export PLACEMENT`` do); ``all`` runs ``export_all`` (``ledger export --all``,
   one pass). ``--sample N`` exports only N placements spread over the trace in ``each``
   mode and extrapolates to all of them (for the slow layout).
4. Verifies ``--verify N`` of the exports (spread over the trace, the largest included)
   with the verifier, to show the fast path writes exports that still verify.

Reports seconds, exports/s, records/s, and the ratio of the time to export everything to
the time of the full read. No asserts: a benchmark reports, the tests judge.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.builders import (  # noqa: E402
    StreamWriter,
    closed,
    gpu,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger.ingest import Ingestor  # noqa: E402
from ledger.inputs import Item  # noqa: E402
from ledger.store import Store  # noqa: E402
from transport.positions import kafka_position, kafka_source  # noqa: E402

CACHE = Path.home() / ".cache" / "gridledger" / "bench"
DEFAULT_TRACE = ROOT.parents[1] / "shared" / "traces" / "openb"
if not DEFAULT_TRACE.exists():
    DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "openb"
SEED = "bench-export-many"
T0_MS = 1_700_000_000_000
GRACE_MS = 300_000
BATCH = 5_000
TOPIC = "bench-export"
# As `gridledger replay` signs them (replay_prices.toml): the trace has tasks of seconds.
TERMS: dict[str, int] = {
    "increment_ms": 1_000,
    "minimum_duration_ms": 0,
    "settlement_period_ms": 86_400_000,
    "late_grace_ms": GRACE_MS,
}


def trace_tasks(trace: Path) -> list[tuple[str, int, int, int]]:
    """(name, start_s, end_s, one-minute events in the full trace) of every GPU task that ran."""
    tasks = []
    with (trace / "openb_pod_list_default.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_gpu"]) == 0 or not row["scheduled_time"]:
                continue
            start, end = int(row["scheduled_time"]), int(row["deletion_time"])
            if end <= start:
                continue
            tasks.append((row["name"], start, end, -(-(end - start) // 60)))
    tasks.sort(key=lambda t: (t[1], t[0]))
    return tasks


def build_store(db: Path, trace: Path, events: int) -> dict[str, Any]:
    """Fold a trace-shaped input stream into a fresh store at ``db`` (temp file + rename)."""
    cast = make_cast(SEED)
    tasks = trace_tasks(trace)
    full = sum(t[3] for t in tasks)
    timeline: list[tuple[int, int, int, int]] = []  # (time_ms, kind, task, k)
    counts: list[int] = []
    for i, (_, start, end, minutes) in enumerate(tasks):
        n = max(1, round(minutes * events / full))
        counts.append(n)
        s_ms, e_ms = T0_MS + start * 1000, T0_MS + end * 1000
        timeline.append((s_ms, 0, i, 0))
        for k in range(n):
            # An event arrives when its interval ends (SPEC §6.6: FUTURE_DATED otherwise).
            timeline.append((s_ms + (e_ms - s_ms) * (k + 1) // n, 1, i, k))
        timeline.append((e_ms + GRACE_MS, 2, i, 0))
    timeline.sort()
    tmp = db.with_name(db.name + ".tmp")
    for path in (tmp, Path(str(tmp) + ".wal")):
        path.unlink(missing_ok=True)
    store = Store(tmp, ledger_public_key=cast.ledger.public_key)
    ingestor = Ingestor(store, cast.ledger)
    writers: dict[int, tuple[StreamWriter, Any]] = {}
    source = kafka_source(TOPIC, 0)
    started = time.perf_counter()
    items: list[Item] = []
    chained = 0
    for offset, (t_ms, kind, i, k) in enumerate(timeline):
        name, start, end, _ = tasks[i]
        pid = name
        s_ms, e_ms = T0_MS + start * 1000, T0_MS + end * 1000
        if kind == 0:
            g = gpu(f"{pid}-n0", 0)
            terms = make_terms(cast, pid, [g], s_ms, e_ms, **TERMS)
            writers[i] = (StreamWriter(cast.node_key(g.node_id), pid, g.node_id), g)
            data = signed_terms(cast, terms)
        elif kind == 1:
            writer, g = writers[i]
            n = counts[i]
            begin = s_ms + (e_ms - s_ms) * k // n
            data = writer.event(begin, t_ms, [sample(g)])
        else:
            data = closed(cast, pid, t_ms)
            del writers[i]
        items.append(
            Item(data, kafka_position(TOPIC, 0, offset), pid, source, str(offset + 1), t_ms)
        )
        if len(items) == BATCH:
            chained += ingestor.ingest(items).chained
            items = []
    if items:
        chained += ingestor.ingest(items).chained
    seconds = time.perf_counter() - started
    ingestor.close()
    rejected = int(store.query("SELECT count(*) FROM records WHERE status <> 'accepted'")[0][0])
    store.close()
    os.replace(tmp, db)
    return {
        "placements": len(tasks),
        "inputs": len(timeline),
        "chained": chained,
        "not_accepted": rejected,
        "build_s": round(seconds, 1),
    }


def _cpu() -> float:
    """CPU seconds of this process, every thread (DuckDB's included)."""
    times = os.times()
    return times.user + times.system


def full_read(db: Path) -> float:
    """Seconds to read every column an export copies, for every row of the store."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True, config={"threads": 2})
    try:
        started = time.perf_counter()
        for sql in (
            "SELECT placement_id, chain_index, envelope, record_hash, kind, status, reason, "
            "delivered_mgms, total_gross_minor FROM records",
            "SELECT placement_id, chain_index, position, input_hash, envelope, kind, status, "
            "reason, node_id, seq, start_ms, end_ms FROM inputs",
        ):
            cursor = con.execute(sql)
            while cursor.fetchmany(50_000):
                pass
        return time.perf_counter() - started
    finally:
        con.close()


def file_floor(work: Path, files: int = 200, keep: bool = False) -> dict[str, float]:
    """The per-file floor, measured in the same run: ``files`` export files, each with one
    row in each of the 7 tables a small placement fills, written as ``export_all``
    writes one (template copy, ATTACH to the writer's own DuckDB, INSERTs, COMMIT,
    DETACH = checkpoint, fsync, rename), one thread: what one file costs DuckDB whatever
    the store. ms per file, wall and CPU (this process, every thread). ``keep``: the
    files stay in ``work/floor`` (``f0.duckdb`` ...) for the caller to read."""
    import duckdb

    from ledger import export

    out = work / "floor"
    out.mkdir()
    template = out / ".template.duckdb"
    export._make_template(template)
    config = getattr(export, "_WRITER_CONFIG", {"threads": 1})
    con = duckdb.connect(":memory:", config=config)
    envelope = bytes(900)
    rows = {
        "ledger_records": "(0, ?, 'h', 'usage', 'accepted', '', 1, 2, 3, 4, 5, 'p')",
        "terms": "(0, 'k:0', 'h', ?, 'accepted', '')",
        "usage_events": "(1, 'k:1', 'h', ?, 'accepted', '', 'n', 0, 1, 2)",
        "closes": "(2, 'k:2', 'h', ?, 'accepted', '', 3)",
        "statements": "(2, ?, true, 1, 2, 3)",
    }
    try:
        started, cpu = time.perf_counter(), _cpu()
        for i in range(files):
            tmp, final = out / f".f{i}.tmp", out / f"f{i}.duckdb"
            shutil.copyfile(template, tmp)
            con.execute(f"ATTACH '{tmp}' AS f")
            con.execute("BEGIN")
            for table, values in rows.items():
                con.execute(f"INSERT INTO f.{table} VALUES {values}", [envelope])
            con.execute("INSERT INTO f.checkpoints VALUES (3, 'note')")
            con.execute("INSERT INTO f.meta VALUES ('format', 'gridledger-export')")
            con.execute("COMMIT")
            con.execute("DETACH f")
            export._fsync_file(tmp)
            os.replace(tmp, final)
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    finally:
        con.close()
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    return {
        "ms_per_file": round(seconds / files * 1000, 2),
        "cpu_ms_per_file": round(cpu / files * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the store, time the full read and the exports, verify a sample."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--mode", choices=("each", "all", "both", "steps"), default="both")
    parser.add_argument("--sample", type=int, default=0, help="each mode: only N placements")
    parser.add_argument("--verify", type=int, default=20)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--threads", type=int, help="all mode: writer threads (EXPORT_THREADS)")
    parser.add_argument(
        "--compact",
        action="store_true",
        help="all and steps modes: compact exports (EXPORT.md: 16 KiB blocks, DuckDB 1.2's "
        "format), as the replay writes them",
    )
    args = parser.parse_args(argv)
    if not (args.trace / "openb_pod_list_default.csv").exists():
        print(f"error: no OpenB trace at {args.trace} (--trace DIR)", file=sys.stderr)
        return 2

    from ledger.export import export_placement
    from ledger.store import STORE_VERSION
    from proto.trust import dump_trust

    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"export-many-{args.events}-store{STORE_VERSION}.duckdb"
    report: dict[str, Any] = {"events_target": args.events}
    if not cached.exists():
        print(f"building {cached} (once) ...", flush=True)
        report["build"] = build_store(cached, args.trace, args.events)
    cast = make_cast(SEED)
    work = Path(tempfile.mkdtemp(prefix="export-many-", dir=args.workdir))
    try:
        db = work / "ledger.duckdb"
        shutil.copyfile(cached, db)  # exports issue statements/checkpoints: keep the cache clean
        report["store_mib"] = round(db.stat().st_size / 2**20)
        report["full_read_s"] = round(full_read(db), 2)
        report["file_floor"] = file_floor(work)
        print(json.dumps({"file_floor": report["file_floor"]}), flush=True)
        with Store(db, ledger_public_key=cast.ledger.public_key) as store:
            placements = store.placements()
            records = int(store.query("SELECT count(*) FROM records")[0][0])
        report["placements"] = len(placements)
        report["records"] = records
        report["compact"] = args.compact
        modes = ("each", "all") if args.mode == "both" else (args.mode,)
        for mode in modes:
            out = work / f"exports-{mode}"
            out.mkdir()
            if mode == "steps":
                started, cpu = time.perf_counter(), _cpu()
                with Store(db, ledger_public_key=cast.ledger.public_key) as store:
                    chosen = replay_steps(store, cast.ledger, out, args.trace, compact=args.compact)
                seconds, cpu = time.perf_counter() - started, _cpu() - cpu
                per, all_s = seconds / len(chosen), seconds
            elif mode == "each":
                chosen = placements
                if args.sample:
                    step = max(1, len(placements) // args.sample)
                    chosen = placements[::step][: args.sample]
                with Store(db, ledger_public_key=cast.ledger.public_key) as store:
                    started = time.perf_counter()
                    cpu = _cpu()
                    for pid in chosen:
                        export_placement(store, pid, out / f"{pid}.duckdb", key=cast.ledger)
                    seconds = time.perf_counter() - started
                    cpu = _cpu() - cpu
                per = seconds / len(chosen)
                all_s = per * len(placements)
            else:
                from ledger.export import export_all

                started = time.perf_counter()
                cpu = _cpu()
                threads = {} if args.threads is None else {"threads": args.threads}
                with Store(db, ledger_public_key=cast.ledger.public_key) as store:
                    done = export_all(store, out, key=cast.ledger, compact=args.compact, **threads)
                seconds = time.perf_counter() - started
                cpu = _cpu() - cpu
                chosen = sorted(done.written)
                per = seconds / len(chosen)
                all_s = seconds
            report[mode] = {
                "exported": len(chosen),
                "seconds": round(seconds, 2),
                "ms_per_export": round(per * 1000, 2),
                "cpu_ms_per_export": round(cpu / len(chosen) * 1000, 2),
                "all_placements_s": round(all_s, 1),
                "exports_per_s": round(len(chosen) / seconds, 1),
                "ratio_to_full_read": round(all_s / report["full_read_s"], 2),
                "load_after": round(os.getloadavg()[0], 1),
                "cpu_ratio_to_file_floor": round(
                    cpu / len(chosen) * 1000 / report["file_floor"]["cpu_ms_per_file"], 2
                ),
            }
            print(json.dumps({mode: report[mode]}), flush=True)
        if args.verify:
            report["verified"] = verify_sample(work, modes[-1], cast, args.verify, dump_trust)
        report["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


def close_steps(trace: Path) -> list[list[str]]:
    """The trace's placements grouped by the replay step (one day, STEP_MS) at whose end
    each is closed (its window end + grace), steps in order."""
    tasks = trace_tasks(trace)
    first = min(t[1] for t in tasks)
    steps: dict[int, list[str]] = {}
    for name, _, end, _ in tasks:
        steps.setdefault((end * 1000 + GRACE_MS - first * 1000) // 86_400_000, []).append(name)
    return [sorted(steps[k]) for k in sorted(steps)]


def replay_steps(
    store: Store, key: Any, out: Path, trace: Path, *, compact: bool = False
) -> list[str]:
    """Export as the replay's ledger process does (``gridledger.replay.export_closed``):
    after each step (one day), the placements closed in it, EXPORT_CHUNK at a time with
    ``export_all``, after the query that finds the closed placements. The store is the
    whole trace's (the steps' later rows are there already; each placement's own commit
    range is as it was when it closed)."""
    from gridledger.replay import closed_placements
    from gridledger.replay_limits import EXPORT_CHUNK
    from ledger.export import export_all

    written: list[str] = []
    for step in close_steps(trace):
        closed_placements(store)
        for at in range(0, len(step), EXPORT_CHUNK):
            done = export_all(
                store, out, key=key, placement_ids=step[at : at + EXPORT_CHUNK], compact=compact
            )
            written.extend(done.written)
    return written


def verify_sample(work: Path, mode: str, cast: Any, n: int, dump_trust: Any) -> dict[str, int]:
    """Verify n exports (evenly spread, plus the largest file) with the offline verifier."""
    from gridledger.replay import quiet_logs
    from verifier.verify import verify_export

    quiet_logs()

    files = sorted((work / f"exports-{mode}").glob("*.duckdb"))
    if not files:
        return {"verified": 0, "failed": 0}
    step = max(1, len(files) // n)
    chosen = set(files[::step][:n]) | {max(files, key=lambda p: p.stat().st_size)}
    trust = cast.trust()
    del dump_trust
    ok = failed = 0
    for path in sorted(chosen):
        result = verify_export(path, trust)
        if result.ok and result.final:
            ok += 1
        else:
            failed += 1
            print(f"FAILED {path.name}: {result.error or result.verdict}", flush=True)
    return {"verified": ok, "failed": failed}


if __name__ == "__main__":
    raise SystemExit(main())
