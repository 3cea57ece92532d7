"""A bill's forms: a printable HTML page per party, CSV and JSON line items, plain text.

Every party sees the same lines; the page for a party leads with what that party pays or
receives and marks each line it pays or receives. No script, no external resource: the
page opens from a file as well as from the ledger's API, and prints as it shows.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Sequence
from typing import Final

import msgspec

from billview.doc import BillDoc, Line, encode
from billview.facts import PARTY_ROLES
from billview.timeline import COLORS, STATE_LABELS, STATES, timeline_svg
from billview.units import duration, format_minor, iso_utc
from proto.limits import MAX_ATTESTATION_VALIDITY_MS

CSV_COLUMNS: Final = (
    "placement_id",
    "period",
    "through_index",
    "final",
    "key",
    "section",
    "label",
    "quantity",
    "unit",
    "amount_minor",
    "amount",
    "currency",
    "payer",
    "payee",
    "derivation",
    "signers",
)

_PARTY_AMOUNT: Final = {
    "buyer": ("buyer_owes_minor", "owes"),
    "operator": ("operator_receives_minor", "receives"),
    "desk": ("desk_receives_minor", "receives"),
}


def to_json(doc: BillDoc) -> bytes:
    """The bill as JSON (``gridledger-bill/v1``)."""
    return encode(doc) + b"\n"


def to_csv(doc: BillDoc) -> str:
    """One row per line item, for accounting systems (amounts in minor units and text)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for line in doc.lines:
        writer.writerow(
            (
                doc.placement_id,
                doc.statement.period,
                doc.statement.through_index,
                "true" if doc.statement.final else "false",
                line.key,
                line.section,
                line.label,
                line.quantity,
                line.unit,
                "" if line.amount_minor is None else line.amount_minor,
                line.amount,
                doc.currency if line.amount_minor is not None else "",
                line.payer,
                line.payee,
                line.derivation,
                "; ".join(line.signers),
            )
        )
    return out.getvalue()


def to_text(doc: BillDoc) -> str:
    """The bill for a terminal (``gridledger ledger statement``): one line per item, its
    derivation indented beneath."""
    money = doc.currency
    rows = [
        f"placement         {doc.placement_id}",
        f"statement         through record {doc.statement.through_index} of "
        f"{doc.record_count}, period {doc.statement.period}, "
        + ("final" if doc.statement.final else "not final (placement open)"),
        f"head              {doc.statement.head}",
        f"status            {doc.verdict.level} ({doc.verdict.by})",
    ]
    rows += [f"  {reason}" for reason in doc.verdict.reasons]
    # One column of amounts: as wide as the longest label (a resale's names run long).
    width = max([44, *(min(len(line.label), 72) for line in doc.lines)])
    section = ""
    for line in doc.lines:
        if line.section != section:
            section = line.section
            rows.append(f"-- {section}")
        value = (
            f"{line.amount} {money}"
            if line.amount_minor is not None
            else f"{line.quantity} {line.unit}".rstrip()
        )
        rows.append(f"{line.label:<{width}} {value:>16}")
        if line.derivation:
            rows.append(f"    {line.derivation}")
        if line.signers:
            rows.append(f"    signed by {', '.join(line.signers)}")
    for check in doc.checks:
        rows.append(f"CHECK: {check}")
    return "\n".join(rows) + "\n"


# ---- HTML ---------------------------------------------------------------------------------

