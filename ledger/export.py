"""Export placements as DuckDB files exactly per proto/EXPORT.md (format version 1).

The export is written to a temporary file beside the target and renamed over it, so a
crash never leaves a half-written export under the target name. Before writing, the
ledger issues (and stores) a statement and a checkpoint for the current head when none
exists yet, so every export carries both. ``parquet_dir`` additionally writes each
table as ``<table>/<placement>.parquet`` (same columns), each file also via a rename; what
an export killed left beside its files (temporary files of a process that is gone) is
removed by the next one (``_remove_leftovers``).

Cost (bench/export_many.py): the rows are copied by DuckDB itself, store to file, with the new file
ATTACHed to a connection of the store (no row passes through Python), and they are read
through the placement's commit range (``ledger.store``), so one export costs about its
own rows. ``export_all`` exports many placements in one pass: statements and checkpoints
issued set-wise (``attest_chunks``), each chunk of placements written as soon as it is
attested while the next is (one pipeline, not two passes); each file synced and renamed
by syncer threads (EXPORT_SYNC_THREADS) while the writers write on; the rows read from
the store once per chunk of placements in commit order (one query per table, not ~10
per placement), handed to a DuckDB of each writer thread's own and written from there;
every file started from one empty file with the schema, by two threads (DuckDB releases
the GIL). What is left per file is DuckDB's own cost of a file (``bench/export_many.py``
measures it beside).

Memory (``bench/export_rss.py``): a placement above EXPORT_STAGE_RECORDS is read
straight from the store page by page (``_pages``: DuckDB sorts EXPORT_PAGE_RECORDS rows at
a time, not the whole placement) into a file of small row groups (EXPORT_ROW_GROUP_ROWS),
so what an export needs of the store's buffer pool does not grow with the placement.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import shutil
import threading
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import duckdb

from ledger.issuer import (
    ChainFacts,
    UnknownPlacement,
    attest_chunks,
    frontier_at,
    issue_checkpoint,
    issue_statement,
    payloads_between,
)
from ledger.limits import (
    EXPORT_PAGE_RECORDS,
    EXPORT_ROW_GROUP_ROWS,
    EXPORT_STAGE_PLACEMENTS,
    EXPORT_STAGE_RECORDS,
    EXPORT_WRITER_MEMORY_LIMIT,
)
from ledger.store import PLACEMENT_ROWS, Store
from proto import merkle
from proto.durable_io import fsync_dir, pid_alive
from proto.errors import ProtoError
from proto.keys import SigningKey, b64
from proto.note import LEDGER_NOTE_NAME, checkpoint_origin, parse_checkpoint_body, parse_note

EXPORT_FORMAT: Final = "gridledger-export"
EXPORT_FORMAT_VERSION: Final = "2"  # records unsigned, covered by checkpoints (SPEC §8)
# The DuckDB storage format of export files: readable by DuckDB 1.0 and every later version.
STORAGE_VERSION: Final = "v1.0.0"
# Compact exports (``compact=True``, EXPORT.md "Readers"): DuckDB 1.2's storage format
# with 16 KiB blocks instead of 256 KiB. A file of the default format takes at least one
# 256 KiB block per table that has rows (~2.5 MiB for a placement whatever its size); a
# compact one ~6x less for a small placement. Readable by DuckDB 1.2 and later only.
COMPACT_STORAGE_VERSION: Final = "v1.2.0"
COMPACT_BLOCK_SIZE: Final = 16 * 1024

_COMMON: Final = (
    "chain_index BIGINT NOT NULL, position VARCHAR NOT NULL, input_hash VARCHAR NOT NULL, "
    "envelope BLOB NOT NULL, status VARCHAR NOT NULL, reason VARCHAR NOT NULL"
)

# table -> (input kind, extra convenience columns with their types)
INPUT_TABLES: Final[dict[str, tuple[str, tuple[tuple[str, str], ...]]]] = {
    "terms": ("terms", ()),
    "key_bindings": (
        "keybinding",
        (("node_id", "VARCHAR"), ("valid_from_ms", "BIGINT"), ("valid_until_ms", "BIGINT")),
    ),
    "usage_events": (
        "usage",
        (("node_id", "VARCHAR"), ("seq", "BIGINT"), ("start_ms", "BIGINT"), ("end_ms", "BIGINT")),
    ),
    "reclaims": ("reclaim", (("issued_at_ms", "BIGINT"), ("effective_at_ms", "BIGINT"))),
    "adjustments": ("adjustment", (("direction", "VARCHAR"), ("amount_minor", "BIGINT"))),
    "closes": ("closed", (("closed_at_ms", "BIGINT"),)),
    # SPEC §6.8 (appended; exports written before it have no such table)
    "assignments": ("assignment", ()),
    # SPEC §6.7; optional for readers (exports written before it have no such table).
    "releases": ("release", (("issued_at_ms", "BIGINT"), ("effective_at_ms", "BIGINT"))),
    # SPEC §6.3 resume; optional for readers (exports written before it have no such table).
    "resumes": ("resume", (("node_id", "VARCHAR"),)),
}


def _schema(prefix: str = "") -> str:
    """The export's CREATE TABLE statements, table names prefixed by ``prefix``."""
    return "\n".join(
        [
            # No PRIMARY KEY: DuckDB 1.0 cannot open a file with an index written by a later
            # DuckDB (EXPORT.md "Readers"); each key is written once and a verifier refuses
            # an export naming a key twice.
            f"CREATE TABLE {prefix}meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL);",
            *(
                f"CREATE TABLE {prefix}{table} ({_COMMON}"
                + "".join(f", {name} {sql_type}" for name, sql_type in extra)
                + ");"
                for table, (_, extra) in INPUT_TABLES.items()
            ),
            f"CREATE TABLE {prefix}ledger_records (chain_index BIGINT NOT NULL, "
            "envelope BLOB NOT NULL, record_hash VARCHAR NOT NULL, kind VARCHAR, "
            "status VARCHAR, reason VARCHAR, "
            "delivered_mgms BIGINT, gross_minor BIGINT, buyer_owes_minor BIGINT, "
            "operator_receives_minor BIGINT, desk_receives_minor BIGINT, placement_id VARCHAR);",
            f"CREATE TABLE {prefix}statements (through_index BIGINT NOT NULL, "
            "envelope BLOB NOT NULL, final BOOLEAN, buyer_owes_minor BIGINT, "
            "operator_receives_minor BIGINT, "
            "desk_receives_minor BIGINT);",
            f"CREATE TABLE {prefix}checkpoints (size BIGINT NOT NULL, note VARCHAR NOT NULL);",
            f"CREATE TABLE {prefix}held (position VARCHAR NOT NULL, input_hash VARCHAR NOT NULL, "
            "envelope BLOB NOT NULL);",
        ]
    )


