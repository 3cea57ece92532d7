"""One consumed input and where it came from (position strings: ``transport.positions``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Item:
    """An input as consumed: bytes, position, transport key, and the source's next position."""

    data: bytes
    position: str
    stream_key: str | None
    source: str
    next_position: str
