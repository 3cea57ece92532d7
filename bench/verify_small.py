"""Benchmark: the verifier's fixed cost per small export, in a warm process, beside its floor.

    .venv/bin/python bench/verify_small.py [--rounds 5] [--passes 3] [--against DIR]
        [--exports DIR --trust FILE]

The trace replay verifies one export per placement (6,203 of them, median 13 records,
p10 4, p90 126) in warm worker processes calling ``verify_export``; this measures that.

1. Builds (in a temporary directory) honest exports of the replay's sizes: one GPU, a
   close, statements and checkpoints, 2 to 124 usage events (``SIZES``), and one export
   with every kind of input (``full_scenario``: key rotation, rejections, adjustments, a
   reclaim, late data); then tampered copies (``TAMPERED``): an edited convenience
   column, a deleted input row, a duplicated record row, an edited statement column.
2. Measures the floor in the same run, in the child that verifies: what any DuckDB-based
   verifier pays per export at least (connect, ATTACH the export read-only, one query,
   close), and the CPU of the export's Ed25519 checks (pynacl).
   Also attach + query + detach on a database already open (what a process that keeps
   one pays per export at least).
3. ``--rounds`` fresh child processes of the checkout (``--against DIR``: this one's and
   DIR's, alternating, so both see the same load; e.g. ``git archive main | tar -x -C DIR``),
   each verifying every export once to warm up, then ``--passes`` times.
   Reports per export: wall ms and CPU ms (time.process_time: steadier on a shared
   machine; each export's median over passes, their mean, the median over rounds), the
   ratio to the floors, and whether both checkouts' reports (``python -m verifier
   --json``, without elapsed_s) are byte-identical.

``--exports DIR --trust FILE``: the same over existing exports instead (a replay's
``--keep-exports``: the trace's own placements).

``--toggle MODULE:NAME=VALUE`` (e.g. ``verifier.step9_obligation:CHAIN_ROWS_MAX=-1``):
instead of child processes, one process of this checkout verifies each export with the
attribute as it is and with it set to VALUE (a Python literal), alternating per export
and swapping the order each round: both variants see the same moments of a shared
machine. Reports the CPU per export of both, their ratio, and whether every report is
byte-identical.

``--batch K``: instead of child processes, one process of this checkout verifies the
exports one by one (``verify_export``) and in batches of K (``verify_exports``, what the
trace replay's workers do with small exports), alternating per round and swapping the
order; the export list is repeated to fill the batches (``--repeat``). Reports the CPU
per export of both, their ratio, and whether every report is byte-identical.

No asserts: this prints numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Usage events per honest export (records = events + terms + close): the replay's
# placements, p10 4 records, median 13, p90 126.
SIZES = (2, 3, 5, 8, 11, 11, 13, 16, 24, 40, 60, 124)

# (name, SQL) applied to a copy of the 11-event export.
TAMPERED = (
    ("column", "UPDATE ledger_records SET gross_minor = gross_minor + 1 WHERE chain_index = 4"),
    ("deleted-input", "DELETE FROM usage_events WHERE chain_index = 3"),
    (
        "duplicated-record",
        "INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index = 2",
    ),
    ("statement", "UPDATE statements SET buyer_owes_minor = buyer_owes_minor + 1"),
)


def build(out: Path) -> list[tuple[Path, Path]]:
    """Honest and tampered exports (with their trust files) under ``out``."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import duckdb
    from test_verifier_exports import full_scenario, small_scenario

    exports: list[tuple[Path, Path]] = []
    for k, events in enumerate(SIZES):
        s = small_scenario(out, name=f"p-small-{k:02d}", minutes=events)
        exports.append((s.path, s.trust_path))
    full = full_scenario(out)
    exports.append((full.path, full.trust_path))
    base, trust = exports[SIZES.index(11)]
    for name, sql in TAMPERED:
        path = out / f"tampered-{name}.duckdb"
        shutil.copyfile(base, path)
        con = duckdb.connect(str(path))
        con.execute(sql)
        con.close()
        exports.append((path, trust))
    return exports


# ---- the child: one checkout's verifier, warm ---------------------------------------------


