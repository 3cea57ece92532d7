"""The verifier's work tables, filled during the single pass (DDL in ``verifier/pricing.py``).

Rows from DECODED envelopes only, and only for inputs the verifier's own referee accepted.
The hot tables (usage, samples, records) are buffered and appended once per batch; the
rare ones (reclaim, close, adjustments) are inserted as they come. Which tables hold a
row, and the highest record index, are kept here as they are written: a small export's
checklist pays more for a statement's planning than for its rows, so what Python already
knows is not asked of DuckDB (bench/verify_small.py).
"""

from __future__ import annotations

from typing import Any, Final

from verifier.pricing import TOTAL_FIELDS

# During the pass the hot buffers are appended once they hold this many rows (``spill``),
# not after every batch: each append costs ~0.5-1 ms whatever its size.
SPILL_ROWS: Final = 8192
# A buffer of at least this many rows goes to its table as columns (``_insert_columns``):
# one INSERT from numpy arrays costs ~1 ms more than an appender's flush, and ~1 us less
# per row of w_records, ~0.5-1 of w_usage and w_samples (bench/verifier_1m.py).
# Fewer rows (small exports) keep the appender.
COLUMNS_MIN_ROWS: Final = 1024
# Each hot table's columns as they travel to DuckDB: "i" BIGINT (a numpy int64 array),
# "b" BOOLEAN (numpy bool), "s" VARCHAR (Python objects). The tables' DDL is in
# ``verifier/pricing.py``.
_KINDS: Final = {
    "w_usage": "isisii",
    "w_samples": "isbbibiibbib",
    "w_records": "isi" + "i" * len(TOTAL_FIELDS),
}


