"""The store's schema: its format and version, the tables and views, the store's errors."""

from __future__ import annotations

from typing import Final

from proto.records import Totals

STORE_FORMAT: Final = "gridledger-ledger-store"

# The store file's name as a database of the store's connection (``Store.__init__``).
STORE_ALIAS: Final = "gridledger_store"
STORE_VERSION: Final = "5"

# The totals the store keeps as columns: those of version 1. Totals appended later with a
# default (SPEC §7.9 release_charge_minor) live in the signed record only, so the store's
# schema (and stores written before them) stay as they are.
TOTALS_FIELDS: Final[tuple[str, ...]] = tuple(Totals.__struct_fields__)[:13]
_N_TOTALS: Final = len(TOTALS_FIELDS)

# The rows of one placement in records/inputs; parameters: placement_id and its commit
# range (``Store.commit_range``). See the docstring of ``ledger.store.store``.
PLACEMENT_ROWS: Final = "placement_id = ? AND commit_no BETWEEN ? AND ?"

# Running totals after each record, as columns "total_<field>" (the record's own
# delivered_mgms has a column of its own).
TOTALS_COLUMNS: Final[tuple[str, ...]] = tuple(f"total_{name}" for name in TOTALS_FIELDS)
_TOTALS_COLUMNS: Final = ",\n    ".join(f"{name} BIGINT NOT NULL" for name in TOTALS_COLUMNS)

# How ``record_rows`` and ``input_rows`` keep an envelope (on disk): its payload as
# bytes, not base64 inside JSON (which DuckDB compresses poorly), and its signatures: the
# one signature as (keyid, sig), else ``signatures``, the canonical JSON text of the list
# (``[]`` for a LedgerRecord, SPEC §8; several for terms). Only canonical envelopes are
# kept so (every row was opened by ``open_envelope``, which requires canonical bytes), so
# ENVELOPE_SQL rebuilds each byte for byte: the canonical JSON of ``Envelope(payload,
# signatures)`` (proto.envelope), sorted keys, standard padded base64, no whitespace.
# Tables whose rows may be non-canonical (quarantine) keep the raw bytes.
_ENVELOPE_COLUMNS: Final = (
    "payload BLOB NOT NULL,\n    keyid VARCHAR,\n    sig BLOB,\n    signatures VARCHAR"
)
ENVELOPE_SQL: Final = (
    """encode('{"payload":"' || to_base64(payload) || '","signatures":' || """
    """CASE WHEN sig IS NULL THEN signatures """
    """ELSE '[{"keyid":"' || keyid || '","sig":"' || to_base64(sig) || '"}]' END || '}')"""
)

SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS record_rows (
    placement_id VARCHAR NOT NULL,
    chain_index BIGINT NOT NULL,
    {_ENVELOPE_COLUMNS},
    record_hash VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    delivered_mgms BIGINT NOT NULL,
    {_TOTALS_COLUMNS},
    commit_no BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS input_rows (
    placement_id VARCHAR NOT NULL,
    chain_index BIGINT NOT NULL,
    position VARCHAR NOT NULL,
    input_hash VARCHAR NOT NULL,
    payload_hash VARCHAR NOT NULL,
    {_ENVELOPE_COLUMNS},
    kind VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    node_id VARCHAR,
    seq BIGINT,
    start_ms BIGINT,
    end_ms BIGINT,
    valid_from_ms BIGINT,
    valid_until_ms BIGINT,
    issued_at_ms BIGINT,
    effective_at_ms BIGINT,
    direction VARCHAR,
    amount_minor BIGINT,
    closed_at_ms BIGINT,
    commit_no BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS quarantine (
    position VARCHAR NOT NULL,
    input_hash VARCHAR NOT NULL,
    size_bytes BIGINT NOT NULL,
    envelope BLOB NOT NULL,
    reason VARCHAR NOT NULL,
    detail VARCHAR NOT NULL,
    placement_id VARCHAR
);
CREATE TABLE IF NOT EXISTS placement_commits (
    placement_id VARCHAR PRIMARY KEY,
    first_commit BIGINT NOT NULL,
    last_commit BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS dropped (
    placement_id VARCHAR PRIMARY KEY,
    count BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS placement_state (
    placement_id VARCHAR PRIMARY KEY,
    snapshot BLOB NOT NULL,
    closed BOOLEAN NOT NULL,
    close_due_ms BIGINT
);
CREATE TABLE IF NOT EXISTS statements (
    placement_id VARCHAR NOT NULL,
    through_index BIGINT NOT NULL,
    head VARCHAR NOT NULL,
    envelope BLOB NOT NULL,
    final BOOLEAN NOT NULL,
    buyer_owes_minor BIGINT NOT NULL,
    operator_receives_minor BIGINT NOT NULL,
    desk_receives_minor BIGINT NOT NULL,
    PRIMARY KEY (placement_id, through_index)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    placement_id VARCHAR NOT NULL,
    size BIGINT NOT NULL,
    note VARCHAR NOT NULL,
    PRIMARY KEY (placement_id, size)
);
CREATE TABLE IF NOT EXISTS closes (
    placement_id VARCHAR PRIMARY KEY,
    envelope BLOB NOT NULL,
    published BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS offsets (source VARCHAR PRIMARY KEY, position VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS held_inputs (
    placement_id VARCHAR NOT NULL,
    position VARCHAR NOT NULL,
    arrived_ms BIGINT,
    raw BLOB,
    node_id VARCHAR,
    seq BIGINT,
    ordinal BIGINT
);
CREATE TABLE IF NOT EXISTS placement_seen (
    placement_id VARCHAR NOT NULL,
    input_hash VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS capacity_claims (
    scope VARCHAR NOT NULL,
    uuid VARCHAR NOT NULL,
    placement_id VARCHAR NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT NOT NULL,
    share_milli BIGINT NOT NULL,
    PRIMARY KEY (scope, uuid, placement_id)
);
"""

# ``records`` and ``inputs``: views with the columns (and column order) of the tables of
# store version 2, ``envelope`` rebuilt by ENVELOPE_SQL, then ``payload``. Every reader
# selects from them; the batch writes the tables below them.
_RECORD_VIEW_COLUMNS: Final = (
    "placement_id",
    "chain_index",
    f"{ENVELOPE_SQL} AS envelope",
    "record_hash",
    "kind",
    "status",
    "reason",
    "delivered_mgms",
    *TOTALS_COLUMNS,
    "commit_no",
    "payload",
)
# The columns of ``input_rows``, in order.
INPUT_COLUMNS: Final[tuple[str, ...]] = (
    "placement_id",
    "chain_index",
    "position",
    "input_hash",
    "payload_hash",
    "payload",
    "keyid",
    "sig",
    "signatures",
    "kind",
    "status",
    "reason",
    "node_id",
    "seq",
    "start_ms",
    "end_ms",
    "valid_from_ms",
    "valid_until_ms",
    "issued_at_ms",
    "effective_at_ms",
    "direction",
    "amount_minor",
    "closed_at_ms",
    "commit_no",
)
# The view's columns from the table's: the stored envelope's columns become ``envelope``
# where the version-2 table had it, ``payload`` follows at the end.
_INPUT_VIEW_COLUMNS: Final = (
    *(
        f"{ENVELOPE_SQL} AS envelope" if column == "payload" else column
        for column in INPUT_COLUMNS
        if column not in ("keyid", "sig", "signatures")
    ),
    "payload",
)
VIEWS: Final = f"""
CREATE VIEW IF NOT EXISTS records AS SELECT {", ".join(_RECORD_VIEW_COLUMNS)} FROM record_rows;
CREATE VIEW IF NOT EXISTS inputs AS SELECT {", ".join(_INPUT_VIEW_COLUMNS)} FROM input_rows;
"""


class StoreError(Exception):
    """The store cannot be used (wrong format, another ledger's key, locked by a writer)."""


class StoreLocked(StoreError):
    """Another process (a running ledger) holds the store's DuckDB lock."""
