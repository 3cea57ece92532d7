"""Attestations that expire (issue 16, SPEC §6.9 Expiry).

Under ``attestation_required`` a usage event is attested only when it ends at or before
its key's attestation ``iat`` x 1000 + MAX_ATTESTATION_VALIDITY_MS; past that it is
NOT_ATTESTED, judged by its end (an event straddling the expiry is refused whole). A fresh
binding that only attests replaces the attestation and its expiry.

Every case uses a token issued 23 h 30 min before the binding reaches the log (fresh by
§6.9 (6)), so the expiry falls 30 minutes into a one-hour window: no test needs a long
placement. The ledger rejects by name, chains the rejection and changes nothing settled;
a dishonest ledger that bills past the expiry is caught by the verifier.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_resale_rules import MIN, PID, T0, Case, case, findings, fold

from billview.render import to_html
from billview.units import iso_utc
from devtools import builders
from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger import rules as ledger_rules
from ledger.fold import Fold, Outcome
from proto import limits
from proto.attestation import AttestationRoot, claims_for, issue_evidence
from proto.keys import SigningKey
from proto.limits import MAX_ATTESTATION_VALIDITY_MS, MAX_EVIDENCE_AGE_MS
from proto.records import PlacementTerms
from transport.local import node_source, publisher_source
from verifier.report import render_export
from verifier.verify import verify_export

HOUR = 60 * MIN
DAY = 24 * HOUR
FOREVER = (0, 2**53 - 1)
SERVICE = SigningKey.from_seed_text("service", "attestation-expiry/service")
ROOTS = (AttestationRoot("test-attestation", "EdDSA", SERVICE.public_key),)
IAT = T0 - DAY + 30 * MIN  # whole seconds; bound at T0 it is 23 h 30 min old
EXPIRY = IAT + MAX_ATTESTATION_VALIDITY_MS  # T0 + 30 min


def test_the_validity_is_the_evidence_age_bound_and_the_expiry_is_in_the_window() -> None:
    # SPEC §6.9 Expiry argues the same span as §6.9 (6): no token speaks for a GPU more
    # than 24 h after it was measured.
    assert MAX_ATTESTATION_VALIDITY_MS == MAX_EVIDENCE_AGE_MS == DAY
    assert IAT % 1000 == 0 and EXPIRY == T0 + 30 * MIN


def _terms(seed: str) -> tuple[builders.Cast, PlacementTerms]:
    cast = make_cast(seed)
    gpus = [gpu(n, i, model="H100-80GB") for n in ("n1", "n2") for i in range(2)]
    return cast, make_terms(cast, PID, gpus, T0, T0 + HOUR, attestation_required=True)


def _attest(
    cast: builders.Cast, terms: PlacementTerms, node: str, iat_ms: int, issued_ms: int
) -> bytes:
    """A binding that only attests: the terms' key of ``node``, with fresh evidence."""
    key = cast.node_key(node)
    models = {g.uuid: g.model for g in terms.gpus if g.node_id == node}
    claims = claims_for(terms.placement_id, node, key.public_key, models, iat=iat_ms // 1000)
    evidence = issue_evidence(claims, kid="svc-1", ed25519=SERVICE)
    return builders.key_binding(
        cast, PID, node, key, *FOREVER, issued_ms, signers=[cast.operator], evidence=evidence
    )


def _one(f: Fold, raw: bytes, at: int, tag: str) -> Outcome:
    outcomes = f.apply(raw, tag, None, at)
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


def _settled(f: Fold) -> tuple[Any, ...]:
    state = f.state(PID)
    assert state is not None
    return (
        state.totals,
        msgspec.to_builtins(state.attested),
        msgspec.to_builtins(state.streams),
    )


class World:
    """A fold with the terms and both nodes attested at T0 by a token of IAT."""

    def __init__(self, seed: str) -> None:
        self.cast, self.terms = _terms(seed)
        self.fold = Fold(self.cast.ledger, attestation_roots=ROOTS)
        assert _one(self.fold, signed_terms(self.cast, self.terms), T0, "terms").status == (
            "accepted"
        )
        for node in ("n1", "n2"):
            got = _one(self.fold, _attest(self.cast, self.terms, node, IAT, T0), T0, f"a-{node}")
            assert got.status == "accepted", got.detail
        self.writers = {n: StreamWriter(self.cast.node_key(n), PID, n) for n in ("n1", "n2")}

    def usage(self, node: str, start: int, end: int, at: int | None = None) -> Outcome:
        samples = [sample(g) for g in self.terms.gpus if g.node_id == node]
        raw = self.writers[node].event(start, end, samples)
        return _one(self.fold, raw, end if at is None else at, f"u-{node}-{start}")

    def delivered(self) -> int:
        state = self.fold.state(PID)
        assert state is not None
        return state.totals.delivered_mgms


def test_usage_ending_at_the_expiry_is_billed_one_ms_later_is_not_attested() -> None:
    w = World("expiry-boundary")
    got = w.usage("n1", EXPIRY - 2 * MIN, EXPIRY - MIN)  # just before
    assert (got.status, got.reason) == ("accepted", None), got.detail
    got = w.usage("n1", EXPIRY - MIN, EXPIRY)  # ends exactly at the expiry: inclusive
    assert (got.status, got.reason) == ("accepted", None), got.detail
    billed = w.delivered()
    assert billed == 2 * 2 * MIN * 1000  # two GPUs, two minutes, share 1000
    before = _settled(w.fold)
    head = w.fold.head(PID)
    assert head is not None
    got = w.usage("n1", EXPIRY, EXPIRY + 1)  # ends 1 ms past it
    assert (got.status, got.reason) == ("rejected", "NOT_ATTESTED")
    assert f"expired at {EXPIRY}" in got.detail and "only attests" in got.detail, got.detail
    assert "MAX_ATTESTATION_VALIDITY_MS" in got.detail
    # chained as evidence; totals and attestations as they were; rejected for its content,
    # it took seq 2 by advancing the stream, whose last accepted end stays (SPEC §6.3 usage)
    assert got.record is not None and got.record.index == head[0]
    assert got.record.totals == before[0] and got.record.delivered_mgms == 0
    after = _settled(w.fold)
    assert after[:2] == before[:2]
    stream, was = after[2]["n1"], before[2]["n1"]
    assert (stream["next_seq"], stream["last_end_ms"]) == (3, was["last_end_ms"])


def test_an_event_straddling_the_expiry_is_refused_whole() -> None:
    w = World("expiry-straddle")
    got = w.usage("n2", EXPIRY - 10 * MIN, EXPIRY + 1000)  # 10 min before, 1 s after
    assert (got.status, got.reason) == ("rejected", "NOT_ATTESTED")
    assert w.delivered() == 0  # not the 10 minutes before the expiry either
    # the other node's stream is untouched and still billed up to its expiry
    got = w.usage("n1", EXPIRY - 10 * MIN, EXPIRY)
    assert (got.status, got.reason) == ("accepted", None)
    assert w.delivered() == 2 * 10 * MIN * 1000


@pytest.mark.parametrize("renew_at", [EXPIRY - 5 * MIN, EXPIRY + 5 * MIN])
def test_renewal_by_a_fresh_attest_only_binding_restores_billing(renew_at: int) -> None:
    """Renewed before the expiry, or after it while the agent holds the next event back:
    the event past the old expiry is judged against the renewal, folded after it."""
    w = World(f"expiry-renewal-{renew_at}")
    assert w.usage("n1", EXPIRY - MIN, EXPIRY).status == "accepted"
    fresh_iat = renew_at - MIN
    state = w.fold.state(PID)
    assert state is not None
    bindings = msgspec.to_builtins(state.bindings)
    got = _one(w.fold, _attest(w.cast, w.terms, "n1", fresh_iat, renew_at), renew_at, "renew")
    assert got.status == "accepted", got.detail
    state = w.fold.state(PID)
    assert state is not None
    renewed = state.attested["n1"][w.cast.node_key("n1").public_key]
    assert got.record is not None and renewed.record_index == got.record.index
    assert renewed.iat == fresh_iat // 1000
    assert msgspec.to_builtins(state.bindings) == bindings  # it only attests: no window moved
    before = w.delivered()
    got = w.usage("n1", EXPIRY, EXPIRY + 10 * MIN, at=max(renew_at, EXPIRY + 10 * MIN) + MIN)
    assert (got.status, got.reason) == ("accepted", None), got.detail
    assert w.delivered() == before + 2 * 10 * MIN * 1000
    # n2 was not renewed: its usage past the expiry is still refused
    got = w.usage("n2", EXPIRY, EXPIRY + MIN, at=EXPIRY + 20 * MIN)
    assert (got.status, got.reason) == ("rejected", "NOT_ATTESTED")


def test_a_stale_renewal_does_not_extend_the_expiry() -> None:
    """Renewal must carry fresh evidence: re-binding the same old token (accepted, it is
    still within MAX_EVIDENCE_AGE_MS of this arrival) keeps the old iat and so the old
    expiry; one older than that is EVIDENCE_INVALID and leaves the attestation as it was."""
    w = World("expiry-stale-renewal")
    at = EXPIRY - 5 * MIN
    got = _one(w.fold, _attest(w.cast, w.terms, "n1", IAT, at), at, "same-token")
    assert got.status == "accepted", got.detail
    got = _one(w.fold, _attest(w.cast, w.terms, "n1", at - DAY - 1000, at), at, "older")
    assert (got.status, got.reason) == ("rejected", "EVIDENCE_INVALID")
    got = w.usage("n1", EXPIRY, EXPIRY + MIN)
    assert (got.status, got.reason) == ("rejected", "NOT_ATTESTED")


# ---- the verifier, over a real ledger service and export ------------------------------------


def _phases(c: Case) -> list[Any]:
    """n1 attested at T0 by a token expiring at minute 30; one-minute events of n1 over
    minutes 25..35, delivered at minute 36."""
    binding = _attest(c.cast, c.terms, "n1", IAT, T0)
    writer = c.writers["n1"]
    samples = [sample(g) for g in c.gpus if g.node_id == "n1"]
    events = [
        (node_source("n1"), writer.event(T0 + m * MIN, T0 + (m + 1) * MIN, samples))
        for m in range(25, 36)
    ]
    return [(0, [(publisher_source("operator"), binding)]), (36, events)]


def test_the_verifier_agrees_with_an_honest_ledger_that_refuses_expired_usage(
    tmp_path: Path,
) -> None:
    c = case(attestation_required=True)
    honest = fold(tmp_path, c, _phases(c))
    usage = [(s, r) for k, s, r in honest.chain if k == "usage"]
    # minutes 25..29 end at or before the expiry; 30 is NOT_ATTESTED and stalls the stream
    assert usage[:6] == [("accepted", "")] * 5 + [("rejected", "NOT_ATTESTED")]
    assert all(s == "rejected" for s, _ in usage[6:]) and len(usage) == 11
    assert findings(honest) == set()
    [attested] = honest.report.attestations
    assert attested["iat"] == IAT // 1000 and attested["gpus"] == ["GPU-n1-0", "GPU-n1-1"]
    # The report line and the statement page show the expiry beside the iat.
    [line] = [x for x in render_export(honest.report) if "attested: node n1" in x]
    assert f"iat {IAT // 1000}, expires {EXPIRY}," in line, line
    with_bill = verify_export(tmp_path / "export.duckdb", c.cast.trust(), bill=True)
    assert with_bill.bill is not None
    page = to_html(with_bill.bill.doc(with_bill), "buyer")
    assert "<th>expires</th>" in page
    assert f"<td>{iso_utc(IAT)}</td><td>{iso_utc(EXPIRY)}</td>" in page


def test_the_verifier_catches_a_ledger_that_bills_an_expired_attestation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case(attestation_required=True)
    # The dishonest ledger's attestations never expire (its limits module replaced; the
    # verifier reads proto.limits itself).
    lax = types.SimpleNamespace(**vars(limits))
    lax.MAX_ATTESTATION_VALIDITY_MS = 10 * DAY
    monkeypatch.setattr(ledger_rules, "limits", lax)
    dishonest = fold(tmp_path, c, _phases(c))
    usage = [(s, r) for k, s, r in dishonest.chain if k == "usage"]
    assert usage == [("accepted", "")] * 11  # six minutes billed past the expiry
    assert "NOT_ATTESTED" in findings(dishonest)