def child(root: Path, listing: Path, out: Path, passes: int) -> None:
    """Warm up, measure the floor, time ``passes`` passes over every export (each export's
    median); JSON to ``out``."""
    sys.path.insert(0, str(root))
    import duckdb

    from gridledger.replay import quiet_logs
    from proto.keys import SigningKey, verify
    from proto.trust import load_trust
    from verifier.report import export_json
    from verifier.verify import verify_export

    quiet_logs()
    pairs = [(Path(a), Path(b)) for a, b in json.loads(listing.read_text())]
    trusts = {t: load_trust(t) for _, t in pairs}
    for path, trust in pairs:  # warm: imports, caches, first-use costs
        verify_export(path, trusts[trust])

    def floor_once(path: Path) -> None:
        con = duckdb.connect(":memory:")
        con.execute(f"ATTACH '{path}' AS x (READ_ONLY)")
        con.execute("SELECT count(*) FROM x.ledger_records").fetchall()
        con.close()

    warm = duckdb.connect(":memory:")

    def warm_floor_once(path: Path) -> None:
        warm.execute(f"ATTACH '{path}' AS x (READ_ONLY)")
        warm.execute("SELECT count(*) FROM x.ledger_records").fetchall()
        warm.execute("DETACH x")

    floor_wall: list[float] = []
    floor_cpu: list[float] = []
    warm_cpu: list[float] = []
    for path, _ in pairs:
        floor_once(path)
        wall, cpu = time.perf_counter(), time.process_time()
        floor_once(path)
        floor_wall.append(time.perf_counter() - wall)
        floor_cpu.append(time.process_time() - cpu)
        warm_floor_once(path)
        cpu = time.process_time()
        warm_floor_once(path)
        warm_cpu.append(time.process_time() - cpu)
    key = SigningKey.from_seed_text("bench", "verify-small")
    message = b"x" * 200
    signature = key.sign(message)
    n = 2000
    cpu = time.process_time()
    for _ in range(n):
        verify(key.public_key, message, signature)
    verify_cpu_s = (time.process_time() - cpu) / n

    walls: list[list[float]] = [[] for _ in pairs]
    cpus: list[list[float]] = [[] for _ in pairs]
    reports: list[str] = []
    signatures = 0
    for n in range(passes):
        for k, (path, trust) in enumerate(pairs):
            wall, cpu = time.perf_counter(), time.process_time()
            report = verify_export(path, trusts[trust])
            cpus[k].append((time.process_time() - cpu) * 1e3)
            walls[k].append((time.perf_counter() - wall) * 1e3)
            if n == 0:
                signatures += report.counts.get("signatures", 0)
                body = export_json(report)
                body.pop("elapsed_s", None)
                reports.append(json.dumps(body, sort_keys=True))
    wall_ms = [statistics.median(w) for w in walls]
    cpu_ms = [statistics.median(c) for c in cpus]
    out.write_text(
        json.dumps(
            {
                "wall_ms": wall_ms,
                "cpu_ms": cpu_ms,
                "reports": reports,
                "floor_wall_ms": statistics.median(floor_wall) * 1e3,
                "floor_cpu_ms": statistics.median(floor_cpu) * 1e3,
                "warm_floor_cpu_ms": statistics.median(warm_cpu) * 1e3,
                "sig_cpu_ms": signatures * verify_cpu_s * 1e3 / len(pairs),
            }
        )
    )


def toggled(listing: Path, toggle: str, rounds: int) -> None:
    """In one process: every export with ``toggle``'s attribute as it is ("as is") and set
    to its value ("toggled"), alternating per export; prints the CPU of both."""
    import ast
    import importlib

    sys.path.insert(0, str(ROOT))
    from gridledger.replay import quiet_logs
    from proto.trust import load_trust
    from verifier.report import export_json
    from verifier.verify import verify_export

    quiet_logs()
    where, _, literal = toggle.partition("=")
    module_name, _, name = where.partition(":")
    module = importlib.import_module(module_name)
    values = {"as is": getattr(module, name), "toggled": ast.literal_eval(literal)}
    pairs = [(Path(a), Path(b)) for a, b in json.loads(listing.read_text())]
    trusts = {t: load_trust(t) for _, t in pairs}
    cpus: dict[str, list[list[float]]] = {v: [[] for _ in pairs] for v in values}
    same = True
    for n in range(rounds + 1):  # round 0 warms up (imports, caches, first-use costs)
        order = list(values) if n % 2 == 0 else list(values)[::-1]
        for k, (path, trust) in enumerate(pairs):
            bodies = []
            for variant in order:
                setattr(module, name, values[variant])
                cpu = time.process_time()
                report = verify_export(path, trusts[trust])
                if n:
                    cpus[variant][k].append((time.process_time() - cpu) * 1e3)
                body = export_json(report)
                body.pop("elapsed_s", None)
                bodies.append(json.dumps(body, sort_keys=True))
            same = same and bodies[0] == bodies[1]
    setattr(module, name, values["as is"])
    medians = {v: [statistics.median(c) for c in cpus[v]] for v in values}
    a, b = (statistics.fmean(medians[v]) for v in values)
    print(
        f"{len(pairs)} exports, {rounds} rounds, load {os.getloadavg()[0]:.1f}: CPU per export "
        f"(mean of each export's median) {module_name}.{name} as is {a:.2f} ms, "
        f"= {literal} {b:.2f} ms; as is / toggled {a / b:.3f} (per export: "
        + " ".join(
            f"{x / y:.2f}" for x, y in zip(medians["as is"], medians["toggled"], strict=True)
        )
        + f"); reports byte-identical (every export, every round): {'yes' if same else 'NO'}"
    )


