"""``ExportSource.plain_shape``: the one statement that lets a small export skip the set
checks of (6) and the duplicate ranking of (7). Reports must be byte-identical with the
shortcut and without it (every check run), on honest and tampered exports, and the shape
must say "plain" only where those checks find nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import full_scenario, small_scenario

from verifier import limits
from verifier import source as source_module
from verifier.report import export_json
from verifier.source import ExportSource, PlainShape
from verifier.verify import verify_export

# The export's usage_events without its NOT NULL constraints (a hostile export may have
# none): a copy under the same name.
LOOSE = (
    "CREATE TABLE loose AS SELECT * FROM usage_events; DROP TABLE usage_events; "
    "ALTER TABLE loose RENAME TO usage_events; "
)

# (name, SQL on a copy of a 6-event export, indices plain, envelopes plain)
TAMPERED = (
    ("honest", "SELECT 1", True, True),
    ("deleted-input", "DELETE FROM usage_events WHERE chain_index = 3", False, True),
    ("deleted-record", "DELETE FROM ledger_records WHERE chain_index = 3", False, True),
    (
        "duplicated-record",
        "INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index = 2",
        False,
        True,
    ),
    (
        "duplicated-input",
        "INSERT INTO usage_events SELECT * FROM usage_events WHERE chain_index = 2",
        False,
        False,
    ),
    (
        "input-repeated-at-new-index",
        "UPDATE usage_events SET envelope = (SELECT envelope FROM usage_events "
        "WHERE chain_index = 1) WHERE chain_index = 2",
        True,
        False,
    ),
    # One NULL envelope repeats nothing, yet count(DISTINCT) skips it: not plain.
    (
        "null-envelope",
        LOOSE + "UPDATE usage_events SET envelope = NULL WHERE chain_index = 2",
        True,
        False,
    ),
    (
        "two-null-envelopes",
        LOOSE + "UPDATE usage_events SET envelope = NULL WHERE chain_index IN (2, 3)",
        True,
        False,
    ),
    (
        "negative-index",
        "UPDATE ledger_records SET chain_index = -1 WHERE chain_index = 0",
        False,
        True,
    ),
    (
        "null-index",
        LOOSE + "UPDATE usage_events SET chain_index = NULL WHERE chain_index = 4",
        False,
        True,
    ),
    ("shifted-inputs", "UPDATE usage_events SET chain_index = chain_index + 100", False, True),
    ("empty-records", "DELETE FROM ledger_records", False, True),
)


def report_text(path: Path, trust: Any) -> str:
    body = export_json(verify_export(path, trust))
    body.pop("elapsed_s", None)
    return json.dumps(body, sort_keys=True)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return small_scenario(tmp_path_factory.mktemp("plain"), minutes=6)


@pytest.mark.parametrize(("name", "sql", "indices", "envelopes"), TAMPERED)
def test_shortcut_changes_no_report(
    honest: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    sql: str,
    indices: bool,
    envelopes: bool,
) -> None:
    path = tmp_path / f"{name}.duckdb"
    shutil.copyfile(honest.path, path)
    con = duckdb.connect(str(path))
    con.execute(sql)
    con.close()
    with ExportSource(path) as source:
        shape = source.plain_shape()
        assert (shape.indices, shape.envelopes) == (indices, envelopes)
        # index_range answers from the shape when plain: the same as its SQL.
        ats = (-5, 0, 1, 6, 7, 8, 50, 200)
        short = [source.index_range(at) for at in ats]
        source._plain = None  # as if never asked: index_range runs its SQL
        assert [source.index_range(at) for at in ats] == short
        counts = dict(source._counts)
    with ExportSource(path) as source:  # counted first: counts and shape in one statement
        assert source._plain is None
        assert {t: source.count(t) for t in counts} == counts
        assert source._plain == shape  # read with the counts, the same
    with monkeypatch.context() as patch:  # more index rows than read in Python: asked of SQL
        patch.setattr(limits, "SHAPE_ROWS_MAX", 1)
        with ExportSource(path) as source:
            assert {t: source.count(t) for t in counts} == counts
            assert source._plain == shape
    fast = report_text(path, honest.trust)
    assert (json.loads(fast)["verdict"] == "verified") == (name == "honest")
    monkeypatch.setattr(
        source_module.ExportSource,
        "plain_shape",
        lambda self: PlainShape(indices=False, envelopes=False),
    )
    assert report_text(path, honest.trust) == fast


def test_colliding_envelope_hashes_only_take_the_thorough_path(
    honest: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small export's envelopes are counted by a 64-bit hash: distinct envelopes whose
    hashes collide make the export not plain (never plain where it is not), and the
    checks then run find nothing: the same report."""
    with ExportSource(honest.path) as source:
        assert source.count("usage_events") > 1 and source._plain is not None
        assert source._plain.envelopes and source._plain.indices
    alone = report_text(honest.path, honest.trust)
    monkeypatch.setattr(
        source_module,
        "_ENVELOPE_HASH",
        "CASE WHEN envelope IS NULL THEN NULL ELSE 7::UBIGINT END",  # every hash equal
    )
    with ExportSource(honest.path) as source:
        source.count("usage_events")
        assert source._plain is not None
        assert (source._plain.indices, source._plain.envelopes) == (True, False)
    assert report_text(honest.path, honest.trust) == alone
    assert json.loads(alone)["verdict"] == "verified"


