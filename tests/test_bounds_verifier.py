"""Resource bounds of the verifier (``verifier/limits.py``) and of the trace replay
(``gridledger/replay_limits.py``, ``gridledger/trace.py``).

Files the verifier reads are bounded (trust, proof, record) and a run takes at most
MAX_EXPORTS_PER_RUN exports: one past a bound is unusable input, exit 2 with a message
naming it. The batching bounds keep memory flat and never change a verdict. The replay
refuses a trace past its row, node and task bounds with the file and line.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import full_scenario, small_scenario, verify

from gridledger import trace as trace_module
from gridledger.cli import main as gridledger_main
from gridledger.replay_limits import MAX_BUYERS, MAX_TRACE_NODES, MAX_TRACE_ROW_CHARS
from gridledger.replay_terms import make_replay_cast
from gridledger.trace import (
    MAX_GPUS_PER_NODE,
    NODE_COLUMNS,
    TASK_COLUMNS,
    TraceError,
    read_nodes,
    read_tasks,
)
from proto.trust import MAX_TRUST_FILE_BYTES
from verifier import limits
from verifier.cli import export_paths
from verifier.errors import UnusableInput
from verifier.inclusion import (
    _MAX_PATH,
    decode_proof,
    encode_proof,
    make_inclusion_bundle,
    read_bundle_files,
)
from verifier.workers import OpenPool

# ---- files the verifier reads --------------------------------------------------------------


def _verify_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = gridledger_main(["verify", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_trust_file_of_exactly_max_bytes_is_read_one_more_is_unusable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = small_scenario(tmp_path)
    trust = s.trust_path.read_bytes()
    # JSON allows trailing whitespace: pad the real trust file to exactly the bound.
    padded = tmp_path / "padded-trust.json"
    padded.write_bytes(trust + b" " * (MAX_TRUST_FILE_BYTES - len(trust)))
    assert padded.stat().st_size == MAX_TRUST_FILE_BYTES
    code, out = _verify_cli(capsys, str(s.path), "--trust", str(padded))
    assert code == 0, out
    padded.write_bytes(trust + b" " * (MAX_TRUST_FILE_BYTES - len(trust) + 1))
    code, out = _verify_cli(capsys, str(s.path), "--trust", str(padded))
    assert code == 2 and "is larger than" in out


def test_exports_per_run_up_to_the_bound_then_unusable(tmp_path: Path) -> None:
    # Listing is all the bound needs: empty *.duckdb files, MAX of them, then one more.
    directory = tmp_path / "many"
    directory.mkdir()
    for i in range(limits.MAX_EXPORTS_PER_RUN):
        (directory / f"{i:05d}.duckdb").touch()
    assert len(export_paths([str(directory)])) == limits.MAX_EXPORTS_PER_RUN
    (directory / "one-more.duckdb").touch()
    with pytest.raises(UnusableInput, match=f"more than {limits.MAX_EXPORTS_PER_RUN} exports"):
        export_paths([str(directory)])


def test_the_cli_verifies_a_run_at_the_export_bound_and_refuses_one_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # verifier.cli reads limits.MAX_EXPORTS_PER_RUN at call time: two real exports.
    monkeypatch.setattr(limits, "MAX_EXPORTS_PER_RUN", 2)
    exports = tmp_path / "exports"
    exports.mkdir()
    scenarios = [
        small_scenario(tmp_path, name=f"p-{n}", gpu_index=i) for i, n in enumerate(("a", "b", "c"))
    ]
    for s in scenarios[:2]:
        shutil.copy(s.path, exports)
    trust = str(scenarios[0].trust_path)
    code, out = _verify_cli(capsys, str(exports), "--trust", trust)
    assert code == 0, out
    shutil.copy(scenarios[2].path, exports)
    code, out = _verify_cli(capsys, str(exports), "--trust", trust)
    assert code == 2 and "more than 2 exports" in out
    assert "OK:" not in out  # refused before any export was verified


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """record.json, proof.json, checkpoint.note of record 3 of a small export."""
    tmp = tmp_path_factory.mktemp("bundle")
    s = small_scenario(tmp)
    out = tmp / "bundle"
    make_inclusion_bundle(s.path, 3).write(out)
    return out


def test_proof_file_of_exactly_max_bytes_is_read_one_more_is_unusable(bundle_dir: Path) -> None:
    raw = (bundle_dir / "proof.json").read_bytes()
    at_limit = raw + b" " * (limits.MAX_PROOF_BYTES - len(raw))
    assert decode_proof(at_limit) == decode_proof(raw)
    with pytest.raises(UnusableInput, match=f"larger than {limits.MAX_PROOF_BYTES} bytes"):
        decode_proof(at_limit + b" ")


def test_proof_path_of_max_hashes_is_read_one_more_is_unusable(bundle_dir: Path) -> None:
    proof = decode_proof((bundle_dir / "proof.json").read_bytes())

    def with_hashes(count: int) -> bytes:
        return encode_proof(
            proof.__class__(proof.format, proof.placement_id, 0, 1, [bytes(32)] * count)
        )

    assert len(decode_proof(with_hashes(_MAX_PATH)).hashes) == _MAX_PATH
    with pytest.raises(UnusableInput, match="not an inclusion proof"):
        decode_proof(with_hashes(_MAX_PATH + 1))


def test_record_file_of_exactly_max_bytes_is_read_one_more_is_unusable(
    bundle_dir: Path, tmp_path: Path
) -> None:
    record = (bundle_dir / "record.json").read_bytes()
    padded = tmp_path / "record.json"
    padded.write_bytes(record + b"\n" * (limits.MAX_RECORD_FILE_BYTES - len(record)))
    proof, note = bundle_dir / "proof.json", bundle_dir / "checkpoint.note"
    assert read_bundle_files(padded, proof, note)[0] == record.rstrip(b"\n")
    padded.write_bytes(record + b"\n" * (limits.MAX_RECORD_FILE_BYTES - len(record) + 1))
    with pytest.raises(UnusableInput, match="larger than any record envelope"):
        read_bundle_files(padded, proof, note)


class _Feeder(threading.Thread):
    """Writes up to ``total`` bytes into a FIFO; counts what the reader took before closing."""

    def __init__(self, path: Path, total: int) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.total = total
        self.written = 0

    def run(self) -> None:
        deadline = time.monotonic() + 30.0
        while True:  # wait (bounded) for the reader to open the FIFO
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    return
                time.sleep(0.005)
        os.set_blocking(fd, True)
        chunk = b" " * 65536
        try:
            while self.written < self.total:
                self.written += os.write(fd, chunk[: self.total - self.written])
        except BrokenPipeError:
            pass  # the reader stopped early: what a bounded read does
        finally:
            os.close(fd)


@pytest.mark.parametrize(
    ("which", "bound"),
    [
        ("trust", MAX_TRUST_FILE_BYTES),
        ("record", limits.MAX_RECORD_FILE_BYTES),
        ("proof", limits.MAX_PROOF_BYTES),
        ("checkpoint", 64 * 1024),  # MAX_NOTE_BYTES: the note parser's bound
    ],
)
def test_bundle_and_trust_files_are_read_no_further_than_their_bound(
    tmp_path: Path, bundle_dir: Path, which: str, bound: int
) -> None:
    trust = small_scenario(tmp_path).trust_path
    paths = {
        "trust": trust,
        "record": bundle_dir / "record.json",
        "proof": bundle_dir / "proof.json",
        "checkpoint": bundle_dir / "checkpoint.note",
    }
    fifo = tmp_path / f"{which}.fifo"
    os.mkfifo(fifo)
    paths[which] = fifo
    feeder = _Feeder(fifo, bound + 16 * 1024 * 1024)
    feeder.start()
    argv = ["verify", "inclusion", "--trust", str(paths["trust"])]
    for name in ("record", "proof", "checkpoint"):
        argv += [f"--{name}", str(paths[name])]
    code = gridledger_main(argv)
    feeder.join(timeout=30.0)
    assert code in (1, 2)  # refused: unusable (2), or an oversize note as a finding (1)
    # A bounded read takes bound + 1 bytes (plus what the pipe buffered) and stops.
    assert feeder.written <= bound + 1 + 1024 * 1024, feeder.written


# ---- batching bounds never change a verdict ---------------------------------------------------


def _summary(report: Any) -> tuple[Any, ...]:
    return (report.verdict, report.totals, report.head_index, report.findings.counts)


def test_tiny_batches_and_one_batch_in_flight_give_the_same_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "s").mkdir()
    honest = full_scenario(tmp_path / "s")
    tampered = tmp_path / "tampered.duckdb"
    shutil.copy(honest.path, tampered)
    with duckdb.connect(str(tampered)) as con:  # every usage row's column disagrees
        con.execute("UPDATE usage_events SET start_ms = start_ms + 1")
    expected = [
        _summary(verify(honest.path, honest.trust)),
        _summary(verify(tampered, honest.trust)),
    ]
    assert expected[0][0] == "verified" and expected[1][0] != "verified", expected
    monkeypatch.setattr(limits, "CHAIN_BATCH_INDICES", 3)
    monkeypatch.setattr(limits, "OPEN_CHUNK_ROWS", 2)
    monkeypatch.setattr(limits, "MAX_BATCHES_IN_FLIGHT", 1)
    from verifier.verify import verify_export

    with OpenPool[Any]("thread", 2) as pool:
        got = [
            _summary(verify_export(honest.path, honest.trust, pool=pool)),
            _summary(verify_export(tampered, honest.trust, pool=pool)),
        ]
    assert got == expected


@pytest.mark.parametrize("in_flight", [1, 4])
def test_the_pool_keeps_at_most_max_batches_in_flight(
    monkeypatch: pytest.MonkeyPatch, in_flight: int
) -> None:
    monkeypatch.setattr(limits, "MAX_BATCHES_IN_FLIGHT", in_flight)
    produced = 0

    def batches() -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
        nonlocal produced
        for n in range(20):
            produced += 1
            yield n, [(n, b"not an envelope")] * 3

    ahead = []
    with OpenPool[int]("thread", 2) as pool:
        for n, results in pool.run(batches(), {}):
            ahead.append(produced - n - 1)  # batches read but not yet handed back
            assert [r.tag for r in results] == [n] * 3
    assert len(ahead) == 20
    assert max(ahead) == in_flight - 1  # the reader never runs further ahead than that


# ---- the trace replay -----------------------------------------------------------------------


def _csv(path: Path, columns: tuple[str, ...], rows: list[str]) -> Path:
    path.write_text(",".join(columns) + "\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return path


def _spec_of_length(length: int) -> str:
    """A gpu_spec ('|'-separated model names, each at most 100 characters) of ``length``."""
    parts, left = [], length
    while left > 100:
        parts.append("m" * 99)
        left -= 100  # 99 characters and a '|'
    parts.append("m" * left)
    return "|".join(parts)


def _task_row(spec: str, name: str = "t1") -> str:
    return f"{name},1000,1024,1,1000,{spec},LS,Running,0,100,10"


def test_a_trace_row_of_max_chars_is_read_one_more_is_refused(tmp_path: Path) -> None:
    fixed = sum(len(f) for f in _task_row("").split(","))
    spec = _spec_of_length(MAX_TRACE_ROW_CHARS - fixed)
    row = _task_row(spec)
    assert sum(len(f) for f in row.split(",")) == MAX_TRACE_ROW_CHARS
    (task,) = read_tasks(_csv(tmp_path / "ok.csv", TASK_COLUMNS, [row]))
    assert task.gpu_spec == frozenset(spec.split("|"))
    longer = _task_row(_spec_of_length(MAX_TRACE_ROW_CHARS - fixed + 1))
    path = _csv(tmp_path / "long.csv", TASK_COLUMNS, [_task_row("A100", "t0"), longer])
    with pytest.raises(TraceError, match=f"long.csv:3: row longer than {MAX_TRACE_ROW_CHARS}"):
        read_tasks(path)


def test_max_trace_nodes_are_read_one_more_is_refused(tmp_path: Path) -> None:
    rows = [f"node-{i},1000,1024,1,A100" for i in range(MAX_TRACE_NODES + 1)]
    nodes = read_nodes(_csv(tmp_path / "ok.csv", NODE_COLUMNS, rows[:MAX_TRACE_NODES]))
    assert len(nodes) == MAX_TRACE_NODES
    with pytest.raises(TraceError, match=f":{MAX_TRACE_NODES + 2}: more than {MAX_TRACE_NODES}"):
        read_nodes(_csv(tmp_path / "past.csv", NODE_COLUMNS, rows))


def test_max_trace_tasks_are_read_one_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gridledger.trace reads MAX_TRACE_TASKS at call time; the real bound is 1 000 000
    # rows (seconds of parsing), the code path is the same.
    monkeypatch.setattr(trace_module, "MAX_TRACE_TASKS", 50)
    rows = [_task_row("A100", f"t{i}") for i in range(51)]
    assert len(read_tasks(_csv(tmp_path / "ok.csv", TASK_COLUMNS, rows[:50]))) == 50
    with pytest.raises(TraceError, match=":52: more than 50 tasks"):
        read_tasks(_csv(tmp_path / "past.csv", TASK_COLUMNS, rows))


def test_gpus_per_node_and_per_task_up_to_max_gpus_per_node(tmp_path: Path) -> None:
    ok = f"n1,1000,1024,{MAX_GPUS_PER_NODE},A100"
    assert read_nodes(_csv(tmp_path / "n.csv", NODE_COLUMNS, [ok]))[0].gpus == MAX_GPUS_PER_NODE
    past = f"n1,1000,1024,{MAX_GPUS_PER_NODE + 1},A100"
    with pytest.raises(TraceError, match=f"gpu={MAX_GPUS_PER_NODE + 1} is outside"):
        read_nodes(_csv(tmp_path / "m.csv", NODE_COLUMNS, [past]))
    task = f"t1,1000,1024,{MAX_GPUS_PER_NODE},1000,,LS,Running,0,100,10"
    read_tasks(_csv(tmp_path / "t.csv", TASK_COLUMNS, [task]))
    task = f"t1,1000,1024,{MAX_GPUS_PER_NODE + 1},1000,,LS,Running,0,100,10"
    with pytest.raises(TraceError, match=f"num_gpu={MAX_GPUS_PER_NODE + 1} is outside"):
        read_tasks(_csv(tmp_path / "u.csv", TASK_COLUMNS, [task]))


def test_buyers_of_a_replay_are_one_to_max_buyers() -> None:
    assert len(make_replay_cast("bounds", MAX_BUYERS).buyers) == MAX_BUYERS
    for bad in (0, MAX_BUYERS + 1):
        with pytest.raises(ValueError, match=f"buyers must be 1..{MAX_BUYERS}"):
            make_replay_cast("bounds", bad)
