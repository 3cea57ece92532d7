"""Small state files of the agent: read back with a bound; written with
``proto.durable_io.write_atomic`` (temp file, fsync, rename, fsync the directory).

After a crash at any point the file holds either the old or the new content, never a
mix, and a completed replace survives power loss.
"""

from __future__ import annotations

from pathlib import Path

from proto.durable_io import write_atomic

__all__ = ["read_small_file", "write_atomic"]

MAX_SMALL_FILE_BYTES = 64 * 1024 * 1024
"""Largest state file read back (a heads file of MAX_STREAMS envelopes fits easily)."""


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
