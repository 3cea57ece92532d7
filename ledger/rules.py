"""The fold as a pure function (SPEC.md §6-§7): ``decide(state, opened) -> (verdict, state)``.

``decide`` takes the state of one placement and one input of it, and returns the
verdict for that input together with the placement's new state. It does no I/O, reads
no clock, calls back into nothing and never changes the state it was given: a verdict
that changes nothing (a drop, a quarantine) returns the very same state object, and a
rejection changes only the chain (its head, its length, the seen inputs) — never a
stream, a binding or a total.

What it needs from outside the state is passed in as data, looked up by the caller
before the call:

* ``accepted_at`` — the (input hash, record hash) of the accepted usage event at the
  input's ``seq``, when ``usage_lookup(state, opened)`` says it is needed (a re-delivery
  or an equivocation of an event committed earlier; SPEC §6.1 (2), §6.3 usage (3));
* ``checked`` — the result of the usage signature check when a thread pool did it ahead
  of the fold. Without it ``decide`` verifies inline (Ed25519 verification is itself a
  pure function of key, bytes and signature).

The checks run in the order SPEC.md §6 writes them; the first that fails names the
reason. Each check cites its section. Signing the records is not done here: a chained
verdict carries the record's signed bytes and hash, and the caller signs them.

``attribute`` is SPEC §6.1 (1): whether an input belongs to a placement at all.
"""

from __future__ import annotations

from enum import Enum
from hashlib import sha256
from typing import Any, Final, Literal, get_args

import msgspec

from ledger import health
from ledger.capacity import Claims, capacity_refusal
from ledger.immutable import PMap, PSet
from ledger.pricing import (
    overlap_ms,
    price,
    reclaim_credit_minor,
    release_charge_minor,
    resale_entry,
    sla_credit_minor,
)
from ledger.state import (
    NEW_STREAM,
    NO_HASHES,
    NO_HELD,
    NO_STREAM_HOLDS,
    AssignmentState,
    Attestation,
    Attested,
    PlacementState,
    StreamState,
    key_among,
    terms_fields,
)
from proto import authority, limits
from proto.attestation import (
    AttestationRoot,
    EvidenceError,
    attested_by,
    evidence_nonce,
    node_key_hash,
    parse_evidence,
)
from proto.canonical import signed_bytes
from proto.envelope import Opened, check_signatures, open_envelope, sha256_hex
from proto.errors import ProtoError
from proto.invariant import InvariantViolation, invariant, of_type
from proto.keys import verify
from proto.reasons import Reason
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    LedgerRecord,
    NodeKeyBinding,
    Party,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    ResaleTotals,
    Status,
    StreamResume,
    Totals,
    UsageEvent,
)
from proto.terms import (
    adjustment_within_bounds,
    gross_ceiling_minor,
    node_inside_residency,
    party_keys,
    validate_terms,
)

# SPEC §6: every input gets exactly one decision.
Decision = Literal["chained", "dropped", "quarantined", "held"]
DECISIONS: Final[tuple[Decision, ...]] = get_args(Decision)

INPUT_KINDS: Final = frozenset(
    {
        "terms",
        "keybinding",
        "usage",
        "reclaim",
        "adjustment",
        "closed",
        "assignment",
        "release",
        "resume",
    }
)
_AFTER_CLOSE_KINDS: Final = frozenset(
    {"usage", "keybinding", "reclaim", "closed", "assignment", "release", "resume"}
)

# (input hash, record hash) of an accepted usage event.
AcceptedEvent = tuple[str, str]


class NotLookedUp(Enum):
    """``accepted_at`` was not looked up (distinct from "looked up: none")."""

    NOT_LOOKED_UP = 0


NOT_LOOKED_UP: Final = NotLookedUp.NOT_LOOKED_UP


class CheckedSignature(msgspec.Struct, frozen=True, gc=False):
    """A usage signature checked ahead of the fold: with this key, it verified or not."""

    public_key: bytes
    valid: bool


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """What SPEC §6 decides for one input (and, for accepted terms, the inputs it released).

    A chained verdict carries its LedgerRecord, the record's signed bytes and their hash;
    the envelope (the ledger's signature over those bytes) is made by the caller.
    """

    decision: Decision
    position: str
    raw: bytes
    input_hash: str
    placement_id: str | None
    kind: str | None
    opened: Opened | None
    status: Status | None = None
    reason: Reason | None = None
    detail: str = ""
    record: LedgerRecord | None = None
    record_payload: bytes | None = None
    record_hash: str | None = None
    # SPEC §6.2: the held inputs processed right after this one (after accepted terms, in
    # arrival order; after an accepted usage event, its stream's next held events).
    released: tuple[Verdict, ...] = ()
    # SPEC §6.3 closed: the close flush, chained right before the close record.
    preceded: tuple[Verdict, ...] = ()

    def flatten(self) -> list[Verdict]:
        """The verdicts in chain order: the flush before it, this one, what it released."""
        if not self.released and not self.preceded:
            return [self]
        out: list[Verdict] = []
        for v in self.preceded:
            out.extend(v.flatten())
        out.append(self)
        for v in self.released:
            out.extend(v.flatten())
        return out


# ---- §6.1 (1): attributable or quarantined ------------------------------------------------


def attribute(
    raw: bytes, opened: Opened | ProtoError, position: str, stream_key: str | None
) -> Verdict | None:
    """SPEC §6.1 (1): the quarantine verdict of an input that is not attributable to a
    placement, or None when it is (``opened.record.placement_id`` names it)."""
    if isinstance(opened, ProtoError):
        return _quarantined(raw, position, None, None, opened.reason, opened.detail)
    placement_id: str = opened.record.placement_id
    if opened.kind not in INPUT_KINDS:
        detail = f"{opened.kind} records are not inputs"
        return _quarantined(raw, position, placement_id, opened, Reason.KIND_MISMATCH, detail)
    if stream_key is not None and stream_key != placement_id:
        detail = f"stream key {stream_key!r} differs from placement_id {placement_id!r}"
        return _quarantined(raw, position, placement_id, opened, Reason.PLACEMENT_MISMATCH, detail)
    return None


def faulted(opened: Opened, position: str, why: str) -> Verdict:
    """The quarantine verdict of an input of a placement whose stored state the ledger
    cannot use (``Fold.faulted``): kept with its bytes, never folded (SPEC §7.7)."""
    return _quarantined(
        opened.raw,
        position,
        opened.record.placement_id,
        opened,
        Reason.PLACEMENT_FAULTED,
        f"the placement's stored state cannot be used: {why}",
    )


def usage_lookup(state: PlacementState, opened: Opened) -> tuple[str, int] | None:
    """(node_id, seq) whose accepted usage event ``decide`` needs as ``accepted_at``
    for this input, or None when the state answers it (SPEC §6.1 (2), §6.3 usage (3))."""
    record = opened.record
    if not isinstance(record, UsageEvent) or state.terms is None:
        return None
    stream = state.streams.get(record.node_id)
    if stream is None or record.seq >= stream.next_seq - 1:
        return None  # the stream's head answers it (``_Run._accepted_at``)
    return record.node_id, record.seq


# ---- decide -------------------------------------------------------------------------------


