"""The fold (SPEC.md §6-§7): inputs of a placement, in stream order -> chained records.

A pure function of the ordered inputs: no clock, no I/O. ``Fold.apply`` takes one raw
input and returns its outcomes (more than one when accepted terms release held inputs).
State per placement is snapshotted with ``snapshot``/``restore`` so the service can
persist it in the same transaction as the records and offsets it produced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from proto.envelope import Opened
from proto.keys import SigningKey
from proto.reasons import Reason
from proto.records import LedgerRecord, Status

Decision = Literal["chained", "dropped", "quarantined", "held"]

# (placement_id, node_id, seq) -> (input_hash, record_hash) of the accepted usage event at
# that seq, or None. Only consulted for a seq older than the stream's last accepted one.
UsageLookup = Callable[[str, str, int], tuple[str, str] | None]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one input."""

    decision: Decision
    position: str
    raw: bytes
    input_hash: str
    placement_id: str | None
    kind: str | None
    opened: Opened | None
    status: Status | None
    reason: Reason | None
    record: LedgerRecord | None
    record_envelope: bytes | None
    record_hash: str | None


class Fold:
    """Folds the inputs of many placements; see the module docstring."""

    def __init__(self, ledger_key: SigningKey, lookup: UsageLookup | None = None) -> None:
        self.ledger_key = ledger_key
        self.lookup = lookup

    def apply(self, raw: bytes, position: str, stream_key: str | None) -> list[Outcome]:
        """Process one input received at ``position`` under transport key ``stream_key``."""
        raise NotImplementedError

    def dirty(self) -> set[str]:
        """Placements whose state changed since the last ``clear_dirty``."""
        raise NotImplementedError

    def clear_dirty(self) -> None:
        """Forget which placements changed (after their snapshots were stored)."""
        raise NotImplementedError

    def snapshot(self, placement_id: str) -> bytes:
        """The placement's fold state as bytes (msgpack), to store beside its records."""
        raise NotImplementedError

    def restore(self, placement_id: str, data: bytes) -> None:
        """Load a snapshot taken by ``snapshot`` (on start, before any ``apply``)."""
        raise NotImplementedError

    def evict(self, placement_id: str) -> None:
        """Drop a placement's state from memory (it can be restored later)."""
        raise NotImplementedError

    def is_closed(self, placement_id: str) -> bool:
        """True when the placement has an accepted PlacementClosed."""
        raise NotImplementedError

    def close_due_ms(self, placement_id: str) -> int | None:
        """window_end_ms + late_grace_ms of the placement; None without accepted terms."""
        raise NotImplementedError

    def open_placements(self) -> list[str]:
        """Placements in memory with accepted terms and not closed."""
        raise NotImplementedError
