"""(3) terms: one accepted terms row (and accepted amendments of it, each version + 1
superseding the one before: SPEC §6.3), signed by its three parties, each party key
pinned under that role with the id the terms give it (PARTY_ID_MISMATCH), its ledger_key
pinned as a ledger key. The terms every later step checks against are the last of that
chain (step (7) re-derives whether each amendment was acceptable).

Without readable terms nothing else can be checked: ``check_terms`` returns None and the
checklist stops there (with the findings so far).
"""

from __future__ import annotations

from proto.envelope import Envelope, check_signatures, decode_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.records import PlacementTerms
from proto.trust import TrustFile
from verifier.decisions import ACCEPTED
from verifier.findings import Step
from verifier.opener import open_one
from verifier.signers import required_of
from verifier.source import ExportSource, blob
from verifier.state import ExportReport
from verifier.step4_envelopes import unreadable

ROLES = ("operator", "buyer", "desk")


def check_terms(
    source: ExportSource, trust: TrustFile, report: ExportReport
) -> PlacementTerms | None:
    """The terms every later step checks against, or None when no terms row decodes."""
    findings = report.findings
    rows = source.small_table("terms", "chain_index, envelope, status", "chain_index")
    accepted = [r for r in rows if r[2] == ACCEPTED]
    chosen: tuple[int, PlacementTerms, Envelope] | None = None
    linked = 0
    for index, raw, _ in accepted + [r for r in rows if r[2] != ACCEPTED]:
        try:
            envelope = decode_envelope(blob(raw))
        except ProtoError:
            continue
        opened = open_one(0, blob(raw), {})
        if not isinstance(opened.record, PlacementTerms):
            continue
        if chosen is None:
            chosen = (int(index), opened.record, envelope)
            linked = 1
            current_hash = opened.record_hash
        elif (
            (index, raw, ACCEPTED) in accepted
            and opened.record.version == chosen[1].version + 1
            and opened.record.supersedes == current_hash
        ):
            # SPEC §6.3 terms: an accepted amendment replaces the terms before it.
            chosen = (int(index), opened.record, envelope)
            linked += 1
            current_hash = opened.record_hash
    if len(accepted) < 1 or len(accepted) != linked:
        findings.add(
            Step.TERMS,
            "TERMS_ACCEPTED_COUNT",
            "terms",
            "one accepted terms row, then only amendments of it" if accepted else 1,
            len(accepted),
            "an export has one accepted terms row and accepted amendments that supersede it",
        )
    if chosen is None:
        for index, raw, _ in rows:
            unreadable(
                findings,
                f"terms chain_index {index}",
                "a canonical PlacementTerms envelope",
                open_one(0, blob(raw), {}),
            )
        findings.add(
            Step.TERMS,
            "TERMS_MISSING",
            "terms",
            "readable terms",
            "none",
            "no terms row decodes: nothing else can be checked",
        )
        return None
    index, terms, envelope = chosen
    where = f"terms chain_index {index}"
    parties = required_of((terms.operator.key, terms.buyer.key, terms.desk.key))
    failure = check_signatures(envelope, parties).failure()
    if failure is not None:
        findings.add(
            Step.TERMS,
            "TERMS_SIGNATURES",
            where,
            "signed by operator, buyer and desk",
            failure.reason.value,
            failure.detail,
        )
    for role in ROLES:
        party = getattr(terms, role)
        if trust.party_of(party.key, role) is None:
            findings.add(
                Step.TERMS,
                "TERMS_KEY_NOT_PINNED",
                where,
                f"{role} key pinned in the trust file",
                f"{party.id} key {key_id(party.key)} not pinned as {role}",
                "terms are trusted only when each party key is pinned under its role",
            )
        else:
            pinned = sorted({k.id for k in trust.keys if k.key == party.key and k.role == role})
            if pinned != [party.id]:
                findings.add(
                    Step.TERMS,
                    "PARTY_ID_MISMATCH",
                    where,
                    f"{role} id {' or '.join(map(repr, pinned))} (pinned in the trust file)",
                    f"{party.id!r} in the terms",
                    "SPEC §9: each party's id in the terms is the id its key is pinned under",
                )
        report.parties[role] = party.id
    if trust.party_of(terms.ledger_key, "ledger") is None:
        findings.add(
            Step.TERMS,
            "TERMS_LEDGER_NOT_PINNED",
            where,
            "ledger_key pinned as a ledger key",
            f"key {key_id(terms.ledger_key)} not pinned",
            "records, statements and checkpoints are trusted only under a pinned ledger key",
        )
    report.placement_id = terms.placement_id
    report.currency = terms.currency
    report.currency_scale = terms.currency_scale
    return terms
