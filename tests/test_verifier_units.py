"""Small pieces of the verifier: the no-ledger-import rule, compact Merkle ranges, the
findings cap, signer rules, and the referee on hand-made inputs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto import merkle
from proto.keys import key_id
from proto.reasons import Reason
from verifier.findings import Findings, Step
from verifier.merkle_stream import CompactRange
from verifier.opener import SIG_INVALID, SIG_UNKNOWN_KEY, SIG_VALID, SigResult
from verifier.signers import signer_failure

VERIFIER = Path(__file__).resolve().parent.parent / "verifier"
FORBIDDEN = ("ledger", "meter", "gridledger")


def test_verifier_imports_only_proto_and_libraries() -> None:
    offenders: list[str] = []
    files = sorted(VERIFIER.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FORBIDDEN:
                    offenders.append(f"{path.name}: import {name}")
    assert not offenders


@given(st.lists(st.binary(min_size=0, max_size=8), max_size=70))
def test_compact_range_matches_rfc9162_root(entries: list[bytes]) -> None:
    compact = CompactRange()
    assert compact.root() == merkle.root([])
    for i, entry in enumerate(entries):
        compact.append(merkle.leaf_hash(entry))
        assert compact.root() == merkle.root(entries[: i + 1])
    assert compact.size == len(entries)


def test_findings_are_capped_per_rule_and_all_counted() -> None:
    findings = Findings(max_per_rule=3)
    for i in range(10):
        findings.add(Step.CHAIN, "CHAIN_PREV", f"ledger_records[{i}]", "a", "b", "m")
    findings.add(Step.DECISIONS, "SEQ_GAP", "usage_events chain_index 1", "x", "y", "m")
    findings.count("TOTAL_GROSS_MINOR", 1000)
    findings.add(Step.OBLIGATION, "TOTAL_GROSS_MINOR", "r", 1, 2, "m", counted=True)
    assert findings.total == 10 + 1 + 1000
    assert [f.rule for f in findings.kept].count("CHAIN_PREV") == 3
    assert findings.not_kept() == {"CHAIN_PREV": 7, "TOTAL_GROSS_MINOR": 999}
    assert findings.rules() == {"CHAIN_PREV", "SEQ_GAP", "TOTAL_GROSS_MINOR"}


KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))
ID_A, ID_B = key_id(KEY_A), key_id(KEY_B)


@pytest.mark.parametrize(
    ("sigs", "reason"),
    [
        ([SigResult(ID_A, SIG_VALID, KEY_A)], None),
        ([SigResult(ID_A, SIG_INVALID, b"")], Reason.SIG_INVALID),
        (
            [SigResult(ID_A, SIG_VALID, KEY_A), SigResult(ID_B, SIG_VALID, KEY_B)],
            Reason.SIG_SURPLUS,
        ),
        ([SigResult(ID_B, SIG_UNKNOWN_KEY, b"")], Reason.SIG_SURPLUS),
        ([], Reason.SIG_MISSING),
        # A bad required signature outranks a surplus one (SPEC §3 order).
        (
            [SigResult(ID_A, SIG_INVALID, b""), SigResult(ID_B, SIG_VALID, KEY_B)],
            Reason.SIG_INVALID,
        ),
        # Verified by another key that happens to share the key id: not the required key.
        ([SigResult(ID_A, SIG_VALID, KEY_B)], Reason.SIG_INVALID),
    ],
)
def test_signer_rules(sigs: list[SigResult], reason: Reason | None) -> None:
    assert signer_failure(sigs, {ID_A: KEY_A}) == reason


@pytest.mark.parametrize("permitted", [None, {}, {ID_B: KEY_B}])
def test_no_signature_fails_only_when_one_is_required(permitted: dict[str, bytes] | None) -> None:
    assert signer_failure([], {ID_A: KEY_A}, permitted) is Reason.SIG_MISSING
    assert signer_failure((), {}, permitted) is None


def test_invariant_holds_under_python_dash_o() -> None:
    """Unlike ``assert``, ``invariant()`` still raises when Python runs with -O."""
    import subprocess
    import sys

    code = (
        "from verifier.invariant import InvariantError, invariant\n"
        "assert False, 'asserts are gone under -O'\n"
        "try:\n    invariant(False, 'broken')\nexcept InvariantError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=VERIFIER.parent,
    )
    assert done.stdout == "broken\n"


def test_verifier_has_no_bare_asserts() -> None:
    offenders = [
        f"{path.name}:{node.lineno}"
        for path in sorted(VERIFIER.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert not offenders
