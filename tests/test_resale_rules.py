"""Resale rules (SPEC §6.8, §7.10) one by one: the ledger decides, the verifier agrees.

Each case publishes signed inputs to spools in phases (the ledger's clock is the arrival
time, SPEC §6.6), folds them to the close, exports and verifies. A dishonest ledger is a
ledger whose assignment rule was replaced (monkeypatch): its chain is consistent and
signed, and only the verifier's own derivation can tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from devtools import builders
from devtools.builders import StreamWriter, gpu, sample
from ledger import rules as ledger_rules
from ledger import snapshot
from ledger.export import export_placement
from ledger.service import LedgerService
from ledger.store import Store
from proto import limits
from proto.canonical import signed_bytes
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.records import GpuSpec, LedgerRecord, PlacementTerms
from proto.trust import TrustedKey
from transport.local import node_source, publish_local, publisher_source
from verifier.state import ExportReport
from verifier.verify import verify_export

T0 = 1_767_225_600_000
MIN = 60_000
WINDOW_MS = 60 * MIN
GRACE_MS = 5 * MIN
PID = "pl-rules"
LATE = T0 + WINDOW_MS + GRACE_MS + 1


def key(name: str) -> SigningKey:
    return SigningKey.from_seed_text(name, f"resale-rules/party/{name}")


B2, B3 = key("buyer-2"), key("buyer-3")


@dataclass
class Case:
    cast: builders.Cast
    terms: PlacementTerms
    gpus: list[GpuSpec]
    writers: dict[str, StreamWriter]

    def events(self, start_min: int, end_min: int, **unhealthy: range) -> list[tuple[str, bytes]]:
        """One-minute events of every node over [start, end) minutes, all GPUs counting
        except ``unhealthy[uuid-with-_-for--]`` minutes."""
        out = []
        for m in range(start_min, end_min):
            for node_id, writer in self.writers.items():
                samples = [
                    sample(g, healthy=m not in unhealthy.get(g.uuid.replace("-", "_"), range(0)))
                    for g in self.gpus
                    if g.node_id == node_id
                ]
                out.append(
                    (node_source(node_id), writer.event(T0 + m * MIN, T0 + (m + 1) * MIN, samples))
                )
        return out

    def assign(
        self,
        assignment_id: str,
        buyer: SigningKey,
        at_min: int,
        gpus: Sequence[str],
        rate: int = 400,
        **kw: Any,
    ) -> tuple[str, bytes]:
        envelope = builders.assignment(
            self.cast, self.terms, assignment_id, buyer, T0 + at_min * MIN, gpus, rate, **kw
        )
        return (publisher_source("desk"), envelope)


def case(n_gpus: int = 3, **terms_fields: Any) -> Case:
    cast = builders.make_cast("resale-rules")
    gpus = [gpu("n1", 0), gpu("n1", 1, share_milli=500), gpu("n2", 0)]
    if n_gpus > 3:
        gpus += [gpu("n3", i) for i in range(n_gpus - 3)]
    terms = builders.make_terms(
        cast, PID, gpus, T0, T0 + WINDOW_MS, late_grace_ms=GRACE_MS, **terms_fields
    )
    nodes = sorted({g.node_id for g in gpus})
    writers = {n: StreamWriter(cast.node_key(n), PID, n) for n in nodes}
    return Case(cast, terms, gpus, writers)


@dataclass
class Folded:
    store: Store
    service: LedgerService
    records: list[LedgerRecord]
    chain: list[tuple[str, str, str]]
    report: ExportReport


def fold(tmp: Path, c: Case, phases: Sequence[tuple[int, Sequence[tuple[str, bytes]]]]) -> Folded:
    """Terms, then each phase's inputs arriving at its minute, then the close."""
    spool = tmp / "spool"
    publish_local(spool, publisher_source("desk"), [builders.signed_terms(c.cast, c.terms)])
    now = [T0]
    store = Store(tmp / "ledger.duckdb", ledger_public_key=c.cast.ledger.public_key)
    service = LedgerService(
        store, c.cast.ledger, ledger_id="ledger-1", local_dir=spool, clock=lambda: now[0]
    )
    try:
        for at_ms, inputs in [*((T0 + m * MIN, i) for m, i in phases), (LATE, [])]:
            now[0] = at_ms
            for source, envelope in inputs:
                publish_local(spool, source, [envelope])
            service.run_until_idle()
        records = []
        for (envelope,) in store.query(
            f"SELECT envelope FROM records WHERE placement_id = '{PID}' ORDER BY chain_index"
        ):
            record = open_envelope(bytes(envelope)).record
            assert isinstance(record, LedgerRecord)
            records.append(record)
        chain = [
            (str(k), str(s), str(r))
            for k, s, r in store.query(
                f"SELECT kind, status, reason FROM inputs WHERE placement_id = '{PID}' "
                "ORDER BY chain_index"
            )
        ]
        export = tmp / "export.duckdb"
        export_placement(store, PID, export, key=service.key)
        trust = c.cast.trust()
        pinned = [TrustedKey(id=k.name, role="buyer", key=k.public_key) for k in (B2, B3)]
        trust = msgspec.structs.replace(trust, keys=[*trust.keys, *pinned])
        report = verify_export(export, trust)
    finally:
        service.close()
    return Folded(store, service, records, chain, report)


