"""The golden vectors in proto/vectors/: current, and true of the code through its API."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import vectorgen

from ledger.fold import Fold
from ledger.pricing import price
from proto import merkle
from proto.cosign import cosignature_of
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.frontier import Frontier
from proto.keys import SigningKey, key_id, verify
from proto.note import parse_checkpoint_body, parse_note
from proto.records import PlacementTerms

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def test_vectors_are_current() -> None:
    for name, data in vectorgen.render().items():
        committed = (VECTORS / name).read_bytes()
        assert committed == data, f"{name} differs from what the code produces now"


def test_keys() -> None:
    for v in load("keys.json"):
        key = SigningKey("k", bytes.fromhex(v["seed_hex"]))
        public = base64.b64decode(v["public_key"])
        assert key.public_key == public and key_id(public) == v["key_id"]
        message = v["message_utf8"].encode()
        assert verify(public, message, base64.b64decode(v["signature"]))


def test_signatures_follow_the_rule() -> None:
    """SPEC §3: this implementation's verify answers every case as the vector says; a
    valid signature satisfies both equations; and the set holds signatures that only
    the cofactored equation accepts (so a verifier checking it would be caught)."""
    data = load("signatures.json")
    assert int(data["L"]) == 2**252 + 27742317777372353535851937790883648493
    small = [bytes.fromhex(h) for h in data["small_order_encodings"]]
    assert len(set(small)) == 7
    only_cofactored = 0
    for v in data["cases"]:
        public = base64.b64decode(v["public_key"])
        signature = base64.b64decode(v["signature"])
        answer = verify(public, v["message_utf8"].encode(), signature)
        assert answer is v["valid"], v["name"]
        if v["valid"]:
            assert v["cofactorless_equation"] and v["cofactored_equation"], v["name"]
            assert signature[:32] not in small and public not in small
        only_cofactored += v["cofactored_equation"] and not v["cofactorless_equation"]
    assert only_cofactored >= 3


def test_records() -> None:
    data = load("records.json")
    for v in data["records"]:
        opened = open_envelope(v["envelope_utf8"].encode())
        assert opened.kind == v["kind"]
        assert opened.payload.decode() == v["signed_bytes_utf8"]
        assert opened.record_hash == v["record_hash"]
        assert opened.input_hash == v["input_hash"]
        assert [s.keyid for s in opened.envelope.signatures] == v["signers"]
    # SPEC §8: a LedgerRecord is unsigned from export format version 2; with or without
    # the ledger's signature it is one payload, so one record hash (prev, Merkle leaf).
    versions = {v["export_format_version"]: v for v in data["records"] if v["kind"] == "record"}
    assert versions["2"]["signers"] == [] and len(versions["1"]["signers"]) == 1
    assert versions["1"]["record_hash"] == versions["2"]["record_hash"]
    assert versions["1"]["input_hash"] != versions["2"]["input_hash"]


def test_rejections() -> None:
    for v in load("rejections.json"):
        with pytest.raises(ProtoError) as caught:
            open_envelope(base64.b64decode(v["envelope_b64"]))
        assert caught.value.reason.value == v["reason"], v["name"]


def test_frontiers() -> None:
    data = load("merkle.json")
    leaves = [bytes.fromhex(x) for x in data["leaves_hex"]]
    for size, hashes in data["frontiers"].items():
        frontier = Frontier.empty().extend(leaves[: int(size)])
        assert [h.hex() for h in frontier.hashes] == hashes
        assert frontier.root().hex() == data["roots"][size]


def test_merkle() -> None:
    data = load("merkle.json")
    leaves = [merkle.leaf_hash(bytes.fromhex(x)) for x in data["leaves_hex"]]
    for size, root in data["roots"].items():
        assert merkle.root_from_leaf_hashes(leaves[: int(size)]).hex() == root
    for v in data["inclusion"]:
        root = bytes.fromhex(data["roots"][str(v["tree_size"])])
        proof = [bytes.fromhex(p) for p in v["proof"]]
        assert merkle.verify_inclusion(leaves[v["index"]], v["index"], v["tree_size"], proof, root)
    for v in data["consistency"]:
        first = bytes.fromhex(data["roots"][str(v["first"])])
        second = bytes.fromhex(data["roots"][str(v["second"])])
        proof = [bytes.fromhex(p) for p in v["proof"]]
        assert merkle.verify_consistency(v["first"], v["second"], first, second, proof)


def test_checkpoint() -> None:
    data = load("checkpoint.json")
    note = parse_note(data["note"])
    signers = {name: base64.b64decode(key) for name, key in data["signers"].items()}
    assert note.signed_by("gridledger-ledger", signers.pop("gridledger-ledger"))
    for name, key in signers.items():
        cosig = cosignature_of(note, name, key)
        assert cosig is not None and cosig.timestamp_s == data["cosigned_at_s"]
    checkpoint = parse_checkpoint_body(note.body)
    assert (checkpoint.origin, checkpoint.size) == (data["origin"], data["size"])
    assert checkpoint.root == base64.b64decode(data["root_b64"])


class _Terms:
    """The fields of PlacementTerms that pricing reads, from a pricing vector."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)
        self.__dict__.setdefault("release_notice_ms", 0)
        share = fields["share_total_milli"]
        self.gpus = [type("G", (), {"share_milli": share})()]


