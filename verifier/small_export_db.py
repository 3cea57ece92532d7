"""One DuckDB database per process for small exports, locked down once, reused.

Starting a DuckDB database costs ~14 ms of CPU (it registers the functions of its
statically linked extensions), about as much as the whole checklist of a placement of a
dozen records; the trace replay's workers verify thousands of them, one after another.
So a process keeps one in-memory database for small exports (``SMALL_EXPORT_BYTES``),
configured once as ``ExportSource`` configures its own — one thread, memory_limit, a
spill directory, no external access, configuration locked — and gives each export:

* a hard link to the export (a copy where no link can be made) in a directory of its
  own, the only place the locked database may read (``allowed_directories``; DuckDB
  resolves symlinks, so a link elsewhere does not widen it), attached READ_ONLY as
  ``x`` and removed after: a VIEW hidden in the export can read that export and nothing
  else, as with a database of its own;
* a fresh in-memory database ``w`` for the work tables (``USE w``), detached after: the
  tables of one export are gone before the next is attached.

Its optimizer runs only the passes of ``WARM_OPTIMIZERS``: on a few dozen rows the
others cost more planning than they save (passes only rewrite a plan into an equivalent
one; the reports are byte-identical, bench/verify_small.py).

After each export the database must hold nothing of it (``_clean``: only its empty
default catalog attached, no table anywhere); any failure there, or on the way, and the
database is closed and forgotten, the next export gets a new one. A database in use (a
second thread, nested sources) is not shared: the caller opens its own, as before. A
forked child never touches its parent's database (``os.register_at_fork``); the database
is closed and its directory removed at exit, in pool workers too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any, Final

import duckdb

from verifier import limits

EXPORT_ALIAS: Final = "x"
WORK_ALIAS: Final = "w"

# The only optimizer passes the warm database runs (every other one is disabled). Measured
# per export, paired in one process (bench/verify_small.py's exports, load ~5): all ~47
# passes 53.4 ms of CPU, none 45.8, these 46.8; on a 4,000-event export (5 MiB, still
# small) all 473 ms, none 485, these 456: join order, filter pushdown and the statistics
# are what pays once an export has thousands of rows.
WARM_OPTIMIZERS: Final = (
    "expression_rewriter",
    "filter_pushdown",
    "join_order",
    "statistics_propagation",
    "build_side_probe_side",
    "column_lifetime",
)


class WarmDatabase:
    """The process's locked in-memory database and its private directories."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.busy = threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix="gridledger-verify-warm-"))
        self.inbox = self.dir / "export"
        self.inbox.mkdir()
        self.serial = 0
        try:
            self.con: Any = duckdb.connect(":memory:")
            # Closed and removed when dropped or at exit, also in a pool's worker process
            # (multiprocessing ends those with os._exit: no atexit), never in a forked
            # child that inherited this finalizer (the pid).
            self._finalizer = Finalize(
                self, _close, args=(self.con, self.dir, self.pid), exitpriority=0
            )
            for statement in (
                "SET enable_progress_bar = false",  # never into stdout
                "SET threads = 1",
                f"SET memory_limit = '{limits.DUCKDB_MEMORY_LIMIT}'",
                f"SET temp_directory = '{_quoted(self.dir / 'spill')}'",
                f"SET allowed_directories = ['{_quoted(self.inbox)}/']",
                # SQL touches nothing outside the export and the work tables: a VIEW
                # hidden in an export cannot read local files or the network.
                "SET enable_external_access = false",
            ):
                self.con.execute(statement)
            _keep_optimizers(self.con, WARM_OPTIMIZERS)
            self.con.execute("SET lock_configuration = true")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def attach(self, path: Path) -> Path:
        """Link ``path`` into the inbox and attach it as ``x``, a fresh ``w`` as the
        default catalog. Returns the link (``detach`` removes it). Raises duckdb.Error
        (the caller then opens the export on a database of its own)."""
        self.serial += 1
        link = self.inbox / f"{self.serial}.duckdb"
        try:
            os.link(path, link)
        except OSError:  # another file system, or not ours to link: a private copy
            shutil.copyfile(path, link)
        try:
            self.con.execute(f"ATTACH '{_quoted(link)}' AS {EXPORT_ALIAS} (READ_ONLY)")
            self.con.execute(f"ATTACH ':memory:' AS {WORK_ALIAS}")
            self.con.execute(f"USE {WORK_ALIAS}")
        except BaseException:
            self.detach(link)
            raise
        return link

    def detach(self, link: Path) -> bool:
        """Drop the export and its work tables; True when the database is clean again."""
        drop = (
            f"USE memory; DETACH DATABASE IF EXISTS {WORK_ALIAS}; "
            f"DETACH DATABASE IF EXISTS {EXPORT_ALIAS}"
        )
        try:
            try:
                self.con.execute(drop)
            except duckdb.Error:  # a transaction the checklist left open (or aborted)
                self.con.execute("ROLLBACK")
                self.con.execute(drop)
            return self._clean()
        except duckdb.Error:
            return False
        finally:
            link.unlink(missing_ok=True)

    def _clean(self) -> bool:
        """Only the default catalog is attached, and no table exists anywhere."""
        rows = self.con.execute(
            "SELECT 'database ' || database_name FROM duckdb_databases() WHERE NOT internal "
            "UNION ALL SELECT 'table ' || table_name FROM duckdb_tables() "
            "UNION ALL SELECT 'view ' || view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        return bool(rows == [("database memory",)])

    def close(self) -> None:
        """Close the database and remove its directories."""
        self._finalizer()


def _close(con: Any, directory: Path, pid: int) -> None:
    if os.getpid() != pid:  # a forked child's copy: the parent's to close
        return
    try:
        with contextlib.suppress(duckdb.Error):
            con.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _keep_optimizers(con: Any, keep: tuple[str, ...]) -> None:
    """Disable every optimizer pass of ``con``'s DuckDB but ``keep``."""
    names = [str(row[0]) for row in con.execute("SELECT name FROM duckdb_optimizers()").fetchall()]
    disabled = ",".join(name for name in names if name not in keep)
    con.execute(f"SET disabled_optimizers = '{disabled}'")


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


_lock = threading.Lock()
# The process's databases by use: "export", the one small exports are attached to;
# "batch", a second for a batch's pricing (``verify_exports``), to which no export is ever
# attached, only the rows the checklists took from decoded envelopes.
_databases: dict[str, WarmDatabase] = {}


def acquire(use: str = "export") -> WarmDatabase | None:
    """The process's database for ``use``, now reserved for the caller (``release`` it),
    or None when it is in use or cannot be made (the caller opens its own; a batch then
    prices its exports one by one)."""
    with _lock:
        database = _databases.get(use)
        if database is not None and database.pid != os.getpid():
            _forget_in_child()  # a fork the at-fork hook missed: not ours to touch
            database = None
        if database is None:
            try:
                database = _databases[use] = WarmDatabase()
            except (duckdb.Error, OSError):
                return None
        if not database.busy.acquire(blocking=False):
            return None
        return database


def release(warm: WarmDatabase, clean: bool) -> None:
    """Give the database back; one that is not clean, or has served
    WARM_DATABASE_MAX_EXPORTS exports (a batch database attaches none), is closed and
    forgotten (the next is new)."""
    if not clean or warm.serial >= limits.WARM_DATABASE_MAX_EXPORTS:
        with _lock:
            for use, database in list(_databases.items()):
                if database is warm:
                    del _databases[use]
        warm.close()
    warm.busy.release()


# A forked child's copies of its parent's databases: kept, never closed nor destroyed
# (DuckDB's state after a fork is not the child's to tear down).
_inherited: list[WarmDatabase] = []


def _forget_in_child() -> None:
    global _lock
    _inherited.extend(_databases.values())
    _databases.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
