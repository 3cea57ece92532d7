"""Exports at the cost of their own rows (issue 15): commit ranges, export_all, migration."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from support import ledger_toml
from test_ledger_scenario import (
    build_scenario,
    ledger_key_file,
    local_service,
    publish_scenario_local,
)
from test_store_envelopes import to_version_2

from devtools.builders import adjustment, gpu, make_terms, signed_terms
from gridledger.cli import main as gridledger_main
from ledger import export, issuer
from ledger.export import TABLES, export_all, export_placement
from ledger.issuer import LEAF_HASH_SQL, UnknownPlacement, attest_all, issue_statement
from ledger.limits import EXPORT_STAGE_PLACEMENTS, EXPORT_STAGE_RECORDS
from ledger.store import STORE_VERSION, Store
from proto import merkle
from proto.envelope import decode_envelope
from verifier.verify import verify_export


def _ledger(tmp_path: Path, placements: int = 4, bad_terms: bool = False) -> tuple[Any, Path]:
    """A folded scenario in several small batches (closes, an adjustment), store closed;
    ``bad_terms``: also a placement "bad" whose only terms are rejected (TERMS_INVALID)."""
    scenario = build_scenario("many", placements=placements, nodes=2, events=4)
    pid = scenario.placement_ids[0]
    extra = [(pid, "publish-desk", adjustment(scenario.cast, pid, "adj-1", "credit", 9, 0))]
    if bad_terms:
        start = scenario.terms[pid].window_start_ms
        terms = make_terms(scenario.cast, "bad", [gpu("bad-n0", 0)], start, start + 1000)
        extra.append(("bad", "publish-desk", signed_terms(scenario.cast, terms)))
    publish_scenario_local(tmp_path / "spool", scenario.inputs + extra)
    service = local_service(tmp_path, scenario)  # batches of 7 inputs
    service.run_until_idle()
    service.close()
    return scenario, tmp_path / "ledger.duckdb"


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def test_commit_ranges_hold_every_row_of_their_placement(tmp_path: Path) -> None:
    _, db = _ledger(tmp_path)
    with duckdb.connect(str(db), read_only=True) as con:
        for table in ("records", "inputs"):
            rows = con.execute(
                f"SELECT t.placement_id, min(t.commit_no), max(t.commit_no), "
                f"any_value(c.first_commit), any_value(c.last_commit) FROM {table} t "
                "LEFT JOIN placement_commits c USING (placement_id) GROUP BY 1"
            ).fetchall()
            assert len(rows) == 4
            for pid, lo, hi, first, last in rows:
                assert (first, last) == (lo, hi), f"{table} of {pid}: range {first}..{last}"
        # Several batches wrote rows: the ranges really separate placements' batches.
        assert con.execute("SELECT count(DISTINCT commit_no) FROM records").fetchone()[0] > 3  # type: ignore[index]


def test_export_all_writes_the_same_files_as_one_at_a_time(tmp_path: Path) -> None:
    scenario, db = _ledger(tmp_path)
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)  # neither store has issued a statement or checkpoint yet
    done = export_all(db, tmp_path / "all", key=scenario.cast.ledger)
    assert done.skipped == {}
    counts = done.written
    assert sorted(counts) == scenario.placement_ids
    for pid in scenario.placement_ids:
        one = tmp_path / "one" / f"{pid}.duckdb"
        assert export_placement(copy, pid, one, key=scenario.cast.ledger) == counts[pid]
        assert _tables(tmp_path / "all" / f"{pid}.duckdb") == _tables(one)
        result = verify_export(tmp_path / "all" / f"{pid}.duckdb", scenario.cast.trust())
        assert result.ok and result.final, result.error
    assert not list((tmp_path / "all").glob(".*")), "temporary files left behind"
    # Again over a store that has them: nothing new is issued, the files are the same.
    again = export_all(db, tmp_path / "again", key=scenario.cast.ledger)
    assert again.written == counts
    pid = scenario.placement_ids[0]
    assert _tables(tmp_path / "again" / f"{pid}.duckdb") == _tables(
        tmp_path / "all" / f"{pid}.duckdb"
    )


def _rows_as_stored(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table in the order its rows were written (no ORDER BY)."""
    with duckdb.connect(str(path), read_only=True) as con:
        return {t: con.execute(f"SELECT * FROM {t}").fetchall() for t in TABLES}


