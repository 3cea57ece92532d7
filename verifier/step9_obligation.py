"""(9) obligation: every total of SPEC §7 recomputed in SQL (``verifier/pricing.py``) from
what the referee accepted, and compared with every LedgerRecord and every statement.

The pass hands each LedgerRecord's own amounts to ``collect_record``; after it,
``price_base`` computes D, B, G, R, Q (what step (7) needs to decide adjustments), and
``check_records`` / ``check_statements`` compare once the adjustments are decided.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from proto.keys import key_id
from proto.records import ZERO_HASH, LedgerRecord, Statement
from verifier import limits
from verifier.findings import Step
from verifier.opener import OpenResult, open_one
from verifier.pricing import (
    CHAIN_ROWS_MAX,
    COMPARED,
    TOTAL_FIELDS,
    DeferredPricing,
    chain_rows,
    compute_base,
    compute_totals,
    create_work_tables,
    gpu_rows,
    load_terms,
    mismatches_in,
    record_mismatches,
    terms_row,
)
from verifier.resale import RESALE_FIELDS, resale_at
from verifier.signers import required_of, signer_failure
from verifier.source import blob
from verifier.step4_envelopes import unreadable
from verifier.step5_columns import check_statement_columns

if TYPE_CHECKING:
    from verifier.state import Verification


def collect_record(run: Verification, index: int, opened: OpenResult, record: LedgerRecord) -> None:
    """During the pass: the amounts a LedgerRecord claims, for the comparison after it."""
    totals = record.totals
    run.work.resale.extend(
        (
            index,
            k,
            e.assignment_id,
            e.new_buyer,
            e.delivered_mgms,
            e.billable_mgms,
            e.gross_minor,
            e.fee_minor,
        )
        for k, e in enumerate(record.resale)
    )
    run.work.records.append(
        (
            index,
            opened.record_hash,
            record.delivered_mgms,
            *(getattr(totals, name) for name in TOTAL_FIELDS),
        )
    )


# Work tables whose rows make an export's pricing its own: adjustments (decided from
# w_base, before the totals), resale (SPEC §7.10, its SQL reads the totals' inputs).
_PRICED_ALONE: Final = frozenset({"w_adjust", "w_assign", "w_resale_rec"})


def price_base(run: Verification) -> None:
    """D, B, G, R and Q at every index (SPEC §7.1-§7.3, §7.5): nothing depends on
    adjustments yet. Deferred to the batch instead (``run.deferred``, ``verify_exports``)
    for a small export (``SMALL_EXPORT_BYTES``) with one LedgerRecord row per index, no
    adjustment nor resale: what ``check_records`` then needs of the SQL is only whether
    the recomputed totals equal the records' (``pricing.batch_mismatches``); when they
    do, ``run.chain`` holds every record's own (what ``_chain_at`` and the head's totals
    read, the same values the SQL would have read at those indices)."""
    deferred, run.deferred = run.deferred, None
    if deferred is not None and run.work.kept is not None:
        run.work.flush()
        kept = run.work.kept
        records = kept.get("w_records", [])
        if (
            run.source.small
            and not (run.work.filled & _PRICED_ALONE)
            and len({row[0] for row in records}) == len(records)
        ):
            deferred.rows = {
                **kept,
                "w_terms": [terms_row(run.terms)],
                "w_gpus": gpu_rows(run.terms),
            }
            run.deferred = deferred
            return
    if run.work.held:  # held back for a deferral that is not to be: made and written now
        create_work_tables(run.con, only=run.work.held)
        load_terms(run.con, run.terms)
        run.work.write_held()
    compute_base(run.con)


def _speculated_chain(deferred: DeferredPricing) -> dict[int, tuple[str, dict[str, int]]]:
    """``check_records``' ``run.chain`` when the recomputed totals equal every record's
    (what the batch then confirms, or the export is verified again on its own): each
    record's hash and its own totals."""
    rows = sorted((deferred.rows or {}).get("w_records", []), key=lambda row: int(row[0]))
    return {
        int(r[0]): (str(r[1]), dict(zip(TOTAL_FIELDS, map(int, r[3:]), strict=True))) for r in rows
    }


