"""SPEC §7.1.1, §5.3: the versioned XID table: which XID codes make a sample unhealthy, and
whom NVIDIA's XID catalog attributes each code to.

The terms choose the table (``metering.xid_table``; terms without ``metering`` use table 1,
the set every event signed before the table existed was judged by). A table never changes
once published: a new judgement is a new version, so a signed export keeps its meaning.

Attribution: ``application`` (the job's own fault: a page fault, an illegal instruction,
a kernel that stopped; the GPU is fine), ``driver``, ``hardware``. Only codes attributed
to the driver or the hardware can be marked unhealthy; a job's own crash never makes the
operator's GPU unhealthy. A code absent from a table is not unhealthy under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEGRADING_CLOCK_EVENTS",
    "XID_TABLES",
    "XidEntry",
    "attribution",
    "unhealthy_xids",
]

Attribution = Literal["application", "driver", "hardware"]


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One code of a table: its attribution, and whether it makes a sample unhealthy."""

    code: int
    attribution: Attribution
    unhealthy: bool
    meaning: str


def _table(*entries: XidEntry) -> dict[int, XidEntry]:
    return {e.code: e for e in entries}


_H: Final = "hardware"
_D: Final = "driver"
_A: Final = "application"

# Table 1: the set of SPEC §7.1.1 as first written (CRITICAL_XIDS), all of it hardware.
_TABLE_1: Final = _table(
    XidEntry(48, _H, True, "double-bit ECC error"),
    XidEntry(63, _H, True, "ECC page retirement or row remapping recording event"),
    XidEntry(64, _H, True, "ECC page retirement or row remapping failure"),
    XidEntry(74, _H, True, "NVLink error"),
    XidEntry(79, _H, True, "GPU has fallen off the bus"),
    XidEntry(92, _H, True, "high single-bit ECC error rate"),
    XidEntry(94, _H, True, "contained ECC error"),
    XidEntry(95, _H, True, "uncontained ECC error"),
)

# Table 2: attribution for the codes an operator and a buyer dispute. 63 (a row remapping
# recorded) becomes evidence: a correctable remap is the memory repairing itself, and an
# uncorrectable one comes with 48, 94 or 95 and an uncorrectable ECC count anyway.
_TABLE_2: Final = _table(
    XidEntry(8, _D, False, "GPU stopped processing (driver)"),
    XidEntry(13, _A, False, "graphics engine exception (the application's kernel)"),
    XidEntry(31, _A, False, "GPU memory page fault (the application's access)"),
    XidEntry(32, _D, False, "invalid or corrupted push buffer stream"),
    XidEntry(38, _D, False, "driver firmware error"),
    XidEntry(43, _A, False, "GPU stopped processing (the application's context)"),
    XidEntry(45, _A, False, "preemptive cleanup after an earlier error of the application"),
    XidEntry(48, _H, True, "double-bit ECC error"),
    XidEntry(61, _D, False, "internal micro-controller breakpoint or warning"),
    XidEntry(62, _H, True, "internal micro-controller halt"),
    XidEntry(63, _H, False, "row remapping or page retirement recorded (evidence only)"),
    XidEntry(64, _H, True, "row remapping or page retirement failure"),
    XidEntry(74, _H, True, "NVLink error"),
    XidEntry(79, _H, True, "GPU has fallen off the bus"),
    XidEntry(92, _H, True, "high single-bit ECC error rate"),
    XidEntry(94, _H, True, "contained ECC error"),
    XidEntry(95, _H, True, "uncontained ECC error"),
    XidEntry(119, _D, True, "GSP RPC timeout"),
    XidEntry(120, _D, True, "GSP error"),
    XidEntry(140, _H, True, "unrecovered ECC error"),
)

XID_TABLES: Final[dict[int, dict[int, XidEntry]]] = {1: _TABLE_1, 2: _TABLE_2}
"""Every published table, by version."""

LATEST_XID_TABLE: Final = max(XID_TABLES)

DEGRADING_CLOCK_EVENTS: Final = 0x08 | 0x20 | 0x40 | 0x80
"""SPEC §7.1.2: the clock-event (throttle) reasons that make a sample degraded: hardware
slowdown, software thermal slowdown, hardware thermal slowdown, hardware power brake
(NVML ``nvmlClocksEventReason*``). Idle, application clocks, the software power cap, sync
boost and display clocks are how a healthy GPU runs, not a degradation."""


def unhealthy_xids(version: int) -> frozenset[int]:
    """The codes that make a sample unhealthy under table ``version``."""
    return frozenset(code for code, e in XID_TABLES[version].items() if e.unhealthy)


def attribution(version: int, code: int) -> str:
    """Whom table ``version`` attributes ``code`` to; ``unknown`` for a code it lacks."""
    entry = XID_TABLES[version].get(code)
    return entry.attribution if entry is not None else "unknown"