_CSS: Final = """
:root { --ink: #1b1b1b; --muted: #5f6368; --rule: #d9d9d9; --ok: #1e6b2f; --warn: #8a5300;
        --bad: #a11d1d; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); margin: 0 auto; max-width: 1040px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 8px; border-bottom: 1px solid var(--rule);
     padding-bottom: 4px; }
.muted, .derivation, .signers { color: var(--muted); }
.derivation, .signers { font-size: 12.5px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 600;
         font-size: 13px; color: white; }
.badge.FINAL { background: var(--ok); } .badge.PROVISIONAL { background: var(--warn); }
.badge.FAILED { background: var(--bad); }
.summary { display: grid; grid-template-columns: 2fr 1fr 1fr 1fr; gap: 12px; margin: 16px 0; }
.card { border: 1px solid var(--rule); border-radius: 6px; padding: 10px 14px; }
.card .amount { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card.you { border: 2px solid var(--ink); }
.card.you .amount { font-size: 26px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--rule);
         vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .03em; color: var(--muted); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.total td { font-weight: 600; }
tr.mine td:first-child { border-left: 3px solid var(--ink); }
.you-tag { font-size: 11px; border: 1px solid var(--ink); border-radius: 3px; padding: 0 4px;
           margin-left: 6px; }
td.gpu { word-break: break-all; }
table.gpus { table-layout: fixed; }
table.gpus td, table.gpus th { padding: 4px 4px; font-size: 12px; white-space: normal;
                               letter-spacing: 0; overflow-wrap: anywhere; }
table.gpus col.gpu { width: 19%; }
table.lines td.num:nth-child(2), table.lines td.num:nth-child(3) { white-space: normal; }
details.derivation summary { cursor: pointer; font-size: 12px; }
.terms td:first-child { width: 180px; color: var(--muted); }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
            vertical-align: -2px; border: 1px solid #777; }
.timeline svg { width: 100%; height: auto; }
.checks { color: var(--bad); font-weight: 600; }
code, .hash { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px;
              word-break: break-all; }
nav a { margin-right: 12px; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  nav, .noprint { display: none; }
  h2 { break-after: avoid; }
  tr, .card, .timeline { break-inside: avoid; }
  .badge { color: black; border: 1px solid black; background: none !important; }
  a { color: inherit; text-decoration: none; }
}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _money(doc: BillDoc, minor: int, total: str | None = None) -> str:
    data = f' data-total="{_e(total)}" data-minor="{minor}"' if total else ""
    return f"<span{data}>{_e(format_minor(minor, doc.currency_scale))} {_e(doc.currency)}</span>"


def _flow_of(doc: BillDoc, line: Line) -> str:
    """Who pays whom for a line: its payer and payee, and for the settlement totals that
    name one side only, the other as SPEC §7.6 has it."""
    if line.payer and line.payee:
        return f"{line.payer} → {line.payee}"
    fee_payer = _fee_payer(doc)
    return {
        "buyer_owes": "buyer → operator" + (" and desk" if fee_payer == "buyer" else ""),
        "operator_receives": "buyer → operator"
        + (" (less the fee it pays the desk)" if fee_payer == "operator" else ""),
        "desk_receives": f"{fee_payer} → desk",
    }.get(line.key, "")


def _line_row(doc: BillDoc, line: Line, party: str) -> str:
    mine = party in (line.payer, line.payee)
    effect = ""
    if line.amount_minor is not None and line.payer == party and line.payee:
        effect = '<span class="you-tag">you pay</span>'
    elif line.amount_minor is not None and line.payee == party and line.payer:
        effect = '<span class="you-tag">you receive</span>'
    total_key = {
        "gross": "gross_minor",
        "sla": "sla_credit_minor",
        "credits": "credits_minor",
        "net": "net_minor",
        "fee": "fee_minor",
        "buyer_owes": "buyer_owes_minor",
        "operator_receives": "operator_receives_minor",
        "desk_receives": "desk_receives_minor",
    }.get(line.key)
    if line.key.startswith("reclaim:"):
        total_key = "reclaim_credit_minor"
    if line.key.startswith("release:"):
        total_key = "release_charge_minor"
    amount = (
        _money(doc, line.amount_minor, total_key and f"line:{total_key}")
        if line.amount_minor is not None
        else ""
    )
    quantity = f"{_e(line.quantity)} {_e(line.unit)}".strip()
    flow = _e(_flow_of(doc, line))
    signers = (
        f'<div class="signers">signed by {_e(", ".join(line.signers))}</div>'
        if line.signers
        else ""
    )
    classes = " ".join(
        c
        for c in (
            "total" if line.section == "settlement" else "",
            "mine" if mine and line.amount_minor is not None else "",
        )
        if c
    )
    derivation = (
        f'<details class="derivation"><summary>how</summary>{_e(line.derivation)}</details>'
        if line.derivation
        else ""
    )
    return (
        f'<tr class="{classes}" data-line="{_e(line.key)}"><td>{_e(line.label)}{effect}'
        f"{derivation}{signers}</td>"
        f'<td class="num">{quantity}</td><td class="num">{_e(line.unit_price)}</td>'
        f'<td>{flow}</td><td class="num">{amount}</td></tr>'
    )


def _fee_payer(doc: BillDoc) -> str:
    """Who pays the desk fee (SPEC §7.6): the fee line's payer."""
    return next((line.payer for line in doc.lines if line.key == "fee"), "operator")


def _card(doc: BillDoc, you: bool, text: str, minor: int, total: str, attr: str = "") -> str:
    return (
        f'<div class="card{" you" if you else ""}"{attr}><div class="muted">{_e(text)}</div>'
        f'<div class="amount">{_money(doc, minor, total)}</div></div>'
    )


