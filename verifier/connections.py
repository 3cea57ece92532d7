"""Each worker's read-only connections to the export it reads its ranges from: one per
process and thread, kept between jobs (``verifier/walk.py``, ``open_ranges``), dropped at
the pass's end and by a pool process as it starts (``verifier/workers.py``).

A module of its own below both, so that neither imports the other.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Final, Protocol

import duckdb

from verifier import limits
from verifier.invariant import InvariantError


class ExportFileKey(Protocol):
    """What names an export file here (``verifier.pair_worker.ExportFile`` has it): its path and
    its identity (st_dev, st_ino, st_mtime_ns) when the run began."""

    @property
    def path(self) -> str: ...

    @property
    def identity(self) -> tuple[int, int, int]: ...


# The worker's connection to the export it reads, by ((pid, thread), path, identity);
# worker threads share the dict (_EXPORT_LOCK).
_EXPORT: dict[tuple[tuple[int, int], str, tuple[int, int, int]], Any] = {}
_EXPORT_LOCK: Final = threading.Lock()


def export_connection(export: ExportFileKey) -> Any:
    """This worker's read-only connection to ``export``: one kept per process and thread
    (a DuckDB connection is not shared between threads, nor used across a fork). The
    threads of one process connect to one database (DuckDB's instance cache hands the
    second the first's): its configuration is locked once, by the first."""
    owner = (os.getpid(), threading.get_ident())
    key = (owner, export.path, export.identity)
    con = _EXPORT.get(key)
    if con is None:
        with _EXPORT_LOCK:
            stale = [_EXPORT.pop(k) for k in list(_EXPORT) if k[0] == owner]
        for old in stale:
            old.close()
        stat = os.stat(export.path)
        if (stat.st_dev, stat.st_ino, stat.st_mtime_ns) != export.identity:
            raise InvariantError(f"{export.path} changed during the verification")
        with _EXPORT_LOCK:
            con = duckdb.connect(
                export.path,
                read_only=True,
                config={
                    "threads": 1,
                    "memory_limit": limits.WORKER_DUCKDB_MEMORY_LIMIT,
                    "enable_external_access": False,
                },
            )
            locked = con.execute("SELECT current_setting('lock_configuration')").fetchall()
            if not locked[0][0]:
                con.execute("SET lock_configuration = true")
            _EXPORT[key] = con
    return con


def forget_exports(close: bool, only: ExportFileKey | None = None) -> None:
    """Drop the cached export connections: closed (the pass ended in this process: only
    its export's), or just forgotten (a forked worker inherited its parent's, which it
    must not touch)."""
    mine = os.getpid()
    with _EXPORT_LOCK:
        dropped = [
            (key, _EXPORT.pop(key))
            for key in list(_EXPORT)
            if only is None or key[1:] == (only.path, only.identity)
        ]
    for key, con in dropped:
        if close and key[0][0] == mine:
            con.close()
