"""(7) decisions: every decision re-derived from SPEC §6 and compared with the ledger's
status and reason (the rules themselves: ``verifier/decisions.py``).

The pass calls ``decide`` for each chain index in order; what the referee accepts feeds the
work tables that step (9) prices. After the pass: inputs still held, and the adjustments,
which are decided once the amounts before each are known (ADJUSTMENT_INVALID).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proto import limits as proto_limits
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    LedgerRecord,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    UsageEvent,
)
from proto.xids import DEGRADING_CLOCK_EVENTS, unhealthy_xids
from verifier.decisions import (
    ACCEPTED,
    PENDING,
    REJECTED,
    Claim,
    PendingAdjustment,
    Verdict,
    settle_adjustments,
)
from verifier.findings import Step
from verifier.invariant import InvariantError
from verifier.opener import OpenResult, open_one
from verifier.pricing import CRITICAL_XID_SET
from verifier.source import ALIAS, InputRow, blob
from verifier.step4_envelopes import check_input_hash
from verifier.terms_rules import adjustment_bounded

if TYPE_CHECKING:
    from verifier.state import Verification


def duplicate_indices(run: Verification) -> set[int]:
    """Chain indices whose envelope bytes equal those of an earlier chained input.

    Only envelopes whose 64-bit ``hash`` occurs more than once are ranked: a first scan
    aggregates the hashes, a second keeps the rows with a repeated one for the ranking,
    which compares the bytes themselves (a hash collision only adds a candidate). Ranking
    every row by its SHA-256 cost 0.7-0.9 s of CPU for 200k events, this 0.16 s; and the
    rows are not held in between (a CTE read twice is materialised: 135 MiB more).
    Empty, without that SQL, when every envelope is distinct (``ExportSource.plain_shape``)."""
    if run.source.plain_shape().envelopes:
        return set()
    tables = run.source.filled_input_tables  # an empty table adds no envelope
    union = " UNION ALL ".join(
        f"SELECT chain_index, rowid AS r, '{t.name}' AS tbl, hash(envelope) AS k, envelope "
        f"FROM {ALIAS}.{t.name}"
        for t in tables
    )
    keys = " UNION ALL ".join(f"SELECT hash(envelope) AS k FROM {ALIAS}.{t.name}" for t in tables)
    rows = run.con.execute(
        f"SELECT chain_index FROM (SELECT chain_index, row_number() OVER "
        f"(PARTITION BY envelope ORDER BY chain_index, tbl, r) AS n FROM ({union}) "
        f"WHERE k IN (SELECT k FROM ({keys}) GROUP BY k HAVING count(*) > 1)) WHERE n > 1"
    ).fetchall()
    return {int(r[0]) for r in rows}


def decide(
    run: Verification, index: int, ledger: LedgerRecord | None, row: InputRow, opened: OpenResult
) -> None:
    """SPEC §6 for the input at ``index``; compare with what the ledger recorded."""
    arrived = None if ledger is None else ledger.arrived_ms
    if ledger is not None:
        check_arrival(run, ledger, row.where)
    verdict = run.referee.decide(opened, index in run.duplicates, index, arrived)
    if ledger is not None:
        check_premature_close(run, ledger, opened, row.where)
    report_stream_violations(run)
    report_disputes(run)
    claimed = (
        Claim(ledger.status, ledger.reason)
        if ledger is not None
        else Claim(str(row.status), str(row.reason or ""))
    )
    record = opened.record
    if verdict.outcome == PENDING:
        if not isinstance(record, Adjustment):
            raise InvariantError(f"a pending {opened.kind} at {index}: only adjustments wait")
        run.con.execute(
            "INSERT INTO w_adjust VALUES (?, ?, ?, ?, NULL)",
            [index, record.adjustment_id, record.direction, record.amount_minor],
        )
        run.work.note("w_adjust")
        run.pending_claims[index] = (claimed, row.where)
        return
    run.bump(f"decided.{verdict.outcome}")
    if not verdict.matches(claimed):
        _finding(run, row.where, verdict, claimed)
    if verdict.outcome != ACCEPTED:
        return
    if isinstance(record, UsageEvent):
        work_usage(run, index, record, opened.record_hash)
    elif isinstance(record, ReclaimNotice):
        # §7.3, §6.6: the notice runs from the reclaim's arrival (issued_at_ms: untimed).
        notice_from = record.issued_at_ms if arrived is None else arrived
        run.work.insert("w_reclaim", (index, notice_from, record.effective_at_ms, arrived))
    elif isinstance(record, Assignment):
        # §6.8: the referee kept it with its effective handover
        assigned = run.referee.assignments[-1]
        ord_ = len(run.referee.assignments) - 1
        run.con.execute(
            "INSERT INTO w_assign VALUES (?, ?, ?, ?, ?, ?)",
            [
                index,
                ord_,
                assigned.assignment_id,
                assigned.new_buyer.id,
                assigned.h_ms,
                assigned.rate_per_gpu_hour_minor,
            ],
        )
        run.work.note("w_assign")
        run.con.executemany(
            "INSERT INTO w_assign_gpus VALUES (?, ?)", [[ord_, u] for u in sorted(assigned.gpus)]
        )
    elif isinstance(record, BuyerRelease) and run.referee.release is not None:
        # §6.7, §7.9: the referee's own a, e and effective end before the release.
        run.work.insert("w_release", (index, *run.referee.release))
    elif isinstance(record, PlacementClosed):
        run.work.insert("w_close", (index,))
        if run.close_index is None:
            run.close_index = index


def work_usage(run: Verification, index: int, record: UsageEvent, record_hash: str) -> None:
    """An accepted usage event's rows for ``w_usage`` and ``w_samples``."""
    run.work.usage.append(
        (index, record.node_id, record.seq, record_hash, record.start_ms, record.end_ms)
    )
    metering = run.terms.metering
    unhealthy = CRITICAL_XID_SET if metering is None else unhealthy_xids(metering.xid_table)
    run.work.samples.extend(
        (
            index,
            s.uuid,
            s.allocated,
            s.healthy,
            s.power_mw,
            not unhealthy.isdisjoint(s.xids),  # any of the terms' XID table (SPEC §7.1.1)
            s.ecc_uncorrectable,
            s.retired_pages,
            s.present,
            # §7.1.2: not another workload's, and the buyer's where idle is not billed
            s.allocation != "other"
            and (metering is None or metering.idle_billed or s.allocation == "buyer"),
            # §7.1.2: a degraded sample's share of its time
            metering.degraded_bps
            if metering is not None and s.clock_events & DEGRADING_CLOCK_EVENTS
            else 10_000,
            s.allocation == "unknown",  # shown on the bill (§7.1.2)
        )
        for s in record.samples
    )


