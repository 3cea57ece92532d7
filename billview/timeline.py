"""Per-GPU delivery over the window, and its picture.

Each side feeds ``TimelineBuilder.add`` the samples of the accepted usage events (one
GPU's intervals in time order, as its node's stream has them) with the state SPEC §7.1
gives each: ``delivered`` (it counts), ``unallocated`` (``allocated = false``) or
``unhealthy`` (flagged, or unhealthy by its evidence, §7.1.1). The builder clips to the
window, cuts at the effective end (after a reclaim the rest of the window is
``reclaimed``), fills what no accepted event covers as ``unreported``, merges neighbours
of one state, and counts milliseconds per state. A GPU's delivered milli-GPU-ms are, per
sample, its share times the sample's delivered milliseconds times its weight (SPEC §7.1,
§7.1.2: 10 000 bps but for degraded time the terms price at a share): summed over the
GPUs they are D. Delivered time is also counted where it was degraded, and where no
scheduler said who held the GPU (``allocation = "unknown"``, §7.1.2): the bill shows both.
"""

from __future__ import annotations

import datetime
import io
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from billview.doc import GpuRow, Segment
from billview.units import format_gpu_hours, format_minor
from proto.limits import MAX_BPS
from proto.records import PlacementTerms

DELIVERED: Final = "delivered"
UNHEALTHY: Final = "unhealthy"
UNALLOCATED: Final = "unallocated"
RECLAIMED: Final = "reclaimed"
UNREPORTED: Final = "unreported"
STATES: Final = (DELIVERED, UNHEALTHY, UNALLOCATED, RECLAIMED, UNREPORTED)
STATE_LABELS: Final = {
    DELIVERED: "delivered",
    UNHEALTHY: "unhealthy",
    UNALLOCATED: "unallocated",
    RECLAIMED: "reclaimed",
    UNREPORTED: "not reported",
}
COLORS: Final = {
    DELIVERED: "#2e7d32",
    UNHEALTHY: "#c62828",
    UNALLOCATED: "#9e9e9e",
    RECLAIMED: "#ef6c00",
    UNREPORTED: "#e3e3e3",
}
# Segments kept for the picture, over all GPUs; past it the counts stay exact and the
# picture is left out with a sentence saying why (BOUNDS.md).
MAX_TIMELINE_SEGMENTS: Final = 20_000


@dataclass
class _Gpu:
    cursor: int
    ms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    segments: list[list[int | str]] = field(default_factory=list)
    delivered_mgms: int = 0
    degraded_ms: int = 0
    unknown_ms: int = 0


class TimelineBuilder:
    """See the module docstring; ``effective_end_ms``: the reclaim's time or the window end."""

    def __init__(
        self,
        terms: PlacementTerms,
        effective_end_ms: int,
        *,
        max_segments: int = MAX_TIMELINE_SEGMENTS,
    ) -> None:
        self.terms = terms
        self.start = terms.window_start_ms
        self.end = max(self.start, min(effective_end_ms, terms.window_end_ms))
        self.max_segments = max_segments
        self.segment_count = 0
        self.truncated = False
        self.ignored = 0  # samples of GPUs the terms do not list (none in an honest log)
        self._gpus = {g.uuid: _Gpu(self.start) for g in terms.gpus}
        self._share = {g.uuid: g.share_milli for g in terms.gpus}

    def add(
        self,
        uuid: str,
        start_ms: int,
        end_ms: int,
        state: str,
        weight_bps: int = MAX_BPS,
        allocation_unknown: bool = False,
    ) -> None:
        """One sample of an accepted event: GPU ``uuid`` was in ``state`` over [start, end);
        delivered at ``weight_bps`` (SPEC §7.1.2), with no scheduler's word on its holder
        when ``allocation_unknown``."""
        gpu = self._gpus.get(uuid)
        if gpu is None or state not in (DELIVERED, UNHEALTHY, UNALLOCATED):
            self.ignored += 1
            return
        lo = max(start_ms, gpu.cursor, self.start)
        hi = min(end_ms, self.end)
        if hi <= lo:
            return
        if lo > gpu.cursor:
            self._put(gpu, gpu.cursor, lo, UNREPORTED)
        self._put(gpu, lo, hi, state)
        if state == DELIVERED:
            gpu.delivered_mgms += self._share[uuid] * (hi - lo) * weight_bps // MAX_BPS
            if weight_bps != MAX_BPS:
                gpu.degraded_ms += hi - lo
            if allocation_unknown:
                gpu.unknown_ms += hi - lo

    def _put(self, gpu: _Gpu, lo: int, hi: int, state: str) -> None:
        gpu.ms[state] += hi - lo
        gpu.cursor = hi
        last = gpu.segments[-1] if gpu.segments else None
        if last is not None and last[1] == lo and last[2] == state:
            last[1] = hi
            return
        if self.segment_count >= self.max_segments:
            self.truncated = True
            return
        self.segment_count += 1
        gpu.segments.append([lo, hi, state])

    def finish(self) -> tuple[list[GpuRow], str]:
        """Per-GPU rows in the terms' order, and a note when the picture was left out."""
        rows: list[GpuRow] = []
        owed = self.end - self.start
        for spec in self.terms.gpus:
            gpu = self._gpus[spec.uuid]
            if gpu.cursor < self.end:
                self._put(gpu, gpu.cursor, self.end, UNREPORTED)
            if self.end < self.terms.window_end_ms:
                self._put(gpu, self.end, self.terms.window_end_ms, RECLAIMED)
            delivered = gpu.delivered_mgms
            availability = 10_000 if owed == 0 else 10_000 * gpu.ms[DELIVERED] // owed
            rows.append(
                GpuRow(
                    uuid=spec.uuid,
                    node_id=spec.node_id,
                    model=spec.model,
                    share_milli=spec.share_milli,
                    owed_ms=owed,
                    ms=dict(gpu.ms),
                    delivered_mgms=delivered,
                    delivered_gpu_h=format_gpu_hours(delivered),
                    availability=f"{format_minor(availability, 2)} %",
                    degraded_ms=gpu.degraded_ms,
                    allocation_unknown_ms=gpu.unknown_ms,
                    segments=[]
                    if self.truncated
                    else [Segment(int(a), int(b), str(s)) for a, b, s in gpu.segments],
                )
            )
        note = ""
        if self.truncated:
            note = (
                f"the delivery picture is left out: more than {self.max_segments} "
                "segments of one state (the hours per state above are exact)"
            )
        return rows, note


