"""The line items of a bill (SPEC §7), each with the numbers that give it.

``build(facts, gpus, note)`` turns what one side established into a ``BillDoc``. Every
amount shown is the statement's own total (the figure that was signed, or that the
verifier recomputed); the derivation beside it recomputes the same figure from the terms
and the inputs with the formula of SPEC §7, and any difference is listed in ``checks`` —
a bill whose derivation does not give its amount says so on its face.
"""

from __future__ import annotations

from typing import Final

from billview.doc import (
    Attested,
    BillDoc,
    Checkpoint,
    GpuRow,
    Line,
    Period,
    Resale,
    StatementRef,
    Verdict,
)
from billview.facts import BillFacts, effective_end, effective_end_at_close
from billview.timeline import DELIVERED, RECLAIMED, UNALLOCATED, UNHEALTHY, UNREPORTED
from billview.units import (
    duration,
    exact_decimal,
    format_gpu_hours,
    format_minor,
    gpu_hours_exact,
    gpus,
    iso_utc,
    percent_bps,
)
from proto.limits import MAX_BPS, MILLI_GPU_MS_PER_GPU_HOUR
from proto.records import PlacementTerms, Totals

# The order of a bill's sections: what was delivered, what it costs, how available it was,
# what is credited back, what each party pays or receives.
SECTIONS: Final = ("delivery", "charges", "sla", "credits", "settlement", "resale")


def _share_total(terms: PlacementTerms) -> int:
    return sum(g.share_milli for g in terms.gpus)


class _Money:
    def __init__(self, terms: PlacementTerms) -> None:
        self.scale = terms.currency_scale
        self.currency = terms.currency

    def __call__(self, minor: int) -> str:
        return f"{format_minor(minor, self.scale)} {self.currency}"

    def exact(self, numerator: int, denominator: int) -> str:
        return f"{exact_decimal(numerator, denominator, self.scale)} {self.currency}"


def terms_summary(terms: PlacementTerms) -> list[tuple[str, str]]:
    """The agreed terms a bill rests on, as (label, value) rows."""
    money = _Money(terms)
    nodes = len(terms.nodes)
    return [
        ("operator", terms.operator.id),
        ("buyer", terms.buyer.id),
        ("desk", terms.desk.id),
        (
            "window",
            f"{iso_utc(terms.window_start_ms)} to {iso_utc(terms.window_end_ms)} "
            f"({duration(terms.window_end_ms - terms.window_start_ms)})",
        ),
        (
            "GPUs",
            f"{len(terms.gpus)} ({gpus(_share_total(terms))}) on {nodes} "
            f"node{'' if nodes == 1 else 's'}",
        ),
        ("rate", f"{money(terms.rate_per_gpu_hour_minor)} per GPU-hour"),
        ("billing increment", duration(terms.increment_ms)),
        ("minimum duration", duration(terms.minimum_duration_ms)),
        *(
            [("release notice", f"{duration(terms.release_notice_ms)} (SPEC §7.9)")]
            if terms.release_notice_ms
            else []
        ),
        (
            "reclaim",
            f"{duration(terms.reclaim_notice_ms)} notice; penalty "
            f"{percent_bps(terms.reclaim_penalty_bps)} of the rate for the short notice"
            + (
                " and the minimum duration taken (interruptible)"
                if terms.interruptible
                else " and the rest of the window taken (not interruptible)"
            ),
        ),
        (
            "SLA",
            f"availability target {percent_bps(terms.sla_availability_target_bps)}; "
            f"credit {percent_bps(terms.sla_credit_bps)} of gross when missed",
        ),
        ("desk fee", f"{percent_bps(terms.desk_fee_bps)} of net, paid by the {terms.fee_payer}"),
        *(
            [("tax", f"{percent_bps(terms.tax_bps)}, on invoices (SPEC §11.2)")]
            if terms.tax_bps
            else []
        ),
        ("late grace", duration(terms.late_grace_ms)),
        ("terms version", str(terms.version)),
        *_placement_rows(terms),
        *(
            [("resale", "an assignment needs the operator's signature too (SPEC §6.8)")]
            if terms.resale_requires_operator
            else []
        ),
        *_attestation_terms(terms),
    ]


