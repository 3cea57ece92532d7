"""Capacity is sold once, across exports (SPEC §6.5): ``verify DIR`` and the reconciliation.

One export shows one placement; a GPU sold twice shows only when the exports of both
placements are read together. For every export that verified (its terms accepted and
signed by its three parties) this module reads the placement's **claims**: for each GPU
of the terms in force (the last accepted: an amendment replaces the terms it amends),
``(uuid, share_milli)`` over ``[window_start_ms, end)`` where ``end`` is
``window_end_ms``, or the ``effective_at_ms`` of an accepted reclaim naming that GPU if
earlier (a reclaimed placement gives its GPU back at the effective time).

Per GPU uuid the claims are swept in time order; every stretch of time in which the
shares of the claims then active add up to more than 1000 share-milli (one whole GPU) is
a finding ``OVERSOLD`` naming the placements active in it, the GPU, the time range and
the operator(s). Copies of one placement (the same placement id in several exports)
claim once: the copy with the most records stands, as in ``verifier/copies.py``.

Reads only envelope bytes (decoded strictly, ``proto.envelope``); independent of the
ledger's rule (``ledger/capacity.py``), as the verifier is of the whole fold.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.records import BuyerRelease, LedgerRecord, PlacementTerms, ReclaimNotice
from verifier import limits
from verifier.source import ALIAS, ExportSource, blob
from verifier.state import FAILED, UNUSABLE, ExportReport
from verifier.terms_rules import spelled

# One whole GPU, in share-milli (SPEC §4.1: share_milli 1..1000).
WHOLE_GPU: Final = 1000
ACCEPTED: Final = "accepted"


@dataclass(frozen=True, slots=True)
class Claim:
    """One placement's claim on one GPU: ``share_milli`` over ``[start_ms, end_ms)``."""

    uuid: str
    placement_id: str
    operator: str
    start_ms: int
    end_ms: int
    share_milli: int
    path: str


