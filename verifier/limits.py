"""Every named maximum of the verifier, in one place.

The verifier reads files it must not trust: every batch, queue and list it keeps has a
bound here, so a hostile or huge export costs bounded memory.
"""

from __future__ import annotations

from typing import Final

# Findings kept per rule id; every finding is still counted (a tampered export can produce
# one finding per row, and a million identical lines help nobody).
MAX_FINDINGS_PER_RULE: Final = 20

# Chain indices read from DuckDB per batch (every table is read by chain_index range, so
# memory is bounded by this many rows per table, whatever the export's size). Also the
# window of rows the main process reads again for findings (``walk._rows_of``).
CHAIN_BATCH_INDICES: Final = 2048

# Envelopes per task sent to a signature worker: large enough to amortise the hand-off,
# small enough that both workers stay busy until the end.
OPEN_CHUNK_ROWS: Final = 512

# Batches in flight between the DuckDB reader and the workers (bounds memory: each batch
# holds at most CHAIN_BATCH_INDICES input rows and as many record rows).
MAX_BATCHES_IN_FLIGHT: Final = 4

# Allocations between two young-generation garbage collections during the pass (Python's
# default is 700). The pass allocates and frees millions of short-lived tuples and Structs,
# almost none of them in reference cycles; at the default, collections that find nothing
# cost about a quarter of the main thread's CPU (bench/verifier_1m.py). At 20,000 they
# still cost 4-6 % of the pass's CPU (a 50k-event export, thread pool: ~10 collections of
# ~30 ms each, every one finding nothing: the rows in flight and in the work-table buffers
# are young); at 100,000, one of ~6 ms (bench/verifier_1m.py). Restored after the
# pass; the pool's worker processes keep it. Bounds the garbage a cycle may hold meanwhile.
GC_GEN0_THRESHOLD: Final = 100_000

# Below this many envelopes a worker pool costs more to start than it saves.
MIN_ROWS_FOR_POOL: Final = 20_000

# Memory DuckDB may use (buffer pool for the export and the scratch work tables) before it
# evicts or spills to the scratch directory.
DUCKDB_MEMORY_LIMIT: Final = "512MB"

# Memory each worker process's own read-only connection to the export may use (process
# pool: the workers read their chain-index ranges themselves, ``verifier/walk.py``).
WORKER_DUCKDB_MEMORY_LIMIT: Final = "64MB"

# Exports of at most this many bytes get their work tables in memory and their SQL on one
# thread, on the process's warm database (``verifier/source.py``,
# ``verifier/small_export_db.py``): a placement of up to a few hundred records is a ~2.4 MB
# file (DuckDB gives each table its own blocks), one of 50 000 usage events 57 MB
# (bench/verifier_1m.py), so this is a few thousand events. A setting, not a bound:
# memory_limit and the spill directory bound both kinds alike.
SMALL_EXPORT_BYTES: Final = 8 * 1024 * 1024

# Chain-index rows (ledger_records' and the input tables' together) a small export's
# plain shape is taken from in Python (``ExportSource._count_with_shape``): an honest
# small export has a few hundred, the largest ~2 per usage event; a file holding more is
# asked for the aggregates in SQL instead, its rows never read into memory.
SHAPE_ROWS_MAX: Final = 40_000

# Exports one warm database serves before it is closed and a new one made
# (``verifier/small_export_db.py``): its process's RSS grew ~2 MiB per 100 small exports on one
# database (DuckDB's native memory, not the Python heap), flat when each had its own;
# a new database costs ~14 ms of CPU, 0.05 ms per export at this count.
WARM_DATABASE_MAX_EXPORTS: Final = 256

# Rows fetched at once from small tables (terms, bindings, statements, checkpoints).
SMALL_TABLE_FETCH_ROWS: Final = 1024

# Rows of the small tables we process at all: more is a finding, not a memory blow-up.
MAX_SMALL_TABLE_ROWS: Final = 100_000

# Characters of a meta value (key or value) read from an export: read one past the bound, a
# longer one makes the export unusable (EXPORT.md "A closed file"); honest ones are < 100.
MAX_META_VALUE_CHARS: Final = 4096

MAX_PROOF_BYTES: Final = 1024 * 1024
# A witness's state file read for its last cosigned note (``verify --witness-state``): the
# bound its witness writes it within.
MAX_WITNESS_STATE_BYTES: Final = 512 * 1024 * 1024
MAX_RECORD_FILE_BYTES: Final = 512 * 1024

# Exports read from one directory in one run.
MAX_EXPORTS_PER_RUN: Final = 10_000
# Exports ``python -m verifier`` hands to ``verify_exports`` at a time (the small ones'
# obligation priced in one SQL pass; the rows it keeps for that are held in Python for
# the batch): what the trace replay's workers use too.
VERIFY_BATCH_EXPORTS: Final = 32

# Rows of per-index mismatches fetched from SQL per compared column.
MAX_MISMATCH_ROWS: Final = MAX_FINDINGS_PER_RULE

# Refresh period of the progress bar on a terminal.
PROGRESS_INTERVAL_S: Final = 0.5
