"""The witness's decision (SPEC.md §8.3): cosign a new checkpoint, or refuse, and why.

A pure function of the witness's state, its own copy of the terms, the note offered,
the new records and the inputs the party knows of. No I/O, no clock (``now_s`` is given).
"""

from __future__ import annotations

import base64
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from proto.cosign import cosign
from proto.envelope import decode_envelope, open_envelope, sha256_hex
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.limits import MAX_ARRIVAL_LAG_MS, MAX_CLOCK_SKEW_MS
from proto.merkle import leaf_hash
from proto.note import (
    LEDGER_NOTE_NAME,
    NoteSignature,
    SignedNote,
    checkpoint_origin,
    note_key_hash,
    parse_checkpoint_body,
)
from proto.records import LedgerRecord, PlacementTerms
from proto.utc import iso_utc
from witness.known import Known
from witness.state import Refusal, WitnessState


@dataclass(frozen=True, slots=True)
class Cosigned:
    """The witness cosigned: the new state (to store first) and the note to hand back."""

    state: WitnessState
    note: SignedNote


@dataclass(frozen=True, slots=True)
class Refused:
    """The witness refused; ``refusal`` is the evidence to keep."""

    refusal: Refusal


class _Refuse(Exception):
    def __init__(self, code: str, detail: str, index: int = -1, record: bytes = b"") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.index = index
        self.record = record


def witness(
    state: WitnessState,
    terms: PlacementTerms,
    note: SignedNote,
    new_records: Sequence[bytes],
    known: Sequence[Known],
    *,
    name: str,
    key: SigningKey,
    now_s: int,
    simulation: bool = False,
) -> Cosigned | Refused:
    """Check ``note`` (with the record envelopes past ``state.size``) and cosign or refuse.

    ``simulation``: the ledger runs ``arrival = "sender"`` (SPEC §6.6): a record may also
    carry the arrival of the record before it, beyond its own delivery's bound."""
    try:
        new_state = _check(state, terms, note, new_records, known, now_s, simulation)
    except _Refuse as refuse:
        return Refused(
            Refusal(
                code=refuse.code,
                detail=refuse.detail,
                placement_id=terms.placement_id,
                refused_at_s=now_s,
                checkpoint=note.text(),
                cosigned=state.cosigned_note,
                index=refuse.index,
                record=base64.b64encode(refuse.record).decode() if refuse.record else "",
            )
        )
    cosigned = cosign(SignedNote(note.body, _ledger_lines(note, terms)), name, key, now_s)
    new_state.cosigned_note = cosigned.text()
    new_state.cosigned_at_s = now_s
    return Cosigned(new_state, cosigned)


def _ledger_lines(note: SignedNote, terms: PlacementTerms) -> tuple[NoteSignature, ...]:
    key_hash = note_key_hash(LEDGER_NOTE_NAME, terms.ledger_key)
    return tuple(
        s for s in note.signatures if s.name == LEDGER_NOTE_NAME and s.key_hash == key_hash
    )


