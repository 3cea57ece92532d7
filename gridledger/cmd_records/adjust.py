"""`gridledger adjust`: a credit to the buyer or a charge, signed by whom it costs."""

from __future__ import annotations

import argparse
from typing import Literal

from gridledger.cmd_records.common import (
    add_issued,
    issued_at,
    load_terms,
    parse_amount_minor,
)
from gridledger.cmd_records.finish import issue
from proto.records import Adjustment


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    direction: Literal["credit", "charge"] = "credit" if args.credit is not None else "charge"
    amount = parse_amount_minor(args.credit or args.charge, terms, f"--{direction}")
    issued = issued_at(args)
    record = Adjustment(
        placement_id=terms.placement_id,
        adjustment_id=args.id or f"adj-{issued}",
        direction=direction,
        amount_minor=amount,
        reference=args.reference,
        reason=args.reason,
        issued_at_ms=issued,
    )
    return issue(args, terms, record, f"adjustment-{record.adjustment_id}")


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger adjust` before the common ones."""
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument(
        "--credit", metavar="AMOUNT", help="credit the buyer AMOUNT (signed: operator and desk)"
    )
    direction.add_argument(
        "--charge", metavar="AMOUNT", help="charge the buyer AMOUNT (signed: buyer; desk may)"
    )
    p.add_argument("--reason", required=True, help="why, in words both parties read")
    p.add_argument("--reference", default="", help="an outside reference (ticket, invoice number)")
    p.add_argument(
        "--id",
        metavar="ID",
        help="the adjustment id; give one so a repeated command is a duplicate, not a "
        "second adjustment (default adj-<issued ms>)",
    )
    add_issued(p)
