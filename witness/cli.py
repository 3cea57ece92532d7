"""``gridledger witness``: a party checks the ledger's log and cosigns it, or refuses.

    gridledger witness run --ledger URL --terms TERMS.signed.json --key PARTY.key --state DIR
                           [--delivery-log FILE ...] [--known DIR] [--interval S]
    gridledger witness keep FILE... --known DIR [--received-ms T]
    gridledger witness status --state DIR
    gridledger witness refusals --state DIR

Exit codes: 0 cosigned (or nothing new), 1 refused (the refusal is kept in DIR/refusals
with its evidence), 2 bad input (files, keys, terms), 75 the ledger did not answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from proto.limits import MAX_WITNESS_INTERVAL_S, WITNESS_INTERVAL_S
from proto.utc import iso_utc
from witness.runner import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, witness_once
from witness.state import (
    list_refusals,
    list_states,
    note_path,
)

__all__ = ["EXIT_OK", "EXIT_REFUSED", "EXIT_UNAVAILABLE", "EXIT_USAGE", "register"]


def register(sub: Any) -> None:
    """Add ``witness`` and its subcommands."""
    parser = sub.add_parser("witness", help="check the ledger's log as a party and cosign it")
    wsub = parser.add_subparsers(dest="witness_command", metavar="WITNESS_COMMAND")
    run = wsub.add_parser("run", help="fetch the latest checkpoint, check it, cosign or refuse")
    run.add_argument(
        "--ledger", required=True, help="the ledger's HTTP API, e.g. http://127.0.0.1:8080"
    )
    run.add_argument("--terms", type=Path, required=True, help="your copy of the signed terms")
    run.add_argument("--key", type=Path, required=True, help="your party's private key file")
    run.add_argument("--state", type=Path, required=True, help="the witness's state directory")
    run.add_argument(
        "--delivery-log",
        type=Path,
        action="append",
        default=[],
        help="an agent's DELIVERED.jsonl (operator; repeat per node)",
    )
    run.add_argument("--known", type=Path, help="a directory of signed inputs you sent or received")
    run.add_argument(
        "--simulation",
        action="store_true",
        help='the ledger runs arrival = "sender" (a simulation, SPEC §6.6): a record may '
        "carry the arrival of the record before it, beyond its own delivery's bound",
    )
    run.add_argument(
        "--interval",
        default=str(WITNESS_INTERVAL_S),
        help="re-cosign an unchanged checkpoint once the last cosignature is this many "
        f"seconds old (default {WITNESS_INTERVAL_S}; run the witness at least this often)",
    )
    run.set_defaults(handler=_run)
    keep = wsub.add_parser(
        "keep",
        help="keep signed inputs you received or sent in your --known DIR, with the time",
    )
    keep.add_argument("files", type=Path, nargs="+", metavar="FILE", help="a signed input file")
    keep.add_argument("--known", type=Path, required=True, help="your known-inputs directory")
    keep.add_argument(
        "--received-ms",
        type=int,
        default=None,
        metavar="T",
        help="when you received or sent them, epoch milliseconds (default: now)",
    )
    keep.set_defaults(handler=_keep)
    status = wsub.add_parser("status", help="what this witness cosigned, per placement")
    status.add_argument("--state", type=Path, required=True, help="the witness's state directory")
    status.set_defaults(handler=_status)
    refusals = wsub.add_parser("refusals", help="every refusal kept, with its reason")
    refusals.add_argument("--state", type=Path, required=True, help="the witness's state directory")
    refusals.set_defaults(handler=_refusals)
    parser.set_defaults(handler=lambda _args: (parser.print_help(sys.stderr), EXIT_USAGE)[1])


def _run(args: argparse.Namespace) -> int:
    interval = _interval(args.interval)
    if interval is None:
        print(
            f"FAIL: --interval takes 1..{MAX_WITNESS_INTERVAL_S} seconds, not {args.interval!r}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    result = witness_once(
        ledger_url=args.ledger,
        terms_path=args.terms,
        key_path=args.key,
        state_dir=args.state,
        delivery_logs=args.delivery_log,
        known_dir=args.known,
        now_s=int(time.time()),
        interval_s=interval,
        simulation=args.simulation,
    )
    print(result.line, file=sys.stdout if result.code in (EXIT_OK, EXIT_REFUSED) else sys.stderr)
    return result.code


def _keep(args: argparse.Namespace) -> int:
    """``witness keep``: each file into --known DIR, its time into DIR/DELIVERED.jsonl."""
    from proto.limits import MAX_SAFE_INTEGER
    from witness.known import KnownError, keep

    at_ms = int(time.time() * 1000) if args.received_ms is None else args.received_ms
    if not 0 <= at_ms <= MAX_SAFE_INTEGER:
        print(f"FAIL: --received-ms {at_ms}: give epoch milliseconds", file=sys.stderr)
        return EXIT_USAGE
    if not args.known.is_dir():
        print(f"FAIL: --known {args.known} is not a directory; create it first", file=sys.stderr)
        return EXIT_USAGE
    for path in args.files:
        try:
            kept = keep(args.known, path.read_bytes(), at_ms, name=path.name)
        except OSError as exc:
            print(f"FAIL: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
        except KnownError as exc:
            print(f"FAIL: {path}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"OK: kept {kept}, received {iso_utc(at_ms)}")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    states = list_states(args.state)
    if not states:
        print(f"no placement witnessed in {args.state}")
    for s in states:
        closed = f"closed at record {s.close_index}" if s.close_index >= 0 else "open"
        kept = note_path(args.state, s.placement_id)
        at = iso_utc(s.cosigned_at_s * 1000)
        print(
            f"{s.placement_id}: cosigned size {s.size}, {closed}, at {at}; "
            f"note kept in {kept} (verify EXPORT --checkpoint {kept})"
        )
    return EXIT_OK


def _refusals(args: argparse.Namespace) -> int:
    refusals = list_refusals(args.state)
    if not refusals:
        print(f"no refusal in {args.state}")
    for r in refusals:
        print(f"{iso_utc(r.refused_at_s * 1000)} {r.placement_id} {r.code}: {r.detail}")
    return EXIT_OK


def _interval(text: str) -> int | None:
    """``--interval`` in seconds, or None when it is no integer in 1..MAX_WITNESS_INTERVAL_S."""
    if not text.isdigit() or len(text) > 6:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_WITNESS_INTERVAL_S else None
