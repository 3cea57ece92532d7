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
from proto.records import PlacementTerms, Totals

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
    reclaim = facts.reclaim
    if reclaim is not None and (
        facts.close_index is None or reclaim.chain_index < facts.close_index
    ):
        return reclaim.effective_at_ms
    return facts.terms.window_end_ms


def effective_end(facts: BillFacts) -> int:
    """Where delivery stops counting (SPEC §6.3 reclaim): the reclaim's time, or the end."""
    if facts.reclaim is not None:
        return facts.reclaim.effective_at_ms
    return facts.terms.window_end_ms
