"""Failover on a three-node Kafka cluster: nothing lost, nothing doubled, same chains.

Replication factor 3, ``min.insync.replicas=2``, idempotent producers with ``acks=all``
(the agents' shippers) and a ledger committing offsets with its results: a broker may
die under them. The fault harness (``devtools.faults``) runs seed ``SEED`` for real —
two ``gridledger meter run`` agents shipping, a ``gridledger ledger run`` consuming —
while ``ClusterControl`` SIGKILLs the leader of the busiest partition (mid-stream),
waits for a new leader, and starts it again; then the same for the active controller.
The harness's end-of-run checks then hold as on one broker:

* every event that reached a spool is chained exactly once, decided as in the fault-free
  run; per placement, messages = chained + dropped duplicates;
* every placement is single-source here, so chain heads and final statements are equal
  byte for byte to the fault-free run's (agents in-process, no Kafka, no kill), and to a
  fault-free fold of the same stream;
* every export verifies (``gridledger verify``, exit 0, witnessed by both parties).

The clean rolling restart of all three nodes is behind ``--run-slow`` (about a minute
more, three JVM restarts each waiting for the replicas to catch up).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from devtools.faults import (
    Fault,
    FaultKind,
    FaultReport,
    Schedule,
    generate_scenario,
    run_seed,
)
from devtools.faults.cluster import ClusterControl, ClusterEvent, KillTarget
from devtools.faults.scenario import INTERVAL_MS, Scenario
from devtools.kafka_cluster import KafkaCluster
from transport.kafka import MIN_INSYNC_REPLICAS, REPLICATION_FACTOR

# Two nodes (f55-n0 with two placements, f55-n1 with one), every placement on one node,
# four partitions; terms that arrive mid-stream (held inputs), reclaims, late records.
SEED = 55

AGENT_SECONDS = 150.0
"""Wall time the paced agents would take for their whole early phase: far longer than
the faults need even on a loaded machine, so both agents are still shipping at every
fault (the harness hurries them, unpaced, once the faults are done)."""

MIN_PROGRESS = 5
"""Messages the agents must have shipped since the last fault before the next kill."""

OUTAGE_S = 1.0
"""How long a killed node stays down before it is started again (after a new leader)."""

FAILOVER_BOUND_S = 30.0
"""A new leader (partition or controller) must be elected within this after a kill: the
broker session timeout (3 s) and a controller election (~1-2 s) with room for a loaded
machine."""


def _schedule(scenario: Scenario, kinds: list[FaultKind]) -> Schedule:
    steps = 1
    for plan in scenario.nodes:
        epoch_ms = min(t.window_start_ms for t in scenario.node_terms(plan.node_id))
        steps = max(steps, (max(s.until_ms for s in plan.segments) - epoch_ms) // INTERVAL_MS)
    faults = tuple(Fault("early", kind, delay_s=OUTAGE_S) for kind in kinds)
    return Schedule(faults, terms_after=1, pace_ms=int(AGENT_SECONDS * 1000 / steps))


def _run(
    tmp_path: Path, cluster: KafkaCluster, kinds: list[FaultKind], kills: list[KillTarget]
) -> tuple[FaultReport, list[ClusterEvent], Scenario]:
    scenario = generate_scenario(SEED)
    assert len(scenario.nodes) == 2, scenario.describe()
    assert all(scenario.single_source(p) for p in scenario.placement_ids)
    topic = f"cluster-failover.{uuid.uuid4().hex[:8]}"
    control = ClusterControl(
        cluster,
        topic,
        scenario.partitions,
        kills=kills or ["controller"],
        min_progress=MIN_PROGRESS,
        start_messages=len(scenario.pre),  # published before the agents start
    )
    report = run_seed(
        SEED,
        bootstrap=cluster.bootstrap,
        broker=control,
        workdir=tmp_path / f"seed-{SEED}",
        cycles=len(kinds),
        schedule=_schedule(scenario, kinds),
        topic=topic,
        replication_factor=REPLICATION_FACTOR,
    )
    print(report.summary())
    for event in control.events:
        print(event)
    # The topic really is replicated as production runs it.
    states = cluster.describe(topic)
    assert len(states) == scenario.partitions
    assert all(len(s.replicas) == REPLICATION_FACTOR and s.in_sync for s in states.values())
    assert report.unexplained_exits() == [], report.summary()
    assert report.total_cycles == len(kinds), report.summary()
    assert report.exports_verified == len(scenario.placement_ids)
    assert report.spooled_seen > 0 and report.topic_messages >= report.spooled_seen
    # Both agents were running through every outage and shipped again after it.
    outages = [line for line in report.log if re.search(r"broker_(kill|restart): down", line)]
    assert len(outages) == len(kinds), report.log
    assert all(", 2 agent(s) shipping again" in line for line in outages), outages
    return report, control.events, scenario


def test_leader_and_controller_sigkilled_mid_stream(
    tmp_path: Path, kafka_cluster: KafkaCluster
) -> None:
    assert MIN_INSYNC_REPLICAS == 2
    report, events, scenario = _run(
        tmp_path,
        kafka_cluster,
        [FaultKind.BROKER_KILL, FaultKind.BROKER_KILL],
        ["partition_leader", "controller"],
    )
    leader, controller = events
    assert leader.kind == "partition_leader" and controller.kind == "controller"
    # The partition leader was killed mid-stream: the agents had shipped some of their
    # events (beyond what the harness published first), and not all of them.
    shipped_before = leader.messages_before - len(scenario.pre)
    assert MIN_PROGRESS <= shipped_before < report.spooled_seen, (leader, report.spooled_seen)
    assert 0 <= leader.partition < scenario.partitions
    for event in events:
        assert event.new_leader not in (-1, event.node), event
        assert event.failover_s < FAILOVER_BOUND_S, event
        assert event.node in kafka_cluster.node_ids


@pytest.mark.slow
def test_clean_rolling_restart_mid_stream(tmp_path: Path, kafka_cluster: KafkaCluster) -> None:
    """All three nodes restarted in turn (SIGTERM, controlled shutdown) while the agents
    ship and the ledger consumes (``--run-slow``: about a minute of restarts)."""
    _, events, _ = _run(tmp_path, kafka_cluster, [FaultKind.BROKER_RESTART], [])
    assert [e.kind for e in events] == ["rolling_restart"]


def test_replicated_topic_settings() -> None:
    from transport.kafka import EVENT_SOURCED_TOPIC_CONFIG, replicated_topic_config

    three = replicated_topic_config(3)
    assert three == {**EVENT_SOURCED_TOPIC_CONFIG, "min.insync.replicas": "2"}
    assert three["retention.ms"] == "-1" and three["message.timestamp.type"] == "LogAppendTime"
    # Below three replicas, requiring two in sync would stop every write while one is down.
    assert replicated_topic_config(1)["min.insync.replicas"] == "1"
    assert replicated_topic_config(2)["min.insync.replicas"] == "1"
    assert replicated_topic_config(5)["min.insync.replicas"] == "2"
    with pytest.raises(ValueError):
        replicated_topic_config(0)


def test_cluster_command_without_a_cluster_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devtools.kafka_cluster import main

    for command in (["status"], ["kill", "1"], ["restart", "2"], ["create-topic", "t"]):
        assert main(["--workdir", str(tmp_path / "none"), *command]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: no cluster state in ") and err.count("\n") == 1, err
    assert main(["--workdir", str(tmp_path / "none"), "stop"]) == 0  # nothing to stop
