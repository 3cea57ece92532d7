"""(6) chain: ledger_records 0..n-1 contiguous, each a canonical LedgerRecord signed by the
trusted ledger key only; prev, placement, source, kind, status and reason right; every
chain index in exactly one input table.

Two halves: ``check_sets`` runs set-based SQL over the whole export before the pass (holes,
duplicates, inputs without records and records without inputs); the rest is called by the
pass for each chain index, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proto.records import ZERO_HASH, LedgerRecord
from verifier import limits
from verifier.findings import Step
from verifier.opener import OpenResult
from verifier.signers import signer_failure
from verifier.source import ALIAS, InputRow, RecordRow

if TYPE_CHECKING:
    from verifier.state import Verification

# A result row of a set check -> (where, expected, actual, message).
Describe = Callable[[tuple[Any, ...]], tuple[str, object, object, str]]


def check_sets(run: Verification) -> None:
    """Contiguity and the one-input-per-index rule, as SQL over the export (not run when
    the export's indices are plain: then every count is 0, ``ExportSource.plain_shape``)."""
    if run.source.plain_shape().indices:
        return
    x = ALIAS
    all_indices = run.source.all_indices_sql()
    tagged = " UNION ALL ".join(
        f"SELECT chain_index, '{t.name}' AS tbl FROM {x}.{t.name}"
        for t in run.source.filled_input_tables
    )
    checks: list[tuple[str, str, Describe]] = [
        (
            "CHAIN_DUPLICATE_INDEX",
            f"SELECT chain_index, count(*) FROM {x}.ledger_records GROUP BY 1 HAVING count(*) > 1",
            lambda r: (
                f"ledger_records[{r[0]}]",
                "one record",
                f"{r[1]} records",
                "two records claim one chain index",
            ),
        ),
        (
            "CHAIN_GAP",
            f"""SELECT lo, hi FROM (
              SELECT chain_index + 1 AS lo,
                     lead(chain_index) OVER (ORDER BY chain_index) - 1 AS hi
              FROM (SELECT DISTINCT chain_index FROM {x}.ledger_records
                    UNION SELECT -1)) WHERE hi >= lo""",
            lambda r: (
                f"ledger_records[{r[0]}..{r[1]}]",
                "contiguous indices from 0",
                "missing",
                "the chain has a hole: records were deleted or never exported",
            ),
        ),
        (
            "CHAIN_INDEX_RANGE",
            f"SELECT chain_index FROM ({all_indices}) WHERE chain_index < 0",
            lambda r: (f"chain_index {r[0]}", ">= 0", r[0], "negative chain index"),
        ),
        (
            "CHAIN_INDEX_NULL",
            f"SELECT 'NULL' FROM ({all_indices}) WHERE chain_index IS NULL",
            lambda r: ("chain_index NULL", "an index", "NULL", "a row without a chain index"),
        ),
        (
            "CHAIN_INPUT_DUPLICATE",
            f"SELECT chain_index, string_agg(tbl, ',' ORDER BY tbl), count(*) FROM ({tagged}) "
            "GROUP BY 1 HAVING count(*) > 1",
            lambda r: (
                f"chain_index {r[0]}",
                "exactly one input row",
                f"{r[2]} rows in {r[1]}",
                "every chain index appears in exactly one input table",
            ),
        ),
        (
            "CHAIN_INPUT_MISSING",
            f"SELECT DISTINCT chain_index FROM {x}.ledger_records "
            # NOT IN over a set holding NULL is never true: keep NULLs out of the set.
            f"WHERE chain_index NOT IN (SELECT chain_index FROM ({tagged}) "
            "WHERE chain_index IS NOT NULL)",
            lambda r: (
                f"ledger_records[{r[0]}]",
                "an input row",
                "none",
                "a record whose input is not in the export",
            ),
        ),
        (
            "CHAIN_RECORD_MISSING",
            f"SELECT DISTINCT chain_index FROM ({tagged}) "
            f"WHERE chain_index NOT IN (SELECT chain_index FROM {x}.ledger_records "
            "WHERE chain_index IS NOT NULL)",
            lambda r: (
                f"chain_index {r[0]}",
                "a ledger record",
                "none",
                "an input without its ledger record (truncated or deleted)",
            ),
        ),
    ]
    _set_checks(run, checks)


def _set_checks(run: Verification, checks: list[tuple[str, str, Describe]]) -> None:
    """Count the rows of each check's SQL as findings of its rule (every count in one
    statement, a UNION ALL: on a small export planning costs more than the rows; see
    ``count_sql``); keep the first few of each as examples."""
    counts = dict(
        run.con.execute(
            " UNION ALL ".join(
                f"SELECT {k}, count(*) FROM ({sql})" for k, (_, sql, _) in enumerate(checks)
            )
        ).fetchall()
    )
    for k, (rule, sql, describe) in enumerate(checks):
        count = counts[k]
        if not count:
            continue
        run.findings.count(rule, int(count))
        for row in run.con.execute(f"{sql} ORDER BY 1 LIMIT {limits.MAX_MISMATCH_ROWS}").fetchall():
            where, expected, actual, message = describe(row)
            run.findings.add(Step.CHAIN, rule, where, expected, actual, message, counted=True)


def ledger_record(run: Verification, row: RecordRow, opened: OpenResult) -> LedgerRecord | None:
    """The decoded LedgerRecord of a ledger_records row, or None (and a finding)."""
    record = opened.record
    if not isinstance(record, LedgerRecord):
        run.add(
            Step.CHAIN,
            "CHAIN_NOT_RECORD",
            row.where,
            "a LedgerRecord",
            opened.kind,
            "ledger_records holds an envelope of another kind",
        )
        run.prev_index = -1
        return None
    return record


def check_record(
    run: Verification, index: int, row: RecordRow, opened: OpenResult, record: LedgerRecord
) -> None:
    """Ledger signature (SPEC §8: required in version 1, checked when present in version
    2), own index, placement and prev link of the record at ``index``."""
    where = row.where
    failure = signer_failure(opened.sigs, run.record_required, run.record_permitted)
    if failure is not None:
        run.add(
            Step.CHAIN,
            "CHAIN_SIGNATURE",
            where,
            "unsigned, or signed by the trusted ledger key only"
            if run.unsigned_records
            else "signed by the trusted ledger key only",
            failure.value,
            "a record signature must be the ledger's and valid"
            if run.unsigned_records
            else "a version-1 record must carry exactly the ledger's valid signature",
        )
    if record.index != index:
        run.add(
            Step.CHAIN,
            "CHAIN_INDEX",
            where,
            index,
            record.index,
            "the record's own index differs from its chain position",
        )
    if record.placement_id != run.placement_id:
        run.add(
            Step.CHAIN,
            "CHAIN_PLACEMENT",
            where,
            run.placement_id,
            record.placement_id,
            "a record of another placement",
        )
    if index == 0 and record.prev != ZERO_HASH:
        run.add(
            Step.CHAIN,
            "CHAIN_PREV",
            where,
            ZERO_HASH,
            record.prev,
            "the first record links to ZERO_HASH",
        )
    elif index > 0 and run.prev_index == index - 1 and record.prev != run.prev_hash:
        run.add(
            Step.CHAIN,
            "CHAIN_PREV",
            where,
            run.prev_hash,
            record.prev,
            "prev is not the record hash of the previous record",
        )
    run.prev_index, run.prev_hash = index, opened.record_hash


def check_link(
    run: Verification, index: int, ledger: LedgerRecord, row: InputRow, opened: OpenResult
) -> None:
    """The record at ``index`` against its input: source, kind, status and reason."""
    where = f"ledger_records[{index}]"
    if ledger.source != opened.input_hash:
        run.add(
            Step.CHAIN,
            "CHAIN_SOURCE",
            where,
            opened.input_hash,
            ledger.source,
            f"source is not the input hash of {row.where}",
        )
    kind = opened.kind or row.kind
    if ledger.kind != kind:
        run.add(
            Step.CHAIN,
            "CHAIN_KIND",
            where,
            kind,
            ledger.kind,
            f"the record's kind differs from its input in {row.table}",
        )
    if (row.status, row.reason) != (ledger.status, ledger.reason):
        run.add(
            Step.CHAIN,
            "CHAIN_STATUS",
            f"{row.where}.status",
            f"{ledger.status} {ledger.reason}".rstrip(),
            f"{row.status} {row.reason}".rstrip(),
            "the input row's status/reason differ from its ledger record",
        )