def decide(
    state: PlacementState,
    opened: Opened,
    position: str,
    *,
    ledger_key: bytes,
    accepted_at: AcceptedEvent | NotLookedUp | None = NOT_LOOKED_UP,
    checked: CheckedSignature | None = None,
    claims: Claims | None = None,
    arrived_ms: int | None = None,
    attestation_roots: tuple[AttestationRoot, ...] | None = None,
    held_room: int | None = None,
) -> tuple[Verdict, PlacementState]:
    """The verdict for one attributable input of ``state``'s placement, and the new state.

    ``arrived_ms`` (SPEC §6.6): when the input reached the log (the broker's log-append
    time, or the intake log's). Every record this call chains carries
    ``max(state.arrived_ms, arrived_ms)``. None chains untimed records (records of
    before §6.6; the ledger's intake always passes a time) and applies no time rule.

    ``ledger_key`` is the public key of the ledger folding the stream (SPEC §5 (6)).
    See the module docstring for ``accepted_at`` and ``checked``. ``claims``: for a terms
    input, the claims of other placements of the same ordered stream on its GPUs (SPEC
    §6.5, ``ledger.capacity``); None checks none. ``attestation_roots`` (SPEC §6.9): the
    attestation services whose signature hardware evidence needs; None (no root
    configured) judges everything of the evidence but its signature. ``held_room``
    (SPEC §6.2, the ledger-wide bound): the envelope bytes the ledger may still hold over
    all its placements; an input to hold that is larger is quarantined. None: no bound
    (the placement's own bounds always apply).
    """
    if opened.record.placement_id != state.placement_id:
        raise InvariantViolation(
            f"an input of {opened.record.placement_id} for {state.placement_id}"
        )
    arrived = arrived_ms
    if arrived is not None and state.arrived_ms is not None:
        arrived = max(arrived, state.arrived_ms)
    run = _Run(ledger_key, accepted_at, claims, arrived, attestation_roots, held_room)
    verdict, new = run.one(state, opened, position, checked)
    if state.terms is None and new.terms is not None and new.held:
        # SPEC §6.2: held inputs are processed right after the accepted terms.
        released, new = run.release(new)
        verdict = msgspec.structs.replace(verdict, released=tuple(released))
    return verdict, new


class _Drop(Exception):
    """Control flow: the input is a re-delivery (SPEC §6.1 (2), §6.3): dropped."""


class _HoldInStream(Exception):
    """Control flow: a usage event beyond its stream's next seq waits (SPEC §6.2)."""


class _Reject(Exception):
    def __init__(
        self, reason: Reason, detail: str = "", takes: tuple[str, int] | None = None
    ) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.detail = detail
        # (node_id, seq) a rejected usage event takes for good (SPEC §6.3 usage (3)).
        self.takes = takes
        # SPEC §6.3 usage, rejected for its content: the record hash the stream advances
        # to (its seq taken by advancing past it), or None.
        self.advances: str | None = None


def _weighted(share_milli: int, weight: int, event: UsageEvent, from_ms: int, to_ms: int) -> int:
    """SPEC §7.1, §7.1.2: a counting sample's delivered milli-GPU-ms over [from_ms, to_ms)."""
    overlap = overlap_ms(event.start_ms, event.end_ms, from_ms, to_ms)
    return health.delivered_mgms(share_milli, overlap, weight)


