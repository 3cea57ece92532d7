"""Reading input files with a bound: never more than the bound (+1 byte to detect excess)."""

from __future__ import annotations

from pathlib import Path


def read_at_most(path: Path, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path``: a result longer than ``limit`` means too large.

    Reads no further, whatever the file is (a FIFO, a device, a file still growing), so
    memory is bounded by the limit, not by the input. Raises OSError as ``open`` does.
    """
    with path.open("rb") as handle:
        return handle.read(limit + 1)
