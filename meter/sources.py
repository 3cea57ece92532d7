"""Where GPU readings come from: one small interface, NVML and a simulator behind it.

A source reports what it sees of the GPUs present on the node. It does not know about
placements: the agent picks the GPUs the signed terms give to each placement, marks them
``allocated``, and reports a GPU of the terms that the source does not see as unhealthy
(it delivered nothing).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from proto import limits as proto_limits
from proto.xids import LATEST_XID_TABLE, XID_TABLES, unhealthy_xids

__all__ = [
    "CRITICAL_XIDS",
    "UNHEALTHY_XIDS",
    "GpuReading",
    "GpuSource",
    "PureGpuSource",
    "bounded_xids",
]

# SPEC §7.1.1: the XIDs that make a sample unhealthy whatever its flag, under any table
# (kept first when a sample lists more than MAX_XIDS codes).
CRITICAL_XIDS: Final = frozenset().union(*(unhealthy_xids(v) for v in XID_TABLES))
# The codes a source flags unhealthy itself: the latest table's (driver or hardware
# faults); an application's own XID (13, 31, 43, ...) leaves the GPU healthy.
UNHEALTHY_XIDS: Final = unhealthy_xids(LATEST_XID_TABLE)


def bounded_xids(codes: Iterable[int]) -> tuple[int, ...]:
    """At most MAX_XIDS distinct codes, ascending; when there are more, every critical
    code is kept (SPEC §7.1.1)."""
    distinct = set(codes)
    critical = sorted(c for c in distinct if c in CRITICAL_XIDS)
    others = sorted(c for c in distinct if c not in CRITICAL_XIDS)
    return tuple(sorted((critical + others)[: proto_limits.MAX_XIDS]))


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU over one interval: the fields of proto.records.GpuSample but ``allocated``.

    ``energy_mj`` is the energy used during the interval; ``xid_errors`` and
    ``ecc_errors`` count the errors seen during the interval; ``healthy`` is False when
    any of them is non-zero or the device reports a fault.

    The health evidence of SPEC §7.1.1: ``xids`` the distinct XID codes seen during the
    interval (ascending), ``ecc_uncorrectable`` the uncorrectable ECC errors during it,
    ``retired_pages`` the pages retired (or rows remapped) so far, cumulative. A reading
    exists only for a device that answered (``present``).
    """

    uuid: str
    model: str
    healthy: bool
    utilisation_pct: int
    memory_used_mib: int
    memory_total_mib: int
    power_mw: int
    energy_mj: int
    xid_errors: int
    ecc_errors: int
    xids: tuple[int, ...] = ()
    ecc_uncorrectable: int = 0
    retired_pages: int = 0
    # SPEC §7.1.2: NVML's clock-event (throttle) reasons for the interval (bitmask), and the
    # rows remapped for correctable errors so far (evidence only).
    clock_events: int = 0
    remapped_correctable: int = 0


class GpuSource(Protocol):
    """Readings of the GPUs of one node."""

    def read(self, start_ms: int, end_ms: int) -> Mapping[str, GpuReading]:
        """The GPUs present now, by uuid, as seen over [start_ms, end_ms).

        A GPU that has gone (fell off the bus, driver lost it) is absent from the result.
        """
        ...

    def close(self) -> None:
        """Release the device library."""
        ...


@runtime_checkable
class PureGpuSource(GpuSource, Protocol):
    """A source whose every reading is a pure function of (device, interval) (the
    simulator; not NVML, whose counters are deltas since the previous read): it can be
    asked for some devices only, and the agent asks for the GPUs its streams need."""

    def read_only(
        self, start_ms: int, end_ms: int, uuids: Collection[str] | None
    ) -> Mapping[str, GpuReading]:
        """``read`` for the devices in ``uuids`` only (None: every device)."""
        ...
