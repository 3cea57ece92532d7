"""`gridledger check FILE...`: meter, ledger, terms and trust files checked together.

Each file is recognised by what it holds (``node_id``: a meter.toml; ``ledger_id``: a
ledger.toml; ``placement_id`` or a signed envelope: terms; ``gridledger-trust/v1``: a
trust file; a signed assignment: a resale) and checked alone (it parses, its key file
loads, its directories exist, its terms are valid and fully signed), then against the
others:

* every terms file names the ledger's key as ``ledger_key`` (else the ledger rejects the
  terms TERMS_INVALID);
* a meter's node is in each of its terms, with the key its key file holds;
* meters and the ledger share one ``local_dir`` (local transport) or one Kafka bootstrap
  and topic;
* a trust file pins the parties of the terms under the ids the terms use, and the ledger;
* an assignment (SPEC §6.8) carries every signature it needs, and each trust file pins its
  new buyer as a buyer under the id it names (else ``verify`` reports
  ASSIGNMENT_KEY_NOT_PINNED);
* terms with ``attestation_required`` meet a ledger with ``[[attestation_roots]]`` and a
  trust file with ``attestation`` keys (else a ``warning:`` line: nothing is wrong yet, but
  no usage would fold, SPEC §6.9).

Every problem is one ``FAIL:`` line naming the file. Exit codes: 0 everything agrees;
1 at least one problem; 2 a file that cannot be read or recognised.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from billview.units import iso_utc
from proto.envelope import Opened, open_envelope
from proto.errors import KeyFileError, ProtoError
from proto.keys import key_id, load_signing_key
from proto.records import Assignment, PlacementTerms
from proto.terms import TermsError, load_terms_file, terms_signature_problem, validate_terms
from proto.trust import TRUST_FORMAT, TrustError, TrustFile, load_trust


@dataclass
class _Found:
    """What the files hold, and what is wrong."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    terms: dict[Path, PlacementTerms] = field(default_factory=dict)
    meters: list[tuple[Path, Any, bytes | None]] = field(default_factory=list)
    ledgers: list[tuple[Path, Any, bytes | None]] = field(default_factory=list)
    trusts: list[tuple[Path, TrustFile]] = field(default_factory=list)
    assignments: list[tuple[Path, Opened, Assignment]] = field(default_factory=list)
    unusable: bool = False


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `check`."""
    check = sub.add_parser(
        "check",
        help="check meter, ledger, terms and trust files against each other",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="meter.toml, ledger.toml, terms (TOML or signed JSON), trust.json",
    )
    check.set_defaults(handler=_check)


def _kind(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if raw.lstrip().startswith(b"{"):
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if isinstance(data, dict) and data.get("format") == TRUST_FORMAT:
            return "trust"
        if not (isinstance(data, dict) and "payload" in data):
            return None
        try:
            kind = open_envelope(raw.strip()).kind
        except ProtoError:
            return "terms"  # loading it as terms says what is wrong
        return "assignment" if kind == "assignment" else "terms"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    for key, kind in (("node_id", "meter"), ("ledger_id", "ledger"), ("placement_id", "terms")):
        if key in data:
            return kind
    return None


def _public(path: Path, found: _Found, where: Path) -> bytes | None:
    try:
        return load_signing_key(path).public_key
    except KeyFileError as exc:
        found.problems.append(f"{where}: key_file: {exc}")
        return None


def _terms(path: Path, found: _Found, listed_by: Path | None = None) -> PlacementTerms | None:
    where = f"{path}" + (f" (listed by {listed_by})" if listed_by else "")
    if path in found.terms:
        return found.terms[path]
    try:
        terms, envelope = load_terms_file(path)
    except TermsError as exc:
        found.problems += [p if p.startswith(str(path)) else f"{where}: {p}" for p in exc.problems]
        return None
    found.problems += [f"{where}: {p}" for p in validate_terms(terms)]
    if envelope is None:
        found.notes.append(f"{where}: unsigned TOML terms (sign them: gridledger terms sign)")
    else:
        failure = terms_signature_problem(envelope, terms)
        if failure is not None:
            found.problems.append(f"{where}: not fully signed: {failure}")
    found.terms[path] = terms
    return terms


def _load(files: list[Path], found: _Found) -> None:
    from ledger.config import ConfigError as LedgerConfigError
    from ledger.config import load_config
    from meter.config import ConfigError as MeterConfigError
    from meter.config import load_meter_config

    for path in files:
        kind = _kind(path)
        if kind is None:
            found.problems.append(
                f"{path}: cannot read it as a meter.toml, ledger.toml, terms or trust file"
            )
            found.unusable = True
        elif kind == "meter":
            try:
                meter = load_meter_config(path)
            except MeterConfigError as exc:
                found.problems += exc.problems
                continue
            found.meters.append((path, meter, _public(meter.key_file, found, path)))
            if not meter.spool_dir.parent.is_dir():
                what = "local_dir" if meter.transport == "local" else "spool_dir's parent"
                found.problems.append(f"{path}: {what} {meter.spool_dir.parent} does not exist")
            for terms_path in meter.terms:
                _terms(terms_path, found, listed_by=path)
        elif kind == "ledger":
            try:
                ledger = load_config(path)
            except LedgerConfigError as exc:
                found.problems.append(str(exc))
                continue
            found.ledgers.append((path, ledger, _public(ledger.key_file, found, path)))
            if ledger.transport == "local" and not (
                ledger.local_dir is not None and ledger.local_dir.is_dir()
            ):
                found.problems.append(f"{path}: local_dir {ledger.local_dir} does not exist")
        elif kind == "terms":
            _terms(path, found)
        elif kind == "assignment":
            opened = open_envelope(path.read_bytes().strip())
            if isinstance(opened.record, Assignment):
                found.assignments.append((path, opened, opened.record))
        else:
            try:
                found.trusts.append((path, load_trust(path)))
            except TrustError as exc:
                found.problems.append(str(exc))


def _attestation(found: _Found) -> None:
    """SPEC §6.9: terms that require attestation fold usage only from keys whose evidence
    a root verifies; a ledger (or a trust file) with no root can attest none of them."""
    required = [(p, t) for p, t in found.terms.items() if t.attestation_required]
    for tpath, terms in required:
        for lpath, ledger, _ in found.ledgers:
            if not ledger.attestation_roots:
                found.warnings.append(
                    f"{tpath}: attestation_required = true, but {lpath} has no "
                    "[[attestation_roots]]: the ledger would reject every usage event of "
                    f"{terms.placement_id} NOT_ATTESTED"
                )
        for trust_path, trust in found.trusts:
            if not trust.attestation_roots():
                found.warnings.append(
                    f"{tpath}: attestation_required = true, but {trust_path} pins no "
                    "attestation key: the verifier cannot check who signed the GPUs' evidence "
                    "(gridledger trust init --attestation ID=FILE)"
                )


def _resales(found: _Found) -> None:
    """SPEC §6.8, §9: an assignment of one of the placements given is fully signed, and
    every trust file given pins its new buyer as a buyer under the id it names."""
    from gridledger.cmd_records import Refused, missing_signers

    for apath, opened, assigned in found.assignments:
        terms = next(
            (t for t in found.terms.values() if t.placement_id == assigned.placement_id), None
        )
        if terms is None:
            found.notes.append(
                f"{apath}: resale of {assigned.placement_id}, whose terms are not among the "
                "files given: its signatures are not checked"
            )
        else:
            try:
                missing = missing_signers(terms, opened.envelope, assigned)
            except Refused as exc:
                found.problems.append(f"{apath}: {exc}")
                missing = ()
            if missing:
                found.problems.append(
                    f"{apath}: not fully signed: missing {', '.join(missing)} (gridledger "
                    f"cosign {apath} --terms TERMS --key THEIR.key)"
                )
        buyer = assigned.new_buyer
        for trust_path, trust in found.trusts:
            pinned = trust.party_of(buyer.key, "buyer")
            if pinned is None:
                found.problems.append(
                    f"{trust_path}: does not pin the new buyer {buyer.id} of {apath} "
                    "(ASSIGNMENT_KEY_NOT_PINNED; gridledger trust init ... --new-buyer "
                    f"{buyer.id}=FILE.pub)"
                )
            elif pinned != buyer.id:
                found.problems.append(
                    f"{trust_path}: pins the new buyer of {apath} as {pinned!r}, the assignment "
                    f"names {buyer.id!r} (PARTY_ID_MISMATCH)"
                )


def _cross(found: _Found) -> None:
    _attestation(found)
    _resales(found)
    for lpath, ledger, lkey in found.ledgers:
        if lkey is None:
            continue
        for tpath, terms in found.terms.items():
            if terms.ledger_key != lkey:
                found.problems.append(
                    f"{tpath}: ledger_key {key_id(terms.ledger_key)} is not the key of the "
                    f"ledger of {lpath} ({key_id(lkey)}): that ledger would reject "
                    f"{terms.placement_id} TERMS_INVALID"
                )
        for mpath, meter, _ in found.meters:
            if meter.transport != ledger.transport:
                found.problems.append(
                    f"{mpath}: transport {meter.transport!r}, the ledger of {lpath} reads "
                    f"{ledger.transport!r}"
                )
            elif meter.transport == "local" and meter.spool_dir.parent.resolve() != (
                ledger.local_dir.resolve()
            ):
                found.problems.append(
                    f"{mpath}: local_dir {meter.spool_dir.parent} is not the local_dir of "
                    f"{lpath} ({ledger.local_dir}): the ledger would never read this meter"
                )
            elif (
                meter.transport == "kafka"
                and ledger.kafka is not None
                and meter.kafka is not None
                and meter.kafka.topic != ledger.kafka.topic
            ):
                found.problems.append(
                    f"{mpath}: topic {meter.kafka.topic!r}, the ledger of {lpath} reads "
                    f"{ledger.kafka.topic!r}"
                )
    for mpath, meter, mkey in found.meters:
        for tpath in meter.terms:
            listed = found.terms.get(tpath)
            if listed is None:
                continue
            node = next((n for n in listed.nodes if n.node_id == meter.node_id), None)
            if node is None:
                found.problems.append(
                    f"{mpath}: node {meter.node_id!r} is not in the nodes of {tpath}"
                )
            elif mkey is not None and node.key != mkey and not meter.key_rebound:
                found.problems.append(
                    f"{mpath}: key_file holds key {key_id(mkey)}, {tpath} names "
                    f"{key_id(node.key)} for {meter.node_id} (key_rebound is not set)"
                )
    for trust_path, trust in found.trusts:
        for tpath, terms in found.terms.items():
            for role in ("operator", "buyer", "desk"):
                party = getattr(terms, role)
                pinned = trust.party_of(party.key, role)
                if pinned is None:
                    found.problems.append(
                        f"{trust_path}: does not pin the {role} key of {tpath} ({party.id})"
                    )
                elif pinned != party.id:
                    found.problems.append(
                        f"{trust_path}: pins the {role} as {pinned!r}, {tpath} names "
                        f"{party.id!r} (PARTY_ID_MISMATCH)"
                    )
            if trust.party_of(terms.ledger_key, "ledger") is None:
                found.problems.append(f"{trust_path}: does not pin the ledger key of {tpath}")


def _placements(found: _Found) -> str:
    """Terms counted by placement: a meter.toml and the files beside it name one terms
    file several times, or copies of it."""
    placements = len({t.placement_id for t in found.terms.values()})
    files = len(found.terms)
    counted = f"terms of {placements} placement{'s' if placements != 1 else ''}"
    return counted + (f" ({files} files)" if files != placements else "")


def _windows(found: _Found, now_ms: int) -> None:
    """A meter's placements whose window is over (terms alone are fine: an auditor checks
    old ones): a problem when all of them are (started now, the meter would meter
    nothing), else a warning for each."""
    for path, meter, _ in found.meters:
        listed = [found.terms[p] for p in meter.terms if p in found.terms]
        over = [t for t in listed if t.window_end_ms <= now_ms]
        if listed and len(over) == len(listed):
            ends = iso_utc(max(t.window_end_ms for t in listed))
            found.problems.append(
                f"{path}: every placement in its terms ended (the last at {ends}): the meter "
                "would meter nothing; give it the terms of a current placement"
            )
            continue
        for terms in over:
            found.warnings.append(
                f"{path}: placement {terms.placement_id} ended {iso_utc(terms.window_end_ms)}; "
                "the meter meters nothing of it"
            )


def _check(args: argparse.Namespace) -> int:
    found = _Found()
    files: list[Path] = args.files
    _load(files, found)
    _cross(found)
    _windows(found, int(time.time() * 1000))
    for note in found.notes:
        print(f"note: {note}")
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for problem in found.problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if found.unusable:
        return 2
    if found.problems:
        return 1
    kinds = (
        f"{len(found.meters)} meter, {len(found.ledgers)} ledger, {_placements(found)}, "
        f"{len(found.trusts)} trust"
        + (f", {len(found.assignments)} assignment" if found.assignments else "")
    )
    print(f"OK: {kinds} file(s) agree")
    return 0
