"""Benchmark: the replay's export pattern, this checkout's ``ledger/export.py`` against
another tree's, alternated step by step in one process (load-independent A/B).

    .venv/bin/python bench/export_steps_ab.py --against DIR [--events 3200000]
        [--steps 20:26] [--per-call 64] [--this-per-call N] [--compact-max-records N]

``DIR`` holds the other tree (``git archive REV | tar -x -C DIR``); its
``ledger/export.py`` is loaded beside this one as a module of its own (the rest of the
ledger is this checkout's). The store is ``bench/export_many.py``'s cached one of
``--events`` (built once if missing), copied twice, one copy per side. For each one-day
step of the trace (``export_many.close_steps``) in ``--steps``, each side runs what the
replay's ledger process runs after a step (``gridledger.replay.export_closed``): the
closed-placements query, then ``export_all`` per ``--per-call`` of the step's closed
placements (``--this-per-call``: this side's own); the two sides take turns going first.
``--compact-max-records N``: as the replay does (``gridledger.replay.export_chunk``), the
placements of at most N records compact, the others portable: one ``export_all`` call
with ``compact_max_records`` where the side's ``export_all`` takes it, else the way the
replay did before (its commit ranges and record counts read, then one call per format).
Reports CPU ms per export (this process, every thread) of each side and the ratio, and
compares the rows of every 1/60th file of the two sides (they must be equal).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402

from bench import export_many as em  # noqa: E402
from devtools.builders import make_cast  # noqa: E402
from gridledger.replay import closed_placements  # noqa: E402
from ledger import export as this  # noqa: E402
from ledger.store import STORE_VERSION, Store  # noqa: E402


def _other(tree: Path) -> Any:
    """``tree``'s ledger/export.py as a module of its own."""
    name = "ledger.export_against"
    spec = importlib.util.spec_from_file_location(name, tree / "ledger" / "export.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"no ledger/export.py in {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in this.TABLES
        }


def _export(
    module: Any, store: Store, out: Path, key: Any, ids: list[str], split: int | None
) -> Any:
    """``export_all`` of ``ids`` as the replay's ledger process calls it (``split``: its
    compact-by-size choice, ``--compact-max-records``)."""
    if split is None:
        return module.export_all(store, out, key=key, placement_ids=ids)
    if "compact_max_records" in inspect.signature(module.export_all).parameters:
        return module.export_all(store, out, key=key, placement_ids=ids, compact_max_records=split)
    # The replay's export_chunk before export_all took compact_max_records (5282238).
    ranges = store.commit_ranges()
    known = [p for p in ids if p in ranges]
    sizes: dict[str, int] = {}
    if known:
        sizes = {
            str(p): int(n)
            for p, n in store.query(
                "SELECT placement_id, count(*) FROM records "
                "WHERE placement_id IN (SELECT unnest(?)) AND commit_no BETWEEN ? AND ? "
                "GROUP BY 1",
                [known, min(ranges[p][0] for p in known), max(ranges[p][1] for p in known)],
            )
        }
    small = [p for p in ids if sizes.get(p, 0) <= split]
    large = [p for p in ids if sizes.get(p, 0) > split]
    written: dict[str, Any] = {}
    for part, compact in ((small, True), (large, False)):
        if part:
            got = module.export_all(store, out, key=key, placement_ids=part, compact=compact)
            written.update(got.written)
    return type("Done", (), {"written": written})()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True)
    parser.add_argument("--events", type=int, default=3_200_000)
    parser.add_argument("--trace", type=Path, default=em.DEFAULT_TRACE)
    parser.add_argument("--steps", default="20:26", metavar="FIRST:END")
    parser.add_argument("--per-call", type=int, default=64)
    parser.add_argument("--this-per-call", type=int)
    parser.add_argument("--compact-max-records", type=int, metavar="N")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    cached = em.CACHE / f"export-many-{args.events}-store{STORE_VERSION}.duckdb"
    if not cached.exists():
        em.CACHE.mkdir(parents=True, exist_ok=True)
        print(f"building {cached} (once) ...", flush=True)
        em.build_store(cached, args.trace, args.events)
    first, end = (int(x) for x in args.steps.split(":"))
    steps = em.close_steps(args.trace)[first:end]
    cast = make_cast(em.SEED)
    work = Path(tempfile.mkdtemp(prefix="export-steps-ab-", dir=args.workdir))
    sides: dict[str, dict[str, Any]] = {}
    try:
        for name, module, per_call in (
            ("against", _other(args.against), args.per_call),
            ("this", this, args.this_per_call or args.per_call),
        ):
            side = work / name
            (side / "out").mkdir(parents=True)
            shutil.copyfile(cached, side / "ledger.duckdb")
            store = Store(side / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
            sides[name] = {
                "module": module,
                "store": store,
                "out": side / "out",
                "per_call": per_call,
                "cpu": 0.0,
                "wall": 0.0,
                "files": 0,
            }
        for k, step in enumerate(steps):
            for name in ("against", "this") if k % 2 == 0 else ("this", "against"):
                side = sides[name]
                cpu, wall = time.process_time(), time.perf_counter()
                closed_placements(side["store"])
                for at in range(0, len(step), side["per_call"]):
                    done = _export(
                        side["module"],
                        side["store"],
                        side["out"],
                        cast.ledger,
                        step[at : at + side["per_call"]],
                        args.compact_max_records,
                    )
                    side["files"] += len(done.written)
                side["cpu"] += time.process_time() - cpu
                side["wall"] += time.perf_counter() - wall
        names = sorted(p.name for p in sides["this"]["out"].glob("*.duckdb"))
        compared = names[:: max(1, len(names) // 60)]
        differing = [
            n
            for n in compared
            if _rows(sides["this"]["out"] / n) != _rows(sides["against"]["out"] / n)
        ]
        report: dict[str, Any] = {
            "steps": args.steps,
            "compact_max_records": args.compact_max_records,
            "files_compared": len(compared),
            "differing": differing,
        }
        for name, side in sides.items():
            report[name] = {
                "exports": side["files"],
                "per_call": side["per_call"],
                "cpu_ms_per_export": round(side["cpu"] / side["files"] * 1000, 2),
                "wall_s": round(side["wall"], 1),
            }
        report["cpu_ratio"] = round(
            report["this"]["cpu_ms_per_export"] / report["against"]["cpu_ms_per_export"], 3
        )
        report["load_after"] = round(os.getloadavg()[0], 1)
        print(json.dumps(report, indent=2))
    finally:
        for side in sides.values():
            side["store"].close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
