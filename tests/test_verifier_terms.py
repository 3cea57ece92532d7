"""The verifier's SPEC §5 rules (``verifier/terms_rules.py``) against the ledger's
(``proto.terms.validate_terms``): two implementations written apart, same verdict on every
terms, valid or not.

Terms are built directly (not through a builder), within the ranges the decoder accepts,
so each is something a ledger could receive; a few mutations push one rule to its edge.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from proto import limits
from proto.records import GpuSpec, NodeSpec, Party, PlacementTerms
from proto.terms import CURRENCY_MINOR_UNITS, validate_terms
from verifier import terms_rules
from verifier.terms_rules import broken_rules

MAX_W = limits.MAX_WINDOW_MS
MAX_SAFE = limits.MAX_SAFE_INTEGER


def _key(n: int) -> bytes:
    return n.to_bytes(32, "big")


# Half the keys come from a pool of three, so keys collide often enough to matter.
keys = st.one_of(st.integers(0, 2), st.integers(3, 2**64)).map(_key)
ids = st.sampled_from(["op", "buyer", "desk", "other"])
times = st.one_of(st.integers(0, MAX_W), st.sampled_from([0, 1, MAX_W - 1, MAX_W]))


# The parts that do not depend on an earlier draw are built once, here: building them
# inside terms_strategy for every example cost most of the generation time.
node_lists = st.lists(
    st.builds(NodeSpec, st.sampled_from(["n1", "n2", "n3"]), keys, st.just("r"), st.just("")),
    min_size=1,
    max_size=3,
)
gpu_lists = st.lists(
    st.builds(
        GpuSpec,
        st.sampled_from(["n1", "n2", "n3", "n4"]),
        st.sampled_from(["g1", "g2", "g3", "g4"]),
        st.just("A100"),
        st.integers(1, 1000),
        st.just(0),
    ),
    min_size=1,
    max_size=4,
)
starts = st.integers(0, 2**44)
windows = st.one_of(st.integers(-3, MAX_W + 3), st.sampled_from([MAX_W, MAX_W + 1]))
currencies = st.sampled_from([*CURRENCY_MINOR_UNITS, "XAU", "ZAR", "ABC"])
rates = st.integers(0, limits.MAX_RATE_MINOR)
scales = st.integers(0, 9)


@st.composite
def terms_strategy(draw: Any) -> PlacementTerms:
    start = draw(starts)
    window = draw(windows)
    window = max(window, -start)
    nodes = draw(node_lists)
    gpus = draw(gpu_lists)
    # A time near the window's length (W - 1, W, W + 1 within 0..MAX_W), or any time.
    near = [v for v in (window - 1, window, window + 1) if 0 <= v <= MAX_W]
    near_w = st.one_of(times, st.sampled_from(near)) if near else times
    currency = draw(currencies)
    return PlacementTerms(
        placement_id="p1",
        operator=Party(draw(ids), draw(keys)),
        buyer=Party(draw(ids), draw(keys)),
        desk=Party(draw(ids), draw(keys)),
        ledger_key=draw(keys),
        nodes=nodes,
        gpus=gpus,
        window_start_ms=start,
        window_end_ms=start + window,
        rate_basis="gpu_hour",
        rate_per_gpu_hour_minor=draw(rates),
        currency=currency,
        currency_scale=draw(scales),
        increment_ms=max(1, draw(near_w)),
        minimum_duration_ms=draw(near_w),
        desk_fee_bps=0,
        fee_payer="buyer",
        interruptible=draw(st.booleans()),
        reclaim_notice_ms=draw(times),
        reclaim_penalty_bps=0,
        sla_availability_target_bps=0,
        sla_credit_bps=0,
        settlement_period_ms=1,
        late_grace_ms=0,
        created_at_ms=0,
    )


def _valid_base() -> PlacementTerms:
    return PlacementTerms(
        placement_id="p1",
        operator=Party("op", _key(1)),
        buyer=Party("buyer", _key(2)),
        desk=Party("desk", _key(3)),
        ledger_key=_key(4),
        nodes=[NodeSpec("n1", _key(5), "r", ""), NodeSpec("n2", _key(6), "r", "")],
        gpus=[GpuSpec("n1", "g1", "A100", 1000, 0), GpuSpec("n2", "g2", "A100", 500, 0)],
        window_start_ms=1_000,
        window_end_ms=1_000 + 3_600_000,
        rate_basis="gpu_hour",
        rate_per_gpu_hour_minor=100,
        currency="USD",
        currency_scale=2,
        increment_ms=60_000,
        minimum_duration_ms=3_600_000,
        desk_fee_bps=0,
        fee_payer="buyer",
        interruptible=False,
        reclaim_notice_ms=0,
        reclaim_penalty_bps=0,
        sla_availability_target_bps=0,
        sla_credit_bps=0,
        settlement_period_ms=1,
        late_grace_ms=0,
        created_at_ms=0,
    )


def _with(**changes: Any) -> PlacementTerms:
    return msgspec.structs.replace(_valid_base(), **changes)


def _many_gpus(window: int, notice: int) -> PlacementTerms:
    gpus = [GpuSpec("n1", f"g{i}", "A100", 1000, 0) for i in range(255)]
    gpus.append(GpuSpec("n1", "odd", "A100", 999, 0))
    return _with(
        gpus=gpus,
        nodes=[NodeSpec("n1", _key(5), "r", "")],
        window_end_ms=1_000 + window,
        minimum_duration_ms=0,
        reclaim_notice_ms=notice,
    )


def _bound_edge(over: int) -> PlacementTerms:
    """S x (W + notice) + increment x 1000 at 2^53 - 1 - x or just past it (x = over)."""
    s = 255 * 1000 + 999
    window = 20_000_000_000
    increment = 60_000
    reach = (MAX_SAFE - increment * 1000) // s  # the largest W + notice within the bound
    return _many_gpus(window, reach - window + over)


def _verdicts(terms: PlacementTerms) -> tuple[bool, bool]:
    return bool(validate_terms(terms)), bool(broken_rules(terms))


EDGES: dict[str, tuple[Callable[[], PlacementTerms], bool]] = {
    "valid": (_valid_base, False),
    "empty window": (lambda: _with(window_end_ms=1_000, minimum_duration_ms=0), True),
    "window = MAX_WINDOW_MS": (lambda: _with(window_end_ms=1_000 + MAX_W), False),
    "window > MAX_WINDOW_MS": (lambda: _with(window_end_ms=1_000 + MAX_W + 1), True),
    "W = minimum": (lambda: _with(minimum_duration_ms=3_600_000), False),
    "W < minimum": (lambda: _with(minimum_duration_ms=3_600_001), True),
    "increment = W": (lambda: _with(increment_ms=3_600_000), False),
    "increment > W": (lambda: _with(increment_ms=3_600_001), True),
    "unknown currency": (lambda: _with(currency="ZAR"), True),
    "scale below ISO": (lambda: _with(currency="BHD", currency_scale=2), True),
    "JPY scale 0": (lambda: _with(currency="JPY", currency_scale=0), False),
    "scale 9": (lambda: _with(currency="KWD", currency_scale=9), False),
    "node listed twice": (
        lambda: _with(nodes=[NodeSpec("n1", _key(5), "r", ""), NodeSpec("n1", _key(6), "r", "")]),
        True,
    ),
    "uuid listed twice": (
        lambda: _with(gpus=[GpuSpec("n1", "g1", "A100", 1, 0), GpuSpec("n2", "g1", "A100", 1, 0)]),
        True,
    ),
    "GPU on unlisted node": (lambda: _with(gpus=[GpuSpec("n9", "g1", "A100", 1, 0)]), True),
    "two parties, one id": (lambda: _with(desk=Party("buyer", _key(3))), True),
    "party key = ledger key": (lambda: _with(ledger_key=_key(2)), True),
    "node key = party key": (lambda: _with(nodes=[NodeSpec("n1", _key(1), "r", "")]), True),
    "bound reached": (lambda: _bound_edge(0), False),
    "bound passed": (lambda: _bound_edge(1), True),
    # §5 rule 5, §7.7: the payable ceiling P(M), ~5.1e15 of gross at the highest rate,
    # doubled by a 100 % fee the buyer pays; the same terms with the operator paying it.
    "payable ceiling passed": (
        lambda: msgspec.structs.replace(
            _many_gpus(20_000_000_000, 0),
            rate_per_gpu_hour_minor=limits.MAX_RATE_MINOR,
            desk_fee_bps=10_000,
            fee_payer="buyer",
        ),
        True,
    ),
    "payable ceiling kept": (
        lambda: msgspec.structs.replace(
            _many_gpus(20_000_000_000, 0),
            rate_per_gpu_hour_minor=limits.MAX_RATE_MINOR,
            desk_fee_bps=10_000,
            fee_payer="operator",
        ),
        False,
    ),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_each_rule_at_its_edge_gets_the_same_verdict(name: str) -> None:
    make, invalid = EDGES[name]
    terms = make()
    assert _verdicts(terms) == (invalid, invalid), (validate_terms(terms), broken_rules(terms))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(terms_strategy())
def test_verifier_and_ledger_agree_on_generated_terms(terms: PlacementTerms) -> None:
    ledger_says, verifier_says = _verdicts(terms)
    assert ledger_says == verifier_says, (validate_terms(terms), broken_rules(terms))


# The generator must produce both verdicts (else the agreement test proves little); a
# fixed, generous search keeps this from depending on the machine's load. The first
# example found is kept, not shrunk: the test needs one of each verdict, not the smallest.
_SEARCH = settings(
    max_examples=5000,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
)


def test_generated_terms_reach_both_verdicts() -> None:
    valid = find(terms_strategy(), lambda t: not broken_rules(t), settings=_SEARCH)
    assert not broken_rules(valid)
    invalid = find(terms_strategy(), lambda t: bool(broken_rules(t)), settings=_SEARCH)
    assert broken_rules(invalid)


def test_spec_constants_transcribed_equal_the_wire_limits() -> None:
    assert terms_rules.MAX_WINDOW_MS == limits.MAX_WINDOW_MS
    assert terms_rules.MAX_SAFE == limits.MAX_SAFE_INTEGER
    assert dict(terms_rules.SPEC_CURRENCIES) == dict(CURRENCY_MINOR_UNITS)


def test_the_verifier_does_not_import_proto_terms() -> None:
    """Sharing ``proto.terms`` would make the two implementations one."""
    offenders = []
    for path in sorted(Path(terms_rules.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "proto":
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n in ("terms", "proto.terms")]
    assert not offenders
