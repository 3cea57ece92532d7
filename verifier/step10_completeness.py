"""(10) completeness: the whole, final, witnessed obligation? (SPEC.md §9)

Reads only what steps (1)-(9) already checked — statements, checkpoints, the close —
and asks what they add up to (the rule itself: ``verifier/witnessed.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proto.trust import TrustFile
from verifier.findings import Step
from verifier.witnessed import judge

if TYPE_CHECKING:
    from verifier.state import Verification


def check_completeness(run: Verification, trust: TrustFile) -> None:
    """Step (10) into the report: its level, what is missing, any finding."""
    statements = [
        (int(index), bool(final))
        for index, final in run.source.small_table(
            "statements", "through_index, final", "through_index"
        )
    ]
    notes = [str(n) for (n,) in run.source.small_table("checkpoints", "note", "size")]
    # SPEC §6.6: a simulation when a statement signs ``sender`` (or the meta row says so:
    # relabelling that unsigned row can only make a verdict more cautious, never FINAL).
    if "sender" in run.arrival_modes:
        run.report.arrival = "sender"
    result = judge(
        terms=run.terms,
        trust=trust,
        record_count=run.record_count,
        closed=run.close_index is not None,
        statements=statements,
        checkpoint_notes=notes,
        simulation=run.report.arrival == "sender",
        new_buyers=[a.new_buyer for a in run.referee.assignments],
        first_arrived_ms=run.first_arrived,
    )
    for rule, where, expected, actual, message in result.findings:
        run.add(Step.COMPLETENESS, rule, where, expected, actual, message)
    report = run.report
    report.level = result.level
    report.provisional = list(result.reasons)
    report.witnessed_by = list(result.witnessed_by)
    report.record_count = run.record_count
