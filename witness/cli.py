"""``gridledger witness``: a party checks the ledger's log and cosigns it, or refuses.

    gridledger witness run --ledger URL --terms TERMS.signed.json --key PARTY.key --state DIR
                           [--delivery-log FILE ...] [--known DIR]
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
from typing import Any, Final

from proto.errors import KeyFileError, ProtoError
from proto.keys import load_signing_key
from proto.note import parse_checkpoint_body, parse_note
from proto.terms import TermsError, load_terms_file
from witness.check import Cosigned, witness
from witness.client import LedgerClient, LedgerRefused, LedgerUnreachable
from witness.known import Known, KnownError, from_delivery_logs, from_envelope_files
from witness.state import (
    StateError,
    list_refusals,
    list_states,
    load_state,
    store_refusal,
    store_state,
)

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 75


def register(sub: Any) -> None:
    """Add ``witness`` and its subcommands."""
    parser = sub.add_parser("witness", help="check the ledger's log as a party and cosign it")
    wsub = parser.add_subparsers(dest="witness_command", metavar="WITNESS_COMMAND")
    run = wsub.add_parser("run", help="fetch the latest checkpoint, check it, cosign or refuse")
    run.add_argument(
        "--ledger", required=True, help="the ledger's HTTP API, e.g. http://127.0.0.1:8787"
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
    run.set_defaults(handler=_run)
    status = wsub.add_parser("status", help="what this witness cosigned, per placement")
    status.add_argument("--state", type=Path, required=True, help="the witness's state directory")
    status.set_defaults(handler=_status)
    refusals = wsub.add_parser("refusals", help="every refusal kept, with its reason")
    refusals.add_argument("--state", type=Path, required=True, help="the witness's state directory")
    refusals.set_defaults(handler=_refusals)
    parser.set_defaults(handler=lambda _args: (parser.print_help(sys.stderr), EXIT_USAGE)[1])


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        terms, _ = load_terms_file(args.terms)
    except TermsError as exc:
        return _fail("; ".join(exc.problems))
    try:
        key = load_signing_key(args.key)
    except (KeyFileError, OSError, ValueError) as exc:
        return _fail(f"cannot use key {args.key}: {exc}")
    parties = {p.key: p.id for p in (terms.operator, terms.buyer, terms.desk)}
    name = parties.get(key.public_key)
    if name is None:
        return _fail(f"the key {args.key} is not a party key of placement {terms.placement_id}")
    try:
        known: list[Known] = from_delivery_logs(args.delivery_log, terms.placement_id)
        if args.known is not None:
            known += from_envelope_files(args.known, terms.placement_id)
        state = load_state(args.state, terms.placement_id)
    except (KnownError, StateError) as exc:
        return _fail(str(exc))
    client = LedgerClient(args.ledger, terms.placement_id)
    try:
        note = parse_note(client.checkpoint())
        size = parse_checkpoint_body(note.body).size
        if size == state.size and state.cosigned_note.startswith(note.body):
            print(f"OK: {terms.placement_id}: size {size} already cosigned as {name}")
            return EXIT_OK
        records = client.records(state.size, size) if size > state.size else []
    except LedgerUnreachable as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    except (LedgerRefused, ProtoError) as exc:
        return _fail(f"{terms.placement_id}: {exc}", EXIT_REFUSED)
    outcome = witness(
        state, terms, note, records, known, name=name, key=key, now_s=int(time.time())
    )
    if not isinstance(outcome, Cosigned):
        path = store_refusal(args.state, outcome.refusal)
        print(
            f"REFUSED: {terms.placement_id}: {outcome.refusal.code}: {outcome.refusal.detail} "
            f"(evidence: {path})"
        )
        return EXIT_REFUSED
    store_state(args.state, outcome.state)  # before the cosignature leaves (SPEC §8.3)
    try:
        client.submit(outcome.note.text())
    except LedgerUnreachable as exc:
        return _fail(
            f"cosigned size {size}, but {exc}; run again to hand it over", EXIT_UNAVAILABLE
        )
    except LedgerRefused as exc:
        return _fail(f"cosigned size {size}, but the ledger did not take it: {exc}", EXIT_REFUSED)
    closed = " (closed)" if outcome.state.close_index >= 0 else ""
    print(f"OK: {terms.placement_id}: cosigned size {size}{closed} as {name}")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    states = list_states(args.state)
    if not states:
        print(f"no placement witnessed in {args.state}")
    for s in states:
        closed = f"closed at record {s.close_index}" if s.close_index >= 0 else "open"
        print(f"{s.placement_id}: cosigned size {s.size}, {closed}, at {s.cosigned_at_s}")
    return EXIT_OK


def _refusals(args: argparse.Namespace) -> int:
    refusals = list_refusals(args.state)
    if not refusals:
        print(f"no refusal in {args.state}")
    for r in refusals:
        print(f"{r.refused_at_s} {r.placement_id} {r.code}: {r.detail}")
    return EXIT_OK
