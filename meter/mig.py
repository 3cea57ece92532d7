"""MIG instances as units of sale (SPEC §5.3, §7.1.2 *MIG*): what one is, and its share.

A MIG (Multi-Instance GPU) instance is a slice of a parent GPU with its own ``MIG-…`` uuid.
NVML names it ``<parent name> MIG <profile>`` (``NVIDIA A100-SXM4-40GB MIG 3g.20gb``), the
profile ``<g>g.<memory>gb`` with ``g`` the GPU instance's compute slices; the parent has
``n`` slices in all (``nvmlDeviceGetMaxMigDeviceCount``: 7 on A100/H100/H200, 4 on A30).
The instance's share of its parent is ``floor(1000 × g / n)`` milli-GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["MigInstance", "profile_of", "share_milli_of"]

_PROFILE: Final = re.compile(r"(?:^|\s)MIG\s+(\d+)g\.(\d+)gb\b")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance as NVML lists it."""

    parent_uuid: str
    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    slices: int
    parent_slices: int
    memory_mib: int

    @property
    def profile(self) -> str:
        """The profile NVML names it by (``3g.20gb``), or ``""`` when the name has none."""
        return profile_of(self.name)

    @property
    def share_milli(self) -> int:
        """Its share of the parent GPU (SPEC §5.3)."""
        return share_milli_of(self.slices, self.parent_slices)


def profile_of(name: str) -> str:
    """The MIG profile in an NVML device name (``…MIG 3g.20gb`` -> ``3g.20gb``)."""
    match = _PROFILE.search(name)
    return f"{match.group(1)}g.{match.group(2)}gb" if match else ""


def share_milli_of(slices: int, parent_slices: int) -> int:
    """``floor(1000 × slices / parent_slices)``; ValueError outside ``1 <= slices <=
    parent_slices`` (a slice is a part of its parent, never more)."""
    if not 1 <= slices <= parent_slices:
        raise ValueError(f"a MIG instance of {slices} slices on a parent of {parent_slices}")
    return 1000 * slices // parent_slices
