"""The single streaming pass: every chain index of the export, in order, once.

Batches of rows are read by chain-index range (``verifier/source.py``), opened and
signature-checked on the worker pool (``verifier/workers.py``), and each chain index is
handed to the steps that look at it, in this order:

    the LedgerRecord   (4) decodes -> (8) its leaf -> (6) is a LedgerRecord ->
                       (5) its columns -> (6) signature, index, placement, prev ->
                       (9) its amounts kept for the comparison after the pass
    its input          (4) decodes, input_hash -> (5) its table and columns
    the two together   (6) source, kind, status
    the decision       (7) SPEC §6 re-derived and compared

A chain index holding one record and one usage event (nearly all of a big export) goes to
the workers as one PAIR job (``verifier/pair_worker.py``): they do the stateless checks above and
return a compact ``FastPair`` when all passed, leaving the main thread only what needs
the chain's order — the prev link, the leaf, arrival order and the decision. Anything a
``FastPair`` cannot settle without a finding (a broken prev link, an arrival out of
order or missing, an AFTER_CLOSE claim) and every ``SlowPair`` goes through the ordinary
per-index checks below, so each finding is named exactly as before.

With a process or thread pool the workers also read the rows themselves (``open_ranges``):
the main thread sends chain-index ranges and gets back FastPairs (packed, from a process),
and the rows only of what the ordinary checks must see.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple, cast

import duckdb

from proto.records import ZERO_HASH, LedgerRecord, UsageEvent
from verifier import (
    limits,
    step4_envelopes,
    step5_columns,
    step6_chain,
    step7_decisions,
    step9_obligation,
)
from verifier.connections import export_connection, forget_exports
from verifier.decisions import ACCEPTED, PENDING, Claim
from verifier.invariant import InvariantError
from verifier.merkle_stream import MISSING_LEAF
from verifier.opener import Keyring, OpenResult, open_one
from verifier.pair_worker import (
    ONE,
    PAIR,
    ExportFile,
    FastPair,
    Job,
    PairContext,
    SlowPair,
    open_jobs,
    pack_pairs,
    unpack_pairs,
)
from verifier.source import (
    ALIAS,
    INPUT_TABLES,
    TABLE_OF_KIND,
    Batch,
    ExportSource,
    InputRow,
    InputTable,
    RecordRow,
    blob,
    input_row,
    raw_input_rows,
    raw_record_rows,
    read_input_rows,
    record_row,
)
from verifier.state import Reread, Verification
from verifier.workers import fewer_collections

# One chain index of a batch: (index, its record row, its input rows, its first job,
# whether it went as a PAIR job).
Plan = list[tuple[int, RecordRow | None, list[InputRow] | None, int, bool]]


def walk(run: Verification) -> None:
    """Stream every chain index in order through the pool and the per-index checks.

    The work tables are written in ONE transaction: committing each batch's appends
    wrote them to the scratch database's write-ahead log first, and the checkpoint wrote
    them again (an uncommitted append of a full row group goes to the file directly)."""
    con = run.con
    con.execute("BEGIN TRANSACTION")
    try:
        _walk(run)
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # the pass's own error is the one to see
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _walk(run: Verification) -> None:
    run.duplicates = step7_decisions.duplicate_indices(run)
    run.progress.start(run.source.path.name, run.record_count)
    done = 0
    context = PairContext(
        step4_envelopes.keyring(run), run.placement_id, run.record_required, run.record_permitted
    )
    if run.pool.reads_ranges:
        _walk_ranges(run, context)
        return
    jobs = run.pool.run_jobs(open_jobs, _batch_jobs(run.source), context)
    with fewer_collections():
        for (batch, plan), results in jobs:
            _check_planned(run, plan, results, context.keyring)
            run.work.spill()
            done += len(batch.records)
            run.progress.update(done)
    run.progress.finish()
    run.work.flush()


# ---- process or thread pool: each worker reads its own chain-index ranges ---------------
#
# Handing every envelope from the main process to a worker costs the main process a DuckDB
# read, a Python object per row and the pickling (the main process is the pass's busiest).
# With a process pool the main process instead sends (lo, hi) ranges: the worker reads the
# rows of its range from the export itself (read-only, its own connection), plans and opens
# them exactly as ``_batch_jobs`` and ``open_jobs`` do, and returns per chain index either
# a ``FastPair`` (all of a range's in one msgpack blob, ``pair_worker.pack_pairs``, which the main
# process decodes straight into FastPairs and their events, without JSON or pickled
# Structs; the rows stay in the worker, and ``_check_fast`` reads them again only in the
# rare case that it must name a finding) or the rows with their results (``Entry``).


class Entry(NamedTuple):
    """One chain index a worker could not settle: its rows and what they opened to."""

    chain_index: int
    record: RecordRow | None
    rows: list[InputRow] | None
    results: list[Any]
    pair: bool


def _walk_ranges(run: Verification, context: PairContext) -> None:
    source = run.source
    stat = source.path.stat()
    context = context._replace(
        export=ExportFile(
            str(source.path.resolve()),
            (stat.st_dev, stat.st_ino, stat.st_mtime_ns),
            source.record_placement_id,
            source.input_tables,
            tuple(_span(source, table) for table in source.input_tables),
        ),
        # packed across processes only (a test's inline pool may stand in for them)
        pack=run.pool.packs,
    )
    done = 0
    jobs = run.pool.run_jobs(open_ranges, _range_jobs(source), context, chunk=1)
    try:
        with fewer_collections():
            for _, ranges in jobs:
                for entries in ranges:
                    done += _check_entries(run, entries, context.keyring)
                run.work.spill()
                run.progress.update(done)
    finally:
        run.reread = None
        run.pair_rows = None
        if run.pool.kind != "process":  # the pass read ranges in this process
            forget_exports(close=True, only=context.export)
    run.progress.finish()
    run.work.flush()


def _span(source: ExportSource, table: InputTable) -> tuple[int, int] | None:
    """The least and the greatest chain_index of a table, None when it has none."""
    rows = source.con.execute(
        f"SELECT min(chain_index), max(chain_index) FROM {ALIAS}.{table.name}"
    ).fetchall()
    low, high = rows[0] if rows else (None, None)
    return None if low is None or high is None else (int(low), int(high))


def _range_jobs(source: ExportSource) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """Per batch of CHAIN_BATCH_INDICES chain indices (as ``ExportSource.batches``: empty
    stretches skipped), one range: DuckDB decodes a column 2048 rows at a time, so smaller
    ranges decoded the same vectors again (a read cost 40 % more per row at 512)."""
    lo = source.next_index(0)
    while lo is not None:
        hi = lo + limits.CHAIN_BATCH_INDICES
        yield lo, [(lo, hi)]
        lo = source.next_index(hi)


# What ``open_ranges`` returns per range: the FastPairs (packed, or the list itself), the
# entries, and (unpacked only) the pairs' rows as read, by chain index.
Ranged = tuple[
    bytes | list[FastPair],
    list["Entry | None"],
    dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] | None,
]


def open_ranges(ranges: Sequence[tuple[int, int]], context: PairContext) -> list[Ranged]:
    """Worker side: per (lo, hi) range, its FastPairs packed in one blob (``pack_pairs``;
    the list itself when ``context.pack`` is False: a thread's, which also hands over the
    pairs' rows as read, for ``_rows_of``) and, in chain order, per chain index present,
    None for the next FastPair or an ``Entry`` (pure but for the cached connection:
    inline, thread or process)."""
    export = context.export
    if export is None:
        raise InvariantError("open_ranges without an export file")
    con = export_connection(export)
    out: list[Ranged] = []
    for lo, hi in ranges:
        plan, jobs, raw = _read_range(con, export, lo, hi)
        results = open_jobs(jobs, context)
        fast: list[FastPair] = []
        entries: list[Entry | None] = []
        for index, record, rows, at, pair in plan:
            if pair:
                result = results[at]
                if type(result) is FastPair:
                    fast.append(result)
                    entries.append(None)
                else:  # the rows, for the ordinary checks
                    rec, usage = raw[index]
                    rows = [input_row(_USAGE, usage)]
                    entries.append(Entry(index, record_row(rec), rows, [result], True))
                continue
            n = (record is not None) + len(rows or ())
            entries.append(Entry(index, record, rows, results[at : at + n], False))
        out.append((pack_pairs(fast), entries, None) if context.pack else (fast, entries, raw))
    return out


_USAGE: Final = TABLE_OF_KIND["usage"]


def _read_range(
    con: Any, export: ExportFile, lo: int, hi: int
) -> tuple[Plan, list[Job], dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]]]:
    """``_plan`` of the range's rows, read on the worker's connection; a usage pair's rows
    stay DuckDB's tuples (returned by chain index: a ``SlowPair`` needs them as rows), as
    building row objects for every pair cost a third of the read."""
    records = {r[1]: r for r in raw_record_rows(con, "", export.placement_column, lo, hi)}
    usage: dict[int, tuple[Any, ...]] = {}
    others: dict[int, list[InputRow]] = {}
    for table, span in zip(export.tables, export.spans, strict=True):
        if span is None or not (span[0] < hi and lo <= span[1]):
            continue
        if table.kind == "usage":
            usage = {r[1]: r for r in raw_input_rows(con, "", table, lo, hi)}
            continue
        for row in read_input_rows(con, "", table, lo, hi):
            others.setdefault(row.chain_index, []).append(row)
    plan: Plan = []
    jobs: list[Job] = []
    raw: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for index in sorted(records.keys() | usage.keys() | others.keys()):
        rec = records.get(index)
        use = usage.get(index)
        if rec is not None and use is not None and index not in others:  # ``pairable``
            raw[index] = (rec, use)
            plan.append((index, None, None, len(jobs), True))
            jobs.append(
                (PAIR, index, blob(rec[2]), rec[3:], blob(use[4]), use[3], use[5], use[6], use[7:])
            )
            continue
        record = None if rec is None else record_row(rec)
        rows = [input_row(t, r) for t, r in ((_USAGE, use),) if r is not None]
        # The ordinary path's input order: the tables' order (``ExportSource.batches``).
        rows = sorted(rows + others.get(index, []), key=_table_rank)
        plan.append((index, record, rows or None, len(jobs), False))
        if record is not None:
            jobs.append((ONE, 0, record.envelope))
        jobs.extend((ONE, 0, r.envelope) for r in rows)
    return plan, jobs, raw


_TABLE_RANK: Final = {t.kind: rank for rank, t in enumerate(INPUT_TABLES)}


def _table_rank(row: InputRow) -> int:
    return _TABLE_RANK[row.kind]


def _check_entries(run: Verification, packed: Ranged, keyring: Keyring) -> int:
    """Main side of ``open_ranges``: every chain index of one range, in order, as
    ``_check_planned`` checks a batch; returns how many records the range held."""
    blob, entries, run.pair_rows = packed
    fast = iter(unpack_pairs(blob) if isinstance(blob, bytes) else blob)
    plan: Plan = []
    results: list[Any] = []
    records = 0
    for entry in entries:
        if entry is None:  # the next FastPair
            pair = next(fast)
            plan.append((pair.chain_index, None, None, len(results), True))
            results.append(pair)
            records += 1
            continue
        index, record, rows, opened, is_pair = entry
        plan.append((index, record, rows, len(results), is_pair))
        results.extend(opened)
        records += record is not None
    _check_planned(run, plan, results, keyring)
    return records


def _batch_jobs(source: ExportSource) -> Iterator[tuple[tuple[Batch, Plan], list[Job]]]:
    """Per batch: its plan (one entry per chain index, in order) and the workers' jobs."""
    for batch in source.batches():
        plan, jobs = _plan(batch.records, batch.inputs)
        yield (batch, plan), jobs


def _plan(records_in: list[RecordRow], inputs_in: list[InputRow]) -> tuple[Plan, list[Job]]:
    """The plan of a batch's rows (one entry per chain index, in order) and its jobs."""
    records = {row.chain_index: row for row in records_in}
    inputs: dict[int, list[InputRow]] = {}
    for row in inputs_in:
        inputs.setdefault(row.chain_index, []).append(row)
    plan: Plan = []
    jobs: list[Job] = []
    for index in sorted(records.keys() | inputs.keys()):
        record = records.get(index)
        rows = inputs.get(index)
        pair = pairable(record, rows)
        plan.append((index, record, rows, len(jobs), pair))
        if pair and record is not None and rows is not None:
            row = rows[0]
            jobs.append(
                (
                    PAIR,
                    index,
                    record.envelope,
                    record.columns,
                    row.envelope,
                    row.input_hash,
                    row.status,
                    row.reason,
                    row.extras,
                )
            )
            continue
        if record is not None:
            jobs.append((ONE, 0, record.envelope))
        jobs.extend((ONE, 0, r.envelope) for r in rows or ())
    return plan, jobs


def pairable(record: RecordRow | None, rows: list[InputRow] | None) -> bool:
    """Whether a chain index goes to the workers as one PAIR job: one record, one input,
    a usage event. (Tests switch it off to compare with the ordinary path.)"""
    return record is not None and rows is not None and len(rows) == 1 and rows[0].kind == "usage"


def _check_planned(run: Verification, plan: Plan, results: list[Any], keyring: Keyring) -> None:
    """Every chain index of a batch, in order, from the workers' results."""
    fast = 0
    signatures = 0
    decided: dict[str, int] = {}
    for index, record, rows, at, pair in plan:
        result = results[at]
        if pair and type(result) is FastPair:
            outcome = _check_fast(run, result, record, rows[0] if rows else None, keyring)
            if outcome:
                fast += 1
                signatures += result.record_sigs + len(result.opened.sigs)
                decided[outcome] = decided.get(outcome, 0) + 1
            continue
        if pair and record is not None and rows is not None:
            slow = cast(SlowPair, result)
            _check_index(run, index, (record, slow.record), [(rows[0], slow.input)])
            continue
        record_pair = None
        if record is not None:
            record_pair = (record, cast(OpenResult, result))
            at += 1
        input_pairs = [(row, cast(OpenResult, results[at + k])) for k, row in enumerate(rows or ())]
        _check_index(run, index, record_pair, input_pairs or None)
    if fast:
        for name, n in (("records", fast), ("inputs.usage", fast), ("signatures", signatures)):
            run.bump(name, n)
        for outcome, n in decided.items():
            run.bump(f"decided.{outcome}", n)


def _check_fast(
    run: Verification,
    pair: FastPair,
    record: RecordRow | None,
    row: InputRow | None,
    keyring: Keyring,
) -> str:
    """The sequential checks of a FastPair; returns the decision's outcome, or '' when the
    pair went through the ordinary checks instead (which counted it themselves). Its rows
    are None when a worker read them (``open_ranges``): read again here when needed."""
    index = pair.chain_index
    arrived = pair.arrived_ms
    last = run.last_arrived
    prev = pair.prev
    if (
        (arrived is None and (last is not None or run.untimed_arrival_finding))
        or (arrived is not None and last is not None and arrived < last)
        or (arrived is not None and run.cosigned.violation(index, arrived) is not None)
        or pair.reason == "AFTER_CLOSE"
        or (index == 0 and prev != ZERO_HASH)
        or (index > 0 and run.prev_index == index - 1 and prev != run.prev_hash)
    ):  # something to report: the ordinary checks name it
        record, row = _rows_of(run, index, record, row)
        opened = open_one(0, record.envelope, keyring)
        _check_index(run, index, (record, opened), [(row, pair.opened)])
        return ""
    # (8) the leaf, (6) the prev link, (9) the record's amounts
    run.roots.leaf(index, pair.leaf)
    run.prev_index, run.prev_hash = index, pair.record_hash
    run.work.records.append(pair.record_row)
    # (7) step7_decisions.decide, for a timed usage record with no arrival finding
    if arrived is not None:  # step7_decisions.check_arrival without a finding
        run.last_arrived = arrived if last is None else max(last, arrived)
        if index == 0:
            run.first_arrived = arrived
    opened = pair.opened
    referee = run.referee
    verdict = referee.decide(opened, index in run.duplicates, index, arrived)
    if referee.violations:
        step7_decisions.report_stream_violations(run)
    if referee.disputes:
        step7_decisions.report_disputes(run)
    outcome = verdict.outcome
    if outcome == PENDING:
        raise InvariantError(f"a pending usage at {index}: only adjustments wait")
    if outcome != pair.status or verdict.reason != pair.reason:
        record, row = _rows_of(run, index, record, row)
        step7_decisions.mismatch(run, row.where, verdict, Claim(pair.status, pair.reason))
    if outcome == ACCEPTED:
        event = cast(UsageEvent, opened.record)
        step7_decisions.work_usage(run, index, event, opened.record_hash)
    return outcome


def _rows_of(
    run: Verification, index: int, record: RecordRow | None, row: InputRow | None
) -> tuple[RecordRow, InputRow]:
    """The rows of a FastPair's chain index: as given, or read again from the export (the
    same first-per-index rows the worker read).

    Read a window at a time: the rows of [index, index + CHAIN_BATCH_INDICES), kept for the
    next pairs that need theirs (they come in chain order). A query of one chain index
    scans the table (no index on chain_index): one per pair made a tampered export whose
    every pair names a finding cost time quadratic in its size (200k usage events: > 15
    minutes); a window costs what a worker's read of its range costs."""
    if record is not None and row is not None:
        return record, row
    rows = run.pair_rows
    if rows is not None and index in rows:  # as the worker thread read them
        rec, use = rows[index]
        return (
            record_row(rec) if record is None else record,
            input_row(_USAGE, use) if row is None else row,
        )
    window = run.reread
    if window is None or not window.lo <= index < window.hi:
        lo, hi = index, index + limits.CHAIN_BATCH_INDICES
        window = run.reread = Reread(
            lo,
            hi,
            {r.chain_index: r for r in run.source.record_rows(lo, hi)},
            {r.chain_index: r for r in run.source.input_rows(TABLE_OF_KIND["usage"], lo, hi)},
        )
    return (
        window.records[index] if record is None else record,
        window.inputs[index] if row is None else row,
    )


def _check_index(
    run: Verification,
    index: int,
    record_pair: tuple[RecordRow, OpenResult] | None,
    input_pairs: list[tuple[InputRow, OpenResult]] | None,
) -> None:
    ledger: LedgerRecord | None = None
    if record_pair is not None:
        ledger = _check_record(run, index, *record_pair)
    elif index >= 0:
        run.roots.leaf(index, MISSING_LEAF)
    if not input_pairs:
        return
    chosen = input_pairs[0]
    if ledger is not None:
        chosen = next((p for p in input_pairs if p[0].kind == ledger.kind), chosen)
    row, opened = chosen
    step4_envelopes.check_input_envelope(run, row, opened)
    step5_columns.check_input_columns(run, row, opened)
    if ledger is not None:
        step6_chain.check_link(run, index, ledger, row, opened)
    step7_decisions.decide(run, index, ledger, row, opened)


def _check_record(
    run: Verification, index: int, row: RecordRow, opened: OpenResult
) -> LedgerRecord | None:
    run.bump("records")
    if not step4_envelopes.check_record_envelope(run, row, opened):
        run.roots.leaf(index, MISSING_LEAF)
        run.prev_index = -1
        return None
    run.roots.leaf(index, opened.leaf)
    record = step6_chain.ledger_record(run, row, opened)
    if record is None:
        return None
    step5_columns.check_record_columns(run, row, opened, record)
    step6_chain.check_record(run, index, row, opened, record)
    step9_obligation.collect_record(run, index, opened, record)
    return record
