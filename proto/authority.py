"""SPEC §4.0, who may sign what: the one signer table of the ledger and the CLI.

The ledger decides with it (``ledger/rules.py``) and the CLI refuses a signer or names
the missing ones before anything is published with it (``gridledger/cmd_records/signers.py``):
one table, so the two cannot answer differently. The verifier keeps its own table on
purpose (``verifier/signers.py``, an independent implementation of the same text); a test
checks that the two agree on every row.

A row is a pair of role tuples: the roles that MUST sign and those that MAY also sign.
Roles: ``operator``, ``buyer``, ``desk`` (the parties of the accepted terms), ``ledger``
(the terms' ``ledger_key``) and ``new_buyer`` (the party an assignment names).
"""

from __future__ import annotations

from typing import Final

from proto.keys import key_id
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    Party,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    StreamResume,
)

Roles = tuple[str, ...]
Row = tuple[Roles, Roles]

# A window [from, until) a key is bound for on a node, as the fold holds it.
Window = tuple[int, int]

SIGNED_RECORD = (
    ReclaimNotice
    | Adjustment
    | NodeKeyBinding
    | Assignment
    | BuyerRelease
    | PlacementClosed
    | StreamResume
)

_TERMS: Final[Row] = (("operator", "buyer", "desk"), ())
_RECLAIM: Final[Row] = (("operator",), ())
_CHARGE: Final[Row] = (("buyer",), ("desk",))
_CREDIT: Final[Row] = (("operator", "desk"), ())
_BINDING: Final[Row] = (("operator", "buyer"), ())
_BINDING_OPERATOR: Final[Row] = (("operator",), ("buyer",))  # only shortens or only attests
_CLOSED: Final[Row] = (("ledger",), ())
_RESALE: Final[Row] = (("buyer", "new_buyer", "desk"), ("operator",))
_RESALE_WITH_OPERATOR: Final[Row] = (("buyer", "new_buyer", "desk", "operator"), ())
_RELEASE: Final[Row] = (("buyer",), ("operator",))
_RESUME: Final[Row] = (("operator", "buyer"), ())


def terms_signers() -> Row:
    """Terms and an amendment: the three parties (of the accepted terms, for an amendment)."""
    return _TERMS


def only_shortens(binding: NodeKeyBinding, current: Window | None) -> bool:
    """SPEC §4.0: the binding only shortens (a revocation) the window ``current`` the
    (node, key) pair is bound for now: ``valid_from_ms ≤ f`` and ``valid_until_ms < u``.
    Its result is ``[f, valid_until_ms)`` whatever ``valid_from_ms`` says (§6.3), so a
    smaller start reaches back nowhere: an operator that does not know the
    arrival-adjusted start ``f`` exactly can still revoke alone."""
    return (
        current is not None
        and binding.valid_from_ms <= current[0]
        and binding.valid_until_ms < current[1]
    )


def only_attests(binding: NodeKeyBinding, current: Window | None, revoked: bool) -> bool:
    """SPEC §4.0, §6.9: the binding carries evidence for a key bound now (``current``) and
    not ``revoked``, with ``valid_from_ms ≤ f`` and ``valid_until_ms = u``: no window moves."""
    return (
        bool(binding.evidence)
        and current is not None
        and not revoked
        and binding.valid_from_ms <= current[0]
        and binding.valid_until_ms == current[1]
    )


def signers(
    terms: PlacementTerms,
    record: SIGNED_RECORD,
    current: Window | None = None,
    revoked: bool = False,
) -> Row:
    """(roles that MUST sign, roles that MAY also sign) for ``record`` under the accepted
    ``terms``. For a key binding, ``current`` is the window its (node, key) pair is bound
    for when it is processed (None: not bound) and ``revoked`` whether that key is revoked
    on the node."""
    match record:
        case ReclaimNotice():
            return _RECLAIM
        case Adjustment():
            return _CHARGE if record.direction == "charge" else _CREDIT
        case NodeKeyBinding():
            if only_shortens(record, current) or only_attests(record, current, revoked):
                return _BINDING_OPERATOR
            return _BINDING
        case Assignment():
            return _RESALE_WITH_OPERATOR if terms.resale_requires_operator else _RESALE
        case BuyerRelease():
            return _RELEASE
        case PlacementClosed():
            return _CLOSED
        case StreamResume():
            return _RESUME


def role_party(terms: PlacementTerms, role: str, record: SIGNED_RECORD | None = None) -> Party:
    """The party a role names: one of the terms' three, or the new buyer an assignment
    names. The ledger has a key, no party: ``role_keys`` answers for it."""
    if role == "new_buyer":
        if not isinstance(record, Assignment):
            raise ValueError("only an assignment names a new buyer")
        return record.new_buyer
    if role not in ("operator", "buyer", "desk"):
        raise ValueError(f"{role!r} is not a party of the terms")
    party: Party = getattr(terms, role)
    return party


def role_keys(
    terms: PlacementTerms, roles: Roles, record: SIGNED_RECORD | None = None
) -> dict[str, bytes]:
    """Key id -> public key of each role in ``roles``."""
    keys = [
        terms.ledger_key if role == "ledger" else role_party(terms, role, record).key
        for role in roles
    ]
    return {key_id(k): k for k in keys}
