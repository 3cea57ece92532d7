"""Required-signer rules (SPEC §3), applied to signatures already checked by a worker.

The order is the SPEC's: a bad signature by a required key (SIG_INVALID), then a signer
that is not required (SIG_SURPLUS), then a required key that did not sign (SIG_MISSING).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from proto.keys import key_id
from proto.reasons import Reason
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
