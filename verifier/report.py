"""Rendering verification results for people (``OK:`` / ``PROVISIONAL:`` / ``FAIL:`` lines)
and programs (JSON), and the exit code (SPEC §9):

    0  every export FINAL: verified, closed, final statement, witnessed as the trust
       file requires
    1  some readable export does not check out (a finding), or the exports disagree
       (equivocation across copies, a kept checkpoint the export does not extend)
    2  some input unusable
    3  verified, but some export is PROVISIONAL: open, unwitnessed or cut short
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from proto.limits import MAX_ATTESTATION_VALIDITY_MS
from verifier.capacity import check_capacity
from verifier.findings import Findings
from verifier.reconcile import format_minor, reconcile, render
from verifier.state import UNUSABLE, ExportReport

REPORT_FORMAT: Final = "gridledger-verify-report/v1"
EXIT_VERIFIED: Final = 0
EXIT_FAILED: Final = 1
EXIT_UNUSABLE: Final = 2
EXIT_PROVISIONAL: Final = 3


def exit_code(reports: Sequence[ExportReport], *, run_failed: bool = False) -> int:
    """See the module docstring; ``run_failed``: a finding across exports."""
    if any(r.verdict == UNUSABLE for r in reports):
        return EXIT_UNUSABLE
    if run_failed or any(not r.ok for r in reports):
        return EXIT_FAILED
    if len(reports) > 1 and check_capacity(reports).failed:  # SPEC §6.5: OVERSOLD
        return EXIT_FAILED
    if any(not r.is_final for r in reports):
        return EXIT_PROVISIONAL
    return EXIT_VERIFIED


def findings_json(findings: Findings) -> dict[str, Any]:
    """Findings as JSON: the kept ones, and the count per rule (all of them)."""
    return {
        "total": findings.total,
        "by_rule": dict(sorted(findings.counts.items())),
        "not_shown": findings.not_kept(),
        "items": [f.to_json() for f in findings.kept],
    }


def export_json(report: ExportReport) -> dict[str, Any]:
    """One export's report as JSON."""
    return {
        "path": report.path,
        "verdict": report.verdict,
        "error": report.error,
        "placement_id": report.placement_id,
        "parties": report.parties,
        "currency": report.currency,
        "currency_scale": report.currency_scale,
        "head_index": report.head_index,
        "final": report.final,
        "level": report.level,
        "provisional": report.provisional,
        "witnessed_by": report.witnessed_by,
        "totals": report.totals,
        **({"resale": report.resale} if report.resale else {}),
        "counts": report.counts,
        "checkpoints": report.checkpoints,
        "periods": report.periods,
        "final_period": final_period(report),  # SPEC §9: which period FINAL is for
        "attestations": report.attestations,
        "attestation_checked": report.attestation_checked,
        "arrival": report.arrival,
        "elapsed_s": round(report.elapsed_s, 3),
        "findings": findings_json(report.findings),
    }


