"""Which GPUs each task of a trace gets: a deterministic, time-aware first-fit. Pure.

One placement per GPU task that ran (``Task.ran``), taken in order of
(``scheduled_time``, file line). Its window is [scheduled_time, deletion_time) in
milliseconds after ``epoch_ms``. Its GPUs are chosen by first-fit over the nodes in
node-list order and, inside a node, over the GPUs in index order:

* a node qualifies when its model satisfies the task's ``gpu_spec`` (empty: any model;
  else one of the models separated by '|') and it has ``num_gpu`` GPUs each with at least
  ``gpu_milli`` thousandths free at ``scheduled_time``;
* the task takes the first ``num_gpu`` such GPUs of the first such node: all its GPUs on
  ONE node, ``gpu_milli`` of each (1000: the whole GPU; less: a share of a GPU that other
  tasks share while the shares sum to at most 1000);
* a GPU's share is free again at the ``deletion_time`` of the task that held it.

Because tasks are taken in start order, everything placed earlier started at or before
the current task; their load on a GPU can only fall after that instant, so "free at
``scheduled_time``" means free for the whole window. Only GPUs are allocated: the trace's
CPU and memory requests are not (the replay meters GPUs).

A task no node can take is reported as unplaceable with its reason, never dropped
silently. GPU uuids are ``GPU-<node>-<index>``, their models those of the node list.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from gridledger.trace import MILLI_PER_GPU, MS_PER_S, Node, Task
from proto.invariant import present

__all__ = [
    "Placement",
    "Plan",
    "PlannedGpu",
    "Unplaceable",
    "buyer_index",
    "gpu_uuid",
    "plan_placements",
]


@dataclass(frozen=True, slots=True)
class PlannedGpu:
    """One GPU of a placement and the share of it the placement holds."""

    node_id: str
    index: int
    uuid: str
    model: str
    share_milli: int


@dataclass(frozen=True, slots=True)
class Placement:
    """A task turned into a placement: window, GPUs, QoS and its buyer."""

    placement_id: str
    task: Task
    node_id: str
    gpus: tuple[PlannedGpu, ...]
    window_start_ms: int
    window_end_ms: int
    created_at_ms: int
    interruptible: bool
    buyer: int

    @property
    def share_milli(self) -> int:
        """S: the sum of the shares of the placement's GPUs."""
        return sum(g.share_milli for g in self.gpus)

    @property
    def model(self) -> str:
        """The GPU model (all GPUs of a placement are on one node, so of one model)."""
        return self.gpus[0].model

    @property
    def weighted_mgms(self) -> int:
        """What the placement delivers when every GPU is healthy the whole window."""
        return self.share_milli * (self.window_end_ms - self.window_start_ms)


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """A GPU task that ran in the trace but that no node could take here, and why."""

    task: Task
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Placements in start order, the tasks that could not be placed, the nodes used."""

    placements: tuple[Placement, ...]
    unplaceable: tuple[Unplaceable, ...]
    nodes: tuple[Node, ...]

    @property
    def nodes_used(self) -> tuple[str, ...]:
        """Node ids hosting at least one placement, in node-list order."""
        used = {p.node_id for p in self.placements}
        return tuple(n.sn for n in self.nodes if n.sn in used)


def gpu_uuid(node_id: str, index: int) -> str:
    """The deterministic uuid of GPU ``index`` of ``node_id``."""
    return f"GPU-{node_id}-{index}"


def buyer_index(task_name: str, buyers: int) -> int:
    """Which of ``buyers`` buyers takes a task: SHA-256 of its name, modulo (stable)."""
    if buyers < 1:
        raise ValueError(f"need at least one buyer, got {buyers}")
    return int.from_bytes(hashlib.sha256(task_name.encode()).digest()[:8], "big") % buyers


class _NodeState:
    """Used share per GPU of one node, and the aggregates the scan checks first."""

    __slots__ = ("free_whole", "max_free", "node", "used")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.used = [0] * node.gpus
        self.free_whole = node.gpus
        self.max_free = MILLI_PER_GPU if node.gpus else 0

    def refresh(self) -> None:
        self.free_whole = sum(1 for u in self.used if u == 0)
        self.max_free = MILLI_PER_GPU - min(self.used, default=MILLI_PER_GPU)

    def fit(self, count: int, share_milli: int) -> list[int] | None:
        """The first ``count`` GPU indexes with ``share_milli`` free, or None."""
        if share_milli == MILLI_PER_GPU:
            if self.free_whole < count:
                return None
        elif self.max_free < share_milli:
            return None
        chosen = [i for i, u in enumerate(self.used) if MILLI_PER_GPU - u >= share_milli]
        return chosen[:count] if len(chosen) >= count else None


def _why_not(task: Task, nodes: Sequence[Node]) -> str:
    models = [n for n in nodes if n.gpus > 0 and (not task.gpu_spec or n.model in task.gpu_spec)]
    if not models:
        wanted = "|".join(sorted(task.gpu_spec))
        return f"no node has a GPU of model {wanted}"
    if max(n.gpus for n in models) < task.num_gpu:
        return f"no node of a fitting model has {task.num_gpu} GPUs"
    return (
        f"no node had {task.num_gpu} GPU(s) with {task.gpu_milli}/1000 free "
        f"at scheduled_time {task.scheduled_time_s} s"
    )


def plan_placements(
    nodes: Sequence[Node], tasks: Sequence[Task], *, epoch_ms: int, buyers: int
) -> Plan:
    """Place every task that ran (module docstring); deterministic for the same input."""
    states = [_NodeState(n) for n in nodes if n.gpus > 0]
    ran = sorted((t for t in tasks if t.ran), key=lambda t: (t.scheduled_time_s, t.line))
    releases: list[tuple[int, int, int, int]] = []  # (end_s, state index, gpu, share)
    placements: list[Placement] = []
    unplaceable: list[Unplaceable] = []
    for task in ran:
        start_s = present(task.scheduled_time_s, "scheduled time of a task that ran")
        end_s = present(task.deletion_time_s, "deletion time of a task that ran")
        touched: set[int] = set()
        while releases and releases[0][0] <= start_s:
            _, s, index, share = heapq.heappop(releases)
            states[s].used[index] -= share
            touched.add(s)
        for s in touched:
            states[s].refresh()
        found: tuple[int, list[int]] | None = None
        for s, state in enumerate(states):
            if task.gpu_spec and state.node.model not in task.gpu_spec:
                continue
            if state.node.gpus < task.num_gpu:
                continue
            chosen = state.fit(task.num_gpu, task.gpu_milli)
            if chosen is not None:
                found = (s, chosen)
                break
        if found is None:
            unplaceable.append(Unplaceable(task, _why_not(task, nodes)))
            continue
        s, chosen = found
        state = states[s]
        for index in chosen:
            state.used[index] += task.gpu_milli
            heapq.heappush(releases, (end_s, s, index, task.gpu_milli))
        state.refresh()
        node = state.node
        placements.append(
            Placement(
                placement_id=task.name,
                task=task,
                node_id=node.sn,
                gpus=tuple(
                    PlannedGpu(node.sn, i, gpu_uuid(node.sn, i), node.model, task.gpu_milli)
                    for i in chosen
                ),
                window_start_ms=epoch_ms + start_s * MS_PER_S,
                window_end_ms=epoch_ms + end_s * MS_PER_S,
                created_at_ms=epoch_ms + task.creation_time_s * MS_PER_S,
                interruptible=task.qos == "BE",
                buyer=buyer_index(task.name, buyers),
            )
        )
    return Plan(tuple(placements), tuple(unplaceable), tuple(nodes))
