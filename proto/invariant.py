"""Invariants of product code: conditions the code itself guarantees, checked always.

A bare ``assert`` vanishes under ``python -O``; these do not. A failure is a bug in
gridledger, never bad input (bad input gets a named reason, SPEC §10), so it raises
``InvariantViolation`` and nothing catches it on purpose::

    from proto.invariant import invariant, of_type, present

    invariant(index == len(chain), "chain index follows the head")
    head = present(store.head(placement_id), "head of a placement just written")
    record = of_type(opened.record, Statement, "record of a statement row")

Pass constant messages: they are built even when the invariant holds.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["InvariantViolation", "invariant", "of_type", "present"]

_T = TypeVar("_T")


class InvariantViolation(RuntimeError):
    """A condition the code guarantees does not hold: a bug, not bad input."""


def invariant(condition: object, message: str) -> None:
    """Raise InvariantViolation(message) unless ``condition`` is true."""
    if not condition:
        raise InvariantViolation(message)


def present(value: _T | None, what: str) -> _T:
    """``value``, which the code guarantees is not None (typed as such for the caller)."""
    if value is None:
        raise InvariantViolation(f"{what}: is None")
    return value


def of_type(value: object, cls: type[_T], what: str) -> _T:
    """``value``, which the code guarantees is a ``cls`` (typed as such for the caller)."""
    if not isinstance(value, cls):
        raise InvariantViolation(f"{what}: a {type(value).__name__}, not a {cls.__name__}")
    return value
