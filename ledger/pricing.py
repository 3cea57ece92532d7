"""Pricing (SPEC.md §7): cumulative totals from what was delivered and agreed.

Pure integer arithmetic on cumulative values; rounding happens once per total, and a
line item is the difference of two consecutive totals.
"""

from __future__ import annotations

from proto.limits import MAX_BPS, MILLI_GPU_MS_PER_GPU_HOUR
from proto.records import PlacementTerms, ResaleTotals, Totals
from proto.terms import total_share_milli

ZERO_TOTALS = Totals(
    delivered_mgms=0,
    billable_mgms=0,
    gross_minor=0,
    reclaim_credit_minor=0,
    sla_credit_minor=0,
    adjustment_credit_minor=0,
    adjustment_charge_minor=0,
    credits_minor=0,
    net_minor=0,
    fee_minor=0,
    buyer_owes_minor=0,
    operator_receives_minor=0,
    desk_receives_minor=0,
)


def overlap_ms(start_ms: int, end_ms: int, lo_ms: int, hi_ms: int) -> int:
    """Length of [start, end) ∩ [lo, hi)."""
    return max(0, min(end_ms, hi_ms) - max(start_ms, lo_ms))


def billable_mgms(terms: PlacementTerms, delivered_mgms: int) -> int:
    """B: delivered rounded up to whole billing increments (SPEC §7.2)."""
    unit = terms.increment_ms * 1000
    return -(-delivered_mgms // unit) * unit


def gross_minor(terms: PlacementTerms, billable: int) -> int:
    """G: billable milli-GPU-ms at the GPU-hour rate, rounded down (SPEC §7.2)."""
    return billable * terms.rate_per_gpu_hour_minor // MILLI_GPU_MS_PER_GPU_HOUR


def reclaim_credit_minor(
    terms: PlacementTerms,
    notice_from_ms: int,
    effective_at_ms: int,
    released_end_ms: int | None = None,
) -> int:
    """R: the credit owed for a reclaim with short notice or a taken window (SPEC §7.3).

    ``notice_from_ms``: the reclaim's arrival (SPEC §6.6; its ``issued_at_ms`` only for an
    untimed record). A reclaim that arrived after it took effect gave no notice.
    ``released_end_ms``: the end e of a release accepted before the reclaim (SPEC §7.9):
    the time taken counts only up to it.
    """
    notice_given = max(0, effective_at_ms - notice_from_ms)
    short = max(0, terms.reclaim_notice_ms - notice_given)
    held_until = terms.window_end_ms
    owed = terms.window_start_ms + terms.minimum_duration_ms
    if released_end_ms is not None:
        held_until = min(held_until, released_end_ms)
        owed = min(owed, released_end_ms)
    if not terms.interruptible:
        taken = held_until - effective_at_ms
    else:
        taken = max(0, owed - effective_at_ms)
    numerator = (
        total_share_milli(terms)
        * (short + taken)
        * terms.rate_per_gpu_hour_minor
        * terms.reclaim_penalty_bps
    )
    return numerator // (MILLI_GPU_MS_PER_GPU_HOUR * MAX_BPS)


def resale_entry(
    terms: PlacementTerms,
    assignment_id: str,
    new_buyer_id: str,
    rate_per_gpu_hour_minor: int,
    delivered_mgms: int,
) -> ResaleTotals:
    """One assignment's resale figures from its cumulative D_k (SPEC §7.10): billable as
    §7.2, gross at the resale rate, the desk's fee on it at the terms' desk_fee_bps."""
    billable = billable_mgms(terms, delivered_mgms)
    gross = billable * rate_per_gpu_hour_minor // MILLI_GPU_MS_PER_GPU_HOUR
    return ResaleTotals(
        assignment_id=assignment_id,
        new_buyer=new_buyer_id,
        delivered_mgms=delivered_mgms,
        billable_mgms=billable,
        gross_minor=gross,
        fee_minor=gross * terms.desk_fee_bps // MAX_BPS,
    )


def release_charge_minor(
    terms: PlacementTerms, arrived_ms: int, release_end_ms: int, end_before_ms: int
) -> int:
    """K: the minimum-duration and notice shortfall of a buyer release (SPEC §7.9).

    ``arrived_ms``: the release's arrival (its ``issued_at_ms`` when untimed);
    ``release_end_ms``: e (SPEC §6.7 step 4); ``end_before_ms``: the effective end just
    before the release (the window end, or an accepted reclaim's effective time).
    """
    owed_until = min(
        end_before_ms,
        max(
            terms.window_start_ms + terms.minimum_duration_ms,
            arrived_ms + terms.release_notice_ms,
        ),
    )
    short = max(0, owed_until - release_end_ms)
    numerator = total_share_milli(terms) * short * terms.rate_per_gpu_hour_minor
    return numerator // MILLI_GPU_MS_PER_GPU_HOUR


def availability_bps(terms: PlacementTerms, delivered_mgms: int, effective_end_ms: int) -> int:
    """Delivered as a share of what was owed, in basis points (SPEC §7.5)."""
    owed_ms = effective_end_ms - terms.window_start_ms
    if owed_ms <= 0:
        return MAX_BPS
    return MAX_BPS * delivered_mgms // (total_share_milli(terms) * owed_ms)


def sla_credit_minor(
    terms: PlacementTerms, delivered_mgms: int, gross: int, effective_end_ms: int
) -> int:
    """Q: fixed at the close; a share of gross when availability missed the target."""
    if (
        availability_bps(terms, delivered_mgms, effective_end_ms)
        < terms.sla_availability_target_bps
    ):
        return gross * terms.sla_credit_bps // MAX_BPS
    return 0


def price(
    terms: PlacementTerms,
    *,
    delivered_mgms: int,
    reclaim_credit: int,
    sla_credit: int,
    adjustment_credit: int,
    adjustment_charge: int,
    release_charge: int = 0,
) -> Totals:
    """Every cumulative total from the cumulative inputs (SPEC §7.2, §7.6, §7.9).

    Once per accepted usage event: ``billable_mgms`` and ``gross_minor`` written out, and
    the Totals built positionally (the same values)."""
    unit = terms.increment_ms * 1000
    billable = -(-delivered_mgms // unit) * unit  # billable_mgms
    gross = billable * terms.rate_per_gpu_hour_minor // MILLI_GPU_MS_PER_GPU_HOUR  # gross_minor
    owed = gross + adjustment_charge + release_charge
    credits = min(reclaim_credit + sla_credit + adjustment_credit, owed)
    net = owed - credits
    fee = net * terms.desk_fee_bps // MAX_BPS
    if terms.fee_payer == "operator":
        buyer_owes, operator_receives = net, net - fee
    else:
        buyer_owes, operator_receives = net + fee, net
    return Totals(
        delivered_mgms,
        billable,
        gross,
        reclaim_credit,  # reclaim_credit_minor
        sla_credit,  # sla_credit_minor
        adjustment_credit,  # adjustment_credit_minor
        adjustment_charge,  # adjustment_charge_minor
        credits,  # credits_minor
        net,  # net_minor
        fee,  # fee_minor
        buyer_owes,  # buyer_owes_minor
        operator_receives,  # operator_receives_minor
        fee,  # desk_receives_minor
        release_charge,  # release_charge_minor
    )
