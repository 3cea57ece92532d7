"""The agent and shipper against the real Kafka broker: kill -9 cycles, an outage, GC."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from devtools import builders
from devtools.faults.launch import launch
from devtools.kafka_broker import KafkaBroker
from devtools.scenario import write_meter_setup
from meter.agent import HEADS_FILE, Agent, AgentConfig
from meter.clock import SimClock
from meter.shipper import Shipper, load_shipped, simulated_send_ms
from meter.sim import SimDevice, Simulator, parse_sim_spec
from proto.delivery import DELIVERY_LOG_FILE, delivered_usage, read_delivered
from proto.envelope import open_envelope, require_signatures
from proto.errors import ProtoError
from proto.keys import key_id
from proto.records import ZERO_HASH, PlacementTerms, UsageEvent
from transport.kafka import (
    LOG_APPEND_TIME,
    SIMULATION_TOPIC_CONFIG,
    KafkaSettings,
    create_topic,
    make_producer,
    placement_of,
    publish_kafka,
)
from transport.local import publish_local
from transport.spool import list_segments, read_spool

T0 = 1_700_000_000_000
MINUTE_MS = 60_000
PARTITIONS = 4
CONSUME_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[1]


# ---- helpers ----------------------------------------------------------------------------


async def _consume_all(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the topic, from offset 0 to the end, partition by partition."""
    return [(key, value) for _, key, value, _, _ in await _consume_placed(bootstrap, topic)]


def check_kafka_streams(
    messages: Sequence[tuple[bytes, bytes]], terms: Sequence[PlacementTerms]
) -> tuple[dict[str, list[UsageEvent]], int]:
    """Drop exact duplicates, then each (node, placement) stream must be whole: seq 0..n-1,
    prev links, signatures, intervals non-overlapping. Returns the streams and the
    number of duplicates dropped."""
    by_id = {t.placement_id: t for t in terms}
    seen: set[bytes] = set()
    duplicates = 0
    streams: dict[tuple[str, str], dict[int, tuple[UsageEvent, str]]] = defaultdict(dict)
    for key, value in messages:
        if value in seen:
            duplicates += 1
            continue
        seen.add(value)
        opened = open_envelope(value)
        event = opened.record
        assert isinstance(event, UsageEvent)
        assert key == event.placement_id.encode()  # keyed by placement
        node = next(n for n in by_id[event.placement_id].nodes if n.node_id == event.node_id)
        require_signatures(opened.envelope, {key_id(node.key): node.key})
        stream = streams[(event.placement_id, event.node_id)]
        assert event.seq not in stream, f"equivocation at seq {event.seq}"
        stream[event.seq] = (event, opened.record_hash)
    result: dict[str, list[UsageEvent]] = {}
    for (placement_id, _), by_seq in streams.items():
        assert sorted(by_seq) == list(range(len(by_seq))), "a gap in seq"
        prev, last_end = ZERO_HASH, None
        for seq in range(len(by_seq)):
            event, record_hash = by_seq[seq]
            assert event.prev == prev, f"prev of seq {seq}"
            assert event.start_ms < event.end_ms
            if last_end is not None:
                assert event.start_ms >= last_end, f"overlap at seq {seq}"
            prev, last_end = record_hash, event.end_ms
        result[placement_id] = [by_seq[s][0] for s in range(len(by_seq))]
    return result, duplicates


def _scenario(intervals: int) -> tuple[builders.Cast, list[PlacementTerms]]:
    cast = builders.make_cast("meter-kafka")
    end = T0 + intervals * MINUTE_MS
    p1 = builders.make_terms(cast, "kp1", [builders.gpu("n1", 0), builders.gpu("n1", 1)], T0, end)
    p2 = builders.make_terms(cast, "kp2", [builders.gpu("n1", 2)], T0 + 30_000, end - 45_000)
    return cast, [p1, p2]


def _expected_intervals(terms: PlacementTerms) -> list[tuple[int, int]]:
    out, start = [], terms.window_start_ms
    while start < terms.window_end_ms:
        end = min(start + MINUTE_MS, terms.window_end_ms)
        out.append((start, end))
        start = end
    return out


def _agent_cmd(config: Path, spec: str, until_ms: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gridledger",
        "meter",
        "run",
        "--config",
        str(config),
        "--simulate",
        spec,
        "--until-ms",
        str(until_ms),
    ]


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def _spooled(spool: Path) -> int:
    return sum(1 for _ in read_spool(spool)) if spool.exists() else 0


