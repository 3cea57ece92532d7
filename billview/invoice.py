"""Invoices and credit notes from verified final statements (SPEC §11).

Pure: ``invoices(placements, profiles)`` arranges what the verifier established for each
placement (its final statement of each period, SPEC §8) into documents, one per payer,
payee, calendar month and kind. Everything a document holds follows from the signed
inputs alone (no clock, no file name), so any party that builds it from the same
placements gets the same number and the same bytes.

The flows of money (SPEC §7.6, §7.10), each its own document:

    buyer -> operator      N: gross per GPU model, release charge, credits, adjustments
    fee payer -> desk      F: the desk fee
    new buyer -> desk      G_k: GPU time bought on resale
    desk -> original buyer G_k - F_k: resale proceeds less the desk's resale fee

Period 0 of a placement is invoiced in the month of its last millisecond of service; a
later period (a change after the close) yields a credit note (the amount falls) or a
supplementary invoice (it rises) in the month its record reached the log, naming the
documents it corrects.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
from msgspec import Struct

from proto.limits import MAX_BPS, MILLI_GPU_MS_PER_GPU_HOUR
from proto.money import format_minor
from proto.records import PlacementTerms, ResaleTotals, Totals

INVOICE_FORMAT: Final = "gridledger-invoice/v1"
DAY_MS: Final = 86_400_000
# Fraction digits of a quantity in GPU-hours (rounded half up; the exact milli-GPU-ms
# are beside it).
QUANTITY_DECIMALS: Final = 6

UNTAXED: Final = "none agreed in the terms"
TAXED: Final = "at the rate each placement's terms agree (tax_bps), on its own line (SPEC §11.2)"

Kind = Literal["invoice", "credit_note", "supplementary_invoice"]
PREFIX: Final[dict[str, str]] = {
    "invoice": "INV",
    "credit_note": "CN",
    "supplementary_invoice": "SUP",
}


# --- what the verifier established (input) -------------------------------------------


@dataclass(frozen=True)
class FinalPeriod:
    """One statement period's final statement (SPEC §8), as the verifier checked it."""

    period: int
    through_index: int
    head: str
    arrived_ms: int  # when its last record reached the log (SPEC §6.6)
    totals: Totals
    resale: tuple[ResaleTotals, ...] = ()


@dataclass(frozen=True)
class VerifiedPlacement:
    """A placement of a FINAL export: its terms, its final periods in order, and what each
    GPU delivered (milli-GPU-ms; fixed at the close: SPEC §6.3 folds no usage after it)."""

    terms: PlacementTerms
    periods: tuple[FinalPeriod, ...]
    delivered_mgms: dict[str, int]
    service_end_ms: int  # the effective end (SPEC §7.5)
    assignments: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    """assignment id -> (GPUs sold, resale rate per GPU-hour)."""


# --- the document (output) -----------------------------------------------------------


class Profile(Struct, frozen=True, kw_only=True):
    """Who a party is on paper (SPEC §12); ``net_days`` 0: due on issue."""

    legal_name: str = ""
    address: list[str] = []
    tax_id: str = ""
    net_days: int = 0
    remit_to: str = ""


class PartyBlock(Struct, frozen=True, kw_only=True):
    """A party as a document names it: its id in the terms and its signed profile."""

    id: str
    profile: Profile | None = None


class GpuCharge(Struct, frozen=True, kw_only=True):
    """One GPU's part of a usage line (SPEC §11.3)."""

    uuid: str
    delivered_mgms: int
    amount_minor: int


class InvoiceLine(Struct, frozen=True, kw_only=True):
    """One line: what, how much of it at what price, the amount, and its placement."""

    placement_id: str
    period: int
    kind: str  # usage, release, reclaim_credit, sla_credit, ... (SPEC §11.3)
    description: str
    sku: str = ""
    quantity: str = ""
    quantity_mgms: int | None = None
    unit: str = ""
    unit_price: str = ""
    currency: str
    currency_scale: int
    amount_minor: int
    amount: str
    gpus: list[GpuCharge] = []
    charge_start_ms: int
    charge_end_ms: int


class Covered(Struct, frozen=True, kw_only=True):
    """A final statement a document covers, and what was invoiced for it before."""

    placement_id: str
    period: int
    through_index: int
    head: str
    previously_invoiced_minor: int
    this_document_minor: int
    currency: str
    currency_scale: int


class Amount(Struct, frozen=True, kw_only=True):
    currency: str
    currency_scale: int
    subtotal_minor: int
    tax_minor: int
    total_minor: int
    total: str


