"""``transport.kafka.send_batched`` on the real broker: the records of one partition
arrive in the order given across many producer batches (a record larger than a batch
included), each record's acknowledgement is its own batch's, and a stated timestamp
reaches the consumer as the producer's."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from test_meter_kafka import consume_records

from transport.kafka import (
    EVENT_SOURCED_TOPIC_CONFIG,
    LOG_APPEND_TIME,
    PRODUCER_BATCH_BYTES,
    SIMULATION_TOPIC_CONFIG,
    KafkaSettings,
    OutRecord,
    create_topic,
    make_producer,
    partitioner_for,
    send_batched,
)

PARTITIONS = 4
TIMEOUT_S = 60.0


async def _produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes, int | None]]) -> Any:
    producer = make_producer(KafkaSettings(bootstrap=bootstrap, topic=topic), linger_ms=5)
    async with asyncio.timeout(TIMEOUT_S):
        await producer.start()
        try:
            partition_of = await partitioner_for(producer, topic)
            records = [OutRecord(k, v, partition_of(k), t) for k, v, t in items]
            acks = await send_batched(producer, topic, records)
        finally:
            await producer.stop()
    return records, acks


@pytest.mark.parametrize("stated", [False, True])
def test_send_batched_keeps_each_partitions_order_and_acks_per_batch(
    kafka_bootstrap: str, tmp_topic: Callable[..., str], stated: bool
) -> None:
    """On the event-sourced topic (log-append time) each record's acknowledgement carries
    the time the broker stamped on its batch; on a simulation topic (CreateTime) the
    consumer sees the time the record stated."""
    topic = tmp_topic(PARTITIONS, create=False)
    config = SIMULATION_TOPIC_CONFIG if stated else EVENT_SOURCED_TOPIC_CONFIG
    create_topic(kafka_bootstrap, topic, PARTITIONS, config=config)
    items: list[tuple[bytes, bytes, int | None]] = []
    for i in range(3_000):
        key = f"placement-{i % 7}".encode()
        # one record larger than a producer batch
        size = PRODUCER_BATCH_BYTES + 10_000 if i == 1_234 else 700
        items.append((key, f"{i:06d}".encode().ljust(size, b"x"), 1_700_000_000_000 + i))
    records, acks = asyncio.run(_produce(kafka_bootstrap, topic, items))
    assert len(acks) == len(records)

    consumed = asyncio.run(consume_records(kafka_bootstrap, topic, PARTITIONS))
    assert sorted(r.value for r in consumed) == sorted(v for _, v, _ in items)  # each once
    by_partition: dict[int, list[bytes]] = defaultdict(list)
    offset_of: dict[bytes, tuple[int, int]] = {}
    log_append: dict[bytes, int] = {}
    for r in consumed:
        by_partition[r.partition].append(r.value)
        offset_of[r.value] = (r.partition, r.offset)
        if stated:
            assert r.timestamp_type == 0
            assert r.timestamp == 1_700_000_000_000 + int(r.value[:6])
        else:
            assert r.timestamp_type == LOG_APPEND_TIME
            log_append[r.value] = r.timestamp
    for partition in range(PARTITIONS):
        given = [rec.value for rec in records if rec.partition == partition]
        assert by_partition[partition] == given  # the order given, partition by partition

    batch_offsets = set()
    for record, ack in zip(records, acks, strict=True):
        partition, offset = offset_of[record.value]
        assert ack.partition == partition == record.partition
        assert ack.offset <= offset  # the base offset of the batch that carried it
        if not stated:  # the broker's time for the batch, as _log_append_ms reads it
            assert ack.timestamp_type == LOG_APPEND_TIME
            assert ack.timestamp == log_append[record.value]
        batch_offsets.add((partition, ack.offset))
    # Several batches (at most PRODUCER_BATCH_BYTES each), far fewer than records.
    assert 3_000 * 700 // PRODUCER_BATCH_BYTES <= len(batch_offsets) <= 3_000 // 100
    # The big record went in a batch of its own.
    big = records[1_234]
    assert offset_of[big.value][1] == acks[1_234].offset
