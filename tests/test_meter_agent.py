"""The node agent in-process: simulator, streams, restarts, spool bound, recovery."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import pytest
import structlog.testing
from support import usage_events

from devtools import builders
from meter.agent import HEADS_FILE, Agent, AgentConfig, AgentConfigError
from meter.clock import SimClock, SkewedClock
from meter.sim import SimDevice, SimSpec, SimSpecError, Simulator, parse_sim_spec
from meter.sources import GpuReading
from meter.stream import node_gpus, seal_event
from proto.envelope import open_envelope, require_signatures, seal
from proto.keys import key_id, signer
from proto.records import ZERO_HASH, PlacementTerms, StreamResume, UsageEvent
from transport.positions import SpoolPosition
from transport.spool import SpoolFull, list_segments, read_spool

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000


def _scenario(seed: str = "agent") -> tuple[builders.Cast, list[PlacementTerms]]:
    cast = builders.make_cast(seed)
    p1 = builders.make_terms(
        cast,
        "p1",
        [builders.gpu("n1", 0), builders.gpu("n1", 1), builders.gpu("n2", 0)],
        T0,
        T0 + HOUR_MS,
    )
    # A window that does not fall on the interval grid: the last interval is clipped.
    p2 = builders.make_terms(
        cast, "p2", [builders.gpu("n1", 2, share_milli=500)], T0 + 90_000, T0 + 1_234_567
    )
    return cast, [p1, p2]


def _agent(
    tmp: Path,
    clock: SimClock | SkewedClock,
    *,
    spec: str = "seed=7",
    interval_ms: int = MINUTE_MS,
    spool: str = "spool",
    cast_seed: str = "agent",
    **config: int,
) -> Agent:
    cast, terms = _scenario(cast_seed)
    devices = sorted(
        {
            g.uuid: SimDevice(g.uuid, g.model, g.memory_mib)
            for t in terms
            for g in node_gpus(t, "n1")
        }.values(),
        key=lambda d: d.uuid,
    )
    agent_config = AgentConfig(
        node_id="n1",
        signing_key=cast.node_key("n1"),
        terms=tuple(terms),
        spool_dir=tmp / spool,
        interval_ms=interval_ms,
        **config,
    )
    return Agent(agent_config, Simulator(parse_sim_spec(spec), devices, T0), clock)


def check_streams(
    envelopes: Sequence[bytes], terms: Sequence[PlacementTerms]
) -> dict[str, list[UsageEvent]]:
    """SPEC 6.3 "usage" for a node's envelopes: what a ledger would accept, all of it."""
    by_id = {t.placement_id: t for t in terms}
    streams: dict[tuple[str, str], list[tuple[UsageEvent, str]]] = defaultdict(list)
    for envelope in envelopes:
        opened = open_envelope(envelope)
        event = opened.record
        assert isinstance(event, UsageEvent)
        placement = by_id[event.placement_id]
        node = next(n for n in placement.nodes if n.node_id == event.node_id)
        require_signatures(opened.envelope, {key_id(node.key): node.key})
        streams[(event.placement_id, event.node_id)].append((event, opened.record_hash))
    result: dict[str, list[UsageEvent]] = {}
    for (placement_id, node_id), items in streams.items():
        placement = by_id[placement_id]
        gpus = {g.uuid: g for g in node_gpus(placement, node_id)}
        prev, last_end = ZERO_HASH, None
        for seq, (event, record_hash) in enumerate(items):
            assert event.seq == seq
            assert event.prev == prev
            assert 0 < event.end_ms - event.start_ms <= 86_400_000
            if last_end is not None:
                assert event.start_ms >= last_end
            assert event.start_ms >= placement.window_start_ms
            assert event.end_ms <= placement.window_end_ms
            assert sorted(s.uuid for s in event.samples) == sorted(gpus)
            for sample in event.samples:
                assert sample.model == gpus[sample.uuid].model
                assert sample.allocated
            prev, last_end = record_hash, event.end_ms
        result[placement_id] = [e for e, _ in items]
    return result


