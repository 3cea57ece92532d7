"""Capacity is sold once, within one ordered stream (SPEC §6.5).

The fold is per placement; whether terms oversell a GPU depends on other placements. To
stay a pure function of one ordered sequence, the ledger compares new terms only with
the **claims** of placements whose terms were accepted earlier in the same ordered
stream — the same *scope*: one Kafka partition (``kafka:<topic>:<partition>``) or one
embedded transport source (``local:<source>``). A rebuild from offset 0 reads the scope
in the same order and decides the same.

A claim is (GPU uuid, placement, ``[window_start_ms, end)``, share_milli), with ``end``
the window end, or the ``effective_at_ms`` of the placement's accepted reclaim if
earlier (a reclaim naming the GPU gives it back at that time; the reclaim travels in the
placement's own stream, hence in the same scope and order).

``CapacityIndex`` holds the claims per scope in memory; the fold reads the claims a
terms input needs (``claims_for``) and passes them to ``decide`` as data; ``oversold``
is the rule ``decide`` applies, to first terms and amendments alike. An accepted
amendment's claims replace those of the terms it amends (a GPU it no longer lists is
free again). The index's changed rows, and the keys of the rows an amendment or a reclaim
at the window's start ended, are stored in the same store transaction as the records and
offsets they came from (``ledger/store/``, ``capacity_claims``), and loaded back on
start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

from proto.reasons import Reason
from proto.records import PlacementTerms

WHOLE_GPU: Final = 1000  # share-milli of one whole GPU


class CapClaim(msgspec.Struct, frozen=True):
    """One placement's claim on one GPU: ``share_milli`` over ``[start_ms, end_ms)``."""

    placement_id: str
    start_ms: int
    end_ms: int
    share_milli: int


# uuid -> the claims of other placements on it, in one scope.
Claims = Mapping[str, Sequence[CapClaim]]

# (scope, uuid, placement_id, start_ms, end_ms, share_milli): one stored row.
ClaimRow = tuple[str, str, str, int, int, int]

# (scope, uuid, placement_id): the key of a stored row.
ClaimKey = tuple[str, str, str]


class ShardClaims(dict[str, tuple[CapClaim, ...]]):
    """The claims of one stream on the GPUs of terms, with the capacity log's refusal of
    those terms when a ledger runs several streams (SPEC §6.5 across shards): the
    reason (OVERSOLD or CAPACITY_LATE) and the detail naming the granted claim."""

    refusal: tuple[Reason, str] | None = None


def capacity_refusal(terms: PlacementTerms, claims: Claims) -> tuple[Reason, str] | None:
    """SPEC §6.5: why the terms may not claim their GPUs (the capacity log's refusal
    first, then the rule within one stream), or None."""
    if isinstance(claims, ShardClaims) and claims.refusal is not None:
        return claims.refusal
    over = oversold(terms, claims)
    return None if over is None else (Reason.OVERSOLD, over)


def scope_of(position: str) -> str:
    """The ordered stream a position belongs to: the position without its place in it.

    ``kafka:<topic>:<partition>:<offset>`` -> ``kafka:<topic>:<partition>``;
    ``local:<source>:<segment>:<offset>`` -> ``local``: the embedded transport's inputs
    all pass through the ledger's one intake log (SPEC §6.4), a single order whatever
    spool they came from; anything else (tests, tools) -> the text before its last ``:``.
    """
    if position.startswith("local:"):
        return "local"
    return position.rsplit(":", 1)[0] if ":" in position else ""


def oversold(terms: PlacementTerms, claims: Claims) -> str | None:
    """SPEC §6.5: None when the terms fit, else the detail naming the first conflict.

    For each GPU of the terms (in terms order), the shares of the claims on it that
    overlap the window, together with the terms' own share, must not exceed one whole
    GPU at any moment of the window.
    """
    lo, hi = terms.window_start_ms, terms.window_end_ms
    for gpu in terms.gpus:
        others = [  # an empty claim (ended at its start) overlaps nothing
            c
            for c in claims.get(gpu.uuid, ())
            if c.placement_id != terms.placement_id
            and c.start_ms < hi
            and lo < c.end_ms
            and c.start_ms < c.end_ms
        ]
        if not others:
            continue
        peak, at, active = _peak(others, lo, hi)
        if peak + gpu.share_milli > WHOLE_GPU:
            names = ", ".join(sorted(active))
            return (
                f"GPU {gpu.uuid} is sold to placement {names} at {at}: "
                f"{peak} + {gpu.share_milli} > {WHOLE_GPU} share-milli"
            )
    return None


