"""SPEC §6.5 across shards: the capacity fold, in the ledger and apart in the verifier.

The committed vector (``proto/vectors/capacity_log.json``) is reproduced by both folds;
on random partitions the two folds agree, what they grant never passes one GPU, a fold
read again from offset 0 decides the same, and a shard that crashed and republished its
requests anywhere changes no decision.
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
)
from proto.limits import MAX_CAPACITY_WAIT_MS
from verifier.capacity_log import Derived, derive

VECTOR = Path(__file__).resolve().parent.parent / "proto" / "vectors" / "capacity_log.json"
KEYS = ("GPU-a-0", "GPU-b-0")
SHARDS = (b"\x01" * 32, b"\x02" * 32)
PLACEMENTS = ("p0", "p1", "p2", "p3", "p4")
T0 = 1_767_225_600_000


def _vector() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTOR.read_text())
    return data


def _entries(data: dict[str, Any]) -> list[CapEntry]:
    return [decode_entry(json.dumps(step["entry"]).encode()) for step in data["steps"]]


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
    fold = CapacityFold()
    for entry, step in zip(_entries(data), data["steps"], strict=True):
        got = msgspec.to_builtins(fold.apply(entry))
        assert got == {**step["decision"], "collided": tuple(step["decision"]["collided"])}, step
    for key, claims in data["claims"].items():
        assert json.loads(msgspec.json.encode(fold.claims(key))) == claims


def test_the_verifier_rederives_the_vector_on_its_own() -> None:
    data = _vector()
    derived = derive(_entries(data))
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
        CapEntry("GPU-a-0", 7, T0, desk_one),
        CapEntry("GPU-a-0", 9, T0 + 5, desk_two),
        CapEntry("GPU-a-0", 11, T0 + 6, later),
    ]
    first, second, third = fold_capacity(entries)
    assert first.outcome == GRANTED and third.outcome == GRANTED  # disjoint windows
    assert (second.outcome, second.reason, second.at_ms, second.collided) == (
        DENIED,
        "OVERSOLD",
        T0 + 30_000,
        (7,),
    )


@pytest.mark.parametrize(
    "raw, field",
    [
        (
            b'{"key":"GPU-a-0","offset":-1,"log_ms":0,"record":{"type":"captick","uuid":"x"}}',
            "offset",
        ),
        (b'{"key":"GPU-a-0","offset":0,"log_ms":0,"record":{"type":"capfoo"}}', "type"),
        (
            b'{"key":"GPU-a-0","offset":0,"log_ms":0,"record":{"type":"captick","uuid":"x","y":1}}',
            "y",
        ),
    ],
)
def test_bad_entries_are_refused_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        decode_entry(raw)


# ---- random partitions --------------------------------------------------------------------


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, int, Any]:
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
        record = CapTick(key)
    return key, log_ms, record


def _partition(records: list[tuple[str, int, Any]]) -> list[CapEntry]:
    return [CapEntry(key, n, log_ms, r) for n, (key, log_ms, r) in enumerate(records)]


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
def test_both_folds_agree_and_never_oversell(records: list[tuple[str, int, Any]]) -> None:
    entries = _partition(records)
    fold = CapacityFold()
    decisions = [fold.apply(e) for e in entries]
    assert all(_same(d, v) for d, v in zip(decisions, derive(entries), strict=True))
    _never_oversold(fold)
    assert fold_capacity(entries) == decisions  # read again from offset 0: the same


@settings(max_examples=100, deadline=None)
@given(st.lists(_records(), min_size=1, max_size=30), st.data())
def test_a_republished_request_changes_no_decision(
    records: list[tuple[str, int, Any]], data: st.DataObject
) -> None:
    """A shard killed after publishing republishes on restart: the copy lands anywhere after
    the original, and every other decision stays as it was."""
    requests = [  # valid ones (an INVALID request decides nothing, its copy neither)
        n
        for n, (_, _, r) in enumerate(records)
        if isinstance(r, CapRequest) and r.start_ms < r.end_ms
    ]
    if not requests:
        return
    original = data.draw(st.sampled_from(requests))
    where = data.draw(st.integers(original + 1, len(records)))
    # even offsets for the records, an odd one for the copy: the others keep theirs
    entries = [CapEntry(k, 2 * n, t, r) for n, (k, t, r) in enumerate(records)]
    key, log_ms, record = records[original]
    copy_entry = CapEntry(key, 2 * where - 1, log_ms, record)
    before = fold_capacity(entries)
    after = fold_capacity([*entries[:where], copy_entry, *entries[where:]])
    copy = after.pop(where)
    first = before[original].duplicate_of  # the original may itself be a copy
    assert copy == msgspec.structs.replace(
        before[original],
        offset=2 * where - 1,
        duplicate_of=2 * original if first is None else first,
    )
    assert after == before
