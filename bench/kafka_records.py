"""Benchmark: what one Kafka record per usage event costs against K events per record.

    .venv/bin/python bench/kafka_records.py [--events 100000] [--per-record 1,4,16]
        [--batch-bytes 16384,262144] [--partitions 8] [--placements 200] [--kafka HOST:PORT]
        [--json]

A design question, measured before it is built: would a shipper that sends a node's events
of a step as ONE Kafka record (a batch envelope) cut the CPU of the replay's shippers, the
broker and the ledger's consumer enough to be worth a protocol change? Real signed usage
envelopes (``devtools.builders.StreamWriter``) are produced as the shipper produces them
(``transport.kafka.send_batched``: idempotent, acks=all, zstd, producer batches filled by
the caller), K envelopes concatenated per record for K > 1, each K on its own topic, then
read back as the ledger reads them (``getmany`` over the assigned partitions, nothing
committed). For each K it prints the CPU per *event* of the producing process, the
consuming process and the broker (from /proc, all its threads), beside one Ed25519
verification measured in the same run (the check every event needs anyway) as a ratio.
``--batch-bytes``: the producer's ``max_batch_size`` values to try (each with every K):
what the client and the broker spend goes per batch, not per record.

Starts the project's broker (``devtools.kafka_broker``) unless ``--kafka`` is given; every
wait is bounded. No assertions: it is a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ed25519_limit import _verify_for  # noqa: E402
from bench.ledger_throughput import process_cpu_s  # noqa: E402
from devtools import builders  # noqa: E402
from devtools.kafka_broker import KafkaBroker  # noqa: E402
from gridledger.replay import cpu_seconds  # noqa: E402
from transport.kafka import (  # noqa: E402
    KafkaSettings,
    OutRecord,
    create_topic_async,
    make_consumer,
    make_producer,
    partitioner_for,
    send_batched,
)

SEND_STEP = 2_000  # records per send_batched call, as a replay step's shipping hands over
STAGE_TIMEOUT_S = 300.0  # each produce or consume phase of one K
POLL_MS = 500
MAX_RECORDS = 5_000


def envelopes(events: int, placements: int) -> list[tuple[bytes, bytes]]:
    """(key, envelope) of ``events`` signed usage events spread over ``placements``, each
    placement's events consecutive in its own stream, interleaved as nodes tick."""
    cast = builders.make_cast("bench-kafka-records")
    writers = []
    for p in range(placements):
        node = f"node-{p:04d}"
        spec = builders.gpu(node, 0)
        writers.append(
            (
                builders.StreamWriter(cast.node_key(node), f"pl-{p:05d}", node),
                [builders.sample(spec)],
            )
        )
    out: list[tuple[bytes, bytes]] = []
    start = 1_700_000_000_000
    for i in range(events):
        writer, samples = writers[i % placements]
        t = start + (i // placements) * 60_000
        out.append((writer.placement_id.encode(), writer.event(t, t + 60_000, samples)))
    return out


async def _produce(
    settings: KafkaSettings, items: list[tuple[bytes, bytes]], per_record: int, batch_bytes: int
) -> tuple[int, float, float]:
    """Records sent, CPU-s and wall-s of producing ``items`` K per record (consecutive
    events of one placement share a record, as one node's step would)."""
    by_key: dict[bytes, list[bytes]] = {}
    for key, envelope in items:
        by_key.setdefault(key, []).append(envelope)
    records: list[tuple[bytes, bytes]] = []
    for key, values in by_key.items():
        for i in range(0, len(values), per_record):
            records.append((key, b"".join(values[i : i + per_record])))
    producer = make_producer(settings, max_batch_size=batch_bytes)
    async with asyncio.timeout(STAGE_TIMEOUT_S):
        await producer.start()
        try:
            partition_of = await partitioner_for(producer, settings.topic)
            cpu0, wall0 = cpu_seconds(), time.perf_counter()
            for i in range(0, len(records), SEND_STEP):
                batch = [
                    OutRecord(key, value, partition_of(key), None)
                    for key, value in records[i : i + SEND_STEP]
                ]
                await send_batched(producer, settings.topic, batch)
            cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
        finally:
            await producer.stop()
    return len(records), cpu, wall


async def _consume(settings: KafkaSettings, records: int, partitions: int) -> tuple[int, float]:
    """Bytes read and CPU-s of reading ``records`` records back from the beginning."""
    from aiokafka.structs import TopicPartition

    consumer = make_consumer(settings)
    got = size = 0
    async with asyncio.timeout(STAGE_TIMEOUT_S):
        await consumer.start()
        try:
            tps = [TopicPartition(settings.topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                await consumer.seek_to_beginning(tp)
            cpu0 = cpu_seconds()
            while got < records:
                batches = await consumer.getmany(*tps, timeout_ms=POLL_MS, max_records=MAX_RECORDS)
                for messages in batches.values():
                    for message in messages:
                        got += 1
                        size += len(message.value)
            cpu = cpu_seconds() - cpu0
        finally:
            await consumer.stop()
    return size, cpu


async def one_k(
    bootstrap: str,
    broker_pid: int | None,
    items: list[tuple[bytes, bytes]],
    per_record: int,
    partitions: int,
    batch_bytes: int,
) -> dict[str, Any]:
    topic = f"bench-k{per_record}-{uuid.uuid4().hex[:8]}"
    await create_topic_async(bootstrap, topic, partitions, config={})
    settings = KafkaSettings(bootstrap=bootstrap, topic=topic)
    broker0 = process_cpu_s(broker_pid)
    records, produce_cpu, produce_wall = await _produce(settings, items, per_record, batch_bytes)
    broker1 = process_cpu_s(broker_pid)
    size, consume_cpu = await _consume(settings, records, partitions)
    broker2 = process_cpu_s(broker_pid)
    events = len(items)

    def us(seconds: float) -> float:
        return round(seconds / events * 1e6, 2)

    return {
        "per_record": per_record,
        "batch_bytes": batch_bytes,
        "records": records,
        "bytes": size,
        "produce_us_per_event": us(produce_cpu),
        "produce_wall_s": round(produce_wall, 2),
        "consume_us_per_event": us(consume_cpu),
        "broker_us_per_event": us(broker2 - broker0),
        "broker_produce_us_per_event": us(broker1 - broker0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--per-record", default="1,4,16", help="K values, comma-separated")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument(
        "--batch-bytes",
        default="16384,262144",
        help="the producer's max_batch_size values to try, comma-separated (aiokafka's "
        "default is 16384)",
    )
    parser.add_argument("--kafka", metavar="HOST:PORT")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ks = [int(k) for k in args.per_record.split(",")]
    sizes = [int(b) for b in args.batch_bytes.split(",")]

    verify_s = 2.0
    verify_us = verify_s / _verify_for(verify_s) * 1e6
    items = envelopes(args.events, args.placements)
    broker = None if args.kafka else KafkaBroker().start()
    try:
        bootstrap = args.kafka or broker.bootstrap  # type: ignore[union-attr]
        pid = None if broker is None else broker.pid
        # The first topic warms the broker's JIT: a throw-away round at the first K.
        warm = items[: args.events // 5]
        asyncio.run(one_k(bootstrap, pid, warm, ks[0], args.partitions, sizes[0]))
        rows = [
            asyncio.run(one_k(bootstrap, pid, items, k, args.partitions, size))
            for size in sizes
            for k in ks
        ]
    finally:
        if broker is not None:
            broker.stop()
    report = {"events": args.events, "ed25519_verify_us": round(verify_us, 2), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{args.events:,} signed usage events ({sum(len(v) for _, v in items) / len(items):.0f} "
        f"B each), {args.partitions} partitions; one Ed25519 verification here: "
        f"{verify_us:.1f} µs"
    )
    print(
        "batch bytes  K/record  records   produce µs/ev  consume µs/ev  broker µs/ev  "
        "(sum / verify)"
    )
    for row in rows:
        total = (
            row["produce_us_per_event"] + row["consume_us_per_event"] + row["broker_us_per_event"]
        )
        print(
            f"{row['batch_bytes']:>11,}  {row['per_record']:>8}  {row['records']:>7,}"
            f"  {row['produce_us_per_event']:>13.1f}"
            f"  {row['consume_us_per_event']:>13.1f}  {row['broker_us_per_event']:>12.1f}"
            f"  ({total:.1f} µs = {total / verify_us:.2f} verifications)"
        )


if __name__ == "__main__":
    main()
