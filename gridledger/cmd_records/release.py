"""`gridledger release`: the buyer ends the placement early (a BuyerRelease, SPEC §6.7)."""

from __future__ import annotations

import argparse

from gridledger.cmd_records.common import (
    UsageError,
    add_ending,
    in_window,
    iso,
    issued_at,
    load_terms,
    parse_time_ms,
)
from gridledger.cmd_records.finish import issue
from proto.records import BuyerRelease


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    issued = issued_at(args)
    effective = parse_time_ms(args.effective_at, "--effective-at")
    if effective < issued:
        given = "--issued-at" if args.issued_at != "now" else "--issued-at (default: now)"
        hint = "" if args.issued_at != "now" else "; give --issued-at, when the buyer issues it"
        raise UsageError(
            f"--effective-at {iso(effective)} is before {given} {iso(issued)}: a release "
            f"cannot end the placement before it is issued (SPEC §6.7: RELEASE_INVALID){hint}"
        )
    in_window(terms, "--effective-at", effective, " (SPEC §6.7: RELEASE_INVALID)")
    record = BuyerRelease(
        placement_id=terms.placement_id,
        release_id=args.id or f"release-{issued}",
        issued_at_ms=issued,
        effective_at_ms=effective,
        reason=args.reason,
    )
    return issue(args, terms, record, f"release-{record.release_id}")


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger release` before the common ones."""
    effective = "when the placement ends (ISO time or epoch ms); never before it reaches the log"
    add_ending(p, "release", effective, "operator")
