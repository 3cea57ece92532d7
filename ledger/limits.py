"""Every named maximum of the ledger service, in one place.

Wire limits (envelope sizes, held inputs per placement) live in ``proto.limits``; these
bound what the service itself buffers, waits for and keeps.
"""

from __future__ import annotations

from typing import Final

# Inputs consumed, folded and committed in one DuckDB transaction. Larger batches amortise
# the commit (~ms) and the appender flush; smaller ones bound the work redone after a crash.
DEFAULT_BATCH_MAX_RECORDS: Final = 5_000
MAX_BATCH_RECORDS: Final = 100_000

# How long one Kafka poll waits for data before the loop runs the closer again.
POLL_TIMEOUT_MS: Final = 200

# Quarantined bytes kept as evidence per input; anything longer is cut (the full size and
# the hash of the whole input are kept beside it).
MAX_QUARANTINE_BYTES: Final = 256 * 1024

# Free-text detail kept with a quarantined input.
MAX_DETAIL_CHARS: Final = 512

# Passes of ``run_until_idle`` (each consumes at most one batch per source): a bound on
# the loop, far above what any backlog of the local transport needs at the batch size.
MAX_IDLE_PASSES: Final = 10_000_000

# Publishing a ledger-signed close into the stream: attempts and the wait between them.
CLOSE_PUBLISH_ATTEMPTS: Final = 5
CLOSE_PUBLISH_BACKOFF_S: Final = 0.5

# HTTP API: largest request body accepted (a cosigned note), request read timeout.
MAX_HTTP_BODY_BYTES: Final = 64 * 1024
HTTP_TIMEOUT_S: Final = 30.0

# Client side of the HTTP API (CLI talking to a running ledger).
HTTP_CLIENT_TIMEOUT_S: Final = 60.0

# Batch latency histogram buckets (seconds).
BATCH_LATENCY_BUCKETS_S: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# Threads that check input signatures and sign records beside the fold (libsodium
# releases the GIL, so two threads use both cores of the reference machine).
CRYPTO_THREADS: Final = 2

# The Kafka service's signature checks run in one spawned worker process instead
# (ledger/crypto.py), the next batch's while this one folds and commits: signatures per
# chunk sent to it (the fold of a batch not checked ahead waits for its first chunk only,
# and checks the chunks the worker has not started itself).
CRYPTO_WORKER_CHUNK: Final = 500
# Longest wait for one chunk's checks (~55 us per signature: a chunk takes ~0.1 s); past
# it, or when the worker died, the batch fails with CryptoWorkerError, never hangs.
CRYPTO_WAIT_S: Final = 60.0
# Stopping the worker: how long the chunk it is running may take before it is killed.
CRYPTO_STOP_S: Final = 10.0
# The Kafka service polls the next batch before folding this one (its signatures then go
# to the worker while this batch folds): the longest wait for it; the fold then goes on.
POLL_AHEAD_MS: Final = 50
# Batches polled and opened ahead of the one folding (the next, and the one after it,
# opened while this one commits): what the Kafka service holds beyond its batch.
AHEAD_BATCHES: Final = 2

# DuckDB memory of the store (buffer pool); the file grows, the process does not.
STORE_MEMORY_LIMIT: Final = "512MB"
# Rows per row group of the store's tables (DuckDB's default is 122,880). A checkpoint
# (every ~16 MB of write-ahead log: ~15k inputs) rewrites the table's last, partly filled
# row group whole; with the default that is up to 8 checkpoints' rows again each time,
# with this size at most one. A layout setting of the ledger's connection (not kept in
# the file): the same rows, and zone maps per 16k rows (a placement's reads prune finer).
STORE_ROW_GROUP_ROWS: Final = 16_384

# `ledger run` waiting for an unreachable broker at start: attempts and backoff, then it
# exits 75 (EX_TEMPFAIL) for its supervisor to restart it.
START_ATTEMPTS: Final = 10
START_BACKOFF_INITIAL_S: Final = 0.5
START_BACKOFF_MAX_S: Final = 10.0

# `ledger supervise --shards N`: at most this many shard processes (and never more than
# the topic's partitions).
MAX_SHARDS: Final = 64

# `ledger supervise`: a shard process that dies is restarted after a backoff doubling from
# the initial delay up to the maximum; more than SUPERVISE_MAX_RESTARTS restarts of one
# shard within SUPERVISE_RESTART_WINDOW_S and the supervisor stops every shard and exits 1.
SUPERVISE_MAX_RESTARTS: Final = 5
SUPERVISE_RESTART_WINDOW_S: Final = 300.0
SUPERVISE_BACKOFF_INITIAL_S: Final = 0.5
SUPERVISE_BACKOFF_MAX_S: Final = 30.0
# How long a stopping supervisor waits for its shards after SIGTERM before SIGKILL.
SUPERVISE_STOP_TIMEOUT_S: Final = 60.0
# How long `supervise` waits for the topic's metadata (its partition count) at start.
SUPERVISE_METADATA_TIMEOUT_S: Final = 10.0

# SPEC §6.5 across shards: a shard deciding terms waits for its claim requests at most
# MAX_CAPACITY_WAIT_MS + MAX_CLOCK_SKEW_MS (its clock against the broker's) plus this
# margin, then stops with CapacityUnavailable (the input stays unfolded, nothing lost);
# while waiting past the deadline it publishes a tick to each undecided key at most this
# often; and it reads at most this many capacity records per poll.
CAPACITY_GIVE_UP_MARGIN_S: Final = 30.0
CAPACITY_TICK_INTERVAL_S: Final = 1.0
CAPACITY_POLL_RECORDS: Final = 1000

# ``export_all`` reads the rows of up to this many placements (and this many records) from
# the store with one query per table, then writes each placement's file from them; a
# larger placement is read alone, straight from the store as ``export_placement`` does.
# Bounds the rows a writer thread holds (~1-2 KB each, records and inputs together).
EXPORT_STAGE_PLACEMENTS: Final = 64
EXPORT_STAGE_RECORDS: Final = 20_000
# A placement read straight from the store is read this many chain indexes at a time (one
# query per page and table, each in chain order): DuckDB sorts a page, never a whole
# large placement (~1-2 KB a row), in the store's buffer pool that the fold shares.
EXPORT_PAGE_RECORDS: Final = 20_000
# Rows per row group of an export file written straight from the store (DuckDB's default
# is 122,880). DuckDB buffers the rows a transaction appends a few row groups at a time
# before writing them to the file: with ~1 KB rows, a placement of ~200k records then
# needs < 100 MB of the store's buffer pool, not ~250 MB (two at once ran the 512 MB pool
# out of memory), and its files are the same size within 2 %.
EXPORT_ROW_GROUP_ROWS: Final = 32_768

# ``attest_all`` (statements and checkpoints before ``export_all``) holds the leaf hashes
# (32 bytes each) of at most this many records of chains that need a checkpoint at once
# (a larger chain alone); everything else of a chain it reads is summed up by DuckDB.
ATTEST_LEAF_RECORDS: Final = 100_000

# DuckDB memory of each export writer thread's own database (``export_all``), which holds
# one chunk's rows and one export file at a time.
EXPORT_WRITER_MEMORY_LIMIT: Final = "256MB"

# Per batch, at most this many log lines name one quarantined input or one rejected terms
# input each (``input_quarantined``, ``terms_rejected``); the rest are counted, by event and
# reason, in one ``inputs_not_logged`` line at the batch's end. Every such input is still
# stored (quarantine table, chained record) and counted: a flood of bad input must not
# become a flood of log lines.
LOG_INPUT_LINES_PER_BATCH: Final = 32