class _Run:
    """One call of ``decide``: its inputs from outside, and the usage events it accepted
    (held inputs released by terms can re-deliver one of those)."""

    __slots__ = ("accepted", "accepted_at", "arrived", "claims", "ledger_key", "room", "roots")

    def __init__(
        self,
        ledger_key: bytes,
        accepted_at: AcceptedEvent | NotLookedUp | None,
        claims: Claims | None = None,
        arrived: int | None = None,
        roots: tuple[AttestationRoot, ...] | None = None,
        room: int | None = None,
    ) -> None:
        self.ledger_key = ledger_key
        # SPEC §6.2: bytes the ledger may still hold (None: no ledger-wide bound). Only the
        # input ``decide`` was given can add to what the ledger holds: a released input
        # held again (in its stream) was counted when it was first held.
        self.room = room
        self.roots = roots
        self.arrived = arrived
        self.accepted_at = accepted_at
        self.claims = claims
        self.accepted: dict[tuple[str, int], AcceptedEvent] = {}

    def one(
        self,
        state: PlacementState,
        opened: Opened,
        position: str,
        checked: CheckedSignature | None,
    ) -> tuple[Verdict, PlacementState]:
        # §6.1 (2): an exact re-delivery is dropped.
        if self._is_redelivery(state, opened):
            return _dropped(state, opened, position), state
        # §6.1 (3), §6.2: inputs before the terms are held, up to the bound.
        if state.terms is None and opened.kind != "terms":
            full = _hold_bound(state, opened, self.room)
            if full is not None:
                verdict = _quarantined(
                    opened.raw,
                    position,
                    state.placement_id,
                    opened,
                    Reason.UNKNOWN_PLACEMENT,
                    f"{full} without terms",
                )
                return verdict, state
            new = msgspec.structs.replace(
                state,
                held=state.held.append((opened.raw, position), len(opened.raw)),
                held_hashes=state.held_hashes.add(opened.input_hash),
                held_arrived=_with_arrival(state.held_arrived, position, self.arrived),
            )
            return _verdict("held", position, state.placement_id, opened), new
        return self._process(state, opened, position, checked)

    def release(self, state: PlacementState) -> tuple[list[Verdict], PlacementState]:
        """SPEC §6.2: the held inputs in arrival order, as if they arrived now (§6.6: each
        record carries max(a_prev, the input's own arrival))."""
        held = list(state.held)
        state = msgspec.structs.replace(state, held=NO_HELD, held_hashes=NO_HASHES)
        verdicts = []
        releasing, room = self.arrived, self.room
        self.room = None  # counted when held: held again in a stream, still counted once
        try:
            for raw, position in held:
                opened = open_envelope(raw)  # it decoded when it was held
                state, self.arrived = _released_arrival(state, position, releasing)
                verdict, state = self.one(state, opened, position, None)
                verdicts.append(verdict)
        finally:
            self.arrived, self.room = releasing, room
        return verdicts, state

    # §6.1 (2)
    def _is_redelivery(self, state: PlacementState, opened: Opened) -> bool:
        if opened.input_hash in state.seen or (
            state.held_hashes is not NO_HASHES and opened.input_hash in state.held_hashes
        ):
            return True
        record = opened.record
        if isinstance(record, UsageEvent) and state.terms is not None:
            held = state.stream_held.get(record.node_id)
            if held is not None and record.seq in held:
                return held[record.seq][2] == opened.input_hash
            stream = state.streams.get(record.node_id)
            if stream is not None and record.seq < stream.next_seq:
                accepted = self._accepted_at(state, stream, record.node_id, record.seq)
                return accepted is not None and accepted[0] == opened.input_hash
        return False

    def _accepted_at(
        self, state: PlacementState, stream: StreamState, node_id: str, seq: int
    ) -> AcceptedEvent | None:
        if seq == stream.next_seq - 1:
            # the head: an accepted event, or a content rejection (SPEC §6.3 usage), which
            # leaves no input hash: no event was accepted at that seq
            return (stream.last_input_hash, stream.last_hash) if stream.last_input_hash else None
        mine = self.accepted.get((node_id, seq))
        if mine is not None:
            return mine
        given = self.accepted_at
        invariant(
            given is not NOT_LOOKED_UP,
            f"decide needs the accepted usage event at {state.placement_id}/{node_id}/{seq}: "
            "look it up (usage_lookup) before the call",
        )
        return None if isinstance(given, NotLookedUp) else given

    # §6.1 (4) and §6.3
    def _process(
        self,
        state: PlacementState,
        opened: Opened,
        position: str,
        checked: CheckedSignature | None,
        *,
        release: bool = True,
    ) -> tuple[Verdict, PlacementState]:
        record = opened.record
        delivered = 0
        try:
            # §6.1 (4): after the close only adjustments (and terms: dropped/conflict).
            if state.closed and opened.kind in _AFTER_CLOSE_KINDS:
                raise _Reject(Reason.AFTER_CLOSE, "the placement is closed")
            terms = state.terms
            if isinstance(record, PlacementTerms):
                new = self._terms(state, opened, record)
            elif terms is None:  # pragma: no cover - §6.1 (3) held it
                raise AssertionError(f"{opened.kind} input without terms was not held")
            elif isinstance(record, NodeKeyBinding):
                new = _key_binding(state, terms, opened, record, self.arrived, self.roots)
            elif isinstance(record, UsageEvent):
                new, delivered = self._usage(state, terms, opened, record, checked)
            elif isinstance(record, ReclaimNotice):
                new = _reclaim(state, terms, opened, record, self.arrived)
            elif isinstance(record, Adjustment):
                new = _adjustment(state, terms, opened, record)
            elif isinstance(record, PlacementClosed):
                new = _close(state, terms, opened, record)
            elif isinstance(record, Assignment):
                new = _assignment(state, terms, opened, record, self.arrived)
            elif isinstance(record, BuyerRelease):
                new = _release(state, terms, opened, record, self.arrived)
            elif isinstance(record, StreamResume):
                new = _resume(state, terms, opened, record)
            else:  # pragma: no cover - attribute() lets only INPUT_KINDS through
                raise InvariantViolation(f"no rule for kind {opened.kind}")
        except _Drop:
            return _dropped(state, opened, position), state
        except _HoldInStream:
            return _hold_in_stream(state, opened, position, self.arrived, self.room)
        except _Reject as rejection:
            verdict, state = _chain_rejection(state, opened, position, rejection, self.arrived)
            if release and rejection.advances is not None and isinstance(record, UsageEvent):
                # SPEC §6.3 usage: a content rejection advances the stream like an
                # accepted event, so the held event at the new next seq comes next.
                verdict, state = self._after_advance(verdict, state, record.node_id)
            return verdict, state
        flush: list[Verdict] = []
        if isinstance(record, PlacementClosed):
            # §6.3 closed: the close flush comes first, then the close record.
            flush, state = _close_flush(state, self.arrived)
        elif isinstance(record, StreamResume):
            # §6.3 resume: the resume flush comes first, then the resume record.
            flush, state = _resume_flush(state, record, self.arrived)
        totals: Totals = new.pop("totals", state.totals)
        # Accepted usage events are recognised by their stream position, not in ``seen``.
        seen = state.seen if isinstance(record, UsageEvent) else state.seen.add(opened.input_hash)
        verdict, state = _chain(
            state,
            seen,
            opened,
            position,
            "accepted",
            None,
            delivered,
            "",
            totals,
            new,
            self.arrived,
        )
        if flush:
            verdict = msgspec.structs.replace(verdict, preceded=tuple(flush))
        if release and isinstance(record, UsageEvent | StreamResume):
            verdict, state = self._after_advance(verdict, state, record.node_id)
        return verdict, state

    def _after_advance(
        self, verdict: Verdict, state: PlacementState, node_id: str
    ) -> tuple[Verdict, PlacementState]:
        """SPEC §6.2: the node's stream advanced; its held events that are next follow."""
        if node_id not in state.stream_held:
            return verdict, state
        released, state = self._release_stream(state, node_id)
        if released:
            verdict = msgspec.structs.replace(verdict, released=tuple(released))
        return verdict, state

    def _release_stream(
        self, state: PlacementState, node_id: str
    ) -> tuple[list[Verdict], PlacementState]:
        """SPEC §6.2: the stream's held events that are next in seq order, as if they
        arrived now (each one accepted advances the stream to the next)."""
        released: list[Verdict] = []
        releasing = self.arrived
        try:
            for _ in range(limits.MAX_HELD_PER_PLACEMENT):
                held = state.stream_held.get(node_id)
                stream = state.streams.get(node_id, NEW_STREAM)
                if not held or stream.next_seq not in held:
                    break
                raw, position, _ = held[stream.next_seq]
                state = _without_held(state, node_id, stream.next_seq, len(raw))
                opened = open_envelope(raw)  # it decoded when it was held
                state, self.arrived = _released_arrival(state, position, releasing)
                verdict, state = self._process(state, opened, position, None, release=False)
                released.append(verdict)
                if state.streams.get(node_id, NEW_STREAM).next_seq == stream.next_seq:
                    break  # the stream did not advance: the rest waits
        finally:
            self.arrived = releasing
        return released, state

    # §6.3 terms
    def _terms(
        self, state: PlacementState, opened: Opened, terms: PlacementTerms
    ) -> dict[str, Any]:
        accepted = state.terms
        if accepted is not None:
            # (1) a re-delivery; (2) not an amendment of the accepted terms: a conflict
            if opened.record_hash == state.terms_record_hash:
                raise _Drop
            if not (
                terms.version == accepted.version + 1
                and terms.supersedes == state.terms_record_hash
            ):
                raise _Reject(
                    Reason.TERMS_CONFLICT,
                    "the placement already has other terms, and these do not amend them",
                )
            # (3) an amendment: the accepted terms' three parties sign it
            _require(opened, party_keys(accepted))
            same = (terms.operator, terms.buyer, terms.desk, terms.ledger_key) == (
                accepted.operator,
                accepted.buyer,
                accepted.desk,
                accepted.ledger_key,
            )
            if not same:
                raise _Reject(
                    Reason.TERMS_INVALID, "an amendment names other parties or another ledger"
                )
        else:
            _require(opened, party_keys(terms))
        problems = validate_terms(terms)
        if accepted is None and terms.version != 1:
            problems.append(f"version {terms.version}: no terms were accepted to amend")
        if problems:
            raise _Reject(Reason.TERMS_INVALID, "; ".join(problems))
        if terms.ledger_key != self.ledger_key:
            raise _Reject(Reason.TERMS_INVALID, "ledger_key names another ledger")
        if accepted is not None and _priced(state):
            raise _Reject(
                Reason.AMENDMENT_TOO_LATE,
                "usage, a reclaim, an adjustment, an assignment or the close was already accepted",
            )
        refusal = None if self.claims is None else capacity_refusal(terms, self.claims)
        if refusal is not None:  # §6.5: capacity is sold once
            raise _Reject(*refusal)
        # (4) accepted: the terms (or the amendment) in force from here on
        return terms_fields(terms, opened.payload, opened.record_hash)

    # §6.3 usage
    def _usage(
        self,
        state: PlacementState,
        terms: PlacementTerms,
        opened: Opened,
        event: UsageEvent,
        checked: CheckedSignature | None,
    ) -> tuple[dict[str, Any], int]:
        """SPEC §6.3 usage, step by step (the verifier's ``Referee._usage`` reads alongside)."""
        # (1) the node is in the terms; (2) its one valid signature covers the interval
        public_key, keyid = _usage_signer(state, opened, event, checked)
        # (2a) §5.2 R2: the node is inside the terms' residency policy (before the stream
        # position: the event takes no seq, so nothing of the node is held behind it)
        _usage_residency(terms, event.node_id)
        # (3) the stream position: re-delivery, equivocation, held beyond a gap, fork
        stream = self._usage_position(state, opened, event)
        takes = (event.node_id, event.seq)
        try:
            # (4) the interval, (5) the window
            _usage_content(state, terms, event, stream, self.arrived, takes)
            # (6) the samples; §7.1 delivered (and §7.10 what an assignment resold)
            delivered, resold = _usage_delivered(
                state, terms, event, stream, public_key, keyid, takes
            )
        except _Reject as rejection:
            if terms.created_at_ms >= limits.REJECTION_ADVANCES_FROM_MS:
                # §6.3 usage: authentic and in its place, rejected for its content
                rejection.advances = opened.record_hash
            raise
        # (7) accepted: advance the stream and fold
        self.accepted[(event.node_id, event.seq)] = (opened.input_hash, opened.record_hash)
        return _usage_accepted(state, terms, opened, event, stream, delivered, resold), delivered

    def _usage_position(
        self, state: PlacementState, opened: Opened, event: UsageEvent
    ) -> StreamState:
        """SPEC §6.3 usage (3): the event's stream when it is next and links to the head;
        raises for a re-delivery, an equivocation, a hold beyond a gap, a fork."""
        node_id = event.node_id
        stream = state.streams.get(node_id, NEW_STREAM)
        if event.seq < stream.next_seq:
            accepted = self._accepted_at(state, stream, node_id, event.seq)
            if accepted is not None and accepted[1] == opened.record_hash:
                raise _Drop
            if accepted is None:  # §6.3 usage: taken by a content rejection
                raise _Reject(
                    Reason.EQUIVOCATION, f"seq {event.seq} was taken by an event rejected before"
                )
            raise _Reject(Reason.EQUIVOCATION, f"a different event for accepted seq {event.seq}")
        if event.seq in state.taken.get(node_id, ()):
            raise _Reject(Reason.EQUIVOCATION, f"seq {event.seq} was taken by a rejected event")
        if event.seq > stream.next_seq:
            if event.seq in state.stream_held.get(node_id, {}):
                raise _Reject(Reason.EQUIVOCATION, f"a different event for held seq {event.seq}")
            raise _HoldInStream
        if event.prev != stream.last_hash:
            raise _Reject(
                Reason.PREV_MISMATCH,
                f"prev {event.prev}, expected {stream.last_hash}",
                (node_id, event.seq),
            )
        return stream