# ---- simulator ---------------------------------------------------------------------------


def test_simulator_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        clock = SimClock(T0)
        agent = _agent(tmp_path, clock, spool=name, spec="seed=11,unhealthy=GPU-n1-1@600000-900000")
        clock.advance(HOUR_MS)
        runs.append(agent.tick())
        agent.close()
    assert runs[0] == runs[1]
    assert len(runs[0]) == 60 + 20  # p1: 60 minutes; p2: 19 full intervals + a clipped one
    other_clock = SimClock(T0)
    other = _agent(tmp_path, other_clock, spool="c", spec="seed=12")
    other_clock.advance(HOUR_MS)
    assert other.tick() != runs[0]
    other.close()
    # Readings depend on (seed, GPU, interval) only, not on the order they are asked for.
    spec = parse_sim_spec("seed=5")
    device = SimDevice("GPU-x", "A100", 81920)
    forward = Simulator(spec, [device], T0)
    backward = Simulator(spec, [device], T0)
    intervals = [(T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS) for i in range(20)]
    got_forward = [forward.read(s, e) for s, e in intervals]
    got_backward = [backward.read(s, e) for s, e in reversed(intervals)][::-1]
    assert got_forward == got_backward
    assert len({r["GPU-x"].utilisation_pct for r in got_forward}) > 1  # it does vary


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", SimSpec()),
        ("seed=7", SimSpec(seed=7)),
        ("seed=7,gpus=4,skew_ms=-250,crash_after=3,pace_ms=5", SimSpec(7, 4, (), (), -250, 3, 5)),
    ],
)
def test_sim_spec_parses(text: str, expected: SimSpec) -> None:
    assert parse_sim_spec(text) == expected


def test_sim_spec_faults_parse() -> None:
    spec = parse_sim_spec(
        "seed=7,gpus=4,unhealthy=GPU-x@600000-900000,vanish=GPU-y@1200000,"
        "vanish=GPU-z:1@5-10,skew_ms=250"
    )
    assert [(f.uuid, f.start_ms, f.end_ms) for f in spec.unhealthy] == [("GPU-x", 600000, 900000)]
    assert [(f.uuid, f.start_ms, f.end_ms) for f in spec.vanish] == [
        ("GPU-y", 1200000, None),
        ("GPU-z:1", 5, 10),
    ]
    assert spec.skew_ms == 250 and spec.gpus == 4


@pytest.mark.parametrize(
    "text",
    [
        "seed",
        "seed=x",
        "seed=1,seed=2",
        "colour=red",
        "unhealthy=GPU-x@600000",
        "unhealthy=GPU-x@900000-600000",
        "unhealthy=@1-2",
        "vanish=GPU x@1",
        "gpus=0",
        "gpus=100000",
        "crash_after=0",
        "pace_ms=-1",
        "skew_ms=1.5",
    ],
)
def test_sim_spec_rejects(text: str) -> None:
    with pytest.raises(SimSpecError):
        parse_sim_spec(text)