def test_one_statement_reads_what_each_table_gives(tmp_path: Path) -> None:
    """A small export's batch reads every filled input table in one UNION ALL
    (``ExportSource._all_input_rows``): the same rows as one read per table."""
    full = full_scenario(tmp_path)
    tampered = tmp_path / "tampered.duckdb"
    shutil.copyfile(full.path, tampered)
    con = duckdb.connect(str(tampered))
    con.execute(LOOSE + "INSERT INTO usage_events SELECT * FROM usage_events WHERE chain_index < 9")
    con.execute("UPDATE usage_events SET node_id = NULL WHERE chain_index = 5")
    con.close()
    for path in (full.path, tampered):
        with ExportSource(path) as source:
            assert source.small and len(source.filled_input_tables) > 2
            for lo, hi in ((0, 2048), (3, 9), (7, 8), (500, 600)):
                each = [r for t in source.filled_input_tables for r in source.input_rows(t, lo, hi)]
                assert source._all_input_rows(lo, hi) == each
            assert source._all_input_rows(0, 2048)  # it read something


def test_totals_without_adjustments_give_the_same_report(
    honest: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No adjustment in w_adjust: w_totals without the window over them (Ac = Ah = 0)."""
    from verifier import pricing, step9_obligation

    fast = report_text(honest.path, honest.trust)
    assert json.loads(fast)["verdict"] == "verified"
    calls: list[bool] = []

    def always_windowed(con: Any, adjustments: bool = True) -> None:
        calls.append(adjustments)
        pricing.compute_totals(con, adjustments=True)

    monkeypatch.setattr(step9_obligation, "compute_totals", always_windowed)
    assert report_text(honest.path, honest.trust) == fast
    assert calls == [False]


def test_chain_rows_compare_as_the_sql_does() -> None:
    """``pricing.mismatches_in`` over ``chain_rows`` gives what ``record_mismatches``
    gives: per column the count, the first ``limit`` rows by chain index, expected and
    actual; NULL on both sides is no mismatch; a record without totals is not compared."""
    import random

    from verifier import pricing

    con = duckdb.connect(":memory:")
    pricing.create_work_tables(con)
    con.execute(
        "CREATE TABLE w_totals(chain_index BIGINT, "
        + ", ".join(f"{c} HUGEINT" for c in pricing.COMPARED)
        + ")"
    )
    rng = random.Random(15)
    width = len(pricing.COMPARED)
    indices = rng.sample(range(400), 150)
    for index in indices:
        mine = [rng.randrange(1 << 40) for _ in range(width)]
        theirs = list(mine)
        for k in range(width):  # column k differs in about one row of 3 + k
            if rng.randrange(3 + k) == 0:
                theirs[k] += rng.choice((-1, 1, 1 << 45))
        if index % 7 == 0:
            mine[3] = theirs[3] = None  # NULL on both sides: not distinct
        if index % 11 != 0:  # a record without totals: not joined
            con.execute(
                f"INSERT INTO w_totals VALUES ({', '.join(['?'] * (width + 1))})", [index, *mine]
            )
        con.execute(
            "INSERT INTO w_records (chain_index, record_hash, "
            + ", ".join(pricing.COMPARED)
            + f") VALUES ({', '.join(['?'] * (width + 2))})",
            [index, f"h{index}", *theirs],
        )
    rows = pricing.chain_rows(con)
    assert [r[0] for r in rows] == sorted(i for i in indices if i % 11 != 0)
    for limit in (0, 1, 3, 100):
        want = pricing.record_mismatches(con, limit)
        assert pricing.mismatches_in(rows, limit) == want
        if limit:
            assert {column for column, *_ in want} == set(pricing.COMPARED)
    honest = [(*r[: 2 + width], *r[2 : 2 + width]) for r in rows]
    assert pricing.mismatches_in(honest, 100) == []


def test_few_records_give_the_same_report_read_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small export of few records reads w_records JOIN w_totals once (``chain_rows``):
    the same report as the SQL comparison and reads, honest and with TOTAL_ findings."""
    from test_verifier_mutations import _wrong_decision_export

    from verifier import step9_obligation

    honest = small_scenario(tmp_path, name="p-few", minutes=6)
    wrong = _wrong_decision_export(tmp_path, "accepted", "", bad=True)
    # No statement at all: the head's totals are not read at a statement's index.
    bare = tmp_path / "no-statements.duckdb"
    shutil.copyfile(honest.path, bare)
    con = duckdb.connect(str(bare))
    con.execute("DELETE FROM statements")
    con.close()
    exports = [(honest.path, honest.trust), (wrong.path, wrong.trust), (bare, honest.trust)]
    calls: list[int] = []
    real = step9_obligation.chain_rows

    def counted(con: Any) -> list[tuple[Any, ...]]:
        rows = real(con)
        calls.append(len(rows))
        return rows

    monkeypatch.setattr(step9_obligation, "chain_rows", counted)
    fast = [report_text(path, trust) for path, trust in exports]
    assert len(calls) == 3 and all(calls), calls
    assert json.loads(fast[0])["verdict"] == "verified"
    rules = set(json.loads(fast[1])["findings"]["by_rule"])
    assert {"TOTAL_DELIVERED_MGMS", "STATEMENT_TOTALS"} <= rules, rules
    assert json.loads(fast[2])["totals"] == json.loads(fast[0])["totals"]
    assert json.loads(fast[2])["totals"]["gross_minor"] > 0
    monkeypatch.setattr(step9_obligation, "CHAIN_ROWS_MAX", -1)  # every export: the SQL
    assert [report_text(path, trust) for path, trust in exports] == fast
    assert len(calls) == 3
