"""Capacity is sold once (SPEC §6.5): across exports in ``verify DIR`` and the reconciliation.

The operator (with only its own keys, plus the buyers' and desk's signatures it obtained
honestly for each sale) sells the same GPU uuid to two buyers for overlapping windows.
Each placement is folded by a real ledger (each on its own shard: its own store) and
exported; each export verifies alone. Read together, ``verify DIR`` must fail and name
both placements, the GPU, the time range and the operator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verifier_exports import MINUTE, T0, explain, verify

from devtools.builders import (
    Cast,
    StreamWriter,
    amendment,
    closed,
    gpu,
    make_cast,
    make_terms,
    reclaim,
    release,
    sample,
    signed_terms,
)
from ledger.capacity import CapacityIndex, CapClaim, oversold
from ledger.export import export_placement
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.issuer import UnknownPlacement
from ledger.store import Store
from proto.records import PlacementTerms
from proto.trust import TrustedKey, TrustFile, dump_trust
from verifier import cli
from verifier.capacity import Claim, claims_of, find_oversold

SEED = "capacity"


@dataclass(frozen=True)
class Sale:
    """One placement of GPU ``node``/0: its buyer, share, window in minutes, optional
    reclaim."""

    placement_id: str
    buyer: str
    share_milli: int
    start_min: int
    end_min: int
    reclaim_at_min: int | None = None
    node: str = "n1"


def _cast(buyer: str) -> Cast:
    return make_cast(SEED, buyer=buyer)  # same seed: same operator, desk, ledger, node keys


def _raws(sale: Sale) -> list[bytes]:
    cast = _cast(sale.buyer)
    spec = gpu(sale.node, 0, share_milli=sale.share_milli)
    start, end = T0 + sale.start_min * MINUTE, T0 + sale.end_min * MINUTE
    terms = make_terms(cast, sale.placement_id, [spec], start, end)
    writer = StreamWriter(cast.node_key(sale.node), sale.placement_id, sale.node)
    raws = [signed_terms(cast, terms)]
    raws.append(writer.event(start, start + 5 * MINUTE, [sample(spec)]))
    if sale.reclaim_at_min is not None:
        at = T0 + sale.reclaim_at_min * MINUTE
        raws.append(reclaim(cast, terms, at - terms.reclaim_notice_ms, at, "rc-1"))
    raws.append(closed(cast, sale.placement_id, end + terms.late_grace_ms))
    return raws


def _shard_export(tmp: Path, shard: str, placement_id: str, raws: list[bytes], out: Path) -> Path:
    """Fold ``raws`` through a real ledger with its own store (one shard) and export."""
    cast = _cast("buyer-a")
    items = [
        Item(
            raw, f"local:{shard}:0:{i}", placement_id, f"local:{shard}", f"local:{shard}:0:{i + 1}"
        )
        for i, raw in enumerate(raws)
    ]
    with Store(tmp / f"{shard}.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        Ingestor(store, cast.ledger).ingest(items)
        export_placement(store, placement_id, out, key=cast.ledger)
    return out


def _trust(buyers: list[str]) -> TrustFile:
    keys: dict[str, TrustedKey] = {}
    for buyer in buyers:
        for k in _cast(buyer).trust().keys:
            keys[f"{k.role}/{k.id}"] = k
    base = _cast(buyers[0]).trust()
    # No witness runs here: capacity is what these tests are about, so the policy asks for
    # none and an honest set of exports verifies FINAL (SPEC §9, "cosigners": []).
    return TrustFile(
        format=base.format,
        keys=sorted(keys.values(), key=lambda k: (k.role, k.id)),
        cosigners=[],
    )


def _run(tmp: Path, sales: list[Sale]) -> tuple[int, dict[str, object], str]:
    """Each sale on its own shard; each export must verify alone; then ``verify DIR``."""
    exports = tmp / "exports"
    exports.mkdir()
    trust = _trust(sorted({s.buyer for s in sales}))
    for i, sale in enumerate(sales):
        out = exports / f"{sale.placement_id}.duckdb"
        _shard_export(tmp, f"shard{i}", sale.placement_id, _raws(sale), out)
        report = verify(out, trust)
        assert report.ok, explain(report)
    trust_path = tmp / "trust.json"
    trust_path.write_bytes(dump_trust(trust))
    return _cli(exports, trust_path)


def _cli(exports: Path, trust_path: Path) -> tuple[int, dict[str, object], str]:
    import contextlib
    import io

    text, js = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(js):
        code_json = cli.main([str(exports), "--trust", str(trust_path), "--json"])
    with contextlib.redirect_stdout(text):
        code_text = cli.main([str(exports), "--trust", str(trust_path)])
    assert code_json == code_text
    data: dict[str, object] = json.loads(js.getvalue())
    return code_text, data, text.getvalue()


def _oversold(data: dict[str, object]) -> list[dict[str, object]]:
    rec = data["reconciliation"]
    assert isinstance(rec, dict)
    found: list[dict[str, object]] = rec["capacity"]["oversold"]
    return found


CASES = {
    # name: (sales, oversold time range in minutes or None)
    "same GPU, two buyers, overlapping whole shares": (
        [Sale("p-a", "buyer-a", 1000, 0, 60), Sale("p-b", "buyer-b", 1000, 30, 90)],
        (30, 60),
    ),
    "600 + 500 overlapping": (
        [Sale("p-a", "buyer-a", 600, 0, 60), Sale("p-b", "buyer-b", 500, 0, 60)],
        (0, 60),
    ),
    "500 + 500 overlapping is one GPU": (
        [Sale("p-a", "buyer-a", 500, 0, 60), Sale("p-b", "buyer-b", 500, 10, 70)],
        None,
    ),
    "windows that touch do not overlap": (
        [Sale("p-a", "buyer-a", 1000, 0, 60), Sale("p-b", "buyer-b", 1000, 60, 120)],
        None,
    ),
    "a reclaimed placement gives the GPU back at the effective time": (
        [
            Sale("p-a", "buyer-a", 1000, 0, 60, reclaim_at_min=30),
            Sale("p-b", "buyer-b", 1000, 30, 90),
        ],
        None,
    ),
    "a reclaim after the overlap began does not excuse it": (
        [
            Sale("p-a", "buyer-a", 1000, 0, 60, reclaim_at_min=40),
            Sale("p-b", "buyer-b", 1000, 30, 90),
        ],
        (30, 40),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_dir_reports_every_oversold_gpu(tmp_path: Path, name: str) -> None:
    sales, oversold = CASES[name]
    code, data, text = _run(tmp_path, sales)
    found = _oversold(data)
    rec = data["reconciliation"]
    assert isinstance(rec, dict)
    if oversold is None:
        assert code == 0, text
        assert found == [] and rec["reconciled"] is True
        assert "OVERSOLD" not in text and ": balanced" in text
        return
    assert code == 1, text
    assert data["exit_code"] == 1
    assert rec["reconciled"] is False
    assert len(found) == 1
    f = found[0]
    lo, hi = oversold
    assert f["rule"] == "OVERSOLD"
    assert f["uuid"] == "GPU-n1-0"
    assert f["placements"] == ["p-a", "p-b"]
    assert (f["start_ms"], f["end_ms"]) == (T0 + lo * MINUTE, T0 + hi * MINUTE)
    assert f["operators"] == ["operator-1"]
    # The text names both placements, the GPU, the range and the operator, and never
    # says the run balanced.
    line = next(x for x in text.splitlines() if x.startswith("OVERSOLD"))
    for word in ("GPU-n1-0", "p-a", "p-b", str(T0 + lo * MINUTE), "operator-1"):
        assert word in line, line
    assert ": balanced" not in text and "NOT RECONCILED" in text


def test_copies_of_one_placement_claim_once(tmp_path: Path) -> None:
    sale = Sale("p-a", "buyer-a", 1000, 0, 60)
    exports = tmp_path / "exports"
    exports.mkdir()
    for copy in ("one", "two"):
        _shard_export(
            tmp_path, f"shard-{copy}", sale.placement_id, _raws(sale), exports / f"{copy}.duckdb"
        )
    trust_path = tmp_path / "trust.json"
    trust_path.write_bytes(dump_trust(_trust(["buyer-a"])))
    code, data, text = _cli(exports, trust_path)
    assert _oversold(data) == [], text
    assert code == 0, text


def _claim(pid: str, share: int, lo: int, hi: int, uuid: str = "g") -> Claim:
    return Claim(uuid, pid, "op", lo, hi, share, f"{pid}.duckdb")


def test_sweep_three_way_and_per_gpu() -> None:
    # Each pair fits (800), all three do not (1200): named together, for their common time.
    found = find_oversold(
        [_claim("a", 400, 0, 100), _claim("b", 400, 50, 150), _claim("c", 400, 80, 200)]
    )
    assert [(o.placements, o.start_ms, o.end_ms, o.share_milli) for o in found] == [
        (("a", "b", "c"), 80, 100, 1200)
    ]
    # Other GPUs do not add up; the same set across touching stretches is one finding.
    found = find_oversold(
        [
            _claim("a", 1000, 0, 100, "g1"),
            _claim("b", 1000, 0, 100, "g2"),
            _claim("c", 600, 0, 50, "g3"),
            _claim("d", 600, 0, 100, "g3"),
        ]
    )
    assert [(o.uuid, o.placements, o.start_ms, o.end_ms) for o in found] == [
        ("g3", ("c", "d"), 0, 50)
    ]
    assert find_oversold([_claim("a", 1000, 0, 10), _claim("b", 1, 10, 20)]) == []


def test_the_replay_plan_of_the_trace_excerpt_never_oversells() -> None:
    """First fit over the excerpt: no GPU above one whole GPU at any moment, by the
    verifier's own sweep over the plan's claims (and the check has teeth: the same
    placement sold again under another id is found)."""
    from gridledger.placement_plan import plan_placements
    from gridledger.replay_limits import TRACE_EPOCH_MS
    from gridledger.trace import read_trace

    excerpt = Path(__file__).parent / "data" / "openb_excerpt"
    trace = read_trace(excerpt)
    plan = plan_placements(trace.nodes, trace.tasks, epoch_ms=TRACE_EPOCH_MS, buyers=4)
    claims = [
        Claim(g.uuid, p.placement_id, "op", p.window_start_ms, p.window_end_ms, g.share_milli, "")
        for p in plan.placements
        for g in p.gpus
    ]
    assert len(plan.placements) > 100 and len(claims) >= len(plan.placements)
    assert find_oversold(claims) == []
    whole = next(p for p in plan.placements if p.gpus[0].share_milli == 1000)
    again = [
        Claim(g.uuid, "again", "op", whole.window_start_ms, whole.window_end_ms, 1000, "")
        for g in whole.gpus
    ]
    found = find_oversold(claims + again)
    assert found and all("again" in o.placements for o in found)
    assert {o.uuid for o in found} == {g.uuid for g in whole.gpus}


# ---- the ledger: within one ordered stream (SPEC §6.5) --------------------------------------


def _items(raws: list[bytes], pids: list[str], source: str, first: int = 0) -> list[Item]:
    return [
        Item(raw, f"{source}:0:{first + i}", pid, source, f"{source}:0:{first + i + 1}")
        for i, (raw, pid) in enumerate(zip(raws, pids, strict=True))
    ]


def _terms_decisions(store: Store) -> dict[str, tuple[str, str]]:
    rows = store.query(
        "SELECT placement_id, status, reason FROM inputs WHERE kind = 'terms' ORDER BY placement_id"
    )
    return {str(p): (str(s), str(r)) for p, s, r in rows}


LEDGER_CASES = {
    # name: (sales, decision of p-b)
    "whole GPU sold twice": (
        [Sale("p-a", "buyer-a", 1000, 0, 60), Sale("p-b", "buyer-b", 1000, 30, 90)],
        ("rejected", "OVERSOLD"),
    ),
    "600 + 500": (
        [Sale("p-a", "buyer-a", 600, 0, 60), Sale("p-b", "buyer-b", 500, 59, 90)],
        ("rejected", "OVERSOLD"),
    ),
    "500 + 500": (
        [Sale("p-a", "buyer-a", 500, 0, 60), Sale("p-b", "buyer-b", 500, 0, 60)],
        ("accepted", ""),
    ),
    "touching windows": (
        [Sale("p-a", "buyer-a", 1000, 0, 60), Sale("p-b", "buyer-b", 1000, 60, 90)],
        ("accepted", ""),
    ),
    "after a reclaim": (
        [
            Sale("p-a", "buyer-a", 1000, 0, 60, reclaim_at_min=30),
            Sale("p-b", "buyer-b", 1000, 30, 90),
        ],
        ("accepted", ""),
    ),
}


@pytest.mark.parametrize("name", sorted(LEDGER_CASES))
def test_ledger_refuses_terms_that_oversell_within_its_stream(tmp_path: Path, name: str) -> None:
    sales, expected = LEDGER_CASES[name]
    raws: list[bytes] = []
    pids: list[str] = []
    for sale in sales:
        mine = _raws(sale)[:-1]  # no close: the second sale arrives while the first is open
        raws += mine
        pids += [sale.placement_id] * len(mine)
    cast = _cast("buyer-a")
    with Store(tmp_path / "l.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        Ingestor(store, cast.ledger).ingest(_items(raws, pids, "local:one"))
        decided = _terms_decisions(store)
        detail = store.query("SELECT detail FROM quarantine")  # nothing quarantined
    assert decided["p-a"] == ("accepted", "")
    assert decided["p-b"] == expected
    assert detail == []


def test_ledger_oversold_detail_names_the_other_placement_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    a, b = Sale("p-a", "buyer-a", 1000, 0, 60), Sale("p-b", "buyer-b", 1000, 30, 90)
    cast = _cast("buyer-a")
    path = tmp_path / "l.duckdb"
    ra, rb = _raws(a)[:-1], _raws(b)[:-1]
    with Store(path, ledger_public_key=cast.ledger.public_key) as store:
        Ingestor(store, cast.ledger).ingest(_items(ra, ["p-a"] * len(ra), "local:one"))
    # A restart: the claims come back from the store, committed with the batch.
    with Store(path, ledger_public_key=cast.ledger.public_key) as store:
        ing = Ingestor(store, cast.ledger)
        outcomes = ing.fold.apply_batch(
            [(r, f"local:one:0:{len(ra) + i}", "p-b", None) for i, r in enumerate(rb)]
        )
    terms_b = next(o for o in outcomes if o.kind == "terms")
    assert terms_b.reason is not None and terms_b.reason.value == "OVERSOLD"
    assert "p-a" in terms_b.detail and "GPU-n1-0" in terms_b.detail
    # Another partition (ordered stream) is not compared: both accepted there (SPEC §6.5,
    # the cross-shard step); the reconciliation reports it (tests above).
    with Store(tmp_path / "two.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        ing = Ingestor(store, cast.ledger)
        ing.ingest(_items(ra, ["p-a"] * len(ra), "kafka:gl:0"))
        ing.ingest(_items(rb, ["p-b"] * len(rb), "kafka:gl:1"))
        assert _terms_decisions(store) == {"p-a": ("accepted", ""), "p-b": ("accepted", "")}


def test_ledger_rebuild_from_offset_zero_decides_the_same(tmp_path: Path) -> None:
    sales = [
        Sale("p-a", "buyer-a", 600, 0, 60, reclaim_at_min=20),
        Sale("p-b", "buyer-b", 500, 10, 70),  # overlaps p-a's claim [0, 20): 1100
        Sale("p-c", "buyer-b", 400, 30, 90),  # fits beside what is left
    ]
    raws: list[bytes] = []
    pids: list[str] = []
    for sale in sales:
        mine = _raws(sale)[:-1]
        raws += mine
        pids += [sale.placement_id] * len(mine)
    cast = _cast("buyer-a")
    items = _items(raws, pids, "local:one")
    runs = []
    for name, size in (("one.duckdb", len(items)), ("batches.duckdb", 2)):
        path = tmp_path / name
        for start in range(0, len(items), size):  # a restart between every batch
            with Store(path, ledger_public_key=cast.ledger.public_key) as store:
                Ingestor(store, cast.ledger).ingest(items[start : start + size])
        with Store(path, ledger_public_key=cast.ledger.public_key) as store:
            runs.append((_terms_decisions(store), store.heads(), store.capacity_claims()))
    assert runs[0] == runs[1]
    assert runs[0][0] == {
        "p-a": ("accepted", ""),
        "p-b": ("rejected", "OVERSOLD"),
        "p-c": ("accepted", ""),
    }


# ---- amendments (SPEC §6.5: the terms in force claim; an amendment is checked too) ---------


def _amended(cast: Cast, terms: PlacementTerms, node: str) -> PlacementTerms:
    """An amendment of ``terms`` that moves the placement to GPU ``node``/0."""
    moved = make_terms(
        cast, terms.placement_id, [gpu(node, 0)], terms.window_start_ms, terms.window_end_ms
    )
    return amendment(terms, gpus=moved.gpus, nodes=moved.nodes)


def test_ledger_refuses_an_amendment_that_moves_onto_a_sold_gpu(tmp_path: Path) -> None:
    """The parties of p-a cannot amend it onto the GPU p-b bought: OVERSOLD, as terms
    would be; p-b's claim and p-a's first GPU stay claimed."""
    cast_a, cast_b = _cast("buyer-a"), _cast("buyer-b")
    start, end = T0, T0 + 60 * MINUTE
    ta = make_terms(cast_a, "p-a", [gpu("n1", 0)], start, end)
    tb = make_terms(cast_b, "p-b", [gpu("n2", 0)], start, end)
    raws = [signed_terms(cast_a, ta), signed_terms(cast_b, tb)]
    raws.append(signed_terms(cast_a, _amended(cast_a, ta, "n2")))
    with Store(tmp_path / "l.duckdb", ledger_public_key=cast_a.ledger.public_key) as store:
        ing = Ingestor(store, cast_a.ledger)
        outcomes = ing.fold.apply_batch(
            [
                (r, f"local:one:0:{i}", pid, None)
                for i, (r, pid) in enumerate(zip(raws, ["p-a", "p-b", "p-a"], strict=True))
            ]
        )
    decided = [(o.kind, o.status, o.reason.value if o.reason else "") for o in outcomes]
    assert decided == [
        ("terms", "accepted", ""),
        ("terms", "accepted", ""),
        ("terms", "rejected", "OVERSOLD"),
    ]
    assert "p-b" in outcomes[2].detail and "GPU-n2-0" in outcomes[2].detail


def test_ledger_amendment_replaces_the_claims_and_a_restart_keeps_them(tmp_path: Path) -> None:
    """p-a amended twice (same GPU, then moved from n1 to n3): its own claim never counts
    against it, and n1 is free afterwards — p-c buys it whole — with a restart between
    every input (the gone claim is deleted from the store in the batch that moved it)."""
    cast_a, cast_c = _cast("buyer-a"), _cast("buyer-c")
    start, end = T0, T0 + 60 * MINUTE
    ta = make_terms(cast_a, "p-a", [gpu("n1", 0)], start, end)
    same = amendment(ta, late_grace_ms=ta.late_grace_ms + MINUTE)
    moved = _amended(cast_a, same, "n3")
    tc = make_terms(cast_c, "p-c", [gpu("n1", 0)], start, end)
    raws = [signed_terms(cast_a, t) for t in (ta, same, moved)] + [signed_terms(cast_c, tc)]
    items = _items(raws, ["p-a", "p-a", "p-a", "p-c"], "local:one")
    path = tmp_path / "l.duckdb"
    for item in items:
        with Store(path, ledger_public_key=cast_a.ledger.public_key) as store:
            Ingestor(store, cast_a.ledger).ingest([item])
    with Store(path, ledger_public_key=cast_a.ledger.public_key) as store:
        rows = store.query(
            "SELECT placement_id, status, reason FROM inputs WHERE kind = 'terms' ORDER BY position"
        )
        claims = store.capacity_claims()
    assert [tuple(map(str, r)) for r in rows] == [("p-a", "accepted", "")] * 3 + [
        ("p-c", "accepted", "")
    ]
    assert [(uuid, pid) for _, uuid, pid, *_ in claims] == [
        ("GPU-n1-0", "p-c"),
        ("GPU-n3-0", "p-a"),
    ]


def _amended_sale_raws(cast: Cast, start: int, end: int) -> list[bytes]:
    """p-a bought on n1, amended onto n2 before any usage, used on n2, closed."""
    ta = make_terms(cast, "p-a", [gpu("n1", 0)], start, end)
    moved = _amended(cast, ta, "n2")
    writer = StreamWriter(cast.node_key("n2"), "p-a", "n2")
    return [
        signed_terms(cast, ta),
        signed_terms(cast, moved),
        writer.event(start, start + 5 * MINUTE, [sample(gpu("n2", 0))]),
        closed(cast, "p-a", end + moved.late_grace_ms),
    ]


def test_verify_dir_counts_the_amended_terms_claims(tmp_path: Path) -> None:
    """Across shards the ledger cannot compare: p-a (amended from n1 onto n2) and p-b (n2,
    the same hour) are both accepted, each export verifies alone, and ``verify DIR``
    reports n2 sold twice — the amended terms claim, not the first ones, and not nothing
    — while p-c on n1 (which p-a left) is no finding."""
    exports = tmp_path / "exports"
    exports.mkdir()
    start, end = T0, T0 + 60 * MINUTE
    sales = {
        "p-a": _amended_sale_raws(_cast("buyer-a"), start, end),
        "p-b": _raws(Sale("p-b", "buyer-b", 1000, 0, 60, node="n2")),
        "p-c": _raws(Sale("p-c", "buyer-c", 1000, 0, 60)),
    }
    trust = _trust(["buyer-a", "buyer-b", "buyer-c"])
    for i, (pid, raws) in enumerate(sorted(sales.items())):
        out = exports / f"{pid}.duckdb"
        _shard_export(tmp_path, f"shard{i}", pid, raws, out)
        report = verify(out, trust)
        assert report.ok, explain(report)
    trust_path = tmp_path / "trust.json"
    trust_path.write_bytes(dump_trust(trust))
    code, data, text = _cli(exports, trust_path)
    found = _oversold(data)
    assert code == 1, text
    assert [(f["uuid"], f["placements"]) for f in found] == [("GPU-n2-0", ["p-a", "p-b"])]
    assert (found[0]["start_ms"], found[0]["end_ms"]) == (start, end)


def test_a_reclaim_at_the_window_start_gives_the_whole_claim_back(tmp_path: Path) -> None:
    """The operator reclaims p-a effective at its window's start (allowed: SPEC §6.3
    reclaim): p-a claims nothing. Terms of p-b covering that instant are accepted — the
    ledger once kept an empty claim [s, s) and its overlap sweep raised on it, so any
    terms over s stopped the fold at every restart — and an empty claim a store already
    holds (written by that ledger) is read as nothing."""
    cast_a, cast_b = _cast("buyer-a"), _cast("buyer-b")
    ta = make_terms(cast_a, "p-a", [gpu("n1", 0)], T0, T0 + 60 * MINUTE)
    notice = reclaim(cast_a, ta, T0 - ta.reclaim_notice_ms, T0, "rc-1")
    tb = make_terms(cast_b, "p-b", [gpu("n1", 0)], T0 - 30 * MINUTE, T0 + 30 * MINUTE)
    raws = [signed_terms(cast_a, ta), notice, signed_terms(cast_b, tb)]
    path = tmp_path / "l.duckdb"
    with Store(path, ledger_public_key=cast_a.ledger.public_key) as store:
        Ingestor(store, cast_a.ledger).ingest(_items(raws, ["p-a", "p-a", "p-b"], "local:one"))
        rows = store.query("SELECT placement_id, kind, status FROM inputs ORDER BY position")
        claims = store.capacity_claims()
    assert [tuple(map(str, r)) for r in rows] == [
        ("p-a", "terms", "accepted"),
        ("p-a", "reclaim", "accepted"),
        ("p-b", "terms", "accepted"),
    ]
    assert [(uuid, pid) for _, uuid, pid, *_ in claims] == [("GPU-n1-0", "p-b")]
    # An empty claim as an older ledger stored it: read back, it claims nothing.
    index = CapacityIndex()
    index.load([("local", "GPU-n1-0", "p-a", T0, T0, 1000)])
    assert index.claims_for("local", tb) == {"GPU-n1-0": ()}
    empty = {"GPU-n1-0": (CapClaim("p-a", T0, T0, 1000),)}
    assert oversold(tb, empty) is None


# ---- property: whatever the parties sign, one stream never oversells -----------------------

_GPUS = ("n1", "n2")
_PIDS = ("p-a", "p-b", "p-c")
_TERMS_OP = st.tuples(
    st.sampled_from(["terms", "amend"]),
    st.sampled_from(_PIDS),
    st.sets(st.sampled_from(_GPUS), min_size=1),
    st.sampled_from([250, 500, 1000]),
    st.integers(0, 60),
    st.integers(1, 60),
)
_END_OP = st.tuples(
    st.sampled_from(["reclaim", "release"]), st.sampled_from(_PIDS), st.integers(0, 40)
)
_OPS = st.lists(st.one_of(_TERMS_OP, _END_OP), min_size=1, max_size=10)

Op = tuple[str, str, set[str], int, int, int] | tuple[str, str, int]


def _stream(ops: list[Op]) -> tuple[list[bytes], list[str], list[int]]:
    """Signed inputs for ``ops`` and when each reaches the log: terms and amendments (of
    a placement's latest terms) an hour before the windows, reclaims and buyer releases
    effective at the window's start plus the given minutes (when inside), at that time."""
    latest: dict[str, PlacementTerms] = {}
    raws: list[bytes] = []
    pids: list[str] = []
    dated: list[int] = []
    for n, op in enumerate(ops):
        pid = op[1]
        cast = _cast(f"buyer-{pid}")
        if len(op) == 6:
            kind, _, nodes, share, start, length = op
            specs = [gpu(node, 0, share_milli=share) for node in sorted(nodes)]
            lo = T0 + start * MINUTE
            made = make_terms(cast, pid, specs, lo, lo + length * MINUTE)
            if kind == "amend" and pid in latest:
                made = amendment(
                    latest[pid],
                    gpus=made.gpus,
                    nodes=made.nodes,
                    window_start_ms=made.window_start_ms,
                    window_end_ms=made.window_end_ms,
                )
            latest[pid] = made
            raws.append(signed_terms(cast, made))
            dated.append(T0 - 60 * MINUTE)
        else:
            kind, _, minutes = op
            terms = latest.get(pid)
            if terms is None:
                continue
            at = terms.window_start_ms + minutes * MINUTE
            if at >= terms.window_end_ms:
                continue
            if kind == "reclaim":
                raws.append(reclaim(cast, terms, at - terms.reclaim_notice_ms, at, f"rc-{n}"))
            else:
                raws.append(release(cast, terms, at, at, f"rl-{n}"))
            dated.append(at)
        pids.append(pid)
    return raws, pids, dated


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=_OPS)
def test_one_stream_never_oversells_and_claims_follow_the_terms_in_force(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Op]
) -> None:
    """Random terms, amendments, reclaims and buyer releases of three placements on two
    GPUs, through a real ledger (one stream, timed): the fold never raises; the claims it
    stores are exactly what the verifier reads from each placement's export (the terms
    in force, cut by an accepted reclaim or release, none when empty); and those claims
    never add up to more than a whole GPU (the verifier's own sweep) — also after a
    restart between every input."""
    raws, pids, dated = _stream(ops)
    if not raws:
        return
    tmp = tmp_path_factory.mktemp("cap")
    cast = _cast("buyer-a")
    items = [
        msgspec.structs.replace(item, arrived_ms=max(dated[: i + 1]))
        for i, item in enumerate(_items(raws, pids, "local:one"))
    ]
    stored = []
    for name, size in (("one.duckdb", len(items)), ("each.duckdb", 1)):
        path = tmp / name
        for at in range(0, len(items), size):
            with Store(path, ledger_public_key=cast.ledger.public_key) as store:
                Ingestor(store, cast.ledger).ingest(items[at : at + size])
        with Store(path, ledger_public_key=cast.ledger.public_key) as store:
            stored.append(store.capacity_claims())
            derived: list[Claim] = []
            for pid in sorted(set(pids)):
                out = tmp / f"{name}-{pid}.duckdb"
                try:
                    export_placement(store, pid, out, key=cast.ledger)
                except UnknownPlacement:  # no terms accepted: nothing to export or claim
                    continue
                derived += claims_of(str(out))[1]
    assert stored[0] == stored[1]
    ledger_claims = sorted(
        (uuid, pid, start, end, share) for _, uuid, pid, start, end, share in stored[0]
    )
    verifier_claims = sorted(
        (c.uuid, c.placement_id, c.start_ms, c.end_ms, c.share_milli) for c in derived
    )
    assert ledger_claims == verifier_claims
    assert find_oversold(derived) == []
