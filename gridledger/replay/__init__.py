"""`gridledger replay TRACE_DIR --workdir DIR`: a production GPU trace through the system.

    trace (CSV)  ->  plan (first-fit)  ->  keys + signed terms  ->  node agents (meter)
    ->  transport (local spools | Kafka)  ->  ledger (fold, close)  ->  exports  ->  verifier

1. Read the trace strictly (``gridledger.trace``) and compute its own GPU usage.
2. Plan one placement per GPU task that ran (``gridledger.placement_plan``).
3. Derive the keys from the seed, sign every placement's terms (``gridledger.replay_terms``),
   write ``DIR/trust.json``.
4. Step a simulated clock through the trace, ``STEP_MS`` at a time. Each step: publish the
   terms of the placements that start in it, tick every node agent
   (``gridledger.replay_cluster``) to the step's end, hand the events to the transport
   (local: the agents' spools are the transport; Kafka: sent keyed by placement and
   acknowledged, each stating the step's simulated time on a ``CreateTime`` topic to a
   ledger with ``arrival = "sender"``: the same arrival times as the local run's intake
   clock, SPEC §6.6), then let the ledger consume everything and close, at the step's end,
   each placement whose ``window_end + late_grace`` has passed.
5. Export every placement to ``DIR/exports/<placement>.duckdb`` and verify each export
   with the verifier against ``DIR/trust.json``; a verified export is then removed unless
   ``keep_exports`` (``--keep-exports``): the store holds everything and writes any
   placement's export again on demand (``gridledger ledger export``), and a failed one
   is kept for inspection. Over Kafka with the ledger in a process of its own (the
   default), this runs beside the steps: the ledger process exports each placement
   right after the step that closed it, the replay hands the export to the verifier's
   workers at once and counts the verdict when it comes; the replay process never opens
   the store.
6. Report: placements, events, delivered GPU-hours (total, by QoS, by GPU model), gross,
   fees and what each side owes or receives, the verdicts — and the trace's own GPU-hours
   computed from the CSV, which the delivered total must equal exactly.

The exact rule where interval boundaries cut a task: a placement's window is
[scheduled_time, deletion_time) of its task (seconds -> ms after 2026-01-01T00:00:00Z);
its node's agent emits one event per interval [start + k x I, min(start + (k + 1) x I,
end)) — the last interval is clipped at the window end — so the intervals tile the window
with nothing cut off and nothing counted twice, and with every GPU healthy and allocated
the delivered milli-GPU-ms are exactly num_gpu x gpu_milli x duration_ms.

Crash safety: kill the replay at any point and run it again with the same arguments and
workdir. Keys and terms are derived again (same bytes); agents recover their heads from
their spools; in Kafka mode, spooled events past the acknowledged position (the
shipper's ``SHIPPED`` file in each spool, ``meter.shipper``) are sent again; the ledger
resumes from its stored offsets and drops exact re-deliveries. The totals are the same as
an uninterrupted run's.

The package, by concern: ``run`` (the options, the tasks, the steps: ``run_replay``),
``ledger_process`` (the ledger in this process or one of its own, and its exports),
``verdicts`` (the verifier's workers and the verdicts counted), ``report`` (what a run
found), ``measure`` (progress, timers, memory and CPU), ``cli`` (`gridledger replay`).
"""

# Every public name the module gridledger/replay.py had, importable from here as before (a
# test that patches a module global patches the module that uses it).
from gridledger.replay.cli import register
from gridledger.replay.ledger_process import (
    COMPACT_MAX_RECORDS,
    LedgerProcessError,
    closed_placements,
    compact_exports,
    export_chunk,
    export_closed,
    ledger_main,
    store_counts,
)
from gridledger.replay.measure import cpu_seconds, own_peak_rss_mib, peak_rss_mib, quiet_logs
from gridledger.replay.report import (
    MONEY_FIELDS,
    REPORT_FORMAT,
    VERIFIER_SIZE_CLASSES,
    Money,
    ReplayReport,
)
from gridledger.replay.run import (
    DEFAULT_BUYERS,
    DEFAULT_PARTITIONS,
    DEFAULT_SEED,
    DEFAULT_TOPIC,
    LEDGER_ID,
    PUBLISHER,
    ReplayOptions,
    planned_events,
    prefix_budgets,
    run_replay,
    select_tasks,
)
from gridledger.replay.verdicts import VerifySummary, verify_one

__all__ = [
    "COMPACT_MAX_RECORDS",
    "DEFAULT_BUYERS",
    "DEFAULT_PARTITIONS",
    "DEFAULT_SEED",
    "DEFAULT_TOPIC",
    "LEDGER_ID",
    "MONEY_FIELDS",
    "PUBLISHER",
    "REPORT_FORMAT",
    "VERIFIER_SIZE_CLASSES",
    "LedgerProcessError",
    "Money",
    "ReplayOptions",
    "ReplayReport",
    "VerifySummary",
    "closed_placements",
    "compact_exports",
    "cpu_seconds",
    "export_chunk",
    "export_closed",
    "ledger_main",
    "own_peak_rss_mib",
    "peak_rss_mib",
    "planned_events",
    "prefix_budgets",
    "quiet_logs",
    "register",
    "run_replay",
    "select_tasks",
    "store_counts",
    "verify_one",
]
