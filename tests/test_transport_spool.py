"""The durable spool: round trips, reopen, torn tails, corruption, bounds, lock, readers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.limits import MAX_RECORD_BYTES
from transport.positions import SpoolPosition
from transport.spool import (
    FRAME_HEADER_BYTES,
    SpoolCorrupt,
    SpoolError,
    SpoolFull,
    SpoolLocked,
    SpoolWriter,
    frame,
    read_spool,
    segment_path,
)

SMALL_SEGMENT = 4096


def _records(n: int, size: int = 100, tag: str = "r") -> list[bytes]:
    return [f"{tag}-{i:06d}-".encode().ljust(size, b"x") for i in range(n)]


def _datas(directory: Path, start: SpoolPosition | None = None) -> list[bytes]:
    return [e.data for e in read_spool(directory, start)]


def test_round_trip_positions_and_next_positions(tmp_path: Path) -> None:
    records = [*_records(50, 37), b"z"]
    with SpoolWriter(tmp_path / "s", segment_max_bytes=SMALL_SEGMENT) as writer:
        positions = writer.append(records[:20])
        positions += writer.append(records[20:])
        end = writer.end_position()
    entries = list(read_spool(tmp_path / "s"))
    assert [e.data for e in entries] == records
    assert [e.position for e in entries] == positions
    # next_position of each entry is where the following one starts; the last is the end.
    assert [e.next_position for e in entries[:-1]] == [e.position for e in entries[1:]]
    assert entries[-1].next_position == end
    # Resuming from any next_position yields exactly the rest.
    for i in (0, 7, 19, 20, 49):
        assert _datas(tmp_path / "s", entries[i].next_position) == records[i + 1 :]


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.binary(min_size=1, max_size=700), max_size=12), max_size=8))
def test_property_any_batches_round_trip(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]]
) -> None:
    directory = tmp_path_factory.mktemp("p") / "s"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        for batch in batches:
            writer.append(batch)
        used = writer.bytes_used
    flat = [r for b in batches for r in b]
    assert _datas(directory) == flat
    assert used == sum(len(r) + FRAME_HEADER_BYTES for r in flat)


def test_segments_rotate_and_a_batch_never_spans_two(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        batches = [_records(7, 300, f"b{i}") for i in range(10)]
        batch_positions = [writer.append(b) for b in batches]
    segments = sorted(directory.glob("*.seg"))
    assert len(segments) > 3
    for positions in batch_positions:
        assert len({p.segment for p in positions}) == 1
    assert _datas(directory) == [r for b in batches for r in b]


def test_reopen_continues_after_the_last_record(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        writer.append(_records(30, 200, "a"))
        end = writer.end_position()
        used = writer.bytes_used
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        assert writer.end_position() == end
        assert writer.bytes_used == used
        writer.append(_records(30, 200, "b"))
    assert _datas(directory) == _records(30, 200, "a") + _records(30, 200, "b")


def _spool_with_last_frame(tmp_path: Path, n: int = 5) -> tuple[Path, Path, int, int]:
    """A one-segment spool; returns (dir, segment file, start of last frame, file size)."""
    directory = tmp_path / "s"
    with SpoolWriter(directory) as writer:
        positions = writer.append(_records(n, 64))
        size = writer.end_position().offset
    return directory, segment_path(directory, 0), positions[-1].offset, size


def test_torn_tail_at_every_byte_of_the_last_frame_is_cut(tmp_path: Path) -> None:
    directory, path, last_start, size = _spool_with_last_frame(tmp_path)
    original = path.read_bytes()
    expected = _records(5, 64)
    for cut_at in range(last_start, size):
        path.write_bytes(original[:cut_at])
        for torn in directory.glob("*.torn"):
            torn.unlink()
        # A reader beside a crashed writer stops silently in front of the torn tail.
        assert _datas(directory) == expected[:-1], cut_at
        with SpoolWriter(directory) as writer:
            assert writer.end_position() == SpoolPosition(0, last_start), cut_at
            assert path.stat().st_size == last_start
            if cut_at > last_start:  # the cut bytes are kept as evidence
                kept = list(directory.glob("*.torn"))
                assert [k.read_bytes() for k in kept] == [original[last_start:cut_at]]
            writer.append([b"after-repair"])
        assert _datas(directory) == [*expected[:-1], b"after-repair"], cut_at
        path.write_bytes(original)


def test_bad_checksum_of_the_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    directory, path, last_start, size = _spool_with_last_frame(tmp_path)
    original = path.read_bytes()
    for flip_at in range(last_start, size):
        damaged = bytearray(original)
        damaged[flip_at] ^= 0x01
        path.write_bytes(bytes(damaged))
        assert _datas(directory) == _records(4, 64), flip_at
        with SpoolWriter(directory) as writer:
            assert writer.end_position() == SpoolPosition(0, last_start), flip_at
        path.write_bytes(original)


def test_corrupted_middle_frame_is_reported_not_cut(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory) as writer:
        positions = writer.append(_records(5, 64))
    path = segment_path(directory, 0)
    data = bytearray(path.read_bytes())
    middle = positions[2].offset
    data[middle + FRAME_HEADER_BYTES + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt) as info:
        list(read_spool(directory))
    assert info.value.path == path and info.value.offset == middle
    # The first two records were readable before the damage was found.
    got = []
    with pytest.raises(SpoolCorrupt):
        for entry in read_spool(directory):
            got.append(entry.data)
    assert got == _records(2, 64)
    # The writer refuses to open rather than cut acknowledged records.
    with pytest.raises(SpoolCorrupt):
        SpoolWriter(directory)
    assert path.stat().st_size == len(data)
    assert not list(directory.glob("*.torn"))


def test_damage_in_a_sealed_segment_is_corruption(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        for i in range(4):
            writer.append(_records(10, 300, f"b{i}"))
    first = segment_path(directory, 0)
    data = first.read_bytes()
    first.write_bytes(data[:-5])  # a sealed segment missing its last bytes
    with pytest.raises(SpoolCorrupt) as info:
        list(read_spool(directory))
    assert info.value.path == first


def test_spool_full_writes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory, max_bytes=8192, segment_max_bytes=SMALL_SEGMENT) as writer:
        record = b"x" * 991  # 1000 bytes framed
        for _ in range(8):
            writer.append([record])
        before = (writer.bytes_used, writer.end_position())
        with pytest.raises(SpoolFull):
            writer.append([b"y" * 10, record])  # 1019 bytes would pass 8192
        assert (writer.bytes_used, writer.end_position()) == before
        writer.append([b"y" * 183])  # exactly up to the bound
        assert writer.bytes_used == 8192
        with pytest.raises(SpoolFull):
            writer.append([b"z"])
    assert sum(p.stat().st_size for p in directory.glob("*.seg")) == 8192
    assert _datas(directory) == [record] * 8 + [b"y" * 183]


def test_bad_records_are_refused(tmp_path: Path) -> None:
    with SpoolWriter(tmp_path / "s") as writer:
        with pytest.raises(ValueError):
            writer.append([b""])
        with pytest.raises(ValueError):
            writer.append([b"x" * (MAX_RECORD_BYTES + 1)])
        writer.append([b"x" * MAX_RECORD_BYTES])
        assert writer.end_position().offset == len(frame(b"x" * MAX_RECORD_BYTES))


def test_lock_is_exclusive_across_processes_and_released_on_close(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    writer = SpoolWriter(directory)
    with pytest.raises(SpoolLocked):
        SpoolWriter(directory)
    probe = (
        "import sys; from pathlib import Path\n"
        "from transport.spool import SpoolWriter, SpoolLocked\n"
        "try:\n    SpoolWriter(Path(sys.argv[1]))\nexcept SpoolLocked:\n    sys.exit(3)\n"
    )
    locked = subprocess.run([sys.executable, "-c", probe, str(directory)], timeout=60)
    assert locked.returncode == 3
    writer.close()
    free = subprocess.run([sys.executable, "-c", probe, str(directory)], timeout=60)
    assert free.returncode == 0


def test_reader_beside_a_live_writer_sees_every_record_once(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    writer = SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT)
    expected = [r for i in range(200) for r in _records(3, 150, f"w{i}")]
    done = threading.Event()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(200):
                writer.append(_records(3, 150, f"w{i}"))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    seen: list[bytes] = []
    position: SpoolPosition | None = None
    for _ in range(1_000_000):  # bounded: the writer finishes long before
        finished = done.is_set()
        for entry in read_spool(directory, position, max_records=50):
            seen.append(entry.data)
            position = entry.next_position
        if finished and len(seen) >= len(expected):
            break
        if finished and not list(read_spool(directory, position)):
            break
    thread.join(timeout=60)
    writer.close()
    assert not failure
    assert seen == expected


def test_delete_segments_before(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        batches = [writer.append(_records(10, 300, f"b{i}")) for i in range(6)]
        assert len({b[0].segment for b in batches}) == 6
        used = writer.bytes_used
        keep_from = batches[3][0]
        sizes = {int(p.stem): p.stat().st_size for p in directory.glob("*.seg")}
        freed = writer.delete_segments_before(keep_from)
        assert freed == sum(v for k, v in sizes.items() if k < keep_from.segment)
        assert writer.bytes_used == used - freed
        assert sorted(int(p.stem) for p in directory.glob("*.seg")) == [3, 4, 5]
        # The current segment survives even when asked to delete past it.
        writer.delete_segments_before(SpoolPosition(99, 0))
        assert [int(p.stem) for p in directory.glob("*.seg")] == [5]
        writer.append([b"still-writing"])
        end = writer.end_position()
    assert _datas(directory) == [*_records(10, 300, "b5"), b"still-writing"]
    # A reader whose position was garbage-collected moves on to the oldest survivor.
    assert _datas(directory, SpoolPosition(1, 0))[-1] == b"still-writing"
    with SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT) as writer:
        assert writer.end_position() == end


def test_seal_starts_an_empty_durable_segment_and_the_sealed_one_can_go(tmp_path: Path) -> None:
    """Issue 15: a sealed segment lies wholly before the end and is deleted with the
    others; the new empty segment keeps the numbering across a restart, so a reader's
    position in the deleted segment reads on from the new one."""
    directory = tmp_path / "s"
    with SpoolWriter(directory) as writer:
        assert writer.seal() is False  # nothing written yet: nothing to seal
        writer.append([b"one", b"two"])
        acked = writer.end_position()
        assert writer.current_segment_bytes == acked.offset
        assert writer.seal() is True
        assert writer.current_segment_bytes == 0 and writer.end_position() == SpoolPosition(1, 0)
        assert writer.seal() is False  # the new segment is empty
        assert writer.delete_segments_before(writer.end_position()) == acked.offset
        assert sorted(int(p.stem) for p in directory.glob("*.seg")) == [1]
        assert writer.bytes_used == 0
    with SpoolWriter(directory) as writer:  # restarted: continues at segment 1
        assert writer.end_position() == SpoolPosition(1, 0)
        writer.append([b"three"])
    assert _datas(directory, acked) == [b"three"]
    writer = SpoolWriter(directory)
    writer.close()
    with pytest.raises(SpoolError, match="closed"):
        writer.seal()


def test_append_after_failed_write_leaves_no_partial_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "s"
    writer = SpoolWriter(directory)
    writer.append([b"first"])
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real_write(fd, bytes(data)[:5])  # half a frame reaches the file, then ENOSPC
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError):
        writer.append([b"second"])
    monkeypatch.setattr(os, "write", real_write)
    writer.append([b"third"])
    writer.close()
    assert _datas(directory) == [b"first", b"third"]


def test_reader_does_not_skip_appends_racing_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader hits the end of segment 0; before it lists the directory again the
    writer appends once more to segment 0 and then rotates. Nothing may be skipped."""
    import transport.spool as spool_module

    directory = tmp_path / "s"
    writer = SpoolWriter(directory, segment_max_bytes=SMALL_SEGMENT)
    a, b, c = _records(3, 150, "a"), _records(3, 150, "b"), _records(4, 900, "c")
    writer.append(a)
    real_list = spool_module.list_segments
    calls = {"n": 0}

    def racing_list(path: Path) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 2:  # the reader just saw the clean end of segment 0
            assert writer.append(b)[0].segment == 0  # still fits segment 0
            assert writer.append(c)[0].segment == 1  # does not: rotates
        return real_list(path)

    monkeypatch.setattr(spool_module, "list_segments", racing_list)
    assert _datas(directory) == a + b + c
    writer.close()


