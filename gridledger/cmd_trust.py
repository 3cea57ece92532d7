"""`gridledger trust init`: the trust file a party pins (SPEC §9), from .pub files.

    gridledger trust init --operator keys/acme-gpu-cloud.pub --buyer keys/inferco-batch.pub \\
        --desk keys/gridx-desk.pub --ledger keys/gridledger-ledger-1.pub \\
        [--new-buyer keys/finetune-labs.pub] [--out trust.json]

Each key is ``FILE.pub`` (the party id is the id written in the file) or ``ID=FILE.pub``
(the id you pin; the terms must name the party by that id, else the verifier reports
PARTY_ID_MISMATCH). ``--new-buyer [ID=]FILE.pub`` pins a resale's new buyer (SPEC §6.8,
§9: a buyer key under the id the assignment names; repeatable). A key pinned twice, or
one id pinned with two keys, is refused. ``--witness ID=FILE.pub`` pins an independent witness;
``--attestation ID=FILE`` an attestation service (SPEC §6.9; FILE: a PEM public key,
P-384 for ES384 or Ed25519 for EdDSA, a JWK of either, or a gridledger .pub file);
``--cosigners`` sets the witness policy (default: operator and buyer); ``--simulations``
admits a simulation's exports (arrival times its senders stated, SPEC §6.6, §9) as FINAL,
for demos, tests and replays only. With ``--terms``
the pinned ids and keys are checked against the terms before anything is written.

Exit codes: 0 written; 1 the keys or ids disagree with the terms, or the file exists
(``--force`` replaces it); 2 unusable input (a .pub file, an id, the terms).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from proto.attestation import RootKeyError, load_root_key
from proto.errors import KeyFileError
from proto.keys import load_public_key
from proto.records import PlacementTerms
from proto.terms import TermsError, load_terms_file
from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile, dump_trust

_ID_CHARS: Final = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")
_ROLES: Final = ("operator", "buyer", "desk", "ledger")


class _Bad(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `trust` command group."""
    trust = sub.add_parser("trust", help="write the trust file a party pins (SPEC §9)")
    trust_sub = trust.add_subparsers(dest="trust_command", metavar="SUBCOMMAND", required=True)
    init = trust_sub.add_parser(
        "init",
        help="trust.json from the parties' and the ledger's .pub files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for role in _ROLES:
        init.add_argument(
            f"--{role}",
            required=True,
            metavar="[ID=]FILE.pub",
            help=f"the {role}'s public key file (its id: the one in the file, or ID=)",
        )
    init.add_argument(
        "--new-buyer",
        action="append",
        default=[],
        metavar="[ID=]FILE.pub",
        help="a resale's new buyer (SPEC §6.8), pinned as a buyer under the id the "
        "assignment names (repeatable)",
    )
    init.add_argument(
        "--witness",
        action="append",
        default=[],
        metavar="ID=FILE.pub",
        help="an independent witness's public key (repeatable)",
    )
    init.add_argument(
        "--attestation",
        action="append",
        default=[],
        metavar="ID=FILE",
        help="an attestation service's public key: PEM (P-384 or Ed25519), JWK or .pub "
        "(repeatable; SPEC §6.9)",
    )
    init.add_argument(
        "--cosigners",
        metavar="LIST",
        help="comma-separated witness policy: operator, buyer, desk or witness ids "
        "(default operator,buyer; an empty string requires no witness)",
    )
    init.add_argument(
        "--simulations",
        action="store_true",
        help="let a simulation's exports (arrival = sender) be FINAL: never in production",
    )
    init.add_argument(
        "--terms", type=Path, metavar="FILE", help="check the pinned ids and keys against these"
    )
    init.add_argument(
        "--out", type=Path, default=Path("trust.json"), help="where to write (default trust.json)"
    )
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(handler=_init)


def _key(spec: str, role: str, option: str | None = None) -> TrustedKey:
    option = option or f"--{role}"
    name, sep, file = spec.partition("=")
    path = Path(file if sep else spec)
    try:
        public = load_public_key(path)
    except KeyFileError as exc:
        raise _Bad(f"{option}: {exc}", 2) from exc
    pinned = name if sep else public.id
    if not pinned or not pinned[0].isalnum() or set(pinned) - _ID_CHARS or len(pinned) > 128:
        raise _Bad(f"{option}: id {pinned!r} must be 1-128 characters of [A-Za-z0-9._:-]", 2)
    return TrustedKey(id=pinned, role=role, key=public.key)  # type: ignore[arg-type]


def _duplicate(keys: list[tuple[str, TrustedKey]]) -> str | None:
    """A key pinned twice, or one id pinned with two keys (SPEC §9: an id names one
    party, a key belongs to one): what to say, naming both options; None when none."""
    by_key: dict[bytes, tuple[str, TrustedKey]] = {}
    by_id: dict[str, tuple[str, TrustedKey]] = {}
    for option, k in keys:
        if k.key in by_key:
            first, other = by_key[k.key]
            return (
                f"{option}: the key of {k.id!r} is already pinned by {first} (as {other.id!r}); "
                "pin each key once"
            )
        if k.id in by_id:
            first, other = by_id[k.id]
            return (
                f"{option}: the id {k.id!r} is already pinned by {first} with another key; "
                "one id, one key (give ID=FILE.pub to pin it under another id)"
            )
        by_key[k.key] = (option, k)
        by_id[k.id] = (option, k)
    return None


def _root(spec: str) -> TrustedKey:
    """``ID=FILE``: an attestation root (SPEC §9 role ``attestation``) and its alg."""
    name, sep, file = spec.partition("=")
    if not sep or not name:
        raise _Bad(f"--attestation {spec!r}: give ID=FILE", 2)
    if not name[0].isalnum() or set(name) - _ID_CHARS or len(name) > 128:
        raise _Bad(f"--attestation: id {name!r} must be 1-128 characters of [A-Za-z0-9._:-]", 2)
    try:
        alg, key = load_root_key(Path(file))
    except RootKeyError as exc:
        raise _Bad(f"--attestation {name}: {exc}", 2) from exc
    return TrustedKey(id=name, role="attestation", key=key, alg=alg)


def _against_terms(keys: list[TrustedKey], terms: PlacementTerms, path: Path) -> list[str]:
    problems: list[str] = []
    by_role: dict[str, TrustedKey] = {}
    for k in keys:  # the first buyer is the terms' buyer; the others are new buyers
        by_role.setdefault(k.role, k)
    for role in ("operator", "buyer", "desk"):
        party = getattr(terms, role)
        pinned = by_role[role]
        if pinned.key != party.key:
            problems.append(f"the {role} key is not the {role} key in {path}")
        elif pinned.id != party.id:
            problems.append(
                f"the {role} is pinned as {pinned.id!r}, the terms name {party.id!r} "
                "(the verifier would report PARTY_ID_MISMATCH)"
            )
    if by_role["ledger"].key != terms.ledger_key:
        problems.append(f"the ledger key is not the ledger_key of {path}")
    return problems


def _init(args: argparse.Namespace) -> int:
    try:
        pins = [(f"--{role}", _key(getattr(args, role), role)) for role in _ROLES]
        pins += [("--new-buyer", _key(spec, "buyer", "--new-buyer")) for spec in args.new_buyer]
        for spec in args.witness:
            if "=" not in spec:
                raise _Bad(f"--witness {spec!r}: give ID=FILE.pub", 2)
            pins.append(("--witness", _key(spec, "witness")))
        pins += [("--attestation", _root(spec)) for spec in args.attestation]
        duplicate = _duplicate(pins)
        if duplicate is not None:
            raise _Bad(duplicate, 2)
        keys = [k for _, k in pins]
        cosigners = None
        if args.cosigners is not None:
            cosigners = [c.strip() for c in args.cosigners.split(",") if c.strip()]
            known = {"operator", "buyer", "desk"} | {k.id for k in keys if k.role == "witness"}
            unknown = [c for c in cosigners if c not in known]
            if unknown:
                raise _Bad(
                    f"--cosigners: {', '.join(unknown)} is neither operator, buyer, desk nor "
                    "a --witness id",
                    2,
                )
        if args.terms is not None:
            try:
                terms, _ = load_terms_file(args.terms)
            except TermsError as exc:
                raise _Bad("; ".join(exc.problems), 2) from exc
            problems = _against_terms(keys, terms, args.terms)
            if problems:
                for problem in problems[:-1]:
                    print(f"FAIL: {problem}", file=sys.stderr)
                raise _Bad(problems[-1], 1)
        out: Path = args.out
        if out.exists() and not args.force:
            raise _Bad(f"{out} exists; not replacing a trust file (--force replaces it)", 1)
        trust = TrustFile(
            format=TRUST_FORMAT, keys=keys, cosigners=cosigners, simulations=args.simulations
        )
        data = dump_trust(trust)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(out)
        except OSError as exc:
            raise _Bad(f"cannot write {out}: {exc.strerror or exc}", 2) from exc
    except _Bad as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return exc.code
    new_buyers = {id(k) for option, k in pins if option == "--new-buyer"}
    for k in keys:
        role = "new buyer" if id(k) in new_buyers else k.role
        print(f"   {role:<9} {k.id}" + (f" ({k.alg})" if k.alg else ""))
    policy = "operator, buyer (default)" if cosigners is None else ", ".join(cosigners) or "none"
    print(f"OK: {out} pins {len(keys)} keys; a final verdict needs cosignatures of: {policy}")
    if args.simulations:
        print("   it admits simulations (arrival = sender) as FINAL: not for production")
    return 0
