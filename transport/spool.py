"""The durable spool: an append-only, checksummed, segmented log of records on local disk.

A node agent appends each signed event here (and fsyncs) before anything may ship it;
the shipper and the ledger's ``local`` transport read it back. One writer per directory
(an exclusive ``flock`` on ``LOCK``); any number of readers, beside a live writer.

Layout of a spool directory::

    LOCK                          the writer's lock file (flock, never deleted)
    00000000000000000000.seg      segment 0, then 1, 2, ... (20-digit decimal numbers)
    <segment>-<offset>.torn       bytes cut from a torn tail, kept as evidence
    (other files)                 ignored by the spool (the shipper keeps its ack there)

Frame format (version 1), one per record, back to back in a segment::

    offset  size  field
    0       1     magic 0xA7 (also the format version: a new format gets a new magic)
    1       4     length N of the record, unsigned big-endian, 1 <= N <= MAX_FRAME_RECORD_BYTES
    5       4     CRC-32 (zlib/IEEE) of bytes 1..4 followed by the N record bytes, big-endian
    9       N     the record bytes

The checksum covers the length too, so a corrupted length is caught rather than followed.

A **stamped** frame (magic 0xA8) is the same but for its N bytes: 8 bytes of a time in
milliseconds (unsigned big-endian) that the writer states, then the record (N - 8 bytes,
at least 1). Only simulations write them (SPEC §6.6 ``arrival = "sender"``: the time the
sender stated is the input's arrival); readers accept both kinds in any mix.
A writer accepts records up to its ``max_record_bytes`` (default MAX_RECORD_BYTES, one
envelope); readers accept frames up to MAX_FRAME_RECORD_BYTES, room for the ledger's
intake log (``transport.intake``), which wraps a spool record with where it came from.
A position is (segment number, byte offset of a frame in it; ``transport.positions``
holds its codec); a record's ``next_position`` is where the following frame starts, which
is what a reader stores to resume.

Durability: ``append`` writes one batch with one ``write`` and one ``fdatasync``, and the
directory is fsynced whenever a segment file is created or removed. A batch never spans
two segments, so a segment, once a later one exists, is sealed and never written again.

Torn tails: only the last, unacknowledged append can be incomplete after a crash, so the
only damage a crash leaves is at the end of the last segment. The rule, used by writer
and reader alike: an invalid frame (incomplete, wrong magic or checksum) at the end of
the last segment, with no valid frame after it, is a **torn tail**. The writer cuts it
when it opens the directory (copying the cut bytes to a ``.torn`` file first, and
logging it); a reader stops silently in front of it and can resume later from the last
``next_position``. Any other invalid frame (in a sealed segment, or followed by a valid
frame) is **corruption** of acknowledged data: readers and the writer raise
``SpoolCorrupt`` naming file and offset, and nothing is cut.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final, Self

import structlog

from proto.durable_io import fsync_dir
from proto.limits import MAX_SAFE_INTEGER
from transport.limits import (
    DEFAULT_SEGMENT_MAX_BYTES,
    DEFAULT_SPOOL_MAX_BYTES,
    MAX_FRAME_RECORD_BYTES,
    MAX_RECORD_BYTES,
    MIN_SEGMENT_MAX_BYTES,
)
from transport.positions import SpoolPosition

__all__ = [
    "FRAME_HEADER_BYTES",
    "FRAME_MAGIC",
    "STAMPED_FRAME_MAGIC",
    "SpoolCorrupt",
    "SpoolEntry",
    "SpoolError",
    "SpoolFull",
    "SpoolLocked",
    "SpoolWriter",
    "frame",
    "list_segments",
    "read_spool",
    "segment_path",
]

FRAME_MAGIC: Final = 0xA7
STAMPED_FRAME_MAGIC: Final = 0xA8
_MAGICS: Final = (FRAME_MAGIC, STAMPED_FRAME_MAGIC)
_STAMP: Final = struct.Struct(">Q")
_HEADER: Final = struct.Struct(">BII")
FRAME_HEADER_BYTES: Final = _HEADER.size
_LENGTH: Final = struct.Struct(">I")
LOCK_NAME: Final = "LOCK"
SEGMENT_SUFFIX: Final = ".seg"
_SEGMENT_RE: Final = re.compile(r"^(\d{20})\.seg$")

_log = structlog.get_logger("transport.spool")


class SpoolError(Exception):
    """Base class of the spool's errors."""


