"""The fold (SPEC.md §6-§7): inputs of a placement, in stream order -> chained records.

A pure function of the ordered inputs: no clock, no I/O. ``Fold.apply`` takes one raw
input and returns its outcomes (more than one when accepted terms release held inputs).
State per placement is snapshotted with ``snapshot``/``restore`` so the service can
persist it in the same transaction as the records and offsets it produced.

The checks run in the order SPEC.md §6 writes them; the first that fails names the
reason. Each method below carries the SPEC section it implements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from ledger.pricing import ZERO_TOTALS, overlap_ms, price, reclaim_credit_minor, sla_credit_minor
from proto import limits
from proto.canonical import signed_bytes
from proto.envelope import (
    Opened,
    check_signatures,
    encode_envelope,
    open_envelope,
    sha256_hex,
    sign_payload,
)
from proto.errors import ProtoError
from proto.keys import SigningKey, key_id, verify
from proto.reasons import Reason
from proto.records import (
    ZERO_HASH,
    Adjustment,
    GpuSpec,
    LedgerRecord,
    NodeKeyBinding,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    Status,
    Totals,
    UsageEvent,
)
from proto.terms import party_keys, validate_terms

Decision = Literal["chained", "dropped", "quarantined", "held"]

# (placement_id, node_id, seq) -> (input_hash, record_hash) of the accepted usage event at
# that seq, or None. Consulted only for events committed before the current batch (the
# fold remembers the events it accepted since the last ``clear_dirty`` itself).
UsageLookup = Callable[[str, str, int], tuple[str, str] | None]
# placement_id -> snapshot bytes of a placement not in memory (evicted), or None.
StateLoader = Callable[[str], bytes | None]

INPUT_KINDS: Final = frozenset({"terms", "keybinding", "usage", "reclaim", "adjustment", "closed"})
_AFTER_CLOSE_KINDS: Final = frozenset({"usage", "keybinding", "reclaim", "closed"})
_FOREVER: Final = (0, limits.MAX_SAFE_INTEGER)
SNAPSHOT_VERSION: Final = 1
# Signatures checked or made per job handed to an executor thread.
CRYPTO_CHUNK: Final = 256


@dataclass(slots=True)
class Outcome:
    """What became of one input. (Mutable only so deferred signing can fill in
    ``record_envelope``; nothing else changes one after the fold returns it.)"""

    decision: Decision
    position: str
    raw: bytes
    input_hash: str
    placement_id: str | None
    kind: str | None
    opened: Opened | None
    status: Status | None = None
    reason: Reason | None = None
    record: LedgerRecord | None = None
    record_envelope: bytes | None = None
    record_hash: str | None = None
    detail: str = ""
    record_payload: bytes | None = None


class _Drop(Exception):
    """Control flow: the input is a re-delivery (SPEC: dropped, not chained)."""


class _Reject(Exception):
    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class _Stream:
    next_seq: int = 0
    last_hash: str = ZERO_HASH
    last_end_ms: int = 0
    last_input_hash: str = ""
    # Accepted since the last clear_dirty: seq -> (input_hash, record_hash).
    recent: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class _Placement:
    placement_id: str
    terms: PlacementTerms | None = None
    terms_payload: bytes | None = None
    terms_record_hash: str = ""
    gpus: dict[str, GpuSpec] = field(default_factory=dict)
    next_index: int = 0
    head: str = ZERO_HASH
    totals: Totals = ZERO_TOTALS
    streams: dict[str, _Stream] = field(default_factory=dict)
    bindings: dict[str, dict[bytes, tuple[int, int]]] = field(default_factory=dict)
    closed: bool = False
    effective_end_ms: int = 0
    reclaimed: bool = False
    max_usage_end_ms: int = 0
    adjustment_ids: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    held: list[tuple[bytes, str]] = field(default_factory=list)
    held_hashes: set[str] = field(default_factory=set)

    def key_for(self, node_id: str, keyid: str) -> bytes | None:
        """The public key with this key id bound to the node (any validity), if any."""
        for public_key in self.bindings.get(node_id, ()):
            if key_id(public_key) == keyid:
                return public_key
        return None

    def accept_terms(self, terms: PlacementTerms, payload: bytes, record_hash: str) -> None:
        self.terms = terms
        self.terms_payload = payload
        self.terms_record_hash = record_hash
        self.gpus = {g.uuid: g for g in terms.gpus}
        self.bindings = {n.node_id: {n.key: _FOREVER} for n in terms.nodes}
        self.effective_end_ms = terms.window_end_ms


# ---- snapshots --------------------------------------------------------------------------


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


class _Snapshot(msgspec.Struct):
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


_SNAP_ENCODER: Final = msgspec.msgpack.Encoder()
_SNAP_DECODER: Final = msgspec.msgpack.Decoder(_Snapshot)


class Fold:
    """Folds the inputs of many placements; see the module docstring."""

    def __init__(
        self,
        ledger_key: SigningKey,
        lookup: UsageLookup | None = None,
        load_state: StateLoader | None = None,
    ) -> None:
        self.ledger_key = ledger_key
        self.lookup = lookup
        self.load_state = load_state
        self._placements: dict[str, _Placement] = {}
        self._dirty: set[str] = set()
        self._preverified: dict[bytes, tuple[bytes, bytes, Future[list[bool]], int]] = {}
        self._defer_signing = False
        # Without a lookup (tests, pure replays) every accepted usage event is remembered.
        self._history: dict[tuple[str, str, int], tuple[str, str]] | None = (
            {} if lookup is None else None
        )

    # ---- public API ---------------------------------------------------------------------

    def apply(self, raw: bytes, position: str, stream_key: str | None) -> list[Outcome]:
        """Process one input received at ``position`` under transport key ``stream_key``."""
        return self._apply_opened(raw, position, stream_key, _open(raw))

    def apply_batch(
        self, items: Sequence[tuple[bytes, str, str | None]], executor: Executor | None = None
    ) -> list[Outcome]:
        """``apply`` each input in order and return all outcomes, flattened.

        With an executor, the Ed25519 work runs on its threads (libsodium releases the
        GIL): usage signatures are checked ahead of the fold with the keys bound when the
        batch starts, and record signatures are made after it. The outcomes are the same
        as ``apply`` one input at a time; a check the pre-pass could not do (a key bound
        inside the batch) is simply done inline.
        """
        if executor is None:
            return [o for raw, pos, key in items for o in self.apply(raw, pos, key)]
        opened = [_open(raw) for raw, _, _ in items]
        self._preverified = self._preverify(opened, executor)
        self._defer_signing = True
        try:
            outcomes = [
                o
                for (raw, position, key), op in zip(items, opened, strict=True)
                for o in self._apply_opened(raw, position, key, op)
            ]
        finally:
            self._preverified = {}
            self._defer_signing = False
        return self._sign_outcomes(outcomes, executor)

    def _preverify(
        self, opened: Sequence[Opened | ProtoError], executor: Executor
    ) -> dict[bytes, tuple[bytes, bytes, Future[list[bool]], int]]:
        jobs: list[tuple[bytes, bytes, bytes]] = []
        for op in opened:
            if not isinstance(op, Opened) or not isinstance(op.record, UsageEvent):
                continue
            signatures = op.envelope.signatures
            placement = self._placements.get(op.record.placement_id)
            if len(signatures) != 1 or placement is None:
                continue
            public_key = placement.key_for(op.record.node_id, signatures[0].keyid)
            if public_key is not None:
                jobs.append((public_key, op.payload, signatures[0].sig))
        table: dict[bytes, tuple[bytes, bytes, Future[list[bool]], int]] = {}
        for start in range(0, len(jobs), CRYPTO_CHUNK):
            chunk = jobs[start : start + CRYPTO_CHUNK]
            future = executor.submit(_verify_chunk, chunk)
            for i, (public_key, payload, sig) in enumerate(chunk):
                table[sig] = (public_key, payload, future, i)
        return table

    def _verified(self, public_key: bytes, payload: bytes, sig: bytes) -> bool:
        entry = self._preverified.get(sig)
        if entry is not None and entry[0] == public_key and entry[1] is payload:
            return entry[2].result()[entry[3]]
        return verify(public_key, payload, sig)

    def _sign_outcomes(self, outcomes: list[Outcome], executor: Executor) -> list[Outcome]:
        pending = [i for i, o in enumerate(outcomes) if o.decision == "chained"]
        chunks = [pending[s : s + CRYPTO_CHUNK] for s in range(0, len(pending), CRYPTO_CHUNK)]
        key = self.ledger_key
        futures = [
            executor.submit(_sign_chunk, key, [outcomes[i].record_payload for i in chunk])
            for chunk in chunks
        ]
        for chunk, future in zip(chunks, futures, strict=True):
            for i, envelope in zip(chunk, future.result(), strict=True):
                outcomes[i].record_envelope = envelope
        return outcomes

    def _apply_opened(
        self, raw: bytes, position: str, stream_key: str | None, opened: Opened | ProtoError
    ) -> list[Outcome]:
        # §6.1 (1): decode, else quarantine (not attributable).
        if isinstance(opened, ProtoError):
            return [_unattributed(raw, position, None, None, opened.reason, opened.detail)]
        record = opened.record
        placement_id: str = record.placement_id
        if opened.kind not in INPUT_KINDS:
            detail = f"{opened.kind} records are not inputs"
            return [
                _unattributed(raw, position, placement_id, opened, Reason.KIND_MISMATCH, detail)
            ]
        if stream_key is not None and stream_key != placement_id:
            detail = f"stream key {stream_key!r} differs from placement_id {placement_id!r}"
            return [
                _unattributed(
                    raw, position, placement_id, opened, Reason.PLACEMENT_MISMATCH, detail
                )
            ]
        placement = self._get(placement_id)
        # §6.1 (2): exact re-delivery.
        if self._is_redelivery(placement, opened):
            return [self._dropped(placement, opened, position)]
        # §6.1 (3), §6.2: hold until the terms are accepted.
        if placement.terms is None and opened.kind != "terms":
            if len(placement.held) >= limits.MAX_HELD_PER_PLACEMENT:
                detail = f"{limits.MAX_HELD_PER_PLACEMENT} inputs already held without terms"
                return [
                    _unattributed(
                        raw, position, placement_id, opened, Reason.UNKNOWN_PLACEMENT, detail
                    )
                ]
            placement.held.append((raw, position))
            placement.held_hashes.add(opened.input_hash)
            self._dirty.add(placement_id)
            return [_outcome("held", position, placement_id, opened)]
        had_terms = placement.terms is not None
        outcomes = [self._process(placement, opened, position)]
        if not had_terms and placement.terms is not None and placement.held:
            outcomes.extend(self._release_held(placement))
        return outcomes

    def dirty(self) -> set[str]:
        """Placements whose state changed since the last ``clear_dirty``."""
        return set(self._dirty)

    def clear_dirty(self) -> None:
        """Forget which placements changed (after their snapshots were stored)."""
        for placement_id in self._dirty:
            placement = self._placements.get(placement_id)
            if placement is not None:
                for stream in placement.streams.values():
                    stream.recent.clear()
        self._dirty.clear()

    def snapshot(self, placement_id: str) -> bytes:
        """The placement's fold state as bytes (msgpack), to store beside its records."""
        p = self._placements[placement_id]
        snap = _Snapshot(
            version=SNAPSHOT_VERSION,
            placement_id=p.placement_id,
            terms_payload=p.terms_payload,
            next_index=p.next_index,
            head=p.head,
            totals=p.totals,
            streams=[
                _StreamSnap(n, s.next_seq, s.last_hash, s.last_end_ms, s.last_input_hash)
                for n, s in sorted(p.streams.items())
            ],
            bindings=[
                _BindingSnap(node, key, frm, until)
                for node, keys in sorted(p.bindings.items())
                for key, (frm, until) in sorted(keys.items())
            ],
            closed=p.closed,
            effective_end_ms=p.effective_end_ms,
            reclaimed=p.reclaimed,
            max_usage_end_ms=p.max_usage_end_ms,
            adjustment_ids=sorted(p.adjustment_ids),
            seen=sorted(p.seen),
            held=list(p.held),
        )
        return _SNAP_ENCODER.encode(snap)

    def restore(self, placement_id: str, data: bytes) -> None:
        """Load a snapshot taken by ``snapshot`` (on start, before any ``apply``)."""
        self._placements[placement_id] = _from_snapshot(placement_id, data)

    def evict(self, placement_id: str) -> None:
        """Drop a placement's state from memory (it can be restored later)."""
        if placement_id in self._dirty:
            raise RuntimeError(f"placement {placement_id} has unsaved state; store it first")
        self._placements.pop(placement_id, None)

    def is_closed(self, placement_id: str) -> bool:
        """True when the placement has an accepted PlacementClosed."""
        p = self._placements.get(placement_id)
        return p is not None and p.closed

    def close_due_ms(self, placement_id: str) -> int | None:
        """window_end_ms + late_grace_ms of the placement; None without accepted terms."""
        p = self._placements.get(placement_id)
        if p is None or p.terms is None:
            return None
        return p.terms.window_end_ms + p.terms.late_grace_ms

    def open_placements(self) -> list[str]:
        """Placements in memory with accepted terms and not closed."""
        return sorted(
            pid for pid, p in self._placements.items() if p.terms is not None and not p.closed
        )

    def totals(self, placement_id: str) -> Totals | None:
        """The placement's current cumulative totals (None if unknown)."""
        p = self._placements.get(placement_id)
        return None if p is None else p.totals

    def head(self, placement_id: str) -> tuple[int, str] | None:
        """(number of chained records, record hash of the last) of a placement."""
        p = self._placements.get(placement_id)
        return None if p is None else (p.next_index, p.head)

    def terms(self, placement_id: str) -> PlacementTerms | None:
        """The accepted terms of a placement, if any."""
        p = self._placements.get(placement_id)
        return None if p is None else p.terms

    # ---- internals -------------------------------------------------------------------------

    def _get(self, placement_id: str) -> _Placement:
        placement = self._placements.get(placement_id)
        if placement is None:
            data = self.load_state(placement_id) if self.load_state is not None else None
            if data is not None:
                placement = _from_snapshot(placement_id, data)
            else:
                placement = _Placement(placement_id)
            self._placements[placement_id] = placement
        return placement

    def _is_redelivery(self, p: _Placement, opened: Opened) -> bool:
        if opened.input_hash in p.seen or opened.input_hash in p.held_hashes:
            return True
        record = opened.record
        if isinstance(record, UsageEvent) and p.terms is not None:
            stream = p.streams.get(record.node_id)
            if stream is not None and record.seq < stream.next_seq:
                accepted = self._accepted_at(p, stream, record.node_id, record.seq)
                return accepted is not None and accepted[0] == opened.input_hash
        return False

    def _accepted_at(
        self, p: _Placement, stream: _Stream, node_id: str, seq: int
    ) -> tuple[str, str] | None:
        if seq == stream.next_seq - 1:
            return stream.last_input_hash, stream.last_hash
        recent = stream.recent.get(seq)
        if recent is not None:
            return recent
        if self._history is not None:
            return self._history.get((p.placement_id, node_id, seq))
        assert self.lookup is not None
        return self.lookup(p.placement_id, node_id, seq)

    def _dropped(self, p: _Placement, opened: Opened, position: str) -> Outcome:
        return _outcome("dropped", position, p.placement_id, opened, reason=Reason.DUPLICATE)

    def _release_held(self, p: _Placement) -> list[Outcome]:
        held, p.held = p.held, []
        outcomes: list[Outcome] = []
        for raw, position in held:
            opened = open_envelope(raw)  # it decoded when it was held
            p.held_hashes.discard(opened.input_hash)
            if self._is_redelivery(p, opened):
                outcomes.append(self._dropped(p, opened, position))
            else:
                outcomes.append(self._process(p, opened, position))
        return outcomes

    def _process(self, p: _Placement, opened: Opened, position: str) -> Outcome:
        """§6.1 (4) and §6.3: decide, fold, chain."""
        delivered = 0
        try:
            if p.closed and opened.kind in _AFTER_CLOSE_KINDS:
                raise _Reject(Reason.AFTER_CLOSE, "the placement is closed")
            record = opened.record
            if isinstance(record, PlacementTerms):
                self._terms(p, opened, record)
            elif isinstance(record, NodeKeyBinding):
                self._key_binding(p, opened, record)
            elif isinstance(record, UsageEvent):
                delivered = self._usage(p, opened, record)
            elif isinstance(record, ReclaimNotice):
                self._reclaim(p, opened, record)
            elif isinstance(record, Adjustment):
                self._adjustment(p, opened, record)
            elif isinstance(record, PlacementClosed):
                self._close(p, opened, record)
            else:  # pragma: no cover - INPUT_KINDS guards this
                raise AssertionError(opened.kind)
        except _Drop:
            return self._dropped(p, opened, position)
        except _Reject as rejection:
            p.seen.add(opened.input_hash)
            return self._chain(
                p, opened, position, "rejected", rejection.reason, 0, rejection.detail
            )
        if not isinstance(opened.record, UsageEvent):
            p.seen.add(opened.input_hash)
        return self._chain(p, opened, position, "accepted", None, delivered, "")

    def _chain(
        self,
        p: _Placement,
        opened: Opened,
        position: str,
        status: Status,
        reason: Reason | None,
        delivered: int,
        detail: str,
    ) -> Outcome:
        record = LedgerRecord(
            placement_id=p.placement_id,
            index=p.next_index,
            prev=p.head,
            kind=opened.kind,  # type: ignore[arg-type]
            source=opened.input_hash,
            status=status,
            reason="" if reason is None else reason.value,
            delivered_mgms=delivered,
            totals=p.totals,
        )
        payload = signed_bytes(record)
        envelope = None if self._defer_signing else _sign_record(self.ledger_key, payload)
        record_hash = sha256_hex(payload)
        p.next_index += 1
        p.head = record_hash
        self._dirty.add(p.placement_id)
        return _outcome(
            "chained",
            position,
            p.placement_id,
            opened,
            status=status,
            reason=reason,
            record=record,
            record_envelope=envelope,
            record_hash=record_hash,
            detail=detail,
            record_payload=payload,
        )

    def _reprice(self, p: _Placement, **changes: int) -> Totals:
        assert p.terms is not None
        current = p.totals
        values = {
            "delivered_mgms": current.delivered_mgms,
            "reclaim_credit": current.reclaim_credit_minor,
            "sla_credit": current.sla_credit_minor,
            "adjustment_credit": current.adjustment_credit_minor,
            "adjustment_charge": current.adjustment_charge_minor,
        }
        values.update(changes)
        return price(p.terms, **values)

    # §6.3 terms
    def _terms(self, p: _Placement, opened: Opened, terms: PlacementTerms) -> None:
        if p.terms is not None:
            if opened.record_hash == p.terms_record_hash:
                raise _Drop
            raise _Reject(Reason.TERMS_CONFLICT, "the placement already has other terms")
        _require(opened, party_keys(terms))
        problems = validate_terms(terms)
        if problems:
            raise _Reject(Reason.TERMS_INVALID, "; ".join(problems))
        if terms.ledger_key != self.ledger_key.public_key:
            raise _Reject(Reason.TERMS_INVALID, "ledger_key names another ledger")
        p.accept_terms(terms, opened.payload, opened.record_hash)

    # §6.3 keybinding
    def _key_binding(self, p: _Placement, opened: Opened, binding: NodeKeyBinding) -> None:
        assert p.terms is not None
        _require(opened, {key_id(p.terms.operator.key): p.terms.operator.key})
        if binding.node_id not in p.bindings:
            raise _Reject(Reason.NODE_UNKNOWN, f"node {binding.node_id!r} is not in the terms")
        if binding.valid_from_ms >= binding.valid_until_ms:
            raise _Reject(Reason.BINDING_INVALID, "valid_from_ms is not before valid_until_ms")
        p.bindings[binding.node_id][binding.key] = (binding.valid_from_ms, binding.valid_until_ms)

    # §6.3 usage
    def _usage(self, p: _Placement, opened: Opened, event: UsageEvent) -> int:
        terms = p.terms
        assert terms is not None
        bound = p.bindings.get(event.node_id)
        if bound is None:
            raise _Reject(Reason.NODE_UNKNOWN, f"node {event.node_id!r} is not in the terms")
        signatures = opened.envelope.signatures
        if not signatures:
            raise _Reject(Reason.SIG_MISSING, "usage must be signed by its node")
        if len(signatures) > 1:
            raise _Reject(Reason.SIG_SURPLUS, f"{len(signatures)} signatures, want 1")
        signature = signatures[0]
        public_key = p.key_for(event.node_id, signature.keyid)
        if public_key is None:
            raise _Reject(Reason.NODE_KEY_UNKNOWN, f"key {signature.keyid} is not bound to node")
        valid_from, valid_until = bound[public_key]
        if not self._verified(public_key, opened.payload, signature.sig):
            raise _Reject(Reason.SIG_INVALID, f"bad signature by key {signature.keyid}")
        if not (valid_from <= event.start_ms and event.end_ms <= valid_until):
            raise _Reject(
                Reason.NODE_KEY_NOT_VALID, "the key's binding does not cover the interval"
            )
        stream = p.streams.get(event.node_id)
        if stream is None:
            stream = p.streams[event.node_id] = _Stream()
        if event.seq < stream.next_seq:
            accepted = self._accepted_at(p, stream, event.node_id, event.seq)
            if accepted is not None and accepted[1] == opened.record_hash:
                raise _Drop
            raise _Reject(Reason.EQUIVOCATION, f"a different event for accepted seq {event.seq}")
        if event.seq > stream.next_seq:
            raise _Reject(Reason.SEQ_GAP, f"seq {event.seq}, expected {stream.next_seq}")
        if event.prev != stream.last_hash:
            raise _Reject(Reason.PREV_MISMATCH, f"prev {event.prev}, expected {stream.last_hash}")
        if not (
            event.start_ms < event.end_ms
            and event.end_ms - event.start_ms <= limits.MAX_INTERVAL_MS
        ):
            raise _Reject(Reason.INTERVAL_INVALID, f"[{event.start_ms}, {event.end_ms})")
        if event.seq > 0 and event.start_ms < stream.last_end_ms:
            raise _Reject(
                Reason.INTERVAL_OVERLAP,
                f"starts at {event.start_ms}, the previous ended at {stream.last_end_ms}",
            )
        if not (event.end_ms > terms.window_start_ms and event.start_ms < terms.window_end_ms):
            raise _Reject(Reason.OUTSIDE_WINDOW, f"[{event.start_ms}, {event.end_ms})")
        uuids = [s.uuid for s in event.samples]
        if len(set(uuids)) != len(uuids):
            raise _Reject(Reason.SAMPLE_DUPLICATE_GPU, "a GPU is sampled twice")
        delivered = 0
        for sample in event.samples:
            spec = p.gpus.get(sample.uuid)
            if spec is None or spec.node_id != event.node_id:
                raise _Reject(Reason.GPU_NOT_IN_TERMS, f"GPU {sample.uuid} on {event.node_id}")
            if spec.model != sample.model:
                raise _Reject(
                    Reason.GPU_MODEL_MISMATCH, f"GPU {sample.uuid}: {sample.model} != {spec.model}"
                )
            if sample.allocated and sample.healthy:
                delivered += spec.share_milli * overlap_ms(
                    event.start_ms, event.end_ms, terms.window_start_ms, p.effective_end_ms
                )
        # Accepted: advance the stream and fold.
        stream.next_seq += 1
        stream.last_hash = opened.record_hash
        stream.last_end_ms = event.end_ms
        stream.last_input_hash = opened.input_hash
        stream.recent[event.seq] = (opened.input_hash, opened.record_hash)
        if self._history is not None:
            key = (p.placement_id, event.node_id, event.seq)
            self._history[key] = (opened.input_hash, opened.record_hash)
        p.max_usage_end_ms = max(p.max_usage_end_ms, event.end_ms)
        if delivered:
            p.totals = self._reprice(p, delivered_mgms=p.totals.delivered_mgms + delivered)
        return delivered

    # §6.3 reclaim
    def _reclaim(self, p: _Placement, opened: Opened, notice: ReclaimNotice) -> None:
        terms = p.terms
        assert terms is not None
        _require(opened, {key_id(terms.operator.key): terms.operator.key})
        if p.reclaimed:
            raise _Reject(Reason.RECLAIM_DUPLICATE, "a reclaim was already accepted")
        if not notice.issued_at_ms <= notice.effective_at_ms:
            raise _Reject(Reason.RECLAIM_INVALID, "issued after it takes effect")
        if not terms.window_start_ms <= notice.effective_at_ms < terms.window_end_ms:
            raise _Reject(Reason.RECLAIM_INVALID, "effective time outside the window")
        if len(set(notice.gpus)) != len(notice.gpus) or set(notice.gpus) != set(p.gpus):
            raise _Reject(Reason.RECLAIM_INVALID, "gpus are not exactly the placement's GPUs")
        if p.max_usage_end_ms > notice.effective_at_ms:
            raise _Reject(
                Reason.RECLAIM_BEHIND_USAGE,
                f"usage already folded to {p.max_usage_end_ms} > {notice.effective_at_ms}",
            )
        p.reclaimed = True
        p.effective_end_ms = notice.effective_at_ms
        credit = reclaim_credit_minor(terms, notice.issued_at_ms, notice.effective_at_ms)
        p.totals = self._reprice(p, reclaim_credit=credit)

    # §6.3 adjustment
    def _adjustment(self, p: _Placement, opened: Opened, adjustment: Adjustment) -> None:
        terms = p.terms
        assert terms is not None
        _require(opened, {key_id(terms.desk.key): terms.desk.key})
        if adjustment.adjustment_id in p.adjustment_ids:
            raise _Reject(Reason.ADJUSTMENT_DUPLICATE, f"{adjustment.adjustment_id} seen before")
        if adjustment.direction == "credit":
            totals = self._reprice(
                p, adjustment_credit=p.totals.adjustment_credit_minor + adjustment.amount_minor
            )
        else:
            totals = self._reprice(
                p, adjustment_charge=p.totals.adjustment_charge_minor + adjustment.amount_minor
            )
        if any(value > limits.MAX_SAFE_INTEGER for value in msgspec.structs.astuple(totals)):
            raise _Reject(Reason.ADJUSTMENT_INVALID, "a total would pass 2^53 - 1")
        p.adjustment_ids.add(adjustment.adjustment_id)
        p.totals = totals

    # §6.3 closed
    def _close(self, p: _Placement, opened: Opened, close: PlacementClosed) -> None:
        terms = p.terms
        assert terms is not None
        _require(opened, {key_id(terms.ledger_key): terms.ledger_key})
        due = terms.window_end_ms + terms.late_grace_ms
        if close.closed_at_ms < due:
            raise _Reject(Reason.CLOSE_INVALID, f"closed at {close.closed_at_ms}, due {due}")
        p.closed = True
        sla = sla_credit_minor(
            terms, p.totals.delivered_mgms, p.totals.gross_minor, p.effective_end_ms
        )
        p.totals = self._reprice(p, sla_credit=sla)


