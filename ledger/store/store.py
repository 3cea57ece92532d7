"""The ledger's DuckDB store: chains, inputs, quarantine, fold state, offsets. One writer.

Everything one batch produced — ledger records, chained inputs, quarantined inputs,
duplicate counters, the fold state of every placement the batch touched, final
statements and the consumed offsets — is written in ONE transaction (``commit_batch``).
A kill -9 at any point leaves either the whole batch or none of it; on start the
service restores the fold state and seeks to the stored offsets, so it resumes exactly
where the last committed batch ended (the eventsourcing "tracking record" pattern).

Bulk rows go through DuckDB appenders (LIMITS.md: ~240k rows/s, where ``executemany``
manages ~2k); an appender's flush is part of the surrounding transaction, so a rollback
or a crash discards it like any other write.

The connection is shared by the service loop and the HTTP threads; a lock serialises
them (DuckDB's Python connection is not safe for concurrent use).

Reading one placement costs its own rows, not the store's (bench/export_many.py): every row of
``records`` and ``inputs`` carries ``commit_no``, the number of the batch that wrote it
(increasing, the same for the whole batch), and ``placement_commits`` keeps, for every
placement, the first and last batch that wrote rows of it (upserted in the batch's own
transaction). A read of one placement filters on its ``commit_no`` range as well as its
id, so DuckDB's zone maps (min/max per row group) skip every row group written outside
that range: a placement open for a day is read from that day's row groups, whatever the
store's size. The id filter stays, so the range only ever prunes, never decides.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import duckdb
import numpy

from ledger import snapshot
from ledger.limits import STORE_MEMORY_LIMIT, STORE_ROW_GROUP_ROWS
from ledger.store.migrate import _MIGRATES_FROM, _migrate
from ledger.store.rows import (
    Batch,
    ChainHead,
    HeldSummary,
    StatementRow,
    _held_input,
    _input_row,
    _quarantine_row,
    _record_row,
    _seen_rows,
    _statement_tuple,
)
from ledger.store.schema import (
    PLACEMENT_ROWS,
    SCHEMA,
    STORE_ALIAS,
    STORE_FORMAT,
    STORE_VERSION,
    VIEWS,
    StoreError,
    StoreLocked,
)
from proto.envelope import open_envelope
from proto.invariant import present
from proto.keys import b64
from proto.records import PlacementTerms

# The wide tables every chained input writes a row to: inserted as columns
# (``Store._insert_columns``), the others through DuckDB's appender.
_COLUMN_TABLES: Final = frozenset({"record_rows", "input_rows"})


def _attach_store(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """ATTACH the store file as STORE_ALIAS in row groups of STORE_ROW_GROUP_ROWS rows; a
    DuckDB that knows no such ATTACH option (before 1.2; pyproject allows 1.1) attaches it
    with its own row groups: the same rows, only the checkpoints' cost differs."""
    quoted = str(path).replace("'", "''")
    try:
        con.execute(f"ATTACH '{quoted}' AS {STORE_ALIAS} (ROW_GROUP_SIZE {STORE_ROW_GROUP_ROWS})")
    except duckdb.BinderException as exc:
        if "row_group_size" not in str(exc).lower():
            raise
        con.execute(f"ATTACH '{quoted}' AS {STORE_ALIAS}")


