"""The producer compresses record batches (transport/kafka.py PRODUCER_COMPRESSION), on the
real broker: the topic stores fewer bytes than the envelopes, the ledger's consumer gets
every envelope back byte for byte, and log-append time still reaches it per record; batches
of a gzip producer (before issue 15's zstd) still read back."""

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
    PRODUCER_COMPRESSION,
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


# Kafka's record batch (magic 2): baseOffset int64, batchLength int32, partitionLeaderEpoch
# int32, magic int8, crc uint32, attributes int16 (bits 0-2: the codec).
_CODECS = {0: None, 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _stored_codecs(broker: KafkaBroker, topic: str) -> set[str | None]:
    """The codec of every record batch in the topic's log segments, read from the bytes."""
    codecs: set[str | None] = set()
    for segment in broker.log_dir.glob(f"{topic}-*/*.log"):
        data = segment.read_bytes()
        at = 0
        while at + 23 <= len(data):
            length = int.from_bytes(data[at + 8 : at + 12], "big")
            assert data[at + 16] == 2, "record batch magic"
            codecs.add(_CODECS[int.from_bytes(data[at + 21 : at + 23], "big") & 0x07])
            at += 12 + length
    return codecs


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
    scenario = build_scenario("kafka-codec", placements=4, nodes=2, events=60)
    items = scenario.keyed()
    raw = sum(len(envelope) for _, envelope in items)
    sizes: dict[str, int] = {}
    runs: tuple[tuple[str, dict[str, Any]], ...] = (
        ("default", {}),
        ("gzip", {"compression_type": "gzip"}),
        ("plain", {"compression_type": None}),
    )
    for name, extra in runs:
        topic = f"codec-{name}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_broker.bootstrap, topic, 1, config=EVENT_SOURCED_TOPIC_CONFIG)
        settings = KafkaSettings(bootstrap=kafka_broker.bootstrap, topic=topic)
        asyncio.run(_publish(settings, items, **extra))
        records = asyncio.run(_consume(settings, len(items)))
        # Every envelope back, byte for byte, in order, stamped by the log.
        assert [r.value for r in records] == [envelope for _, envelope in items]
        assert {r.timestamp_type for r in records} == {LOG_APPEND_TIME}
        sizes[name] = _stored_bytes(kafka_broker, topic)
        expected = PRODUCER_COMPRESSION if name == "default" else extra["compression_type"]
        assert _stored_codecs(kafka_broker, topic) == {expected}, name
    assert PRODUCER_COMPRESSION == "zstd"
    assert sizes["plain"] > raw  # uncompressed: the envelopes plus record overhead
    for name in ("default", "gzip"):  # signed JSON envelopes compress well
        assert sizes[name] < raw // 2, (name, sizes, raw)


def test_stored_bytes_reads_the_brokers_log_dir(kafka_broker: KafkaBroker) -> None:
    assert isinstance(kafka_broker.log_dir, Path) and kafka_broker.log_dir.is_dir()
    assert _stored_bytes(kafka_broker, f"absent-{uuid.uuid4().hex}") == 0