# ---- kill -9 ----------------------------------------------------------------------------


def test_kill_minus_9_cycles_leave_one_whole_stream_per_placement(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    intervals = 1500
    cast, terms = _scenario(intervals)
    config = write_meter_setup(
        tmp_path,
        cast,
        "n1",
        terms,
        transport="kafka",
        kafka={"bootstrap": kafka_bootstrap, "topic": topic},
        segment_max_bytes=32 * 1024,  # small segments: GC and HEADS recovery happen too
    )
    spool = config.parent / "spool"
    until_ms = T0 + intervals * MINUTE_MS
    rng = random.Random(20261130)
    cycles = 20
    agent_log = tmp_path / "agent.log"
    for cycle in range(cycles):
        before = load_shipped(spool)
        # Forked from the harness's fork server (the package imported once): the kills
        # "anywhere" land in the agent's own start-up or run, not in Python's imports.
        proc = launch(_agent_cmd(config, "seed=9,pace_ms=20", until_ms)[3:], agent_log)
        try:
            if cycle % 2:
                # Every other run is killed only once it has shipped something (however
                # long start-up takes on a loaded machine), at a random point after that:
                # kills land mid-stream, between spool, send and acknowledgement.
                _wait_for(
                    lambda before=before, proc=proc: (
                        load_shipped(spool) != before or proc.poll() is not None
                    ),
                    60.0,
                    "the agent to ship",
                )
                assert proc.poll() is None, "the run ended before it shipped anything"
            proc.wait(timeout=rng.uniform(0.1, 0.8))  # the others: anywhere, start-up too
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, "the run finished before it was killed"
    done = subprocess.run(
        _agent_cmd(config, "seed=9", until_ms),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    messages = asyncio.run(_consume_all(kafka_bootstrap, topic))
    streams, duplicates = check_kafka_streams(messages, terms)
    for placement in terms:
        events = streams[placement.placement_id]
        # The simulated clock makes every restart contiguous: the window is tiled exactly.
        assert [(e.start_ms, e.end_ms) for e in events] == _expected_intervals(placement)
    # Garbage collection ran (acknowledged segments deleted) and left the heads behind.
    assert (spool / HEADS_FILE).exists()
    assert min(list_segments(spool)) > 0
    print(f"kill cycles={cycles} messages={len(messages)} duplicates dropped={duplicates}")


# ---- broker outage ------------------------------------------------------------------------


def test_broker_outage_loses_nothing(
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_broker: KafkaBroker,
    tmp_topic: Callable[..., str],
) -> None:
    topic = tmp_topic(PARTITIONS)
    intervals = 600
    cast, terms = _scenario(intervals)
    config = write_meter_setup(
        tmp_path,
        cast,
        "n1",
        terms,
        transport="kafka",
        kafka={"bootstrap": kafka_bootstrap, "topic": topic},
    )
    spool = config.parent / "spool"
    proc = subprocess.Popen(
        _agent_cmd(config, "seed=4,pace_ms=15", T0 + intervals * MINUTE_MS),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: load_shipped(spool) is not None, 30, "the first acknowledgement")
        kafka_broker.kill()  # the broker goes away (its data stays)
        outage_start = _spooled(spool)
        acked_at_outage = load_shipped(spool)
        # Events keep being spooled while nothing can be acknowledged.
        _wait_for(lambda: _spooled(spool) >= outage_start + 150, 30, "spooling during outage")
        assert load_shipped(spool) == acked_at_outage
        kafka_broker.restart()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    messages = asyncio.run(_consume_all(kafka_broker.bootstrap, topic))
    streams, _ = check_kafka_streams(messages, terms)
    for placement in terms:
        events = streams[placement.placement_id]
        assert [(e.start_ms, e.end_ms) for e in events] == _expected_intervals(placement)
    # (aiokafka may ride out a short outage inside one attempt: the failure path itself is
    # covered by test_shipper_failure_keeps_records_until_kafka_answers.)


# ---- shipper in-process -----------------------------------------------------------------


def _in_process_agent(tmp_path: Path, clock: SimClock, terms: list[PlacementTerms]) -> Agent:
    cast = builders.make_cast("meter-kafka")
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for t in terms for g in t.gpus]
    config = AgentConfig(
        "n1", cast.node_key("n1"), tuple(terms), tmp_path / "spool", segment_max_bytes=8192
    )
    return Agent(config, Simulator(parse_sim_spec("seed=2"), devices, T0), clock)


def test_shipper_acks_collects_garbage_and_resumes_without_resending(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    _, terms = _scenario(120)
    clock = SimClock(T0)
    agent = _in_process_agent(tmp_path, clock, terms)
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)

    async def ship_once() -> int:
        shipper = Shipper(
            tmp_path / "spool",
            settings,
            metrics=agent.metrics,
            collect_garbage=agent.collect_garbage,
        )
        try:
            return await shipper.ship_available()
        finally:
            await shipper.close()

    clock.advance(60 * MINUTE_MS)
    first = agent.tick()
    assert asyncio.run(ship_once()) == len(first)
    assert load_shipped(tmp_path / "spool") == agent.spool.end_position()
    assert list_segments(tmp_path / "spool") == [agent.spool.end_position().segment]
    assert asyncio.run(ship_once()) == 0  # a new shipper resumes at the acked position
    clock.advance(60 * MINUTE_MS)
    second = agent.tick()
    assert asyncio.run(ship_once()) == len(second)
    agent.close()
    messages = asyncio.run(_consume_all(kafka_bootstrap, topic))
    assert sorted(v for _, v in messages) == sorted(first + second)  # once each
    streams, duplicates = check_kafka_streams(messages, terms)
    assert duplicates == 0
    assert [(e.start_ms, e.end_ms) for e in streams["kp2"]] == _expected_intervals(terms[1])


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def test_shipper_failure_keeps_records_until_kafka_answers(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    _, terms = _scenario(30)
    clock = SimClock(T0)
    agent = _in_process_agent(tmp_path, clock, terms)
    clock.advance(30 * MINUTE_MS)
    envelopes = agent.tick()
    nowhere = KafkaSettings(bootstrap=f"127.0.0.1:{_closed_port()}", topic=topic)
    shipper = Shipper(tmp_path / "spool", nowhere, metrics=agent.metrics, attempt_timeout_s=0.5)

    async def run_briefly() -> bool:
        stop = asyncio.Event()
        task = asyncio.create_task(shipper.run(stop, drain_timeout_s=2.0))
        await asyncio.sleep(0)  # the shipper starts; stop asks it to drain, bounded
        stop.set()
        return await task

    started = time.monotonic()
    assert asyncio.run(run_briefly()) is False
    assert time.monotonic() - started < 10  # bounded by the drain timeout and backoff
    snapshot = agent.metrics.snapshot()
    assert snapshot["meter_ship_failures_total"] >= 2  # retried, with backoff
    assert snapshot["meter_events_pending"] == len(envelopes)
    assert load_shipped(tmp_path / "spool") is None  # nothing recorded as acknowledged
    # Kafka answers: everything waiting drains, once.
    good = Shipper(
        tmp_path / "spool",
        KafkaSettings(bootstrap=kafka_bootstrap, topic=topic),
        metrics=agent.metrics,
    )

    async def drain() -> bool:
        stop = asyncio.Event()
        stop.set()
        return await good.run(stop, drain_timeout_s=30.0)

    assert asyncio.run(drain()) is True
    agent.close()
    messages = asyncio.run(_consume_all(kafka_bootstrap, topic))
    assert sorted(v for _, v in messages) == sorted(envelopes)


def test_publish_kafka_and_local(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    cast, terms = _scenario(10)
    envelopes = [builders.signed_terms(cast, t) for t in terms]
    items = [(t.placement_id, e) for t, e in zip(terms, envelopes, strict=True)]
    asyncio.run(publish_kafka(KafkaSettings(bootstrap=kafka_bootstrap, topic=topic), items))
    got = asyncio.run(_consume_all(kafka_bootstrap, topic))
    assert sorted(got) == sorted((k.encode(), v) for k, v in items)
    # Keyed by the wrong placement, or not an envelope: refused before anything is sent.
    with pytest.raises(ProtoError):
        asyncio.run(
            publish_kafka(
                KafkaSettings(bootstrap=kafka_bootstrap, topic=topic), [("kp1", envelopes[1])]
            )
        )
    with pytest.raises(ProtoError):
        publish_local(tmp_path, "publish-desk", [envelopes[0], b"{not an envelope}"])
    assert not (tmp_path / "publish-desk").exists() or _spooled(tmp_path / "publish-desk") == 0
    positions = publish_local(tmp_path, "publish-desk", envelopes)
    assert [e.data for e in read_spool(tmp_path / "publish-desk")] == envelopes
    assert len(positions) == 2
    with pytest.raises(ValueError):
        publish_local(tmp_path, "../escape", envelopes)


async def _consume_placed(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes, int, int]]:
    """Every (partition, key, value, timestamp, timestamp type) of the topic."""
    return [
        (r.partition, r.key, r.value, r.timestamp, r.timestamp_type)
        for r in await consume_records(bootstrap, topic, PARTITIONS)
    ]


async def consume_records(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of the topic's ``partitions`` (aiokafka ConsumerRecords), offset 0 to
    the end, in each partition's order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        end = await consumer.end_offsets(tps)
        out: list[Any] = []
        async with asyncio.timeout(CONSUME_TIMEOUT_S):
            while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize(
    ("simulated", "hand_off"), [(False, None), (True, None), (True, 10_000), (False, 100)]
)
def test_shipper_partitions_and_delivery_lines_are_the_producers_own(
    tmp_path: Path,
    kafka_bootstrap: str,
    tmp_topic: Callable[..., str],
    simulated: bool,
    hand_off: int | None,
) -> None:
    """The shipper opens each envelope once and picks the partition itself: every record
    lands where the producer's own ``send`` puts its key, in spool order per partition,
    and each delivery line is ``delivered_usage`` of the envelope at the time the log
    keeps (LogAppendTime topic) or the time the simulation stated (CreateTime topic).
    ``hand_off``: the agent hands its events to the shipper (``Agent.hand_off``) rather
    than the shipper opening them, all of them or (a bound of 100) the last 100 only:
    the same records, partitions, order and delivery lines."""
    cast = builders.make_cast("meter-kafka")
    terms = [
        builders.make_terms(cast, f"kq{i}", [builders.gpu("n1", i)], T0, T0 + 30 * MINUTE_MS)
        for i in range(8)
    ]
    if simulated:
        topic = tmp_topic(create=False)
        create_topic(kafka_bootstrap, topic, PARTITIONS, config=SIMULATION_TOPIC_CONFIG)
    else:
        topic = tmp_topic(PARTITIONS)
    clock = SimClock(T0)
    agent = _in_process_agent(tmp_path, clock, terms)
    handed_off = agent.hand_off(hand_off) if hand_off is not None else None
    clock.advance(30 * MINUTE_MS)
    envelopes = agent.tick()
    if handed_off is not None:
        assert len(handed_off) == min(hand_off or 0, len(envelopes))
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    stamp = simulated_send_ms if simulated else None

    async def ship_and_probe() -> tuple[int, dict[bytes, int]]:
        shipper = Shipper(
            tmp_path / "spool",
            settings,
            now_ms=clock.now_ms,
            stamp=stamp,
            handed_off=handed_off,
        )
        producer = make_producer(settings)
        await producer.start()
        try:
            shipped = await shipper.ship_available()
            probe = tmp_topic(PARTITIONS)  # where the producer itself puts each key
            placed = {}
            for t in terms:
                key = t.placement_id.encode()
                ack = await (await producer.send(probe, value=b"x", key=key))
                placed[key] = ack.partition
            return shipped, placed
        finally:
            await shipper.close()
            await producer.stop()

    shipped, placed = asyncio.run(ship_and_probe())
    agent.close()
    assert shipped == len(envelopes) == 8 * 30
    if handed_off is not None:
        assert len(handed_off) == 0  # the shipper took every event handed to it
    assert len(set(placed.values())) > 1  # the keys spread: the check below can fail
    records = asyncio.run(_consume_placed(kafka_bootstrap, topic))
    assert sorted(r[2] for r in records) == sorted(envelopes)
    for partition, key, value, _, _ in records:
        assert partition == placed[key]
        assert placement_of(value) == key.decode()
    spool_order = {e: i for i, e in enumerate(envelopes)}
    for p in range(PARTITIONS):
        order = [spool_order[r[2]] for r in records if r[0] == p]
        assert order == sorted(order)
    log_time = {r[2]: r[3] for r in records}
    expected = [
        delivered_usage(e, simulated_send_ms(e) if simulated else log_time[e]) for e in envelopes
    ]
    if simulated:
        assert all(r[4] == 0 for r in records)  # CreateTime: what the shipper stated
        assert all(log_time[e] == simulated_send_ms(e) for e in envelopes)
    else:
        assert all(r[4] == LOG_APPEND_TIME for r in records)
    assert list(read_delivered(tmp_path / "spool" / DELIVERY_LOG_FILE)) == expected
