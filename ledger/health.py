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

from proto.records import GpuSample

# SPEC §7.1: XIDs that mean the device lost work or left the bus (48 double-bit ECC, 63/64
# page retirement / row remapping event or failure, 74 NVLink error, 79 fell off the bus,
# 92 high single-bit ECC rate, 94/95 contained / uncontained ECC error).
CRITICAL_XIDS: Final = frozenset({48, 63, 64, 74, 79, 92, 94, 95})


def counts(sample: GpuSample, first_event: bool, retired_before: Mapping[str, int]) -> bool:
    """Whether ``sample`` counts towards delivered (SPEC §7.1)."""
    return (
        sample.allocated
        and sample.healthy
        and sample.present
        and sample.power_mw > 0
        and sample.ecc_uncorrectable == 0
        and CRITICAL_XIDS.isdisjoint(sample.xids)
        and (first_event or sample.retired_pages <= retired_before.get(sample.uuid, 0))
    )


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
