"""The seeded fault harness: meter -> real Kafka -> ledger, with faults injected.

Read in this order:

* ``scenario.py`` — what a seed describes (placements, terms, nodes, records around the
  usage); pure and seeded.
* ``schedule.py`` — when faults happen (the fault classes, one seed's schedule); pure.
* ``reference.py`` — the fault-free reference ledgers and what they expect, and how a
  stopped ledger's store is read.
* ``checks.py`` — the invariants after every cycle and at the end of a run.
* ``topic.py`` — reading the Kafka topic back, publishing to it.
* ``runner.py`` — the processes, the loop that injects faults, ``run_seed``.
* ``cluster.py`` — the broker faults aimed at a three-node cluster (the busiest
  partition's leader, the active controller, a rolling restart): ``ClusterControl``.
"""

from devtools.faults.checks import check_spool, check_store, compare_final
from devtools.faults.reference import (
    LedgerState,
    Reference,
    ReferenceDecision,
    build_reference,
    fold_partitions,
    read_ledger_state,
    rebuild_local,
    remove_store,
)
from devtools.faults.runner import (
    CYCLES_ENV,
    DEFAULT_CYCLES_PER_SEED,
    DEFAULT_SEEDS,
    SEED_ENV,
    SEEDS_ENV,
    BrokerControl,
    FaultFailure,
    FaultReport,
    env_int,
    replay_command,
    run_seed,
    suite_seeds,
)
from devtools.faults.scenario import Scenario, generate_scenario, write_node_configs
from devtools.faults.schedule import MIN_CYCLES, Fault, FaultKind, Schedule, make_schedule
from devtools.faults.topic import TopicMessage, read_topic

__all__ = [
    "CYCLES_ENV",
    "DEFAULT_CYCLES_PER_SEED",
    "DEFAULT_SEEDS",
    "MIN_CYCLES",
    "SEEDS_ENV",
    "SEED_ENV",
    "BrokerControl",
    "Fault",
    "FaultFailure",
    "FaultKind",
    "FaultReport",
    "LedgerState",
    "Reference",
    "ReferenceDecision",
    "Scenario",
    "Schedule",
    "TopicMessage",
    "build_reference",
    "check_spool",
    "check_store",
    "compare_final",
    "env_int",
    "fold_partitions",
    "generate_scenario",
    "make_schedule",
    "read_ledger_state",
    "read_topic",
    "rebuild_local",
    "remove_store",
    "replay_command",
    "run_seed",
    "suite_seeds",
    "write_node_configs",
]