def _staged_in_twos(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """``export_all`` stages two placements a chunk from now on; the list it returns
    fills with the chunks staged."""
    monkeypatch.setattr(export, "EXPORT_STAGE_PLACEMENTS", 2)
    staged: list[list[str]] = []
    stage = export._stage

    def spy(con: Any, writer: Any, chunk: list[str], *rest: Any) -> None:
        staged.append(chunk)
        stage(con, writer, chunk, *rest)

    monkeypatch.setattr(export, "_stage", spy)
    return staged


def test_export_all_in_staged_chunks_writes_the_files_of_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven placements in chunks of two read from the store at once, the last one alone
    straight from the store: every file holds the rows of ``export_placement``'s, in the
    same order."""
    scenario, db = _ledger(tmp_path, placements=7)
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)
    staged = _staged_in_twos(monkeypatch)
    done = export_all(db, tmp_path / "all", key=scenario.cast.ledger, threads=2)
    assert sorted(done.written) == scenario.placement_ids
    assert sorted(len(chunk) for chunk in staged) == [2, 2, 2]  # and one read alone
    for pid in scenario.placement_ids:
        one = tmp_path / "one" / f"{pid}.duckdb"
        assert export_placement(copy, pid, one, key=scenario.cast.ledger) == done.written[pid]
        assert _rows_as_stored(tmp_path / "all" / f"{pid}.duckdb") == _rows_as_stored(one), pid
    assert not list((tmp_path / "all").glob(".*")), "temporary files left behind"


def test_chunks_staged_through_parquet_or_arrow_give_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DuckDB that cannot hand rows over as an Arrow stream (before 2.0) stages each
    chunk through a Parquet file instead: the same files row for row, no file left."""
    scenario, db = _ledger(tmp_path, placements=5)
    assert export._arrow_handoff()  # the DuckDB the tests run with (pyproject's newest)
    arrow = export_all(db, tmp_path / "arrow", key=scenario.cast.ledger)
    monkeypatch.setattr(export, "_arrow_handoff", lambda: False)
    parquet = export_all(db, tmp_path / "parquet", key=scenario.cast.ledger)
    assert parquet.written == arrow.written
    assert sorted(arrow.written) == scenario.placement_ids
    for pid in scenario.placement_ids:
        assert _rows_as_stored(tmp_path / "parquet" / f"{pid}.duckdb") == _rows_as_stored(
            tmp_path / "arrow" / f"{pid}.duckdb"
        ), pid
    assert not list((tmp_path / "parquet").glob(".*")), "temporary files left behind"


def test_prepared_inserts_quote_any_placement_id_and_rebind_per_file() -> None:
    """A writer's prepared INSERT takes the placement id as an SQL literal (quotes
    doubled) and writes into whichever file is attached under its alias now."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            "CREATE TABLE stage_t AS SELECT * FROM (VALUES ('o''brien', 1), ('x', 2)) v(p, i)"
        )
        prepared = export._Prepared("w", set())
        got = []
        for _ in range(2):
            con.execute("ATTACH ':memory:' AS w")
            con.execute("CREATE TABLE w.t (i INTEGER)")
            sql = prepared.statement(
                con, "ins", "INSERT INTO w.t SELECT i FROM stage_t WHERE p = $1", "o'brien"
            )
            assert export._count(con, sql, []) == 1
            got.append(con.execute("SELECT i FROM w.t").fetchall())
            con.execute("DETACH w")
        assert got == [[(1,)], [(1,)]]
        assert prepared.names == {"ins"}
    finally:
        con.close()


def test_placements_read_from_the_store_in_pages_are_written_as_read_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every placement alone, straight from the store, in pages of 2 chain indexes (one
    INSERT per page and table, each page through its own commit range, files in row
    groups of EXPORT_ROW_GROUP_ROWS): the same rows in the same order as the staged
    path's files, and they verify."""
    scenario, db = _ledger(tmp_path, placements=3)
    staged = tmp_path / "staged"
    done = export_all(db, staged, key=scenario.cast.ledger)  # 3 placements: staged chunks
    monkeypatch.setattr(export, "EXPORT_STAGE_RECORDS", 1)  # every placement alone
    monkeypatch.setattr(export, "EXPORT_PAGE_RECORDS", 2)
    with Store(db) as store:
        ranges = store.commit_ranges()
        con = store.cursor()
        try:
            for pid, (head, _) in store.heads().items():
                pages = export._pages(con, pid, ranges[pid], head + 1)
                assert len(pages) == (head + 2) // 2  # ceil(records / 2)
                assert pages[0].first_index is None and pages[-1].end_index is None
                assert [p.end_index for p in pages[:-1]] == [p.first_index for p in pages[1:]]
                assert all(ranges[pid][0] <= p.first_commit <= p.last_commit for p in pages)
                assert max(p.last_commit for p in pages) == ranges[pid][1]
        finally:
            con.close()
    paged = tmp_path / "paged"
    again = export_all(db, paged, key=scenario.cast.ledger)
    assert again.written == done.written
    for pid in scenario.placement_ids:
        assert _rows_as_stored(paged / f"{pid}.duckdb") == _rows_as_stored(
            staged / f"{pid}.duckdb"
        ), pid
        result = verify_export(paged / f"{pid}.duckdb", scenario.cast.trust())
        assert result.ok and result.final, result.error
        one = tmp_path / "one" / f"{pid}.duckdb"
        assert export_placement(db, pid, one, key=scenario.cast.ledger) == done.written[pid]
        assert _rows_as_stored(one) == _rows_as_stored(staged / f"{pid}.duckdb"), pid


_KILLER = """
import os, signal, sys
from pathlib import Path
from ledger import issuer, export
from proto.keys import load_signing_key

db, out, key, hook, at = sys.argv[1:6]
calls = 0
real = getattr(export, hook)

def dying(*args, **kwargs):
    global calls
    calls += 1
    if calls == int(at):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)

setattr(export, hook, dying)
export.EXPORT_STAGE_PLACEMENTS = 2
export.export_all(Path(db), Path(out), key=load_signing_key(Path(key)), threads=2)
"""


@pytest.mark.parametrize(
    ("hook", "at"),
    [
        ("_fsync_file", 3),  # a file written and synced, not yet renamed
        ("_count", 9),  # inside a file's transaction
        ("_stage", 2),  # reading a chunk from the store
    ],
)
def test_export_all_killed_leaves_only_whole_exports_and_runs_again(
    tmp_path: Path, hook: str, at: int
) -> None:
    """kill -9 in the middle of export_all: every file under a final name is a whole
    export (export_placement's rows, verified), anything else is a dot file; export_all
    run again writes every placement's export."""
    scenario, db = _ledger(tmp_path, placements=7)
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)
    key = ledger_key_file(tmp_path / "keys", scenario.cast)
    out = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-c", _KILLER, str(db), str(out), str(key), hook, str(at)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    whole = sorted(p.stem for p in out.glob("*.duckdb") if not p.name.startswith("."))
    assert set(whole) < set(scenario.placement_ids)
    assert all(p.name.startswith(".") for p in out.iterdir() if p.stem not in whole)
    for pid in scenario.placement_ids:
        export_placement(copy, pid, tmp_path / "one" / f"{pid}.duckdb", key=scenario.cast.ledger)
    for pid in whole:
        assert _rows_as_stored(out / f"{pid}.duckdb") == _rows_as_stored(
            tmp_path / "one" / f"{pid}.duckdb"
        ), pid
        result = verify_export(out / f"{pid}.duckdb", scenario.cast.trust())
        assert result.ok and result.final, result.error
    left = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    if hook != "_stage":
        # Killed while staging, nothing may be left: the template is made once and held
        # in memory (``export._template``), and a chunk passes as an Arrow stream.
        assert left, "the kill left no temporary file: nothing to clean up"
    done = export_all(db, out, key=scenario.cast.ledger)
    assert sorted(done.written) == scenario.placement_ids
    for pid in scenario.placement_ids:
        assert _rows_as_stored(out / f"{pid}.duckdb") == _rows_as_stored(
            tmp_path / "one" / f"{pid}.duckdb"
        ), pid
    # The killed run's temporary files (template, stage Parquet, .tmp exports) are gone.
    assert sorted(p.name for p in out.iterdir()) == [
        f"{p}.duckdb" for p in scenario.placement_ids
    ], left