def check_arrival(run: Verification, ledger: LedgerRecord, where: str) -> None:
    """SPEC §6.6: arrival times are monotone per placement, and once the chain is timed
    every record carries one (records of before §6.6 may precede the first timed one)."""
    arrived = ledger.arrived_ms
    last = run.last_arrived
    if arrived is None:
        if run.terms.created_at_ms >= proto_limits.ARRIVAL_REQUIRED_FROM_MS:
            run.add(
                Step.DECISIONS,
                "ARRIVAL_MISSING",
                where,
                "arrived_ms on every record of terms created from "
                f"{proto_limits.ARRIVAL_REQUIRED_FROM_MS}",
                "no arrived_ms",
                "SPEC §6.6: no untimed record in a placement created after the rule",
            )
        elif last is not None:
            run.add(
                Step.DECISIONS,
                "ARRIVAL_MISSING",
                where,
                "arrived_ms on every record once one has it",
                "no arrived_ms",
                "SPEC §6.6: a timed chain does not turn untimed",
            )
        return
    if last is not None and arrived < last:
        run.add(
            Step.DECISIONS,
            "ARRIVAL_ORDER",
            where,
            f"arrived_ms >= {last}",
            arrived,
            "SPEC §6.6: arrival is monotone per placement",
        )
    bound = run.cosigned.violation(ledger.index, arrived)
    if bound is not None:
        run.add(Step.DECISIONS, bound.code, where, bound.expected, arrived, bound.detail)
    run.last_arrived = arrived if last is None else max(last, arrived)
    if ledger.index == 0:
        run.first_arrived = arrived


