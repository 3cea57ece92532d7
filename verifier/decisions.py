"""Re-deriving the ledger's decisions (SPEC §6), written from the text, not from ledger/.

``Referee`` walks the inputs of one placement in chain order and says, for each, what
SPEC §6 decides: ``accepted``, ``rejected`` with a reason, ``dropped`` (an exact
re-delivery), ``quarantined`` (could never have been chained) or ``held`` (before the
terms). The verifier compares this with the ledger's own status and reason, so a valid
event wrongly rejected is caught as surely as a bad one wrongly accepted.

One decision depends on the adjustments before it: an adjustment is rejected
ADJUSTMENT_INVALID when the sums Ac, Ah after it break the bounds of SPEC §7.7 (decided
on the terms and the sums alone). The referee leaves an adjustment that passes its other
checks ``pending``; ``settle_adjustments`` decides those in chain order (nothing else
depends on an adjustment's fate).

Pure: no I/O. The one look-up into history (the record hash of an accepted usage event at
an old seq, needed to tell a re-delivery from an equivocation) is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

from proto import limits as proto_limits
from proto.attestation import (
    AttestationRoot,
    EvidenceError,
    attested_by,
    evidence_nonce,
    node_key_hash,
    parse_evidence,
)
from proto.keys import key_id
from proto.reasons import Reason
from proto.records import (
    ZERO_HASH,
    Adjustment,
    Assignment,
    BuyerRelease,
    GpuSpec,
    NodeKeyBinding,
    Party,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    Record,
    StreamResume,
    UsageEvent,
)
from verifier.opener import SIG_VALID, OpenResult
from verifier.signers import authority_row, binding_kind, required_of, signer_failure
from verifier.terms_rules import adjustment_bounded, broken_rules, outside_residency

# What SPEC §6 decides for one input (``pending``: an adjustment waiting for the amounts).
# The verifier's own words, not the ledger's ``Decision`` (it must not import ledger/).
Outcome = Literal["accepted", "rejected", "dropped", "quarantined", "held", "pending"]

ACCEPTED: Final[Outcome] = "accepted"
REJECTED: Final[Outcome] = "rejected"
DROPPED: Final[Outcome] = "dropped"
QUARANTINED: Final[Outcome] = "quarantined"
HELD: Final[Outcome] = "held"
PENDING: Final[Outcome] = "pending"

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
_CLOSED_TO: Final = frozenset(
    {"usage", "keybinding", "reclaim", "closed", "assignment", "release", "resume"}
)
_FOREVER_MS: Final = proto_limits.MAX_SAFE_INTEGER

# Looks up the record hash of the accepted usage event (node_id, seq), if any.
UsageLookup = Callable[[str, int], str | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What SPEC §6 decides for one input: an outcome and '' or a reason code."""

    outcome: Outcome
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.outcome} {self.reason}".rstrip()

    def matches(self, claim: Claim) -> bool:
        """True when the ledger claimed exactly this decision."""
        return self.outcome == claim.status and self.reason == claim.reason


@dataclass(frozen=True, slots=True)
class Claim:
    """What the export says the ledger decided: any status and reason text (untrusted)."""

    status: str
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.status} {self.reason}".rstrip()


_OK: Final = Verdict(ACCEPTED)


def _reject(reason: Reason) -> Verdict:
    return Verdict(REJECTED, reason.value)


@dataclass
class _Stream:
    """State of one (placement, node) usage stream."""

    next_seq: int = 0
    last_hash: str = ZERO_HASH
    last_end_ms: int = 0
    # Seqs taken for good by a rejected event of the node that did not advance the stream
    # (SPEC §6.3 usage (3): PREV_MISMATCH, or any rejection from step 3 on in terms created
    # before REJECTION_ADVANCES_FROM_MS): never replaced.
    taken: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Assigned:
    """An accepted assignment (SPEC §6.8) with its effective handover ``h_ms``."""

    index: int
    assignment_id: str
    new_buyer: Party
    h_ms: int
    gpus: frozenset[str]
    rate_per_gpu_hour_minor: int


@dataclass(frozen=True, slots=True)
class KeyAttestation:
    """SPEC §6.9: accepted hardware evidence for one node key, as the verifier judged it."""

    node_id: str
    key: bytes
    gpus: tuple[str, ...]
    attester: str  # the trust file's id of the root; "" when no root is pinned
    iss: str
    iat: int
    index: int