def _check(
    state: WitnessState,
    terms: PlacementTerms,
    note: SignedNote,
    new_records: Sequence[bytes],
    known: Sequence[Known],
    now_s: int,
    simulation: bool = False,
) -> WitnessState:
    # (1) W_SIGNATURE: the ledger the terms name signed it, for this placement's log.
    if not note.signed_by(LEDGER_NOTE_NAME, terms.ledger_key):
        raise _Refuse("W_SIGNATURE", "the checkpoint is not signed by the terms' ledger key")
    try:
        checkpoint = parse_checkpoint_body(note.body)
    except ProtoError as exc:
        raise _Refuse("W_SIGNATURE", f"the checkpoint body is malformed: {exc.detail}") from exc
    if checkpoint.origin != checkpoint_origin(terms.placement_id):
        raise _Refuse("W_SIGNATURE", f"the checkpoint is of another log: {checkpoint.origin!r}")
    # (2) W_ROLLBACK: the log never shrinks.
    if checkpoint.size < state.size:
        raise _Refuse(
            "W_ROLLBACK",
            f"the checkpoint has {checkpoint.size} records; {state.size} were cosigned before",
        )
    if len(new_records) != checkpoint.size - state.size:
        raise _Refuse(
            "W_INCONSISTENT",
            f"the ledger served {len(new_records)} records for sizes "
            f"{state.size}..{checkpoint.size}",
        )
    # (3) W_INCONSISTENT: the new records extend the cosigned tree to exactly this root.
    payloads = _payloads(new_records, state.size)
    frontier = state.tree()
    for payload in payloads:
        frontier = frontier.append_leaf_hash(leaf_hash(payload))
    if frontier.root() != checkpoint.root:
        raise _Refuse(
            "W_INCONSISTENT",
            f"the checkpoint of size {checkpoint.size} is not an extension of the tree of "
            f"size {state.size} this witness cosigned (equivocation: keep both notes)",
        )
    # (4) W_RECORD: each record at its index, linked to the one before. No record signature
    # is checked (SPEC §8: none from version 2): (3) tied its bytes to the signed root.
    included = dict(state.included)
    close_index = state.close_index
    terms_arrived_ms = state.terms_arrived_ms
    prev = state.last_record_hash
    window = _TimeWindow.of(known, state, simulation)
    for offset, raw in enumerate(new_records):
        index = state.size + offset
        record = _ledger_record(raw, index, prev, terms)
        prev = sha256_hex(payloads[offset])
        included.setdefault(record.source, index)
        terms_arrived_ms = _terms_arrival(record, terms_arrived_ms)
        # (7) W_TIME: the arrival the ledger signed lies within this party's own clocks.
        window.check(record, index, raw, now_s, terms_arrived_ms)
        window.last_arrived_ms = max(window.last_arrived_ms, record.arrived_ms or -1)
        if record.kind == "closed" and record.status == "accepted" and close_index < 0:
            close_index = index
    # (5) W_ORDER: each of the party's node streams is in the log in seq order.
    _check_order(known, included)
    # (6) W_MISSING: once closed, all owed by the deadline is before it; always, all due is in
    if close_index >= 0:
        _check_complete(known, included, close_index, terms)
    _check_owed(known, included, now_s)
    return WitnessState(
        format=state.format,
        placement_id=state.placement_id,
        size=checkpoint.size,
        frontier=list(frontier.hashes),
        last_record_hash=prev,
        close_index=close_index,
        included=included,
        terms_arrived_ms=terms_arrived_ms,
        last_arrived_ms=window.last_arrived_ms,
    )


def _payloads(new_records: Sequence[bytes], first: int) -> list[bytes]:
    """The signed bytes of each new record (record ``first`` on), or W_RECORD."""
    payloads: list[bytes] = []
    for offset, raw in enumerate(new_records):
        try:
            payloads.append(decode_envelope(raw).payload)
        except ProtoError as exc:
            index = first + offset
            raise _Refuse("W_RECORD", f"record {index} does not decode: {exc}", index, raw) from exc
    return payloads


def _terms_arrival(record: LedgerRecord, known_ms: int) -> int:
    """The arrival of the placement's first accepted terms record (-1 until it is seen)."""
    if known_ms >= 0 or record.kind != "terms" or record.status != "accepted":
        return known_ms
    return record.arrived_ms if record.arrived_ms is not None else -1


def _ledger_record(raw: bytes, index: int, prev: str, terms: PlacementTerms) -> LedgerRecord:
    try:
        opened = open_envelope(raw)
    except ProtoError as exc:
        raise _Refuse("W_RECORD", f"record {index} does not decode: {exc}", index, raw) from exc
    record = opened.record
    if not isinstance(record, LedgerRecord):
        raise _Refuse("W_RECORD", f"entry {index} is a {opened.kind}, not a record", index, raw)
    if record.placement_id != terms.placement_id or record.index != index:
        raise _Refuse(
            "W_RECORD",
            f"record at {index} says placement {record.placement_id!r} index {record.index}",
            index,
            raw,
        )
    if record.prev != prev:
        raise _Refuse("W_RECORD", f"record {index} does not link to record {index - 1}", index, raw)
    return record


