"""The OpenB GPU cluster trace (Alibaba, 2023): its two CSV files, read strictly.

``openb_node_list_gpu_node.csv`` lists the nodes (``sn, cpu_milli, memory_mib, gpu,
model``); ``openb_pod_list_default.csv`` the tasks (``name, cpu_milli, memory_mib,
num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time,
scheduled_time``), times in whole seconds from the trace start. Every row is checked;
a bad one raises TraceError naming the file, the line and the field — a trace we cannot
read exactly is not replayed approximately.

The trace's own GPU usage is computed here, straight from the rows, in exact integers
(milli-GPU-milliseconds: seconds x 1000 -> ms, GPUs x 1000 -> milli-GPU), over the GPU
tasks that ran: ``num_gpu > 0``, ``scheduled_time`` set and ``deletion_time`` after it.

* whole:    num_gpu x 1000     x (deletion_time - scheduled_time) x 1000
* weighted: num_gpu x gpu_milli x (deletion_time - scheduled_time) x 1000

That weighted total is what a replay must deliver, to the milli-GPU-millisecond.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gridledger.replay_limits import MAX_TRACE_NODES, MAX_TRACE_ROW_CHARS, MAX_TRACE_TASKS
from proto.invariant import present

__all__ = [
    "NODE_COLUMNS",
    "NODE_FILE",
    "TASK_COLUMNS",
    "TASK_FILE",
    "Node",
    "Task",
    "Trace",
    "TraceError",
    "TraceUsage",
    "read_nodes",
    "read_tasks",
    "read_trace",
    "trace_usage",
]

NODE_FILE: Final = "openb_node_list_gpu_node.csv"
TASK_FILE: Final = "openb_pod_list_default.csv"
NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS: Final = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
MS_PER_S: Final = 1000
MILLI_PER_GPU: Final = 1000
MAX_GPUS_PER_NODE: Final = 64
_ID_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


class TraceError(ValueError):
    """A trace file that does not follow the format; names file, line and field."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class Node:
    """One GPU node of the cluster, in node-list order."""

    sn: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class Task:
    """One task (pod) of the trace. Times are seconds from the trace start."""

    line: int
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]
    qos: str
    pod_phase: str
    creation_time_s: int
    deletion_time_s: int | None
    scheduled_time_s: int | None

    @property
    def uses_gpu(self) -> bool:
        """The task asked for at least one GPU."""
        return self.num_gpu > 0

    @property
    def ran(self) -> bool:
        """A GPU task that was scheduled and ran for a positive time."""
        return (
            self.num_gpu > 0
            and self.scheduled_time_s is not None
            and self.deletion_time_s is not None
            and self.deletion_time_s > self.scheduled_time_s
        )

    @property
    def duration_s(self) -> int:
        """Seconds from scheduled to deleted (0 for a task that did not run)."""
        if not self.ran:
            return 0
        deleted = present(self.deletion_time_s, "deletion time of a task that ran")
        return deleted - present(self.scheduled_time_s, "scheduled time of a task that ran")


@dataclass(frozen=True, slots=True)
class Trace:
    """Both files of a trace directory."""

    directory: Path
    nodes: tuple[Node, ...]
    tasks: tuple[Task, ...]


