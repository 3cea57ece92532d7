"""The records parties sign after the terms: reclaim, adjust, bind-key, cosign, publish.

    gridledger reclaim  --terms T --key OPERATOR.key --effective-at TIME ...
    gridledger release  --terms T --key BUYER.key --effective-at TIME ...  # the buyer ends early
    gridledger adjust   --terms T (--credit | --charge) AMOUNT --reason TEXT --key K [--key K]
    gridledger bind-key --terms T --node NODE --node-key NODE.pub --valid-from TIME ...
    gridledger assign   --terms T --new-buyer ID --new-buyer-key NEW.pub --handover-at TIME
                        --rate AMOUNT [--gpus UUID,...] --key BUYER.key [--key DESK.key]
    gridledger cosign   RECORD.json --terms T --key K       # the next party adds its signature
    gridledger publish  RECORD.json --terms T (--kafka HOST:PORT | --local-dir DIR)

Each signs with the party's own key file, writes the signed record (an envelope, JSON),
and publishes it once every signature SPEC §4.0 requires is there: a reclaim needs the
operator; a charge the buyer (the desk may co-sign); a credit the operator **and** the
desk; a key binding the operator and the buyer (one that only shortens a binding, the
operator alone); an assignment (a resale, SPEC §6.8) the buyer, the new buyer and the
desk (and the operator when the terms say ``resale_requires_operator``). Several
``--key`` sign at once; otherwise one party signs, sends the
file, and the next runs ``gridledger cosign``.

``--dry-run`` shows what the record does to the bill before anything is published: the
current statement against the same with the record, folded locally by the ledger's own
rules from an export (``--export FILE``) or from the running ledger's API (``--ledger
URL``). It writes and publishes nothing.

Times are ISO 8601 with an offset (``2026-12-01T00:52:00Z``) or integer milliseconds
since the epoch; amounts are decimal currency units (``12.50``), exact at the terms'
scale.

Exit codes: 0 done (signed and written; published when asked; a dry run the ledger
would accept); 1 refused (a key that may not sign this record, signatures missing for
publishing, a dry run the ledger would reject); 2 unusable input (a file, a time, an
amount, an export) or a record the ledger will refuse, known from the terms before
signing (a party's, the ledger's or a node's key where it may not be; stale or
future-dated evidence, SPEC §6.3, §6.8, §6.9); 75 Kafka did not acknowledge (nothing was
published; try again).
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Literal

from billview.units import iso_utc
from gridledger.publishing import PublishError, add_target_arguments, publish, target_of
from proto import authority as proto_authority
from proto.attestation import (
    Evidence,
    EvidenceError,
    attested_by,
    evidence_nonce,
    node_key_hash,
    parse_evidence,
)
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import (
    Envelope,
    Opened,
    add_signatures,
    check_signatures,
    encode_envelope,
    open_envelope,
    sign_payload,
)
from proto.errors import KeyFileError, ProtoError
from proto.files import read_at_most
from proto.keys import SigningKey, key_id, load_public_key, load_signing_key
from proto.limits import (
    MAX_CLOCK_SKEW_MS,
    MAX_ENVELOPE_BYTES,
    MAX_EVIDENCE_AGE_MS,
    MAX_EVIDENCE_CHARS,
    MAX_SAFE_INTEGER,
)
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    Party,
    PlacementTerms,
    ReclaimNotice,
)
from proto.terms import (
    MIN_PLAUSIBLE_MS,
    TermsError,
    in_words,
    load_terms_file,
    terms_signature_problem,
)
from proto.trust import TrustError, load_trust

EX_OK: Final = 0
EX_REFUSED: Final = 1
EX_USAGE: Final = 2
_RECORD = ReclaimNotice | Adjustment | NodeKeyBinding | Assignment | BuyerRelease


class UsageError(Exception):
    """Input the command cannot use; one line, exit 2."""


class Refused(Exception):
    """The command will not do it (a key that may not sign, signatures missing); exit 1."""


# ---- parsing --------------------------------------------------------------------------------


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


def _load_terms(path: Path) -> PlacementTerms:
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


def _load_keys(paths: Sequence[Path]) -> list[SigningKey]:
    keys: list[SigningKey] = []
    for path in paths:
        try:
            keys.append(load_signing_key(path))
        except KeyFileError as exc:
            raise UsageError(str(exc)) from exc
    return keys


# ---- who signs (SPEC §4.0) -------------------------------------------------------------------


def authority(
    terms: PlacementTerms,
    record: _RECORD,
    bound: dict[str, dict[bytes, tuple[int, int]]] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(roles that MUST sign, roles that MAY also sign) for ``record`` under ``terms``:
    the ledger's own table (``proto/authority.py``), so the pre-check cannot ask for
    other signers than the ledger does.

    ``bound``: the node key bindings of the current state when known (a dry run);
    otherwise those the terms make: each listed node key for [0, 2^53 - 1).
    """
    current = None
    if isinstance(record, NodeKeyBinding):
        if bound is None:
            bound = {n.node_id: {n.key: (0, MAX_SAFE_INTEGER)} for n in terms.nodes}
        current = bound.get(record.node_id, {}).get(record.key)
    return proto_authority.signers(terms, record, current)


