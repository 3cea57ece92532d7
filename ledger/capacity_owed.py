"""Releases a shard still owes the capacity log, derived at start (SPEC §6.5, rule 6).

A shard publishes the releases a batch's decisions owe once that batch is committed. A
shard killed between the commit and the publication leaves claims in the log that its
store no longer stands behind. At start, after the capacity topic is folded to its end,
``owed_releases`` compares the two: every claim the log holds for this shard's ledger key
whose terms the store committed

* rejected (every input with that record hash rejected): owed ``rejected``, end 0;
* accepted, then amended by later accepted terms of the placement: owed ``amended``,
  end 0, justified by the amending terms' record;
* accepted and in force, with an accepted reclaim naming the GPU effective before the
  claim's end: owed ``reclaimed`` at the earliest such ``effective_at_ms``.

Claims whose terms the store does not hold (not yet committed, or another shard's of the
same ledger) are left alone: the batch that decides them is refolded and owes its own.
Publishing twice is harmless (the second release of a claim is IGNORED, or ends it where
it already ends), and once the fold reads the releases nothing is owed: idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from ledger.capacity_gate import KafkaCapacityLog
from ledger.capacity_log import Granted, PendingRelease
from ledger.store import Store
from proto.canonical import decode_kind_payload
from proto.errors import ProtoError
from proto.records import ReclaimNotice
from proto.terms import canonical_uuid

# One query per this many placements (DuckDB parameter lists stay small).
_CHUNK: Final = 500

_SQL: Final = (
    "SELECT i.placement_id, i.chain_index, i.payload_hash, i.kind, i.status, r.record_hash, "
    "i.payload FROM inputs i JOIN records r "
    "ON r.placement_id = i.placement_id AND r.chain_index = i.chain_index "
    "WHERE i.kind IN ('terms', 'reclaim') AND i.placement_id IN ({}) "
    "ORDER BY i.placement_id, i.chain_index"
)


class Committed(msgspec.Struct, frozen=True):
    """One committed terms or reclaim input of a placement, in chain order."""

    chain_index: int
    payload_hash: str
    kind: str
    status: str
    record_hash: str
    reclaim: ReclaimNotice | None = None


def committed_inputs(store: Store, placement_ids: Iterable[str]) -> dict[str, list[Committed]]:
    """The terms and reclaim inputs the store committed for ``placement_ids``."""
    wanted = sorted(set(placement_ids))
    found: dict[str, list[Committed]] = {}
    for n in range(0, len(wanted), _CHUNK):
        chunk = wanted[n : n + _CHUNK]
        sql = _SQL.format(", ".join("?" for _ in chunk))
        for pid, index, phash, kind, status, rhash, payload in store.query(sql, chunk):
            reclaim = _reclaim(bytes(payload)) if kind == "reclaim" else None
            row = Committed(int(index), str(phash), str(kind), str(status), str(rhash), reclaim)
            found.setdefault(str(pid), []).append(row)
    return found


def _reclaim(payload: bytes) -> ReclaimNotice | None:
    try:
        _, record = decode_kind_payload(payload)
    except ProtoError:
        return None
    return record if isinstance(record, ReclaimNotice) else None


def owed_releases(
    claims: Sequence[tuple[str, Granted]], committed: dict[str, list[Committed]]
) -> list[PendingRelease]:
    """The releases owed for this shard's granted ``claims`` (uuid, claim), given what the
    store committed; one per claim at most, in the order of ``claims``."""
    owed: list[PendingRelease] = []
    for uuid, claim in claims:
        release = _owed(uuid, claim, committed.get(claim.placement_id, []))
        if release is not None:
            owed.append(release)
    return owed


def _owed(uuid: str, claim: Granted, rows: Sequence[Committed]) -> PendingRelease | None:
    pid, terms_hash = claim.placement_id, claim.terms_hash
    mine = [r for r in rows if r.kind == "terms" and r.payload_hash == terms_hash]
    if not mine:
        return None  # not committed here: its batch, refolded, owes its own releases
    accepted = [r for r in mine if r.status == "accepted"]
    if not accepted:
        return PendingRelease(pid, terms_hash, (uuid,), 0, "rejected", mine[0].record_hash)
    at = accepted[0].chain_index
    later = [r for r in rows if r.chain_index > at and r.status == "accepted"]
    amending = next((r for r in later if r.kind == "terms"), None)
    if amending is not None:
        return PendingRelease(pid, terms_hash, (uuid,), 0, "amended", amending.record_hash)
    reclaims = [
        r
        for r in later
        if r.reclaim is not None
        and uuid in {canonical_uuid(g) for g in r.reclaim.gpus}
        and r.reclaim.effective_at_ms < claim.end_ms
    ]
    if not reclaims:
        return None
    first = min(reclaims, key=lambda r: r.reclaim.effective_at_ms if r.reclaim else 0)
    end = first.reclaim.effective_at_ms if first.reclaim else 0
    return PendingRelease(pid, terms_hash, (uuid,), end, "reclaimed", first.record_hash)


async def release_owed_at_start(capacity: KafkaCapacityLog, store: Store) -> int:
    """Publish what the store's decisions owe the log now (after ``capacity.start``, which
    folds the topic to its end); how many releases."""
    claims = capacity.fold.held_by(capacity.ledger_key)
    committed = committed_inputs(store, {claim.placement_id for _, claim in claims})
    owed = owed_releases(claims, committed)
    for release in owed:
        await capacity.release(release)
    return len(owed)