class Invoice(Struct, frozen=True, kw_only=True):
    """One invoice or credit note (``gridledger-invoice/v1``)."""

    format: str = INVOICE_FORMAT
    number: str
    kind: Kind
    month: str
    issue_date: str
    due_date: str
    payer: PartyBlock
    payee: PartyBlock
    billing_period_start_ms: int
    billing_period_end_ms: int
    lines: list[InvoiceLine]
    amounts: list[Amount]
    covers: list[Covered]
    corrects: list[str] = []
    tax: str = ""
    basis: str = (
        "Built from exports that gridledger verify judged FINAL; amounts are the final "
        "statements' own figures (SPEC §7, §8), split into lines as SPEC §11 says."
    )


def encode(doc: Invoice) -> bytes:
    """The JSON bytes of a document (stable field order; what parties compare)."""
    return msgspec.json.encode(doc)


def decode(raw: bytes) -> Invoice:
    return msgspec.json.decode(raw, type=Invoice)


# --- arithmetic ------------------------------------------------------------------------


def split(amount_minor: int, weights: Sequence[tuple[str, int]]) -> dict[str, int]:
    """``amount_minor`` over ``weights`` by largest remainder (SPEC §11.3): each key gets
    ``floor(amount × w / W)``, and the units left go one each to the largest remainders
    (ties: the smaller key). The parts sum to ``amount_minor`` exactly."""
    total = sum(w for _, w in weights)
    if amount_minor == 0:
        return {k: 0 for k, _ in weights}
    if total <= 0:  # nothing delivered yet something charged: all on the first key
        return {k: 0 for k, _ in weights} | _all_to_first(amount_minor, weights)
    sign = -1 if amount_minor < 0 else 1
    magnitude = abs(amount_minor)
    parts = {k: magnitude * w // total for k, w in weights}
    left = magnitude - sum(parts.values())
    order = sorted(weights, key=lambda kw: (-(magnitude * kw[1] % total), kw[0]))
    for k, _ in order[:left]:
        parts[k] += 1
    return {k: sign * v for k, v in parts.items()}


def _all_to_first(amount_minor: int, weights: Sequence[tuple[str, int]]) -> dict[str, int]:
    keys = sorted(k for k, _ in weights)
    if not keys:
        raise ValueError(f"no weights to split {amount_minor} over")
    return {keys[0]: amount_minor}


def gpu_hours(milli_gpu_ms: int) -> str:
    """Milli-GPU-ms as GPU-hours, ``QUANTITY_DECIMALS`` places, half up; exact integers."""
    scale = 10**QUANTITY_DECIMALS
    sign = "-" if milli_gpu_ms < 0 else ""
    scaled = (abs(milli_gpu_ms) * scale * 2 + MILLI_GPU_MS_PER_GPU_HOUR) // (
        2 * MILLI_GPU_MS_PER_GPU_HOUR
    )
    return sign + format_minor(scaled, QUANTITY_DECIMALS)


def month_of(ms: int) -> str:
    """``YYYY-MM`` of an epoch-ms instant, UTC."""
    return datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC).strftime("%Y-%m")


def month_bounds(month: str) -> tuple[int, int]:
    """``[first ms, first ms of the next month)`` of ``YYYY-MM``."""
    year, mon = (int(p) for p in month.split("-"))
    start = datetime.datetime(year, mon, 1, tzinfo=datetime.UTC)
    end = datetime.datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=datetime.UTC)
    return int(start.timestamp()) * 1000, int(end.timestamp()) * 1000


def date_of(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC).strftime("%Y-%m-%d")


# --- lines per flow --------------------------------------------------------------------

ZERO: Final = Totals(
    delivered_mgms=0, billable_mgms=0, gross_minor=0, reclaim_credit_minor=0,
    sla_credit_minor=0, adjustment_credit_minor=0, adjustment_charge_minor=0,
    credits_minor=0, net_minor=0, fee_minor=0, buyer_owes_minor=0,
    operator_receives_minor=0, desk_receives_minor=0,
)  # fmt: skip


@dataclass
class _Flow:
    """Lines of one (payer, payee) for one placement period, and their sum."""

    payer: str
    payee: str
    lines: list[InvoiceLine]

    @property
    def amount_minor(self) -> int:
        return sum(line.amount_minor for line in self.lines)