@dataclass(slots=True)
class _TimeWindow:
    """What bounds a record's ``arrived_ms`` for this party (SPEC §6.6, §8.3 (7)).

    ``delivered``: input hash -> when the party delivered it; ``waited``: input hash -> the
    latest delivery of what it legitimately waited for (its node's lower seqs);
    ``cosigned_ms``/``cosigned_size``: this witness's last cosignature, a floor for every
    record past the tree it covered.
    """

    delivered: dict[str, int]
    waited: dict[str, int]
    cosigned_ms: int
    cosigned_size: int
    simulation: bool = False  # SPEC §6.6 arrival = "sender": the record before may raise it
    last_arrived_ms: int = -1  # the latest arrival chained so far

    @classmethod
    def of(
        cls, known: Sequence[Known], state: WitnessState, simulation: bool = False
    ) -> _TimeWindow:
        delivered: dict[str, int] = {}
        for k in known:
            delivered[k.input_hash] = min(
                delivered.get(k.input_hash, k.delivered_at_ms), k.delivered_at_ms
            )
        waited: dict[str, int] = {}
        for events in _streams(known).values():
            latest = -1
            for k in events:  # in seq order: an event waits for every lower seq (§6.2)
                latest = max(latest, delivered[k.input_hash])
                waited[k.input_hash] = latest
        cosigned_ms = state.cosigned_at_s * 1000 if state.cosigned_note else -1
        return cls(delivered, waited, cosigned_ms, state.size, simulation, state.last_arrived_ms)

    def check(
        self, record: LedgerRecord, index: int, raw: bytes, now_s: int, terms_arrived_ms: int
    ) -> None:
        """Timed, not after this witness's clock (+ skew), not before the party delivered
        its input (- skew), not later than that delivery (or what it waited for) + the
        arrival lag, and not before this witness's last cosignature of a tree without it."""
        arrived = record.arrived_ms
        if arrived is None:
            raise _Refuse("W_TIME", f"record {index} carries no arrived_ms", index, raw)
        latest = now_s * 1000 + MAX_CLOCK_SKEW_MS
        if arrived > latest:
            raise _Refuse(
                "W_TIME",
                f"record {index} arrived_ms {_when(arrived)} is after this witness's clock "
                f"{_when(now_s * 1000)} + {MAX_CLOCK_SKEW_MS} ms",
                index,
                raw,
            )
        if self.cosigned_ms >= 0 and arrived < self.cosigned_ms - MAX_CLOCK_SKEW_MS:
            raise _Refuse(
                "W_TIME",
                f"record {index} arrived_ms {_when(arrived)} is backdated: this witness "
                f"cosigned the tree of size {self.cosigned_size} without it at "
                f"{_when(self.cosigned_ms)} (- {MAX_CLOCK_SKEW_MS} ms)",
                index,
                raw,
            )
        sent = self.delivered.get(record.source)
        if sent is None:
            return
        if arrived < sent - MAX_CLOCK_SKEW_MS:
            raise _Refuse(
                "W_TIME",
                f"record {index} arrived_ms {_when(arrived)} is before its input was delivered "
                f"({_when(sent)}) - {MAX_CLOCK_SKEW_MS} ms",
                index,
                raw,
            )
        if record.status == "rejected" and record.reason == "SEQ_GAP":
            return  # flushed at the close: its time decides nothing (SPEC §6.6)
        bound = max(sent, self.waited.get(record.source, sent), terms_arrived_ms)
        if self.simulation:  # senders' times are not in log order: max(a_prev, t) (§6.6)
            bound = max(bound, self.last_arrived_ms)
        if arrived > bound + MAX_ARRIVAL_LAG_MS:
            raise _Refuse(
                "W_TIME",
                f"record {index} arrived_ms {_when(arrived)} is delayed: its input was "
                f"delivered at {_when(sent)} (waiting for nothing later than {_when(bound)}) "
                f"+ {MAX_ARRIVAL_LAG_MS} ms",
                index,
                raw,
            )


