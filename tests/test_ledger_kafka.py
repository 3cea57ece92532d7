"""The ledger on the real Kafka broker: bad inputs by class, shards, replay from offset 0."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import pytest
from support import ledger_toml
from test_ledger_scenario import (
    EARLY_CLOCK_MS,
    INTERVAL_MS,
    LATE_CLOCK_MS,
    T0_MS,
    WINDOW_MS,
    Scenario,
    build_scenario,
    final_statements,
)

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger.config import KafkaConfig
from ledger.service import KafkaLedgerService, RunReport, fixed_clock
from ledger.store import Store
from proto.envelope import Envelope, Signature, decode_envelope, encode_envelope
from proto.keys import write_key_pair
from transport.kafka import SIMULATION_TOPIC_CONFIG, KafkaSettings, create_topic, publish_kafka

RUN_DEADLINE_S = 60.0


def publish(
    bootstrap: str,
    topic: str,
    items: Sequence[tuple[str, bytes]],
    stated_ms: int | None = None,
) -> None:
    """Publish keyed envelopes (validated by publish_kafka); each stating ``stated_ms`` as
    its producer timestamp when given (a simulation's CreateTime topic, SPEC §6.6)."""
    asyncio.run(
        publish_kafka(
            KafkaSettings(bootstrap=bootstrap, topic=topic),
            items,
            timestamps_ms=None if stated_ms is None else [stated_ms] * len(items),
        )
    )


def publish_raw(bootstrap: str, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
    """Publish arbitrary bytes (garbage, mismatched keys), bypassing publish_kafka's checks."""
    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            async with asyncio.timeout(RUN_DEADLINE_S):
                for key, value in items:
                    await producer.send_and_wait(topic, value=value, key=key)
        finally:
            await producer.stop()

    asyncio.run(send())


def run_ledger(
    db: Path,
    scenario: Scenario,
    bootstrap: str,
    topic: str,
    *,
    clock_ms: int = LATE_CLOCK_MS,
    shard: int = 0,
    shards: int = 1,
    batch_max_records: int = 5,
    done: Callable[[Store], bool] | None = None,
    arrival: Literal["log", "sender"] = "log",
) -> RunReport:
    """Run a ledger shard on ``db`` until caught up with nothing left to close (or ``done``)."""

    async def go() -> RunReport:
        store = Store(db, ledger_public_key=scenario.cast.ledger.public_key)
        kafka = KafkaConfig(
            settings=KafkaSettings(bootstrap=bootstrap, topic=topic), shard=shard, shards=shards
        )
        service = KafkaLedgerService(
            store,
            scenario.cast.ledger,
            kafka,
            clock=fixed_clock(clock_ms),
            batch_max_records=batch_max_records,
            arrival=arrival,
        )
        await service.start()
        try:
            condition = None if done is None else (lambda: done(store))
            return await service.run_until(condition, deadline_s=RUN_DEADLINE_S, idle_poll_ms=100)
        finally:
            await service.stop()
            service.close()

    return asyncio.run(go())


def heads_and_statements(db: Path) -> tuple[dict[str, tuple[int, str]], dict[str, bytes]]:
    """Chain heads and final statements of a stopped ledger's DB."""
    with Store(db) as store:
        return store.heads(), final_statements(store)


# ---- bad inputs -------------------------------------------------------------------------------


def resign_badly(envelope: bytes) -> bytes:
    """``envelope`` with one bit of its first signature flipped (a forged signature)."""
    env = decode_envelope(envelope)
    sig = env.signatures[0]
    broken = bytes([sig.sig[0] ^ 0x01]) + sig.sig[1:]
    return encode_envelope(
        Envelope(payload=env.payload, signatures=[Signature(keyid=sig.keyid, sig=broken)])
    )


def test_each_bad_input_class_is_named_while_good_records_flow(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(2)
    scenario = build_scenario("bad", placements=1, nodes=1, events=6)
    good = scenario.placement_ids[0]
    cast = scenario.cast
    # Placement "bad-x" receives every bad class between good events.
    pid = "bad-x"
    g0, g1 = gpu("bad-x-n0", 0), gpu("bad-x-n0", 1)
    # A node's own rejected event takes its seq for good (SPEC §6.3 usage (3)), so the
    # content-bad events come from nodes n1 and n2 and node n0's good events keep flowing.
    g2, g3 = gpu("bad-x-n1", 0), gpu("bad-x-n2", 0)
    terms = make_terms(cast, pid, [g0, g1, g2, g3], T0_MS, T0_MS + WINDOW_MS, late_grace_ms=300_000)
    writer = StreamWriter(cast.node_key("bad-x-n0"), pid, "bad-x-n0")

    def at(e: int) -> tuple[int, int]:
        return T0_MS + e * INTERVAL_MS, T0_MS + (e + 1) * INTERVAL_MS

    first = writer.event(*at(0), [sample(g0), sample(g1)])
    second = writer.event(*at(1), [sample(g0)])
    ghost_terms_gpu = gpu("ghost-node", 0)
    ghost = StreamWriter(cast.node_key("ghost-node"), pid, "ghost-node").event(
        *at(2), [sample(ghost_terms_gpu)]
    )
    bad_sig = resign_badly(dataclasses.replace(writer).event(*at(2), [sample(g0)]))
    gap = dataclasses.replace(writer, seq=writer.seq + 3).event(*at(2), [sample(g0)])
    equivocation = StreamWriter(cast.node_key("bad-x-n0"), pid, "bad-x-n0").event(
        *at(0), [sample(g1)]
    )
    outside = StreamWriter(cast.node_key("bad-x-n1"), pid, "bad-x-n1").event(
        T0_MS + WINDOW_MS + INTERVAL_MS, T0_MS + WINDOW_MS + 2 * INTERVAL_MS, [sample(g2)]
    )
    foreign_gpu = StreamWriter(cast.node_key("bad-x-n2"), pid, "bad-x-n2").event(
        *at(2), [sample(gpu("bad-x-n2", 7))]
    )
    third = writer.event(*at(2), [sample(g0), sample(g1)])
    # Placement "late-terms": usage arrives before its terms.
    late_gpu = gpu("late-n0", 0)
    late_terms = make_terms(cast, "late-terms", [late_gpu], T0_MS, T0_MS + WINDOW_MS)
    late_writer = StreamWriter(cast.node_key("late-n0"), "late-terms", "late-n0")
    early_events = [late_writer.event(*at(e), [sample(late_gpu)]) for e in range(3)]

    good_inputs = scenario.keyed()
    publish(kafka_bootstrap, topic, good_inputs[:3])
    publish(
        kafka_bootstrap,
        topic,
        [(pid, signed_terms(cast, terms)), (pid, first), (pid, second)]
        + [("late-terms", e) for e in early_events],
    )
    publish(kafka_bootstrap, topic, good_inputs[3:5])
    # A batch boundary lies between the accepted events and these (batch_max_records=5),
    # so the duplicate and the equivocation are judged against committed rows.
    publish(
        kafka_bootstrap,
        topic,
        [
            (pid, ghost),
            (pid, bad_sig),
            (pid, gap),
            (pid, first),  # exact re-delivery
            (pid, equivocation),
            (pid, outside),
            (pid, foreign_gpu),
            (pid, third),
            ("late-terms", signed_terms(cast, late_terms)),
        ],
    )
    publish_raw(
        kafka_bootstrap,
        topic,
        [(pid.encode(), b"\x00garbage{"), (pid.encode(), good_inputs[5][1])],
    )
    publish(kafka_bootstrap, topic, good_inputs[5:])
    db = tmp_path / "bad.duckdb"
    first_run = run_ledger(db, scenario, kafka_bootstrap, topic, clock_ms=EARLY_CLOCK_MS)
    assert first_run.closes_published == 0
    run_ledger(db, scenario, kafka_bootstrap, topic)  # closes everything
    after_close = writer.event(*at(3), [sample(g0)])
    publish(kafka_bootstrap, topic, [(pid, after_close)])
    run_ledger(db, scenario, kafka_bootstrap, topic)

    with Store(db) as store:
        chain = store.query(
            "SELECT kind, status, reason FROM records WHERE placement_id = ? ORDER BY chain_index",
            [pid],
        )
        assert chain == [
            ("terms", "accepted", ""),
            ("usage", "accepted", ""),
            ("usage", "accepted", ""),
            ("usage", "rejected", "NODE_UNKNOWN"),
            ("usage", "rejected", "SIG_INVALID"),
            ("usage", "rejected", "EQUIVOCATION"),
            ("usage", "rejected", "OUTSIDE_WINDOW"),
            ("usage", "rejected", "GPU_NOT_IN_TERMS"),
            ("usage", "accepted", ""),
            # The event beyond the gap waited in its stream; the close flush chains it.
            ("usage", "rejected", "SEQ_GAP"),
            ("closed", "accepted", ""),
            ("usage", "rejected", "AFTER_CLOSE"),
        ]
        assert store.dropped_count(pid) == 1
        quarantined = store.query("SELECT reason, placement_id FROM quarantine ORDER BY 1")
        assert quarantined == [("MALFORMED", None), ("PLACEMENT_MISMATCH", good)]
        late = store.query(
            "SELECT kind, status FROM records WHERE placement_id = 'late-terms' "
            "ORDER BY chain_index"
        )
        assert late == [("terms", "accepted")] + [("usage", "accepted")] * 3 + [
            ("closed", "accepted")
        ]
        # The good placement was untouched by its neighbour's garbage.
        good_chain = store.query(
            "SELECT DISTINCT status FROM records WHERE placement_id = ?", [good]
        )
        assert good_chain == [("accepted",)]
        statement = final_statements(store)[good]
        assert statement
        delivered = store.query(
            "SELECT max(total_delivered_mgms) FROM records WHERE placement_id = ?", [good]
        )
        assert delivered == [(scenario.expected_delivered_mgms(good),)]


# ---- shards and replays -------------------------------------------------------------------------


def test_two_shards_equal_one_and_replay_from_zero_is_identical(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(4)
    scenario = build_scenario("shards", placements=8, nodes=2, events=3)
    publish(kafka_bootstrap, topic, scenario.keyed())
    whole = tmp_path / "whole.duckdb"
    run_ledger(whole, scenario, kafka_bootstrap, topic, batch_max_records=50)
    whole_heads, whole_statements = heads_and_statements(whole)
    assert sorted(whole_heads) == scenario.placement_ids
    assert sorted(whole_statements) == scenario.placement_ids

    shard_heads: list[dict[str, tuple[int, str]]] = []
    shard_statements: dict[str, bytes] = {}
    for shard in (0, 1):
        db = tmp_path / f"shard{shard}.duckdb"
        run_ledger(db, scenario, kafka_bootstrap, topic, shard=shard, shards=2)
        heads, statements = heads_and_statements(db)
        shard_heads.append(heads)
        shard_statements.update(statements)
    assert shard_heads[0] and shard_heads[1]
    assert not set(shard_heads[0]) & set(shard_heads[1])
    assert {**shard_heads[0], **shard_heads[1]} == whole_heads
    assert shard_statements == whole_statements

    # A fresh DB replaying the topic (closes included) from offset 0: identical chains.
    fresh = tmp_path / "fresh.duckdb"
    replay = run_ledger(fresh, scenario, kafka_bootstrap, topic, batch_max_records=3)
    assert replay.closes_published == 0  # every close is already in the stream
    assert heads_and_statements(fresh) == (whole_heads, whole_statements)


@pytest.mark.parametrize("arrival", ["log", "sender"])
def test_a_ledger_on_log_time_refuses_producer_timestamps_in_one_line(
    arrival: str, kafka_bootstrap: str, tmp_topic: Callable[..., str], tmp_path: Path
) -> None:
    """SPEC §6.6: on a CreateTime topic (the producer's clock), a ledger with the default
    ``arrival = "log"`` stops at the first record, exit 2, one FAIL line naming it; only a
    simulation's ``arrival = "sender"`` folds it, with the time the sender stated."""
    cast = make_cast(f"create-time-{arrival}")
    topic = tmp_topic(1, create=False)
    create_topic(kafka_bootstrap, topic, 1, config=SIMULATION_TOPIC_CONFIG)
    terms = make_terms(cast, "p-ct", [gpu("n1", 0)], T0_MS, T0_MS + WINDOW_MS)
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    asyncio.run(
        publish_kafka(settings, [("p-ct", signed_terms(cast, terms))], timestamps_ms=[T0_MS])
    )
    key_file, _ = write_key_pair(cast.ledger, tmp_path / "keys")
    db = tmp_path / "l.duckdb"
    if arrival == "log":
        config = ledger_toml(
            tmp_path / "ledger.toml",
            key_file,
            db=db,
            transport="kafka",
            kafka={"bootstrap": kafka_bootstrap, "topic": topic},
            http="off",
        )
        done = subprocess.run(
            [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        fails = [line for line in done.stderr.splitlines() if line.startswith("FAIL")]
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert len(fails) == 1 and "LogAppendTime" in fails[0] and f"{topic}[0]@0" in fails[0]
        return
    store = Store(db, ledger_public_key=cast.ledger.public_key)
    service = KafkaLedgerService(
        store, cast.ledger, KafkaConfig(settings), clock=fixed_clock(T0_MS), arrival="sender"
    )

    async def run() -> None:
        await service.start()
        try:
            await service.run_until(deadline_s=60.0)
        finally:
            await service.stop()

    try:
        asyncio.run(run())
        (envelope,) = store.record_envelopes("p-ct")
    finally:
        service.close()
    record = decode_envelope(envelope)
    assert b'"arrived_ms":' + str(T0_MS).encode() in record.payload
