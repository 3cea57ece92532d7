"""(5) columns: every convenience column of the export equals the value decoded from its
envelope (or, for meta, from the accepted terms and the table sizes). The verifier never
reads these columns for anything else: they exist for people writing SQL."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Final

from proto.records import LedgerRecord, PlacementTerms, Statement
from verifier.findings import Findings, Step
from verifier.opener import OpenResult
from verifier.source import TABLE_OF_KIND, ExportSource, InputRow, RecordRow

if TYPE_CHECKING:
    from verifier.state import Verification

RECORD_COLUMN_NAMES: Final = (
    "record_hash",
    "kind",
    "status",
    "reason",
    "delivered_mgms",
    "gross_minor",
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
)
STATEMENT_COLUMN_NAMES: Final = (
    "through_index",
    "final",
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
)


def _mismatches(
    findings: Findings,
    where: str,
    names: tuple[str, ...],
    wanted: tuple[Any, ...],
    have: tuple[Any, ...],
    message: str,
) -> None:
    for name, want, got in zip(names, wanted, have, strict=True):
        if want != got:
            findings.add(Step.COLUMNS, "COLUMN_MISMATCH", f"{where}.{name}", want, got, message)


def _shown(text: str | None) -> str | None:
    """A meta value as a finding shows it: at most 64 characters, then its length."""
    if text is None or len(text) <= 64:
        return text
    return f"{text[:64]}... ({len(text)} characters)"


def check_meta_terms(source: ExportSource, terms: PlacementTerms, findings: Findings) -> None:
    """meta.placement_id and meta.ledger_key against the accepted terms."""
    meta = source.meta
    for key, expected in (
        ("placement_id", terms.placement_id),
        ("ledger_key", base64.b64encode(terms.ledger_key).decode()),
    ):
        if meta.get(key) != expected:
            findings.add(
                Step.COLUMNS,
                "META_COLUMN",
                f"meta.{key}",
                expected,
                _shown(meta.get(key)),
                "meta disagrees with the accepted terms",
            )


def check_meta_records(run: Verification) -> None:
    """meta.records against the number of ledger_records rows."""
    meta_records = run.source.meta.get("records")
    if meta_records != str(run.record_count):
        run.add(
            Step.COLUMNS,
            "META_COLUMN",
            "meta.records",
            run.record_count,
            _shown(meta_records),
            "meta.records is not the number of ledger_records rows",
        )


def check_record_columns(
    run: Verification, row: RecordRow, opened: OpenResult, record: LedgerRecord
) -> None:
    """A ledger_records row's columns against its LedgerRecord (hot path: one compare)."""
    wanted = record_column_values(opened.record_hash, record, row.columns)
    names: tuple[str, ...] = RECORD_COLUMN_NAMES
    if len(row.columns) > len(names):  # the export has ledger_records.placement_id
        names = (*names, "placement_id")
    if wanted != row.columns:
        _mismatches(
            run.findings,
            row.where,
            names,
            wanted,
            row.columns,
            "a convenience column disagrees with the signed envelope",
        )


def record_column_values(
    record_hash: str, record: LedgerRecord, columns: tuple[Any, ...]
) -> tuple[Any, ...]:
    """What a ledger_records row's columns (``RecordRow.columns``) must hold for
    ``record``: RECORD_COLUMN_NAMES, then placement_id when the row has that column."""
    totals = record.totals
    wanted: tuple[Any, ...] = (
        record_hash,
        record.kind,
        record.status,
        record.reason,
        record.delivered_mgms,
        totals.gross_minor,
        totals.buyer_owes_minor,
        totals.operator_receives_minor,
        totals.desk_receives_minor,
    )
    if len(columns) > len(RECORD_COLUMN_NAMES):  # the export has ledger_records.placement_id
        wanted = (*wanted, record.placement_id)
    return wanted


def check_input_columns(run: Verification, row: InputRow, opened: OpenResult) -> None:
    """An input row in the table of its kind, with its extra columns from the envelope."""
    record = opened.record
    if record is None:
        return
    if opened.kind != row.kind:
        run.add(
            Step.COLUMNS,
            "TABLE_KIND",
            row.where,
            row.kind,
            opened.kind,
            f"a {opened.kind} envelope in table {row.table}",
        )
        return
    extras = TABLE_OF_KIND[row.kind].extras
    wanted = tuple(getattr(record, name) for name, _ in extras)
    if wanted != row.extras:
        _mismatches(
            run.findings,
            row.where,
            tuple(n for n, _ in extras),
            wanted,
            row.extras,
            "a convenience column disagrees with the signed envelope",
        )


def check_statement_columns(
    run: Verification, where: str, statement: Statement, stored: tuple[Any, ...]
) -> None:
    """A statements row's columns (through_index first) against its Statement."""
    t = statement.totals
    wanted = (
        statement.through_index,
        statement.final,
        t.buyer_owes_minor,
        t.operator_receives_minor,
        t.desk_receives_minor,
    )
    _mismatches(
        run.findings,
        where,
        STATEMENT_COLUMN_NAMES,
        wanted,
        stored,
        "a convenience column disagrees with the signed statement",
    )


def check_checkpoint_size(run: Verification, where: str, size: int, stored: object) -> None:
    """A checkpoints row's size column against the size inside its signed note."""
    if size != stored:
        run.add(
            Step.COLUMNS,
            "COLUMN_MISMATCH",
            f"{where}.size",
            size,
            stored,
            "the size column disagrees with the signed note",
        )
