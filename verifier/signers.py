"""Required-signer rules (SPEC §3), applied to signatures already checked by a worker.

The order is the SPEC's: a bad signature by a required key (SIG_INVALID), then a signer
that is not required (SIG_SURPLUS), then a required key that did not sign (SIG_MISSING).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from proto.keys import key_id
from proto.reasons import Reason
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    PlacementClosed,
    ReclaimNotice,
    StreamResume,
)
from verifier.opener import SIG_VALID, SigResult


def required_of(keys: Iterable[bytes]) -> dict[str, bytes]:
    """Key id -> public key of the keys that must sign."""
    return {key_id(k): k for k in keys}


def signer_failure(
    sigs: Sequence[SigResult],
    required: Mapping[str, bytes],
    permitted: Mapping[str, bytes] | None = None,
) -> Reason | None:
    """The SPEC §3 reason why ``sigs`` are not the required signers (plus, optionally, the
    ``permitted`` ones: SPEC §4.0 "MAY also sign"), or None."""
    if not sigs:  # no signature (a version-2 record): only a missing one can fail
        return Reason.SIG_MISSING if required else None
    allowed = {**(permitted or {}), **required}
    for sig in sigs:
        wanted = allowed.get(sig.keyid)
        if wanted is not None and not (sig.outcome == SIG_VALID and sig.key == wanted):
            return Reason.SIG_INVALID
    present = {sig.keyid for sig in sigs}
    if present - allowed.keys():
        return Reason.SIG_SURPLUS
    if required.keys() - present:
        return Reason.SIG_MISSING
    return None


# ---- SPEC §4.0, the authority table, as the verifier reads it ------------------------------
#
# The verifier's own table, kept apart from ``proto/authority.py`` (the ledger's and the
# CLI's) on purpose: two readings of one text. ``tests/test_authority_table.py`` checks
# that they agree on every row. A row: (roles that MUST sign, roles that MAY also sign).

Row = tuple[tuple[str, ...], tuple[str, ...]]

AUTHORITY: Final[dict[str, Row]] = {
    "reclaim": (("operator",), ()),
    "adjustment/charge": (("buyer",), ("desk",)),
    "adjustment/credit": (("operator", "desk"), ()),
    "keybinding/introduces or extends": (("operator", "buyer"), ()),
    "keybinding/only shortens": (("operator",), ("buyer",)),
    "keybinding/only attests": (("operator",), ("buyer",)),
    "closed": (("ledger",), ()),
    "assignment": (("buyer", "new_buyer", "desk"), ("operator",)),
    "assignment/operator required": (("buyer", "new_buyer", "desk", "operator"), ()),
    "release": (("buyer",), ("operator",)),
    "resume": (("operator", "buyer"), ()),
}


def binding_kind(
    binding: NodeKeyBinding, bound: tuple[int, int] | None, revoked: bool
) -> Literal["only shortens", "only attests", "introduces or extends"]:
    """SPEC §4.0: what a key binding does to the window ``bound`` = [f, u) its (node, key)
    pair holds when it is processed (None: not bound): it only shortens when
    ``valid_from_ms ≤ f`` and ``valid_until_ms < u`` (the result keeps f, so a smaller
    start reaches back nowhere); it only attests when it carries evidence for a key not
    ``revoked``, ``valid_from_ms ≤ f`` and ``valid_until_ms = u``; else it introduces or
    extends the key."""
    if bound is not None and binding.valid_from_ms <= bound[0]:
        if binding.valid_until_ms < bound[1]:
            return "only shortens"
        if binding.evidence and not revoked and binding.valid_until_ms == bound[1]:
            return "only attests"
    return "introduces or extends"


def authority_row(
    record: object,
    resale_requires_operator: bool,
    bound: tuple[int, int] | None = None,
    revoked: bool = False,
) -> Row:
    """The row of ``AUTHORITY`` for ``record`` (``bound``, ``revoked``: a key binding's
    (node, key) window and revocation when it is processed)."""
    if isinstance(record, NodeKeyBinding):
        return AUTHORITY[f"keybinding/{binding_kind(record, bound, revoked)}"]
    if isinstance(record, Adjustment):
        return AUTHORITY[f"adjustment/{record.direction}"]
    if isinstance(record, Assignment):
        return AUTHORITY[
            "assignment/operator required" if resale_requires_operator else "assignment"
        ]
    if isinstance(record, ReclaimNotice):
        return AUTHORITY["reclaim"]
    if isinstance(record, BuyerRelease):
        return AUTHORITY["release"]
    if isinstance(record, StreamResume):
        return AUTHORITY["resume"]
    if isinstance(record, PlacementClosed):
        return AUTHORITY["closed"]
    raise TypeError(f"SPEC §4.0 has no row for {type(record).__name__}")