# ---- the picture ----------------------------------------------------------------------------

# matplotlib's rc settings are process-wide: one drawing at a time (the ledger's HTTP API
# serves requests on several threads).
_DRAW_LOCK: Final = threading.Lock()


def _tick_label(window_start_ms: int, span_ms: int) -> Callable[[float, object], str]:
    def label(minutes: float, _pos: object = None) -> str:
        ms = window_start_ms + round(minutes * 60_000)
        moment = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC)
        return moment.strftime("%H:%M" if span_ms <= 2 * 86_400_000 else "%m-%d %H:%M")

    return label


def timeline_svg(rows: list[GpuRow], window_start_ms: int, window_end_ms: int) -> str:
    """The per-GPU timeline as an inline ``<svg>`` element (matplotlib, SVG backend).

    Each state's bars are one group with id ``bill-<state>`` (tests and style sheets find
    them there); the output is deterministic for the same rows.
    """
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    span_ms = max(1, window_end_ms - window_start_ms)
    count = max(1, len(rows))
    with (
        _DRAW_LOCK,
        matplotlib.rc_context(
            {"svg.hashsalt": "gridledger-bill", "svg.fonttype": "none", "font.size": 9}
        ),
    ):
        figure = Figure(figsize=(9.0, 0.38 * count + 1.25))
        FigureCanvasSVG(figure)
        axes = figure.add_subplot()
        for state in STATES:
            bars: list[tuple[float, float]] = []
            lanes: list[int] = []
            for lane, row in enumerate(rows):
                for seg in row.segments:
                    if seg.state == state:
                        bars.append(
                            (
                                (seg.start_ms - window_start_ms) / 60_000,
                                (seg.end_ms - seg.start_ms) / 60_000,
                            )
                        )
                        lanes.append(lane)
            for lane in sorted(set(lanes)):
                mine = [b for b, ln in zip(bars, lanes, strict=True) if ln == lane]
                axes.broken_barh(
                    mine,
                    (lane - 0.36, 0.72),
                    facecolors=COLORS[state],
                    edgecolor="#555555" if state == UNREPORTED else "none",
                    linewidth=0.4,
                    gid=f"bill-{state}-{lane}",
                )
        axes.set_ylim(count - 0.5, -0.5)
        axes.set_yticks(
            range(len(rows)), labels=[f"{r.uuid} ({r.share_milli / 1000:g})" for r in rows]
        )
        axes.set_xlim(0, span_ms / 60_000)
        axes.xaxis.set_major_formatter(FuncFormatter(_tick_label(window_start_ms, span_ms)))
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        axes.legend(
            handles=[
                Patch(facecolor=COLORS[s], edgecolor="#555555", label=STATE_LABELS[s])
                for s in STATES
            ],
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncols=len(STATES),
            frameon=False,
        )
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]
