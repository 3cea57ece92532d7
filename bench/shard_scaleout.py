"""Scale-out of ledger shards as separate processes, beside the machine's own scale-out.

    .venv/bin/python bench/shard_scaleout.py [--events 40000] [--placements 200]
        [--partitions 4] [--batch 5000] [--brokers 1|3]

Publishes N signed usage events over many placements to a fresh topic (single broker,
or the three-node cluster with RF 3 and min.insync.replicas=2), then folds it twice,
each time from offset 0 into fresh DuckDB files:

* one shard process owning every partition;
* two shard processes at once (``shard = 0/1, shards = 2``), each with its own store:
  the aggregate rate is all inputs over the wall time from the common start to the
  last shard caught up.

Each ledger runs in a process of its own (``multiprocessing`` spawn), connects and
assigns its partitions first, then all start folding together (a barrier). In the same
run the machine's limit is measured: Ed25519 verification on one core and in two
processes (``bench/ed25519_limit.py``'s loop), before and after. The figure to compare
is the shards' speed-up (two / one) against the verify limit's (two processes / one
core): on two cores shared by the Kafka broker(s) and both shards, that is the most two
shards can gain. No asserts: a benchmark reports, the tests judge.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ed25519_limit import _verify_for  # noqa: E402
from bench.ledger_throughput import generate, publish  # noqa: E402
from devtools.kafka_broker import KafkaBroker  # noqa: E402
from devtools.kafka_cluster import KafkaCluster  # noqa: E402
from transport.kafka import REPLICATION_FACTOR, create_topic, replicated_topic_config  # noqa: E402

T0_MS = 1_767_225_600_000


def _shard_worker(
    bootstrap: str,
    topic: str,
    seed_text: str,
    db: str,
    shard: int,
    shards: int,
    batch: int,
    barrier: Any,
    results: Any,
) -> None:
    """One ledger shard in this process: connect, wait at the barrier, fold to the end."""
    sys.path.insert(0, str(ROOT))
    from devtools.builders import make_cast
    from ledger.config import KafkaConfig
    from ledger.service import KafkaLedgerService, fixed_clock
    from ledger.store import Store
    from transport.kafka import KafkaSettings

    key = make_cast(seed_text).ledger

    async def go() -> tuple[float, float, int, float]:
        store = Store(Path(db), ledger_public_key=key.public_key)
        kafka = KafkaConfig(
            settings=KafkaSettings(bootstrap=bootstrap, topic=topic), shard=shard, shards=shards
        )
        service = KafkaLedgerService(
            store, key, kafka, clock=fixed_clock(T0_MS), batch_max_records=batch, close=False
        )
        await service.start()
        try:
            await asyncio.to_thread(barrier.wait, 120)
            started = time.time()
            cpu_started = time.process_time()  # every thread of this process
            consumed = 0
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                report = await service.step(200)
                if report is not None:
                    consumed += report.inputs
                elif await service.source.caught_up():
                    break
            return started, time.time(), consumed, time.process_time() - cpu_started
        finally:
            await service.stop()
            service.close()

    started, ended, consumed, cpu_s = asyncio.run(go())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results.put((shard, started, ended, consumed, peak, cpu_s))


def run_shards(
    bootstrap: str, topic: str, shards: int, batch: int, tmp: Path
) -> tuple[float, int, list[tuple[int, float, int, float, float]]]:
    """Fold the topic with `shards` processes at once: (wall s, inputs, per shard: shard,
    seconds, inputs, peak RSS MiB, CPU seconds of all its threads)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(shards)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_shard_worker,
            args=(
                bootstrap,
                topic,
                "bench",
                str(tmp / f"shards{shards}-{s}.duckdb"),
                s,
                shards,
                batch,
                barrier,
                results,
            ),
        )
        for s in range(shards)
    ]
    for proc in procs:
        proc.start()
    rows = [results.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    start = min(r[1] for r in rows)
    end = max(r[2] for r in rows)
    per = [(r[0], r[2] - r[1], r[3], r[4], r[5]) for r in sorted(rows)]
    return end - start, sum(r[3] for r in rows), per


def limits(seconds: float) -> tuple[float, float]:
    """Ed25519 verify/s on one core and in two processes."""
    one = _verify_for(seconds) / seconds
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_verify_for, [0.05, 0.05])  # both workers up and warm before timing
        started = time.perf_counter()
        counts = pool.map(_verify_for, [seconds, seconds])
        two = sum(counts) / (time.perf_counter() - started)
    return one, two


def main() -> int:
    """Run the benchmark and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--brokers", choices=("1", "3"), default="1")
    parser.add_argument("--limit-seconds", type=float, default=3.0)
    args = parser.parse_args()

    cast, items = generate(args.events, args.placements)
    del cast
    print(
        f"inputs {len(items)} ({args.placements} placements, {args.partitions} partitions, "
        f"batch {args.batch}, {args.brokers} broker(s)); cores {multiprocessing.cpu_count()}"
    )
    one_before, two_before = limits(args.limit_seconds)
    print(f"limit before: verify 1 core {one_before:,.0f}/s, 2 processes {two_before:,.0f}/s")
    launcher: KafkaBroker | KafkaCluster = KafkaBroker() if args.brokers == "1" else KafkaCluster()
    with launcher:
        bootstrap = launcher.bootstrap
        replication = 1 if args.brokers == "1" else REPLICATION_FACTOR
        topic = f"bench-shards.{uuid.uuid4().hex[:8]}"
        config = None if replication == 1 else replicated_topic_config(replication)
        create_topic(
            bootstrap, topic, args.partitions, replication_factor=replication, config=config
        )
        t = time.perf_counter()
        asyncio.run(publish(bootstrap, topic, items))
        print(f"publish {len(items) / (time.perf_counter() - t):,.0f}/s (acks=all)")
        with tempfile.TemporaryDirectory(prefix="shard-bench-") as tmp:
            one_s, one_n, one_per = run_shards(bootstrap, topic, 1, args.batch, Path(tmp))
            two_s, two_n, two_per = run_shards(bootstrap, topic, 2, args.batch, Path(tmp))
    one_after, two_after = limits(args.limit_seconds)
    print(f"limit after:  verify 1 core {one_after:,.0f}/s, 2 processes {two_after:,.0f}/s")
    one_rate, two_rate = one_n / one_s, two_n / two_s
    limit_one = (one_before + one_after) / 2
    limit_two = (two_before + two_after) / 2
    print(f"1 shard process   {one_n} inputs in {one_s:.2f} s = {one_rate:,.0f} inputs/s")
    for shard, secs, n, peak, cpu in one_per:
        print(
            f"    shard {shard}: {n} inputs in {secs:.2f} s, peak RSS {peak:.0f} MiB, "
            f"CPU {cpu / max(n, 1) * 1e6:.0f} us/input"
        )
    print(f"2 shard processes {two_n} inputs in {two_s:.2f} s = {two_rate:,.0f} inputs/s")
    for shard, secs, n, peak, cpu in two_per:
        print(
            f"    shard {shard}: {n} inputs in {secs:.2f} s, peak RSS {peak:.0f} MiB, "
            f"CPU {cpu / max(n, 1) * 1e6:.0f} us/input"
        )
    print(f"ratio 1 shard / verify 1 core        {one_rate / limit_one:.2f}")
    print(f"ratio 2 shards / verify 2 processes  {two_rate / limit_two:.2f}")
    print(f"speed-up 2 shards / 1 shard          {two_rate / one_rate:.2f}")
    print(f"limit's speed-up 2 processes / 1 core {limit_two / limit_one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
