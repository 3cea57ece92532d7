"""The Kafka topic of a run: reading it back and publishing to it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from transport.kafka import KafkaSettings, client_kwargs, publish_kafka, run_sync

__all__ = [
    "KAFKA_IO_TIMEOUT_S",
    "TopicMessage",
    "end_offsets",
    "publish",
    "read_topic",
]

KAFKA_IO_TIMEOUT_S: Final = 60.0
"""Longest one read of the whole topic or one publish may take."""


# ---- Kafka helpers ----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicMessage:
    """One message of the topic; ``timestamp_ms`` is the time its sender stated (the
    harness's topics keep ``CreateTime``, SPEC §6.6 ``arrival = "sender"``)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int = 0


async def _read_topic(settings: KafkaSettings, partitions: int) -> list[TopicMessage]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(
        **client_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(settings.topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[TopicMessage] = []
        async with asyncio.timeout(KAFKA_IO_TIMEOUT_S):
            while True:
                behind = [tp for tp in tps if await consumer.position(tp) < end[tp]]
                if not behind:
                    break
                batches = await consumer.getmany(*behind, timeout_ms=200)
                for tp, records in batches.items():
                    out.extend(
                        TopicMessage(
                            tp.partition, r.offset, r.key, r.value or b"", int(r.timestamp)
                        )
                        for r in records
                        if r.offset < end[tp]
                    )
        return sorted(out, key=lambda m: (m.partition, m.offset))
    finally:
        await consumer.stop()


def read_topic(settings: KafkaSettings, partitions: int) -> list[TopicMessage]:
    """Every message of the topic up to its end offsets now, by partition and offset."""
    return asyncio.run(_read_topic(settings, partitions))


async def _end_offsets(settings: KafkaSettings, partitions: int) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False)
    async with asyncio.timeout(KAFKA_IO_TIMEOUT_S):
        await consumer.start()
        try:
            tps = [TopicPartition(settings.topic, p) for p in range(partitions)]
            ends = await consumer.end_offsets(tps)
            return {tp.partition: int(offset) for tp, offset in ends.items()}
        finally:
            await consumer.stop()


def end_offsets(settings: KafkaSettings, partitions: int) -> dict[int, int]:
    """The log end offset of every partition now (how many messages each holds)."""
    return run_sync(_end_offsets(settings, partitions))


def publish(
    settings: KafkaSettings, items: Sequence[tuple[str, bytes]], stamps_ms: Sequence[int]
) -> None:
    """Send (placement, envelope) pairs in order, each stating its simulated time."""
    if items:
        asyncio.run(
            publish_kafka(
                settings, items, timeout_s=KAFKA_IO_TIMEOUT_S, timestamps_ms=list(stamps_ms)
            )
        )