def test_only_the_temporary_files_of_a_dead_process_are_removed(tmp_path: Path) -> None:
    """export_all's clean-up removes the template, staged Parquet and temporary exports
    (and their WAL) of a process that is gone; a live process's (this one's: a call in
    another thread) and every other file stay."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    gone, me = int(dead.stdout), os.getpid()
    names = {
        f".template-{gone}.duckdb": False,
        f".template-{gone}.duckdb.wal": False,
        f".stage-{gone}-17-records.parquet": False,
        f".p-1.duckdb.tmp-{gone}": False,
        f".p-1.duckdb.tmp-{gone}.wal": False,
        f".template-{me}.duckdb": True,
        f".p-2.duckdb.tmp-{me}": True,
        f".stage-{me}-3-inputs.parquet": True,
        "p-1.duckdb": True,
        ".keep": True,
        f"p-3.duckdb.tmp-{gone}": True,  # not a dot file: not ours
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = export._remove_leftovers(tmp_path)
    assert sorted(removed) == sorted(n for n, kept in names.items() if not kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for n, kept in names.items() if kept
    )


def test_attest_all_issues_what_one_at_a_time_issues_leaves_read_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attest_all sums chains up in SQL and reads leaf hashes ATTEST_LEAF_RECORDS at a
    time (3 here: every chain alone or with others, some larger than the bound): the same
    statements (a later period's included: a late charge after the close) and checkpoints,
    byte for byte, as issue_statement and issue_checkpoint one placement at a time."""
    monkeypatch.setattr(issuer, "ATTEST_LEAF_RECORDS", 3)
    scenario = build_scenario("attest-late", placements=3, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    pid = scenario.placement_ids[0]
    try:
        service.run_until_idle()
        close = service.store.close_index(pid)
        assert close is not None
        late = adjustment(
            scenario.cast, pid, "late-1", "charge", 500, 0, signers=[scenario.cast.buyer]
        )
        publish_scenario_local(tmp_path / "spool", [(pid, "publish-buyer", late)])
        service.run_until_idle()
    finally:
        service.close()
    db = tmp_path / "ledger.duckdb"
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)
    key = scenario.cast.ledger
    with Store(db) as store:
        facts = attest_all(store, key, scenario.placement_ids)
        together = _attestations(store)
    with Store(copy) as store:
        for p in scenario.placement_ids:
            issue_statement(store, key, p)
        alone = _attestations(store)
        heads = store.heads()
    assert together == alone
    assert {p: f.records for p, f in facts.chains.items()} == {
        p: index + 1 for p, (index, _) in heads.items()
    }
    assert heads[pid][0] > close  # the late charge is past the close: a period 1 statement
    assert [s for s in together if s[0] == pid and s[1] > close]