def test_faults_show_in_the_samples(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(
        tmp_path,
        clock,
        spec="seed=3,gpus=6,unhealthy=GPU-n1-0@600000-900000,vanish=GPU-n1-1@1200000",
    )
    clock.advance(HOUR_MS)
    events = check_streams(agent.tick(), _scenario()[1])["p1"]
    agent.close()
    for event in events:
        rel = event.start_ms - T0
        by_uuid = {s.uuid: s for s in event.samples}
        sick = by_uuid["GPU-n1-0"]
        assert sick.healthy == (not 600_000 <= rel < 900_000), rel
        assert (sick.xid_errors > 0) == (not sick.healthy)
        gone = by_uuid["GPU-n1-1"]
        assert gone.healthy == (rel + MINUTE_MS <= 1_200_000), rel
        if not gone.healthy:
            assert gone.utilisation_pct == gone.power_mw == gone.energy_mj == 0
        else:
            assert gone.energy_mj == gone.power_mw * MINUTE_MS // 1000 > 0
    # gpus=6 adds devices no placement has: never reported.
    assert all(not s.uuid.startswith("GPU-sim") for e in events for s in e.samples)


# ---- streams -----------------------------------------------------------------------------


def test_events_follow_the_spec_and_clip_at_the_window(tmp_path: Path) -> None:
    clock = SimClock(T0 - 5 * MINUTE_MS)  # started before the windows open
    agent = _agent(tmp_path, clock)
    clock.advance(2 * HOUR_MS)
    envelopes = agent.tick()
    assert agent.tick() == []  # nothing new is due
    agent.close()
    streams = check_streams(envelopes, _scenario()[1])
    p1, p2 = streams["p1"], streams["p2"]
    assert [(e.start_ms, e.end_ms) for e in p1] == [
        (T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS) for i in range(60)
    ]
    assert p2[0].start_ms == T0 + 90_000 and p2[-1].end_ms == T0 + 1_234_567
    assert all(b.start_ms == a.end_ms for a, b in itertools.pairwise(p2))  # contiguous
    # What was returned is exactly what the spool holds, in the same order.
    assert [e.data for e in read_spool(tmp_path / "spool")] == envelopes


def test_restart_continues_the_stream(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock)
    clock.advance(30 * MINUTE_MS + 20_000)
    first = agent.tick()
    heads = agent.heads
    agent.close()  # (a kill -9 leaves the same spool: every tick fsyncs before returning)
    # Restarted within one interval of the last end: contiguous.
    clock.advance(30_000)
    agent = _agent(tmp_path, clock)
    assert agent.heads == heads
    clock.advance(10 * MINUTE_MS)
    second = agent.tick()
    agent.close()
    # Restarted long after: a gap in time, never in seq or prev.
    clock.advance(7 * MINUTE_MS + 1234)
    agent = _agent(tmp_path, clock)
    restart_ms = clock.now_ms()
    clock.advance(HOUR_MS)
    third = agent.tick()
    agent.close()
    p1 = check_streams(first + second + third, _scenario()[1])["p1"]
    ends = [e.end_ms for e in p1]
    starts = [e.start_ms for e in p1]
    assert starts[30] == ends[29] == T0 + 30 * MINUTE_MS  # contiguous across restart 1
    gap_at = next(i for i in range(1, len(p1)) if starts[i] != ends[i - 1])
    assert starts[gap_at] == restart_ms  # restart 2 starts at its now
    assert p1[-1].end_ms == T0 + HOUR_MS


def test_a_clock_set_back_never_overlaps(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock)
    clock.advance(20 * MINUTE_MS)
    before = agent.tick()
    agent.close()
    clock.set(T0 + 5 * MINUTE_MS)  # the node's clock jumped back 15 minutes
    agent = _agent(tmp_path, clock)
    clock.advance(15 * MINUTE_MS)
    assert agent.tick() == []  # nothing until time passes the last end again
    clock.advance(MINUTE_MS)
    after = agent.tick()
    agent.close()
    assert after
    check_streams(before + after, _scenario()[1])


def test_skewed_clock_shifts_the_intervals(tmp_path: Path) -> None:
    base = SimClock(T0)
    agent = _agent(tmp_path, SkewedClock(base, 250), spec="seed=1,skew_ms=250")
    base.advance(3 * MINUTE_MS)
    events = usage_events(agent.tick())
    agent.close()
    p1 = [e for e in events if e.placement_id == "p1"]
    # The agent started at T0 + 250 by its clock: within one interval of the window
    # start, so it starts there; it sees the third minute end 250 ms early.
    assert [(e.start_ms - T0, e.end_ms - T0) for e in p1] == [
        (0, MINUTE_MS),
        (MINUTE_MS, 2 * MINUTE_MS),
        (2 * MINUTE_MS, 3 * MINUTE_MS),
    ]


def test_spool_full_raises_and_advances_nothing(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, spool_max_bytes=16384, segment_max_bytes=4096)
    emitted: list[bytes] = []
    with pytest.raises(SpoolFull):
        for _ in range(1000):  # bounded; the bound is hit far earlier
            clock.advance(MINUTE_MS)
            emitted += agent.tick()
    heads = agent.heads
    assert agent.metrics.snapshot()["meter_events_emitted_total"] == len(emitted)
    with pytest.raises(SpoolFull):
        agent.tick()
    assert agent.heads == heads
    agent.close()
    assert [e.data for e in read_spool(tmp_path / "spool")] == emitted
    # After a restart with room (a larger bound), the same seq continues: no gap.
    agent = _agent(tmp_path, clock, spool_max_bytes=1 << 20, segment_max_bytes=4096)
    more = agent.tick()
    agent.close()
    check_streams(emitted + more, _scenario()[1])


def test_an_acknowledged_segment_being_written_is_sealed_and_collected(tmp_path: Path) -> None:
    """Issue 15: with everything acknowledged, the segment being written goes too once it
    holds seal_acked_bytes (before: a node kept up to a whole 16 MiB segment of
    acknowledged events for ever). The spool keeps none of them, a restarted agent
    continues every stream from HEADS, and a shipper's recorded position in the deleted
    segment reads on from the new one: exactly the events spooled after it."""
    spool = tmp_path / "spool"
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, seal_acked_bytes=2048)
    emitted: list[bytes] = []
    for _ in range(10):
        clock.advance(MINUTE_MS)
        emitted += agent.tick()
    assert list_segments(spool) == [0]  # one segment, never rotated (16 MiB default)
    acked = agent.spool.end_position()
    assert agent.spool.current_segment_bytes >= 2048
    freed = agent.collect_garbage(acked)
    assert freed == acked.offset  # the whole acknowledged segment
    assert list_segments(spool) == [1] and agent.spool.bytes_used == 0
    assert list(read_spool(spool)) == []
    heads = agent.heads
    agent.close()
    agent = _agent(tmp_path, clock, seal_acked_bytes=2048)
    assert agent.heads == heads
    clock.advance(MINUTE_MS)
    more = agent.tick()
    assert more and [e.data for e in read_spool(spool, acked)] == more
    agent.close()
    check_streams(emitted + more, _scenario()[1])


