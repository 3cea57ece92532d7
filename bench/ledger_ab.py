"""A/B of ``bench/ledger_throughput.py``: this checkout against another, in the same minutes.

    .venv/bin/python bench/ledger_ab.py --against DIR [--pairs 5] [--events 50000]

``DIR`` is another checkout of the project (e.g. ``git archive main | tar -x -C DIR``); both
run with this checkout's interpreter, on one broker started here, alternately (A B, B A,
...), so a shared machine's load falls on both alike. Prints each run's inputs/s, the
ledger's CPU per input (its signature worker's included, without the worker's start-up,
when it has one), the main thread's, and the 1-core verify rate measured in that run; then
the medians. No asserts: a benchmark reports.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.kafka_broker import KafkaBroker  # noqa: E402

Run = tuple[float, int, int, float, float, float, float]


def run_once(checkout: Path, bootstrap: str, events: int) -> Run:
    """(inputs/s, CPU us/input, main thread us/input, 1-core verifies/s, commit thread
    us/input, DuckDB's own threads us/input, store MiB) of one run (-1: not printed)."""
    out = subprocess.run(
        [
            sys.executable,
            "bench/ledger_throughput.py",
            "--events",
            str(events),
            "--bootstrap",
            bootstrap,
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    ).stdout
    rate = re.search(r"= ([\d,]+) inputs/s", out)
    main = re.search(r"main thread\s+(\d+)", out)
    cpu = re.search(r"without it (\d+)", out) or re.search(r"ledger CPU\s+(\d+)", out)
    verify = [float(v.replace(",", "")) for v in re.findall(r"1 core\s+([\d,]+)/s", out)]
    if rate is None or main is None or cpu is None or not verify:
        raise RuntimeError(f"{checkout}: unexpected output:\n{out[-2000:]}")
    threads = {name: float(us) for name, us in re.findall(r"thread (\S+)\s+([\d.]+) us/input", out)}
    store = re.search(r"store size\s+([\d.]+) MiB", out)
    return (
        float(rate.group(1).replace(",", "")),
        int(cpu.group(1)),
        int(main.group(1)),
        statistics.mean(verify),
        next((us for name, us in threads.items() if name.startswith("ledger-commit")), -1.0),
        threads.get("native", -1.0),
        -1.0 if store is None else float(store.group(1)),
    )


def main() -> int:
    """Run the pairs and print each run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other checkout")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    checkouts = {"this": ROOT, "other": args.against.resolve()}
    runs: dict[str, list[Run]] = {k: [] for k in checkouts}
    with KafkaBroker() as broker:
        for i in range(args.pairs):
            order = list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]
            for name in order:
                row = run_once(checkouts[name], broker.bootstrap, args.events)
                runs[name].append(row)
                rate, cpu, main_us, verify, commit_us, native_us, store_mib = row
                print(
                    f"{time.strftime('%H:%M:%S')} {name:5} {rate:7,.0f} inputs/s"
                    f"  CPU {cpu} us/input"
                    f"  main thread {main_us} us/input  verify 1 core {verify:,.0f}/s"
                    f"  ratio {rate / verify:.2f}  commit thread {commit_us:.1f}"
                    f"  DuckDB threads {native_us:.1f} us/input  store {store_mib:.1f} MiB",
                    flush=True,
                )
    for name, rows in runs.items():
        print(
            f"{name:5} median {statistics.median(r[0] for r in rows):7,.0f} inputs/s, ratio to "
            f"1-core verify {statistics.median(r[0] / r[3] for r in rows):.3f}, CPU "
            f"{statistics.median(r[1] for r in rows):.0f} us/input, main thread "
            f"{statistics.median(r[2] for r in rows):.0f} us/input, commit thread "
            f"{statistics.median(r[4] for r in rows):.1f}, DuckDB threads "
            f"{statistics.median(r[5] for r in rows):.1f} us/input, store "
            f"{statistics.median(r[6] for r in rows):.1f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