def check_premature_close(
    run: Verification, ledger: LedgerRecord, opened: OpenResult, where: str
) -> None:
    """SPEC §6.6: usage that ended inside the window and arrived before the grace ran out,
    rejected AFTER_CLOSE: the ledger closed too early."""
    record = opened.record
    terms = run.referee.terms
    arrived = ledger.arrived_ms
    if (
        isinstance(record, UsageEvent)
        and terms is not None
        and arrived is not None
        and ledger.reason == "AFTER_CLOSE"
        and record.end_ms <= terms.window_end_ms
        and arrived < terms.window_end_ms + terms.late_grace_ms
    ):
        run.add(
            Step.DECISIONS,
            "PREMATURE_CLOSE",
            where,
            f"open until {terms.window_end_ms + terms.late_grace_ms}",
            f"usage arrived at {arrived} rejected AFTER_CLOSE",
            "SPEC §6.6: the close came before window_end_ms + late_grace_ms",
        )


def report_stream_violations(run: Verification, *, at_end: bool = False) -> None:
    """Chain positions the stream rules forbid (SPEC §6.2-§6.3), once they are known."""
    referee = run.referee
    if at_end:
        referee.finish()
    for violation in referee.violations:
        run.add(
            Step.DECISIONS,
            violation.rule,
            f"chain_index {violation.index}",
            "held in its stream until the close flush",
            "chained here",
            violation.message,
        )
    referee.violations.clear()


def report_disputes(run: Verification) -> None:
    """Terms the accepted terms' parties all signed that do not amend them (SPEC §6.3)."""
    referee = run.referee
    for index, version in referee.disputes:
        run.add(
            Step.DECISIONS,
            "TERMS_DISPUTED",
            f"chain_index {index}",
            "one agreement per placement (amendments: version + 1, supersedes the last)",
            f"other terms ({version}) signed by operator, buyer and desk",
            "SPEC §6.3 terms: the parties signed two agreements for one placement",
        )
    referee.disputes.clear()


def _finding(run: Verification, where: str, verdict: Verdict, claimed: Claim) -> None:
    """The ledger claimed another decision than SPEC §6 re-derived."""
    if verdict.outcome == ACCEPTED:
        rule = claimed.reason or "DECISION"
    else:
        rule = verdict.reason or verdict.outcome.upper()
    if verdict.outcome in (ACCEPTED, REJECTED):
        message = "the ledger's decision differs from SPEC §6"
    else:
        message = f"SPEC §6 says this input is {verdict.outcome}, never chained"
    run.add(Step.DECISIONS, rule, where, verdict, claimed, message)


mismatch = _finding  # for the pass's fast path (verifier/walk.py)


def check_held(run: Verification) -> None:
    """Inputs held for terms that were accepted should have been processed (SPEC §6.2);
    a gap candidate left at the end of the chain was chained outside a close flush."""
    report_stream_violations(run, at_end=True)
    rows = run.source.small_table("held", "position, input_hash, envelope", "position")
    for position, input_hash, raw in rows:
        where = f"held {position}"
        check_input_hash(run.findings, where, input_hash, open_one(0, blob(raw), {}).input_hash)
        if run.referee.terms is not None:
            run.add(
                Step.DECISIONS,
                "HELD_AFTER_TERMS",
                where,
                "processed after the terms",
                "still held",
                "SPEC §6.2: held inputs are processed right after the terms",
            )


def decide_adjustments(run: Verification) -> None:
    """The pending adjustments, in chain order, by the bounds of SPEC §7.7."""
    con = run.con
    pending: list[PendingAdjustment] = []
    rows = (
        con.execute(
            "SELECT chain_index, adjustment_id, direction, amount_minor FROM w_adjust "
            "ORDER BY chain_index"
        ).fetchall()
        if "w_adjust" in run.work.filled
        else []
    )
    terms = run.referee.terms
    for index, adjustment_id, direction, amount in rows:

        def bounded(credit: int, charge: int, terms: PlacementTerms | None = terms) -> bool:
            return terms is not None and adjustment_bounded(terms, credit, charge)

        pending.append(
            PendingAdjustment(int(index), adjustment_id, direction, int(amount), bounded)
        )
    for index, verdict in settle_adjustments(pending):
        claimed, where = run.pending_claims[index]
        run.bump(f"decided.{verdict.outcome}")
        if not verdict.matches(claimed):
            _finding(run, where, verdict, claimed)
        con.execute(
            "UPDATE w_adjust SET accepted = ? WHERE chain_index = ?",
            [verdict.outcome == ACCEPTED, index],
        )
