"""The snapshot codec: a placement's fold state <-> bytes (msgpack), stored beside its
records in the same transaction (``placement_state.snapshot``).

The byte format is the one stores already hold (version 1): the same msgpack structs,
sorted the same way, so a store written before the fold became ``decide`` restores, and
the same state encodes to the same bytes.

Held inputs (SPEC §6.2) are the one part that grows with what anyone writes to the
stream: the store keeps them as rows of ``held_inputs`` (written and deleted with the
batch that holds and releases them) and its snapshots without them (``encode(state,
holds=False)``); ``with_holds`` puts the rows back into such a snapshot, giving the bytes
``encode(state)`` gives for the whole state.

The input hashes of ``seen`` (SPEC §6.1 (2): every chained input except an accepted usage
event) grow the same way — a usage event of a node the terms do not list is rejected and
chained without any valid signature — and are kept as rows of ``placement_seen``
(appended by the batch that chains them), the snapshot without them (``encode(state,
seen=False)``); ``with_seen`` puts them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from ledger.immutable import PLog, PMap, PSet
from ledger.state import (
    NO_ARRIVALS,
    NO_HASHES,
    NO_HELD,
    AssignmentState,
    Attestation,
    PlacementState,
    StreamHolds,
    StreamState,
    terms_fields,
)
from proto.canonical import decode_payload
from proto.envelope import sha256_hex
from proto.records import Party, PlacementTerms, Totals

SNAPSHOT_VERSION: Final = 1


class _StreamSnap(msgspec.Struct, array_like=True):
    node_id: str
    next_seq: int
    last_hash: str
    last_end_ms: int
    last_input_hash: str


class _BindingSnap(msgspec.Struct, array_like=True):
    node_id: str
    key: bytes
    valid_from_ms: int
    valid_until_ms: int


class _StreamHeldSnap(msgspec.Struct, array_like=True):
    node_id: str
    seq: int
    raw: bytes
    position: str


class _TakenSnap(msgspec.Struct, array_like=True):
    node_id: str
    seqs: list[int]


class _RetiredSnap(msgspec.Struct, array_like=True):
    node_id: str
    uuid: str
    pages: int


class _RevokedSnap(msgspec.Struct, array_like=True):
    node_id: str
    key: bytes


class _AssignmentSnap(msgspec.Struct, array_like=True):
    assignment_id: str
    new_buyer_id: str
    new_buyer_key: bytes
    handover_ms: int
    gpus: list[str]
    rate_per_gpu_hour_minor: int
    delivered_mgms: int


class _AttestedSnap(msgspec.Struct, array_like=True):
    node_id: str
    key: bytes
    gpus: list[str]
    attester: str
    iss: str
    iat: int
    record_index: int


class _Snapshot(msgspec.Struct, omit_defaults=True):
    version: int
    placement_id: str
    terms_payload: bytes | None
    next_index: int
    head: str
    totals: Totals
    streams: list[_StreamSnap]
    bindings: list[_BindingSnap]
    closed: bool
    effective_end_ms: int
    reclaimed: bool
    max_usage_end_ms: int
    adjustment_ids: list[str]
    seen: list[str]
    held: list[tuple[bytes, str]]
    # Added after version 1 shipped; absent (empty) in older snapshots, so the bytes of a
    # state without them are what they were (SPEC §6.2 stream holds, §6.3 taken seqs).
    stream_held: list[_StreamHeldSnap] = []
    taken: list[_TakenSnap] = []
    # SPEC §7.1 retired-page baselines (non-zero only): absent in older snapshots and in
    # any state whose events reported no retired page, so those bytes are unchanged.
    retired: list[_RetiredSnap] = []
    # SPEC §6.6: the last record's arrival and revoked keys; absent before §6.6.
    arrived_ms: int | None = None
    revoked: list[_RevokedSnap] = []
    # SPEC §6.6: (position, arrived_ms) of each held input that has one.
    held_arrived: list[tuple[str, int]] = []
    # SPEC §6.8: accepted assignments in chain order; absent before resale existed.
    assignments: list[_AssignmentSnap] = []
    # SPEC §6.7: the end of the accepted buyer release; absent when there is none.
    release_end_ms: int | None = None
    # SPEC §6.9: accepted hardware evidence per node key; absent when there is none.
    attested: list[_AttestedSnap] = []


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(_Snapshot)


class SnapshotError(ValueError):
    """Snapshot bytes that are not a version-1 snapshot of the expected placement."""


def _decode_bytes(placement_id: str, data: bytes) -> _Snapshot:
    """The snapshot in ``data``, or SnapshotError naming the placement: bytes that do not
    decode, or a value out of its range (a total past 2^53 - 1 that a ledger older than
    SPEC §7.7's bounds stored) are one placement's fault, never the whole store's."""
    try:
        return _DECODER.decode(data)
    except msgspec.MsgspecError as exc:
        raise SnapshotError(f"the stored state of {placement_id} does not decode: {exc}") from exc


def encode(state: PlacementState, *, holds: bool = True, seen: bool = True) -> bytes:
    """The state as snapshot bytes; ``holds=False``: without its held inputs (their raw
    bytes, positions and arrivals), which the store keeps as rows (``with_holds``);
    ``seen=False``: without the input hashes of ``seen`` (rows too, ``with_seen``)."""
    if not holds:
        state = msgspec.structs.replace(
            state, held=NO_HELD, stream_held={}, held_arrived=NO_ARRIVALS
        )
    if not seen:
        state = msgspec.structs.replace(state, seen=NO_HASHES)
    snap = _Snapshot(
        version=SNAPSHOT_VERSION,
        placement_id=state.placement_id,
        terms_payload=state.terms_payload,
        next_index=state.next_index,
        head=state.head,
        totals=state.totals,
        streams=[
            _StreamSnap(n, s.next_seq, s.last_hash, s.last_end_ms, s.last_input_hash)
            for n, s in sorted(state.streams.items())
        ],
        bindings=[
            _BindingSnap(node, key, frm, until)
            for node, keys in sorted(state.bindings.items())
            for key, (frm, until) in sorted(keys.items())
        ],
        closed=state.closed,
        effective_end_ms=state.effective_end_ms,
        reclaimed=state.reclaimed,
        max_usage_end_ms=state.max_usage_end_ms,
        adjustment_ids=sorted(state.adjustment_ids),
        seen=sorted(state.seen),
        held=list(state.held),
        stream_held=[
            _StreamHeldSnap(node, seq, raw, position)
            for node, holds in sorted(state.stream_held.items())
            for seq, (raw, position, _) in sorted(holds.items())
        ],
        taken=[_TakenSnap(node, sorted(seqs)) for node, seqs in sorted(state.taken.items())],
        retired=[
            _RetiredSnap(node, uuid, pages)
            for node, s in sorted(state.streams.items())
            for uuid, pages in sorted(s.retired.items())
        ],
        arrived_ms=state.arrived_ms,
        revoked=[
            _RevokedSnap(node, key)
            for node, keys in sorted(state.revoked.items())
            for key in sorted(keys)
        ],
        held_arrived=sorted(state.held_arrived.items()),
        assignments=[
            _AssignmentSnap(
                a.assignment_id,
                a.new_buyer.id,
                a.new_buyer.key,
                a.handover_ms,
                sorted(a.gpus),
                a.rate_per_gpu_hour_minor,
                a.delivered_mgms,
            )
            for a in state.assignments
        ],
        release_end_ms=state.release_end_ms,
        attested=[
            _AttestedSnap(node, key, list(a.gpus), a.attester, a.iss, a.iat, a.record_index)
            for node, keys in sorted(state.attested.items())
            for key, a in sorted(keys.items())
        ],
    )
    return _ENCODER.encode(snap)


def decode(placement_id: str, data: bytes) -> PlacementState:
    """The state ``encode`` wrote for ``placement_id``."""
    snap = _decode_bytes(placement_id, data)
    if snap.version != SNAPSHOT_VERSION or snap.placement_id != placement_id:
        raise SnapshotError(
            f"snapshot of {snap.placement_id} v{snap.version} is not for {placement_id}"
        )
    bindings: dict[str, dict[bytes, tuple[int, int]]] = {}
    for b in snap.bindings:
        bindings.setdefault(b.node_id, {})[b.key] = (b.valid_from_ms, b.valid_until_ms)
    held = [(raw, position) for raw, position in snap.held]
    retired: dict[str, dict[str, int]] = {}
    for r in snap.retired:
        retired.setdefault(r.node_id, {})[r.uuid] = r.pages
    state = PlacementState(
        placement_id,
        next_index=snap.next_index,
        head=snap.head,
        totals=snap.totals,
        streams={
            s.node_id: StreamState(
                s.next_seq,
                s.last_hash,
                s.last_end_ms,
                s.last_input_hash,
                retired.get(s.node_id, {}),
            )
            for s in snap.streams
        },
        bindings=bindings,
        closed=snap.closed,
        effective_end_ms=snap.effective_end_ms,
        reclaimed=snap.reclaimed,
        max_usage_end_ms=snap.max_usage_end_ms,
        adjustment_ids=PSet(snap.adjustment_ids),
        seen=PSet(snap.seen),
        held=PLog(held, sum(len(raw) for raw, _ in held)),
        held_hashes=PSet(sha256_hex(raw) for raw, _ in held),
        stream_held=_stream_held(snap.stream_held),
        taken={t.node_id: frozenset(t.seqs) for t in snap.taken},
        arrived_ms=snap.arrived_ms,
        revoked=_revoked(snap.revoked),
        held_arrived=PMap(snap.held_arrived),
        assignments=tuple(
            AssignmentState(
                a.assignment_id,
                Party(id=a.new_buyer_id, key=a.new_buyer_key),
                a.handover_ms,
                frozenset(a.gpus),
                a.rate_per_gpu_hour_minor,
                a.delivered_mgms,
            )
            for a in snap.assignments
        ),
        release_end_ms=snap.release_end_ms,
        attested=_attested(snap.attested),
    )
    if snap.terms_payload is None:
        return state
    terms = decode_payload(snap.terms_payload)
    if not isinstance(terms, PlacementTerms):
        raise SnapshotError(f"snapshot of {placement_id}: its terms are a {type(terms).__name__}")
    fields = terms_fields(terms, snap.terms_payload, sha256_hex(snap.terms_payload))
    # Bindings, revocations and the effective end are the snapshot's own.
    del fields["bindings"], fields["effective_end_ms"], fields["revoked"], fields["attested"]
    return msgspec.structs.replace(state, **fields)


def _stream_held(rows: list[_StreamHeldSnap]) -> dict[str, StreamHolds]:
    out: dict[str, dict[int, tuple[bytes, str, str]]] = {}
    for row in rows:
        out.setdefault(row.node_id, {})[row.seq] = (row.raw, row.position, sha256_hex(row.raw))
    return {
        node: PMap(holds, sum(len(raw) for raw, _, _ in holds.values()))
        for node, holds in out.items()
    }


class HeldInput(msgspec.Struct, frozen=True, array_like=True):
    """One held input as the store keeps it (table ``held_inputs``): its raw envelope,
    its position, the stream (node_id, seq) of a usage event (None otherwise), and its
    held arrival (SPEC §6.6; None: untimed)."""

    position: str
    raw: bytes
    node_id: str | None
    seq: int | None
    arrived_ms: int | None


def split_holds(placement_id: str, data: bytes) -> tuple[bytes, list[HeldInput]] | None:
    """A snapshot with holds as the store keeps it since version 4 (``with_holds``'s
    inverse): the snapshot without them and its held inputs in the order held (before
    the terms in arrival order, then stream holds by node and seq). None: it holds none."""
    snap = _decode_bytes(placement_id, data)
    if snap.version != SNAPSHOT_VERSION or snap.placement_id != placement_id:
        raise SnapshotError(
            f"snapshot of {snap.placement_id} v{snap.version} is not for {placement_id}"
        )
    if not snap.held and not snap.stream_held:
        return None
    arrived = dict(snap.held_arrived)
    rows = [
        HeldInput(position, raw, None, None, arrived.get(position)) for raw, position in snap.held
    ]
    rows += [
        HeldInput(h.position, h.raw, h.node_id, h.seq, arrived.get(h.position))
        for h in sorted(snap.stream_held, key=lambda h: (h.node_id, h.seq))
    ]
    snap.held, snap.stream_held, snap.held_arrived = [], [], []
    return _ENCODER.encode(snap), rows


def with_holds(placement_id: str, data: bytes, rows: Sequence[HeldInput]) -> bytes:
    """A snapshot stored without its holds (``encode(state, holds=False)``) with ``rows``
    put back (in the order they were held): the bytes ``encode(state)`` gives. Without
    terms every row is held before the terms, in that order; with terms every row is a
    stream hold (accepted terms release the others)."""
    if not rows:
        return data
    try:
        snap = _decode_bytes(placement_id, data)
    except SnapshotError:
        return data  # ``decode`` (the fold's restore) reports this placement's fault
    if snap.version != SNAPSHOT_VERSION or snap.placement_id != placement_id:
        raise SnapshotError(
            f"snapshot of {snap.placement_id} v{snap.version} is not for {placement_id}"
        )
    if snap.held or snap.stream_held or snap.held_arrived:
        raise SnapshotError(f"snapshot of {placement_id} carries holds and has held rows too")
    if snap.terms_payload is None:
        snap.held = [(row.raw, row.position) for row in rows]
    else:
        stream: list[_StreamHeldSnap] = []
        for row in rows:
            if row.node_id is None or row.seq is None:
                raise SnapshotError(f"{placement_id}: a stream hold without its node and seq")
            stream.append(_StreamHeldSnap(row.node_id, row.seq, row.raw, row.position))
        snap.stream_held = sorted(stream, key=lambda h: (h.node_id, h.seq))
    snap.held_arrived = sorted(
        (row.position, row.arrived_ms) for row in rows if row.arrived_ms is not None
    )
    return _ENCODER.encode(snap)


def split_seen(placement_id: str, data: bytes) -> tuple[bytes, list[str]] | None:
    """A snapshot with ``seen`` as the store keeps it since version 5 (``with_seen``'s
    inverse): the snapshot without it and its input hashes (sorted). None: none seen."""
    snap = _decode(placement_id, data)
    if not snap.seen:
        return None
    hashes = snap.seen
    snap.seen = []
    return _ENCODER.encode(snap), hashes


def with_seen(placement_id: str, data: bytes, hashes: Sequence[str]) -> bytes:
    """A snapshot stored without ``seen`` (``encode(state, seen=False)``) with the input
    hashes ``hashes`` (rows of ``placement_seen``, any order) put back: the bytes
    ``encode`` gives with them."""
    if not hashes:
        return data
    try:
        snap = _decode(placement_id, data)
    except SnapshotError:
        return data  # ``decode`` (the fold's restore) reports this placement's fault
    if snap.seen:
        raise SnapshotError(f"snapshot of {placement_id} carries seen and has seen rows too")
    snap.seen = sorted(hashes)
    return _ENCODER.encode(snap)


def _decode(placement_id: str, data: bytes) -> _Snapshot:
    snap = _decode_bytes(placement_id, data)
    if snap.version != SNAPSHOT_VERSION or snap.placement_id != placement_id:
        raise SnapshotError(
            f"snapshot of {snap.placement_id} v{snap.version} is not for {placement_id}"
        )
    return snap


def _revoked(rows: list[_RevokedSnap]) -> dict[str, frozenset[bytes]]:
    out: dict[str, set[bytes]] = {}
    for row in rows:
        out.setdefault(row.node_id, set()).add(row.key)
    return {node: frozenset(keys) for node, keys in out.items()}


def _attested(rows: list[_AttestedSnap]) -> dict[str, dict[bytes, Attestation]]:
    out: dict[str, dict[bytes, Attestation]] = {}
    for r in rows:
        out.setdefault(r.node_id, {})[r.key] = Attestation(
            tuple(r.gpus), r.attester, r.iss, r.iat, r.record_index
        )
    return out