class _Liner:
    """Builds the lines of one placement period."""

    def __init__(self, placed: VerifiedPlacement, period: FinalPeriod) -> None:
        self.placed = placed
        self.terms = placed.terms
        self.period = period
        self.start_ms = self.terms.window_start_ms
        self.end_ms = max(self.start_ms, placed.service_end_ms)

    def line(self, kind: str, description: str, amount_minor: int, **more: Any) -> InvoiceLine:
        terms = self.terms
        return InvoiceLine(
            placement_id=terms.placement_id,
            period=self.period.period,
            kind=kind,
            description=description,
            currency=terms.currency,
            currency_scale=terms.currency_scale,
            amount_minor=amount_minor,
            amount=format_minor(amount_minor, terms.currency_scale),
            charge_start_ms=self.start_ms,
            charge_end_ms=self.end_ms,
            **more,
        )

    def tax_line(self, tax_minor: int, base_minor: int) -> InvoiceLine:
        """SPEC §11.2: the terms' tax rate on this flow (the change, in a later period)."""
        terms = self.terms
        base = format_minor(base_minor, terms.currency_scale)
        return self.line(
            "tax", f"Tax {format_minor(terms.tax_bps, 2)} % of {base} {terms.currency}", tax_minor
        )

    def price(self, minor: int) -> str:
        return f"{format_minor(minor, self.terms.currency_scale)} / GPU-h"

    def usage(self, gross_minor: int) -> list[InvoiceLine]:
        """The gross split over the GPUs by delivered time, grouped by model (§11.3)."""
        terms = self.terms
        delivered = self.placed.delivered_mgms
        weights = [(g.uuid, delivered.get(g.uuid, 0)) for g in terms.gpus]
        parts = split(gross_minor, weights)
        lines = []
        for model in sorted({g.model for g in terms.gpus}):
            gpus = [g for g in terms.gpus if g.model == model]
            charges = [
                GpuCharge(uuid=g.uuid, delivered_mgms=delivered.get(g.uuid, 0),
                          amount_minor=parts[g.uuid])
                for g in sorted(gpus, key=lambda g: g.uuid)
            ]  # fmt: skip
            mgms = sum(c.delivered_mgms for c in charges)
            lines.append(
                self.line(
                    "usage",
                    f"GPU time, {model} ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})",
                    sum(c.amount_minor for c in charges),
                    sku=model,
                    quantity=gpu_hours(mgms),
                    quantity_mgms=mgms,
                    unit="GPU-h",
                    unit_price=self.price(terms.rate_per_gpu_hour_minor),
                    gpus=charges,
                )
            )
        return lines

    def operator_flow(self, before: Totals) -> _Flow:
        """buyer -> operator: N (SPEC §7.6) as its parts; a later period: the change."""
        t, terms = self.period.totals, self.terms
        lines: list[InvoiceLine] = []
        gross = t.gross_minor - before.gross_minor
        if self.period.period == 0:
            lines += self.usage(gross)
        elif gross:
            lines.append(self.line("usage", "GPU time, change after the close", gross))
        claimed_now = t.reclaim_credit_minor + t.sla_credit_minor + t.adjustment_credit_minor
        claimed_before = (
            before.reclaim_credit_minor + before.sla_credit_minor + before.adjustment_credit_minor
        )
        cap = (claimed_now - t.credits_minor) - (claimed_before - before.credits_minor)

        def change(name: str) -> int:
            return int(getattr(t, name)) - int(getattr(before, name))

        parts = (
            ("release", "Release charge (SPEC §7.9)", change("release_charge_minor")),
            ("adjustment_charge", "Adjustment charges (SPEC §7.4)",
             change("adjustment_charge_minor")),
            ("reclaim_credit", "Reclaim credit (SPEC §7.3)", -change("reclaim_credit_minor")),
            ("sla_credit", "SLA credit (SPEC §7.5)", -change("sla_credit_minor")),
            ("adjustment_credit", "Adjustment credits (SPEC §7.4)",
             -change("adjustment_credit_minor")),
            ("credit_cap", "Credits above gross + charges, not given (SPEC §7.6)", cap),
        )  # fmt: skip
        lines += [self.line(kind, text, amount) for kind, text, amount in parts if amount]
        flow = _Flow(terms.buyer.id, terms.operator.id, lines)
        expected = t.net_minor - before.net_minor
        if flow.amount_minor != expected:
            raise ValueError(
                f"{terms.placement_id} period {self.period.period}: lines sum to "
                f"{flow.amount_minor}, the statements' net changes by {expected}"
            )
        return flow

    def fee_flow(self, before: Totals) -> _Flow:
        """fee payer -> desk: F (SPEC §7.6)."""
        t, terms = self.period.totals, self.terms
        payer = terms.operator.id if terms.fee_payer == "operator" else terms.buyer.id
        fee = t.fee_minor - before.fee_minor
        text = (
            f"Desk fee, {format_minor(terms.desk_fee_bps, 2)} % of net "
            f"{format_minor(t.net_minor, terms.currency_scale)} {terms.currency}"
            + (
                ""
                if self.period.period == 0
                else f" (was {format_minor(before.net_minor, terms.currency_scale)})"
            )
        )
        return _Flow(payer, terms.desk.id, [self.line("desk_fee", text, fee)] if fee else [])

    def resale_flows(self, before: dict[str, ResaleTotals]) -> list[_Flow]:
        """SPEC §7.10: new buyer -> desk G_k; desk -> original buyer G_k − F_k."""
        terms, flows = self.terms, []
        for entry in self.period.resale:
            prior = before.get(entry.assignment_id)
            gross = entry.gross_minor - (0 if prior is None else prior.gross_minor)
            fee = entry.fee_minor - (0 if prior is None else prior.fee_minor)
            mgms = entry.billable_mgms - (0 if prior is None else prior.billable_mgms)
            gpus, rate = self.placed.assignments.get(entry.assignment_id, ((), 0))
            sold = ", ".join(gpus) or "?"
            bought = self.line(
                "resale", f"GPU time bought on resale {entry.assignment_id} ({sold})", gross,
                quantity=gpu_hours(mgms), quantity_mgms=mgms, unit="GPU-h",
                unit_price=self.price(rate),
            )  # fmt: skip
            flows.append(_Flow(entry.new_buyer, terms.desk.id, [bought] if gross else []))
            proceeds = [
                self.line("resale_proceeds",
                          f"Resale {entry.assignment_id} to {entry.new_buyer}", gross),
                self.line("resale_fee", f"Desk fee on resale {entry.assignment_id} "
                          f"({format_minor(terms.desk_fee_bps, 2)} %)", -fee),
            ]  # fmt: skip
            flows.append(
                _Flow(terms.desk.id, terms.buyer.id, [p for p in proceeds if p.amount_minor])
            )
        return flows