def _usage_signer(
    state: PlacementState,
    opened: Opened,
    event: UsageEvent,
    checked: CheckedSignature | None,
) -> tuple[bytes, str]:
    """SPEC §6.3 usage (1) and (2): the node is in the terms; one signature, by a key bound
    to the node, valid, not revoked, its binding covering the interval. The key and its id."""
    node_id = event.node_id
    bound = state.bindings.get(node_id)
    if bound is None:
        raise _Reject(Reason.NODE_UNKNOWN, f"node {node_id!r} is not in the terms")
    signatures = opened.envelope.signatures
    if not signatures:
        raise _Reject(Reason.SIG_MISSING, "usage must be signed by its node")
    if len(signatures) > 1:
        raise _Reject(Reason.SIG_SURPLUS, f"{len(signatures)} signatures, want 1")
    signature = signatures[0]
    public_key = key_among(bound, signature.keyid)  # state.key_for(node_id, keyid)
    if public_key is None:
        raise _Reject(Reason.NODE_KEY_UNKNOWN, f"key {signature.keyid} is not bound to node")
    valid_from, valid_until = bound[public_key]
    if checked is not None and checked.public_key == public_key:
        valid = checked.valid
    else:
        valid = verify(public_key, opened.payload, signature.sig)
    if not valid:
        raise _Reject(Reason.SIG_INVALID, f"bad signature by key {signature.keyid}")
    if public_key in state.revoked.get(node_id, ()):
        # §6.6: a revocation applies at its arrival, whatever interval is claimed.
        raise _Reject(Reason.NODE_KEY_REVOKED, f"key {signature.keyid} was revoked")
    if not (valid_from <= event.start_ms and event.end_ms <= valid_until):
        raise _Reject(Reason.NODE_KEY_NOT_VALID, "the key's binding does not cover the interval")
    return public_key, signature.keyid


def _usage_residency(terms: PlacementTerms, node_id: str) -> None:
    """SPEC §6.3 usage (2a), §5.2 R2: the node lies inside the residency policy."""
    if terms.residency is None:
        return
    region = next((n.region for n in terms.nodes if n.node_id == node_id), "")
    if not node_inside_residency(terms, region):
        raise _Reject(
            Reason.RESIDENCY,
            f"node {node_id} is in region {region!r}, outside the allowed regions "
            f"{', '.join(terms.residency.allowed_regions)}",
        )


def _usage_content(
    state: PlacementState,
    terms: PlacementTerms,
    event: UsageEvent,
    stream: StreamState,
    arrived: int | None,
    takes: tuple[str, int],
) -> None:
    """SPEC §6.3 usage (4) the interval and (5) the window (the release, the arrival)."""
    if not (
        event.start_ms < event.end_ms and event.end_ms - event.start_ms <= limits.MAX_INTERVAL_MS
    ):
        raise _Reject(Reason.INTERVAL_INVALID, f"[{event.start_ms}, {event.end_ms})", takes)
    if event.seq > 0 and event.start_ms < stream.last_end_ms:
        raise _Reject(
            Reason.INTERVAL_OVERLAP,
            f"starts at {event.start_ms}, the previous ended at {stream.last_end_ms}",
            takes,
        )
    if not (event.end_ms > terms.window_start_ms and event.start_ms < terms.window_end_ms):
        raise _Reject(Reason.OUTSIDE_WINDOW, f"[{event.start_ms}, {event.end_ms})", takes)
    released = state.release_end_ms
    if released is not None and event.start_ms >= released:
        # §6.7: the buyer released the placement from ``released`` on.
        raise _Reject(
            Reason.AFTER_RELEASE, f"starts at {event.start_ms}, released from {released}", takes
        )
    if arrived is not None and event.end_ms > arrived + limits.MAX_CLOCK_SKEW_MS:
        # §6.6: a node reports what it measured; nothing ends after it arrived.
        raise _Reject(Reason.FUTURE_DATED, f"ends at {event.end_ms}, arrived at {arrived}", takes)


def _usage_delivered(
    state: PlacementState,
    terms: PlacementTerms,
    event: UsageEvent,
    stream: StreamState,
    public_key: bytes,
    keyid: str,
    takes: tuple[str, int],
) -> tuple[int, list[int]]:
    """SPEC §6.3 usage (6) the samples; §7.1 what they deliver, §7.10 what of it each
    assignment resold (by the assignments' order)."""
    if len(event.samples) > 1:
        uuids = [s.uuid for s in event.samples]
        if len(set(uuids)) != len(uuids):
            raise _Reject(Reason.SAMPLE_DUPLICATE_GPU, "a GPU is sampled twice", takes)
    delivered = 0
    assignments = state.assignments
    resold = [0] * len(assignments)
    for sample in event.samples:
        spec = state.gpus.get(sample.uuid)
        if spec is None or spec.node_id != event.node_id:
            raise _Reject(Reason.GPU_NOT_IN_TERMS, f"GPU {sample.uuid} on {event.node_id}", takes)
        if spec.model != sample.model:
            raise _Reject(
                Reason.GPU_MODEL_MISMATCH,
                f"GPU {sample.uuid}: {sample.model} != {spec.model}",
                takes,
            )
        if terms.attestation_required:
            _usage_attested(state, event, sample.uuid, public_key, keyid, takes)
        if health.counts(sample, event.seq == 0, stream.retired, terms.metering):
            weight = health.weight_bps(sample, terms.metering)
            end_ms, share = state.effective_end_ms, spec.share_milli
            delivered += _weighted(share, weight, event, terms.window_start_ms, end_ms)
            # §7.10: the same time on an assigned GPU, from the handover on
            for k, assigned in enumerate(assignments):
                if sample.uuid in assigned.gpus:
                    resold[k] += _weighted(share, weight, event, assigned.handover_ms, end_ms)
    return delivered, resold


def _usage_attested(
    state: PlacementState,
    event: UsageEvent,
    uuid: str,
    public_key: bytes,
    keyid: str,
    takes: tuple[str, int],
) -> None:
    """SPEC §6.9: only attested keys carry usage, and only for the GPUs attested."""
    attestation = state.attested.get(event.node_id, {}).get(public_key)
    if attestation is None or uuid not in attestation.gpus:
        raise _Reject(
            Reason.NOT_ATTESTED, f"key {keyid} has no accepted evidence for GPU {uuid}", takes
        )
    # §6.9 Expiry: judged by the event's end, the whole event
    expires_ms = attestation.iat * 1000 + limits.MAX_ATTESTATION_VALIDITY_MS
    if event.end_ms > expires_ms:
        raise _Reject(
            Reason.NOT_ATTESTED,
            f"the attestation of key {keyid} (iat {attestation.iat}) "
            f"expired at {expires_ms} (iat + MAX_ATTESTATION_VALIDITY_MS); the "
            f"event ends at {event.end_ms}; the operator re-attests with a "
            "binding that only attests (SPEC §6.9)",
            takes,
        )


