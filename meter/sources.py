"""Where GPU readings come from: one small interface, NVML and a simulator behind it.

A source reports what it sees of the GPUs present on the node. It does not know about
placements: the agent picks the GPUs the signed terms give to each placement, marks them
``allocated``, and reports a GPU of the terms that the source does not see as unhealthy
(it delivered nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["GpuReading", "GpuSource"]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU over one interval: the fields of proto.records.GpuSample but ``allocated``.

    ``energy_mj`` is the energy used during the interval; ``xid_errors`` and
    ``ecc_errors`` count the errors seen during the interval; ``healthy`` is False when
    any of them is non-zero or the device reports a fault.
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
