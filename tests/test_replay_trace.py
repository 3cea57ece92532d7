"""The trace reader: the full OpenB files reproduce their published numbers; bad rows are
refused with file:line; the excerpt in tests/data is a faithful copy of trace rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from devtools.openb import openb_trace
from gridledger.trace import (
    NODE_FILE,
    TASK_COLUMNS,
    TASK_FILE,
    TraceError,
    read_nodes,
    read_tasks,
    read_trace,
    trace_usage,
)

FULL_TRACE = openb_trace()
EXCERPT = Path(__file__).parent / "data" / "openb_excerpt"
MGMS_PER_GPU_HOUR = 3_600_000_000


def _independent_usage(path: Path) -> tuple[int, int, int, int]:
    """(GPU tasks, ran, whole mgms, weighted mgms) with nothing but the csv module."""
    gpu_tasks = ran = whole = weighted = 0
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["num_gpu"]) == 0:
                continue
            gpu_tasks += 1
            if row["scheduled_time"] == "" or row["deletion_time"] == "":
                continue
            seconds = int(row["deletion_time"]) - int(row["scheduled_time"])
            if seconds <= 0:
                continue
            ran += 1
            whole += int(row["num_gpu"]) * 1000 * seconds * 1000
            weighted += int(row["num_gpu"]) * int(row["gpu_milli"]) * seconds * 1000
    return gpu_tasks, ran, whole, weighted


def test_full_trace_reproduces_its_published_gpu_hours() -> None:
    assert (FULL_TRACE / TASK_FILE).is_file(), (
        f"the full trace is missing at {FULL_TRACE} (set GRIDLEDGER_OPENB_TRACE)"
    )
    trace = read_trace(FULL_TRACE)
    assert len(trace.nodes) == 1213
    assert len(trace.tasks) == 8152
    usage = trace_usage(trace.tasks)
    # The README of the trace: 7,064 GPU tasks, 59,612 GPU-hours whole, 51,471 weighted.
    assert usage.gpu_tasks == 7064
    assert round(usage.whole_mgms / MGMS_PER_GPU_HOUR) == 59_612
    assert round(usage.weighted_mgms / MGMS_PER_GPU_HOUR) == 51_471
    assert usage.gpu_tasks_by_qos == {"BE": 2948, "Burstable": 99, "Guaranteed": 6, "LS": 4011}
    # And to the milli-GPU-millisecond, against a second reading of the same file.
    assert (usage.gpu_tasks, usage.ran_tasks, usage.whole_mgms, usage.weighted_mgms) == (
        _independent_usage(FULL_TRACE / TASK_FILE)
    )
    assert sum(usage.weighted_by_qos_mgms.values()) == usage.weighted_mgms


def test_excerpt_rows_are_rows_of_the_full_trace() -> None:
    for name in (NODE_FILE, TASK_FILE):
        full_lines = (FULL_TRACE / name).read_text().splitlines()
        full = set(full_lines)
        excerpt = (EXCERPT / name).read_text().splitlines()
        assert excerpt[0] == full_lines[0]
        assert len(excerpt) < len(full_lines) // 3
        missing = [line for line in excerpt if line not in full]
        assert missing == [], f"{name}: rows not in the full trace: {missing[:3]}"
    assert "Weng et al." in (EXCERPT / "README.md").read_text()


def test_excerpt_usage_matches_an_independent_reading() -> None:
    usage = trace_usage(read_trace(EXCERPT).tasks)
    assert (usage.gpu_tasks, usage.ran_tasks, usage.whole_mgms, usage.weighted_mgms) == (
        _independent_usage(EXCERPT / TASK_FILE)
    )
    assert usage.ran_tasks > 200 and usage.weighted_mgms > 0


_HEADER = ",".join(TASK_COLUMNS)
_GOOD = "pod-1,1000,2048,1,500,,LS,Running,10,100,20"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("", 1, "empty file"),
        ("name,cpu\n", 1, "header"),
        (f"{_HEADER}\n{_GOOD},extra\n", 2, "12 fields"),
        (f"{_HEADER}\n{_GOOD}\npod-2,1000\n", 3, "2 fields"),
        (f"{_HEADER}\npod-1,1000,2048,one,500,,LS,Running,10,100,20\n", 2, "num_gpu"),
        (f"{_HEADER}\npod-1,1000,2048,1,-5,,LS,Running,10,100,20\n", 2, "gpu_milli"),
        (f"{_HEADER}\npod-1,1000,2048,1,1500,,LS,Running,10,100,20\n", 2, "outside"),
        (f"{_HEADER}\npod-1,1000,2048,1,0,,LS,Running,10,100,20\n", 2, "share 0"),
        (f"{_HEADER}\npod-1,1000,2048,0,500,,LS,Running,10,100,20\n", 2, "no GPU"),
        (f"{_HEADER}\npod-1,1000,2048,1,500,,LS,Running,10,100,1.5\n", 2, "scheduled_time"),
        (f"{_HEADER}\npod-1,1000,2048,1,500,,LS,Running,30,100,20\n", 2, "before it was"),
        (f"{_HEADER}\n{_GOOD}\n{_GOOD}\n", 3, "twice"),
        (f"{_HEADER}\npod 1,1000,2048,1,500,,LS,Running,10,100,20\n", 2, "identifier"),
        (f"{_HEADER}\npod-1,1000,2048,1,500,T4||A10,LS,Running,10,100,20\n", 2, "gpu_spec"),
        (f'{_HEADER}\n"pod-1,1000\n', 2, "not CSV"),
        (f"{_HEADER}\npod-1,1000,2048,1,500,,L\xff,Running,10,100,20\n", 2, "identifier"),
    ],
)
def test_bad_task_rows_are_refused_with_file_and_line(
    tmp_path: Path, text: str, line: int, needle: str
) -> None:
    path = tmp_path / TASK_FILE
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceError) as caught:
        read_tasks(path)
    assert caught.value.line == line
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert needle in str(caught.value)


def test_non_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / TASK_FILE
    path.write_bytes(f"{_HEADER}\n".encode() + b"pod-\xff,1,1,1,500,,LS,Running,10,100,20\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_tasks(path)


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("n-1,64000,262144,2,", "no model"),
        ("n-1,64000,262144,99,T4", "gpu=99"),
        ("n-1,64000,x,2,T4", "memory_mib"),
    ],
)
def test_bad_node_rows_are_refused(tmp_path: Path, row: str, needle: str) -> None:
    path = tmp_path / NODE_FILE
    path.write_text(f"sn,cpu_milli,memory_mib,gpu,model\n{row}\n")
    with pytest.raises(TraceError, match=needle) as caught:
        read_nodes(path)
    assert caught.value.line == 2


def test_a_node_listed_twice_is_refused_at_its_second_row(tmp_path: Path) -> None:
    path = tmp_path / NODE_FILE
    row = "n-1,64000,262144,2,T4"
    path.write_text(f"sn,cpu_milli,memory_mib,gpu,model\n{row}\nn-2,1,1,0,\n{row}\n")
    with pytest.raises(TraceError, match="node n-1 is listed twice") as caught:
        read_nodes(path)
    assert caught.value.line == 4


def test_gpu_spec_lists_models_and_empty_times_are_none(tmp_path: Path) -> None:
    path = tmp_path / TASK_FILE
    path.write_text(
        f"{_HEADER}\npod-0,1000,2048,2,1000,V100M32|G3,BE,Pending,10,,\n{_GOOD}\n",
        encoding="utf-8",
    )
    first, second = read_tasks(path)
    assert first.gpu_spec == frozenset({"V100M32", "G3"})
    assert first.scheduled_time_s is None and first.deletion_time_s is None
    assert not first.ran and first.duration_s == 0
    assert second.gpu_spec == frozenset() and second.ran and second.duration_s == 80
    usage = trace_usage([first, second])
    assert (usage.gpu_tasks, usage.ran_tasks) == (2, 1)
    assert usage.weighted_mgms == 1 * 500 * 80 * 1000
    assert usage.whole_mgms == 1 * 1000 * 80 * 1000