SCHEMA: Final = _schema()

TABLES: Final[tuple[str, ...]] = (
    "meta",
    *INPUT_TABLES,
    "ledger_records",
    "statements",
    "checkpoints",
    "held",
)


# Threads writing export files in ``export_all``.
EXPORT_THREADS: Final = 2
# Threads syncing and renaming the files written (``_finish``) in ``export_all``: an fsync
# waits on the disk, not the CPU, and one thread alone caps the files per second at one
# over the fsync's latency (loaded machine: fewer files/s than two writers make); the
# fsyncs of several threads at once share the file system's journal commits.
EXPORT_SYNC_THREADS: Final = 4

_ALIASES = itertools.count()


def _tmp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.tmp-{os.getpid()}")


# The names of the files an export writes beside its exports before renaming or removing
# them (``_tmp_path``, the template, ``_stage``'s Parquet, and their WAL), with the id of
# the process that wrote each.
_LEFTOVER: Final = re.compile(
    r"^\.(?:template-(\d+)\.duckdb|stage-(\d+)-\d+-\w+\.parquet|.+\.tmp-(\d+))(?:\.wal)?$"
)


def _remove_leftovers(directory: Path, only: str | None = None) -> list[str]:
    """Remove what an export killed in ``directory`` left behind (kill -9: its temporary
    files, never under an export's name), and name it. Only the files of a process that
    is gone: this process's own, or a live one's, may be in use. ``only``: just the
    temporary files of the file named so (``_tmp_path``), in a directory that is not the
    exports' own (``--out`` of one export may be anywhere)."""
    pattern = (
        _LEFTOVER if only is None else re.compile(rf"^\.{re.escape(only)}\.tmp-(\d+)(?:\.wal)?$")
    )
    removed: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            match = pattern.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            pid = int(next(group for group in match.groups() if group is not None))
            if pid == os.getpid() or pid_alive(pid):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> int:
    row = con.execute(sql, params).fetchone()
    return 0 if row is None else int(row[0])


def _attach_options(compact: bool) -> str:
    """The ATTACH options of a new export file (its storage format and block size)."""
    if compact:
        return f"STORAGE_VERSION '{COMPACT_STORAGE_VERSION}', BLOCK_SIZE {COMPACT_BLOCK_SIZE}"
    return f"STORAGE_VERSION '{STORAGE_VERSION}'"


# The order of each export table's rows, and the column that orders them.
_ORDER: Final = {
    "ledger_records": "chain_index",
    **dict.fromkeys(INPUT_TABLES, "chain_index"),
    "statements": "through_index",
    "checkpoints": "size",
}


# The columns of each export table that holds rows of the store, as read from
# ``records``, ``inputs``, ``statements`` and ``checkpoints``, in the table's order.
_COLUMNS: Final = {
    "ledger_records": "chain_index, envelope, record_hash, kind, status, reason, "
    "delivered_mgms, total_gross_minor, total_buyer_owes_minor, "
    "total_operator_receives_minor, total_desk_receives_minor, placement_id",
    **{
        table: "chain_index, position, input_hash, envelope, status, reason"
        + "".join(f", {name}" for name, _ in extra)
        for table, (_, extra) in INPUT_TABLES.items()
    },
    "statements": "through_index, envelope, final, buyer_owes_minor, "
    "operator_receives_minor, desk_receives_minor",
    "checkpoints": "size, note",
}


@dataclass(frozen=True, slots=True)
class _Rows:
    """Where ``_copy_rows`` reads one placement's rows: in the store, page by page
    (``pages``, see ``_pages``), or in the tables ``_stage`` filled (``pages`` empty)."""

    placement_id: str
    pages: tuple[_Page, ...] = ()
    records: int | None = None  # read from the store: only the first ``records`` (None: all)
    # An export since a checkpoint of this size (SPEC §8.5): rows from it on; None: all.
    since: int | None = None

    def of(self, table: str) -> list[tuple[str, list[Any]]]:
        """The FROM .. clauses (through ORDER BY) that read the rows of export table
        ``table`` in their order, one after the other, and their parameters."""
        if not self.pages:
            # Staged in this order, read in it (the writer preserves insertion order).
            return [(f"FROM {_STAGE_PREFIX}{table} WHERE placement_id = ?", [self.placement_id])]
        order = f"ORDER BY {_ORDER[table]}"
        if table in ("statements", "checkpoints"):
            bounds: list[Any] = [self.placement_id]
            clause = "WHERE placement_id = ?"
            if self.records is not None:
                clause += " AND through_index < ?" if table == "statements" else " AND size <= ?"
                bounds.append(self.records)
            if self.since is not None:
                clause += f" AND {_ORDER[table]} >= ?"
                bounds.append(self.since)
            return [(f"FROM {table} {clause} {order}", bounds)]
        source, kind = "records", []
        if table != "ledger_records":
            source, kind = "inputs", [INPUT_TABLES[table][0]]
        clauses = []
        for page in self.pages:
            where = PLACEMENT_ROWS + (" AND kind = ?" if kind else "")
            params = [self.placement_id, page.first_commit, page.last_commit, *kind]
            if page.first_index is not None:
                where += " AND chain_index >= ?"
                params.append(page.first_index)
            if page.end_index is not None:
                where += " AND chain_index < ?"
                params.append(page.end_index)
            if self.records is not None:
                where += " AND chain_index < ?"
                params.append(self.records)
            if self.since is not None:
                where += " AND chain_index >= ?"
                params.append(self.since)
            clauses.append((f"FROM {source} WHERE {where} {order}", params))
        return clauses