def _require(opened: Opened, required: dict[str, bytes]) -> None:
    error = check_signatures(opened.envelope, required).failure()
    if error is not None:
        raise _Reject(error.reason, error.detail)


def _outcome(
    decision: Decision,
    position: str,
    placement_id: str | None,
    opened: Opened,
    **fields: Any,
) -> Outcome:
    """The outcome of an input that opened (its bytes, hash and kind come from it)."""
    return Outcome(
        decision=decision,
        position=position,
        raw=opened.raw,
        input_hash=opened.input_hash,
        placement_id=placement_id,
        kind=opened.kind,
        opened=opened,
        **fields,
    )


def _unattributed(
    raw: bytes,
    position: str,
    placement_id: str | None,
    opened: Opened | None,
    reason: Reason,
    detail: str,
) -> Outcome:
    return Outcome(
        decision="quarantined",
        position=position,
        raw=raw,
        input_hash=sha256_hex(raw),
        placement_id=placement_id,
        kind=None if opened is None else opened.kind,
        opened=opened,
        reason=reason,
        detail=detail,
    )


def _from_snapshot(placement_id: str, data: bytes) -> _Placement:
    snap = _SNAP_DECODER.decode(data)
    if snap.version != SNAPSHOT_VERSION or snap.placement_id != placement_id:
        raise ValueError(f"snapshot of {snap.placement_id} v{snap.version} is not for this fold")
    p = _Placement(placement_id)
    if snap.terms_payload is not None:
        from proto.canonical import decode_payload

        terms = decode_payload(snap.terms_payload)
        assert isinstance(terms, PlacementTerms)
        p.accept_terms(terms, snap.terms_payload, sha256_hex(snap.terms_payload))
    p.next_index = snap.next_index
    p.head = snap.head
    p.totals = snap.totals
    p.streams = {
        s.node_id: _Stream(s.next_seq, s.last_hash, s.last_end_ms, s.last_input_hash)
        for s in snap.streams
    }
    p.bindings = {}
    for b in snap.bindings:
        p.bindings.setdefault(b.node_id, {})[b.key] = (b.valid_from_ms, b.valid_until_ms)
    p.closed = snap.closed
    p.effective_end_ms = snap.effective_end_ms
    p.reclaimed = snap.reclaimed
    p.max_usage_end_ms = snap.max_usage_end_ms
    p.adjustment_ids = set(snap.adjustment_ids)
    p.seen = set(snap.seen)
    p.held = [(raw, position) for raw, position in snap.held]
    p.held_hashes = {sha256_hex(raw) for raw, _ in p.held}
    return p


def _open(raw: bytes) -> Opened | ProtoError:
    try:
        return open_envelope(raw)
    except ProtoError as exc:
        return exc


def _sign_record(key: SigningKey, payload: bytes) -> bytes:
    return encode_envelope(sign_payload(payload, [key]))


def _verify_chunk(jobs: Sequence[tuple[bytes, bytes, bytes]]) -> list[bool]:
    return [verify(public_key, payload, sig) for public_key, payload, sig in jobs]


def _sign_chunk(key: SigningKey, payloads: Sequence[bytes | None]) -> list[bytes]:
    out = []
    for payload in payloads:
        assert payload is not None
        out.append(_sign_record(key, payload))
    return out