def _attestation_terms(terms: PlacementTerms) -> list[tuple[str, str]]:
    """SPEC §6.9: the row for ``attestation_required`` (none when it is false)."""
    if not terms.attestation_required:
        return []
    return [
        (
            "hardware evidence",
            "required: usage counts only from node keys with accepted attestation "
            "evidence for the sampled GPUs (SPEC §6.9)",
        )
    ]


def _one_line(text: str) -> str:
    """Signed free text shown on one line: a control character (a newline that would
    forge a line of ``terms show``) is written as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _placement_rows(terms: PlacementTerms) -> list[tuple[str, str]]:
    """SPEC §5.1-§5.3: workload, delivery, residency and metering rows, only when the terms
    carry them (terms without them show exactly the rows they always did)."""
    rows = _placement_text_rows(terms)
    return [(label, _one_line(value)) for label, value in rows]


def _placement_text_rows(terms: PlacementTerms) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    w, d, r = terms.workload, terms.delivery, terms.residency
    if w is not None:
        rows.append(("workload", f"{w.workload_class}, {w.isolation} isolation"))
        rows.append(("runtime", w.runtime or "(not stated)"))
        rows.append(("data access", w.data_access or "(not stated)"))
    if d is not None:
        rows.append(("operator of record", d.operator_of_record))
        support = ", ".join(x for x in (d.support_contact, d.support_hours) if x)
        rows.append(("support", support or "(not stated)"))
        for i, item in enumerate(d.acceptance, start=1):
            rows.append((f"acceptance {i}", item))
        rows.append(("on reclaim", d.on_reclaim))
    if r is not None:
        rows.append(("residency", "regions " + ", ".join(r.allowed_regions)))
        if r.jurisdictions:
            rows.append(("jurisdictions", ", ".join(r.jurisdictions)))
    m = terms.metering
    if m is not None:  # SPEC §5.3
        idle = "billed" if m.idle_billed else "not billed (only the buyer's workload's time)"
        rows.append(("metering", f"XID table {m.xid_table}; idle GPUs {idle}"))
        rows.append(("buyer's workloads", ", ".join(m.holders) or "(none named)"))
        rows.append(("degraded time", f"counted at {percent_bps(m.degraded_bps)}"))
    return rows


def build(facts: BillFacts, gpu_rows: list[GpuRow], timeline_note: str = "") -> BillDoc:
    """The bill of ``facts``; ``gpu_rows`` from ``TimelineBuilder.finish``."""
    terms = facts.terms
    totals = facts.statement.totals
    money = _Money(terms)
    checks: list[str] = []
    lines: list[Line] = []
    lines += _delivery(terms, totals, gpu_rows, checks)
    lines += _gross(terms, totals, money, checks)
    lines += _availability(facts, totals, money, checks)
    lines += _reclaim(facts, totals, money, checks)
    lines += _release(facts, totals, money, checks)
    lines += _adjustments(facts, totals, money, checks)
    lines += _settlement(terms, totals, money, checks, facts.release is not None)
    resale = _resale_rows(facts)
    lines += _resale(facts, resale, money, checks)
    lines.sort(key=lambda line: SECTIONS.index(line.section))  # stable: order within kept
    statement = facts.statement
    checkpoint = None
    if facts.checkpoint is not None:
        cp = facts.checkpoint
        checkpoint = Checkpoint(
            size=cp.size,
            root_b64=cp.root_b64,
            cosigners=list(cp.cosigners),
            covers_statement=cp.size == statement.through_index + 1,
        )
    return BillDoc(
        placement_id=terms.placement_id,
        renderer=facts.renderer,
        source=facts.source,
        currency=terms.currency,
        currency_scale=terms.currency_scale,
        parties={"operator": terms.operator.id, "buyer": terms.buyer.id, "desk": terms.desk.id},
        terms=terms_summary(terms),
        window_start_ms=terms.window_start_ms,
        window_end_ms=terms.window_end_ms,
        effective_end_ms=effective_end(facts),
        statement=StatementRef(
            through_index=statement.through_index,
            head=statement.head,
            final=statement.final,
            period=statement.period,
            previous=statement.previous,
        ),
        record_count=facts.record_count,
        totals={name: getattr(totals, name) for name in Totals.__struct_fields__},
        lines=lines,
        gpus=gpu_rows,
        timeline_note=timeline_note,
        periods=[
            Period(
                period=p.period,
                through_index=p.through_index,
                buyer_owes_minor=p.totals.buyer_owes_minor,
                operator_receives_minor=p.totals.operator_receives_minor,
                desk_receives_minor=p.totals.desk_receives_minor,
                latest=p.latest,
            )
            for p in facts.periods
        ],
        verdict=Verdict(
            level=facts.verdict.level, by=facts.verdict.by, reasons=list(facts.verdict.reasons)
        ),
        checkpoint=checkpoint,
        checks=checks,
        resale=resale,
        original_buyer_net_minor=(
            totals.buyer_owes_minor - sum(r.proceeds_minor for r in resale) if resale else None
        ),
        desk_total_minor=(
            totals.desk_receives_minor + sum(r.fee_minor for r in resale) if resale else None
        ),
        attested=[
            Attested(
                node_id=a.node_id,
                key_id=a.key_id,
                gpus=list(a.gpus),
                attester=a.attester,
                iss=a.iss,
                iat_s=a.iat,
                chain_index=a.chain_index,
            )
            for a in facts.attestations
        ],
    )


def _resale_rows(facts: BillFacts) -> list[Resale]:
    """SPEC §7.10: each assignment with the statement's figures for it."""
    by_id = {a.assignment_id: a for a in facts.assignments}
    rows = []
    for entry in facts.statement.resale:
        assigned = by_id.get(entry.assignment_id)
        rows.append(
            Resale(
                assignment_id=entry.assignment_id,
                new_buyer=entry.new_buyer,
                handover_ms=0 if assigned is None else assigned.handover_ms,
                gpus=[] if assigned is None else list(assigned.gpus),
                rate_per_gpu_hour_minor=0 if assigned is None else assigned.rate_per_gpu_hour_minor,
                delivered_mgms=entry.delivered_mgms,
                billable_mgms=entry.billable_mgms,
                gross_minor=entry.gross_minor,
                fee_minor=entry.fee_minor,
                proceeds_minor=entry.gross_minor - entry.fee_minor,
            )
        )
    return rows


