"""Verify one export offline: the checklist, step by step (SPEC.md, EXPORT.md).

One module per step, read in order; ``run_checklist`` below runs them, and steps (4)-(9)
visit the single streaming pass over the chain (``verifier/walk.py``) per chain index.

    step1_format.py      (1) format: no DuckDB side file beside the export (EXPORT.md "A
                         closed file"; else the finding EXPORT_NOT_CLOSED, nothing read);
                         meta.format is gridledger-export, meta.format_version is 1 or 2
                         (else the input is unusable: exit 2); meta integers bounded
    step2_trust.py       (2) trust: the trust file names which keys belong to which party
                         and role
    step3_terms.py       (3) terms: exactly one accepted terms row, signed by its three
                         parties, each party key pinned under that role, its ledger_key
                         pinned as a ledger key
    step4_envelopes.py   (4) envelopes: every envelope decodes canonically;
                         input_hash = SHA-256(envelope)
    step5_columns.py     (5) columns: every convenience column equals the value decoded
                         from its envelope
    step6_chain.py       (6) chain: ledger_records 0..n-1 contiguous, each a canonical
                         LedgerRecord signed by the trusted ledger key only; prev,
                         placement, source, kind, status and reason right; every chain
                         index in exactly one input table
    step7_decisions.py   (7) decisions: every decision re-derived from SPEC §6
                         (``decisions.py``; its §5 rules in ``terms_rules.py``) and
                         compared with the ledger's status and reason
    step8_merkle.py      (8) merkle: each checkpoint's origin, size, RFC 9162 root of the
                         record payloads, signed by the ledger key; the parties'
                         cosignatures
    step9_obligation.py  (9) obligation: every total of SPEC §7 recomputed in SQL
                         (``pricing.py``) and compared with every LedgerRecord and every
                         statement
    step10_completeness.py (10) completeness: the log is closed, ends with its final
                         statement, a checkpoint covers the last record and carries the
                         cosignatures the trust file's policy requires, and is no
                         simulation the trust file does not admit (``witnessed.py``):
                         FINAL, else PROVISIONAL naming what is missing (SPEC §9)

Library code: returns an ``ExportReport``, never exits. Unusable input is reported with
verdict ``unusable``; anything readable that does not check out is a finding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import structlog

from proto.keys import key_id
from proto.trust import TrustFile
from verifier import (
    capacity_export,
    limits,
    resale,
    small_export_db,
    step1_format,
    step2_trust,
    step3_terms,
    step5_columns,
    step6_chain,
    step7_decisions,
    step8_merkle,
    step9_obligation,
    step10_completeness,
)
from verifier.cosigned_time import CosignedTimes, read_stamps, trusted_cosigners
from verifier.errors import UnusableInput
from verifier.findings import Step
from verifier.pricing import (
    HELD_TABLES,
    DeferredPricing,
    batch_mismatches,
    create_work_tables,
    load_terms,
    totals_at,
)
from verifier.progress import Progress
from verifier.source import ExportSource, meta_int, side_file_message, side_files
from verifier.state import FAILED, UNUSABLE, VERIFIED, ExportReport, ExportVerdict, Verification
from verifier.walk import walk
from verifier.workers import OpenPool

__all__ = [
    "FAILED",
    "UNUSABLE",
    "VERIFIED",
    "ExportReport",
    "ExportVerdict",
    "run_checklist",
    "small_export",
    "verify_export",
    "verify_exports",
]

log = structlog.get_logger(__name__)


def verify_export(
    path: Path,
    trust: TrustFile,
    *,
    pool: OpenPool[Any] | None = None,
    progress: Progress | None = None,
    bill: bool = False,
) -> ExportReport:
    """Run the whole checklist on one export file; see the module docstring.

    ``bill``: also gather the bill a person reads (``report.bill``, ``verify --html``)."""
    started = time.monotonic()
    report = _verify(path, trust, pool, progress, bill, share=True)
    if (report.verdict == UNUSABLE or "VERIFIER_ERROR" in report.findings.rules()) and small_export(
        path
    ):
        # Again on a database of its own, as a big export is read: a DuckDB message names
        # the file it read, on the process's warm database a link to the export
        # (``verifier/small_export_db.py``); the report must not depend on which database
        # read it.
        report = _verify(path, trust, pool, progress, bill, share=False)
    report.elapsed_s = time.monotonic() - started
    _log(path, report)
    return report


def _log(path: Path, report: ExportReport) -> None:
    log.info(
        "export verified",
        path=str(path),
        verdict=report.verdict,
        findings=report.findings.total,
        elapsed_s=round(report.elapsed_s, 3),
    )


def verify_exports(
    paths: Sequence[Path],
    trust: TrustFile,
    *,
    pool: OpenPool[Any] | None = None,
    progress: Progress | None = None,
) -> list[ExportReport]:
    """``verify_export`` of each path, in order: each report byte-identical to that
    export's alone (but ``elapsed_s``), what the trace replay's workers verify thousands
    of small exports with (docs/replay.md).

    A small export's checklist costs most in the obligation's SQL (``w_base`` and
    ``w_totals``: each statement's planning, whatever its few rows), so each small export
    runs its checklist with that SQL deferred (``step9_obligation.price_base`` says when
    it may: no adjustment, no resale, one record row per index), and the rows only that
    SQL reads kept in Python, not written: as if the recomputed totals equalled every
    LedgerRecord's. Then ONE pass of the same SQL over every deferred export's work
    rows, each keyed by its export (``pricing.batch_mismatches``, on a database no export
    is attached to: the exports are attached one at a time, as by ``verify_export``), says
    which ones they do equal. An export's report is kept only when its checklist found
    nothing at all and the batch confirms its totals; any other export — a finding,
    unusable, a verifier error, a total the batch recomputes otherwise, a batch that
    fails — is verified again on its own by ``verify_export``, so no export's content can
    change another's report. ``pool``: what the big exports are opened with (``python -m
    verifier`` over many files); a small one is opened in this thread, as ``verify_export``
    without a pool opens it (a pool's threads or processes cost it more than they save).
    ``progress``: as ``verify_export``'s."""
    reports: list[ExportReport | None] = [None] * len(paths)
    waiting: list[tuple[int, ExportReport, DeferredPricing]] = []
    for k, path in enumerate(paths):
        started = time.monotonic()
        small = small_export(path)
        deferred = DeferredPricing() if small else None
        use = None if small else pool
        report = _verify(path, trust, use, progress, False, share=True, deferred=deferred)
        if deferred is None or deferred.rows is None:  # verified on its own
            if report.verdict == UNUSABLE or "VERIFIER_ERROR" in report.findings.rules():
                # as verify_export does them (its retry)
                reports[k] = verify_export(path, trust, pool=use, progress=progress)
                continue
            report.elapsed_s = time.monotonic() - started
            _log(path, report)
            reports[k] = report
        elif report.verdict == VERIFIED:
            report.elapsed_s = time.monotonic() - started
            waiting.append((k, report, deferred))
        else:  # a finding, found without the totals: the export alone says which ones
            reports[k] = verify_export(path, trust, pool=use, progress=progress)
    if waiting:
        started = time.monotonic()
        differ = _batch_mismatches([deferred for _, _, deferred in waiting])
        each = (time.monotonic() - started) / len(waiting)
        for position, (k, report, _) in enumerate(waiting):
            if differ is None or position in differ:
                reports[k] = verify_export(paths[k], trust, progress=progress)  # small
            else:
                report.elapsed_s += each
                _log(paths[k], report)
                reports[k] = report
    return [report for report in reports if report is not None]


def _batch_mismatches(batch: list[DeferredPricing]) -> set[int] | None:
    """``pricing.batch_mismatches`` on the process's batch database; None when it cannot
    say (no database, an error: every export of the batch is then verified alone)."""
    database = small_export_db.acquire("batch")
    if database is None:
        return None
    clean = False
    try:
        differ = batch_mismatches(database.con, batch)
        clean = True
        return differ
    except Exception:
        log.warning("batch pricing failed, verifying one by one", exc_info=True)
        return None
    finally:
        small_export_db.release(database, clean)


def _verify(
    path: Path,
    trust: TrustFile,
    pool: OpenPool[Any] | None,
    progress: Progress | None,
    bill: bool,
    *,
    share: bool,
    deferred: DeferredPricing | None = None,
) -> ExportReport:
    """``verify_export`` once (``share``: a small export may use the warm database;
    ``deferred``: the obligation's SQL may wait for a batch, ``verify_exports``)."""
    report = ExportReport(path=str(path))
    found = side_files(path)
    if found:  # EXPORT.md "A closed file": refused, nothing beside it read
        report.findings.add(
            Step.FORMAT,
            "EXPORT_NOT_CLOSED",
            str(path),
            "a closed export file, nothing beside it",
            ", ".join(found),
            side_file_message(found),
        )
        report.verdict = FAILED
        return report
    own_pool = pool is None
    try:
        with ExportSource(path, share=share) as source:
            if pool is None:
                pool = _pool_for(source)
            run = run_checklist(
                source, trust, report, pool, progress or Progress(enabled=False), deferred
            )
            if bill and run is not None:
                _gather_bill(run)
    except UnusableInput as exc:
        report.verdict = UNUSABLE
        report.error = exc.detail
    except duckdb.Error as exc:  # a damaged file that attached but cannot be read
        report.verdict = UNUSABLE
        report.error = f"DuckDB cannot read it: {exc}"
    except Exception as exc:  # a verifier bug must not pass for a verdict, nor crash a batch run
        log.error("verifier error", path=str(path), exc_info=True)
        report.findings.add(
            Step.FORMAT,
            "VERIFIER_ERROR",
            str(path),
            "a completed verification",
            type(exc).__name__,
            f"internal error, the export is NOT verified: {exc}",
        )
    finally:
        if own_pool and pool is not None:
            pool.close()
    if report.verdict != UNUSABLE:
        report.verdict = FAILED if report.findings else VERIFIED
    return report


def small_export(path: Path) -> bool:
    """Whether ``path`` is a file the warm database may have read (``SMALL_EXPORT_BYTES``)."""
    try:
        return path.is_file() and path.stat().st_size <= limits.SMALL_EXPORT_BYTES
    except OSError:
        return False


def _pool_for(source: ExportSource) -> OpenPool[Any]:
    rows = source.count("ledger_records") + source.count("usage_events")
    return OpenPool("thread" if rows >= limits.MIN_ROWS_FOR_POOL else "inline")


def run_checklist(
    source: ExportSource,
    trust: TrustFile,
    report: ExportReport,
    pool: OpenPool[Any],
    progress: Progress,
    deferred: DeferredPricing | None = None,
) -> Verification | None:
    """Steps (1) to (10), in order, into ``report``; raises UnusableInput for exit 2.
    Returns the run's state (None when no terms could be read). ``deferred``: the
    obligation's SQL may wait for a batch (``verify_exports``)."""
    findings = report.findings
    step1_format.check_format(source)
    report.arrival = source.meta.get("arrival", "log")
    step1_format.check_sizes(source, findings)
    step1_format.check_meta_integers(source, findings)
    step2_trust.check_trust(trust, findings)
    terms = step3_terms.check_terms(source, trust, report)
    if terms is None:  # nothing further can be checked
        return None
    step5_columns.check_meta_terms(source, terms, findings)
    create_work_tables(source.con, skip=HELD_TABLES if deferred is not None else ())
    if deferred is None:
        load_terms(source.con, terms)
    run = Verification(source, report, pool, progress, terms, trust.attestation_roots() or None)
    if deferred is not None:  # the priced tables written only if the pricing is not deferred
        run.deferred = deferred
        run.work.keeping(hold=HELD_TABLES)
    step5_columns.check_meta_records(run)
    step6_chain.check_sets(run)  # the set-based half of (6), SQL over the export
    step8_merkle.read_sizes(run)  # which tree sizes the pass must keep roots for
    run.cosigned = CosignedTimes(
        read_stamps(
            (str(n) for (n,) in source.small_table("checkpoints", "note", "size")),
            terms,
            trusted_cosigners(terms, trust),
        )
    )  # (7) SPEC §6.6: the floor and ceiling of each record's arrival
    walk(run)  # (4) (5) (6) (7) (8) (9) per chain index: the single pass
    step7_decisions.check_held(run)
    _check_capacity(run, trust)  # (7) SPEC §6.5: terms decided through the capacity log
    step9_obligation.price_base(run)  # D, B, G, R, Q: what the adjustments depend on
    step7_decisions.decide_adjustments(run)
    step9_obligation.check_records(run)
    resale.check_resale(run, trust)  # SPEC §7.10: both obligations, after the totals
    step9_obligation.check_statements(run)
    step8_merkle.check_checkpoints(run)
    step10_completeness.check_completeness(run, trust)
    _summarise(run)
    return run


def _check_capacity(run: Verification, trust: TrustFile) -> None:
    """The export's capacity records re-fold to its terms' decisions (when it has them)."""
    if run.source.has_table(capacity_export.TABLE):
        rows = run.source.small_table(
            capacity_export.TABLE,
            ", ".join(c for c, _ in capacity_export.COLUMNS),
            "log_partition, log_offset",
        )
        keys = {run.ledger_key, *(k.key for k in trust.keys if k.role == "ledger")}
        inputs = capacity_export.terms_inputs(run.source)
        capacity_export.check_capacity_records(rows, inputs, keys, run.findings)


def _gather_bill(run: Verification) -> None:
    """The bill's facts, from the work tables before they go. A failure here is the
    renderer's, never a finding about the export: it is logged and reported beside."""
    from verifier.bill import collect

    try:
        run.report.bill = collect(run)
        if run.report.bill is None:
            run.report.bill_error = "the export holds no statement to render"
    except Exception as exc:
        log.error("bill not gathered", path=str(run.source.path), exc_info=True)
        run.report.bill_error = f"{type(exc).__name__}: {exc}"


def _summarise(run: Verification) -> None:
    """Head totals, finality and counts into the report."""
    report = run.report
    run.work.flush()
    head = run.work.max_record_index  # max(chain_index) of w_records
    if head is not None:
        report.head_index = int(head)
        # w_totals at the head: read already when a statement is there (the last one)
        read = run.totals_read.get(head)
        if read is None and run.chain is not None and head in run.chain:
            read = run.chain[head][1]  # every record's totals, read at once (step 9)
        report.totals = dict(read) if read is not None else totals_at(run.con, int(head))
        report.resale = resale.resale_at(run.con, int(head), "w_assign" in run.work.filled)
    report.final = run.close_index is not None
    report.attestations = [  # SPEC §6.9
        {
            "node_id": a.node_id,
            "key_id": key_id(a.key),
            "gpus": list(a.gpus),
            "attester": a.attester,
            "iss": a.iss,
            "iat": a.iat,
            "record_index": a.index,
        }
        for a in run.referee.attestations
    ]
    run.counts["dropped_duplicates_meta"] = _int_or_zero(run.source.meta.get("dropped_duplicates"))
    report.counts = dict(sorted(run.counts.items()))


def _int_or_zero(text: str | None) -> int:
    value = meta_int(text)  # bounded before conversion (step 1 reports one that is not)
    return 0 if value is None else value