class WorkTables:
    """Appenders and per-batch buffers for ``w_usage``, ``w_samples`` and ``w_records``."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.usage: list[tuple[Any, ...]] = []
        self.samples: list[tuple[Any, ...]] = []
        self.records: list[tuple[Any, ...]] = []
        # SPEC §7.10: each record's resale entries (chain_index, ord, id, buyer, D, B, G, F)
        self.resale: list[tuple[Any, ...]] = []
        # Each table's appender, made when it first has rows to append (~0.4 ms each;
        # most exports never fill w_resale_rec).
        self._appenders: dict[str, Any] = {}
        # The work tables that hold a row (``note``, ``flush``); the highest chain index
        # appended to w_records (None: none).
        self.filled: set[str] = set()
        self.max_record_index: int | None = None
        # Every row written to the tables the obligation's SQL reads, by table, when the
        # run may defer its pricing to a batch (``keeping``; ``verify_exports``), else None.
        self.kept: dict[str, list[tuple[Any, ...]]] | None = None

        # Tables whose rows are only kept, not written, while the pricing may be deferred:
        # no SQL reads them before it (``write_held`` writes them when it is not).
        self.held: frozenset[str] = frozenset()
        # (node_id, seq) -> record hash of the kept w_usage rows indexed so far (the first
        # ``_usage_indexed``): ``usage_record_hash`` while w_usage is held, linear overall.
        self._usage_index: dict[tuple[Any, Any], str] = {}
        self._usage_indexed = 0

    def keeping(self, hold: frozenset[str] = frozenset()) -> None:
        """From now on keep a copy of every row written (``kept``); the rows of ``hold``
        only kept, until ``write_held``."""
        self.kept = {}
        self.held = hold

    def keep(self, table: str, row: tuple[Any, ...]) -> None:
        """``row`` was inserted into ``table`` (kept when ``keeping``)."""
        if self.kept is not None:
            self.kept.setdefault(table, []).append(row)

    def insert(self, table: str, row: tuple[Any, ...]) -> None:
        """One row into a rare table (an INSERT; kept, and only kept while held)."""
        if table not in self.held:
            self.con.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", list(row))
        self.keep(table, row)

    def write_held(self) -> None:
        """Write the rows held back (the pricing is not deferred after all), as they
        would have been written, in their order."""
        self.flush()
        held, self.held = self.held, frozenset()
        for table in sorted(held):
            rows = (self.kept or {}).get(table)
            if rows:
                app = self._appenders.get(table)
                if app is None:
                    app = self._appenders[table] = self.con.appender(table)
                app.append_rows(rows)
                app.flush()
                self.filled.add(table)

    def note(self, table: str) -> None:
        """``table`` now holds a row (an INSERT of the caller's)."""
        self.filled.add(table)

    def spill(self) -> None:
        """``flush`` once a hot buffer holds SPILL_ROWS rows (the pass calls it per batch;
        whatever reads a work table calls ``flush`` first)."""
        if (
            len(self.usage) >= SPILL_ROWS
            or len(self.samples) >= SPILL_ROWS
            or len(self.records) >= SPILL_ROWS
        ):
            self.flush()

    def flush(self) -> None:
        """Append what the buffers hold (one call per table)."""
        if self.records:
            top = max(row[0] for row in self.records)  # the row's chain_index
            if self.max_record_index is None or top > self.max_record_index:
                self.max_record_index = top
        for table, buffer in (
            ("w_usage", self.usage),
            ("w_samples", self.samples),
            ("w_records", self.records),
            ("w_resale_rec", self.resale),
        ):
            if buffer:
                if self.kept is not None:
                    self.kept.setdefault(table, []).extend(buffer)
                if table in self.held:
                    buffer.clear()
                    continue
                if len(buffer) >= COLUMNS_MIN_ROWS and self._insert_columns(table, buffer):
                    buffer.clear()
                    self.filled.add(table)
                    continue
                app = self._appenders.get(table)
                if app is None:
                    app = self._appenders[table] = self.con.appender(table)
                app.append_rows(buffer)
                app.flush()
                buffer.clear()
                self.filled.add(table)

    def _insert_columns(self, table: str, rows: list[tuple[Any, ...]]) -> bool:
        """Append ``rows`` to ``table`` as one INSERT from numpy arrays, as
        ``ledger/store/store.py`` writes its batches; False (nothing written) when the table
        has no column kinds here or a column's values are not all of its kind (the appender
        then writes them, as before: a NULL, say, or an int beyond BIGINT)."""
        kinds = _KINDS.get(table)
        if kinds is None:
            return False
        import numpy  # only for big exports' buffers: most verifications never need it

        data: dict[str, Any] = {}
        for k, (kind, values) in enumerate(zip(kinds, zip(*rows, strict=True), strict=True)):
            if kind == "s":
                if not all(type(v) is str for v in values):
                    return False
                column = numpy.array(values, dtype=object)
            else:
                # numpy picks the dtype from the values: int64 only when every one is an
                # int in range, bool only when every one is a bool (None: object)
                column = numpy.array(values)
                if column.dtype != (numpy.int64 if kind == "i" else numpy.bool_):
                    return False
            data[f"c{k}"] = column
        view = f"_columns_{table}"
        self.con.register(view, data)
        try:
            self.con.execute(f"INSERT INTO {table} SELECT * FROM {view}").fetchall()
        finally:
            self.con.unregister(view)
        return True

    def usage_record_hash(self, node_id: str, seq: int) -> str | None:
        """The record hash of the accepted usage event (node_id, seq), if any (from the
        rows kept while w_usage is held back, else from the table)."""
        self.flush()
        if "w_usage" in self.held:
            kept = (self.kept or {}).get("w_usage", [])
            # rows (chain_index, node_id, seq, record_hash, ...): each (node, seq) once
            for usage in kept[self._usage_indexed :]:
                self._usage_index.setdefault((usage[1], usage[2]), str(usage[3]))
            self._usage_indexed = len(kept)
            return self._usage_index.get((node_id, seq))
        rows = self.con.execute(
            "SELECT record_hash FROM w_usage WHERE node_id = ? AND seq = ? LIMIT 1", [node_id, seq]
        ).fetchall()
        row = rows[0] if rows else None
        return None if row is None else str(row[0])
