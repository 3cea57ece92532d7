"""proto.invariant: conditions checked always (also under ``python -O``), named when broken."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proto.invariant import InvariantViolation, invariant, of_type, present


def test_a_holding_invariant_passes_values_through() -> None:
    invariant(1 + 1 == 2, "arithmetic")
    assert present(0, "zero") == 0  # falsy but present
    assert of_type("kind", str, "a tag") == "kind"


def test_a_broken_invariant_raises_a_named_error() -> None:
    with pytest.raises(InvariantViolation, match=r"^the head moved$"):
        invariant(False, "the head moved")
    with pytest.raises(InvariantViolation, match=r"^head of p1: is None$"):
        present(None, "head of p1")
    with pytest.raises(InvariantViolation, match=r"^a tag: a int, not a str$"):
        of_type(3, str, "a tag")


def test_invariants_survive_python_o() -> None:
    probe = (
        "from proto.invariant import InvariantViolation, invariant\n"
        "try:\n    invariant(False, 'x')\nexcept InvariantViolation:\n    raise SystemExit(3)\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", probe], timeout=60, check=False)
    assert done.returncode == 3
