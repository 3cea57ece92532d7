"""``invariant()``: a check that must hold, kept under ``python -O`` (unlike ``assert``).

A failed invariant is a bug in the ledger, never bad input (bad input gets a reason code).
"""

from __future__ import annotations


class InvariantError(AssertionError):
    """An internal invariant of the ledger does not hold."""


def invariant(condition: bool, message: str) -> None:
    """Raise ``InvariantError(message)`` unless ``condition``; runs even under ``-O``."""
    if not condition:
        raise InvariantError(message)