class SpoolFull(SpoolError):
    """The append would carry the spool past its named byte bound; nothing was written."""


class SpoolLocked(SpoolError):
    """Another writer holds the spool directory's lock."""


class SpoolCorrupt(SpoolError):
    """Acknowledged data in the spool fails its checks; ``path`` and ``offset`` say where."""

    def __init__(self, path: Path, offset: int, detail: str) -> None:
        super().__init__(f"{path} at offset {offset}: {detail}")
        self.path = path
        self.offset = offset
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One record read back, where it was, and where the next frame starts; ``stamp_ms``
    is the time a stamped frame states (None: a plain frame)."""

    position: SpoolPosition
    data: bytes
    next_position: SpoolPosition
    stamp_ms: int | None = None


# ---- frames (pure) ----------------------------------------------------------------------


def _check_record(record: bytes, max_bytes: int) -> None:
    if not isinstance(record, bytes):
        raise TypeError(f"a spool record is bytes, got {type(record).__name__}")
    if not 1 <= len(record) <= max_bytes:
        raise ValueError(f"a spool record is 1..{max_bytes} bytes, got {len(record)}")


def _checksum(length_bytes: bytes, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(length_bytes))


def frame(record: bytes, max_bytes: int = MAX_RECORD_BYTES, stamp_ms: int | None = None) -> bytes:
    """The frame of one record: magic, length, checksum, bytes (module docstring); a
    stamped frame when ``stamp_ms`` is given.

    ``max_bytes`` (at most MAX_FRAME_RECORD_BYTES) bounds the record: ValueError beyond.
    """
    if stamp_ms is None:
        _check_record(record, min(max_bytes, MAX_FRAME_RECORD_BYTES))
        magic, body = FRAME_MAGIC, record
    else:
        _check_record(record, min(max_bytes, MAX_FRAME_RECORD_BYTES - _STAMP.size))
        if isinstance(stamp_ms, bool) or not 0 <= stamp_ms <= MAX_SAFE_INTEGER:
            raise ValueError(f"a spool stamp is 0..{MAX_SAFE_INTEGER} ms, got {stamp_ms!r}")
        magic, body = STAMPED_FRAME_MAGIC, _STAMP.pack(stamp_ms) + record
    length_bytes = _LENGTH.pack(len(body))
    return _HEADER.pack(magic, len(body), _checksum(length_bytes, body)) + body


def _unstamp(magic: int, body: bytes) -> tuple[bytes, int | None]:
    if magic == FRAME_MAGIC:
        return body, None
    return body[_STAMP.size :], _STAMP.unpack_from(body)[0]


def _length_ok(magic: int, length: int) -> bool:
    least = 1 if magic == FRAME_MAGIC else _STAMP.size + 1
    return magic in _MAGICS and least <= length <= MAX_FRAME_RECORD_BYTES


class _Frame(Enum):
    OK = "ok"
    END = "end"  # clean end of file exactly at a frame boundary
    INCOMPLETE = "incomplete"  # the file ends inside the frame
    BAD = "bad"  # wrong magic, impossible length, or checksum mismatch


def _read_frame(handle: BinaryIO) -> tuple[_Frame, bytes, int, int | None]:
    """Read one frame at the handle's position: (status, record, frame length or 0,
    the stamp of a stamped frame)."""
    header = handle.read(FRAME_HEADER_BYTES)
    if not header:
        return _Frame.END, b"", 0, None
    if len(header) < FRAME_HEADER_BYTES:
        # A short header whose first byte is not a magic is damage, not a short write.
        return (_Frame.INCOMPLETE if header[0] in _MAGICS else _Frame.BAD), b"", 0, None
    magic, length, crc = _HEADER.unpack(header)
    if not _length_ok(magic, length):
        return _Frame.BAD, b"", 0, None
    data = handle.read(length)
    if len(data) < length:
        return _Frame.INCOMPLETE, b"", 0, None
    if _checksum(header[1:5], data) != crc:
        return _Frame.BAD, b"", FRAME_HEADER_BYTES + length, None
    record, stamp = _unstamp(magic, data)
    return _Frame.OK, record, FRAME_HEADER_BYTES + length, stamp


def _valid_frame_follows(handle: BinaryIO, offset: int, frame_bytes: int) -> bool:
    """Whether a complete, valid frame lies after an invalid one at ``offset``.

    With a known length (a checksum mismatch) the next frame is right after it. With an
    unknown one (a damaged magic or length field, or a length running past the end) the
    rest of the segment is scanned for any checksum-valid frame: a damaged length must
    not hide acknowledged frames behind it and get them cut as a "torn tail".
    """
    if frame_bytes:
        handle.seek(offset + frame_bytes)
        status, _, _, _ = _read_frame(handle)
        return status is _Frame.OK
    handle.seek(offset + 1)
    rest = handle.read()
    at = _find_magic(rest, 0)
    while 0 <= at <= len(rest) - FRAME_HEADER_BYTES - 1:
        magic, length, crc = _HEADER.unpack_from(rest, at)
        end = at + FRAME_HEADER_BYTES + length
        if _length_ok(magic, length) and end <= len(rest):
            data = rest[at + FRAME_HEADER_BYTES : end]
            if _checksum(rest[at + 1 : at + 5], data) == crc:
                return True
        at = _find_magic(rest, at + 1)
    return False


def _find_magic(data: bytes, start: int) -> int:
    """The first offset at or after ``start`` holding either frame magic (-1: none)."""
    found = [i for i in (data.find(bytes([m]), start) for m in _MAGICS) if i >= 0]
    return min(found, default=-1)


_READ_AHEAD_BYTES: Final = 256 * 1024


def _frame_in(chunk: bytes, at: int) -> tuple[bytes, int, int | None] | None:
    """The record, frame length and stamp of the frame at ``at`` in ``chunk`` when it is
    whole there and valid (``_read_frame`` would return it as OK); None otherwise (not
    whole in the chunk, or invalid: the caller reads it on its own)."""
    end_header = at + FRAME_HEADER_BYTES
    if at < 0 or end_header > len(chunk):
        return None
    magic, length, crc = _HEADER.unpack_from(chunk, at)
    end = end_header + length
    if end > len(chunk) or not _length_ok(magic, length):
        return None
    data = chunk[end_header:end]
    if zlib.crc32(data, zlib.crc32(chunk[at + 1 : at + 5])) != crc:
        return None
    record, stamp = _unstamp(magic, data)
    return record, FRAME_HEADER_BYTES + length, stamp


# ---- directory helpers ------------------------------------------------------------------


def segment_path(directory: Path, segment: int) -> Path:
    """The file of segment number ``segment``."""
    return directory / f"{segment:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """The segment numbers present in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _SEGMENT_RE.match(name)
        if match is not None:
            found.append(int(match.group(1)))
    return sorted(found)


