"""What a record would do to the bill, before anyone publishes it (``--dry-run``): the
command's side.

The current state of the placement is rebuilt locally from an export (a file the user
has, or one the running ledger serves at ``GET /placements/<id>/export``, fetched here)
by the ledger's own fold, behind ``ledger.dryrun.rebuild``; the new record is folded on
top of it there. Here: the fetch, and the verdict and the totals before and after, line
by line.

Nothing is signed by the ledger and nothing is published: the dry run needs no key but
the party's own, which already signed the record.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Final

from billview.units import iso_utc
from ledger.dryrun import Current, DryRun, DryRunError, rebuild
from proto.keys import SigningKey, key_id
from proto.money import format_gpu_hours, format_minor
from proto.records import PlacementTerms, ResaleTotals, Totals

__all__ = ["Current", "DryRun", "DryRunError", "current_from_ledger", "rebuild", "render"]

# The lines of the comparison: (Totals field, label, unit). GPU-hours or money.
LINES: Final[tuple[tuple[str, str, str], ...]] = (
    ("delivered_mgms", "delivered", "gpu"),
    ("billable_mgms", "billable", "gpu"),
    ("gross_minor", "gross", "money"),
    ("reclaim_credit_minor", "reclaim credit", "money"),
    ("sla_credit_minor", "SLA credit", "money"),
    ("adjustment_credit_minor", "adjustment credits", "money"),
    ("adjustment_charge_minor", "adjustment charges", "money"),
    ("release_charge_minor", "release charge", "money"),
    ("net_minor", "net", "money"),
    ("fee_minor", "desk fee", "money"),
    ("buyer_owes_minor", "buyer owes", "money"),
    ("operator_receives_minor", "operator receives", "money"),
    ("desk_receives_minor", "desk receives", "money"),
)


def current_from_ledger(base_url: str, placement_id: str, key: SigningKey) -> Current:
    """Fetch the export from a running ledger's API (requests signed with ``key``, a party's
    key, SPEC §13) and rebuild from it."""
    from ledger.client import ApiError, download_export

    with tempfile.TemporaryDirectory(prefix="gridledger-dryrun-") as tmp:
        path = Path(tmp) / f"{placement_id}.duckdb"
        try:
            download_export(base_url.rstrip("/"), placement_id, path, key)
        except ApiError as exc:
            raise DryRunError(str(exc)) from exc
        return rebuild(path, placement_id, source=f"{base_url} (ledger API)")


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def render(result: DryRun, terms: PlacementTerms, missing: tuple[str, ...]) -> list[str]:
    """The dry run as lines a person reads."""
    scale, currency = terms.currency_scale, terms.currency
    lines = [
        f"dry run against {terms.placement_id} through record {result.records - 1} "
        f"(from {result.source})"
    ]
    if result.status == "accepted":
        lines.append("verdict: the ledger would accept it")
    else:
        why = f" {result.reason}" if result.reason else ""
        detail = f": {result.detail}" if result.detail else ""
        lines.append(f"verdict: the ledger would record it {result.status}{why}{detail}")
    after = result.after
    label_after = "with it"
    if result.once_signed is not None:
        after = result.once_signed
        label_after = "once signed"
        lines.append(f"         (missing signature of {', '.join(missing)}; shown as once signed)")
    if result.handover_ms is not None:
        when = iso_utc(result.handover_ms)
        lines.append(
            f"resale: the new buyer is billed from {when} at the resale "
            "rate (SPEC §7.10); the totals below stay the original terms', the obligations "
            "after them are both sides'"
        )
    lines.append(f"  {'':<19}{'now':>14}{label_after:>14}{'change':>14}")
    for field, label, unit in LINES:
        old, new = getattr(result.before, field), getattr(after, field)

        def show(value: int, signed: bool = False, unit: str = unit) -> str:
            sign = "+" if signed and value > 0 else ""
            if unit == "gpu":
                return sign + format_gpu_hours(value) + " GPU-h"
            return sign + format_minor(value, scale) + f" {currency}"

        change = show(new - old, signed=True) if new != old else ""
        lines.append(f"  {label:<19}{show(old):>14}{show(new):>14}{change:>14}")
    if result.resale_after or result.resale_before:
        lines += _obligations(result, result.before, after, terms)
    return lines


def _obligations(result: DryRun, before: Totals, after: Totals, terms: PlacementTerms) -> list[str]:
    """SPEC §7.10: with a resale, what each new buyer owes (via the desk), the original
    buyer's net (what it owes less what the resale brings it) and the desk's total."""
    scale, currency = terms.currency_scale, terms.currency

    def money(value: int | None, signed: bool = False) -> str:
        if value is None:
            return "-"
        sign = "+" if signed and value > 0 else ""
        return sign + format_minor(value, scale) + f" {currency}"

    def row(label: str, old: int | None, new: int | None) -> str:
        change = "" if new is None or new == (old or 0) else money(new - (old or 0), signed=True)
        first = 14 - max(0, len(label) - 19)  # a longer label: the columns stay aligned
        return f"  {label:<19}{money(old):>{first}}{money(new):>14}{change:>14}"

    def net(totals: Totals, resale: tuple[ResaleTotals, ...]) -> int:
        return totals.buyer_owes_minor - sum(e.gross_minor - e.fee_minor for e in resale)

    def desk(totals: Totals, resale: tuple[ResaleTotals, ...]) -> int:
        return totals.desk_receives_minor + sum(e.fee_minor for e in resale)

    old = {e.assignment_id: e for e in result.resale_before}
    lines = ["obligations (SPEC §7.10):"]
    for entry in result.resale_after:
        was = old.get(entry.assignment_id)
        label = f"{entry.new_buyer} owes"
        lines.append(row(label, None if was is None else was.gross_minor, entry.gross_minor))
    lines.append(
        row(
            "original buyer's net",
            net(before, result.resale_before),
            net(after, result.resale_after),
        )
    )
    lines.append(
        row("desk in all", desk(before, result.resale_before), desk(after, result.resale_after))
    )
    full = result.resale_full
    if full is not None and result.handover_ms is not None:
        lines.append(
            f"  {full.new_buyer} owes from {iso_utc(result.handover_ms)}: up to "
            f"{money(full.gross_minor)} if the {_gpus(result.resale_gpus)} it buys "
            f"deliver{'s' if result.resale_gpus == 1 else ''} until "
            f"{iso_utc(result.resale_end_ms)} ({full.assignment_id}, paid to the desk); the "
            f"original buyer's net falls by up to {money(full.gross_minor - full.fee_minor)} "
            f"(after the desk's resale fee {money(full.fee_minor)})"
        )
    return lines


def signer_roles(terms: PlacementTerms, keyids: list[str]) -> list[str]:
    """The roles of the terms these key ids belong to (for messages)."""
    roles = {key_id(getattr(terms, r).key): r for r in ("operator", "buyer", "desk")}
    return [roles.get(k, k) for k in keyids]