def _role_keys(
    terms: PlacementTerms, roles: Sequence[str], record: _RECORD | None = None
) -> dict[str, bytes]:
    return proto_authority.role_keys(terms, tuple(roles), record)


def _role_of(terms: PlacementTerms, keyid: str, record: _RECORD | None = None) -> str:
    for role in ("operator", "buyer", "desk"):
        if key_id(getattr(terms, role).key) == keyid:
            return role
    if isinstance(record, Assignment) and key_id(record.new_buyer.key) == keyid:
        return f"new buyer {record.new_buyer.id}"
    return f"key {keyid}"


def _check_signers(
    terms: PlacementTerms, record: _RECORD, keys: Sequence[SigningKey], what: str
) -> None:
    required, permitted = authority(terms, record)
    allowed = _role_keys(terms, (*required, *permitted), record)
    for key in keys:
        if key.key_id not in allowed:
            who = _role_of(terms, key.key_id, record)
            roles = " and ".join(_in_words(required)) + (
                f" (the {' and '.join(_in_words(permitted))} may also sign)" if permitted else ""
            )
            raise Refused(
                f"{who} ({key.name}, key id {key.key_id}) may not sign {what}: SPEC §4.0 "
                f"asks the {roles}"
            )


def _in_words(roles: Sequence[str]) -> list[str]:
    """Roles as a person says them: ``new_buyer`` is the new buyer."""
    return [r.replace("_", " ") for r in roles]


def missing_signers(terms: PlacementTerms, envelope: Envelope, record: _RECORD) -> tuple[str, ...]:
    """Roles whose required signature is absent; Refused for a bad or surplus one."""
    required, permitted = authority(terms, record)
    report = check_signatures(envelope, _role_keys(terms, (*required, *permitted), record))
    if report.invalid:
        who = _role_of(terms, report.invalid[0], record)
        raise Refused(f"the signature of the {who} does not verify")
    if report.unexpected:
        raise Refused(f"signed by key {report.unexpected[0]}, who may not sign this record")
    needed = set(_role_keys(terms, required, record))
    return tuple(_role_of(terms, k, record) for k in report.missing if k in needed)


# ---- the shared flow ----------------------------------------------------------------------


def _describe(record: _RECORD, terms: PlacementTerms) -> str:
    if isinstance(record, ReclaimNotice):
        notice = _span(record.effective_at_ms - record.issued_at_ms)
        agreed = _span(terms.reclaim_notice_ms)
        return (
            f"reclaim {record.reclaim_id} of {record.placement_id}: all {len(record.gpus)} GPUs "
            f"at {_iso(record.effective_at_ms)}, dated {notice} ahead ({agreed} agreed; "
            "the notice counts from when it reaches the log)"
        )
    if isinstance(record, Assignment):
        from proto.money import format_minor

        rate = format_minor(record.rate_per_gpu_hour_minor, terms.currency_scale)
        return (
            f"assignment {record.assignment_id} of {record.placement_id}: the buyer "
            f"{terms.buyer.id} sells {len(record.gpus)} of {len(terms.gpus)} GPUs "
            f"({', '.join(record.gpus)}) to {record.new_buyer.id} from "
            f"{_iso(record.handover_at_ms)} (or its arrival in the log, if later) at {rate} "
            f"{terms.currency}/GPU-h, paid to the desk"
        )
    if isinstance(record, BuyerRelease):
        agreed = _span(terms.release_notice_ms)
        minimum = _span(terms.minimum_duration_ms)
        return (
            f"release {record.release_id} of {record.placement_id}: the buyer ends it at "
            f"{_iso(record.effective_at_ms)} ({agreed} notice and a {minimum} "
            "minimum agreed; the notice counts from when it reaches the log, SPEC §7.9)"
        )
    if isinstance(record, Adjustment):
        from proto.money import format_minor

        amount = format_minor(record.amount_minor, terms.currency_scale)
        return (
            f"adjustment {record.adjustment_id} of {record.placement_id}: {record.direction} "
            f"{amount} {terms.currency} ({record.reason})"
        )
    start = _iso(record.valid_from_ms) if record.valid_from_ms else "start"
    return (
        f"key binding of {record.placement_id}: node {record.node_id} signs with key "
        f"{key_id(record.key)} for [{start}, {_iso(record.valid_until_ms)})"
    )


