"""The ledger store: one transaction per batch, bounded evidence, refusing a foreign key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_ledger_scenario import (
    LATE_CLOCK_MS,
    build_scenario,
    chain_heads,
    final_statements,
    local_service,
    publish_scenario_local,
)

from devtools.builders import make_cast
from ledger.ingest import IngestBroken
from ledger.limits import MAX_QUARANTINE_BYTES, STORE_ROW_GROUP_ROWS
from ledger.store import Batch, QuarantineRow, Store, StoreError


def test_crash_between_fold_and_commit_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = build_scenario("crash-commit", placements=2, nodes=2, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    original = Store._append
    calls: list[str] = []

    def failing_append(self: Store, table: str, rows: object, *, upsert: bool = False) -> None:
        calls.append(table)
        if table == "offsets":  # the last write of the batch: everything else is in
            raise OSError("simulated crash before commit")
        original(self, table, rows, upsert=upsert)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "_append", failing_append)
    with pytest.raises(OSError, match="simulated crash"):
        service.step()
    assert {"record_rows", "input_rows", "placement_state", "offsets"} <= set(calls)
    # The fold ran ahead of the store: this ingestor refuses to go on.
    with pytest.raises(IngestBroken):
        service.step()
    service.close()
    monkeypatch.setattr(Store, "_append", original)

    reopened = Store(tmp_path / "ledger.duckdb")
    assert reopened.counts() == {
        "records": 0,
        "inputs": 0,
        "quarantine": 0,
        "placement_state": 0,
        "statements": 0,
        "dropped": 0,
    }
    assert reopened.offsets() == {}
    reopened.close()

    # A restart resumes from the (empty) stored state and reaches the one-run result.
    resumed = local_service(tmp_path, scenario)
    resumed.run_until_idle()
    heads = chain_heads(resumed.store)
    statements = final_statements(resumed.store)
    resumed.close()
    reference_dir = tmp_path / "ref"
    publish_scenario_local(reference_dir / "spool", scenario.inputs)
    reference = local_service(reference_dir, scenario, clock_ms=LATE_CLOCK_MS)
    reference.run_until_idle()
    assert chain_heads(reference.store) == heads
    assert final_statements(reference.store) == statements
    assert len(heads) == 2
    reference.close()


def test_offsets_and_records_commit_together(tmp_path: Path) -> None:
    scenario = build_scenario("together", placements=1, nodes=1, events=4)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    report = service.step()
    assert report is not None and report.inputs > 0
    offsets = service.store.offsets()
    stored_inputs = service.store.counts()["inputs"]
    service.close()
    reopened = Store(tmp_path / "ledger.duckdb")
    assert reopened.offsets() == offsets
    assert reopened.counts()["inputs"] == stored_inputs
    # Offsets point one past the last consumed entry of each spool.
    assert all(":" in position for position in offsets.values())
    reopened.close()


def test_quarantine_evidence_is_bounded(tmp_path: Path) -> None:
    store = Store(tmp_path / "q.duckdb")
    huge = b"x" * (MAX_QUARANTINE_BYTES + 12345)
    batch = Batch(
        quarantined=[QuarantineRow("local:a:0:0", huge, "OVERSIZE", "too big", None)],
        offsets={"local:a": "0:9"},
    )
    store.commit_batch(batch)
    rows = store.query("SELECT size_bytes, octet_length(envelope), reason FROM quarantine")
    assert rows == [(len(huge), MAX_QUARANTINE_BYTES, "OVERSIZE")]
    assert store.quarantine_counts() == {"OVERSIZE": 1}
    store.close()


def test_store_refuses_another_ledger_key(tmp_path: Path) -> None:
    first, second = make_cast("key-a").ledger, make_cast("key-b").ledger
    Store(tmp_path / "k.duckdb", ledger_public_key=first.public_key).close()
    with pytest.raises(StoreError, match="another ledger key"):
        Store(tmp_path / "k.duckdb", ledger_public_key=second.public_key)
    Store(tmp_path / "k.duckdb", ledger_public_key=first.public_key).close()


def test_usage_lookup_answers_from_committed_rows(tmp_path: Path) -> None:
    scenario = build_scenario("lookup", placements=1, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    pid = scenario.placement_ids[0]
    node = scenario.terms[pid].nodes[0].node_id
    found = service.store.lookup_usage(pid, node, 1)
    assert found is not None
    rows = service.store.query(
        "SELECT input_hash, payload_hash FROM inputs WHERE kind = 'usage' AND seq = 1"
    )
    assert rows == [found]
    assert service.store.lookup_usage(pid, node, 99) is None
    service.close()


def test_wide_rows_inserted_as_columns_equal_the_appenders_at_the_integer_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record_rows/input_rows go in as NumPy columns (``Store._insert_columns``): the stored rows
    equal what DuckDB's appender stores, NULLs and 2^53 - 1 included, wherever they sit
    (an object column would have DuckDB guess a narrower type from a sample and fail)."""
    import ledger.store.store as store_module

    top = 2**53 - 1
    n = 4000

    def nullable(i: int, small: int) -> int | None:
        return top if i == n - 7 else (None if i % 3 else small)

    rows = [
        (
            f"p-{i % 5}",
            i,
            f"kafka:t:0:{i}",
            f"ih{i}",
            f"ph{i}",
            bytes([i % 256]) * (1 + i % 9),
            None if i % 7 else f"{i:016x}",
            None if i % 7 else bytes([i % 256]) * 64,
            f"[{i}]" if i % 7 else None,
            "usage",
            "accepted" if i % 2 else "rejected",
            "" if i % 2 else "SEQ_GAP",
            None if i % 4 == 0 else f"node-{i}",
            *(nullable(i, i % 100) for _ in range(7)),
            None if i % 5 else ("credit" if i % 2 else "charge"),
            nullable(i, 1),
            nullable(i, 2),
            top if i == n - 1 else i,
        )
        for i in range(n)
    ]
    stored: list[list[tuple[object, ...]]] = []
    for name, tables in (("columns", frozenset({"input_rows"})), ("appender", frozenset())):
        monkeypatch.setattr(store_module, "_COLUMN_TABLES", tables)
        with Store(tmp_path / f"{name}.duckdb") as store:
            store._append("input_rows", rows)
            stored.append(
                [tuple(r) for r in store.query("SELECT * FROM input_rows ORDER BY chain_index")]
            )
    assert stored[0] == stored[1] == [tuple(r) for r in rows]


