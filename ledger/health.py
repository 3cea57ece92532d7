"""SPEC §7.1, health from evidence: which samples count as delivered, whatever their flag.

A sample counts when it is ``allocated`` and ``healthy`` and none of its evidence says
otherwise: no XID of ``CRITICAL_XIDS`` in the interval, no uncorrectable ECC error in the
interval, no growth of retired pages over the stream's earlier samples of that GPU, the
device present, and a non-zero power reading.

Retired pages are cumulative: the stream keeps, per GPU, the highest count its accepted
events reported (``StreamState.retired``; only non-zero counts are kept, absent = 0).
The stream's first event (seq 0) sets that baseline and is not judged on growth: pages
retired before the placement are not this interval's fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from proto.limits import MAX_BPS
from proto.records import GpuSample, Metering
from proto.xids import DEGRADING_CLOCK_EVENTS, unhealthy_xids

# SPEC §7.1.1: the XIDs that make a sample unhealthy, per table (§5.3 ``xid_table``;
# terms without ``metering``: table 1, 48 63 64 74 79 92 94 95).
_UNHEALTHY: Final = {version: unhealthy_xids(version) for version in (1, 2)}
CRITICAL_XIDS: Final = _UNHEALTHY[1]


def counts(
    sample: GpuSample,
    first_event: bool,
    retired_before: Mapping[str, int],
    metering: Metering | None = None,
) -> bool:
    """Whether ``sample`` counts towards delivered (SPEC §7.1, §7.1.1, §7.1.2)."""
    table = _UNHEALTHY[metering.xid_table] if metering is not None else CRITICAL_XIDS
    return (
        sample.allocated
        and sample.healthy
        and sample.present
        and sample.power_mw > 0
        and sample.ecc_uncorrectable == 0
        and table.isdisjoint(sample.xids)
        and (first_event or sample.retired_pages <= retired_before.get(sample.uuid, 0))
        and held(sample, metering)
    )


def held(sample: GpuSample, metering: Metering | None) -> bool:
    """SPEC §7.1.2: the GPU was the buyer's to use: not held by another workload, and,
    where the terms bill only while the buyer's workload holds it, held by it."""
    if sample.allocation == "other":
        return False
    return metering is None or metering.idle_billed or sample.allocation == "buyer"


def weight_bps(sample: GpuSample, metering: Metering | None) -> int:
    """SPEC §7.1.2: the share (basis points) of a counting sample's time that is
    delivered: the terms' ``degraded_bps`` when its clock events degrade it, else all."""
    if metering is not None and sample.clock_events & DEGRADING_CLOCK_EVENTS:
        return metering.degraded_bps
    return MAX_BPS


def delivered_mgms(share_milli: int, overlap_ms: int, weight: int) -> int:
    """SPEC §7.1: one sample's delivered milli-GPU-ms: ``floor(share × overlap × w / 10 000)``."""
    if weight == MAX_BPS:
        return share_milli * overlap_ms
    return share_milli * overlap_ms * weight // MAX_BPS


def retired_after(retired_before: Mapping[str, int], samples: list[GpuSample]) -> Mapping[str, int]:
    """The stream's highest retired-page count per GPU after an accepted event (non-zero
    counts only); ``retired_before`` itself when nothing grew."""
    after: dict[str, int] | None = None
    for s in samples:
        pages = s.retired_pages
        if pages and pages > retired_before.get(s.uuid, 0):  # 0 never grows a count
            if after is None:
                after = dict(retired_before)
            after[s.uuid] = pages
    return retired_before if after is None else after