def _usage_accepted(
    state: PlacementState,
    terms: PlacementTerms,
    opened: Opened,
    event: UsageEvent,
    stream: StreamState,
    delivered: int,
    resold: list[int],
) -> dict[str, Any]:
    """SPEC §6.3 usage (7): the stream advances; the totals and assignments fold."""
    streams = dict(state.streams)
    streams[event.node_id] = StreamState(
        event.seq + 1,
        opened.record_hash,
        event.end_ms,
        opened.input_hash,
        health.retired_after(stream.retired, event.samples),
    )
    changes: dict[str, Any] = {
        "streams": streams,
        "max_usage_end_ms": max(state.max_usage_end_ms, event.end_ms),
    }
    assignments = state.assignments
    if assignments and any(resold):
        changes["assignments"] = tuple(
            msgspec.structs.replace(a, delivered_mgms=a.delivered_mgms + extra)
            for a, extra in zip(assignments, resold, strict=True)
        )
    if delivered:
        current = state.totals  # _reprice(delivered_mgms=...), without its dicts
        changes["totals"] = price(
            terms,
            delivered_mgms=current.delivered_mgms + delivered,
            reclaim_credit=current.reclaim_credit_minor,
            sla_credit=current.sla_credit_minor,
            adjustment_credit=current.adjustment_credit_minor,
            adjustment_charge=current.adjustment_charge_minor,
            release_charge=current.release_charge_minor,
        )
    return changes


def _chain_rejection(
    state: PlacementState, opened: Opened, position: str, rejection: _Reject, arrived: int | None
) -> tuple[Verdict, PlacementState]:
    """A rejection is chained (SPEC §6) and changes nothing else — but a usage event
    rejected from §6.3 usage (3) on takes its seq: for its content (terms of
    REJECTION_ADVANCES_FROM_MS on) by advancing the stream past it, else for good."""
    seen = state.seen.add(opened.input_hash)
    changes: dict[str, Any] = {}
    if rejection.advances is not None and rejection.takes is not None:
        node_id, seq = rejection.takes
        streams = dict(state.streams)
        stream = streams.get(node_id, NEW_STREAM)
        # last_end_ms and the health evidence stay the last accepted event's; no input
        # hash: the head is not an accepted event (``_accepted_at``)
        streams[node_id] = msgspec.structs.replace(
            stream, next_seq=seq + 1, last_hash=rejection.advances, last_input_hash=""
        )
        changes["streams"] = streams
    elif rejection.takes is not None:
        node_id, seq = rejection.takes
        taken = dict(state.taken)
        taken[node_id] = taken.get(node_id, frozenset()) | {seq}
        changes["taken"] = taken
    return _chain(
        state,
        seen,
        opened,
        position,
        "rejected",
        rejection.reason,
        0,
        rejection.detail,
        state.totals,
        changes,
        arrived,
    )


# §6.3 terms (3): whether anything was priced (an amendment comes too late then).
def _priced(state: PlacementState) -> bool:
    return (
        state.closed
        or state.reclaimed
        or state.release_end_ms is not None
        or len(state.adjustment_ids) > 0
        or len(state.assignments) > 0
        # an accepted event ends after 0 (§6.3 usage (5)); a content rejection leaves 0
        or any(stream.last_end_ms > 0 for stream in state.streams.values())
    )


# §6.2: a usage event waits in its stream
def _hold_in_stream(
    state: PlacementState,
    opened: Opened,
    position: str,
    arrived: int | None,
    room: int | None,
) -> tuple[Verdict, PlacementState]:
    event = of_type(opened.record, UsageEvent, "an event held in its stream")
    full = _hold_bound(state, opened, room)
    if full is not None:
        verdict = _quarantined(
            opened.raw, position, state.placement_id, opened, Reason.HOLD_FULL, full
        )
        return verdict, state
    holds = dict(state.stream_held)
    holds[event.node_id] = holds.get(event.node_id, NO_STREAM_HOLDS).set(
        event.seq, (opened.raw, position, opened.input_hash), len(opened.raw)
    )
    new = msgspec.structs.replace(
        state,
        stream_held=holds,
        held_arrived=_with_arrival(state.held_arrived, position, arrived),
    )
    return _verdict("held", position, state.placement_id, opened), new


def _hold_bound(state: PlacementState, opened: Opened, room: int | None) -> str | None:
    """SPEC §6.2: why holding ``opened`` would pass a hold bound (the detail of its
    quarantine), or None. The placement's bounds first (its count, then its bytes: both
    follow from its own stream), then the ledger-wide one (``room``)."""
    if state.held_count() >= limits.MAX_HELD_PER_PLACEMENT:
        return f"{limits.MAX_HELD_PER_PLACEMENT} inputs already held"
    size = len(opened.raw)
    held = state.held_bytes()
    if held + size > limits.MAX_HELD_BYTES_PER_PLACEMENT:
        return (
            f"{held} bytes already held, {size} more would pass "
            f"{limits.MAX_HELD_BYTES_PER_PLACEMENT} bytes per placement"
        )
    if room is not None and size > room:
        return f"ledger-wide: {size} bytes more than the ledger may hold ({room} left)"
    return None


def _with_arrival(
    held_arrived: PMap[str, int], position: str, arrived: int | None
) -> PMap[str, int]:
    """SPEC §6.6: remember when a held input arrived (nothing for an untimed one)."""
    if arrived is None:
        return held_arrived
    return held_arrived.set(position, arrived)


def _released_arrival(
    state: PlacementState, position: str, releasing: int | None
) -> tuple[PlacementState, int | None]:
    """SPEC §6.6: the arrival a released held input's record carries: max(a_prev, its own
    arrival); the releasing input's when it has none. Forgets the held arrival."""
    own = state.held_arrived.get(position)
    if own is None:
        return state, releasing
    state = msgspec.structs.replace(state, held_arrived=state.held_arrived.delete(position))
    if releasing is None:
        return state, own
    return state, max(own, releasing if state.arrived_ms is None else state.arrived_ms)


def _without_held(state: PlacementState, node_id: str, seq: int, size: int) -> PlacementState:
    holds = dict(state.stream_held)
    rest = holds[node_id].delete(seq, size)
    if rest:
        holds[node_id] = rest
    else:
        del holds[node_id]
    return msgspec.structs.replace(state, stream_held=holds)


# §6.3 closed: the close flush — every event still held is chained as rejected SEQ_GAP.
def _close_flush(
    state: PlacementState, arrived: int | None
) -> tuple[list[Verdict], PlacementState]:
    holds = state.stream_held
    if not holds:
        return [], state
    state = msgspec.structs.replace(state, stream_held={})
    verdicts: list[Verdict] = []
    for node_id in sorted(holds):
        expected = state.streams.get(node_id, NEW_STREAM).next_seq
        for seq in sorted(holds[node_id]):
            detail = f"seq {seq} still held at the close; the stream expected {expected}"
            state = _flushed(state, holds[node_id][seq], detail, arrived, verdicts)
    return verdicts, state


# §6.3 resume: the resume flush — the node's held events below from_seq, rejected SEQ_GAP.
def _resume_flush(
    state: PlacementState, resume: StreamResume, arrived: int | None
) -> tuple[list[Verdict], PlacementState]:
    held = state.stream_held.get(resume.node_id)
    verdicts: list[Verdict] = []
    if not held:
        return verdicts, state
    gone = sorted(seq for seq in held if seq < resume.from_seq)
    for seq in gone:
        entry = held[seq]
        state = _without_held(state, resume.node_id, seq, len(entry[0]))
        detail = f"seq {seq} still held when the stream resumed at seq {resume.from_seq}"
        state = _flushed(state, entry, detail, arrived, verdicts)
    return verdicts, state