def _attestations(store: Store) -> list[tuple[Any, ...]]:
    return store.query(
        "SELECT placement_id, through_index, envelope, NULL FROM statements UNION ALL "
        "SELECT placement_id, size, NULL, note FROM checkpoints ORDER BY ALL"
    )


def test_export_chunks_are_bounded_in_placements_and_records() -> None:
    """_chunks keeps commit order, at most EXPORT_STAGE_PLACEMENTS placements and
    EXPORT_STAGE_RECORDS records a chunk (a larger placement alone), and makes at least
    one chunk per writer thread when there are enough placements."""
    bound = EXPORT_STAGE_RECORDS
    ids = [f"p{i:03}" for i in range(3 * EXPORT_STAGE_PLACEMENTS)]
    records = dict.fromkeys(ids, 1)
    records["p005"] = bound + 1  # over the bound: alone
    records["p007"] = bound - 1  # fills a chunk
    chunks = export._chunks(ids, records, threads=2)
    assert [p for chunk in chunks for p in chunk] == ids
    assert ["p005"] in chunks  # over the bound, alone
    assert ["p006", "p007"] in chunks  # exactly at the bound
    for chunk in chunks:
        assert len(chunk) <= EXPORT_STAGE_PLACEMENTS
        assert len(chunk) == 1 or sum(records[p] for p in chunk) <= bound
    assert max(len(chunk) for chunk in chunks) == EXPORT_STAGE_PLACEMENTS
    assert [len(c) for c in export._chunks(ids[:10], dict.fromkeys(ids[:10], 1), threads=2)] == [
        5,
        5,
    ]
    assert [len(c) for c in export._chunks(ids[:1], records, threads=2)] == [1]