# ---- writer -----------------------------------------------------------------------------


class SpoolWriter:
    """The one writer of a spool directory (see the module docstring for the format)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if not 1 <= max_record_bytes <= MAX_FRAME_RECORD_BYTES:
            raise ValueError(
                f"max_record_bytes {max_record_bytes} is outside 1..{MAX_FRAME_RECORD_BYTES}"
            )
        if segment_max_bytes < MIN_SEGMENT_MAX_BYTES:
            raise ValueError(
                f"segment_max_bytes {segment_max_bytes} is below {MIN_SEGMENT_MAX_BYTES}"
            )
        if max_bytes < segment_max_bytes:
            raise ValueError(
                f"max_bytes {max_bytes} is below segment_max_bytes {segment_max_bytes}"
            )
        self._directory = Path(directory)
        self._max_bytes = max_bytes
        self._segment_max_bytes = segment_max_bytes
        self._max_record_bytes = max_record_bytes
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._make_directory()
        self._lock()
        try:
            self._sizes: dict[int, int] = {}
            for number in list_segments(self._directory):
                self._sizes[number] = segment_path(self._directory, number).stat().st_size
            self._segment = max(self._sizes, default=0)
            if self._sizes:
                self._repair_tail()
            self._bytes_used = sum(self._sizes.values())
        except BaseException:
            self.close()
            raise

    # -- opening --

    def _make_directory(self) -> None:
        missing = []
        path = self._directory
        while not path.exists():
            missing.append(path)
            path = path.parent
        self._directory.mkdir(parents=True, exist_ok=True)
        for created in reversed(missing):  # make each new directory entry durable
            fsync_dir(created.parent)

    def _lock(self) -> None:
        fd = os.open(self._directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise SpoolLocked(f"another writer holds {self._directory / LOCK_NAME}") from exc
            raise
        self._lock_fd = fd

    def _repair_tail(self) -> None:
        """Cut a torn tail off the last segment; refuse (SpoolCorrupt) to cut anything else."""
        path = segment_path(self._directory, self._segment)
        size = self._sizes[self._segment]
        with path.open("rb") as handle:
            offset = 0
            while True:
                handle.seek(offset)
                status, _, frame_bytes, _ = _read_frame(handle)
                if status is _Frame.OK:
                    offset += frame_bytes
                    continue
                if status is _Frame.END:
                    return
                # No writer runs beside this one (the lock): an incomplete frame followed
                # by valid frames is damage too, not a short write.
                if _valid_frame_follows(handle, offset, frame_bytes):
                    raise SpoolCorrupt(path, offset, "bad frame followed by valid frames")
                break
            handle.seek(offset)
            cut = handle.read()
        evidence = self._directory / f"{self._segment:020d}-{offset}.torn"
        evidence.write_bytes(cut)
        with evidence.open("rb") as kept:
            os.fsync(kept.fileno())
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self._directory)
        self._sizes[self._segment] = offset
        _log.warning(
            "spool_torn_tail_cut",
            segment=str(path),
            offset=offset,
            bytes_cut=size - offset,
            kept_as=str(evidence),
        )

    # -- public API --

    @property
    def directory(self) -> Path:
        """The spool directory."""
        return self._directory

    @property
    def bytes_used(self) -> int:
        """Bytes of all segment files (frames included) now in the directory."""
        return self._bytes_used

    @property
    def max_bytes(self) -> int:
        """The bound ``append`` never lets ``bytes_used`` exceed."""
        return self._max_bytes

    def end_position(self) -> SpoolPosition:
        """Where the next appended frame will start (the ``next_position`` of the last)."""
        return SpoolPosition(self._segment, self._sizes.get(self._segment, 0))

    def append(
        self, records: Sequence[bytes], stamps: Sequence[int] | None = None
    ) -> list[SpoolPosition]:
        """Append ``records`` durably (one write, one fdatasync) and return their positions;
        with ``stamps`` (one per record), as stamped frames stating those times.

        Raises SpoolFull, before writing anything, when the spool would pass ``max_bytes``.
        """
        if self._lock_fd is None:
            raise SpoolError("the spool writer is closed")
        if not records:
            return []
        if stamps is None:
            frames = [frame(r, self._max_record_bytes) for r in records]
        else:
            if len(stamps) != len(records):
                raise ValueError(f"{len(stamps)} stamps for {len(records)} records")
            frames = [
                frame(r, self._max_record_bytes, t) for r, t in zip(records, stamps, strict=True)
            ]
        total = sum(len(f) for f in frames)
        if self._bytes_used + total > self._max_bytes:
            raise SpoolFull(
                f"{self._directory}: appending {total} bytes to {self._bytes_used} would pass "
                f"the bound of {self._max_bytes} bytes"
            )
        size = self._sizes.get(self._segment, 0)
        if size > 0 and size + total > self._segment_max_bytes:
            self._rotate()
            size = 0
        fd = self._open_current()
        buffer = b"".join(frames)
        try:
            view = memoryview(buffer)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fdatasync(fd)
        except BaseException:
            # A half-written batch must not stay behind the next append (it would read as
            # corruption); put the file back to its acknowledged size.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
                os.fsync(fd)
            raise
        positions = []
        offset = size
        for item in frames:
            positions.append(SpoolPosition(self._segment, offset))
            offset += len(item)
        self._sizes[self._segment] = offset
        self._bytes_used += total
        return positions

    @property
    def first_segment(self) -> int:
        """The oldest segment number in the directory (the one being written when alone)."""
        return min(self._sizes, default=self._segment)

    @property
    def current_segment_bytes(self) -> int:
        """Bytes of the segment being written (0: none yet, or just sealed)."""
        return self._sizes.get(self._segment, 0)

    def seal(self) -> bool:
        """Start a new, empty segment after the one being written (created durably now, so
        a restarted writer continues the numbering). The sealed segment then lies wholly
        before ``end_position()`` and ``delete_segments_before`` may delete it. False (and
        nothing done) when the segment being written is empty."""
        if self._lock_fd is None:
            raise SpoolError("the spool writer is closed")
        if self.current_segment_bytes == 0:
            return False
        self._rotate()
        self._open_current()
        return True

    def delete_segments_before(self, position: SpoolPosition) -> int:
        """Delete whole segments numbered below ``position.segment``; return bytes freed.

        The segment being written is never deleted. The caller guarantees everything
        before ``position`` is no longer needed (in Kafka mode: acknowledged).
        """
        freed = 0
        for number in sorted(self._sizes):
            if number >= position.segment or number == self._segment:
                continue
            with contextlib.suppress(FileNotFoundError):
                segment_path(self._directory, number).unlink()
            freed += self._sizes.pop(number)
        if freed:
            fsync_dir(self._directory)
            self._bytes_used -= freed
            _log.info("spool_segments_deleted", directory=str(self._directory), bytes=freed)
        return freed

    def close(self) -> None:
        """Close the current segment and release the lock. Safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- segments --

    def _open_current(self) -> int:
        if self._fd is None:
            path = segment_path(self._directory, self._segment)
            created = self._segment not in self._sizes
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if created:
                fsync_dir(self._directory)
                self._sizes[self._segment] = 0
        return self._fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._segment += 1