def _iso(ms: int) -> str:
    """ISO-8601 UTC to the second (``.123`` only when there are milliseconds)."""
    if ms >= 253_402_300_800_000:  # past 9999-12-31: "for ever"
        return "forever"
    return iso_utc(ms)


def _write(out: Path, envelope: Envelope) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_bytes(encode_envelope(envelope) + b"\n")
        tmp.replace(out)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc


def _finish(
    args: argparse.Namespace,
    terms: PlacementTerms,
    record: _RECORD,
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
            current = dryrun.current_from_export(export, terms.placement_id)
        elif ledger is not None:
            current = dryrun.current_from_ledger(ledger, terms.placement_id)
        else:
            raise UsageError("--dry-run needs the current state: --export FILE or --ledger URL")
    except dryrun.DryRunError as exc:
        raise UsageError(str(exc)) from exc
    arrives = parse_time_ms(args.arrives_at, "--arrives-at")
    print(f"as if it reaches the log at {_iso(arrives)} (a notice counts from there)")
    logged = current.state.arrived_ms
    if logged is not None and logged > arrives:  # SPEC §6.6: arrivals are monotone
        print(
            f"  the log is already at {_iso(logged)} (an arrival never goes back, SPEC §6.6): "
            "the ledger times it from there"
        )
    result = dryrun.dry_run(current, raw, missing, arrives_at_ms=arrives)
    for line in dryrun.render(result, terms, missing):
        print(line)
    print("nothing written, nothing published (--dry-run)")
    if result.status == "accepted" or result.once_signed is not None:
        return EX_OK
    return EX_REFUSED


def _sign_new(args: argparse.Namespace, terms: PlacementTerms, record: _RECORD) -> Envelope:
    keys = _load_keys(args.key)
    _check_signers(terms, record, keys, _what(record))
    return sign_payload(signed_bytes(record), keys)


def _what(record: _RECORD) -> str:
    if isinstance(record, ReclaimNotice):
        return "a reclaim"
    if isinstance(record, BuyerRelease):
        return "a release"
    if isinstance(record, Adjustment):
        return f"a {record.direction}"
    if isinstance(record, Assignment):
        return "an assignment"
    return "this key binding"


def _default_out(args: argparse.Namespace, name: str) -> Path:
    out: Path | None = args.out
    return out if out is not None else Path(f"{name}.signed.json")


def _run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
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


# ---- pre-checks: what the ledger will refuse, known from the terms (SPEC §6.3, §6.8, §6.9) --
#
# Each refuses before anything is signed, in one line naming the option (exit 2). What the
# command cannot know from the files it is given (bindings or assignments the ledger accepted
# since the terms) it leaves to the ledger: a dry run against an export says it.


def _key_holder(terms: PlacementTerms, key: bytes) -> str | None:
    """Whose key ``key`` is in the terms: a party (with its id), the ledger, or a node."""
    for role in ("operator", "buyer", "desk"):
        party: Party = getattr(terms, role)
        if key == party.key:
            return f"the {role}'s key ({party.id})"
    if key == terms.ledger_key:
        return "the ledger's key"
    for node in terms.nodes:
        if key == node.key:
            return f"the key of node {node.node_id} in the terms (a meter of this placement)"
    return None


def _precheck_new_buyer(
    terms: PlacementTerms, new_buyer: str, key: bytes, id_said: str, key_said: str
) -> None:
    """SPEC §6.8 (3): the new buyer is no party of the terms, its key no party's, not the
    ledger's, not a node key of the terms (keys bound since: the ledger decides).
    ``id_said``, ``key_said``: how the message names them (the option, or the file)."""
    for role in ("operator", "buyer", "desk"):
        if new_buyer == getattr(terms, role).id:
            raise UsageError(
                f"{id_said} {new_buyer!r} is a party of the terms (the {role}'s id); a resale "
                "goes to someone else (SPEC §6.8: ASSIGNMENT_INVALID)"
            )
    holder = _key_holder(terms, key)
    if holder is not None:
        raise UsageError(
            f"{key_said} is {holder}: a new buyer signs with its own key, never "
            "a party's, the ledger's or a node's (SPEC §6.8: ASSIGNMENT_INVALID)"
        )


def _precheck_node_key(terms: PlacementTerms, node_id: str, key: bytes, key_said: str) -> None:
    """SPEC §6.3 keybinding: a node key is nobody's party key (the operator's, buyer's,
    desk's, ledger's). A binding that only shortens one the terms make stays allowed (no
    party key is a node key of the terms); an accepted new buyer's key: the ledger decides."""
    if key in {n.key for n in terms.nodes if n.node_id == node_id}:
        return
    holder = _key_holder(terms, key)
    if holder is not None:
        raise UsageError(
            f"{key_said} is {holder}: a node key is nobody's party key, so one key "
            "never both meters usage and signs for money (SPEC §6.3: BINDING_INVALID)"
        )


def _span(ms: int) -> str:
    """A duration as a person says it: 61 s, 24 h, 25.5 h, 365 days (to a tenth)."""
    for unit_ms, below, name in ((1000, 120_000, "s"), (60_000, 7_200_000, "min")):
        if ms < below:
            return f"{round(ms / unit_ms, 1):g} {name}"
    if ms < 172_800_000:
        return f"{round(ms / 3_600_000, 1):g} h"
    return f"{round(ms / 86_400_000, 1):.15g} days"


def _precheck_fresh(token: str, issued_ms: int, what: str, given: str, hint: str = "") -> None:
    """SPEC §6.9 (6): ``iat`` within [issued - MAX_EVIDENCE_AGE_MS, issued +
    MAX_CLOCK_SKEW_MS] of the binding's issued time (the ledger judges against the
    record's arrival, or its issued time when untimed). ``what`` names the token (the
    option and file), ``given`` the issued time."""
    iat_ms = parse_evidence(token).claims.iat * 1000
    if iat_ms < issued_ms - MAX_EVIDENCE_AGE_MS:
        raise UsageError(
            f"{what}: issued at {_iso(iat_ms)} (iat), {_span(issued_ms - iat_ms)} before "
            f"{given} {_iso(issued_ms)}: older than MAX_EVIDENCE_AGE_MS "
            f"({_span(MAX_EVIDENCE_AGE_MS)}); the ledger refuses stale evidence (SPEC §6.9: "
            "EVIDENCE_INVALID); attest the node again for a fresh token"
        )
    if iat_ms > issued_ms + MAX_CLOCK_SKEW_MS:
        raise UsageError(
            f"{what}: issued at {_iso(iat_ms)} (iat), {_span(iat_ms - issued_ms)} after "
            f"{given} {_iso(issued_ms)}: more than MAX_CLOCK_SKEW_MS "
            f"({_span(MAX_CLOCK_SKEW_MS)}) in its future; the ledger refuses evidence from "
            f"the future (SPEC §6.9: EVIDENCE_INVALID); check the clocks{hint}"
        )


def _precheck_opened(terms: PlacementTerms, record: _RECORD, path: Path) -> None:
    """The same pre-checks for a signed record file given to cosign or publish."""
    if isinstance(record, Assignment):
        new_buyer = record.new_buyer
        said = f"{path}: the new buyer"
        _precheck_new_buyer(terms, new_buyer.id, new_buyer.key, said, f"{said}'s key")
    if isinstance(record, NodeKeyBinding):
        _precheck_node_key(terms, record.node_id, record.key, f"{path}: the node key")
        if record.evidence:
            try:
                parse_evidence(record.evidence)
            except EvidenceError:
                return  # not a token at all: the ledger's EVIDENCE_INVALID (the dry run says)
            what = f"{path}: its evidence"
            _precheck_fresh(record.evidence, record.issued_at_ms, what, "its issued_at_ms")


# ---- the commands -------------------------------------------------------------------------


def _reclaim(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    issued = parse_time_ms(args.issued_at, "--issued-at")
    effective = parse_time_ms(args.effective_at, "--effective-at")
    record = ReclaimNotice(
        placement_id=terms.placement_id,
        reclaim_id=args.id or f"reclaim-{issued}",
        issued_at_ms=issued,
        effective_at_ms=effective,
        gpus=[g.uuid for g in terms.gpus],
        reason=args.reason,
    )
    _check_record(record)
    envelope = _sign_new(args, terms, record)
    out = None if args.dry_run else _default_out(args, f"reclaim-{record.reclaim_id}")
    return _finish(args, terms, record, envelope, out)


def _release(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    issued = parse_time_ms(args.issued_at, "--issued-at")
    effective = parse_time_ms(args.effective_at, "--effective-at")
    if effective < issued:
        given = "--issued-at" if args.issued_at != "now" else "--issued-at (default: now)"
        hint = "" if args.issued_at != "now" else "; give --issued-at, when the buyer issues it"
        raise UsageError(
            f"--effective-at {_iso(effective)} is before {given} {_iso(issued)}: a release "
            f"cannot end the placement before it is issued (SPEC §6.7: RELEASE_INVALID){hint}"
        )
    if not terms.window_start_ms <= effective < terms.window_end_ms:
        raise UsageError(
            f"--effective-at {_iso(effective)} is outside the window [{_iso(terms.window_start_ms)}"
            f", {_iso(terms.window_end_ms)}) (SPEC §6.7: RELEASE_INVALID)"
        )
    record = BuyerRelease(
        placement_id=terms.placement_id,
        release_id=args.id or f"release-{issued}",
        issued_at_ms=issued,
        effective_at_ms=effective,
        reason=args.reason,
    )
    _check_record(record)
    envelope = _sign_new(args, terms, record)
    out = None if args.dry_run else _default_out(args, f"release-{record.release_id}")
    return _finish(args, terms, record, envelope, out)


def _adjust(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    direction: Literal["credit", "charge"] = "credit" if args.credit is not None else "charge"
    amount = parse_amount_minor(args.credit or args.charge, terms, f"--{direction}")
    issued = parse_time_ms(args.issued_at, "--issued-at")
    record = Adjustment(
        placement_id=terms.placement_id,
        adjustment_id=args.id or f"adj-{issued}",
        direction=direction,
        amount_minor=amount,
        reference=args.reference,
        reason=args.reason,
        issued_at_ms=issued,
    )
    _check_record(record)
    envelope = _sign_new(args, terms, record)
    out = None if args.dry_run else _default_out(args, f"adjustment-{record.adjustment_id}")
    return _finish(args, terms, record, envelope, out)


def _bind_key(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    if args.node not in {n.node_id for n in terms.nodes}:
        nodes = ", ".join(n.node_id for n in terms.nodes)
        raise UsageError(f"node {args.node!r} is not in the terms (nodes: {nodes})")
    try:
        public = load_public_key(args.node_key).key
    except KeyFileError as exc:
        raise UsageError(f"--node-key: {exc}") from exc
    until = (
        MAX_SAFE_INTEGER
        if args.valid_until == "forever"
        else parse_time_ms(args.valid_until, "--valid-until")
    )
    start = 0 if args.valid_from == "start" else parse_time_ms(args.valid_from, "--valid-from")
    issued = parse_time_ms(args.issued_at, "--issued-at")
    if start >= until:
        raise UsageError("--valid-from must be before --valid-until")
    _precheck_node_key(terms, args.node, public, f"--node-key {args.node_key}")  # §6.3
    evidence = ""
    if args.evidence is not None:
        evidence = _evidence(args, terms, args.node, public)
        given = "--issued-at" + (" (default: now)" if args.issued_at == "now" else "")
        what = f"--evidence {args.evidence}"
        _precheck_fresh(evidence, issued, what, given, ", or give --issued-at")  # §6.9 (6)
    record = NodeKeyBinding(
        placement_id=terms.placement_id,
        node_id=args.node,
        key=public,
        valid_from_ms=start,
        valid_until_ms=until,
        issued_at_ms=issued,
        evidence=evidence,
    )
    _check_record(record)
    envelope = _sign_new(args, terms, record)
    if record.evidence:  # once the record is whole: a warning, never beside a refusal
        _warn_unrooted(args.evidence, parse_evidence(record.evidence), args.trust)
    out = (
        None
        if args.dry_run
        else _default_out(args, f"keybinding-{record.node_id}-{key_id(public)}")
    )
    return _finish(args, terms, record, envelope, out)


def _assign(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
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
    _precheck_new_buyer(terms, args.new_buyer, public, "--new-buyer", key_said)  # §6.8 (3)
    handover = parse_time_ms(args.handover_at, "--handover-at")
    if not terms.window_start_ms <= handover < terms.window_end_ms:
        raise UsageError(
            f"--handover-at {_iso(handover)} is outside the window "
            f"[{_iso(terms.window_start_ms)}, {_iso(terms.window_end_ms)})"
        )
    issued = parse_time_ms(args.issued_at, "--issued-at")
    record = Assignment(
        placement_id=terms.placement_id,
        assignment_id=args.id or f"assign-{issued}",
        new_buyer=Party(id=args.new_buyer, key=public),
        handover_at_ms=handover,
        gpus=gpus,
        rate_per_gpu_hour_minor=parse_amount_minor(args.rate, terms, "--rate"),
        issued_at_ms=issued,
    )
    _check_record(record)
    envelope = _sign_new(args, terms, record)
    out = None if args.dry_run else _default_out(args, f"assignment-{record.assignment_id}")
    return _finish(args, terms, record, envelope, out)


def _evidence(args: argparse.Namespace, terms: PlacementTerms, node_id: str, key: bytes) -> str:
    """SPEC §6.9: the compact JWS of ``--evidence``, checked as the ledger will; a one-line
    UsageError otherwise. Its signature is checked against the attestation roots of
    ``--trust`` when given; one the command cannot tie to a root is a one-line warning
    naming the issuer, and proceeds: the ledger decides with its own roots."""
    token = _evidence_token(args.evidence, terms, node_id, key)
    if args.trust is not None:
        try:
            load_trust(args.trust)
        except TrustError as exc:
            raise UsageError(f"--trust: {exc}") from exc
    return token


def _warn_unrooted(path: Path, evidence: Evidence, trust_path: Path | None) -> None:
    issuer = f"issuer {evidence.claims.iss!r} (kid {evidence.header.kid!r})"
    after = (
        "proceeding: the ledger decides with its own [[attestation_roots]] (a key no root "
        "attests is NOT_ATTESTED where the terms require attestation, SPEC §6.9)"
    )
    if trust_path is None:
        print(
            f"warning: --evidence {path}: the signature of {issuer} is not checked here (no "
            f"--trust FILE with attestation keys); {after}",
            file=sys.stderr,
        )
        return
    try:
        roots = load_trust(trust_path).attestation_roots()
    except TrustError as exc:
        raise UsageError(f"--trust: {exc}") from exc
    root = attested_by(evidence, roots)
    if root is None:
        pinned = ", ".join(r.id for r in roots) or "none"
        print(
            f"warning: --evidence {path}: {issuer} is signed by no attestation key pinned in "
            f"{trust_path} (pinned: {pinned}); {after}",
            file=sys.stderr,
        )
    else:
        print(f"evidence: signed by the attestation key {root!r} of {trust_path} ({issuer})")


def _evidence_token(path: Path, terms: PlacementTerms, node_id: str, key: bytes) -> str:
    """The token of ``path``, checked as the ledger will (all but the signature)."""
    try:
        raw = read_at_most(path, MAX_EVIDENCE_CHARS + 2)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        token = raw.decode("ascii").strip()
        evidence = parse_evidence(token)
    except (UnicodeDecodeError, EvidenceError) as exc:
        raise UsageError(f"--evidence {path}: not an attestation token: {exc}") from exc
    claims = evidence.claims
    if claims.node_key_sha256 != node_key_hash(key):
        raise UsageError(f"--evidence {path}: the token names another node key")
    if claims.eat_nonce != evidence_nonce(terms.placement_id, node_id, key):
        raise UsageError(
            f"--evidence {path}: eat_nonce is not this binding's nonce "
            f"{evidence_nonce(terms.placement_id, node_id, key)} (SPEC §6.9)"
        )
    on_node = {g.uuid: g.model for g in terms.gpus if g.node_id == node_id}
    for uuid, model in evidence.gpus().items():
        if on_node.get(uuid) != model:
            raise UsageError(
                f"--evidence {path}: GPU {uuid} ({model}) is not on {node_id} in the terms"
            )
    if not claims.overall_result:
        raise UsageError(f"--evidence {path}: the attestation service's overall result is false")
    return token


# A record's field -> the option the user gave it with (messages use the user's words).
_OPTION_OF: Final = {
    "reclaim_id": "--id",
    "release_id": "--id",
    "adjustment_id": "--id",
    "assignment_id": "--id",
    "new_buyer.id": "--new-buyer",
    "new_buyer.key": "--new-buyer-key",
    "reason": "--reason",
    "reference": "--reference",
    "gpus": "--gpus",
    "rate_per_gpu_hour_minor": "--rate",
    "amount_minor": "the amount",
    "issued_at_ms": "--issued-at",
    "effective_at_ms": "--effective-at",
    "handover_at_ms": "--handover-at",
    "valid_from_ms": "--valid-from",
    "valid_until_ms": "--valid-until",
    "node_id": "--node",
    "key": "--node-key",
    "evidence": "--evidence",
    "placement_id": "the terms' placement_id",
}
_AT: Final = re.compile(r"^(?:\w+: )?(?P<message>.*) - at `\$\.(?P<path>[\w.\[\]]+)`$", re.S)


def _field_value(record: _RECORD, path: str) -> object:
    value: object = record
    for part in re.findall(r"\w+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])] if isinstance(value, list) else None
        else:
            value = getattr(value, part, None)
    return value


def _check_record(record: _RECORD) -> None:
    """The wire's checks (identifiers, text, bounds), reported by the option given."""
    try:
        decode_payload(signed_bytes(record))
    except ProtoError as exc:
        found = _AT.match(exc.detail)
        path = "" if found is None else found["path"]
        option = _OPTION_OF.get(path) or _OPTION_OF.get(re.sub(r"\[\d+\]$", "", path))
        if found is None or option is None:
            raise UsageError(f"the record is not valid: {exc}") from exc
        if option == "the amount" and isinstance(record, Adjustment):
            option = f"--{record.direction}"
        words = in_words(option, _field_value(record, path), found["message"], sep=" ")
        raise UsageError(words) from exc


def _open_record(path: Path, terms: PlacementTerms) -> tuple[Opened, _RECORD]:
    try:
        raw = read_at_most(path, MAX_ENVELOPE_BYTES + 2)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        opened = open_envelope(raw.rstrip(b"\n"))
    except ProtoError as exc:
        raise UsageError(f"{path} is not a signed record: {exc}") from exc
    record = opened.record
    if not isinstance(
        record, ReclaimNotice | Adjustment | NodeKeyBinding | Assignment | BuyerRelease
    ):
        raise UsageError(
            f"{path} holds a {opened.kind} record; this command takes reclaim, adjustment, "
            "keybinding, assignment and release records (terms: gridledger terms sign/publish)"
        )
    if record.placement_id != terms.placement_id:
        raise UsageError(
            f"{path} is for placement {record.placement_id}, the terms for {terms.placement_id}"
        )
    return opened, record


def _cosign(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    opened, record = _open_record(args.record, terms)
    _precheck_opened(terms, record, args.record)
    keys = _load_keys(args.key)
    _check_signers(terms, record, keys, _what(record))
    signed = {s.keyid for s in opened.envelope.signatures}
    for key in keys:
        if key.key_id in signed:
            who = _role_of(terms, key.key_id, record)
            print(f"note: the {who} ({key.name}) had signed already; its signature is renewed")
    envelope = add_signatures(opened.envelope, keys)
    out = args.out or args.record
    return _finish(args, terms, record, envelope, None if args.dry_run else out)


def _publish(args: argparse.Namespace) -> int:
    terms = _load_terms(args.terms)
    opened, record = _open_record(args.record, terms)
    _precheck_opened(terms, record, args.record)
    if target_of(args) is None and not args.dry_run:
        raise UsageError("publish needs --kafka HOST:PORT or --local-dir DIR (or --dry-run)")
    return _finish(args, terms, record, opened.envelope, None)


# ---- registration -------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, *, keys: bool, out: bool, target_required: bool) -> None:
    p.add_argument(
        "--terms",
        type=Path,
        required=True,
        metavar="FILE",
        help="the placement's signed terms (terms.signed.json): parties, keys, GPUs",
    )
    if keys:
        p.add_argument(
            "--key",
            type=Path,
            action="append",
            required=True,
            metavar="FILE",
            help="a signing party's private key file (repeat for several signers)",
        )
    if out:
        p.add_argument("--out", type=Path, metavar="FILE", help="where to write the signed record")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the statement now and with this record; write and publish nothing",
    )
    p.add_argument(
        "--arrives-at",
        default="now",
        metavar="TIME",
        help="dry run: when the record reaches the log (ISO time or epoch ms; default now) — "
        "the ledger times it by arrival (SPEC §6.6), e.g. a reclaim's notice",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--export", type=Path, metavar="FILE", help="dry run: the current state from this export"
    )
    source.add_argument(
        "--ledger",
        metavar="URL",
        help="dry run: the current state from the running ledger's API (http://HOST:PORT)",
    )
    add_target_arguments(p, required=target_required)


def _issued(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--issued-at",
        default="now",
        metavar="TIME",
        help="when it is issued (ISO time or epoch ms; default now)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add reclaim, adjust, bind-key, cosign and publish."""

    def parser(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text + ".\n\n" + (__doc__ or ""),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    reclaim = parser("reclaim", "operator: take the placement's GPUs back (a ReclaimNotice)")
    reclaim.add_argument(
        "--effective-at",
        required=True,
        metavar="TIME",
        help="when the GPUs are taken back (ISO time or epoch ms)",
    )
    _issued(reclaim)
    reclaim.add_argument(
        "--reason", default="", help="free text shown to the buyer (at most 512 characters)"
    )
    reclaim.add_argument("--id", metavar="ID", help="the reclaim id (default reclaim-<issued ms>)")
    _common(reclaim, keys=True, out=True, target_required=False)
    reclaim.set_defaults(handler=lambda a: _run(_reclaim, a))

    rel = parser("release", "buyer: end the placement early (a BuyerRelease, SPEC §6.7)")
    rel.add_argument(
        "--effective-at",
        required=True,
        metavar="TIME",
        help="when the placement ends (ISO time or epoch ms); never before it reaches the log",
    )
    _issued(rel)
    rel.add_argument(
        "--reason", default="", help="free text shown to the operator (at most 512 characters)"
    )
    rel.add_argument("--id", metavar="ID", help="the release id (default release-<issued ms>)")
    _common(rel, keys=True, out=True, target_required=False)
    rel.set_defaults(handler=lambda a: _run(_release, a))

    adjust = parser("adjust", "a credit to the buyer or a charge, signed by whom it costs")
    direction = adjust.add_mutually_exclusive_group(required=True)
    direction.add_argument(
        "--credit", metavar="AMOUNT", help="credit the buyer AMOUNT (signed: operator and desk)"
    )
    direction.add_argument(
        "--charge", metavar="AMOUNT", help="charge the buyer AMOUNT (signed: buyer; desk may)"
    )
    adjust.add_argument("--reason", required=True, help="why, in words both parties read")
    adjust.add_argument(
        "--reference", default="", help="an outside reference (ticket, invoice number)"
    )
    adjust.add_argument(
        "--id",
        metavar="ID",
        help="the adjustment id; give one so a repeated command is a duplicate, not a "
        "second adjustment (default adj-<issued ms>)",
    )
    _issued(adjust)
    _common(adjust, keys=True, out=True, target_required=False)
    adjust.set_defaults(handler=lambda a: _run(_adjust, a))

    bind = parser("bind-key", "operator and buyer: a node signs with this key (NodeKeyBinding)")
    bind.add_argument("--node", required=True, help="the node id, as the terms name it")
    bind.add_argument(
        "--node-key", required=True, type=Path, metavar="FILE", help="the node's public key (.pub)"
    )
    bind.add_argument(
        "--valid-from",
        default="start",
        metavar="TIME",
        help="usage from this time is signed with the key (default: start, i.e. 0)",
    )
    bind.add_argument(
        "--valid-until",
        default="forever",
        metavar="TIME",
        help="until this time (default: forever); an earlier time than bound revokes",
    )
    bind.add_argument(
        "--evidence",
        type=Path,
        metavar="FILE",
        help="hardware evidence for the key (SPEC §6.9): the attestation service's compact "
        "JWS; with the key's current window, the operator alone signs",
    )
    bind.add_argument(
        "--trust",
        type=Path,
        metavar="FILE",
        help="with --evidence: check the token's signature against the attestation keys "
        "pinned in this trust file (a token none of them signed is a warning)",
    )
    _issued(bind)
    _common(bind, keys=True, out=True, target_required=False)
    bind.set_defaults(handler=lambda a: _run(_bind_key, a))

    assign = parser(
        "assign", "buyer, new buyer and desk: resell GPUs of the window (an Assignment)"
    )
    assign.add_argument("--new-buyer", required=True, metavar="ID", help="the new buyer's id")
    assign.add_argument(
        "--new-buyer-key",
        required=True,
        type=Path,
        metavar="FILE",
        help="the new buyer's public key (.pub); it signs the assignment too",
    )
    assign.add_argument(
        "--handover-at",
        required=True,
        metavar="TIME",
        help="from when the new buyer pays (ISO time or epoch ms; the ledger takes the later "
        "of this and the record's arrival)",
    )
    assign.add_argument(
        "--rate", required=True, metavar="AMOUNT", help="the resale price per GPU-hour (12.50)"
    )
    assign.add_argument(
        "--gpus", metavar="UUID,...", help="the GPUs sold (default: every GPU of the terms)"
    )
    assign.add_argument("--id", metavar="ID", help="the assignment id (default assign-<issued>)")
    _issued(assign)
    _common(assign, keys=True, out=True, target_required=False)
    assign.set_defaults(handler=lambda a: _run(_assign, a))

    cosign = parser(
        "cosign",
        "add your signature to a signed record (reclaim, release, adjustment, key binding, "
        "assignment)",
    )
    cosign.add_argument("record", type=Path, metavar="RECORD", help="the signed record file")
    _common(cosign, keys=True, out=True, target_required=False)
    cosign.set_defaults(handler=lambda a: _run(_cosign, a))

    pub = parser(
        "publish",
        "publish a fully signed record (reclaim, release, adjustment, key binding, assignment)",
    )
    pub.add_argument("record", type=Path, metavar="RECORD", help="the signed record file")
    _common(pub, keys=False, out=False, target_required=False)
    pub.set_defaults(handler=lambda a: _run(_publish, a))
