"""The fault harness's broker faults on a three-node cluster (``devtools.kafka_cluster``).

``ClusterControl`` is the ``BrokerControl`` the runner drives (``kill()``, a pause, then
``restart()``; or ``restart(hard=False)`` alone for a clean restart), aimed at the node
that matters at that moment:

* ``"partition_leader"`` — the leader of the busiest partition of the run's topic (the
  most messages so far), once the agents have shipped ``min_progress`` more messages
  since the last fault, or since ``start_messages`` (so the kill lands mid-stream).
  Before it is started again, a new leader from the in-sync replicas must have taken
  the partition over;
* ``"controller"`` — the active controller (the KRaft quorum leader); before it is
  started again, the two others must have elected a new one;
* a ``restart()`` with no node down is a clean **rolling restart** of all three, each
  node back in sync before the next (``KafkaCluster.rolling_restart``).

The kill targets are taken in the order given (``kills``). Every fault is recorded in
``events`` (which node, which partition, how long the failover took) for the tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from devtools.faults.topic import end_offsets
from devtools.kafka_cluster import IN_SYNC_TIMEOUT_S, KafkaCluster
from devtools.kafka_fetch import KafkaLauncherError
from transport.kafka import KafkaSettings

__all__ = [
    "PROGRESS_TIMEOUT_S",
    "ClusterControl",
    "ClusterEvent",
    "KillTarget",
]

KillTarget = Literal["partition_leader", "controller"]

PROGRESS_TIMEOUT_S: Final = 60.0
"""Longest wait for the agents to ship ``min_progress`` messages before a kill."""

POLL_S: Final = 0.1
"""Pause between two looks at the topic or the cluster while waiting."""


@dataclass(frozen=True)
class ClusterEvent:
    """One fault on the cluster, as it happened."""

    kind: str  # "partition_leader" | "controller" | "rolling_restart"
    node: int  # the node killed (0 for a rolling restart)
    partition: int = -1  # the busiest partition, for a partition leader kill
    messages_before: int = 0  # messages in the topic when the node was killed
    new_leader: int = -1  # who took over (the partition's leader or the controller)
    failover_s: float = 0.0  # kill -> a new leader elected
    back_in_sync_s: float = 0.0  # restart -> every replica in sync again


class ClusterControl:
    """``BrokerControl`` for the fault harness on a ``KafkaCluster`` (module doc)."""

    def __init__(
        self,
        cluster: KafkaCluster,
        topic: str,
        partitions: int,
        *,
        kills: Sequence[KillTarget] = ("partition_leader",),
        min_progress: int = 10,
        start_messages: int = 0,
    ) -> None:
        if not kills:
            raise ValueError("kills names at least one target")
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.kills = tuple(kills)
        self.min_progress = min_progress
        self.events: list[ClusterEvent] = []
        self._next_kill = 0
        self._down: ClusterEvent | None = None
        self._killed_at = 0.0
        # Messages in the topic before the agents ship (what the harness publishes first):
        # the first kill waits for `min_progress` more than these.
        self._messages_at_last_fault = start_messages

    def _offsets(self) -> dict[int, int]:
        return end_offsets(
            KafkaSettings(bootstrap=self.cluster.running_bootstrap(), topic=self.topic),
            self.partitions,
        )

    def _wait_progress(self) -> dict[int, int]:
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while True:
            offsets = self._offsets()
            if sum(offsets.values()) >= self._messages_at_last_fault + self.min_progress:
                return offsets
            if time.monotonic() >= deadline:
                raise KafkaLauncherError(
                    f"the topic {self.topic} did not grow by {self.min_progress} messages "
                    f"within {PROGRESS_TIMEOUT_S:.0f} s (at {sum(offsets.values())})"
                )
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL the next target (``kills``), mid-stream; its data is kept."""
        if self._down is not None:
            raise KafkaLauncherError(f"node {self._down.node} is down already")
        target = self.kills[self._next_kill % len(self.kills)]
        self._next_kill += 1
        offsets = self._wait_progress()
        partition = -1
        if target == "partition_leader":
            partition = max(sorted(offsets), key=lambda p: offsets[p])
            node = self.cluster.leader_of(self.topic, partition)
        else:
            leader = self.cluster.quorum_leader()
            if leader is None:
                raise KafkaLauncherError("no node records an active controller")
            node = leader
        self.cluster.kill(node)
        self._killed_at = time.monotonic()
        self._messages_at_last_fault = sum(offsets.values())
        self._down = ClusterEvent(target, node, partition, sum(offsets.values()))

    def restart(self, *, hard: bool = False) -> None:
        """Start the killed node again once the others have taken over (a new leader of
        its partition, or a new controller), and wait until every replica is in sync;
        with no node down, restart all three in turn."""
        down = self._down
        if down is None:
            started = time.monotonic()
            self.cluster.rolling_restart(hard=hard)
            self.events.append(
                ClusterEvent("rolling_restart", 0, back_in_sync_s=time.monotonic() - started)
            )
            self._messages_at_last_fault = sum(self._offsets().values())
            return
        if down.kind == "controller":
            new_leader = self.cluster.wait_quorum_leader(other_than=down.node)
        else:
            new_leader = self._wait_partition_leader(down)
        failover_s = time.monotonic() - self._killed_at
        started = time.monotonic()
        self.cluster.restart_node(down.node)
        self.events.append(
            ClusterEvent(
                down.kind,
                down.node,
                down.partition,
                down.messages_before,
                new_leader,
                failover_s,
                time.monotonic() - started,
            )
        )
        self._down = None

    def _wait_partition_leader(self, down: ClusterEvent) -> int:
        deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
        while True:
            state = self.cluster.describe(self.topic).get(down.partition)
            if state is not None and state.leader not in (-1, down.node):
                return state.leader
            if time.monotonic() >= deadline:
                raise KafkaLauncherError(
                    f"{self.topic}[{down.partition}] got no new leader within "
                    f"{IN_SYNC_TIMEOUT_S:.0f} s after node {down.node} was killed: {state}"
                )
            time.sleep(POLL_S)
