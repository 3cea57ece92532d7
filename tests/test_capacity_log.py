"""SPEC §6.5 across shards: the capacity fold, in the ledger and apart in the verifier.

The committed vector (``proto/vectors/capacity_log.json``) is reproduced by both folds;
on random partitions (records signed by their shard, by another shard, by an outsider, or
not at all) the two folds agree, what they grant never passes one GPU, a fold read again
from offset 0 decides the same, and a shard that crashed and republished its requests
anywhere changes no decision. A release forged by anyone but the shard that holds the
claim frees nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.capacity_log import CapacityFold, Decision, fold_capacity
from proto.capacity_log import (
    DENIED,
    GRANTED,
    CapEntry,
    CapRelease,
    CapRequest,
    CapTick,
    decode_entry,
    sealed_entry,
)
from proto.envelope import Envelope
from proto.keys import SigningKey
from proto.limits import MAX_CAPACITY_WAIT_MS
from verifier.capacity_log import Derived, derive

VECTOR = Path(__file__).resolve().parent.parent / "proto" / "vectors" / "capacity_log.json"
KEYS = ("GPU-a-0", "GPU-b-0")
SHARD_KEYS = (
    SigningKey.from_seed_text("shard-1", "test capacity shard 1"),
    SigningKey.from_seed_text("shard-2", "test capacity shard 2"),
)
OUTSIDER = SigningKey.from_seed_text("outsider", "test capacity outsider")
SHARDS = tuple(k.public_key for k in SHARD_KEYS)
SIGNERS = {k.public_key: k for k in (*SHARD_KEYS, OUTSIDER)}
PLACEMENTS = ("p0", "p1", "p2", "p3", "p4")
T0 = 1_767_225_600_000


def _vector() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTOR.read_text())
    return data


def _entries(data: dict[str, Any]) -> list[CapEntry]:
    return [decode_entry(json.dumps(step["entry"]).encode()) for step in data["steps"]]


def _ledger_keys(data: dict[str, Any]) -> list[bytes]:
    return [msgspec.convert(k, bytes) for k in data["ledger_keys"]]


def _signed(key: str, offset: int, log_ms: int, record: Any) -> CapEntry:
    return sealed_entry(key, offset, log_ms, record, SIGNERS[record.ledger_key])


def _same(decision: Decision, derived: Derived) -> bool:
    return msgspec.to_builtins(decision) == {
        "offset": derived.offset,
        "outcome": derived.outcome,
        "reason": derived.reason,
        "at_ms": derived.at_ms,
        "collided": derived.collided,
        "duplicate_of": derived.duplicate_of,
    }


def test_the_ledger_fold_reproduces_the_vector() -> None:
    data = _vector()
    assert data["max_capacity_wait_ms"] == MAX_CAPACITY_WAIT_MS
    fold = CapacityFold(_ledger_keys(data))
    for entry, step in zip(_entries(data), data["steps"], strict=True):
        got = msgspec.to_builtins(fold.apply(entry))
        assert got == {**step["decision"], "collided": tuple(step["decision"]["collided"])}, step
    for key, claims in data["claims"].items():
        assert json.loads(msgspec.json.encode(fold.claims(key))) == claims


def test_the_verifier_rederives_the_vector_on_its_own() -> None:
    data = _vector()
    derived = derive(_entries(data), _ledger_keys(data))
    for got, step in zip(derived, data["steps"], strict=True):
        want = step["decision"]
        assert (got.offset, got.outcome, got.reason, got.at_ms) == (
            want["offset"],
            want["outcome"],
            want["reason"],
            want["at_ms"],
        ), step["note"]
        assert list(got.collided) == want["collided"], step["note"]
        assert got.duplicate_of == want["duplicate_of"], step["note"]


def test_the_second_sale_is_denied_naming_the_granted_claim() -> None:
    desk_one = CapRequest("pl-1", "1" * 64, "GPU-a-0", 1000, T0, T0 + 60_000, T0, SHARDS[0])
    desk_two = CapRequest(
        "pl-2", "2" * 64, "GPU-a-0", 1000, T0 + 30_000, T0 + 90_000, T0, SHARDS[1]
    )
    later = CapRequest("pl-3", "3" * 64, "GPU-a-0", 1000, T0 + 60_000, T0 + 90_000, T0, SHARDS[1])
    entries = [
        _signed("GPU-a-0", 7, T0, desk_one),
        _signed("GPU-a-0", 9, T0 + 5, desk_two),
        _signed("GPU-a-0", 11, T0 + 6, later),
    ]
    first, second, third = fold_capacity(entries, SHARDS)
    assert first.outcome == GRANTED and third.outcome == GRANTED  # disjoint windows
    assert (second.outcome, second.reason, second.at_ms, second.collided) == (
        DENIED,
        "OVERSOLD",
        T0 + 30_000,
        (7,),
    )


def test_a_forged_release_frees_nothing() -> None:
    """Anyone who can write to the topic publishes a release of shard 1's claim naming shard
    1's key (the right ``ledger_key`` field) but signed by another key, or by none: both
    folds decide it INVALID, and the GPU stays sold (the next sale is still OVERSOLD)."""
    held = CapRequest("pl-1", "1" * 64, "GPU-a-0", 1000, T0, T0 + 60_000, T0, SHARDS[0])
    release = CapRelease("pl-1", "1" * 64, "GPU-a-0", T0, "rejected", "0" * 64, SHARDS[0])
    second = CapRequest("pl-2", "2" * 64, "GPU-a-0", 1000, T0, T0 + 60_000, T0, SHARDS[1])
    forged = [
        sealed_entry("GPU-a-0", 1, T0, release, SHARD_KEYS[1]),  # another shard signs
        sealed_entry("GPU-a-0", 2, T0, release, OUTSIDER),  # an outsider signs
    ]
    payload = sealed_entry("GPU-a-0", 3, T0, release, SHARD_KEYS[0]).envelope.payload
    forged.append(CapEntry("GPU-a-0", 3, T0, Envelope(payload, [])))  # nobody signs
    both = sorted(
        [
            *sealed_entry("GPU-a-0", 4, T0, release, SHARD_KEYS[0]).envelope.signatures,
            *forged[1].envelope.signatures,
        ],
        key=lambda s: s.keyid,
    )
    forged.append(CapEntry("GPU-a-0", 4, T0, Envelope(payload, both)))  # a surplus signer
    entries = [
        _signed("GPU-a-0", 0, T0, held),
        *forged,
        _signed("GPU-a-0", 9, T0, second),
    ]
    decisions = fold_capacity(entries, SHARDS)
    derived = derive(entries, SHARDS)
    assert [d.outcome for d in decisions[1:-1]] == ["INVALID"] * len(forged)
    assert (decisions[-1].outcome, decisions[-1].reason, decisions[-1].collided) == (
        DENIED,
        "OVERSOLD",
        (0,),
    )
    assert all(_same(d, v) for d, v in zip(decisions, derived, strict=True))
    # shard 1's own release, signed by shard 1, does free it
    real = _signed("GPU-a-0", 8, T0, release)
    freed = fold_capacity([entries[0], real, entries[-1]], SHARDS)
    assert [d.outcome for d in freed] == [GRANTED, "RELEASED", GRANTED]


def test_a_request_by_a_key_the_fold_does_not_know_claims_nothing() -> None:
    outsider = CapRequest(
        "pl-o", "9" * 64, "GPU-a-0", 1000, T0, T0 + 60_000, T0, OUTSIDER.public_key
    )
    honest = CapRequest("pl-1", "1" * 64, "GPU-a-0", 1000, T0, T0 + 60_000, T0, SHARDS[0])
    entries = [_signed("GPU-a-0", 0, T0, outsider), _signed("GPU-a-0", 1, T0, honest)]
    assert [d.outcome for d in fold_capacity(entries, SHARDS)] == ["INVALID", GRANTED]
    assert [d.outcome for d in derive(entries, SHARDS)] == ["INVALID", GRANTED]


@pytest.mark.parametrize(
    "raw, field",
    [
        (
            b'{"key":"GPU-a-0","offset":-1,"log_ms":0,"envelope":{"payload":"eA==","signatures":[]}}',
            "offset",
        ),
        (b'{"key":"GPU-a-0","offset":0,"log_ms":0,"envelope":{"payload":"eA=="}}', "signatures"),
        (
            b'{"key":"GPU-a-0","offset":0,"log_ms":0,"record":{"type":"captick","uuid":"x"}}',
            "record",
        ),
    ],
)
def test_bad_entries_are_refused_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        decode_entry(raw)


# ---- random partitions --------------------------------------------------------------------


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, int, Any, SigningKey | None]:
    key = draw(st.sampled_from(KEYS))
    pid = draw(st.sampled_from(PLACEMENTS))
    shard = draw(st.sampled_from(SHARDS))
    version = draw(st.sampled_from("12"))
    terms_hash = (version * 64)[:64]
    lo = draw(st.integers(0, 8)) * 10_000
    kind = draw(st.sampled_from(("req", "req", "req", "rel", "tick")))
    log_ms = T0 + draw(st.sampled_from((0, MAX_CAPACITY_WAIT_MS, MAX_CAPACITY_WAIT_MS + 1)))
    record: Any
    if kind == "req":
        hi = lo + draw(st.integers(0, 5)) * 10_000
        share = draw(st.sampled_from((1, 250, 500, 501, 1000)))
        amends = draw(st.sampled_from(("0", "1", "2")))  # "0": first terms
        supersedes = (amends * 64)[:64]
        record = CapRequest(pid, terms_hash, key, share, T0 + lo, T0 + hi, T0, shard, supersedes)
    elif kind == "rel":
        because = draw(st.sampled_from(("rejected", "reclaimed", "amended")))
        record = CapRelease(pid, terms_hash, key, T0 + lo, because, "0" * 64, shard)
    else:
        record = CapTick(key, shard)
    # mostly its own shard; sometimes forged by the other shard, an outsider, or nobody
    signer = draw(st.sampled_from(("own",) * 6 + ("other", "outsider", "none")))
    by = {
        "own": SIGNERS[shard],
        "other": SIGNERS[SHARDS[1 - SHARDS.index(shard)]],
        "outsider": OUTSIDER,
        "none": None,
    }[signer]
    return key, log_ms, record, by


def _entry(key: str, offset: int, log_ms: int, record: Any, by: SigningKey | None) -> CapEntry:
    if by is None:
        payload = sealed_entry(key, offset, log_ms, record, OUTSIDER).envelope.payload
        return CapEntry(key, offset, log_ms, Envelope(payload, []))
    return sealed_entry(key, offset, log_ms, record, by)


Drawn = tuple[str, int, Any, SigningKey | None]


def _partition(records: list[Drawn]) -> list[CapEntry]:
    return [_entry(key, n, log_ms, r, by) for n, (key, log_ms, r, by) in enumerate(records)]


def _never_oversold(fold: CapacityFold) -> None:
    """At every moment, the largest claim of each (placement, ledger key) — its terms and
    the terms they amend stand together until a release — adds up to at most one GPU."""
    for key in KEYS:
        claims = fold.claims(key)
        for at in {c.start_ms for c in claims}:
            largest: dict[tuple[str, bytes], int] = {}
            for c in claims:
                if c.start_ms <= at < c.end_ms:
                    owner = (c.placement_id, c.ledger_key)
                    largest[owner] = max(largest.get(owner, 0), c.share_milli)
            assert sum(largest.values()) <= 1000, (key, at, claims)


@settings(max_examples=150, deadline=None)
@given(st.lists(_records(), max_size=40))
def test_both_folds_agree_and_never_oversell(records: list[Drawn]) -> None:
    entries = _partition(records)
    fold = CapacityFold(SHARDS)
    decisions = [fold.apply(e) for e in entries]
    assert all(_same(d, v) for d, v in zip(decisions, derive(entries, SHARDS), strict=True))
    _never_oversold(fold)
    assert fold_capacity(entries, SHARDS) == decisions  # read again from offset 0: the same
    # a record not signed by the shard it names decides nothing but the key's time
    for (_, _, record, by), decision in zip(records, decisions, strict=True):
        if by is None or by.public_key != record.ledger_key:
            assert decision.outcome == "INVALID"


@settings(max_examples=100, deadline=None)
@given(st.lists(_records(), min_size=1, max_size=30), st.data())
def test_a_republished_request_changes_no_decision(
    records: list[Drawn], data: st.DataObject
) -> None:
    """A shard killed after publishing republishes on restart: the copy lands anywhere after
    the original, and every other decision stays as it was."""
    requests = [  # valid ones (an INVALID request decides nothing, its copy neither)
        n
        for n, (_, _, r, by) in enumerate(records)
        if isinstance(r, CapRequest)
        and r.start_ms < r.end_ms
        and by is not None
        and by.public_key == r.ledger_key
    ]
    if not requests:
        return
    original = data.draw(st.sampled_from(requests))
    where = data.draw(st.integers(original + 1, len(records)))
    # even offsets for the records, an odd one for the copy: the others keep theirs
    entries = [_entry(k, 2 * n, t, r, by) for n, (k, t, r, by) in enumerate(records)]
    key, log_ms, record, by = records[original]
    copy_entry = _entry(key, 2 * where - 1, log_ms, record, by)
    before = fold_capacity(entries, SHARDS)
    after = fold_capacity([*entries[:where], copy_entry, *entries[where:]], SHARDS)
    copy = after.pop(where)
    first = before[original].duplicate_of  # the original may itself be a copy
    assert copy == msgspec.structs.replace(
        before[original],
        offset=2 * where - 1,
        duplicate_of=2 * original if first is None else first,
    )
    assert after == before