def _resale_cards(doc: BillDoc, party: str) -> list[str]:
    """SPEC §7.10: what each new buyer pays the desk; what the desk pays the original
    buyer; the original buyer's net. A new buyer sees its own obligation only."""
    desk, buyer = doc.parties["desk"], doc.parties["buyer"]
    cards = []
    for r in doc.resale:
        you = party == r.new_buyer
        if party not in PARTY_ROLES and not you:
            continue
        who = "You, the new buyer" if you else "The new buyer"
        cards.append(
            _card(doc, you, f"{who} ({r.new_buyer}) pays the desk ({desk}) for resale "
                  f"{r.assignment_id}", r.gross_minor, f"resale:{r.assignment_id}",
                  f' data-new-buyer="{_e(r.new_buyer)}"')
        )  # fmt: skip
    if doc.original_buyer_net_minor is None or party not in PARTY_ROLES:
        return cards
    you = party == "buyer"
    proceeds = sum(r.proceeds_minor for r in doc.resale)
    to_you = "you" if you else f"the original buyer ({buyer})"
    cards.append(
        _card(doc, you, f"The desk ({desk}) pays {to_you} the resale proceeds (less its "
              "resale fee)", proceeds, "resale_proceeds")
    )  # fmt: skip
    net = doc.original_buyer_net_minor
    verb = "pays" if net >= 0 else "receives"
    text = (
        f"Your net: you {verb[:-1]} in all (what you pay the operator less what the desk pays you)"
        if you
        else f"The original buyer’s net: {verb} in all (what it pays the operator less what "
        "the desk pays it)"
    )
    cards.append(_card(doc, you, text, net, "buyer_net"))
    return cards


def _role_text(doc: BillDoc, role: str) -> str:
    """What a party's amount is, and to or from whom (SPEC §7.6)."""
    p, fee_payer = doc.parties, _fee_payer(doc)
    if role == "buyer":
        if fee_payer == "buyer":
            return f"pays the operator ({p['operator']}) the net and the desk ({p['desk']}) its fee"
        return f"pays the operator ({p['operator']})"
    if role == "operator":
        if fee_payer == "operator":
            return f"receives from the buyer ({p['buyer']}), after paying the desk its fee"
        return f"receives from the buyer ({p['buyer']})"
    return f"receives its fee, paid by the {fee_payer}"


def _summary(doc: BillDoc, party: str) -> str:
    if party not in PARTY_ROLES:  # a new buyer: its own obligation only
        return '<div class="summary">' + "".join(_resale_cards(doc, party)) + "</div>"
    cards: list[str] = []
    order = [*[p for p in PARTY_ROLES if p == party], *[p for p in PARTY_ROLES if p != party]]
    for role in order:
        total, _ = _PARTY_AMOUNT[role]
        you = role == party
        amount, name, verb = doc.totals[total], total, _role_text(doc, role)
        if role == "desk" and doc.desk_total_minor is not None:
            # SPEC §7.10: the desk's fee on the original terms and its resale fees, in all.
            fee = format_minor(doc.totals[total], doc.currency_scale)
            fees = format_minor(doc.desk_total_minor - doc.totals[total], doc.currency_scale)
            plural = "s" if len(doc.resale) > 1 else ""
            verb = f"receives in all ({fee} fee + {fees} resale fee{plural})"
            amount, name = doc.desk_total_minor, "desk_total"
        who = f"{'You, the ' if you else 'The '}{role} ({doc.parties[role]}), {verb}"
        cards.append(_card(doc, you, who, amount, name))
    cards += _resale_cards(doc, party)
    return '<div class="summary">' + "".join(cards) + "</div>"


def _for_party(doc: BillDoc, party: str) -> BillDoc:
    """What a page shows ``party``: everything for the three parties; for a new buyer
    (SPEC §7.10) only its resale lines, its GPUs and its resale terms."""
    if party in PARTY_ROLES:
        return doc
    mine = [r for r in doc.resale if r.new_buyer == party]
    gpus = {g for r in mine for g in r.gpus}
    terms = [("seller", doc.parties["buyer"]), ("paid to", f"the desk ({doc.parties['desk']})")]
    for r in mine:
        terms += [
            (f"resale {r.assignment_id}", f"{', '.join(r.gpus)} from {iso_utc(r.handover_ms)}"),
            ("rate", f"{format_minor(r.rate_per_gpu_hour_minor, doc.currency_scale)} "
                     f"{doc.currency} per GPU-hour"),
        ]  # fmt: skip
    return msgspec.structs.replace(
        doc,
        lines=[line for line in doc.lines if party in (line.payer, line.payee)],
        gpus=[g for g in doc.gpus if g.uuid in gpus],
        terms=terms,
        periods=[],
    )


