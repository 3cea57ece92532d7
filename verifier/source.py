"""Reading an export (proto/EXPORT.md): open, check the schema, stream rows by chain index.

The export is attached READ_ONLY to a scratch DuckDB (in a temporary directory, removed
on close) that holds the verifier's own work tables, so verification never writes to the
file it checks; a small export (``SMALL_EXPORT_BYTES``) to the process's warm database
instead, with its work tables in a database of their own, both detached on close
(``verifier/small_export_db.py``). Every big table is
read by chain-index range (``CHAIN_BATCH_INDICES`` at a time): memory stays bounded
whatever the export's size, and the reader never trusts the export's row order. The
export is read-only: what is read whole (row counts, small tables) is read once.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

import duckdb

from verifier import limits, small_export_db
from verifier.capacity_export import COLUMNS as CAPACITY_COLUMNS
from verifier.capacity_export import TABLE as CAPACITY_TABLE
from verifier.errors import UnusableInput

EXPORT_FORMAT: Final = "gridledger-export"
EXPORT_FORMAT_VERSION: Final = "2"
# Versions this verifier reads: 1 (ledger records signed), 2 (unsigned, SPEC §8).
EXPORT_FORMAT_VERSIONS: Final = ("1", "2")
ALIAS: Final = small_export_db.EXPORT_ALIAS

# DuckDB's side files of a database file ``F``: its write-ahead log, what a checkpoint or a
# recovery leaves beside it, its temporary directory. Every other DuckDB reader that opens
# ``F`` replays them, so an export is a closed file with none (EXPORT.md "A closed file"):
# one found beside it is refused, never read past.
SIDE_FILE_SUFFIXES: Final = (".wal", ".wal.checkpoint", ".wal.recovery", ".tmp")

# Meta rows holding integers (EXPORT.md): decimal ASCII digits, at most 2^53 - 1.
META_INTEGERS: Final = ("records", "dropped_duplicates")
_MAX_SAFE_INTEGER: Final = 2**53 - 1
_DECIMAL: Final = re.compile(r"^(0|[1-9][0-9]{0,15})$")

# Whether small exports use the process's warm database (tests switch it off to compare).
_share_warm = True

_COMMON: Final = (
    ("chain_index", "BIGINT"),
    ("position", "VARCHAR"),
    ("input_hash", "VARCHAR"),
    ("envelope", "BLOB"),
    ("status", "VARCHAR"),
    ("reason", "VARCHAR"),
)


@dataclass(frozen=True, slots=True)
class InputTable:
    """One input table of the export: its name, the kind it holds, its extra columns."""

    kind: str
    name: str
    extras: tuple[tuple[str, str], ...]

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        """Every column, common ones first."""
        return (*_COMMON, *self.extras)


INPUT_TABLES: Final = (
    InputTable("terms", "terms", ()),
    InputTable(
        "keybinding",
        "key_bindings",
        (("node_id", "VARCHAR"), ("valid_from_ms", "BIGINT"), ("valid_until_ms", "BIGINT")),
    ),
    InputTable(
        "usage",
        "usage_events",
        (("node_id", "VARCHAR"), ("seq", "BIGINT"), ("start_ms", "BIGINT"), ("end_ms", "BIGINT")),
    ),
    InputTable("reclaim", "reclaims", (("issued_at_ms", "BIGINT"), ("effective_at_ms", "BIGINT"))),
    InputTable("adjustment", "adjustments", (("direction", "VARCHAR"), ("amount_minor", "BIGINT"))),
    InputTable("closed", "closes", (("closed_at_ms", "BIGINT"),)),
    # SPEC §6.8, appended (EXPORT.md): exports written before it have no such table.
    InputTable("assignment", "assignments", ()),
    InputTable("release", "releases", (("issued_at_ms", "BIGINT"), ("effective_at_ms", "BIGINT"))),
    # SPEC §6.3 resume, appended (EXPORT.md).
    InputTable("resume", "resumes", (("node_id", "VARCHAR"),)),
)
TABLE_OF_KIND: Final = {t.kind: t for t in INPUT_TABLES}
# Input tables appended after format version 1 shipped (SPEC §6.7, §6.8): an export
# written before them has none, and reads as if the table were empty.
# ``capacity_records`` (SPEC §6.5): written by a ledger that decides terms through the
# capacity log; absent, nothing is checked against it.
OPTIONAL_TABLES: Final = frozenset({"assignments", "releases", "resumes", CAPACITY_TABLE})

RECORD_COLUMNS: Final = (
    ("chain_index", "BIGINT"),
    ("envelope", "BLOB"),
    ("record_hash", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("status", "VARCHAR"),
    ("reason", "VARCHAR"),
    ("delivered_mgms", "BIGINT"),
    ("gross_minor", "BIGINT"),
    ("buyer_owes_minor", "BIGINT"),
    ("operator_receives_minor", "BIGINT"),
    ("desk_receives_minor", "BIGINT"),
)
# Optional (EXPORT.md): checked against the record when the export has it.
RECORD_PLACEMENT_COLUMN: Final = "placement_id"
STATEMENT_COLUMNS: Final = (
    ("through_index", "BIGINT"),
    ("envelope", "BLOB"),
    ("final", "BOOLEAN"),
    ("buyer_owes_minor", "BIGINT"),
    ("operator_receives_minor", "BIGINT"),
    ("desk_receives_minor", "BIGINT"),
)
CHECKPOINT_COLUMNS: Final = (("size", "BIGINT"), ("note", "VARCHAR"))
HELD_COLUMNS: Final = (("position", "VARCHAR"), ("input_hash", "VARCHAR"), ("envelope", "BLOB"))
META_COLUMNS: Final = (("key", "VARCHAR"), ("value", "VARCHAR"))

SCHEMA: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "meta": META_COLUMNS,
    **{t.name: t.columns for t in INPUT_TABLES},
    "ledger_records": RECORD_COLUMNS,
    "statements": STATEMENT_COLUMNS,
    "checkpoints": CHECKPOINT_COLUMNS,
    "held": HELD_COLUMNS,
    CAPACITY_TABLE: CAPACITY_COLUMNS,
}


def side_files(path: Path) -> list[str]:
    """The DuckDB side files beside ``path`` (``SIDE_FILE_SUFFIXES``), by name."""
    return [path.name + s for s in SIDE_FILE_SUFFIXES if os.path.lexists(f"{path}{s}")]


def side_file_message(found: list[str]) -> str:
    """How a refusal for side files reads (one line)."""
    return (
        f"DuckDB side file beside the export: {', '.join(found)}; an export is a closed "
        "file, and every other DuckDB reader would replay what it holds (EXPORT.md)"
    )


def meta_int(text: str | None) -> int | None:
    """A meta row's integer, or None when it is not one: decimal ASCII digits without a
    leading zero, within 0..2^53 - 1, checked on the text before any conversion (a
    5,000-digit value is refused by its length, never handed to ``int``)."""
    if text is None or len(text) > 16 or not _DECIMAL.match(text):
        return None
    value = int(text)
    return value if value <= _MAX_SAFE_INTEGER else None


def blob(value: Any) -> bytes:
    """A BLOB cell as bytes; NULL (a hostile export may hold one) as b"", which fails to
    decode and so becomes a finding, never a crash."""
    if type(value) is bytes:  # what DuckDB hands back for a BLOB: no copy
        return value
    return b"" if value is None else bytes(value)


def first_per_index(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows (rowid, chain_index, ...) -> the first (lowest rowid) row of each chain index,
    in chain-index order. Nothing is assumed of the order DuckDB returned them in: rows
    already strictly increasing in chain_index (an honest export) are kept as they are,
    anything else is sorted and deduplicated here."""
    if all(a[1] < b[1] for a, b in pairwise(rows)):
        return rows
    rows = sorted(rows, key=lambda r: (r[1], r[0]))
    return [r for k, r in enumerate(rows) if k == 0 or rows[k - 1][1] != r[1]]


