"""`gridledger assign`: the buyer resells GPUs of the window (an Assignment, SPEC §6.8)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gridledger.cmd_records.common import (
    UsageError,
    add_issued,
    in_window,
    issued_at,
    load_terms,
    parse_amount_minor,
    parse_time_ms,
)
from gridledger.cmd_records.finish import issue
from gridledger.cmd_records.precheck import precheck_new_buyer
from proto.errors import KeyFileError
from proto.keys import load_public_key
from proto.records import Assignment, Party


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    try:
        public = load_public_key(args.new_buyer_key).key
    except KeyFileError as exc:
        raise UsageError(f"--new-buyer-key: {exc}") from exc
    held = [g.uuid for g in terms.gpus]
    gpus = held if args.gpus is None else [u.strip() for u in args.gpus.split(",") if u.strip()]
    unknown = [u for u in gpus if u not in held]
    if unknown:
        raise UsageError(
            f"GPU {unknown[0]} is not in the terms: the buyer can only sell its own "
            f"({', '.join(held)})"
        )
    if not gpus or len(set(gpus)) != len(gpus):
        raise UsageError("--gpus lists each GPU of the terms at most once, at least one")
    key_said = f"--new-buyer-key {args.new_buyer_key}"
    precheck_new_buyer(terms, args.new_buyer, public, "--new-buyer", key_said)  # §6.8 (3)
    handover = in_window(terms, "--handover-at", parse_time_ms(args.handover_at, "--handover-at"))
    issued = issued_at(args)
    record = Assignment(
        placement_id=terms.placement_id,
        assignment_id=args.id or f"assign-{issued}",
        new_buyer=Party(id=args.new_buyer, key=public),
        handover_at_ms=handover,
        gpus=gpus,
        rate_per_gpu_hour_minor=parse_amount_minor(args.rate, terms, "--rate"),
        issued_at_ms=issued,
    )
    return issue(args, terms, record, f"assignment-{record.assignment_id}")


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger assign` before the common ones."""
    p.add_argument("--new-buyer", required=True, metavar="ID", help="the new buyer's id")
    p.add_argument(
        "--new-buyer-key",
        required=True,
        type=Path,
        metavar="FILE",
        help="the new buyer's public key (.pub); it signs the assignment too",
    )
    p.add_argument(
        "--handover-at",
        required=True,
        metavar="TIME",
        help="from when the new buyer pays (ISO time or epoch ms; the ledger takes the later "
        "of this and the record's arrival)",
    )
    p.add_argument(
        "--rate", required=True, metavar="AMOUNT", help="the resale price per GPU-hour (12.50)"
    )
    p.add_argument(
        "--gpus", metavar="UUID,...", help="the GPUs sold (default: every GPU of the terms)"
    )
    p.add_argument("--id", metavar="ID", help="the assignment id (default assign-<issued>)")
    add_issued(p)