def test_an_acknowledged_segment_below_the_seal_bound_is_kept(tmp_path: Path) -> None:
    """Below seal_acked_bytes, or with records not yet acknowledged, nothing is sealed."""
    spool = tmp_path / "spool"
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, seal_acked_bytes=1 << 20)
    for _ in range(3):
        clock.advance(MINUTE_MS)
        agent.tick()
    end = agent.spool.end_position()
    assert agent.collect_garbage(end) == 0 and list_segments(spool) == [0]
    agent.close()
    agent = _agent(tmp_path, clock, seal_acked_bytes=1)
    first = next(iter(read_spool(spool)))
    assert agent.collect_garbage(first.next_position) == 0  # not all acknowledged
    assert list_segments(spool) == [0] and agent.spool.bytes_used == end.offset
    assert agent.collect_garbage(end) == end.offset and list_segments(spool) == [1]
    agent.close()
    with pytest.raises(AgentConfigError, match="seal_acked_bytes"):
        _agent(tmp_path, clock, seal_acked_bytes=0)


def test_recovery_after_garbage_collection_uses_heads(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, segment_max_bytes=4096)
    emitted: list[bytes] = []
    for _ in range(40):
        clock.advance(MINUTE_MS)
        emitted += agent.tick()
    assert len(list_segments(tmp_path / "spool")) > 5
    heads = agent.heads
    end = agent.spool.end_position()
    freed = agent.collect_garbage(end)  # everything acknowledged
    assert freed > 0 and (tmp_path / "spool" / HEADS_FILE).exists()
    assert len(list_segments(tmp_path / "spool")) == 1
    agent.close()
    # p2's last events went with the deleted segments: only HEADS knows its head now.
    remaining = usage_events(e.data for e in read_spool(tmp_path / "spool"))
    assert all(e.placement_id == "p1" for e in remaining)
    agent = _agent(tmp_path, clock, segment_max_bytes=4096)
    assert agent.heads == heads
    clock.advance(MINUTE_MS)
    emitted += agent.tick()
    agent.close()
    check_streams(emitted, _scenario()[1])