def _peak(claims: Sequence[CapClaim], lo: int, hi: int) -> tuple[int, int, list[str]]:
    """The largest sum of shares inside [lo, hi), the first instant it is reached, and
    the placements active then."""
    events = sorted(
        [(max(c.start_ms, lo), 1, i) for i, c in enumerate(claims)]
        + [(min(c.end_ms, hi), 0, i) for i, c in enumerate(claims)]
    )
    active: dict[int, CapClaim] = {}
    total = peak = 0
    peak_at, peak_active = lo, []
    for n, (at, is_start, i) in enumerate(events):
        if is_start:
            active[i] = claims[i]
            total += claims[i].share_milli
        else:
            total -= active.pop(i).share_milli
        last_at_instant = n + 1 == len(events) or events[n + 1][0] != at
        if last_at_instant and total > peak:
            peak, peak_at = total, at
            peak_active = [c.placement_id for c in active.values()]
    return peak, peak_at, peak_active


class CapacityIndex:
    """The claims per scope, in memory, with the rows changed since the last commit."""

    def __init__(self) -> None:
        self._claims: dict[str, dict[str, dict[str, CapClaim]]] = {}
        # placement -> the (scope, uuid) of its claims: an amendment finds its own
        # without a scan of every claim
        self._of: dict[str, set[tuple[str, str]]] = {}
        # changed since the last commit: the claim now, or None when it is gone
        self._dirty: dict[ClaimKey, CapClaim | None] = {}

    def load(self, rows: Iterable[ClaimRow]) -> None:
        """Rows as stored (on start, before any input)."""
        for scope, uuid, placement_id, start, end, share in rows:
            if end <= start:  # stored by an older ledger for a reclaim at the start: nothing
                continue
            claim = CapClaim(placement_id, start, end, share)
            self._claims.setdefault(scope, {}).setdefault(uuid, {})[placement_id] = claim
            self._of.setdefault(placement_id, set()).add((scope, uuid))

    def claims_for(self, scope: str, terms: PlacementTerms) -> dict[str, tuple[CapClaim, ...]]:
        """The claims in ``scope`` on the GPUs of ``terms`` (what ``decide`` needs)."""
        by_uuid = self._claims.get(scope, {})
        return {g.uuid: tuple(by_uuid.get(g.uuid, {}).values()) for g in terms.gpus}

    def _put(self, scope: str, uuid: str, claim: CapClaim) -> None:
        self._claims.setdefault(scope, {}).setdefault(uuid, {})[claim.placement_id] = claim
        self._of.setdefault(claim.placement_id, set()).add((scope, uuid))
        self._dirty[(scope, uuid, claim.placement_id)] = claim

    def _drop(self, scope: str, uuid: str, placement_id: str) -> None:
        by_uuid = self._claims.get(scope, {})
        mine = by_uuid.get(uuid, {})
        if mine.pop(placement_id, None) is None:
            return
        if not mine:
            del by_uuid[uuid]
        held = self._of[placement_id]
        held.discard((scope, uuid))
        if not held:
            del self._of[placement_id]
        self._dirty[(scope, uuid, placement_id)] = None

    def accept_terms(self, scope: str, terms: PlacementTerms) -> None:
        """Accepted terms claim their GPUs over their window. Accepted amendments replace
        the claims of the terms they amend (SPEC §6.5): a GPU they no longer list is no
        longer claimed, in whichever scope the amended terms claimed it."""
        listed = {gpu.uuid for gpu in terms.gpus}
        for held_scope, uuid in sorted(self._of.get(terms.placement_id, ())):
            if uuid not in listed or held_scope != scope:
                self._drop(held_scope, uuid, terms.placement_id)
        for gpu in terms.gpus:
            claim = CapClaim(
                terms.placement_id, terms.window_start_ms, terms.window_end_ms, gpu.share_milli
            )
            self._put(scope, gpu.uuid, claim)

    def accept_reclaim(self, placement_id: str, uuids: Iterable[str], effective_at_ms: int) -> None:
        """An accepted reclaim ends the placement's claims on ``uuids`` at its effective time
        (in whichever scope its terms claimed them)."""
        wanted = set(uuids)
        for scope, uuid in sorted(self._of.get(placement_id, ())):
            claim = self._claims[scope][uuid][placement_id]
            if uuid not in wanted or effective_at_ms >= claim.end_ms:
                continue
            if effective_at_ms <= claim.start_ms:  # given back before it began
                self._drop(scope, uuid, placement_id)
            else:
                self._put(scope, uuid, msgspec.structs.replace(claim, end_ms=effective_at_ms))

    def dirty_rows(self) -> list[ClaimRow]:
        """The rows changed since ``clear_dirty`` (to insert or replace), sorted."""
        return sorted(
            (scope, uuid, pid, c.start_ms, c.end_ms, c.share_milli)
            for (scope, uuid, pid), c in self._dirty.items()
            if c is not None
        )

    def gone_rows(self) -> list[ClaimKey]:
        """The keys of the rows gone since ``clear_dirty`` (to delete), sorted."""
        return sorted(key for key, c in self._dirty.items() if c is None)

    def clear_dirty(self) -> None:
        """After the changed rows were committed."""
        self._dirty.clear()
