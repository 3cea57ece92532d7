"""Resource bounds of the wire and the fold: every named limit, exactly at it and one past.

The limits live in ``proto/limits.py`` (and ``proto/terms.py``); BOUNDS.md lists every
limit of the project with the test that shows it. The pattern of each test: an input
exactly at the limit is accepted (decoded, folded, priced); one unit past it is refused
with its named reason (SPEC §4.1 ``OUT_OF_RANGE`` / ``OVERSIZE``, §6 ``TERMS_INVALID``,
``INTERVAL_INVALID``, ``ADJUSTMENT_INVALID``, ``UNKNOWN_PLACEMENT``), never a crash, and
nothing accepted before it is lost or changed.

The last tests keep BOUNDS.md honest: every constant of the limits modules has a row, and
every one is read by the code it claims to bound.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from devtools import builders as b
from devtools.kafka_tls import MAX_SCRAM_USERS, ScramUser, scram_format_args
from ledger.fold import Fold, Outcome
from proto import limits
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import (
    Envelope,
    decode_envelope,
    encode_envelope,
    open_envelope,
    sign_payload,
)
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.reasons import Reason
from proto.records import GpuSpec, NodeSpec, PlacementTerms, UsageEvent
from proto.terms import (
    MAX_CURRENCY_SCALE,
    MAX_TERMS_FILE_BYTES,
    TermsError,
    gross_ceiling_minor,
    load_terms_file,
    total_share_milli,
    validate_terms,
)

ROOT = Path(__file__).resolve().parent.parent
WS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000
MINUTE = 60_000
CAST = b.make_cast("bounds")


# ---- helpers ------------------------------------------------------------------------------


def reason_of(raw: bytes) -> Reason | None:
    """The reason ``open_envelope`` refuses ``raw`` with, or None when it decodes."""
    try:
        open_envelope(raw)
    except ProtoError as exc:
        return exc.reason
    return None


def payload_reason(payload: bytes) -> Reason | None:
    """The reason ``decode_payload`` refuses ``payload`` with, or None when it decodes."""
    try:
        decode_payload(payload)
    except ProtoError as exc:
        return exc.reason
    return None


def terms_for(
    gpus: list[GpuSpec], placement_id: str = "p-bounds", **overrides: Any
) -> PlacementTerms:
    """Terms of CAST over ``gpus`` for one hour (any field overridden)."""
    start = overrides.pop("window_start_ms", WS)
    end = overrides.pop("window_end_ms", start + HOUR)
    return b.make_terms(CAST, placement_id, gpus, start, end, **overrides)


def one_gpu_terms(**overrides: Any) -> PlacementTerms:
    """Terms for one whole GPU on node n0."""
    return terms_for([b.gpu("n0", 0)], **overrides)


class Feeder:
    """A fold of CAST's ledger fed inputs in order, at positions bounds:1, bounds:2, ..."""

    def __init__(self) -> None:
        self.fold = Fold(CAST.ledger)
        self.count = 0

    def feed(self, raw: bytes) -> list[Outcome]:
        """Every outcome of one input."""
        self.count += 1
        return self.fold.apply(raw, f"bounds:{self.count}", None)

    def one(self, raw: bytes) -> Outcome:
        """The single outcome of one input."""
        outcomes = self.feed(raw)
        assert len(outcomes) == 1, outcomes
        return outcomes[0]


def accepted(outcome: Outcome) -> None:
    """The input was chained and folded."""
    assert (outcome.decision, outcome.status) == ("chained", "accepted"), (
        outcome.decision,
        outcome.reason,
        outcome.detail,
    )


def chained_rejected(outcome: Outcome, reason: Reason) -> None:
    """The input was chained as rejected with ``reason``."""
    assert (outcome.decision, outcome.status, outcome.reason) == ("chained", "rejected", reason), (
        outcome.decision,
        outcome.reason,
        outcome.detail,
    )


def quarantined(outcome: Outcome, reason: Reason) -> None:
    """The input was quarantined (not attributable) with ``reason``."""
    assert (outcome.decision, outcome.reason) == ("quarantined", reason), (
        outcome.decision,
        outcome.reason,
        outcome.detail,
    )


def started(terms: PlacementTerms) -> Feeder:
    """A fold whose placement has these (valid) terms accepted."""
    feeder = Feeder()
    accepted(feeder.one(b.signed_terms(CAST, terms)))
    return feeder