@pytest.mark.parametrize("compact", [False, True])
def test_the_template_in_memory_writes_the_template_file_byte_for_byte(
    tmp_path: Path, compact: bool
) -> None:
    """export_all starts each file from the empty template held in memory (its non-zero
    pages written, the zero ones left a hole): the same bytes as the template file, and
    DuckDB opens it with every export table, empty."""
    path = tmp_path / "template.duckdb"
    export._make_template(path, compact)
    template = export._Template.load(path)
    assert template.size == path.stat().st_size
    assert 0 < sum(len(data) for _, data in template.runs) < template.size  # zeros dropped
    copy = tmp_path / "copy.duckdb"
    template.write(copy)
    assert copy.read_bytes() == path.read_bytes()
    with pytest.raises(FileExistsError):  # never over an existing file
        template.write(copy)
    with duckdb.connect(str(copy), read_only=True) as con:
        for table in TABLES:
            assert con.execute(f"SELECT count(*) FROM {table}").fetchall() == [(0,)]


def test_export_all_refuses_an_unknown_placement_before_writing(tmp_path: Path) -> None:
    scenario, db = _ledger(tmp_path, placements=2)
    with pytest.raises(UnknownPlacement, match="nope"):
        export_all(
            db,
            tmp_path / "out",
            key=scenario.cast.ledger,
            placement_ids=["nope", *scenario.placement_ids],
        )
    assert not (tmp_path / "out").exists()


def test_the_sql_leaf_hash_is_the_rfc9162_leaf_of_the_payload(tmp_path: Path) -> None:
    scenario, db = _ledger(tmp_path, placements=2)
    with Store(db, ledger_public_key=scenario.cast.ledger.public_key) as store:
        rows = store.query(f"SELECT envelope, {LEAF_HASH_SQL} FROM records")
        assert len(rows) > 10
        for envelope, leaf in rows:
            assert leaf == merkle.leaf_hash(decode_envelope(bytes(envelope)).payload).hex()
        attested = attest_all(store, scenario.cast.ledger, scenario.placement_ids)
        assert attested.skipped == {}
        facts = attested.chains
        for pid in scenario.placement_ids:
            assert facts[pid].records == store.heads()[pid][0] + 1
            assert "usage" in facts[pid].kinds and "terms" in facts[pid].kinds


