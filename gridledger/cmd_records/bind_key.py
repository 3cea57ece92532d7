"""`gridledger bind-key`: a node signs with this key (a NodeKeyBinding), with hardware
evidence for it when given (SPEC §6.9)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gridledger.cmd_records.common import (
    UsageError,
    add_issued,
    default_out,
    issued_at,
    load_terms,
    parse_time_ms,
)
from gridledger.cmd_records.finish import finish, sign_new
from gridledger.cmd_records.precheck import precheck_fresh, precheck_node_key
from proto.attestation import (
    Evidence,
    EvidenceError,
    attested_by,
    evidence_nonce,
    node_key_hash,
    parse_evidence,
)
from proto.durable_io import read_at_most
from proto.errors import KeyFileError
from proto.keys import key_id, load_public_key
from proto.limits import MAX_EVIDENCE_CHARS, MAX_SAFE_INTEGER
from proto.records import NodeKeyBinding, PlacementTerms
from proto.trust import TrustError, load_trust


def command(args: argparse.Namespace) -> int:
    terms = load_terms(args.terms)
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
    issued = issued_at(args)
    if start >= until:
        raise UsageError("--valid-from must be before --valid-until")
    precheck_node_key(terms, args.node, public, f"--node-key {args.node_key}")  # §6.3
    evidence = ""
    if args.evidence is not None:
        evidence = _evidence(args, terms, args.node, public)
        given = "--issued-at" + (" (default: now)" if args.issued_at == "now" else "")
        what = f"--evidence {args.evidence}"
        precheck_fresh(evidence, issued, what, given, ", or give --issued-at")  # §6.9 (6)
    record = NodeKeyBinding(
        placement_id=terms.placement_id,
        node_id=args.node,
        key=public,
        valid_from_ms=start,
        valid_until_ms=until,
        issued_at_ms=issued,
        evidence=evidence,
    )
    envelope = sign_new(args, terms, record)
    if record.evidence:  # once the record is whole: a warning, never beside a refusal
        _warn_unrooted(args.evidence, parse_evidence(record.evidence), args.trust)
    out = (
        None if args.dry_run else default_out(args, f"keybinding-{record.node_id}-{key_id(public)}")
    )
    return finish(args, terms, record, envelope, out)


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


def options(p: argparse.ArgumentParser) -> None:
    """The options of `gridledger bind-key` before the common ones."""
    p.add_argument("--node", required=True, help="the node id, as the terms name it")
    p.add_argument(
        "--node-key", required=True, type=Path, metavar="FILE", help="the node's public key (.pub)"
    )
    p.add_argument(
        "--valid-from",
        default="start",
        metavar="TIME",
        help="usage from this time is signed with the key (default: start, i.e. 0)",
    )
    p.add_argument(
        "--valid-until",
        default="forever",
        metavar="TIME",
        help="until this time (default: forever); an earlier time than bound revokes",
    )
    p.add_argument(
        "--evidence",
        type=Path,
        metavar="FILE",
        help="hardware evidence for the key (SPEC §6.9): the attestation service's compact "
        "JWS; with the key's current window, the operator alone signs",
    )
    p.add_argument(
        "--trust",
        type=Path,
        metavar="FILE",
        help="with --evidence: check the token's signature against the attestation keys "
        "pinned in this trust file (a token none of them signed is a warning)",
    )
    add_issued(p)