def test_config_is_checked(tmp_path: Path) -> None:
    cast, terms = _scenario()
    with pytest.raises(AgentConfigError):
        AgentConfig("n1", cast.node_key("n1"), tuple(terms), tmp_path, interval_ms=0)
    with pytest.raises(AgentConfigError):
        AgentConfig("n1", cast.node_key("n1"), (terms[0], terms[0]), tmp_path)


def test_agent_for_a_node_outside_the_terms_emits_nothing(tmp_path: Path) -> None:
    cast, terms = _scenario()
    clock = SimClock(T0)
    config = AgentConfig("n9", cast.node_key("n9"), tuple(terms), tmp_path / "s")
    agent = Agent(config, Simulator(SimSpec(), [], T0), clock)
    clock.advance(HOUR_MS)
    assert agent.tick() == [] and agent.next_due_ms() is None
    agent.close()


def test_node_spool_positions_are_resumable_by_a_reader(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock)
    clock.advance(10 * MINUTE_MS)
    agent.tick()
    position: SpoolPosition | None = None
    seen = []
    for entry in read_spool(tmp_path / "spool"):
        seen.append(entry.data)
        position = entry.next_position
    clock.advance(10 * MINUTE_MS)
    later = agent.tick()
    agent.close()
    assert [e.data for e in read_spool(tmp_path / "spool", position)] == later


class _BrokenSource:
    def read(self, start_ms: int, end_ms: int) -> dict[str, object]:
        raise RuntimeError("driver went away")

    def close(self) -> None:
        pass


def test_a_failing_source_is_counted_not_fatal(tmp_path: Path) -> None:
    cast, terms = _scenario()
    clock = SimClock(T0)
    config = AgentConfig("n1", cast.node_key("n1"), tuple(terms), tmp_path / "s")
    agent = Agent(config, _BrokenSource(), clock)  # type: ignore[arg-type]
    clock.advance(2 * MINUTE_MS)
    events = check_streams(agent.tick(), terms)
    agent.close()
    assert all(not s.healthy for e in events["p1"] for s in e.samples)
    assert agent.metrics.snapshot()["meter_source_errors_total"] == 2


# ---- reading only the GPUs due ------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "seed=5",
        "seed=5,gpus=4,unhealthy=GPU-a@60000-180000,vanish=GPU-b@120000,xid=79/GPU-a@0-60000,"
        "ecc=GPU-b@0-60000,retire=GPU-a@30000,nopower=GPU-c@60000-120000",
    ],
)
def test_simulator_reads_some_devices_as_it_reads_all(spec: str) -> None:
    devices = [SimDevice(f"GPU-{c}", "A100", 81920) for c in "abc"]
    simulator = Simulator(parse_sim_spec(spec), devices, T0)
    for i in range(6):
        start, end = T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS
        whole = simulator.read(start, end)
        assert simulator.read_only(start, end, None) == whole
        for uuid in ("GPU-a", "GPU-b", "GPU-c"):
            assert simulator.read_only(start, end, {uuid}) == (
                {uuid: whole[uuid]} if uuid in whole else {}
            )
    # A fresh simulator asked in another order, and device by device, agrees (no state).
    other = Simulator(parse_sim_spec(spec), devices, T0)
    late = other.read_only(T0 + 5 * MINUTE_MS, T0 + 6 * MINUTE_MS, {"GPU-c"})
    assert late == {
        k: v
        for k, v in simulator.read(T0 + 5 * MINUTE_MS, T0 + 6 * MINUTE_MS).items()
        if k == "GPU-c"
    }


class _Plain:
    """A source with ``read`` only: the agent reads every device."""

    def __init__(self, inner: Simulator) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int]] = []

    def read(self, start_ms: int, end_ms: int) -> Mapping[str, GpuReading]:
        self.calls.append((start_ms, end_ms))
        return self.inner.read(start_ms, end_ms)

    def close(self) -> None:
        pass


