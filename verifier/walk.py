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
"""

from __future__ import annotations

from collections.abc import Iterator

from proto.records import LedgerRecord
from verifier import (
    step4_envelopes,
    step5_columns,
    step6_chain,
    step7_decisions,
    step9_obligation,
)
from verifier.opener import OpenResult
from verifier.source import Batch, ExportSource, InputRow, RecordRow
from verifier.state import Verification
from verifier.step8_merkle import MISSING_LEAF


def walk(run: Verification) -> None:
    """Stream every chain index in order through the pool and the per-index checks."""
    run.duplicates = step7_decisions.duplicate_indices(run)
    run.progress.start(run.source.path.name, run.record_count)
    done = 0
    for batch, results in run.pool.run(_batch_rows(run.source), step4_envelopes.keyring(run)):
        _check_batch(run, batch, results)
        run.work.flush()
        done += len(batch.records)
        run.progress.update(done)
    run.progress.finish()
    run.work.flush()


def _batch_rows(source: ExportSource) -> Iterator[tuple[Batch, list[tuple[int, bytes]]]]:
    for batch in source.batches():
        rows = [(i, r.envelope) for i, r in enumerate(batch.records)]
        base = len(rows)
        rows += [(base + i, r.envelope) for i, r in enumerate(batch.inputs)]
        yield batch, rows


def _check_batch(run: Verification, batch: Batch, results: list[OpenResult]) -> None:
    n_records = len(batch.records)
    records: dict[int, tuple[RecordRow, OpenResult]] = {
        row.chain_index: (row, results[i]) for i, row in enumerate(batch.records)
    }
    inputs: dict[int, list[tuple[InputRow, OpenResult]]] = {}
    for i, row in enumerate(batch.inputs):
        inputs.setdefault(row.chain_index, []).append((row, results[n_records + i]))
    for index in sorted(records.keys() | inputs.keys()):
        _check_index(run, index, records.get(index), inputs.get(index))


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
