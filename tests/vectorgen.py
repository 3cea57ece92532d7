"""Generate the golden test vectors in ``proto/vectors/`` (``python tests/vectorgen.py``).

The vectors are committed; ``tests/test_proto_vectors.py`` regenerates them and fails on
any difference, so a change to the wire cannot pass unnoticed. Another implementation
checks itself against the committed files alone (their format is described in
``proto/vectors/README.md``).

Pricing expectations are computed here directly from the formulas of SPEC.md §7, apart
from ``ledger/pricing.py``; the fold scenarios record what the reference fold decided.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ed25519_edges
import msgspec

from devtools import builders as b
from proto import merkle
from proto.cosign import cosign
from proto.envelope import Envelope, encode_envelope, open_envelope, seal, sign_payload
from proto.errors import ProtoError
from proto.frontier import Frontier
from proto.keys import SigningKey, key_id
from proto.note import checkpoint_body, checkpoint_origin, sign_note
from proto.records import ZERO_HASH, Checkpoint, LedgerRecord, PlacementTerms

VECTORS_DIR = Path(__file__).resolve().parent.parent / "proto" / "vectors"
WS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000
HOUR = 3_600_000
COSIGNED_AT_S = 1_767_225_600


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def keys_vectors() -> Any:
    """Seeds, public keys and key ids."""
    out = []
    for text in ("gridledger/vector/key/0", "gridledger/vector/key/1", "gridledger/vector/key/2"):
        key = SigningKey.from_seed_text("k", text)
        out.append(
            {
                "seed_hex": key.seed.hex(),
                "public_key": _b64(key.public_key),
                "key_id": key_id(key.public_key),
                "message_utf8": "gridledger/closed/v1\n{}",
                "signature": _b64(key.sign(b"gridledger/closed/v1\n{}")),
            }
        )
    return out


def signatures_vectors() -> Any:
    """SPEC §3's verification rule at its edges: which signatures are valid, and which of
    the two equations of RFC 8032 holds for each (``tests/ed25519_edges.py``)."""
    small = [encoding.hex() for encoding in ed25519_edges.SMALL_ORDER_ENCODINGS]
    cases = []
    for case in ed25519_edges.cases():
        cases.append(
            {
                "name": case.name,
                "public_key": _b64(case.public_key),
                "message_utf8": case.message.decode(),
                "signature": _b64(case.signature),
                "valid": case.valid,
                "cofactorless_equation": ed25519_edges.cofactorless(
                    case.public_key, case.message, case.signature
                ),
                "cofactored_equation": ed25519_edges.cofactored(
                    case.public_key, case.message, case.signature
                ),
                "why": case.why,
            }
        )
    return {"L": str(ed25519_edges.L), "small_order_encodings": small, "cases": cases}


def _cast() -> b.Cast:
    return b.make_cast("gridledger/vectors")


def _terms(cast: b.Cast, **overrides: Any) -> PlacementTerms:
    gpus = [b.gpu("node-a", 0), b.gpu("node-a", 1, share_milli=500), b.gpu("node-b", 0)]
    return b.make_terms(cast, "pl-vector", gpus, WS, WS + HOUR, **overrides)


def records_vectors() -> Any:
    """One signed envelope per input kind, with bytes and hashes; a LedgerRecord unsigned
    (export format version 2) and signed (version 1)."""
    cast = _cast()
    terms = _terms(cast)
    writer = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    samples = [b.sample(g) for g in terms.gpus if g.node_id == "node-a"]
    envelopes = {
        "terms": b.signed_terms(cast, terms),
        "usage": writer.event(WS, WS + MINUTE, samples),
        "reclaim": b.reclaim(cast, terms, WS, WS + 30 * MINUTE, "r1"),
        "adjustment": b.adjustment(cast, "pl-vector", "adj-1", "credit", 120, WS + HOUR),
        "keybinding": b.key_binding(
            cast, "pl-vector", "node-a", cast.node_key("node-a"), 0, WS + HOUR, WS
        ),
        "closed": b.closed(cast, "pl-vector", WS + HOUR + 5 * MINUTE),
    }
    out = []
    for kind, raw in envelopes.items():
        opened = open_envelope(raw)
        out.append(
            {
                "kind": kind,
                "signed_bytes_utf8": opened.payload.decode(),
                "record_hash": opened.record_hash,
                "envelope_utf8": raw.decode(),
                "input_hash": opened.input_hash,
                "signers": [s.keyid for s in opened.envelope.signatures],
            }
        )
    # SPEC §8: the LedgerRecord chaining the terms, as export format version 2 writes it
    # (no signature) and as version 1 did (the ledger's): one payload, so one record hash.
    from ledger.pricing import ZERO_TOTALS

    terms_input = open_envelope(envelopes["terms"])
    record = LedgerRecord(
        placement_id="pl-vector",
        index=0,
        prev=ZERO_HASH,
        kind="terms",
        source=terms_input.input_hash,
        status="accepted",
        reason="",
        delivered_mgms=0,
        totals=ZERO_TOTALS,
        arrived_ms=WS,
    )
    for version, signers in (("2", []), ("1", [cast.ledger])):
        raw = seal(record, signers)
        opened = open_envelope(raw)
        out.append(
            {
                "kind": "record",
                "export_format_version": version,
                "signed_bytes_utf8": opened.payload.decode(),
                "record_hash": opened.record_hash,
                "envelope_utf8": raw.decode(),
                "input_hash": opened.input_hash,
                "signers": [s.keyid for s in opened.envelope.signatures],
            }
        )
    return {
        "parties": {
            role: {"key_id": k.key_id, "public_key": _b64(k.public_key)}
            for role, k in (
                ("operator", cast.operator),
                ("buyer", cast.buyer),
                ("desk", cast.desk),
                ("ledger", cast.ledger),
                ("node-a", cast.node_key("node-a")),
            )
        },
        "records": out,
    }


def rejections_vectors() -> Any:
    """Envelopes that must be refused at decoding, each with its reason code."""
    cast = _cast()
    good = b.closed(cast, "pl-vector", WS)
    opened = open_envelope(good)
    sigs = opened.envelope.signatures

    def with_payload(payload: bytes) -> bytes:
        return encode_envelope(Envelope(payload=payload, signatures=sigs))

    body = opened.payload.split(b"\n", 1)[1]
    cases: dict[str, bytes] = {
        "not json": b"{",
        "unknown envelope field": good[:-1] + b',"z":1}',
        "whitespace in envelope": good.replace(b'{"payload"', b'{ "payload"'),
        "no prefix": with_payload(body),
        "unknown kind": with_payload(b"gridledger/bogus/v1\n" + body),
        "closed body under the usage prefix": with_payload(b"gridledger/usage/v1\n" + body),
        "tag differs from prefix": with_payload(
            b'gridledger/closed/v1\n{"closed_at_ms":1,"placement_id":"pl-vector","type":"usage"}'
        ),
        "float": with_payload(
            opened.payload.replace(b'"closed_at_ms":', b'"closed_at_ms":1.5,"x":')
        ),
        "unknown field": with_payload(opened.payload[:-1] + b',"zz":1}'),
        "non-canonical order": with_payload(
            b'gridledger/closed/v1\n{"placement_id":"pl-vector","closed_at_ms":1,"type":"closed"}'
        ),
        "duplicate key": with_payload(
            b'gridledger/closed/v1\n{"closed_at_ms":1,"closed_at_ms":1,'
            b'"placement_id":"pl-vector","type":"closed"}'
        ),
        # Python's `$` also matches before a final newline; identifiers and hashes are
        # the characters of SPEC §4.1 only, end to end.
        "identifier with a trailing newline": with_payload(
            b'gridledger/closed/v1\n{"closed_at_ms":1,"placement_id":"pl-vector\\n","type":"closed"}'
        ),
        "integer beyond 2^53": with_payload(
            b'gridledger/closed/v1\n{"closed_at_ms":9007199254740992,'
            b'"placement_id":"pl-vector","type":"closed"}'
        ),
    }
    out = []
    for name, raw in cases.items():
        try:
            open_envelope(raw)
        except ProtoError as exc:
            out.append({"name": name, "envelope_b64": _b64(raw), "reason": exc.reason.value})
        else:  # pragma: no cover - a vector that decodes is a generator bug
            raise AssertionError(f"vector {name!r} decodes")
    return out


def merkle_vectors() -> Any:
    """The RFC 6962 reference leaves, roots, and every inclusion/consistency proof."""
    leaves = [
        b"",
        b"\x00",
        b"\x10",
        b"\x20\x21",
        b"\x30\x31",
        b"\x40\x41\x42\x43",
        bytes(range(0x50, 0x58)),
        bytes(range(0x60, 0x70)),
    ]
    hashed = [merkle.leaf_hash(x) for x in leaves]
    roots = {n: merkle.root_from_leaf_hashes(hashed[:n]).hex() for n in range(0, 9)}
    inclusion = [
        {
            "index": i,
            "tree_size": n,
            "proof": [p.hex() for p in merkle.inclusion_proof(hashed[:n], i)],
        }
        for n in range(1, 9)
        for i in range(n)
    ]
    frontiers = {
        n: [h.hex() for h in Frontier.empty().extend(leaves[:n]).hashes] for n in range(0, 9)
    }
    consistency = [
        {
            "first": m,
            "second": n,
            "proof": [p.hex() for p in merkle.consistency_proof(hashed[:n], m)],
        }
        for n in range(1, 9)
        for m in range(1, n + 1)
    ]
    return {
        "leaves_hex": [x.hex() for x in leaves],
        "roots": roots,
        "inclusion": inclusion,
        "consistency": consistency,
        # SPEC §8.3: the right frontier (perfect subtree roots, largest first) of each size.
        "frontiers": frontiers,
    }


def checkpoint_vectors() -> Any:
    """A checkpoint note signed by the ledger and cosigned (C2SP cosignature/v1) by the buyer."""
    cast = _cast()
    root = merkle.root([b"record 0", b"record 1", b"record 2"])
    body = checkpoint_body(Checkpoint(origin=checkpoint_origin("pl-vector"), size=3, root=root))
    note = cosign(
        sign_note(body, "gridledger-ledger", cast.ledger), "buyer-1", cast.buyer, COSIGNED_AT_S
    )
    return {
        "note": note.text(),
        "signers": {
            "gridledger-ledger": _b64(cast.ledger.public_key),
            "buyer-1": _b64(cast.buyer.public_key),
        },
        "origin": checkpoint_origin("pl-vector"),
        "size": 3,
        "root_b64": _b64(root),
        "cosigned_at_s": COSIGNED_AT_S,
    }


# ---- pricing, straight from SPEC §7 ---------------------------------------------------------


def _spec_totals(t: dict[str, Any], case: dict[str, Any]) -> dict[str, int]:
    s = t["share_total_milli"]
    rate = t["rate_per_gpu_hour_minor"]
    d = case["delivered_mgms"]
    unit = t["increment_ms"] * 1000
    billable = -(-d // unit) * unit
    gross = billable * rate // 3_600_000_000
    r = 0
    if case.get("reclaim"):
        issued, eff = case["reclaim"]
        short = max(0, t["reclaim_notice_ms"] - (eff - issued))
        if not t["interruptible"]:
            taken = t["window_end_ms"] - eff
        else:
            taken = max(0, t["window_start_ms"] + t["minimum_duration_ms"] - eff)
        r = s * (short + taken) * rate * t["reclaim_penalty_bps"] // (3_600_000_000 * 10_000)
    # §7.9: a release (arrival a, effective_at, end of usage folded before it) after the
    # reclaim, if any: e = max of the three; owed until min(E0, max(ws + min, a + notice)).
    k = 0
    eff_end = case["reclaim"][1] if case.get("reclaim") else t["window_end_ms"]
    if case.get("release"):
        arrived, effective_at, usage_end = case["release"]
        e = max(effective_at, arrived, usage_end)
        owed_until = min(
            eff_end,
            max(
                t["window_start_ms"] + t["minimum_duration_ms"],
                arrived + t.get("release_notice_ms", 0),
            ),
        )
        k = s * max(0, owed_until - e) * rate // 3_600_000_000
        eff_end = e
    q = 0
    if case.get("closed"):
        owed = eff_end - t["window_start_ms"]
        availability = 10_000 if owed == 0 else 10_000 * d // (s * owed)
        if availability < t["sla_availability_target_bps"]:
            q = gross * t["sla_credit_bps"] // 10_000
    ac, ah = case.get("adjustment_credit", 0), case.get("adjustment_charge", 0)
    credits = min(r + q + ac, gross + ah + k)
    net = gross + ah + k - credits
    fee = net * t["desk_fee_bps"] // 10_000
    if t["fee_payer"] == "operator":
        owes, receives = net, net - fee
    else:
        owes, receives = net + fee, net
    totals = {
        "delivered_mgms": d,
        "billable_mgms": billable,
        "gross_minor": gross,
        "reclaim_credit_minor": r,
        "sla_credit_minor": q,
        "adjustment_credit_minor": ac,
        "adjustment_charge_minor": ah,
        "credits_minor": credits,
        "net_minor": net,
        "fee_minor": fee,
        "buyer_owes_minor": owes,
        "operator_receives_minor": receives,
        "desk_receives_minor": fee,
    }
    if k:  # §2 (4): omitted at its default
        totals["release_charge_minor"] = k
    return totals


def pricing_vectors() -> Any:
    """Worked examples of every rule of SPEC §7."""
    base = {
        "share_total_milli": 2500,
        "window_start_ms": WS,
        "window_end_ms": WS + HOUR,
        "rate_per_gpu_hour_minor": 250,
        "increment_ms": MINUTE,
        "minimum_duration_ms": 30 * MINUTE,
        "desk_fee_bps": 500,
        "fee_payer": "operator",
        "interruptible": False,
        "reclaim_notice_ms": 10 * MINUTE,
        "reclaim_penalty_bps": 10_000,
        "sla_availability_target_bps": 9_900,
        "sla_credit_bps": 1_000,
    }
    full = 2500 * HOUR
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("nothing delivered", {}, {"delivered_mgms": 0}),
        ("one millisecond rounds up to one increment", {}, {"delivered_mgms": 1}),
        ("exact increments", {}, {"delivered_mgms": 2500 * 10 * MINUTE}),
        ("full hour, open", {}, {"delivered_mgms": full}),
        ("full hour, closed: no SLA credit", {}, {"delivered_mgms": full, "closed": True}),
        ("98% availability: SLA credit", {}, {"delivered_mgms": full * 98 // 100, "closed": True}),
        ("buyer pays the fee", {"fee_payer": "buyer"}, {"delivered_mgms": full}),
        (
            "reclaim with full notice, not interruptible: taken window",
            {},
            {"delivered_mgms": full // 2, "reclaim": [WS, WS + 30 * MINUTE]},
        ),
        (
            "reclaim with short notice, interruptible, after minimum",
            {"interruptible": True},
            {"delivered_mgms": full * 3 // 4, "reclaim": [WS + 44 * MINUTE, WS + 45 * MINUTE]},
        ),
        (
            "reclaim before minimum duration, interruptible",
            {"interruptible": True},
            {"delivered_mgms": full // 6, "reclaim": [WS, WS + 10 * MINUTE], "closed": True},
        ),
        (
            "reclaim at the window start",
            {"interruptible": True, "minimum_duration_ms": 0},
            {"delivered_mgms": 0, "reclaim": [WS - HOUR, WS], "closed": True},
        ),
        (
            "credits capped at gross plus charges",
            {},
            {"delivered_mgms": full // 10, "adjustment_credit": 10**6, "adjustment_charge": 3},
        ),
        (
            "odd rate and fee rounding",
            {"rate_per_gpu_hour_minor": 333, "desk_fee_bps": 333, "increment_ms": 7_000},
            {"delivered_mgms": 123_456_789},
        ),
        (
            "large placement near the bounds",
            {
                "share_total_milli": 256_000,
                "window_end_ms": WS + 366 * 24 * HOUR - 1,
                "rate_per_gpu_hour_minor": 3_600_000_000,
            },
            {"delivered_mgms": 256_000 * (366 * 24 * HOUR - 1)},
        ),
        (
            "release before the minimum duration: K bills the rest of the minimum",
            {"release_notice_ms": 0},
            {
                "delivered_mgms": 2500 * 10 * MINUTE,
                "release": [WS + 9 * MINUTE, WS, WS + 10 * MINUTE],
            },
        ),
        (
            "release with short notice: owed until arrival + notice, past the minimum",
            {"release_notice_ms": 20 * MINUTE},
            {
                "delivered_mgms": 2500 * 35 * MINUTE,
                "release": [WS + 30 * MINUTE, WS + 25 * MINUTE, WS + 35 * MINUTE],
                "closed": True,
            },
        ),
        (
            "release with full notice after the minimum: no charge",
            {"release_notice_ms": 10 * MINUTE},
            {
                "delivered_mgms": 2500 * 40 * MINUTE,
                "release": [WS + 30 * MINUTE, WS + 45 * MINUTE, 0],
            },
        ),
        (
            "release after a reclaim: owed only until the reclaim, which still credits",
            {"release_notice_ms": 30 * MINUTE, "minimum_duration_ms": 50 * MINUTE},
            {
                "delivered_mgms": 2500 * 20 * MINUTE,
                "reclaim": [WS + 10 * MINUTE, WS + 40 * MINUTE],
                "release": [WS + 20 * MINUTE, WS + 20 * MINUTE, WS + 20 * MINUTE],
            },
        ),
        (
            "release charge offset by credits, buyer pays the fee",
            {"release_notice_ms": 60 * MINUTE, "fee_payer": "buyer"},
            {
                "delivered_mgms": 2500 * 5 * MINUTE,
                "release": [WS + 5 * MINUTE, WS + 5 * MINUTE, WS + 5 * MINUTE],
                "adjustment_credit": 100,
            },
        ),
    ]
    out = []
    for name, term_changes, case in cases:
        terms = {**base, **term_changes}
        out.append(
            {"name": name, "terms": terms, "case": case, "expected": _spec_totals(terms, case)}
        )
    return out


# ---- fold scenarios ----------------------------------------------------------------------


def scenario_vectors() -> Any:
    """Whole input streams with the decision for each input and the final chain head."""
    from ledger.fold import Fold

    cast = _cast()
    terms = _terms(cast)
    a = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    nb = b.StreamWriter(cast.node_key("node-b"), "pl-vector", "node-b")

    def samples(node: str, healthy: bool = True) -> list[Any]:
        return [b.sample(g, healthy=healthy) for g in terms.gpus if g.node_id == node]

    inputs: list[bytes] = []
    early = a.event(WS, WS + 10 * MINUTE, samples("node-a"))
    inputs += [early, b.signed_terms(cast, terms), early]
    inputs.append(nb.event(WS, WS + 10 * MINUTE, samples("node-b", healthy=False)))
    inputs.append(a.event(WS + 10 * MINUTE, WS + 20 * MINUTE, samples("node-a")))
    forked = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    inputs.append(forked.event(WS, WS + 5 * MINUTE, samples("node-a")))
    inputs.append(b"not an envelope")
    inputs.append(b.reclaim(cast, terms, WS + 15 * MINUTE, WS + 40 * MINUTE, "r1"))
    inputs.append(nb.event(WS + 10 * MINUTE, WS + 50 * MINUTE, samples("node-b")))
    # SPEC §6.2 stream holds: node b's seq 3 arrives before its seq 2 and waits for it.
    nb2 = nb.event(WS + 50 * MINUTE, WS + 55 * MINUTE, samples("node-b"))
    nb3 = nb.event(WS + 55 * MINUTE, WS + 60 * MINUTE, samples("node-b"))
    inputs += [nb3, nb2]
    inputs.append(b.adjustment(cast, "pl-vector", "adj-1", "credit", 17, WS + HOUR))
    # Node a's seq 5 (seqs 2-4 never come) waits, and the close flushes it as SEQ_GAP.
    beyond = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a", seq=5, prev=a.prev)
    inputs.append(beyond.event(WS + 50 * MINUTE, WS + 55 * MINUTE, samples("node-a")))
    inputs.append(b.closed(cast, "pl-vector", WS + HOUR + 5 * MINUTE))
    inputs.append(a.event(WS + 20 * MINUTE, WS + 30 * MINUTE, samples("node-a")))
    inputs.append(b.adjustment(cast, "pl-vector", "adj-2", "charge", 40, WS + 2 * HOUR))
    fold = Fold(cast.ledger)
    steps = []
    for i, raw in enumerate(inputs):
        outcomes = fold.apply(raw, f"vector:{i}", None)
        steps.append(
            {
                "envelope_b64": _b64(raw),
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "index": None if o.record is None else o.record.index,
                        "delivered_mgms": None if o.record is None else o.record.delivered_mgms,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head("pl-vector")
    totals = fold.totals("pl-vector")
    assert head is not None and totals is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.to_builtins(totals),
    }


def health_vectors() -> Any:
    """SPEC §7.1.1: samples flagged healthy whose evidence says otherwise, folded; the
    canonical bytes of a sample with evidence; evidence that must be refused."""
    from ledger.fold import Fold

    cast = _cast()
    terms = _terms(cast)
    gpu0, gpu1 = [g for g in terms.gpus if g.node_id == "node-a"]
    a = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    events: list[tuple[str, list[Any]]] = [
        (
            "seq 0 sets the retired baseline (2 pages on GPU 0)",
            [b.sample(gpu0, retired_pages=2), b.sample(gpu1)],
        ),
        (
            "GPU 0: XID 79, flagged healthy",
            [b.sample(gpu0, xids=[79], retired_pages=2), b.sample(gpu1)],
        ),
        (
            "GPU 0: 3 uncorrectable ECC errors",
            [b.sample(gpu0, ecc_uncorrectable=3, retired_pages=2), b.sample(gpu1)],
        ),
        ("GPU 0: retired pages 2 -> 3", [b.sample(gpu0, retired_pages=3), b.sample(gpu1)]),
        ("GPU 1: not present", [b.sample(gpu0, retired_pages=3), b.sample(gpu1, present=False)]),
        (
            "GPU 1: 0 W; GPU 0: XID 31 (not critical)",
            [b.sample(gpu0, xids=[31], retired_pages=3), b.sample(gpu1, power_mw=0)],
        ),
    ]
    inputs = [b.signed_terms(cast, terms)]
    for i, (_, samples) in enumerate(events):
        inputs.append(a.event(WS + i * 10 * MINUTE, WS + (i + 1) * 10 * MINUTE, samples))
    fold = Fold(cast.ledger)
    steps = []
    for i, raw in enumerate(inputs):
        (outcome,) = fold.apply(raw, f"health:{i}", None)
        assert outcome.record is not None and outcome.status == "accepted"
        opened = open_envelope(raw)
        steps.append(
            {
                "note": "terms" if i == 0 else events[i - 1][0],
                "signed_bytes_utf8": opened.payload.decode(),
                "envelope_b64": _b64(raw),
                "delivered_mgms": outcome.record.delivered_mgms,
            }
        )
    totals = fold.totals("pl-vector")
    assert totals is not None

    base = a.event(WS + HOUR, WS + HOUR + MINUTE, [b.sample(gpu0)])
    body = open_envelope(base).payload
    key = cast.node_key("node-a")

    def signed(payload: bytes) -> bytes:
        return encode_envelope(sign_payload(payload, [key]))

    uuid_field = f'"uuid":"{gpu0.uuid}"'.encode()
    too_many = ",".join(str(x) for x in range(17))
    cases = {
        "evidence field written at its default": body.replace(
            b'"utilisation_pct":', b'"present":true,"utilisation_pct":'
        ),
        "17 XID codes": body.replace(uuid_field, uuid_field + f',"xids":[{too_many}]'.encode()),
        "negative XID code": body.replace(uuid_field, uuid_field + b',"xids":[-1]'),
    }
    rejections = []
    for name, payload in cases.items():
        raw = signed(payload)
        try:
            open_envelope(raw)
        except ProtoError as exc:
            rejections.append({"name": name, "envelope_b64": _b64(raw), "reason": exc.reason.value})
        else:  # pragma: no cover - a vector that decodes is a generator bug
            raise AssertionError(f"vector {name!r} decodes")
    return {
        "critical_xids": [48, 63, 64, 74, 79, 92, 94, 95],
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "totals": msgspec.to_builtins(totals),
        "rejections": rejections,
    }


def measurement_vectors() -> Any:
    """SPEC §5.3, §7.1.1 (the XID table), §7.1.2: terms with ``metering`` (XID table 2, idle
    not billed, degraded time at a quarter); node-signed events whose allocation, clock
    events and XIDs decide each sample, folded; both XID tables with their attribution."""
    from ledger.fold import Fold
    from proto.records import Metering
    from proto.xids import DEGRADING_CLOCK_EVENTS, XID_TABLES

    cast = _cast()
    metering = Metering(
        xid_table=2, idle_billed=False, holders=["k8s:team-a", "slurm:acme"], degraded_bps=2_500
    )
    terms = _terms(cast, metering=metering)
    gpu0, gpu1 = [g for g in terms.gpus if g.node_id == "node-a"]
    a = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    events: list[tuple[str, list[Any]]] = [
        (
            "GPU 0 held by the buyer; GPU 1 by another tenant (flagged allocated all the same)",
            [b.sample(gpu0, allocation="buyer"), b.sample(gpu1, allocation="other")],
        ),
        (
            "GPU 0 idle, GPU 1 allocation unknown: idle_billed false, neither counts",
            [b.sample(gpu0, allocation="idle"), b.sample(gpu1)],
        ),
        (
            "GPU 0: hardware thermal slowdown (0x40), at degraded_bps; GPU 1: power cap (0x04)",
            [
                b.sample(gpu0, allocation="buyer", clock_events=0x40),
                b.sample(gpu1, allocation="buyer", clock_events=0x04),
            ],
        ),
        (
            "GPU 0: XID 13 and 31 (the application's); GPU 1: XID 63 and a correctable remap",
            [
                b.sample(gpu0, allocation="buyer", xids=[13, 31]),
                b.sample(gpu1, allocation="buyer", xids=[63], remapped_correctable=1),
            ],
        ),
        (
            "GPU 0: XID 119 (driver, GSP timeout); GPU 1: XID 79 (hardware)",
            [
                b.sample(gpu0, allocation="buyer", xids=[119]),
                b.sample(gpu1, allocation="buyer", xids=[79]),
            ],
        ),
    ]
    inputs = [b.signed_terms(cast, terms)]
    for i, (_, samples) in enumerate(events):
        inputs.append(a.event(WS + i * 10 * MINUTE, WS + (i + 1) * 10 * MINUTE, samples))
    fold = Fold(cast.ledger)
    steps = []
    for i, raw in enumerate(inputs):
        (outcome,) = fold.apply(raw, f"measurement:{i}", None)
        assert outcome.record is not None and outcome.status == "accepted"
        opened = open_envelope(raw)
        steps.append(
            {
                "note": "terms" if i == 0 else events[i - 1][0],
                "signed_bytes_utf8": opened.payload.decode(),
                "envelope_b64": _b64(raw),
                "delivered_mgms": outcome.record.delivered_mgms,
            }
        )
    totals = fold.totals("pl-vector")
    assert totals is not None
    body = open_envelope(a.event(WS + HOUR, WS + HOUR + MINUTE, [b.sample(gpu0)])).payload
    key = cast.node_key("node-a")
    uuid_field = f'"uuid":"{gpu0.uuid}"'.encode()
    cases = {
        "allocation written at its default": body.replace(
            uuid_field, uuid_field + b',"allocation":"unknown"'
        ),
        "allocation not one of the four": body.replace(
            uuid_field, uuid_field + b',"allocation":"mine"'
        ),
        "negative clock_events": body.replace(uuid_field, uuid_field + b',"clock_events":-1'),
    }
    rejections = []
    for name, payload in cases.items():
        raw = encode_envelope(sign_payload(payload, [key]))
        try:
            open_envelope(raw)
        except ProtoError as exc:
            rejections.append({"name": name, "envelope_b64": _b64(raw), "reason": exc.reason.value})
        else:  # pragma: no cover - a vector that decodes is a generator bug
            raise AssertionError(f"vector {name!r} decodes")
    return {
        "xid_tables": {
            str(version): [
                {"code": e.code, "attribution": e.attribution, "unhealthy": e.unhealthy}
                for e in sorted(table.values(), key=lambda e: e.code)
            ]
            for version, table in XID_TABLES.items()
        },
        "degrading_clock_events": DEGRADING_CLOCK_EVENTS,
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "totals": msgspec.to_builtins(totals),
        "rejections": rejections,
    }


def time_vectors() -> Any:
    """SPEC §6.6: one stream with the time each input reached the log; the decisions and
    the ``arrived_ms`` of every record (monotone; a held input keeps its own), the
    FUTURE_DATED bound, a reclaim whose notice runs from its arrival, a revoked key."""
    from ledger.fold import Fold
    from proto.limits import MAX_CLOCK_SKEW_MS

    cast = _cast()
    terms = _terms(cast, reclaim_notice_ms=30 * MINUTE)
    a = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")
    nb = b.StreamWriter(cast.node_key("node-b"), "pl-vector", "node-b")

    def samples(node: str) -> list[Any]:
        return [b.sample(g) for g in terms.gpus if g.node_id == node]

    steps_in: list[tuple[str, bytes, int]] = [
        (
            "held before the terms; keeps its own arrival",
            a.event(WS, WS + 5 * MINUTE, samples("node-a")),
            WS + 5 * MINUTE,
        ),
        ("terms stated earlier than the held event", b.signed_terms(cast, terms), WS - MINUTE),
        (
            "ends exactly MAX_CLOCK_SKEW_MS after its arrival",
            nb.event(WS, WS + 10 * MINUTE, samples("node-b")),
            WS + 10 * MINUTE - MAX_CLOCK_SKEW_MS,
        ),
    ]
    ahead = b.StreamWriter(cast.node_key("node-b"), "pl-vector", "node-b", seq=1, prev=nb.prev)
    steps_in.append(
        (
            "ends 1 ms past the bound: FUTURE_DATED",
            ahead.event(WS + 10 * MINUTE, WS + 20 * MINUTE + 1, samples("node-b")),
            WS + 20 * MINUTE - MAX_CLOCK_SKEW_MS,
        )
    )
    steps_in.append(
        (
            "issued_at minute 0 on paper, arrives at minute 25: 5 minutes of notice",
            b.reclaim(cast, terms, WS, WS + 30 * MINUTE, "r1"),
            WS + 25 * MINUTE,
        )
    )
    steps_in.append(
        (
            "the operator revokes node b's key (valid until minute 10)",
            b.key_binding(
                cast,
                "pl-vector",
                "node-b",
                cast.node_key("node-b"),
                0,
                WS + 10 * MINUTE,
                WS,
                [cast.operator],
            ),
            WS + 26 * MINUTE,
        )
    )
    revoked = b.StreamWriter(cast.node_key("node-b"), "pl-vector", "node-b", seq=1, prev=nb.prev)
    steps_in.append(
        (
            "node b's key after its revocation, inside the old binding: NODE_KEY_REVOKED",
            revoked.event(WS + 5 * MINUTE, WS + 10 * MINUTE, samples("node-b")),
            WS + 27 * MINUTE,
        )
    )
    steps_in.append(
        (
            "arrives stated earlier than the record before: carries the later arrival",
            a.event(WS + 5 * MINUTE, WS + 10 * MINUTE, samples("node-a")),
            WS + 20 * MINUTE,
        )
    )
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"time:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "index": None if o.record is None else o.record.index,
                        "arrived_ms": None if o.record is None else o.record.arrived_ms,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head("pl-vector")
    totals = fold.totals("pl-vector")
    assert head is not None and totals is not None
    return {
        "max_clock_skew_ms": MAX_CLOCK_SKEW_MS,
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.to_builtins(totals),
    }


def release_vectors() -> Any:
    """SPEC §6.7, §7.9: a buyer release in one stream with the time each input reached the
    log: who may sign it, its end e (never before its arrival nor before folded usage),
    the release charge K from the minimum duration and the notice, usage after e, a second
    release, a reclaim after it (whichever ends first; its taken time only up to e), and a
    release after the close."""
    from ledger.fold import Fold

    cast = _cast()
    terms = _terms(
        cast, minimum_duration_ms=40 * MINUTE, release_notice_ms=15 * MINUTE, late_grace_ms=0
    )
    a = b.StreamWriter(cast.node_key("node-a"), "pl-vector", "node-a")

    def samples() -> list[Any]:
        return [b.sample(g) for g in terms.gpus if g.node_id == "node-a"]

    def rel(issued: int, effective: int, rid: str, signers: list[SigningKey]) -> bytes:
        return b.release(cast, terms, WS + issued, WS + effective, rid, signers)

    steps_in: list[tuple[str, bytes, int]] = [
        ("terms: minimum 40 min, release notice 15 min", b.signed_terms(cast, terms), WS),
        *(
            (
                f"node a, minute {m}",
                a.event(WS + m * MINUTE, WS + (m + 1) * MINUTE, samples()),
                WS + (m + 1) * MINUTE,
            )
            for m in range(12)
        ),
        ("a release nobody signed: SIG_MISSING", rel(10, 10, "r0", []), WS + 12 * MINUTE),
        (
            "signed by the buyer and the desk: SIG_SURPLUS",
            rel(10, 10, "r0", [cast.buyer, cast.desk]),
            WS + 12 * MINUTE,
        ),
        (
            "effective before it was issued: RELEASE_INVALID",
            rel(11, 10, "r0", [cast.buyer]),
            WS + 12 * MINUTE,
        ),
        (
            "dated minute 10 for minute 10, reaches the log at 13, usage folded to 12: "
            "e = 13, owed until max(40, 13 + 15) = 40, K for 27 min",
            rel(10, 10, "r1", [cast.buyer, cast.operator]),
            WS + 13 * MINUTE,
        ),
        (
            "starts before e: accepted, counts to e",
            a.event(WS + 12 * MINUTE, WS + 14 * MINUTE, samples()),
            WS + 14 * MINUTE,
        ),
        (
            "starts at e or later: AFTER_RELEASE",
            a.event(WS + 14 * MINUTE, WS + 15 * MINUTE, samples()),
            WS + 15 * MINUTE,
        ),
        ("a second release: RELEASE_DUPLICATE", rel(15, 16, "r2", [cast.buyer]), WS + 15 * MINUTE),
        (
            "a reclaim after e: RECLAIM_INVALID",
            b.reclaim(cast, terms, WS + 15 * MINUTE, WS + 20 * MINUTE, "c1"),
            WS + 16 * MINUTE,
        ),
        (
            "the close at the window end + grace, whatever e",
            b.closed(cast, "pl-vector", WS + HOUR),
            WS + HOUR,
        ),
        ("a release after the close: AFTER_CLOSE", rel(61, 61, "r3", [cast.buyer]), WS + HOUR),
    ]
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"release:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "index": None if o.record is None else o.record.index,
                        "arrived_ms": None if o.record is None else o.record.arrived_ms,
                        "record_hash": o.record_hash,
                        "totals": None
                        if o.record is None
                        else msgspec.to_builtins(o.record.totals),
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head("pl-vector")
    totals = fold.totals("pl-vector")
    assert head is not None and totals is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.to_builtins(totals),
    }


def authority_vectors() -> Any:
    """SPEC §4.0, §6.3 terms and §8 statement periods: who may sign what, amendments, and
    the statements of period 0 and of the period a late charge opens."""
    from ledger.fold import Fold
    from ledger.statements import make_statement

    cast = _cast()
    pid = "pl-authority"
    terms = b.make_terms(cast, pid, [b.gpu("node-a", 0)], WS, WS + HOUR)
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")
    rival = b.make_terms(cast, pid, terms.gpus, WS, WS + HOUR, rate_per_gpu_hour_minor=490)
    amended = b.amendment(terms, rate_per_gpu_hour_minor=300)
    new_key = SigningKey.from_seed_text("node-a-2", "vectors/node-a-2")
    op, buyer, desk = cast.operator, cast.buyer, cast.desk

    def adj(adjustment_id: str, direction: str, signers: list[SigningKey]) -> bytes:
        return b.adjustment(cast, pid, adjustment_id, direction, 25, WS, signers=signers)

    def bind(valid_from: int, until: int, signers: list[SigningKey]) -> bytes:
        return b.key_binding(cast, pid, "node-a", new_key, valid_from, until, WS, signers=signers)

    cases: list[tuple[str, bytes]] = [
        ("terms, version 1", b.signed_terms(cast, terms)),
        ("other fully signed terms, no amendment link", b.signed_terms(cast, rival)),
        ("amendment signed by operator and buyer only", seal(amended, [op, buyer])),
        ("amendment (version 2), all three sign", b.signed_terms(cast, amended)),
        ("new node key, operator alone", bind(WS, WS + HOUR, [op])),
        ("new node key, operator and buyer", bind(WS, WS + HOUR, [op, buyer])),
        ("revocation (shortens), operator alone", bind(WS, WS + 30 * MINUTE, [op])),
        ("charge, desk alone", adj("c-desk", "charge", [desk])),
        ("credit, desk alone", adj("r-desk", "credit", [desk])),
        ("credit, operator alone", adj("r-op", "credit", [op])),
        ("charge, buyer and desk", adj("c-1", "charge", [buyer, desk])),
        ("credit, operator and desk", adj("r-1", "credit", [op, desk])),
        ("usage", a.event(WS, WS + 10 * MINUTE, [b.sample(terms.gpus[0])])),
        ("amendment after usage", b.signed_terms(cast, b.amendment(amended, desk_fee_bps=0))),
        ("close", b.closed(cast, pid, WS + 2 * HOUR)),
        ("charge after the close, buyer alone", adj("c-late", "charge", [buyer])),
    ]
    fold = Fold(cast.ledger)
    steps = []
    records = []
    for i, (name, raw) in enumerate(cases):
        outcomes = fold.apply(raw, f"vector:{i}", None)
        steps.append(
            {
                "name": name,
                "envelope_b64": _b64(raw),
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
        records += [(o.record, o.record_hash) for o in outcomes if o.record is not None]
    final_terms = fold.terms(pid)
    assert final_terms is not None
    close = next(i for i, (r, _) in enumerate(records) if r.kind == "closed")
    statements = []
    for through in (close, len(records) - 1):
        record, record_hash = records[through]
        period = through - close
        previous = records[through - 1][1] if period else ZERO_HASH
        row = make_statement(
            record, record_hash, final_terms, True, cast.ledger, period=period, previous=previous
        )
        statements.append({"period": period, "envelope_b64": _b64(row.envelope)})
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "statements": statements,
    }


def shortens_vectors() -> Any:
    """SPEC §4.0, §6.3 keybinding: when a binding only shortens (valid_from_ms ≤ f,
    valid_until_ms < u), so the operator alone may sign it. A second key of node a is
    bound by operator and buyer and reaches the log at minute 5, so f = minute 5 (§6.6).
    The operator alone: a start after f (SIG_MISSING: it moves the start, not a
    revocation), a start before f with an earlier end (accepted: only shortens, to
    [f, 30); the key is revoked), an end not earlier (SIG_MISSING: it extends)."""
    from ledger.fold import Fold

    cast = _cast()
    pid = "pl-shortens"
    terms = b.make_terms(cast, pid, [b.gpu("node-a", 0)], WS, WS + HOUR)
    key2 = SigningKey.from_seed_text("node-a-2", "vectors/node-a-2")
    a2 = b.StreamWriter(key2, pid, "node-a")
    op, buyer = cast.operator, cast.buyer

    def at(minute: int) -> int:
        return WS + minute * MINUTE

    def bind(valid_from: int, until: int, signers: list[SigningKey]) -> bytes:
        return b.key_binding(cast, pid, "node-a", key2, valid_from, until, WS, signers=signers)

    def usage(start: int, end: int) -> bytes:
        return a2.event(at(start), at(end), [b.sample(terms.gpus[0])])

    steps_in: list[tuple[str, bytes, int]] = [
        ("terms", b.signed_terms(cast, terms), WS),
        (
            "key 2 for [0, 60), operator and buyer, arrives at 5: f = 5",
            bind(WS, at(60), [op, buyer]),
            at(5),
        ),
        ("key 2 usage, minutes 5-10", usage(5, 10), at(10)),
        ("operator alone, [6, 30): starts after f, SIG_MISSING", bind(at(6), at(30), [op]), at(11)),
        (
            "operator alone, [0, 60): not earlier than u, SIG_MISSING",
            bind(WS, at(60), [op]),
            at(11),
        ),
        (
            "operator alone, [0, 30): before f, only shortens to [5, 30)",
            bind(WS, at(30), [op]),
            at(11),
        ),
        ("key 2 usage, minutes 10-15: NODE_KEY_REVOKED", usage(10, 15), at(15)),
        (
            "operator alone, [5, 20): valid_from = f, only shortens",
            bind(at(5), at(20), [op]),
            at(16),
        ),
    ]
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"shortens:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head(pid)
    assert head is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "rule": "only shortens: valid_from_ms <= f and valid_until_ms < u (SPEC §4.0)",
        "steps": steps,
        "records": head[0],
        "head": head[1],
    }


def rejection_advances_vectors() -> Any:
    """SPEC §6.3 usage "What a rejected event does": one node's events, the same envelopes
    folded under terms created at REJECTION_ADVANCES_FROM_MS (a content rejection takes
    its seq and advances the stream, last_end stays) and 1 ms earlier (the rule of before:
    the seq is taken and the rest of the window waits, SEQ_GAP at the close)."""
    from ledger.fold import Fold
    from proto.limits import MAX_CLOCK_SKEW_MS, REJECTION_ADVANCES_FROM_MS

    cast = _cast()
    pid = "pl-rejection"
    start = REJECTION_ADVANCES_FROM_MS
    gpu = b.gpu("node-a", 0)
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")

    def at(minute: int) -> int:
        return start + minute * MINUTE

    def usage(begin: int, end: int, samples: Any = None) -> bytes:
        return a.event(at(begin), at(end), [b.sample(gpu)] if samples is None else samples)

    e0 = usage(0, 10)
    e1 = usage(10, 20, [b.sample(b.gpu("node-a", 7))])  # a GPU outside the terms
    e1_other = b.StreamWriter(cast.node_key("node-a"), pid, "node-a", seq=1, prev=a.prev)
    e2 = usage(20, 30)
    e3 = a.event(at(30), at(52) + MAX_CLOCK_SKEW_MS + 1, [b.sample(gpu)])  # a clock step
    e4 = usage(40, 50)
    e5 = usage(45, 55)
    e6 = usage(50, 58)
    thief = b.StreamWriter(cast.node_key("node-x"), pid, "node-a", seq=a.seq, prev=a.prev)
    e7 = usage(58, 60)
    events: list[tuple[str, bytes, int]] = [
        ("seq 0, minutes 0-10", e0, at(10)),
        ("seq 1 names a GPU outside the terms: GPU_NOT_IN_TERMS", e1, at(20)),
        ("seq 2, chained to the rejected seq 1", e2, at(30)),
        ("seq 4 before seq 3: held in its stream", e4, at(50)),
        ("seq 3 ends past its arrival + MAX_CLOCK_SKEW_MS: FUTURE_DATED", e3, at(52)),
        ("seq 1 again, the same bytes: DUPLICATE", e1, at(53)),
        (
            "another event for seq 1: EQUIVOCATION",
            e1_other.event(at(10), at(20), [b.sample(gpu)]),
            at(53),
        ),
        ("seq 5 starts before the last accepted end: INTERVAL_OVERLAP", e5, at(55)),
        ("seq 6 starts at the last accepted end", e6, at(58)),
        (
            "seq 7 signed by a key not bound to the node: NODE_KEY_UNKNOWN, no seq taken",
            thief.event(at(58), at(60), [b.sample(gpu)]),
            at(60),
        ),
        ("seq 7, the node's own", e7, at(60)),
    ]
    rules = {}
    for name, created in (("advancing", start), ("before", start - 1)):
        terms = b.make_terms(cast, pid, [gpu], start, start + HOUR, created_at_ms=created)
        close_at = terms.window_end_ms + terms.late_grace_ms
        steps_in = [
            ("terms", b.signed_terms(cast, terms), start),
            *events,
            ("the close", b.closed(cast, pid, close_at), close_at),
        ]
        fold = Fold(cast.ledger)
        steps = _timed_steps(fold, f"rejection-{name}", steps_in)
        head, totals = fold.head(pid), fold.totals(pid)
        assert head is not None and totals is not None
        rules[name] = {
            "terms_created_at_ms": created,
            "steps": steps,
            "records": head[0],
            "head": head[1],
            "totals": msgspec.to_builtins(totals),
        }
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "rejection_advances_from_ms": REJECTION_ADVANCES_FROM_MS,
        "max_clock_skew_ms": MAX_CLOCK_SKEW_MS,
        **rules,
    }


def resume_vectors() -> Any:
    """SPEC §6.3 resume: node a signs seq 0-2, loses seq 3 with its spool (seq 4 arrived:
    held), is reimaged; seq 0 again is EQUIVOCATION; resumes signed by the operator alone
    (SIG_MISSING), below the next seq and before the last accepted end (RESUME_INVALID);
    the resume at seq 10 from minute 50 (the resume flush rejects the held seq 4
    SEQ_GAP); the new stream's seq 10 chained to the resume (accepted); an old event for
    seq 5 still in flight (EQUIVOCATION); the close. 40 of 60 minutes delivered."""
    from ledger.fold import Fold
    from proto.envelope import open_envelope
    from proto.limits import REJECTION_ADVANCES_FROM_MS

    cast = _cast()
    pid = "pl-resume"
    start = REJECTION_ADVANCES_FROM_MS
    gpu = b.gpu("node-a", 0)
    terms = b.make_terms(cast, pid, [gpu], start, start + HOUR)
    old = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")

    def at(minute: int) -> int:
        return start + minute * MINUTE

    def usage(writer: b.StreamWriter, begin: int, end: int) -> bytes:
        return writer.event(at(begin), at(end), [b.sample(gpu)])

    first = [usage(old, 10 * i, 10 * (i + 1)) for i in range(3)]
    usage(old, 30, 40)  # seq 3: lost with the spool
    held = usage(old, 40, 50)
    in_flight = usage(old, 50, 60)
    reimaged = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")
    good = b.resume(cast, pid, "node-a", 10, at(50))
    resumed = b.StreamWriter(
        cast.node_key("node-a"), pid, "node-a", seq=10, prev=open_envelope(good).record_hash
    )
    close_at = terms.window_end_ms + terms.late_grace_ms
    steps_in: list[tuple[str, bytes, int]] = [
        ("terms", b.signed_terms(cast, terms), start),
        *((f"seq {i}", raw, at(10 * (i + 1))) for i, raw in enumerate(first)),
        ("seq 4 (seq 3 was lost): held", held, at(50)),
        ("the reimaged node starts at seq 0 again: EQUIVOCATION", usage(reimaged, 50, 51), at(51)),
        (
            "a resume signed by the operator alone: SIG_MISSING",
            b.resume(cast, pid, "node-a", 10, at(50), "r0", [cast.operator]),
            at(52),
        ),
        (
            "a resume at seq 2, below the next seq 3: RESUME_INVALID",
            b.resume(cast, pid, "node-a", 2, at(50), "r1"),
            at(52),
        ),
        (
            "a resume from minute 25, before the last accepted end: RESUME_INVALID",
            b.resume(cast, pid, "node-a", 10, at(25), "r2"),
            at(52),
        ),
        ("the resume at seq 10 from minute 50: seq 4 flushed SEQ_GAP first", good, at(53)),
        ("the new stream's seq 10, chained to the resume", usage(resumed, 50, 60), at(60)),
        ("the old node's seq 5, still in flight: EQUIVOCATION", in_flight, at(60)),
        ("the close", b.closed(cast, pid, close_at), close_at),
    ]
    fold = Fold(cast.ledger)
    steps = _timed_steps(fold, "resume", steps_in)
    head, totals = fold.head(pid), fold.totals(pid)
    assert head is not None and totals is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.to_builtins(totals),
    }


def bounds_vectors() -> Any:
    """SPEC §5 rule 5, §6.3 adjustment, §7.7: every total stays within 2^53 - 1 after every
    input. Terms with the buyer paying a 5 % fee; M (the most G + K can reach) and the
    largest charge sum P(M + Ah) allows; charges of 2^53 - 1, one past the limit, the
    limit, one more; credits of 2^53 - 1 and one more; a whole window of usage; the close.
    Then terms whose payable ceiling P(M) passes 2^53 - 1 (TERMS_INVALID) and the same
    terms with the operator paying the fee (accepted)."""
    from ledger.fold import Fold
    from proto.terms import gross_ceiling_minor, payable_minor

    top = 2**53 - 1
    cast = _cast()
    pid = "pl-bounds"
    terms = b.make_terms(
        cast, pid, [b.gpu("node-a", 0)], WS, WS + HOUR, fee_payer="buyer", desk_fee_bps=500
    )
    ceiling = gross_ceiling_minor(terms)
    net = top * 10_000 // 10_500
    while payable_minor(terms, net + 1) <= top:
        net += 1
    while payable_minor(terms, net) > top:
        net -= 1
    limit = net - ceiling
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")

    def adj(aid: str, direction: str, amount: int) -> bytes:
        return b.adjustment(cast, pid, aid, direction, amount, WS)

    steps_in: list[tuple[str, bytes]] = [
        ("terms: 1 GPU, 1 h, fee 5 % paid by the buyer", b.signed_terms(cast, terms)),
        ("charge 2^53 - 1: ADJUSTMENT_INVALID", adj("c-top", "charge", top)),
        ("charge limit + 1: ADJUSTMENT_INVALID", adj("c-past", "charge", limit + 1)),
        ("charge limit: accepted", adj("c-limit", "charge", limit)),
        ("charge 1 more: ADJUSTMENT_INVALID", adj("c-more", "charge", 1)),
        (
            "usage, the whole window: buyer_owes = P(G + Ah) <= 2^53 - 1",
            a.event(WS, WS + HOUR, [b.sample(terms.gpus[0])]),
        ),
        ("credit 2^53 - 1: accepted", adj("r-top", "credit", top)),
        ("credit 1 more: ADJUSTMENT_INVALID", adj("r-more", "credit", 1)),
        ("close", b.closed(cast, pid, WS + HOUR + terms.late_grace_ms)),
    ]
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"bounds:{i}", None)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head(pid)
    totals = fold.totals(pid)
    assert head is not None and totals is not None
    gpus = [b.gpu(f"n{i // 8}", i % 8) for i in range(256)]
    big = b.make_terms(
        cast,
        "pl-bounds-big",
        gpus,
        WS,
        WS + 366 * 24 * HOUR,
        rate_per_gpu_hour_minor=3_600_000_000,
        desk_fee_bps=10_000,
        fee_payer="buyer",
    )
    terms_cases = []
    for name, case in (
        ("256 GPUs, 366 days, top rate, fee 100 % paid by the buyer", big),
        ("the same, fee paid by the operator", msgspec.structs.replace(big, fee_payer="operator")),
    ):
        (o,) = Fold(cast.ledger).apply(b.signed_terms(cast, case), "bounds-terms:0", None)
        terms_cases.append(
            {
                "name": name,
                "envelope_b64": _b64(b.signed_terms(cast, case)),
                "payable_ceiling_minor": payable_minor(case, gross_ceiling_minor(case)),
                "status": o.status,
                "reason": None if o.reason is None else o.reason.value,
            }
        )
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "max_safe_integer": top,
        "gross_ceiling_minor": ceiling,
        "charge_limit_minor": limit,
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.structs.asdict(totals),
        "terms": terms_cases,
        "worked": [
            "M = floor((S x W + U) x rate / 3 600 000 000) = floor((1000 x 3 600 000 + "
            f"60 000 000) x 250 / 3 600 000 000) = {ceiling}",
            "P(x) = x + floor(x x 500 / 10 000); the largest Ah with P(M + Ah) <= 2^53 - 1 "
            f"is {limit}",
        ],
    }


def _placement_terms(
    cast: b.Cast, pid: str, regions: dict[str, str], gpus: list[Any], **overrides: Any
) -> PlacementTerms:
    """Terms whose nodes sit in ``regions`` (node id -> region), GPUs or not."""
    from proto.records import NodeSpec

    nodes = [
        NodeSpec(node_id=n, key=cast.node_key(n).public_key, region=r, fabric="nvlink")
        for n, r in sorted(regions.items())
    ]
    return b.make_terms(cast, pid, gpus, WS, WS + HOUR, nodes=nodes, **overrides)


def residency_vectors() -> Any:
    """SPEC §5.1-§5.2: workload, delivery and residency terms (valid and each rule broken,
    folded by a fresh ledger each), then one stream in which a node listed without GPUs
    outside the residency policy sends usage (RESIDENCY, never held, even after a key
    binding), and an amendment that would move a GPU out of the policy (TERMS_INVALID)."""
    from ledger.fold import Fold
    from proto.records import Delivery, Residency, Workload

    cast = _cast()
    workload = Workload(
        workload_class="inference",
        runtime="oci:registry.example/llm-serve:1.4 (containerd, CUDA 12.4)",
        isolation="mig",
        data_access="read-only model weights; prompts stay in eu:de",
    )
    delivery = Delivery(
        operator_of_record="op-1 GmbH",
        support_contact="noc@op-1.example",
        support_hours="24x7",
        acceptance=["ssh access for buyer-1", "nvidia-smi shows the MIG slices"],
        on_reclaim="checkpoint",
    )
    residency = Residency(allowed_regions=["eu:de", "eu:fr"], jurisdictions=["EU"])
    slices = [b.gpu("node-a", 0, share_milli=500), b.gpu("node-a", 1, share_milli=250)]
    whole = [b.gpu("node-a", 0), b.gpu("node-a", 1)]
    inside = {"node-a": "eu:de"}
    full = {"workload": workload, "delivery": delivery, "residency": residency}

    def wl(**changes: Any) -> Workload:
        return msgspec.structs.replace(workload, **changes)

    def dl(**changes: Any) -> Delivery:
        return msgspec.structs.replace(delivery, **changes)

    term_cases: list[tuple[str, PlacementTerms]] = [
        (
            "workload, delivery and residency: valid",
            _placement_terms(cast, "pl-wl-valid", inside, slices, **full),
        ),
        (
            "W1 dedicated with a half GPU",
            _placement_terms(
                cast, "pl-wl-w1", inside, slices, **{**full, "workload": wl(isolation="dedicated")}
            ),
        ),
        (
            "dedicated with whole GPUs: valid",
            _placement_terms(
                cast,
                "pl-wl-dedicated",
                inside,
                whole,
                **{**full, "workload": wl(isolation="dedicated")},
            ),
        ),
        (
            "W2 checkpoint without reclaim notice",
            _placement_terms(cast, "pl-wl-w2", inside, slices, reclaim_notice_ms=0, **full),
        ),
        (
            "terminate without reclaim notice: valid",
            _placement_terms(
                cast,
                "pl-wl-terminate",
                inside,
                slices,
                reclaim_notice_ms=0,
                **{**full, "delivery": dl(on_reclaim="terminate")},
            ),
        ),
        ("W3 mig with a whole GPU", _placement_terms(cast, "pl-wl-w3", inside, whole, **full)),
        (
            "W4 an acceptance requirement twice",
            _placement_terms(
                cast,
                "pl-wl-w4",
                inside,
                slices,
                **{**full, "delivery": dl(acceptance=["ssh", "ssh"])},
            ),
        ),
        (
            "R1 a GPU on a node outside the allowed regions",
            _placement_terms(cast, "pl-wl-r1", {"node-a": "us:east"}, slices, **full),
        ),
        (
            "R1 holds for a node without GPUs outside the regions: valid",
            _placement_terms(
                cast, "pl-wl-gateway", {"node-a": "eu:de", "gw": "us:east"}, slices, **full
            ),
        ),
        (
            "R3 an allowed region twice",
            _placement_terms(
                cast,
                "pl-wl-r3",
                inside,
                slices,
                **{**full, "residency": Residency(allowed_regions=["eu:de", "eu:de"])},
            ),
        ),
        (
            "only residency, no workload or delivery: valid",
            _placement_terms(
                cast,
                "pl-wl-residency-only",
                inside,
                slices,
                residency=Residency(allowed_regions=["eu:de"]),
            ),
        ),
    ]
    terms_out = []
    for name, terms in term_cases:
        raw = b.signed_terms(cast, terms)
        (outcome,) = Fold(cast.ledger).apply(raw, "terms:0", None, WS - HOUR)
        terms_out.append(
            {
                "name": name,
                "envelope_b64": _b64(raw),
                "status": outcome.status,
                "reason": None if outcome.reason is None else outcome.reason.value,
            }
        )
    # One stream: node-a (eu:de, GPUs) and gw (us:east, listed without GPUs).
    pid = "pl-residency"
    terms = _placement_terms(cast, pid, {"node-a": "eu:de", "gw": "us:east"}, slices, **full)
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")
    gw = b.StreamWriter(cast.node_key("gw"), pid, "gw")
    gw_later = b.StreamWriter(cast.node_key("gw"), pid, "gw", seq=1, prev=ZERO_HASH)
    rotated = SigningKey.from_seed_text("gw-2", "vectors/gw-2")
    gw_rotated = b.StreamWriter(rotated, pid, "gw")

    def samples() -> list[Any]:
        return [b.sample(g) for g in terms.gpus]

    moved = b.amendment(
        terms,
        nodes=[
            msgspec.structs.replace(n, region="us:east") if n.node_id == "node-a" else n
            for n in terms.nodes
        ],
    )
    steps_in: list[tuple[str, bytes, int]] = [
        (
            "terms: node-a in eu:de carries the GPUs, gw in us:east none",
            b.signed_terms(cast, terms),
            WS - HOUR,
        ),
        (
            "amendment moving node-a to us:east: TERMS_INVALID (R1)",
            b.signed_terms(cast, moved),
            WS - HOUR + MINUTE,
        ),
        ("node-a, minutes 0-10", a.event(WS, WS + 10 * MINUTE, samples()), WS + 10 * MINUTE),
        ("gw seq 0, no samples: RESIDENCY", gw.event(WS, WS + 10 * MINUTE, []), WS + 10 * MINUTE),
        (
            "gw seq 1: RESIDENCY, not held",
            gw_later.event(WS + 10 * MINUTE, WS + 20 * MINUTE, []),
            WS + 20 * MINUTE,
        ),
        (
            "a new key bound to gw (operator and buyer): accepted",
            b.key_binding(cast, pid, "gw", rotated, WS, WS + HOUR, WS + 20 * MINUTE),
            WS + 20 * MINUTE,
        ),
        (
            "gw under the new key: RESIDENCY",
            gw_rotated.event(WS + 20 * MINUTE, WS + 30 * MINUTE, []),
            WS + 30 * MINUTE,
        ),
        (
            "node-a, minutes 10-40",
            a.event(WS + 10 * MINUTE, WS + 40 * MINUTE, samples()),
            WS + 40 * MINUTE,
        ),
        ("close", b.closed(cast, pid, WS + 2 * HOUR), WS + 2 * HOUR),
    ]
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"residency:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    head = fold.head(pid)
    totals = fold.totals(pid)
    assert head is not None and totals is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "terms": terms_out,
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.structs.asdict(totals),
    }


def resale_vectors() -> Any:
    """SPEC §6.8, §7.10: one stream with an accepted resale and the bad ones (unsigned by
    the desk, a GPU the buyer does not hold, overlapping, a repeated id, behind usage,
    after the close); each record's resale list; the parties' worked figures."""
    from ledger.fold import Fold
    from ledger.statements import make_statement

    cast = _cast()
    terms = _terms(cast)
    pid = terms.placement_id
    b2 = SigningKey.from_seed_text("buyer-2", "vectors/buyer-2")
    b3 = SigningKey.from_seed_text("buyer-3", "vectors/buyer-3")
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")
    nb = b.StreamWriter(cast.node_key("node-b"), pid, "node-b")

    def samples(node: str) -> list[Any]:
        return [b.sample(g) for g in terms.gpus if g.node_id == node]

    def assign(aid: str, buyer: SigningKey, at: int, gpus: list[str], **kw: Any) -> bytes:
        return b.assignment(cast, terms, aid, buyer, at, gpus, 400, **kw)

    m20, end = WS + 20 * MINUTE, WS + HOUR
    close_at = end + terms.late_grace_ms
    sold = ["GPU-node-a-0", "GPU-node-a-1"]
    steps_in: list[tuple[str, bytes, int]] = [
        ("terms", b.signed_terms(cast, terms), WS),
        ("node a, minutes 0-20", a.event(WS, m20, samples("node-a")), m20),
        ("node b, minutes 0-20", nb.event(WS, m20, samples("node-b")), m20),
        (
            "node b, minutes 20-21 (within the skew)",
            nb.event(m20, m20 + MINUTE, samples("node-b")),
            m20,
        ),
        (
            "buyer-1 sells node a's GPUs to buyer-2 from minute 20 at 4.00/GPU-h",
            assign("as-1", b2, m20, sold),
            m20,
        ),
        (
            "not signed by the desk: SIG_MISSING",
            assign("as-2", b3, m20, ["GPU-node-b-0"], signers=[cast.buyer, b3]),
            m20,
        ),
        (
            "a GPU the buyer does not hold: ASSIGNMENT_INVALID",
            assign("as-3", b3, m20, ["GPU-node-b-0", "GPU-node-z-0"]),
            m20,
        ),
        ("GPU-node-a-1 again: ASSIGNMENT_OVERLAP", assign("as-4", b3, m20, ["GPU-node-a-1"]), m20),
        (
            "as-1 again, other content: ASSIGNMENT_DUPLICATE",
            assign("as-1", b3, m20, ["GPU-node-b-0"]),
            m20,
        ),
        (
            "node b folded to minute 21 > h = 20: ASSIGNMENT_BEHIND_USAGE",
            assign("as-5", b3, m20, ["GPU-node-b-0"]),
            m20,
        ),
        ("node a, minutes 20-60", a.event(m20, end, samples("node-a")), end),
        ("node b, minutes 21-60", nb.event(m20 + MINUTE, end, samples("node-b")), end),
        ("close", b.closed(cast, pid, close_at), close_at),
        (
            "a resale after the close: AFTER_CLOSE",
            assign("as-6", b3, WS + 50 * MINUTE, ["GPU-node-b-0"]),
            close_at,
        ),
    ]
    fold = Fold(cast.ledger)
    steps = []
    last: Any = None
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"resale:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
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
                ],
            }
        )
        for o in outcomes:
            if o.record is not None and o.record.kind == "closed":
                last = (o.record, o.record_hash)
    head = fold.head(pid)
    totals = fold.totals(pid)
    assert head is not None and totals is not None and last is not None
    statement = make_statement(last[0], last[1], terms, True, cast.ledger)
    resale = last[0].resale
    sold_net = sum(e.gross_minor - e.fee_minor for e in resale)
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "new_buyers": {"buyer-2": _b64(b2.public_key), "buyer-3": _b64(b3.public_key)},
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.structs.asdict(totals),
        "final_statement_b64": _b64(statement.envelope),
        # SPEC §6.6, §8: the same statement by a simulation's ledger signs its mode.
        "final_statement_sender_b64": _b64(
            make_statement(last[0], last[1], terms, True, cast.ledger, arrival="sender").envelope
        ),
        "parties_minor": {
            "operator_receives": totals.operator_receives_minor,
            "original_buyer_net": totals.buyer_owes_minor - sold_net,
            "new_buyers_owe": {e.new_buyer: e.gross_minor for e in resale},
            "desk_receives": totals.desk_receives_minor + sum(e.fee_minor for e in resale),
        },
        "worked": [
            "D = 2.5 GPU x 60 min = 150 GPU-min; G = 150/60 x 250 = 625; F = 5 % = 31; "
            "buyer-1 owes 625, the operator receives 594, the desk 31",
            "resale D_0 = (1 + 0.5) GPU x 40 min = 60 GPU-min; G_0 = 60/60 x 400 = 400; "
            "F_0 = 5 % of 400 = 20",
            "buyer-2 owes 400 (to the desk); buyer-1 nets 625 - (400 - 20) = 245; "
            "desk 31 + 20 = 51; 245 + 400 - 594 - 51 = 0",
        ],
    }


def resale_release_vectors() -> Any:
    """SPEC §6.7 "With a resale", §6.8 step 3, §7.10: a buyer release that reaches the log at
    minute 10 and ends the placement at e = 40, then an assignment from minute 20 (h < e:
    accepted) and one from minute 40 (h = e: ASSIGNMENT_INVALID); an event spanning e
    counts, for the original terms and for the resale alike, only up to e."""
    from ledger.fold import Fold

    cast = _cast()
    terms = _terms(cast, late_grace_ms=0)
    pid = terms.placement_id
    b2 = SigningKey.from_seed_text("buyer-2", "vectors/buyer-2")
    a = b.StreamWriter(cast.node_key("node-a"), pid, "node-a")

    def samples() -> list[Any]:
        return [b.sample(g) for g in terms.gpus if g.node_id == "node-a"]

    def at(minute: int) -> int:
        return WS + minute * MINUTE

    steps_in: list[tuple[str, bytes, int]] = [
        ("terms", b.signed_terms(cast, terms), WS),
        ("node a, minutes 0-10", a.event(at(0), at(10), samples()), at(10)),
        (
            "buyer release at minute 10, effective at minute 40: e = 40",
            b.release(cast, terms, at(10), at(40), "rel-1"),
            at(10),
        ),
        (
            "GPU-node-a-0 sold to buyer-2 from minute 20 (h = 20 < e): accepted",
            b.assignment(cast, terms, "as-1", b2, at(20), ["GPU-node-a-0"], 400),
            at(12),
        ),
        (
            "GPU-node-a-1 sold from minute 40 (h = e): ASSIGNMENT_INVALID",
            b.assignment(cast, terms, "as-2", b2, at(40), ["GPU-node-a-1"], 400),
            at(12),
        ),
        ("node a, minutes 10-33", a.event(at(10), at(33), samples()), at(33)),
        ("node a, minutes 33-43: counts to e = 40", a.event(at(33), at(43), samples()), at(43)),
        ("close", b.closed(cast, pid, at(60)), at(60)),
    ]
    fold = Fold(cast.ledger)
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"resale-release:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
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
                ],
            }
        )
    head = fold.head(pid)
    totals = fold.totals(pid)
    assert head is not None and totals is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "new_buyers": {"buyer-2": _b64(b2.public_key)},
        "steps": steps,
        "records": head[0],
        "head": head[1],
        "totals": msgspec.structs.asdict(totals),
        "worked": [
            "the release's end e = max(40, arrival 10, usage folded 10) = minute 40",
            "as-1: h = 20 < e, accepted; as-2: h = 40 >= e, ASSIGNMENT_INVALID",
            "resale D_0 = GPU-node-a-0 (1 GPU) x [20, 40) = 20 GPU-min = 1 200 000 000 "
            "milli-GPU-ms (the event 33-43 counts to 40, not 43); "
            "G_0 = 20/60 x 400 = 133.33 -> 133; F_0 = 5 % of 133 = 6.65 -> 6",
            "original D = 1.5 GPU x 40 min = 60 GPU-min; G = 60/60 x 250 = 250",
        ],
    }


def attestation_vectors() -> Any:
    """SPEC §6.9: hardware evidence on key bindings and usage under attestation_required.
    Tokens are EdDSA (deterministic) from a vector attestation service; the fold runs with
    that service as its one root."""
    from ledger.fold import Fold
    from proto.attestation import AttestationRoot, claims_for, evidence_nonce, issue_evidence

    cast = _cast()
    pid = "pl-attest"
    service = SigningKey.from_seed_text("attest", "vectors/attestation-service")
    stranger = SigningKey.from_seed_text("stranger", "vectors/unknown-attestation-service")
    roots = (AttestationRoot("vector-attestation", "EdDSA", service.public_key),)
    gpus = [
        b.gpu(node, i, model="H100-80GB")
        for node, i in (("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-c", 0), ("node-c", 1))
    ]
    terms = b.make_terms(cast, pid, gpus, WS, WS + HOUR, attestation_required=True)
    op, buyer = cast.operator, cast.buyer
    forever = (0, 2**53 - 1)
    other = SigningKey.from_seed_text("node-a-2", "vectors/node-a-2")

    def on(node: str) -> dict[str, str]:
        return {g.uuid: g.model for g in gpus if g.node_id == node}

    def token(
        node: str, key: SigningKey, signer: SigningKey = service, only: Any = None, **changes: Any
    ) -> str:
        claims = claims_for(pid, node, key.public_key, only or on(node), iat=WS // 1000)
        claims.update(changes)
        return issue_evidence(claims, kid="vector-1", ed25519=signer)

    def attest(
        node: str, evidence: str, key: SigningKey | None = None, signers: Any = None
    ) -> bytes:
        key = key or cast.node_key(node)
        return b.key_binding(
            cast, pid, node, key, *forever, WS, signers=signers or [op], evidence=evidence
        )

    def usage(writer: b.StreamWriter, node: str, start: int, uuids: Any = None) -> bytes:
        samples = [
            b.sample(g) for g in gpus if g.node_id == node and (uuids is None or g.uuid in uuids)
        ]
        return writer.event(start, start + 10 * MINUTE, samples)

    ka, kb = cast.node_key("node-a"), cast.node_key("node-b")
    sa = b.StreamWriter(ka, pid, "node-a")
    sb = b.StreamWriter(kb, pid, "node-b")
    sc = b.StreamWriter(cast.node_key("node-c"), pid, "node-c")
    a0 = gpus[0].uuid
    c0 = {gpus[3].uuid: gpus[3].model}
    cases: list[tuple[str, bytes]] = [
        ("terms with attestation_required", b.signed_terms(cast, terms)),
        ("node-b usage before any evidence: NOT_ATTESTED", usage(sb, "node-b", WS)),
        (
            "evidence for another key (hash of the other key)",
            attest("node-a", token("node-a", other), key=ka),
        ),
        (
            "evidence echoing another placement's nonce",
            attest(
                "node-a",
                token("node-a", ka, eat_nonce=evidence_nonce("pl-other", "node-a", ka.public_key)),
            ),
        ),
        (
            "evidence signed by an unknown service",
            attest("node-a", token("node-a", ka, signer=stranger)),
        ),
        (
            "evidence naming a GPU of another node",
            attest("node-a", token("node-a", ka, only={gpus[2].uuid: "H100-80GB"})),
        ),
        ("evidence with another model", attest("node-a", token("node-a", ka, only={a0: "A10"}))),
        ("evidence not a JWS", attest("node-a", "a.b.c")),
        ("evidence, buyer alone", attest("node-a", token("node-a", ka), signers=[buyer])),
        (
            "evidence for node-a GPU 0 only, operator alone",
            attest("node-a", token("node-a", ka, only={a0: "H100-80GB"})),
        ),
        ("node-a usage of GPU 0: attested", usage(sa, "node-a", WS, {a0})),
        (
            "evidence for both node-a GPUs, operator and buyer",
            attest("node-a", token("node-a", ka), signers=[op, buyer]),
        ),
        ("node-a usage of both GPUs: attested", usage(sa, "node-a", WS + 10 * MINUTE)),
        (
            "evidence for node-c GPU 0 only",
            attest("node-c", token("node-c", cast.node_key("node-c"), only=c0)),
        ),
        ("node-c usage of both GPUs: GPU 1 NOT_ATTESTED", usage(sc, "node-c", WS)),
        ("close", b.closed(cast, pid, WS + 2 * HOUR)),
    ]
    fold = Fold(cast.ledger, attestation_roots=roots)
    steps = []
    for i, (name, raw) in enumerate(cases):
        outcomes = fold.apply(raw, f"vector:{i}", None)
        steps.append(
            {
                "name": name,
                "envelope_b64": _b64(raw),
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "attestation_roots": [{"id": r.id, "alg": r.alg, "key": _b64(r.key)} for r in roots],
        "nonce": {
            "placement_id": pid,
            "node_id": "node-a",
            "key": _b64(ka.public_key),
            "eat_nonce": evidence_nonce(pid, "node-a", ka.public_key),
        },
        "steps": steps,
    }


def _timed_steps(
    fold: Any, prefix: str, steps_in: list[tuple[str, bytes, int]]
) -> list[dict[str, Any]]:
    """Apply (note, envelope, arrived_ms) in order; each step with its outcomes."""
    steps = []
    for i, (note, raw, arrived) in enumerate(steps_in):
        outcomes = fold.apply(raw, f"{prefix}:{i}", None, arrived)
        steps.append(
            {
                "note": note,
                "envelope_b64": _b64(raw),
                "arrived_ms": arrived,
                "outcomes": [
                    {
                        "decision": o.decision,
                        "status": o.status,
                        "reason": None if o.reason is None else o.reason.value,
                        "record_hash": o.record_hash,
                    }
                    for o in outcomes
                ],
            }
        )
    return steps


def resale_keys_vectors() -> Any:
    """SPEC §6.3 keybinding, §6.8 (3): one key never both meters usage and is billed as a
    party. A new buyer key that is (or was) bound to a node is ASSIGNMENT_INVALID; a later
    binding of a party's key or of an accepted new buyer's key is BINDING_INVALID."""
    from ledger.fold import Fold

    cast = _cast()
    terms = _terms(cast)
    pid = terms.placement_id
    op = cast.operator
    b2 = SigningKey.from_seed_text("buyer-2", "vectors/buyer-2")
    k2 = SigningKey.from_seed_text("meter-2", "vectors/node-a-second-key")
    node_a = cast.node_key("node-a")
    m = [WS + i * MINUTE for i in range(4)]

    def assign(aid: str, buyer: SigningKey, gpus: list[str]) -> bytes:
        return b.assignment(cast, terms, aid, buyer, m[2], gpus, 400)

    def bind(node: str, key: SigningKey, at: int, **kw: Any) -> bytes:
        return b.key_binding(cast, pid, node, key, WS, WS + HOUR, at, **kw)

    steps_in: list[tuple[str, bytes, int]] = [
        ("terms", b.signed_terms(cast, terms), m[0]),
        ("operator and buyer bind a second key to node a", bind("node-a", k2, m[0]), m[0]),
        (
            "the operator revokes it",
            b.key_binding(cast, pid, "node-a", k2, WS, WS + 30 * MINUTE, m[1], signers=[op]),
            m[1],
        ),
        (
            "a resale to node a's key in the terms: ASSIGNMENT_INVALID",
            assign("as-1", node_a, ["GPU-node-b-0"]),
            m[2],
        ),
        (
            "a resale to the key a binding bound (revoked since): ASSIGNMENT_INVALID",
            assign("as-2", k2, ["GPU-node-b-0"]),
            m[2],
        ),
        ("a resale of node b's GPU to buyer-2", assign("as-3", b2, ["GPU-node-b-0"]), m[2]),
        ("buyer-2's key bound to node b: BINDING_INVALID", bind("node-b", b2, m[3]), m[3]),
        (
            "the buyer's key bound to node a: BINDING_INVALID",
            bind("node-a", cast.buyer, m[3]),
            m[3],
        ),
        ("the desk's key bound to node a: BINDING_INVALID", bind("node-a", cast.desk, m[3]), m[3]),
        (
            "the ledger key bound to node b: BINDING_INVALID",
            bind("node-b", cast.ledger, m[3]),
            m[3],
        ),
        (
            "node b usage signed with buyer-2's key: NODE_KEY_UNKNOWN",
            b.StreamWriter(b2, pid, "node-b").event(
                m[2], m[3], [b.sample(g) for g in terms.gpus if g.node_id == "node-b"]
            ),
            m[3],
        ),
        (
            "the close",
            b.closed(cast, pid, WS + HOUR + terms.late_grace_ms),
            WS + HOUR + terms.late_grace_ms,
        ),
    ]
    fold = Fold(cast.ledger)
    steps = _timed_steps(fold, "resale-keys", steps_in)
    head = fold.head(pid)
    assert head is not None
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "records": head[0],
        "head": head[1],
    }


def evidence_age_vectors() -> Any:
    """SPEC §6.9 (6): a token's iat x 1000 lies in [a - MAX_EVIDENCE_AGE_MS, a +
    MAX_CLOCK_SKEW_MS], a the binding's arrival: both bounds exact and one second past."""
    from ledger.fold import Fold
    from proto.attestation import AttestationRoot, claims_for, issue_evidence
    from proto.limits import MAX_CLOCK_SKEW_MS, MAX_EVIDENCE_AGE_MS

    cast = _cast()
    pid = "pl-evidence-age"
    service = SigningKey.from_seed_text("attest", "vectors/attestation-service")
    roots = (AttestationRoot("vector-attestation", "EdDSA", service.public_key),)
    gpus = [b.gpu("node-a", i, model="H100-80GB") for i in range(2)]
    terms = b.make_terms(cast, pid, gpus, WS, WS + HOUR, attestation_required=True)
    key = cast.node_key("node-a")
    models = {g.uuid: g.model for g in gpus}
    a = WS + 10 * MINUTE  # every binding reaches the log at minute 10

    def attest(iat_ms: int) -> bytes:
        claims = claims_for(pid, "node-a", key.public_key, models, iat=iat_ms // 1000)
        evidence = issue_evidence(claims, kid="vector-1", ed25519=service)
        return b.key_binding(
            cast, pid, "node-a", key, 0, 2**53 - 1, a, signers=[cast.operator], evidence=evidence
        )

    oldest, newest = a - MAX_EVIDENCE_AGE_MS, a + MAX_CLOCK_SKEW_MS
    steps_in: list[tuple[str, bytes, int]] = [
        ("terms with attestation_required", b.signed_terms(cast, terms), WS),
        ("iat 1 s older than MAX_EVIDENCE_AGE_MS: EVIDENCE_INVALID", attest(oldest - 1000), a),
        ("iat exactly MAX_EVIDENCE_AGE_MS before the arrival", attest(oldest), a),
        ("iat exactly MAX_CLOCK_SKEW_MS after the arrival", attest(newest), a),
        ("iat 1 s later than that: EVIDENCE_INVALID", attest(newest + 1000), a),
        (
            "node a usage: attested",
            b.StreamWriter(key, pid, "node-a").event(a, a + MINUTE, [b.sample(g) for g in gpus]),
            a + MINUTE,
        ),
    ]
    fold = Fold(cast.ledger, attestation_roots=roots)
    steps = _timed_steps(fold, "evidence-age", steps_in)
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "attestation_roots": [{"id": r.id, "alg": r.alg, "key": _b64(r.key)} for r in roots],
        "max_evidence_age_ms": MAX_EVIDENCE_AGE_MS,
        "steps": steps,
    }