def parties_of(doc: BillDoc) -> list[str]:
    """Whose statement pages the bill has: the three roles, then each new buyer (§7.10)."""
    return [*PARTY_ROLES, *dict.fromkeys(r.new_buyer for r in doc.resale)]


def page_of(doc: BillDoc, party: str) -> str | None:
    """The page ``party`` asks for: a role, a new buyer's id, or a party's id as the terms
    name it (``gridx-desk`` is the desk's page); None when the bill has no such party."""
    if party in parties_of(doc):
        return party
    return next((role for role in PARTY_ROLES if doc.parties.get(role) == party), None)


def _gpu_table(doc: BillDoc) -> str:
    head = (
        "<tr><th>GPU</th><th class=num>share</th>"
        + "".join(f"<th class=num>{_e(STATE_LABELS[s])}</th>" for s in STATES)
        + "<th class=num>delivered</th><th class=num>availability</th></tr>"
    )
    rows = []
    for g in doc.gpus:
        cells = "".join(f"<td class=num>{_e(duration(g.ms.get(s, 0)))}</td>" for s in STATES)
        rows.append(
            f'<tr data-gpu="{_e(g.uuid)}"><td class="gpu">{_e(g.uuid)}<div class="muted">'
            f"{_e(g.model)} on {_e(g.node_id)}</div></td>"
            f"<td class=num>{g.share_milli}/1000</td>{cells}"
            f"<td class=num>{_e(g.delivered_gpu_h)} GPU-h</td>"
            f"<td class=num>{_e(g.availability)}</td></tr>"
        )
    return f"<table class=gpus><col class=gpu>{head}{''.join(rows)}</table>"


def _legend() -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i style="background:{COLORS[s]}"></i>{_e(STATE_LABELS[s])}</span>'
            for s in STATES
        )
        + "</div>"
    )


def _verification(doc: BillDoc) -> str:
    v = doc.verdict
    reasons = "".join(f"<li>{_e(r)}</li>" for r in v.reasons)
    cp = doc.checkpoint
    if cp is None:
        checkpoint = "<p>No checkpoint covers this log yet.</p>"
    else:
        cosigners = ", ".join(cp.cosigners) or "nobody yet"
        covers = (
            "covers every record of this statement"
            if cp.covers_statement
            else f"covers {cp.size} of {doc.statement.through_index + 1} records"
        )
        checkpoint = (
            '<table class="terms">'
            f"<tr><td>tree size</td><td data-checkpoint-size>{cp.size} ({_e(covers)})</td></tr>"
            f'<tr><td>root (RFC 9162)</td><td class="hash">{_e(cp.root_b64)}</td></tr>'
            f"<tr><td>cosigned by</td><td>{_e(cosigners)}</td></tr></table>"
        )
    s = doc.statement
    statement = (
        '<table class="terms">'
        f"<tr><td>statement</td><td>through record {s.through_index} of {doc.record_count}, "
        f"period {s.period}, {'final' if s.final else 'not final'}</td></tr>"
        f'<tr><td>head</td><td class="hash">{_e(s.head)}</td></tr>'
        f'<tr><td>previous period head</td><td class="hash">{_e(s.previous)}</td></tr>'
        "</table>"
    )
    return (
        f'<p><span class="badge {_e(v.level)}" data-verdict>{_e(v.level)}</span> '
        f"{_e(v.by)}</p>{f'<ul>{reasons}</ul>' if reasons else ''}{statement}"
        f"<h3>Checkpoint</h3>{checkpoint}"
    )


def _attested(doc: BillDoc) -> str:
    """SPEC §6.9: which GPUs were attested, by whom, when, until when."""
    if not doc.attested:
        return ""
    rows = "".join(
        f"<tr><td>{_e(a.node_id)}</td><td>{_e(a.key_id)}</td><td>{_e(', '.join(a.gpus))}</td>"
        f"<td>{_e(a.attester or 'not checked (no attestation root)')}</td><td>{_e(a.iss)}</td>"
        f"<td>{_e(iso_utc(a.iat_s * 1000))}</td>"
        f"<td>{_e(iso_utc(a.iat_s * 1000 + MAX_ATTESTATION_VALIDITY_MS))}</td>"
        f"<td>{a.chain_index}</td></tr>"
        for a in doc.attested
    )
    return (
        "<h2>Hardware evidence</h2><table class=attested><tr><th>node</th><th>key id</th>"
        "<th>GPUs attested</th><th>attested by</th><th>issuer</th><th>issued</th>"
        f"<th>expires</th><th>record</th></tr>{rows}</table><p class=muted>Attestation "
        "tokens carried by the node key bindings; each attests usage up to its expiry, "
        "24 h after it was issued (SPEC §6.9).</p>"
    )