@dataclass(frozen=True, slots=True)
class TraceUsage:
    """The trace's own GPU usage, exact (milli-GPU-milliseconds)."""

    gpu_tasks: int
    ran_tasks: int
    whole_mgms: int
    weighted_mgms: int
    weighted_by_qos_mgms: dict[str, int] = field(default_factory=dict)
    gpu_tasks_by_qos: dict[str, int] = field(default_factory=dict)


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every data row, after checking the header exactly."""
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read: {exc.strerror}") from exc
    with handle:
        reader = csv.reader(handle, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(path, 1, "empty file, want a header row")
            if tuple(header) != columns:
                raise TraceError(path, 1, f"header {header} is not {list(columns)}")
            for row in reader:
                line = reader.line_num
                if sum(len(f) for f in row) > MAX_TRACE_ROW_CHARS:
                    raise TraceError(path, line, f"row longer than {MAX_TRACE_ROW_CHARS} chars")
                if len(row) != len(columns):
                    raise TraceError(path, line, f"{len(row)} fields, want {len(columns)}")
                yield line, row
        except csv.Error as exc:
            raise TraceError(path, reader.line_num, f"not CSV: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise TraceError(path, reader.line_num, f"not UTF-8: {exc.reason}") from exc


def _int(path: Path, line: int, column: str, text: str, lo: int, hi: int) -> int:
    # Digits only: no sign, no spaces, no "1e3", no "1.0" — the trace writes plain integers.
    if not text.isascii() or not text.isdigit():
        raise TraceError(path, line, f"{column}={text!r} is not a non-negative integer")
    value = int(text)
    if not lo <= value <= hi:
        raise TraceError(path, line, f"{column}={value} is outside {lo}..{hi}")
    return value


def _ident(path: Path, line: int, column: str, text: str) -> str:
    if not 1 <= len(text) <= 100 or not text[0].isalnum() or set(text) - _ID_CHARS:
        raise TraceError(path, line, f"{column}={text!r} is not an identifier [A-Za-z0-9._:-]")
    return text


_MAX_TIME_S: Final = 10 * 366 * 86_400
_MAX_MILLI: Final = 10**9


def read_nodes(path: Path) -> tuple[Node, ...]:
    """Every node of ``path`` in file order; TraceError on the first bad row."""
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, (sn, cpu, mem, gpus, model) in _rows(path, NODE_COLUMNS):
        if len(nodes) >= MAX_TRACE_NODES:
            raise TraceError(path, line, f"more than {MAX_TRACE_NODES} nodes")
        node = Node(
            sn=_ident(path, line, "sn", sn),
            cpu_milli=_int(path, line, "cpu_milli", cpu, 0, _MAX_MILLI),
            memory_mib=_int(path, line, "memory_mib", mem, 0, _MAX_MILLI),
            gpus=_int(path, line, "gpu", gpus, 0, MAX_GPUS_PER_NODE),
            model=_ident(path, line, "model", model) if model else "",
        )
        if node.gpus > 0 and not node.model:
            raise TraceError(path, line, f"node {sn} has {node.gpus} GPUs but no model")
        _first(seen, sn, path, line, "node")
        nodes.append(node)
    return tuple(nodes)


def _first(seen: set[str], name: str, path: Path, line: int, what: str) -> None:
    """Add ``name`` to ``seen``; a TraceError when it is there already (a row listed twice)."""
    if name in seen:
        raise TraceError(path, line, f"{what} {name} is listed twice")
    seen.add(name)


def _spec(path: Path, line: int, text: str) -> frozenset[str]:
    """``gpu_spec``: empty (any model) or models separated by '|'."""
    if not text:
        return frozenset()
    return frozenset(_ident(path, line, "gpu_spec", part) for part in text.split("|"))


def read_tasks(path: Path) -> tuple[Task, ...]:
    """Every task of ``path`` in file order; TraceError on the first bad row."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for line, row in _rows(path, TASK_COLUMNS):
        name, cpu, mem, num_gpu, gpu_milli, spec, qos, phase, created, deleted, scheduled = row
        if len(tasks) >= MAX_TRACE_TASKS:
            raise TraceError(path, line, f"more than {MAX_TRACE_TASKS} tasks")
        task = Task(
            line=line,
            name=_ident(path, line, "name", name),
            cpu_milli=_int(path, line, "cpu_milli", cpu, 0, _MAX_MILLI),
            memory_mib=_int(path, line, "memory_mib", mem, 0, _MAX_MILLI),
            num_gpu=_int(path, line, "num_gpu", num_gpu, 0, MAX_GPUS_PER_NODE),
            gpu_milli=_int(path, line, "gpu_milli", gpu_milli, 0, MILLI_PER_GPU),
            gpu_spec=_spec(path, line, spec),
            qos=_ident(path, line, "qos", qos),
            pod_phase=_ident(path, line, "pod_phase", phase),
            creation_time_s=_int(path, line, "creation_time", created, 0, _MAX_TIME_S),
            deletion_time_s=(
                _int(path, line, "deletion_time", deleted, 0, _MAX_TIME_S) if deleted else None
            ),
            scheduled_time_s=(
                _int(path, line, "scheduled_time", scheduled, 0, _MAX_TIME_S) if scheduled else None
            ),
        )
        if task.num_gpu > 0 and task.gpu_milli == 0:
            raise TraceError(path, line, f"task {name} asks for {task.num_gpu} GPUs of share 0")
        if task.num_gpu == 0 and task.gpu_milli != 0:
            raise TraceError(path, line, f"task {name} has gpu_milli {task.gpu_milli} and no GPU")
        if task.scheduled_time_s is not None and task.scheduled_time_s < task.creation_time_s:
            raise TraceError(path, line, f"task {name} is scheduled before it was created")
        _first(seen, name, path, line, "task")
        tasks.append(task)
    return tuple(tasks)


def read_trace(directory: Path) -> Trace:
    """Both files of a trace directory."""
    directory = Path(directory)
    return Trace(
        directory=directory,
        nodes=read_nodes(directory / NODE_FILE),
        tasks=read_tasks(directory / TASK_FILE),
    )


def task_weighted_mgms(task: Task) -> int:
    """Milli-GPU-milliseconds a task used, weighted by its share (0 if it did not run)."""
    return task.num_gpu * task.gpu_milli * task.duration_s * MS_PER_S


def trace_usage(tasks: tuple[Task, ...] | list[Task]) -> TraceUsage:
    """The trace's own GPU usage over ``tasks``, straight from the rows (module docstring)."""
    gpu_tasks = [t for t in tasks if t.uses_gpu]
    ran = [t for t in gpu_tasks if t.ran]
    by_qos: Counter[str] = Counter()
    for task in ran:
        by_qos[task.qos] += task_weighted_mgms(task)
    return TraceUsage(
        gpu_tasks=len(gpu_tasks),
        ran_tasks=len(ran),
        whole_mgms=sum(t.num_gpu * MILLI_PER_GPU * t.duration_s * MS_PER_S for t in ran),
        weighted_mgms=sum(task_weighted_mgms(t) for t in ran),
        weighted_by_qos_mgms=dict(sorted(by_qos.items())),
        gpu_tasks_by_qos=dict(sorted(Counter(t.qos for t in gpu_tasks).items())),
    )