def batched(listing: Path, k: int, rounds: int, repeat: int) -> None:
    """In one process: the exports one by one and in batches of ``k`` (``verify_exports``),
    alternating per round; prints the CPU per export of both (all exports, and the ones
    that verify), and whether every report is byte-identical."""
    sys.path.insert(0, str(ROOT))
    from gridledger.replay import quiet_logs
    from proto.trust import load_trust
    from verifier.report import export_json
    from verifier.verify import verify_export, verify_exports

    quiet_logs()
    pairs = [(Path(a), Path(b)) for a, b in json.loads(listing.read_text())]
    groups: dict[bytes, tuple[Any, list[Path]]] = {}  # one trust file's exports together
    for path, trust in pairs:
        groups.setdefault(trust.read_bytes(), (load_trust(trust), []))[1].append(path)

    def body(report: Any) -> str:
        out = export_json(report)
        out.pop("elapsed_s", None)
        return json.dumps(out, sort_keys=True)

    cpu: dict[str, list[float]] = {"one by one": [], f"batches of {k}": []}
    same = True
    count = ok_count = 0
    for n in range(rounds + 1):  # round 0 warms up
        order = list(cpu) if n % 2 == 0 else list(cpu)[::-1]
        texts: dict[str, list[str]] = {}
        for variant in order:
            spent = 0.0
            texts[variant] = []
            count = ok_count = 0
            for trust, paths in groups.values():
                work = paths * repeat
                for at in range(0, len(work), k):
                    chunk = work[at : at + k]
                    started = time.process_time()
                    if variant == "one by one":
                        reports = [verify_export(p, trust) for p in chunk]
                    else:
                        reports = verify_exports(chunk, trust)
                    spent += time.process_time() - started
                    texts[variant] += [body(r) for r in reports]
                    count += len(chunk)
                    ok_count += sum(r.ok for r in reports)
            if n:
                cpu[variant].append(spent * 1e3 / count)
        same = same and texts[order[0]] == texts[order[1]]
    a, b = (statistics.median(cpu[v]) for v in cpu)
    print(
        f"{count} verifications per variant and round ({ok_count} verified), {rounds} rounds, "
        f"load {os.getloadavg()[0]:.1f}: CPU per export (median of rounds) one by one "
        f"{a:.2f} ms, batches of {k} {b:.2f} ms; batched / one by one {b / a:.3f} "
        f"(rounds: {' '.join(f'{y / x:.2f}' for x, y in zip(*cpu.values(), strict=True))}); "
        f"reports byte-identical (every export, every round): {'yes' if same else 'NO'}"
    )


