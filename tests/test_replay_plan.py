"""Placement planning on the trace excerpt: capacity never over-committed, whole-GPU tasks
on one node, model constraints honoured, nothing dropped silently, deterministic; and the
terms built from a plan are valid and signed by all three parties."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from gridledger.placement_plan import Plan, buyer_index, plan_placements
from gridledger.replay_limits import TRACE_EPOCH_MS
from gridledger.replay_terms import (
    PriceTableError,
    load_price_table,
    make_replay_cast,
    signed_placement_terms,
)
from gridledger.trace import Node, Task, read_trace
from proto.envelope import open_envelope
from proto.terms import check_terms_signatures, validate_terms
from transport.kafka import placement_of

EXCERPT = Path(__file__).parent / "data" / "openb_excerpt"


def _plan(nodes: tuple[Node, ...], tasks: tuple[Task, ...] | list[Task]) -> Plan:
    return plan_placements(nodes, tasks, epoch_ms=TRACE_EPOCH_MS, buyers=4)


def _peak_share_per_gpu(plan: Plan) -> dict[str, int]:
    """Sweep every GPU's [start, end) intervals: the largest sum of shares at any instant."""
    events: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p in plan.placements:
        for g in p.gpus:
            events[g.uuid].append((p.window_start_ms, g.share_milli))
            events[g.uuid].append((p.window_end_ms, -g.share_milli))
    peaks: dict[str, int] = {}
    for uuid, items in events.items():
        # Ends before starts at the same instant: a share is free again at deletion time.
        items.sort(key=lambda e: (e[0], e[1]))
        load = peak = 0
        for _, delta in items:
            load += delta
            peak = max(peak, load)
        peaks[uuid] = peak
    return peaks


def test_excerpt_plan_never_over_commits_and_places_every_task_that_ran() -> None:
    trace = read_trace(EXCERPT)
    plan = _plan(trace.nodes, trace.tasks)
    ran = [t for t in trace.tasks if t.ran]
    assert len(plan.placements) + len(plan.unplaceable) == len(ran)
    assert plan.unplaceable == ()
    peaks = _peak_share_per_gpu(plan)
    assert max(peaks.values()) <= 1000
    # The excerpt shares GPUs: some GPU carries more than one task at the same instant.
    assert any(
        sum(1 for q in plan.placements if g.uuid in {x.uuid for x in q.gpus}) > 1
        for p in plan.placements
        for g in p.gpus
        if g.share_milli < 1000
    )
    nodes = {n.sn: n for n in trace.nodes}
    for p in plan.placements:
        task = p.task
        assert task.scheduled_time_s is not None and task.deletion_time_s is not None
        assert p.window_start_ms == TRACE_EPOCH_MS + task.scheduled_time_s * 1000
        assert p.window_end_ms == TRACE_EPOCH_MS + task.deletion_time_s * 1000
        assert len(p.gpus) == task.num_gpu
        assert {g.node_id for g in p.gpus} == {p.node_id}  # one node
        assert len({g.index for g in p.gpus}) == task.num_gpu  # distinct GPUs
        assert all(g.share_milli == task.gpu_milli for g in p.gpus)
        assert all(g.model == nodes[p.node_id].model for g in p.gpus)
        assert all(g.index < nodes[p.node_id].gpus for g in p.gpus)
        assert all(g.uuid == f"GPU-{p.node_id}-{g.index}" for g in p.gpus)
        assert p.interruptible == (task.qos == "BE")
        assert p.weighted_mgms == task.num_gpu * task.gpu_milli * task.duration_s * 1000
    assert any(len(p.gpus) == 8 for p in plan.placements)


def test_plan_is_deterministic_and_in_start_order() -> None:
    trace = read_trace(EXCERPT)
    first = _plan(trace.nodes, trace.tasks)
    second = _plan(trace.nodes, tuple(reversed(trace.tasks)))
    assert first.placements == second.placements
    starts = [(p.window_start_ms, p.task.line) for p in first.placements]
    assert starts == sorted(starts)
    assert {p.buyer for p in first.placements} == {0, 1, 2, 3}
    assert all(p.buyer == buyer_index(p.placement_id, 4) for p in first.placements)


