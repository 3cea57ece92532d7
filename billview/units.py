"""Numbers as people read them, exactly: no float ever touches an amount."""

from __future__ import annotations

from typing import Final

from proto.limits import MAX_BPS, MILLI_GPU_MS_PER_GPU_HOUR
from proto.money import format_gpu_hours, format_minor
from proto.utc import iso_utc

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 60 * MINUTE_MS
DAY_MS: Final = 24 * HOUR_MS

__all__ = [
    "duration",
    "exact_decimal",
    "format_gpu_hours",
    "format_minor",
    "gpus",
    "iso_utc",
    "percent_bps",
]


def duration(ms: int) -> str:
    """``240000`` -> ``"4 min"``; ``5400000`` -> ``"1 h 30 min"``; ``1500`` -> ``"1.5 s"``."""
    if ms < 0:
        return "-" + duration(-ms)
    if ms == 0:
        return "0 min"
    if ms % 1000:
        return f"{format_minor(ms, 3).rstrip('0').rstrip('.')} s" if ms < MINUTE_MS else f"{ms} ms"
    parts: list[str] = []
    days, rest = divmod(ms, DAY_MS)
    hours, rest = divmod(rest, HOUR_MS)
    minutes, rest = divmod(rest, MINUTE_MS)
    seconds = rest // 1000
    for value, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")):
        if value:
            parts.append(f"{value} {unit}")
    return " ".join(parts)


def percent_bps(bps: int) -> str:
    """Basis points as a percentage: ``9679`` -> ``"96.79 %"``."""
    return f"{format_minor(bps, 2)} %"


def gpus(share_milli: int) -> str:
    """A sum of ``share_milli`` as GPUs: ``3000`` -> ``"3 GPU"``, ``2500`` -> ``"2.5 GPU"``."""
    text = format_minor(share_milli, 3).rstrip("0").rstrip(".")
    return f"{text} GPU"


def exact_decimal(numerator: int, denominator: int, scale: int, extra: int = 4) -> str:
    """``numerator / denominator`` minor units in currency units, with up to ``extra``
    more digits than the currency has: ``171.5`` minor at scale 2 -> ``"1.715"``; a value
    that does not end within them is cut and marked ``…``."""
    if denominator <= 0 or numerator < 0:
        raise ValueError("exact_decimal wants numerator >= 0 and denominator > 0")
    for digits in range(extra + 1):
        value, remainder = divmod(numerator * 10**digits, denominator)
        if remainder == 0:
            return format_minor(value, scale + digits)
    return format_minor(numerator * 10**extra // denominator, scale + extra) + "…"


def gpu_hours_exact(milli_gpu_ms: int) -> str:
    """Milli-GPU-ms as exact GPU time: ``0.7 GPU-h`` when the hours end within 3
    decimals, else whole GPU-minutes (``151 GPU-min (2.517 GPU-h)``), else ``≈`` hours."""
    hours, rest = divmod(milli_gpu_ms * 1000, MILLI_GPU_MS_PER_GPU_HOUR)
    if rest == 0:
        return f"{format_minor(hours, 3).rstrip('0').rstrip('.')} GPU-h"
    minutes, rest = divmod(milli_gpu_ms, 60_000_000)
    if rest == 0:
        return f"{minutes} GPU-min ({format_gpu_hours(milli_gpu_ms)} GPU-h)"
    return f"≈{format_gpu_hours(milli_gpu_ms, 6)} GPU-h"


def bps_share(amount_minor: int, bps: int) -> tuple[int, str]:
    """``floor(amount × bps / 10 000)`` and its exact value in minor units as text."""
    return amount_minor * bps // MAX_BPS, exact_decimal(amount_minor * bps, MAX_BPS, 0)