@dataclass(frozen=True, slots=True)
class _Page:
    """Chain indexes ``first_index``..``end_index`` (excluded; None: no bound) of one
    placement, whose rows in ``records`` and ``inputs`` were all written by the batches
    ``first_commit``..``last_commit``."""

    first_index: int | None
    end_index: int | None
    first_commit: int
    last_commit: int


def _pages(
    con: duckdb.DuckDBPyConnection, placement_id: str, commits: tuple[int, int], records: int
) -> tuple[_Page, ...]:
    """The pages ``_copy_rows`` reads a placement of ``records`` records through, written
    by the batches ``commits``: EXPORT_PAGE_RECORDS chain indexes a page, each with the
    commit range that holds its rows (one query: the placement's indexes and commit
    numbers, grouped), so each page reads its own batches' row groups and DuckDB sorts at
    most a page at a time, never the whole placement. Read one after the other, the pages
    give the rows in chain order, whatever order the batches wrote them in."""
    if records <= EXPORT_PAGE_RECORDS:
        return (_Page(None, None, *commits),)
    params = [placement_id, *commits]
    found = con.execute(
        "SELECT chain_index // ? AS page, min(commit_no), max(commit_no) FROM ("
        f"SELECT chain_index, commit_no FROM record_rows WHERE {PLACEMENT_ROWS} UNION ALL "
        f"SELECT chain_index, commit_no FROM input_rows WHERE {PLACEMENT_ROWS}"
        ") GROUP BY page ORDER BY page",
        [EXPORT_PAGE_RECORDS, *params, *params],
    ).fetchall()
    pages = []
    for i, (page, first, last) in enumerate(found):
        start = int(page) * EXPORT_PAGE_RECORDS
        pages.append(
            _Page(
                None if i == 0 else start,
                None if i == len(found) - 1 else start + EXPORT_PAGE_RECORDS,
                int(first),
                int(last),
            )
        )
    return tuple(pages) or (_Page(None, None, *commits),)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """The prepared INSERTs of a writer's own DuckDB (``export_all``, rows staged by
    ``_stage``): it attaches every export file under the same ``alias``, so each INSERT
    is parsed and planned once per writer and only rebound for each file and each chunk
    staged (DuckDB rebinds a prepared statement whose tables changed). Measured per
    INSERT of a staged placement: 0.37 ms against 0.43-0.59 parsed each time."""

    alias: str
    names: set[str]

    def statement(self, con: duckdb.DuckDBPyConnection, name: str, sql: str, *args: str) -> str:
        """``EXECUTE`` of the statement ``sql`` (parameters $1 ..), prepared as ``name``
        on ``con`` the first time, with ``args`` as SQL string literals (DuckDB takes no
        ``?`` parameters in an ``EXECUTE``)."""
        if name not in self.names:
            con.execute(f"PREPARE {name} AS {sql}")
            self.names.add(name)
        literals = ", ".join("'" + arg.replace("'", "''") + "'" for arg in args)
        return f"EXECUTE {name}({literals})"


def _copy_rows(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    source: _Rows,
    meta: dict[str, str],
    kinds: Collection[str] | None,
    template: _Template | None,
    compact: bool = False,
    prepared: _Prepared | None = None,
) -> dict[str, int]:
    """Write the export file ``path`` of placement ``source.placement_id`` from the rows
    ``source`` names.

    The file is ATTACHed to ``con`` and filled by INSERT .. SELECT in one transaction;
    COMMIT (``_WRITER_CONFIG``) or DETACH checkpoints it into one self-contained file.
    ``source``: the store itself (``_Rows`` with a commit range) or a chunk staged by
    ``_stage``. ``template``: an empty export file to start from (else the schema is
    created here). ``kinds``: the input kinds the chain holds (None: every kind).
    ``prepared``: the prepared INSERTs of ``con`` (a writer's own DuckDB, rows staged).
    """
    alias = f"gridledger_export_{next(_ALIASES)}" if prepared is None else prepared.alias
    # Rows read straight from the store (``source.pages``) are written in row groups of
    # EXPORT_ROW_GROUP_ROWS: the transaction buffers a few row groups at a time in the
    # store's buffer pool, however large the placement (bench/export_rss.py).
    options = [f"ROW_GROUP_SIZE {EXPORT_ROW_GROUP_ROWS}"] if source.pages else []
    if template is not None:
        # Made in the storage format and block size wanted (_make_template); the file
        # header carries both.
        template.write(path)
    else:
        # Written in the storage format of DuckDB 1.0 (EXPORT.md "Readers"), so every
        # DuckDB 1.x and later opens it, whatever version writes it.
        options.insert(0, _attach_options(compact))
    attach = f" ({', '.join(options)})" if options else ""
    con.execute(f"ATTACH '{_sql_string(path)}' AS {alias}{attach}")
    try:
        con.execute("BEGIN")
        try:
            if template is None:
                con.execute(_schema(f"{alias}."))
            counts = {"meta": len(meta) + 1}
            for table, columns in _COLUMNS.items():
                kind = INPUT_TABLES[table][0] if table in INPUT_TABLES else None
                if kind is not None and kinds is not None and kind not in kinds:
                    counts[table] = 0
                    continue
                if prepared is not None:
                    insert = prepared.statement(
                        con,
                        f"insert_{table}",
                        f"INSERT INTO {alias}.{table} SELECT {columns} "
                        f"FROM {_STAGE_PREFIX}{table} WHERE placement_id = $1",
                        source.placement_id,
                    )
                    counts[table] = _count(con, insert, [])
                    continue
                # One INSERT per page (``_pages``): each appends its rows in their order.
                counts[table] = sum(
                    _count(con, f"INSERT INTO {alias}.{table} SELECT {columns} {clause}", params)
                    for clause, params in source.of(table)
                )
            counts["held"] = 0
            pairs = _meta_pairs(source.placement_id, meta, counts["ledger_records"])
            values = [value for pair in pairs for value in pair]
            if prepared is not None:
                numbered = (f"(${2 * i + 1}, ${2 * i + 2})" for i in range(len(pairs)))
                sql = f"INSERT INTO {alias}.meta VALUES " + ", ".join(numbered)
                con.execute(prepared.statement(con, "insert_meta", sql, *values))
            else:
                con.execute(
                    f"INSERT INTO {alias}.meta VALUES " + ", ".join(["(?, ?)"] * len(pairs)),
                    values,
                )
            if "since_size" in meta:
                _write_consistency(con, alias, meta)
            counts["meta"] = len(pairs)
            _commit_closed(con, alias)
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.execute(f"DETACH {alias}")
    return counts


