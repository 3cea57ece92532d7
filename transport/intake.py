"""The ledger's intake log: the one total order of the embedded transport (SPEC §6.4).

On the ``local`` transport many writers append to their own spools (``transport.local``)
and nothing orders one spool against another. The ledger gives its inputs the order a
Kafka partition would: everything it reads from the spools is first appended, durably,
to its own intake log, and the fold consumes the intake log, never the spools. The
intake log is a spool directory (``transport.spool``: same frames, CRC, segments, torn
tail rule, one writer under ``flock``) whose records are ``IntakeEntry`` (msgpack):

    [spool name, segment, offset, next segment, next offset, arrived_ms, record bytes]

i.e. the record as read, where it was read (so the spool read positions are recoverable
from the log itself) and ``arrived_ms``, the ledger clock when it was appended. A store
that is lost is rebuilt by replaying the intake log from its start: the same inputs in
the same order, whatever the spool directories are called or when they are read.

The log lives with the transport's files, not with the store (``intake_dir_for``:
``<local_dir>/.intake-<ledger id>/``): it is the embedded transport's partition, never
trimmed, and a ledger that loses its store (its data directory) rebuilds from it in the
same order. Losing the intake log is losing the partition: a ledger started without it
reads the spools afresh, in a new order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import msgspec

from transport.limits import (
    DEFAULT_SEGMENT_MAX_BYTES,
    INTAKE_MAX_BYTES,
    MAX_FRAME_RECORD_BYTES,
)
from transport.positions import SpoolPosition
from transport.spool import SpoolCorrupt, SpoolEntry, SpoolWriter, read_spool, segment_path

__all__ = [
    "INTAKE_SOURCE",
    "IntakeEntry",
    "IntakeLog",
    "intake_dir_for",
    "read_intake",
]

INTAKE_SOURCE: Final = "intake:local"
"""The offsets key of the intake log (its next position to fold, ``SEGMENT:OFFSET``)."""


class IntakeEntry(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One input as the intake read it from a spool (module docstring)."""

    spool: str
    segment: int
    offset: int
    next_segment: int
    next_offset: int
    arrived_ms: int
    data: bytes

    @property
    def position(self) -> SpoolPosition:
        """Where the record is in its spool."""
        return SpoolPosition(self.segment, self.offset)

    @property
    def next_position(self) -> SpoolPosition:
        """Where the spool's next record starts (the spool's read position after it)."""
        return SpoolPosition(self.next_segment, self.next_offset)


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(IntakeEntry)


def intake_dir_for(local_dir: Path, ledger_id: str) -> Path:
    """The intake log of ledger ``ledger_id`` reading ``local_dir``: a hidden directory in
    it (the spool reader skips it), beside the spools it orders."""
    return local_dir / f".intake-{ledger_id}"


def read_intake(
    directory: Path, start: SpoolPosition | None = None, *, max_records: int | None = None
) -> Iterator[tuple[SpoolEntry, IntakeEntry]]:
    """The intake log's entries from ``start`` (None: its beginning), in order.

    Raises SpoolCorrupt for damage, including a checksummed frame that is not an entry.
    """
    for frame in read_spool(directory, start, max_records=max_records):
        try:
            entry = _DECODER.decode(frame.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SpoolCorrupt(
                segment_path(directory, frame.position.segment),
                frame.position.offset,
                f"not an intake entry: {exc}",
            ) from exc
        yield frame, entry


class IntakeLog:
    """The one writer of an intake log (it holds the directory's lock while open)."""

    def __init__(
        self, directory: Path, *, segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    ) -> None:
        self.directory = Path(directory)
        self._writer = SpoolWriter(
            self.directory,
            max_bytes=INTAKE_MAX_BYTES,
            segment_max_bytes=segment_max_bytes,
            max_record_bytes=MAX_FRAME_RECORD_BYTES,
        )
        try:
            self._sync_tail()
        except BaseException:
            self._writer.close()
            raise

    def _sync_tail(self) -> None:
        # A writer killed inside ``append`` may leave whole frames it never fsynced; they
        # are read (and folded) from now on, so make them durable first.
        path = segment_path(self.directory, self._writer.end_position().segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def end_position(self) -> SpoolPosition:
        """Where the next entry will be appended."""
        return self._writer.end_position()

    def append(self, entries: Sequence[IntakeEntry]) -> list[SpoolPosition]:
        """Append ``entries`` durably (one write, one fdatasync); their positions."""
        return self._writer.append([_ENCODER.encode(e) for e in entries])

    def read(
        self, start: SpoolPosition | None, max_records: int | None = None
    ) -> Iterator[tuple[SpoolEntry, IntakeEntry]]:
        """``read_intake`` of this log."""
        return read_intake(self.directory, start, max_records=max_records)

    def close(self) -> None:
        """Release the lock (safe to call twice)."""
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