def run_child(root: Path, listing: Path, work: Path, passes: int) -> dict[str, Any]:
    """One fresh process of the checkout at ``root`` (its own packages first on sys.path)."""
    out = work / "result.json"
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(root),
            str(listing),
            str(out),
        ],
        check=True,
        cwd=root,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def summary(name: str, runs: list[dict[str, Any]], honest: int) -> dict[str, float]:
    """Medians over rounds of the mean per export (honest ones, and all)."""
    figures = {
        "wall": statistics.median(statistics.fmean(r["wall_ms"][:honest]) for r in runs),
        "cpu": statistics.median(statistics.fmean(r["cpu_ms"][:honest]) for r in runs),
        "wall_median": statistics.median(statistics.median(r["wall_ms"][:honest]) for r in runs),
        "cpu_median": statistics.median(statistics.median(r["cpu_ms"][:honest]) for r in runs),
        "wall_all": statistics.median(statistics.fmean(r["wall_ms"]) for r in runs),
        "floor_wall": statistics.median(r["floor_wall_ms"] for r in runs),
        "floor_cpu": statistics.median(r["floor_cpu_ms"] for r in runs),
        "warm_floor_cpu": statistics.median(r["warm_floor_cpu_ms"] for r in runs),
        "sig_cpu": statistics.median(r["sig_cpu_ms"] for r in runs),
    }
    floor = figures["floor_cpu"] + figures["sig_cpu"]
    warm_floor = figures["warm_floor_cpu"] + figures["sig_cpu"]
    print(
        f"{name}: per honest export (mean of {honest}, median of {len(runs)} rounds) "
        f"{figures['wall']:.1f} ms wall, {figures['cpu']:.1f} ms CPU; the median export "
        f"{figures['wall_median']:.1f} ms wall, {figures['cpu_median']:.1f} ms CPU; all "
        f"{figures['wall_all']:.1f} ms wall. Floor: DuckDB open+attach+query+close "
        f"{figures['floor_wall']:.1f} ms wall / {figures['floor_cpu']:.1f} ms CPU (attach+"
        f"query+detach on an open database {figures['warm_floor_cpu']:.2f} ms CPU), Ed25519 "
        f"checks {figures['sig_cpu']:.2f} ms CPU per export -> CPU {figures['cpu'] / floor:.1f}x "
        f"the fresh-database floor, {figures['cpu'] / warm_floor:.1f}x the open-database one"
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3, help="passes over the exports per round")
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument(
        "--exports",
        type=Path,
        help="verify the *.duckdb files of this directory instead (e.g. a replay's "
        "--keep-exports), all honest, with --trust",
    )
    parser.add_argument("--trust", type=Path, help="the trust file of --exports")
    parser.add_argument(
        "--toggle",
        help="MODULE:NAME=VALUE: alternate the attribute as it is and set to VALUE, per "
        "export in one process (--rounds rounds), instead of child processes",
    )
    parser.add_argument(
        "--batch",
        type=int,
        help="K: one by one against verify_exports in batches of K, in one process "
        "(--rounds rounds)",
    )
    parser.add_argument(
        "--repeat", type=int, default=4, help="--batch: the export list repeated this often"
    )
    parser.add_argument("--honest-only", action="store_true", help="leave the tampered out")
    parser.add_argument("--child", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, args.passes)
        return 0
    with tempfile.TemporaryDirectory(prefix="verify-small-") as tmp:
        work = Path(tmp)
        if args.exports is not None:
            if args.trust is None:
                parser.error("--exports needs --trust")
            exports = [(p, args.trust.resolve()) for p in sorted(args.exports.glob("*.duckdb"))]
            honest = len(exports)
            what = f"{honest} exports of {args.exports}"
        else:
            exports = build(work)
            honest = len(SIZES) + 1
            what = (
                f"{len(exports)} exports ({honest} honest of {min(SIZES) + 2}-{max(SIZES) + 2} "
                f"records and one of every input kind, {len(TAMPERED)} tampered)"
            )
        listing = work / "exports.json"
        listing.write_text(json.dumps([[str(a), str(b)] for a, b in exports]))
        if args.honest_only:
            exports = exports[:honest]
            what += "; the tampered left out"
            listing.write_text(json.dumps([[str(a), str(b)] for a, b in exports]))
        if args.batch:
            print(what)
            batched(listing, args.batch, args.rounds, args.repeat)
            return 0
        if args.toggle:
            print(what)
            toggled(listing, args.toggle, args.rounds)
            return 0
        sides = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, root in sides.items():  # alternating: both see the same minutes
                runs[name].append(run_child(root, listing, work, args.passes))
        print(f"{what}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        figures = {name: summary(f"{name} ({sides[name]})", runs[name], honest) for name in sides}
        if "against" in figures:
            a, b = figures["this"], figures["against"]
            same = all(r["reports"] == s["reports"] for r in runs["this"] for s in runs["against"])
            print(
                f"this/against per honest export: wall {a['wall'] / b['wall']:.3f}, "
                f"CPU {a['cpu'] / b['cpu']:.3f}; reports byte-identical "
                f"(every export, every round): {'yes' if same else 'NO'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
