"""`gridledger resume`: operator and buyer restart a node's usage stream after it lost its
spool (a StreamResume, SPEC §6.3 resume)."""

from __future__ import annotations

import argparse

from gridledger.cmd_records.common import UsageError, default_out, iso, load_terms, parse_time_ms
from gridledger.cmd_records.finish import finish, sign_new
from gridledger.cmd_records.wire import check_record
from proto.records import StreamResume


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
    nodes = sorted(n.node_id for n in terms.nodes)
    if args.node not in nodes:
        raise UsageError(
            f"--node {args.node} is not a node of the terms ({', '.join(nodes)}): "
            "SPEC §6.3 resume, NODE_UNKNOWN"
        )
    if args.from_seq < 1:
        raise UsageError(
            f"--from-seq {args.from_seq}: a resume starts at seq 1 or later, past every seq "
            "the node signed before it lost its spool (SPEC §6.3 resume: RESUME_INVALID)"
        )
    from_ms = parse_time_ms(args.from_time, "--from")
    if not terms.window_start_ms <= from_ms < terms.window_end_ms:
        raise UsageError(
            f"--from {iso(from_ms)} is outside the window [{iso(terms.window_start_ms)}, "
            f"{iso(terms.window_end_ms)}): the resumed stream would bill nothing"
        )
    record = StreamResume(
        placement_id=terms.placement_id,
        resume_id=args.id or f"resume-{args.node}-{args.from_seq}",
        node_id=args.node,
        from_seq=args.from_seq,
        from_ms=from_ms,
        reason=args.reason,
    )
    check_record(record)
    envelope = sign_new(args, terms, record)
    out = None if args.dry_run else default_out(args, f"resume-{record.resume_id}")
    return finish(args, terms, record, envelope, out)


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger resume` before the common ones."""
    p.add_argument("--node", required=True, metavar="NODE", help="the node whose stream restarts")
    p.add_argument(
        "--from-seq",
        required=True,
        type=int,
        metavar="SEQ",
        help="the seq of the node's next event: past every seq it may have signed before "
        "the loss (its stream's next seq plus the intervals since, with a margin)",
    )
    p.add_argument(
        "--from",
        dest="from_time",
        required=True,
        metavar="TIME",
        help="no interval before this is billed to the resumed stream (ISO time or epoch "
        "ms); never before the node's last accepted end",
    )
    p.add_argument(
        "--reason", default="", help="free text shown to the buyer (at most 512 characters)"
    )
    p.add_argument("--id", metavar="ID", help="the resume id (default resume-<node>-<seq>)")
