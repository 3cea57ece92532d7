"""Every mutation class of an honest export is caught and named (step, rule, record).

Each test copies the honest full-scenario export, changes it the way an attacker or a
buggy ledger would, and asserts the verifier fails it with the specific rule. Mutations
that keep every signature valid (re-signed statements, a ledger that decides wrongly)
show that the verifier recomputes rather than trusts.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verifier_exports import (
    ExportBuilder,
    Scenario,
    explain,
    full_scenario,
    small_scenario,
    verify,
)

from devtools.builders import StreamWriter, adjustment, sample, signed_terms
from proto.keys import SigningKey
from proto.records import Statement
from proto.trust import load_trust
from verifier.findings import Step
from verifier.verify import ExportReport


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("honest"))


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    # Another placement of the SAME parties and ledger: every signature in it is trusted.
    return full_scenario(tmp_path_factory.mktemp("other"), name="p-other")


@pytest.fixture(scope="module")
def honest_files(honest: Scenario) -> tuple[str, str]:
    # Plain strings: hypothesis prints the arguments of a failing example.
    return str(honest.path), str(honest.trust_path)


class _Files:
    """Export and trust of a scenario, without the scenario (see ``honest_files``)."""

    def __init__(self, path: str, trust_path: str) -> None:
        self.path = Path(path)
        self.trust = load_trust(Path(trust_path))


def mutated(s: Scenario | _Files, tmp: Path, *sql: str, params: list[Any] | None = None) -> Path:
    """A copy of the export with ``sql`` applied."""
    path = tmp / "mutated.duckdb"
    shutil.copyfile(s.path, path)
    con = duckdb.connect(str(path))
    for statement in sql:
        con.execute(statement, params or [])
    con.close()
    return path


def failed_with(report: ExportReport, *rules: str) -> None:
    assert not report.ok, "the mutated export verified"
    missing = set(rules) - report.findings.rules()
    assert not missing, f"rules {missing} not reported; got:\n{explain(report)}"


def finding(report: ExportReport, rule: str) -> Any:
    return next(f for f in report.findings.kept if f.rule == rule)


def test_honest_baseline(honest: Scenario) -> None:
    report = verify(honest.path, honest.trust)
    assert report.ok, explain(report)


# ---- flipped bytes -------------------------------------------------------------------


def _envelopes(path: Path) -> list[tuple[str, str, int, int]]:
    """(table, key column, key, envelope length) of every envelope and note in the export."""
    con = duckdb.connect(str(path), read_only=True)
    out: list[tuple[str, str, int, int]] = []
    for table in ("terms", "key_bindings", "usage_events", "reclaims", "adjustments", "closes"):
        out += [
            (table, "chain_index", i, n)
            for i, n in con.execute(
                f"SELECT chain_index, octet_length(envelope) FROM {table}"
            ).fetchall()
        ]
    out += [
        ("ledger_records", "chain_index", i, n)
        for i, n in con.execute(
            "SELECT chain_index, octet_length(envelope) FROM ledger_records"
        ).fetchall()
    ]
    out += [
        ("statements", "through_index", i, n)
        for i, n in con.execute(
            "SELECT through_index, octet_length(envelope) FROM statements"
        ).fetchall()
    ]
    con.close()
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_flipped_byte_in_any_envelope_is_caught(
    honest_files: tuple[str, str], tmp_path: Path, data: st.DataObject
) -> None:
    honest = _Files(*honest_files)
    envelopes = _envelopes(honest.path)
    table, key_column, key, length = data.draw(st.sampled_from(envelopes), label="envelope")
    position = data.draw(st.integers(0, length - 1), label="byte")
    mask = data.draw(st.integers(1, 255), label="xor")
    con = duckdb.connect(str(honest.path), read_only=True)
    raw = bytearray(
        con.execute(f"SELECT envelope FROM {table} WHERE {key_column} = ?", [key]).fetchone()[0]
    )
    con.close()
    raw[position] ^= mask
    path = mutated(
        honest,
        tmp_path,
        f"UPDATE {table} SET envelope = $1 WHERE {key_column} = $2",
        params=[bytes(raw), key],
    )
    report = verify(path, honest.trust)
    assert not report.ok, f"flip at {table}[{key}] byte {position} went unnoticed"
    # The finding names the row that was touched (or, for a statement, its index).
    named = [f for f in report.findings.kept if str(key) in f.record and f.step <= Step.OBLIGATION]
    assert named, explain(report)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_flipped_character_in_checkpoint_is_caught(
    honest_files: tuple[str, str], tmp_path: Path, data: st.DataObject
) -> None:
    honest = _Files(*honest_files)
    con = duckdb.connect(str(honest.path), read_only=True)
    size, note = con.execute("SELECT size, note FROM checkpoints ORDER BY size DESC").fetchone()
    con.close()
    position = data.draw(st.integers(0, len(note) - 2), label="char")  # keep the final newline
    replacement = data.draw(st.sampled_from("A0+/= x\n"), label="char")
    if note[position] == replacement:
        replacement = "B" if replacement != "B" else "C"
    changed = note[:position] + replacement + note[position + 1 :]
    path = mutated(
        honest, tmp_path, "UPDATE checkpoints SET note = $1 WHERE size = $2", params=[changed, size]
    )
    report = verify(path, honest.trust)
    assert not report.ok, f"note change at {position} went unnoticed"
    assert report.findings.steps() & {Step.MERKLE, Step.COLUMNS}, explain(report)


# ---- rows deleted, duplicated, reordered ------------------------------------------------


def test_deleted_input_row(honest: Scenario, tmp_path: Path) -> None:
    index = honest.index_of("usage")
    path = mutated(honest, tmp_path, f"DELETE FROM usage_events WHERE chain_index = {index + 2}")
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_INPUT_MISSING")
    assert finding(report, "CHAIN_INPUT_MISSING").record == f"ledger_records[{index + 2}]"


def test_deleted_record_row(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(honest, tmp_path, "DELETE FROM ledger_records WHERE chain_index = 5")
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_GAP", "CHAIN_RECORD_MISSING", "META_COLUMN", "CHECKPOINT_ROOT")
    assert finding(report, "CHAIN_GAP").record == "ledger_records[5..5]"


def test_duplicated_input_row(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(
        honest,
        tmp_path,
        "INSERT INTO usage_events SELECT * FROM usage_events WHERE chain_index = 3",
    )
    failed_with(verify(path, honest.trust), "CHAIN_INPUT_DUPLICATE")


def test_duplicated_record_row(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(
        honest,
        tmp_path,
        "INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index = 3",
    )
    failed_with(verify(path, honest.trust), "CHAIN_DUPLICATE_INDEX", "META_COLUMN")


def test_reordered_inputs(honest: Scenario, tmp_path: Path) -> None:
    # Two usage events of one stream trade places in the chain.
    path = mutated(
        honest,
        tmp_path,
        "UPDATE usage_events SET chain_index = CASE chain_index WHEN 2 THEN 3 ELSE 2 END "
        "WHERE chain_index IN (2, 3)",
    )
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_SOURCE", "SEQ_GAP")


def test_reordered_records(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(
        honest,
        tmp_path,
        "UPDATE ledger_records SET chain_index = CASE chain_index WHEN 7 THEN 8 ELSE 7 END "
        "WHERE chain_index IN (7, 8)",
    )
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_INDEX", "CHAIN_PREV", "CHAIN_SOURCE", "CHECKPOINT_ROOT")


def test_inputs_moved_to_another_table(honest: Scenario, tmp_path: Path) -> None:
    index = honest.index_of("reclaim", "accepted")
    path = mutated(
        honest,
        tmp_path,
        "INSERT INTO closes SELECT chain_index, position, input_hash, envelope, status, reason, "
        f"NULL FROM reclaims WHERE chain_index = {index}",
        f"DELETE FROM reclaims WHERE chain_index = {index}",
    )
    failed_with(verify(path, honest.trust), "TABLE_KIND")


# ---- convenience columns --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "record"),
    [
        (
            "UPDATE usage_events SET end_ms = end_ms + 1 WHERE chain_index = 4",
            "usage_events chain_index 4.end_ms",
        ),
        (
            "UPDATE usage_events SET node_id = 'node-b' WHERE chain_index = 4",
            "usage_events chain_index 4.node_id",
        ),
        (
            "UPDATE ledger_records SET gross_minor = gross_minor + 1 WHERE chain_index = 20",
            "ledger_records[20].gross_minor",
        ),
        (
            "UPDATE ledger_records SET status = 'rejected' WHERE chain_index = 2",
            "ledger_records[2].status",
        ),
        ("UPDATE adjustments SET amount_minor = 70 WHERE amount_minor = 7", None),
        ("UPDATE statements SET buyer_owes_minor = buyer_owes_minor - 1", None),
        ("UPDATE meta SET value = 'p-elsewhere' WHERE key = 'placement_id'", "meta.placement_id"),
        ("UPDATE checkpoints SET size = size + 1 WHERE size = 14", "checkpoints size 15.size"),
    ],
)
def test_edited_convenience_column(
    honest: Scenario, tmp_path: Path, sql: str, record: str | None
) -> None:
    report = verify(mutated(honest, tmp_path, sql), honest.trust)
    assert not report.ok
    columns = [f for f in report.findings.kept if f.step == Step.COLUMNS]
    assert columns, explain(report)
    if record is not None:
        assert record in {f.record for f in columns}, explain(report)


def test_input_status_column_disagrees_with_record(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(
        honest,
        tmp_path,
        "UPDATE usage_events SET status = 'rejected', reason = 'SEQ_GAP' WHERE chain_index = 2",
    )
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_STATUS")
    assert finding(report, "CHAIN_STATUS").record == "usage_events chain_index 2.status"


# ---- another placement, truncation ---------------------------------------------------------


def test_records_of_another_placement_swapped_in(
    honest: Scenario, other: Scenario, tmp_path: Path
) -> None:
    path = mutated(
        honest,
        tmp_path,
        f"ATTACH '{other.path}' AS o (READ_ONLY)",
        "DELETE FROM ledger_records",
        "INSERT INTO ledger_records SELECT * FROM o.ledger_records",
    )
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_PLACEMENT", "CHAIN_SOURCE", "CHECKPOINT_ROOT")


def test_whole_export_of_another_placement_is_not_this_one(
    honest: Scenario, other: Scenario, tmp_path: Path
) -> None:
    # Everything of the other placement, but the statements of this one.
    path = tmp_path / "swapped.duckdb"
    shutil.copyfile(other.path, path)
    con = duckdb.connect(str(path))
    con.execute(f"ATTACH '{honest.path}' AS h (READ_ONLY)")
    con.execute("DELETE FROM statements")
    con.execute("INSERT INTO statements SELECT * FROM h.statements")
    con.close()
    failed_with(verify(path, honest.trust), "STATEMENT_PLACEMENT", "STATEMENT_HEAD")


def test_truncated_chain(honest: Scenario, tmp_path: Path) -> None:
    n = len(honest.builder.items)
    path = mutated(honest, tmp_path, f"DELETE FROM ledger_records WHERE chain_index >= {n - 3}")
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_RECORD_MISSING", "CHECKPOINT_SIZE", "META_COLUMN")


def test_consistently_truncated_chain_is_betrayed_by_its_checkpoint(
    honest: Scenario, tmp_path: Path
) -> None:
    # Cut every table at n - 3 and fix meta: only the signed checkpoint of size n remains.
    n = len(honest.builder.items)
    cut = [
        f"DELETE FROM {t} WHERE chain_index >= {n - 3}"
        for t in (
            "terms",
            "key_bindings",
            "usage_events",
            "reclaims",
            "adjustments",
            "closes",
            "ledger_records",
        )
    ]
    path = mutated(
        honest,
        tmp_path,
        *cut,
        f"DELETE FROM statements WHERE through_index >= {n - 3}",
        f"UPDATE meta SET value = '{n - 3}' WHERE key = 'records'",
    )
    report = verify(path, honest.trust)
    failed_with(report, "CHECKPOINT_SIZE")
    assert finding(report, "CHECKPOINT_SIZE").actual == str(n)


# ---- statements ---------------------------------------------------------------------


def _replace_statement(s: Scenario, tmp: Path, envelope: bytes, through: int) -> Path:
    return mutated(
        s,
        tmp,
        "UPDATE statements SET envelope = $1 WHERE through_index = $2",
        params=[envelope, through],
    )


def test_statement_signed_by_key_outside_trust(honest: Scenario, tmp_path: Path) -> None:
    through = len(honest.builder.items) - 1
    stranger = SigningKey.from_seed_text("ledger-1", "not the pinned ledger")
    envelope = honest.builder.statement(through, key=stranger)
    report = verify(_replace_statement(honest, tmp_path, envelope, through), honest.trust)
    failed_with(report, "STATEMENT_SIGNATURE")
    assert finding(report, "STATEMENT_SIGNATURE").actual in {"SIG_SURPLUS", "SIG_INVALID"}


@pytest.mark.parametrize("field", ["buyer_owes_minor", "operator_receives_minor", "gross_minor"])
def test_statement_off_by_one_minor_unit(honest: Scenario, tmp_path: Path, field: str) -> None:
    # Correctly signed by the pinned ledger key: only recomputation can catch it.
    through = len(honest.builder.items) - 1
    record = honest.builder.items[through].record
    assert record is not None
    totals = record.totals.__class__(
        **{
            **{f: getattr(record.totals, f) for f in record.totals.__struct_fields__},
            field: getattr(record.totals, field) + 1,
        }
    )
    envelope = honest.builder.statement(through, totals=totals)
    report = verify(_replace_statement(honest, tmp_path, envelope, through), honest.trust)
    failed_with(report, "STATEMENT_TOTALS")
    f = next(f for f in report.findings.kept if f.rule == "STATEMENT_TOTALS")
    assert f.record.endswith(field)
    assert int(f.actual) == int(f.expected) + 1


def test_statement_claiming_final_too_early(honest: Scenario, tmp_path: Path) -> None:
    envelope = honest.builder.statement(14, final=True)
    report = verify(_replace_statement(honest, tmp_path, envelope, 14), honest.trust)
    failed_with(report, "STATEMENT_FINAL")


def test_statement_type_is_checked(honest: Scenario) -> None:
    assert Statement.__struct_config__.tag == "statement"


# ---- wrong decisions by the ledger (every signature valid) -------------------------------


def _wrong_decision_export(tmp: Path, status: str, reason: str, *, bad: bool) -> Scenario:
    s = small_scenario(tmp, name="p-wrong", minutes=0)
    b = ExportBuilder(s.cast, s.terms)
    b.add(signed_terms(s.cast, s.terms))
    g = s.terms.gpus[0]
    a = StreamWriter(s.cast.node_key("node-a"), "p-wrong", "node-a")
    from test_verifier_exports import MINUTE, T0

    for m in range(3):
        b.add(a.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(g)]))
    if bad:  # seq jumps by one: SEQ_GAP, but the ledger says accepted
        a.seq += 1
    b.add(a.event(T0 + 3 * MINUTE, T0 + 4 * MINUTE, [sample(g)]), status, reason)
    b.checkpoints_at = [len(b.items)]
    b.statements_at = [len(b.items) - 1]
    b.write(s.path)
    return s


def test_valid_event_wrongly_rejected(tmp_path: Path) -> None:
    s = _wrong_decision_export(tmp_path, "rejected", "SIG_INVALID", bad=False)
    report = verify(s.path, s.trust)
    failed_with(report, "SIG_INVALID", "TOTAL_DELIVERED_MGMS")
    f = finding(report, "SIG_INVALID")
    assert (f.step, f.record, f.expected, f.actual) == (
        Step.DECISIONS,
        "usage_events chain_index 4",
        "accepted",
        "rejected SIG_INVALID",
    )


def test_bad_event_wrongly_accepted(tmp_path: Path) -> None:
    s = _wrong_decision_export(tmp_path, "accepted", "", bad=True)
    report = verify(s.path, s.trust)
    failed_with(report, "SEQ_GAP", "TOTAL_DELIVERED_MGMS", "STATEMENT_TOTALS")
    f = finding(report, "SEQ_GAP")
    assert (f.step, f.expected, f.actual) == (Step.DECISIONS, "rejected SEQ_GAP", "accepted")


def test_chained_duplicate_should_have_been_dropped(tmp_path: Path) -> None:
    s = small_scenario(tmp_path, name="p-dup", minutes=2)
    b = s.builder
    raw = adjustment(s.cast, "p-dup", "adj-9", "credit", 1, 0)
    b.items.insert(2, b.items[0].__class__(raw, "accepted", ""))
    b.items.insert(3, b.items[0].__class__(raw, "rejected", "ADJUSTMENT_DUPLICATE"))
    b.statements_at, b.checkpoints_at = [], []
    b.write(s.path)
    report = verify(s.path, s.trust)
    failed_with(report, "DUPLICATE")
    f = finding(report, "DUPLICATE")
    assert (f.expected, f.actual) == ("dropped DUPLICATE", "rejected ADJUSTMENT_DUPLICATE")


def test_usage_before_terms_should_have_been_held(tmp_path: Path) -> None:
    s = small_scenario(tmp_path, name="p-held", minutes=2)
    b = s.builder
    b.items[0], b.items[1] = b.items[1], b.items[0]
    b.items[0].status, b.items[0].reason = "rejected", "NODE_UNKNOWN"
    b.statements_at, b.checkpoints_at = [], []
    b.write(s.path)
    report = verify(s.path, s.trust)
    failed_with(report, "HELD")


# ---- trust ------------------------------------------------------------------------------


def test_export_by_an_unpinned_ledger(honest: Scenario) -> None:
    # A trust file pinning the parties but another ledger key: nothing the ledger signed counts.
    from proto.trust import TrustedKey, TrustFile

    stranger = SigningKey.from_seed_text("ledger-x", "another ledger")
    keys = [k for k in honest.trust.keys if k.role != "ledger"]
    keys.append(TrustedKey(id="ledger-x", role="ledger", key=stranger.public_key))
    report = verify(honest.path, TrustFile(format=honest.trust.format, keys=keys))
    failed_with(report, "TERMS_LEDGER_NOT_PINNED")


def test_terms_party_not_pinned(honest: Scenario) -> None:
    from proto.trust import TrustFile

    keys = [k for k in honest.trust.keys if k.role != "buyer"]
    report = verify(honest.path, TrustFile(format=honest.trust.format, keys=keys))
    failed_with(report, "TERMS_KEY_NOT_PINNED")
    assert finding(report, "TERMS_KEY_NOT_PINNED").step == Step.TERMS


def test_findings_are_capped_but_counted(honest: Scenario, tmp_path: Path) -> None:
    path = mutated(honest, tmp_path, "UPDATE usage_events SET start_ms = start_ms + 1")
    report = verify(path, honest.trust)
    rows = sum(1 for i in honest.builder.items if i.raw and b'"type":"usage"' in _payload(i.raw))
    assert report.findings.counts["COLUMN_MISMATCH"] == rows
    kept = [f for f in report.findings.kept if f.rule == "COLUMN_MISMATCH"]
    assert len(kept) == min(rows, report.findings.max_per_rule)


def _payload(raw: bytes) -> bytes:
    from proto.envelope import decode_envelope

    return decode_envelope(raw).payload


def test_nulls_in_a_hostile_export_are_findings_not_crashes(
    honest: Scenario, tmp_path: Path
) -> None:
    path = tmp_path / "nulls.duckdb"
    shutil.copyfile(honest.path, path)
    con = duckdb.connect(str(path))
    for table in ("usage_events", "ledger_records", "statements"):
        # Recreate without NOT NULL, as a hostile writer may.
        con.execute(f"CREATE TABLE t AS SELECT * FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE t RENAME TO {table}")
    con.execute("UPDATE usage_events SET envelope = NULL WHERE chain_index = 2")
    con.execute("UPDATE usage_events SET chain_index = NULL WHERE chain_index = 3")
    con.execute("UPDATE ledger_records SET envelope = NULL WHERE chain_index = 4")
    con.execute("UPDATE statements SET envelope = NULL WHERE through_index = 14")
    con.close()
    report = verify(path, honest.trust)
    failed_with(report, "CHAIN_INDEX_NULL", "MALFORMED", "CHAIN_INPUT_MISSING")
    assert "VERIFIER_ERROR" not in report.findings.rules()


def test_a_view_in_place_of_a_table_is_unusable_and_never_runs(
    honest: Scenario, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-7")
    path = mutated(
        honest,
        tmp_path,
        "ALTER TABLE meta RENAME TO meta_orig",
        "CREATE VIEW meta AS SELECT key, CASE WHEN key = 'placement_id' THEN "
        f"(SELECT content FROM read_text('{secret}')) ELSE value END AS value FROM meta_orig",
    )
    report = verify(path, honest.trust)
    assert report.verdict == "unusable"
    assert "meta is a view" in report.error and "SECRET" not in report.error


def test_a_meta_key_written_twice_makes_the_export_unusable(
    honest: Scenario, tmp_path: Path
) -> None:
    """EXPORT.md: each meta key at most once (the table has no PRIMARY KEY since DuckDB 1.0
    could not read one back). Row order carries no meaning, so which of two placement ids
    would be the export's is not for the verifier to pick, whichever row comes first."""
    honest_rows = "INSERT INTO meta SELECT * FROM meta_orig"
    other_row = (
        "INSERT INTO meta SELECT key, 'someone-else' FROM meta_orig WHERE key = 'placement_id'"
    )
    for first, then in ((honest_rows, other_row), (other_row, honest_rows)):
        where = tmp_path / str(first == other_row)
        where.mkdir()
        path = mutated(
            honest,
            where,
            "ALTER TABLE meta RENAME TO meta_orig",
            "CREATE TABLE meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL)",
            first,
            then,
            "DROP TABLE meta_orig",
        )
        report = verify(path, honest.trust)
        assert report.verdict == "unusable", where
        assert "meta key 'placement_id' appears twice" in report.error, where


def test_rows_past_the_small_table_bound_fail_the_export(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verifier import limits

    monkeypatch.setattr(limits, "MAX_SMALL_TABLE_ROWS", 2)
    report = verify(honest.path, honest.trust)  # 3 statements and 3 checkpoints
    failed_with(report, "TABLE_TOO_LARGE")
    assert {f.record for f in report.findings.kept if f.rule == "TABLE_TOO_LARGE"} == {
        "statements",
        "checkpoints",
    }
