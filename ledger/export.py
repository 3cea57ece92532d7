"""Export one placement as a DuckDB file exactly per proto/EXPORT.md (format version 1).

The export is written to a temporary file beside the target and renamed over it, so a
crash never leaves a half-written export under the target name. Before writing, the
ledger issues (and stores) a statement and a checkpoint for the current head when none
exists yet, so every export carries both. ``parquet_dir`` additionally writes each
table as ``<table>.parquet`` (same columns), each file also via a rename.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import duckdb

from ledger.attest import UnknownPlacement, issue_checkpoint, issue_statement
from ledger.store import Store
from proto.keys import SigningKey, b64

EXPORT_FORMAT: Final = "gridledger-export"
EXPORT_FORMAT_VERSION: Final = "1"
# The DuckDB storage format of export files: readable by DuckDB 1.0 and every later version.
STORAGE_VERSION: Final = "v1.0.0"

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
}

SCHEMA: Final = "\n".join(
    [
        "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);",
        *(
            f"CREATE TABLE {table} ({_COMMON}"
            + "".join(f", {name} {sql_type}" for name, sql_type in extra)
            + ");"
            for table, (_, extra) in INPUT_TABLES.items()
        ),
        "CREATE TABLE ledger_records (chain_index BIGINT NOT NULL, envelope BLOB NOT NULL, "
        "record_hash VARCHAR NOT NULL, kind VARCHAR, status VARCHAR, reason VARCHAR, "
        "delivered_mgms BIGINT, gross_minor BIGINT, buyer_owes_minor BIGINT, "
        "operator_receives_minor BIGINT, desk_receives_minor BIGINT, placement_id VARCHAR);",
        "CREATE TABLE statements (through_index BIGINT NOT NULL, envelope BLOB NOT NULL, "
        "final BOOLEAN, buyer_owes_minor BIGINT, operator_receives_minor BIGINT, "
        "desk_receives_minor BIGINT);",
        "CREATE TABLE checkpoints (size BIGINT NOT NULL, note VARCHAR NOT NULL);",
        "CREATE TABLE held (position VARCHAR NOT NULL, input_hash VARCHAR NOT NULL, "
        "envelope BLOB NOT NULL);",
    ]
)

TABLES: Final[tuple[str, ...]] = (
    "meta",
    *INPUT_TABLES,
    "ledger_records",
    "statements",
    "checkpoints",
    "held",
)


def _tmp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.tmp-{os.getpid()}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_rows(store: Store, placement_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the export, by table, read from the store in one locked pass."""
    with store.lock:
        records = store.query(
            "SELECT chain_index, envelope, record_hash, kind, status, reason, delivered_mgms, "
            "total_gross_minor, total_buyer_owes_minor, total_operator_receives_minor, "
            "total_desk_receives_minor, placement_id FROM records WHERE placement_id = ? "
            "ORDER BY chain_index",
            [placement_id],
        )
        tables: dict[str, list[tuple[Any, ...]]] = {"ledger_records": records}
        for table, (kind, extra) in INPUT_TABLES.items():
            columns = "".join(f", {name}" for name, _ in extra)
            tables[table] = store.query(
                "SELECT chain_index, position, input_hash, envelope, status, reason"
                f"{columns} FROM inputs WHERE placement_id = ? AND kind = ? "
                "ORDER BY chain_index",
                [placement_id, kind],
            )
        tables["statements"] = [tuple(row) for row in store.statements(placement_id)]
        tables["checkpoints"] = [tuple(row) for row in store.checkpoints(placement_id)]
        tables["held"] = []
        dropped = store.dropped_count(placement_id)
    tables["meta"] = [
        ("format", EXPORT_FORMAT),
        ("format_version", EXPORT_FORMAT_VERSION),
        ("placement_id", placement_id),
        ("ledger_key", ""),  # filled by export_placement (the key is not in the rows)
        ("records", str(len(records))),
        ("dropped_duplicates", str(dropped)),
    ]
    return tables


def _write_db(path: Path, tables: dict[str, list[tuple[Any, ...]]]) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    # Written in the storage format of DuckDB 1.0 (EXPORT.md "Readers"), so every DuckDB
    # 1.x and later opens it, whatever version writes it.
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH '{_sql_string(path)}' AS export (STORAGE_VERSION '{STORAGE_VERSION}')")
        con.execute("USE export")
        con.execute("BEGIN")
        con.execute(SCHEMA)
        for table in TABLES:
            rows: Sequence[tuple[Any, ...]] = tables[table]
            if rows:
                appender = con.appender(table)
                appender.append_rows(rows)
                appender.flush()
        con.execute("COMMIT")
        con.execute("CHECKPOINT export")
        con.execute("USE memory")
        con.execute("DETACH export")
    finally:
        con.close()
    with contextlib.suppress(FileNotFoundError):  # a checkpointed file has no WAL left
        Path(str(path) + ".wal").unlink()


def export_placement(
    store_or_path: Store | Path,
    placement_id: str,
    out: Path,
    *,
    key: SigningKey,
    parquet_dir: Path | None = None,
) -> dict[str, int]:
    """Write the export of ``placement_id`` to ``out`` (and ``parquet_dir``); row counts.

    ``store_or_path`` is the running ledger's Store, or the path of a ledger DB no
    process is writing (it is opened, used and closed here). ``key`` is the ledger key:
    it signs the statement and checkpoint issued for the head if none exists yet.
    Raises UnknownPlacement when the store has no chain for the placement.
    """
    if isinstance(store_or_path, Store):
        return _export(store_or_path, placement_id, out, key, parquet_dir)
    with Store(store_or_path, ledger_public_key=key.public_key) as store:
        return _export(store, placement_id, out, key, parquet_dir)


def _export(
    store: Store, placement_id: str, out: Path, key: SigningKey, parquet_dir: Path | None
) -> dict[str, int]:
    if store.head(placement_id) is None:
        raise UnknownPlacement(f"no records for placement {placement_id!r}")
    issue_statement(store, key, placement_id)
    issue_checkpoint(store, key, placement_id)
    tables = export_rows(store, placement_id)
    tables["meta"] = [
        (k, b64(key.public_key) if k == "ledger_key" else v) for k, v in tables["meta"]
    ]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(out)
    try:
        _write_db(tmp, tables)
        _fsync_file(tmp)
        if parquet_dir is not None:
            write_parquet(tmp, Path(parquet_dir))
        os.replace(tmp, out)
        _fsync_dir(out.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        with contextlib.suppress(FileNotFoundError):
            Path(str(tmp) + ".wal").unlink()
    return {table: len(rows) for table, rows in tables.items()}


def write_parquet(db: Path, directory: Path) -> None:
    """Write every table of the export file ``db`` to ``directory/<table>/<placement>.parquet``.

    One directory per table, one file per placement: exports of many placements into one
    directory sit side by side, and an analyst reads a table across all of them with one
    glob (``read_parquet('DIR/ledger_records/*.parquet')``; ``ledger_records`` carries
    ``placement_id``, and ``filename = true`` names the placement of any other table).
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
            final = table_dir / f"{placement_id}.parquet"
            tmp = table_dir / f".{placement_id}.parquet.tmp-{os.getpid()}"
            con.execute(f"COPY {table} TO '{_sql_string(tmp)}' (FORMAT parquet)")
            _fsync_file(tmp)
            os.replace(tmp, final)
            _fsync_dir(table_dir)
    finally:
        con.close()


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")