@pytest.mark.parametrize("spec", [{"T4"}, {"V100M32", "G3"}, {"V100M16", "A10"}])
def test_model_constraints_are_honoured(spec: set[str]) -> None:
    trace = read_trace(EXCERPT)
    constrained = [
        dataclasses.replace(t, gpu_spec=frozenset(spec)) if t.ran and t.line % 3 == 0 else t
        for t in trace.tasks
    ]
    plan = _plan(trace.nodes, constrained)
    models = {n.sn: n.model for n in trace.nodes}
    checked = 0
    for p in plan.placements:
        if p.task.gpu_spec:
            assert models[p.node_id] in spec
            checked += 1
    for u in plan.unplaceable:
        assert u.task.gpu_spec == frozenset(spec)
    assert checked + len(plan.unplaceable) == sum(1 for t in constrained if t.gpu_spec)
    assert checked > 0
    assert max(_peak_share_per_gpu(plan).values()) <= 1000


def test_unplaceable_tasks_are_reported_with_a_reason() -> None:
    trace = read_trace(EXCERPT)
    p100 = tuple(n for n in trace.nodes if n.model == "P100")[:2]  # 4 GPUs in all
    tasks = [t for t in trace.tasks if t.ran]
    tasks.append(
        dataclasses.replace(
            tasks[0], name="needs-a-missing-model", line=10_001, gpu_spec=frozenset({"H100"})
        )
    )
    plan = _plan(p100, tasks)
    reasons = {u.task.name: u.reason for u in plan.unplaceable}
    assert reasons["needs-a-missing-model"] == "no node has a GPU of model H100"
    assert any("8 GPUs" in r for r in reasons.values())  # 8-GPU tasks on 2-GPU nodes
    assert any("free at scheduled_time" in r for r in reasons.values())  # capacity
    assert len(plan.placements) + len(plan.unplaceable) == len(tasks)
    assert max(_peak_share_per_gpu(plan).values()) <= 1000


def test_terms_of_the_plan_are_valid_and_signed_by_all_three_parties() -> None:
    trace = read_trace(EXCERPT)
    plan = _plan(trace.nodes, trace.tasks)
    cast = make_replay_cast("test-seed", 4)
    prices = load_price_table()
    trusted = {k.key for k in cast.trust().keys}
    for placement in plan.placements:
        terms, envelope = signed_placement_terms(placement, cast, prices)
        assert validate_terms(terms) == []
        opened = open_envelope(envelope)
        assert opened.record == terms
        assert check_terms_signatures(opened.envelope, terms)  # all three, each valid
        assert {terms.operator.key, terms.buyer.key, terms.desk.key, terms.ledger_key} <= trusted
        assert terms.buyer.id == f"buyer-{placement.buyer + 1}"
        assert terms.interruptible == (placement.task.qos == "BE")
        price = prices.price(placement.model)
        assert terms.rate_per_gpu_hour_minor == price.rate_per_gpu_hour_minor
        assert terms.nodes[0].key == cast.node_key(placement.node_id).public_key
        assert placement_of(envelope) == placement.placement_id
    again = make_replay_cast("test-seed", 4)
    assert again.trust() == cast.trust()  # keys derive from the seed alone


def test_price_table_without_a_model_is_refused(tmp_path: Path) -> None:
    text = (Path(load_price_table().source)).read_text().replace("[models.P100]", "[models.X]")
    path = tmp_path / "prices.toml"
    path.write_text(text)
    trace = read_trace(EXCERPT)
    plan = _plan(trace.nodes, trace.tasks)
    with pytest.raises(PriceTableError, match="no price for GPU model 'P100'"):
        for placement in plan.placements:
            signed_placement_terms(placement, make_replay_cast("s", 4), load_price_table(path))
    path.write_text("currency = 'XXX'\n")
    with pytest.raises(PriceTableError, match="currency"):
        load_price_table(path)
