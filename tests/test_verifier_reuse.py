"""The process's warm database for small exports (``verifier/small_export_db.py``): reused, and
nothing of one export reaches another's report; every way of opening an export (warm,
a small one's own in-memory database, a big one's scratch file) gives one report."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import full_scenario, small_scenario

from verifier import limits, small_export_db, source
from verifier.report import export_json
from verifier.source import ExportSource
from verifier.verify import verify_export

# (name, SQL) applied to a copy of an honest export: each makes it fail its own way.
TAMPERING = (
    ("column", "UPDATE ledger_records SET gross_minor = gross_minor + 1 WHERE chain_index = 4"),
    ("deleted-input", "DELETE FROM usage_events WHERE chain_index = 3"),
    (
        "duplicated-record",
        "INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index = 2",
    ),
    ("statement", "UPDATE statements SET buyer_owes_minor = buyer_owes_minor + 1"),
    ("status", "UPDATE usage_events SET status = 'rejected' WHERE chain_index = 2"),
)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """name -> (export, trust): honest small and full exports, tampered copies."""
    tmp = tmp_path_factory.mktemp("reuse")
    small = small_scenario(tmp, minutes=11)
    full = full_scenario(tmp)
    out = {"small": (small.path, small.trust), "full": (full.path, full.trust)}
    for name, sql in TAMPERING:
        path = tmp / f"tampered-{name}.duckdb"
        shutil.copyfile(small.path, path)
        con = duckdb.connect(str(path))
        con.execute(sql)
        con.close()
        out[name] = (path, small.trust)
    return out


@pytest.fixture(autouse=True)
def fresh_warm_database() -> None:
    """Each test starts on a new warm database (one that has served no export yet: the
    tests that count on reuse must not meet its WARM_DATABASE_MAX_EXPORTS-th export)."""
    database = small_export_db.acquire()
    if database is not None:
        small_export_db.release(database, clean=False)


def report_text(path: Path, trust: Any) -> str:
    """The report of ``python -m verifier --json`` for one export, without its timing."""
    body = export_json(verify_export(path, trust))
    body.pop("elapsed_s")
    return json.dumps(body, sort_keys=True)


def alone(path: Path, trust: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The report with the warm database out of the game (a database of its own)."""
    with monkeypatch.context() as m:
        m.setattr(source, "_share_warm", False)
        return report_text(path, trust)


def test_the_warm_database_is_reused_and_left_holding_nothing(
    exports: dict[str, tuple[Path, Any]],
) -> None:
    path, _ = exports["small"]
    with ExportSource(path) as first:
        assert first.warm
        con = first.con
    database = small_export_db.acquire()
    assert database is not None
    try:
        assert database.con is con  # the same database, not a new one per export
        assert database._clean()
        assert list(database.inbox.iterdir()) == []  # the export's link is gone
    finally:
        small_export_db.release(database, clean=True)
    with ExportSource(path) as second:
        assert second.warm and second.con is con


