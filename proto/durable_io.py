"""Files: read with a bound (never more than the bound, +1 byte to detect excess), and
written durably (every byte written, fsync'd; replaced atomically).

After a crash at any point a file written by ``write_atomic`` holds either the old or
the new content, never a mix, and a completed replace survives power loss.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def read_at_most(path: Path, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path``: a result longer than ``limit`` means too large.

    Reads no further, whatever the file is (a FIFO, a device, a file still growing), so
    memory is bounded by the limit, not by the input. Raises OSError as ``open`` does.
    """
    with path.open("rb") as handle:
        return handle.read(limit + 1)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (it may be another user's): who may still own a
    lock or temporary file that names it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename,
    fsync of the directory); the file is created 0600."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write_synced(tmp, os.O_TRUNC, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created 0600) and fsync it before returning."""
    _write_synced(path, os.O_APPEND, data)


def _write_synced(path: Path, mode: int, data: bytes) -> None:
    """Write ``data`` to ``path`` (created 0600; ``mode``: ``os.O_TRUNC`` or ``os.O_APPEND``)
    and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
