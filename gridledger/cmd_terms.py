"""`gridledger terms sign|show|publish`: placement terms as each party handles them.

Each party signs the same canonical bytes on its own machine: ``sign`` reads the TOML
terms (or a terms file someone else already signed) and adds one signature; ``show``
prints who signed, who is missing and what is wrong; ``publish`` puts fully signed,
valid terms into the stream.

Exit codes: 0 fine; 1 the terms are inconsistent or a signature is bad; 2 a file cannot
be read; 3 (``show``) valid so far but signatures are missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from billview.build import terms_summary
from gridledger.publishing import PublishError, add_target_arguments, publish, target_of
from proto.canonical import signed_bytes
from proto.envelope import Envelope, add_signatures, encode_envelope, sign_payload
from proto.errors import KeyFileError
from proto.keys import load_signing_key
from proto.records import PlacementTerms
from proto.terms import (
    TermsError,
    check_terms_signatures,
    load_terms_file,
    role_of_key,
    terms_signature_problem,
    validate_terms,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `terms` command group."""
    terms = sub.add_parser("terms", help="sign, show and publish placement terms")
    terms_sub = terms.add_subparsers(dest="terms_command", metavar="SUBCOMMAND", required=True)
    sign = terms_sub.add_parser("sign", help="add one party's signature")
    sign.add_argument("terms", type=Path, help="TOML terms, or a signed terms file (JSON)")
    sign.add_argument("--key", required=True, type=Path, help="the party's private key file")
    sign.add_argument("--out", type=Path, help="where to write (default: TERMS.signed.json)")
    sign.set_defaults(handler=_sign)
    show = terms_sub.add_parser("show", help="who signed, what is missing, what is wrong")
    show.add_argument("terms", type=Path, help="TOML terms, or a signed terms file (JSON)")
    show.set_defaults(handler=_show)
    publish = terms_sub.add_parser("publish", help="put fully signed terms into the stream")
    publish.add_argument("terms", type=Path, help="the signed terms file (terms.signed.json)")
    add_target_arguments(publish, required=True)
    publish.set_defaults(handler=_publish)


def _load(path: Path) -> tuple[PlacementTerms, Envelope | None] | None:
    try:
        return load_terms_file(path)
    except TermsError as exc:
        for problem in exc.problems:
            print(f"FAIL: {problem}", file=sys.stderr)
        return None


def _default_out(path: Path) -> Path:
    if path.name.endswith(".signed.json"):
        return path
    return path.with_name(path.stem + ".signed.json")


def _sign(args: argparse.Namespace) -> int:
    loaded = _load(args.terms)
    if loaded is None:
        return 2
    terms, envelope = loaded
    problems = validate_terms(terms)
    if problems:
        # One line: what is wrong, every rule broken (SPEC §5; a node outside the
        # residency policy is named with its region, §5.2 R1).
        print(f"FAIL: refusing to sign inconsistent terms: {'; '.join(problems)}", file=sys.stderr)
        return 1
    try:
        key = load_signing_key(args.key)
    except KeyFileError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 2
    role = role_of_key(terms, key.key_id)
    if role is None:
        print(
            f"FAIL: key {key.key_id} ({args.key}) is not the operator's, buyer's or desk's key"
            " in these terms",
            file=sys.stderr,
        )
        return 1
    if envelope is None:
        envelope = sign_payload(signed_bytes(terms), [key])
    else:
        envelope = add_signatures(envelope, [key])
    out: Path = args.out or _default_out(args.terms)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(encode_envelope(envelope) + b"\n")
    tmp.replace(out)
    report = check_terms_signatures(envelope, terms)
    missing = [r for r in ("operator", "buyer", "desk") if _role_missing(terms, r, report.missing)]
    print(f"OK: signed as {role} ({getattr(terms, role).id}) -> {out}")
    print("OK: fully signed" if not missing else f"missing: {', '.join(missing)}")
    return 0


def _role_missing(terms: PlacementTerms, role: str, missing_keyids: list[str]) -> bool:
    return any(role_of_key(terms, keyid) == role for keyid in missing_keyids)


def _show(args: argparse.Namespace) -> int:
    loaded = _load(args.terms)
    if loaded is None:
        return 2
    terms, envelope = loaded
    t = terms
    print(f"{'placement':<18} {t.placement_id}")
    # Window in ISO-8601 UTC, reclaim and SLA terms, "1 node": the rows every bill shows.
    for label, value in terms_summary(t):
        print(f"{label:<18} {value}")
    for g in t.gpus:
        print(f"  {g.node_id} {g.uuid} {g.model} share {g.share_milli}/1000")
    problems = validate_terms(terms)
    for problem in problems:
        print(f"FAIL: {problem}")
    if envelope is None:
        print("signatures  none (unsigned TOML)")
        return 1 if problems else 3
    report = check_terms_signatures(envelope, terms)
    for role in ("operator", "buyer", "desk"):
        keyids = [k for k in report.valid if role_of_key(terms, k) == role]
        status = "signed" if keyids else "MISSING"
        if any(role_of_key(terms, k) == role for k in report.invalid):
            status = "BAD SIGNATURE"
        print(f"  {role:<9} {status}")
    for keyid in report.unexpected:
        print(f"FAIL: signature by {keyid}, who is not a party to these terms")
    if problems or report.invalid or report.unexpected:
        return 1
    if report.missing:
        return 3
    print("OK: fully signed by operator, buyer and desk")
    return 0


def _publish(args: argparse.Namespace) -> int:
    loaded = _load(args.terms)
    if loaded is None:
        return 2
    terms, envelope = loaded
    if envelope is None:
        print("FAIL: unsigned terms cannot be published; sign them first", file=sys.stderr)
        return 1
    problems = validate_terms(terms)
    failure = terms_signature_problem(envelope, terms)
    if problems or failure is not None:
        for problem in problems:
            print(f"FAIL: {problem}", file=sys.stderr)
        if failure is not None:
            print(f"FAIL: {failure}", file=sys.stderr)
        return 1
    target = target_of(args)
    if target is None:  # argparse requires one; kept for the type checker
        return 2
    try:
        publish(target, terms.placement_id, "terms", encode_envelope(envelope))
    except PublishError as exc:
        # One line, no traceback (nothing to undo; publishing again is safe, the ledger
        # drops an exact duplicate).
        print(f"FAIL: {exc}", file=sys.stderr)
        return exc.code
    print(f"OK: published {terms.placement_id} to {target.describe()}")
    return 0
