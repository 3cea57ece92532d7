"""The bill as the ledger sees it: its statement, rendered from its own store.

``bill_doc`` gathers the facts of one placement — the statement through the current head
(the signed one stored for it, or the same unsigned, a preview: a read signs nothing, as
``GET /statement``), the terms in force, the accepted reclaim, every chained adjustment
with its signers, the close, the latest checkpoint with the party cosignatures it
carries, and the samples of every accepted usage event classified by the ledger's own
§7.1 rule (``ledger.health``) — and hands them to ``billview``, which arranges line
items, derivations and the timeline. The verifier renders the same page
from what it recomputed (``verifier/bill.py``); neither uses the other's figures.

What the ledger cannot say is whether its own figures verify: its verdict is what the
log shows (closed, final statement, a checkpoint over it cosigned by operator and buyer,
the default witness policy of SPEC §9), labelled as the ledger's own view.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Final

from billview.build import build
from billview.doc import BillDoc, GpuRow
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
    VerdictFacts,
    effective_end,
    signer_names,
)
from billview.timeline import DELIVERED, UNALLOCATED, UNHEALTHY, TimelineBuilder
from ledger import health, snapshot
from ledger.issuer import UnknownPlacement, current_statement
from ledger.store import Store
from proto.cosign import cosignature_of
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.keys import SigningKey, key_id
from proto.note import parse_checkpoint_body, parse_note
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    LedgerRecord,
    Metering,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    Statement,
    UsageEvent,
)

# Usage events read per query while the timeline is built (bounded memory).
USAGE_PAGE: Final = 5_000


def bill_doc(store: Store, key: SigningKey, placement_id: str) -> BillDoc:
    """The bill of ``placement_id`` through its current head (raises UnknownPlacement).
    It writes nothing; ``key``, the ledger's, signs nothing here either."""
    facts, rows, note = bill_facts(store, key, placement_id)
    return build(facts, rows, note)


def bill_facts(
    store: Store, key: SigningKey, placement_id: str
) -> tuple[BillFacts, list[GpuRow], str]:
    """What the bill shows, from the store: the facts, the per-GPU rows, a timeline note."""
    statement, envelope = current_statement(store, placement_id)
    terms = store.terms(placement_id)
    if terms is None:
        raise UnknownPlacement(f"placement {placement_id!r} has no accepted terms")
    through = statement.through_index
    reclaim, adjustments, close = _inputs(store, terms, through)
    left_out = max(0, len(adjustments) - MAX_ADJUSTMENT_LINES)
    checkpoint = _checkpoint(store, terms)
    facts = BillFacts(
        renderer="ledger",
        terms=terms,
        statement=StatementFacts(
            through_index=through,
            head=statement.head,
            final=statement.final,
            period=statement.period,
            previous=statement.previous,
            totals=statement.totals,
            resale=tuple(statement.resale),
        ),
        record_count=through + 1,
        periods=_periods(store, placement_id),
        reclaim=reclaim,
        adjustments=tuple(adjustments[:MAX_ADJUSTMENT_LINES]),
        adjustments_left_out=left_out,
        close_index=None if close is None else close[0],
        closed_at_ms=None if close is None else close[1],
        checkpoint=checkpoint,
        assignments=_assignments(store, terms, through),
        release=_release(store, terms, through, reclaim),
        attestations=_attestations(store, placement_id, through),
        verdict=_verdict(statement, envelope is not None, checkpoint, terms),
        source=(
            "Rendered by the ledger from its own store. Check it independently, offline: "
            f"gridledger ledger export {placement_id} --out {placement_id}.duckdb; "
            f"gridledger verify {placement_id}.duckdb --trust trust.json --html DIR"
        ),
    )
    timeline = TimelineBuilder(terms, effective_end(facts))
    _classify_usage(store, placement_id, through, timeline, terms.metering)
    rows, note = timeline.finish()
    return facts, rows, note


def _attestations(store: Store, placement_id: str, through: int) -> tuple[AttestationFacts, ...]:
    """SPEC §6.9: the node keys attested in the fold's state, as of record ``through``."""
    raw = store.load_state(placement_id)
    if raw is None:
        return ()
    state = snapshot.decode(placement_id, raw)
    found = [
        AttestationFacts(node_id, key_id(key), a.gpus, a.attester, a.iss, a.iat, a.record_index)
        for node_id, keys in state.attested.items()
        for key, a in keys.items()
        if a.record_index <= through
    ]
    return tuple(sorted(found, key=lambda a: a.chain_index))


