"""One consumed input and where it came from (position strings: ``transport.positions``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Item:
    """An input as consumed: bytes, position, transport key, and the source's next position.

    ``arrived_ms``: on the embedded transport, the ledger clock when the input was
    appended to the intake log (``transport.intake``); None on Kafka. Stored and exposed
    only; the fold does not read it. ``fed_by``: (offsets key, next position) of the
    sources that fed this input into its source (the spool it was read from, on the
    embedded transport), stored with the batch like ``next_position``.
    """

    data: bytes
    position: str
    stream_key: str | None
    source: str
    next_position: str
    arrived_ms: int | None = None
    fed_by: tuple[tuple[str, str], ...] = ()