def _flushed(
    state: PlacementState,
    entry: tuple[bytes, str, str],
    detail: str,
    arrived: int | None,
    verdicts: list[Verdict],
) -> PlacementState:
    """One held event chained as rejected SEQ_GAP (a flush); its verdict appended."""
    raw, position, input_hash = entry
    opened = open_envelope(raw)  # it decoded when it was held
    state, flushed_at = _released_arrival(state, position, arrived)
    verdict, state = _chain(
        state,
        state.seen.add(input_hash),
        opened,
        position,
        "rejected",
        Reason.SEQ_GAP,
        0,
        detail,
        state.totals,
        {},
        flushed_at,
    )
    verdicts.append(verdict)
    return state


# §6.3 keybinding
def _key_binding(
    state: PlacementState,
    terms: PlacementTerms,
    opened: Opened,
    binding: NodeKeyBinding,
    arrived: int | None,
    roots: tuple[AttestationRoot, ...] | None = None,
) -> dict[str, Any]:
    # §4.0: a binding that introduces or extends a key needs the operator and the buyer;
    # one that only shortens (or only attests for) the current binding of (node, key)
    # the operator alone.
    keys = state.bindings.get(binding.node_id)
    current = None if keys is None else keys.get(binding.key)
    node_revoked = state.revoked.get(binding.node_id, frozenset())
    revoked = binding.key in node_revoked
    shortens = authority.only_shortens(binding, current)
    attests_only = authority.only_attests(binding, current, revoked)
    _require_roles(opened, terms, binding, current, revoked)
    if keys is None:
        raise _Reject(Reason.NODE_UNKNOWN, f"node {binding.node_id!r} is not in the terms")
    if binding.valid_from_ms >= binding.valid_until_ms:
        raise _Reject(Reason.BINDING_INVALID, "valid_from_ms is not before valid_until_ms")
    if not shortens:
        # §6.3: a node key is nobody's party key — not the terms' operator, buyer, desk or
        # ledger key, nor an accepted new buyer's (§6.8): a meter never signs for money.
        party = _party_of_key(state, terms, binding.key)
        if party is not None:
            raise _Reject(Reason.BINDING_INVALID, f"the key is the {party}'s key")
    # §6.9 (6): evidence is judged fresh against the arrival (untimed: the issued time).
    at = binding.issued_at_ms if arrived is None else arrived
    if attests_only:
        # §6.9: the binding stays as it is; only the evidence is judged.
        return {"attested": _evidence(state, terms, binding, roots, at)}
    now_revoked = dict(state.revoked)
    if shortens and current is not None:
        # §6.3, §6.6: a revocation keeps the start and applies from its arrival on.
        window = (current[0], binding.valid_until_ms)
        now_revoked[binding.node_id] = node_revoked | {binding.key}
    else:
        # §6.6: an introduction or extension takes effect at its arrival.
        start = binding.valid_from_ms
        if arrived is not None:
            if current is None or binding.key in node_revoked:
                start = max(start, arrived)
            else:
                start = max(start, min(current[0], arrived))
        if start >= binding.valid_until_ms:
            raise _Reject(Reason.BINDING_INVALID, "the binding ends before it arrived")
        window = (start, binding.valid_until_ms)
        if binding.key in node_revoked:
            rest = node_revoked - {binding.key}
            if rest:
                now_revoked[binding.node_id] = rest
            else:
                del now_revoked[binding.node_id]
    attested = state.attested
    if binding.evidence:  # §6.9, after the checks of §6.3
        attested = _evidence(state, terms, binding, roots, at)
    bindings = dict(state.bindings)
    bindings[binding.node_id] = {**keys, binding.key: window}
    return {"bindings": bindings, "revoked": now_revoked, "attested": attested}


def _party_of_key(state: PlacementState, terms: PlacementTerms, key: bytes) -> str | None:
    """§6.3 keybinding: which party ``key`` belongs to (None: none)."""
    named = (
        ("operator", terms.operator.key),
        ("buyer", terms.buyer.key),
        ("desk", terms.desk.key),
        ("ledger", terms.ledger_key),
    )
    for party, party_key in named:
        if key == party_key:
            return party
    for accepted in state.assignments:
        if key == accepted.new_buyer.key:
            return f"new buyer {accepted.new_buyer.id!r} (assignment {accepted.assignment_id})"
    return None


# §6.9: the checks of a binding's hardware evidence, in order; the attestations after it.
def _evidence(
    state: PlacementState,
    terms: PlacementTerms,
    binding: NodeKeyBinding,
    roots: tuple[AttestationRoot, ...] | None,
    at: int,
) -> Attested:
    try:  # (1)
        evidence = parse_evidence(binding.evidence)
    except EvidenceError as exc:
        raise _Reject(Reason.EVIDENCE_INVALID, f"evidence: {exc}") from exc
    claims = evidence.claims
    if not claims.overall_result:
        raise _Reject(Reason.EVIDENCE_INVALID, "the attestation service's overall result is false")
    # (2) the nonce of this binding, (3) the hash of this key
    nonce = evidence_nonce(binding.placement_id, binding.node_id, binding.key)
    if claims.eat_nonce != nonce:
        raise _Reject(Reason.EVIDENCE_INVALID, f"eat_nonce {claims.eat_nonce}, expected {nonce}")
    if claims.node_key_sha256 != node_key_hash(binding.key):
        raise _Reject(Reason.EVIDENCE_INVALID, "the evidence names another node key")
    # (4) the GPUs: distinct, on this node in the terms, of the terms' model
    uuids = [g.ueid for g in claims.submods.values()]
    if len(set(uuids)) != len(uuids):
        raise _Reject(Reason.EVIDENCE_INVALID, "a GPU is attested twice")
    for gpu in claims.submods.values():
        spec = state.gpus.get(gpu.ueid)
        if spec is None or spec.node_id != binding.node_id:
            raise _Reject(
                Reason.EVIDENCE_INVALID, f"GPU {gpu.ueid} is not on {binding.node_id} in the terms"
            )
        if spec.model != gpu.hwmodel:
            raise _Reject(Reason.EVIDENCE_INVALID, f"GPU {gpu.ueid}: {gpu.hwmodel} != {spec.model}")
    # (5) the signature, by a configured root (none configured: not judged)
    attester = ""
    if roots is not None:
        found = attested_by(evidence, roots)
        if found is None:
            raise _Reject(
                Reason.EVIDENCE_INVALID,
                f"no attestation root signed it ({evidence.header.alg}, kid "
                f"{evidence.header.kid!r})",
            )
        attester = found
    # (6) fresh: issued at most MAX_EVIDENCE_AGE_MS before the arrival, not in its future
    issued_ms = claims.iat * 1000
    if issued_ms < at - limits.MAX_EVIDENCE_AGE_MS:
        raise _Reject(
            Reason.EVIDENCE_INVALID,
            f"iat {claims.iat} is more than MAX_EVIDENCE_AGE_MS "
            f"({limits.MAX_EVIDENCE_AGE_MS} ms) before the binding's arrival {at}",
        )
    if issued_ms > at + limits.MAX_CLOCK_SKEW_MS:
        raise _Reject(
            Reason.EVIDENCE_INVALID,
            f"iat {claims.iat} is more than MAX_CLOCK_SKEW_MS "
            f"({limits.MAX_CLOCK_SKEW_MS} ms) after the binding's arrival {at}",
        )
    attestation = Attestation(
        tuple(sorted(uuids)), attester, claims.iss, claims.iat, state.next_index
    )
    node = {**state.attested.get(binding.node_id, {}), binding.key: attestation}
    return {**state.attested, binding.node_id: node}