def run_json(
    reports: Sequence[ExportReport], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The whole run as JSON; with several exports, the reconciliation too."""
    data: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "exit_code": exit_code(reports),
        "exports": [export_json(r) for r in reports],
    }
    if len(reports) > 1:
        data["reconciliation"] = reconcile(reports).to_json()
    if extra:
        data.update(extra)
    return data


def render_export(report: ExportReport) -> list[str]:
    """``OK:`` or ``FAIL:`` for one export, then its findings, one per line."""
    if report.verdict == UNUSABLE:
        return [f"FAIL: {report.path}: unusable input: {report.error}"]
    if report.ok and report.totals is not None:
        t, scale = report.totals, report.currency_scale
        money = report.currency
        desk = f"desk receives {format_minor(t['desk_receives_minor'], scale)} {money}"
        if report.resale:  # SPEC §7.10: the desk once, in all, as the statement's desk card
            fees = sum(e["fee_minor"] for e in report.resale)
            plural = "s" if len(report.resale) > 1 else ""
            desk = (
                f"desk receives {format_minor(t['desk_receives_minor'] + fees, scale)} {money} "
                f"in all ({format_minor(t['desk_receives_minor'], scale)} fee + "
                f"{format_minor(fees, scale)} resale fee{plural})"
            )
        amounts = (
            f"buyer owes {format_minor(t['buyer_owes_minor'], scale)} {money}, operator "
            f"receives {format_minor(t['operator_receives_minor'], scale)} {money}, {desk}"
        )
        if report.resale:  # SPEC §7.10: the second obligation, and the seller's net
            sold = sum(e["gross_minor"] - e["fee_minor"] for e in report.resale)
            amounts += "; resale: " + ", ".join(
                f"{e['new_buyer']} owes {format_minor(e['gross_minor'], scale)} {money} "
                f"({e['assignment_id']}, via the desk)"
                for e in report.resale
            )
            amounts += (
                f"; original buyer's net {format_minor(t['buyer_owes_minor'] - sold, scale)} "
                f"{money}"
            )
        records = f"{report.counts.get('records', 0)} records through index {report.head_index}"
        periods = [
            f"  period {p['period']} (through record {p['through_index']}"
            f"{', latest' if p['latest'] else ''}): buyer owes "
            f"{format_minor(int(str(p['buyer_owes_minor'])), scale)} {money}"
            for p in report.periods
            if len(report.periods) > 1
        ]
        periods += [_attestation_line(a) for a in report.attestations]  # SPEC §6.9
        if report.arrival == "sender":  # SPEC §6.6: stated by the ledger, not checkable
            periods.append(
                "  arrival times were stated by the senders (arrival = sender): a simulation "
                "on a simulated clock, not a production settlement"
            )
        if report.is_final:
            witnesses = ", ".join(report.witnessed_by) or "no witness required by the trust file"
            # SPEC §8 statement periods: FINAL says for which (the latest) period
            period = next((p["period"] for p in report.periods if p["latest"]), 0)
            return [
                f"OK: {report.path}: placement {report.placement_id}, {records}, period "
                f"{period} (final, witnessed by {witnesses}); {_final_for(report)}: {amounts}",
                *periods,
            ]
        return [
            f"PROVISIONAL: {report.path}: placement {report.placement_id}, {records}; "
            f"{amounts} so far — not final, not payable: {'; '.join(report.provisional)}",
            *periods,
        ]
    head = f"FAIL: {report.path}: placement {report.placement_id or '?'}: "
    if _pins_none(report.findings):
        head += (
            "the trust file (--trust) pins none of this placement's keys (operator, buyer, "
            "desk, ledger): nothing in it can be trusted, not a sign the ledger cheated; "
            "verify with the trust file of these parties (gridledger trust init); "
        )
    lines = [head + f"{report.findings.total} finding(s)"]
    lines += [f"  {f.line()}" for f in report.findings.kept]
    for rule, n in sorted(report.findings.not_kept().items()):
        lines.append(f"  ... and {n} more {rule} finding(s) not shown")
    return lines


def _pins_none(findings: Findings) -> bool:
    """Every party key of the terms and the ledger key unpinned: a wrong trust file."""
    unpinned = [f for f in findings.kept if f.rule == "TERMS_KEY_NOT_PINNED"]
    roles = {f.expected.split(" ", 1)[0] for f in unpinned}
    return "TERMS_LEDGER_NOT_PINNED" in findings.rules() and roles >= {"operator", "buyer", "desk"}


def final_period(report: ExportReport) -> dict[str, object] | None:
    """SPEC §8, §9: the period a FINAL verdict is for (the latest with a final
    statement) and its last record; None when the verdict is not FINAL."""
    if not report.is_final:
        return None
    latest = [p for p in report.periods if p.get("latest")] or report.periods[-1:]
    if not latest:
        return None
    return {"period": latest[0]["period"], "through_index": latest[0]["through_index"]}


def _final_for(report: ExportReport) -> str:
    """ "FINAL for period P (through record I)", what a FINAL line says it settles."""
    p = final_period(report)
    if p is None:
        return "FINAL"
    return f"FINAL for period {p['period']} (through record {p['through_index']})"


def render_run(reports: Sequence[ExportReport]) -> list[str]:
    """Every export's lines, then the reconciliation when there are several."""
    lines: list[str] = []
    for report in reports:
        lines += render_export(report)
    if len(reports) > 1:
        lines += render(reconcile(reports))
    return lines


__all__ = [
    "EXIT_FAILED",
    "EXIT_PROVISIONAL",
    "EXIT_UNUSABLE",
    "EXIT_VERIFIED",
    "exit_code",
    "export_json",
    "findings_json",
    "render_export",
    "render_run",
    "run_json",
]


def _expiry_ms(iat: object) -> object:
    """SPEC §6.9 Expiry: iat x 1000 + MAX_ATTESTATION_VALIDITY_MS (ms)."""
    return iat * 1000 + MAX_ATTESTATION_VALIDITY_MS if isinstance(iat, int) else "?"


def _attestation_line(a: dict[str, object]) -> str:
    """SPEC §6.9: which GPUs of a node key were attested, by whom, when."""
    gpus = a["gpus"]
    names = ", ".join(str(g) for g in gpus) if isinstance(gpus, list) else str(gpus)
    attester = a["attester"] or "an attestation service (signature not checked: no root pinned)"
    return (
        f"  attested: node {a['node_id']} key {a['key_id']}: {names} by {attester} "
        f"(iss {a['iss']}, iat {a['iat']}, expires {_expiry_ms(a['iat'])}, "
        f"record {a['record_index']})"
    )
