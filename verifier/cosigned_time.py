"""(7) arrival against the cosigned checkpoints (SPEC §6.6 "Bounded from both sides").

A valid cosignature of time ``T`` (seconds) on a ledger-signed checkpoint of size ``s``
says the witness saw records ``0..s-1`` at ``T`` and not record ``s``. So each record
``i < s`` carries ``arrived_ms <= 1000*T + MAX_CLOCK_SKEW_MS`` (else ``POSTDATED``) and
each record ``i >= s`` carries ``arrived_ms >= 1000*T - MAX_CLOCK_SKEW_MS`` (else
``BACKDATED``: dated before a checkpoint that did not hold it).

The cosignatures counted are those that verify under a key the user trusts for this
export: the terms' parties (step 3 checked them against the trust file), keys pinned as
``buyer`` (a resale's new buyer, SPEC §8.2) or as ``witness``, each under the id it is
pinned or named with. They are read before the pass, so each record is checked as it
streams by, in O(log checkpoints).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from proto.cosign import cosignature_of
from proto.errors import ProtoError
from proto.limits import MAX_CLOCK_SKEW_MS
from proto.note import LEDGER_NOTE_NAME, checkpoint_origin, parse_checkpoint_body, parse_note
from proto.records import PlacementTerms
from proto.trust import TrustFile


@dataclass(frozen=True, slots=True)
class Stamp:
    """One valid cosignature: on the checkpoint of ``size``, by ``name`` at ``at_s``."""

    size: int
    name: str
    at_s: int


@dataclass(frozen=True, slots=True)
class Violation:
    """A record dated outside a cosignature's bound."""

    code: str  # BACKDATED | POSTDATED
    expected: str
    detail: str


class CosignedTimes:
    """The floor and ceiling that the export's cosignatures put on each record's arrival."""

    def __init__(self, stamps: Iterable[Stamp]) -> None:
        self.stamps = sorted(stamps, key=lambda s: (s.size, s.at_s, s.name))
        sizes = sorted({s.size for s in self.stamps})
        self._sizes = sizes
        latest: dict[int, Stamp] = {}
        earliest: dict[int, Stamp] = {}
        for s in self.stamps:
            if s.size not in latest or s.at_s > latest[s.size].at_s:
                latest[s.size] = s
            if s.size not in earliest or s.at_s < earliest[s.size].at_s:
                earliest[s.size] = s
        # floor[k]: the latest cosignature on a checkpoint of size <= sizes[k]
        self._floor: list[Stamp] = []
        for size in sizes:
            best = latest[size]
            if self._floor and self._floor[-1].at_s >= best.at_s:
                best = self._floor[-1]
            self._floor.append(best)
        # ceiling[k]: the earliest cosignature on a checkpoint of size >= sizes[k]
        ceiling: list[Stamp] = []
        for size in reversed(sizes):
            best = earliest[size]
            if ceiling and ceiling[-1].at_s <= best.at_s:
                best = ceiling[-1]
            ceiling.append(best)
        self._ceiling = ceiling[::-1]

    def __bool__(self) -> bool:
        return bool(self.stamps)

    def violation(self, index: int, arrived_ms: int) -> Violation | None:
        """The bound record ``index`` dated ``arrived_ms`` breaks, if any."""
        if not self._sizes:
            return None
        k = bisect.bisect_right(self._sizes, index)  # sizes[:k] <= index < sizes[k:]
        if k > 0:
            floor = self._floor[k - 1]
            lowest = floor.at_s * 1000 - MAX_CLOCK_SKEW_MS
            if arrived_ms < lowest:
                return Violation(
                    "BACKDATED",
                    f"arrived_ms >= {lowest}",
                    f"SPEC §6.6: {floor.name} cosigned the checkpoint of size {floor.size}, "
                    f"which does not hold record {index}, at {floor.at_s} s "
                    f"(- {MAX_CLOCK_SKEW_MS} ms): nothing is dated before a checkpoint "
                    "that did not hold it",
                )
        if k < len(self._sizes):
            ceiling = self._ceiling[k]
            highest = ceiling.at_s * 1000 + MAX_CLOCK_SKEW_MS
            if arrived_ms > highest:
                return Violation(
                    "POSTDATED",
                    f"arrived_ms <= {highest}",
                    f"SPEC §6.6: {ceiling.name} cosigned the checkpoint of size {ceiling.size}, "
                    f"which holds record {index}, at {ceiling.at_s} s (+ {MAX_CLOCK_SKEW_MS} "
                    "ms): a record is not dated after a witness saw it",
                )
        return None


def trusted_cosigners(terms: PlacementTerms, trust: TrustFile) -> dict[str, bytes]:
    """Name -> key of every cosigner whose timestamps bound arrival (module docstring)."""
    names = {k.id: k.key for k in trust.keys if k.role in ("buyer", "witness")}
    names.update({p.id: p.key for p in (terms.operator, terms.buyer, terms.desk)})
    return names


def read_stamps(
    notes: Iterable[str], terms: PlacementTerms, cosigners: dict[str, bytes]
) -> list[Stamp]:
    """The valid cosignatures of ledger-signed checkpoints of this placement in ``notes``
    (a malformed or foreign note is step 8's finding, and bounds nothing here)."""
    origin = checkpoint_origin(terms.placement_id)
    stamps: list[Stamp] = []
    for text in notes:
        try:
            note = parse_note(text)
            body = parse_checkpoint_body(note.body)
        except ProtoError:
            continue
        if body.origin != origin or not note.signed_by(LEDGER_NOTE_NAME, terms.ledger_key):
            continue
        for name in sorted({s.name for s in note.signatures if s.name in cosigners}):
            cosigned = cosignature_of(note, name, cosigners[name])
            if cosigned is not None:
                stamps.append(Stamp(body.size, name, cosigned.timestamp_s))
    return stamps