def attestation_expiry_vectors() -> Any:
    """SPEC §6.9 Expiry: under attestation_required an event is attested only when it ends
    at or before iat x 1000 + MAX_ATTESTATION_VALIDITY_MS. The token is 23 h 30 min old
    when bound, so it expires at minute 30: node-a's event ending exactly then is billed,
    its renewal (a fresh binding that only attests) lets the next event past the old
    expiry be billed; node-b, not renewed, is NOT_ATTESTED for an event ending 1 ms past it.
    """
    from ledger.fold import Fold
    from proto.attestation import AttestationRoot, claims_for, issue_evidence
    from proto.limits import MAX_ATTESTATION_VALIDITY_MS

    cast = _cast()
    pid = "pl-attestation-expiry"
    service = SigningKey.from_seed_text("attest", "vectors/attestation-service")
    roots = (AttestationRoot("vector-attestation", "EdDSA", service.public_key),)
    gpus = [b.gpu(n, 0, model="H100-80GB") for n in ("node-a", "node-b")]
    terms = b.make_terms(cast, pid, gpus, WS, WS + HOUR, attestation_required=True)
    iat = WS + 30 * MINUTE - MAX_ATTESTATION_VALIDITY_MS  # whole seconds
    expiry = iat + MAX_ATTESTATION_VALIDITY_MS

    def attest(node: str, iat_ms: int, arrived: int) -> bytes:
        key = cast.node_key(node)
        models = {g.uuid: g.model for g in gpus if g.node_id == node}
        claims = claims_for(pid, node, key.public_key, models, iat=iat_ms // 1000)
        evidence = issue_evidence(claims, kid="vector-1", ed25519=service)
        return b.key_binding(
            cast, pid, node, key, 0, 2**53 - 1, arrived, signers=[cast.operator], evidence=evidence
        )

    writers = {n: b.StreamWriter(cast.node_key(n), pid, n) for n in ("node-a", "node-b")}

    def usage(node: str, start: int, end: int) -> bytes:
        return writers[node].event(start, end, [b.sample(g) for g in gpus if g.node_id == node])

    renew = expiry - 5 * MINUTE
    steps_in: list[tuple[str, bytes, int]] = [
        ("terms with attestation_required", b.signed_terms(cast, terms), WS),
        ("node-a attested, expiring at minute 30", attest("node-a", iat, WS), WS),
        ("node-b attested, expiring at minute 30", attest("node-b", iat, WS), WS),
        ("node-a usage ending exactly at the expiry", usage("node-a", WS, expiry), expiry),
        (
            "node-b usage ending 1 ms past the expiry: NOT_ATTESTED",
            usage("node-b", WS, expiry + 1),
            expiry + 1,
        ),
        (
            "node-a renewed: a fresh binding that only attests",
            attest("node-a", renew, renew),
            renew,
        ),
        (
            "node-a usage past the old expiry: attested by the renewal",
            usage("node-a", expiry, expiry + 10 * MINUTE),
            expiry + 10 * MINUTE,
        ),
    ]
    fold = Fold(cast.ledger, attestation_roots=roots)
    steps = _timed_steps(fold, "attestation-expiry", steps_in)
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "attestation_roots": [{"id": r.id, "alg": r.alg, "key": _b64(r.key)} for r in roots],
        "max_attestation_validity_ms": MAX_ATTESTATION_VALIDITY_MS,
        "expiry_ms": expiry,
        "steps": steps,
    }