# --- documents ---------------------------------------------------------------------------


@dataclass
class _Group:
    kind_hint: str  # "original" | "correction"
    month: str
    payer: str
    payee: str
    lines: list[InvoiceLine] = field(default_factory=list)
    covers: list[Covered] = field(default_factory=list)
    latest_ms: int = 0


def _billing_month(placed: VerifiedPlacement, period: FinalPeriod) -> str:
    if period.period == 0:
        return month_of(max(placed.terms.window_start_ms, placed.service_end_ms - 1))
    return month_of(max(period.arrived_ms, placed.service_end_ms - 1))  # 0: not recorded


def invoices(
    placements: Iterable[VerifiedPlacement],
    profiles: dict[str, Profile] | None = None,
    month: str | None = None,
) -> list[Invoice]:
    """Every document of ``placements`` (of ``month`` only, when given), by number."""
    groups: dict[tuple[str, str, str, str], _Group] = {}
    for placed in sorted(placements, key=lambda p: p.terms.placement_id):
        for period, flow, before_minor in placement_flows(placed):
            hint = "original" if period.period == 0 else "correction"
            billing = _billing_month(placed, period)
            key = (hint, billing, flow.payer, flow.payee)
            group = groups.setdefault(key, _Group(hint, billing, flow.payer, flow.payee))
            group.lines += flow.lines
            group.latest_ms = max(group.latest_ms, period.arrived_ms)
            group.covers.append(
                Covered(
                    placement_id=placed.terms.placement_id,
                    period=period.period,
                    through_index=period.through_index,
                    head=period.head,
                    previously_invoiced_minor=before_minor,
                    this_document_minor=flow.amount_minor,
                    currency=placed.terms.currency,
                    currency_scale=placed.terms.currency_scale,
                )
            )
    docs = [_document(g, profiles or {}) for g in groups.values()]
    originals = {
        (c.placement_id, d.payer.id, d.payee.id): d.number
        for d in docs if d.kind == "invoice" for c in d.covers
    }  # fmt: skip
    docs = [d if d.kind == "invoice" else _with_corrects(d, originals) for d in docs]
    if month is not None:
        docs = [d for d in docs if d.month == month]
    return sorted(docs, key=lambda d: d.number)


