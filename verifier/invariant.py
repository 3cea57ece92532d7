"""``invariant()``: a check of the verifier's own logic that, unlike ``assert``, survives
``python -O``.

A broken invariant is a verifier bug, never a property of the export: it raises
``InvariantError``, which ``verify_export`` turns into a VERIFIER_ERROR finding (the export
is NOT verified), so a bug can never pass for a verdict. Local to the verifier on purpose:
the verifier stands alone and imports nothing of the ledger's.
"""

from __future__ import annotations


class InvariantError(Exception):
    """The verifier's own logic broke a rule it relies on."""


def invariant(condition: bool, message: str) -> None:
    """Raise ``InvariantError(message)`` unless ``condition`` holds (also under ``-O``)."""
    if not condition:
        raise InvariantError(message)
