"""Money as people read it: integer minor units shown at the currency's scale, exactly."""

from __future__ import annotations


def format_minor(amount_minor: int, scale: int) -> str:
    """``12345`` at scale 2 -> ``"123.45"``; never goes through a float."""
    sign = "-" if amount_minor < 0 else ""
    whole, frac = divmod(abs(amount_minor), 10**scale)
    return f"{sign}{whole}" + (f".{frac:0{scale}d}" if scale else "")


def format_gpu_hours(milli_gpu_ms: int, decimals: int = 3) -> str:
    """Milli-GPU-milliseconds as GPU-hours, rounded half up to ``decimals`` places."""
    unit = 3_600_000_000  # milli-GPU-ms per GPU-hour
    scaled = (milli_gpu_ms * 10**decimals * 2 + unit) // (2 * unit)
    return format_minor(scaled, decimals)
