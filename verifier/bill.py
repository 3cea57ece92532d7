"""The bill as the verifier recomputed it: ``gridledger verify EXPORT --html DIR``.

Gathered at the end of a verification, from the verifier's own work tables and decoded
envelopes only — the totals it recomputed (``w_totals``, not the ledger's columns), the
reclaim and adjustments its referee accepted, the samples of the usage events it
accepted classified by its own SQL of SPEC §7.1 (``pricing.HEALTH_SQL``), the checkpoint
it checked — and rendered by ``billview``. An auditor needs no ledger for it.

The verdict (FINAL / PROVISIONAL / FAILED) is the verification's, known once the whole
checklist ran: ``BillParts.doc(report)`` (``verifier/state.py``, beside the report it
belongs to) puts it in.
"""

from __future__ import annotations

import base64
from typing import Final

from billview.facts import (
    MAX_ADJUSTMENT_LINES,
    AdjustmentFacts,
    AssignmentFacts,
    AttestationFacts,
    BillFacts,
    CheckpointFacts,
    PeriodFacts,
    ReclaimFacts,
    ReleaseFacts,
    StatementFacts,
    effective_end,
    signer_names,
)
from billview.timeline import DELIVERED, UNALLOCATED, UNHEALTHY, TimelineBuilder
from proto.cosign import cosignature_of
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.note import parse_checkpoint_body, parse_note
from proto.records import (
    Adjustment,
    BuyerRelease,
    PlacementClosed,
    ReclaimNotice,
    ResaleTotals,
    Statement,
    Totals,
)
from verifier.pricing import HEALTH_SQL, TOTAL_FIELDS, totals_at
from verifier.resale import resale_at
from verifier.source import ALIAS, blob
from verifier.state import BillParts, Verification

# Samples read per fetch while the timeline is built (bounded memory).
SAMPLE_FETCH: Final = 10_000


def collect(run: Verification) -> BillParts | None:
    """The bill's facts from a finished verification (None without any statement)."""
    rows = run.source.small_table("statements", "through_index, envelope", "through_index DESC")
    statement: Statement | None = None
    for _, raw in rows:
        try:
            record = open_envelope(blob(raw)).record
        except ProtoError:
            continue
        if isinstance(record, Statement):
            statement = record
            break
    if statement is None:
        return None
    through = statement.through_index
    mine = totals_at(run.con, through)
    if mine is None:
        return None
    terms = run.terms
    facts = BillFacts(
        renderer="verifier",
        terms=terms,
        statement=StatementFacts(
            through_index=through,
            head=statement.head,
            final=statement.final,
            period=statement.period,
            previous=statement.previous,
            totals=Totals(**mine),
            # SPEC §7.10: the verifier's own resale figures at the statement's index
            resale=tuple(
                ResaleTotals(**e)
                for e in resale_at(run.con, through, "w_assign" in run.work.filled)
            ),
        ),
        record_count=run.record_count,
        periods=_periods(run),
        reclaim=_reclaim(run, through),
        adjustments=_adjustments(run, through),
        adjustments_left_out=max(0, _adjustment_count(run, through) - MAX_ADJUSTMENT_LINES),
        close_index=run.close_index,
        closed_at_ms=_closed_at(run),
        checkpoint=_checkpoint(run),
        assignments=tuple(
            AssignmentFacts(
                chain_index=a.index,
                assignment_id=a.assignment_id,
                new_buyer=a.new_buyer.id,
                handover_ms=a.h_ms,
                handover_at_ms=a.h_ms,
                gpus=tuple(sorted(a.gpus)),
                rate_per_gpu_hour_minor=a.rate_per_gpu_hour_minor,
                signers=(),
            )
            for a in run.referee.assignments
            if a.index <= through
        ),
        release=_release(run, through),
        attestations=tuple(  # SPEC §6.9, as this verification judged them
            AttestationFacts(a.node_id, key_id(a.key), a.gpus, a.attester, a.iss, a.iat, a.index)
            for a in run.referee.attestations
            if a.index <= through
        ),
        source=(
            f"Recomputed by gridledger verify from the export {run.source.path.name} "
            "(signed inputs and the trust file only; no ledger asked). Amounts are the "
            "verifier's own SPEC §7 figures."
        ),
    )
    timeline = TimelineBuilder(terms, effective_end(facts))
    cursor = run.con.execute(
        f"WITH hs AS ({HEALTH_SQL}) SELECT hs.uuid, u.start_ms, u.end_ms, hs.counts, "
        "hs.allocated, hs.weight_bps, hs.allocation_unknown FROM hs JOIN w_usage u "
        "USING (chain_index) WHERE u.chain_index <= ? ORDER BY hs.uuid, u.start_ms",
        [through],
    )
    while batch := cursor.fetchmany(SAMPLE_FETCH):
        for uuid, start_ms, end_ms, counts, allocated, weight, unknown in batch:
            state = DELIVERED if counts else (UNHEALTHY if allocated else UNALLOCATED)
            timeline.add(str(uuid), int(start_ms), int(end_ms), state, int(weight), bool(unknown))
    gpus, note = timeline.finish()
    return BillParts(facts, gpus, note)


