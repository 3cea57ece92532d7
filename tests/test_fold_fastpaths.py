"""The ledger's cheaper per-input paths (bench/fold_micro.py) give the same
bytes and decisions as the general ones they stand in for."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devtools import builders as b
from ledger import health
from ledger.crypto import seal_record
from ledger.fold import Fold, Outcome
from ledger.store import Batch, StateRow, Store
from proto.envelope import Envelope, encode_envelope, open_envelope, seal
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.reasons import Reason

WS = 1_767_225_600_000
MINUTE = 60_000


@pytest.mark.parametrize("size", [1, 2, 3, 4, 100, 451, 452, 453, 4096])
def test_unsigned_record_envelope_is_the_canonical_encoding(size: int) -> None:
    payload = bytes((7 * i + size) % 256 for i in range(size))
    assert seal_record(payload) == encode_envelope(Envelope(payload=payload, signatures=[]))


def _summary(outcomes: list[Outcome]) -> list[tuple[object, ...]]:
    return [
        (o.position, o.decision, o.status, o.reason, o.record_hash, o.record_envelope)
        for o in outcomes
    ]


def test_terms_and_events_in_one_batch_fold_as_one_at_a_time() -> None:
    """Usage checked ahead with the key the batch's terms name (a good one, one signed by
    another key, one with a broken signature) ends exactly as folded inline."""
    cast = b.make_cast("fastpaths")
    g = b.gpu("fp-node", 0)
    terms = b.make_terms(cast, "fp-1", [g], WS, WS + 60 * MINUTE)
    good = b.StreamWriter(cast.node_key(g.node_id), "fp-1", g.node_id)
    items = [(b.signed_terms(cast, terms), "t:0:0", "fp-1", WS)]
    for i in range(4):
        start = WS + i * MINUTE
        items.append(
            (
                good.event(start, start + MINUTE, [b.sample(g)]),
                f"t:0:{i + 1}",
                "fp-1",
                start + MINUTE,
            )
        )
    stranger = b.StreamWriter(
        SigningKey.from_seed_text("x", "stranger"), "fp-1", g.node_id, seq=4, prev=good.prev
    )
    start = WS + 4 * MINUTE
    items.append(
        (stranger.event(start, start + MINUTE, [b.sample(g)]), "t:0:5", "fp-1", start + MINUTE)
    )
    broken = bytearray(good.event(start, start + MINUTE, [b.sample(g)]))
    sig_at = broken.rindex(b'"sig":"') + len(b'"sig":"')
    broken[sig_at] = ord("A") if broken[sig_at] != ord("A") else ord("B")
    items.append((bytes(broken), "t:0:6", "fp-1", start + MINUTE))

    inline = Fold(cast.ledger)
    one_by_one = [o for raw, pos, key, at in items for o in inline.apply(raw, pos, key, at)]
    with ThreadPoolExecutor(2) as pool:
        batched = Fold(cast.ledger).apply_batch(items, pool)
    assert _summary(batched) == _summary(one_by_one)
    statuses = [(o.status, o.reason) for o in batched]
    assert statuses[:5] == [("accepted", None)] * 5
    assert statuses[5] == ("rejected", Reason.NODE_KEY_UNKNOWN)
    assert statuses[6] == ("rejected", Reason.SIG_INVALID)


def test_envelope_signature_order_and_duplicates_keep_their_reasons() -> None:
    cast = b.make_cast("fastpaths-env")
    g = b.gpu("fp-node", 0)
    terms = b.make_terms(cast, "fp-2", [g], WS, WS + 60 * MINUTE)
    raw = b.signed_terms(cast, terms)
    envelope = open_envelope(raw).envelope
    assert len(envelope.signatures) == 3
    swapped = Envelope(
        envelope.payload, [envelope.signatures[1], envelope.signatures[0], envelope.signatures[2]]
    )
    twice = Envelope(envelope.payload, [envelope.signatures[0], *envelope.signatures])
    for bad, reason in ((swapped, Reason.NON_CANONICAL), (twice, Reason.SIG_DUPLICATE)):
        with pytest.raises(ProtoError) as caught:
            open_envelope(encode_envelope(bad))
        assert caught.value.reason == reason
    one = seal(terms, [cast.operator])
    assert open_envelope(one).kind == "terms"
    with pytest.raises(ProtoError) as caught:
        open_envelope(one.replace(b'{"payload"', b'{ "payload"'))
    assert caught.value.reason in (Reason.NON_CANONICAL, Reason.MALFORMED)


def test_retired_after_keeps_the_mapping_unless_a_count_grew() -> None:
    g = b.gpu("fp-node", 0)
    before = {g.uuid: 3}
    assert health.retired_after(before, [b.sample(g, retired_pages=3)]) is before
    assert health.retired_after(before, [b.sample(g)]) is before
    grown = health.retired_after(before, [b.sample(g, retired_pages=5)])
    assert grown == {g.uuid: 5} and before == {g.uuid: 3}
    other = b.gpu("fp-node", 1)
    assert health.retired_after(before, [b.sample(other, retired_pages=1)]) == {
        g.uuid: 3,
        other.uuid: 1,
    }


def test_load_state_answers_for_stored_placements_only(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = Store(path)
    assert store.load_state("fp-a") is None
    batch = Batch(states=[StateRow("fp-a", b"snapshot-a", False, None)])
    store.commit_batch(batch)
    assert store.load_state("fp-a") == b"snapshot-a"
    assert store.load_state("fp-b") is None
    store.close()
    reopened = Store(path)
    assert reopened.load_state("fp-a") == b"snapshot-a"
    assert reopened.load_state("fp-b") is None
    reopened.close()
