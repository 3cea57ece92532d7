"""What one verification of one export carries: the report it fills, and the run state the
steps (1)-(9) share once the terms are known.

``ExportReport`` is the result (``verify_export`` returns it). ``Verification`` exists
only after step (3) found readable terms, so every step after it can rely on them; every
attribute is set in ``__init__``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

from billview.build import build
from billview.doc import BillDoc, GpuRow
from billview.facts import BillFacts, VerdictFacts
from proto.attestation import AttestationRoot
from proto.limits import ARRIVAL_REQUIRED_FROM_MS
from proto.records import PlacementTerms
from verifier.cosigned_time import CosignedTimes
from verifier.decisions import Claim, Referee
from verifier.findings import Findings, Step
from verifier.merkle_stream import CheckpointRoots
from verifier.pricing import DeferredPricing
from verifier.progress import Progress
from verifier.source import ExportSource, InputRow, RecordRow
from verifier.work_tables import WorkTables
from verifier.workers import OpenPool

# The verdict on one export: the CLI exits 0, 1 or 2 on it.
ExportVerdict = Literal["verified", "failed", "unusable"]

VERIFIED: Final[ExportVerdict] = "verified"
FAILED: Final[ExportVerdict] = "failed"
UNUSABLE: Final[ExportVerdict] = "unusable"


class Reread(NamedTuple):
    """Rows of chain indices [lo, hi) read again from the export by the main process (the
    first ledger_records and usage_events row of each index, by chain_index): for the
    pairs a worker settled whose findings need their rows (``verifier/walk.py``)."""

    lo: int
    hi: int
    records: dict[int, RecordRow]
    inputs: dict[int, InputRow]


@dataclass
class ExportReport:
    """The outcome of verifying one export."""

    path: str
    verdict: ExportVerdict = FAILED
    error: str = ""
    placement_id: str = ""
    findings: Findings = field(default_factory=Findings)
    totals: dict[str, int] | None = None
    # SPEC §7.10: the recomputed resale list at the head (one dict per accepted
    # assignment, RESALE_FIELDS), empty without resale.
    resale: list[dict[str, Any]] = field(default_factory=list)
    head_index: int | None = None
    final: bool = False
    currency: str = ""
    currency_scale: int = 0
    parties: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    # SPEC §8 statement periods with a final statement: period, through_index, totals,
    # and ``latest`` on the last one.
    periods: list[dict[str, object]] = field(default_factory=list)
    elapsed_s: float = 0.0
    # Step (10): "final" (complete, final, witnessed) or "provisional" (verified as far
    # as it goes; ``provisional`` says what is missing). Empty until step (10) ran.
    level: str = ""
    provisional: list[str] = field(default_factory=list)
    witnessed_by: list[str] = field(default_factory=list)
    record_count: int = 0
    # SPEC §6.9: each accepted attestation of a node key (node, key id, GPUs, attester —
    # the trust file's id, "" when none is pinned —, iss, iat, record index), and whether
    # the trust file pins attestation roots (signatures judged).
    attestations: list[dict[str, object]] = field(default_factory=list)
    attestation_checked: bool = False
    # SPEC §6.6: where the export says its arrival times come from (meta ``arrival``):
    # ``log`` (also when absent) or ``sender`` (a simulation). Stated, not checkable.
    arrival: str = "log"
    # ``verify --html``: what the bill shows, as this verification recomputed it
    # (verifier/bill.py); ``bill_error`` when it could not be gathered (never a finding).
    bill: BillParts | None = None
    bill_error: str = ""

    @property
    def ok(self) -> bool:
        """True when the export verified (no finding): final or provisional."""
        return self.verdict == VERIFIED

    @property
    def is_final(self) -> bool:
        """True when it verified and step (10) found it complete, final and witnessed."""
        return self.ok and self.level == "final"


class Verification:
    """Steps (4)-(9) of one export, after (3) accepted ``terms``: the state they share."""

    def __init__(
        self,
        source: ExportSource,
        report: ExportReport,
        pool: OpenPool[Any],
        progress: Progress,
        terms: PlacementTerms,
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
    ) -> None:
        self.source = source
        self.con: Any = source.con
        self.report = report
        self.findings = report.findings
        self.pool = pool
        self.progress = progress
        self.terms = terms
        self.ledger_key = terms.ledger_key
        self.placement_id = terms.placement_id
        self.counts: dict[str, int] = {}
        self.record_count = source.count("ledger_records")
        # (4)-(7) the single pass, in chain order
        self.work = WorkTables(self.con)
        self.referee = Referee(
            self.placement_id,
            self.ledger_key,
            self.work.usage_record_hash,
            attestation_roots=attestation_roots,
        )
        report.attestation_checked = attestation_roots is not None
        self.duplicates: set[int] = set()  # chain indices whose input repeats an earlier one
        self.prev_index = -1  # the last LedgerRecord read, for the prev link (6)
        self.prev_hash = ""
        self.close_index: int | None = None  # the first accepted close (7)
        self.last_arrived: int | None = None  # the highest arrived_ms so far (7, SPEC §6.6)
        self.first_arrived: int | None = None  # record 0's (10: the witnessing interval)
        # rows read again for findings, at most CHAIN_BATCH_INDICES of each (walk._rows_of)
        self.reread: Reread | None = None
        # the range being checked: its pairs' rows as a worker THREAD read them (DuckDB's
        # tuples, by chain index), so the rows a finding needs are not read again
        self.pair_rows: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] | None = None
        # (7) SPEC §6.6: an untimed record is a finding in a placement created after the rule
        self.untimed_arrival_finding = terms.created_at_ms >= ARRIVAL_REQUIRED_FROM_MS
        # SPEC §6.6: the arrival modes the statements sign (step 9), read by step (10).
        self.arrival_modes: set[str] = set()
        self.pending_claims: dict[int, tuple[Claim, str]] = {}  # adjustments decided later
        # (9) the recomputed totals read at the statements' indices (step9_obligation),
        # by chain index: what the report's head totals are when the head is among them
        self.totals_read: dict[int, dict[str, int]] = {}
        # (9) every LedgerRecord's hash and recomputed totals by chain index, when an export
        # of few records read them at once (``step9_obligation.check_records``), else None
        self.chain: dict[int, tuple[str, dict[str, int]]] | None = None
        # (9) the pricing deferred to a batch of exports (``verify_exports``): set by the
        # caller before the pass, kept by ``step9_obligation.price_base`` only when it did
        self.deferred: DeferredPricing | None = None
        # (8) the roots of the checkpoints' tree sizes, kept while the pass streams leaves
        self.roots = CheckpointRoots()
        # (7) SPEC §6.6: the bounds the cosigned checkpoints put on arrival (set before the pass)
        self.cosigned = CosignedTimes(())
        # (6) SPEC §8: who signs a LedgerRecord envelope. Version 1: the ledger key, always.
        # Version 2: nobody (a covering checkpoint authenticates it, step 8); a signature
        # that is present must still be the ledger key's and verify.
        self.format_version = source.meta.get("format_version", "1")
        ledger = self.referee.ledger_required
        self.unsigned_records = self.format_version != "1"
        self.record_required: dict[str, bytes] = {} if self.unsigned_records else ledger
        self.record_permitted: dict[str, bytes] = ledger

    def add(
        self, step: Step, rule: str, where: str, expected: object, actual: object, msg: str
    ) -> None:
        """Shorthand for one finding."""
        self.findings.add(step, rule, where, expected, actual, msg)

    def bump(self, name: str, n: int = 1) -> None:
        """Count something for the report."""
        self.counts[name] = self.counts.get(name, 0) + n


@dataclass(frozen=True)
class BillParts:
    """What the verification established for the bill, before its verdict is known."""

    facts: BillFacts
    gpus: list[GpuRow]
    note: str

    def doc(self, report: ExportReport) -> BillDoc:
        """The bill with the verification's verdict."""
        facts = dataclasses.replace(self.facts, verdict=verdict_of(report))
        return build(facts, self.gpus, self.note)


def verdict_of(report: ExportReport) -> VerdictFacts:
    """FINAL / PROVISIONAL / FAILED as ``gridledger verify`` judged the export."""
    by = f"verified offline by gridledger verify from {Path(report.path).name}"
    if not report.ok:
        reasons = [f.line() for f in report.findings.kept[:20]]
        return VerdictFacts("FAILED", by, (f"{report.findings.total} finding(s)", *reasons))
    if report.is_final:
        witnesses = ", ".join(report.witnessed_by) or "no witness required by the trust file"
        return VerdictFacts("FINAL", by, (f"witnessed by {witnesses}",))
    return VerdictFacts("PROVISIONAL", by, tuple(report.provisional))