# §6.3 reclaim; §7.3 reclaim credit
def _reclaim(
    state: PlacementState,
    terms: PlacementTerms,
    opened: Opened,
    notice: ReclaimNotice,
    arrived: int | None,
) -> dict[str, Any]:
    _require_roles(opened, terms, notice)
    if state.reclaimed:
        raise _Reject(Reason.RECLAIM_DUPLICATE, "a reclaim was already accepted")
    if not notice.issued_at_ms <= notice.effective_at_ms:
        raise _Reject(Reason.RECLAIM_INVALID, "issued after it takes effect")
    if not terms.window_start_ms <= notice.effective_at_ms < terms.window_end_ms:
        raise _Reject(Reason.RECLAIM_INVALID, "effective time outside the window")
    if len(set(notice.gpus)) != len(notice.gpus) or set(notice.gpus) != set(state.gpus):
        raise _Reject(Reason.RECLAIM_INVALID, "gpus are not exactly the placement's GPUs")
    released = state.release_end_ms
    if released is not None and notice.effective_at_ms >= released:
        # §6.7: whichever ends earlier; the buyer released the placement from ``released``.
        raise _Reject(Reason.RECLAIM_INVALID, f"the buyer released the placement from {released}")
    if state.max_usage_end_ms > notice.effective_at_ms:
        raise _Reject(
            Reason.RECLAIM_BEHIND_USAGE,
            f"usage already folded to {state.max_usage_end_ms} > {notice.effective_at_ms}",
        )
    # §7.3, §6.6: the notice runs from the reclaim's arrival, not from issued_at_ms.
    notice_from = notice.issued_at_ms if arrived is None else arrived
    credit = reclaim_credit_minor(terms, notice_from, notice.effective_at_ms, released)
    return {
        "reclaimed": True,
        "effective_end_ms": notice.effective_at_ms,
        "totals": _reprice(terms, state.totals, reclaim_credit=credit),
    }


# §6.7 buyer release; §7.9 release charge
def _release(
    state: PlacementState,
    terms: PlacementTerms,
    opened: Opened,
    release: BuyerRelease,
    arrived: int | None,
) -> dict[str, Any]:
    # §4.0: the buyer signs; the operator may co-sign; nobody else.
    _require_roles(opened, terms, release)
    if state.release_end_ms is not None:
        raise _Reject(Reason.RELEASE_DUPLICATE, "a release was already accepted")
    if state.assignments:  # §6.7 with a resale: part of the placement is not the buyer's
        raise _Reject(
            Reason.RELEASE_INVALID,
            f"assignment {state.assignments[0].assignment_id} was accepted: the buyer no "
            "longer holds the whole placement",
        )
    if not release.issued_at_ms <= release.effective_at_ms:
        raise _Reject(Reason.RELEASE_INVALID, "issued after it takes effect")
    if not terms.window_start_ms <= release.effective_at_ms < terms.window_end_ms:
        raise _Reject(Reason.RELEASE_INVALID, "effective time outside the window")
    # (4) e: never before the arrival (the notice runs from it) nor before folded usage.
    at = release.issued_at_ms if arrived is None else arrived
    end = max(release.effective_at_ms, at, state.max_usage_end_ms)
    if end >= state.effective_end_ms:
        raise _Reject(
            Reason.RELEASE_INVALID,
            f"it would end at {end}; the placement already ends at {state.effective_end_ms}",
        )
    charge = release_charge_minor(terms, at, end, state.effective_end_ms)
    return {
        "release_end_ms": end,
        "effective_end_ms": end,
        "totals": _reprice(terms, state.totals, release_charge=charge),
    }


# §6.3 resume
def _resume(
    state: PlacementState, terms: PlacementTerms, opened: Opened, resume: StreamResume
) -> dict[str, Any]:
    """SPEC §6.3 resume: node ``node_id``'s stream restarts at ``from_seq``, chained to this
    record, nothing before ``from_ms`` (the resume flush is ``_resume_flush``)."""
    _require_roles(opened, terms, resume)  # §4.0: operator and buyer
    node_id = resume.node_id
    if node_id not in state.bindings:
        raise _Reject(Reason.NODE_UNKNOWN, f"node {node_id!r} is not in the terms")
    stream = state.streams.get(node_id, NEW_STREAM)
    lowest = max(stream.next_seq, 1, max(state.taken.get(node_id, ()), default=-1) + 1)
    if resume.from_seq < lowest:
        raise _Reject(
            Reason.RESUME_INVALID,
            f"from_seq {resume.from_seq} is below {lowest}: the stream's next seq (at least "
            "1), past every seq a rejected event took; a resume never reuses a seq",
        )
    if resume.from_ms < stream.last_end_ms:
        raise _Reject(
            Reason.RESUME_INVALID,
            f"from_ms {resume.from_ms} is before the last accepted end {stream.last_end_ms}",
        )
    streams = dict(state.streams)
    # no input hash: no event was accepted at from_seq - 1 (``_Run._accepted_at``)
    streams[node_id] = msgspec.structs.replace(
        stream,
        next_seq=resume.from_seq,
        last_hash=opened.record_hash,
        last_end_ms=resume.from_ms,
        last_input_hash="",
    )
    return {"streams": streams}


# §6.3 adjustment; §7.4 adjustments, §7.7 bounds
def _adjustment(
    state: PlacementState, terms: PlacementTerms, opened: Opened, adjustment: Adjustment
) -> dict[str, Any]:
    # §4.0: a charge needs the buyer (the desk may co-sign); a credit the operator and desk.
    _require_roles(opened, terms, adjustment)
    if adjustment.adjustment_id in state.adjustment_ids:
        raise _Reject(Reason.ADJUSTMENT_DUPLICATE, f"{adjustment.adjustment_id} seen before")
    current = state.totals
    credit = current.adjustment_credit_minor
    charge = current.adjustment_charge_minor
    if adjustment.direction == "credit":
        credit += adjustment.amount_minor
    else:
        charge += adjustment.amount_minor
    # §7.7: bounded against the most the terms let the gross reach, not the gross so far,
    # so no later input can carry a total past 2^53 - 1 because of this one.
    if not adjustment_within_bounds(terms, credit, charge):
        raise _Reject(
            Reason.ADJUSTMENT_INVALID,
            f"with Ac = {credit} and Ah = {charge} a total could pass 2^53 - 1 "
            f"(the terms let the gross and release charge reach {gross_ceiling_minor(terms)})",
        )
    totals = _reprice(terms, current, adjustment_credit=credit, adjustment_charge=charge)
    if any(value > limits.MAX_SAFE_INTEGER for value in msgspec.structs.astuple(totals)):
        # Unreachable by §7.7 (G + K ≤ M); kept so a fault in that argument refuses the
        # input instead of storing a total no record can carry.
        raise _Reject(Reason.ADJUSTMENT_INVALID, "a total would pass 2^53 - 1")
    return {
        "adjustment_ids": state.adjustment_ids.add(adjustment.adjustment_id),
        "totals": totals,
    }