def _periods(run: Verification) -> tuple[PeriodFacts, ...]:
    return tuple(
        PeriodFacts(
            period=int(str(p["period"])),
            through_index=int(str(p["through_index"])),
            totals=Totals(**{name: int(str(p[name])) for name in TOTAL_FIELDS}),
            latest=bool(p["latest"]),
        )
        for p in run.report.periods
    )


def _decoded(run: Verification, table: str, index: int) -> tuple[object, list[str]] | None:
    rows = run.con.execute(
        f"SELECT envelope FROM {ALIAS}.{table} WHERE chain_index = ? ORDER BY rowid LIMIT 1",
        [index],
    ).fetchall()
    if not rows:
        return None
    try:
        opened = open_envelope(blob(rows[0][0]))
    except ProtoError:
        return None
    return opened.record, [s.keyid for s in opened.envelope.signatures]


def _reclaim(run: Verification, through: int) -> ReclaimFacts | None:
    rows = run.con.execute(
        "SELECT chain_index, arrived_ms FROM w_reclaim WHERE chain_index <= ? "
        "ORDER BY chain_index LIMIT 1",
        [through],
    ).fetchall()
    if not rows:
        return None
    index = int(rows[0][0])
    arrived_ms = None if rows[0][1] is None else int(rows[0][1])
    decoded = _decoded(run, "reclaims", index)
    if decoded is None:
        return None
    notice, keyids = decoded
    if not isinstance(notice, ReclaimNotice):
        return None
    return ReclaimFacts(
        chain_index=index,
        reclaim_id=notice.reclaim_id,
        issued_at_ms=notice.issued_at_ms,
        effective_at_ms=notice.effective_at_ms,
        reason=notice.reason,
        signers=signer_names(run.terms, keyids),
        arrived_ms=arrived_ms,  # the record's, as the verifier's step 7 read it
    )


def _release(run: Verification, through: int) -> ReleaseFacts | None:
    """SPEC §6.7: the release the verifier's own referee accepted, with its a, e, E0."""
    rows = run.con.execute(
        "SELECT chain_index, arrived_ms, end_ms, end_before_ms FROM w_release "
        "WHERE chain_index <= ? ORDER BY chain_index LIMIT 1",
        [through],
    ).fetchall()
    if not rows:
        return None
    index, arrived_ms, end_ms, end_before_ms = (int(v) for v in rows[0])
    decoded = _decoded(run, "releases", index)
    if decoded is None:
        return None
    release, keyids = decoded
    if not isinstance(release, BuyerRelease):
        return None
    return ReleaseFacts(
        chain_index=index,
        release_id=release.release_id,
        issued_at_ms=release.issued_at_ms,
        effective_at_ms=release.effective_at_ms,
        end_ms=end_ms,
        end_before_ms=end_before_ms,
        reason=release.reason,
        signers=signer_names(run.terms, keyids),
        arrived_ms=arrived_ms,
    )


def _adjustments(run: Verification, through: int) -> tuple[AdjustmentFacts, ...]:
    accepted = {
        int(i): bool(a)
        for i, a in run.con.execute("SELECT chain_index, accepted FROM w_adjust").fetchall()
    }
    out: list[AdjustmentFacts] = []
    # A rejected one shows the export's reason: step (7) compared it with the verifier's own
    # decision, so on a verified export it is the verifier's reason too.
    for index, reason in run.con.execute(
        f"SELECT chain_index, reason FROM {ALIAS}.adjustments WHERE chain_index <= ? "
        f"ORDER BY chain_index LIMIT {MAX_ADJUSTMENT_LINES}",
        [through],
    ).fetchall():
        decoded = _decoded(run, "adjustments", int(index))
        if decoded is None:
            continue
        adj, keyids = decoded
        if not isinstance(adj, Adjustment):
            continue
        ok = accepted.get(int(index), False)
        out.append(
            AdjustmentFacts(
                chain_index=int(index),
                adjustment_id=adj.adjustment_id,
                direction=adj.direction,
                amount_minor=adj.amount_minor,
                reference=adj.reference,
                reason=adj.reason,
                issued_at_ms=adj.issued_at_ms,
                signers=signer_names(run.terms, keyids),
                accepted=ok,
                reject_reason="" if ok else str(reason),
            )
        )
    return tuple(out)


def _adjustment_count(run: Verification, through: int) -> int:
    return int(
        run.source.scalar(
            f"SELECT count(*) FROM {ALIAS}.adjustments WHERE chain_index <= ?", [through]
        )
    )


def _closed_at(run: Verification) -> int | None:
    if run.close_index is None:
        return None
    decoded = _decoded(run, "closes", run.close_index)
    record = None if decoded is None else decoded[0]
    return record.closed_at_ms if isinstance(record, PlacementClosed) else None


def _checkpoint(run: Verification) -> CheckpointFacts | None:
    """The largest checkpoint note of the export, with the party cosignatures that verify."""
    best: CheckpointFacts | None = None
    terms = run.terms
    for (text,) in run.source.small_table("checkpoints", "note", "size"):
        try:
            note = parse_note(str(text))
            body = parse_checkpoint_body(note.body)
        except ProtoError:
            continue
        if best is not None and body.size <= best.size:
            continue
        cosigners = tuple(
            party.id
            for party in (terms.operator, terms.buyer, terms.desk)
            if cosignature_of(note, party.id, party.key) is not None
        )
        best = CheckpointFacts(body.size, base64.b64encode(body.root).decode(), cosigners)
    return best