def _resale(facts: BillFacts, resale: list[Resale], money: _Money, checks: list[str]) -> list[Line]:
    """SPEC §7.10: what each new buyer owes (to the desk), the desk's fee on it (paid by
    the seller), what reaches the seller, its net, and the desk's total."""
    if not resale:
        return []
    terms, scale = facts.terms, facts.terms.currency_scale
    unit = terms.increment_ms * 1000
    known = {a.assignment_id for a in facts.assignments}
    lines: list[Line] = []
    for r in resale:
        if r.assignment_id not in known:
            checks.append(f"resale {r.assignment_id}: no accepted assignment of that id")
        billable = -(-r.delivered_mgms // unit) * unit
        _check(checks, f"resale {r.assignment_id} billable", billable, r.billable_mgms)
        product = r.billable_mgms * r.rate_per_gpu_hour_minor
        gross = product // MILLI_GPU_MS_PER_GPU_HOUR
        _check(checks, f"resale {r.assignment_id} gross", gross, r.gross_minor)
        fee = r.gross_minor * terms.desk_fee_bps // MAX_BPS
        _check(checks, f"resale {r.assignment_id} fee", fee, r.fee_minor)
        sold = ", ".join(r.gpus) or "?"
        lines += [
            Line(
                key=f"resale:{r.assignment_id}",
                section="resale",
                unit_price=f"{money(r.rate_per_gpu_hour_minor)}/GPU-h",
                label=f"Resale {r.assignment_id}: {r.new_buyer} owes (paid to the desk)",
                quantity=format_gpu_hours(r.billable_mgms),
                unit="GPU-h",
                amount_minor=r.gross_minor,
                amount=format_minor(r.gross_minor, scale),
                payer=r.new_buyer,
                payee="desk",
                derivation=f"{sold} from {iso_utc(r.handover_ms)} (the handover, SPEC §6.8): "
                f"delivered {gpu_hours_exact(r.delivered_mgms)}, billable "
                f"{gpu_hours_exact(r.billable_mgms)} × {money(r.rate_per_gpu_hour_minor)}/GPU-h "
                f"= {money.exact(product, MILLI_GPU_MS_PER_GPU_HOUR)}, rounded down to "
                f"{money(gross)} (SPEC §7.10)",
            ),
            Line(
                key=f"resale_fee:{r.assignment_id}",
                section="resale",
                label=f"Desk fee on resale {r.assignment_id}",
                amount_minor=r.fee_minor,
                amount=format_minor(r.fee_minor, scale),
                payer="buyer",
                payee="desk",
                derivation=f"{percent_bps(terms.desk_fee_bps)} of {money(r.gross_minor)} = "
                f"{money.exact(r.gross_minor * terms.desk_fee_bps, MAX_BPS)}, rounded down to "
                f"{money(fee)}; paid by the seller (the original buyer) out of the resale",
            ),
            Line(
                key=f"resale_proceeds:{r.assignment_id}",
                section="resale",
                label=f"Resale {r.assignment_id} passed on to the original buyer",
                amount_minor=r.proceeds_minor,
                amount=format_minor(r.proceeds_minor, scale),
                payer="desk",
                payee="buyer",
                derivation=f"{money(r.gross_minor)} − {money(r.fee_minor)}",
            ),
        ]
    totals = facts.statement.totals
    proceeds = sum(r.proceeds_minor for r in resale)
    net = totals.buyer_owes_minor - proceeds
    fees = sum(r.fee_minor for r in resale)
    lines += [
        Line(
            key="original_buyer_net",
            section="resale",
            label="Original buyer's net, after the resale",
            amount_minor=net,
            amount=format_minor(net, scale),
            payer="buyer",
            derivation=f"owes the operator {money(totals.buyer_owes_minor)} under the original "
            f"terms − {money(proceeds)} from the resale"
            + (" (negative: it receives the difference)" if net < 0 else ""),
        ),
        Line(
            key="desk_total",
            section="resale",
            label="Desk receives in all",
            amount_minor=totals.desk_receives_minor + fees,
            amount=format_minor(totals.desk_receives_minor + fees, scale),
            payee="desk",
            derivation=f"F {money(totals.desk_receives_minor)} + resale fees {money(fees)}",
        ),
    ]
    return lines


def _check(checks: list[str], what: str, derived: int, stated: int) -> None:
    if derived != stated:
        checks.append(f"{what}: the derivation gives {derived}, the statement says {stated}")


def _delivery(
    terms: PlacementTerms, totals: Totals, rows: list[GpuRow], checks: list[str]
) -> list[Line]:
    lines: list[Line] = []
    for row in rows:
        parts = [f"{duration(row.ms[DELIVERED])} delivered × share {row.share_milli}/1000"]
        for state, words in (
            (UNHEALTHY, "unhealthy"),
            (UNALLOCATED, "unallocated"),
            (RECLAIMED, "reclaimed"),
            (UNREPORTED, "not reported"),
        ):
            if row.ms[state]:
                parts.append(f"{duration(row.ms[state])} {words}")
        if row.degraded_ms and terms.metering is not None:
            parts.append(
                f"of the delivered, {duration(row.degraded_ms)} degraded (throttled), "
                f"counted at {percent_bps(terms.metering.degraded_bps)}"
            )
        if row.allocation_unknown_ms:
            parts.append(
                f"of the delivered, {duration(row.allocation_unknown_ms)} allocation unknown "
                "(no scheduler said who held the GPU)"
            )
        lines.append(
            Line(
                key=f"gpu:{row.uuid}",
                section="delivery",
                label=f"{row.uuid} ({row.model}) on {row.node_id}",
                quantity=row.delivered_gpu_h,
                unit="GPU-h",
                derivation="; ".join(parts) + f"; availability {row.availability}",
            )
        )
    delivered = sum(r.delivered_mgms for r in rows)
    _check(checks, "delivered (sum of the GPUs)", delivered, totals.delivered_mgms)
    lines.append(
        Line(
            key="delivered",
            section="delivery",
            label="Delivered",
            quantity=format_gpu_hours(totals.delivered_mgms),
            unit="GPU-h",
            derivation=f"D = the GPUs above: {gpu_hours_exact(delivered)} "
            "(healthy, allocated, within the window, SPEC §7.1)",
        )
    )
    unit = terms.increment_ms * 1000
    increments = -(-totals.delivered_mgms // unit)
    _check(checks, "billable", increments * unit, totals.billable_mgms)
    lines.append(
        Line(
            key="billable",
            section="delivery",
            label="Billable",
            quantity=format_gpu_hours(totals.billable_mgms),
            unit="GPU-h",
            derivation=f"D rounded up to whole increments of {duration(terms.increment_ms)} "
            f"of one GPU: {increments} × {duration(terms.increment_ms)} = "
            f"{gpu_hours_exact(increments * unit)} (SPEC §7.2)",
        )
    )
    return lines


def _gross(terms: PlacementTerms, totals: Totals, money: _Money, checks: list[str]) -> list[Line]:
    product = totals.billable_mgms * terms.rate_per_gpu_hour_minor
    derived = product // MILLI_GPU_MS_PER_GPU_HOUR
    _check(checks, "gross", derived, totals.gross_minor)
    return [
        Line(
            key="gross",
            section="charges",
            unit_price=f"{money(terms.rate_per_gpu_hour_minor)}/GPU-h",
            label="Gross",
            quantity=format_gpu_hours(totals.billable_mgms),
            unit="GPU-h",
            amount_minor=totals.gross_minor,
            amount=format_minor(totals.gross_minor, terms.currency_scale),
            payer="buyer",
            payee="operator",
            derivation=f"billable {gpu_hours_exact(totals.billable_mgms)} × "
            f"{money(terms.rate_per_gpu_hour_minor)}/GPU-h = "
            f"{money.exact(product, MILLI_GPU_MS_PER_GPU_HOUR)}, rounded down to "
            f"{money(derived)} (SPEC §7.2)",
        )
    ]


def _availability(facts: BillFacts, totals: Totals, money: _Money, checks: list[str]) -> list[Line]:
    terms = facts.terms
    share = _share_total(terms)
    end = effective_end_at_close(facts)
    owed_ms = end - terms.window_start_ms
    bps = MAX_BPS if owed_ms <= 0 else MAX_BPS * totals.delivered_mgms // (share * owed_ms)
    target = terms.sla_availability_target_bps
    met = bps >= target
    owed_text = f"{gpus(share)} × {duration(owed_ms)} = {gpu_hours_exact(share * owed_ms)}" + (
        " (to the reclaim)" if end < terms.window_end_ms else ""
    )
    closed = facts.close_index is not None and facts.close_index <= facts.statement.through_index
    derivation = (
        f"D / (S × E) = {gpu_hours_exact(totals.delivered_mgms)} / "
        f"({owed_text}) = {percent_bps(bps)} (rounded down), "
        f"{'meets' if met else 'misses'} the target {percent_bps(target)} (SPEC §7.5)"
    )
    if not closed:
        # Over the whole window, mid-window figures read as a miss: say what is known.
        derivation = (
            f"delivered so far D = {gpu_hours_exact(totals.delivered_mgms)} of the window's "
            f"S × E = {owed_text}; availability is judged at the close against the target "
            f"{percent_bps(target)} (SPEC §7.5)"
        )
    availability = Line(
        key="availability",
        section="sla",
        label="Availability",
        quantity=percent_bps(bps) if closed else "open: judged at the close",
        unit="",
        derivation=derivation,
    )
    if not closed:
        derived = 0
        why = "fixed at the close (SPEC §7.5); the placement is open, so it is 0 so far"
    elif met:
        derived = 0
        why = f"availability {percent_bps(bps)} ≥ target {percent_bps(target)}: no credit"
    else:
        derived = totals.gross_minor * terms.sla_credit_bps // MAX_BPS
        why = (
            f"availability {percent_bps(bps)} < target {percent_bps(target)}: "
            f"{percent_bps(terms.sla_credit_bps)} of gross {money(totals.gross_minor)} = "
            f"{money.exact(totals.gross_minor * terms.sla_credit_bps, MAX_BPS)}, "
            f"rounded down to {money(derived)}"
        )
    _check(checks, "SLA credit", derived, totals.sla_credit_minor)
    credit = Line(
        key="sla",
        section="credits",
        label="SLA credit",
        amount_minor=totals.sla_credit_minor,
        amount=format_minor(totals.sla_credit_minor, terms.currency_scale),
        payer="operator",
        payee="buyer",
        derivation=why,
    )
    return [availability, credit]


def _reclaim(facts: BillFacts, totals: Totals, money: _Money, checks: list[str]) -> list[Line]:
    reclaim = facts.reclaim
    if reclaim is None:
        _check(checks, "reclaim credit", 0, totals.reclaim_credit_minor)
        return []
    terms = facts.terms
    share = _share_total(terms)
    given = max(0, reclaim.effective_at_ms - reclaim.notice_from_ms)
    required = terms.reclaim_notice_ms
    short = max(0, required - given)
    if terms.interruptible:
        minimum_end = terms.window_start_ms + terms.minimum_duration_ms
        taken = max(0, minimum_end - reclaim.effective_at_ms)
        taken_text = (
            f"minimum duration taken {duration(taken)} (interruptible: the minimum duration "
            f"ends {iso_utc(minimum_end)})"
        )
    else:
        taken = terms.window_end_ms - reclaim.effective_at_ms
        release = facts.release
        if release is not None and release.chain_index < reclaim.chain_index:
            taken = min(terms.window_end_ms, release.end_ms) - reclaim.effective_at_ms  # §7.9
        taken_text = (
            f"window taken {duration(taken)} (effective {iso_utc(reclaim.effective_at_ms)} "
            f"to window end {iso_utc(terms.window_end_ms)}, not interruptible)"
        )
    mgms = share * (short + taken)
    numerator = mgms * terms.rate_per_gpu_hour_minor * terms.reclaim_penalty_bps
    denominator = MILLI_GPU_MS_PER_GPU_HOUR * MAX_BPS
    derived = numerator // denominator
    _check(checks, "reclaim credit", derived, totals.reclaim_credit_minor)
    if reclaim.arrived_ms is None:
        counted = f"issued {iso_utc(reclaim.issued_at_ms)}"
    else:
        counted = (
            f"reached the log {iso_utc(reclaim.arrived_ms)}, dated "
            f"{iso_utc(reclaim.issued_at_ms)} by the operator"
        )
    derivation = (
        f"notice given {duration(given)} ({counted}, effective "
        f"{iso_utc(reclaim.effective_at_ms)}) of {duration(required)} required → short "
        f"{duration(short)}; {taken_text}; ({duration(short)} + {duration(taken)}) × "
        f"{gpus(share)} = {gpu_hours_exact(mgms)} × "
        f"{money(terms.rate_per_gpu_hour_minor)}/GPU-h × penalty "
        f"{percent_bps(terms.reclaim_penalty_bps)} = {money.exact(numerator, denominator)}, "
        f"rounded down to {money(derived)} (SPEC §7.3)"
    )
    if reclaim.reason:
        derivation += f"; reason given: {reclaim.reason}"
    return [
        Line(
            key=f"reclaim:{reclaim.reclaim_id}",
            section="credits",
            label=f"Reclaim credit ({duration(given)} notice of {duration(required)})",
            quantity=duration(short + taken),
            unit="",
            amount_minor=totals.reclaim_credit_minor,
            amount=format_minor(totals.reclaim_credit_minor, terms.currency_scale),
            payer="operator",
            payee="buyer",
            derivation=derivation,
            signers=list(reclaim.signers),
        )
    ]


def _release(facts: BillFacts, totals: Totals, money: _Money, checks: list[str]) -> list[Line]:
    """SPEC §7.9: the release charge K, billed once."""
    release = facts.release
    if release is None:
        _check(checks, "release charge", 0, totals.release_charge_minor)
        return []
    terms = facts.terms
    share = _share_total(terms)
    minimum_end = terms.window_start_ms + terms.minimum_duration_ms
    notice_end = release.notice_from_ms + terms.release_notice_ms
    owed_until = min(release.end_before_ms, max(minimum_end, notice_end))
    short = max(0, owed_until - release.end_ms)
    mgms = share * short
    numerator = mgms * terms.rate_per_gpu_hour_minor
    derived = numerator // MILLI_GPU_MS_PER_GPU_HOUR
    _check(checks, "release charge", derived, totals.release_charge_minor)
    if release.arrived_ms is None:
        counted = f"issued {iso_utc(release.issued_at_ms)}"
    else:
        counted = (
            f"reached the log {iso_utc(release.arrived_ms)}, dated "
            f"{iso_utc(release.issued_at_ms)} by the buyer"
        )
    derivation = (
        f"released from {iso_utc(release.end_ms)} (asked for "
        f"{iso_utc(release.effective_at_ms)}; {counted}); owed until min(end before "
        f"{iso_utc(release.end_before_ms)}, max(minimum duration end {iso_utc(minimum_end)}, "
        f"notice {duration(terms.release_notice_ms)} after arrival {iso_utc(notice_end)})) = "
        f"{iso_utc(owed_until)}; {duration(short)} × {gpus(share)} = {gpu_hours_exact(mgms)} "
        f"× {money(terms.rate_per_gpu_hour_minor)}/GPU-h = "
        f"{money.exact(numerator, MILLI_GPU_MS_PER_GPU_HOUR)}, rounded down to "
        f"{money(derived)} (SPEC §7.9)"
    )
    if release.reason:
        derivation += f"; reason given: {release.reason}"
    return [
        Line(
            key=f"release:{release.release_id}",
            section="charges",
            label=f"Release charge (released {duration(short)} before it was owed until)",
            quantity=duration(short),
            unit="",
            amount_minor=totals.release_charge_minor,
            amount=format_minor(totals.release_charge_minor, terms.currency_scale),
            payer="buyer",
            payee="operator",
            derivation=derivation,
            signers=list(release.signers),
        )
    ]


def _adjustments(facts: BillFacts, totals: Totals, money: _Money, checks: list[str]) -> list[Line]:
    terms = facts.terms
    lines: list[Line] = []
    credit = charge = 0
    for adj in facts.adjustments:
        is_credit = adj.direction == "credit"
        text = f"{adj.reason}" + (f" (reference {adj.reference})" if adj.reference else "")
        text += f"; issued {iso_utc(adj.issued_at_ms)}"
        if adj.accepted:
            if is_credit:
                credit += adj.amount_minor
            else:
                charge += adj.amount_minor
        else:
            text += f"; REJECTED {adj.reject_reason}: not counted"
        lines.append(
            Line(
                key=f"adjustment:{adj.adjustment_id}",
                section="credits" if is_credit else "charges",
                label=f"Adjustment {adj.adjustment_id} ({adj.direction})",
                amount_minor=adj.amount_minor if adj.accepted else 0,
                amount=format_minor(adj.amount_minor if adj.accepted else 0, terms.currency_scale),
                payer="" if not adj.accepted else "operator" if is_credit else "buyer",
                payee="" if not adj.accepted else "buyer" if is_credit else "operator",
                derivation=text,
                signers=list(adj.signers),
            )
        )
    if facts.adjustments_left_out:
        lines.append(
            Line(
                key="adjustments:left-out",
                section="credits",
                label=f"… {facts.adjustments_left_out} more adjustments",
                derivation="not listed one by one (a bill lists at most "
                f"{len(facts.adjustments)}); they count in the totals below",
            )
        )
        return lines
    _check(checks, "adjustment credits", credit, totals.adjustment_credit_minor)
    _check(checks, "adjustment charges", charge, totals.adjustment_charge_minor)
    return lines


def _settlement(
    terms: PlacementTerms, totals: Totals, money: _Money, checks: list[str], released: bool
) -> list[Line]:
    t = totals
    scale = terms.currency_scale
    claimed = t.reclaim_credit_minor + t.sla_credit_minor + t.adjustment_credit_minor
    ceiling = t.gross_minor + t.adjustment_charge_minor + t.release_charge_minor  # §7.9
    # SPEC §7.9: K beside the gross; shown only when the placement was released.
    k_sym = " + K" if released else ""
    k_val = f" + {money(t.release_charge_minor)}" if released else ""
    credits = min(claimed, ceiling)
    _check(checks, "credits", credits, t.credits_minor)
    net = ceiling - t.credits_minor
    _check(checks, "net", net, t.net_minor)
    fee = t.net_minor * terms.desk_fee_bps // MAX_BPS
    _check(checks, "desk fee", fee, t.fee_minor)
    if terms.fee_payer == "operator":
        owes, receives = t.net_minor, t.net_minor - t.fee_minor
        owes_text = f"N = {money(t.net_minor)} (the operator pays the desk fee)"
        receives_text = f"N − F = {money(t.net_minor)} − {money(t.fee_minor)}"
        fee_payer_text = "paid by the operator: deducted from what it receives"
    else:
        owes, receives = t.net_minor + t.fee_minor, t.net_minor
        owes_text = f"N + F = {money(t.net_minor)} + {money(t.fee_minor)}"
        receives_text = f"N = {money(t.net_minor)} (the buyer pays the desk fee)"
        fee_payer_text = "paid by the buyer: added to what it owes"
    _check(checks, "buyer owes", owes, t.buyer_owes_minor)
    _check(checks, "operator receives", receives, t.operator_receives_minor)
    _check(checks, "desk receives", t.fee_minor, t.desk_receives_minor)
    capped = " — capped at gross + charges" if claimed > ceiling else ""

    def line(
        key: str, label: str, amount: int, derivation: str, payer: str = "", payee: str = ""
    ) -> Line:
        return Line(
            key=key,
            section="settlement",
            label=label,
            amount_minor=amount,
            amount=format_minor(amount, scale),
            payer=payer,
            payee=payee,
            derivation=derivation,
        )

    return [
        line(
            "credits",
            "Credits",
            t.credits_minor,
            f"C = min(R + Q + Ac, G + Ah{k_sym}) = min({money(t.reclaim_credit_minor)} + "
            f"{money(t.sla_credit_minor)} + {money(t.adjustment_credit_minor)}, "
            f"{money(t.gross_minor)} + {money(t.adjustment_charge_minor)}{k_val}){capped} "
            "(SPEC §7.6)",
        ),
        line(
            "net",
            "Net",
            t.net_minor,
            f"N = G + Ah{k_sym} − C = {money(t.gross_minor)} + "
            f"{money(t.adjustment_charge_minor)}{k_val} − {money(t.credits_minor)}",
        ),
        line(
            "fee",
            "Desk fee",
            t.fee_minor,
            f"F = {percent_bps(terms.desk_fee_bps)} of net {money(t.net_minor)} = "
            f"{money.exact(t.net_minor * terms.desk_fee_bps, MAX_BPS)}, rounded down to "
            f"{money(fee)}; {fee_payer_text}",
            payer=terms.fee_payer,
            payee="desk",
        ),
        line("buyer_owes", "Buyer owes", t.buyer_owes_minor, owes_text, payer="buyer"),
        line(
            "operator_receives",
            "Operator receives",
            t.operator_receives_minor,
            receives_text,
            payee="operator",
        ),
        line(
            "desk_receives", "Desk receives", t.desk_receives_minor, "F, the desk fee", payee="desk"
        ),
    ]
