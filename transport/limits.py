"""Every named maximum of the transport (the spool and Kafka sends), in one place."""

from __future__ import annotations

from typing import Final

from proto import limits as proto_limits

# ---- spool --------------------------------------------------------------------------

MAX_RECORD_BYTES: Final = proto_limits.MAX_ENVELOPE_BYTES
"""Largest record a spool writer accepts by default: one envelope at its wire limit."""

INTAKE_ENTRY_OVERHEAD_BYTES: Final = 1024
"""Room an intake-log entry (``transport.intake``) needs beside the spool record it
carries: the spool's name (at most 255 bytes, a file name), its positions, the arrival
time, and the msgpack framing of those fields."""

MAX_FRAME_RECORD_BYTES: Final = MAX_RECORD_BYTES + INTAKE_ENTRY_OVERHEAD_BYTES
"""Largest record any frame may hold (what readers accept): a spool record wrapped in an
intake-log entry."""

INTAKE_MAX_BYTES: Final = 256 * 1024**3
"""Bound on the bytes of the ledger's intake log (256 GiB). It is the embedded
transport's partition and is never trimmed (infinite retention, like the topic); at
~1 KiB per input it holds ~250 million inputs. Past it the intake stops with an error
and the ledger folds what the log holds."""

MAX_READ_FILE_BYTES: Final = 16 * 1024 * 1024
"""Largest READ file (``transport.intake``: the ledger's read position of every spool,
~30 bytes a spool: room for ~500,000 spools) a spool's writer reads back; a larger one
is not read and nothing is collected."""

DEFAULT_SPOOL_MAX_BYTES: Final = 1024 * 1024 * 1024
"""Default bound on the bytes of all segment files of one spool (1 GiB).

At one event per minute per placement of ~1 KiB this holds years of events; segments
are deleted once acknowledged (Kafka) or read into the ledger's intake log (embedded
transport), so the bound only matters during a long outage.
"""

DEFAULT_SEGMENT_MAX_BYTES: Final = 16 * 1024 * 1024
"""A segment file is closed (sealed) and a new one started past this size (16 MiB).

A soft limit: one append never spans two files, so a segment can exceed it by one batch.
"""

MIN_SEGMENT_MAX_BYTES: Final = 4096
"""Smallest segment size accepted (tests use small segments to exercise rotation)."""

LOCAL_SEAL_READ_BYTES: Final = 256 * 1024
"""``publish_local``: the segment being written of a publisher's or a ledger's spool is
sealed and deleted once every ledger has read it and it holds this many bytes (256 KiB,
the meter's SPOOL_SEAL_ACKED_BYTES); below it, it stays."""

SPOOL_LOCK_WAIT_S: Final = 10.0
"""How long ``publish_local`` waits for another writer to release a spool directory."""

SPOOL_LOCK_POLL_S: Final = 0.05
"""Pause between two attempts to take a spool lock while waiting for it."""

# ---- Kafka --------------------------------------------------------------------------

SHIP_ATTEMPT_TIMEOUT_S: Final = 30.0
"""Longest wait for one batch to be acknowledged (or a producer to start) before the
producer is torn down and the batch resent."""