def test_a_tampered_export_after_an_honest_one_reports_what_it_reports_alone(
    exports: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    honest_alone = alone(*exports["small"], monkeypatch)
    assert json.loads(honest_alone)["verdict"] == "verified"
    for name, _ in TAMPERING:
        tampered_alone = alone(*exports[name], monkeypatch)
        assert json.loads(tampered_alone)["verdict"] == "failed", name
        # honest, tampered, honest on the one warm database
        assert report_text(*exports["small"]) == honest_alone
        assert report_text(*exports[name]) == tampered_alone, name
        assert report_text(*exports["small"]) == honest_alone, name


def test_small_and_large_ways_give_the_same_report(
    exports: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("small", "full", "column", "duplicated-record"):
        path, trust = exports[name]
        warm_report = report_text(path, trust)
        own_in_memory = alone(path, trust, monkeypatch)
        with monkeypatch.context() as m:  # every export "large": a scratch file, all threads
            m.setattr(limits, "SMALL_EXPORT_BYTES", 0)
            with ExportSource(path) as opened:
                assert not opened.small and not opened.warm
            scratch_file = report_text(path, trust)
        assert warm_report == own_in_memory == scratch_file, name


def test_the_warm_database_reads_nothing_but_the_export_and_stays_locked(
    exports: dict[str, tuple[Path, Any]],
) -> None:
    path, _ = exports["small"]
    with ExportSource(path) as opened:
        assert opened.warm
        quoted = str(path).replace("'", "''")
        # the export itself, by its own path: outside the one directory the database reads
        with pytest.raises(duckdb.PermissionException):
            opened.con.execute(f"SELECT count(*) FROM read_blob('{quoted}')").fetchall()
        with pytest.raises(duckdb.PermissionException):
            opened.con.execute(f"ATTACH '{quoted}' AS other (READ_ONLY)")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            opened.con.execute("SET enable_external_access = true")


def test_a_second_source_while_the_warm_one_is_open_gets_its_own(
    exports: dict[str, tuple[Path, Any]],
) -> None:
    path, _ = exports["small"]
    with ExportSource(path) as first, ExportSource(exports["full"][0]) as second:
        assert first.warm and not second.warm
        assert second.count("ledger_records") != first.count("ledger_records")
    with ExportSource(path) as again:
        assert again.warm


def test_a_damaged_small_export_reads_as_with_a_database_of_its_own(
    tmp_path: Path, exports: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, trust = exports["small"]
    raw = path.read_bytes()
    damaged = tmp_path / "damaged.duckdb"
    errors: list[str] = []
    # A block of garbage at each DuckDB block (256 KiB) past the file's headers: the
    # catalog's (attach fails) and the tables' (a read fails in the middle of the checklist).
    for offset in range(3 * 4096, len(raw), 256 * 1024):
        damaged.write_bytes(raw[:offset] + b"\x5a" * 64 + raw[offset + 64 :])
        expected = alone(damaged, trust, monkeypatch)
        assert report_text(damaged, trust) == expected, offset
        if json.loads(expected)["verdict"] == "unusable":
            errors.append(json.loads(expected)["error"])
    assert any(e.startswith("DuckDB cannot open it") for e in errors), errors
    assert any(e.startswith("DuckDB cannot read it") for e in errors), errors
    # and the warm database serves the next export as before
    with ExportSource(path) as opened:
        assert opened.warm
    assert json.loads(report_text(path, trust))["verdict"] == "verified"


def test_a_database_left_unclean_is_closed_and_replaced(
    exports: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, trust = exports["small"]
    with ExportSource(path) as opened:
        before = opened.con
        monkeypatch.setattr(small_export_db.WarmDatabase, "_clean", lambda self: False)
    monkeypatch.undo()
    with ExportSource(path) as reopened:
        assert reopened.warm and reopened.con is not before
    assert json.loads(report_text(path, trust))["verdict"] == "verified"


def _verify_in_worker(path: str, trust: Any) -> tuple[str, str, str]:
    """In a pool worker: the verdict, and the warm database's directory and pid."""
    report = verify_export(Path(path), trust)
    database = small_export_db.acquire()
    assert database is not None
    try:
        return report.verdict, str(database.dir), str(database.pid)
    finally:
        small_export_db.release(database, clean=True)


def test_a_forked_worker_gets_its_own_warm_database_and_removes_it(
    exports: dict[str, tuple[Path, Any]],
) -> None:
    path, trust = exports["small"]
    with ExportSource(path) as opened:  # the parent's warm database exists before the fork
        assert opened.warm
        parent_con = opened.con
    database = small_export_db.acquire()
    assert database is not None
    parent_dir = database.dir
    small_export_db.release(database, clean=True)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        verdict, child_dir, child_pid = pool.submit(_verify_in_worker, str(path), trust).result()
    assert verdict == "verified"
    assert Path(child_dir) != parent_dir and int(child_pid) != os.getpid()
    assert not Path(child_dir).exists()  # the worker removed its own at exit
    assert parent_dir.is_dir()  # and left the parent's alone
    with ExportSource(path) as again:
        assert again.warm and again.con is parent_con
    assert json.loads(report_text(path, trust))["verdict"] == "verified"


@pytest.mark.parametrize("left", ["open", "aborted"])
def test_a_transaction_left_open_is_rolled_back_and_the_database_reused(
    exports: dict[str, tuple[Path, Any]], left: str
) -> None:
    path, trust = exports["small"]
    with ExportSource(path) as opened:
        assert opened.warm
        con = opened.con
        con.execute("CREATE TABLE w_left(i INTEGER)")
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO w_left VALUES (1)")
        if left == "aborted":
            with pytest.raises(duckdb.ConversionException):
                con.execute("SELECT 1 / 'x'::INTEGER").fetchall()
    with ExportSource(path) as again:
        assert again.warm and again.con is con  # detached cleanly: not replaced
        assert again.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'w_left'"
        ).fetchall() == [(0,)]
    assert json.loads(report_text(path, trust))["verdict"] == "verified"


def test_the_warm_database_is_replaced_after_max_exports(
    exports: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, trust = exports["small"]
    monkeypatch.setattr(limits, "WARM_DATABASE_MAX_EXPORTS", 3)
    seen: list[Any] = []
    for _ in range(7):
        with ExportSource(path) as opened:
            assert opened.warm
            seen.append(opened.con)
    # three exports per database: the first three on one, the next three on another
    assert seen[0] is seen[1] is seen[2]
    assert seen[3] is seen[4] is seen[5] and seen[3] is not seen[0]
    assert seen[6] is not seen[3]
    assert json.loads(report_text(path, trust))["verdict"] == "verified"
