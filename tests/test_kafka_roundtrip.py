"""Round trips through the real Kafka 4.1.1 broker with aiokafka.

The delivery pattern of the ledger, in miniature: an idempotent producer (acks=all) sends
keyed records; a consumer with manual partition assignment writes its results and the
next offsets in one DuckDB transaction, and a new consumer resumes from the stored
offsets. Every record is consumed exactly once and each key's order is kept.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from devtools.kafka_broker import KafkaBroker

PHASE_TIMEOUT_S = 60.0


def _messages(n_keys: int, per_key: int, tag: str = "") -> list[tuple[bytes, bytes]]:
    """Keys interleaved round-robin so every partition sees many keys mixed together."""
    out = []
    for seq in range(per_key):
        for k in range(n_keys):
            key = f"placement-{k:03d}"
            value = json.dumps({"key": key, "seq": seq, "tag": tag}, sort_keys=True)
            out.append((key.encode(), value.encode()))
    return out


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        request_timeout_ms=30000,
    )


async def _send_all(producer: AIOKafkaProducer, topic: str, msgs: list[tuple[bytes, bytes]]) -> int:
    """Send in order and wait for every ack; return how many were acked."""
    futures = [await producer.send(topic, key=key, value=value) for key, value in msgs]
    acked = await asyncio.gather(*futures)
    return len(acked)


async def _produce(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes]]) -> int:
    producer = _producer(bootstrap)
    await producer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            return await _send_all(producer, topic, msgs)
    finally:
        await producer.stop()


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    # No group: offsets live outside Kafka. "none": an unknown offset is an error, never
    # a silent jump to the beginning or the end.
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_poll_records=37,
    )


# --- exactly-once resume with offsets stored beside the results --------------------------


def _open_store(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE IF NOT EXISTS consumed ("
        " part INTEGER, off BIGINT, key VARCHAR, seq INTEGER, consumer VARCHAR)"
    )
    con.execute("CREATE TABLE IF NOT EXISTS offsets (part INTEGER PRIMARY KEY, next BIGINT)")
    return con


async def _consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    store: Path,
    name: str,
    *,
    stop_after: int | None,
) -> dict[str, Any]:
    """Consume from the stored offsets, one DuckDB transaction per fetched batch.

    With `stop_after`, stop once that many records were committed, and "crash" on the
    next batch: its rows are written but the transaction is rolled back, as if the process
    died before the commit. Without it, run until the stored offsets reach the end.
    """
    con = _open_store(store)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    stored = dict(con.execute("SELECT part, next FROM offsets").fetchall())
    consumer = _consumer(bootstrap)
    await consumer.start()
    committed = 0
    rolled_back: list[tuple[int, int]] = []
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, stored.get(tp.partition, 0))
        end = await consumer.end_offsets(tps)
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while True:
                if stop_after is None:
                    done = dict(con.execute("SELECT part, next FROM offsets").fetchall())
                    if all(done.get(tp.partition, 0) >= end[tp] for tp in tps):
                        break
                batches = await consumer.getmany(timeout_ms=1000)
                for tp, records in batches.items():
                    if not records:
                        continue
                    rows = []
                    for rec in records:
                        body = json.loads(rec.value)
                        assert rec.key.decode() == body["key"]
                        rows.append((tp.partition, rec.offset, body["key"], body["seq"], name))
                    con.begin()
                    con.executemany("INSERT INTO consumed VALUES (?, ?, ?, ?, ?)", rows)
                    con.execute(
                        "INSERT INTO offsets VALUES (?, ?) ON CONFLICT (part) DO UPDATE"
                        " SET next = excluded.next",
                        [tp.partition, records[-1].offset + 1],
                    )
                    if stop_after is not None and committed >= stop_after:
                        con.rollback()  # the crash: written, never committed
                        rolled_back = [(tp.partition, rec.offset) for rec in records]
                        return {"committed": committed, "rolled_back": rolled_back}
                    con.commit()
                    committed += len(records)
        return {"committed": committed, "rolled_back": rolled_back, "end": end}
    finally:
        await consumer.stop()
        con.close()


def test_resume_from_stored_offsets_exactly_once(
    kafka_bootstrap: str, tmp_topic: Callable[..., str], tmp_path: Path
) -> None:
    partitions, n_keys, per_key = 4, 24, 100
    topic = tmp_topic(partitions)
    msgs = _messages(n_keys, per_key)
    total = len(msgs)
    assert asyncio.run(_produce(kafka_bootstrap, topic, msgs)) == total

    store = tmp_path / "consumer.duckdb"
    first = asyncio.run(
        _consume(kafka_bootstrap, topic, partitions, store, "first", stop_after=total // 2)
    )
    assert total // 2 <= first["committed"] < total, first["committed"]
    assert first["rolled_back"], "the first consumer should stop with a batch in flight"

    second = asyncio.run(
        _consume(kafka_bootstrap, topic, partitions, store, "second", stop_after=None)
    )
    assert first["committed"] + second["committed"] == total

    con = duckdb.connect(str(store))
    try:
        rows = con.execute("SELECT part, off, key, seq, consumer FROM consumed").fetchall()
        offsets = dict(con.execute("SELECT part, next FROM offsets").fetchall())
    finally:
        con.close()

    # Exactly once: every (key, seq) and every (partition, offset) appears once.
    assert len(rows) == total
    assert {(r[2], r[3]) for r in rows} == {
        (f"placement-{k:03d}", s) for k in range(n_keys) for s in range(per_key)
    }
    by_part: dict[int, list[int]] = defaultdict(list)
    for part, off, *_ in rows:
        by_part[part].append(off)
    end = second["end"]
    for p in range(partitions):
        assert sorted(by_part[p]) == list(range(end[TopicPartition(topic, p)])), p
        assert offsets[p] == end[TopicPartition(topic, p)]
    assert sum(end.values()) == total

    # The rolled-back batch was consumed again, by the second consumer, once.
    owner = {(r[0], r[1]): r[4] for r in rows}
    assert all(owner[po] == "second" for po in first["rolled_back"])

    # Per-key order: one partition per key, and offsets order the seqs 0..per_key-1.
    per_key_rows: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for part, off, key, seq, _ in rows:
        per_key_rows[key].append((part, off, seq))
    for key, entries in per_key_rows.items():
        assert len({part for part, _, _ in entries}) == 1, key
        assert [seq for _, _, seq in sorted(entries)] == list(range(per_key)), key
    assert len({entries[0][0] for entries in per_key_rows.values()}) > 1  # keys spread


# --- the broker keeps its data across restarts -------------------------------------------


async def _read_all(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes, bytes]]:
    """Every record of the topic from offset 0 to the current end offsets."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = _consumer(bootstrap)
    await consumer.start()
    out: list[tuple[int, int, bytes, bytes]] = []
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        end = await consumer.end_offsets(tps)
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while any([await consumer.position(tp) < end[tp] for tp in tps]):
                batches = await consumer.getmany(timeout_ms=1000)
                for tp, records in batches.items():
                    out.extend((tp.partition, r.offset, r.key, r.value) for r in records)
    finally:
        await consumer.stop()
    return out


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_broker_restart_keeps_data(
    kafka_broker: KafkaBroker, tmp_topic: Callable[..., str], hard: bool
) -> None:
    partitions = 3
    topic = tmp_topic(partitions)
    before = _messages(10, 30, tag="before")
    after = _messages(10, 30, tag="after")
    bootstrap = kafka_broker.bootstrap
    pid = kafka_broker.pid

    async def scenario() -> list[tuple[int, int, bytes, bytes]]:
        producer = _producer(bootstrap)
        await producer.start()
        try:
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                assert await _send_all(producer, topic, before) == len(before)
            # The same producer lives through the restart and carries on afterwards.
            await asyncio.to_thread(kafka_broker.restart, hard=hard)
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                assert await _send_all(producer, topic, after) == len(after)
        finally:
            await producer.stop()
        return await _read_all(bootstrap, topic, partitions)

    records = asyncio.run(scenario())

    assert kafka_broker.bootstrap == bootstrap  # same port
    assert kafka_broker.pid != pid  # a new process
    assert sorted(value for *_, value in records) == sorted(v for _, v in before + after)
    by_part: dict[int, list[int]] = defaultdict(list)
    for part, off, _, _ in records:
        by_part[part].append(off)
    for offs in by_part.values():
        assert offs == list(range(len(offs)))  # contiguous from 0: nothing lost, no duplicate
    # Per key: everything from before the restart, then everything after, in seq order.
    seqs: dict[bytes, list[tuple[str, int]]] = defaultdict(list)
    for _, _, key, value in sorted(records):
        body = json.loads(value)
        seqs[key].append((body["tag"], body["seq"]))
    for key, seen in seqs.items():
        assert seen == [("before", s) for s in range(30)] + [("after", s) for s in range(30)], key
