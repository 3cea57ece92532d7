"""The auditor's appendix of one export: what an audit file records beside the bill.

Pure rendering of an ``Appendix`` the caller gathered (``gridledger audit``): which
verifier judged the export and when, the SHA-256 of the export and of the trust file, each
pinned key's fingerprint, when the terms and each statement reached the log, the inputs
the ledger rejected (with their reasons) and those still held, and where the CSV of the
signed usage per GPU per interval is.
"""

from __future__ import annotations

import html
from typing import Final

from msgspec import Struct

from billview.units import iso_utc

# Rejected inputs listed one by one; past it the page says how many more there are.
MAX_LISTED: Final = 1_000


class KeyRow(Struct, frozen=True, kw_only=True):
    id: str
    role: str
    key_id: str
    sha256: str  # of the raw public key


class StatementRow(Struct, frozen=True, kw_only=True):
    period: int
    through_index: int
    head: str
    final: bool
    arrived_ms: int | None  # when its last record reached the log (SPEC §6.6)


class RejectedRow(Struct, frozen=True, kw_only=True):
    table: str
    chain_index: int
    position: str
    input_hash: str
    status: str
    reason: str


class Appendix(Struct, frozen=True, kw_only=True):
    placement_id: str
    verifier: str
    verified_at_ms: int
    verdict: str
    verdict_reasons: list[str]
    export_name: str
    export_sha256: str
    trust_sha256: str
    keys: list[KeyRow]
    terms_signers: list[str]
    terms_created_ms: int
    terms_arrived_ms: int | None
    statements: list[StatementRow]
    rejected: list[RejectedRow]
    rejected_total: int
    held: list[tuple[str, str]]  # (position, input hash) of inputs held, not chained
    usage_csv: str
    usage_rows: int


def _e(text: object) -> str:
    return html.escape(str(text))


def _when(ms: int | None) -> str:
    return "not recorded (chained before SPEC §6.6)" if ms is None else iso_utc(ms)


def to_html(a: Appendix) -> str:
    """The appendix page."""
    keys = "".join(
        f"<tr><td>{_e(k.id)}</td><td>{_e(k.role)}</td><td><code>{_e(k.key_id)}</code></td>"
        f"<td><code>{_e(k.sha256)}</code></td></tr>"
        for k in a.keys
    )
    statements = "".join(
        f"<tr><td>{s.period}</td><td>{s.through_index}</td><td>{'final' if s.final else ''}</td>"
        f"<td>{_e(_when(s.arrived_ms))}</td><td><code>{_e(s.head)}</code></td></tr>"
        for s in a.statements
    )
    rejected = "".join(
        f"<tr><td>{_e(r.table)}</td><td>{r.chain_index}</td><td>{_e(r.status)}</td>"
        f"<td>{_e(r.reason)}</td><td><code>{_e(r.input_hash)}</code></td></tr>"
        for r in a.rejected
    )
    more = a.rejected_total - len(a.rejected)
    held = "".join(f"<li>{_e(p)} <code>{_e(h)}</code></li>" for p, h in a.held)
    reasons = "".join(f"<li>{_e(r)}</li>" for r in a.verdict_reasons)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Audit appendix {_e(a.placement_id)}</title>
<style>
body {{ font: 13px/1.4 system-ui, sans-serif; max-width: 1000px; margin: 0 auto;
        padding: 20px; }}
table {{ border-collapse: collapse; width: 100%; table-layout: fixed; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left;
          vertical-align: top; overflow-wrap: anywhere; }}
code {{ font-size: 11px; }}
</style></head><body>
<h1>Audit appendix — placement {_e(a.placement_id)}</h1>
<h2>Verification</h2>
<table>
<tr><td>verdict</td><td data-verdict>{_e(a.verdict)}</td></tr>
<tr><td>verifier</td><td>{_e(a.verifier)}</td></tr>
<tr><td>verified at</td><td>{_e(iso_utc(a.verified_at_ms))}</td></tr>
<tr><td>export</td><td>{_e(a.export_name)}<br>SHA-256
 <code data-export-sha256>{_e(a.export_sha256)}</code></td></tr>
<tr><td>trust file</td><td>SHA-256 <code data-trust-sha256>{_e(a.trust_sha256)}</code></td></tr>
</table>
<ul>{reasons}</ul>
<h2>Keys pinned by the trust file</h2>
<table><tr><th>id</th><th>role</th><th>key id (SPEC §3)</th><th>SHA-256 of the key</th></tr>
{keys}</table>
<h2>Terms</h2>
<p>Signed by {_e(", ".join(a.terms_signers))}; created {_e(iso_utc(a.terms_created_ms))};
reached the log {_e(_when(a.terms_arrived_ms))}. Signatures carry no time of their own: a
party signed no later than the terms reached the log.</p>
<h2>Statements signed by the ledger</h2>
<table><tr><th>period</th><th>through record</th><th></th><th>its last record reached the log</th>
<th>head</th></tr>{statements}</table>
<h2>Rejected inputs</h2>
<p data-rejected="{a.rejected_total}">{a.rejected_total} chained input(s) were rejected with a
reason (SPEC §10); they count in no total.</p>
<table><tr><th>table</th><th>record</th><th>status</th><th>reason</th><th>input hash</th></tr>
{rejected}</table>
{f"<p>… {more} more not listed.</p>" if more > 0 else ""}
<h2>Held, not chained</h2>
{f"<ul>{held}</ul>" if held else "<p>None.</p>"}
<p>Inputs the ledger quarantined never reach the chain and so are not in an export; the
ledger's own quarantine lists them.</p>
<h2>Signed usage</h2>
<p>{a.usage_rows} sample(s), one per GPU per interval of every usage event in the export,
with its decision: <a href="{_e(a.usage_csv)}">{_e(a.usage_csv)}</a>.</p>
</body></html>
"""
