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
reads the spools afresh, in a new order (and without the segments their writers have
collected since).

What the ledger has read, for the spools' writers (``READ_FILE``, ``ReadByLedgers``): once
entries are durably in the intake log, the spool records they carry are the ledger's (as
records Kafka acknowledged are the broker's), and the spool's writer may delete segments
lying wholly before that point (``meter.agent.Agent.collect_garbage``, the Kafka
shipper's rule). The ledger states its read position of every spool in
``<intake dir>/READ``: text lines ``<spool> <segment> <offset>`` between a header line and
an ``end`` line, replaced by rename after the intake append's fdatasync. The file is
not fsynced: it only ever names positions the intake log already holds durably, so after
a crash it is the new content, an older one, or unreadable (then nothing is collected
until the next). Written when every spool was read to its end, or a spool's read
position moved to a later segment: a writer collects whole segments, or seals its
segment once the ledger has read all of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import msgspec

from proto.durable_io import read_at_most, write_all
from transport.limits import (
    DEFAULT_SEGMENT_MAX_BYTES,
    INTAKE_MAX_BYTES,
    MAX_FRAME_RECORD_BYTES,
    MAX_READ_FILE_BYTES,
)
from transport.positions import SpoolPosition
from transport.spool import SpoolCorrupt, SpoolEntry, SpoolWriter, read_spool, segment_path

__all__ = [
    "INTAKE_SOURCE",
    "READ_FILE",
    "IntakeEntry",
    "IntakeLog",
    "ReadByLedgers",
    "intake_dir_for",
    "read_intake",
    "read_position",
    "store_read",
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


_INTAKE_PREFIX: Final = ".intake-"


def intake_dir_for(local_dir: Path, ledger_id: str) -> Path:
    """The intake log of ledger ``ledger_id`` reading ``local_dir``: a hidden directory in
    it (the spool reader skips it), beside the spools it orders."""
    return local_dir / f"{_INTAKE_PREFIX}{ledger_id}"


# ---- what the ledger has read (module docstring) ----------------------------------------

READ_FILE: Final = "READ"
_RACY_MTIME_NS: Final = 2_000_000_000
_READ_HEADER: Final = b"gridledger spools read 1\n"
_READ_END: Final = b"end\n"


def store_read(intake_dir: Path, positions: Mapping[str, SpoolPosition]) -> None:
    """Replace ``intake_dir/READ`` with ``positions`` (every one durable in the intake log
    already: module docstring). A name with whitespace in it is left out (its spool is
    then never collected)."""
    lines = [_READ_HEADER]
    for name in sorted(positions):
        if name and not any(c.isspace() for c in name):
            position = positions[name]
            lines.append(f"{name} {position.segment} {position.offset}\n".encode())
    lines.append(_READ_END)
    path = intake_dir / READ_FILE
    tmp = intake_dir / f".{READ_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, b"".join(lines))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_position(data: bytes, spool: str) -> SpoolPosition | None:
    """The position of ``spool`` in the content of a READ file (None: not there, or the
    content is not a whole READ file)."""
    if not (data.startswith(_READ_HEADER) and data.endswith(b"\n" + _READ_END)):
        return None
    key = f"\n{spool} ".encode()
    at = data.find(key)
    if at < 0:
        return None
    line = data[at + len(key) : data.index(b"\n", at + 1)].split(b" ")
    if len(line) != 2 or not all(part.isdigit() for part in line):
        return None
    return SpoolPosition(int(line[0]), int(line[1]))


class ReadByLedgers:
    """How far every ledger reading ``local_dir`` has read the spool ``spool`` into its
    intake log (their READ files), for the spool's writer."""

    def __init__(self, local_dir: Path, spool: str) -> None:
        self.local_dir = Path(local_dir)
        self.spool = spool
        self._seen: tuple[tuple[str, int, int, int], ...] | None = None
        # The intake logs found in ``local_dir``, listed again only when the directory
        # changed (a listing of thousands of spools costs milliseconds, a stat a few us).
        self._listed: tuple[int, int, list[str]] | None = None

    def _intake_names(self) -> list[str]:
        stat = os.stat(self.local_dir)
        listed = self._listed
        if listed is None or (listed[0], listed[1]) != (stat.st_ino, stat.st_mtime_ns):
            names = sorted(
                entry.name
                for entry in os.scandir(self.local_dir)
                if entry.name.startswith(_INTAKE_PREFIX) and entry.is_dir()
            )
            # A change within the file system's timestamp granularity of the listing may
            # not move the mtime: a directory changed this recently is listed again.
            recent = time.time_ns() - stat.st_mtime_ns < _RACY_MTIME_NS
            self._listed = None if recent else (stat.st_ino, stat.st_mtime_ns, names)
            return names
        return listed[2]

    def position(self, *, only_if_changed: bool = False) -> SpoolPosition | None:
        """The least read position over every intake log in ``local_dir``; None when there
        is none, one of them has not read the spool (or its READ file is missing or
        unreadable), or (``only_if_changed``) no READ file changed since the last call."""
        try:
            names = self._intake_names()
        except FileNotFoundError:
            return None
        if not names:
            return None
        seen: list[tuple[str, int, int, int]] = []
        for name in names:
            try:
                stat = os.stat(self.local_dir / name / READ_FILE)
            except FileNotFoundError:
                return None
            seen.append((name, stat.st_ino, stat.st_mtime_ns, stat.st_size))
        if only_if_changed and tuple(seen) == self._seen:
            return None
        self._seen = tuple(seen)
        least: SpoolPosition | None = None
        for name in names:
            try:
                data = read_at_most(self.local_dir / name / READ_FILE, MAX_READ_FILE_BYTES)
            except FileNotFoundError:
                return None
            position = None if len(data) > MAX_READ_FILE_BYTES else read_position(data, self.spool)
            if position is None:
                return None
            least = position if least is None else min(least, position)
        return least


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
