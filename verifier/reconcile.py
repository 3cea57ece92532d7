"""Reconciliation across placements: what each party owes or receives, per currency.

Only verified exports count; failed or unusable ones are listed apart and excluded from
every total, so a bad file can never move a party's balance. Per (currency, scale) the
buyers' total must equal what operators and desks receive together (SPEC §7.6: buyer owes
N (+F), operator receives N (-F), desk receives F).

Resale (SPEC §7.10): a new buyer is a buyer that owes G_k (to the desk); the original buyer's
amount is its net, what it owes the operator less what the resale brings it (G_k − F_k,
negative when the resale brings more); the desk receives F + Σ F_k. The balance holds as
before: Σ buyers = operators + desks, to the minor unit.

Capacity is checked across the same exports (``verifier/capacity.py``, SPEC §6.5): a GPU
sold above one whole GPU at some moment is an ``OVERSOLD`` finding of the run, and the
run is then not reconciled, whatever the money says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from verifier.capacity import CapacityReport, check_capacity, render_capacity
from verifier.state import ExportReport

# Which total each role is owed or owes, from SPEC §7.6.
ROLE_AMOUNT = {
    "buyer": "buyer_owes_minor",
    "operator": "operator_receives_minor",
    "desk": "desk_receives_minor",
}


@dataclass
class PartyLine:
    """One party in one role and one currency, summed over verified placements."""

    role: str
    party: str
    currency: str
    currency_scale: int
    placements: int = 0
    final_placements: int = 0
    amount_minor: int = 0
    credits_minor: int = 0


@dataclass
class Balance:
    """Per (currency, scale): buyers owe = operators + desks receive."""

    currency: str
    currency_scale: int
    buyer_owes_minor: int = 0
    operator_receives_minor: int = 0
    desk_receives_minor: int = 0

    @property
    def balanced(self) -> bool:
        """True when what buyers owe is exactly what operators and desks receive."""
        return self.buyer_owes_minor == self.operator_receives_minor + self.desk_receives_minor


@dataclass
class Reconciliation:
    """Per-party lines, per-currency balances, and the exports left out."""

    lines: list[PartyLine] = field(default_factory=list)
    balances: list[Balance] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)  # (path, verdict)
    capacity: CapacityReport = field(default_factory=CapacityReport)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "verified": self.verified,
            "excluded": [{"path": p, "verdict": v} for p, v in self.excluded],
            "parties": [asdict(line) for line in self.lines],
            "balances": [{**asdict(b), "balanced": b.balanced} for b in self.balances],
            "capacity": self.capacity.to_json(),
            "reconciled": not self.capacity.failed and all(b.balanced for b in self.balances),
        }


def reconcile(reports: Iterable[ExportReport]) -> Reconciliation:
    """Sum verified placements per party, role and currency; check capacity across them."""
    reports = list(reports)
    result = Reconciliation(capacity=check_capacity(reports))
    lines: dict[tuple[str, str, str, int], PartyLine] = {}
    balances: dict[tuple[str, int], Balance] = {}
    for report in reports:
        if not report.ok or report.totals is None:
            result.excluded.append((report.path, report.verdict))
            continue
        result.verified.append(report.path)
        money = (report.currency, report.currency_scale)
        balance = balances.setdefault(money, Balance(*money))
        for role, party, amount, credits in _amounts(report):
            line = lines.setdefault((role, party, *money), PartyLine(role, party, *money))
            line.placements += 1
            line.final_placements += int(report.final)
            line.amount_minor += amount
            line.credits_minor += credits
            column = ROLE_AMOUNT[role]
            setattr(balance, column, getattr(balance, column) + amount)
    result.lines = sorted(
        lines.values(), key=lambda x: (x.currency, x.currency_scale, x.role, x.party)
    )
    result.balances = sorted(balances.values(), key=lambda b: (b.currency, b.currency_scale))
    return result


def _amounts(report: ExportReport) -> list[tuple[str, str, int, int]]:
    """(role, party, amount, credits) of each party of one verified placement: SPEC §7.6,
    and with resale §7.10 (new buyers owe, the original buyer's net, the desk's fees)."""
    totals = report.totals or {}
    resale = report.resale
    proceeds = sum(e["gross_minor"] - e["fee_minor"] for e in resale)
    fees = sum(e["fee_minor"] for e in resale)
    credits = totals["credits_minor"]
    out = [
        ("buyer", report.parties.get("buyer", "?"), totals["buyer_owes_minor"] - proceeds, credits),
        (
            "operator",
            report.parties.get("operator", "?"),
            totals["operator_receives_minor"],
            credits,
        ),
        ("desk", report.parties.get("desk", "?"), totals["desk_receives_minor"] + fees, 0),
    ]
    out += [("buyer", str(e["new_buyer"]), int(e["gross_minor"]), 0) for e in resale]
    return out


def format_minor(amount_minor: int, scale: int) -> str:
    """Minor units as a decimal amount (1234 at scale 2 -> 12.34)."""
    if scale == 0:
        return str(amount_minor)
    sign = "-" if amount_minor < 0 else ""
    whole, frac = divmod(abs(amount_minor), 10**scale)
    return f"{sign}{whole}.{frac:0{scale}d}"


def render(rec: Reconciliation) -> list[str]:
    """The reconciliation as text lines: one table per role, then the balances."""
    out = [
        f"Reconciliation: {len(rec.verified)} verified placement(s); "
        f"{len(rec.excluded)} excluded from the totals"
    ]
    for path, verdict in rec.excluded:
        out.append(f"  excluded ({verdict}): {path}")
    titles = {
        "buyer": "Buyers: owe",
        "operator": "Operators: receive",
        "desk": "Desks: receive (fees)",
    }
    for role, title in titles.items():
        rows = [line for line in rec.lines if line.role == role]
        if not rows:
            continue
        out.append(f"{title}")
        out.append(
            f"  {'party':<24} {'currency':<8} {'placements':>10} {'final':>5} "
            f"{'amount':>20} {'credits':>16}"
        )
        for line in rows:
            amount = format_minor(line.amount_minor, line.currency_scale)
            credits = format_minor(line.credits_minor, line.currency_scale)
            out.append(
                f"  {line.party:<24} {line.currency + '/' + str(line.currency_scale):<8} "
                f"{line.placements:>10} {line.final_placements:>5} {amount:>20} {credits:>16}"
            )
    for b in rec.balances:
        state = "balanced" if b.balanced else "NOT BALANCED"
        if rec.capacity.failed:  # the sums add up over capacity that was sold twice
            state = (
                f"NOT RECONCILED: capacity OVERSOLD (sums {'equal' if b.balanced else 'differ'})"
            )
        out.append(
            f"{b.currency}/{b.currency_scale}: buyers owe "
            f"{format_minor(b.buyer_owes_minor, b.currency_scale)} = operators "
            f"{format_minor(b.operator_receives_minor, b.currency_scale)} + desks "
            f"{format_minor(b.desk_receives_minor, b.currency_scale)}: {state}"
        )
    out += render_capacity(rec.capacity)
    return out