def test_pricing_examples_match_the_fold_pricing() -> None:
    for v in load("pricing.json"):
        terms = _Terms(v["terms"])
        case = v["case"]
        from ledger.pricing import reclaim_credit_minor, release_charge_minor, sla_credit_minor

        reclaim = 0
        effective_end = v["terms"]["window_end_ms"]
        if case.get("reclaim"):
            issued, effective_end = case["reclaim"]
            reclaim = reclaim_credit_minor(terms, issued, effective_end)  # type: ignore[arg-type]
        release = 0
        if case.get("release"):
            arrived, effective_at, usage_end = case["release"]
            end = max(effective_at, arrived, usage_end)
            release = release_charge_minor(terms, arrived, end, effective_end)  # type: ignore[arg-type]
            effective_end = end
        open_totals = price(
            terms,  # type: ignore[arg-type]
            delivered_mgms=case["delivered_mgms"],
            reclaim_credit=reclaim,
            sla_credit=0,
            adjustment_credit=case.get("adjustment_credit", 0),
            adjustment_charge=case.get("adjustment_charge", 0),
            release_charge=release,
        )
        sla = 0
        if case.get("closed"):
            sla = sla_credit_minor(
                terms,  # type: ignore[arg-type]
                case["delivered_mgms"],
                open_totals.gross_minor,
                effective_end,
            )
        totals = price(
            terms,  # type: ignore[arg-type]
            delivered_mgms=case["delivered_mgms"],
            reclaim_credit=reclaim,
            sla_credit=sla,
            adjustment_credit=case.get("adjustment_credit", 0),
            adjustment_charge=case.get("adjustment_charge", 0),
            release_charge=release,
        )
        got = msgspec.to_builtins(totals)
        assert got == v["expected"], v["name"]
        assert all(value < 2**53 for value in got.values()), v["name"]


def test_scenario_is_reproduced_by_the_fold() -> None:
    data = load("scenario.json")
    cast = vectorgen._cast()
    assert base64.b64encode(cast.ledger.public_key).decode() == data["ledger_public_key"]
    fold = Fold(cast.ledger)
    for i, step in enumerate(data["steps"]):
        outcomes = fold.apply(base64.b64decode(step["envelope_b64"]), f"vector:{i}", None)
        got = [
            {
                "decision": o.decision,
                "status": o.status,
                "reason": None if o.reason is None else o.reason.value,
                "index": None if o.record is None else o.record.index,
                "delivered_mgms": None if o.record is None else o.record.delivered_mgms,
                "record_hash": o.record_hash,
            }
            for o in outcomes
        ]
        assert got == step["outcomes"], f"step {i}"
    assert fold.head("pl-vector") == (data["records"], data["head"])
    totals = fold.totals("pl-vector")
    assert totals is not None
    assert msgspec.to_builtins(totals) == data["totals"]
    assert isinstance(vectorgen._terms(cast), PlacementTerms)


def test_json_schemas_are_current() -> None:
    from proto.schemagen import SCHEMA_DIR, render

    for name, data in render().items():
        assert (SCHEMA_DIR / name).read_bytes() == data, f"proto/schema/{name} is stale"


