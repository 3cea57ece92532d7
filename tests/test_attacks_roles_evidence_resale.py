"""Resale, release, key bindings and evidence, attacked by each party with its own keys
(SPEC §6.3, §6.7, §6.8, §6.9, §7.10).

1. One key, one role (SPEC §6.3 keybinding, §6.8 (3)). A key that meters a node (bound by
   the terms or by an accepted binding, revoked or not) is never accepted as a new buyer's
   key (ASSIGNMENT_INVALID), and no binding binds a party's key or an accepted new
   buyer's (BINDING_INVALID): otherwise one key signs the usage it is billed for.
2. Fresh evidence (SPEC §6.9 (6)). A token's ``iat`` lies in [arrival -
   MAX_EVIDENCE_AGE_MS, arrival + MAX_CLOCK_SKEW_MS]: an old token of the same key (say,
   from before the GPUs were swapped) is EVIDENCE_INVALID.
3. Named bad inputs not yet covered elsewhere (an operator-only release), and
   a property: for random resale/release/reclaim sequences every figure of SPEC §7.10
   follows from the one before and the four sides balance to the minor unit.

For each attack: the ledger rejects it with the named reason and nothing already settled
changes (totals, resale list and attestations before == after); a dishonest ledger that
accepts it (its rule replaced by monkeypatch: a consistent, signed chain) is caught by
the verifier, which re-derives the decision; the honest export verifies clean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_resale_rules import B2, MIN, PID, T0, WINDOW_MS, assignments, case, findings, fold

from devtools import builders
from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger import rules as ledger_rules
from ledger.fold import Fold, Outcome
from proto.attestation import AttestationRoot, claims_for, issue_evidence, parse_evidence
from proto.keys import SigningKey
from proto.limits import MAX_CLOCK_SKEW_MS, MAX_EVIDENCE_AGE_MS
from proto.records import NodeKeyBinding, PlacementTerms
from transport.local import node_source, publisher_source

HOUR = 60 * MIN
DAY = 24 * HOUR
FOREVER = (0, 2**53 - 1)
METER = SigningKey.from_seed_text("meter-2", "attacks-issue16/meter-2")
SERVICE = SigningKey.from_seed_text("service", "attacks-issue16/attestation-service")
ROOTS = (AttestationRoot("test-attestation", "EdDSA", SERVICE.public_key),)


def _one(fold_: Fold, raw: bytes, at: int | None, tag: str) -> Outcome:
    outcomes = fold_.apply(raw, tag, None, at)
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


def _settled(fold_: Fold, pid: str) -> tuple[Any, ...]:
    """What a rejection must leave as it was: totals, resale list, attestations, bindings."""
    state = fold_.state(pid)
    assert state is not None
    return (
        state.totals,
        state.assignments,
        msgspec.to_builtins(state.attested),
        msgspec.to_builtins(state.bindings),
    )


def _rejected(fold_: Fold, pid: str, raw: bytes, at: int | None, reason: str, tag: str) -> Outcome:
    """Apply ``raw``: rejected with ``reason``, chained, nothing settled changed."""
    before = _settled(fold_, pid)
    head = fold_.head(pid)
    assert head is not None
    got = _one(fold_, raw, at, tag)
    assert (got.status, got.reason) == ("rejected", reason), got.detail
    assert got.record is not None and got.record.index == head[0]  # chained, as evidence
    assert got.record.totals == before[0]
    assert _settled(fold_, pid) == before
    return got


# ---- 1. one key, one role -------------------------------------------------------------------


def _resale_fold(seed: str) -> tuple[builders.Cast, PlacementTerms, Fold]:
    cast = make_cast(seed)
    terms = make_terms(cast, PID, [gpu("n1", 0), gpu("n2", 0)], T0, T0 + HOUR)
    fold_ = Fold(cast.ledger)
    assert _one(fold_, signed_terms(cast, terms), T0, "terms").status == "accepted"
    return cast, terms, fold_


def _assign(cast: builders.Cast, terms: PlacementTerms, aid: str, buyer: SigningKey) -> bytes:
    return builders.assignment(cast, terms, aid, buyer, T0 + 2 * MIN, ["GPU-n2-0"], 400)


def test_a_key_bound_by_a_binding_is_never_a_new_buyers_key() -> None:
    cast, terms, f = _resale_fold("attack16-bound-key")
    bind = builders.key_binding(cast, PID, "n1", METER, T0, T0 + HOUR, T0)
    assert _one(f, bind, T0, "bind").status == "accepted"
    # The operator and the buyer bound METER to n1: as a new buyer it would be billed
    # for the usage it signs itself.
    got = _rejected(
        f, PID, _assign(cast, terms, "as-1", METER), T0 + MIN, "ASSIGNMENT_INVALID", "a1"
    )
    assert "node key of n1" in got.detail
    # Revoked, it was still a meter of this placement: still refused.
    revoke = builders.key_binding(
        cast, PID, "n1", METER, T0, T0 + 10 * MIN, T0 + MIN, signers=[cast.operator]
    )
    assert _one(f, revoke, T0 + MIN, "revoke").status == "accepted"
    _rejected(f, PID, _assign(cast, terms, "as-2", METER), T0 + 2 * MIN, "ASSIGNMENT_INVALID", "a2")
    # The terms' own node key, as before.
    n1 = cast.node_key("n1")
    _rejected(f, PID, _assign(cast, terms, "as-3", n1), T0 + 2 * MIN, "ASSIGNMENT_INVALID", "a3")
    # Control: a key that never metered is sold to.
    assert _one(f, _assign(cast, terms, "as-4", B2), T0 + 2 * MIN, "a4").status == "accepted"


def test_a_new_buyers_key_is_never_bound_to_a_node_and_never_meters() -> None:
    cast, terms, f = _resale_fold("attack16-buyer-meters")
    assert _one(f, _assign(cast, terms, "as-1", B2), T0 + 2 * MIN, "a").status == "accepted"
    bind = builders.key_binding(cast, PID, "n2", B2, T0, T0 + HOUR, T0 + 3 * MIN)
    got = _rejected(f, PID, bind, T0 + 3 * MIN, "BINDING_INVALID", "bind")
    assert "new buyer 'buyer-2'" in got.detail and "as-1" in got.detail
    # So buyer-2's key signs no usage of the node whose GPU it bought.
    usage = StreamWriter(B2, PID, "n2").event(T0 + 3 * MIN, T0 + 4 * MIN, [sample(terms.gpus[1])])
    _rejected(f, PID, usage, T0 + 4 * MIN, "NODE_KEY_UNKNOWN", "usage")


@pytest.mark.parametrize("party", ["operator", "buyer", "desk", "ledger"])
def test_a_binding_of_a_party_key_is_binding_invalid(party: str) -> None:
    cast, _, f = _resale_fold(f"attack16-party-{party}")
    key = getattr(cast, party)
    bind = builders.key_binding(cast, PID, "n1", key, T0, T0 + HOUR, T0)
    got = _rejected(f, PID, bind, T0, "BINDING_INVALID", party)
    assert f"the {party}'s key" in got.detail
    # Evidence does not make it one either (a binding that only attests is judged too).
    assert _one(f, bind, T0, "again").decision != "accepted"


def test_verifier_catches_a_ledger_that_sells_to_a_meter_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    bind = (
        publisher_source("desk"),
        builders.key_binding(c.cast, PID, "n1", METER, T0, T0 + WINDOW_MS, T0),
    )
    sale = c.assign("a-1", METER, 1, ["GPU-n2-0"])
    phases = [(0, [bind]), (1, [sale]), (10, c.events(0, 10))]
    honest = fold(tmp_path / "honest", c, phases)
    assert assignments(honest) == [("rejected", "ASSIGNMENT_INVALID")]
    assert findings(honest) == set()
    assert all(not r.resale for r in honest.records)

    rule = ledger_rules._assignment

    def lax(state: Any, *args: Any) -> dict[str, Any]:  # forgets the bindings since the terms
        return rule(msgspec.structs.replace(state, bindings={}), *args)

    monkeypatch.setattr(ledger_rules, "_assignment", lax)
    dishonest = fold(tmp_path / "dishonest", c, phases)
    assert assignments(dishonest) == [("accepted", "")]
    assert dishonest.records[-1].resale[0].delivered_mgms > 0  # billed to the meter key
    assert "ASSIGNMENT_INVALID" in findings(dishonest)  # SPEC §6.8 (3) says rejected


def test_verifier_catches_a_ledger_that_binds_a_new_buyers_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    bind = builders.key_binding(c.cast, PID, "n2", B2, T0, T0 + WINDOW_MS, T0 + MIN)
    n2 = [g for g in c.gpus if g.node_id == "n2"]
    rogue = StreamWriter(B2, PID, "n2")
    usage = [
        (node_source("n2"), rogue.event(T0 + m * MIN, T0 + (m + 1) * MIN, [sample(g) for g in n2]))
        for m in range(1, 5)
    ]
    phases = [
        (0, [c.assign("a-1", B2, 0, ["GPU-n2-0"])]),
        (1, [(publisher_source("desk"), bind)]),
        (5, usage),
    ]
    honest = fold(tmp_path / "honest", c, phases)
    assert [(s, r) for k, s, r in honest.chain if k == "keybinding"] == [
        ("rejected", "BINDING_INVALID")
    ]
    assert {r for k, _, r in honest.chain if k == "usage"} == {"NODE_KEY_UNKNOWN"}
    assert findings(honest) == set()
    assert honest.records[-1].resale[0].delivered_mgms == 0
    assert honest.records[-1].totals.delivered_mgms == 0

    monkeypatch.setattr(ledger_rules, "_party_of_key", lambda *args: None)
    dishonest = fold(tmp_path / "dishonest", c, phases)
    assert [s for k, s, _ in dishonest.chain if k == "keybinding"] == ["accepted"]
    # buyer-2 metered its own GPU: 4 minutes billed to it and to the original buyer
    assert dishonest.records[-1].resale[0].delivered_mgms == 4 * MIN * 1000
    assert "BINDING_INVALID" in findings(dishonest)


# ---- 2. fresh evidence --------------------------------------------------------------------


def _attested_terms(seed: str) -> tuple[builders.Cast, PlacementTerms]:
    cast = make_cast(seed)
    gpus = [gpu("n1", i, model="H100-80GB") for i in range(2)]
    return cast, make_terms(cast, PID, gpus, T0, T0 + 3 * DAY, attestation_required=True)


def _evidence(terms: PlacementTerms, key: SigningKey, iat_ms: int) -> str:
    models = {g.uuid: g.model for g in terms.gpus if g.node_id == "n1"}
    claims = claims_for(terms.placement_id, "n1", key.public_key, models, iat=iat_ms // 1000)
    return issue_evidence(claims, kid="svc-1", ed25519=SERVICE)


def _attest(cast: builders.Cast, key: SigningKey, evidence: str, issued_ms: int) -> bytes:
    return builders.key_binding(
        cast, PID, "n1", key, *FOREVER, issued_ms, signers=[cast.operator], evidence=evidence
    )


def test_evidence_age_bounds_exact_and_one_second_past() -> None:
    cast, terms = _attested_terms("attack16-age")
    key = cast.node_key("n1")
    f = Fold(cast.ledger, attestation_roots=ROOTS)
    assert _one(f, signed_terms(cast, terms), T0, "terms").status == "accepted"
    a = T0 + 10 * MIN  # each binding reaches the log at minute 10
    oldest, newest = a - MAX_EVIDENCE_AGE_MS, a + MAX_CLOCK_SKEW_MS
    got = _rejected(f, PID, _attest(cast, key, _evidence(terms, key, oldest - 1000), a), a,
                    "EVIDENCE_INVALID", "old")  # fmt: skip
    assert "MAX_EVIDENCE_AGE_MS" in got.detail
    got = _rejected(f, PID, _attest(cast, key, _evidence(terms, key, newest + 1000), a), a,
                    "EVIDENCE_INVALID", "future")  # fmt: skip
    assert "MAX_CLOCK_SKEW_MS" in got.detail
    for tag, at in (("oldest", oldest), ("newest", newest)):
        ok = _one(f, _attest(cast, key, _evidence(terms, key, at), a), a, tag)
        assert ok.status == "accepted", ok.detail
        state = f.state(PID)
        assert state is not None and state.attested["n1"][key.public_key].iat == at // 1000


def test_an_untimed_binding_is_judged_against_its_issued_time() -> None:
    cast, terms = _attested_terms("attack16-untimed")
    key = cast.node_key("n1")
    f = Fold(cast.ledger, attestation_roots=ROOTS)
    assert _one(f, signed_terms(cast, terms), None, "terms").status == "accepted"
    issued = T0 + HOUR
    stale = _attest(cast, key, _evidence(terms, key, issued - MAX_EVIDENCE_AGE_MS - 1000), issued)
    _rejected(f, PID, stale, None, "EVIDENCE_INVALID", "stale")
    fresh = _attest(cast, key, _evidence(terms, key, issued - HOUR), issued)
    assert _one(f, fresh, None, "fresh").status == "accepted"


def test_an_old_token_of_the_same_key_does_not_replay_after_a_swap() -> None:
    """Day 0: the node's GPUs are attested. Day 2, after the GPUs were swapped, the operator
    re-binds the key with the day-0 token: its nonce still matches (same placement, node,
    key), its signature is still good, but it is two days old."""
    cast, terms = _attested_terms("attack16-replay")
    key = cast.node_key("n1")
    f = Fold(cast.ledger, attestation_roots=ROOTS)
    assert _one(f, signed_terms(cast, terms), T0, "terms").status == "accepted"
    day0 = _evidence(terms, key, T0)
    assert _one(f, _attest(cast, key, day0, T0), T0 + MIN, "day0").status == "accepted"
    writer = StreamWriter(key, PID, "n1")
    usage = writer.event(T0 + MIN, T0 + 2 * MIN, [sample(g) for g in terms.gpus])
    assert _one(f, usage, T0 + 2 * MIN, "usage").status == "accepted"
    # a revocation, then the key back with the old token
    revoke = builders.key_binding(
        cast, PID, "n1", key, 0, T0 + 2 * DAY, T0 + 2 * DAY, signers=[cast.operator]
    )
    assert _one(f, revoke, T0 + 2 * DAY, "revoke").status == "accepted"
    back = builders.key_binding(
        cast, PID, "n1", key, *FOREVER, T0 + 2 * DAY, evidence=day0
    )  # operator and buyer
    got = _rejected(f, PID, back, T0 + 2 * DAY, "EVIDENCE_INVALID", "replay")
    assert "MAX_EVIDENCE_AGE_MS" in got.detail
    # the same binding with a token issued now is accepted
    now = _evidence(terms, key, T0 + 2 * DAY)
    again = builders.key_binding(cast, PID, "n1", key, *FOREVER, T0 + 2 * DAY, evidence=now)
    assert _one(f, again, T0 + 2 * DAY, "fresh").status == "accepted"


def _age_phases(cast: builders.Cast, terms: PlacementTerms, iat_ms: int) -> list[Any]:
    key = cast.node_key("n1")
    binding = _attest(cast, key, _evidence(terms, key, iat_ms), T0)
    return [(0, [(publisher_source("operator"), binding)])]


def test_verifier_catches_a_ledger_that_accepts_stale_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    stale = _age_phases(c.cast, c.terms, T0 - 2 * DAY)
    honest = fold(tmp_path / "honest", c, stale)
    assert [(s, r) for k, s, r in honest.chain if k == "keybinding"] == [
        ("rejected", "EVIDENCE_INVALID")
    ]
    assert findings(honest) == set()
    assert honest.report.attestations == []

    rule = ledger_rules._evidence

    def ageless(state: Any, terms: Any, binding: NodeKeyBinding, roots: Any, at: int) -> Any:
        issued = parse_evidence(binding.evidence).claims.iat * 1000  # any age is "fresh"
        return rule(state, terms, binding, roots, issued)

    monkeypatch.setattr(ledger_rules, "_evidence", ageless)
    dishonest = fold(tmp_path / "dishonest", c, stale)
    assert [s for k, s, _ in dishonest.chain if k == "keybinding"] == ["accepted"]
    assert "EVIDENCE_INVALID" in findings(dishonest)


def test_verifier_catches_a_ledger_that_refuses_fresh_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    fresh = _age_phases(c.cast, c.terms, T0 - HOUR)
    honest = fold(tmp_path / "honest", c, fresh)
    assert [s for k, s, _ in honest.chain if k == "keybinding"] == ["accepted"]
    assert findings(honest) == set()
    assert [a["gpus"] for a in honest.report.attestations] == [["GPU-n1-0", "GPU-n1-1"]]

    rule = ledger_rules._evidence

    def strict(state: Any, terms: Any, binding: NodeKeyBinding, roots: Any, at: int) -> Any:
        return rule(state, terms, binding, roots, at + 2 * MAX_EVIDENCE_AGE_MS)

    monkeypatch.setattr(ledger_rules, "_evidence", strict)
    dishonest = fold(tmp_path / "dishonest", c, fresh)
    assert [(s, r) for k, s, r in dishonest.chain if k == "keybinding"] == [
        ("rejected", "EVIDENCE_INVALID")
    ]
    assert "EVIDENCE_INVALID" in findings(dishonest)  # the verifier says: accepted


# ---- 3. the issue's bad inputs not covered elsewhere ------------------------------------------
#
# Covered already, each with its named reason and "nothing settled changes": an unsigned
# release and one the desk co-signs (test_release.py), a resale of a GPU the buyer does
# not hold, overlapping resales (test_resale.py, test_resale_rules.py, resale.json),
# evidence for another key (test_attestation.py), a region outside the policy
# (test_residency_pipeline.py). Missing: the operator ending the buyer's placement.


def test_an_operator_only_release_is_refused_and_settles_nothing() -> None:
    cast, terms, f = _resale_fold("attack16-operator-release")
    writer = StreamWriter(cast.node_key("n1"), PID, "n1")
    usage = writer.event(T0, T0 + 10 * MIN, [sample(terms.gpus[0])])
    assert _one(f, usage, T0 + 10 * MIN, "usage").status == "accepted"
    at = T0 + 11 * MIN
    for tag, signers in (
        ("operator", [cast.operator]),
        ("operator+desk", [cast.operator, cast.desk]),
    ):
        raw = builders.release(cast, terms, at, at, f"rl-{tag.replace('+', '-')}", signers)
        reason = "SIG_MISSING" if tag == "operator" else "SIG_SURPLUS"
        _rejected(f, PID, raw, at, reason, tag)
        state = f.state(PID)
        assert state is not None and state.release_end_ms is None
        assert state.effective_end_ms == terms.window_end_ms  # the buyer still holds it all


def test_verifier_catches_a_ledger_that_lets_the_operator_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    raw = builders.release(
        c.cast, c.terms, T0 + 11 * MIN, T0 + 11 * MIN, "rl-op", [c.cast.operator]
    )
    phases = [
        (10, c.events(0, 10)),
        (11, [(publisher_source("operator"), raw)]),
        (20, c.events(10, 20)),
    ]
    honest = fold(tmp_path / "honest", c, phases)
    assert [(s, r) for k, s, r in honest.chain if k == "release"] == [("rejected", "SIG_MISSING")]
    assert findings(honest) == set()
    require = ledger_rules._require

    def lax(opened: Any, required: Any, optional: Any = None) -> None:
        if isinstance(opened.record, ledger_rules.BuyerRelease):
            return  # any signer ends the placement
        require(opened, required, optional)

    monkeypatch.setattr(ledger_rules, "_require", lax)
    dishonest = fold(tmp_path / "dishonest", c, phases)
    assert [s for k, s, _ in dishonest.chain if k == "release"] == ["accepted"]
    # the placement ended at minute 11 against the buyer's will: its later usage is cut
    cut = {r for k, s, r in dishonest.chain if k == "usage" and s == "rejected"}
    assert "AFTER_RELEASE" in cut
    assert dishonest.records[-1].totals.delivered_mgms < honest.records[-1].totals.delivered_mgms
    assert "SIG_MISSING" in findings(dishonest)


# ---- the property: resale, release and reclaim in any order ---------------------------------

_BUYERS = [SigningKey.from_seed_text(f"nb-{i}", f"attacks-issue16/nb-{i}") for i in range(3)]
_UUIDS = ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0"]
_USAGE = st.tuples(st.just("usage"), st.sampled_from(["n1", "n2", "both"]), st.integers(1, 20))
_ASSIGN = st.tuples(
    st.just("assign"),
    st.lists(st.sampled_from(_UUIDS), min_size=1, max_size=3, unique=True),
    st.integers(0, 55),  # handover minute; the arrival may move it later
    st.integers(1, 2000),  # resale rate
    st.integers(0, 2),  # which new buyer
)
# usage and resales twice as likely as a release or a reclaim (each ends the placement)
_OPS = st.lists(
    st.one_of(
        _USAGE,
        _USAGE,
        _ASSIGN,
        _ASSIGN,
        st.tuples(st.just("release"), st.integers(10, 65)),
        st.tuples(st.just("reclaim"), st.integers(10, 65)),
    ),
    max_size=16,
)
_PROPERTY_CAST = make_cast("attack16-property")
_PROPERTY_TERMS = make_terms(
    _PROPERTY_CAST,
    PID,
    [gpu("n1", 0), gpu("n1", 1, share_milli=500), gpu("n2", 0)],
    T0,
    T0 + HOUR,
    late_grace_ms=5 * MIN,
    minimum_duration_ms=40 * MIN,
    release_notice_ms=10 * MIN,
    reclaim_notice_ms=5 * MIN,
    reclaim_penalty_bps=2000,
)


def _inputs(ops: list[Any]) -> list[tuple[bytes, int]]:
    """Each op as a signed input and its arrival; time only moves forward."""
    cast, terms = _PROPERTY_CAST, _PROPERTY_TERMS
    writers = {n: StreamWriter(cast.node_key(n), PID, n) for n in ("n1", "n2")}
    last = {"n1": T0, "n2": T0}
    now = T0
    out: list[tuple[bytes, int]] = [(signed_terms(cast, terms), T0)]
    for i, op in enumerate(ops):
        match op:
            case ("usage", which, minutes):
                for node in ("n1", "n2") if which == "both" else (which,):
                    start, end = last[node], last[node] + minutes * MIN
                    samples = [sample(g) for g in terms.gpus if g.node_id == node]
                    last[node], now = end, max(now, end)
                    out.append((writers[node].event(start, end, samples), now))
            case ("assign", uuids, handover, rate, b):
                raw = builders.assignment(
                    cast, terms, f"as-{i}", _BUYERS[b], T0 + handover * MIN, uuids, rate, now
                )
                out.append((raw, now))
            case ("release", effective):
                raw = builders.release(cast, terms, now, T0 + effective * MIN, f"rl-{i}")
                out.append((raw, now))
            case ("reclaim", effective):
                raw = builders.reclaim(cast, terms, now, T0 + effective * MIN, f"rc-{i}")
                out.append((raw, now))
    close = T0 + HOUR + terms.late_grace_ms
    out.append((builders.closed(cast, PID, close), max(now, close)))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS)
def test_resale_and_release_sequences_balance_to_the_minor_unit(ops: list[Any]) -> None:
    terms = _PROPERTY_TERMS
    f = Fold(_PROPERTY_CAST.ledger)
    unit = terms.increment_ms * 1000
    previous = None
    for i, (raw, at) in enumerate(_inputs(ops)):
        for o in f.apply(raw, f"p:{i}", None, at):
            if o.record is None:
                continue
            record, t = o.record, o.record.totals
            if previous is not None and record.status == "rejected":
                assert (t, record.resale) == (previous.totals, previous.resale)  # nothing moves
            if previous is not None:  # cumulative figures never go back
                assert t.delivered_mgms >= previous.totals.delivered_mgms
                for old, new in zip(previous.resale, record.resale, strict=False):
                    assert new.assignment_id == old.assignment_id
                    assert new.delivered_mgms >= old.delivered_mgms
            state = f.state(PID)
            assert state is not None
            rates = {a.assignment_id: a.rate_per_gpu_hour_minor for a in state.assignments}
            for e in record.resale:  # SPEC §7.10, each figure from the one before it
                assert e.billable_mgms == -(-e.delivered_mgms // unit) * unit
                assert e.gross_minor == e.billable_mgms * rates[e.assignment_id] // 3_600_000_000
                assert e.fee_minor == e.gross_minor * terms.desk_fee_bps // 10_000
            # disjoint GPU sets: what the new buyers got is part of what was delivered
            assert sum(e.delivered_mgms for e in record.resale) <= t.delivered_mgms
            # SPEC §7.6, §7.9: N from its parts; the fee on N; who pays it
            assert t.net_minor == (
                t.gross_minor + t.adjustment_charge_minor + t.release_charge_minor - t.credits_minor
            )
            assert t.fee_minor == t.net_minor * terms.desk_fee_bps // 10_000
            assert (t.buyer_owes_minor, t.operator_receives_minor) == (
                (t.net_minor, t.net_minor - t.fee_minor)
                if terms.fee_payer == "operator"
                else (t.net_minor + t.fee_minor, t.net_minor)
            )
            # SPEC §7.10 balance: payments positive, receipts negative, to the minor unit
            sold = sum(e.gross_minor for e in record.resale)
            fees = sum(e.fee_minor for e in record.resale)
            original_net = t.buyer_owes_minor - (sold - fees)
            desk = t.desk_receives_minor + fees
            assert original_net + sold - t.operator_receives_minor - desk == 0
            previous = record
    assert previous is not None and previous.kind == "closed" and previous.status == "accepted"


def test_the_new_buyer_cannot_release_what_it_bought() -> None:
    cast, terms, f = _resale_fold("attack16-new-buyer-release")
    assert _one(f, _assign(cast, terms, "as-1", B2), T0 + 2 * MIN, "a").status == "accepted"
    at = T0 + 3 * MIN
    for tag, signers, reason in (
        ("alone", [B2], "SIG_SURPLUS"),  # a signer outside the table, checked first
        ("with-buyer", [cast.buyer, B2], "SIG_SURPLUS"),  # the new buyer is nobody here
        ("buyer", [cast.buyer], "RELEASE_INVALID"),  # and the seller no longer holds it whole
    ):
        _rejected(
            f, PID, builders.release(cast, terms, at, at, f"rl-{tag}", signers), at, reason, tag
        )


# ---- the vectors, re-derived by the verifier's own referee ---------------------------------


@pytest.mark.parametrize("name", ["resale_keys.json", "evidence_age.json"])
def test_the_verifier_referee_reproduces_the_vectors(name: str) -> None:
    """The verifier's decisions (``verifier/decisions.py``, written from the SPEC, not the
    ledger) for every step of the new vector files equal the ledger's."""
    import base64
    import json

    import vectorgen

    from proto.keys import key_id
    from verifier.decisions import Referee
    from verifier.opener import open_one

    data = json.loads((Path(vectorgen.VECTORS_DIR) / name).read_text())
    cast = vectorgen._cast()
    keys = [
        cast.operator, cast.buyer, cast.desk, cast.ledger,
        *(cast.node_key(n) for n in ("node-a", "node-b", "node-c")),
        SigningKey.from_seed_text("buyer-2", "vectors/buyer-2"),
        SigningKey.from_seed_text("meter-2", "vectors/node-a-second-key"),
    ]  # fmt: skip
    keyring = {key_id(k.public_key): [k.public_key] for k in keys}
    roots = tuple(
        AttestationRoot(r["id"], r["alg"], base64.b64decode(r["key"]))
        for r in data.get("attestation_roots", [])
    )
    first = open_one(0, base64.b64decode(data["steps"][0]["envelope_b64"]), keyring)
    assert isinstance(first.record, PlacementTerms)
    referee = Referee(
        first.record.placement_id,
        first.record.ledger_key,
        lambda node, seq: None,
        attestation_roots=roots or None,
    )
    for i, step in enumerate(data["steps"]):
        opened = open_one(i, base64.b64decode(step["envelope_b64"]), keyring)
        verdict = referee.decide(opened, False, i, step["arrived_ms"])
        (expected,) = step["outcomes"]
        assert (verdict.outcome, verdict.reason or None) == (
            expected["status"],
            expected["reason"],
        ), step["note"]
