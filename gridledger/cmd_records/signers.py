"""Who signs which record (SPEC §4.0): the roles that must and may, checked for the keys
given and against a record's signatures."""

from __future__ import annotations

from collections.abc import Sequence

from gridledger.cmd_records.common import RECORD, Refused
from proto import authority as proto_authority
from proto.envelope import Envelope, check_signatures
from proto.keys import SigningKey, key_id
from proto.limits import MAX_SAFE_INTEGER
from proto.records import Assignment, NodeKeyBinding, PlacementTerms


def authority(
    terms: PlacementTerms,
    record: RECORD,
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
    terms: PlacementTerms, roles: Sequence[str], record: RECORD | None = None
) -> dict[str, bytes]:
    return proto_authority.role_keys(terms, tuple(roles), record)


def role_of(terms: PlacementTerms, keyid: str, record: RECORD | None = None) -> str:
    for role in ("operator", "buyer", "desk"):
        if key_id(getattr(terms, role).key) == keyid:
            return role
    if isinstance(record, Assignment) and key_id(record.new_buyer.key) == keyid:
        return f"new buyer {record.new_buyer.id}"
    return f"key {keyid}"


def check_signers(
    terms: PlacementTerms, record: RECORD, keys: Sequence[SigningKey], what: str
) -> None:
    required, permitted = authority(terms, record)
    allowed = _role_keys(terms, (*required, *permitted), record)
    for key in keys:
        if key.key_id not in allowed:
            who = role_of(terms, key.key_id, record)
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


def missing_signers(terms: PlacementTerms, envelope: Envelope, record: RECORD) -> tuple[str, ...]:
    """Roles whose required signature is absent; Refused for a bad or surplus one."""
    required, permitted = authority(terms, record)
    report = check_signatures(envelope, _role_keys(terms, (*required, *permitted), record))
    if report.invalid:
        who = role_of(terms, report.invalid[0], record)
        raise Refused(f"the signature of the {who} does not verify")
    if report.unexpected:
        raise Refused(f"signed by key {report.unexpected[0]}, who may not sign this record")
    needed = set(_role_keys(terms, required, record))
    return tuple(role_of(terms, k, record) for k in report.missing if k in needed)