# The meta rows of an export since a checkpoint (EXPORT.md "Since a checkpoint"), and
# what ``_write_consistency`` reads (not a meta row).
_SINCE_META: Final = ("since_size", "since_root")


def _meta_pairs(placement_id: str, meta: dict[str, str], records: int) -> list[tuple[str, str]]:
    """The rows of an export's ``meta`` table (EXPORT.md), in order."""
    return [
        ("format", EXPORT_FORMAT),
        ("format_version", EXPORT_FORMAT_VERSION),
        ("placement_id", placement_id),
        ("ledger_key", meta["ledger_key"]),
        ("records", str(records)),
        ("dropped_duplicates", meta["dropped_duplicates"]),
        ("arrival", meta.get("arrival", "log")),
        *((key, meta[key]) for key in _SINCE_META if key in meta),
    ]


def _write_consistency(con: duckdb.DuckDBPyConnection, alias: str, meta: dict[str, str]) -> None:
    """The ``consistency`` table of an export since a checkpoint: its one row."""
    con.execute(
        f"CREATE TABLE {alias}.consistency (first_size BIGINT NOT NULL, size BIGINT NOT NULL, "
        "proof VARCHAR NOT NULL)"
    )
    con.execute(
        f"INSERT INTO {alias}.consistency VALUES (?, ?, ?)",
        [int(meta["since_size"]), int(meta["proof_size"]), meta["proof"]],
    )


def _write_export(
    con: duckdb.DuckDBPyConnection,
    source: _Rows,
    out: Path,
    meta: dict[str, str],
    *,
    kinds: Collection[str] | None = None,
    template: _Template | None = None,
    sync_dir: bool = True,
    compact: bool = False,
) -> dict[str, int]:
    """The export file of placement ``source.placement_id`` at ``out``, via a temporary
    file and a rename."""
    tmp, counts = _write_tmp(con, source, out, meta, kinds, template, compact)
    _finish(tmp, out, sync_dir=sync_dir)
    return counts


def _write_tmp(
    con: duckdb.DuckDBPyConnection,
    source: _Rows,
    out: Path,
    meta: dict[str, str],
    kinds: Collection[str] | None,
    template: _Template | None,
    compact: bool,
    prepared: _Prepared | None = None,
) -> tuple[Path, dict[str, int]]:
    """The export file of ``out`` written whole under its temporary name (``_tmp_path``,
    removed again if anything fails), and its row counts; ``_finish`` renames it."""
    tmp = _tmp_path(out)
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        counts = _copy_rows(con, tmp, source, meta, kinds, template, compact, prepared)
        _close_side_files(tmp)
    except BaseException:
        _discard(tmp)
        raise
    return tmp, counts