def _with_corrects(doc: Invoice, originals: dict[tuple[str, str, str], str]) -> Invoice:
    """A correction names the invoices of the placements it corrects (same payer, payee)."""
    keys = {(c.placement_id, doc.payer.id, doc.payee.id) for c in doc.covers}
    return msgspec.structs.replace(
        doc, corrects=sorted(originals[k] for k in keys if k in originals)
    )


def tax_on(amount_minor: int, tax_bps: int) -> int:
    """SPEC §11.2: ``floor(amount × tax_bps / 10 000)`` of a cumulative flow (≥ 0)."""
    return amount_minor * tax_bps // MAX_BPS


def placement_flows(placed: VerifiedPlacement) -> list[tuple[FinalPeriod, _Flow, int]]:
    """Each period's non-empty flows, with its tax line (the change of the tax on the
    cumulative flow, SPEC §11.2), and what earlier periods put on documents of that payer
    and payee (tax included)."""
    out: list[tuple[FinalPeriod, _Flow, int]] = []
    cumulative: dict[tuple[str, str], int] = {}  # (payer, payee) -> untaxed, so far
    invoiced: dict[tuple[str, str], int] = {}  # (payer, payee) -> with tax, so far
    before, resale_before = ZERO, dict[str, ResaleTotals]()
    rate = placed.terms.tax_bps
    for period in placed.periods:
        liner = _Liner(placed, period)
        flows = [liner.operator_flow(before), liner.fee_flow(before)]
        flows += liner.resale_flows(resale_before)
        for flow in flows:
            pair = (flow.payer, flow.payee)
            was = cumulative.get(pair, 0)
            now = was + flow.amount_minor
            cumulative[pair] = now
            tax = tax_on(now, rate) - tax_on(was, rate)
            if tax:
                flow.lines.append(liner.tax_line(tax, now))
            if flow.lines:
                out.append((period, flow, invoiced.get(pair, 0)))
                invoiced[pair] = invoiced.get(pair, 0) + flow.amount_minor
        before = period.totals
        resale_before = {r.assignment_id: r for r in period.resale}
    return out


def document_number(kind: str, month: str, payer: str, payee: str, heads: Sequence[str]) -> str:
    """SPEC §11.2: the number of a document from what it covers (``heads``: each
    ``placement_id:period:head``)."""
    text = "\n".join([INVOICE_FORMAT, kind, month, payer, payee, *sorted(heads)])
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{PREFIX[kind]}-{month.replace('-', '')}-{digest[:12].upper()}"


def _document(group: _Group, profiles: dict[str, Profile]) -> Invoice:
    by_currency: dict[tuple[str, int], tuple[int, int]] = {}  # (subtotal, tax)
    for line in group.lines:
        key = (line.currency, line.currency_scale)
        subtotal, tax = by_currency.get(key, (0, 0))
        if line.kind == "tax":
            tax += line.amount_minor
        else:
            subtotal += line.amount_minor
        by_currency[key] = (subtotal, tax)
    taxed = any(t for _, t in by_currency.values())
    kind: Kind
    if group.kind_hint == "original":
        kind = "invoice"
    else:
        totals = [a + t for a, t in by_currency.values()]
        credit = all(x <= 0 for x in totals) and any(x < 0 for x in totals)
        kind = "credit_note" if credit else "supplementary_invoice"
    heads = [f"{c.placement_id}:{c.period}:{c.head}" for c in group.covers]
    number = document_number(kind, group.month, group.payer, group.payee, heads)
    start_ms, end_ms = month_bounds(group.month)
    issue_ms = max(end_ms, group.latest_ms)
    payee = profiles.get(group.payee)
    net_days = 0 if payee is None else payee.net_days
    return Invoice(
        number=number,
        kind=kind,
        month=group.month,
        issue_date=date_of(issue_ms),
        due_date=date_of(issue_ms + net_days * DAY_MS),
        payer=PartyBlock(id=group.payer, profile=profiles.get(group.payer)),
        payee=PartyBlock(id=group.payee, profile=payee),
        billing_period_start_ms=start_ms,
        billing_period_end_ms=end_ms,
        lines=group.lines,
        amounts=[
            Amount(
                currency=currency,
                currency_scale=scale,
                subtotal_minor=subtotal,
                tax_minor=tax,
                total_minor=subtotal + tax,
                total=format_minor(subtotal + tax, scale),
            )
            for (currency, scale), (subtotal, tax) in sorted(by_currency.items())
        ],
        tax=TAXED if taxed else UNTAXED,
        covers=sorted(group.covers, key=lambda c: (c.placement_id, c.period)),
    )