def _rows(
    store: Store, placement_id: str, kind: str, through: int
) -> list[tuple[int, bytes, str, str]]:
    return [
        (int(i), bytes(e), str(s), str(r))
        for i, e, s, r in store.query(
            "SELECT chain_index, envelope, status, reason FROM inputs WHERE placement_id = ? "
            "AND kind = ? AND chain_index <= ? ORDER BY chain_index",
            [placement_id, kind, through],
        )
    ]


def _arrived(store: Store, placement_id: str, chain_index: int) -> int | None:
    """The ``arrived_ms`` the ledger chained for record ``chain_index`` (SPEC §6.6)."""
    rows = store.query(
        "SELECT envelope FROM records WHERE placement_id = ? AND chain_index = ?",
        [placement_id, chain_index],
    )
    if not rows:
        return None
    record = open_envelope(bytes(rows[0][0])).record
    if not isinstance(record, LedgerRecord):
        return None
    return record.arrived_ms


def _inputs(
    store: Store, terms: PlacementTerms, through: int
) -> tuple[ReclaimFacts | None, list[AdjustmentFacts], tuple[int, int] | None]:
    pid = terms.placement_id
    reclaim: ReclaimFacts | None = None
    for index, raw, status, _ in _rows(store, pid, "reclaim", through):
        opened = open_envelope(raw)
        notice = opened.record
        if status == "accepted" and isinstance(notice, ReclaimNotice) and reclaim is None:
            reclaim = ReclaimFacts(
                chain_index=index,
                reclaim_id=notice.reclaim_id,
                issued_at_ms=notice.issued_at_ms,
                effective_at_ms=notice.effective_at_ms,
                reason=notice.reason,
                signers=signer_names(terms, [s.keyid for s in opened.envelope.signatures]),
                arrived_ms=_arrived(store, pid, index),
            )
    adjustments: list[AdjustmentFacts] = []
    for index, raw, status, reason in _rows(store, pid, "adjustment", through):
        opened = open_envelope(raw)
        adj = opened.record
        if not isinstance(adj, Adjustment):
            continue
        adjustments.append(
            AdjustmentFacts(
                chain_index=index,
                adjustment_id=adj.adjustment_id,
                direction=adj.direction,
                amount_minor=adj.amount_minor,
                reference=adj.reference,
                reason=adj.reason,
                issued_at_ms=adj.issued_at_ms,
                signers=signer_names(terms, [s.keyid for s in opened.envelope.signatures]),
                accepted=status == "accepted",
                reject_reason=reason,
            )
        )
    close: tuple[int, int] | None = None
    for index, raw, status, _ in _rows(store, pid, "closed", through):
        record = open_envelope(raw).record
        if status == "accepted" and isinstance(record, PlacementClosed) and close is None:
            close = (index, record.closed_at_ms)
    return reclaim, adjustments, close


def _assignments(store: Store, terms: PlacementTerms, through: int) -> tuple[AssignmentFacts, ...]:
    """The accepted assignments (SPEC §6.8) with their effective handover."""
    pid = terms.placement_id
    out = []
    for index, raw, status, _ in _rows(store, pid, "assignment", through):
        opened = open_envelope(raw)
        record = opened.record
        if status != "accepted" or not isinstance(record, Assignment):
            continue
        arrived = _arrived(store, pid, index)
        handover = record.handover_at_ms if arrived is None else max(record.handover_at_ms, arrived)
        names = signer_names(terms, [s.keyid for s in opened.envelope.signatures])
        new_buyer_key = f"key {key_id(record.new_buyer.key)}"
        out.append(
            AssignmentFacts(
                chain_index=index,
                assignment_id=record.assignment_id,
                new_buyer=record.new_buyer.id,
                handover_ms=handover,
                handover_at_ms=record.handover_at_ms,
                gpus=tuple(record.gpus),
                rate_per_gpu_hour_minor=record.rate_per_gpu_hour_minor,
                signers=tuple(
                    f"new buyer {record.new_buyer.id}" if n == new_buyer_key else n for n in names
                ),
            )
        )
    return tuple(out)