def _when(ms: int) -> str:
    """A time in a refusal: ISO-8601 UTC for the reader, the milliseconds for evidence."""
    return f"{iso_utc(ms)} ({ms} ms)"


def _streams(known: Sequence[Known]) -> dict[str, list[Known]]:
    """The party's usage events per node, in seq order (first delivery of each seq)."""
    streams: dict[str, dict[int, Known]] = defaultdict(dict)
    for k in sorted(known, key=lambda k: (k.delivered_at_ms, k.input_hash)):
        if k.kind == "usage":
            streams[k.node_id].setdefault(k.seq, k)
    return {node: [by_seq[q] for q in sorted(by_seq)] for node, by_seq in streams.items()}


def _check_order(known: Sequence[Known], included: dict[str, int]) -> None:
    streams: dict[str, list[tuple[int, int, Known]]] = defaultdict(list)
    for k in known:
        if k.kind == "usage" and k.input_hash in included:
            streams[k.node_id].append((k.seq, included[k.input_hash], k))
    for node_id in sorted(streams):
        events = sorted(streams[node_id], key=lambda e: e[0])
        for (seq_a, index_a, _), (seq_b, index_b, later) in itertools.pairwise(events):
            if index_b < index_a:
                raise _Refuse(
                    "W_ORDER",
                    f"node {node_id}: seq {seq_b} is at record {index_b}, before seq {seq_a} "
                    f"at record {index_a} ({later.describe()})",
                    index_b,
                )


def _check_complete(
    known: Sequence[Known], included: dict[str, int], close_index: int, terms: PlacementTerms
) -> None:
    deadline_ms = terms.window_end_ms + terms.late_grace_ms - MAX_CLOCK_SKEW_MS
    missing = []
    for k in sorted(known, key=lambda k: (k.kind, k.node_id, k.seq, k.input_hash)):
        if k.delivered_at_ms > deadline_ms:
            continue  # delivered too close to (or after) the close to be owed before it
        index = included.get(k.input_hash)
        if index is None:
            missing.append(
                f"{k.describe()} (delivered at {_when(k.delivered_at_ms)}) is not in the log"
            )
        elif index > close_index:
            missing.append(
                f"{k.describe()} (delivered at {_when(k.delivered_at_ms)}, before the close "
                f"deadline {_when(deadline_ms)}) is at record {index}, after the close at "
                f"{close_index}"
            )
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise _Refuse("W_MISSING", "; ".join(missing[:5]) + more)


def _check_owed(known: Sequence[Known], included: dict[str, int], now_s: int) -> None:
    """SPEC §8.3 (6), at every round: an input delivered more than the arrival lag (+ skew)
    ago is in the log, window or not — unless it is a usage event held for a lower seq
    the party never delivered (SPEC §6.2)."""
    owed_before = now_s * 1000 - MAX_ARRIVAL_LAG_MS - MAX_CLOCK_SKEW_MS
    held: set[str] = set()
    for events in _streams(known).values():
        held_in_stream = False  # from the first gap on, each later seq may be held
        for k, after in itertools.pairwise(events):
            held_in_stream = held_in_stream or after.seq != k.seq + 1
            if held_in_stream:
                held.add(after.input_hash)
    missing = [
        f"{k.describe()} (delivered at {_when(k.delivered_at_ms)}) is not in the log at "
        f"{_when(now_s * 1000)}, {MAX_ARRIVAL_LAG_MS} + {MAX_CLOCK_SKEW_MS} ms later"
        for k in sorted(known, key=lambda k: (k.delivered_at_ms, k.kind, k.input_hash))
        if k.delivered_at_ms < owed_before
        and k.input_hash not in included
        and k.input_hash not in held
    ]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise _Refuse("W_MISSING", "; ".join(missing[:5]) + more)
