"""The verifier's work tables, filled during the single pass (DDL in ``verifier/pricing.py``).

Rows from DECODED envelopes only, and only for inputs the verifier's own referee accepted.
The hot tables (usage, samples, records) are buffered and appended once per batch; the
rare ones (reclaim, close, adjustments) are inserted as they come.
"""

from __future__ import annotations

from typing import Any


class WorkTables:
    """Appenders and per-batch buffers for ``w_usage``, ``w_samples`` and ``w_records``."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.usage: list[tuple[Any, ...]] = []
        self.samples: list[tuple[Any, ...]] = []
        self.records: list[tuple[Any, ...]] = []
        # SPEC §7.10: each record's resale entries (chain_index, ord, id, buyer, D, B, G, F)
        self.resale: list[tuple[Any, ...]] = []
        self._usage_app: Any = con.appender("w_usage")
        self._sample_app: Any = con.appender("w_samples")
        self._record_app: Any = con.appender("w_records")
        self._resale_app: Any = con.appender("w_resale_rec")

    def flush(self) -> None:
        """Append what the buffers hold (one call per table)."""
        for app, buffer in (
            (self._usage_app, self.usage),
            (self._sample_app, self.samples),
            (self._record_app, self.records),
            (self._resale_app, self.resale),
        ):
            if buffer:
                app.append_rows(buffer)
                app.flush()
                buffer.clear()

    def usage_record_hash(self, node_id: str, seq: int) -> str | None:
        """The record hash of the accepted usage event (node_id, seq), if any."""
        self.flush()
        rows = self.con.execute(
            "SELECT record_hash FROM w_usage WHERE node_id = ? AND seq = ? LIMIT 1", [node_id, seq]
        ).fetchall()
        row = rows[0] if rows else None
        return None if row is None else str(row[0])
