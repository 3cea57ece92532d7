"""`gridledger cosign`: the next party adds its signature to a signed record file."""

from __future__ import annotations

import argparse
from pathlib import Path

from gridledger.cmd_records.common import load_keys, load_terms, what_of
from gridledger.cmd_records.finish import finish
from gridledger.cmd_records.precheck import precheck_opened
from gridledger.cmd_records.signers import check_signers, role_of
from gridledger.cmd_records.wire import open_record
from proto.envelope import add_signatures


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    opened, record = open_record(args.record, terms)
    precheck_opened(terms, record, args.record)
    keys = load_keys(args.key)
    check_signers(terms, record, keys, what_of(record))
    signed = {s.keyid for s in opened.envelope.signatures}
    for key in keys:
        if key.key_id in signed:
            who = role_of(terms, key.key_id, record)
            print(f"note: the {who} ({key.name}) had signed already; its signature is renewed")
    envelope = add_signatures(opened.envelope, keys)
    out = args.out or args.record
    return finish(args, terms, record, envelope, None if args.dry_run else out)


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger cosign` before the common ones."""
    p.add_argument("record", type=Path, metavar="RECORD", help="the signed record file")