def whole_samples(terms: PlacementTerms, node_id: str) -> list[Any]:
    """An allocated, healthy sample of every GPU of the terms on ``node_id``."""
    return [b.sample(g) for g in terms.gpus if g.node_id == node_id]


# ---- envelope and payload sizes (OVERSIZE) ---------------------------------------------------


def test_envelope_of_exactly_max_bytes_is_parsed_one_more_is_oversize() -> None:
    # Junk of exactly the limit gets past the size check and is refused for what it is;
    # one byte more is refused by size, before any parsing.
    assert reason_of(b"x" * limits.MAX_ENVELOPE_BYTES) is Reason.MALFORMED
    assert reason_of(b"x" * (limits.MAX_ENVELOPE_BYTES + 1)) is Reason.OVERSIZE


def test_payload_of_exactly_max_bytes_is_parsed_one_more_is_oversize() -> None:
    prefix = b"gridledger/usage/v1\n"
    at_limit = prefix + b" " * (limits.MAX_PAYLOAD_BYTES - len(prefix))
    assert len(at_limit) == limits.MAX_PAYLOAD_BYTES
    assert payload_reason(at_limit) is Reason.MALFORMED
    assert payload_reason(at_limit + b" ") is Reason.OVERSIZE


def test_an_envelope_cannot_carry_a_payload_at_the_payload_limit() -> None:
    """The base64 of a MAX_PAYLOAD_BYTES payload alone fills MAX_ENVELOPE_BYTES: the
    envelope bound is the one that fires, with the same reason (BOUNDS.md notes it)."""
    body = b"gridledger/usage/v1\n" + b"x" * (limits.MAX_PAYLOAD_BYTES - 20)
    raw = encode_envelope(Envelope(payload=body, signatures=[]))
    assert len(raw) > limits.MAX_ENVELOPE_BYTES
    assert reason_of(raw) is Reason.OVERSIZE


# ---- signatures per envelope -------------------------------------------------------------------


def _usage_payload(terms: PlacementTerms) -> bytes:
    event = UsageEvent(
        placement_id=terms.placement_id,
        node_id="n0",
        seq=0,
        prev="0" * 64,
        start_ms=WS,
        end_ms=WS + MINUTE,
        samples=whole_samples(terms, "n0"),
    )
    return signed_bytes(event)


def test_max_signatures_decode_and_one_more_is_out_of_range() -> None:
    terms = one_gpu_terms()
    payload = _usage_payload(terms)
    keys = [CAST.node_key("n0")] + [
        SigningKey.from_seed_text(f"extra-{i}", f"bounds/extra/{i}")
        for i in range(limits.MAX_SIGNATURES)
    ]
    at_limit = encode_envelope(sign_payload(payload, keys[: limits.MAX_SIGNATURES]))
    past = encode_envelope(sign_payload(payload, keys[: limits.MAX_SIGNATURES + 1]))
    assert len(decode_envelope(at_limit).signatures) == limits.MAX_SIGNATURES
    assert reason_of(past) is Reason.OUT_OF_RANGE
    # In the fold: at the limit the envelope is attributable and rejected for its signers
    # (usage wants exactly one); past it, it does not decode and is quarantined.
    feeder = started(terms)
    quarantined(feeder.one(past), Reason.OUT_OF_RANGE)
    chained_rejected(feeder.one(at_limit), Reason.SIG_SURPLUS)
    # The stream is untouched by both: seq 0 signed by the node alone is accepted.
    accepted(feeder.one(encode_envelope(sign_payload(payload, keys[:1]))))


# ---- list lengths: GPUs, nodes, samples ---------------------------------------------------------


def test_max_gpus_on_max_nodes_are_accepted_one_more_of_either_is_out_of_range() -> None:
    gpus = [b.gpu(f"n{i}", 0) for i in range(limits.MAX_GPUS)]
    assert limits.MAX_GPUS == limits.MAX_NODES
    terms = terms_for(gpus)
    assert len(terms.nodes) == limits.MAX_NODES
    feeder = started(terms)
    assert feeder.fold.terms(terms.placement_id) == terms

    extra_gpu = terms_for([*gpus, b.gpu("n0", 1)], "p-gpus")
    assert len(extra_gpu.gpus) == limits.MAX_GPUS + 1
    assert reason_of(b.signed_terms(CAST, extra_gpu)) is Reason.OUT_OF_RANGE
    # One node more than MAX_NODES (hosting no GPU of its own: a node list past the bound).
    nodes = [*terms.nodes, NodeSpec("n-extra", CAST.node_key("n-extra").public_key, "", "")]
    extra_node = terms_for(gpus, "p-nodes", nodes=nodes)
    assert len(extra_node.nodes) == limits.MAX_NODES + 1
    assert reason_of(b.signed_terms(CAST, extra_node)) is Reason.OUT_OF_RANGE
    quarantined(feeder.one(b.signed_terms(CAST, extra_gpu)), Reason.OUT_OF_RANGE)


