"""`gridledger publish`: a fully signed record file, to the log."""

from __future__ import annotations

import argparse
from pathlib import Path

from gridledger.cmd_records.common import UsageError, load_terms
from gridledger.cmd_records.finish import finish
from gridledger.cmd_records.precheck import precheck_opened
from gridledger.cmd_records.wire import open_record
from gridledger.publishing import target_of


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    opened, record = open_record(args.record, terms)
    precheck_opened(terms, record, args.record)
    if target_of(args) is None and not args.dry_run:
        raise UsageError("publish needs --kafka HOST:PORT or --local-dir DIR (or --dry-run)")
    return finish(args, terms, record, opened.envelope, None)


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger publish` before the common ones."""
    p.add_argument("record", type=Path, metavar="RECORD", help="the signed record file")
