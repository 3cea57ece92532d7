"""The flow after a record is built: sign it, describe it, dry-run it against the bill, or
write it and publish it once every required signature is there."""

from __future__ import annotations

import argparse
from pathlib import Path

from gridledger.cmd_records.common import (
    EX_OK,
    EX_REFUSED,
    RECORD,
    Refused,
    UsageError,
    iso,
    load_keys,
    parse_time_ms,
    span,
    what_of,
)
from gridledger.cmd_records.signers import check_signers, missing_signers
from gridledger.publishing import publish, target_of
from proto.canonical import signed_bytes
from proto.envelope import Envelope, encode_envelope, sign_payload
from proto.keys import key_id
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    PlacementTerms,
    ReclaimNotice,
    StreamResume,
)


def _describe(record: RECORD, terms: PlacementTerms) -> str:
    if isinstance(record, ReclaimNotice):
        notice = span(record.effective_at_ms - record.issued_at_ms)
        agreed = span(terms.reclaim_notice_ms)
        return (
            f"reclaim {record.reclaim_id} of {record.placement_id}: all {len(record.gpus)} GPUs "
            f"at {iso(record.effective_at_ms)}, dated {notice} ahead ({agreed} agreed; "
            "the notice counts from when it reaches the log)"
        )
    if isinstance(record, Assignment):
        from proto.money import format_minor

        rate = format_minor(record.rate_per_gpu_hour_minor, terms.currency_scale)
        return (
            f"assignment {record.assignment_id} of {record.placement_id}: the buyer "
            f"{terms.buyer.id} sells {len(record.gpus)} of {len(terms.gpus)} GPUs "
            f"({', '.join(record.gpus)}) to {record.new_buyer.id} from "
            f"{iso(record.handover_at_ms)} (or its arrival in the log, if later) at {rate} "
            f"{terms.currency}/GPU-h, paid to the desk"
        )
    if isinstance(record, StreamResume):
        return (
            f"resume {record.resume_id} of {record.placement_id}: node {record.node_id}'s "
            f"stream goes on at seq {record.from_seq}, chained to this record, billed from "
            f"{iso(record.from_ms)} (SPEC §6.3 resume)"
        )
    if isinstance(record, BuyerRelease):
        agreed = span(terms.release_notice_ms)
        minimum = span(terms.minimum_duration_ms)
        return (
            f"release {record.release_id} of {record.placement_id}: the buyer ends it at "
            f"{iso(record.effective_at_ms)} ({agreed} notice and a {minimum} "
            "minimum agreed; the notice counts from when it reaches the log, SPEC §7.9)"
        )
    if isinstance(record, Adjustment):
        from proto.money import format_minor

        amount = format_minor(record.amount_minor, terms.currency_scale)
        return (
            f"adjustment {record.adjustment_id} of {record.placement_id}: {record.direction} "
            f"{amount} {terms.currency} ({record.reason})"
        )
    start = iso(record.valid_from_ms) if record.valid_from_ms else "start"
    return (
        f"key binding of {record.placement_id}: node {record.node_id} signs with key "
        f"{key_id(record.key)} for [{start}, {iso(record.valid_until_ms)})"
    )


def _write(out: Path, envelope: Envelope) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_bytes(encode_envelope(envelope) + b"\n")
        tmp.replace(out)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc


def finish(
    args: argparse.Namespace,
    terms: PlacementTerms,
    record: RECORD,
    envelope: Envelope,
    out: Path | None,
) -> int:
    """Dry run, or write, then publish when asked and complete."""
    missing = missing_signers(terms, envelope, record)
    raw = encode_envelope(envelope)
    print(_describe(record, terms))
    if getattr(args, "dry_run", False):
        return _dry_run(args, terms, raw, missing)
    if out is not None:
        _write(out, envelope)
        print(f"OK: signed -> {out}")
    target = target_of(args)
    if missing:
        named = out or getattr(args, "record", None) or "FILE"
        print(
            f"missing: {', '.join(missing)} (each runs: gridledger cosign {named} "
            f"--terms TERMS --key THEIR.key)"
        )
        if target is not None:
            raise Refused(
                f"not published: the {' and '.join(missing)} must sign first; then "
                f"gridledger publish {named} --terms TERMS and the same target"
            )
        return EX_OK
    print("OK: every required signature is there")
    if target is None:
        return EX_OK
    publish(target, terms.placement_id, "records", raw)
    print(f"OK: published to {target.describe()}")
    return EX_OK


def _dry_run(
    args: argparse.Namespace, terms: PlacementTerms, raw: bytes, missing: tuple[str, ...]
) -> int:
    from gridledger import dryrun

    export: Path | None = getattr(args, "export", None)
    ledger: str | None = getattr(args, "ledger", None)
    try:
        if export is not None:
            current = dryrun.rebuild(export, terms.placement_id)
        elif ledger is not None:
            keys = load_keys(args.key)
            if not keys:
                raise UsageError("--dry-run --ledger URL signs its requests with --key")
            current = dryrun.current_from_ledger(ledger, terms.placement_id, keys[0])
        else:
            raise UsageError("--dry-run needs the current state: --export FILE or --ledger URL")
    except dryrun.DryRunError as exc:
        raise UsageError(str(exc)) from exc
    arrives = parse_time_ms(args.arrives_at, "--arrives-at")
    print(f"as if it reaches the log at {iso(arrives)} (a notice counts from there)")
    logged = current.logged_ms
    if logged is not None and logged > arrives:  # SPEC §6.6: arrivals are monotone
        print(
            f"  the log is already at {iso(logged)} (an arrival never goes back, SPEC §6.6): "
            "the ledger times it from there"
        )
    result = current.dry_run(raw, missing, arrives_at_ms=arrives)
    for line in dryrun.render(result, terms, missing):
        print(line)
    print("nothing written, nothing published (--dry-run)")
    if result.status == "accepted" or result.once_signed is not None:
        return EX_OK
    return EX_REFUSED


def sign_new(args: argparse.Namespace, terms: PlacementTerms, record: RECORD) -> Envelope:
    keys = load_keys(args.key)
    check_signers(terms, record, keys, what_of(record))
    return sign_payload(signed_bytes(record), keys)