class _Pure(_Plain):
    """A pure source: the agent asks for the GPUs due."""

    def __init__(self, inner: Simulator) -> None:
        super().__init__(inner)
        self.asked: list[tuple[int, int, frozenset[str]]] = []

    def read_only(
        self, start_ms: int, end_ms: int, uuids: Collection[str] | None
    ) -> Mapping[str, GpuReading]:
        assert uuids is not None
        self.asked.append((start_ms, end_ms, frozenset(uuids)))
        return self.inner.read_only(start_ms, end_ms, uuids)


def test_a_pure_source_is_asked_for_the_gpus_due_only(tmp_path: Path) -> None:
    cast, terms = _scenario()
    devices = [SimDevice(f"GPU-n1-{i}", "A100", 81920) for i in range(4)]  # GPU-n1-3: unused
    spec = parse_sim_spec("seed=9,unhealthy=GPU-n1-2@300000-600000")
    runs = []
    sources = (_Plain(Simulator(spec, devices, T0)), _Pure(Simulator(spec, devices, T0)))
    for name, source in zip(("plain", "pure"), sources, strict=True):
        clock = SimClock(T0)
        config = AgentConfig("n1", cast.node_key("n1"), tuple(terms), tmp_path / name)
        agent = Agent(config, source, clock)
        clock.advance(HOUR_MS)
        runs.append(agent.tick())
        agent.close()
    plain, pure = sources
    assert isinstance(pure, _Pure)
    # The same signed bytes either way.
    assert runs[0] == runs[1] and len(runs[0]) == 80
    assert pure.calls == []  # never a whole read
    # One read per interval either way: p1's 60, p2's 20 (its grid is 30 s off p1's).
    assert sorted(plain.calls) == sorted((s, e) for s, e, _ in pure.asked)
    assert len(pure.asked) == 80
    for start, end, uuids in pure.asked:
        if (start - T0) % MINUTE_MS == 0:
            assert uuids == {"GPU-n1-0", "GPU-n1-1"}, (start, end)  # p1 on this node
        else:
            assert uuids == {"GPU-n1-2"}, (start, end)  # p2
    assert all("GPU-n1-3" not in u for _, _, u in pure.asked)


def test_a_sealed_event_is_the_same_with_a_known_key_id(tmp_path: Path) -> None:
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock)
    clock.advance(5 * MINUTE_MS)
    envelopes = agent.tick()
    agent.close()
    key = _scenario()[0].node_key("n1")
    for envelope in envelopes:
        event = open_envelope(envelope).record
        assert isinstance(event, UsageEvent)
        fast = seal_event(event, key, key.key_id)
        assert fast == seal_event(event, key)
        assert fast.envelope == envelope == seal(event, [key])
    wrong = seal_event(event, key, "0" * 16)  # the id is taken as given: callers pass the key's
    assert open_envelope(wrong.envelope).envelope.signatures[0].keyid == "0" * 16


@pytest.mark.parametrize(
    "spec",
    [
        "seed=0",
        "seed=11,unhealthy=GPU-b@0-600000",
        "seed=3,claim_healthy=1,unhealthy=GPU-a@0-90000",
    ],
)
def test_simulator_draws_are_random_randoms(spec: str) -> None:
    """The simulator draws each interval's variation as ``random.Random`` seeded with
    "seed/uuid/start/end" would, ``randint`` by ``randint`` (it skips their Python layers):
    the readings of every release so far, whatever the interval's length."""
    parsed = parse_sim_spec(spec)
    devices = [SimDevice(f"GPU-{c}", "A100", 81920) for c in "ab"]
    simulator = Simulator(parsed, devices, T0)
    for i in range(400):
        start, end = T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS - (i % 13) * 997
        readings = simulator.read(start, end)
        for device in devices:
            base = random.Random(f"{parsed.seed}/{device.uuid}").randint(35, 95)
            rng = random.Random(f"{parsed.seed}/{device.uuid}/{start}/{end}")
            sick = any(
                f.uuid == device.uuid and f.overlaps(start - T0, end - T0) for f in parsed.unhealthy
            )
            utilisation = min(100, max(0, base + rng.randint(-10, 10)))
            if sick:
                utilisation = 0
            power = 60_000 + 3_000 * utilisation + rng.randint(0, 5_000)
            used = 81920 * min(95, utilisation + rng.randint(0, 5)) // 100
            xid_errors = rng.randint(1, 3) if sick else 0
            reading = readings[device.uuid]
            assert (reading.utilisation_pct, reading.power_mw, reading.memory_used_mib) == (
                utilisation,
                power,
                used,
            )
            assert reading.xid_errors == xid_errors
            assert reading.energy_mj == power * (end - start) // 1000
            assert reading.healthy is (parsed.claim_healthy or not sick)