def assignments(f: Folded) -> list[tuple[str, str]]:
    return [(s, r) for k, s, r in f.chain if k == "assignment"]


def findings(f: Folded) -> set[str]:
    return {x.rule for x in f.report.findings.kept}


def test_operator_signs_when_the_terms_require_it(tmp_path: Path) -> None:
    plain = case()
    assert b"resale_requires_operator" not in signed_bytes(plain.terms)  # old bytes kept
    c = case(resale_requires_operator=True)
    assert b'"resale_requires_operator":true' in signed_bytes(c.terms)
    f = fold(
        tmp_path,
        c,
        [
            (
                0,
                [
                    c.assign("a-1", B2, 0, ["GPU-n2-0"], signers=[c.cast.buyer, B2, c.cast.desk]),
                    c.assign("a-2", B2, 0, ["GPU-n2-0"]),  # the builder adds the operator
                ],
            ),
        ],
    )
    assert assignments(f) == [("rejected", "SIG_MISSING"), ("accepted", "")]
    assert findings(f) == set()


def test_operator_may_cosign_when_not_required(tmp_path: Path) -> None:
    c = case()
    signers = [c.cast.buyer, B2, c.cast.desk, c.cast.operator]
    f = fold(tmp_path, c, [(0, [c.assign("a-1", B2, 0, ["GPU-n2-0"], signers=signers)])])
    assert assignments(f) == [("accepted", "")]
    assert findings(f) == set()


def test_handover_window_and_parties(tmp_path: Path) -> None:
    c = case()
    operator = c.cast.operator
    f = fold(
        tmp_path,
        c,
        [
            (1, c.events(0, 1)),
            (
                2,
                [
                    # before the window starts (the window began at minute 0)
                    (
                        publisher_source("desk"),
                        builders.assignment(
                            c.cast, c.terms, "a-early", B2, T0 - 1, ["GPU-n2-0"], 400
                        ),
                    ),
                    # at the window's end: nothing left to sell
                    c.assign("a-end", B2, 60, ["GPU-n2-0"]),
                    # a GPU twice
                    c.assign("a-twice", B2, 5, ["GPU-n2-0", "GPU-n2-0"]),
                    # to the operator (its key, another id)
                    (
                        publisher_source("desk"),
                        builders.assignment(
                            c.cast,
                            c.terms,
                            "a-op",
                            SigningKey.from_seed_text("operator-1", "resale-rules/x"),
                            T0 + 5 * MIN,
                            ["GPU-n2-0"],
                            400,
                        ),
                    ),
                    c.assign("a-op-key", operator, 5, ["GPU-n2-0"]),
                    # the handover reaches back before the arrival: h = arrival (minute 2)
                    c.assign("a-ok", B2, 0, ["GPU-n2-0"]),
                    # buyer-2's key under another id
                    (
                        publisher_source("desk"),
                        builders.assignment(
                            c.cast,
                            c.terms,
                            "a-alias",
                            SigningKey.from_seed_text(
                                "buyer-2-alias", "resale-rules/party/buyer-2"
                            ),
                            T0 + 5 * MIN,
                            ["GPU-n1-0"],
                            400,
                        ),
                    ),
                ],
            ),
            (30, c.events(1, 30)),
        ],
    )
    assert assignments(f) == [("rejected", "ASSIGNMENT_INVALID")] * 5 + [
        ("accepted", ""),
        ("rejected", "ASSIGNMENT_INVALID"),
    ]
    assert findings(f) == set()
    # h = max(handover 0, arrival minute 2): GPU-n2-0 billed to buyer-2 from minute 2
    (entry,) = f.records[-1].resale
    assert entry.delivered_mgms == 28 * MIN * 1000


def test_reclaim_after_a_resale_ends_the_new_buyers_delivery(tmp_path: Path) -> None:
    c = case()
    reclaim = builders.reclaim(c.cast, c.terms, T0 + 10 * MIN, T0 + 40 * MIN, "rc-1")
    f = fold(
        tmp_path,
        c,
        [
            (10, [*c.events(0, 10), c.assign("a-1", B2, 10, ["GPU-n1-0", "GPU-n2-0"], 300)]),
            (20, [(publisher_source("operator"), reclaim)]),
            (45, c.events(10, 40)),
        ],
    )
    assert [s for k, s, _ in f.chain if k == "reclaim"] == ["accepted"]
    assert findings(f) == set()
    (entry,) = f.records[-1].resale
    # minutes 10-40 on two whole GPUs = 60 GPU-min at 3.00/GPU-h = 300; fee 5 % = 15
    assert (entry.delivered_mgms, entry.gross_minor, entry.fee_minor) == (60 * MIN * 1000, 300, 15)
    # the reclaim credit is the original buyer's: 20 min taken x 2.5 GPU at 2.50 = 208
    assert f.records[-1].totals.reclaim_credit_minor == 208