# ---- reader -----------------------------------------------------------------------------


def read_spool(
    directory: Path, start: SpoolPosition | None = None, *, max_records: int | None = None
) -> Iterator[SpoolEntry]:
    """Yield the complete, valid records from ``start`` (None: the oldest segment's start).

    Moves on to the next segment file at the end of one. Stops silently at a torn or
    still-being-written tail of the last segment; resume later from the last entry's
    ``next_position``. Raises SpoolCorrupt (file, offset) for damage anywhere else.
    """
    directory = Path(directory)
    segments = list_segments(directory)
    if not segments:
        return
    if start is None:
        start = SpoolPosition(segments[0], 0)
    segment, offset = start.segment, start.offset
    count = 0
    rechecked: SpoolPosition | None = None
    while max_records is None or count < max_records:
        later = [s for s in segments if s >= segment]
        if not later:
            segments = list_segments(directory)
            later = [s for s in segments if s >= segment]
            if not later:
                return
        if later[0] != segment:
            segment, offset = later[0], 0
        path = segment_path(directory, segment)
        try:
            handle = path.open("rb")
        except FileNotFoundError:  # deleted by the writer's garbage collection meanwhile
            segments = list_segments(directory)
            segment, offset = segment + 1, 0
            continue
        with handle:
            status = _Frame.END
            # Frames are parsed from chunks read ahead (``_frame_in``); a frame that is
            # not whole and valid in the chunk is read again on its own (``_read_frame``),
            # which alone decides what an invalid or incomplete frame is.
            chunk, chunk_at = b"", offset
            while max_records is None or count < max_records:
                found = _frame_in(chunk, offset - chunk_at)
                if found is None and len(chunk) == _READ_AHEAD_BYTES:
                    handle.seek(offset)
                    chunk, chunk_at = handle.read(_READ_AHEAD_BYTES), offset
                    found = _frame_in(chunk, 0)
                if found is not None:
                    data, frame_bytes, stamp = found
                    status = _Frame.OK
                else:
                    handle.seek(offset)
                    status, data, frame_bytes, stamp = _read_frame(handle)
                    if status is not _Frame.OK:
                        break
                    handle.seek(offset + frame_bytes)
                    chunk, chunk_at = handle.read(_READ_AHEAD_BYTES), offset + frame_bytes
                next_offset = offset + frame_bytes
                yield SpoolEntry(
                    SpoolPosition(segment, offset),
                    data,
                    SpoolPosition(segment, next_offset),
                    stamp,
                )
                count += 1
                offset = next_offset
            if status is _Frame.OK:
                return  # max_records reached
            if status is _Frame.BAD and _valid_frame_follows(handle, offset, frame_bytes):
                raise SpoolCorrupt(path, offset, "bad frame followed by valid frames")
        segments = list_segments(directory)
        if not any(s > segment for s in segments):
            return  # the last segment: clean end, or a tail still being written / torn
        # A later segment exists, so this one is sealed now; but what we read may predate
        # the writer's last appends to it (it rotates only when a batch no longer fits).
        # Read it once more from here before moving on, or judging a bad frame.
        here = SpoolPosition(segment, offset)
        if rechecked != here:
            rechecked = here
            continue
        if status is not _Frame.END:
            raise SpoolCorrupt(path, offset, f"sealed segment has a {status.value} frame")
        segment, offset = segment + 1, 0