def test_time_from_the_log_is_reproduced_by_the_fold() -> None:
    """SPEC §6.6: the fold, given each input's arrival, decides and dates every record as
    the vectors say (monotone, a held input's own arrival, FUTURE_DATED at the bound, the
    notice from arrival, NODE_KEY_REVOKED)."""
    data = load("time.json")
    cast = vectorgen._cast()
    assert base64.b64encode(cast.ledger.public_key).decode() == data["ledger_public_key"]
    fold = Fold(cast.ledger)
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        outcomes = fold.apply(raw, f"time:{i}", None, step["arrived_ms"])
        got = [
            {
                "decision": o.decision,
                "status": o.status,
                "reason": None if o.reason is None else o.reason.value,
                "index": None if o.record is None else o.record.index,
                "arrived_ms": None if o.record is None else o.record.arrived_ms,
                "record_hash": o.record_hash,
            }
            for o in outcomes
        ]
        assert got == step["outcomes"], f"step {i}: {step['note']}"
    assert fold.head("pl-vector") == (data["records"], data["head"])
    totals = fold.totals("pl-vector")
    assert totals is not None
    assert msgspec.to_builtins(totals) == data["totals"]


def test_buyer_release_is_reproduced_by_the_fold() -> None:
    """SPEC §6.7, §7.9: the release stream decides, dates and prices every record as the
    vectors say (K billed once, from the arrival; usage after e; the rejections)."""
    data = load("release.json")
    cast = vectorgen._cast()
    assert base64.b64encode(cast.ledger.public_key).decode() == data["ledger_public_key"]
    fold = Fold(cast.ledger)
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        outcomes = fold.apply(raw, f"release:{i}", None, step["arrived_ms"])
        got = [
            {
                "decision": o.decision,
                "status": o.status,
                "reason": None if o.reason is None else o.reason.value,
                "index": None if o.record is None else o.record.index,
                "arrived_ms": None if o.record is None else o.record.arrived_ms,
                "record_hash": o.record_hash,
                "totals": None if o.record is None else msgspec.to_builtins(o.record.totals),
            }
            for o in outcomes
        ]
        assert got == step["outcomes"], f"step {i}: {step['note']}"
    assert fold.head("pl-vector") == (data["records"], data["head"])
    totals = fold.totals("pl-vector")
    assert totals is not None and msgspec.to_builtins(totals) == data["totals"]
    # By hand (SPEC §7.9): S = 2.5 GPU, e = minute 13, owed until minute 40: 27 min at
    # 2.50 USD/GPU-h = 2.5 x 27 / 60 x 250 = 281.25 -> 281 minor units, billed once.
    assert data["totals"]["release_charge_minor"] == 281
    reasons = [o["reason"] for step in data["steps"] for o in step["outcomes"]]
    for reason in ("SIG_MISSING", "SIG_SURPLUS", "RELEASE_INVALID", "AFTER_RELEASE",
                   "RELEASE_DUPLICATE", "RECLAIM_INVALID", "AFTER_CLOSE"):  # fmt: skip
        assert reason in reasons, reason


def test_resale_vectors_are_reproduced_by_the_fold() -> None:
    """SPEC §6.8, §7.10: every decision, record hash and resale list of resale.json, the
    final statement byte for byte, and the parties' figures, which balance."""
    from ledger.statements import make_statement

    data = load("resale.json")
    cast = vectorgen._cast()
    fold = Fold(cast.ledger)
    last = None
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        outcomes = fold.apply(raw, f"resale:{i}", None, step["arrived_ms"])
        got = [
            {
                "decision": o.decision,
                "status": o.status,
                "reason": None if o.reason is None else o.reason.value,
                "record_hash": o.record_hash,
                "resale": None
                if o.record is None
                else [msgspec.structs.asdict(e) for e in o.record.resale],
            }
            for o in outcomes
        ]
        assert got == step["outcomes"], f"step {i}: {step['note']}"
        last = next((o for o in outcomes if o.kind == "closed" and o.record), last)
    assert fold.head("pl-vector") == (data["records"], data["head"])
    assert last is not None and last.record is not None and last.record_hash is not None
    terms = fold.terms("pl-vector")
    assert terms is not None
    statement = make_statement(last.record, last.record_hash, terms, True, cast.ledger)
    assert base64.b64encode(statement.envelope).decode() == data["final_statement_b64"]
    # SPEC §6.6, §8: the arrival mode signed; "log" (the default) is omitted from the bytes.
    sender = make_statement(
        last.record, last.record_hash, terms, True, cast.ledger, arrival="sender"
    )
    assert base64.b64encode(sender.envelope).decode() == data["final_statement_sender_b64"]
    sender_payload = open_envelope(sender.envelope).envelope.payload
    assert b'"arrival":"sender"' in sender_payload
    assert b'"arrival"' not in open_envelope(statement.envelope).envelope.payload
    parties = data["parties_minor"]
    # The worked figures of the vector file, by hand (SPEC §7.10).
    assert parties == {
        "operator_receives": 594,
        "original_buyer_net": 245,
        "new_buyers_owe": {"buyer-2": 400},
        "desk_receives": 51,
    }
    owed = parties["original_buyer_net"] + sum(parties["new_buyers_owe"].values())
    assert owed - parties["operator_receives"] - parties["desk_receives"] == 0