# §6.8 assignment (resale)
def _assignment(
    state: PlacementState,
    terms: PlacementTerms,
    opened: Opened,
    assignment: Assignment,
    arrived: int | None,
) -> dict[str, Any]:
    # (1) §4.0: seller (the terms' buyer), the new buyer named inside, the desk; the
    # operator too when the terms require it, else it may co-sign.
    _require_roles(opened, terms, assignment)
    # (2) a new assignment_id
    if any(a.assignment_id == assignment.assignment_id for a in state.assignments):
        raise _Reject(Reason.ASSIGNMENT_DUPLICATE, f"{assignment.assignment_id} seen before")
    # (3) the buyer's to sell, to another party, inside the window
    if len(state.assignments) >= limits.MAX_ASSIGNMENTS:
        raise _Reject(
            Reason.ASSIGNMENT_INVALID, f"{limits.MAX_ASSIGNMENTS} assignments already accepted"
        )
    new_buyer = assignment.new_buyer
    _another_party(state, terms, new_buyer)
    if len(set(assignment.gpus)) != len(assignment.gpus):
        raise _Reject(Reason.ASSIGNMENT_INVALID, "a GPU is listed twice")
    unknown = sorted(set(assignment.gpus) - set(state.gpus))
    if unknown:
        raise _Reject(Reason.ASSIGNMENT_INVALID, f"GPU {unknown[0]} is not in the terms")
    handover = (
        assignment.handover_at_ms if arrived is None else max(assignment.handover_at_ms, arrived)
    )
    if assignment.handover_at_ms < terms.window_start_ms:
        raise _Reject(Reason.ASSIGNMENT_INVALID, "handover before the window starts")
    if handover >= state.effective_end_ms:
        raise _Reject(
            Reason.ASSIGNMENT_INVALID,
            f"handover {handover} at or after the effective end {state.effective_end_ms}",
        )
    # (4) each GPU is sold on at most once
    for earlier in state.assignments:
        both = sorted(earlier.gpus & set(assignment.gpus))
        if both:
            raise _Reject(
                Reason.ASSIGNMENT_OVERLAP,
                f"GPU {both[0]} already assigned by {earlier.assignment_id}",
            )
    # (5) nothing already folded past the handover on the GPUs' nodes
    for node_id in sorted({state.gpus[uuid].node_id for uuid in assignment.gpus}):
        stream = state.streams.get(node_id)
        if stream is not None and stream.next_seq > 0 and stream.last_end_ms > handover:
            raise _Reject(
                Reason.ASSIGNMENT_BEHIND_USAGE,
                f"node {node_id} usage already folded to {stream.last_end_ms} > {handover}",
            )
    # (6) accepted
    accepted = AssignmentState(
        assignment.assignment_id,
        new_buyer,
        handover,
        frozenset(assignment.gpus),
        assignment.rate_per_gpu_hour_minor,
    )
    return {"assignments": (*state.assignments, accepted)}


def _another_party(state: PlacementState, terms: PlacementTerms, new_buyer: Party) -> None:
    """SPEC §6.8 (3): the new buyer is none of the terms' parties, holds none of their keys
    nor a node key, and is the same id and key as in every earlier assignment."""
    parties = (terms.operator, terms.buyer, terms.desk)
    if new_buyer.id in {p.id for p in parties}:
        raise _Reject(Reason.ASSIGNMENT_INVALID, f"new buyer {new_buyer.id!r} is a party")
    taken_keys = {p.key for p in parties} | {terms.ledger_key} | {n.key for n in terms.nodes}
    if new_buyer.key in taken_keys:
        raise _Reject(Reason.ASSIGNMENT_INVALID, "the new buyer's key is another party's")
    for node_id, keys in sorted(state.bindings.items()):
        if new_buyer.key in keys:  # §6.8 (3): bound since the terms, revoked or not
            raise _Reject(
                Reason.ASSIGNMENT_INVALID, f"the new buyer's key is a node key of {node_id}"
            )
    for earlier in state.assignments:
        if (earlier.new_buyer.id == new_buyer.id) != (earlier.new_buyer.key == new_buyer.key):
            raise _Reject(
                Reason.ASSIGNMENT_INVALID,
                f"new buyer {new_buyer.id!r} differs in id or key from assignment "
                f"{earlier.assignment_id}",
            )


def resale_of(
    state: PlacementState, assignments: tuple[AssignmentState, ...]
) -> list[ResaleTotals]:
    """SPEC §7.10: the resale list a record carries (empty: omitted from its bytes)."""
    terms = state.terms
    if terms is None or not assignments:
        return []
    return [
        resale_entry(
            terms, a.assignment_id, a.new_buyer.id, a.rate_per_gpu_hour_minor, a.delivered_mgms
        )
        for a in assignments
    ]


# §6.3 closed; §7.5 SLA credit
def _close(
    state: PlacementState, terms: PlacementTerms, opened: Opened, close: PlacementClosed
) -> dict[str, Any]:
    _require_roles(opened, terms, close)
    due = terms.window_end_ms + terms.late_grace_ms
    if close.closed_at_ms < due:
        raise _Reject(Reason.CLOSE_INVALID, f"closed at {close.closed_at_ms}, due {due}")
    totals = state.totals
    sla = sla_credit_minor(terms, totals.delivered_mgms, totals.gross_minor, state.effective_end_ms)
    return {"closed": True, "totals": _reprice(terms, totals, sla_credit=sla)}


# §3 signatures, for the kinds whose signers are named by the terms: every ``required``
# key signs, a ``permitted`` key may (§4.0 "MAY also sign"), nobody else.
def _require_roles(
    opened: Opened,
    terms: PlacementTerms,
    record: authority.SIGNED_RECORD,
    current: authority.Window | None = None,
    revoked: bool = False,
) -> None:
    """§4.0 by the one signer table (``proto/authority.py``)."""
    must, may = authority.signers(terms, record, current, revoked)
    _require(
        opened, authority.role_keys(terms, must, record), authority.role_keys(terms, may, record)
    )


def _require(
    opened: Opened, required: dict[str, bytes], permitted: dict[str, bytes] | None = None
) -> None:
    if permitted:
        report = check_signatures(opened.envelope, {**permitted, **required})
        report.missing = [k for k in report.missing if k in required]
    else:
        report = check_signatures(opened.envelope, required)
    error = report.failure()
    if error is not None:
        raise _Reject(error.reason, error.detail)


# §7: the totals after a change of one of the cumulative inputs of the price.
def _reprice(terms: PlacementTerms, current: Totals, **changes: int) -> Totals:
    values = {
        "delivered_mgms": current.delivered_mgms,
        "reclaim_credit": current.reclaim_credit_minor,
        "sla_credit": current.sla_credit_minor,
        "adjustment_credit": current.adjustment_credit_minor,
        "adjustment_charge": current.adjustment_charge_minor,
        "release_charge": current.release_charge_minor,
    }
    values.update(changes)
    return price(terms, **values)


# §8: record i of the chain.
def _chain(
    state: PlacementState,
    seen: PSet[str],
    opened: Opened,
    position: str,
    status: Status,
    reason: Reason | None,
    delivered: int,
    detail: str,
    totals: Totals,
    changes: dict[str, Any],
    arrived: int | None,
) -> tuple[Verdict, PlacementState]:
    before = state.arrived_ms
    if arrived is not None and before is not None and before > arrived:
        arrived = before  # §6.6: monotone per placement
    assignments = changes.get("assignments", state.assignments)
    record = LedgerRecord(
        state.placement_id,  # placement_id
        state.next_index,  # index
        state.head,  # prev
        opened.kind,  # type: ignore[arg-type]  # kind
        opened.input_hash,  # source
        status,
        "" if reason is None else reason.value,  # reason
        delivered,  # delivered_mgms
        totals,
        arrived,  # arrived_ms
        resale_of(state, assignments) if assignments else [],  # resale
    )
    payload = signed_bytes(record)
    record_hash = sha256(payload).hexdigest()  # sha256_hex, without a call per record
    new = msgspec.structs.replace(
        state,
        next_index=state.next_index + 1,
        head=record_hash,
        totals=totals,
        seen=seen,
        arrived_ms=before if arrived is None else arrived,
        **changes,
    )
    verdict = Verdict(
        "chained",
        position,
        opened.raw,
        opened.input_hash,
        state.placement_id,
        opened.kind,
        opened,
        status,
        reason,
        detail,
        record,
        payload,
        record_hash,
    )
    return verdict, new


def _verdict(
    decision: Decision, position: str, placement_id: str | None, opened: Opened, **fields: Any
) -> Verdict:
    """The verdict on an input that opened (its bytes, hash and kind come from it)."""
    return Verdict(
        decision=decision,
        position=position,
        raw=opened.raw,
        input_hash=opened.input_hash,
        placement_id=placement_id,
        kind=opened.kind,
        opened=opened,
        **fields,
    )


def _dropped(state: PlacementState, opened: Opened, position: str) -> Verdict:
    return _verdict("dropped", position, state.placement_id, opened, reason=Reason.DUPLICATE)


def _quarantined(
    raw: bytes,
    position: str,
    placement_id: str | None,
    opened: Opened | None,
    reason: Reason,
    detail: str,
) -> Verdict:
    return Verdict(
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