@dataclass(frozen=True, slots=True)
class InputRow:
    """One row of an input table, as stored (nothing in it is trusted yet)."""

    kind: str
    chain_index: int
    position: str | None
    input_hash: str | None
    envelope: bytes
    status: str | None
    reason: str | None
    extras: tuple[Any, ...]

    @property
    def table(self) -> str:
        """The table the row came from."""
        return TABLE_OF_KIND[self.kind].name

    @property
    def where(self) -> str:
        """How findings name the row."""
        return f"{self.table} chain_index {self.chain_index}"


@dataclass(frozen=True, slots=True)
class RecordRow:
    """One row of ``ledger_records``, as stored."""

    chain_index: int
    envelope: bytes
    # record_hash .. desk_receives_minor in RECORD_COLUMNS order, then placement_id when
    # the export has that column
    columns: tuple[Any, ...]

    @property
    def where(self) -> str:
        """How findings name the row."""
        return f"ledger_records[{self.chain_index}]"


def read_input_rows(con: Any, prefix: str, table: InputTable, lo: int, hi: int) -> list[InputRow]:
    """The first row (by storage order) of each chain index in [lo, hi) of an input table;
    ``prefix`` is how the export's tables are named on ``con`` (``x.`` when attached, ``''``
    on a connection to the export itself, as a worker process has: ``verifier/walk.py``)."""
    return [input_row(table, r) for r in raw_input_rows(con, prefix, table, lo, hi)]


