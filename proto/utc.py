"""Epoch milliseconds as a person reads them, for every line a command prints."""

from __future__ import annotations

import datetime

__all__ = ["iso_utc"]


def iso_utc(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC: ``2026-12-01T00:52:00Z`` (``.123Z`` if needed)."""
    seconds, millis = divmod(ms, 1000)
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"