def test_amendment_after_an_assignment_is_too_late(tmp_path: Path) -> None:
    c = case()
    amended = builders.amendment(c.terms, rate_per_gpu_hour_minor=300)
    f = fold(
        tmp_path,
        c,
        [
            (
                0,
                [
                    c.assign("a-1", B2, 0, ["GPU-n2-0"]),
                    (publisher_source("desk"), builders.signed_terms(c.cast, amended)),
                ],
            )
        ],
    )
    assert [(k, s, r) for k, s, r in f.chain if k == "terms"][-1] == (
        "terms",
        "rejected",
        "AMENDMENT_TOO_LATE",
    )
    assert findings(f) == set()


def test_max_assignments_then_assignment_invalid(tmp_path: Path) -> None:
    n = limits.MAX_ASSIGNMENTS + 1
    c = case(n_gpus=3 + n)
    buyers = [key(f"nb-{i}") for i in range(n)]
    inputs = [c.assign(f"a-{i}", b, 0, [f"GPU-n3-{i}"]) for i, b in enumerate(buyers)]
    f = fold(tmp_path, c, [(0, inputs), (10, c.events(0, 10))])
    assert assignments(f) == [("accepted", "")] * (n - 1) + [("rejected", "ASSIGNMENT_INVALID")]
    assert len(f.records[-1].resale) == limits.MAX_ASSIGNMENTS
    # every buyer but the pinned two is unknown to the trust file: the only findings
    assert findings(f) == {"ASSIGNMENT_KEY_NOT_PINNED"}
    # one entry more does not decode (SPEC §4.1 bound)
    record = f.records[-1]
    too_many = msgspec.structs.replace(record, resale=[*record.resale, record.resale[0]])
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(too_many), type=LedgerRecord)


def test_snapshot_keeps_the_assignments(tmp_path: Path) -> None:
    c = case()
    f = fold(tmp_path, c, [(5, [*c.events(0, 5), c.assign("a-1", B2, 5, ["GPU-n1-1"])])])
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=c.cast.ledger.public_key)
    try:
        data = store.load_state(PID)
    finally:
        store.close()
    assert data is not None
    state = snapshot.decode(PID, data)
    (kept,) = state.assignments
    assert (kept.assignment_id, kept.new_buyer.id, kept.handover_ms) == (
        "a-1",
        "buyer-2",
        T0 + 5 * MIN,
    )
    assert snapshot.encode(state) == data
    assert f.records[-1].resale[0].assignment_id == "a-1"


# ---- a dishonest ledger: the chain is consistent and signed, the rule is not SPEC's ----


def test_verifier_catches_a_ledger_that_drops_the_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()

    def drop(state: Any, *args: Any) -> dict[str, Any]:
        return {}  # "accepted", but never billed to the new buyer

    monkeypatch.setattr(ledger_rules, "_assignment", drop)
    f = fold(tmp_path, c, [(0, [c.assign("a-1", B2, 0, ["GPU-n2-0"])]), (10, c.events(0, 10))])
    assert assignments(f) == [("accepted", "")]
    assert f.records[-1].resale == []
    assert "RESALE_MISMATCH" in findings(f)


def test_verifier_catches_a_ledger_that_refuses_a_valid_resale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()

    def refuse(state: Any, *args: Any) -> dict[str, Any]:
        raise ledger_rules._Reject(ledger_rules.Reason.ASSIGNMENT_INVALID, "no")

    monkeypatch.setattr(ledger_rules, "_assignment", refuse)
    f = fold(tmp_path, c, [(0, [c.assign("a-1", B2, 0, ["GPU-n2-0"])])])
    assert assignments(f) == [("rejected", "ASSIGNMENT_INVALID")]
    assert "ASSIGNMENT_INVALID" in findings(f)  # the verifier says: accepted


