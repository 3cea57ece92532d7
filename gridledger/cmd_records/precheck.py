"""Pre-checks: what the ledger will refuse, known from the terms (SPEC §6.3, §6.8, §6.9).

Each refuses before anything is signed, in one line naming the option (exit 2). What the
command cannot know from the files it is given (bindings or assignments the ledger accepted
since the terms) it leaves to the ledger: a dry run against an export says it."""

from __future__ import annotations

from pathlib import Path

from gridledger.cmd_records.common import RECORD, UsageError, iso, span
from proto.attestation import EvidenceError, parse_evidence
from proto.limits import MAX_CLOCK_SKEW_MS, MAX_EVIDENCE_AGE_MS
from proto.records import Assignment, NodeKeyBinding, Party, PlacementTerms


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


def precheck_new_buyer(
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


def precheck_node_key(terms: PlacementTerms, node_id: str, key: bytes, key_said: str) -> None:
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


def precheck_fresh(token: str, issued_ms: int, what: str, given: str, hint: str = "") -> None:
    """SPEC §6.9 (6): ``iat`` within [issued - MAX_EVIDENCE_AGE_MS, issued +
    MAX_CLOCK_SKEW_MS] of the binding's issued time (the ledger judges against the
    record's arrival, or its issued time when untimed). ``what`` names the token (the
    option and file), ``given`` the issued time."""
    iat_ms = parse_evidence(token).claims.iat * 1000
    if iat_ms < issued_ms - MAX_EVIDENCE_AGE_MS:
        raise UsageError(
            f"{what}: issued at {iso(iat_ms)} (iat), {span(issued_ms - iat_ms)} before "
            f"{given} {iso(issued_ms)}: older than MAX_EVIDENCE_AGE_MS "
            f"({span(MAX_EVIDENCE_AGE_MS)}); the ledger refuses stale evidence (SPEC §6.9: "
            "EVIDENCE_INVALID); attest the node again for a fresh token"
        )
    if iat_ms > issued_ms + MAX_CLOCK_SKEW_MS:
        raise UsageError(
            f"{what}: issued at {iso(iat_ms)} (iat), {span(iat_ms - issued_ms)} after "
            f"{given} {iso(issued_ms)}: more than MAX_CLOCK_SKEW_MS "
            f"({span(MAX_CLOCK_SKEW_MS)}) in its future; the ledger refuses evidence from "
            f"the future (SPEC §6.9: EVIDENCE_INVALID); check the clocks{hint}"
        )


def precheck_opened(terms: PlacementTerms, record: RECORD, path: Path) -> None:
    """The same pre-checks for a signed record file given to cosign or publish."""
    if isinstance(record, Assignment):
        new_buyer = record.new_buyer
        said = f"{path}: the new buyer"
        precheck_new_buyer(terms, new_buyer.id, new_buyer.key, said, f"{said}'s key")
    if isinstance(record, NodeKeyBinding):
        precheck_node_key(terms, record.node_id, record.key, f"{path}: the node key")
        if record.evidence:
            try:
                parse_evidence(record.evidence)
            except EvidenceError:
                return  # not a token at all: the ledger's EVIDENCE_INVALID (the dry run says)
            what = f"{path}: its evidence"
            precheck_fresh(record.evidence, record.issued_at_ms, what, "its issued_at_ms")
