"""Resource bounds of the node agent (``meter/limits.py`` and a few module constants).

Each test shows one bound at its value and one past it: a configuration past a bound is
refused with a message naming it; a tick past MAX_EVENTS_PER_TICK leaves the rest for the
next tick (backpressure, no gap); the shipper sends at most ``batch_max_records`` before
recording an acknowledgement, gives up an attempt on a silent broker after its timeout,
and backs off up to its ceiling. Spool-full behaviour is shown by the tests BOUNDS.md
names (tests/test_transport_spool.py, test_meter_agent.py, test_meter_cli.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from structlog.testing import capture_logs
from support import usage_events
from test_meter_nvml import FakeDevice, FakeNvml

from devtools import builders
from meter import durable, shipper
from meter.agent import Agent, AgentConfig, AgentConfigError
from meter.clock import SimClock
from meter.config import ConfigError, parse_meter_config
from meter.limits import (
    MAX_EVENTS_PER_TICK,
    MAX_INTERVAL_MS,
    MAX_STREAMS,
    MAX_TERMS_FILES,
    MIN_INTERVAL_MS,
)
from meter.nvml import MAX_XID_EVENTS_PER_READ, NvmlSource
from meter.shipper import Shipper, load_shipped
from meter.sim import MAX_SIM_GPUS, SimDevice, SimSpecError, Simulator, parse_sim_spec
from proto.records import PlacementTerms, UsageEvent
from transport.kafka import KafkaSettings
from transport.limits import MIN_SEGMENT_MAX_BYTES
from transport.local import publish_local
from transport.positions import SpoolPosition
from transport.spool import SpoolWriter, read_spool

T0 = 1_767_225_600_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
CAST = builders.make_cast("bounds-meter")
KAFKA_WAIT_S = 60.0


def _terms(placement_id: str, gpus: int = 1, hours: int = 1) -> PlacementTerms:
    specs = [builders.gpu("n1", i) for i in range(gpus)]
    return builders.make_terms(CAST, placement_id, specs, T0, T0 + hours * HOUR_MS)


def _agent(
    tmp: Path, clock: SimClock, terms: tuple[PlacementTerms, ...], interval_ms: int
) -> Agent:
    devices = sorted(
        {g.uuid: SimDevice(g.uuid, g.model, g.memory_mib) for t in terms for g in t.gpus}.values(),
        key=lambda d: d.uuid,
    )
    config = AgentConfig("n1", CAST.node_key("n1"), terms, tmp / "spool", interval_ms=interval_ms)
    return Agent(config, Simulator(parse_sim_spec("seed=3"), devices, T0), clock)


def _assert_contiguous(events: list[UsageEvent], first_start_ms: int) -> None:
    """One stream: seq 0..n-1, each interval starting where the previous one ended."""
    assert [e.seq for e in events] == list(range(len(events)))
    start = first_start_ms
    for event in events:
        assert event.start_ms == start, (event.seq, event.start_ms, start)
        start = event.end_ms


# ---- the agent ----------------------------------------------------------------------------


def test_a_tick_emits_at_most_max_events_and_the_rest_comes_next_tick(tmp_path: Path) -> None:
    # Two streams at the shortest interval, a clock jump worth more than one tick's budget:
    # the first tick stops exactly at MAX_EVENTS_PER_TICK, the next one continues each
    # stream where it stopped. Nothing is skipped, nothing is emitted twice.
    clock = SimClock(T0)
    terms = (_terms("p-a"), _terms("p-b"))
    agent = _agent(tmp_path, clock, terms, MIN_INTERVAL_MS)
    due_per_stream = MAX_EVENTS_PER_TICK // 2 + 7
    clock.advance(due_per_stream * MIN_INTERVAL_MS)
    first = agent.tick()
    assert len(first) == MAX_EVENTS_PER_TICK
    # The rest is due already: the caller sees backpressure, not an idle agent.
    due = agent.next_due_ms()
    assert due is not None and due <= clock.now_ms()
    second = agent.tick()
    assert len(first) + len(second) == 2 * due_per_stream
    assert agent.tick() == []
    agent.close()
    spooled = [e.data for e in read_spool(tmp_path / "spool")]
    assert spooled == first + second  # durable, in the order returned
    events = usage_events(first + second)
    for t in terms:
        stream = [e for e in events if e.placement_id == t.placement_id]
        assert len(stream) == due_per_stream
        _assert_contiguous(stream, t.window_start_ms)


def test_max_streams_placements_are_metered_one_more_is_refused(tmp_path: Path) -> None:
    terms = tuple(_terms(f"p{i}") for i in range(MAX_STREAMS + 1))
    with pytest.raises(AgentConfigError, match=f"{MAX_STREAMS + 1} placements; at most"):
        AgentConfig("n1", CAST.node_key("n1"), terms, tmp_path / "refused")
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, terms[:MAX_STREAMS], MINUTE_MS)
    clock.advance(MINUTE_MS)
    events = usage_events(agent.tick())
    agent.close()
    # At the bound every stream runs: one event each, seq 0, in one tick.
    assert len(events) == MAX_STREAMS
    assert {e.placement_id for e in events} == {t.placement_id for t in terms[:MAX_STREAMS]}
    assert {e.seq for e in events} == {0}


@pytest.mark.parametrize(
    ("interval_ms", "ok"),
    [
        (MIN_INTERVAL_MS, True),
        (MIN_INTERVAL_MS - 1, False),
        (MAX_INTERVAL_MS, True),
        (MAX_INTERVAL_MS + 1, False),
    ],
)
def test_agent_interval_range(tmp_path: Path, interval_ms: int, ok: bool) -> None:
    terms = (_terms("p1"),)
    if ok:
        config = AgentConfig("n1", CAST.node_key("n1"), terms, tmp_path, interval_ms=interval_ms)
        assert config.interval_ms == interval_ms
    else:
        with pytest.raises(AgentConfigError, match="is outside"):
            AgentConfig("n1", CAST.node_key("n1"), terms, tmp_path, interval_ms=interval_ms)


def test_an_interval_of_max_ms_is_one_event(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, (_terms("p1", hours=48),), MAX_INTERVAL_MS)
    clock.advance(MAX_INTERVAL_MS)
    events = usage_events(agent.tick())
    agent.close()
    assert [(e.start_ms, e.end_ms) for e in events] == [(T0, T0 + MAX_INTERVAL_MS)]


# ---- meter.toml ----------------------------------------------------------------------------


def _config_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "node_id": "n1",
        "key_file": "n1.key",
        "terms": ["t.json"],
        "transport": "local",
        "local_dir": "local",
    }
    data.update(changes)
    return data


def test_max_terms_files_are_accepted_one_more_is_refused(tmp_path: Path) -> None:
    names = [f"terms/p{i}.json" for i in range(MAX_TERMS_FILES + 1)]
    path = tmp_path / "meter.toml"
    config = parse_meter_config(_config_data(terms=names[:MAX_TERMS_FILES]), path)
    assert len(config.terms) == MAX_TERMS_FILES
    with pytest.raises(ConfigError, match=f"at most {MAX_TERMS_FILES}"):
        parse_meter_config(_config_data(terms=names), path)


@pytest.mark.parametrize(
    ("interval_s", "interval_ms"),
    [
        (MAX_INTERVAL_MS // 1000, MAX_INTERVAL_MS),
        (MIN_INTERVAL_MS / 1000, MIN_INTERVAL_MS),
        (MAX_INTERVAL_MS / 1000 + 0.001, None),
        (0.0004, None),  # rounds to 0 ms
    ],
)
def test_config_interval_range(tmp_path: Path, interval_s: float, interval_ms: int | None) -> None:
    data = _config_data(interval_s=interval_s)
    if interval_ms is None:
        with pytest.raises(ConfigError, match=r"interval_s .* is outside"):
            parse_meter_config(data, tmp_path / "meter.toml")
    else:
        assert parse_meter_config(data, tmp_path / "meter.toml").interval_ms == interval_ms


def test_spool_and_segment_bytes_have_a_floor(tmp_path: Path) -> None:
    path = tmp_path / "meter.toml"
    at_floor = _config_data(spool_max_bytes=MIN_SEGMENT_MAX_BYTES)
    config = parse_meter_config(at_floor, path)
    assert (config.spool_max_bytes, config.segment_max_bytes) == (MIN_SEGMENT_MAX_BYTES,) * 2
    with pytest.raises(ConfigError, match="spool_max_bytes must be an integer >= 4096"):
        parse_meter_config(_config_data(spool_max_bytes=MIN_SEGMENT_MAX_BYTES - 1), path)
    writer = SpoolWriter(tmp_path / "s", max_bytes=MIN_SEGMENT_MAX_BYTES, segment_max_bytes=4096)
    writer.append([b"x" * (MIN_SEGMENT_MAX_BYTES - 9)])  # one frame fills it exactly
    assert writer.bytes_used == MIN_SEGMENT_MAX_BYTES
    writer.close()
    with pytest.raises(ValueError, match="below"):
        SpoolWriter(tmp_path / "t", segment_max_bytes=MIN_SEGMENT_MAX_BYTES - 1)
    with pytest.raises(ValueError, match="below segment_max_bytes"):
        SpoolWriter(tmp_path / "u", max_bytes=8191, segment_max_bytes=8192)


# ---- sources ------------------------------------------------------------------------------


def test_simulated_gpus_up_to_max_sim_gpus() -> None:
    assert parse_sim_spec(f"gpus={MAX_SIM_GPUS}").gpus == MAX_SIM_GPUS
    with pytest.raises(SimSpecError, match=f"at most {MAX_SIM_GPUS}"):
        parse_sim_spec(f"gpus={MAX_SIM_GPUS + 1}")


def test_an_xid_storm_is_drained_max_events_per_read_and_none_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = FakeDevice("GPU-storm")
    fake = FakeNvml([device])
    fake.install(monkeypatch)
    source = NvmlSource(pynvml)
    extra = 3
    fake.events = [device] * (MAX_XID_EVENTS_PER_READ + extra)
    with capture_logs():  # one warning per event: keep them off stdout
        first = source.read(T0, T0 + MINUTE_MS)
        assert len(fake.events) == extra  # the read stopped at its bound
        second = source.read(T0 + MINUTE_MS, T0 + 2 * MINUTE_MS)
    source.close()
    assert first["GPU-storm"].xid_errors == MAX_XID_EVENTS_PER_READ
    assert second["GPU-storm"].xid_errors == extra  # counted in the next interval
    assert not first["GPU-storm"].healthy and not second["GPU-storm"].healthy
    assert fake.events == []


# ---- small state files ----------------------------------------------------------------------


def test_small_state_files_are_read_up_to_their_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # read_small_file reads MAX_SMALL_FILE_BYTES at call time: a small bound here runs the
    # same code as the real 64 MiB.
    monkeypatch.setattr(durable, "MAX_SMALL_FILE_BYTES", 1000)
    path = tmp_path / "HEADS"
    path.write_bytes(b"x" * 1000)
    assert durable.read_small_file(path) == b"x" * 1000
    path.write_bytes(b"x" * 1001)
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        durable.read_small_file(path)


# ---- the shipper ----------------------------------------------------------------------------


def _spool_records(directory: Path, count: int) -> list[bytes]:
    terms = _terms("p-ship")
    writer = builders.StreamWriter(CAST.node_key("n1"), terms.placement_id, "n1")
    sample = [builders.sample(terms.gpus[0])]
    envelopes = [
        writer.event(T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS, sample) for i in range(count)
    ]
    publish_local(directory.parent, directory.name, envelopes)
    return envelopes


async def _consume(bootstrap: str, topic: str, want: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        out: list[bytes] = []
        async with asyncio.timeout(KAFKA_WAIT_S):
            while len(out) < want:
                batches = await consumer.getmany(tp, timeout_ms=500)
                out.extend(r.value for r in batches.get(tp, []))
        return out
    finally:
        await consumer.stop()


def test_shipper_sends_at_most_batch_max_records_per_acknowledgement(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(1)
    spool = tmp_path / "node-n1"
    envelopes = _spool_records(spool, 10)
    batch = 3
    acked: list[SpoolPosition] = []

    def record_ack(position: SpoolPosition) -> int:
        # Called once per acknowledged batch, after SHIPPED is stored.
        assert load_shipped(spool) == position
        acked.append(position)
        return 0

    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)

    async def ship() -> int:
        sender = Shipper(spool, settings, collect_garbage=record_ack, batch_max_records=batch)
        try:
            return await sender.ship_available()
        finally:
            await sender.close()

    assert asyncio.run(ship()) == len(envelopes)
    positions = [e.next_position for e in read_spool(spool)]
    # ceil(10 / 3) acknowledgements, each after at most `batch` records.
    assert acked == [positions[2], positions[5], positions[8], positions[9]]
    assert asyncio.run(_consume(kafka_bootstrap, topic, len(envelopes))) == envelopes


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes handshakes; nobody reads or writes
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def test_an_attempt_on_a_silent_broker_gives_up_after_its_timeout(
    tmp_path: Path, silent_broker: str
) -> None:
    spool = tmp_path / "node-n1"
    envelopes = _spool_records(spool, 4)
    timeout_s = 0.5
    sender = Shipper(
        spool, KafkaSettings(bootstrap=silent_broker, topic="t"), attempt_timeout_s=timeout_s
    )

    async def attempt() -> BaseException | None:
        try:
            await sender.ship_available()
        except Exception as exc:
            return exc
        finally:
            await sender.close()
        return None

    started = time.monotonic()
    error = asyncio.run(attempt())
    elapsed = time.monotonic() - started
    assert isinstance(error, TimeoutError), repr(error)
    # Bounded by the attempt timeout (plus the producer's bounded stop), not hung.
    assert elapsed < timeout_s + 10
    assert load_shipped(spool) is None  # nothing recorded as acknowledged
    assert sender.pending() == len(envelopes)


def test_backoff_doubles_up_to_its_ceiling_and_the_drain_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_broker: str
) -> None:
    # Small constants (read at call time by meter.shipper) so the ceiling is reached fast.
    monkeypatch.setattr(shipper, "SHIP_BACKOFF_INITIAL_S", 0.01)
    monkeypatch.setattr(shipper, "SHIP_BACKOFF_MAX_S", 0.04)
    spool = tmp_path / "node-n1"
    envelopes = _spool_records(spool, 4)
    sender = Shipper(
        spool, KafkaSettings(bootstrap=silent_broker, topic="t"), attempt_timeout_s=0.1
    )

    async def run() -> bool:
        stop = asyncio.Event()
        stop.set()  # drain what is there, for at most the drain timeout
        return await sender.run(stop, drain_timeout_s=2.0)

    with capture_logs() as logs:
        drained = asyncio.run(run())
    assert drained is False
    pauses = [e["retry_in_s"] for e in logs if e["event"] == "ship_failed"]
    assert len(pauses) >= 4, pauses
    assert pauses[:4] == [0.01, 0.02, 0.04, 0.04]
    assert max(pauses) == 0.04
    assert sender.metrics.snapshot()["meter_events_pending"] == len(envelopes)
    assert load_shipped(spool) is None
