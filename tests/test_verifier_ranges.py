"""Workers that read their own chain-index ranges (``verifier/walk.py``, ``open_ranges``):
the process pool's pass must give exactly the report of the ordinary pass, on honest and
tampered exports alike, including the fast pairs that ``_check_fast`` hands back to the
ordinary checks (it then reads their rows again from the export).

``open_ranges`` is a pure function, so most of these run it inline (an inline pool told
to read ranges); one runs it in real worker processes.
"""

from __future__ import annotations

import itertools
import pickle
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import Scenario, explain, full_scenario, verify
from test_verifier_pairs import MUTATIONS, _mutated, _usage_index, _whole

from proto.canonical import decode_payload, signed_bytes
from proto.envelope import Envelope, decode_envelope, encode_envelope, sha256_hex
from proto.keys import key_id
from proto.records import LedgerRecord
from verifier import connections, limits, walk
from verifier.pair_worker import (
    ExportFile,
    FastPair,
    PairContext,
    open_jobs,
    pack_pairs,
    unpack_pairs,
)
from verifier.signers import required_of
from verifier.source import ExportSource
from verifier.state import ExportReport
from verifier.verify import verify_export
from verifier.workers import OpenPool, PoolKind


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("ranges"))


def _ranged(path: Path, s: Scenario) -> ExportReport:
    with OpenPool[Any]("inline", reads_ranges=True) as pool:
        pool.packs = True  # stands in for a process pool: its pairs packed and unpacked
        return verify_export(path, s.trust, pool=pool)


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_ranges_read_by_workers_give_the_ordinary_report(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    sql, rule = MUTATIONS[name]
    i, j = _usage_index(honest, 1), _usage_index(honest, 3)
    path = _mutated(honest, tmp_path, *(s.format(i=i, j=j) for s in sql))
    ranges = 0
    open_ranges = walk.open_ranges

    def counting(*args: Any) -> Any:
        nonlocal ranges
        ranges += 1
        return open_ranges(*args)

    monkeypatch.setattr(walk, "open_ranges", counting)
    ranged = _ranged(path, honest)
    assert ranges > 0, "the pass did not read by ranges"
    if rule:
        assert rule in ranged.findings.rules(), explain(ranged)
    else:
        assert ranged.ok, explain(ranged)
    monkeypatch.setattr(walk, "pairable", lambda record, rows: False)
    assert _whole(ranged) == _whole(verify(path, honest.trust))


def _relinked(s: Scenario, tmp: Path, index: int) -> Path:
    """A copy whose record at ``index`` links to a wrong prev, its columns kept consistent
    (records are unsigned in format version 2): a fast pair that only the main process's
    sequential check can catch."""
    path = _mutated(s, tmp)
    with duckdb.connect(str(path)) as con:
        (raw,) = con.execute(
            "SELECT envelope FROM ledger_records WHERE chain_index = ?", [index]
        ).fetchall()[0]
        envelope = decode_envelope(bytes(raw))
        record = decode_payload(envelope.payload)
        assert isinstance(record, LedgerRecord)
        payload = signed_bytes(LedgerRecord(**{**_fields(record), "prev": "ab" * 32}))
        forged = encode_envelope(Envelope(payload=payload, signatures=[]))
        con.execute(
            "UPDATE ledger_records SET envelope = ?, record_hash = ? WHERE chain_index = ?",
            [forged, sha256_hex(payload), index],
        )
    return path


def _fields(record: LedgerRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__struct_fields__}


def test_a_broken_prev_link_is_named_from_rows_read_again(honest: Scenario, tmp_path: Path) -> None:
    path = _relinked(honest, tmp_path, _usage_index(honest, 2))
    ranged = _ranged(path, honest)
    assert "CHAIN_PREV" in ranged.findings.rules(), explain(ranged)
    assert _whole(ranged) == _whole(verify(path, honest.trust))


def _pooled_as_inline(honest: Scenario, tmp_path: Path, kind: PoolKind) -> None:
    """The honest export and a relinked copy verified by two workers of ``kind`` reading
    their ranges: each report the inline one; the copy fails."""
    path = _relinked(honest, tmp_path, _usage_index(honest, 2))
    for export in (honest.path, path):
        with OpenPool[Any](kind, 2) as pool:
            assert pool.reads_ranges
            pooled = verify_export(export, honest.trust, pool=pool)
        assert not connections._EXPORT, "the pass left export connections open"
        assert _whole(pooled) == _whole(verify(export, honest.trust))
    assert not pooled.ok


def test_worker_processes_reading_ranges_give_the_inline_report(
    honest: Scenario, tmp_path: Path
) -> None:
    _pooled_as_inline(honest, tmp_path, "process")


def test_worker_threads_reading_ranges_give_the_inline_report(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads read their ranges on connections of their own (to one DuckDB database
    of the export: the instance cache hands the second thread the first's), hand their
    FastPairs over unpacked, and the pass closes the connections when it ends."""
    packed: list[bool] = []
    threads: set[int] = set()
    open_ranges = walk.open_ranges

    def watching(ranges: Any, context: PairContext) -> Any:
        packed.append(context.pack)
        threads.add(threading.get_ident())
        return open_ranges(ranges, context)

    monkeypatch.setattr(walk, "open_ranges", watching)
    monkeypatch.setattr(limits, "CHAIN_BATCH_INDICES", 4)  # many ranges, both threads busy
    _pooled_as_inline(honest, tmp_path, "thread")
    assert packed and not any(packed), "a worker thread packed its pairs"
    assert threading.get_ident() not in threads


def test_packed_pairs_unpack_to_the_fast_pairs_the_worker_made(honest: Scenario) -> None:
    with ExportSource(honest.path) as source:
        batch = next(iter(source.batches()))
    _, jobs = walk._plan(batch.records, batch.inputs)
    keys = {honest.terms.ledger_key, *(n.key for n in honest.terms.nodes)}
    context = PairContext(
        {key_id(k): [k] for k in keys},
        honest.terms.placement_id,
        {},
        required_of([honest.terms.ledger_key]),
    )
    fast = [r for r in open_jobs(jobs, context) if type(r) is FastPair]
    assert len(fast) >= 3
    # as a worker process sends them: one blob, pickled across
    back = unpack_pairs(pickle.loads(pickle.dumps(pack_pairs(fast))))
    assert back == fast
    for got, want in zip(back, fast, strict=True):
        assert type(got) is FastPair and type(got.opened) is type(want.opened)
        assert type(got.opened.record) is type(want.opened.record)
        assert got.opened.record == want.opened.record
        assert [type(s) for s in got.opened.sigs] == [type(s) for s in want.opened.sigs]
        assert [type(v) for v in got.record_row] == [type(v) for v in want.record_row]
    assert unpack_pairs(pack_pairs([])) == []


# Chain indices that are no usage pair, read by a worker: inputs in two tables at one
# index, a usage row twice, a usage row without its record.
ODD_INDICES = {
    "inputs in two tables": (
        "INSERT INTO closes SELECT chain_index, position, input_hash, envelope, status, "
        "reason, 0 FROM usage_events WHERE chain_index = {i}",
        "CHAIN_INPUT_DUPLICATE",
    ),
    "usage row twice": (
        "INSERT INTO usage_events SELECT * FROM usage_events WHERE chain_index = {i}",
        "CHAIN_INPUT_DUPLICATE",
    ),
    "usage without record": (
        "DELETE FROM ledger_records WHERE chain_index = {i}",
        "CHAIN_RECORD_MISSING",
    ),
}


@pytest.mark.parametrize("name", list(ODD_INDICES))
def test_odd_chain_indices_read_by_workers_give_the_ordinary_report(
    honest: Scenario, tmp_path: Path, name: str
) -> None:
    sql, rule = ODD_INDICES[name]
    path = _mutated(honest, tmp_path, sql.format(i=_usage_index(honest, 2)))
    ranged = _ranged(path, honest)
    assert rule in ranged.findings.rules(), explain(ranged)
    assert _whole(ranged) == _whole(verify(path, honest.trust))


def test_a_worker_reads_the_export_read_only_with_its_memory_bounded(honest: Scenario) -> None:
    stat = honest.path.stat()
    export = ExportFile(
        str(honest.path), (stat.st_dev, stat.st_ino, stat.st_mtime_ns), True, (), ()
    )
    con = connections.export_connection(export)
    try:
        (limit,) = con.execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit == "61.0 MiB"  # WORKER_DUCKDB_MEMORY_LIMIT "64MB" as DuckDB states it
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("CREATE TABLE w (x INTEGER)")
        with pytest.raises(duckdb.Error, match=r"lock_configuration|locked"):
            con.execute("SET memory_limit = '1GB'")
    finally:
        connections._EXPORT.clear()
        con.close()


def test_rows_read_again_for_findings_are_read_a_window_at_a_time(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15, never trust input: an early usage event deleted, every later one of its
    node is decided otherwise than stored, so its fast pair needs its rows read again.
    They must be read a window of CHAIN_BATCH_INDICES chain indices at a time, each chain
    index at most once (a query per pair scans the table each time: time quadratic in the
    export's size), and give the report of the ordinary pass."""
    path = _mutated(
        honest, tmp_path, f"DELETE FROM usage_events WHERE chain_index = {_usage_index(honest, 0)}"
    )
    monkeypatch.setattr(limits, "CHAIN_BATCH_INDICES", 4)
    needed: list[int] = []
    reads: list[tuple[int, int]] = []
    rows_of, record_rows = walk._rows_of, ExportSource.record_rows

    def needing(run: Any, index: int, record: Any, row: Any) -> Any:
        if record is None or row is None:
            needed.append(index)
        return rows_of(run, index, record, row)

    def reading(self: ExportSource, lo: int, hi: int) -> Any:
        reads.append((lo, hi))
        return record_rows(self, lo, hi)

    monkeypatch.setattr(walk, "_rows_of", needing)
    monkeypatch.setattr(ExportSource, "record_rows", reading)
    ranged = _ranged(path, honest)
    assert "SEQ_GAP" in ranged.findings.rules(), explain(ranged)
    usage = ranged.counts["inputs.usage"]
    assert len(needed) >= usage // 2 >= 10, (needed, usage)
    assert needed == sorted(needed)
    assert reads and all(hi - lo == 4 for lo, hi in reads), reads
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(reads)), reads  # none read twice
    assert len(reads) <= len(needed) // 2, (reads, needed)
    assert all(any(lo <= i < hi for lo, hi in reads) for i in needed)
    monkeypatch.setattr(ExportSource, "record_rows", record_rows)
    monkeypatch.setattr(walk, "pairable", lambda record, rows: False)
    assert _whole(ranged) == _whole(verify(path, honest.trust))


def test_a_worker_threads_rows_name_the_findings_without_reading_them_again(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With worker threads, the rows a fast pair's finding needs are the ones the thread
    read (handed over with its FastPairs): the export is not read again for them, and the
    report is the ordinary pass's."""
    path = _mutated(
        honest, tmp_path, f"DELETE FROM usage_events WHERE chain_index = {_usage_index(honest, 0)}"
    )
    monkeypatch.setattr(limits, "CHAIN_BATCH_INDICES", 4)
    needed: list[int] = []
    reads: list[tuple[int, int]] = []
    rows_of, record_rows = walk._rows_of, ExportSource.record_rows

    def needing(run: Any, index: int, record: Any, row: Any) -> Any:
        if record is None or row is None:
            needed.append(index)
        return rows_of(run, index, record, row)

    def reading(self: ExportSource, lo: int, hi: int) -> Any:
        reads.append((lo, hi))
        return record_rows(self, lo, hi)

    monkeypatch.setattr(walk, "_rows_of", needing)
    monkeypatch.setattr(ExportSource, "record_rows", reading)
    with OpenPool[Any]("thread", 2) as pool:
        pooled = verify_export(path, honest.trust, pool=pool)
    assert "SEQ_GAP" in pooled.findings.rules(), explain(pooled)
    assert len(needed) >= pooled.counts["inputs.usage"] // 2 >= 10, needed
    assert not reads, reads
    monkeypatch.setattr(ExportSource, "record_rows", record_rows)
    monkeypatch.setattr(walk, "_rows_of", rows_of)
    assert _whole(pooled) == _whole(verify(path, honest.trust))
