"""Migrations of older store versions, in place on open, inside the opening transaction."""

from __future__ import annotations

from typing import Any, Final

import duckdb

from ledger import snapshot
from ledger.store.schema import ENVELOPE_SQL, STORE_VERSION

# Store versions this code opens; older ones are migrated in place on open (_migrate).
_MIGRATES_FROM: Final = ("1", "2", "3", "4")


def _migrate(con: duckdb.DuckDBPyConnection, version: str) -> None:
    """Bring a store of ``version`` to STORE_VERSION inside the caller's transaction (a
    crash before its COMMIT leaves the store as it was; the next open migrates again).

    1 -> 2: ``commit_no`` on records and inputs (0 for every existing row) and
    ``placement_commits`` with the range 0..0 for every placement already stored (so a
    read of an old placement scans the rows written before the migration, as before).

    2 -> 3: the tables ``records`` and ``inputs`` become ``record_rows`` and
    ``input_rows``, each envelope kept as its payload and signatures (SCHEMA), under views
    of the old names (VIEWS). Every envelope must rebuild byte for byte (ENVELOPE_SQL),
    else nothing is migrated (duckdb.Error, the transaction rolls back).

    3 -> 4: held inputs (SPEC §6.2) leave the snapshots for rows of ``held_inputs`` (raw,
    node_id/seq of a stream hold, ordinal: the order held). The old rows (a position and
    arrival per input ever held, released ones too) are replaced by the holds of each
    snapshot, which is rewritten without them (``snapshot.split_holds``).

    4 -> 5: the input hashes a placement has seen (SPEC §6.1 (2)) leave the snapshots for
    rows of ``placement_seen``; each snapshot is rewritten without them
    (``snapshot.split_seen``).
    """
    if version == "1":
        for table in ("records", "inputs"):
            con.execute(f"ALTER TABLE {table} ADD COLUMN commit_no BIGINT NOT NULL DEFAULT 0")
        con.execute(
            "INSERT INTO placement_commits SELECT placement_id, 0, 0 FROM "
            "(SELECT placement_id FROM records UNION SELECT placement_id FROM inputs) "
            "ON CONFLICT DO NOTHING"
        )
        version = "2"
    if version == "2":
        for old, new in (("records", "record_rows"), ("inputs", "input_rows")):
            split = _split_envelopes(old)
            row = con.execute(
                f"SELECT count(*), count(*) FILTER ({ENVELOPE_SQL} IS DISTINCT FROM envelope), "
                f"(SELECT count(*) FROM {old}) FROM {split}"
            ).fetchone()
            if row is None or row[1] or row[0] != row[2]:
                bad = "?" if row is None else row[1] + row[2] - row[0]
                raise duckdb.ConstraintException(
                    f"{bad} envelope(s) of {old} are not canonical: not rebuilt byte for byte"
                )
            columns = [
                str(r[0])
                for r in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE "
                    "table_catalog = current_database() AND table_schema = current_schema() "
                    "AND table_name = ? ORDER BY ordinal_position",
                    [new],
                ).fetchall()
            ]
            con.execute(f"INSERT INTO {new} SELECT {', '.join(columns)} FROM {split}")
            con.execute(f"DROP TABLE {old}")
        version = "3"
    if version == "3":
        _migrate_holds(con)
        version = "4"
    if version == "4":
        _migrate_seen(con)
    con.execute("UPDATE meta SET value = ? WHERE key = 'store_version'", [STORE_VERSION])


def _migrate_holds(con: duckdb.DuckDBPyConnection) -> None:
    """Store version 3 -> 4 (``_migrate``): held inputs from the snapshots to rows."""
    have = {
        str(r[0])
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE "
            "table_catalog = current_database() AND table_schema = current_schema() "
            "AND table_name = 'held_inputs'"
        ).fetchall()
    }
    for column, kind in (("raw", "BLOB"), ("node_id", "VARCHAR"), ("seq", "BIGINT")):
        if column not in have:
            con.execute(f"ALTER TABLE held_inputs ADD COLUMN {column} {kind}")
    if "ordinal" not in have:
        con.execute("ALTER TABLE held_inputs ADD COLUMN ordinal BIGINT")
    con.execute("DELETE FROM held_inputs")
    rows: list[tuple[Any, ...]] = []
    rewritten: list[tuple[bytes, str]] = []
    for pid, data in con.execute(
        "SELECT placement_id, snapshot FROM placement_state ORDER BY placement_id"
    ).fetchall():
        split = snapshot.split_holds(str(pid), bytes(data))
        if split is None:
            continue
        without, holds = split
        rewritten.append((without, str(pid)))
        for h in holds:
            rows.append((str(pid), h.position, h.arrived_ms, h.raw, h.node_id, h.seq, len(rows)))
    if rows:  # the appender: executemany manages ~2k rows/s (LIMITS.md)
        appender = con.appender("held_inputs")
        appender.append_rows(rows)
        appender.flush()
    if rewritten:
        con.executemany("UPDATE placement_state SET snapshot = ? WHERE placement_id = ?", rewritten)


def _migrate_seen(con: duckdb.DuckDBPyConnection) -> None:
    """Store version 4 -> 5 (``_migrate``): seen input hashes from the snapshots to rows."""
    con.execute("DELETE FROM placement_seen")  # created empty by SCHEMA in this transaction
    rows: list[tuple[str, str]] = []
    rewritten: list[tuple[bytes, str]] = []
    for pid, data in con.execute(
        "SELECT placement_id, snapshot FROM placement_state ORDER BY placement_id"
    ).fetchall():
        split = snapshot.split_seen(str(pid), bytes(data))
        if split is None:
            continue
        without, hashes = split
        rewritten.append((without, str(pid)))
        rows.extend((str(pid), h) for h in hashes)
    # The appender (executemany manages ~2k rows/s, LIMITS.md), and one UPDATE from a
    # temporary table for the snapshots: nearly every placement has seen something.
    if rows:
        appender = con.appender("placement_seen")
        appender.append_rows(rows)
        appender.flush()
    if rewritten:
        con.execute("CREATE TEMP TABLE _migrate_seen (snapshot BLOB, placement_id VARCHAR)")
        appender = con.appender("_migrate_seen")
        appender.append_rows(rewritten)
        appender.flush()
        con.execute(
            "UPDATE placement_state SET snapshot = t.snapshot FROM _migrate_seen t "
            "WHERE placement_state.placement_id = t.placement_id"
        )
        con.execute("DROP TABLE _migrate_seen")


def _split_envelopes(table: str) -> str:
    """A subquery: ``table``'s rows with their canonical envelope split into the columns
    of SCHEMA (payload, keyid, sig, signatures). For a non-canonical envelope the columns
    are whatever the split finds; ENVELOPE_SQL over them then differs from it."""
    text = f"(SELECT *, decode(envelope) AS _text FROM {table})"
    at = f'(SELECT *, strpos(_text, \'","signatures":\') AS _at FROM {text})'
    parts = (
        "(SELECT *, substr(_text, 13, _at - 13) AS _b64, "
        f"substr(_text, _at + 15, length(_text) - _at - 15) AS _sigs FROM {at})"
    )
    one = "json_array_length(_sigs) = 1"
    return (
        f"(SELECT *, from_base64(_b64) AS payload, "
        f"CASE WHEN {one} THEN json_extract_string(_sigs, '$[0].keyid') END AS keyid, "
        f"CASE WHEN {one} THEN from_base64(json_extract_string(_sigs, '$[0].sig')) END AS sig, "
        f"CASE WHEN {one} THEN NULL ELSE _sigs END AS signatures FROM {parts})"
    )