def test_store_connections_never_draw_a_progress_bar(tmp_path: Path) -> None:
    """DuckDB draws a progress bar on stdout during long queries unless told not to: a
    store's connection and its reader cursors have it off (a `--json` output stays JSON)."""
    with Store(tmp_path / "bar.duckdb") as store:
        cursor = store.cursor()
        try:
            row = cursor.execute("SELECT current_setting('enable_progress_bar')").fetchone()
            assert row is not None and row[0] is False
        finally:
            cursor.close()


def _row_groups(con: Any, table: str) -> list[int]:
    """Rows of each of ``table``'s row groups (after a CHECKPOINT), in order."""
    return [
        int(n)
        for (n,) in con.execute(
            "SELECT sum(count) FROM pragma_storage_info(?) WHERE column_path = '[0]' "
            "GROUP BY row_group_id ORDER BY row_group_id",
            [table],
        ).fetchall()
    ]


def test_store_tables_are_written_in_row_groups_of_the_store_size(tmp_path: Path) -> None:
    """The store's file is attached with ROW_GROUP_SIZE STORE_ROW_GROUP_ROWS (a checkpoint
    rewrites at most one partly filled row group, issue 15): batches appended in many
    transactions, across a reopen, fill row groups of that size; the store's connection,
    its cursors and a plain read-only DuckDB read the same rows."""
    path = tmp_path / "groups.duckdb"
    size = STORE_ROW_GROUP_ROWS
    total = 2 * size + 5
    per_batch = 5000
    written = 0
    for reopen in range(2):
        with Store(path) as store:
            while written < total * (reopen + 1) // 2:
                n = min(per_batch, total * (reopen + 1) // 2 - written)
                rows = [(f"p-{(written + i) % 7}", f"{written + i:064x}") for i in range(n)]
                store._con.execute("BEGIN")
                store._append("placement_seen", rows)
                store._con.execute("COMMIT")
                written += n
            store._con.execute("CHECKPOINT")
            cursor = store.cursor()
            try:
                row = cursor.execute("SELECT count(*) FROM placement_seen").fetchone()
                assert row is not None and row[0] == written
            finally:
                cursor.close()
            groups = _row_groups(store._con, "placement_seen")
            assert sum(groups) == written
            assert all(n == size for n in groups[:-1]) and 0 < groups[-1] <= size
            # Where DuckDB spills past the memory limit: beside the store, as for a file
            # it opens itself (not ``.tmp`` in the working directory).
            row = store.query("SELECT current_setting('temp_directory')")[0]
            assert row[0] == f"{path}.tmp"
    assert written == total
    con = duckdb.connect(str(path), read_only=True)
    try:
        hashes = [h for (h,) in con.execute("SELECT input_hash FROM placement_seen").fetchall()]
    finally:
        con.close()
    assert hashes == [f"{i:064x}" for i in range(total)]


_OLD_ATTACH = """
import sys
from pathlib import Path
import duckdb
sys.path.insert(0, sys.argv[2])
from ledger.store import STORE_ALIAS
from ledger.store.store import _attach_store
con = duckdb.connect(":memory:")
_attach_store(con, Path(sys.argv[1]))
con.execute(f"USE {STORE_ALIAS}")
con.execute("CREATE TABLE t AS SELECT 1 AS x")
print(duckdb.__version__, con.execute("SELECT x FROM gridledger_store.t").fetchall())
"""


def test_a_duckdb_without_the_row_group_option_attaches_the_store_with_its_own(
    tmp_path: Path,
) -> None:
    """pyproject allows DuckDB 1.1, whose ATTACH knows no ROW_GROUP_SIZE: the store file is
    attached without it (DuckDB 1.0.0 from .venv/duckdb-1.0 stands in, in a process of its
    own), and any other ATTACH error still surfaces."""
    import os
    import subprocess
    import sys

    old = Path(sys.prefix) / "duckdb-1.0"
    assert (old / "duckdb").is_dir(), f"{old} is missing: `make venv` installs DuckDB 1.0.0 there"
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _OLD_ATTACH, str(tmp_path / "old.duckdb"), str(root)],
        env={**os.environ, "PYTHONPATH": str(old)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "1.0.0" and "[(1,)]" in done.stdout

    from ledger.store.store import _attach_store

    with pytest.raises(duckdb.Error):  # a directory is no database file: not swallowed
        _attach_store(duckdb.connect(":memory:"), tmp_path)


def test_closes_due_at_once_are_recorded_together_and_the_first_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    with Store(path) as store:
        store.add_closes([])  # nothing due: nothing written
        assert store.unpublished_closes() == []
        store.add_closes([("p-a", b"close a 1"), ("p-b", b"close b")])
        # A placement already closed keeps its close; of two in one call, the first counts.
        store.add_closes([("p-a", b"close a 2"), ("p-c", b"close c 1"), ("p-c", b"close c 2")])
        expected = [("p-a", b"close a 1"), ("p-b", b"close b"), ("p-c", b"close c 1")]
        assert store.unpublished_closes() == expected
        store.mark_closes_published(["p-b"])
        assert store.unpublished_closes() == [expected[0], expected[2]]
        assert store.closes_recorded() == {"p-a", "p-b", "p-c"}
    with Store(path) as store:  # committed: a restart publishes the same bytes
        assert store.unpublished_closes() == [expected[0], expected[2]]