def check_records(run: Verification) -> None:
    """Every total at every index, with the decided adjustments, against the records."""
    if run.deferred is not None:  # priced with its batch: no mismatch unless it says so
        run.chain = _speculated_chain(run.deferred)
        return
    compute_totals(run.con, adjustments="w_adjust" in run.work.filled)
    if run.source.small and run.record_count <= CHAIN_ROWS_MAX:
        # Few records (w_records holds at most one row per export row): every row at once,
        # compared here, kept for the statements' indices and the head (``_chain_at``).
        rows = chain_rows(run.con)
        first = 3 + len(COMPARED)  # the recomputed TOTAL_FIELDS of a row
        run.chain = {
            int(r[0]): (str(r[1]), dict(zip(TOTAL_FIELDS, map(int, r[first:]), strict=True)))
            for r in rows
        }
        mismatches = mismatches_in(rows, limits.MAX_MISMATCH_ROWS)
    else:
        mismatches = record_mismatches(run.con, limits.MAX_MISMATCH_ROWS)
    seen: set[str] = set()
    for column, count, index, expected, actual in mismatches:
        rule = f"TOTAL_{column.upper()}"
        if rule not in seen:
            run.findings.count(rule, count)
            seen.add(rule)
        run.findings.add(
            Step.OBLIGATION,
            rule,
            f"ledger_records[{index}]",
            expected,
            actual,
            f"{column} differs from SPEC §7 recomputed from the envelopes",
            counted=True,
        )


def check_statements(run: Verification) -> None:
    """Each statement: ledger-signed, head and totals equal to the chain at its index."""
    terms = run.terms
    ring = {key_id(run.ledger_key): [run.ledger_key]}
    rows = run.source.small_table(
        "statements",
        "through_index, envelope, final, buyer_owes_minor, operator_receives_minor, "
        "desk_receives_minor",
        "through_index",
    )
    wanted = {int(r[0]) for r in rows if r[0] is not None} | {
        int(o.record.through_index)
        for o in (open_one(0, blob(r[1]), {}) for r in rows)
        if isinstance(o.record, Statement)
    }
    # and the record before each: a later period's ``previous`` (SPEC §8)
    chain_at = _chain_at(run, wanted | {i - 1 for i in wanted if i > 0})
    finals: dict[int, dict[tuple[int, ...], int]] = {}
    for through_index, raw, *columns in rows:
        run.bump("statements")
        where = f"statements through_index {through_index}"
        opened = open_one(0, blob(raw), ring)
        statement = opened.record
        if opened.error or not isinstance(statement, Statement):
            unreadable(run.findings, where, "a canonical Statement envelope", opened)
            continue
        run.bump("signatures", len(opened.sigs))
        failure = signer_failure(opened.sigs, required_of((run.ledger_key,)))
        if failure is not None:
            run.add(
                Step.OBLIGATION,
                "STATEMENT_SIGNATURE",
                where,
                "signed by the trusted ledger key only",
                failure.value,
                "a statement counts only under the ledger's signature",
            )
        check_statement_columns(run, where, statement, (through_index, *columns))
        if statement.placement_id != run.placement_id:
            run.add(
                Step.OBLIGATION,
                "STATEMENT_PLACEMENT",
                where,
                run.placement_id,
                statement.placement_id,
                "a statement of another placement",
            )
        if (statement.currency, statement.currency_scale) != (
            terms.currency,
            terms.currency_scale,
        ):
            run.add(
                Step.OBLIGATION,
                "STATEMENT_CURRENCY",
                where,
                f"{terms.currency}/{terms.currency_scale}",
                f"{statement.currency}/{statement.currency_scale}",
                "a statement in other money than the terms",
            )
        index = statement.through_index
        head, mine = chain_at.get(index, (None, None))
        if head is None or head != statement.head:
            run.add(
                Step.OBLIGATION,
                "STATEMENT_HEAD",
                where,
                head or f"a record at index {index}",
                statement.head,
                "head is not the record hash at through_index",
            )
        final = run.close_index is not None and run.close_index <= index
        if statement.final != final:
            run.add(
                Step.OBLIGATION,
                "STATEMENT_FINAL",
                where,
                final,
                statement.final,
                "final is true exactly when the chain through the index holds the close",
            )
        _check_signed_fields(run, where, statement, chain_at)
        if statement.final:
            figures = tuple(getattr(statement.totals, name) for name in TOTAL_FIELDS)
            finals.setdefault(statement.period, {}).setdefault(figures, index)
        if mine is None:
            continue
        t = statement.totals
        for name in TOTAL_FIELDS:
            have = getattr(t, name)
            if mine[name] != have:
                run.add(
                    Step.OBLIGATION,
                    "STATEMENT_TOTALS",
                    f"{where}.{name}",
                    mine[name],
                    have,
                    "the statement's amount differs from SPEC §7 at its index",
                )
    _report_periods(run, finals)
    _check_arrival_modes(run)


def _check_signed_fields(
    run: Verification,
    where: str,
    statement: Statement,
    chain_at: dict[int, tuple[str, dict[str, int]]],
) -> None:
    """A statement's period and previous (SPEC §8), its resale list (§7.10), and the
    arrival mode it signs (§6.6: kept for step (10) and ``_check_arrival_modes``)."""
    _check_period(run, where, statement, chain_at)
    _check_statement_resale(run, where, statement)
    run.arrival_modes.add(statement.arrival)