def test_resale_after_a_release_is_reproduced_by_the_fold() -> None:
    """SPEC §6.7, §6.8 step 3, §7.10: resale_release.json, every decision, record hash and
    resale list; the new buyer's delivery ends at the release's end e = minute 40."""
    data = load("resale_release.json")
    fold = Fold(vectorgen._cast().ledger)
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        outcomes = fold.apply(raw, f"resale-release:{i}", None, step["arrived_ms"])
        got = [
            {
                **row,
                "resale": None
                if o.record is None
                else [msgspec.structs.asdict(e) for e in o.record.resale],
            }
            for row, o in zip(_outcome_rows(outcomes), outcomes, strict=True)
        ]
        assert got == step["outcomes"], f"step {i}: {step['note']}"
    assert fold.head("pl-vector") == (data["records"], data["head"])
    (entry,) = data["steps"][-1]["outcomes"][0]["resale"]
    assert (entry["delivered_mgms"], entry["gross_minor"]) == (20 * 60_000 * 1000, 133)


def test_shortens_is_reproduced_by_the_fold() -> None:
    """SPEC §4.0, §6.3 keybinding: a binding only shortens with valid_from_ms ≤ f, so the
    operator alone may sign it; a later start or a later end needs the buyer too."""
    data = load("shortens.json")
    fold = Fold(vectorgen._cast().ledger)
    reasons = _replay_timed(fold, "shortens", data["steps"])
    assert reasons == [
        None,
        None,
        None,
        "SIG_MISSING",
        "SIG_MISSING",
        None,
        "NODE_KEY_REVOKED",
        None,
    ]
    assert fold.head("pl-shortens") == (data["records"], data["head"])


def test_bounds_are_reproduced_by_the_fold() -> None:
    """SPEC §5 rule 5, §6.3 adjustment, §7.7: bounds.json, every decision and record hash;
    every record's totals within 2^53 - 1 (each decodes); the terms cases."""
    data = load("bounds.json")
    cast = vectorgen._cast()
    fold = Fold(cast.ledger)
    reasons: list[str | None] = []
    for i, step in enumerate(data["steps"]):
        outcomes = fold.apply(base64.b64decode(step["envelope_b64"]), f"bounds:{i}", None)
        assert _outcome_rows(outcomes) == step["outcomes"], f"step {i}: {step['note']}"
        reasons += [o.reason for o in outcomes]
        for o in outcomes:
            envelope = o.record_envelope
            assert envelope is not None and open_envelope(envelope).record is not None
    assert reasons.count("ADJUSTMENT_INVALID") == 4
    assert fold.head("pl-bounds") == (data["records"], data["head"])
    totals = fold.totals("pl-bounds")
    assert totals is not None and msgspec.structs.asdict(totals) == data["totals"]
    for case in data["terms"]:
        (o,) = Fold(cast.ledger).apply(base64.b64decode(case["envelope_b64"]), "t:0", None)
        assert (o.status, o.reason) == (case["status"], case["reason"]), case["name"]
        assert (case["payable_ceiling_minor"] > 2**53 - 1) == (o.reason == "TERMS_INVALID")