def _downgrade_to_v1(db: Path) -> None:
    """What a store written before commit ranges looks like (STORE_VERSION 1)."""
    to_version_2(db)
    with duckdb.connect(str(db)) as con:
        con.execute("DROP TABLE placement_commits")
        con.execute("ALTER TABLE records DROP COLUMN commit_no")
        con.execute("ALTER TABLE inputs DROP COLUMN commit_no")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'store_version'")


def test_a_version_1_store_is_migrated_and_keeps_its_chains(tmp_path: Path) -> None:
    scenario = build_scenario("migrate", placements=2, nodes=1, events=3)
    first, second = scenario.placement_ids
    publish_scenario_local(tmp_path / "spool", [i for i in scenario.inputs if i[0] == first])
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    heads = service.store.heads()
    service.close()
    _downgrade_to_v1(tmp_path / "ledger.duckdb")

    publish_scenario_local(tmp_path / "spool", [i for i in scenario.inputs if i[0] == second])
    service = local_service(tmp_path, scenario)  # migrates, then folds the second placement
    try:
        store = service.store
        assert store.query("SELECT value FROM meta WHERE key = 'store_version'") == [
            (STORE_VERSION,)
        ]
        assert store.commit_range(first) == (0, 0)
        assert store.heads()[first] == heads[first]
        service.run_until_idle()
        low, high = store.commit_range(second) or (0, 0)
        assert 1 <= low <= high
        for pid in (first, second):
            out = tmp_path / f"{pid}.duckdb"
            export_placement(store, pid, out, key=scenario.cast.ledger)
            result = verify_export(out, scenario.cast.trust())
            assert result.ok and result.final, result.error
    finally:
        service.close()


def test_cli_export_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario, _ = _ledger(tmp_path, placements=3)
    config = ledger_toml(
        tmp_path / "ledger.toml", ledger_key_file(tmp_path / "keys", scenario.cast)
    )
    out = tmp_path / "exports"
    assert gridledger_main(["ledger", "export", "--all", str(out), "--config", str(config)]) == 0
    assert "OK: exported 3 placement(s)" in capsys.readouterr().out
    assert sorted(p.stem for p in out.glob("*.duckdb")) == scenario.placement_ids
    argv = ["ledger", "export", "x", "--all", str(out), "--config", str(config)]
    assert gridledger_main(argv) == 2
    assert (
        capsys.readouterr().err.strip() == "FAIL: --all DIR takes no PLACEMENT, --out or --parquet"
    )
    assert gridledger_main(["ledger", "export", "--config", str(config)]) == 2
    assert "export needs PLACEMENT --out FILE.duckdb, or --all DIR" in capsys.readouterr().err


def test_a_placement_without_accepted_terms_is_skipped_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, db = _ledger(tmp_path, placements=2, bad_terms=True)
    done = export_all(db, tmp_path / "out", key=scenario.cast.ledger)
    assert sorted(done.written) == scenario.placement_ids
    assert done.skipped == {"bad": "placement 'bad' has no accepted terms"}
    assert not (tmp_path / "out" / "bad.duckdb").exists()
    with pytest.raises(UnknownPlacement, match="has no accepted terms"):
        export_placement(db, "bad", tmp_path / "bad.duckdb", key=scenario.cast.ledger)
    config = ledger_toml(
        tmp_path / "ledger.toml", ledger_key_file(tmp_path / "keys", scenario.cast)
    )
    argv = ["ledger", "export", "--all", str(tmp_path / "cli"), "--config", str(config)]
    assert gridledger_main(argv) == 1
    out = capsys.readouterr().out
    assert "OK: exported 2 placement(s)" in out
    assert "SKIPPED: bad: placement 'bad' has no accepted terms" in out