def _commit_closed(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """COMMIT the export's one transaction and checkpoint the file: a closed file
    (EXPORT.md), everything in the database file itself and no WAL for a reader to
    replay (``_close_side_files`` checks that none is left)."""
    con.execute("COMMIT")
    con.execute(f"CHECKPOINT {alias}")


# DuckDB's side files of a database file (as ``verifier/source.py`` lists them, EXPORT.md
# "A closed file"): none is left beside an export.
_SIDE_FILE_SUFFIXES: Final = (".wal", ".wal.checkpoint", ".wal.recovery", ".tmp")


def _close_side_files(path: Path) -> None:
    """After the checkpoint: an empty WAL is removed; a WAL still holding anything means
    the file alone is not the export (a reader would replay it), so nothing is renamed."""
    wal = Path(f"{path}.wal")
    with contextlib.suppress(FileNotFoundError):
        if wal.stat().st_size > 0:
            raise RuntimeError(f"{wal}: the export was not checkpointed into one closed file")
        wal.unlink()


def _clear_side_files(out: Path) -> None:
    """Remove any side file of ``out`` left by an earlier file of that name: DuckDB would
    replay a stale WAL onto the new export."""
    for suffix in _SIDE_FILE_SUFFIXES:
        side = Path(f"{out}{suffix}")
        if side.is_dir() and not side.is_symlink():
            shutil.rmtree(side, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                side.unlink()


def _finish(tmp: Path, out: Path, *, sync_dir: bool = True) -> None:
    """Sync the whole temporary export file ``tmp`` and rename it to ``out`` (only a
    synced, whole file ever gets an export's name: kill -9 anywhere leaves a dot file),
    with no side file of ``out`` beside it."""
    try:
        _fsync_file(tmp)
        _clear_side_files(out)
        os.replace(tmp, out)
        if sync_dir:
            fsync_dir(out.parent)
    finally:
        _discard(tmp)


def _discard(tmp: Path) -> None:
    """Remove the temporary export file ``tmp`` and its WAL, if they are there."""
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    with contextlib.suppress(FileNotFoundError):
        Path(str(tmp) + ".wal").unlink()


def export_placement(
    store_or_path: Store | Path,
    placement_id: str,
    out: Path,
    *,
    key: SigningKey,
    parquet_dir: Path | None = None,
    compact: bool = False,
    issue: bool = True,
    since: str | None = None,
) -> dict[str, int]:
    """Write the export of ``placement_id`` to ``out`` (and ``parquet_dir``); row counts.

    ``store_or_path`` is the running ledger's Store, or the path of a ledger DB no
    process is writing (it is opened, used and closed here). ``key`` is the ledger key:
    it signs the statement and checkpoint issued for the head if none exists yet.
    Raises UnknownPlacement when the store has no chain for the placement. ``compact``:
    the compact storage (EXPORT.md "Readers": DuckDB 1.2 and later read it). ``issue``
    False: a read (the HTTP API, SPEC §8.4), which signs nothing: the export runs through
    the latest stored statement and its checkpoint, and raises NotAttested when there is
    none yet. ``since``: the text of a checkpoint note this ledger issued for the
    placement: only what came after it, with a consistency proof to it (SPEC §8.5);
    raises SinceRefused for a note that is not one.
    """
    if isinstance(store_or_path, Store):
        return _export(store_or_path, placement_id, out, key, parquet_dir, compact, issue, since)
    with Store(store_or_path, ledger_public_key=key.public_key) as store:
        return _export(store, placement_id, out, key, parquet_dir, compact, issue, since)


class SinceRefused(ValueError):
    """``export --since NOTE`` with a note that is not this ledger's checkpoint of the
    placement (SPEC §8.5); the message names what is wrong."""


def _since_meta(
    store: Store, placement_id: str, note_text: str, key: SigningKey, records: int
) -> dict[str, str]:
    """The meta rows (and the proof) of an export since the checkpoint ``note_text``."""
    try:
        note = parse_note(note_text)
        checkpoint = parse_checkpoint_body(note.body)
    except ProtoError as exc:
        raise SinceRefused(f"--since: not a checkpoint note: {exc}") from exc
    if checkpoint.origin != checkpoint_origin(placement_id):
        raise SinceRefused(f"--since: a checkpoint of {checkpoint.origin!r}, not of {placement_id}")
    if not note.signed_by(LEDGER_NOTE_NAME, key.public_key):
        raise SinceRefused("--since: the note is not signed by this ledger's key")
    size = checkpoint.size
    if not 0 < size <= records or store.checkpoint(placement_id, size) is None:
        raise SinceRefused(f"--since: this ledger issued no checkpoint of size {size}")
    # The frontier at the note's size and the records after it: what the export holds,
    # not the log (``issuer.frontier_at`` keeps the frontiers of the last checkpoints).
    frontier = frontier_at(store, placement_id, size)
    if frontier.root() != checkpoint.root:
        raise SinceRefused(f"--since: the root of size {size} is not this ledger's")
    leaves = [merkle.leaf_hash(p) for p in payloads_between(store, placement_id, size, records)]
    proof = frontier.consistency_proof(leaves)
    return {
        "since_size": str(size),
        "since_root": b64(checkpoint.root),
        "proof_size": str(records),
        "proof": "\n".join(b64(h) for h in proof),
    }


def _export(
    store: Store,
    placement_id: str,
    out: Path,
    key: SigningKey,
    parquet_dir: Path | None,
    compact: bool = False,
    issue: bool = True,
    since: str | None = None,
) -> dict[str, int]:
    if store.head(placement_id) is None:
        raise UnknownPlacement(f"no records for placement {placement_id!r}")
    attested: int | None = None  # issue False: the records the latest pair covers
    if issue:
        issue_statement(store, key, placement_id)
        issue_checkpoint(store, key, placement_id)
    else:
        attested = _attested(store, placement_id)
    commits = store.commit_range(placement_id)
    if commits is None:  # a chain has a commit range (written in the same transaction)
        raise UnknownPlacement(f"no records for placement {placement_id!r}")
    meta = {
        "ledger_key": b64(key.public_key),
        "dropped_duplicates": str(store.dropped_count(placement_id)),
        "arrival": store.arrival(),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out.parent, only=out.name)
    con = store.cursor()
    try:
        head = store.head(placement_id)
        records = 0 if head is None else head.chain_index + 1
        if attested is not None:
            records = min(records, attested)
        first = None
        pages = _pages(con, placement_id, commits, records)
        if since is not None:  # the pages wholly before the checkpoint hold nothing to copy
            meta.update(_since_meta(store, placement_id, since, key, records))
            first = int(meta["since_size"])
            pages = tuple(p for p in pages if p.end_index is None or p.end_index > first)
        source = _Rows(placement_id, pages, attested, first)
        counts = _write_export(con, source, out, meta, compact=compact)
    finally:
        con.close()
    if parquet_dir is not None:
        write_parquet(out, Path(parquet_dir))
    return counts


class NotAttested(LookupError):
    """A read-only export found no stored statement with its checkpoint."""


def _attested(store: Store, placement_id: str) -> int:
    """The records a read-only export holds: through the latest stored statement that a
    stored checkpoint of exactly its size covers (``issue_statement`` stores both)."""
    sizes = {n for n, _ in store.checkpoints(placement_id)}
    rows = store.query(
        "SELECT through_index FROM statements WHERE placement_id = ? ORDER BY through_index DESC",
        [placement_id],
    )
    for (through,) in rows:
        if int(through) + 1 in sizes:
            return int(through) + 1
    raise NotAttested(
        f"placement {placement_id!r}: no statement with its checkpoint issued yet; the ledger "
        "issues them on its period, or when a party asks (POST /placements/<id>/checkpoint)"
    )


@dataclass(frozen=True, slots=True)
class ExportedAll:
    """What ``export_all`` wrote (placement -> row counts) and what it could not export."""

    written: dict[str, dict[str, int]]
    skipped: dict[str, str]  # placement -> why, as export_placement would refuse it


def export_all(
    store_or_path: Store | Path,
    directory: Path,
    *,
    key: SigningKey,
    placement_ids: Sequence[str] | None = None,
    threads: int = EXPORT_THREADS,
    compact: bool = False,
    compact_max_records: int | None = None,
) -> ExportedAll:
    """Export every placement (or ``placement_ids``) to ``directory/<placement>.duckdb``.

    The same files as ``export_placement`` for each, in one pass: see the module
    docstring. A placement without accepted terms is skipped and named (no statement
    can be issued for it). Raises UnknownPlacement (before writing anything) when one of
    ``placement_ids`` has no chain. ``compact``: as for ``export_placement``.
    ``compact_max_records`` (instead of ``compact``): the placements of at most that many
    records are written compact, the others portable, in the same pass (their sizes are
    what the attestation read anyway).
    """
    if compact and compact_max_records is not None:
        raise ValueError("compact and compact_max_records are exclusive")
    # The largest chain written compact (-1: none).
    limit = -1 if compact_max_records is None else compact_max_records
    if compact:
        limit = _ALL_COMPACT
    if isinstance(store_or_path, Store):
        return _export_all(store_or_path, Path(directory), key, placement_ids, threads, limit)
    with Store(store_or_path, ledger_public_key=key.public_key) as store:
        return _export_all(store, Path(directory), key, placement_ids, threads, limit)


# ``_export_all``'s ``compact_max_records`` when every placement is written compact.
_ALL_COMPACT: Final = 2**63


def _export_all(
    store: Store,
    directory: Path,
    key: SigningKey,
    placement_ids: Sequence[str] | None,
    threads: int,
    compact_max_records: int,
) -> ExportedAll:
    ids = store.placements() if placement_ids is None else list(placement_ids)
    # Raises UnknownPlacement here, before anything is issued or written.
    attesting = attest_chunks(store, key, ids)
    first = next(attesting, None)
    ranges = store.commit_ranges()
    dropped = store.dropped_counts()
    ledger_key = b64(key.public_key)
    arrival = store.arrival()
    directory.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(directory)
    facts: dict[str, ChainFacts] = {}
    skipped: dict[str, str] = {}

    writers: dict[int, tuple[duckdb.DuckDBPyConnection, _Prepared]] = {}
    config = _writer_config()

    def writer() -> tuple[duckdb.DuckDBPyConnection, _Prepared]:
        """This thread's writer: a DuckDB of its own (one thread, not the store's), and
        its prepared INSERTs. A new one each call: writers kept from call to call made
        the replay's exports ~5 % slower (in-process A/B, 3.2M-event store)."""
        thread = threading.get_ident()
        if thread not in writers:
            con = duckdb.connect(":memory:", config=config)
            _keep_optimizers(con, _WRITER_OPTIMIZERS)
            writers[thread] = (con, _Prepared(f"gridledger_export_{next(_ALIASES)}", set()))
        return writers[thread]

    def work(chunk: list[str]) -> list[tuple[str, dict[str, int], Future[None]]]:
        done: list[tuple[str, dict[str, int], Future[None]]] = []
        con = store.cursor()
        try:
            staged = len(chunk) > 1
            if staged:
                low = min(ranges[p][0] for p in chunk)
                high = max(ranges[p][1] for p in chunk)
                _stage(con, writer()[0], chunk, low, high, directory)
            for pid in chunk:
                meta = {
                    "ledger_key": ledger_key,
                    "dropped_duplicates": str(dropped.get(pid, 0)),
                    "arrival": arrival,
                }
                out = directory / f"{pid}.duckdb"
                # The file's format (EXPORT.md "Readers") by its chain's size.
                compact = facts[pid].records <= compact_max_records
                template = _template(directory, compact)
                if staged:
                    own, prepared = writer()
                    tmp, counts = _write_tmp(
                        own, _Rows(pid), out, meta, facts[pid].kinds, template, compact, prepared
                    )
                else:
                    pages = _pages(con, pid, ranges[pid], facts[pid].records)
                    tmp, counts = _write_tmp(
                        con, _Rows(pid, pages), out, meta, facts[pid].kinds, template, compact
                    )
                # Synced and renamed by a syncer thread while this one writes on.
                done.append((pid, counts, syncer.submit(_finish, tmp, out, sync_dir=False)))
        finally:
            con.close()
        return done

    try:
        results: dict[str, dict[str, int]] = {}
        with (
            ThreadPoolExecutor(EXPORT_SYNC_THREADS, thread_name_prefix="export-sync") as syncer,
            ThreadPoolExecutor(max(1, threads), thread_name_prefix="ledger-export") as pool,
        ):
            # Each chunk of placements is written as soon as attested, while the next
            # chunk is attested (this thread): attestation was a pass of its own
            # before the writers started.
            pending: list[Future[list[tuple[str, dict[str, int], Future[None]]]]] = []
            part = first
            while part is not None:
                facts.update(part.chains)
                skipped.update(part.skipped)
                ordered = list(part.chains)  # in commit order (attest_chunks)
                for chunk in _chunks(ordered, {p: facts[p].records for p in ordered}, threads):
                    pending.append(pool.submit(work, chunk))
                part = next(attesting, None)
            for future in pending:
                for pid, counts, synced in future.result():
                    synced.result()
                    results[pid] = counts
        fsync_dir(directory)
    finally:
        for con, _ in writers.values():
            con.close()
    return ExportedAll(results, skipped)


def _chunks(ordered: Sequence[str], records: dict[str, int], threads: int) -> list[list[str]]:
    """``ordered`` (in commit order) cut into runs ``_stage`` reads at once: at most
    EXPORT_STAGE_PLACEMENTS placements and EXPORT_STAGE_RECORDS records a run (a larger
    placement alone), and at least ``threads`` runs when there are as many placements."""
    size = max(1, min(EXPORT_STAGE_PLACEMENTS, -(-len(ordered) // max(1, threads))))
    chunks: list[list[str]] = []
    chunk: list[str] = []
    held = 0
    for pid in ordered:
        n = records[pid]
        if chunk and (len(chunk) >= size or held + n > EXPORT_STAGE_RECORDS):
            chunks.append(chunk)
            chunk, held = [], 0
        chunk.append(pid)
        held += n
    if chunk:
        chunks.append(chunk)
    return chunks


# ``_stage`` fills, in a writer's DuckDB, one table per export table: this prefix and
# the export table's name.
_STAGE_PREFIX: Final = "stage_"
# A writer's DuckDB (``export_all``): one thread (its work is one small file at a time),
# its memory bounded beside the store's, insertion order preserved (a staged table is
# written in its export's order and read in it), and columns stored uncompressed: DuckDB
# then skips trying every compression method on every column at each file's checkpoint
# (measured: 3-8 of ~25 ms CPU a small placement's file), while the files hold the same
# rows and keep their size within 1 % (most of an export is envelopes, which no method
# compresses much, and a small table fills a block of its own either way).
# A checkpoint threshold of 0: each file's COMMIT checkpoints at once (the file is a
# temporary one until it is synced and renamed; DETACH then has nothing left to write);
# and a WAL-skip threshold of 0, so the rows are not first copied into the file's WAL
# (strace: ~6 KB written there per small file, then removed; now its 68-byte header).
# No fsync by DuckDB (``fsync_mode`` NONE): a writer's DuckDB only ever writes temporary
# export files, which ``_write_export`` syncs itself (one fsync of the whole file) before
# renaming them to their final name; DuckDB's own four syncs per file (its checkpoint's
# blocks and headers) waited on the disk for nothing a crash could keep.
_WRITER_CONFIG: Final[dict[str, str | bool | int | float | list[str]]] = {
    "threads": 1,
    "memory_limit": EXPORT_WRITER_MEMORY_LIMIT,
    "preserve_insertion_order": True,
    "force_compression": "uncompressed",
    "checkpoint_threshold": "0b",
    "auto_checkpoint_skip_wal_threshold": 0,
    "fsync_mode": "NONE",
}
# Settings of _WRITER_CONFIG that only save work: a DuckDB without them (before 2.0;
# pyproject allows 1.1) writes the same files, with its own syncs and a WAL copy.
_WRITER_OPTIONAL: Final = frozenset({"auto_checkpoint_skip_wal_threshold", "fsync_mode"})


@functools.cache
def _writer_config() -> dict[str, str | bool | int | float | list[str]]:
    """_WRITER_CONFIG without the optional settings this DuckDB does not know (asked once
    per process: a DuckDB of its own, ~40 ms of each ``export_all`` call before; callers
    must not change the dict)."""
    with duckdb.connect(":memory:") as con:
        rows = con.execute("SELECT name FROM duckdb_settings()").fetchall()
    names = {str(row[0]) for row in rows}
    return {k: v for k, v in _WRITER_CONFIG.items() if k not in _WRITER_OPTIONAL or k in names}


# The only optimizer passes a writer's DuckDB runs (``_keep_optimizers``). Its statements
# copy one placement's rows, already in their order, from a staged chunk into an empty
# file (INSERT .. SELECT .. WHERE placement_id = ?) or stage a chunk: the filter pushed
# into the scan is all that pays. Measured per INSERT, interleaved: with a
# staged table of 640 rows 0.57 ms with these two, 0.78 with all ~45 passes; of 20,000
# rows 0.83 and 0.98 (with none at all 0.57 and 1.93: the scan reads every row).
_WRITER_OPTIMIZERS: Final = ("expression_rewriter", "filter_pushdown")


def _keep_optimizers(con: duckdb.DuckDBPyConnection, keep: Collection[str]) -> None:
    """Disable every optimizer pass of ``con``'s DuckDB but ``keep`` (passes only
    rewrite a plan into an equivalent one: the same rows in the same order)."""
    names = [str(row[0]) for row in con.execute("SELECT name FROM duckdb_optimizers()").fetchall()]
    disabled = ",".join(name for name in names if name not in keep)
    con.execute(f"SET disabled_optimizers = '{disabled}'")


def _stage(
    con: duckdb.DuckDBPyConnection,
    writer: duckdb.DuckDBPyConnection,
    chunk: list[str],
    low: int,
    high: int,
    directory: Path,
) -> None:
    """Read the rows of every placement of ``chunk`` from the store (``con``) once, one
    query per store table over the chunk's commit range ``low``..``high`` (which holds
    each placement's own range), into ``writer``'s tables ``stage_<export table>``,
    sorted by placement and each table's order; ``_Rows(pid)`` then reads one
    placement's rows there instead of in the store's large tables. The rows pass from
    one DuckDB to the other as an Arrow stream (``_arrow_handoff``: no file, no
    encoding), else through a Parquet file in ``directory`` (removed at once); DuckDB's
    types survive either way."""
    for source in ("records", "inputs", "statements", "checkpoints"):
        if source in ("records", "inputs"):
            select = (
                f"SELECT * EXCLUDE (payload, commit_no) FROM {source} "
                "WHERE placement_id IN (SELECT unnest(?)) AND commit_no BETWEEN ? AND ?"
            )
            params: list[Any] = [chunk, low, high]
        else:
            select = f"SELECT * FROM {source} WHERE placement_id IN (SELECT unnest(?))"
            params = [chunk]
        with _handed_over(con, writer, select, params, directory, source) as rows:
            if source == "inputs":
                writer.execute(f"CREATE OR REPLACE TEMPORARY TABLE staged_inputs AS FROM {rows}")
                for table, (kind, _) in INPUT_TABLES.items():
                    writer.execute(
                        f"CREATE OR REPLACE TABLE {_STAGE_PREFIX}{table} AS FROM staged_inputs "
                        "WHERE kind = ? ORDER BY placement_id, chain_index",
                        [kind],
                    )
                writer.execute("DROP TABLE staged_inputs")
            else:
                table = "ledger_records" if source == "records" else source
                writer.execute(
                    f"CREATE OR REPLACE TABLE {_STAGE_PREFIX}{table} AS FROM {rows} "
                    f"ORDER BY placement_id, {_ORDER[table]}"
                )


@contextlib.contextmanager
def _handed_over(
    con: duckdb.DuckDBPyConnection,
    writer: duckdb.DuckDBPyConnection,
    select: str,
    params: list[Any],
    directory: Path,
    source: str,
) -> Iterator[str]:
    """The rows of ``select`` (run on ``con``) as a relation ``writer`` reads once: the
    name of an Arrow stream registered there (``_arrow_handoff``), else a Parquet file
    written by ``con`` in ``directory`` (removed afterwards)."""
    if _arrow_handoff():
        name = f"{_STAGE_PREFIX}arrow_{source}"
        writer.register(name, con.sql(select, params=params).__arrow_c_stream__())
        try:
            yield name
        finally:
            writer.unregister(name)
        return
    path = directory / f".stage-{os.getpid()}-{next(_ALIASES)}-{source}.parquet"
    try:
        con.execute(
            f"COPY ({select}) TO '{_sql_string(path)}' (FORMAT parquet, COMPRESSION uncompressed)",
            params,
        )
        yield f"read_parquet('{_sql_string(path)}')"
    finally:
        path.unlink(missing_ok=True)


@functools.cache
def _arrow_handoff() -> bool:
    """Whether this DuckDB hands a query's rows to another DuckDB as an Arrow C stream
    (a relation's ``__arrow_c_stream__``, scanned where registered; no pyarrow needed).
    Measured (640 small placements in chunks of 64, 3 rounds interleaved):
    0.73-0.94 ms CPU and 0.8-1.3 ms wall a placement to stage, against 0.92-0.98 and
    1.1-1.5 through Parquet. DuckDB 2.0 does; 1.0 falls back to Parquet."""
    try:
        with duckdb.connect(":memory:") as a, duckdb.connect(":memory:") as b:
            rel = a.sql("SELECT ?::BIGINT AS i, 'x'::BLOB AS b", params=[7])
            b.register("probe", rel.__arrow_c_stream__())
            return b.execute("SELECT i, b FROM probe").fetchall() == [(7, b"x")]
    except (AttributeError, TypeError, duckdb.Error):
        return False


def _make_template(path: Path, compact: bool = False) -> None:
    """An empty export file with the schema (checkpointed: no WAL beside it)."""
    path.unlink(missing_ok=True)
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH '{_sql_string(path)}' AS template ({_attach_options(compact)})")
        con.execute("USE template")
        con.execute(SCHEMA)
        con.execute("CHECKPOINT template")
        con.execute("USE memory")
        con.execute("DETACH template")
    finally:
        con.close()
    Path(str(path) + ".wal").unlink(missing_ok=True)


# The empty export file of each storage format (``compact``), made once per process by
# ``_template`` (``_make_template`` cost ~120 ms wall and ~50 ms CPU of every
# ``export_all`` call, and the replay's ledger process calls it after every step).
_TEMPLATES: dict[bool, _Template] = {}
_TEMPLATES_LOCK: Final = threading.Lock()


def _template(directory: Path, compact: bool) -> _Template:
    """The empty export file (``_make_template``) in memory, made the first time in
    ``directory`` (as ``.template-<pid>.duckdb``, removed at once: ``_remove_leftovers``
    removes it after a kill -9), then kept for this process: every export file starts
    from the same bytes, whichever call of ``export_all`` writes it."""
    with _TEMPLATES_LOCK:
        if compact not in _TEMPLATES:
            path = directory / f".template-{os.getpid()}.duckdb"
            try:
                _make_template(path, compact)
                _TEMPLATES[compact] = _Template.load(path)
            finally:
                path.unlink(missing_ok=True)
        return _TEMPLATES[compact]


# The granularity at which ``_Template`` drops the zero bytes of an empty export file.
_TEMPLATE_PAGE: Final = 4096


@dataclass(frozen=True, slots=True)
class _Template:
    """An empty export file (``_make_template``) held in memory: its size and its runs of
    pages that are not all zero bytes. ``write`` makes a new file with the same bytes by
    writing those runs (one ``pwrite`` each) and extending the file to its size: the
    zero pages stay a hole, which reads as zero bytes. About half of the template is
    zeros (the unused part of a metadata block), and copying the file (``sendfile``)
    cost ~9 % of ``export_all``'s CPU on small placements."""

    size: int
    runs: tuple[tuple[int, bytes], ...]

    @classmethod
    def load(cls, path: Path) -> _Template:
        data = path.read_bytes()
        runs: list[tuple[int, bytes]] = []
        start: int | None = None
        for offset in range(0, len(data) + _TEMPLATE_PAGE, _TEMPLATE_PAGE):
            page = data[offset : offset + _TEMPLATE_PAGE]
            if page.strip(b"\0"):
                if start is None:
                    start = offset
            elif start is not None:
                runs.append((start, data[start:offset]))
                start = None
        return cls(len(data), tuple(runs))

    def write(self, path: Path) -> None:
        """Create ``path`` (it must not exist) with the template's bytes."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for offset, data in self.runs:
                os.pwrite(fd, data, offset)
            os.ftruncate(fd, self.size)
        finally:
            os.close(fd)


def write_parquet(db: Path, directory: Path) -> None:
    """Write every table of the export file ``db`` to ``directory/<table>/<placement>.parquet``.

    One directory per table, one file per placement: exports of many placements into one
    directory sit side by side, and an analyst reads a table across all of them with one
    glob (``read_parquet('DIR/ledger_records/*.parquet')``; ``ledger_records`` carries
    ``placement_id``, and ``filename = true`` names the placement of any other table).
    Each file is written as ``.<placement>.parquet.tmp-<pid>`` and renamed; the temporary
    files a killed writer left in a table's directory are removed first (``export_all``'s
    rule: only those of a process that is gone), so a rerun leaves only finished files.
    """
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'placement_id'").fetchone()
        if row is None:
            raise ValueError(f"{db} has no meta.placement_id: not an export")
        placement_id = str(row[0])
        for table in TABLES:
            table_dir = directory / table
            table_dir.mkdir(parents=True, exist_ok=True)
            _remove_leftovers(table_dir)
            final = table_dir / f"{placement_id}.parquet"
            tmp = table_dir / f".{placement_id}.parquet.tmp-{os.getpid()}"
            con.execute(f"COPY {table} TO '{_sql_string(tmp)}' (FORMAT parquet)")
            _fsync_file(tmp)
            os.replace(tmp, final)
            fsync_dir(table_dir)
    finally:
        con.close()


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")