class Store:
    """The ledger's DuckDB file. Open it once per process; it is the only writer."""

    def __init__(self, path: Path | str, *, ledger_public_key: bytes | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._columns: dict[str, tuple[tuple[str, str], ...]] = {}
        try:
            # Bounded memory: DuckDB's buffer pool would otherwise grow towards 80 % of RAM
            # as the store grows; past the limit it spills to the file, never fails.
            # Spilled to ``<store>.tmp``, where DuckDB puts it for a file it opens itself
            # (an in-memory database's default is ``.tmp`` in the working directory).
            self._con = duckdb.connect(
                ":memory:",
                config={
                    "memory_limit": STORE_MEMORY_LIMIT,
                    "threads": 2,
                    "temp_directory": f"{self.path}.tmp",
                },
            )
        except duckdb.Error as exc:
            raise StoreError(f"cannot open ledger store {self.path}: {exc}") from exc
        try:
            # No progress bar: DuckDB would draw it on stdout during a long query, into
            # the middle of a command's output (`--json` included). Cursors inherit it.
            self._con.execute("SET enable_progress_bar = false")
            # The file ATTACHed for its row group size (STORE_ROW_GROUP_ROWS: an ATTACH
            # option, not a setting of ``connect``), then the default database of this
            # connection and its cursors: every statement names its tables unqualified.
            _attach_store(self._con, self.path)
            self._con.execute(f"USE {STORE_ALIAS}")
        except duckdb.IOException as exc:
            self._con.close()
            if "lock" in str(exc).lower():
                raise StoreLocked(
                    f"the ledger store {self.path} is in use by a running ledger; ask that "
                    'ledger over its HTTP API (http in ledger.toml, not "off"), or stop it '
                    "and try again"
                ) from exc
            raise StoreError(f"cannot open ledger store {self.path}: {exc}") from exc
        except BaseException:
            self._con.close()
            raise
        try:
            self._init_schema(ledger_public_key)
        except BaseException:
            self._con.close()
            raise

    def _init_schema(self, ledger_public_key: bytes | None) -> None:
        con = self._con
        con.execute("BEGIN")
        try:
            con.execute(SCHEMA)
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                rows = [("format", STORE_FORMAT), ("store_version", STORE_VERSION)]
                if ledger_public_key is not None:
                    rows.append(("ledger_key", b64(ledger_public_key)))
                for key, value in rows:
                    con.execute("INSERT INTO meta VALUES (?, ?)", [key, value])
            else:
                if meta.get("format") != STORE_FORMAT:
                    raise StoreError(f"{self.path} is not a ledger store ({meta.get('format')!r})")
                if meta.get("store_version") in _MIGRATES_FROM:
                    try:
                        _migrate(con, str(meta["store_version"]))
                    except duckdb.Error as exc:
                        raise StoreError(
                            f"{self.path}: cannot migrate store version "
                            f"{meta['store_version']!r} to {STORE_VERSION!r} (left as it "
                            f"was): {exc}"
                        ) from exc
                elif meta.get("store_version") != STORE_VERSION:
                    raise StoreError(
                        f"{self.path}: store version {meta.get('store_version')!r}, "
                        f"this ledger reads {STORE_VERSION!r}"
                    )
                stored_key = meta.get("ledger_key")
                if ledger_public_key is not None:
                    if stored_key is None:
                        con.execute(
                            "INSERT INTO meta VALUES ('ledger_key', ?)", [b64(ledger_public_key)]
                        )
                    elif stored_key != b64(ledger_public_key):
                        raise StoreError(
                            f"{self.path} belongs to another ledger key ({stored_key}); "
                            "refusing to mix chains signed by two keys"
                        )
            con.execute(VIEWS)
            row = con.execute("SELECT max(last_commit) FROM placement_commits").fetchone()
            self._commit_no = 0 if row is None or row[0] is None else int(row[0])
            # The placements with a stored snapshot: ``load_state`` of any other (a
            # placement seen for the first time) answers None without a query.
            self._stated: set[str] = {
                str(pid)
                for (pid,) in con.execute("SELECT placement_id FROM placement_state").fetchall()
            }
            # Placements that may have held rows (a superset: released rows are not
            # tracked), and the next row's ordinal (held order, SPEC §6.2).
            self._holding: set[str] = {
                str(pid)
                for (pid,) in con.execute(
                    "SELECT DISTINCT placement_id FROM held_inputs"
                ).fetchall()
            }
            row = con.execute("SELECT coalesce(max(ordinal), -1) + 1 FROM held_inputs").fetchone()
            self._next_ordinal = 0 if row is None else int(row[0])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def note_arrival(self, arrival: str) -> None:
        """Record where this store's arrival times come from (SPEC §6.6: ``log`` or
        ``sender``), or refuse a ledger configured otherwise than the one that wrote it:
        one chain never mixes log times with times its senders stated. A store written
        before the mode was recorded takes the first mode it is opened with."""
        with self._lock:
            row = self._con.execute("SELECT value FROM meta WHERE key = 'arrival'").fetchone()
            if row is None:
                self._con.execute("INSERT INTO meta VALUES ('arrival', ?)", [arrival])
        if row is not None and str(row[0]) != arrival:
            raise StoreError(
                f"{self.path} was written with arrival = {str(row[0])!r}; this ledger is "
                f"configured with arrival = {arrival!r}: refusing to mix arrival times of "
                "two kinds in one chain (SPEC 6.6)"
            )

    def arrival(self) -> str:
        """Where the arrival times of this store's records come from: ``log`` (also for a
        store that never recorded it) or ``sender`` (a simulation)."""
        with self._lock:
            row = self._con.execute("SELECT value FROM meta WHERE key = 'arrival'").fetchone()
        return "log" if row is None else str(row[0])

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        """Hold it for a read-modify-write that must not interleave with other threads."""
        return self._lock

    def close(self) -> None:
        """Close the connection (a checkpoint of the WAL happens in DuckDB on close)."""
        with self._lock:
            self._con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- the write path ----------------------------------------------------------------------

    def commit_batch(self, batch: Batch) -> None:
        """Write everything in ``batch`` in one transaction (all or nothing)."""
        commit_no = self._commit_no + 1
        record_rows = [_record_row(r, commit_no) for r in batch.chained]
        input_rows = [_input_row(r, commit_no) for r in batch.chained]
        touched = sorted({r.record.placement_id for r in batch.chained})
        quarantine_rows = [_quarantine_row(q) for q in batch.quarantined]
        state_rows = [(s.placement_id, s.snapshot, s.closed, s.close_due_ms) for s in batch.states]
        statement_rows = [_statement_tuple(s) for s in batch.statements]
        held_rows = [
            (h.placement_id, h.position, h.arrived_ms, h.raw, h.node_id, h.seq, ordinal)
            for ordinal, h in enumerate(batch.held, start=self._next_ordinal)
        ]
        seen_rows = _seen_rows(batch.chained)
        with self._lock:
            con = self._con
            con.execute("BEGIN")
            try:
                self._append("record_rows", record_rows)
                self._append("input_rows", input_rows)
                if touched:
                    con.execute(
                        "INSERT INTO placement_commits SELECT unnest(?), ?, ? ON CONFLICT "
                        "(placement_id) DO UPDATE SET last_commit = excluded.last_commit",
                        [touched, commit_no, commit_no],
                    )
                self._append("quarantine", quarantine_rows)
                self._append("placement_state", state_rows, upsert=True)
                self._append("statements", statement_rows, upsert=True)
                for placement_id, count in sorted(batch.dropped.items()):
                    con.execute(
                        "INSERT INTO dropped VALUES (?, ?) ON CONFLICT (placement_id) "
                        "DO UPDATE SET count = dropped.count + excluded.count",
                        [placement_id, count],
                    )
                self._append("offsets", sorted(batch.offsets.items()), upsert=True)
                if batch.released:
                    con.execute(
                        "DELETE FROM held_inputs h USING (SELECT unnest(?) AS p, unnest(?) AS q) r "
                        "WHERE h.placement_id = r.p AND h.position = r.q",
                        [[p for p, _ in batch.released], [q for _, q in batch.released]],
                    )
                self._append("held_inputs", held_rows)
                self._append("placement_seen", seen_rows)
                if batch.claims_gone:
                    con.execute(
                        "DELETE FROM capacity_claims c USING (SELECT unnest(?) AS s, "
                        "unnest(?) AS u, unnest(?) AS p) g "
                        "WHERE c.scope = g.s AND c.uuid = g.u AND c.placement_id = g.p",
                        [
                            [k[0] for k in batch.claims_gone],
                            [k[1] for k in batch.claims_gone],
                            [k[2] for k in batch.claims_gone],
                        ],
                    )
                self._append("capacity_claims", batch.claims, upsert=True)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            self._next_ordinal += len(held_rows)
            self._holding.update(h.placement_id for h in batch.held)
            self._stated.update(s.placement_id for s in batch.states)
            if touched:
                self._commit_no = commit_no

    def _insert_columns(self, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """INSERT ``rows`` (every column of ``table``, in order) as columns: one NumPy array
        per column, scanned by DuckDB in one statement. The same rows as ``_append``, at a
        fraction of its cost per row for the two wide tables every input writes.

        BIGINT columns travel as int64 arrays (a nullable one with a mask beside it): an
        array of Python objects would let DuckDB guess a narrower type from a sample of
        the values and fail on a larger one further down. A column that is NULL in every
        row, or the same ``str`` in every row (a batch's kinds, statuses, reasons, the
        signatures of unsigned records), travels as one NULL or one parameter, and a
        nullable BIGINT column without a NULL in the batch as a plain int64 array: the same
        rows, without DuckDB converting thousands of Python objects (holding the GIL)."""
        if not rows:
            return
        data: dict[str, Any] = {}
        select: list[str] = []
        parameters: list[str] = []
        count = len(rows)
        for (name, kind), values in zip(
            self._column_kinds(table), zip(*rows, strict=True), strict=True
        ):
            first = values[0]
            if (
                kind != "bigint"
                and (first is None or type(first) is str)
                and values.count(first) == count
            ):
                if first is None:
                    select.append("NULL")
                else:
                    select.append("?")
                    parameters.append(first)
                continue
            if kind == "bigint" or (kind == "nullable_bigint" and None not in values):
                data[name] = numpy.array(values, dtype=numpy.int64)
                select.append(f'"{name}"')
            elif kind == "nullable_bigint":
                objects = numpy.array(values, dtype=object)
                missing = numpy.array([v is None for v in values], dtype=numpy.bool_)
                objects[missing] = 0
                data[name] = objects.astype(numpy.int64)
                data[f"{name}__null"] = missing
                select.append(f'CASE WHEN "{name}__null" THEN NULL ELSE "{name}" END')
            else:
                data[name] = numpy.array(values, dtype=object)
                select.append(f'"{name}"')
        view = f"_batch_{table}"
        self._con.register(view, data)
        try:
            self._con.execute(
                f"INSERT INTO {table} SELECT {', '.join(select)} FROM {view}", parameters
            ).fetchall()
        finally:
            self._con.unregister(view)

    def _column_kinds(self, table: str) -> tuple[tuple[str, str], ...]:
        """``table``'s columns in order, each with how it travels: "bigint" (NOT NULL),
        "nullable_bigint", or "object" (strings, blobs: Python objects, NULLs included)."""
        cached = self._columns.get(table)
        if cached is None:
            found = self._con.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_catalog = current_database() AND table_schema = current_schema() "
                "AND table_name = ? ORDER BY ordinal_position",
                [table],
            ).fetchall()
            cached = tuple(
                (
                    str(name),
                    "object"
                    if data_type != "BIGINT"
                    else ("bigint" if nullable == "NO" else "nullable_bigint"),
                )
                for name, data_type, nullable in found
            )
            self._columns[table] = cached
        return cached

    def _append(self, table: str, rows: Sequence[tuple[Any, ...]], *, upsert: bool = False) -> None:
        if not rows:
            return
        if not upsert and table in _COLUMN_TABLES:
            self._insert_columns(table, rows)
            return
        appender = self._con.appender(table, action="upsert" if upsert else "insert")
        appender.append_rows(rows)
        appender.flush()

    # ---- fold state and offsets -----------------------------------------------------------

    def offsets(self) -> dict[str, str]:
        """Source -> stored position (the next input to read)."""
        return dict(self._rows("SELECT source, position FROM offsets"))

    def open_states(self) -> list[tuple[str, bytes]]:
        """(placement_id, snapshot) of every placement that is not closed, each with its
        held inputs (rows of ``held_inputs``, ``snapshot.with_holds``) and the input hashes
        it has seen (rows of ``placement_seen``, ``snapshot.with_seen``)."""
        with self._lock:
            held: dict[str, list[snapshot.HeldInput]] = {}
            for pid, *row in self._rows(
                "SELECT placement_id, position, raw, node_id, seq, arrived_ms FROM held_inputs "
                "ORDER BY ordinal"
            ):
                held.setdefault(str(pid), []).append(_held_input(row))
            seen: dict[str, list[str]] = {}
            for pid, input_hash in self._rows(
                "SELECT s.placement_id, s.input_hash FROM placement_seen s "
                "SEMI JOIN placement_state p ON s.placement_id = p.placement_id "
                "AND NOT p.closed"
            ):
                seen.setdefault(str(pid), []).append(str(input_hash))
            out: list[tuple[str, bytes]] = []
            for pid, snap in self._rows(
                "SELECT placement_id, snapshot FROM placement_state WHERE NOT closed "
                "ORDER BY placement_id"
            ):
                data = snapshot.with_holds(str(pid), bytes(snap), held.get(str(pid), []))
                out.append((str(pid), snapshot.with_seen(str(pid), data, seen.get(str(pid), []))))
            return out

    def seen_hashes(self, placement_id: str) -> list[str]:
        """The input hashes the placement has seen (SPEC §6.1 (2); rows of
        ``placement_seen``: every chained input but an accepted usage event)."""
        return [
            str(h)
            for (h,) in self._rows(
                "SELECT input_hash FROM placement_seen WHERE placement_id = ?", [placement_id]
            )
        ]

    def held_inputs(self, placement_id: str) -> list[snapshot.HeldInput]:
        """The placement's held inputs (rows of ``held_inputs``) in the order held."""
        if placement_id not in self._holding:
            return []
        return [
            _held_input(row)
            for row in self._rows(
                "SELECT position, raw, node_id, seq, arrived_ms FROM held_inputs "
                "WHERE placement_id = ? ORDER BY ordinal",
                [placement_id],
            )
        ]

    def capacity_claims(self) -> list[tuple[str, str, str, int, int, int]]:
        """Every stored GPU claim (SPEC §6.5), to restore the fold's capacity index."""
        return [
            (str(s), str(u), str(p), int(a), int(b), int(m))
            for s, u, p, a, b, m in self._rows(
                "SELECT scope, uuid, placement_id, start_ms, end_ms, share_milli "
                "FROM capacity_claims ORDER BY scope, uuid, placement_id"
            )
        ]

    def load_state(self, placement_id: str) -> bytes | None:
        """The stored snapshot of one placement with its held inputs and seen input hashes
        (restores an evicted placement)."""
        if placement_id not in self._stated:
            return None  # never stored (this store is its only writer): no query
        with self._lock:
            rows = self._rows(
                "SELECT snapshot FROM placement_state WHERE placement_id = ?", [placement_id]
            )
            if not rows:
                return None
            held = self.held_inputs(placement_id)
            seen = self.seen_hashes(placement_id)
        data = snapshot.with_holds(placement_id, bytes(rows[0][0]), held)
        return snapshot.with_seen(placement_id, data, seen)

    def lookup_usage(self, placement_id: str, node_id: str, seq: int) -> tuple[str, str] | None:
        """(input_hash, payload record hash) of the accepted usage event at ``seq``, or None."""
        rows = self.placement_query(
            "SELECT input_hash, payload_hash FROM inputs WHERE {rows} AND node_id = ? "
            "AND seq = ? AND kind = 'usage' AND status = 'accepted'",
            placement_id,
            [node_id, seq],
        )
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    # ---- chains ------------------------------------------------------------------------------

    def commit_range(self, placement_id: str) -> tuple[int, int] | None:
        """(first, last) commit_no of the batches that wrote rows of the placement."""
        rows = self._rows(
            "SELECT first_commit, last_commit FROM placement_commits WHERE placement_id = ?",
            [placement_id],
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def placement_query(
        self, sql: str, placement_id: str, params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` over ``records``/``inputs`` of one placement, at its own cost.

        ``{rows}`` in ``sql`` (before any other ``?``) becomes the placement's filter: its
        id and its commit range (module docstring), so only its row groups are read.
        """
        with self._lock:
            span = self.commit_range(placement_id)
            if span is None:
                return []
            return self._rows(sql.format(rows=PLACEMENT_ROWS), [placement_id, *span, *params])

    def commit_ranges(self) -> dict[str, tuple[int, int]]:
        """placement_id -> (first, last) commit_no, for every placement with a chain."""
        return {
            str(p): (int(a), int(b))
            for p, a, b in self._rows(
                "SELECT placement_id, first_commit, last_commit FROM placement_commits"
            )
        }

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own to the store's database, for one reader thread.

        It does not take the store's lock: DuckDB isolates its transactions from the
        writer's (a read sees committed batches only). Close it when done.
        """
        with self._lock:
            cursor = self._con.cursor()
        try:
            cursor.execute(f"USE {STORE_ALIAS}")  # a cursor starts in DuckDB's own default
        except BaseException:
            cursor.close()
            raise
        return cursor

    def placements(self) -> list[str]:
        """Every placement with at least one chained record."""
        return [
            str(r[0]) for r in self._rows("SELECT placement_id FROM placement_commits ORDER BY 1")
        ]

    def head(self, placement_id: str) -> ChainHead | None:
        """The last record of the placement's chain."""
        rows = self.placement_query(
            "SELECT chain_index, record_hash, envelope FROM records WHERE {rows} "
            "ORDER BY chain_index DESC LIMIT 1",
            placement_id,
        )
        if not rows:
            return None
        index, record_hash, envelope = rows[0]
        return ChainHead(placement_id, int(index), str(record_hash), bytes(envelope))

    def heads(self) -> dict[str, tuple[int, str]]:
        """placement_id -> (last chain index, its record hash), for every placement."""
        rows = self._rows(
            "SELECT placement_id, arg_max(chain_index, chain_index), "
            "arg_max(record_hash, chain_index) FROM records GROUP BY placement_id"
        )
        return {str(p): (int(i), str(h)) for p, i, h in rows}

    def record_envelopes(self, placement_id: str, through_index: int | None = None) -> list[bytes]:
        """The LedgerRecord envelopes of a placement in index order (optionally a prefix)."""
        return self._chain_column(placement_id, "envelope", through_index)

    def record_payloads(self, placement_id: str, through_index: int | None = None) -> list[bytes]:
        """The signed bytes of each LedgerRecord in index order: the Merkle leaves."""
        return self._chain_column(placement_id, "payload", through_index)

    def _chain_column(
        self,
        placement_id: str,
        column: Literal["envelope", "payload"],
        through_index: int | None,
    ) -> list[bytes]:
        """``column`` of each record of a placement in index order (through ``through_index``
        when given); a StoreError where the chain has a hole."""
        limit = -1 if through_index is None else through_index
        rows = self.placement_query(
            f"SELECT chain_index, {column} FROM records WHERE {{rows}} "
            "AND (? < 0 OR chain_index <= ?) ORDER BY chain_index",
            placement_id,
            [limit, limit],
        )
        for expected, (index, _) in enumerate(rows):
            if index != expected:
                raise StoreError(f"chain of {placement_id} has a hole at index {expected}")
        return [bytes(value) for _, value in rows]

    def terms(self, placement_id: str) -> PlacementTerms | None:
        """The placement's terms in force: the last accepted (an amendment replaces the
        terms before it, SPEC §6.3 terms), decoded from the stored envelope."""
        rows = self.placement_query(
            "SELECT envelope FROM inputs WHERE {rows} AND kind = 'terms' "
            "AND status = 'accepted' ORDER BY chain_index DESC LIMIT 1",
            placement_id,
        )
        if not rows:
            return None
        record = open_envelope(bytes(rows[0][0])).record
        if not isinstance(record, PlacementTerms):
            raise StoreError(f"stored terms of {placement_id} decode as {type(record).__name__}")
        return record

    def record_hash_at(self, placement_id: str, index: int) -> str | None:
        """The record hash of record ``index`` of the placement's chain, if it exists."""
        rows = self.placement_query(
            "SELECT record_hash FROM records WHERE {rows} AND chain_index = ?",
            placement_id,
            [index],
        )
        return None if not rows else str(rows[0][0])

    def close_index(self, placement_id: str) -> int | None:
        """Chain index of the placement's accepted close, if any."""
        rows = self.placement_query(
            "SELECT min(chain_index) FROM records WHERE {rows} AND kind = 'closed' "
            "AND status = 'accepted'",
            placement_id,
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def held(self, placement_id: str) -> HeldSummary | None:
        """The inputs the placement holds now (none once its terms are accepted), or None."""
        rows = self._rows(
            "SELECT snapshot FROM placement_state WHERE placement_id = ?", [placement_id]
        )
        if not rows:
            return None
        state = snapshot.decode(placement_id, bytes(rows[0][0]))
        if state.terms is not None:
            return None
        found = self._rows(
            "SELECT count(*), min(arrived_ms) FROM held_inputs WHERE placement_id = ?",
            [placement_id],
        )
        if not found or not found[0][0]:
            return None
        count, since = found[0]
        return HeldSummary(placement_id, int(count), None if since is None else int(since))

    def no_records_text(self, placement_id: str) -> str:
        """Why the placement has no chain: its inputs are held (how many, since when,
        waiting for what), or nothing of it was read at all."""
        held = self.held(placement_id)
        if held is None:
            return f"no records for placement {placement_id!r}"
        since = (
            ""
            if held.since_ms is None
            else f" since {_utc(held.since_ms)} (ledger clock {held.since_ms} ms)"
        )
        return (
            f"placement {placement_id!r} has no records yet: {held.count} input(s) held{since}, "
            "waiting for its terms (PlacementTerms signed by operator, buyer and desk; "
            "publish them with `gridledger terms publish`)"
        )

    def dropped_count(self, placement_id: str) -> int:
        """Inputs of the placement dropped as exact re-deliveries."""
        rows = self._rows("SELECT count FROM dropped WHERE placement_id = ?", [placement_id])
        return int(rows[0][0]) if rows else 0

    def quarantine_counts(self) -> dict[str, int]:
        """Quarantined inputs by reason."""
        return {
            str(r): int(n)
            for r, n in self._rows("SELECT reason, count(*) FROM quarantine GROUP BY 1")
        }

    def counts(self) -> dict[str, int]:
        """Row counts of the main tables (health and tests)."""
        out: dict[str, int] = {}
        for table in ("records", "inputs", "quarantine", "placement_state", "statements"):
            out[table] = int(self._rows(f"SELECT count(*) FROM {table}")[0][0])
        out["dropped"] = int(self._rows("SELECT coalesce(sum(count), 0) FROM dropped")[0][0])
        return out

    # ---- statements and checkpoints -----------------------------------------------------------

    def statement(self, placement_id: str, through_index: int) -> bytes | None:
        """The stored statement envelope through ``through_index``, if one was issued."""
        rows = self._rows(
            "SELECT envelope FROM statements WHERE placement_id = ? AND through_index = ?",
            [placement_id, through_index],
        )
        return bytes(rows[0][0]) if rows else None

    def statements(self, placement_id: str) -> list[tuple[int, bytes, bool, int, int, int]]:
        """(through_index, envelope, final, buyer_owes, operator_receives, desk_receives)."""
        return [
            (int(i), bytes(e), bool(f), int(b), int(o), int(d))
            for i, e, f, b, o, d in self._rows(
                "SELECT through_index, envelope, final, buyer_owes_minor, "
                "operator_receives_minor, desk_receives_minor FROM statements "
                "WHERE placement_id = ? ORDER BY through_index",
                [placement_id],
            )
        ]

    def add_statement(self, row: StatementRow) -> None:
        """Store one statement (its own transaction; replaces one through the same index)."""
        with self._lock:
            self._con.execute("BEGIN")
            try:
                self._append("statements", [_statement_tuple(row)], upsert=True)
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def add_attestations(
        self, statements: Sequence[StatementRow], checkpoints: Sequence[tuple[str, int, str]]
    ) -> None:
        """Store many statements and (placement_id, size, note) checkpoints in one
        transaction; a checkpoint already stored for the same size is kept (it may carry
        cosignatures), a statement through the same index is replaced (same bytes)."""
        with self._lock:
            self._con.execute("BEGIN")
            try:
                self._append("statements", [_statement_tuple(r) for r in statements], upsert=True)
                if checkpoints:
                    self._con.execute(
                        "INSERT INTO checkpoints SELECT unnest(?), unnest(?), unnest(?) "
                        "ON CONFLICT DO NOTHING",
                        [
                            [c[0] for c in checkpoints],
                            [c[1] for c in checkpoints],
                            [c[2] for c in checkpoints],
                        ],
                    )
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def statement_heads(self) -> set[tuple[str, int]]:
        """(placement_id, through_index) of every stored statement."""
        return {
            (str(p), int(i))
            for p, i in self._rows("SELECT placement_id, through_index FROM statements")
        }

    def checkpoint_sizes(self) -> set[tuple[str, int]]:
        """(placement_id, size) of every stored checkpoint."""
        return {
            (str(p), int(n)) for p, n in self._rows("SELECT placement_id, size FROM checkpoints")
        }

    def dropped_counts(self) -> dict[str, int]:
        """placement_id -> inputs dropped as exact re-deliveries (placements with any)."""
        return {str(p): int(n) for p, n in self._rows("SELECT placement_id, count FROM dropped")}

    def checkpoint(self, placement_id: str, size: int) -> str | None:
        """The stored note of the checkpoint at ``size``, with every cosignature so far."""
        rows = self._rows(
            "SELECT note FROM checkpoints WHERE placement_id = ? AND size = ?",
            [placement_id, size],
        )
        return str(rows[0][0]) if rows else None

    def checkpoints(self, placement_id: str) -> list[tuple[int, str]]:
        """(size, note) of every stored checkpoint of the placement."""
        return [
            (int(s), str(n))
            for s, n in self._rows(
                "SELECT size, note FROM checkpoints WHERE placement_id = ? ORDER BY size",
                [placement_id],
            )
        ]

    def put_checkpoint(self, placement_id: str, size: int, note: str, *, replace: bool) -> str:
        """Store the note of the checkpoint at ``size``; return the note now stored.

        ``replace=False`` keeps a note already stored (it may carry cosignatures);
        ``replace=True`` overwrites it (a cosignature was merged in).
        """
        conflict = "DO UPDATE SET note = excluded.note" if replace else "DO NOTHING"
        with self._lock:
            self._con.execute(
                f"INSERT INTO checkpoints VALUES (?, ?, ?) ON CONFLICT {conflict}",
                [placement_id, size, note],
            )
            return present(self.checkpoint(placement_id, size), "checkpoint just stored")

    # ---- closes the ledger publishes ------------------------------------------------------------

    def add_closes(self, closes: Sequence[tuple[str, bytes]]) -> None:
        """Record closes to publish, ``(placement_id, envelope)`` each, in one transaction; a
        placement that already has one keeps it (the earlier close wins, here and in
        ``closes``), as does the first of two for one placement in ``closes``.

        Written before they are published, so a restart republishes the same bytes (the
        fold drops the copy as a duplicate) instead of a second close with another time.
        One transaction for every close due at once: one write-ahead-log commit instead of
        one per placement (a close alone cost ~4 ms of CPU)."""
        first: dict[str, bytes] = {}
        for placement_id, envelope in closes:
            first.setdefault(placement_id, envelope)
        if not first:
            return
        with self._lock:
            self._con.execute(
                "INSERT INTO closes SELECT unnest(?), unnest(?), false ON CONFLICT DO NOTHING",
                [list(first), list(first.values())],
            )

    def unpublished_closes(self) -> list[tuple[str, bytes]]:
        """Closes recorded but not known to be published, in placement order."""
        return [
            (str(p), bytes(e))
            for p, e in self._rows(
                "SELECT placement_id, envelope FROM closes WHERE NOT published ORDER BY 1"
            )
        ]

    def closes_recorded(self) -> set[str]:
        """Placements for which this ledger has recorded a close."""
        return {str(r[0]) for r in self._rows("SELECT placement_id FROM closes")}

    def mark_closes_published(self, placement_ids: Iterable[str]) -> None:
        """Note that these closes reached the stream."""
        ids = sorted(placement_ids)
        if not ids:
            return
        with self._lock:
            self._con.execute(
                "UPDATE closes SET published = true WHERE list_contains(?, placement_id)", [ids]
            )

    # ---- reads -------------------------------------------------------------------------------

    def _rows(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._con.execute(sql, params or []).fetchall()

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read-only SQL query under the store's lock (exports, diagnostics)."""
        return self._rows(sql, params)


def _utc(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