def capacity_vectors() -> Any:
    """SPEC §6.5 in one ordered stream: overselling refused for terms and amendments
    alike, an amendment's claims replacing those of the terms it amends, a reclaim at the
    window's start leaving no claim; every decision and the claims at the end."""
    from ledger.fold import Fold

    cast = _cast()
    early = WS - 2 * HOUR  # terms and amendments reach the log before the windows

    def terms(pid: str, node: str, start: int, end: int, share: int = 1000) -> PlacementTerms:
        return b.make_terms(cast, pid, [b.gpu(node, 0, share_milli=share)], start, end)

    def moved(amended: PlacementTerms, node: str) -> PlacementTerms:
        other = terms(amended.placement_id, node, amended.window_start_ms, amended.window_end_ms)
        return b.amendment(amended, gpus=other.gpus, nodes=other.nodes)

    def shouted(t: PlacementTerms) -> PlacementTerms:  # its GPU uuid in upper case
        gpus = [msgspec.structs.replace(g, uuid=g.uuid.upper()) for g in t.gpus]
        return msgspec.structs.replace(t, gpus=gpus)

    a, bb = terms("pl-cap-a", "node-a", WS, WS + HOUR), terms("pl-cap-b", "node-b", WS, WS + HOUR)
    onto_b = moved(a, "node-b")
    onto_c = moved(a, "node-c")
    notice_at = WS - bb.reclaim_notice_ms
    steps_in: list[tuple[str, bytes, int]] = [
        ("A buys node-a whole for the hour", b.signed_terms(cast, a), early),
        ("B buys node-b whole for the hour", b.signed_terms(cast, bb), early),
        ("A amended onto node-b: OVERSOLD (B holds it)", b.signed_terms(cast, onto_b), early),
        (
            "A amended onto node-c: accepted, node-a no longer A's",
            b.signed_terms(cast, onto_c),
            early,
        ),
        (
            "C buys node-a whole for the hour: accepted (A left it)",
            b.signed_terms(cast, terms("pl-cap-c", "node-a", WS, WS + HOUR)),
            early,
        ),
        (
            "B reclaimed effective at its window's start: B claims nothing",
            b.reclaim(cast, bb, notice_at, WS, "rc-b"),
            notice_at,
        ),
        (
            "D buys node-b over B's start: accepted",
            b.signed_terms(cast, terms("pl-cap-d", "node-b", WS - HOUR // 2, WS + HOUR // 2)),
            notice_at,
        ),
        (
            "E buys half of node-c inside A's hour: OVERSOLD (A holds it whole)",
            b.signed_terms(
                cast, terms("pl-cap-e", "node-c", WS + 10 * MINUTE, WS + 20 * MINUTE, 500)
            ),
            notice_at,
        ),
        (
            "F buys node-d's GPU spelled GPU-NODE-D-0: TERMS_INVALID (§5 (3) canonical uuid)",
            b.signed_terms(cast, shouted(terms("pl-cap-f", "node-d", WS, WS + HOUR))),
            notice_at,
        ),
    ]
    fold = Fold(cast.ledger)
    steps = _timed_steps(fold, "capacity", steps_in)
    return {
        "ledger_public_key": _b64(cast.ledger.public_key),
        "steps": steps,
        "claims": [
            {"uuid": uuid, "placement_id": pid, "start_ms": lo, "end_ms": hi, "share_milli": share}
            for _, uuid, pid, lo, hi, share in fold.capacity_rows()
        ],
    }


def capacity_log_vectors() -> Any:
    """SPEC §6.5 across shards: one capacity partition holding two GPU keys, records of two
    shards interleaved, each signed (by its shard, or forged); the decision on every entry
    and the claims left per key."""
    import hashlib

    from ledger.capacity_log import CapacityFold
    from proto.capacity_log import CapEntry, CapRelease, CapRequest, CapTick, sealed_entry
    from proto.envelope import Envelope
    from proto.limits import MAX_CAPACITY_WAIT_MS

    one_key = SigningKey.from_seed_text("shard-1", "capacity-log shard 1")
    two_key = SigningKey.from_seed_text("shard-2", "capacity-log shard 2")
    outsider = SigningKey.from_seed_text("outsider", "capacity-log outsider")
    one, two = one_key.public_key, two_key.public_key
    signers = {one: one_key, two: two_key, outsider.public_key: outsider}
    x, y = "GPU-x-0", "GPU-y-0"

    def h(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    def req(
        shard: bytes,
        pid: str,
        uuid: str,
        lo: int,
        hi: int,
        share: int = 1000,
        *,
        arrived: int = WS,
        version: str = "1",
        amends: str = "",
    ) -> CapRequest:
        window = (WS + lo * MINUTE, WS + hi * MINUTE)
        supersedes = h(pid + amends) if amends else ZERO_HASH
        return CapRequest(pid, h(pid + version), uuid, share, *window, arrived, shard, supersedes)

    def rel(
        shard: bytes, pid: str, uuid: str, end: int, because: Any, version: str = "1"
    ) -> CapRelease:
        return CapRelease(
            pid, h(pid + version), uuid, WS + end * MINUTE, because, h("record " + pid), shard
        )

    late = WS + MAX_CAPACITY_WAIT_MS
    steps: list[tuple[str, str, int, Any]] = [  # a record, or (record, its signer or None)
        ("shard 1: A whole [0, 60): granted", x, WS, req(one, "pl-a", x, 0, 60)),
        (
            "shard 2: B whole [30, 90), the operator's second desk: OVERSOLD naming A",
            x,
            WS,
            req(two, "pl-b", x, 30, 90),
        ),
        ("shard 2: C whole [60, 120), touching A: granted", x, WS, req(two, "pl-c", x, 60, 120)),
        (
            "shard 1 restarted, publishes A's request again: decided as the first",
            x,
            WS + 1,
            req(one, "pl-a", x, 0, 60),
        ),
        (
            "shard 2: D half [0, 30) inside A: OVERSOLD at 0 naming A",
            x,
            WS,
            req(two, "pl-d", x, 0, 30, 500),
        ),
        ("a tick on the idle key y", y, late, CapTick(y, one)),
        (
            "shard 2: E on y appended MAX_CAPACITY_WAIT_MS after its terms arrived: granted",
            y,
            late,
            req(two, "pl-e", y, 0, 10),
        ),
        (
            "shard 2: F on y appended 1 ms later than that: CAPACITY_LATE",
            y,
            late + 1,
            req(two, "pl-f", y, 20, 30),
        ),
        (
            "shard 2: F2 on y appended before its deadline, after the key's time passed it: "
            "CAPACITY_LATE (the broker's clock stepped back)",
            y,
            WS,
            req(two, "pl-f2", y, 20, 30),
        ),
        (
            "shard 2 releases A's claim (shard 1's): ignored",
            x,
            WS,
            rel(two, "pl-a", x, 0, "rejected"),
        ),
        (
            "shard 2 requests under A's placement id: its claim is another's, OVERSOLD",
            x,
            WS,
            req(two, "pl-a", x, 0, 60, 500, version="2"),
        ),
        (
            "forged: A's release naming shard 1's key, signed by shard 2: invalid",
            x,
            WS,
            (rel(one, "pl-a", x, 0, "rejected"), two_key),
        ),
        (
            "forged: A's release naming shard 1's key, signed by an outsider: invalid",
            x,
            WS,
            (rel(one, "pl-a", x, 0, "rejected"), outsider),
        ),
        (
            "forged: A's release naming shard 1's key, unsigned: invalid",
            x,
            WS,
            (rel(one, "pl-a", x, 0, "rejected"), None),
        ),
        (
            "an outsider's own request, self-signed (its key is no shard's): invalid",
            y,
            late,
            req(outsider.public_key, "pl-o", y, 50, 60, arrived=late),
        ),
        (
            "shard 2: K half [10, 20) beside A: still OVERSOLD (the forged releases freed nothing)",
            x,
            WS,
            req(two, "pl-k2", x, 10, 20, 500),
        ),
        ("shard 1 releases A, reclaimed at 20", x, WS, rel(one, "pl-a", x, 20, "reclaimed")),
        (
            "shard 2: G half [20, 60): granted (A ends at 20)",
            x,
            WS,
            req(two, "pl-g", x, 20, 60, 500),
        ),
        (
            "shard 2: H half [25, 60): granted (G + H = one GPU)",
            x,
            WS,
            req(two, "pl-h", x, 25, 60, 500),
        ),
        (
            "shard 2: I 1 share-milli [40, 50): OVERSOLD at 40 naming G and H",
            x,
            WS,
            req(two, "pl-i", x, 40, 50, 1),
        ),
        (
            "G amended to [20, 40): granted beside G's first claim (the one it amends)",
            x,
            WS,
            req(two, "pl-g", x, 20, 40, 500, version="2", amends="1"),
        ),
        (
            "I published again: still the first decision (denied)",
            x,
            WS,
            req(two, "pl-i", x, 40, 50, 1),
        ),
        (
            "shard 2 releases G's first terms, amended: released (G's amendment stays)",
            x,
            WS,
            rel(two, "pl-g", x, 20, "amended"),
        ),
        (
            "shard 2 releases G's first terms again: ignored (no such claim left)",
            x,
            WS,
            rel(two, "pl-g", x, 20, "amended"),
        ),
        (
            "conflicting terms for C by shard 2 (another hash, amending nothing): OVERSOLD "
            "naming C's own claim",
            x,
            WS,
            req(two, "pl-c", x, 60, 120, version="x"),
        ),
        (
            "shard 2 releases E, its terms rejected: the claim is gone",
            y,
            late,
            rel(two, "pl-e", y, 0, "rejected"),
        ),
        (
            "shard 1: J whole [0, 10) on y: granted (E released)",
            y,
            late,
            req(one, "pl-j", y, 0, 10, arrived=late),
        ),
        (
            "key not canonical (GPU-Y-0): invalid",
            "GPU-Y-0",
            late,
            req(one, "pl-k", "GPU-Y-0", 0, 10, arrived=late),
        ),
        ("uuid not the key: invalid", x, late, req(one, "pl-k", y, 0, 10, arrived=late)),
        ("empty window: invalid", x, late, req(one, "pl-k", x, 10, 10, arrived=late)),
    ]
    fold = CapacityFold((one, two))
    out = []
    for offset, (note, key, log_ms, step) in enumerate(steps):
        record, by = step if isinstance(step, tuple) else (step, signers[step.ledger_key])
        entry = sealed_entry(key, offset, log_ms, record, by) if by else None
        if entry is None:
            unsigned = sealed_entry(key, offset, log_ms, record, one_key).envelope
            entry = CapEntry(key, offset, log_ms, Envelope(unsigned.payload, []))
        decision = fold.apply(entry)
        out.append(
            {
                "note": note,
                "record": msgspec.to_builtins(record),
                "entry": msgspec.to_builtins(entry),
                "decision": msgspec.to_builtins(decision),
            }
        )
    return {
        "max_capacity_wait_ms": MAX_CAPACITY_WAIT_MS,
        "ledger_keys": msgspec.to_builtins([one, two]),
        "steps": out,
        "claims": {key: msgspec.to_builtins(fold.claims(key)) for key in (x, y)},
    }


def _largest_remainder(amount: int, weights: list[tuple[str, int]]) -> dict[str, int]:
    """SPEC §11.3, written here from the text (apart from ``billview/invoice.py``)."""
    total = sum(w for _, w in weights)
    if amount == 0:
        return {k: 0 for k, _ in weights}
    if total == 0:
        first = min(k for k, _ in weights)
        return {k: amount if k == first else 0 for k, _ in weights}
    sign, size = (-1 if amount < 0 else 1), abs(amount)
    parts = {k: size * w // total for k, w in weights}
    ranked = sorted(weights, key=lambda kw: (-(size * kw[1] % total), kw[0]))
    for k, _ in ranked[: size - sum(parts.values())]:
        parts[k] += 1
    return {k: sign * v for k, v in parts.items()}


def finance_vectors() -> Any:
    """SPEC §11 (largest remainder, document numbers) and §12 (a signed profile)."""
    import hashlib

    from proto.profile import PartyProfile, profile_bytes, sign_profile

    splits = [
        (375, [("GPU-a", 3_600_000_000), ("GPU-b", 1_800_000_000)]),
        (100, [("GPU-x", 1), ("GPU-y", 1), ("GPU-z", 1)]),
        (458, [("GPU-n0-0", 3_000_000_000), ("GPU-n0-1", 1_200_000_000),
               ("GPU-n1-0", 2_400_000_000)]),
        (-7, [("GPU-p", 2), ("GPU-q", 1)]),
        (5, [("GPU-b", 0), ("GPU-a", 0)]),
    ]  # fmt: skip
    numbers = []
    for kind, prefix, month, heads in (
        ("invoice", "INV", "2026-01", ["pl-b:0:" + "b" * 64, "pl-a:0:" + "a" * 64]),
        ("credit_note", "CN", "2026-02", ["pl-a:1:" + "c" * 64]),
    ):
        text = "\n".join(["gridledger-invoice/v1", kind, month, "buyer-1", "operator-1",
                          *sorted(heads)])  # fmt: skip
        digest = hashlib.sha256(text.encode()).hexdigest()[:12].upper()
        number = f"{prefix}-{month.replace('-', '')}-{digest}"
        numbers.append({"kind": kind, "month": month, "payer": "buyer-1", "payee": "operator-1",
                        "heads": heads, "number": number})  # fmt: skip
    cast = _cast()
    profile = PartyProfile(
        party_id=cast.operator.name,
        legal_name="Acme GPU Cloud Ltd",
        address=["1 Dock Road", "Dublin", "Ireland"],
        tax_id="IE1234567T",
        net_days=30,
        remit_to="IBAN IE29 AIBK 9311 5212 3456 78",
        issued_at_ms=WS,
    )
    return {
        "splits": [
            {
                "amount_minor": a,
                "weights": [list(w) for w in ws],
                "parts": _largest_remainder(a, ws),
            }
            for a, ws in splits
        ],
        "numbers": numbers,
        "profile": {
            "party_public_key": _b64(cast.operator.public_key),
            "signed_bytes": _b64(profile_bytes(profile)),
            "file_utf8": sign_profile(profile, cast.operator).decode(),
        },
    }


def arrival_bounds_vectors() -> Any:
    """SPEC §6.6 "Bounded from both sides", computed here from the rule's text: a record's
    arrival against the cosigned checkpoints (BACKDATED / POSTDATED), and against a
    party's delivery (the witness's W_TIME window)."""
    skew, lag = 60_000, 60_000
    t = 1_796_083_200  # cosignature times, seconds
    checkpoints = [(3, t), (3, t + 60), (5, t + 120), (8, t + 300)]

    def finding(index: int, arrived: int) -> str | None:
        floors = [at for size, at in checkpoints if size <= index]
        if floors and arrived < max(floors) * 1000 - skew:
            return "BACKDATED"
        ceilings = [at for size, at in checkpoints if size > index]
        if ceilings and arrived > min(ceilings) * 1000 + skew:
            return "POSTDATED"
        return None

    cases = []
    for index, arrived in (
        (2, t * 1000),  # inside every checkpoint, before all cosignatures
        (2, t * 1000 + skew),  # at the earliest ceiling + skew
        (2, t * 1000 + skew + 1),  # 1 ms past it
        (3, (t + 60) * 1000 - skew),  # past size 3: the latest floor - skew
        (3, (t + 60) * 1000 - skew - 1),  # 1 ms before it (the re-cosignature counts)
        (4, (t + 120) * 1000 + skew),  # before size 5's cosignature + skew
        (4, (t + 120) * 1000 + skew + 1),
        (6, (t + 120) * 1000 - skew - 1),  # past size 5, before it - skew
        (9, (t + 300) * 1000 - skew),  # past every checkpoint: a floor only
        (9, (t + 300) * 1000 - skew - 1),
    ):
        cases.append({"index": index, "arrived_ms": arrived, "finding": finding(index, arrived)})
    d = t * 1000
    delivered = []
    for waited, arrived in (
        (d, d - skew),  # earliest: delivered - skew
        (d, d - skew - 1),
        (d, d + lag),  # latest: delivered + lag
        (d, d + lag + 1),
        (d + 600_000, d + 600_000 + lag),  # held for a lower seq delivered 10 min later
        (d + 600_000, d + 600_000 + lag + 1),
    ):
        refused = arrived < d - skew or arrived > max(d, waited) + lag
        delivered.append(
            {"delivered_ms": d, "waited_ms": waited, "arrived_ms": arrived, "refused": refused}
        )
    return {
        "max_clock_skew_ms": skew,
        "max_arrival_lag_ms": lag,
        "checkpoints": [{"size": size, "cosigned_at_s": at} for size, at in checkpoints],
        "cosigned": cases,
        "delivered": delivered,
    }


GENERATORS: dict[str, Callable[[], Any]] = {
    "arrival_bounds.json": arrival_bounds_vectors,
    "attestation_expiry.json": attestation_expiry_vectors,
    "resale_keys.json": resale_keys_vectors,
    "evidence_age.json": evidence_age_vectors,
    "attestation.json": attestation_vectors,
    "residency.json": residency_vectors,
    "health.json": health_vectors,
    "measurement.json": measurement_vectors,
    "time.json": time_vectors,
    "authority.json": authority_vectors,
    "release.json": release_vectors,
    "keys.json": keys_vectors,
    "capacity.json": capacity_vectors,
    "capacity_log.json": capacity_log_vectors,
    "signatures.json": signatures_vectors,
    "records.json": records_vectors,
    "rejections.json": rejections_vectors,
    "merkle.json": merkle_vectors,
    "checkpoint.json": checkpoint_vectors,
    "pricing.json": pricing_vectors,
    "scenario.json": scenario_vectors,
    "resale.json": resale_vectors,
    "resale_release.json": resale_release_vectors,
    "shortens.json": shortens_vectors,
    "rejection_advances.json": rejection_advances_vectors,
    "resume.json": resume_vectors,
    "bounds.json": bounds_vectors,
    "finance.json": finance_vectors,
}


def render() -> dict[str, bytes]:
    """Every vector file's bytes."""
    return {
        name: msgspec.json.format(msgspec.json.encode(make()), indent=1) + b"\n"
        for name, make in GENERATORS.items()
    }


def main() -> int:
    """Write the vectors."""
    VECTORS_DIR.mkdir(exist_ok=True)
    for name, data in render().items():
        (VECTORS_DIR / name).write_bytes(data)
        print(f"wrote {VECTORS_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
