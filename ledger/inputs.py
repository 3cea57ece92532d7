"""One consumed input and where it came from (position strings: ``transport.positions``)."""

from __future__ import annotations

import msgspec


class Item(msgspec.Struct, frozen=True, gc=False):
    """An input as consumed: bytes, position, transport key, and the source's next position.

    ``arrived_ms``: when the input reached the log (SPEC §6.6): on the embedded transport
    the ledger clock when it was appended to the intake log (``transport.intake``), on
    Kafka the record's timestamp (``ledger.consume``; both the senders' stated times
    under ``arrival = "sender"``, a simulation); None: untimed. The fold dates the
    records it chains with it. ``fed_by``: (offsets key, next position) of the
    sources that fed this input into its source (the spool it was read from, on the
    embedded transport), stored with the batch like ``next_position``.

    A frozen Struct, not a frozen dataclass: one is made per consumed input, and a
    frozen dataclass sets each field through ``object.__setattr__`` (~1.3 us of the
    consume loop per input). Untracked by the cyclic collector (``gc=False``):
    its fields are bytes, strings, ints and tuples of strings, which cannot form a cycle.
    """

    data: bytes
    position: str
    stream_key: str | None
    source: str
    next_position: str
    arrived_ms: int | None = None
    fed_by: tuple[tuple[str, str], ...] = ()
