"""What every records command shares: exit codes, its errors, times and amounts, the
terms and key files, how a handler's errors become one line."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from billview.units import iso_utc
from gridledger.publishing import PublishError
from proto.errors import KeyFileError
from proto.keys import SigningKey, load_signing_key
from proto.limits import MAX_SAFE_INTEGER
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    PlacementTerms,
    ReclaimNotice,
    StreamResume,
)
from proto.terms import MIN_PLAUSIBLE_MS, TermsError, load_terms_file, terms_signature_problem

EX_OK: Final = 0

EX_REFUSED: Final = 1

EX_USAGE: Final = 2

RECORD = ReclaimNotice | Adjustment | NodeKeyBinding | Assignment | BuyerRelease | StreamResume


class UsageError(Exception):
    """Input the command cannot use; one line, exit 2."""


class Refused(Exception):
    """The command will not do it (a key that may not sign, signatures missing); exit 1."""


def parse_time_ms(text: str, what: str) -> int:
    """ISO 8601 with an offset, ``now``, or integer milliseconds since the epoch."""
    value = text.strip()
    if value == "now":
        return time.time_ns() // 1_000_000
    if value.isdigit():
        ms = int(value)
        if ms < MIN_PLAUSIBLE_MS:
            raise UsageError(
                f"{what} {value} looks like seconds; give milliseconds ({ms * 1000}) "
                "or an ISO time such as 2026-12-01T00:52:00Z"
            )
        if ms > MAX_SAFE_INTEGER:
            raise UsageError(f"{what} {value} is past 2^53 - 1 milliseconds")
        return ms
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(
            f"{what} {text!r} is neither an ISO time (2026-12-01T00:52:00Z) nor milliseconds"
        ) from exc
    if parsed.tzinfo is None:
        raise UsageError(f"{what} {text!r} needs a UTC offset, e.g. {text}Z")
    return int(parsed.timestamp() * 1000)


def parse_amount_minor(text: str, terms: PlacementTerms, what: str = "amount") -> int:
    """``12.50`` in the terms' currency -> minor units at its scale, exactly. ``what``
    names the option the user gave (``--rate``) in every message."""
    try:
        amount = decimal.Decimal(text.strip())
    except decimal.InvalidOperation as exc:
        raise UsageError(f"{what} {text!r} is not a decimal number (e.g. 12.50)") from exc
    if not amount.is_finite() or amount <= 0:
        raise UsageError(f"{what} {text!r} must be a positive number")
    minor = amount.scaleb(terms.currency_scale)
    if minor != minor.to_integral_value():
        raise UsageError(
            f"{what} {text} has more than {terms.currency_scale} decimals ({terms.currency} "
            f"at scale {terms.currency_scale})"
        )
    if int(minor) > MAX_SAFE_INTEGER:
        raise UsageError(f"{what} {text} is too large")
    return int(minor)


def span(ms: int) -> str:
    """A duration as a person says it: 61 s, 24 h, 25.5 h, 365 days (to a tenth)."""
    for unit_ms, below, name in ((1000, 120_000, "s"), (60_000, 7_200_000, "min")):
        if ms < below:
            return f"{round(ms / unit_ms, 1):g} {name}"
    if ms < 172_800_000:
        return f"{round(ms / 3_600_000, 1):g} h"
    return f"{round(ms / 86_400_000, 1):.15g} days"


def load_terms(path: Path) -> PlacementTerms:
    try:
        terms, envelope = load_terms_file(path)
    except TermsError as exc:
        raise UsageError("; ".join(exc.problems)) from exc
    if envelope is None:
        raise UsageError(f"{path}: unsigned TOML terms; give the signed terms file (JSON)")
    failure = terms_signature_problem(envelope, terms)
    if failure is not None:
        raise UsageError(f"{path}: the terms are not fully signed: {failure}")
    return terms


def load_keys(paths: Sequence[Path]) -> list[SigningKey]:
    keys: list[SigningKey] = []
    for path in paths:
        try:
            keys.append(load_signing_key(path))
        except KeyFileError as exc:
            raise UsageError(str(exc)) from exc
    return keys


def iso(ms: int) -> str:
    """ISO-8601 UTC to the second (``.123`` only when there are milliseconds)."""
    if ms >= 253_402_300_800_000:  # past 9999-12-31: "for ever"
        return "forever"
    return iso_utc(ms)


def what_of(record: RECORD) -> str:
    if isinstance(record, ReclaimNotice):
        return "a reclaim"
    if isinstance(record, BuyerRelease):
        return "a release"
    if isinstance(record, Adjustment):
        return f"a {record.direction}"
    if isinstance(record, Assignment):
        return "an assignment"
    if isinstance(record, StreamResume):
        return "a resume"
    return "this key binding"


def default_out(args: argparse.Namespace, name: str) -> Path:
    out: Path | None = args.out
    return out if out is not None else Path(f"{name}.signed.json")


def add_issued(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--issued-at",
        default="now",
        metavar="TIME",
        help="when it is issued (ISO time or epoch ms; default now)",
    )


def run_handler(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except UsageError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return EX_USAGE
    except Refused as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return EX_REFUSED
    except PublishError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return exc.code
