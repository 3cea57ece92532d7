"""The fold as the service runs it: ``decide`` (ledger/rules.py) with its surroundings.

``Fold.apply`` takes one raw input and returns its outcomes (more than one when
accepted terms release held inputs); ``Fold.apply_batch`` does the same for a batch
with the Ed25519 work on a thread pool. For each input:

1. open it and attribute it to a placement (SPEC §6.1 (1), ``attribute``), else it is
   quarantined;
2. take the placement's state from the cache (ledger/cache.py; a placement evicted
   earlier is reloaded from the store) and look up what ``decide`` needs from the past
   (the accepted usage event at an old seq, ``usage_lookup``);
3. ``decide(state, opened, ...)`` -> verdict, new state; the cache keeps the new state;
4. seal the chained records, unsigned (SPEC §8; ledger/crypto.py) -> ``Outcome``.

Capacity (SPEC §6.5): the fold keeps the GPU claims of accepted terms per ordered
stream (``ledger/capacity.py``), hands a terms input (first terms or amendment) the
claims of its stream, and records accepted terms, amendments, reclaims and releases in
them; ``capacity_rows`` and ``capacity_gone`` are stored with the batch.

State per placement is snapshotted with ``snapshot``/``restore`` (ledger/snapshot.py) so
the service can persist it in the same transaction as the records and offsets it
produced; ``dirty``/``clear_dirty``/``evict`` manage what is in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Final

import msgspec

from ledger import crypto, snapshot
from ledger.cache import PlacementCache, StateLoader, UsageLookup
from ledger.capacity import CapacityIndex, ClaimKey, ClaimRow, Claims, ShardClaims, scope_of
from ledger.capacity_log import PendingRelease
from ledger.crypto import PendingCheck
from ledger.rules import (
    INPUT_KINDS,
    NOT_LOOKED_UP,
    Decision,
    Verdict,
    attribute,
    decide,
    faulted,
    usage_lookup,
)
from ledger.state import PlacementState
from proto import limits
from proto.attestation import AttestationRoot
from proto.envelope import Opened, open_envelope
from proto.errors import ProtoError
from proto.keys import SigningKey, key_id
from proto.reasons import Reason
from proto.records import (
    BuyerRelease,
    LedgerRecord,
    NodeKeyBinding,
    PlacementTerms,
    ReclaimNotice,
    Status,
    Totals,
)

__all__ = ["INPUT_KINDS", "Decision", "Fold", "Outcome", "StateLoader", "UsageLookup"]


class Outcome(msgspec.Struct, frozen=True, gc=False):
    """What became of one input: its verdict, and for a chained one the ledger's record
    (``record_payload``, its signed bytes; ``record_envelope``, its envelope)."""

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
    record_hash: str | None = None
    detail: str = ""
    record_payload: bytes | None = None

    @property
    def record_envelope(self) -> bytes | None:
        """The chained record's envelope, with no signature (SPEC §8), made when asked.

        Not made per input on the fold's path: the store keeps the payload and rebuilds
        the envelope in SQL (``ledger.store``), so ~1 KB of base64 per input was made
        there for nothing but a length check."""
        payload = self.record_payload
        return None if payload is None else crypto.seal_record(payload)


def outcome(verdict: Verdict) -> Outcome:
    """The outcome of a verdict."""
    return Outcome(
        verdict.decision,
        verdict.position,
        verdict.raw,
        verdict.input_hash,
        verdict.placement_id,
        verdict.kind,
        verdict.opened,
        verdict.status,
        verdict.reason,
        verdict.record,
        verdict.record_hash,
        verdict.detail,
        verdict.record_payload,
    )


# The kinds whose acceptance changes GPU claims (``Fold._verdicts``, SPEC §6.5, §6.7).
_CLAIM_KINDS: Final = frozenset({"terms", "reclaim", "release"})

# One input as ``Fold.apply_batch`` takes it: (envelope, position, stream key, arrived_ms).
FoldInput = tuple[bytes, str, str | None, int | None]


class Fold:
    """Folds the inputs of many placements; see the module docstring."""

    def __init__(
        self,
        ledger_key: SigningKey,
        lookup: UsageLookup | None = None,
        load_state: StateLoader | None = None,
        attestation_roots: tuple[AttestationRoot, ...] | None = None,
        max_held_bytes: int | None = None,
    ) -> None:
        self.ledger_key = ledger_key
        # SPEC §6.2, the ledger-wide bound: envelope bytes held over every placement of
        # this fold (states in memory and restored ones; a placement leaves memory only
        # closed, when it holds nothing), and the bound (None: proto.limits', read at call
        # time as the other limits are).
        self.held_bytes = 0
        self._max_held_bytes = max_held_bytes
        # SPEC §6.9: the roots hardware evidence must be signed by (None: not judged).
        self.attestation_roots = attestation_roots
        self._public_key = ledger_key.public_key
        self._cache = PlacementCache(lookup, load_state)
        # Placements whose stored state does not decode (a total past 2^53 - 1 a ledger
        # older than SPEC §7.7's bounds stored, or damaged bytes): placement -> why. Their
        # inputs are quarantined PLACEMENT_FAULTED; every other placement goes on.
        self.faulted: dict[str, str] = {}
        self._capacity = CapacityIndex()
        # SPEC §6.5 across shards (set by a service deciding terms through the capacity
        # log): the log's refusal of terms by record hash (None: granted), and the releases
        # the fold's decisions owe the log, drained by the service after the commit.
        self.capacity_refusals: dict[str, tuple[Reason, str] | None] | None = None
        self.capacity_releases: list[PendingRelease] = []
        self._decided_by_log: set[str] = set()  # terms the log decided, not yet folded

    # ---- folding ------------------------------------------------------------------------

    def apply(
        self,
        raw: bytes,
        position: str,
        stream_key: str | None,
        arrived_ms: int | None = None,
    ) -> list[Outcome]:
        """Process one input received at ``position`` under transport key ``stream_key``,
        which reached the log at ``arrived_ms`` (SPEC §6.6; None: untimed)."""
        verdicts = self._verdicts(raw, _open(raw), position, stream_key, None, arrived_ms)
        return [outcome(v) for v in verdicts]

    def apply_batch(
        self,
        items: Sequence[FoldInput],
        executor: Executor | crypto.CryptoWorker | None = None,
        opening: Opening | None = None,
    ) -> list[Outcome]:
        """``apply`` each input in order and return all outcomes, flattened.

        With an executor, the Ed25519 work runs on its threads (or worker process): usage
        signatures are checked ahead of the fold (``open_batch``) with the keys bound when
        the batch is opened (records are not signed, SPEC §8). ``opening``: the batch
        already opened by ``open_batch`` (its checks under way). The outcomes are the same
        as ``apply`` one input at a time.
        """
        if opening is None:
            if executor is None:
                return [o for raw, pos, key, at in items for o in self.apply(raw, pos, key, at)]
            opening = self.open_batch(items, executor)
        # Records are unsigned (SPEC §8): nothing left for the threads.
        outcomes: list[Outcome] = []
        add = outcomes.append
        for (raw, position, key, at), op, check in zip(
            items, opening.opened, opening.checks, strict=True
        ):
            for v in self._verdicts(raw, op, position, key, check, at):
                add(outcome(v))
        return outcomes

    def open_batch(
        self,
        items: Sequence[FoldInput],
        executor: Executor | crypto.CryptoWorker,
        ahead_of: Sequence[Opening] = (),
    ) -> Opening:
        """Open a batch's envelopes and hand its usage signatures to ``executor``.

        ``ahead_of``: the batches opened before this one and not folded yet (the Kafka
        service opens batch N+1 while N folds): keys their terms and key bindings name
        are guessed for this batch too. A guess is only a guess (``_key_finder``)."""
        opened: list[Opened | ProtoError] = []
        add = opened.append
        for raw, _, _, _ in items:  # ``_open`` of each, without a call per input
            try:
                add(open_envelope(raw))
            except ProtoError as exc:
                add(exc)
        named = _named_keys(opened)
        guesses = named
        if any(o.named for o in ahead_of):
            guesses = {}
            for source in (*(o.named for o in ahead_of), named):
                for k, v in source.items():
                    guesses.setdefault(k, []).extend(v)
        checks = crypto.preverify(executor, opened, self._key_finder(guesses))
        return Opening(opened, checks, named)

    def _verdicts(
        self,
        raw: bytes,
        opened: Opened | ProtoError,
        position: str,
        stream_key: str | None,
        check: PendingCheck | None,
        arrived_ms: int | None = None,
    ) -> list[Verdict]:
        quarantined = attribute(raw, opened, position, stream_key)
        if quarantined is not None or isinstance(opened, ProtoError):
            return [quarantined] if quarantined is not None else []
        cache = self._cache
        placement_id = opened.record.placement_id
        why = self.faulted.get(placement_id)
        if why is None:
            try:
                state = cache.get(placement_id)
            except snapshot.SnapshotError as exc:  # evicted, and its state no longer decodes
                why = self.faulted[placement_id] = str(exc)
        if why is not None:
            return [faulted(opened, position, why)]
        wanted = usage_lookup(state, opened)
        accepted_at = (
            NOT_LOOKED_UP
            if wanted is None
            else cache.accepted_at(state.placement_id, wanted[0], wanted[1])
        )
        record = opened.record
        claims = (  # §6.5: first terms and amendments alike
            self._claims_for(scope_of(position), record, opened.record_hash)
            if isinstance(record, PlacementTerms)
            else None
        )
        bound = self._max_held_bytes
        if bound is None:
            bound = limits.MAX_HELD_BYTES_LEDGER
        verdict, new = decide(
            state,
            opened,
            position,
            ledger_key=self._public_key,
            accepted_at=accepted_at,
            checked=None if check is None else check.result(),
            claims=claims,
            arrived_ms=arrived_ms,
            attestation_roots=self.attestation_roots,
            held_room=bound - self.held_bytes,
        )
        # The held bytes changed only if the holds did (the same held log and no stream
        # holds: the difference is 0).
        if new is not state and (
            new.held is not state.held or new.stream_held or state.stream_held
        ):
            self.held_bytes += new.held_bytes() - state.held_bytes()
        verdicts = verdict.flatten()
        for v in verdicts:  # §6.5: accepted terms claim their GPUs, reclaims end claims
            if v.kind not in _CLAIM_KINDS or v.status != "accepted" or v.opened is None:
                continue
            done = v.opened.record
            if isinstance(done, PlacementTerms):
                self._capacity.accept_terms(scope_of(position), done)
            elif isinstance(done, ReclaimNotice):
                self._capacity.accept_reclaim(done.placement_id, done.gpus, done.effective_at_ms)
            elif isinstance(done, BuyerRelease) and new.release_end_ms is not None:
                # §6.7: the release frees the placement's GPUs from its end e on.
                self._capacity.accept_reclaim(
                    done.placement_id, [g.uuid for g in new.gpus.values()], new.release_end_ms
                )
        if self.capacity_refusals is not None:
            self._owe_releases(state, new, verdicts)
        if new is not state:
            cache.put(new, verdicts)
        return verdicts

    def _claims_for(self, scope: str, terms: PlacementTerms, record_hash: str) -> Claims:
        claims = ShardClaims(self._capacity.claims_for(scope, terms))
        if self.capacity_refusals is not None and record_hash in self.capacity_refusals:
            claims.refusal = self.capacity_refusals.pop(record_hash)
            self._decided_by_log.add(record_hash)
        return claims

    def _owe_releases(
        self, state: PlacementState, new: PlacementState, verdicts: Sequence[Verdict]
    ) -> None:
        """SPEC §6.5 across shards: rejected terms give back what the log granted them; an
        accepted amendment the claims of the terms it amends (they stand beside its own
        until released); an accepted reclaim the GPUs it names, from its effective time."""
        for v in verdicts:
            if v.opened is None or v.placement_id is None:
                continue
            done, pid, why = v.opened.record, v.placement_id, v.record_hash or ""
            decided = (
                isinstance(done, PlacementTerms) and v.opened.record_hash in self._decided_by_log
            )
            self._decided_by_log.discard(v.opened.record_hash)
            if isinstance(done, PlacementTerms) and v.status == "rejected":
                if not decided:
                    continue  # refused before it claimed anything (no request was made)
                uuids = tuple(sorted(g.uuid for g in done.gpus))
                owed = PendingRelease(pid, v.opened.record_hash, uuids, 0, "rejected", why)
            elif isinstance(done, PlacementTerms) and v.status == "accepted":
                if not state.terms_record_hash:
                    continue  # first terms: nothing amended
                uuids = tuple(sorted(state.gpus))
                owed = PendingRelease(pid, state.terms_record_hash, uuids, 0, "amended", why)
            elif isinstance(done, ReclaimNotice) and v.status == "accepted":
                at = done.effective_at_ms
                uuids = tuple(sorted(done.gpus))
                owed = PendingRelease(pid, new.terms_record_hash, uuids, at, "reclaimed", why)
            else:
                continue
            self.capacity_releases.append(owed)

    def _bound_key(self, placement_id: str, node_id: str, keyid: str) -> bytes | None:
        state = self._cache.peek(placement_id)
        return None if state is None else state.key_for(node_id, keyid)

    def _key_finder(self, named: dict[tuple[str, str], list[bytes]]) -> crypto.KeyFinder:
        """The key to check a usage signature with ahead of the fold: the key bound now,
        else a node key named by terms or a key binding not folded yet (``named``: a
        placement whose terms and first events arrive together, a key bound just before
        the events it signs). Only a guess: ``decide`` uses a check made with the key
        actually bound when it gets there, and verifies inline otherwise."""
        if not named:
            return self._bound_key

        def key_for(placement_id: str, node_id: str, keyid: str) -> bytes | None:
            found = self._bound_key(placement_id, node_id, keyid)
            if found is None:
                for public_key in named.get((placement_id, node_id), ()):
                    if key_id(public_key) == keyid:
                        return public_key
            return found

        return key_for

    # ---- state in memory and in the store -------------------------------------------------

    def dirty(self) -> set[str]:
        """Placements whose state changed since the last ``clear_dirty``."""
        return self._cache.dirty()

    def clear_dirty(self) -> None:
        """Forget which placements changed (their snapshots and claims are in the batch
        to store)."""
        self._cache.clear_dirty()
        self._capacity.clear_dirty()

    def forget_accepted(self) -> None:
        """The usage events accepted so far are stored: ``accepted_at`` asks the store for
        them from now on (after the batch that accepted them committed)."""
        self._cache.forget_accepted()

    def capacity_rows(self) -> list[ClaimRow]:
        """GPU claims changed since the last ``clear_dirty`` (SPEC §6.5), to store."""
        return self._capacity.dirty_rows()

    def capacity_gone(self) -> list[ClaimKey]:
        """GPU claims gone since the last ``clear_dirty`` (a GPU an amendment left, or
        given back by a reclaim or release before its claim began), to delete."""
        return self._capacity.gone_rows()

    def restore_capacity(self, rows: list[ClaimRow]) -> None:
        """Load the stored GPU claims (on start, before any ``apply``)."""
        self._capacity.load(rows)

    def snapshot(self, placement_id: str, *, holds: bool = True, seen: bool = True) -> bytes:
        """The placement's fold state as bytes (msgpack), to store beside its records;
        ``holds=False``, ``seen=False``: without its held inputs, without the input hashes
        it has seen (the store keeps both as rows)."""
        state = self._cache.peek(placement_id)
        if state is None:
            raise KeyError(placement_id)
        return snapshot.encode(state, holds=holds, seen=seen)

    def restore(self, placement_id: str, data: bytes) -> None:
        """Load a snapshot taken by ``snapshot`` (on start, before any ``apply``); its held
        inputs count towards the ledger-wide bound (SPEC §6.2)."""
        try:
            state = snapshot.decode(placement_id, data)
        except snapshot.SnapshotError as exc:
            self.faulted[placement_id] = str(exc)
            return
        self._cache.restore(state)
        self.held_bytes += state.held_bytes()

    def evict(self, placement_id: str) -> None:
        """Drop a placement's state from memory (it can be restored later)."""
        self._cache.evict(placement_id)

    def state(self, placement_id: str) -> PlacementState | None:
        """The placement's state in memory, if any (immutable)."""
        return self._cache.peek(placement_id)

    # ---- questions about a placement in memory -------------------------------------------

    def is_closed(self, placement_id: str) -> bool:
        """True when the placement has an accepted PlacementClosed."""
        state = self._cache.peek(placement_id)
        return state is not None and state.closed

    def close_due_ms(self, placement_id: str) -> int | None:
        """window_end_ms + late_grace_ms of the placement; None without accepted terms."""
        state = self._cache.peek(placement_id)
        return None if state is None else state.close_due_ms()

    def open_placements(self) -> list[str]:
        """Placements in memory with accepted terms and not closed."""
        return sorted(
            s.placement_id for s in self._cache.states() if s.terms is not None and not s.closed
        )

    def totals(self, placement_id: str) -> Totals | None:
        """The placement's current cumulative totals (None if unknown)."""
        state = self._cache.peek(placement_id)
        return None if state is None else state.totals

    def head(self, placement_id: str) -> tuple[int, str] | None:
        """(number of chained records, record hash of the last) of a placement."""
        state = self._cache.peek(placement_id)
        return None if state is None else (state.next_index, state.head)

    def terms(self, placement_id: str) -> PlacementTerms | None:
        """The accepted terms of a placement, if any."""
        state = self._cache.peek(placement_id)
        return None if state is None else state.terms


class Opening:
    """A batch opened ahead of its fold: each input's envelope (or why it does not
    open), its pending signature check, and the node keys its own terms and key
    bindings name, by (placement, node)."""

    __slots__ = ("checks", "named", "opened")

    def __init__(
        self,
        opened: list[Opened | ProtoError],
        checks: list[PendingCheck | None],
        named: dict[tuple[str, str], list[bytes]],
    ) -> None:
        self.opened = opened
        self.checks = checks
        self.named = named


def _named_keys(opened: Sequence[Opened | ProtoError]) -> dict[tuple[str, str], list[bytes]]:
    """Node keys named by the terms and key bindings among ``opened``."""
    named: dict[tuple[str, str], list[bytes]] = {}
    for op in opened:
        if not isinstance(op, Opened) or op.kind == "usage":
            continue
        record = op.record
        if isinstance(record, PlacementTerms):
            for node in record.nodes:
                named.setdefault((record.placement_id, node.node_id), []).append(node.key)
        elif isinstance(record, NodeKeyBinding):
            named.setdefault((record.placement_id, record.node_id), []).append(record.key)
    return named


def _open(raw: bytes) -> Opened | ProtoError:
    try:
        return open_envelope(raw)
    except ProtoError as exc:
        return exc