def test_attestation_is_reproduced_by_the_fold() -> None:
    """SPEC §6.9: the fold with the vectors' attestation root decides every step as the
    vectors say; the worked nonce is the one the SPEC formula gives."""
    import hashlib

    from proto.attestation import AttestationRoot

    data = load("attestation.json")
    nonce = data["nonce"]
    text = f"{nonce['placement_id']}\n{nonce['node_id']}\n".encode()
    expected = hashlib.sha256(
        b"gridledger/attestation-nonce/v1\n" + text + base64.b64decode(nonce["key"])
    ).hexdigest()
    assert nonce["eat_nonce"] == expected
    roots = tuple(
        AttestationRoot(r["id"], r["alg"], base64.b64decode(r["key"]))
        for r in data["attestation_roots"]
    )
    fold = Fold(vectorgen._cast().ledger, attestation_roots=roots)
    reasons = []
    for i, step in enumerate(data["steps"]):
        outcomes = fold.apply(base64.b64decode(step["envelope_b64"]), f"a:{i}", None)
        got = _outcome_rows(outcomes)
        assert got == step["outcomes"], step["name"]
        reasons += [o["reason"] for o in got]
    assert reasons.count("EVIDENCE_INVALID") == 6
    assert reasons.count("NOT_ATTESTED") == 2


def _outcome_rows(outcomes: Any) -> list[dict[str, Any]]:
    """A fold's outcomes as the vectors write them."""
    return [
        {
            "decision": o.decision,
            "status": o.status,
            "reason": None if o.reason is None else o.reason.value,
            "record_hash": o.record_hash,
        }
        for o in outcomes
    ]


def _replay_timed(fold: Fold, prefix: str, steps: list[Any]) -> list[str | None]:
    """Apply every step at its arrival; assert its outcomes; the reasons in order."""
    reasons: list[str | None] = []
    for i, step in enumerate(steps):
        outcomes = fold.apply(
            base64.b64decode(step["envelope_b64"]), f"{prefix}:{i}", None, step["arrived_ms"]
        )
        got = _outcome_rows(outcomes)
        assert got == step["outcomes"], f"step {i}: {step['note']}"
        reasons += [o["reason"] for o in got]
    return reasons


def test_resale_keys_are_reproduced_by_the_fold() -> None:
    """SPEC §6.3 keybinding, §6.8 (3): a node key (of the terms or bound since, revoked
    too) is never a new buyer's key, and no binding binds a party's or new buyer's key."""
    data = load("resale_keys.json")
    fold = Fold(vectorgen._cast().ledger)
    reasons = _replay_timed(fold, "resale-keys", data["steps"])
    assert reasons.count("ASSIGNMENT_INVALID") == 2
    assert reasons.count("BINDING_INVALID") == 4
    assert reasons.count("NODE_KEY_UNKNOWN") == 1
    assert fold.head("pl-vector") == (data["records"], data["head"])


def test_capacity_is_reproduced_by_the_fold() -> None:
    """SPEC §6.5: terms and amendments alike are refused when they oversell; an
    amendment's claims replace its terms'; a reclaim at the window's start claims nothing;
    §5 (3): a GPU uuid not in its canonical spelling is TERMS_INVALID."""
    data = load("capacity.json")
    fold = Fold(vectorgen._cast().ledger)
    reasons = _replay_timed(fold, "capacity", data["steps"])
    assert reasons == [None, None, "OVERSOLD", None, None, None, None, "OVERSOLD", "TERMS_INVALID"]
    claims = [
        {"uuid": uuid, "placement_id": pid, "start_ms": lo, "end_ms": hi, "share_milli": share}
        for _, uuid, pid, lo, hi, share in fold.capacity_rows()
    ]
    assert claims == data["claims"]
    assert {c["placement_id"] for c in claims} == {"pl-cap-a", "pl-cap-c", "pl-cap-d"}


def test_evidence_age_is_reproduced_by_the_fold() -> None:
    """SPEC §6.9 (6): both freshness bounds are inclusive; one second past each is
    EVIDENCE_INVALID; the fresh evidence attests the key for usage."""
    from proto.attestation import AttestationRoot
    from proto.limits import MAX_EVIDENCE_AGE_MS

    data = load("evidence_age.json")
    assert data["max_evidence_age_ms"] == MAX_EVIDENCE_AGE_MS == 24 * 3_600_000
    roots = tuple(
        AttestationRoot(r["id"], r["alg"], base64.b64decode(r["key"]))
        for r in data["attestation_roots"]
    )
    fold = Fold(vectorgen._cast().ledger, attestation_roots=roots)
    reasons = _replay_timed(fold, "evidence-age", data["steps"])
    assert reasons == [None, "EVIDENCE_INVALID", None, None, "EVIDENCE_INVALID", None]