def test_max_samples_are_folded_one_more_is_out_of_range() -> None:
    gpus = [b.gpu("n0", i) for i in range(limits.MAX_SAMPLES)]
    terms = terms_for(gpus)
    feeder = started(terms)
    writer = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0")
    samples = whole_samples(terms, "n0")
    assert len(samples) == limits.MAX_SAMPLES
    outcome = feeder.one(writer.event(WS, WS + MINUTE, samples))
    accepted(outcome)
    assert outcome.record is not None
    assert outcome.record.delivered_mgms == limits.MAX_SAMPLES * 1000 * MINUTE
    # One sample more (a GPU repeated: the list length is checked before anything else).
    past = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0", writer.seq, writer.prev)
    raw = past.event(WS + MINUTE, WS + 2 * MINUTE, [*samples, samples[0]])
    assert reason_of(raw) is Reason.OUT_OF_RANGE
    quarantined(feeder.one(raw), Reason.OUT_OF_RANGE)
    totals = feeder.fold.totals(terms.placement_id)
    assert totals is not None and totals.delivered_mgms == limits.MAX_SAMPLES * 1000 * MINUTE


# ---- identifiers and free text -----------------------------------------------------------------


def test_identifier_of_max_chars_is_accepted_one_more_is_out_of_range() -> None:
    longest = "p" + "x" * (limits.MAX_ID_CHARS - 1)
    terms = terms_for([b.gpu("n0", 0)], longest)
    assert len(terms.placement_id) == limits.MAX_ID_CHARS
    started(terms)
    too_long = terms_for([b.gpu("n0", 0)], longest + "x")
    assert reason_of(b.signed_terms(CAST, too_long)) is Reason.OUT_OF_RANGE
    long_uuid = GpuSpec("n0", "G" * limits.MAX_ID_CHARS, "A100-80GB", 1000, 81920)
    assert reason_of(b.signed_terms(CAST, terms_for([long_uuid]))) is None
    longer_uuid = GpuSpec("n0", "G" * (limits.MAX_ID_CHARS + 1), "A100-80GB", 1000, 81920)
    assert reason_of(b.signed_terms(CAST, terms_for([longer_uuid]))) is Reason.OUT_OF_RANGE


def test_text_of_max_characters_is_accepted_one_more_is_out_of_range() -> None:
    # Characters, not bytes: 512 two-byte characters are 1024 bytes and still fit.
    terms = one_gpu_terms()
    feeder = started(terms)
    text = "é" * limits.MAX_TEXT_CHARS
    at_limit = b.adjustment(CAST, terms.placement_id, "adj-1", "credit", 5, WS, reason=text)
    accepted(feeder.one(at_limit))
    past = b.adjustment(CAST, terms.placement_id, "adj-2", "credit", 5, WS, reason=text + "é")
    assert reason_of(past) is Reason.OUT_OF_RANGE
    quarantined(feeder.one(past), Reason.OUT_OF_RANGE)
    totals = feeder.fold.totals(terms.placement_id)
    assert totals is not None and totals.adjustment_credit_minor == 5


# ---- prices, basis points, shares, currency scale -------------------------------------------


def test_max_rate_is_priced_exactly_one_more_is_out_of_range() -> None:
    terms = one_gpu_terms(rate_per_gpu_hour_minor=limits.MAX_RATE_MINOR, increment_ms=1)
    feeder = started(terms)
    writer = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0")
    accepted(feeder.one(writer.event(WS, WS + HOUR, whole_samples(terms, "n0"))))
    totals = feeder.fold.totals(terms.placement_id)
    assert totals is not None
    # One GPU-hour at the top rate: gross equals billable milli-GPU-ms (SPEC §7.7 G <= B).
    assert totals.billable_mgms == limits.MILLI_GPU_MS_PER_GPU_HOUR
    assert totals.gross_minor == limits.MAX_RATE_MINOR == totals.billable_mgms
    past = one_gpu_terms(rate_per_gpu_hour_minor=limits.MAX_RATE_MINOR + 1)
    assert reason_of(b.signed_terms(CAST, past)) is Reason.OUT_OF_RANGE