# ---- stamped frames (SPEC §6.6 arrival = "sender") -------------------------------------------


def test_stamped_and_plain_frames_mix_and_read_back_with_their_stamps(tmp_path: Path) -> None:
    with SpoolWriter(tmp_path) as writer:
        writer.append([b"plain-1"])
        writer.append([b"stamped-1", b"stamped-2"], [1_767_225_600_000, 0])
        writer.append([b"plain-2"])
    entries = list(read_spool(tmp_path))
    assert [(e.data, e.stamp_ms) for e in entries] == [
        (b"plain-1", None),
        (b"stamped-1", 1_767_225_600_000),
        (b"stamped-2", 0),
        (b"plain-2", None),
    ]
    # A stamped frame is 8 bytes longer than the plain frame of the same record.
    assert len(frame(b"x", stamp_ms=5)) == len(frame(b"x")) + 8


def test_a_torn_stamped_tail_is_cut_and_damage_inside_is_corruption(tmp_path: Path) -> None:
    with SpoolWriter(tmp_path) as writer:
        writer.append([b"a", b"b"], [1, 2])
    path = segment_path(tmp_path, 0)
    whole = path.read_bytes()
    path.write_bytes(whole + frame(b"c", stamp_ms=3)[:-2])  # a torn stamped append
    with SpoolWriter(tmp_path) as writer:
        writer.append([b"d"], [4])
    assert [(e.data, e.stamp_ms) for e in read_spool(tmp_path)] == [
        (b"a", 1),
        (b"b", 2),
        (b"d", 4),
    ]
    # A flipped byte in the first stamp, followed by valid frames: corruption, not a tail.
    data = bytearray(path.read_bytes())
    data[FRAME_HEADER_BYTES + 7] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt):
        list(read_spool(tmp_path))


