"""The ledger's DuckDB store (one writer): ``Store`` and what one batch writes.

* ``schema``: the store's format and version, its tables and views, its errors;
* ``rows``: what one batch writes (``Batch`` and its rows) and the table rows they become;
* ``migrate``: older store versions brought to this one in place on open;
* ``store``: ``Store``, the connection, the batch's one transaction, the reads.

Importers use this package's names; the modules are its seams, not its face.
"""

from ledger.store.rows import (
    Batch,
    ChainedRow,
    ChainHead,
    HeldRow,
    HeldSummary,
    QuarantineRow,
    StatementRow,
    StateRow,
)
from ledger.store.schema import (
    ENVELOPE_SQL,
    INPUT_COLUMNS,
    PLACEMENT_ROWS,
    SCHEMA,
    STORE_ALIAS,
    STORE_FORMAT,
    STORE_VERSION,
    TOTALS_COLUMNS,
    TOTALS_FIELDS,
    VIEWS,
    StoreError,
    StoreLocked,
)
from ledger.store.store import Store

__all__ = [
    "ENVELOPE_SQL",
    "INPUT_COLUMNS",
    "PLACEMENT_ROWS",
    "SCHEMA",
    "STORE_ALIAS",
    "STORE_FORMAT",
    "STORE_VERSION",
    "TOTALS_COLUMNS",
    "TOTALS_FIELDS",
    "VIEWS",
    "Batch",
    "ChainHead",
    "ChainedRow",
    "HeldRow",
    "HeldSummary",
    "QuarantineRow",
    "StateRow",
    "StatementRow",
    "Store",
    "StoreError",
    "StoreLocked",
]