BPS_FIELDS = (
    "desk_fee_bps",
    "reclaim_penalty_bps",
    "sla_availability_target_bps",
    "sla_credit_bps",
)


@pytest.mark.parametrize("field", BPS_FIELDS)
def test_basis_points_up_to_max_bps_one_more_is_out_of_range(field: str) -> None:
    at_limit = one_gpu_terms(**{field: limits.MAX_BPS})
    assert validate_terms(at_limit) == []
    started(at_limit)
    past = one_gpu_terms(**{field: limits.MAX_BPS + 1})
    assert reason_of(b.signed_terms(CAST, past)) is Reason.OUT_OF_RANGE


@pytest.mark.parametrize(
    ("share", "reason"),
    [
        (1, None),
        (limits.MAX_SHARE_MILLI, None),
        (0, Reason.OUT_OF_RANGE),
        (limits.MAX_SHARE_MILLI + 1, Reason.OUT_OF_RANGE),
    ],
)
def test_share_milli_is_one_to_a_whole_gpu(share: int, reason: Reason | None) -> None:
    terms = terms_for([b.gpu("n0", 0, share_milli=share)])
    assert reason_of(b.signed_terms(CAST, terms)) is reason


def test_currency_scale_up_to_its_max_one_more_is_out_of_range() -> None:
    at_limit = one_gpu_terms(currency_scale=MAX_CURRENCY_SCALE)
    assert validate_terms(at_limit) == []
    started(at_limit)
    past = one_gpu_terms(currency_scale=MAX_CURRENCY_SCALE + 1)
    assert reason_of(b.signed_terms(CAST, past)) is Reason.OUT_OF_RANGE


# ---- windows, intervals, durations ----------------------------------------------------------


def test_window_of_max_ms_is_valid_one_more_is_terms_invalid() -> None:
    at_limit = one_gpu_terms(window_end_ms=WS + limits.MAX_WINDOW_MS)
    assert validate_terms(at_limit) == []
    feeder = started(at_limit)
    assert feeder.fold.close_due_ms(at_limit.placement_id) == (
        WS + limits.MAX_WINDOW_MS + at_limit.late_grace_ms
    )
    past = one_gpu_terms(window_end_ms=WS + limits.MAX_WINDOW_MS + 1)
    assert any("exceeds the limit" in p for p in validate_terms(past))
    chained_rejected(Feeder().one(b.signed_terms(CAST, past)), Reason.TERMS_INVALID)


DURATION_FIELDS = (
    "increment_ms",
    "minimum_duration_ms",
    "reclaim_notice_ms",
    "settlement_period_ms",
    "late_grace_ms",
)


@pytest.mark.parametrize("field", DURATION_FIELDS)
def test_durations_up_to_max_window_ms_one_more_is_out_of_range(field: str) -> None:
    window = {"window_end_ms": WS + limits.MAX_WINDOW_MS}
    at_limit = one_gpu_terms(**window, **{field: limits.MAX_WINDOW_MS})
    assert reason_of(b.signed_terms(CAST, at_limit)) is None
    assert validate_terms(at_limit) == []
    past = one_gpu_terms(**window, **{field: limits.MAX_WINDOW_MS + 1})
    assert reason_of(b.signed_terms(CAST, past)) is Reason.OUT_OF_RANGE


def test_usage_interval_of_max_ms_is_folded_one_more_is_interval_invalid() -> None:
    terms = one_gpu_terms(window_end_ms=WS + 3 * limits.MAX_INTERVAL_MS)
    feeder = started(terms)
    samples = whole_samples(terms, "n0")
    writer = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0")
    accepted(feeder.one(writer.event(WS, WS + limits.MAX_INTERVAL_MS, samples)))
    start = WS + limits.MAX_INTERVAL_MS
    seq, prev = writer.seq, writer.prev
    too_long = writer.event(start, start + limits.MAX_INTERVAL_MS + 1, samples)
    chained_rejected(feeder.one(too_long), Reason.INTERVAL_INVALID)
    # The rejected event took its seq (SPEC §6.3 usage (3)): the node cannot replace it.
    again = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0", seq, prev)
    chained_rejected(
        feeder.one(again.event(start, start + limits.MAX_INTERVAL_MS, samples)),
        Reason.EQUIVOCATION,
    )
    totals = feeder.fold.totals(terms.placement_id)
    assert totals is not None and totals.delivered_mgms == 1000 * limits.MAX_INTERVAL_MS


