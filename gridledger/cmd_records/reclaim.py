"""`gridledger reclaim`: the operator takes the placement's GPUs back (a ReclaimNotice)."""

from __future__ import annotations

import argparse

from gridledger.cmd_records.common import add_ending, issued_at, load_terms, parse_time_ms
from gridledger.cmd_records.finish import issue
from proto.records import ReclaimNotice


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    issued = issued_at(args)
    effective = parse_time_ms(args.effective_at, "--effective-at")
    record = ReclaimNotice(
        placement_id=terms.placement_id,
        reclaim_id=args.id or f"reclaim-{issued}",
        issued_at_ms=issued,
        effective_at_ms=effective,
        gpus=[g.uuid for g in terms.gpus],
        reason=args.reason,
    )
    return issue(args, terms, record, f"reclaim-{record.reclaim_id}")


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger reclaim` before the common ones."""
    add_ending(p, "reclaim", "when the GPUs are taken back (ISO time or epoch ms)", "buyer")
