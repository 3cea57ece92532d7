"""An invoice or credit note as a print-ready HTML page (A4, no script, no external
resource). Everything shown comes from the ``Invoice`` document; the page adds nothing."""

from __future__ import annotations

import html
from typing import Final

from billview.invoice import Invoice, PartyBlock
from billview.units import iso_utc
from proto.money import format_minor

TITLES: Final = {
    "invoice": "Invoice",
    "credit_note": "Credit note",
    "supplementary_invoice": "Supplementary invoice",
}

_CSS: Final = """
@page { size: A4; margin: 14mm; }
body { font-family: "DejaVu Sans", Arial, sans-serif; font-size: 10pt; color: #111;
       max-width: 190mm; margin: 0 auto; }
h1 { font-size: 18pt; margin: 0 0 2mm 0; }
.head { display: flex; justify-content: space-between; gap: 8mm; }
.parties { display: flex; gap: 10mm; margin: 6mm 0; }
.party { flex: 1; border-top: 2px solid #333; padding-top: 2mm; }
.party h2 { font-size: 9pt; text-transform: uppercase; color: #555; margin: 0 0 1mm 0; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { border-bottom: 1px solid #ccc; padding: 1.5mm 1mm; vertical-align: top;
         overflow-wrap: anywhere; }
th { text-align: left; background: #f0f0f0; font-size: 8.5pt; }
td.num, th.num { text-align: right; }
.due { font-size: 14pt; font-weight: bold; margin: 4mm 0; white-space: nowrap; }
.meta td { border: none; padding: 0.5mm 2mm 0.5mm 0; }
.small { font-size: 8pt; color: #444; }
code { font-size: 7.5pt; overflow-wrap: anywhere; }
@media print { th { background: #eee !important; -webkit-print-color-adjust: exact; } }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _party(role: str, party: PartyBlock) -> str:
    rows = [f'<h2>{_e(role)}</h2><div data-party="{_e(role)}">']
    profile = party.profile
    if profile is None:
        rows.append(f"<b>{_e(party.id)}</b><br><span class=small>no signed profile given</span>")
    else:
        rows.append(f"<b>{_e(profile.legal_name or party.id)}</b> ({_e(party.id)})")
        rows += [f"<br>{_e(line)}" for line in profile.address]
        if profile.tax_id:
            rows.append(f"<br>Tax id: {_e(profile.tax_id)}")
        if profile.remit_to:
            rows.append(f"<br>Remit to: {_e(profile.remit_to)}")
    rows.append("</div>")
    return "".join(rows)


def to_html(doc: Invoice) -> str:
    """The page of one document."""
    title = f"{TITLES.get(doc.kind, doc.kind)} {doc.number}"
    payee_terms = doc.payee.profile
    net = (
        "due on issue (no payment terms in a signed profile)"
        if payee_terms is None or payee_terms.net_days == 0
        else f"net {payee_terms.net_days} days"
    )
    totals = "".join(
        f"<div class=due>{'Credit to the payer' if a.total_minor < 0 else 'Amount due'}: "
        f'<span data-total="{_e(a.currency)}">'
        f"{_e(format_minor(abs(a.total_minor), a.currency_scale))} {_e(a.currency)}</span></div>"
        for a in doc.amounts
    )
    lines = "".join(
        "<tr>"
        f"<td>{_e(line.placement_id)}<br><span class=small>period {line.period}</span></td>"
        f"<td>{_e(line.description)}<br><span class=small>{_e(iso_utc(line.charge_start_ms))}"
        f" – {_e(iso_utc(line.charge_end_ms))}</span></td>"
        f"<td>{_e(line.sku)}</td>"
        f"<td class=num>{_e(line.quantity)}<br>{_e(line.unit)}</td>"
        f"<td class=num>{_e(line.unit_price)}</td>"
        f'<td class=num data-amount="{line.amount_minor}">'
        f"{_e(line.amount)} {_e(line.currency)}</td>"
        "</tr>"
        for line in doc.lines
    )
    sums = "".join(
        f"<tr><td colspan=5 class=num>Subtotal</td><td class=num>"
        f"{_e(format_minor(a.subtotal_minor, a.currency_scale))} {_e(a.currency)}</td></tr>"
        f"<tr><td colspan=5 class=num>Tax</td><td class=num data-tax>"
        f"{_e(format_minor(a.tax_minor, a.currency_scale))} {_e(a.currency)}</td></tr>"
        f"<tr><td colspan=5 class=num><b>Total</b></td><td class=num><b>{_e(a.total)} "
        f"{_e(a.currency)}</b></td></tr>"
        for a in doc.amounts
    )
    covers = "".join(
        f"<tr><td>{_e(c.placement_id)}</td><td class=num>{c.period}</td>"
        f"<td class=num>{c.through_index}</td><td><code>{_e(c.head)}</code></td>"
        f"<td class=num>{_e(format_minor(c.previously_invoiced_minor, c.currency_scale))}</td>"
        f"<td class=num>{_e(format_minor(c.this_document_minor, c.currency_scale))}</td></tr>"
        for c in doc.covers
    )
    corrects = f"<p>Corrects: {', '.join(_e(n) for n in doc.corrects)}</p>" if doc.corrects else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{_CSS}</style></head><body>
<div class=head><div><h1 data-kind="{_e(doc.kind)}">{_e(title)}</h1>
<table class=meta>
<tr><td>Number</td><td data-number>{_e(doc.number)}</td></tr>
<tr><td>Issue date</td><td>{_e(doc.issue_date)}</td></tr>
<tr><td>Due date</td><td data-due>{_e(doc.due_date)} ({_e(net)})</td></tr>
<tr><td>Billing period</td><td>{_e(doc.month)} ({_e(iso_utc(doc.billing_period_start_ms))}
 to {_e(iso_utc(doc.billing_period_end_ms))})</td></tr>
</table></div><div>{totals}</div></div>
{corrects}
<div class=parties><div class=party>{_party("from (payee)", doc.payee)}</div>
<div class=party>{_party("to (payer)", doc.payer)}</div></div>
<table><colgroup><col style="width:12%"><col style="width:34%"><col style="width:13%">
<col style="width:13%"><col style="width:14%"><col style="width:14%"></colgroup>
<tr><th>Placement</th><th>Description</th><th>SKU</th><th class=num>Quantity</th>
<th class=num>Unit price</th><th class=num>Amount</th></tr>
{lines}
{sums}
</table>
<p>Tax: {_e(doc.tax)}.</p>
<h3>Statements covered</h3>
<table class=small><colgroup><col style="width:12%"><col style="width:8%"><col style="width:9%">
<col style="width:45%"><col style="width:13%"><col style="width:13%"></colgroup>
<tr><th>Placement</th><th class=num>Period</th><th class=num>Through</th><th>Head</th>
<th class=num>Invoiced before</th><th class=num>This document</th></tr>
{covers}
</table>
<p class=small>{_e(doc.basis)}</p>
</body></html>
"""