def test_attestation_expiry_is_reproduced_by_the_fold() -> None:
    """SPEC §6.9 Expiry: usage ending exactly at iat + MAX_ATTESTATION_VALIDITY_MS is
    attested, 1 ms later NOT_ATTESTED; a renewal (attest-only binding) restores billing."""
    from proto.attestation import AttestationRoot
    from proto.limits import MAX_ATTESTATION_VALIDITY_MS

    data = load("attestation_expiry.json")
    assert data["max_attestation_validity_ms"] == MAX_ATTESTATION_VALIDITY_MS == 24 * 3_600_000
    roots = tuple(
        AttestationRoot(r["id"], r["alg"], base64.b64decode(r["key"]))
        for r in data["attestation_roots"]
    )
    fold = Fold(vectorgen._cast().ledger, attestation_roots=roots)
    reasons = _replay_timed(fold, "attestation-expiry", data["steps"])
    assert reasons == [None, None, None, None, "NOT_ATTESTED", None, None]
    state = fold.state("pl-attestation-expiry")
    assert (
        state is not None
        and state.totals.delivered_mgms
        == (data["expiry_ms"] - data["steps"][0]["arrived_ms"] + 10 * 60_000) * 1000
    )


def test_finance_vectors_are_reproduced_by_the_invoice_builder() -> None:
    """SPEC §11.3 largest remainder, §11.2 numbers, §12 profiles (tests/vectorgen.py
    computes them from the text, apart from billview/invoice.py)."""
    import base64

    from billview.invoice import document_number, split
    from proto.profile import ProfileError, open_profile
    from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile

    v = load("finance.json")
    for case in v["splits"]:
        weights = [(k, w) for k, w in case["weights"]]
        assert split(case["amount_minor"], weights) == case["parts"]
    for case in v["numbers"]:
        number = document_number(
            case["kind"], case["month"], case["payer"], case["payee"], case["heads"]
        )
        assert number == case["number"]
    p = v["profile"]
    key = base64.b64decode(p["party_public_key"])
    trust = TrustFile(
        format=TRUST_FORMAT, keys=[TrustedKey(id="operator-1", role="operator", key=key)]
    )
    profile = open_profile(p["file_utf8"].encode(), trust, "vector")
    assert profile.legal_name == "Acme GPU Cloud Ltd" and profile.net_days == 30
    other = TrustFile(
        format=TRUST_FORMAT, keys=[TrustedKey(id="operator-1", role="witness", key=key)]
    )
    with pytest.raises(ProfileError, match="no key pinned"):
        open_profile(p["file_utf8"].encode(), other, "vector")


def test_arrival_bounds_are_what_the_verifier_and_the_witness_enforce() -> None:
    """SPEC §6.6 "Bounded from both sides": the verifier's BACKDATED/POSTDATED over the
    cosigned checkpoints, and the witness's W_TIME window around a party's delivery."""
    from ledger.pricing import ZERO_TOTALS
    from proto.limits import MAX_ARRIVAL_LAG_MS, MAX_CLOCK_SKEW_MS
    from proto.records import ZERO_HASH, LedgerRecord
    from verifier.cosigned_time import CosignedTimes, Stamp
    from witness.check import _Refuse, _TimeWindow

    data = load("arrival_bounds.json")
    assert data["max_clock_skew_ms"] == MAX_CLOCK_SKEW_MS
    assert data["max_arrival_lag_ms"] == MAX_ARRIVAL_LAG_MS
    times = CosignedTimes(
        Stamp(c["size"], f"w{i}", c["cosigned_at_s"]) for i, c in enumerate(data["checkpoints"])
    )
    for case in data["cosigned"]:
        got = times.violation(case["index"], case["arrived_ms"])
        assert (None if got is None else got.code) == case["finding"], case
    for case in data["delivered"]:
        window = _TimeWindow({"h": case["delivered_ms"]}, {"h": case["waited_ms"]}, -1, 0)
        record = LedgerRecord(
            placement_id="pl-vector",
            index=1,
            prev=ZERO_HASH,
            kind="reclaim",
            source="h",
            status="accepted",
            reason="",
            delivered_mgms=0,
            totals=ZERO_TOTALS,
            arrived_ms=case["arrived_ms"],
        )
        now_s = case["arrived_ms"] // 1000 + 1
        try:
            window.check(record, 1, b"", now_s, -1)
            refused = False
        except _Refuse:
            refused = True
        assert refused == case["refused"], case