@dataclass(frozen=True, slots=True)
class Oversold:
    """A stretch of time in which one GPU's claims add up to more than one GPU."""

    uuid: str
    start_ms: int
    end_ms: int
    share_milli: int  # the largest sum of shares in the stretch
    placements: tuple[str, ...]
    operators: tuple[str, ...]
    paths: tuple[str, ...]

    def line(self) -> str:
        """One human line, naming the GPU, the placements, the time range, the operator."""
        return (
            f"OVERSOLD: GPU {self.uuid} sold to placements {', '.join(self.placements)} "
            f"for [{self.start_ms}, {self.end_ms}) (up to {self.share_milli} share-milli "
            f"> {WHOLE_GPU}); operator {', '.join(self.operators)}"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (rule ``OVERSOLD``)."""
        return {"rule": "OVERSOLD", **asdict(self)}


@dataclass
class CapacityReport:
    """Every oversold stretch found (at most MAX_FINDINGS_PER_RULE kept, all counted)."""

    claims: int = 0
    total: int = 0
    oversold: list[Oversold] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # verified exports we could not reread

    def __bool__(self) -> bool:
        return self.failed

    @property
    def failed(self) -> bool:
        """True when a GPU is oversold, or a counted export could not be reread."""
        return self.total > 0 or bool(self.unreadable)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "claims": self.claims,
            "oversold_total": self.total,
            "oversold": [o.to_json() for o in self.oversold],
            "unreadable": self.unreadable,
        }


# ---- reading the claims of one export ------------------------------------------------------


def _accepted_records(source: ExportSource, table: str) -> list[Any]:
    rows = source.small_table(table, "chain_index, envelope, status", "chain_index")
    out = []
    for _, raw, status in rows:
        if status != ACCEPTED:
            continue
        try:
            out.append(open_envelope(blob(raw)).record)
        except ProtoError:
            continue  # a verified export has none; step (4) names it otherwise
    return out


def claims_of_source(source: ExportSource, path: str) -> tuple[int, list[Claim]]:
    """(record count, claims) of the export open at ``source``."""
    terms = [t for t in _accepted_records(source, "terms") if isinstance(t, PlacementTerms)]
    if not terms:
        return source.count("ledger_records"), []
    t = terms[-1]  # the terms in force: an accepted amendment replaces what it amends
    ends: dict[str, int] = {}
    for notice in _accepted_records(source, "reclaims"):
        if isinstance(notice, ReclaimNotice):
            for uuid in notice.gpus:
                ends[uuid] = min(ends.get(uuid, notice.effective_at_ms), notice.effective_at_ms)
    release_end = _release_end(source)
    claims = []
    for gpu in t.gpus:
        end = min(t.window_end_ms, ends.get(gpu.uuid, t.window_end_ms))
        if release_end is not None:
            end = min(end, release_end)
        if end > t.window_start_ms:
            claims.append(
                Claim(
                    gpu.uuid,
                    t.placement_id,
                    t.operator.id,
                    t.window_start_ms,
                    end,
                    gpu.share_milli,
                    path,
                )
            )
    return source.count("ledger_records"), claims


def _release_end(source: ExportSource) -> int | None:
    """SPEC §6.7: the end e of the export's accepted release, if any: max(effective_at_ms,
    the arrival its LedgerRecord carries, the end of the usage accepted before it)."""
    if not any(t.name == "releases" for t in source.input_tables):
        return None
    rows = source.small_table("releases", "chain_index, envelope, status", "chain_index")
    for index, raw, status in rows:
        if status != ACCEPTED:
            continue
        try:
            release = open_envelope(blob(raw)).record
            ledger_raw = source.scalar(
                f"SELECT envelope FROM {ALIAS}.ledger_records WHERE chain_index = ? "
                "ORDER BY rowid LIMIT 1",
                [index],
            )
            ledger = open_envelope(blob(ledger_raw)).record
        except ProtoError:
            continue  # a verified export has none; step (4) names it otherwise
        if not isinstance(release, BuyerRelease) or not isinstance(ledger, LedgerRecord):
            continue
        arrived = release.issued_at_ms if ledger.arrived_ms is None else ledger.arrived_ms
        usage_end = source.scalar(
            f"SELECT max(end_ms) FROM {ALIAS}.usage_events "
            "WHERE status = 'accepted' AND chain_index < ?",
            [index],
        )
        return max(release.effective_at_ms, arrived, int(usage_end or 0))
    return None


@lru_cache(maxsize=limits.MAX_EXPORTS_PER_RUN)
def _claims_cached(path: str, _size: int, _mtime_ns: int) -> tuple[int, tuple[Claim, ...]]:
    with ExportSource(Path(path)) as source:
        size, claims = claims_of_source(source, path)
    return size, tuple(claims)


def claims_of(path: str) -> tuple[int, tuple[Claim, ...]]:
    """(record count, claims) of the export at ``path`` (read once per file version)."""
    st = os.stat(path)
    return _claims_cached(path, st.st_size, st.st_mtime_ns)


# ---- the sweep -----------------------------------------------------------------------------


def find_oversold(claims: Iterable[Claim]) -> list[Oversold]:
    """Every maximal stretch, per GPU, whose active shares add up to more than one GPU.

    Stretches with the same set of active placements that touch are merged; the result
    is sorted by GPU (its canonical spelling, SPEC §5 (3)) and start time.
    """
    by_gpu: dict[str, list[Claim]] = defaultdict(list)
    for claim in claims:
        # SPEC §5 (3): one device whatever the letter case its uuid is spelled in.
        by_gpu[spelled(claim.uuid)].append(claim)
    found: list[Oversold] = []
    for uuid in sorted(by_gpu):
        gpu_claims = by_gpu[uuid]
        if sum(c.share_milli for c in gpu_claims) <= WHOLE_GPU:
            continue  # cannot exceed one GPU at any moment
        found.extend(_sweep(uuid, gpu_claims))
    return found


def _sweep(uuid: str, claims: Sequence[Claim]) -> list[Oversold]:
    # Events in time order; at one instant ends come before starts ([start, end)).
    events = sorted(
        [(c.start_ms, 1, i) for i, c in enumerate(claims)]
        + [(c.end_ms, 0, i) for i, c in enumerate(claims)]
    )
    active: dict[int, Claim] = {}
    total = 0
    out: list[Oversold] = []
    for n, (at, is_start, i) in enumerate(events):
        if is_start:
            active[i] = claims[i]
            total += claims[i].share_milli
        else:
            total -= active.pop(i).share_milli
        nxt = events[n + 1][0] if n + 1 < len(events) else at
        if total <= WHOLE_GPU or nxt == at:
            continue  # not oversold, or an instant of zero length
        _add(out, uuid, at, nxt, total, list(active.values()))
    return out


def _add(out: list[Oversold], uuid: str, lo: int, hi: int, total: int, active: list[Claim]) -> None:
    placements = tuple(sorted({c.placement_id for c in active}))
    prev = out[-1] if out else None
    if prev is not None and prev.end_ms == lo and prev.placements == placements:
        out[-1] = Oversold(
            uuid,
            prev.start_ms,
            hi,
            max(prev.share_milli, total),
            placements,
            prev.operators,
            prev.paths,
        )
        return
    out.append(
        Oversold(
            uuid,
            lo,
            hi,
            total,
            placements,
            tuple(sorted({c.operator for c in active})),
            tuple(sorted({c.path for c in active})),
        )
    )


def counted(report: ExportReport) -> bool:
    """Whether an export's claims count: it was read and nothing in it failed."""
    return report.verdict not in (FAILED, UNUSABLE) and bool(report.placement_id)


def check_capacity(reports: Iterable[ExportReport]) -> CapacityReport:
    """Claims of every counted export, one copy per placement, swept per GPU."""
    result = CapacityReport()
    standing: dict[str, tuple[int, str, tuple[Claim, ...]]] = {}
    for report in reports:
        if not counted(report):
            continue
        try:
            size, claims = claims_of(report.path)
        except Exception:  # the file changed or vanished since it verified
            result.unreadable.append(report.path)
            continue
        pid = report.placement_id
        best = standing.get(pid)
        if best is None or (-size, report.path) < (-best[0], best[1]):
            standing[pid] = (size, report.path, claims)
    every = [c for _, _, claims in standing.values() for c in claims]
    result.claims = len(every)
    found = find_oversold(every)
    result.total = len(found)
    result.oversold = found[: limits.MAX_FINDINGS_PER_RULE]
    return result


def render_capacity(capacity: CapacityReport) -> list[str]:
    """Text lines: one per oversold stretch (and how many more were not shown)."""
    lines = [o.line() for o in capacity.oversold]
    if capacity.total > len(capacity.oversold):
        lines.append(f"... and {capacity.total - len(capacity.oversold)} more OVERSOLD not shown")
    for path in capacity.unreadable:
        lines.append(f"FAIL: {path}: could not be reread for the capacity check")
    return lines