def _release(
    store: Store, terms: PlacementTerms, through: int, reclaim: ReclaimFacts | None
) -> ReleaseFacts | None:
    """SPEC §6.7: the accepted release, with e and the effective end before it, from the
    store's records (the fold's own state is not kept per record)."""
    pid = terms.placement_id
    for index, raw, status, _ in _rows(store, pid, "release", through):
        opened = open_envelope(raw)
        release = opened.record
        if status != "accepted" or not isinstance(release, BuyerRelease):
            continue
        arrived = _arrived(store, pid, index)
        rows = store.query(
            "SELECT max(end_ms) FROM inputs WHERE placement_id = ? AND kind = 'usage' "
            "AND status = 'accepted' AND chain_index < ?",
            [pid, index],
        )
        usage_end = int(rows[0][0] or 0) if rows else 0
        notice_from = release.issued_at_ms if arrived is None else arrived
        before = terms.window_end_ms
        if reclaim is not None and reclaim.chain_index < index:
            before = reclaim.effective_at_ms
        return ReleaseFacts(
            chain_index=index,
            release_id=release.release_id,
            issued_at_ms=release.issued_at_ms,
            effective_at_ms=release.effective_at_ms,
            end_ms=max(release.effective_at_ms, notice_from, usage_end),
            end_before_ms=before,
            reason=release.reason,
            signers=signer_names(terms, [s.keyid for s in opened.envelope.signatures]),
            arrived_ms=arrived,
        )
    return None


def _periods(store: Store, placement_id: str) -> tuple[PeriodFacts, ...]:
    """The final statements the ledger issued, one per period (the latest last)."""
    by_period: dict[int, PeriodFacts] = {}
    for through_index, envelope, final, *_ in store.statements(placement_id):
        if not final:
            continue
        statement = open_envelope(envelope).record
        if isinstance(statement, Statement) and statement.period not in by_period:
            by_period[statement.period] = PeriodFacts(
                statement.period, through_index, statement.totals, latest=False
            )
    periods = [by_period[p] for p in sorted(by_period)]
    if periods:
        last = periods[-1]
        periods[-1] = PeriodFacts(last.period, last.through_index, last.totals, latest=True)
    return tuple(periods)


def _checkpoint(store: Store, terms: PlacementTerms) -> CheckpointFacts | None:
    """The latest checkpoint the ledger issued (None: none yet), with its cosigners."""
    stored = store.checkpoints(terms.placement_id)
    if not stored:
        return None
    try:
        note = parse_note(max(stored)[1])
        body = parse_checkpoint_body(note.body)
    except ProtoError:
        return None
    cosigners = tuple(
        party.id
        for party in (terms.operator, terms.buyer, terms.desk)
        if cosignature_of(note, party.id, party.key) is not None
    )
    return CheckpointFacts(body.size, base64.b64encode(body.root).decode(), cosigners)


def _verdict(
    statement: Statement,
    signed: bool,
    checkpoint: CheckpointFacts | None,
    terms: PlacementTerms,
) -> VerdictFacts:
    reasons: list[str] = []
    if not signed:
        reasons.append("a preview: the ledger has not signed a statement through this record yet")
    if not statement.final:
        reasons.append("open: the placement is not closed yet")
    size = statement.through_index + 1
    if checkpoint is None or checkpoint.size != size:
        reasons.append(f"no checkpoint covers all {size} records yet")
    else:
        for role, party in (("operator", terms.operator), ("buyer", terms.buyer)):
            if party.id not in checkpoint.cosigners:
                reasons.append(f"not witnessed by the {role} ({party.id}) yet")
    return VerdictFacts(
        "PROVISIONAL" if reasons else "FINAL",
        "as the ledger sees its own log (not an independent verification)",
        tuple(reasons),
    )


def _usage_pages(store: Store, placement_id: str, through: int) -> Iterator[bytes]:
    after = -1
    while True:
        rows = store.query(
            "SELECT chain_index, envelope FROM inputs WHERE placement_id = ? AND kind = 'usage' "
            "AND status = 'accepted' AND chain_index > ? AND chain_index <= ? "
            f"ORDER BY chain_index LIMIT {USAGE_PAGE}",
            [placement_id, after, through],
        )
        for _, envelope in rows:
            yield bytes(envelope)
        if len(rows) < USAGE_PAGE:
            return
        after = int(rows[-1][0])


def _classify_usage(
    store: Store,
    placement_id: str,
    through: int,
    timeline: TimelineBuilder,
    metering: Metering | None = None,
) -> None:
    """Every sample of the accepted usage events, in chain order, with its §7.1 state."""
    retired: dict[str, dict[str, int]] = {}  # per node stream: the retired-page baseline
    for raw in _usage_pages(store, placement_id, through):
        event = open_envelope(raw).record
        if not isinstance(event, UsageEvent):
            continue
        before = retired.get(event.node_id, {})
        for sample in event.samples:
            if health.counts(sample, event.seq == 0, before, metering):
                state = DELIVERED
            elif not sample.allocated or not health.held(sample, metering):
                state = UNALLOCATED
            else:
                state = UNHEALTHY
            timeline.add(
                sample.uuid,
                event.start_ms,
                event.end_ms,
                state,
                health.weight_bps(sample, metering),
                sample.allocation == "unknown",
            )
        retired[event.node_id] = dict(health.retired_after(before, event.samples))