def test_rejection_advances_is_reproduced_by_the_fold() -> None:
    """SPEC §6.3 usage: rejection_advances.json, every decision and record hash under both
    rules; a content rejection costs its own interval only from REJECTION_ADVANCES_FROM_MS."""
    from proto.limits import REJECTION_ADVANCES_FROM_MS

    data = load("rejection_advances.json")
    assert data["rejection_advances_from_ms"] == REJECTION_ADVANCES_FROM_MS
    expected = {
        "advancing": [
            "GPU_NOT_IN_TERMS",
            "FUTURE_DATED",
            "EQUIVOCATION",
            "INTERVAL_OVERLAP",
            "NODE_KEY_UNKNOWN",
        ],
        "before": ["GPU_NOT_IN_TERMS", "EQUIVOCATION", "NODE_KEY_UNKNOWN", *["SEQ_GAP"] * 6],
    }
    for rule in ("advancing", "before"):
        fold = Fold(vectorgen._cast().ledger)
        reasons = _replay_timed(fold, f"rejection-{rule}", data[rule]["steps"])
        assert [r for r in reasons if r is not None and r != "DUPLICATE"] == expected[rule]
        assert fold.head("pl-rejection") == (data[rule]["records"], data[rule]["head"])
        totals = fold.totals("pl-rejection")
        assert totals is not None
        assert msgspec.to_builtins(totals) == data[rule]["totals"]


def test_resume_is_reproduced_by_the_fold() -> None:
    """SPEC §6.3 resume: resume.json, every decision and record hash; the node reimaged
    mid-window is billed again from the resume on (40 of 60 minutes)."""
    data = load("resume.json")
    fold = Fold(vectorgen._cast().ledger)
    reasons = _replay_timed(fold, "resume", data["steps"])
    assert [r for r in reasons if r is not None] == [
        "EQUIVOCATION",
        "SIG_MISSING",
        "RESUME_INVALID",
        "RESUME_INVALID",
        "SEQ_GAP",
        "EQUIVOCATION",
    ]
    assert fold.head("pl-resume") == (data["records"], data["head"])
    assert data["totals"]["delivered_mgms"] == 40 * 60_000 * 1000


def test_measurement_is_reproduced_by_the_fold() -> None:
    """SPEC §5.3, §7.1.1 (XID tables), §7.1.2: allocation, degradation and attribution decide
    each event's delivered; the tables and the degrading bits are the code's."""
    from proto.xids import DEGRADING_CLOCK_EVENTS, XID_TABLES

    data = load("measurement.json")
    cast = vectorgen._cast()
    assert base64.b64encode(cast.ledger.public_key).decode() == data["ledger_public_key"]
    fold = Fold(cast.ledger)
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        assert open_envelope(raw).payload.decode() == step["signed_bytes_utf8"]
        (outcome,) = fold.apply(raw, f"vector:{i}", None)
        assert outcome.record is not None, step["note"]
        assert outcome.record.delivered_mgms == step["delivered_mgms"], step["note"]
    totals = fold.totals("pl-vector")
    assert totals is not None and msgspec.to_builtins(totals) == data["totals"]
    for case in data["rejections"]:
        with pytest.raises(ProtoError) as caught:
            open_envelope(base64.b64decode(case["envelope_b64"]))
        assert caught.value.reason.value == case["reason"], case["name"]
    assert data["degrading_clock_events"] == DEGRADING_CLOCK_EVENTS
    for version, entries in data["xid_tables"].items():
        table = XID_TABLES[int(version)]
        assert {e["code"]: (e["attribution"], e["unhealthy"]) for e in entries} == {
            c: (x.attribution, x.unhealthy) for c, x in table.items()
        }
