"""The local transport: one directory of spools, read by the ledger in name order.

A directory ``LOCAL_DIR`` holds one spool directory (``transport.spool``) per writer:
node agents write ``LOCAL_DIR/node-<node_id>/``, publishers of terms, reclaims and
adjustments ``LOCAL_DIR/publish-<name>/``, the ledger its PlacementClosed records
``LOCAL_DIR/ledger-<ledger_id>/``. The ledger reads every subdirectory into its own
intake log (``transport.intake``), which gives the inputs one total order (SPEC §6.4;
docs/architecture.md, "The data's path": same records, same results as Kafka).

Every envelope is opened (``proto.envelope.open_envelope``) before it is written: bytes
that are not a well-formed envelope are refused with a ProtoError and nothing of the
batch is written. Before it writes, ``publish_local`` deletes what every ledger has
read of the spool (``collect_read``), as node agents do with theirs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from transport.intake import ReadByLedgers
from transport.kafka import placement_of
from transport.limits import LOCAL_SEAL_READ_BYTES, SPOOL_LOCK_POLL_S, SPOOL_LOCK_WAIT_S
from transport.positions import SpoolPosition
from transport.spool import SpoolLocked, SpoolWriter

__all__ = ["collect_read", "ledger_source", "node_source", "publish_local", "publisher_source"]

_SOURCE_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,200}$")


def node_source(node_id: str) -> str:
    """The local-directory subfolder of a node agent."""
    return f"node-{node_id}"


def publisher_source(name: str) -> str:
    """The local-directory subfolder of a publisher of terms, reclaims, adjustments."""
    return f"publish-{name}"


def ledger_source(ledger_id: str) -> str:
    """The local-directory subfolder where a ledger publishes its PlacementClosed records."""
    return f"ledger-{ledger_id}"


def publish_local(
    local_dir: Path,
    source: str,
    envelopes: Sequence[bytes],
    *,
    stamps_ms: Sequence[int] | None = None,
) -> list[SpoolPosition]:
    """Append ``envelopes`` durably to ``local_dir/source/``; return their spool positions.

    ``stamps_ms`` (one per envelope): the time a simulation's sender states for each
    (stamped frames, SPEC §6.6 ``arrival = "sender"``). None: plain frames.

    Waits up to SPOOL_LOCK_WAIT_S for another writer of the same directory; raises
    SpoolLocked after that, ProtoError (nothing written) for an envelope that does not
    open, ValueError for a source name that is not a plain directory name.
    """
    if not _SOURCE_RE.match(source):
        raise ValueError(f"source {source!r} is not a plain directory name")
    for envelope in envelopes:
        placement_of(envelope)
    deadline = time.monotonic() + SPOOL_LOCK_WAIT_S
    while True:
        try:
            writer = SpoolWriter(Path(local_dir) / source)
            break
        except SpoolLocked:
            if time.monotonic() >= deadline:
                raise
            time.sleep(SPOOL_LOCK_POLL_S)
    with writer:
        collect_read(writer, local_dir, source)
        return writer.append(list(envelopes), None if stamps_ms is None else list(stamps_ms))


def collect_read(writer: SpoolWriter, local_dir: Path, source: str) -> int:
    """Delete the segments of ``local_dir/source`` that every ledger reading ``local_dir``
    has in its intake log (``transport.intake.ReadByLedgers``); bytes freed. The rule of
    the meter's ``Agent.collect_garbage``: whole segments before the read position, and
    the segment being written too (sealed first) once it is all read and holds
    LOCAL_SEAL_READ_BYTES. Looked up only when there is something to collect."""
    end = writer.end_position()
    if writer.first_segment == end.segment and writer.current_segment_bytes < (
        LOCAL_SEAL_READ_BYTES
    ):
        return 0
    read = ReadByLedgers(Path(local_dir), source).position()
    if read is None or read > end:
        return 0
    if read == end and writer.current_segment_bytes >= LOCAL_SEAL_READ_BYTES:
        writer.seal()
        read = writer.end_position()
    return writer.delete_segments_before(read)
