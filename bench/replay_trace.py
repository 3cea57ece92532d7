"""Benchmark: the whole OpenB trace through `gridledger replay` over real Kafka.

    .venv/bin/python bench/replay_trace.py [--trace DIR] [--workdir DIR] [--kafka HOST:PORT]
        [--interval-s 60] [--limit N] [--max-events N] [--json]

Starts the project's Kafka broker (``devtools.kafka_broker``) unless ``--kafka`` is
given, measures the Ed25519 verify limit of this machine in the same run (pynacl, one
core and two threads), replays the trace, then verifies every export again on its own
(two processes) to time the verifier alone. Reports events/s of the ledger and of the
verifier beside the verify limit, as ratios, and the peak RSS of the replay process.
Takes tens of minutes at the default 60 s interval (~3.2M events).
"""

from __future__ import annotations

import argparse
import json
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

from devtools.openb import openb_trace
from gridledger.replay import ReplayOptions, quiet_logs, run_replay, verify_one
from proto.trust import dump_trust, load_trust

DEFAULT_TRACE = openb_trace()


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
    args = parser.parse_args(argv)
    quiet_logs()
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
            )
        )
        verify_s, verified, failed = reverify(workdir / "exports", workdir / "trust.json")
        limit_after = verify_limit()
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
        "seconds": {k: round(v, 1) for k, v in report.seconds.items()},
        "report": report.to_json(),
    }
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


if __name__ == "__main__":
    sys.exit(main())
