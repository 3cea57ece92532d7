"""kill -9 of a ledger process at random points: the result equals an uninterrupted run.

A ledger subprocess (``gridledger ledger run``) consumes a topic while the test publishes
more of the scenario, and is killed with SIGKILL at a random moment, 20 times: during
start-up, mid-batch, while publishing closes. Then one more run finishes the work. The
chain heads and final statements must be byte-identical to those of a ledger that ran
once, uninterrupted, over the same inputs on another topic; and a fresh DB replaying the
killed ledger's topic from offset 0 must reach them too.

Two topics are two logs with two sets of broker times, so "the same inputs" includes when
they arrived: both topics keep the time the publisher states (CreateTime) and the
ledgers take arrival from it (``arrival = "sender"``, SPEC §6.6 simulations).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from support import ledger_toml
from test_ledger_kafka import heads_and_statements, publish, run_ledger
from test_ledger_scenario import (
    EARLY_CLOCK_MS,
    LATE_CLOCK_MS,
    build_scenario,
    ledger_key_file,
)

from devtools.faults.launch import launch
from ledger.issuer import issue_statement
from ledger.store import Store
from transport.kafka import SIMULATION_TOPIC_CONFIG, create_topic

CYCLES_BEFORE_CLOSE = 12
CYCLES_WITH_CLOSE = 8
READY_TIMEOUT_S = 30.0
MAX_KILL_DELAY_S = 0.4


# Every input states the end of the windows: after every event, before any close.
STATED_MS = EARLY_CLOCK_MS


def simulation_topic(bootstrap: str, tmp_topic: Callable[..., str]) -> str:
    """A fresh 2-partition topic keeping the publisher's times (arrival = "sender")."""
    topic = tmp_topic(2, create=False)
    create_topic(bootstrap, topic, 2, config=SIMULATION_TOPIC_CONFIG)
    return topic


def kafka_ledger_config(
    tmp: Path, key_file: Path, bootstrap: str, topic: str, clock_ms: int
) -> Path:
    """``tmp/ledger.toml`` of a Kafka ledger on ``topic``, store ``tmp/kill.duckdb``."""
    return ledger_toml(
        tmp / "ledger.toml",
        key_file,
        ledger_id="kill",
        db="kill.duckdb",
        transport="kafka",
        kafka={"bootstrap": bootstrap, "topic": topic},
        batch_max_records=4,
        http="off",
        clock_ms=clock_ms,
        arrival="sender",
    )


def _start_and_kill(config: Path, log_path: Path, rng: random.Random) -> str:
    """Start a ledger, SIGKILL it at a random moment; say when it was killed."""
    # Forked from the harness's fork server (the package imported once): the start-up
    # kills land in the ledger's own start-up, not in Python's imports.
    process = launch(["ledger", "run", "--config", str(config)], log_path)
    try:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.8))  # somewhere in start-up
            when = "startup"
        else:
            start = log_path.stat().st_size
            deadline = time.monotonic() + READY_TIMEOUT_S
            while b"kafka_assigned" not in log_path.read_bytes()[start:]:
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "ledger did not start consuming"
                time.sleep(0.01)
            # The random kill point; often within the first batches after assignment.
            limit = MAX_KILL_DELAY_S if rng.random() < 0.5 else MAX_KILL_DELAY_S / 10
            time.sleep(rng.uniform(0.0, limit))
            when = "running"
        assert process.poll() is None, f"the ledger exited: {log_path.read_text()[-3000:]}"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL
        return when
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)


def test_kill_nine_at_random_points_equals_uninterrupted_run(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    rng = random.Random(20261130)
    scenario = build_scenario("kill", placements=4, nodes=2, events=20)
    keyed = scenario.keyed()
    # Re-deliveries of already published events: dropped, across restarts too.
    redelivered = [keyed[i] for i in range(5, len(keyed), 17)]
    inputs = keyed + redelivered
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)

    # The uninterrupted reference, on its own topic.
    reference_topic = simulation_topic(kafka_bootstrap, tmp_topic)
    publish(kafka_bootstrap, reference_topic, inputs, STATED_MS)
    reference_db = tmp_path / "reference.duckdb"
    run_ledger(
        reference_db,
        scenario,
        kafka_bootstrap,
        reference_topic,
        batch_max_records=4,
        arrival="sender",
    )
    reference_heads, reference_statements = heads_and_statements(reference_db)
    assert sorted(reference_statements) == scenario.placement_ids

    topic = simulation_topic(kafka_bootstrap, tmp_topic)
    log_path = tmp_path / "ledger.log"
    log_path.touch()
    chunk = -(-len(inputs) // CYCLES_BEFORE_CLOSE)
    kills: list[str] = []
    early = kafka_ledger_config(tmp_path, key_file, kafka_bootstrap, topic, EARLY_CLOCK_MS)
    for cycle in range(CYCLES_BEFORE_CLOSE):
        publish(kafka_bootstrap, topic, inputs[cycle * chunk : (cycle + 1) * chunk], STATED_MS)
        kills.append(_start_and_kill(early, log_path, rng))
    late = kafka_ledger_config(tmp_path, key_file, kafka_bootstrap, topic, LATE_CLOCK_MS)
    for _ in range(CYCLES_WITH_CLOSE):
        kills.append(_start_and_kill(late, log_path, rng))
    assert len(kills) == 20 and "running" in kills

    killed_db = tmp_path / "kill.duckdb"
    with Store(killed_db) as store:
        # Some work survived the kills (each committed batch is whole).
        assert store.counts()["records"] > 0
    run_ledger(killed_db, scenario, kafka_bootstrap, topic, batch_max_records=4, arrival="sender")
    heads, statements = heads_and_statements(killed_db)
    assert heads == reference_heads
    assert statements == reference_statements

    # Statements on request through the head are byte-identical as well.
    with Store(killed_db) as a, Store(reference_db) as b:
        for pid in scenario.placement_ids:
            assert issue_statement(a, scenario.cast.ledger, pid) == issue_statement(
                b, scenario.cast.ledger, pid
            )
        inputs_a = a.query("SELECT count(*), count(DISTINCT input_hash) FROM inputs")
        assert inputs_a == b.query("SELECT count(*), count(DISTINCT input_hash) FROM inputs")

    # A ledger that lost its disk replays the killed run's topic from offset 0.
    fresh_db = tmp_path / "fresh.duckdb"
    run_ledger(fresh_db, scenario, kafka_bootstrap, topic, batch_max_records=64, arrival="sender")
    assert heads_and_statements(fresh_db) == (reference_heads, reference_statements)