@dataclass(frozen=True, slots=True)
class StreamViolation:
    """A chain position SPEC §6.2-§6.3 rules out, found after the fact (see ``Referee``)."""

    index: int
    rule: str
    message: str


@dataclass
class Referee:
    """SPEC §6 for one placement; see the module docstring."""

    placement_id: str
    ledger_key: bytes
    lookup: UsageLookup
    terms: PlacementTerms | None = None
    terms_record_hash: str = ""
    closed: bool = False
    reclaimed: bool = False
    effective_end_ms: int = 0
    max_usage_end_ms: int = 0
    gpus: dict[str, GpuSpec] = field(default_factory=dict)
    # §5.2: nodes of the terms in force outside their residency policy (R2: no usage)
    outside_residency: frozenset[str] = frozenset()
    bindings: dict[str, dict[bytes, tuple[int, int]]] = field(default_factory=dict)
    # node -> key id -> keys bound to the node with that id (ids cached: hot path)
    bound_ids: dict[str, dict[str, list[bytes]]] = field(default_factory=dict)
    streams: dict[str, _Stream] = field(default_factory=dict)
    operator_required: dict[str, bytes] = field(default_factory=dict)
    buyer_required: dict[str, bytes] = field(default_factory=dict)
    desk_required: dict[str, bytes] = field(default_factory=dict)
    ledger_required: dict[str, bytes] = field(default_factory=dict)
    # §6.3 terms (3): something was priced (usage, reclaim, adjustment or close accepted);
    # an amendment comes too late from then on.
    priced: bool = False
    # §6.3 terms: chain indices of TERMS_CONFLICT inputs that the accepted terms' three
    # parties all signed (TERMS_DISPUTED), with their versions, for step (7) to report.
    disputes: list[tuple[int, str]] = field(default_factory=list)
    _index: int = -1
    # SPEC §6.2: an event beyond its stream's next seq waits; it may be chained only as a
    # SEQ_GAP rejection in the close flush, right before an accepted close, in (node, seq)
    # order. The candidates seen since the last other input: (index, node_id, seq).
    flush: list[tuple[int, str, int]] = field(default_factory=list)
    violations: list[StreamViolation] = field(default_factory=list)
    _gap: bool = False
    # SPEC §6.6: the arrival of the input being decided (its record's ``arrived_ms``;
    # None for an untimed record) and the keys revoked per node.
    _arrived: int | None = None
    revoked: dict[str, set[bytes]] = field(default_factory=dict)
    # SPEC §6.8: accepted assignments in chain order.
    assignments: list[Assigned] = field(default_factory=list)
    # SPEC §6.7: the accepted release, as the pricing needs it: (arrival a, end e, the
    # effective end E0 just before it). None: no release accepted.
    release: tuple[int, int, int] | None = None
    # SPEC §6.9: the roots of the trust file (None: none pinned, signatures not judged),
    # the attested keys now (node -> key -> attestation), and every attestation accepted.
    attestation_roots: tuple[AttestationRoot, ...] | None = None
    attested: dict[str, dict[bytes, KeyAttestation]] = field(default_factory=dict)
    attestations: list[KeyAttestation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ledger_required = required_of((self.ledger_key,))

    def decide(
        self,
        opened: OpenResult,
        duplicate: bool,
        index: int = -1,
        arrived_ms: int | None = None,
    ) -> Verdict:
        """The decision for the next input in chain order; updates the state when accepted.

        ``arrived_ms``: the ``arrived_ms`` its LedgerRecord carries (SPEC §6.6), which the
        time rules use; None (an untimed record) applies none of them.

        ``duplicate`` is true when an earlier input of the placement has the same input
        hash (SPEC §6.1 step 2). ``index`` is its chain index: a chain position the
        stream rules forbid is kept in ``violations`` once it is known (``finish``).
        """
        self._gap = False
        self._index = index
        self._arrived = arrived_ms
        verdict = self._decide(opened, duplicate)
        record = opened.record
        if self._gap and isinstance(record, UsageEvent):
            self.flush.append((index, record.node_id, record.seq))
        elif self.flush:
            if isinstance(record, PlacementClosed) and verdict == _OK:
                self._check_flush_order()
            elif isinstance(record, StreamResume) and verdict == _OK:
                self._check_resume_flush(record)
            else:
                self.finish()
        return verdict

    def finish(self) -> None:
        """The chain ended (or went on) without the close that a flush must precede."""
        for index, node_id, seq in self.flush:
            self.violations.append(
                StreamViolation(
                    index,
                    "SEQ_GAP_OUT_OF_FLUSH",
                    f"node {node_id} seq {seq} is beyond its stream's next seq: SPEC §6.2 "
                    "holds it until the seqs before it arrive (chained early, or reordered)",
                )
            )
        self.flush.clear()

    def _check_flush_order(self) -> None:
        keys = [(node_id, seq) for _, node_id, seq in self.flush]
        if keys != sorted(keys):
            for index, node_id, seq in self.flush:
                self.violations.append(
                    StreamViolation(
                        index,
                        "FLUSH_ORDER",
                        f"node {node_id} seq {seq}: the close flush is in node, then seq order",
                    )
                )
        self.flush.clear()

    def _check_resume_flush(self, resume: StreamResume) -> None:
        """SPEC §6.3 resume: the resume flush holds only the resumed node's events below
        ``from_seq``, in seq order; any other candidate was chained out of a flush."""
        keys = [(node_id, seq) for _, node_id, seq in self.flush]
        mine = all(n == resume.node_id and seq < resume.from_seq for n, seq in keys)
        if mine and keys == sorted(keys):
            self.flush.clear()
            return
        self.finish()

    def _decide(self, opened: OpenResult, duplicate: bool) -> Verdict:
        # §6.1 step 1: what does not decode, is not an input, or names another placement
        # is quarantined: it can never be chained.
        record = opened.record
        if opened.error or record is None:
            return Verdict(QUARANTINED, opened.error or Reason.MALFORMED.value)
        if opened.kind not in INPUT_KINDS:
            return Verdict(QUARANTINED, Reason.KIND_MISMATCH.value)
        if _placement_of(record) != self.placement_id:
            return Verdict(QUARANTINED, Reason.PLACEMENT_MISMATCH.value)
        # §6.1 step 2: exact re-delivery.
        if duplicate:
            return Verdict(DROPPED, Reason.DUPLICATE.value)
        # §6.1 step 3: nothing but terms before terms (and nothing is closed before terms,
        # so step 4 cannot apply yet).
        terms = self.terms
        if terms is None:
            if isinstance(record, PlacementTerms):
                return self._terms(opened, record)
            return Verdict(HELD)
        # §6.1 step 4: the close ends usage, bindings, reclaims and closes (not adjustments).
        if self.closed and opened.kind in _CLOSED_TO:
            return _reject(Reason.AFTER_CLOSE)
        # §6.1 step 5 / §6.3: per kind.
        match record:
            case PlacementTerms():
                return self._terms(opened, record)
            case NodeKeyBinding():
                return self._keybinding(opened, record)
            case UsageEvent():
                return self._usage(opened, record, terms)
            case ReclaimNotice():
                return self._reclaim(opened, record, terms)
            case Adjustment():
                return self._adjustment(opened, record)
            case PlacementClosed():
                return self._closed(opened, record, terms)
            case Assignment():
                return self._assignment(opened, record, terms)
            case BuyerRelease():
                return self._release(opened, record, terms)
            case StreamResume():
                return self._resume(opened, record)
        return Verdict(QUARANTINED, Reason.KIND_MISMATCH.value)

    # ---- per kind (SPEC §6.3) -----------------------------------------------------------

    def _terms(self, opened: OpenResult, terms: PlacementTerms) -> Verdict:
        accepted = self.terms
        if accepted is not None:
            parties = (accepted.operator, accepted.buyer, accepted.desk)
            # 1. a re-delivery of the accepted terms
            if opened.record_hash == self.terms_record_hash:
                return Verdict(DROPPED, Reason.DUPLICATE.value)
            # 2. not version + 1 linked to the accepted terms: a conflict; disputed when
            # the accepted terms' three parties all signed it validly
            if (terms.version, terms.supersedes) != (accepted.version + 1, self.terms_record_hash):
                signed_by = {s.key for s in opened.sigs if s.outcome == SIG_VALID}
                if all(p.key in signed_by for p in parties):
                    self.disputes.append((self._index, f"version {terms.version}"))
                return _reject(Reason.TERMS_CONFLICT)
            # 3. an amendment: the same three parties sign it, name themselves and the ledger
            # again, follow §5, and come before anything was priced
            failure = signer_failure(opened.sigs, required_of(p.key for p in parties))
            if failure is not None:
                return _reject(failure)
            if (terms.operator, terms.buyer, terms.desk, terms.ledger_key) != (
                *parties,
                accepted.ledger_key,
            ) or broken_rules(terms):
                return _reject(Reason.TERMS_INVALID)
            if self.priced:
                return _reject(Reason.AMENDMENT_TOO_LATE)
            # 4. accepted: the amendment replaces the terms; bindings start again from its
            # nodes, streams (and their taken seqs) stay
            self.bindings = {}
            self.bound_ids = {}
            self.revoked = {}
            self.attested = {}
            return self._install(opened, terms)
        failure = signer_failure(
            opened.sigs, required_of((terms.operator.key, terms.buyer.key, terms.desk.key))
        )
        if failure is not None:
            return _reject(failure)
        # §5 rules 1-5 and 7 (the verifier's own transcription, ``verifier/terms_rules.py``),
        # rule 6: the terms name the ledger that folds (and signs) this chain; and the first
        # terms are version 1.
        if broken_rules(terms) or terms.ledger_key != self.ledger_key or terms.version != 1:
            return _reject(Reason.TERMS_INVALID)
        return self._install(opened, terms)

    def _install(self, opened: OpenResult, terms: PlacementTerms) -> Verdict:
        """§6.3 terms, "Accepted" (and an accepted amendment, step 4)."""
        self.terms = terms
        self.terms_record_hash = opened.record_hash
        self.effective_end_ms = terms.window_end_ms
        self.gpus = {g.uuid: g for g in terms.gpus}
        self.outside_residency = outside_residency(terms)
        self.operator_required = required_of((terms.operator.key,))
        self.buyer_required = required_of((terms.buyer.key,))
        self.desk_required = required_of((terms.desk.key,))
        for node in terms.nodes:
            self.bindings[node.node_id] = {node.key: (0, _FOREVER_MS)}
            self.bound_ids[node.node_id] = {key_id(node.key): [node.key]}
            self.streams.setdefault(node.node_id, _Stream())
        return _OK

    def _signed_as_the_table_says(
        self,
        opened: OpenResult,
        record: NodeKeyBinding
        | Adjustment
        | Assignment
        | BuyerRelease
        | PlacementClosed
        | ReclaimNotice
        | StreamResume,
        resale_requires_operator: bool = False,
        bound: tuple[int, int] | None = None,
        revoked: bool = False,
    ) -> Reason | None:
        """SPEC §4.0 by the verifier's own table (``verifier/signers.py``)."""
        must, may = authority_row(record, resale_requires_operator, bound, revoked)
        return signer_failure(
            opened.sigs, self._role_keys(must, record), self._role_keys(may, record)
        )

    def _role_keys(self, roles: tuple[str, ...], record: object) -> dict[str, bytes]:
        keys: dict[str, bytes] = {}
        for role in roles:
            if role == "new_buyer" and isinstance(record, Assignment):
                keys.update(required_of((record.new_buyer.key,)))
            else:
                keys.update(
                    {
                        "operator": self.operator_required,
                        "buyer": self.buyer_required,
                        "desk": self.desk_required,
                        "ledger": self.ledger_required,
                    }[role]
                )
        return keys

    def _keybinding(self, opened: OpenResult, binding: NodeKeyBinding) -> Verdict:
        # §4.0: a binding that only shortens the current one of (node, key) — same
        # valid_from, earlier valid_until — needs the operator (the buyer may co-sign);
        # anything else introduces or extends a key: operator and buyer.
        current = self.bindings.get(binding.node_id, {}).get(binding.key)
        was_revoked = binding.key in self.revoked.get(binding.node_id, set())
        kind = binding_kind(binding, current, was_revoked)
        revocation = kind == "only shortens"
        # §6.9: evidence for a key bound now (not revoked) that changes no window.
        attests = kind == "only attests"
        failure = self._signed_as_the_table_says(
            opened, binding, bound=current, revoked=was_revoked
        )
        if failure is not None:
            return _reject(failure)
        if binding.node_id not in self.bindings:
            return _reject(Reason.NODE_UNKNOWN)
        if binding.valid_from_ms >= binding.valid_until_ms:
            return _reject(Reason.BINDING_INVALID)
        # §6.3: a binding that does more than shorten never binds a party's key (the
        # terms' operator, buyer, desk, ledger key, or an accepted new buyer's).
        if not revocation and binding.key in self._party_keys():
            return _reject(Reason.BINDING_INVALID)
        keys = self.bindings[binding.node_id]
        if attests:
            return self._evidence(binding)
        revoked = self.revoked.setdefault(binding.node_id, set())
        if revocation and current is not None:
            # §6.6: a revocation keeps the start; the key is out from its arrival on.
            window = (current[0], binding.valid_until_ms)
        else:
            # §6.6: an introduction (or the return of a revoked key) starts no earlier
            # than its arrival; an extension reaches back no further than that either,
            # beyond what the key already had.
            start = binding.valid_from_ms
            arrived = self._arrived
            if arrived is not None:
                if current is None or binding.key in revoked:
                    start = max(start, arrived)
                else:
                    start = max(start, min(current[0], arrived))
            if start >= binding.valid_until_ms:
                return _reject(Reason.BINDING_INVALID)
            window = (start, binding.valid_until_ms)
        if binding.evidence:
            judged = self._evidence(binding)
            if judged != _OK:
                return judged
        if not revocation:
            revoked.discard(binding.key)
        elif current is not None:
            revoked.add(binding.key)
        if binding.key not in keys:
            ids = self.bound_ids[binding.node_id]
            ids.setdefault(key_id(binding.key), []).append(binding.key)
        keys[binding.key] = window
        return _OK

    def _party_keys(self) -> set[bytes]:
        """The keys no node may sign with (§6.3 keybinding)."""
        terms = self.terms
        if terms is None:  # no terms accepted yet: no party keys to refuse
            return {a.new_buyer.key for a in self.assignments}
        keys = {terms.operator.key, terms.buyer.key, terms.desk.key, terms.ledger_key}
        return keys | {a.new_buyer.key for a in self.assignments}

    def _evidence(self, binding: NodeKeyBinding) -> Verdict:
        """SPEC §6.9 (1)-(6) for a binding that passed §6.3; records the attestation."""
        try:
            evidence = parse_evidence(binding.evidence)
        except EvidenceError:
            return _reject(Reason.EVIDENCE_INVALID)
        claims = evidence.claims
        if (
            not claims.overall_result
            or claims.eat_nonce
            != evidence_nonce(binding.placement_id, binding.node_id, binding.key)
            or claims.node_key_sha256 != node_key_hash(binding.key)
        ):
            return _reject(Reason.EVIDENCE_INVALID)
        gpus = {g.ueid: g.hwmodel for g in claims.submods.values()}
        if len(gpus) != len(claims.submods):
            return _reject(Reason.EVIDENCE_INVALID)
        for uuid, model in gpus.items():
            spec = self.gpus.get(uuid)
            if spec is None or spec.node_id != binding.node_id or spec.model != model:
                return _reject(Reason.EVIDENCE_INVALID)
        attester = ""
        if self.attestation_roots is not None:
            found = attested_by(evidence, self.attestation_roots)
            if found is None:
                return _reject(Reason.EVIDENCE_INVALID)
            attester = found
        # (6) fresh against the arrival (an untimed record: the binding's issued time)
        at_ms = binding.issued_at_ms if self._arrived is None else self._arrived
        if not (
            at_ms - proto_limits.MAX_EVIDENCE_AGE_MS
            <= claims.iat * 1000
            <= at_ms + proto_limits.MAX_CLOCK_SKEW_MS
        ):
            return _reject(Reason.EVIDENCE_INVALID)
        attestation = KeyAttestation(
            binding.node_id,
            binding.key,
            tuple(sorted(gpus)),
            attester,
            claims.iss,
            claims.iat,
            self._index,
        )
        self.attested.setdefault(binding.node_id, {})[binding.key] = attestation
        self.attestations.append(attestation)
        return _OK

    def _usage(self, opened: OpenResult, event: UsageEvent, terms: PlacementTerms) -> Verdict:
        # 1. the node
        keys = self.bindings.get(event.node_id)
        stream = self.streams.get(event.node_id)
        if keys is None or stream is None:
            return _reject(Reason.NODE_UNKNOWN)
        # 2. exactly one signature, by a key bound to the node, valid, covering the interval
        if not opened.sigs:
            return _reject(Reason.SIG_MISSING)
        if len(opened.sigs) > 1:
            return _reject(Reason.SIG_SURPLUS)
        sig = opened.sigs[0]
        bound = self.bound_ids[event.node_id].get(sig.keyid)
        if not bound:
            return _reject(Reason.NODE_KEY_UNKNOWN)
        if sig.outcome != SIG_VALID or sig.key not in bound:
            return _reject(Reason.SIG_INVALID)
        if sig.key in self.revoked.get(event.node_id, ()):
            return _reject(Reason.NODE_KEY_REVOKED)  # §6.6: whatever the interval
        valid_from_ms, valid_until_ms = keys[sig.key]
        if not (valid_from_ms <= event.start_ms and event.end_ms <= valid_until_ms):
            return _reject(Reason.NODE_KEY_NOT_VALID)
        # 2a. §5.2 R2: the node lies inside the residency policy (before step 3: no seq)
        if event.node_id in self.outside_residency:
            return _reject(Reason.RESIDENCY)
        # 3. the stream: re-delivery, equivocation, held beyond a gap, fork
        if event.seq < stream.next_seq:
            if self.lookup(event.node_id, event.seq) == opened.record_hash:
                return Verdict(DROPPED, Reason.DUPLICATE.value)
            return _reject(Reason.EQUIVOCATION)
        if event.seq in stream.taken:
            return _reject(Reason.EQUIVOCATION)  # a node never replaces a seq it signed
        if event.seq > stream.next_seq:
            # Held until the close flush (SPEC §6.2); chained, it can only be SEQ_GAP there.
            self._gap = True
            return _reject(Reason.SEQ_GAP)
        if event.prev != stream.last_hash:
            stream.taken.add(event.seq)  # the seq is taken, the stream does not advance
            return _reject(Reason.PREV_MISMATCH)
        failure = self._usage_content(event, stream, terms) or self._attested_for(
            event, sig.key, terms
        )
        if failure is not None:
            if terms.created_at_ms >= proto_limits.REJECTION_ADVANCES_FROM_MS:
                # rejected for its content: the seq is taken by advancing past it; the
                # last accepted end stays (SPEC §6.3 usage, "What a rejected event does")
                stream.next_seq += 1
                stream.last_hash = opened.record_hash
            else:
                stream.taken.add(event.seq)  # the rule of before: taken, the stream stops
            return _reject(failure)
        stream.next_seq += 1
        stream.last_hash = opened.record_hash
        stream.last_end_ms = event.end_ms
        self.max_usage_end_ms = max(self.max_usage_end_ms, event.end_ms)
        self.priced = True
        return _OK

    def _usage_content(
        self, event: UsageEvent, stream: _Stream, terms: PlacementTerms
    ) -> Reason | None:
        """Steps 4 to 6 of SPEC §6.3 usage: None when the event may be folded."""
        # 4. the interval
        length_ms = event.end_ms - event.start_ms
        if length_ms <= 0 or length_ms > proto_limits.MAX_INTERVAL_MS:
            return Reason.INTERVAL_INVALID
        if event.seq > 0 and event.start_ms < stream.last_end_ms:
            return Reason.INTERVAL_OVERLAP
        # 5. the window
        if not (event.end_ms > terms.window_start_ms and event.start_ms < terms.window_end_ms):
            return Reason.OUTSIDE_WINDOW
        # §6.7: nothing starts at or after the buyer's release end.
        if self.release is not None and event.start_ms >= self.release[1]:
            return Reason.AFTER_RELEASE
        # §6.6: nothing measured ends after it reached the log (beyond the skew bound).
        arrived = self._arrived
        if arrived is not None and event.end_ms > arrived + proto_limits.MAX_CLOCK_SKEW_MS:
            return Reason.FUTURE_DATED
        # 6. the samples
        uuids = [s.uuid for s in event.samples]
        if len(set(uuids)) != len(uuids):
            return Reason.SAMPLE_DUPLICATE_GPU
        for sample in event.samples:
            spec = self.gpus.get(sample.uuid)
            if spec is None or spec.node_id != event.node_id:
                return Reason.GPU_NOT_IN_TERMS
            if sample.model != spec.model:
                return Reason.GPU_MODEL_MISMATCH
        return None

    def _attested_for(self, event: UsageEvent, key: bytes, terms: PlacementTerms) -> Reason | None:
        """SPEC §6.9: under ``attestation_required`` every sampled GPU is one the signing
        key's accepted evidence attests."""
        if not terms.attestation_required:
            return None
        attestation = self.attested.get(event.node_id, {}).get(key)
        for sample in event.samples:
            if attestation is None or sample.uuid not in attestation.gpus:
                return Reason.NOT_ATTESTED
            # Expiry: the whole event is judged by its end
            if event.end_ms > attestation.iat * 1000 + proto_limits.MAX_ATTESTATION_VALIDITY_MS:
                return Reason.NOT_ATTESTED
        return None

    def _reclaim(self, opened: OpenResult, notice: ReclaimNotice, terms: PlacementTerms) -> Verdict:
        failure = self._signed_as_the_table_says(opened, notice)
        if failure is not None:
            return _reject(failure)
        if self.reclaimed:
            return _reject(Reason.RECLAIM_DUPLICATE)
        effective_ms = notice.effective_at_ms
        if not (
            notice.issued_at_ms <= effective_ms
            and terms.window_start_ms <= effective_ms < terms.window_end_ms
            and len(set(notice.gpus)) == len(notice.gpus)
            and set(notice.gpus) == set(self.gpus)
        ):
            return _reject(Reason.RECLAIM_INVALID)
        if self.release is not None and effective_ms >= self.release[1]:
            return _reject(Reason.RECLAIM_INVALID)  # §6.7: released before it takes effect
        if self.max_usage_end_ms > effective_ms:
            return _reject(Reason.RECLAIM_BEHIND_USAGE)
        self.reclaimed = True
        self.effective_end_ms = effective_ms
        self.priced = True
        return _OK

    def _adjustment(self, opened: OpenResult, adjustment: Adjustment) -> Verdict:
        # §4.0: a charge costs the buyer (the desk may co-sign), a credit the operator and
        # the desk.
        failure = self._signed_as_the_table_says(opened, adjustment)
        if failure is not None:
            return _reject(failure)
        if not self.priced and self.terms is not None:
            # Whether this adjustment is accepted decides whether a later amendment is
            # too late (§6.3 terms (3)). Nothing is priced, so no adjustment was accepted
            # before it: the sums after it are its own amount (§7.7).
            amount = adjustment.amount_minor
            credit, charge = (amount, 0) if adjustment.direction == "credit" else (0, amount)
            self.priced = adjustment_bounded(self.terms, credit, charge)
        return Verdict(PENDING)

    def _closed(self, opened: OpenResult, close: PlacementClosed, terms: PlacementTerms) -> Verdict:
        failure = self._signed_as_the_table_says(opened, close)
        if failure is not None:
            return _reject(failure)
        if close.closed_at_ms < terms.window_end_ms + terms.late_grace_ms:
            return _reject(Reason.CLOSE_INVALID)
        self.closed = True
        self.priced = True
        return _OK

    def _assignment(
        self, opened: OpenResult, assignment: Assignment, terms: PlacementTerms
    ) -> Verdict:
        """SPEC §6.8, steps 1-6 in order."""
        # 1. seller (the terms' buyer), the new buyer named inside, the desk; the operator
        # when the terms require it, else it may co-sign
        failure = self._signed_as_the_table_says(opened, assignment, terms.resale_requires_operator)
        if failure is not None:
            return _reject(failure)
        # 2. a new id
        if assignment.assignment_id in {a.assignment_id for a in self.assignments}:
            return _reject(Reason.ASSIGNMENT_DUPLICATE)
        # 3. the buyer's to sell, to someone else, inside the window
        buyer = assignment.new_buyer
        parties = (terms.operator, terms.buyer, terms.desk)
        others = {p.key for p in parties} | {terms.ledger_key} | {n.key for n in terms.nodes}
        # §6.8 (3): every key bound to a node since the terms (revoked or expired too)
        others |= {k for keys in self.bindings.values() for k in keys}
        arrived = self._arrived
        h_ms = (
            assignment.handover_at_ms
            if arrived is None
            else max(assignment.handover_at_ms, arrived)
        )
        if (
            len(self.assignments) >= proto_limits.MAX_ASSIGNMENTS
            or buyer.id in {p.id for p in parties}
            or buyer.key in others
            or any(
                (a.new_buyer.id == buyer.id) != (a.new_buyer.key == buyer.key)
                for a in self.assignments
            )
            or len(set(assignment.gpus)) != len(assignment.gpus)
            or not set(assignment.gpus) <= set(self.gpus)
            or assignment.handover_at_ms < terms.window_start_ms
            or h_ms >= self.effective_end_ms
        ):
            return _reject(Reason.ASSIGNMENT_INVALID)
        # 4. each GPU sold on once
        gpus = frozenset(assignment.gpus)
        if any(a.gpus & gpus for a in self.assignments):
            return _reject(Reason.ASSIGNMENT_OVERLAP)
        # 5. nothing folded past h on the nodes of those GPUs
        for node_id in {self.gpus[uuid].node_id for uuid in gpus}:
            stream = self.streams.get(node_id)
            if stream is not None and stream.next_seq > 0 and stream.last_end_ms > h_ms:
                return _reject(Reason.ASSIGNMENT_BEHIND_USAGE)
        self.assignments.append(
            Assigned(
                self._index,
                assignment.assignment_id,
                buyer,
                h_ms,
                gpus,
                assignment.rate_per_gpu_hour_minor,
            )
        )
        self.priced = True
        return _OK

    def _resume(self, opened: OpenResult, resume: StreamResume) -> Verdict:
        return _resume_of(self, opened, resume)

    def _release(self, opened: OpenResult, release: BuyerRelease, terms: PlacementTerms) -> Verdict:
        """SPEC §6.7: the buyer signs (the operator may), once, inside the window, and it
        must end the placement before it already ends."""
        failure = self._signed_as_the_table_says(opened, release)
        if failure is not None:
            return _reject(failure)
        if self.release is not None:
            return _reject(Reason.RELEASE_DUPLICATE)
        if self.assignments:  # §6.7 with a resale: the buyer no longer holds it whole
            return _reject(Reason.RELEASE_INVALID)
        effective_ms = release.effective_at_ms
        if not (
            release.issued_at_ms <= effective_ms
            and terms.window_start_ms <= effective_ms < terms.window_end_ms
        ):
            return _reject(Reason.RELEASE_INVALID)
        arrived = release.issued_at_ms if self._arrived is None else self._arrived
        end_ms = max(effective_ms, arrived, self.max_usage_end_ms)
        if end_ms >= self.effective_end_ms:
            return _reject(Reason.RELEASE_INVALID)
        self.release = (arrived, end_ms, self.effective_end_ms)
        self.effective_end_ms = end_ms
        self.priced = True
        return _OK


def _resume_of(referee: Referee, opened: OpenResult, resume: StreamResume) -> Verdict:
    """SPEC §6.3 resume: operator and buyer sign; the node is in the terms; the stream
    restarts at from_seq (never a seq it reached, never 0) from from_ms (never before the
    last accepted end), chained to this record."""
    failure = referee._signed_as_the_table_says(opened, resume)
    if failure is not None:
        return _reject(failure)
    stream = referee.streams.get(resume.node_id)
    if resume.node_id not in referee.bindings or stream is None:
        return _reject(Reason.NODE_UNKNOWN)
    lowest = max(stream.next_seq, 1, max(stream.taken, default=-1) + 1)
    if resume.from_seq < lowest or resume.from_ms < stream.last_end_ms:
        return _reject(Reason.RESUME_INVALID)
    stream.next_seq = resume.from_seq
    stream.last_hash = opened.record_hash
    stream.last_end_ms = resume.from_ms
    return _OK


def _placement_of(record: Record) -> str:
    return record.placement_id if hasattr(record, "placement_id") else ""


# ---- adjustments, once the base totals are known --------------------------------------


@dataclass(frozen=True, slots=True)
class PendingAdjustment:
    """An adjustment that passed its signature check.

    ``bounded`` says whether cumulative (Ac, Ah) after it keep every total within the
    bounds of SPEC §7.7 (``verifier/terms_rules.adjustment_bounded`` for the terms).
    """

    chain_index: int
    adjustment_id: str
    direction: str
    amount_minor: int
    bounded: Callable[[int, int], bool]


def settle_adjustments(pending: Iterable[PendingAdjustment]) -> Iterator[tuple[int, Verdict]]:
    """Decide pending adjustments in chain order: duplicates, then the bounds of §7.7."""
    seen_ids: set[str] = set()
    credit_minor = 0
    charge_minor = 0
    for adj in pending:
        if adj.adjustment_id in seen_ids:
            yield adj.chain_index, _reject(Reason.ADJUSTMENT_DUPLICATE)
            continue
        credit_after = credit_minor + (adj.amount_minor if adj.direction == "credit" else 0)
        charge_after = charge_minor + (adj.amount_minor if adj.direction == "charge" else 0)
        if not adj.bounded(credit_after, charge_after):
            yield adj.chain_index, _reject(Reason.ADJUSTMENT_INVALID)
            continue
        seen_ids.add(adj.adjustment_id)
        credit_minor, charge_minor = credit_after, charge_after
        yield adj.chain_index, _OK
