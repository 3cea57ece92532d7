"""Benchmark: the CPU of one export file, compact against portable, alternated in one process.

    .venv/bin/python bench/export_formats.py [--events 600000] [--placements 200]
        [--max-records 200] [--rounds 4] [--workdir DIR]

``export_all`` of the same ``--placements`` small placements (at most ``--max-records``
records each) of ``bench/export_many.py``'s cached store (copied: the first call issues
their statements and checkpoints), once per format for warm-up, then ``--rounds`` times
each, the formats taking turns going first. Reports CPU ms (this process, every thread)
and wall ms per export of each format, the ratio, the bytes a file takes, and the load.
Run it under ``perf record -g`` to see where the portable format's extra CPU goes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import export_many as em  # noqa: E402
from devtools.builders import make_cast  # noqa: E402
from ledger.export import export_all  # noqa: E402
from ledger.store import STORE_VERSION, Store  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--max-records", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    cached = em.CACHE / f"export-many-{args.events}-store{STORE_VERSION}.duckdb"
    if not cached.exists():
        raise SystemExit(f"no cached store {cached}: run bench/export_many.py --events N first")
    cast = make_cast(em.SEED)
    work = Path(tempfile.mkdtemp(prefix="export-formats-", dir=args.workdir))
    try:
        shutil.copyfile(cached, work / "ledger.duckdb")
        with Store(work / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
            sizes = {
                str(p): int(n)
                for p, n in store.query("SELECT placement_id, count(*) FROM records GROUP BY 1")
            }
            ids = sorted(p for p, n in sizes.items() if n <= args.max_records)[: args.placements]
            formats = {"compact": True, "portable": False}
            figures = {name: {"cpu": 0.0, "wall": 0.0, "files": 0} for name in formats}
            for name, compact in formats.items():  # warm-up; statements issued once
                export_all(store, work / name, key=cast.ledger, placement_ids=ids, compact=compact)
            for k in range(args.rounds):
                for name in list(formats) if k % 2 == 0 else list(formats)[::-1]:
                    out = work / name
                    shutil.rmtree(out, ignore_errors=True)
                    cpu, wall = _cpu(), time.perf_counter()
                    done = export_all(
                        store, out, key=cast.ledger, placement_ids=ids, compact=formats[name]
                    )
                    figures[name]["cpu"] += _cpu() - cpu
                    figures[name]["wall"] += time.perf_counter() - wall
                    figures[name]["files"] += len(done.written)
        report: dict[str, object] = {
            "placements": len(ids),
            "records": sum(sizes[p] for p in ids),
            "rounds": args.rounds,
        }
        for name, f in figures.items():
            files = max(1, int(f["files"]))
            report[name] = {
                "cpu_ms_per_export": round(f["cpu"] / files * 1000, 2),
                "wall_ms_per_export": round(f["wall"] / files * 1000, 2),
                "bytes_per_file": sum(p.stat().st_size for p in (work / name).glob("*.duckdb"))
                // max(1, len(ids)),
            }
        compact_ms = report["compact"]["cpu_ms_per_export"]  # type: ignore[index]
        portable_ms = report["portable"]["cpu_ms_per_export"]  # type: ignore[index]
        report["portable_over_compact"] = round(portable_ms / compact_ms, 2)
        report["load_after"] = round(os.getloadavg()[0], 1)
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
