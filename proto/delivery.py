"""The delivery log: what a party handed to the transport, for its own witness (SPEC §8.3).

One JSON object per line, appended and fsync'd before the party treats an input as sent:

    {"delivered_at_ms": T, "input_hash": H, "kind": K, "node_id": N, "placement_id": P, "seq": S}

A party's own known inputs (SPEC §8.3: the buyer's terms, reclaims, adjustments) use the
same lines, written when it keeps each input (``received_input``; ``gridledger witness
keep``), with ``node_id`` "" and ``seq`` -1 for an input other than a usage event.

A meter agent writes a line per usage event once the transport has it (Kafka acknowledged
it, or, on the embedded transport, it is in the spool); the file is never
garbage-collected with the spool. The operator's witness reads these lines to check that
every event it delivered before the close is in the ledger's log, in seq order.

Reading tolerates one torn last line (a crash mid-append): it is ignored, as the input
was not yet counted as delivered. Any other unreadable line is an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Final

import msgspec

from proto.durable_io import append_durably
from proto.envelope import open_envelope, sha256_hex
from proto.limits import MAX_ID_CHARS
from proto.records import Identifier, UsageEvent

DELIVERY_LOG_FILE: Final = "DELIVERED.jsonl"
MAX_DELIVERY_LINE_BYTES: Final = 1024


# A usage event's node, or "" for the other inputs (terms, reclaims, adjustments, ...).
NodeOrNone = Annotated[
    str, msgspec.Meta(pattern=r"^([A-Za-z0-9][A-Za-z0-9._:-]*)?$(?!\n)", max_length=MAX_ID_CHARS)
]


class Delivered(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One input a party delivered to the transport (or received, for a party's own
    known inputs: ``received_input``)."""

    delivered_at_ms: int
    input_hash: str
    kind: str
    node_id: NodeOrNone
    placement_id: Identifier
    seq: int


class DeliveryLogError(ValueError):
    """A delivery log line that cannot be read (not the torn last line)."""


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Delivered)


def delivered_usage(envelope: bytes, delivered_at_ms: int) -> Delivered:
    """The delivery line of one usage event envelope (signatures are not checked here)."""
    opened = open_envelope(envelope)
    record = opened.record
    if not isinstance(record, UsageEvent):
        raise DeliveryLogError(f"delivery log takes usage events, not {opened.kind}")
    return Delivered(
        delivered_at_ms=delivered_at_ms,
        input_hash=sha256_hex(envelope),
        kind="usage",
        node_id=record.node_id,
        placement_id=record.placement_id,
        seq=record.seq,
    )


def received_input(envelope: bytes, received_at_ms: int) -> Delivered:
    """The line of any signed input a party received or sent (its known inputs, SPEC §8.3):
    a usage event as ``delivered_usage``; another kind with node_id "" and seq -1."""
    opened = open_envelope(envelope)
    record = opened.record
    if isinstance(record, UsageEvent):
        return delivered_usage(envelope, received_at_ms)
    placement_id = getattr(record, "placement_id", None)
    if not isinstance(placement_id, str):
        raise DeliveryLogError(f"a {opened.kind} belongs to no placement")
    return Delivered(
        delivered_at_ms=received_at_ms,
        input_hash=sha256_hex(envelope),
        kind=opened.kind,
        node_id="",
        placement_id=placement_id,
        seq=-1,
    )


def append_delivered(path: Path, lines: Iterable[Delivered]) -> None:
    """Append ``lines`` to the log at ``path`` and fsync (creating it 0600)."""
    data = b"".join(_encoder.encode(line) + b"\n" for line in lines)
    if data:
        append_durably(path, data)


def read_delivered(path: Path) -> Iterator[Delivered]:
    """Every complete line of the log at ``path``, in order (a torn last line skipped)."""
    with path.open("rb") as f:
        pending: bytes | None = None
        for number, raw in enumerate(f, start=1):
            if pending is not None:
                raise DeliveryLogError(f"{path}: line {number - 1} is not a delivery record")
            if not raw.endswith(b"\n") or len(raw) > MAX_DELIVERY_LINE_BYTES:
                pending = raw
                continue
            try:
                yield _decoder.decode(raw)
            except msgspec.DecodeError:
                pending = raw
        # A last line that does not parse is a torn append: nothing to yield.
