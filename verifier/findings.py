"""Findings: what did not check out, named by checklist step, rule, record, expected, actual.

The checklist (see ``verifier/verify.py``):

    (1) format      meta.format and meta.format_version
    (2) trust       the pinned keys and their roles
    (3) terms       one accepted terms row, signed by its parties, all keys pinned
    (4) envelopes   every envelope decodes canonically; input_hash = SHA-256(envelope)
    (5) columns     every convenience column equals the value in its envelope
    (6) chain       contiguous indices, ledger signatures, prev links, sources
    (7) decisions   every decision re-derived from SPEC §6
    (8) merkle      checkpoints: root, size, ledger signature, cosignatures
    (9) obligation  totals recomputed from SPEC §7, compared with records and statements
    (10) completeness  closed, final statement, checkpoint of the last record, witnessed
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

from verifier import limits


class Step(IntEnum):
    """The numbered steps of the verification checklist."""

    FORMAT = 1
    TRUST = 2
    TERMS = 3
    ENVELOPES = 4
    COLUMNS = 5
    CHAIN = 6
    DECISIONS = 7
    MERKLE = 8
    OBLIGATION = 9
    COMPLETENESS = 10

    @property
    def label(self) -> str:
        """``(7) decisions``: how a person reads the step."""
        return f"({self.value}) {self.name.lower()}"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that does not check out."""

    step: Step
    rule: str
    record: str
    expected: str
    actual: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON-ready mapping (step as number and name)."""
        data = asdict(self)
        data["step"] = int(self.step)
        data["step_name"] = self.step.name.lower()
        return data

    def line(self) -> str:
        """One human line: step, rule, record, expected vs actual, message."""
        return (
            f"{self.step.label} {self.rule} at {self.record}: expected {self.expected}, "
            f"actual {self.actual} — {self.message}"
        )


@dataclass
class Findings:
    """Collects findings: all counted per rule, at most MAX_FINDINGS_PER_RULE kept per rule."""

    kept: list[Finding] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    max_per_rule: int = limits.MAX_FINDINGS_PER_RULE
    _kept_per_rule: Counter[str] = field(default_factory=Counter)

    def add(
        self,
        step: Step,
        rule: str,
        record: str,
        expected: object,
        actual: object,
        message: str,
        *,
        counted: bool = False,
    ) -> None:
        """Count a finding; keep it unless its rule already has ``max_per_rule`` kept.

        ``counted`` keeps an example of findings already counted with ``count``.
        """
        if not counted:
            self.counts[rule] += 1
        if self._kept_per_rule[rule] < self.max_per_rule:
            self._kept_per_rule[rule] += 1
            self.kept.append(Finding(step, rule, record, str(expected), str(actual), message))

    def count(self, rule: str, n: int) -> None:
        """Count ``n`` findings of ``rule`` found by a set-based query (examples added apart)."""
        self.counts[rule] += n

    @property
    def total(self) -> int:
        """Every finding counted, kept or not."""
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return self.total > 0

    def rules(self) -> set[str]:
        """The rule ids that fired."""
        return {rule for rule, n in self.counts.items() if n}

    def steps(self) -> set[Step]:
        """The steps with at least one kept finding."""
        return {f.step for f in self.kept}

    def not_kept(self) -> dict[str, int]:
        """Per rule, how many findings were counted but not kept."""
        return {
            rule: n - self._kept_per_rule[rule]
            for rule, n in self.counts.items()
            if n > self._kept_per_rule[rule]
        }
