"""The producer compresses record batches (transport/kafka.py PRODUCER_COMPRESSION), on the
real broker: the topic stores fewer bytes than the envelopes, the ledger's consumer gets
every envelope back byte for byte, and log-append time still reaches it per record."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from test_ledger_scenario import build_scenario

from devtools.kafka_broker import KafkaBroker
from transport.kafka import (
    EVENT_SOURCED_TOPIC_CONFIG,
    LOG_APPEND_TIME,
    KafkaSettings,
    create_topic,
    make_consumer,
    make_producer,
    publish_kafka,
)

TIMEOUT_S = 60.0


def _stored_bytes(broker: KafkaBroker, topic: str) -> int:
    """Bytes of the topic's log segments on the broker's disk."""
    return sum(f.stat().st_size for f in broker.log_dir.glob(f"{topic}-*/*.log"))


async def _publish(settings: KafkaSettings, items: list[tuple[str, bytes]], **extra: Any) -> None:
    producer = make_producer(settings, linger_ms=20, **extra)
    await producer.start()
    try:
        await publish_kafka(settings, items, producer=producer, timeout_s=TIMEOUT_S)
    finally:
        await producer.stop()


async def _consume(settings: KafkaSettings, count: int) -> list[Any]:
    from aiokafka.structs import TopicPartition

    consumer = make_consumer(settings)
    await consumer.start()
    try:
        tp = TopicPartition(settings.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[Any] = []
        async with asyncio.timeout(TIMEOUT_S):
            while len(got) < count:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=1000)
                got += batch.get(tp, [])
        return got
    finally:
        await consumer.stop()


def test_batches_are_stored_compressed_and_read_back_exactly(kafka_broker: KafkaBroker) -> None:
    scenario = build_scenario("kafka-gzip", placements=4, nodes=2, events=60)
    items = scenario.keyed()
    raw = sum(len(envelope) for _, envelope in items)
    sizes: dict[str, int] = {}
    for name, extra in (("gzip", {}), ("plain", {"compression_type": None})):
        topic = f"gzip-{name}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_broker.bootstrap, topic, 1, config=EVENT_SOURCED_TOPIC_CONFIG)
        settings = KafkaSettings(bootstrap=kafka_broker.bootstrap, topic=topic)
        asyncio.run(_publish(settings, items, **extra))
        records = asyncio.run(_consume(settings, len(items)))
        # Every envelope back, byte for byte, in order, stamped by the log.
        assert [r.value for r in records] == [envelope for _, envelope in items]
        assert {r.timestamp_type for r in records} == {LOG_APPEND_TIME}
        sizes[name] = _stored_bytes(kafka_broker, topic)
    assert sizes["plain"] > raw  # uncompressed: the envelopes plus record overhead
    assert sizes["gzip"] < raw // 2, (sizes, raw)  # signed JSON envelopes compress well


def test_stored_bytes_reads_the_brokers_log_dir(kafka_broker: KafkaBroker) -> None:
    assert isinstance(kafka_broker.log_dir, Path) and kafka_broker.log_dir.is_dir()
    assert _stored_bytes(kafka_broker, f"absent-{uuid.uuid4().hex}") == 0
