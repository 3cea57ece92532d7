"""The witness (SPEC §8.3): an honest log is cosigned; each way a ledger can cheat on the
log — drop, reorder, cut the tail, close early, rewrite, roll back, sign with another key —
is refused with its code and the evidence that names the input.

The dishonest ledger here holds only the ledger key: it signs whatever chain it likes.
"""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.builders import (
    Cast,
    StreamWriter,
    closed,
    gpu,
    make_cast,
    make_terms,
    reclaim,
    sample,
    signed_terms,
)
from ledger.checkpoints import make_checkpoint
from ledger.pricing import ZERO_TOTALS
from proto import merkle
from proto.canonical import signed_bytes
from proto.cosign import cosignature_of, cosigner_key_id
from proto.delivery import Delivered, append_delivered, delivered_usage, read_delivered
from proto.envelope import open_envelope, seal, sha256_hex
from proto.frontier import Frontier
from proto.note import note_key_hash, parse_note
from proto.records import ZERO_HASH, LedgerRecord, PlacementTerms
from witness.check import Cosigned, Refused, witness
from witness.known import Known, from_delivery_logs
from witness.state import STATE_FORMAT, WitnessState, load_state, store_state

WS = 1_767_225_600_000
MIN = 60_000


class Scene:
    """Terms, ten events of node n1, a close — and a ledger key to chain them at will."""

    def __init__(self) -> None:
        self.cast: Cast = make_cast("witness")
        g = gpu("n1", 0)
        self.terms: PlacementTerms = make_terms(self.cast, "pl-w", [g], WS, WS + 10 * MIN)
        self.terms_raw = signed_terms(self.cast, self.terms)
        writer = StreamWriter(self.cast.node_key("n1"), "pl-w", "n1")
        self.events = [
            writer.event(WS + i * MIN, WS + (i + 1) * MIN, [sample(g)]) for i in range(10)
        ]
        deadline = self.terms.window_end_ms + self.terms.late_grace_ms
        self.close_raw = closed(self.cast, "pl-w", deadline)
        # Each event delivered (acknowledged) right at the end of its interval.
        self.known = [
            _known(delivered_usage(raw, WS + (i + 1) * MIN)) for i, raw in enumerate(self.events)
        ]

    def chain(
        self, inputs: list[tuple[bytes, str, str]], arrived: dict[int, int | None] | None = None
    ) -> list[bytes]:
        """LedgerRecord envelopes for (input, status, reason), unsigned (SPEC §8);
        record i arrived at WS + i minutes (the events right when delivered) unless
        ``arrived`` says otherwise."""
        out, prev = [], ZERO_HASH
        for index, (raw, status, reason) in enumerate(inputs):
            opened = open_envelope(raw)
            record = LedgerRecord(
                placement_id="pl-w",
                index=index,
                prev=prev,
                kind=opened.kind,  # type: ignore[arg-type]
                source=opened.input_hash,
                status=status,  # type: ignore[arg-type]
                reason=reason,
                delivered_mgms=0,
                totals=ZERO_TOTALS,
                arrived_ms=(arrived or {}).get(index, WS + index * MIN),
            )
            prev = sha256_hex(signed_bytes(record))
            out.append(seal(record, []))
        return out

    def honest(self, arrived: dict[int, int | None] | None = None) -> list[bytes]:
        ok = [(self.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in self.events]
        return self.chain([*ok, (self.close_raw, "accepted", "")], arrived)

    def note(self, records: list[bytes], key: object | None = None) -> str:
        payloads = [open_envelope(r).payload for r in records]
        return make_checkpoint("pl-w", payloads, key or self.cast.ledger).text()  # type: ignore[arg-type]

    def run(
        self,
        state: WitnessState,
        records: list[bytes],
        note: str | None = None,
        now_s: int | None = None,
    ) -> object:
        """The operator's witness over ``records``, by default one second after the last
        of them arrived (a witness runs while the log grows: SPEC §8.3 owes it nothing
        delivered later)."""
        if now_s is None:
            now_s = last_arrival_s(records) + 1
        return witness(
            state,
            self.terms,
            parse_note(note or self.note(records)),
            records[state.size :],
            self.known,
            name=self.cast.operator.name,
            key=self.cast.operator,
            now_s=now_s,
        )


def last_arrival_s(records: list[bytes]) -> int:
    """The latest ``arrived_ms`` of ``records``, in seconds."""
    arrivals = [getattr(open_envelope(r).record, "arrived_ms", None) or 0 for r in records]
    return max(arrivals, default=0) // 1000


def _known(line: Delivered) -> Known:
    return Known(line.input_hash, line.kind, line.node_id, line.seq, line.delivered_at_ms, "log")


def fresh() -> WitnessState:
    return WitnessState(format=STATE_FORMAT, placement_id="pl-w")


def refused(outcome: object, code: str) -> str:
    assert isinstance(outcome, Refused), f"expected a {code} refusal, got a cosignature"
    assert outcome.refusal.code == code, outcome.refusal.detail
    return outcome.refusal.detail


def test_honest_log_is_cosigned_in_steps_and_the_cosignature_verifies() -> None:
    s = Scene()
    records = s.honest()
    first = s.run(fresh(), records[:4])
    assert isinstance(first, Cosigned)
    assert first.state.size == 4 and first.state.close_index == -1
    second = s.run(first.state, records)
    assert isinstance(second, Cosigned)
    assert second.state.size == len(records) and second.state.close_index == len(records) - 1
    cosig = cosignature_of(second.note, s.cast.operator.name, s.cast.operator.public_key)
    assert cosig is not None and cosig.timestamp_s == last_arrival_s(records) + 1
    # The ledger's own signature is still there, and a cosignature is not a note signature.
    assert second.note.signed_by("gridledger-ledger", s.cast.ledger.public_key)
    assert not second.note.signed_by(s.cast.operator.name, s.cast.operator.public_key)


def test_dropped_middle_event_is_refused_naming_node_seq_and_hash() -> None:
    s = Scene()
    inputs = [(s.terms_raw, "accepted", "")]
    inputs += [(e, "accepted", "") for i, e in enumerate(s.events) if i < 5]
    inputs += [(e, "rejected", "SEQ_GAP") for i, e in enumerate(s.events) if i > 5]
    records = s.chain([*inputs, (s.close_raw, "accepted", "")])
    detail = refused(s.run(fresh(), records), "W_MISSING")
    assert f"node n1 seq 5 input {sha256_hex(s.events[5])}" in detail


def test_dropped_tail_is_refused() -> None:
    s = Scene()
    inputs = [(s.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in s.events[:8]]
    records = s.chain([*inputs, (s.close_raw, "accepted", "")])
    detail = refused(s.run(fresh(), records), "W_MISSING")
    assert "seq 8" in detail and "seq 9" in detail


def test_dropped_tail_is_not_refused_before_the_close() -> None:
    s = Scene()
    inputs = [(s.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in s.events[:8]]
    assert isinstance(s.run(fresh(), s.chain(inputs)), Cosigned)


def test_swapped_events_are_refused() -> None:
    s = Scene()
    order = [0, 1, 2, 3, 4, 6, 5, 7, 8, 9]
    inputs = [(s.terms_raw, "accepted", "")] + [(s.events[i], "accepted", "") for i in order]
    detail = refused(s.run(fresh(), s.chain(inputs)), "W_ORDER")
    assert "seq 6" in detail and "seq 5" in detail


def test_premature_close_is_refused() -> None:
    s = Scene()
    inputs = [(s.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in s.events[:4]]
    inputs.append((s.close_raw, "accepted", ""))
    inputs += [(e, "rejected", "AFTER_CLOSE") for e in s.events[4:]]
    detail = refused(s.run(fresh(), s.chain(inputs)), "W_MISSING")
    assert "after the close" in detail and "seq 4" in detail


def test_event_delivered_after_the_deadline_is_not_owed_before_the_close() -> None:
    s = Scene()
    late = s.terms.window_end_ms + s.terms.late_grace_ms
    s.known[9] = _known(delivered_usage(s.events[9], late))
    inputs = [(s.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in s.events[:9]]
    inputs += [(s.close_raw, "accepted", ""), (s.events[9], "rejected", "AFTER_CLOSE")]
    assert isinstance(s.run(fresh(), s.chain(inputs, {10: late, 11: late})), Cosigned)


def test_rewritten_history_is_inconsistent() -> None:
    s = Scene()
    honest = s.honest()
    first = s.run(fresh(), honest[:5])
    assert isinstance(first, Cosigned)
    # The ledger rewrites record 2 (rejects event 1) and re-chains everything after it.
    inputs = [(s.terms_raw, "accepted", ""), (s.events[0], "accepted", "")]
    inputs += [(s.events[1], "rejected", "INTERVAL_OVERLAP")]
    inputs += [(e, "accepted", "") for e in s.events[2:]] + [(s.close_raw, "accepted", "")]
    detail = refused(s.run(first.state, s.chain(inputs)), "W_INCONSISTENT")
    assert "not an extension" in detail


def test_rollback_and_same_size_fork_are_refused() -> None:
    s = Scene()
    honest = s.honest()
    cosigned = s.run(fresh(), honest[:8])
    assert isinstance(cosigned, Cosigned)
    refused(s.run(cosigned.state, honest[:5], s.note(honest[:5])), "W_ROLLBACK")
    fork = s.chain(
        [(s.terms_raw, "accepted", "")] + [(e, "rejected", "SEQ_GAP") for e in s.events[:7]]
    )
    refused(s.run(cosigned.state, fork, s.note(fork)), "W_INCONSISTENT")


def test_checkpoint_signed_by_another_key_is_refused() -> None:
    s = Scene()
    records = s.honest()
    refused(s.run(fresh(), records, s.note(records, key=s.cast.desk)), "W_SIGNATURE")


def test_record_forged_without_the_ledger_key_is_refused() -> None:
    # SPEC §8: records are unsigned; a record changed after the ledger signed the
    # checkpoint over it no longer gives the signed root.
    s = Scene()
    records = s.honest()
    note = s.note(records)
    record = open_envelope(records[3]).record
    assert isinstance(record, LedgerRecord)
    records[3] = seal(msgspec.structs.replace(record, status="rejected", reason="SEQ_GAP"), [])
    refused(s.run(fresh(), records, note), "W_INCONSISTENT")


def test_record_signatures_are_not_what_the_witness_relies_on() -> None:
    # Records of a version-1 store carry the ledger's signature, or anyone's: the witness
    # cosigns the root over the records' bytes, which no envelope signature changes.
    s = Scene()
    records = s.honest()
    note = s.note(records)
    for i, key in ((2, s.cast.ledger), (3, s.cast.desk)):
        records[i] = seal(open_envelope(records[i]).record, [key])
    assert isinstance(s.run(fresh(), records, note), Cosigned)
    # ...but a record's bytes are checked: one at the wrong index is refused.
    wrong = s.chain([(s.terms_raw, "accepted", ""), (s.events[0], "accepted", "")])
    detail = refused(s.run(fresh(), [wrong[0], wrong[0]]), "W_RECORD")
    assert "record at 1" in detail


def test_state_round_trips_and_rejects_a_damaged_frontier(tmp_path: Path) -> None:
    s = Scene()
    outcome = s.run(fresh(), s.honest())
    assert isinstance(outcome, Cosigned)
    store_state(tmp_path, outcome.state)
    assert load_state(tmp_path, "pl-w") == outcome.state
    path = tmp_path / "pl-w.json"
    path.write_bytes(path.read_bytes().replace(b'"size":12', b'"size":13'))
    with pytest.raises(Exception, match="frontier"):
        load_state(tmp_path, "pl-w")


def test_delivery_log_skips_a_torn_last_line_only(tmp_path: Path) -> None:
    s = Scene()
    log = tmp_path / "DELIVERED.jsonl"
    append_delivered(log, [delivered_usage(e, WS + i) for i, e in enumerate(s.events[:3])])
    with log.open("ab") as f:
        f.write(b'{"delivered_at_ms": 5, "inp')
    assert [d.seq for d in read_delivered(log)] == [0, 1, 2]
    assert len(from_delivery_logs([log], "pl-w")) == 3
    assert from_delivery_logs([log], "pl-other") == []
    log.write_bytes(b"not json\n" + log.read_bytes())
    with pytest.raises(Exception, match="line 1"):
        from_delivery_logs([log], "pl-w")


def test_cosignature_format_is_c2sp_v1() -> None:
    s = Scene()
    outcome = s.run(fresh(), s.honest(), now_s=1_800_000_000)
    assert isinstance(outcome, Cosigned)
    line = next(x for x in outcome.note.signatures if x.name == s.cast.operator.name)
    assert line.key_hash == cosigner_key_id(s.cast.operator.name, s.cast.operator.public_key)
    assert line.key_hash != note_key_hash(s.cast.operator.name, s.cast.operator.public_key)
    assert int.from_bytes(line.signature[:8], "big") == 1_800_000_000
    text = outcome.note.text()
    # Another timestamp under the same signature does not verify.
    blob = base64.b64decode(text.rsplit(" ", 1)[1])
    forged = blob[:4] + (1_800_000_001).to_bytes(8, "big") + blob[12:]
    forged_text = text.rsplit(" ", 1)[0] + " " + base64.b64encode(forged).decode() + "\n"
    note = parse_note(forged_text)
    assert cosignature_of(note, s.cast.operator.name, s.cast.operator.public_key) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=80), st.data())
def test_frontier_root_equals_merkle_root(leaves: list[bytes], data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(leaves)))
    frontier = Frontier.empty().extend(leaves[:cut]).extend(leaves[cut:])
    assert frontier.well_formed()
    assert frontier.root() == merkle.root(leaves)


def test_a_whole_stream_left_out_is_refused_listing_its_events() -> None:
    s = Scene()
    records = s.chain([(s.terms_raw, "accepted", ""), (s.close_raw, "accepted", "")])
    detail = refused(s.run(fresh(), records), "W_MISSING")
    assert "node n1 seq 0" in detail and "(and 5 more)" in detail


def test_the_buyers_witness_refuses_a_log_without_the_reclaim_it_received() -> None:
    s = Scene()
    notice = reclaim(s.cast, s.terms, WS + 4 * MIN, WS + 8 * MIN, "rc-1")
    received = Known(sha256_hex(notice), "reclaim", "", -1, WS + 4 * MIN, "reclaim.json")
    terms_known = Known(sha256_hex(s.terms_raw), "terms", "", -1, WS, "terms.json")
    # The ledger leaves the reclaim out (the buyer's credit for short notice goes with it).
    records = s.honest()
    outcome = witness(
        fresh(),
        s.terms,
        parse_note(s.note(records)),
        records,
        [terms_known, received],
        name=s.cast.buyer.name,
        key=s.cast.buyer,
        now_s=1_800_000_000,
    )
    detail = refused(outcome, "W_MISSING")
    assert f"reclaim input {received.input_hash}" in detail
    # With the reclaim in the log when it was received, the buyer cosigns.
    ok = [(s.terms_raw, "accepted", "")] + [(e, "accepted", "") for e in s.events[:3]]
    ok += [(notice, "accepted", "")] + [(e, "accepted", "") for e in s.events[3:8]]
    ok += [(s.close_raw, "accepted", "")]
    chained = s.chain(ok)
    outcome = witness(
        fresh(),
        s.terms,
        parse_note(s.note(chained)),
        chained,
        [terms_known, received],
        name=s.cast.buyer.name,
        key=s.cast.buyer,
        now_s=1_800_000_000,
    )
    assert isinstance(outcome, Cosigned)


NOW_S = 1_800_000_000


@pytest.mark.parametrize(
    ("arrived", "index"),
    [
        # untimed: a ledger that leaves arrival out escapes no rule by it
        ({3: None}, 3),
        # dated after the witness's own clock + skew (a reclaim's notice would grow)
        ({11: NOW_S * 1000 + 60_001}, 11),
        # dated before the operator delivered the event - skew (event 4, record 5)
        ({5: WS + 5 * MIN - 60_001}, 5),
    ],
    ids=["untimed", "after-own-clock", "before-delivery"],
)
def test_witness_refuses_arrival_outside_its_clock(
    arrived: dict[int, int | None], index: int
) -> None:
    scene = Scene()
    records = scene.honest(arrived)
    outcome = scene.run(fresh(), records, now_s=NOW_S)
    assert isinstance(outcome, Refused)
    assert (outcome.refusal.code, outcome.refusal.index) == ("W_TIME", index)


def test_witness_accepts_arrival_at_the_skew_bounds() -> None:
    scene = Scene()
    records = scene.honest({5: WS + 5 * MIN - 60_000, 6: WS + 6 * MIN, 11: NOW_S * 1000 + 60_000})
    assert isinstance(scene.run(fresh(), records, now_s=NOW_S), Cosigned)
