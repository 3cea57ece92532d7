"""Long soak of the seeded fault harness (``devtools.faults``) on a broker of its own.

    .venv/bin/python bench/fault_soak.py [--seeds N | --seed S ...] [--first F]
                                         [--cycles C] [--workdir DIR] [--keep]

Starts an Apache Kafka broker (``devtools.kafka_broker``) in a temporary directory,
runs each seed's scenario with C fault cycles (meter and ledger kill -9, broker kill and
restart, duplicate deliveries; see the harness's docstring), prints one summary per seed
and the totals: cycles by fault class, seconds, messages, duplicates dropped. A seed
whose invariants fail prints the failure (seed, replay command) and the soak goes on
with the next; the exit code is 1 if any seed failed, else 0.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import structlog

# devtools/ is not installed (not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.faults import DEFAULT_CYCLES_PER_SEED, FaultFailure, FaultReport, run_seed
from devtools.kafka_broker import KafkaBroker


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds (default 10)")
    parser.add_argument("--first", type=int, default=1000, help="first seed (default 1000)")
    parser.add_argument("--seed", type=int, action="append", help="run these seeds only")
    parser.add_argument("--cycles", type=int, default=DEFAULT_CYCLES_PER_SEED * 2)
    parser.add_argument("--workdir", type=Path, default=None, help="keep run files here")
    parser.add_argument("--keep", action="store_true", help="keep the work dirs of passing seeds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; exit 0 when every seed held its invariants."""
    args = _parse(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    seeds = args.seed or list(range(args.first, args.first + args.seeds))
    root = args.workdir or Path(tempfile.mkdtemp(prefix="gridledger-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    totals: Counter[str] = Counter()
    failed: list[int] = []
    reports: list[FaultReport] = []
    started = time.monotonic()
    with KafkaBroker() as broker:
        print(f"broker {broker.bootstrap}; {len(seeds)} seed(s) x {args.cycles} cycles; {root}")
        for seed in seeds:
            workdir = root / f"seed-{seed}"
            try:
                report = run_seed(
                    seed,
                    bootstrap=broker.bootstrap,
                    broker=broker,
                    workdir=workdir,
                    cycles=args.cycles,
                )
            except FaultFailure as exc:
                failed.append(seed)
                print(f"FAIL: {exc}", flush=True)
                continue
            reports.append(report)
            totals.update(report.cycles)
            print(f"OK: {report.summary()}", flush=True)
            for exit_text in report.unexpected_exits:
                print(f"  unexpected exit: {exit_text[:300]}")
            if not args.keep and args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    cycles = sum(totals.values())
    kinds = ", ".join(f"{k}={n}" for k, n in sorted(totals.items()))
    print(
        f"\n{len(reports)}/{len(seeds)} seeds held every invariant; {cycles} cycles ({kinds}) "
        f"in {elapsed:.0f} s ({cycles / max(elapsed, 1e-9) * 60:.1f} cycles/min)"
    )
    if failed:
        print(f"failed seeds: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
