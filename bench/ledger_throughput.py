"""Ledger throughput on the real Kafka broker, beside the machine's Ed25519 verify limit.

    .venv/bin/python bench/ledger_throughput.py [--events 50000] [--placements 200]
        [--partitions 2] [--batch 5000] [--bootstrap HOST:PORT]
        [--brokers 1|3|both] [--shards N] [--crypto worker|threads]

Pre-generates N signed usage events over many placements, publishes them (and the
terms) to a fresh topic, then runs one ledger shard over a fresh DuckDB file until it
has consumed everything, and reports events/s end to end. In the same run it measures
pynacl Ed25519 verification on one core and prints the ratio, plus peak RSS. No asserts:
a benchmark reports, the tests judge.

``--brokers 3`` runs it on a three-node cluster (``devtools.kafka_cluster``: the topic
with replication factor 3 and ``min.insync.replicas=2``, the producer ``acks=all`` as
always, so every acknowledged record is on two brokers); ``--brokers both`` runs the
single broker and then the cluster with the same signed events, one after the other, and
measures the limit before and after.

``--shards N`` (single broker or ``--bootstrap``; use ``--partitions`` >= N, e.g. 4 for
2 shards): the same published inputs are folded from offset 0 by one ledger process, then
by N shard processes at once, each ``shard = i, shards = N`` with its own store — what
``gridledger ledger supervise --shards N`` runs, started here at a barrier after each has
connected and assigned its partitions (``bench/shard_scaleout.py``), so process start-up
is not counted. The aggregate is all inputs over the wall time from the common start to
the last shard caught up. Beside it: Ed25519 verify on one core and in two processes,
measured in the same run before and after, and the ratios to both.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import resource
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms  # noqa: E402
from devtools.kafka_broker import KafkaBroker  # noqa: E402
from devtools.kafka_cluster import KafkaCluster  # noqa: E402
from ledger.config import KafkaConfig  # noqa: E402
from ledger.service import KafkaLedgerService, fixed_clock  # noqa: E402
from ledger.store import Store  # noqa: E402
from proto.envelope import decode_envelope  # noqa: E402
from proto.keys import SigningKey, verify  # noqa: E402
from transport.kafka import (  # noqa: E402
    REPLICATION_FACTOR,
    KafkaSettings,
    create_topic,
    make_producer,
    replicated_topic_config,
)

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000


def generate(events: int, placements: int) -> tuple[object, list[tuple[str, bytes]]]:
    """Terms for every placement, then usage events round-robin over placements."""
    cast = make_cast("bench")
    per = -(-events // placements)
    window_ms = (per + 1) * INTERVAL_MS
    items: list[tuple[str, bytes]] = []
    writers = []
    for i in range(placements):
        pid = f"bench-{i:05d}"
        g = gpu(f"{pid}-n0", 0)
        terms = make_terms(cast, pid, [g], T0_MS, T0_MS + window_ms)
        items.append((pid, signed_terms(cast, terms)))
        writers.append((pid, StreamWriter(cast.node_key(g.node_id), pid, g.node_id), g))
    produced = 0
    for e in range(per):
        for pid, writer, g in writers:
            if produced == events:
                break
            start = T0_MS + e * INTERVAL_MS
            items.append((pid, writer.event(start, start + INTERVAL_MS, [sample(g)])))
            produced += 1
    return cast, items


async def publish(bootstrap: str, topic: str, items: list[tuple[str, bytes]]) -> None:
    """One idempotent producer, everything in flight, every ack awaited."""
    producer = make_producer(KafkaSettings(bootstrap=bootstrap, topic=topic), linger_ms=20)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value=envelope, key=pid.encode()) for pid, envelope in items
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


# CPU seconds per Ed25519 verification, as last measured by ``verify_rate``.
VERIFY_CPU_S: list[float] = []
# CPU seconds of the main thread (event loop, Kafka client, fold, store calls) over each
# ``run_ledger`` consume loop: no crypto threads (only the signatures checked inline, such
# as terms'), no DuckDB threads, no GIL waits, so it moves less with the load of a shared
# machine than the process figure.
MAIN_THREAD_CPU_S: list[float] = []
# CPU seconds of each group of the ledger process's threads over each ``run_ledger``
# consume loop (Linux /proc): "main", a Python thread's name (numbers stripped: the
# commit thread, the worker's queue threads), "native" (threads Python did not start:
# DuckDB's own).
THREAD_CPU_S: list[dict[str, float]] = []
# CPU seconds of the signature worker when it answered its first job (its start-up).
WORKER_START_CPU_S: list[float] = []
# ``--crypto``: the service's signature checks in its worker process (True) or on threads.
CRYPTO_WORKER: list[bool] = [True]


def verify_rate(seconds: float = 2.0) -> float:
    """Ed25519 verifications per second on one core (pynacl), ~400-byte messages; the
    CPU time per verification is kept in ``VERIFY_CPU_S``."""
    key = SigningKey.from_seed_text("bench", "verify")
    message = b"x" * 400
    signature = key.sign(message)
    public = key.public_key
    count = 0
    started = time.perf_counter()
    started_cpu = time.thread_time()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(500):
            verify(public, message, signature)
        count += 500
    VERIFY_CPU_S.append((time.thread_time() - started_cpu) / count)
    return count / (time.perf_counter() - started)


def signatures_of(items: list[tuple[str, bytes]]) -> int:
    """How many signatures the ledger verifies to fold ``items`` (each one once)."""
    return sum(len(decode_envelope(envelope).signatures) for _, envelope in items)


async def run_ledger(
    bootstrap: str,
    topic: str,
    cast: object,
    db: Path,
    batch: int,
    total: int,
    profile: Path | None = None,
) -> tuple[float, int]:
    """Fold every message of the topic into a fresh store; (seconds, inputs).

    ``profile``: run the consume loop under cProfile and write its stats there."""
    key = cast.ledger  # type: ignore[attr-defined]
    store = Store(db, ledger_public_key=key.public_key)
    kafka = KafkaConfig(settings=KafkaSettings(bootstrap=bootstrap, topic=topic))
    # The clock stays inside the windows: no closes, pure ingest.
    service = KafkaLedgerService(
        store,
        key,
        kafka,
        clock=fixed_clock(T0_MS),
        batch_max_records=batch,
        close=False,
        crypto_worker=CRYPTO_WORKER[0],
    )
    await service.start()
    worker = service.ingestor.crypto_worker
    if worker is not None:
        # The worker's start-up (a spawned interpreter importing pynacl, and this script
        # again as __mp_main__), once per ledger process: reported apart from the run.
        WORKER_START_CPU_S.append(process_cpu_s(worker.pid()))
    consumed = 0
    profiler = None if profile is None else cProfile.Profile()
    try:
        threads_before = _thread_cpu()
        started = time.perf_counter()
        started_cpu = time.thread_time()
        deadline = time.monotonic() + 3600
        if profiler is not None:
            profiler.enable()
        while consumed < total and time.monotonic() < deadline:
            report = await service.step(200)
            if report is not None:
                consumed += report.inputs
        seconds = time.perf_counter() - started
        MAIN_THREAD_CPU_S.append(time.thread_time() - started_cpu)
        THREAD_CPU_S.append(_thread_groups(threads_before, _thread_cpu()))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        await service.stop()
        service.close()
    return seconds, consumed


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) a running process has used (Linux /proc);
    0 without one."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        cpu[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def _thread_groups(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds between ``before`` and ``after`` per group of threads (THREAD_CPU_S)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().native_id
    groups: dict[str, float] = {}
    for tid, cpu in after.items():
        if tid == main_id:
            group = "main"
        elif tid in names:
            group = names[tid].rstrip("0123456789_-") or "python"
        else:
            group = "native"
        groups[group] = groups.get(group, 0.0) + cpu - before.get(tid, 0.0)
    return groups


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's reaped children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    label: str,
    bootstrap: str,
    replication: int,
    cast: object,
    items: list[tuple[str, bytes]],
    args: argparse.Namespace,
) -> float:
    """Publish `items` to a fresh topic on `bootstrap`, fold it; print and return inputs/s."""
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    config = None if replication == 1 else replicated_topic_config(replication)
    create_topic(bootstrap, topic, args.partitions, replication_factor=replication, config=config)
    t = time.perf_counter()
    asyncio.run(publish(bootstrap, topic, items))
    publish_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="ledger-bench-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        cpu = time.process_time()
        children = _children_cpu()
        seconds, consumed = asyncio.run(
            run_ledger(bootstrap, topic, cast, db, args.batch, len(items), args.profile)
        )
        cpu_s = time.process_time() - cpu  # this process: the ledger, no broker
        # The ledger's signature worker process, reaped when the service closes (the
        # broker, still running, is not in it).
        worker_s = _children_cpu() - children
        db_bytes = db.stat().st_size
    rate = consumed / seconds
    verify_cpu = sum(VERIFY_CPU_S) / max(len(VERIFY_CPU_S), 1)
    signature_cpu = signatures_of(items) * verify_cpu
    print(f"--- {label}: topic RF {replication}, {args.partitions} partitions")
    print(f"publish to Kafka        {publish_s:.2f} s ({len(items) / publish_s:,.0f}/s, acks=all)")
    print(f"ledger end to end       {seconds:.2f} s = {rate:,.0f} inputs/s ({consumed} inputs)")
    print(
        f"ledger CPU              {cpu_s / max(consumed, 1) * 1e6:.0f} us/input "
        "(this process, all its threads; start and stop included)"
    )
    print(
        f"  of which signatures    {signature_cpu / max(consumed, 1) * 1e6:.0f} us/input "
        f"(signatures x {verify_cpu * 1e6:.1f} us CPU per verify, measured before); the rest "
        f"{(cpu_s + worker_s - signature_cpu) / max(consumed, 1) * 1e6:.0f} us/input "
        "(ledger + worker)"
    )
    print(
        f"  worker process         {worker_s / max(consumed, 1) * 1e6:.0f} us/input "
        f"(the signature worker); ledger + worker {(cpu_s + worker_s) / max(consumed, 1) * 1e6:.0f}"
        " us/input"
    )
    if WORKER_START_CPU_S:
        start_s = WORKER_START_CPU_S[-1]
        print(
            f"  worker start-up        {start_s:.2f} s CPU; ledger + worker without it "
            f"{(cpu_s + worker_s - start_s) / max(consumed, 1) * 1e6:.0f} us/input"
        )
    print(
        f"  main thread            {MAIN_THREAD_CPU_S[-1] / max(consumed, 1) * 1e6:.0f} us/input "
        "(the consume loop: Kafka client, fold, store calls, signatures checked inline)"
    )
    for group, group_s in sorted(THREAD_CPU_S[-1].items(), key=lambda kv: -kv[1]):
        print(f"  thread {group:18} {group_s / max(consumed, 1) * 1e6:.1f} us/input")
    print(f"store size              {db_bytes / 2**20:.1f} MiB")
    return rate


def measure_shards(args: argparse.Namespace) -> int:
    """``--shards N``: one process, then N shard processes, over the same published inputs."""
    import multiprocessing

    from bench.shard_scaleout import limits, run_shards

    if not 1 <= args.shards <= args.partitions:
        print(f"--shards {args.shards}: need 1..--partitions ({args.partitions})")
        return 2
    t = time.perf_counter()
    cast, items = generate(args.events, args.placements)
    generate_s = time.perf_counter() - t
    print(
        f"inputs                  {len(items)} ({args.placements} placements, "
        f"{args.partitions} partitions, batch {args.batch}, {args.shards} shards); "
        f"cores {multiprocessing.cpu_count()}"
    )
    print(f"generate (sign)         {generate_s:.2f} s")
    one_before, two_before = limits(2.0)
    print(f"limit before  verify 1 core {one_before:,.0f}/s, 2 processes {two_before:,.0f}/s")

    def fold(
        bootstrap: str,
    ) -> tuple[float, float, float, list[tuple[int, float, int, float, float]]]:
        topic = f"bench.{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        t = time.perf_counter()
        asyncio.run(publish(bootstrap, topic, items))
        publish_s = time.perf_counter() - t
        print(
            f"publish to Kafka        {publish_s:.2f} s ({len(items) / publish_s:,.0f}/s, acks=all)"
        )
        with tempfile.TemporaryDirectory(prefix="ledger-bench-") as tmp:
            cpu = time.process_time()
            one_s, one_n = asyncio.run(
                run_ledger(bootstrap, topic, cast, Path(tmp) / "one.duckdb", args.batch, len(items))
            )
            one_cpu = time.process_time() - cpu  # this process: the ledger, no broker
            n_s, n_n, per = run_shards(bootstrap, topic, args.shards, args.batch, Path(tmp))
        if one_n != len(items) or n_n != len(items):
            print(f"WARNING: folded {one_n} / {n_n} of {len(items)} inputs")
        return one_n / one_s, one_cpu / max(one_n, 1), n_n / n_s, per

    if args.bootstrap is not None:
        one_rate, one_cpu, n_rate, per = fold(args.bootstrap)
    else:
        with KafkaBroker() as broker:
            one_rate, one_cpu, n_rate, per = fold(broker.bootstrap)
    one_after, two_after = limits(2.0)
    print(f"limit after   verify 1 core {one_after:,.0f}/s, 2 processes {two_after:,.0f}/s")
    limit_one = (one_before + one_after) / 2
    limit_two = (two_before + two_after) / 2
    print(
        f"1 ledger process        {one_rate:,.0f} inputs/s, CPU {one_cpu * 1e6:.0f} us/input "
        "(all its threads)"
    )
    print(f"{args.shards} shard processes      {n_rate:,.0f} inputs/s (aggregate)")
    for shard, secs, n, peak, cpu_s in per:
        print(
            f"    shard {shard}: {n} inputs in {secs:.2f} s, peak RSS {peak:.0f} MiB, "
            f"CPU {cpu_s / max(n, 1) * 1e6:.0f} us/input"
        )
    print(f"ratio 1 process / verify 1 core       {one_rate / limit_one:.2f}")
    print(f"ratio {args.shards} shards / verify 1 core        {n_rate / limit_one:.2f}")
    print(f"ratio {args.shards} shards / verify 2 processes   {n_rate / limit_two:.2f}")
    print(f"speed-up {args.shards} shards / 1 process         {n_rate / one_rate:.2f}")
    print(f"limit's speed-up 2 processes / 1 core {limit_two / limit_one:.2f}")
    return 0


def main() -> int:
    """Run the benchmark and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of starting one")
    parser.add_argument(
        "--brokers", choices=("1", "3", "both"), default="1", help="single broker, cluster, or both"
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="also fold with N shard processes at once (single broker); ratios to both limits",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="FILE",
        help="run the ledger's consume loop under cProfile and write the stats to FILE",
    )
    parser.add_argument(
        "--crypto",
        choices=("worker", "threads"),
        default="worker",
        help="the ledger's signature checks in its worker process (default) or on threads",
    )
    args = parser.parse_args()
    CRYPTO_WORKER[0] = args.crypto == "worker"
    if args.shards is not None:
        return measure_shards(args)

    t = time.perf_counter()
    cast, items = generate(args.events, args.placements)
    generate_s = time.perf_counter() - t
    print(
        f"inputs                  {len(items)} ({args.placements} placements, "
        f"{args.partitions} partitions, batch {args.batch})"
    )
    print(f"generate (sign)         {generate_s:.2f} s")
    limit_before = verify_rate()
    print(f"Ed25519 verify, 1 core  {limit_before:,.0f}/s (pynacl, before)")
    rates: dict[str, float] = {}
    if args.bootstrap is not None:
        rates["given broker"] = measure("given broker", args.bootstrap, 1, cast, items, args)
    else:
        if args.brokers in ("1", "both"):
            with KafkaBroker() as broker:
                rates["1 broker"] = measure("1 broker", broker.bootstrap, 1, cast, items, args)
        if args.brokers in ("3", "both"):
            with KafkaCluster() as cluster:
                rates["3 brokers"] = measure(
                    "3 brokers", cluster.bootstrap, REPLICATION_FACTOR, cast, items, args
                )
    limit_after = verify_rate()
    limit = (limit_before + limit_after) / 2
    print(f"Ed25519 verify, 1 core  {limit_after:,.0f}/s (pynacl, after)")
    for label, rate in rates.items():
        print(f"ratio ledger / verify   {rate / limit:.2f} ({label})")
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (this process) {peak_rss_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
