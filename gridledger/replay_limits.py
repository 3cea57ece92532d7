"""Every named maximum and default of the trace replay, in one place.

The replay reads a trace it did not write, so every file, row and loop has a bound; and
it runs a whole cluster on one machine, so every buffer it fills has one too.
"""

from __future__ import annotations

from typing import Final

MAX_TRACE_NODES: Final = 100_000
"""Rows of a node list (OpenB has 1,213)."""

MAX_TRACE_TASKS: Final = 1_000_000
"""Rows of a task list (OpenB has 8,152)."""

MAX_TRACE_ROW_CHARS: Final = 4096
"""Characters of one CSV row: a longer row is not a trace row, it is refused."""

TRACE_EPOCH_MS: Final = 1_767_225_600_000
"""Second 0 of the trace, as a time of the replay: 2026-01-01T00:00:00Z."""

DEFAULT_INTERVAL_S: Final = 60
"""Default usage interval of the replayed node agents (one event per minute)."""

STEP_MS: Final = 24 * 3_600_000
"""Simulated time per replay step: the agents tick to the step's end, the events are
handed to the transport, the ledger catches up and closes what is due. Larger steps mean
fewer fsyncs and rounds (a Kafka round costs ~0.5 s of polls and lag checks, measured);
smaller ones fewer events in flight (at 60 s intervals the OpenB peak is ~75k per day)."""

MAX_AGENT_TICKS_PER_STEP: Final = 100_000
"""Ticks of one agent in one step (each emits at most meter's MAX_EVENTS_PER_TICK): a bound
on the loop far above what a step of the longest trace needs."""

SEND_WINDOW_RECORDS: Final = 20_000
"""Records one node's shipper sends before it waits for their acknowledgements (its batch)."""

MAX_BUYERS: Final = 64
"""Buyers a replay may spread placements over (the default is 4)."""

LEDGER_IDLE_POLL_MS: Final = 20
"""Kafka poll wait once the ledger has caught up (the replay knows more is not coming)."""

LEDGER_STEP_DEADLINE_S: Final = 1_800.0
"""Longest the ledger may take to catch up with one step's records through Kafka."""

MAX_LEDGER_STEPS_AHEAD: Final = 2
"""Steps a Kafka replay's agents may be ahead of its ledger process (acknowledged by
Kafka, not yet folded): the agents of step k+1 run while the ledger folds step k."""

MAX_LEDGER_LAG_EVENTS: Final = 200_000
"""Records a Kafka replay's agents may be ahead of its ledger process, beyond one step
(~2.5 OpenB peak days at 60 s intervals): the lag is bounded in events, not only steps."""

LEDGER_PROCESS_EXIT_S: Final = 60.0
"""Longest wait for a replay's ledger process to end once told to stop (or terminated)."""

UNPLACEABLE_SHOWN: Final = 20
"""Unplaceable task ids printed in the human report (the JSON report lists them all)."""

VERIFY_WORKERS: Final = 2
"""Processes verifying exports while the replay writes the next ones (one per core)."""

VERIFY_POOL: Final = "inline"
"""How each of those processes opens a big export's envelopes: in its own thread
(``verifier.workers.OpenPool``), not the thread pool ``python -m verifier`` uses. The
replay's cores are full (agents, broker, ledger, two verifiers): a thread pool's
hand-overs of the GIL cost CPU without a free core to gain wall time on. A 50k-event
export (bench/verifier_1m.py): 112-121 us of CPU per usage event inline
against 123-168 with two threads."""

EXPORT_CHUNK: Final = 64
"""Placements exported by one ``export_all`` call at the end of a replay: statements and
checkpoints issued set-wise, two writer threads; the replay holds one chunk's results."""

MAX_VERIFY_IN_FLIGHT: Final = 2 * EXPORT_CHUNK
"""Exports handed to the verifier workers and not yet reported back: the verifier may lag
the exports by up to two chunks, so the writers rarely wait for it."""

PROGRESS_EVERY_S: Final = 5.0
"""Wall seconds between two progress lines of a replay (each also after the last step)."""