def raw_input_rows(
    con: Any, prefix: str, table: InputTable, lo: int, hi: int
) -> list[tuple[Any, ...]]:
    """``read_input_rows`` as the tuples (rowid, chain_index, columns...) DuckDB returned."""
    names = ", ".join(c for c, _ in table.columns)
    # No window function or ORDER BY in SQL: sorting 2048 rows there costs more than
    # checking their order here (first_per_index).
    rows = con.execute(
        f"SELECT rowid, {names} FROM {prefix}{table.name} "
        "WHERE chain_index >= ? AND chain_index < ?",
        [lo, hi],
    ).fetchall()
    return first_per_index(rows)


def input_row(table: InputTable, r: tuple[Any, ...]) -> InputRow:
    """An ``InputRow`` of ``table`` from its tuple (rowid, chain_index, columns...)."""
    return InputRow(table.kind, r[1], r[2], r[3], blob(r[4]), r[5], r[6], r[7:])


def read_record_rows(
    con: Any, prefix: str, placement_column: bool, lo: int, hi: int
) -> list[RecordRow]:
    """The first ledger_records row of each chain index in [lo, hi) (``read_input_rows``)."""
    return [record_row(r) for r in raw_record_rows(con, prefix, placement_column, lo, hi)]


def raw_record_rows(
    con: Any, prefix: str, placement_column: bool, lo: int, hi: int
) -> list[tuple[Any, ...]]:
    """``read_record_rows`` as the tuples (rowid, chain_index, columns...) DuckDB returned."""
    names = ", ".join(c for c, _ in RECORD_COLUMNS)
    if placement_column:
        names += f", {RECORD_PLACEMENT_COLUMN}"
    rows = con.execute(
        f"SELECT rowid, {names} FROM {prefix}ledger_records "
        "WHERE chain_index >= ? AND chain_index < ?",
        [lo, hi],
    ).fetchall()
    return first_per_index(rows)


def record_row(r: tuple[Any, ...]) -> RecordRow:
    """A ``RecordRow`` from its tuple (rowid, chain_index, columns...)."""
    return RecordRow(r[1], blob(r[2]), r[3:])


@dataclass(frozen=True, slots=True)
class PlainShape:
    """What one statement says of a small export's chain (``ExportSource.plain_shape``)."""

    # ledger_records holds chain indices 0..n-1 (n > 0), each once, none NULL, and the
    # input tables together hold the same n indices, each once: the set checks of (6)
    # can find nothing.
    indices: bool
    # Every input envelope is distinct and none is NULL: no input repeats an earlier one.
    envelopes: bool
    # The rows of ledger_records (n).
    records: int = 0


