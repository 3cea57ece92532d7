"""Re-deriving the capacity log's grants (SPEC §6.5 "Across shards: the capacity log").

The verifier does not take a shard's word that its terms' claim requests were granted: it
folds the capacity records itself, per GPU key in partition order, and compares. Written
apart from the ledger's fold (``ledger/capacity_log.py``), from SPEC alone:

(1) a record whose key is not a canonical uuid, or whose uuid is not its key, is INVALID;
    so is a request with a share outside 1..1000 or an empty window, and a record that is
    not signed by exactly the ledger key it names, validly, or whose ledger key is not one
    of the shards' ledger keys the verifier was given (the trust policy's);
(2) a request already seen (placement, terms hash, ledger key) is decided as the first;
(3) a request is denied CAPACITY_LATE once the key's time (the latest ``log_ms`` of its
    entries, this one included) passed ``terms_arrived_ms + MAX_CAPACITY_WAIT_MS``;
(4) a request that does not fit beside the granted claims (all but the one of the terms it
    amends) is denied OVERSOLD, naming the claims covering the first moment it does not fit;
(5) else granted: one more claim (the amended terms keep theirs until released);
(6) a release by the requesting ledger key ends the claim of the terms it names; others
    are IGNORED.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Final

from proto.capacity_log import (
    DENIED,
    GRANTED,
    IGNORED,
    INVALID,
    RELEASED,
    TICK,
    CapEntry,
    CapRecord,
    CapRelease,
    CapRequest,
    open_capacity,
)
from proto.envelope import Envelope, check_signatures
from proto.errors import ProtoError
from proto.keys import key_id
from proto.limits import MAX_CAPACITY_WAIT_MS
from verifier.terms_rules import spelled

ONE_GPU: Final = 1000


@dataclass(frozen=True, slots=True)
class Derived:
    """What the verifier derives for one capacity entry."""

    offset: int
    outcome: str
    reason: str | None = None
    at_ms: int | None = None
    collided: tuple[int, ...] = ()
    duplicate_of: int | None = None


@dataclass(frozen=True, slots=True)
class _Claim:
    offset: int
    terms_hash: str
    start_ms: int
    end_ms: int
    share_milli: int


@dataclass
class _Gpu:
    # (placement_id, ledger_key, terms_hash) -> its granted claim on this GPU
    held: dict[tuple[str, bytes, str], _Claim] = field(default_factory=dict)
    seen: dict[tuple[str, str, bytes], Derived] = field(default_factory=dict)
    clock_ms: int = 0  # the log's latest time on this GPU's key, this entry included


def derive(entries: Iterable[CapEntry], ledger_keys: Iterable[bytes]) -> list[Derived]:
    """The decision on each entry, in the order given (one partition's order), records
    counting only when signed by one of ``ledger_keys``."""
    gpus: dict[str, _Gpu] = {}
    known = frozenset(ledger_keys)
    return [_one(gpus, known, e) for e in entries]


def record_of(envelope: Envelope, known: frozenset[bytes]) -> CapRecord | None:
    """(1) The record, when one known ledger key signed it, the one it names, and no other."""
    try:
        r = open_capacity(envelope)
    except ProtoError:
        return None
    if r.ledger_key not in known:
        return None
    report = check_signatures(envelope, {key_id(r.ledger_key): r.ledger_key})
    return r if report.failure() is None else None


def _one(gpus: dict[str, _Gpu], known: frozenset[bytes], e: CapEntry) -> Derived:
    if spelled(e.key) != e.key:  # (1)
        return Derived(e.offset, INVALID)
    gpu = gpus.setdefault(e.key, _Gpu())
    gpu.clock_ms = max(gpu.clock_ms, e.log_ms)  # (3) any entry of the key moves its time
    r = record_of(e.envelope, known)
    if r is None or r.uuid != e.key:  # (1)
        return Derived(e.offset, INVALID)
    if isinstance(r, CapRequest):
        if r.start_ms >= r.end_ms or not 0 < r.share_milli <= ONE_GPU:  # (1)
            return Derived(e.offset, INVALID)
        seen = gpu.seen.get((r.placement_id, r.terms_hash, r.ledger_key))
        if seen is not None:  # (2)
            return replace(seen, offset=e.offset, duplicate_of=seen.offset)
        result = _judge(gpu, e, r)
        gpu.seen[(r.placement_id, r.terms_hash, r.ledger_key)] = result
        return result
    if isinstance(r, CapRelease):
        return _release(gpu, e, r)
    return Derived(e.offset, TICK)


def _judge(gpu: _Gpu, e: CapEntry, r: CapRequest) -> Derived:
    if gpu.clock_ms - r.terms_arrived_ms > MAX_CAPACITY_WAIT_MS:  # (3)
        return Derived(e.offset, DENIED, "CAPACITY_LATE")
    others = {
        k: c for k, c in gpu.held.items() if k != (r.placement_id, r.ledger_key, r.supersedes)
    }
    # (4) a sweep over the window: shares in use change at starts (+) and ends (-) only
    changes: dict[int, int] = {r.start_ms: 0}
    for c in others.values():
        if c.end_ms <= r.start_ms or c.start_ms >= r.end_ms:
            continue
        changes[max(c.start_ms, r.start_ms)] = changes.get(max(c.start_ms, r.start_ms), 0) + (
            c.share_milli
        )
        if c.end_ms < r.end_ms:
            changes[c.end_ms] = changes.get(c.end_ms, 0) - c.share_milli
    used = 0
    for at in sorted(changes):
        used += changes[at]
        if used + r.share_milli > ONE_GPU:
            hit = sorted(c.offset for c in others.values() if c.start_ms <= at < c.end_ms)
            return Derived(e.offset, DENIED, "OVERSOLD", at, tuple(hit))
    gpu.held[(r.placement_id, r.ledger_key, r.terms_hash)] = _Claim(  # (5)
        e.offset, r.terms_hash, r.start_ms, r.end_ms, r.share_milli
    )
    return Derived(e.offset, GRANTED)


def _release(gpu: _Gpu, e: CapEntry, r: CapRelease) -> Derived:
    key = (r.placement_id, r.ledger_key, r.terms_hash)
    claim = gpu.held.get(key)
    if claim is None:  # (6)
        return Derived(e.offset, IGNORED)
    end = min(claim.end_ms, r.end_ms)
    if end <= claim.start_ms:
        del gpu.held[key]
    else:
        gpu.held[key] = replace(claim, end_ms=end)
    return Derived(e.offset, RELEASED)


def decisions_for_terms(
    entries: Iterable[CapEntry],
    placement_id: str,
    terms_hash: str,
    ledger_key: bytes,
    ledger_keys: Iterable[bytes],
) -> dict[str, Derived]:
    """Per GPU key, the derived decision on the first request of these terms (its later
    copies are decided the same, (2)); a key missing from the result holds no request.
    The terms were rightly accepted only when every GPU of theirs is here and GRANTED."""
    found: dict[str, Derived] = {}
    listed = list(entries)
    known = frozenset(ledger_keys)
    for entry, derived in zip(listed, derive(listed, known), strict=True):
        r = record_of(entry.envelope, known)
        if (
            isinstance(r, CapRequest)
            and (r.placement_id, r.terms_hash, r.ledger_key)
            == (placement_id, terms_hash, ledger_key)
            and entry.key not in found
            and derived.outcome != INVALID
        ):
            found[entry.key] = derived
    return found