def _check_arrival_modes(run: Verification) -> None:
    """SPEC §6.6: one store, one arrival mode, so every statement signs the same."""
    if len(run.arrival_modes) > 1:
        run.add(
            Step.OBLIGATION,
            "ARRIVAL_MODE",
            "statements",
            "one arrival mode in every statement",
            ", ".join(sorted(run.arrival_modes)),
            "a chain never mixes the log's times with times its senders stated",
        )


def _check_statement_resale(run: Verification, where: str, statement: Statement) -> None:
    """SPEC §7.10, §8: a statement's resale list is the recomputed one at its index."""
    if not statement.resale and not run.referee.assignments:
        return
    expected = resale_at(run.con, statement.through_index, "w_assign" in run.work.filled)
    have = [{name: getattr(e, name) for name in RESALE_FIELDS} for e in statement.resale]
    if have != expected:
        run.add(
            Step.OBLIGATION,
            "RESALE_MISMATCH",
            f"{where}.resale",
            expected,
            have,
            "the statement's resale list differs from SPEC §7.10 at its index",
        )


def _expected_period(run: Verification, index: int) -> int:
    """SPEC §8 "Statement periods": 0 through the close ``c``, ``i - c`` after it."""
    close = run.close_index
    return 0 if close is None or index <= close else index - close


def _check_period(
    run: Verification,
    where: str,
    statement: Statement,
    chain_at: dict[int, tuple[str, dict[str, int]]],
) -> None:
    """A statement's ``period`` and ``previous`` as SPEC §8 derives them from the chain."""
    index = statement.through_index
    period = _expected_period(run, index)
    previous = ZERO_HASH if period == 0 else chain_at.get(index - 1, ("?", {}))[0]
    if (statement.period, statement.previous) != (period, previous):
        run.add(
            Step.OBLIGATION,
            "STATEMENT_PERIOD",
            where,
            f"period {period}, previous {previous}",
            f"period {statement.period}, previous {statement.previous}",
            "SPEC §8: period 0 through the close, each later record its own period, "
            "previous = the record hash before it",
        )


def _report_periods(run: Verification, finals: dict[int, dict[tuple[int, ...], int]]) -> None:
    """Every period with a final statement, the latest last; two different final
    figures for one period are STATEMENT_CONFLICT (SPEC §8)."""
    periods: list[dict[str, object]] = []
    for period in sorted(finals):
        figures = finals[period]
        if len(figures) > 1:
            shown = "; ".join(
                f"through {i}: buyer owes {f[TOTAL_FIELDS.index('buyer_owes_minor')]}"
                for f, i in sorted(figures.items(), key=lambda kv: kv[1])
            )
            run.add(
                Step.OBLIGATION,
                "STATEMENT_CONFLICT",
                f"statements of period {period}",
                "one final figure per period",
                shown,
                "SPEC §8: nothing changes a final statement; a change opens a new period",
            )
        for totals, through_index in sorted(figures.items(), key=lambda kv: kv[1]):
            periods.append(
                {
                    "period": period,
                    "through_index": through_index,
                    **dict(zip(TOTAL_FIELDS, totals, strict=True)),
                }
            )
    for entry in periods:
        entry["latest"] = entry is periods[-1]
    run.report.periods = periods


def _chain_at(run: Verification, indices: set[int]) -> dict[int, tuple[str, dict[str, int]]]:
    """Record hash and recomputed totals at each index, in one query (not one per row;
    the indices as one list parameter, not a table: no CREATE on a small export)."""
    if not indices:
        return {}
    if run.chain is not None:  # every row read already (``check_records``)
        known = run.chain
        chain_at = {index: known[index] for index in indices if index in known}
        run.totals_read.update((index, totals) for index, (_, totals) in chain_at.items())
        return chain_at
    names = ", ".join(f"t.{name}" for name in TOTAL_FIELDS)
    rows = run.con.execute(
        f"SELECT r.chain_index, r.record_hash, {names} FROM w_records r "
        "JOIN w_totals t USING (chain_index) "
        "JOIN (SELECT DISTINCT unnest(?::BIGINT[]) AS chain_index) w USING (chain_index)",
        [sorted(indices)],
    ).fetchall()
    chain_at = {
        int(r[0]): (str(r[1]), dict(zip(TOTAL_FIELDS, map(int, r[2:]), strict=True))) for r in rows
    }
    run.totals_read.update((index, totals) for index, (_, totals) in chain_at.items())
    return chain_at