def test_compact_exports_hold_the_same_rows_verify_and_take_less_disk(tmp_path: Path) -> None:
    """Issue 15: a default export takes at least one 256 KiB block per table with rows,
    whatever the placement's size; a compact one (DuckDB 1.2 storage, 16 KiB blocks) holds
    the same rows, verifies the same, and is far smaller (EXPORT.md "Readers")."""
    scenario, db = _ledger(tmp_path)
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)
    plain = export_all(db, tmp_path / "plain", key=scenario.cast.ledger)
    compact = export_all(db, tmp_path / "compact", key=scenario.cast.ledger, compact=True)
    assert compact.written == plain.written
    pid = scenario.placement_ids[0]
    one = tmp_path / "one" / f"{pid}.duckdb"
    assert export_placement(copy, pid, one, key=scenario.cast.ledger, compact=True)
    assert _tables(one) == _tables(tmp_path / "plain" / f"{pid}.duckdb")
    for pid in scenario.placement_ids:
        small, big = tmp_path / "compact" / f"{pid}.duckdb", tmp_path / "plain" / f"{pid}.duckdb"
        assert _tables(small) == _tables(big)
        result = verify_export(small, scenario.cast.trust())
        assert result.ok and result.final, result.error
        assert small.stat().st_size * 4 < big.stat().st_size
        with duckdb.connect(str(small), read_only=True) as con:
            size = con.execute("PRAGMA database_size").fetchone()
            tags = con.execute(
                "SELECT tags FROM duckdb_databases() WHERE database_name = ?", [small.stem]
            ).fetchone()
        assert size is not None and size[2] == 16 * 1024  # block size
        assert tags is not None and tags[0]["storage_version"].startswith("v1.2.0")
    assert not list((tmp_path / "compact").glob(".*")), "temporary files left behind"


_OLD_READER = """
import json, sys
import duckdb
tables = json.loads(sys.argv[2])
with duckdb.connect(sys.argv[1], read_only=True) as con:
    rows = {t: [repr(r) for r in con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()]
            for t in tables}
print(json.dumps({"version": duckdb.__version__, "rows": rows}))
"""