def test_verifier_catches_a_resale_of_more_than_the_buyer_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    honest = ledger_rules._assignment

    def lax(state: Any, terms: Any, opened: Any, record: Any, arrived: Any) -> dict[str, Any]:
        # accepts GPUs the terms do not have (and bills the ones they do)
        held = [g for g in record.gpus if g in state.gpus]
        return honest(state, terms, opened, msgspec.structs.replace(record, gpus=held), arrived)

    monkeypatch.setattr(ledger_rules, "_assignment", lax)
    f = fold(
        tmp_path,
        c,
        [(0, [c.assign("a-1", B2, 0, ["GPU-n2-0", "GPU-n9-9"])]), (10, c.events(0, 10))],
    )
    assert assignments(f) == [("accepted", "")]
    rules = findings(f)
    assert "ASSIGNMENT_INVALID" in rules  # SPEC §6.8 says rejected
    assert "RESALE_MISMATCH" in rules  # and nothing billed to buyer-2


# ---- with a buyer release (SPEC §6.7 "With a resale") ------------------------------------


def _release(c: Case, at_min: int, effective_min: int) -> tuple[str, bytes]:
    envelope = builders.release(
        c.cast, c.terms, T0 + at_min * MIN, T0 + effective_min * MIN, f"rel-{at_min}"
    )
    return (publisher_source("buyer"), envelope)


def test_a_release_after_a_resale_is_invalid_and_the_new_buyer_keeps_its_gpus(
    tmp_path: Path,
) -> None:
    c = case()
    f = fold(
        tmp_path,
        c,
        [
            (10, [*c.events(0, 10), c.assign("a-1", B2, 10, ["GPU-n2-0"], 300)]),
            (20, [*c.events(10, 20), _release(c, 20, 30)]),
            (45, c.events(20, 40)),
        ],
    )
    releases = [(s, r) for k, s, r in f.chain if k == "release"]
    assert releases == [("rejected", "RELEASE_INVALID")]
    assert findings(f) == set()  # the verifier derives the same refusal
    totals = f.records[-1].totals
    assert totals.release_charge_minor == 0
    (entry,) = f.records[-1].resale
    # the new buyer's GPU kept delivering to minute 40: 30 GPU-min at 3.00/GPU-h = 150
    assert (entry.delivered_mgms, entry.gross_minor) == (30 * MIN * 1000, 150)


def test_an_assignment_after_a_release_is_invalid(tmp_path: Path) -> None:
    c = case()
    f = fold(
        tmp_path,
        c,
        [
            (10, [*c.events(0, 10), _release(c, 10, 20)]),
            (12, [c.assign("a-1", B2, 25, ["GPU-n2-0"], 300)]),  # h = 25 >= e = 20
        ],
    )
    assert [(s, r) for k, s, r in f.chain if k == "release"] == [("accepted", "")]
    assert assignments(f) == [("rejected", "ASSIGNMENT_INVALID")]
    assert findings(f) == set()
    assert f.records[-1].resale == []


def test_verifier_catches_a_ledger_that_releases_a_resold_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case()
    honest = ledger_rules._release

    def ignore_resale(state: Any, *args: Any) -> dict[str, Any]:
        return honest(msgspec.structs.replace(state, assignments=()), *args)

    monkeypatch.setattr(ledger_rules, "_release", ignore_resale)
    f = fold(
        tmp_path,
        c,
        [
            (10, [*c.events(0, 10), c.assign("a-1", B2, 10, ["GPU-n2-0"], 300)]),
            (12, [_release(c, 12, 30)]),
        ],
    )
    assert [s for k, s, _ in f.chain if k == "release"] == ["accepted"]
    assert "RELEASE_INVALID" in findings(f)  # the verifier says: rejected


def test_an_assignment_before_a_release_end_is_billed_only_up_to_it(tmp_path: Path) -> None:
    """SPEC §6.7, §6.8 step 3, §7.10: a release at minute 10 ends the placement at 40; an
    assignment from minute 20 (h < e) is accepted, and its new buyer's delivery ends at
    the effective end in force when each event is folded: e, not the window's end. A
    7-minute event spanning minute 40 bills the new buyer 20 GPU-min (20..40), not 23."""
    c = case()
    f = fold(
        tmp_path,
        c,
        [
            (10, [*c.events(0, 10), _release(c, 10, 40)]),
            (20, [*c.events(10, 20), c.assign("a-1", B2, 20, ["GPU-n2-0"], 300)]),
            (33, c.events(20, 33)),
            (
                45,
                [
                    (
                        node_source(n),
                        w.event(
                            T0 + 33 * MIN,
                            T0 + 40 * MIN + 3 * MIN,
                            [sample(g) for g in c.gpus if g.node_id == n],
                        ),
                    )
                    for n, w in c.writers.items()
                ],
            ),
        ],
    )
    assert [(s, r) for k, s, r in f.chain if k == "release"] == [("accepted", "")]
    assert assignments(f) == [("accepted", "")]
    (entry,) = f.records[-1].resale
    # 20 GPU-min at 3.00/GPU-h = 100
    assert (entry.delivered_mgms, entry.gross_minor) == (20 * MIN * 1000, 100)
    assert findings(f) == set()  # the verifier clips at e too (no RESALE_MISMATCH)
