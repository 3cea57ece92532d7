"""(4) envelopes: every envelope decodes canonically (SPEC §2-§3); input_hash is the
SHA-256 of the envelope bytes.

The decoding and the signature checks themselves run on the worker pool
(``verifier/opener.py``); this step turns what they found into findings and counts the
signatures. ``keyring`` lists every key an envelope of the export may be checked against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proto.keys import key_id
from proto.records import NodeKeyBinding, PlacementTerms
from verifier.findings import Findings, Step
from verifier.opener import OpenResult, open_one
from verifier.source import InputRow, RecordRow, blob

if TYPE_CHECKING:
    from verifier.state import Verification


def unreadable(findings: Findings, where: str, expected: str, opened: OpenResult) -> None:
    """An envelope that did not decode (its reason code), or decoded to the wrong kind."""
    findings.add(
        Step.ENVELOPES,
        opened.error or "KIND_MISMATCH",
        where,
        expected,
        opened.error or opened.kind,
        opened.detail,
    )


def check_input_hash(findings: Findings, where: str, stored: object, actual: str) -> None:
    """A stored input_hash column must be the SHA-256 of the envelope bytes."""
    if stored != actual:
        findings.add(
            Step.ENVELOPES,
            "INPUT_HASH",
            f"{where}.input_hash",
            actual,
            stored,
            "input_hash is not the SHA-256 of the envelope bytes",
        )


def keyring(run: Verification) -> dict[str, list[bytes]]:
    """Every key an envelope of this export may be verified against."""
    terms = run.terms
    keys: set[bytes] = {run.ledger_key, *(n.key for n in terms.nodes)}
    keys.update(p.key for p in (terms.operator, terms.buyer, terms.desk))
    # Node keys of every terms row: an amendment's predecessor bound other nodes (§6.3).
    for (raw,) in run.source.small_table("terms", "envelope", "chain_index"):
        opened = open_one(0, blob(raw), {})
        if isinstance(opened.record, PlacementTerms):
            keys.update(n.key for n in opened.record.nodes)
    for (raw,) in run.source.small_table("key_bindings", "envelope", "chain_index"):
        opened = open_one(0, blob(raw), {})
        if isinstance(opened.record, NodeKeyBinding):
            keys.add(opened.record.key)
    ring: dict[str, list[bytes]] = {}
    for key in keys:
        ring.setdefault(key_id(key), []).append(key)
    return ring


def check_record_envelope(run: Verification, row: RecordRow, opened: OpenResult) -> bool:
    """A ledger_records envelope: False (and a finding) when it does not decode."""
    if opened.error:
        unreadable(run.findings, row.where, "a canonical LedgerRecord envelope", opened)
        return False
    run.bump("signatures", len(opened.sigs))
    return True


def check_input_envelope(run: Verification, row: InputRow, opened: OpenResult) -> None:
    """An input row's envelope, and its input_hash column."""
    run.bump(f"inputs.{row.kind}")
    if opened.error:
        unreadable(run.findings, row.where, "a canonical envelope", opened)
    else:
        run.bump("signatures", len(opened.sigs))
    check_input_hash(run.findings, row.where, row.input_hash, opened.input_hash)