def test_the_agents_signer_is_the_keys_sign() -> None:
    """``proto.keys.signer``: the key's own signatures (Ed25519 is deterministic), for
    messages of every size, its buffer grown past the first 4 KiB."""
    key = builders.make_cast("signer").node_key("n1")
    other = builders.make_cast("signer").node_key("n2")
    sign, sign_other = signer(key), signer(other)
    for size in (0, 1, 63, 64, 429, 4032, 4033, 9000, 100, 20_000, 5):
        message = bytes(range(256)) * (size // 256) + bytes(size % 256)
        assert sign(message) == key.sign(message)
        assert sign_other(message) == other.sign(message) != sign(message)


def test_the_hand_off_is_what_opening_the_envelope_gives(tmp_path: Path) -> None:
    """``Agent.hand_off``: each event spooled (faults and all), under the SHA-256 of its
    envelope, is the record ``open_envelope`` decodes from that envelope; taken once;
    beyond its bound the oldest go."""
    clock = SimClock(T0)
    spec = (
        "seed=4,unhealthy=GPU-n1-0@0-600000,xid=79/GPU-n1-1@60000-240000,"
        "ecc=GPU-n1-2@0-300000,retire=GPU-n1-2@120000,nopower=GPU-n1-1@300000-420000,"
        "vanish=GPU-n1-0@900000"
    )
    agent = _agent(tmp_path, clock, spec=spec)
    before = agent.tick()  # nothing due yet: the hand-off starts empty either way
    handed_off = agent.hand_off(50)
    assert agent.hand_off() is handed_off
    clock.advance(20 * MINUTE_MS)
    envelopes = agent.tick()
    agent.close()
    assert before == [] and len(envelopes) == 20 + 18 == len(handed_off)
    for envelope in envelopes:
        opened = open_envelope(envelope)
        taken = handed_off.take(opened.input_hash)
        assert taken is not None and taken == opened.record
        assert handed_off.take(opened.input_hash) is None
    assert len(handed_off) == 0
    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, spec=spec, spool="bounded")
    handed_off = agent.hand_off(45)
    clock.advance(30 * MINUTE_MS)
    more = agent.tick()
    agent.close()
    assert len(more) == 30 + 20 and len(handed_off) == 45  # the 5 oldest dropped
    assert [handed_off.take(open_envelope(e).input_hash) is not None for e in more] == (
        [False] * 5 + [True] * 45
    )


