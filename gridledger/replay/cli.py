"""`gridledger replay TRACE_DIR --workdir DIR`: a production GPU trace through the system.

The command's options and its report on stdout (the package docstring says what a run
does)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from gridledger.replay.ledger_process import LedgerProcessError
from gridledger.replay.measure import quiet_logs
from gridledger.replay.run import (
    DEFAULT_BUYERS,
    DEFAULT_PARTITIONS,
    DEFAULT_SEED,
    DEFAULT_TOPIC,
    ReplayOptions,
    run_replay,
)
from gridledger.replay_limits import DEFAULT_INTERVAL_S


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gridledger replay`."""
    parser = subparsers.add_parser(
        "replay",
        help="meter, settle and verify a production GPU cluster trace (OpenB CSV format)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument(
        "trace_dir", type=Path, metavar="TRACE_DIR", help="the OpenB trace directory (CSV files)"
    )
    parser.add_argument(
        "--workdir", type=Path, required=True, metavar="DIR", help="where keys, spools, DB go"
    )
    parser.add_argument("--kafka", metavar="HOST:PORT", help="use Kafka (default: local spools)")
    parser.add_argument(
        "--topic", default=DEFAULT_TOPIC, help=f"Kafka topic to create (default {DEFAULT_TOPIC})"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help=f"partitions of the topic (default {DEFAULT_PARTITIONS})",
    )
    parser.add_argument(
        "--interval-s",
        type=int,
        default=DEFAULT_INTERVAL_S,
        metavar="N",
        help=f"usage interval of every agent, seconds (default {DEFAULT_INTERVAL_S})",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="replay only the first N GPU tasks that ran (by scheduled time); a task's "
        "cost is its duration: the trace's first tasks run for months",
    )
    parser.add_argument(
        "--max-events",
        type=int,
        metavar="N",
        help="replay the first GPU tasks that ran while their usage events stay within N "
        "(bounds the work; combines with --limit)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (the report only)"
    )
    parser.add_argument(
        "--keep-exports",
        action="store_true",
        help="keep every export in DIR/exports (default: an export that verified is "
        "removed; one that failed is kept; `gridledger ledger export` writes any again). "
        "The replay writes them compact: DuckDB 1.2 and later read them",
    )
    parser.add_argument("--prices", type=Path, metavar="FILE", help="price table (TOML)")
    parser.add_argument("--seed", default=DEFAULT_SEED, help="seed text of every key")
    parser.add_argument(
        "--buyers",
        type=int,
        default=DEFAULT_BUYERS,
        help=f"buyers the placements are spread over (default {DEFAULT_BUYERS})",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.set_defaults(handler=_handle)


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _handle(args: argparse.Namespace) -> int:
    from gridledger.replay_terms import PriceTableError
    from gridledger.trace import TraceError

    quiet_logs()
    options = ReplayOptions(
        trace_dir=args.trace_dir,
        workdir=args.workdir,
        kafka=args.kafka,
        topic=args.topic,
        partitions=args.partitions,
        interval_s=args.interval_s,
        limit=args.limit,
        max_events=args.max_events,
        prices=args.prices,
        seed=args.seed,
        buyers=args.buyers,
        progress=None if args.quiet else _stderr_line,
        keep_exports=args.keep_exports,
    )
    try:
        report = run_replay(options)
    except (TraceError, PriceTableError, ValueError, LedgerProcessError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 2
    emit: Callable[[str], None] = print
    if args.json:
        emit(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for line in report.render():
            emit(line)
    return 0 if report.ok else 1
