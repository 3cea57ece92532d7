"""Canonical bytes and envelopes: round trips, the RFC 8785 reference, every rejection."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools import builders as b
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import (
    Envelope,
    Signature,
    decode_envelope,
    encode_envelope,
    open_envelope,
    require_signatures,
    seal,
)
from proto.errors import ProtoError
from proto.keys import key_id
from proto.limits import MAX_ENVELOPE_BYTES, MAX_PAYLOAD_BYTES
from proto.reasons import Reason
from proto.records import LedgerRecord, Statement
from proto.terms import party_keys

WS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CAST = b.make_cast("canonical-tests")
GPUS = [b.gpu("node-a", 0), b.gpu("node-a", 1, share_milli=500)]
TERMS = b.make_terms(CAST, "pl-canon", GPUS, WS, WS + 3_600_000)


def every_record() -> list[object]:
    """One record of every kind that travels in an envelope."""
    writer = b.StreamWriter(CAST.node_key("node-a"), "pl-canon", "node-a")
    usage = open_envelope(writer.event(WS, WS + 60_000, [b.sample(g) for g in GPUS])).record
    reclaim = open_envelope(b.reclaim(CAST, TERMS, WS, WS + 600_000, "r1")).record
    adjustment = open_envelope(b.adjustment(CAST, "pl-canon", "a1", "credit", 5, WS)).record
    binding = open_envelope(b.key_binding(CAST, "pl-canon", "node-a", CAST.desk, 0, WS, WS)).record
    closed = open_envelope(b.closed(CAST, "pl-canon", WS + 7_200_000)).record
    from ledger.pricing import ZERO_TOTALS

    record = LedgerRecord(
        placement_id="pl-canon",
        index=0,
        prev="0" * 64,
        kind="terms",
        source="a" * 64,
        status="accepted",
        reason="",
        delivered_mgms=0,
        totals=ZERO_TOTALS,
    )
    statement = Statement(
        placement_id="pl-canon",
        through_index=0,
        head="b" * 64,
        currency="USD",
        currency_scale=2,
        final=False,
        totals=ZERO_TOTALS,
    )
    return [TERMS, usage, reclaim, adjustment, binding, closed, record, statement]


@pytest.mark.parametrize("record", every_record(), ids=lambda r: type(r).__name__)
def test_round_trip_reproduces_bytes_and_matches_rfc8785(record: object) -> None:
    payload = signed_bytes(record)  # type: ignore[arg-type]
    prefix, _, body = payload.partition(b"\n")
    assert prefix.startswith(b"gridledger/") and prefix.endswith(b"/v1")
    assert decode_payload(payload) == record
    assert signed_bytes(decode_payload(payload)) == payload
    # The reference JCS implementation produces the same body.
    assert rfc8785.dumps(json.loads(body)) == body


def test_envelope_round_trip_and_signatures() -> None:
    raw = b.signed_terms(CAST, TERMS)
    opened = open_envelope(raw)
    assert encode_envelope(opened.envelope) == raw
    require_signatures(opened.envelope, party_keys(TERMS))
    keyids = [s.keyid for s in opened.envelope.signatures]
    assert keyids == sorted(keyids) and len(keyids) == 3


def _closed_body(**fields: object) -> bytes:
    data: dict[str, object] = {"closed_at_ms": 5, "placement_id": "p", "type": "closed"}
    data.update(fields)
    return b"gridledger/closed/v1\n" + json.dumps(data, separators=(",", ":")).encode()


REJECTIONS: list[tuple[str, bytes, Reason]] = [
    ("no prefix", b'{"closed_at_ms":5,"placement_id":"p","type":"closed"}', Reason.BAD_PREFIX),
    ("unknown kind", b'gridledger/bogus/v1\n{"type":"bogus"}', Reason.BAD_PREFIX),
    ("wrong version", b"gridledger/closed/v2\n{}", Reason.BAD_PREFIX),
    ("tag differs", _closed_body(type="usage"), Reason.KIND_MISMATCH),
    ("float", _closed_body(closed_at_ms=5.0), Reason.FLOAT),
    (
        "exponent",
        b'gridledger/closed/v1\n{"closed_at_ms":5e0,"placement_id":"p","type":"closed"}',
        Reason.FLOAT,
    ),
    ("unknown field", _closed_body(extra=1), Reason.UNKNOWN_FIELD),
    ("null", _closed_body(placement_id=None), Reason.MALFORMED),
    (
        "missing field",
        b'gridledger/closed/v1\n{"placement_id":"p","type":"closed"}',
        Reason.MALFORMED,
    ),
    ("beyond 2^53", _closed_body(closed_at_ms=2**53), Reason.OUT_OF_RANGE),
    ("negative time", _closed_body(closed_at_ms=-1), Reason.OUT_OF_RANGE),
    ("bad id", _closed_body(placement_id="has space"), Reason.OUT_OF_RANGE),
    (
        "whitespace",
        b'gridledger/closed/v1\n{"closed_at_ms": 5,"placement_id":"p","type":"closed"}',
        Reason.NON_CANONICAL,
    ),
    (
        "key order",
        b'gridledger/closed/v1\n{"placement_id":"p","closed_at_ms":5,"type":"closed"}',
        Reason.NON_CANONICAL,
    ),
    (
        "minus zero",
        b'gridledger/closed/v1\n{"closed_at_ms":-0,"placement_id":"p","type":"closed"}',
        Reason.NON_CANONICAL,
    ),
    (
        "escaped ascii",
        b'gridledger/closed/v1\n{"closed_at_ms":5,"placement_id":"\\u0070","type":"closed"}',
        Reason.NON_CANONICAL,
    ),
    (
        "duplicate key",
        b'gridledger/closed/v1\n{"closed_at_ms":5,"closed_at_ms":5,'
        b'"placement_id":"p","type":"closed"}',
        Reason.DUPLICATE_KEY,
    ),
    ("not json", b"gridledger/closed/v1\n{oops", Reason.MALFORMED),
    (
        "bad utf-8",
        b'gridledger/closed/v1\n{"closed_at_ms":5,"placement_id":"\xff","type":"closed"}',
        Reason.MALFORMED,
    ),
    ("oversize", b"gridledger/closed/v1\n" + b" " * MAX_PAYLOAD_BYTES, Reason.OVERSIZE),
]


@pytest.mark.parametrize(
    ("payload", "reason"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS]
)
def test_payload_rejections(payload: bytes, reason: Reason) -> None:
    with pytest.raises(ProtoError) as caught:
        decode_payload(payload)
    assert caught.value.reason is reason, caught.value.detail


def _envelope_json(payload: bytes, signatures: list[dict[str, str]]) -> bytes:
    return json.dumps(
        {"payload": base64.b64encode(payload).decode(), "signatures": signatures},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


def test_envelope_rejections() -> None:
    raw = b.closed(CAST, "p", 5)
    envelope = decode_envelope(raw)
    sig = {
        "keyid": envelope.signatures[0].keyid,
        "sig": base64.b64encode(envelope.signatures[0].sig).decode(),
    }
    cases: list[tuple[bytes, Reason]] = [
        (b"x" * (MAX_ENVELOPE_BYTES + 1), Reason.OVERSIZE),
        (b"[]", Reason.MALFORMED),
        (b"not json", Reason.MALFORMED),
        (raw[:-1] + b',"x":1}', Reason.UNKNOWN_FIELD),
        (raw.replace(b'{"payload"', b'{ "payload"'), Reason.NON_CANONICAL),
        (_envelope_json(envelope.payload, [sig, sig]), Reason.SIG_DUPLICATE),
    ]
    for data, reason in cases:
        with pytest.raises(ProtoError) as caught:
            decode_envelope(data)
        assert caught.value.reason is reason, (data[:60], caught.value)


def test_signature_order_is_canonical() -> None:
    opened = open_envelope(b.signed_terms(CAST, TERMS))
    reversed_sigs = [
        {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode()}
        for s in reversed(opened.envelope.signatures)
    ]
    with pytest.raises(ProtoError) as caught:
        decode_envelope(_envelope_json(opened.payload, reversed_sigs))
    assert caught.value.reason is Reason.NON_CANONICAL


def test_required_signers_missing_surplus_invalid() -> None:
    payload = signed_bytes(TERMS)
    required = party_keys(TERMS)
    two = seal(TERMS, [CAST.operator, CAST.buyer])
    with pytest.raises(ProtoError) as caught:
        require_signatures(decode_envelope(two), required)
    assert caught.value.reason is Reason.SIG_MISSING
    assert "2/3" in caught.value.detail
    four = seal(TERMS, [CAST.operator, CAST.buyer, CAST.desk, CAST.ledger])
    with pytest.raises(ProtoError) as caught:
        require_signatures(decode_envelope(four), required)
    assert caught.value.reason is Reason.SIG_SURPLUS
    forged = Envelope(
        payload=payload,
        signatures=sorted(
            [
                Signature(keyid=key_id(CAST.operator.public_key), sig=CAST.buyer.sign(payload)),
                Signature(keyid=CAST.buyer.key_id, sig=CAST.buyer.sign(payload)),
                Signature(keyid=CAST.desk.key_id, sig=CAST.desk.sign(payload)),
            ],
            key=lambda s: s.keyid,
        ),
    )
    with pytest.raises(ProtoError) as caught:
        require_signatures(forged, required)
    assert caught.value.reason is Reason.SIG_INVALID


SIGNED_USAGE = b.StreamWriter(CAST.node_key("node-a"), "pl-canon", "node-a").event(
    WS, WS + 60_000, [b.sample(g) for g in GPUS]
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_single_byte_change_of_signed_bytes_is_rejected(data: st.DataObject) -> None:
    opened = open_envelope(SIGNED_USAGE)
    payload = bytearray(opened.payload)
    index = data.draw(st.integers(0, len(payload) - 1), label="index")
    new = data.draw(st.integers(0, 255).filter(lambda v: v != payload[index]), label="byte")
    payload[index] = new
    tampered = encode_envelope(
        Envelope(payload=bytes(payload), signatures=opened.envelope.signatures)
    )
    node_key = {CAST.node_key("node-a").key_id: CAST.node_key("node-a").public_key}
    try:
        reopened = open_envelope(tampered)
    except ProtoError:
        return  # rejected at decoding: fine
    with pytest.raises(ProtoError) as caught:
        require_signatures(reopened.envelope, node_key)
    assert caught.value.reason is Reason.SIG_INVALID


def test_canonical_envelope_bytes_are_json_sorted() -> None:
    raw = b.closed(CAST, "p", 5)
    assert msgspec.json.decode(raw)["signatures"][0]["keyid"] == CAST.ledger.key_id
    assert rfc8785.dumps(json.loads(raw)) == raw