@pytest.mark.parametrize("stamp", [-1, 2**53, True])
def test_a_stamp_out_of_range_is_refused_and_nothing_written(tmp_path: Path, stamp: int) -> None:
    with SpoolWriter(tmp_path) as writer:
        with pytest.raises(ValueError):
            writer.append([b"ok", b"bad"], [0, stamp])
        with pytest.raises(ValueError):
            writer.append([b"ok"], [0, 1])
    assert list(read_spool(tmp_path)) == []


def test_frames_across_the_readers_chunks(tmp_path: Path) -> None:
    """The reader parses frames from chunks it reads ahead (256 KiB): frames straddling a
    chunk's end, frames longer than a chunk, stamped and plain ones, come back whole and
    at their positions; damage past the first chunk is still named where it is, and a
    torn tail past it still ends the read silently."""
    sizes = [100, 5_000, MAX_RECORD_BYTES, 777, 60_000, 1, 131_072, 9_999]
    records = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes * 3)]
    stamps = [1_000 + i for i in range(len(records))]
    with SpoolWriter(tmp_path) as writer:
        positions = writer.append(records[:10]) + writer.append(records[10:], stamps[10:])
        end = writer.end_position()
    entries = list(read_spool(tmp_path))
    assert [e.data for e in entries] == records
    assert [e.position for e in entries] == positions
    assert [e.next_position for e in entries] == [*positions[1:], end]
    assert [e.stamp_ms for e in entries] == [None] * 10 + stamps[10:]
    for start in (3, 7, 11, 20):  # resumed mid-segment, a few records at a time
        got = [e.data for e in read_spool(tmp_path, positions[start], max_records=4)]
        assert got == records[start : start + 4]
    path = segment_path(tmp_path, 0)
    whole = path.read_bytes()
    # A bit flipped in a record past the first chunk, valid frames after it: corruption.
    damaged = 17
    assert positions[damaged].offset > 256 * 1024
    flipped = bytearray(whole)
    flipped[positions[damaged].offset + FRAME_HEADER_BYTES + 8 + 3] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(SpoolCorrupt) as caught:
        list(read_spool(tmp_path))
    assert caught.value.offset == positions[damaged].offset
    # The last frame cut short (a torn tail): everything before it, silently.
    path.write_bytes(whole[: positions[-1].offset + FRAME_HEADER_BYTES + 5])
    assert [e.data for e in read_spool(tmp_path)] == records[:-1]