def _read_with_duckdb_1_0(path: Path) -> dict[str, Any]:
    """The export's tables as DuckDB 1.0.0 reads them (installed by `make venv` beside the
    project's own DuckDB, in .venv/duckdb-1.0), in a process of its own."""
    import json

    old = Path(sys.prefix) / "duckdb-1.0"
    assert (old / "duckdb").is_dir(), f"{old} is missing: `make venv` installs DuckDB 1.0.0 there"
    env = {**os.environ, "PYTHONPATH": str(old)}
    done = subprocess.run(
        [sys.executable, "-c", _OLD_READER, str(path), json.dumps(TABLES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_exports_of_every_path_open_in_duckdb_1_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXPORT.md "Readers": DuckDB 1.0 opens every (non-compact) export. Exports once had
    `meta.key` as PRIMARY KEY, whose index DuckDB 1.0 cannot read back from a file written
    by DuckDB 2 ("Failed to deserialize ... field id: 103") although the header said
    storage version 64. One placement alone, export_all's staged chunks and a placement
    read straight from the store in pages: the same rows through DuckDB 1.0 as now."""
    scenario, db = _ledger(tmp_path, placements=2)
    files = [tmp_path / "one" / f"{scenario.placement_ids[0]}.duckdb"]
    export_placement(db, scenario.placement_ids[0], files[0], key=scenario.cast.ledger)
    export_all(db, tmp_path / "staged", key=scenario.cast.ledger)
    files += sorted((tmp_path / "staged").glob("*.duckdb"))
    monkeypatch.setattr(export, "EXPORT_STAGE_RECORDS", 1)  # every placement alone
    monkeypatch.setattr(export, "EXPORT_PAGE_RECORDS", 2)
    export_all(db, tmp_path / "paged", key=scenario.cast.ledger)
    files += sorted((tmp_path / "paged").glob("*.duckdb"))
    assert len(files) == 5
    for path in files:
        old = _read_with_duckdb_1_0(path)
        assert old["version"] == "1.0.0"
        with duckdb.connect(str(path), read_only=True) as con:
            now = {
                t: [repr(r) for r in con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()]
                for t in TABLES
            }
        assert old["rows"] == now, path
        assert len(now["ledger_records"]) > 0


def test_the_writers_config_keeps_every_required_setting_and_only_known_optional_ones() -> None:
    """A DuckDB before 2.0 knows neither ``fsync_mode`` nor the WAL-skip threshold: the
    writers leave them out there (pyproject allows 1.1) and keep every other setting."""
    import duckdb

    from ledger import export

    config = export._writer_config()
    with duckdb.connect(":memory:") as con:
        known = {str(r[0]) for r in con.execute("SELECT name FROM duckdb_settings()").fetchall()}
    required = set(export._WRITER_CONFIG) - export._WRITER_OPTIONAL
    assert required <= set(config)
    assert set(config) - required == export._WRITER_OPTIONAL & known
    duckdb.connect(":memory:", config=config).close()


def test_export_all_writes_small_placements_compact_and_the_others_portable_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compact_max_records``: in one call, the placements of at most that many records
    compact (16 KiB blocks, DuckDB 1.2 storage), the others portable (256 KiB, DuckDB
    1.0's), staged chunks mixing both and a placement read alone; each file holds the
    rows ``export_placement`` writes in the same order, and verifies."""
    scenario, db = _ledger(tmp_path, placements=7)
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(db, copy)
    with duckdb.connect(str(db), read_only=True) as con:
        sizes = {
            str(p): int(n)
            for p, n in con.execute(
                "SELECT placement_id, count(*) FROM records GROUP BY 1"
            ).fetchall()
        }
    limit = min(sizes.values())
    assert limit < max(sizes.values())  # both formats
    staged = _staged_in_twos(monkeypatch)
    done = export_all(
        db, tmp_path / "all", key=scenario.cast.ledger, threads=2, compact_max_records=limit
    )
    assert sorted(done.written) == scenario.placement_ids and done.skipped == {}
    assert sorted(len(chunk) for chunk in staged) == [2, 2, 2]  # and one read alone
    assert any(len({sizes[p] <= limit for p in chunk}) == 2 for chunk in staged)
    blocks: dict[str, int] = {}
    for pid in scenario.placement_ids:
        path = tmp_path / "all" / f"{pid}.duckdb"
        compact = sizes[pid] <= limit
        one = tmp_path / "one" / f"{pid}.duckdb"
        counts = export_placement(copy, pid, one, key=scenario.cast.ledger, compact=compact)
        assert counts == done.written[pid]
        assert _rows_as_stored(path) == _rows_as_stored(one), pid
        result = verify_export(path, scenario.cast.trust())
        assert result.ok and result.final, result.error
        with duckdb.connect(str(path), read_only=True) as con:
            size = con.execute("PRAGMA database_size").fetchone()
            tags = con.execute(
                "SELECT tags FROM duckdb_databases() WHERE database_name = ?", [pid]
            ).fetchone()
        assert size is not None and tags is not None
        blocks[pid] = size[2]
        version = tags[0]["storage_version"]
        assert (size[2], version[:6]) == (
            (16 * 1024, "v1.2.0") if compact else (256 * 1024, "v1.0.0")
        ), pid
    assert set(blocks.values()) == {16 * 1024, 256 * 1024}
    assert not list((tmp_path / "all").glob(".*")), "temporary files left behind"
    with pytest.raises(ValueError, match="exclusive"):
        export_all(
            db, tmp_path / "x", key=scenario.cast.ledger, compact=True, compact_max_records=1
        )
