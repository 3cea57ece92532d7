"""Small files replaced atomically: write a temp file, fsync, rename, fsync the directory.

After a crash at any point the file holds either the old or the new content, never a
mix, and a completed replace survives power loss.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["read_small_file", "write_atomic"]

MAX_SMALL_FILE_BYTES = 64 * 1024 * 1024
"""Largest state file read back (a heads file of MAX_STREAMS envelopes fits easily)."""


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_small_file(path: Path) -> bytes | None:
    """The content of ``path``, or None if it does not exist. Refuses oversized files."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SMALL_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_SMALL_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_SMALL_FILE_BYTES} bytes")
    return data