def _periods(doc: BillDoc, party: str) -> str:
    if party not in PARTY_ROLES:  # a new buyer (SPEC §7.10)
        return "<p>The periods hold the original terms' figures; yours is the resale above.</p>"
    if not doc.periods:
        return "<p>No period has a final statement yet: the placement is open.</p>"
    rows = "".join(
        f"<tr><td>{p.period}{' (latest)' if p.latest else ''}</td><td>{p.through_index}</td>"
        f"<td class=num>{_money(doc, p.buyer_owes_minor)}</td>"
        f"<td class=num>{_money(doc, p.operator_receives_minor)}</td>"
        f"<td class=num>{_money(doc, p.desk_receives_minor)}</td></tr>"
        for p in doc.periods
    )
    return (
        "<table><tr><th>period</th><th>through record</th><th class=num>buyer owes</th>"
        "<th class=num>operator receives</th><th class=num>desk receives</th></tr>"
        f"{rows}</table><p class=muted>Periods after the close hold late adjustments; "
        "totals are cumulative (SPEC §8)."
        + (
            " These are the original terms' figures; the resale's (what the new buyer owes, "
            "the desk's resale fee) are in the line items (SPEC §7.10)."
            if doc.resale
            else ""
        )
        + "</p>"
    )


def to_html(doc: BillDoc, party: str, links: Sequence[tuple[str, str]] = ()) -> str:
    """The statement page of ``doc`` for ``party`` (buyer, operator or desk).

    ``links``: (label, href) of the other forms (CSV, JSON, the other parties' pages).
    """
    parties = parties_of(doc)
    page = page_of(doc, party)
    if page is None:
        raise ValueError(f"party must be one of {', '.join(parties)}, not {party!r}")
    party = page
    doc = _for_party(doc, party)
    who = doc.parties[party] if party in PARTY_ROLES else "new buyer by resale"
    rows = [g for g in doc.gpus if g.segments]
    picture = (
        timeline_svg(rows, doc.window_start_ms, doc.window_end_ms)
        if rows and not doc.timeline_note
        else f"<p class=muted>{_e(doc.timeline_note or 'no delivery to draw')}</p>"
    )
    sections = {
        "delivery": "Delivery",
        "charges": "Charges",
        "sla": "Availability",
        "credits": "Credits",
        "settlement": "Settlement",
        "resale": "Resale (assignment): the second obligation",
    }
    body_rows: list[str] = []
    current = ""
    for line in doc.lines:
        if line.section != current:
            current = line.section
            body_rows.append(f'<tr><th colspan="5">{_e(sections.get(current, current))}</th></tr>')
        body_rows.append(_line_row(doc, line, party))
    checks = "".join(f'<p class="checks">CHECK: {_e(c)}</p>' for c in doc.checks)
    nav = " ".join(f'<a href="{_e(href)}">{_e(label)}</a>' for label, href in links)
    terms = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in doc.terms)
    title = f"Statement {doc.placement_id} — {party}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{_e(title)}</title><style>{_CSS}</style></head>
<body data-placement="{_e(doc.placement_id)}" data-party="{_e(party)}">
<nav class="noprint">{nav}</nav>
<h1>Statement — placement {_e(doc.placement_id)}</h1>
<p class="muted">For the {_e(party)} ({_e(who)}) ·
window {_e(iso_utc(doc.window_start_ms))} to {_e(iso_utc(doc.window_end_ms))} ·
through record {doc.statement.through_index}, period {doc.statement.period},
{"final" if doc.statement.final else "not final"} ·
<span class="badge {_e(doc.verdict.level)}">{_e(doc.verdict.level)}</span></p>
{_summary(doc, party)}
{checks}
<h2>Line items</h2>
<table class="lines"><tr><th>item</th><th class=num>quantity</th><th class=num>unit price</th>
<th>who pays whom</th><th class=num>amount</th></tr>
{"".join(body_rows)}
</table>
<h2>Delivery per GPU</h2>
{_gpu_table(doc)}
<div class="timeline">{picture}</div>
<p class="muted">Times in UTC; each bar is one GPU over the window.</p>
<h2>Terms</h2>
<table class="terms">{terms}</table>
{_attested(doc)}
<h2>Statement periods</h2>
{_periods(doc, party)}
<h2>Verification</h2>
{_verification(doc)}
<p class="muted">{_e(doc.source)}</p>
</body></html>
"""
