"""SPEC §4.0, who may sign what: one table for the ledger and the CLI, the verifier's own.

``proto/authority.py`` is the table the ledger decides with and the CLI's pre-check asks
by; ``verifier/signers.py`` keeps its own reading of the same text on purpose. Here the
two are compared row by row, over every kind and every way a key binding can meet the
window its key holds; and the shortening rule (``valid_from_ms ≤ f``) is followed by the
fold, the CLI and the verifier alike (``proto/vectors/shortens.json``).
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import vectorgen
from test_verifier_exports import explain, verify
from test_verifier_ledger import _ledger_export

from devtools import builders as b
from gridledger.cmd_records import authority as cli_authority
from proto import authority
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    Party,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
)
from verifier.signers import AUTHORITY, authority_row

T0 = 1_767_225_600_000
F, U = T0 + 300_000, T0 + 3_600_000  # a key's window [f, u) when a binding is processed


def _terms(resale_requires_operator: bool = False) -> PlacementTerms:
    cast = b.make_cast("authority-table")
    return b.make_terms(
        cast,
        "p-table",
        [b.gpu("n1", 0)],
        T0,
        T0 + 3_600_000,
        resale_requires_operator=resale_requires_operator,
    )


def _binding(valid_from: int, valid_until: int, evidence: str = "") -> NodeKeyBinding:
    key = b.make_cast("authority-table").node_key("n1").public_key
    return NodeKeyBinding(
        placement_id="p-table",
        node_id="n1",
        key=key,
        valid_from_ms=valid_from,
        valid_until_ms=valid_until,
        issued_at_ms=T0,
        evidence=evidence,
    )


def _others(terms: PlacementTerms) -> list[object]:
    buyer2 = Party(id="buyer-2", key=b"\x07" * 32)
    return [
        ReclaimNotice(
            placement_id="p-table",
            reclaim_id="r",
            gpus=["GPU-n1-0"],
            issued_at_ms=T0,
            effective_at_ms=T0,
            reason="x",
        ),
        Adjustment(
            placement_id="p-table",
            adjustment_id="c",
            direction="charge",
            amount_minor=1,
            reference="",
            reason="x",
            issued_at_ms=T0,
        ),
        Adjustment(
            placement_id="p-table",
            adjustment_id="r",
            direction="credit",
            amount_minor=1,
            reference="",
            reason="x",
            issued_at_ms=T0,
        ),
        Assignment(
            placement_id="p-table",
            assignment_id="a",
            new_buyer=buyer2,
            handover_at_ms=T0,
            gpus=["GPU-n1-0"],
            rate_per_gpu_hour_minor=1,
            issued_at_ms=T0,
        ),
        BuyerRelease(
            placement_id="p-table",
            release_id="l",
            issued_at_ms=T0,
            effective_at_ms=T0,
            reason="x",
        ),
        PlacementClosed(placement_id="p-table", closed_at_ms=T0),
    ]


def test_the_two_tables_agree_on_every_row() -> None:
    """Every kind but a binding, under terms with and without resale_requires_operator;
    every binding whose start is before, at or after f and whose end is before, at or
    after u, with and without evidence, for a key bound or not, revoked or not."""
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for required in (False, True):
        terms = _terms(required)
        for record in _others(terms):
            row = authority.signers(terms, record)  # type: ignore[arg-type]
            assert row == authority_row(record, required), record
            seen.add(row)
        starts, ends = (F - 1, F, F + 1), (U - 1, U, U + 1)
        for start, end, evidence, bound, revoked in itertools.product(
            starts, ends, ("", "x.y.z"), (None, (F, U)), (False, True)
        ):
            binding = _binding(start, end, evidence)
            row = authority.signers(terms, binding, bound, revoked)
            assert row == authority_row(binding, required, bound, revoked), (
                start - F,
                end - U,
                evidence,
                bound,
                revoked,
            )
            seen.add(row)
    assert seen == set(AUTHORITY.values())  # every row of the verifier's table was met


def test_only_shortens_is_valid_from_at_most_f() -> None:
    """SPEC §4.0: the operator alone revokes with any start up to f; a later start or an
    end not before u needs the buyer too."""
    operator_alone = (("operator",), ("buyer",))
    both = (("operator", "buyer"), ())
    terms = _terms()
    assert authority.signers(terms, _binding(T0, U - 1), (F, U)) == operator_alone
    assert authority.signers(terms, _binding(F, U - 1), (F, U)) == operator_alone
    assert authority.signers(terms, _binding(F + 1, U - 1), (F, U)) == both
    assert authority.signers(terms, _binding(T0, U), (F, U)) == both
    assert authority.signers(terms, _binding(T0, U - 1), None) == both


def test_the_cli_precheck_asks_what_the_ledger_asks() -> None:
    """The CLI's pre-check once asked the buyer to co-sign a revocation starting before
    f, which the ledger and the verifier accept from the operator alone."""
    terms = _terms()
    bound = {"n1": {_binding(0, 1).key: (F, U)}}
    revocation = _binding(T0, U - 1)
    assert cli_authority(terms, revocation, bound) == (("operator",), ("buyer",))
    # a terms node key is bound for [0, 2^53 - 1): valid_from 0 = f
    assert cli_authority(terms, _binding(0, U)) == (("operator",), ("buyer",))
    assert cli_authority(terms, _binding(1, U)) == (("operator", "buyer"), ())


def test_shortens_vector_verifies(tmp_path: Path) -> None:
    """proto/vectors/shortens.json through the real ledger, then the verifier: it decides
    every binding as the fold did and finds nothing."""
    data = json.loads((vectorgen.VECTORS_DIR / "shortens.json").read_text())
    cast = vectorgen._cast()
    raws = [base64.b64decode(step["envelope_b64"]) for step in data["steps"]]
    arrivals: list[int | None] = [step["arrived_ms"] for step in data["steps"]]
    out = _ledger_export(tmp_path, cast.ledger, "pl-shortens", raws, arrivals)
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    reasons = [o["reason"] for step in data["steps"] for o in step["outcomes"]]
    assert reasons.count("SIG_MISSING") == 2 and reasons.count("NODE_KEY_REVOKED") == 1
