"""Benchmark: the whole OpenB trace through `gridledger replay` over real Kafka.

    .venv/bin/python bench/replay_trace.py [--trace DIR] [--workdir DIR] [--kafka HOST:PORT]
        [--interval-s 60] [--limit N] [--max-events N] [--json]
        [--prefixes 10,25,50,100 [--plot FILE.png]] [--no-reverify]

Starts the project's Kafka broker (``devtools.kafka_broker``) unless ``--kafka`` is
given, measures the Ed25519 verify limit of this machine in the same run (pynacl, one
core and two threads), replays the trace, then verifies every export again on its own
(two processes) to time the verifier alone. Reports events/s of the ledger and of the
verifier beside the verify limit, as ratios, and the peak RSS of the replay process.
Takes tens of minutes at the default 60 s interval (~3.2M events).

``--prefixes 10,25,50,100``: one run per prefix, each holding that percentage of the
trace's usage events (``gridledger.replay.prefix_budgets``: the longest prefix of tasks
in scheduled order within the budget), each in its own process (so its peak RSS is its
own), one broker for all; records wall time, events/s per stage and peak RSS per prefix
and, with ``--plot FILE.png``, draws them (matplotlib: the ``bench`` extra). Flat is the
goal: peak RSS should not grow with the prefix, events/s should not fall.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nacl.signing

# devtools/ is not installed (not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ledger_throughput import process_cpu_s
from devtools.openb import openb_trace
from gridledger.replay import (
    ReplayOptions,
    prefix_budgets,
    quiet_logs,
    run_replay,
    select_tasks,
    verify_one,
)
from gridledger.trace import read_trace
from proto.trust import dump_trust, load_trust

DEFAULT_TRACE = openb_trace()
STAGES = ("agents", "ship", "ledger", "export", "verify_busy")
PREFIX_RUN_TIMEOUT_S = 4 * 3600.0


def verify_limit(seconds: float = 2.0) -> dict[str, float]:
    """Ed25519 verifications per second: one thread, and two threads (pynacl drops the GIL)."""
    key = nacl.signing.SigningKey(b"\x01" * 32)
    message = b"x" * 600
    signed = key.sign(message)
    verify_key = key.verify_key

    def loop(deadline: float) -> int:
        count = 0
        while time.perf_counter() < deadline:
            for _ in range(200):
                verify_key.verify(signed)
            count += 200
        return count

    one = loop(time.perf_counter() + seconds) / seconds
    with ThreadPoolExecutor(2) as pool:
        deadline = time.perf_counter() + seconds
        two = sum(pool.map(loop, [deadline, deadline])) / seconds
    return {"one_core": round(one), "two_threads": round(two)}


def reverify(exports: Path, trust_file: Path) -> tuple[float, int, int]:
    """Verify every export again with two processes: (seconds, verified, failed)."""
    trust = dump_trust(load_trust(trust_file))
    paths = sorted(str(p) for p in exports.glob("*.duckdb"))
    started = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(verify_one, paths, [trust] * len(paths), chunksize=8))
    seconds = time.perf_counter() - started
    failed = sum(1 for r in results if r.why)
    return seconds, len(results) - failed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--kafka", metavar="HOST:PORT")
    parser.add_argument("--interval-s", type=int, default=60)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--max-events", type=int)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--prefixes", metavar="P,P,..", help="percentages of the trace's events, one run each"
    )
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="with --prefixes")
    parser.add_argument(
        "--no-reverify", action="store_true", help="skip verifying every export a second time"
    )
    parser.add_argument("--progress", action="store_true", help="progress lines on stderr")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the JSON here")
    args = parser.parse_args(argv)
    quiet_logs()
    if args.prefixes:
        return run_prefixes(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="replay-bench-"))
    broker: Any = None
    bootstrap = args.kafka
    if bootstrap is None:
        from devtools.kafka_broker import KafkaBroker

        broker = KafkaBroker()
        broker.start()
        bootstrap = broker.bootstrap
    try:
        limit_before = verify_limit()
        report = run_replay(
            ReplayOptions(
                trace_dir=args.trace,
                workdir=workdir,
                kafka=bootstrap,
                topic=f"replay-bench-{uuid.uuid4().hex[:8]}",
                interval_s=args.interval_s,
                limit=args.limit,
                max_events=args.max_events,
                progress=_stderr_line if args.progress else None,
                # the second verification below reads the exports the replay wrote
                keep_exports=not args.no_reverify,
            )
        )
        if args.no_reverify:
            verify_s, verified, failed = 0.0, report.verified, len(report.failed)
        else:
            verify_s, verified, failed = reverify(workdir / "exports", workdir / "trust.json")
        limit_after = verify_limit()
        broker_cpu = process_cpu_s(None if broker is None else broker.pid)
    finally:
        if broker is not None:
            broker.stop()
    limit_one = min(limit_before["one_core"], limit_after["one_core"])
    limit_two = min(limit_before["two_threads"], limit_after["two_threads"])
    events = report.events_accepted
    ledger_rate = report.rate("ledger")
    verifier_rate = events / verify_s if verify_s > 0 else 0.0
    result = {
        "events": events,
        "placements": report.placements,
        "delivered_equals_trace": report.delivered_equals_trace,
        "verified": report.verified,
        "failed": len(report.failed),
        "reverify": {"verified": verified, "failed": failed, "seconds": round(verify_s, 1)},
        "ed25519_verify_per_s": {"before": limit_before, "after": limit_after},
        "ledger_events_per_s": round(ledger_rate),
        "ledger_vs_one_core_limit": round(ledger_rate / limit_one, 3),
        "verifier_events_per_s": round(verifier_rate),
        "verifier_vs_two_core_limit": round(verifier_rate / limit_two, 3),
        "peak_rss_mib": round(report.peak_rss_mib),
        "peak_rss_mib_by_process": {
            k: round(v) for k, v in sorted(report.peak_rss_mib_by_process.items())
        },
        "seconds": {k: round(v, 1) for k, v in report.seconds.items()},
        # CPU by process; the broker's only when this run started it (its whole life)
        "cpu_seconds": {
            **{k: round(v, 1) for k, v in sorted(report.cpu_seconds.items())},
            **({"broker": round(broker_cpu, 1)} if broker is not None else {}),
        },
        "stage_events_per_s": stage_rates(report.events_accepted, report.seconds),
        "report": report.to_json(),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for line in report.render():
            print(line)
        print(
            f"ledger: {ledger_rate:,.0f} events/s = {ledger_rate / limit_one:.2f} x the "
            f"Ed25519 verify limit of one core ({limit_one:,.0f}/s)"
        )
        print(
            f"verifier: {verifier_rate:,.0f} events/s over {verified} exports "
            f"= {verifier_rate / limit_two:.2f} x the two-core verify limit ({limit_two:,.0f}/s)"
        )
        print(f"peak RSS of the replay: {report.peak_rss_mib:.0f} MiB")
    return 0 if report.ok and failed == 0 else 1


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage_rates(events: int, seconds: dict[str, float]) -> dict[str, float]:
    """Accepted events per second of each stage that took time."""
    return {
        stage: round(events / seconds[stage], 1) for stage in STAGES if seconds.get(stage, 0.0) > 0
    }


def run_prefixes(args: argparse.Namespace) -> int:
    """One replay per prefix, each in a process of its own; a table, JSON, a plot."""
    percents = [int(p) for p in str(args.prefixes).split(",") if p.strip()]
    interval_ms = args.interval_s * 1000
    tasks = select_tasks(read_trace(args.trace).tasks, args.limit)
    budgets = prefix_budgets(tasks, percents, interval_ms)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="replay-prefixes-"))
    root.mkdir(parents=True, exist_ok=True)
    broker: Any = None
    bootstrap = args.kafka
    if bootstrap is None:
        from devtools.kafka_broker import KafkaBroker

        broker = KafkaBroker()
        broker.start()
        bootstrap = broker.bootstrap
    rows: list[dict[str, Any]] = []
    try:
        for percent, budget in zip(percents, budgets, strict=True):
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--trace",
                str(args.trace),
                "--workdir",
                str(root / f"p{percent}"),
                "--kafka",
                bootstrap,
                "--interval-s",
                str(args.interval_s),
                "--out",
                str(root / f"p{percent}.json"),
            ]
            if args.limit is not None:
                command += ["--limit", str(args.limit)]
            if budget is not None:
                command += ["--max-events", str(budget)]
            if args.no_reverify:
                command.append("--no-reverify")
            if args.progress:
                command.append("--progress")
            started = time.perf_counter()
            broker_cpu = process_cpu_s(None if broker is None else broker.pid)
            out = root / f"p{percent}.json"
            out.unlink(missing_ok=True)
            done = subprocess.run(
                command, stdout=subprocess.DEVNULL, timeout=PREFIX_RUN_TIMEOUT_S, check=False
            )
            wall = time.perf_counter() - started
            broker_cpu = process_cpu_s(None if broker is None else broker.pid) - broker_cpu
            if not out.is_file():
                print(f"FAIL: prefix {percent}% produced no report (exit {done.returncode})")
                return 1
            result = json.loads(out.read_text())
            row = {
                "percent": percent,
                "max_events": budget,
                "events": result["events"],
                "placements": result["placements"],
                "wall_s": round(wall, 1),
                "peak_rss_mib": result["peak_rss_mib"],
                "peak_rss_mib_by_process": result.get("peak_rss_mib_by_process", {}),
                "stage_events_per_s": result["stage_events_per_s"],
                "seconds": result["seconds"],
                "cpu_seconds": {
                    **result["report"].get("cpu_seconds", {}),
                    **({"broker": round(broker_cpu, 1)} if broker is not None else {}),
                },
                "verifier_cpu_by_records": result["report"].get("verifier_cpu_by_records", {}),
                "verifier_batches": result["report"].get("verifier_batches", {}),
                "ok": done.returncode == 0,
            }
            rows.append(row)
            say = functools.partial(print, file=sys.stderr if args.json else sys.stdout, flush=True)
            say(
                f"prefix {percent:3d}%: {row['events']:,} events, {row['placements']:,} "
                f"placements, {wall:,.1f} s wall, peak RSS {row['peak_rss_mib']} MiB "
                + "("
                + ", ".join(f"{k} {v}" for k, v in row["peak_rss_mib_by_process"].items())
                + "), "
                + ", ".join(f"{k} {v:,.0f}/s" for k, v in row["stage_events_per_s"].items())
                + "; CPU s: "
                + ", ".join(f"{k} {v:,.0f}" for k, v in row["cpu_seconds"].items())
                + ("" if row["ok"] else " FAIL")
            )
            by_size = row["verifier_cpu_by_records"]
            if by_size:
                say(
                    "  verifier CPU by export size (records): "
                    + "; ".join(
                        f"{label} {v['exports']:,} exports {v['records']:,} records "
                        f"{v['cpu_s']:,.1f} s"
                        + (
                            f" ({v['cpu_s'] / v['records'] * 1e6:,.0f} us/record)"
                            if v["records"]
                            else ""
                        )
                        for label, v in by_size.items()
                    )
                )
            batches = row["verifier_batches"]
            if batches:
                say(
                    "  small exports handed to the verifier, batch size x batches: "
                    + ", ".join(f"{k} x {v}" for k, v in batches.items())
                )
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        print(json.dumps({"interval_s": args.interval_s, "prefixes": rows}, indent=2))
    if args.plot is not None:
        plot_prefixes(rows, args.plot, args.interval_s)
    return 0 if all(r["ok"] for r in rows) else 1


def plot_prefixes(rows: list[dict[str, Any]], out: Path, interval_s: int) -> None:
    """Wall time, peak RSS and events/s per stage against the prefix's events, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [r["events"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    wall, rss, rates = axes
    wall.plot(events, [r["wall_s"] for r in rows], marker="o")
    wall.set_title("wall time")
    wall.set_ylabel("s")
    rss.plot(events, [r["peak_rss_mib"] for r in rows], marker="o", color="tab:red", label="all")
    for name in ("replay", "ledger"):
        values = [r.get("peak_rss_mib_by_process", {}).get(name) for r in rows]
        if all(v is not None for v in values):
            rss.plot(events, values, marker="o", label=name)
    rss.legend()
    rss.set_title("peak RSS (replay and its children; each process)")
    rss.set_ylabel("MiB")
    rss.set_ylim(bottom=0)
    for stage in STAGES:
        values = [r["stage_events_per_s"].get(stage) for r in rows]
        if any(v is not None for v in values):
            rates.plot(events, [v or 0 for v in values], marker="o", label=stage)
    rates.set_title("events/s per stage")
    rates.set_yscale("log")
    rates.legend()
    for ax in axes:
        ax.set_xlabel("events in the prefix")
        ax.grid(True, alpha=0.3)
    labels = ", ".join(f"{r['percent']}%" for r in rows)
    fig.suptitle(f"gridledger replay of OpenB prefixes ({labels}), interval {interval_s} s")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
