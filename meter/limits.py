"""Every named maximum of the node agent, in one place.

The agent never grows without bound: the spool has a byte limit (in
``transport/limits.py``, with the spool; a full spool stops the agent, it never drops
signed data), every retry has a ceiling, every loop a count.
"""

from __future__ import annotations

from typing import Final

from proto import limits as proto_limits

# ---- agent --------------------------------------------------------------------------

DEFAULT_INTERVAL_MS: Final = 60_000
"""Default usage interval: one event per (node, placement) per minute."""

MIN_INTERVAL_MS: Final = 1
"""Shortest interval accepted (tests run many intervals per second)."""

MAX_INTERVAL_MS: Final = proto_limits.MAX_INTERVAL_MS
"""Longest interval: what SPEC accepts for one event (one day)."""

MAX_EVENTS_PER_TICK: Final = 10_000
"""Events one tick may emit in total (catching up a long simulated jump): the rest waits
for the next tick, so one tick's batch and its memory stay bounded."""

SPOOL_SEAL_ACKED_BYTES: Final = 256 * 1024
"""In Kafka mode, once everything spooled is acknowledged and the segment being written
holds at least this many bytes, the agent seals it so it is garbage-collected with the
others: acknowledged bytes a spool keeps stay below this bound, not below a whole segment
(``transport.limits.DEFAULT_SEGMENT_MAX_BYTES``, 16 MiB), which a node with few placements
never fills in weeks."""

MAX_HANDED_OFF: Final = 20_000
"""Events an agent keeps for the shipper of its spool in the same process
(``Agent.hand_off``): spooled, not yet read by that shipper (~0.5 KB each: the record and
its input hash, not the envelope). Beyond it the oldest are dropped and the shipper opens
those envelopes itself (only its CPU differs). A replay node's day of events fits."""

MAX_STREAMS: Final = 4096
"""(node, placement) streams one agent meters at once (placements whose terms it holds)."""

MAX_TERMS_FILES: Final = 4096
"""Terms files named in one meter.toml."""

# ---- shipper ------------------------------------------------------------------------

SHIP_BATCH_MAX_RECORDS: Final = 2000
"""Records read from the spool and sent before one acknowledgement is recorded."""

SHIP_BACKOFF_INITIAL_S: Final = 0.1
"""First pause after a failed send; doubled on each consecutive failure."""

SHIP_BACKOFF_MAX_S: Final = 5.0
"""Ceiling of the pause between two attempts while Kafka is unreachable."""

SHIP_IDLE_POLL_S: Final = 0.05
"""How often an idle shipper looks for new records in the spool."""

SHIP_DRAIN_TIMEOUT_S: Final = 60.0
"""On a clean stop, the longest wait for the spool to drain into Kafka."""

SIGNAL_DRAIN_TIMEOUT_S: Final = 5.0
"""After SIGTERM/SIGINT, the longest wait for the spool to drain (a second signal stops
at once): what is left stays in the spool, and the next start ships it."""

PRODUCER_STOP_TIMEOUT_S: Final = 10.0
"""Longest wait for a producer to stop (it may be flushing to a dead broker)."""

STATS_LOG_INTERVAL_S: Final = 60.0
"""How often the running agent logs its counters."""
