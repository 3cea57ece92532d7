"""What each side hands the renderer: facts it established itself.

The ledger fills these from its store, the verifier from what it decoded and recomputed;
nothing here is computed from the other side's word. ``signers`` are the parties whose
signatures the envelope carries, as ``"operator acme-gpu-cloud"`` (``signer_names``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from proto.keys import key_id
from proto.records import PlacementTerms, ResaleTotals, Totals

Level = Literal["FINAL", "PROVISIONAL", "FAILED"]
Renderer = Literal["ledger", "verifier"]
PARTY_ROLES: Final = ("buyer", "operator", "desk")
# Adjustments listed one by one on a bill; past it the rest still count in the totals and
# one line says how many were left out (BOUNDS.md).
MAX_ADJUSTMENT_LINES: Final = 1_000


@dataclass(frozen=True)
class StatementFacts:
    """The statement the bill shows (SPEC §8): its position and its totals."""

    through_index: int
    head: str
    final: bool
    period: int
    previous: str
    totals: Totals
    # SPEC §7.10: the statement's resale list (one entry per accepted assignment).
    resale: tuple[ResaleTotals, ...] = ()


@dataclass(frozen=True)
class AssignmentFacts:
    """An accepted assignment (SPEC §6.8): who bought which GPUs from when, at what rate."""

    chain_index: int
    assignment_id: str
    new_buyer: str
    handover_ms: int  # the effective handover h = max(handover_at_ms, arrival)
    handover_at_ms: int
    gpus: tuple[str, ...]
    rate_per_gpu_hour_minor: int
    signers: tuple[str, ...]


@dataclass(frozen=True)
class PeriodFacts:
    """A statement period with a final statement (SPEC §8 "Statement periods")."""

    period: int
    through_index: int
    totals: Totals
    latest: bool


@dataclass(frozen=True)
class ReclaimFacts:
    """The accepted reclaim notice (SPEC §6.3, §7.3)."""

    chain_index: int
    reclaim_id: str
    issued_at_ms: int
    effective_at_ms: int
    reason: str
    signers: tuple[str, ...]
    arrived_ms: int | None = None
    """When the notice reached the log (SPEC §6.6): the notice runs from here. None only
    for a record chained before arrival times existed (then from ``issued_at_ms``)."""

    @property
    def notice_from_ms(self) -> int:
        """Where the notice given is counted from (SPEC §7.3)."""
        return self.issued_at_ms if self.arrived_ms is None else self.arrived_ms


@dataclass(frozen=True)
class ReleaseFacts:
    """The accepted buyer release (SPEC §6.7, §7.9) and the times its charge rests on."""

    chain_index: int
    release_id: str
    issued_at_ms: int
    effective_at_ms: int
    end_ms: int
    """e = max(effective_at_ms, arrival, end of the usage folded before it)."""
    end_before_ms: int
    """The effective end just before it: the window end, or an earlier reclaim's time."""
    reason: str
    signers: tuple[str, ...]
    arrived_ms: int | None = None

    @property
    def notice_from_ms(self) -> int:
        """Where the release notice runs from (SPEC §7.9): its arrival."""
        return self.issued_at_ms if self.arrived_ms is None else self.arrived_ms


@dataclass(frozen=True)
class AdjustmentFacts:
    """One chained adjustment (SPEC §7.4); ``accepted`` False: shown, not counted."""

    chain_index: int
    adjustment_id: str
    direction: str
    amount_minor: int
    reference: str
    reason: str
    issued_at_ms: int
    signers: tuple[str, ...]
    accepted: bool
    reject_reason: str = ""


@dataclass(frozen=True)
class AttestationFacts:
    """Accepted hardware evidence for one node key (SPEC §6.9): which GPUs, by whom, when.
    ``attester`` is the id of the attestation root that signed it, "" when the side that
    established it had none to check against."""

    node_id: str
    key_id: str
    gpus: tuple[str, ...]
    attester: str
    iss: str
    iat: int
    chain_index: int


@dataclass(frozen=True)
class CheckpointFacts:
    """The checkpoint over the log (SPEC §8.1) and whose cosignatures verify on it."""

    size: int
    root_b64: str
    cosigners: tuple[str, ...]


@dataclass(frozen=True)
class VerdictFacts:
    """How far the figures are established: FINAL, PROVISIONAL or FAILED, by whom, why."""

    level: Level
    by: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class BillFacts:
    """Everything one statement page shows, as one side established it."""

    renderer: Renderer
    terms: PlacementTerms
    statement: StatementFacts
    record_count: int
    periods: tuple[PeriodFacts, ...] = ()
    reclaim: ReclaimFacts | None = None
    adjustments: tuple[AdjustmentFacts, ...] = ()
    adjustments_left_out: int = 0  # chained adjustments past MAX_ADJUSTMENT_LINES
    close_index: int | None = None
    closed_at_ms: int | None = None
    checkpoint: CheckpointFacts | None = None
    verdict: VerdictFacts = field(
        default_factory=lambda: VerdictFacts("PROVISIONAL", "nobody", ("not verified",))
    )
    source: str = ""  # where the figures come from, for the page's footer
    # SPEC §6.8: the accepted assignments, in chain order (their figures: statement.resale)
    assignments: tuple[AssignmentFacts, ...] = ()
    release: ReleaseFacts | None = None  # SPEC §6.7
    attestations: tuple[AttestationFacts, ...] = ()  # SPEC §6.9, in chain order


def signer_names(terms: PlacementTerms, keyids: Iterable[str]) -> tuple[str, ...]:
    """The parties of ``terms`` whose key ids are among ``keyids``: ``"operator ID"``;
    a key id of nobody in the terms is shown as ``"key KEYID"``."""
    by_id = {
        key_id(party.key): f"{role} {party.id}"
        for role, party in (
            ("operator", terms.operator),
            ("buyer", terms.buyer),
            ("desk", terms.desk),
        )
    }
    by_id.setdefault(key_id(terms.ledger_key), "ledger")
    return tuple(by_id.get(k, f"key {k}") for k in keyids)


def effective_end_at_close(facts: BillFacts) -> int:
    """The effective end SPEC §7.5 reads at the close (or now, while open): the reclaim's
    effective time when it was accepted before the close, else the window end."""
    end = facts.terms.window_end_ms
    reclaim, release = facts.reclaim, facts.release
    if reclaim is not None and (
        facts.close_index is None or reclaim.chain_index < facts.close_index
    ):
        end = min(end, reclaim.effective_at_ms)
    if release is not None and (
        facts.close_index is None or release.chain_index < facts.close_index
    ):
        end = min(end, release.end_ms)  # SPEC §6.7: whichever ends earlier
    return end


def effective_end(facts: BillFacts) -> int:
    """Where delivery stops counting (SPEC §6.3 reclaim, §6.7 release): the earlier of the
    reclaim's time and the release's end, or the window end."""
    end = facts.terms.window_end_ms
    if facts.reclaim is not None:
        end = min(end, facts.reclaim.effective_at_ms)
    if facts.release is not None:
        end = min(end, facts.release.end_ms)
    return end
