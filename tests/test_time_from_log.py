"""Issue 14, section B (time from the log, SPEC §6.6): one row per attack.

Built with the attacker's keys only. (a) The fold, given the arrival times the log gives,
rejects the attack with its reason (or prices it from the arrival); (b) a dishonest
ledger that chains it otherwise (records signed with the ledger key by ``ExportBuilder``)
is caught by the verifier, which re-derives every rule from the records' ``arrived_ms``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from test_verifier_exports import HOUR, MINUTE, T0, ExportBuilder, explain, verify

from devtools.builders import (
    Cast,
    StreamWriter,
    closed,
    gpu,
    key_binding,
    make_cast,
    make_terms,
    reclaim,
    sample,
    signed_terms,
)
from ledger.fold import Fold, Outcome
from ledger.pricing import reclaim_credit_minor
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.limits import ARRIVAL_REQUIRED_FROM_MS, MAX_CLOCK_SKEW_MS
from proto.records import LedgerRecord, PlacementTerms
from transport.local import publish_local

PID = "p-time"


@dataclass
class Stage:
    """Honest inputs and the attack, each with the time it reached the log."""

    cast: Cast
    terms: PlacementTerms
    honest: list[tuple[bytes, int]]
    attack: list[tuple[bytes, int]]
    ledger_reasons: list[str]  # what an honest ledger decides for each attack input


def _base(seed: str) -> tuple[Cast, PlacementTerms, StreamWriter, list[tuple[bytes, int]]]:
    cast = make_cast(seed)
    terms = make_terms(cast, PID, [gpu("node-a", 0)], T0, T0 + HOUR)
    writer = StreamWriter(cast.node_key("node-a"), PID, "node-a")
    first = writer.event(T0, T0 + 5 * MINUTE, [sample(terms.gpus[0])])
    return cast, terms, writer, [(signed_terms(cast, terms), T0 - MINUTE), (first, T0 + 5 * MINUTE)]


def stolen_key_presigns_the_window() -> Stage:
    # At minute 5 the thief signs [minute 5, minute 60) with the node's key.
    cast, terms, writer, honest = _base("time-presign")
    ahead = writer.event(T0 + 5 * MINUTE, T0 + HOUR, [sample(terms.gpus[0])])
    return Stage(cast, terms, honest, [(ahead, T0 + 5 * MINUTE)], ["FUTURE_DATED"])


def usage_after_revocation() -> Stage:
    # The operator revokes the stolen key at minute 20 (valid until minute 10); the thief
    # then sends an event inside the old binding, [minute 5, minute 10).
    cast, terms, writer, honest = _base("time-revoked")
    old = cast.node_key("node-a")
    revoke = key_binding(cast, PID, "node-a", old, 0, T0 + 10 * MINUTE, T0, [cast.operator])
    honest.append((revoke, T0 + 20 * MINUTE))
    late = writer.event(T0 + 5 * MINUTE, T0 + 10 * MINUTE, [sample(terms.gpus[0])])
    return Stage(cast, terms, honest, [(late, T0 + 21 * MINUTE)], ["NODE_KEY_REVOKED"])


def binding_reaches_back() -> Stage:
    # Operator and buyer bind a new key "from minute 0", published at minute 20: it counts
    # from minute 20, so an event of [minute 5, minute 10) signed with it is not covered.
    cast, terms, _, honest = _base("time-binding")
    new_key = SigningKey.from_seed_text("node-a", "time-binding/new")
    bind = key_binding(cast, PID, "node-a", new_key, T0, T0 + HOUR, T0)
    honest.append((bind, T0 + 20 * MINUTE))
    fold = Fold(cast.ledger)
    for i, (raw, at) in enumerate(honest):
        fold.apply(raw, f"t:{i}", PID, at)
    state = fold.state(PID)
    assert state is not None
    writer = StreamWriter(new_key, PID, "node-a", seq=1, prev=state.streams["node-a"].last_hash)
    early = writer.event(T0 + 5 * MINUTE, T0 + 10 * MINUTE, [sample(terms.gpus[0])])
    return Stage(cast, terms, honest, [(early, T0 + 21 * MINUTE)], ["NODE_KEY_NOT_VALID"])


ATTACKS: dict[str, tuple[Callable[[], Stage], set[str]]] = {
    "a stolen node key pre-signs [minute 5, minute 60) at minute 5": (
        stolen_key_presigns_the_window,
        {"FUTURE_DATED"},
    ),
    "usage of a revoked key arriving after the revocation": (
        usage_after_revocation,
        {"NODE_KEY_REVOKED"},
    ),
    "a new key bound from before its arrival": (binding_reaches_back, {"NODE_KEY_NOT_VALID"}),
}


def _fold(stage: Stage) -> list[Outcome]:
    fold = Fold(stage.cast.ledger)
    outcomes: list[Outcome] = []
    for i, (raw, at) in enumerate(stage.honest + stage.attack):
        outcomes += fold.apply(raw, f"t:{i}", PID, at)
    return outcomes


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_ledger_rejects_the_attack(name: str) -> None:
    stage = ATTACKS[name][0]()
    outcomes = _fold(stage)
    honest, attack = outcomes[: len(stage.honest)], outcomes[len(stage.honest) :]
    assert [o.status for o in honest] == ["accepted"] * len(honest), [o.detail for o in honest]
    assert [o.reason for o in attack] == stage.ledger_reasons, [o.detail for o in attack]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_dishonest_ledger_that_accepts_it_is_caught(name: str, tmp_path: Path) -> None:
    make, expected = ATTACKS[name]
    stage = make()
    b = ExportBuilder(stage.cast, stage.terms)
    for raw, at in stage.honest + stage.attack:
        b.add(raw, arrived_ms=at)  # the attack chained as accepted, with its true arrival
    b.statements_at = [len(b.items) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), stage.cast.trust())
    assert expected <= report.findings.rules(), explain(report)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_honest_export_of_the_rejection_verifies(name: str, tmp_path: Path) -> None:
    stage = ATTACKS[name][0]()
    b = ExportBuilder(stage.cast, stage.terms)
    for raw, at in stage.honest:
        b.add(raw, arrived_ms=at)
    for (raw, at), reason in zip(stage.attack, stage.ledger_reasons, strict=True):
        b.add(raw, "rejected", reason, arrived_ms=at)
    b.statements_at = [len(b.items) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), stage.cast.trust())
    assert not report.findings, explain(report)


# ---- the bound ---------------------------------------------------------------------------


@pytest.mark.parametrize(("over", "reason"), [(0, None), (1, "FUTURE_DATED")])
def test_future_dated_bound_exact_and_one_past(over: int, reason: str | None) -> None:
    cast, terms, writer, honest = _base("time-bound")
    arrived = T0 + 6 * MINUTE
    end = arrived + MAX_CLOCK_SKEW_MS + over
    event = writer.event(T0 + 5 * MINUTE, end, [sample(terms.gpus[0])])
    stage = Stage(cast, terms, honest, [(event, arrived)], [])
    (outcome,) = _fold(stage)[len(honest) :]
    assert outcome.reason == reason, outcome.detail


# ---- the backdated reclaim notice ----------------------------------------------------------


def _backdated(seed: str) -> tuple[Cast, PlacementTerms, list[tuple[bytes, int]], int]:
    # The operator writes issued_at = minute 0 (a full 30-minute notice on paper) and
    # publishes the reclaim at minute 29: one minute of notice, from the log.
    cast, terms, _, honest = _base(seed)
    effective = T0 + 30 * MINUTE
    notice = reclaim(cast, terms, T0, effective, "rc-1")
    return cast, terms, [*honest, (notice, T0 + 29 * MINUTE)], effective


def test_a_backdated_reclaim_notice_runs_from_its_arrival() -> None:
    cast, terms, inputs, effective = _backdated("time-reclaim")
    outcomes = _fold(Stage(cast, terms, inputs, [], []))
    assert [o.status for o in outcomes] == ["accepted"] * 3, [o.detail for o in outcomes]
    credit = outcomes[-1].record.totals.reclaim_credit_minor  # type: ignore[union-attr]
    from_arrival = reclaim_credit_minor(terms, T0 + 29 * MINUTE, effective)
    from_paper = reclaim_credit_minor(terms, T0, effective)
    assert credit == from_arrival > from_paper


def test_a_reclaim_arriving_after_it_took_effect_gave_no_notice() -> None:
    cast, terms, inputs, effective = _backdated("time-reclaim-late")
    inputs[-1] = (inputs[-1][0], effective + MINUTE)
    outcomes = _fold(Stage(cast, terms, inputs, [], []))
    credit = outcomes[-1].record.totals.reclaim_credit_minor  # type: ignore[union-attr]
    assert credit == reclaim_credit_minor(terms, effective, effective)


@pytest.mark.parametrize("honest", [True, False], ids=["from-arrival", "from-issued-at"])
def test_the_verifier_prices_the_reclaim_from_its_arrival(honest: bool, tmp_path: Path) -> None:
    cast, terms, inputs, _ = _backdated("time-reclaim-verify")
    b = ExportBuilder(cast, terms)
    for raw, at in inputs:
        b.add(raw, arrived_ms=at)
    if not honest:  # the dishonest ledger prices the notice from issued_at_ms
        b.items[-1].priced_from = T0
    b.statements_at = [len(b.items) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    if honest:
        assert not report.findings, explain(report)
    else:
        assert report.findings, "a reclaim priced from issued_at_ms must not verify"


# ---- arrival order, untimed records, a premature close ------------------------------------


def test_arrival_going_backwards_is_a_finding(tmp_path: Path) -> None:
    cast, terms, _, inputs = _base("time-order")
    b = ExportBuilder(cast, terms)
    b.add(inputs[0][0], arrived_ms=T0 + 10 * MINUTE)
    b.add(inputs[1][0], arrived_ms=T0 + 9 * MINUTE)
    b.statements_at = [1]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert "ARRIVAL_ORDER" in report.findings.rules(), explain(report)


def test_a_timed_chain_that_turns_untimed_is_a_finding(tmp_path: Path) -> None:
    cast, terms, _, inputs = _base("time-missing")
    b = ExportBuilder(cast, terms)
    b.add(inputs[0][0], arrived_ms=T0)
    b.add(inputs[1][0], arrived_ms=None)
    b.statements_at = [1]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert "ARRIVAL_MISSING" in report.findings.rules(), explain(report)


def test_a_close_before_the_grace_ran_out_is_premature(tmp_path: Path) -> None:
    cast, terms, writer, inputs = _base("time-premature")
    due = terms.window_end_ms + terms.late_grace_ms
    last = writer.event(T0 + 50 * MINUTE, T0 + HOUR, [sample(terms.gpus[0])])
    b = ExportBuilder(cast, terms)
    for raw, at in inputs:
        b.add(raw, arrived_ms=at)
    b.add(closed(cast, PID, due), arrived_ms=T0 + HOUR)  # closed at the window's end
    b.add(last, "rejected", "AFTER_CLOSE", arrived_ms=T0 + HOUR + MINUTE)
    b.statements_at = [2, 3]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert "PREMATURE_CLOSE" in report.findings.rules(), explain(report)


def test_an_untimed_chain_escapes_no_rule_once_the_terms_are_recent(tmp_path: Path) -> None:
    """SPEC §6.6: a dishonest ledger leaves arrived_ms out of every record (so the
    pre-signed window would pass): for terms created from ARRIVAL_REQUIRED_FROM_MS on,
    each untimed record is ARRIVAL_MISSING; older terms may have untimed chains."""
    for start, caught in ((ARRIVAL_REQUIRED_FROM_MS, True), (ARRIVAL_REQUIRED_FROM_MS - 1, False)):
        cast = make_cast(f"time-untimed-{caught}")
        terms = make_terms(cast, PID, [gpu("node-a", 0)], start, start + HOUR)
        assert (terms.created_at_ms >= ARRIVAL_REQUIRED_FROM_MS) is caught
        writer = StreamWriter(cast.node_key("node-a"), PID, "node-a")
        b = ExportBuilder(cast, terms)
        b.add(signed_terms(cast, terms), arrived_ms=None)
        b.add(writer.event(start, start + HOUR, [sample(terms.gpus[0])]), arrived_ms=None)
        b.statements_at = [1]
        report = verify(b.write(tmp_path / f"{caught}.duckdb"), cast.trust())
        if caught:
            assert report.findings.rules() == {"ARRIVAL_MISSING"}, explain(report)
            assert report.findings.total == 2, explain(report)  # both records
        else:
            assert not report.findings, explain(report)


# ---- held inputs keep their own arrival ---------------------------------------------------


@pytest.mark.parametrize(
    ("terms_at", "released_at"),
    [
        # the log's order: the terms came after the held event, the record carries theirs
        (T0 + 20 * MINUTE, T0 + 20 * MINUTE),
        # a sender stated an earlier time for the terms: the event keeps its own
        (T0 - MINUTE, T0 + 5 * MINUTE),
    ],
    ids=["terms-later", "terms-stated-earlier"],
)
def test_a_released_held_input_carries_max_of_previous_and_its_own(
    terms_at: int, released_at: int
) -> None:
    cast, _, _, honest = _base("time-held")
    (terms_raw, _), (event, event_at) = honest
    fold = Fold(cast.ledger)
    assert [o.decision for o in fold.apply(event, "t:0", PID, event_at)] == ["held"]
    outcomes = fold.apply(terms_raw, "t:1", PID, terms_at)
    records = [o.record for o in outcomes if o.record is not None]
    assert [r.kind for r in records] == ["terms", "usage"]
    assert [r.arrived_ms for r in records] == [terms_at, released_at]
    assert [r.status for r in records] == ["accepted", "accepted"]


# ---- where arrival comes from: the log, or (simulations) the sender ----------------------


@pytest.mark.parametrize("arrival", ["log", "sender"])
def test_embedded_arrival_is_the_intake_clock_unless_a_simulation_says_sender(
    arrival: Literal["log", "sender"], tmp_path: Path
) -> None:
    cast, _, _, honest = _base(f"time-embedded-{arrival}")
    (terms_raw, _), (event, _) = honest
    local = tmp_path / "spool"
    publish_local(local, "publish-terms", [terms_raw])  # plain frame: no stated time
    publish_local(local, "node-node-a", [event], stamps_ms=[T0 + 9 * MINUTE])
    clock_ms = T0 + 7 * MINUTE
    store = Store(tmp_path / "l.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store,
        cast.ledger,
        ledger_id="l",
        local_dir=local,
        clock=fixed_clock(clock_ms),
        arrival=arrival,
    )
    try:
        service.run_until_idle()
        records = [open_envelope(e).record for e in store.record_envelopes(PID)]
    finally:
        service.close()
    arrived = [r.arrived_ms for r in records if isinstance(r, LedgerRecord)]
    # The terms' plain frame arrives at the ledger clock either way; the event's stamped
    # frame at the time its sender stated only in a simulation.
    stated = T0 + 9 * MINUTE if arrival == "sender" else clock_ms
    assert arrived == [clock_ms, stated]
