"""(2) trust: the trust file names which keys belong to which party and role; it must pin
at least one ledger key, and no key in two roles."""

from __future__ import annotations

from proto.keys import key_id
from proto.trust import TrustFile
from verifier.findings import Findings, Step


def check_trust(trust: TrustFile, findings: Findings) -> None:
    """At least one pinned ledger key; every key in one role only (SPEC §5)."""
    if not trust.keys_for("ledger"):
        findings.add(
            Step.TRUST,
            "TRUST_NO_LEDGER",
            "trust file",
            "a pinned ledger key",
            "none",
            "nothing an export says can be checked without a trusted ledger key",
        )
    roles: dict[bytes, set[str]] = {}
    for entry in trust.keys:
        roles.setdefault(entry.key, set()).add(entry.role)
    for key, held in roles.items():
        if len(held) > 1:
            findings.add(
                Step.TRUST,
                "TRUST_KEY_TWO_ROLES",
                f"trust key {key_id(key)}",
                "one role",
                ", ".join(sorted(held)),
                "SPEC §5: the parties and the ledger hold distinct keys",
            )