_NOT_PLAIN: Final = PlainShape(indices=False, envelopes=False)
# The tags of the shape's rows (``ExportSource._shape_sql``, ``_count_with_shape``): no
# table is named so.
_SHAPE_TAGS: Final = ("#records", "#inputs")
# A small export's input envelope as ``_count_with_shape`` reads it: NULL stays NULL.
_ENVELOPE_HASH: Final = "CASE WHEN envelope IS NULL THEN NULL ELSE hash(envelope) END"


def _shape_of(by_tag: dict[str, tuple[Any, ...]]) -> PlainShape:
    """``plain_shape`` from ``_shape_sql``'s rows by tag."""
    records, inputs = (by_tag[tag] for tag in _SHAPE_TAGS)
    return _plain(records[:5], inputs[:5], inputs[5])


def _index_stats(indices: list[Any]) -> tuple[Any, ...]:
    """``_shape_sql``'s aggregates of chain indices, taken in Python: count(*),
    count(chain_index), count(DISTINCT chain_index), min and max (None: no index)."""
    present = [i for i in indices if i is not None]
    return (
        len(indices),
        len(present),
        len(set(present)),
        min(present, default=None),
        max(present, default=None),
    )


def _plain(records: tuple[Any, ...], inputs: tuple[Any, ...], distinct: int) -> PlainShape:
    """The shape from the aggregates of ledger_records' and the inputs' chain indices
    (``_index_stats``) and the inputs' count of distinct envelopes."""
    n = records[0]
    return PlainShape(
        indices=n > 0 and records == (n, n, n, 0, n - 1) and inputs == records,
        envelopes=distinct == inputs[0],
        records=int(n),
    )


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows of every chained table whose chain_index lies in [lo, hi)."""

    lo: int
    hi: int
    records: list[RecordRow]
    inputs: list[InputRow]


def count_sql(tables: Iterable[str]) -> str:
    """SQL: (table, its row count) for each export table named. A UNION ALL: one statement
    costs less than one per table, and scalar subqueries side by side would cost more than
    both (DuckDB plans them as a cross product and orders its joins)."""
    return " UNION ALL ".join(
        f"SELECT '{table}', count(*) FROM {ALIAS}.{table}" for table in sorted(tables)
    )


class ExportSource:
    """An export attached read-only, with the schema checked. Close it when done."""

    def __init__(self, path: Path, *, share: bool = True) -> None:
        """``share``: a small export may use the process's warm database."""
        self.path = path
        self.record_placement_id = False
        # The input tables this export has (OPTIONAL_TABLES may be absent).
        self.input_tables: tuple[InputTable, ...] = INPUT_TABLES
        if not path.is_file():
            raise UnusableInput(str(path), "no such file")
        found = side_files(path)
        if found:
            raise UnusableInput(str(path), side_file_message(found))
        with path.open("rb") as handle:
            head = handle.read(16)
        # A DuckDB file has the magic "DUCK" at byte 8; anything else is not an export.
        if len(head) < 12 or head[8:12] != b"DUCK":
            raise UnusableInput(str(path), "not a DuckDB file")
        # The work tables of a big export live in a scratch file, so DuckDB can page them
        # out under memory_limit: a million-event export costs bounded RAM. A small one's
        # fit in memory (an in-memory database spills to temp_directory past memory_limit
        # all the same); its scratch file cost more than its checklist: every CREATE and
        # COMMIT went through the file's write-ahead log, the close through a checkpoint.
        # Its SQL runs on one thread: on a few hundred rows DuckDB's task scheduling costs
        # more than a second thread gives; and on the process's warm database, locked as
        # this one (``verifier/small_export_db.py``), when free (bench/verify_small.py).
        self.small = path.stat().st_size <= limits.SMALL_EXPORT_BYTES
        self._counts: dict[str, int] = {}
        self._small: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        self._present: frozenset[str] = frozenset()
        self._plain: PlainShape | None = None
        self._warm: small_export_db.WarmDatabase | None = None
        self._link: Path | None = None
        self._scratch: Path | None = None
        if self.small and share and _share_warm:
            self._open_warm()
        if self._warm is None:
            self._open_own()
        try:
            self._check_schema()
            self.meta = self._read_meta()
        except BaseException:
            self.close()
            raise

    def _open_warm(self) -> None:
        """Attach to the process's warm database; on any failure leave it (``_open_own``
        then says what is wrong in its own words)."""
        shared = small_export_db.acquire()
        if shared is None:
            return
        try:
            self._link = shared.attach(self.path)
        except (duckdb.Error, OSError):
            small_export_db.release(shared, clean=False)
            return
        self._warm = shared
        self.con: Any = shared.con

    def _open_own(self) -> None:
        """A DuckDB database of this source's own, in a scratch directory."""
        path = self.path
        self._scratch = Path(tempfile.mkdtemp(prefix="gridledger-verify-"))
        try:
            self.con = duckdb.connect(
                ":memory:" if self.small else str(self._scratch / "work.duckdb")
            )
        except duckdb.Error:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise
        try:
            self.con.execute("SET enable_progress_bar = false")  # never into stdout
            if self.small:
                self.con.execute("SET threads = 1")
            self.con.execute(f"SET memory_limit = '{limits.DUCKDB_MEMORY_LIMIT}'")
            self.con.execute(f"SET temp_directory = '{self._scratch}/spill'")
            quoted = str(path).replace("'", "''")
            self.con.execute(f"ATTACH '{quoted}' AS {ALIAS} (READ_ONLY)")
            # From here on SQL touches nothing outside the two databases: a VIEW hidden in
            # an export cannot read local files or the network with the verifier's rights.
            self.con.execute("SET enable_external_access = false")
            self.con.execute("SET lock_configuration = true")
        except duckdb.Error as exc:
            self.close()
            raise UnusableInput(str(path), f"DuckDB cannot open it: {exc}") from exc

    @property
    def warm(self) -> bool:
        """True when on the process's warm database (``verifier/small_export_db.py``)."""
        return self._warm is not None

    def close(self) -> None:
        """Detach the export and delete the work tables (with their scratch directory)."""
        shared, self._warm = self._warm, None
        if shared is not None and self._link is not None:
            small_export_db.release(shared, clean=shared.detach(self._link))
            return
        try:
            self.con.close()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> ExportSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema and meta ---------------------------------------------------------------

    def _check_schema(self) -> None:
        # Columns (of tables and views) and which names are tables, in one statement.
        rows = self.con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = $1 AND schema_name = 'main' UNION ALL "
            "SELECT table_name, NULL, NULL FROM duckdb_tables() "
            "WHERE database_name = $1 AND schema_name = 'main'",
            [ALIAS],
        ).fetchall()
        have: dict[str, dict[str, str]] = {}
        tables: set[str] = set()
        for table, column, data_type in rows:
            if column is None:
                tables.add(table)
            else:
                have.setdefault(table, {})[column] = data_type
        if "meta" not in have:
            raise UnusableInput(str(self.path), "no meta table: not a gridledger export")
        if "terms" not in have and {"records", "input_rows"} <= set(have):
            raise UnusableInput(
                str(self.path),
                "this is a ledger's store, not an export; export a placement from it first: "
                "gridledger ledger export PLACEMENT --out FILE.duckdb (gridledger ledger list "
                "names the placements)",
            )
        problems: list[str] = [
            f"{name} is a view, not a table"
            for name in SCHEMA
            if name in have and name not in tables
        ]
        # EXPORT.md: ledger_records.placement_id, appended later; exports written before it
        # have none and verify as they did.
        extra = have.get("ledger_records", {}).get(RECORD_PLACEMENT_COLUMN)
        self.record_placement_id = extra is not None
        if extra not in (None, "VARCHAR"):
            problems.append(f"ledger_records.{RECORD_PLACEMENT_COLUMN} is {extra}, want VARCHAR")
        self.input_tables = tuple(
            t for t in INPUT_TABLES if t.name in have or t.name not in OPTIONAL_TABLES
        )
        self._present = frozenset(t for t in SCHEMA if t in have and t in tables)
        for table, columns in SCHEMA.items():
            if table not in have and table in OPTIONAL_TABLES:
                continue
            if table not in have:
                problems.append(f"table {table} missing")
                continue
            for column, data_type in columns:
                actual = have[table].get(column)
                if actual != data_type:
                    problems.append(f"{table}.{column} is {actual or 'missing'}, want {data_type}")
        if problems:
            raise UnusableInput(str(self.path), "export schema: " + "; ".join(problems[:5]))

    def _read_meta(self) -> dict[str, str]:
        # Each text read at most one character past its bound: a huge meta value is
        # refused by its length, never read whole.
        cut = limits.MAX_META_VALUE_CHARS + 1
        rows = self.con.execute(
            f"SELECT left(key, {cut}), left(value, {cut}) FROM {ALIAS}.meta "
            f"LIMIT {limits.SMALL_TABLE_FETCH_ROWS}"
        ).fetchall()
        meta: dict[str, str] = {}
        for key, value in rows:
            if isinstance(key, str) and isinstance(value, str):
                if (
                    len(key) > limits.MAX_META_VALUE_CHARS
                    or len(value) > limits.MAX_META_VALUE_CHARS
                ):
                    raise UnusableInput(
                        str(self.path),
                        f"meta {key[:40]!r}: more than {limits.MAX_META_VALUE_CHARS} characters",
                    )
                if key in meta:
                    # Row order carries no meaning (EXPORT.md): which of two values would
                    # be the export's is not for the verifier to pick.
                    raise UnusableInput(str(self.path), f"meta key {key!r} appears twice")
                meta[key] = value
        return meta

    # ---- reading -----------------------------------------------------------------------

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        """The first column of the first row of a query."""
        # fetchall, never fetchone: an unfinished result blocks the connection's appenders.
        rows = self.con.execute(sql, params or []).fetchall()
        row = rows[0] if rows else None
        return None if row is None else row[0]

    def count(self, table: str) -> int:
        """Rows in an export table (the export is read-only: each is counted once, every
        table of the schema in one statement)."""
        if not self._counts:
            if self.small and self._plain is None:
                self._count_with_shape()
            else:
                self._counts = {
                    table: int(n)
                    for table, n in self.con.execute(count_sql(self._present)).fetchall()
                }
        if table not in self._counts:
            self._counts[table] = int(self.scalar(f"SELECT count(*) FROM {ALIAS}.{table}"))
        return self._counts[table]

    def _count_with_shape(self) -> None:
        """``count``'s row counts and ``plain_shape``'s facts of a small export from ONE
        statement (its checklist asks for both; each statement costs it ~0.5-1 ms): the
        counts beside the chain indices of ledger_records and of every input table, with
        a hash of each input's envelope, the aggregates taken here (``_index_stats``). Asked of
        DuckDB in the same statement they cost ~3x as much (the UNION's typed NULL columns
        and the DISTINCTs). At most SHAPE_ROWS_MAX index rows are read (an honest small
        export has a few hundred): a file that holds more is asked for the aggregates
        (``_shape_sql``), its rows never read into memory.

        Envelopes are counted by DuckDB's 64-bit ``hash``, never read: equal envelopes
        hash alike, so a repeat is always seen; two distinct ones that collide count as a
        repeat, and the export is then checked as one that is not plain (the thorough
        path: the report is the same, only dearer)."""
        records, inputs = _SHAPE_TAGS
        counts = " UNION ALL ".join(
            f"SELECT '{table}', count(*), NULL::UBIGINT FROM {ALIAS}.{table}"
            for table in sorted(self._present)
        )
        indices = " UNION ALL ".join(
            [f"SELECT '{records}', chain_index, NULL::UBIGINT FROM {ALIAS}.ledger_records"]
            + [
                f"SELECT '{inputs}', chain_index, {_ENVELOPE_HASH} FROM {ALIAS}.{t.name}"
                for t in self.input_tables
            ]
        )
        rows = self.con.execute(
            f"{counts} UNION ALL ({indices} LIMIT {limits.SHAPE_ROWS_MAX + 1})"
        ).fetchall()
        self._counts = {str(row[0]): int(row[1]) for row in rows if row[0] not in _SHAPE_TAGS}
        held = self._counts["ledger_records"]
        held += sum(self._counts.get(t.name, 0) for t in self.input_tables)
        if held > limits.SHAPE_ROWS_MAX:
            self._plain = self._shape_by_sql()
            return
        hashes = [row[2] for row in rows if row[0] == inputs]
        self._plain = _plain(
            _index_stats([row[1] for row in rows if row[0] == records]),
            _index_stats([row[1] for row in rows if row[0] == inputs]),
            len({h for h in hashes if h is not None}),
        )

    def _shape_by_sql(self) -> PlainShape:
        """``plain_shape`` asked of DuckDB: the aggregates over the filled input tables."""
        rows = self.con.execute(self._shape_sql(self.filled_input_tables)).fetchall()
        return _shape_of({row[0]: row[1:] for row in rows})

    @staticmethod
    def _shape_sql(tables: Iterable[InputTable]) -> str:
        """SQL: ``plain_shape``'s aggregates, a row for ledger_records and one for the
        input ``tables`` together (tagged _SHAPE_TAGS)."""
        tagged = " UNION ALL ".join(
            f"SELECT chain_index, envelope FROM {ALIAS}.{t.name}" for t in tables
        )
        stats = "count(*), count(chain_index), count(DISTINCT chain_index), "
        stats += "min(chain_index), max(chain_index)"
        records, inputs = _SHAPE_TAGS
        return (
            f"SELECT '{records}', {stats}, 0 FROM {ALIAS}.ledger_records UNION ALL "
            f"SELECT '{inputs}', {stats}, count(DISTINCT envelope) FROM ({tagged})"
        )

    def has_table(self, table: str) -> bool:
        """Whether the export holds ``table`` (an optional one may be absent)."""
        return table in self._present

    def small_table(self, table: str, columns: str, order: str) -> list[tuple[Any, ...]]:
        """At most MAX_SMALL_TABLE_ROWS rows of a table that is small in an honest export
        (read once per export for each columns and order asked)."""
        names = [c.strip() for c in columns.split(",")]
        have = [c for c, _ in SCHEMA.get(table, ())]
        if not set(names) <= set(have):  # not plain columns of the table: as asked
            return list(
                self.con.execute(
                    f"SELECT {columns} FROM {ALIAS}.{table} ORDER BY {order} "
                    f"LIMIT {limits.MAX_SMALL_TABLE_ROWS}"
                ).fetchall()
            )
        # Every column of the schema, once per table and order; the columns asked for
        # are picked here (each statement costs more than such a table's rows).
        if table in self._present and not self.count(table):
            return []  # counted empty (the export is read-only): nothing to read
        key = (table, order)
        rows = self._small.get(key)
        if rows is None:
            rows = self.con.execute(
                f"SELECT {', '.join(have)} FROM {ALIAS}.{table} ORDER BY {order} "
                f"LIMIT {limits.MAX_SMALL_TABLE_ROWS}"
            ).fetchall()
            self._small[key] = rows
        picks = [have.index(c) for c in names]
        return [tuple(row[k] for k in picks) for row in rows]

    def input_rows(self, table: InputTable, lo: int, hi: int) -> list[InputRow]:
        """The first row (by storage order) of each chain index in [lo, hi) of a table."""
        return read_input_rows(self.con, f"{ALIAS}.", table, lo, hi)

    def record_rows(self, lo: int, hi: int) -> list[RecordRow]:
        """The first ledger_records row of each chain index in [lo, hi)."""
        return read_record_rows(self.con, f"{ALIAS}.", self.record_placement_id, lo, hi)

    def _all_input_rows(self, lo: int, hi: int) -> list[InputRow]:
        """``input_rows`` of every filled input table, in their order, from ONE statement
        (a small export's checklist pays more per statement than per row): a UNION ALL
        with each table's extra columns in slots of their own (NULL in the other tables'
        rows, so no column changes type), split here by table."""
        tables = self.filled_input_tables
        slots = [(t, k) for t in tables for k in range(len(t.extras))]
        common = ", ".join(c for c, _ in _COMMON)
        parts = []
        for n, table in enumerate(tables):
            extras = [
                f"{table.extras[k][0]}" if t is table else f"NULL::{t.extras[k][1]}"
                for t, k in slots
            ]
            parts.append(
                f"SELECT {n}, rowid, {', '.join([common, *extras])} FROM {ALIAS}.{table.name} "
                "WHERE chain_index >= $1 AND chain_index < $2"
            )
        by_table: list[list[tuple[Any, ...]]] = [[] for _ in tables]
        for row in self.con.execute(" UNION ALL ".join(parts), [lo, hi]).fetchall():
            by_table[row[0]].append(row[1:])
        rows: list[InputRow] = []
        width = 1 + len(_COMMON)  # rowid, then the common columns
        for n, table in enumerate(tables):
            picks = [width + k for k, (t, _) in enumerate(slots) if t is table]
            rows.extend(
                input_row(table, (*r[:width], *(r[k] for k in picks)))
                for r in first_per_index(by_table[n])
            )
        return rows

    @property
    def filled_input_tables(self) -> tuple[InputTable, ...]:
        """The input tables holding a row (at least one table, for a UNION to be SQL): what
        a query over every input table needs to read; most exports fill three of eight."""
        filled = tuple(t for t in self.input_tables if self.count(t.name))
        return filled or self.input_tables[:1]

    def plain_shape(self) -> PlainShape:
        """Whether a small export's chain indices and input envelopes are plain (see
        ``PlainShape``), in one statement of a few aggregates: on an honest export the
        set checks of (6) and the duplicate ranking of (7) find nothing, and their SQL
        (~10 statements' worth of planning) is only run when this says it might find
        something. A big export is not asked (its DISTINCT over every envelope would
        cost memory): both False.

        Why plain indices leave the set checks nothing: n non-NULL distinct indices
        between 0 and n-1 are exactly 0..n-1 (no duplicate, gap, negative or NULL in
        ledger_records); n non-NULL distinct input indices between 0 and n-1 are the
        same set (no input index twice, none without its record, no record without
        its input). Plain envelopes: count(DISTINCT envelope) = count(*) leaves no NULL
        and no two equal."""
        if self._plain is None:
            self._plain = _NOT_PLAIN
            if self.small:
                self._plain = self._shape_by_sql()
        return self._plain

    def all_indices_sql(self) -> str:
        """SQL: every chain_index of ledger_records and the input tables (with repeats)."""
        parts = [f"SELECT chain_index FROM {ALIAS}.ledger_records"]
        parts += [f"SELECT chain_index FROM {ALIAS}.{t.name}" for t in self.filled_input_tables]
        return " UNION ALL ".join(parts)

    def next_index(self, at_least: int) -> int | None:
        """The smallest chain index >= ``at_least`` in any chained table."""
        return self.index_range(at_least)[0]

    def index_range(self, at_least: int) -> tuple[int | None, int | None]:
        """The smallest and the largest chain index >= ``at_least`` in any chained table
        (when ``plain_shape`` found the indices plain, they are 0..n-1: no SQL)."""
        plain = self._plain
        if plain is not None and plain.indices:
            low, high = max(at_least, 0), plain.records - 1
            return (low, high) if low <= high else (None, None)
        rows = self.con.execute(
            f"SELECT min(chain_index), max(chain_index) FROM ({self.all_indices_sql()}) "
            "WHERE chain_index >= ?",
            [at_least],
        ).fetchall()
        low, high = rows[0]  # an aggregate without GROUP BY: always one row
        return (None, None) if low is None or high is None else (int(low), int(high))

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """Batches covering every chain index >= ``start`` present anywhere, in order.

        Empty stretches are skipped (a forged huge index costs one query, not a loop).
        """
        lo, last = self.index_range(start)
        while lo is not None and last is not None:
            hi = lo + limits.CHAIN_BATCH_INDICES
            records = self.record_rows(lo, hi)
            inputs: list[InputRow] = []
            if self.small and len(self.filled_input_tables) > 1:
                inputs = self._all_input_rows(lo, hi)
            else:
                for table in self.filled_input_tables:
                    inputs.extend(self.input_rows(table, lo, hi))
            yield Batch(lo, hi, records, inputs)
            lo = self.next_index(hi) if last >= hi else None
