"""``KafkaSource.poll`` builds each message's position from a per-partition prefix rather
than calling ``kafka_position`` once per message, and ``advance`` reads only the last item
of each source (issue 15: the consume loop's CPU per input). These check that every item
is still exactly what the transport's own functions say, against a plain consumer's view
of the same messages on a real broker: offsets past one digit, two partitions, a key that
is not UTF-8, a message with no key and one with no value."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka.structs import TopicPartition

from ledger.config import KafkaConfig
from ledger.consume import KafkaSource
from ledger.inputs import Item
from transport.kafka import KafkaSettings, create_topic, make_consumer, make_producer
from transport.positions import kafka_position, kafka_source

TIMEOUT_S = 60.0
PER_PARTITION = 23  # offsets 0..22: one and two digits


def test_poll_items_match_the_transport_positions(kafka_bootstrap: str) -> None:
    topic = f"poll-{uuid.uuid4().hex[:12]}"
    create_topic(kafka_bootstrap, topic, 2)
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    sent: list[tuple[int, bytes | None, bytes | None]] = []
    for partition in (0, 1):
        for i in range(PER_PARTITION):
            key: bytes | None = f"pl-{partition}-{i % 3}".encode()
            value: bytes | None = f"input {partition}/{i}".encode()
            if i == 5:
                key = b"\xff\xfepl"  # not UTF-8
            elif i == 6:
                key = None
            elif i == 7:
                value = None
            sent.append((partition, key, value))

    async def run() -> tuple[list[Item], dict[int, list[tuple[int, bytes | None, int]]], list]:
        producer = make_producer(settings, linger_ms=5)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, value=value, key=key, partition=partition)
                for partition, key, value in sent
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        # A plain consumer's view of the same messages: offset, key, timestamp.
        plain = make_consumer(settings)
        await plain.start()
        seen: dict[int, list[tuple[int, bytes | None, int]]] = {0: [], 1: []}
        try:
            tps = [TopicPartition(topic, p) for p in (0, 1)]
            plain.assign(tps)
            for tp in tps:
                await plain.seek_to_beginning(tp)
            async with asyncio.timeout(TIMEOUT_S):
                while sum(len(v) for v in seen.values()) < len(sent):  # bounded by timeout
                    got = await plain.getmany(*tps, timeout_ms=500)
                    for tp, messages in got.items():
                        seen[tp.partition] += [(m.offset, m.key, m.timestamp) for m in messages]
        finally:
            await plain.stop()
        source = KafkaSource(KafkaConfig(settings=settings), {}, max_poll_records=1000)
        items: list[Item] = []
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await source.start()
                while len(items) < len(sent):  # bounded by the timeout above
                    batch = await source.poll(1000, timeout_ms=500)
                    items.extend(batch)
                    source.advance(batch)
                lag = [(p.partition, p.next_offset, p.end_offset) for p in await source.lag()]
        finally:
            await source.stop()
        return items, seen, lag

    items, seen, lag = asyncio.run(run())
    values = {(p, i): v for i, (p, _, v) in enumerate(sent)}
    expected = []
    for partition in (0, 1):
        assert [offset for offset, _, _ in seen[partition]] == list(range(PER_PARTITION))
        for offset, key, timestamp in seen[partition]:
            value = values[(partition, partition * PER_PARTITION + offset)]
            expected.append(
                Item(
                    data=b"" if value is None else value,
                    position=kafka_position(topic, partition, offset),
                    stream_key=None if key is None else key.decode("utf-8", "replace"),
                    source=kafka_source(topic, partition),
                    next_position=str(offset + 1),
                    arrived_ms=timestamp,
                )
            )
    by_position = {item.position: item for item in items}
    assert len(by_position) == len(items) == len(expected)
    assert [by_position[e.position] for e in expected] == expected
    assert any(e.stream_key is not None and "\ufffd" in e.stream_key for e in expected)
    # Each partition's items in offset order, and advance moved to each partition's end.
    for partition in (0, 1):
        mine = [i.position for i in items if i.source == kafka_source(topic, partition)]
        assert mine == [kafka_position(topic, partition, o) for o in range(PER_PARTITION)]
    assert sorted(lag) == [(0, PER_PARTITION, PER_PARTITION), (1, PER_PARTITION, PER_PARTITION)]