def _reach(terms: PlacementTerms) -> int:
    window = terms.window_end_ms - terms.window_start_ms
    return total_share_milli(terms) * (window + terms.reclaim_notice_ms) + terms.increment_ms * 1000


def _terms_at_the_reach_bound() -> PlacementTerms:
    """Terms with S * (W + notice) + increment * 1000 == 2^53 - 1 exactly (SPEC §5 rule 5).

    W is the longest window; S, notice and increment are found by a short search (S of
    256 GPUs in thousandths, so S * (W + notice) can reach 2^53 at all).
    """
    top = limits.MAX_SAFE_INTEGER
    window = limits.MAX_WINDOW_MS
    for share in range(limits.MAX_GPUS * limits.MAX_SHARE_MILLI, 0, -1):
        for span in range(top // share, top // share - 2000, -1):
            rest = top - share * span
            notice, increment = span - window, rest // 1000
            if rest % 1000 == 0 and 0 <= notice <= window and 1 <= increment <= window:
                shares = [limits.MAX_SHARE_MILLI] * (limits.MAX_GPUS - 1)
                shares.append(share - sum(shares))
                gpus = [b.gpu(f"n{i % 4}", i, share_milli=s) for i, s in enumerate(shares)]
                return terms_for(
                    gpus,
                    window_end_ms=WS + window,
                    reclaim_notice_ms=notice,
                    increment_ms=increment,
                )
    raise AssertionError("no terms reach 2^53 - 1 exactly")


def test_terms_reaching_exactly_max_safe_integer_are_valid_one_more_ms_is_not() -> None:
    at_limit = _terms_at_the_reach_bound()
    assert _reach(at_limit) == limits.MAX_SAFE_INTEGER
    assert validate_terms(at_limit) == []
    started(at_limit)
    # One millisecond more of reclaim notice carries the reach S past 2^53 - 1.
    past = b.make_terms(
        CAST,
        at_limit.placement_id,
        at_limit.gpus,
        at_limit.window_start_ms,
        at_limit.window_end_ms,
        reclaim_notice_ms=at_limit.reclaim_notice_ms + 1,
        increment_ms=at_limit.increment_ms,
    )
    assert _reach(past) == limits.MAX_SAFE_INTEGER + total_share_milli(past)
    assert any("exceeds 2^53 - 1" in p for p in validate_terms(past))
    chained_rejected(Feeder().one(b.signed_terms(CAST, past)), Reason.TERMS_INVALID)


# ---- integers in signed bytes, adjustments past 2^53 - 1 ------------------------------------


def test_integer_fields_up_to_max_safe_integer_one_more_is_out_of_range() -> None:
    terms = one_gpu_terms()

    def payload(seq: int) -> bytes:
        event = UsageEvent(terms.placement_id, "n0", seq, "0" * 64, WS, WS + 1, [])
        return signed_bytes(event)

    assert payload_reason(payload(limits.MAX_SAFE_INTEGER)) is None
    assert payload_reason(payload(limits.MAX_SAFE_INTEGER + 1)) is Reason.OUT_OF_RANGE


@pytest.mark.parametrize("direction", ["credit", "charge"])
def test_adjustment_carrying_a_total_past_max_safe_integer_is_adjustment_invalid(
    direction: str,
) -> None:
    """SPEC §7.7: a credit up to Ac = 2^53 - 1; a charge up to Ah = 2^53 - 1 - M, M the
    most the window lets the gross reach (fee paid by the operator: P(x) = x), so that
    no later usage carries a total past the bound."""
    terms = one_gpu_terms()
    feeder = started(terms)
    pid = terms.placement_id
    top = limits.MAX_SAFE_INTEGER
    if direction == "charge":
        top -= gross_ceiling_minor(terms)
        too_much = b.adjustment(CAST, pid, "adj-past", direction, top + 1, WS)
        rejected = feeder.one(too_much)
        chained_rejected(rejected, Reason.ADJUSTMENT_INVALID)
        assert rejected.record is not None and rejected.record.totals == feeder.fold.totals(pid)
    accepted(feeder.one(b.adjustment(CAST, pid, "adj-top", direction, top, WS)))
    before = feeder.fold.totals(pid)
    assert before is not None
    column = "adjustment_credit_minor" if direction == "credit" else "adjustment_charge_minor"
    assert getattr(before, column) == top
    outcome = feeder.one(b.adjustment(CAST, pid, "adj-one-more", direction, 1, WS))
    chained_rejected(outcome, Reason.ADJUSTMENT_INVALID)
    # Chained as evidence with the totals as they were: nothing was carried past the bound.
    assert outcome.record is not None and outcome.record.totals == before
    assert feeder.fold.totals(pid) == before
    # An amount past the bound does not even decode.
    past = limits.MAX_SAFE_INTEGER + 1
    assert reason_of(b.adjustment(CAST, pid, "adj-x", direction, past, WS)) is Reason.OUT_OF_RANGE


# ---- inputs held without terms ----------------------------------------------------------------


def _held_events(terms: PlacementTerms, count: int) -> list[bytes]:
    writer = b.StreamWriter(CAST.node_key("n0"), terms.placement_id, "n0")
    samples = whole_samples(terms, "n0")
    return [writer.event(WS + i * MINUTE, WS + (i + 1) * MINUTE, samples) for i in range(count)]


def test_held_inputs_up_to_the_bound_then_unknown_placement_and_none_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fold reads proto.limits.MAX_HELD_PER_PLACEMENT at call time: a small bound here
    # exercises exactly the code path of the real 100 000.
    bound = 5
    monkeypatch.setattr(limits, "MAX_HELD_PER_PLACEMENT", bound)
    terms = one_gpu_terms()
    events = _held_events(terms, bound + 1)
    feeder = Feeder()
    for raw in events[:bound]:
        assert [o.decision for o in feeder.feed(raw)] == ["held"]
    # A re-delivery of a held input at the bound is a duplicate, not a new input.
    assert [o.decision for o in feeder.feed(events[0])] == ["dropped"]
    quarantined(feeder.one(events[bound]), Reason.UNKNOWN_PLACEMENT)
    # A crash now: the held inputs are in the snapshot the store keeps with the batch.
    snapshot = feeder.fold.snapshot(terms.placement_id)
    restored = Feeder()
    restored.fold.restore(terms.placement_id, snapshot)
    outcomes = restored.feed(b.signed_terms(CAST, terms))
    assert [(o.decision, o.status, o.kind) for o in outcomes] == [
        ("chained", "accepted", "terms")
    ] + [("chained", "accepted", "usage")] * bound
    assert [o.input_hash for o in outcomes[1:]] == [
        open_envelope(raw).input_hash for raw in events[:bound]
    ]
    # The quarantined input, delivered again once terms exist, continues the stream.
    accepted(restored.one(events[bound]))
    totals = restored.fold.totals(terms.placement_id)
    assert totals is not None and totals.delivered_mgms == (bound + 1) * 1000 * MINUTE


def test_held_bytes_up_to_the_placement_bound_then_unknown_placement_or_hold_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPEC §6.2: envelope bytes held per placement, before the terms and in a stream hold:
    exactly at the bound they are held, one input more is quarantined (UNKNOWN_PLACEMENT,
    HOLD_FULL), and nothing held is lost."""
    terms = one_gpu_terms()
    events = _held_events(terms, 5)
    size = len(events[0])
    assert {len(raw) for raw in events} == {size}
    # The fold reads the bound at call time: three events' bytes exactly.
    monkeypatch.setattr(limits, "MAX_HELD_BYTES_PER_PLACEMENT", 3 * size)
    feeder = Feeder()
    for raw in events[:3]:
        assert [o.decision for o in feeder.feed(raw)] == ["held"]
    over = feeder.one(events[3])
    quarantined(over, Reason.UNKNOWN_PLACEMENT)
    assert "bytes per placement" in over.detail
    state = feeder.fold.state(terms.placement_id)
    assert state is not None and state.held_bytes() == 3 * size
    outcomes = feeder.feed(b.signed_terms(CAST, terms))
    assert [o.status for o in outcomes] == ["accepted"] * 4  # the terms and the three
    # In the stream hold: seq 0..2 are chained, 3 is missing, then 4 waits alone; with a
    # bound of one event's bytes, one more waiting event is HOLD_FULL.
    monkeypatch.setattr(limits, "MAX_HELD_BYTES_PER_PLACEMENT", size)
    assert [o.decision for o in feeder.feed(events[4])] == ["held"]
    more = _held_events(terms, 6)[5]
    quarantined(feeder.one(more), Reason.HOLD_FULL)
    # Seq 3 fills the gap and releases 4; the quarantined seq 5, sent again, folds.
    assert [o.status for o in feeder.feed(events[3])] == ["accepted", "accepted"]
    accepted(feeder.one(more))
    totals = feeder.fold.totals(terms.placement_id)
    assert totals is not None and totals.delivered_mgms == 6 * 1000 * MINUTE


# ---- terms files ------------------------------------------------------------------------------


def test_terms_file_of_exactly_max_bytes_loads_one_more_is_refused(tmp_path: Path) -> None:
    terms = one_gpu_terms()
    signed = b.signed_terms(CAST, terms)
    # Trailing newlines are allowed after the envelope: pad to exactly the bound.
    padding = MAX_TERMS_FILE_BYTES - len(signed)
    assert padding > 0
    at_limit = tmp_path / "at-limit.json"
    at_limit.write_bytes(signed + b"\n" * padding)
    loaded, envelope = load_terms_file(at_limit)
    assert loaded == terms and envelope is not None
    past = tmp_path / "past.json"
    past.write_bytes(signed + b"\n" * (padding + 1))
    with pytest.raises(TermsError, match=f"larger than {MAX_TERMS_FILE_BYTES} bytes"):
        load_terms_file(past)


# ---- other named limits -----------------------------------------------------------------------


def test_scram_users_of_the_test_broker_up_to_max_scram_users() -> None:
    users = [ScramUser(f"user-{i}", f"secret-{i}") for i in range(MAX_SCRAM_USERS + 1)]
    args = scram_format_args(users[:MAX_SCRAM_USERS])
    assert args.count("--add-scram") == MAX_SCRAM_USERS
    with pytest.raises(ValueError, match=f"limit {MAX_SCRAM_USERS}"):
        scram_format_args(users)


# ---- BOUNDS.md is complete, and every limit is read by the code it bounds ---------------------

LIMIT_MODULES = (
    "proto/limits.py",
    "transport/limits.py",
    "meter/limits.py",
    "ledger/limits.py",
    "verifier/limits.py",
    "gridledger/replay_limits.py",
)
_LIMIT_NAME = re.compile(r"^_?(MAX|MIN)_[A-Z0-9_]+$")
# Named limits outside the limits modules (grep "Final = " for MAX_/MIN_ names).
OTHER_LIMIT_MODULES = (
    "proto/terms.py",
    "proto/note.py",
    "proto/trust.py",
    "meter/durable.py",
    "meter/sim.py",
    "meter/nvml.py",
    "meter/cli.py",
    "verifier/inclusion.py",
    "billview/timeline.py",
    "billview/facts.py",
    "gridledger/trace.py",
    "devtools/kafka_tls.py",
    "proto/httpsig.py",
    "ledger/access.py",
    "ledger/config.py",
)
PACKAGES = (
    "proto",
    "transport",
    "meter",
    "ledger",
    "verifier",
    "billview",
    "gridledger",
    "devtools",
    "witness",
)


def _constants(relative: str, only_limits: bool) -> list[str]:
    """Module-level constants assigned in a file (all, or only MAX_/MIN_ names)."""
    tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        target = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            first = node.targets[0]
            target = first.id if isinstance(first, ast.Name) else None
        if target is None or not target.lstrip("_").isupper():
            continue
        if only_limits and not _LIMIT_NAME.match(target):
            continue
        names.append(target)
    return names


def _all_limits() -> list[tuple[str, str]]:
    found = [(m, n) for m in LIMIT_MODULES for n in _constants(m, only_limits=False)]
    found += [(m, n) for m in OTHER_LIMIT_MODULES for n in _constants(m, only_limits=True)]
    return found


def _bounds_rows() -> dict[str, set[str]]:
    """Constant name -> module paths named in its BOUNDS.md table rows."""
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "BOUNDS.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        rows.setdefault(name, set()).add(cells[1].strip("`"))
    return rows


@pytest.mark.parametrize(("module", "name"), _all_limits(), ids=lambda v: str(v))
def test_every_named_limit_has_a_row_in_bounds_md(module: str, name: str) -> None:
    rows = _bounds_rows()
    assert name in rows, f"BOUNDS.md has no row for {name} ({module})"
    assert module in rows[name], f"BOUNDS.md names {name} in {sorted(rows[name])}, not {module}"


_ABBREVIATIONS = {
    "b": "test_bounds.py",
    "bm": "test_bounds_meter.py",
    "bl": "test_bounds_ledger.py",
    "bv": "test_bounds_verifier.py",
}
_CITED = re.compile(r"`(b|bm|bl|bv|test_[a-z_]+\.py)::(test_[a-z0-9_]+)")


def test_every_test_bounds_md_cites_exists() -> None:
    text = (ROOT / "BOUNDS.md").read_text(encoding="utf-8")
    cited = {(_ABBREVIATIONS.get(f, f), name) for f, name in _CITED.findall(text)}
    assert len(cited) > 50
    missing = [
        f"{f}::{name}"
        for f, name in sorted(cited)
        if not re.search(
            rf"^(async )?def {name}\(", (ROOT / "tests" / f).read_text(encoding="utf-8"), re.M
        )
    ]
    assert missing == []


def _python_files() -> Iterable[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


# Constants kept in a limits module for documentation only: nothing reads them. Each one is
# a known gap in BOUNDS.md (a bound that states a maximum nothing enforces).
DEAD_LIMITS: dict[str, str] = {}


def _limit_cases() -> list[Any]:
    cases = []
    for module, name in _all_limits():
        marks = []
        if name in DEAD_LIMITS:
            marks.append(pytest.mark.xfail(strict=True, reason=DEAD_LIMITS[name]))
        cases.append(pytest.param(module, name, marks=marks, id=f"{module}:{name}"))
    return cases


@pytest.mark.parametrize(("module", "name"), _limit_cases())
def test_every_named_limit_is_read_by_code(module: str, name: str) -> None:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    readers = []
    for path in _python_files():
        text = path.read_text(encoding="utf-8")
        uses = len(pattern.findall(text))
        if path == ROOT / module:
            uses -= 1  # its definition; another mention there is a read (a derived limit)
        if uses > 0:
            readers.append(path.relative_to(ROOT))
    assert readers, f"{module}: nothing reads {name}"


def test_terms_metering_names_at_most_max_holders() -> None:
    # SPEC §5.3: the buyer's workload identities in the terms' metering; MAX_HOLDERS of
    # them decode, one more is refused naming the field.
    import msgspec

    from proto.records import Metering

    def metering(n: int) -> bytes:
        holders = [f"k8s:team-{i}" for i in range(n)]
        return msgspec.json.encode(
            {"xid_table": 2, "idle_billed": True, "holders": holders, "degraded_bps": 10_000}
        )

    at = msgspec.json.decode(metering(limits.MAX_HOLDERS), type=Metering)
    assert len(at.holders) == limits.MAX_HOLDERS
    with pytest.raises(msgspec.ValidationError, match=r"holders"):
        msgspec.json.decode(metering(limits.MAX_HOLDERS + 1), type=Metering)


def test_capacity_ledger_keys_are_at_most_max_capacity_ledger_keys(tmp_path: Path) -> None:
    import base64

    from ledger.config import MAX_CAPACITY_LEDGER_KEYS, ConfigError, config_from_mapping

    base = {"ledger_id": "l", "key_file": "k", "db": "d", "transport": "kafka"}
    key = base64.b64encode(SigningKey.generate("ledger-b").public_key).decode()

    def config(n: int) -> Any:
        kafka = {
            "bootstrap": "127.0.0.1:9",
            "topic": "gl.records",
            "capacity_topic": "gl.cap",
            "capacity_ledger_keys": [key] * n,
        }
        return config_from_mapping({**base, "kafka": kafka}, tmp_path)

    assert len(config(MAX_CAPACITY_LEDGER_KEYS).kafka.capacity_ledger_keys) > 0
    with pytest.raises(ConfigError, match=f"at most {MAX_CAPACITY_LEDGER_KEYS} keys"):
        config(MAX_CAPACITY_LEDGER_KEYS + 1)