def test_a_node_that_lost_its_spool_goes_on_from_a_signed_resume(tmp_path: Path) -> None:
    """SPEC §6.3 resume, end to end through the ledger's fold: a node reimaged mid-window
    signs seq 0 again without its spool (EQUIVOCATION, the agent logs the one command to
    run); with the resume operator and buyer signed in its config, the new agent's events
    carry from_seq on, chained to the resume, and are billed."""
    from ledger.fold import Fold

    cast, terms = _scenario()
    fold = Fold(cast.ledger)
    for t in terms:
        assert fold.apply(builders.signed_terms(cast, t), f"terms-{t.placement_id}", None)

    def fold_p1(envelopes: list[bytes]) -> list[tuple[str | None, str | None]]:
        out = []
        for i, raw in enumerate(envelopes):
            if open_envelope(raw).record.placement_id == "p1":
                for o in fold.apply(raw, f"p1-{len(out)}-{i}", None):
                    out.append((o.status, None if o.reason is None else o.reason.value))
        return out

    clock = SimClock(T0)
    agent = _agent(tmp_path, clock, spool="spool-1")
    clock.advance(10 * MINUTE_MS)
    assert set(fold_p1(agent.tick())) == {("accepted", None)}
    agent.close()
    delivered = fold.totals("p1")
    assert delivered is not None and delivered.delivered_mgms > 0
    # Reimaged at minute 20: no spool, no resume: seq 0 again.
    clock.advance(10 * MINUTE_MS)
    with structlog.testing.capture_logs() as logs:
        lost = _agent(tmp_path, clock, spool="spool-2")
    warned = [e for e in logs if e["event"] == "stream_without_spool"]
    assert {e["placement"] for e in warned} == {"p1", "p2"}
    assert "gridledger resume --terms TERMS --node n1" in warned[0]["advice"]
    clock.advance(2 * MINUTE_MS)
    assert ("rejected", "EQUIVOCATION") in fold_p1(lost.tick())
    lost.close()
    # Operator and buyer sign the resume at seq 30 from minute 20; the ledger accepts it.
    raw = builders.resume(cast, "p1", "n1", 30, T0 + 20 * MINUTE_MS)
    assert [o.status for o in fold.apply(raw, "resume", None)] == ["accepted"]
    resume_record = open_envelope(raw)
    assert isinstance(resume_record.record, StreamResume)
    cast_terms = _scenario()[1]
    devices = sorted(
        {g.uuid: SimDevice(g.uuid, g.model, g.memory_mib) for t in cast_terms
         for g in node_gpus(t, "n1")}.values(),
        key=lambda d: d.uuid,
    )  # fmt: skip
    resumed = Agent(
        AgentConfig(
            node_id="n1",
            signing_key=cast.node_key("n1"),
            terms=tuple(cast_terms),
            spool_dir=tmp_path / "spool-3",
            interval_ms=MINUTE_MS,
            resumes=((resume_record.record, resume_record.record_hash),),
        ),
        Simulator(parse_sim_spec("seed=7"), devices, T0),
        clock,
    )
    clock.advance(5 * MINUTE_MS)
    events = resumed.tick()
    resumed.close()
    first = next(
        e for e in (open_envelope(r).record for r in events) if isinstance(e, UsageEvent)
        and e.placement_id == "p1"
    )  # fmt: skip
    assert (first.seq, first.prev) == (30, resume_record.record_hash)
    assert set(fold_p1(events)) == {("accepted", None)}
    after = fold.totals("p1")
    assert after is not None and after.delivered_mgms > delivered.delivered_mgms


def test_resume_files_are_checked_before_the_agent_signs(tmp_path: Path) -> None:
    """meter.toml resume_files (SPEC §6.3 resume): a file that is not a resume of this
    node's stream, or that the buyer did not sign, is refused with the file named."""
    from meter.cli import load_resumes
    from proto.terms import TermsError

    cast, terms = _scenario()
    good = tmp_path / "good.json"
    good.write_bytes(builders.resume(cast, "p1", "n1", 30, T0) + b"\n")
    ((record, record_hash),) = load_resumes((good,), "n1", tuple(terms))
    assert (record.from_seq, record_hash) == (
        30,
        open_envelope(good.read_bytes().rstrip()).record_hash,
    )
    cases = {
        "operator-only.json": builders.resume(cast, "p1", "n1", 30, T0, signers=[cast.operator]),
        "other-node.json": builders.resume(cast, "p1", "n2", 30, T0),
        "a-close.json": builders.closed(cast, "p1", T0 + HOUR_MS),
    }
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(TermsError) as caught:
            load_resumes((tmp_path / name,), "n1", tuple(terms))
        assert name in str(caught.value), caught.value
