"""What one batch writes (``Store.commit_batch``) and the rows it becomes in the tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from ledger import snapshot
from ledger.limits import MAX_DETAIL_CHARS, MAX_QUARANTINE_BYTES
from ledger.store.schema import _N_TOTALS, StoreError
from proto.canonical import canonical_json
from proto.envelope import Envelope, sha256_hex
from proto.records import (
    Adjustment,
    BuyerRelease,
    LedgerRecord,
    NodeKeyBinding,
    PlacementClosed,
    ReclaimNotice,
    StreamResume,
    Totals,
    UsageEvent,
)


class ChainedRow(msgspec.Struct, frozen=True, gc=False):
    """One chained input and the LedgerRecord it produced. (A frozen Struct: one is built
    per input, and a frozen dataclass sets each field through ``object.__setattr__``.)"""

    record: LedgerRecord
    record_hash: str
    position: str
    raw: bytes
    input_hash: str
    payload_hash: str
    input_record: object
    # What the store keeps of the two envelopes (ENVELOPE_SQL rebuilds them): the
    # record's signed bytes (its envelope is ``crypto.seal_record`` of them: a record is
    # unsigned, SPEC §8) and the input's decoded envelope (``raw`` is its canonical form:
    # it was opened).
    record_payload: bytes
    input_envelope: Envelope


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    """An input that could not be attributed to a placement's chain."""

    position: str
    raw: bytes
    reason: str
    detail: str
    placement_id: str | None


@dataclass(frozen=True, slots=True)
class StateRow:
    """The fold state of one placement after the batch."""

    placement_id: str
    snapshot: bytes
    closed: bool
    close_due_ms: int | None


@dataclass(frozen=True, slots=True)
class StatementRow:
    """A signed statement and the columns kept beside it."""

    placement_id: str
    through_index: int
    head: str
    envelope: bytes
    final: bool
    totals: Totals


@dataclass(frozen=True, slots=True)
class HeldRow:
    """An input the fold holds (SPEC §6.2: before its placement's terms, or in its stream
    hold), kept as a row of ``held_inputs`` until the batch that releases it: its raw
    envelope, the stream (node_id, seq) of a usage event, and its held arrival (SPEC
    §6.6, None: untimed). The store numbers the rows in the order batches hold them."""

    placement_id: str
    position: str
    arrived_ms: int | None
    raw: bytes
    node_id: str | None
    seq: int | None


@dataclass(frozen=True, slots=True)
class HeldSummary:
    """Inputs a placement holds until its terms are accepted (SPEC §6.2)."""

    placement_id: str
    count: int
    since_ms: int | None


@dataclass(slots=True)
class Batch:
    """Everything one consumed batch produced; written atomically by ``commit_batch``."""

    chained: list[ChainedRow] = field(default_factory=list)
    quarantined: list[QuarantineRow] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    states: list[StateRow] = field(default_factory=list)
    statements: list[StatementRow] = field(default_factory=list)
    offsets: dict[str, str] = field(default_factory=dict)
    held: list[HeldRow] = field(default_factory=list)
    # (placement_id, position) of held inputs the batch released (their rows go).
    released: list[tuple[str, str]] = field(default_factory=list)
    # SPEC §6.5: GPU claims (scope, uuid, placement, start, end, share) changed by the batch,
    # and the (scope, uuid, placement) of those it ended (a GPU an amendment left, or
    # one given back before its claim began).
    claims: list[tuple[str, str, str, int, int, int]] = field(default_factory=list)
    claims_gone: list[tuple[str, str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.chained) + len(self.quarantined) + sum(self.dropped.values())


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The last record of a placement's chain."""

    placement_id: str
    chain_index: int
    record_hash: str
    envelope: bytes


def _input_columns(record: object) -> tuple[Any, ...]:
    """The convenience columns (node_id .. closed_at_ms) of one input record."""
    none11: tuple[Any, ...] = (None,) * 11
    match record:
        case UsageEvent():
            return (record.node_id, record.seq, record.start_ms, record.end_ms, *none11[:7])
        case NodeKeyBinding():
            return (
                record.node_id,
                None,
                None,
                None,
                record.valid_from_ms,
                record.valid_until_ms,
                record.issued_at_ms,
                None,
                None,
                None,
                None,
            )
        case ReclaimNotice() | BuyerRelease():
            return (*none11[:6], record.issued_at_ms, record.effective_at_ms, None, None, None)
        case Adjustment():
            return (
                *none11[:6],
                record.issued_at_ms,
                None,
                record.direction,
                record.amount_minor,
                None,
            )
        case PlacementClosed():
            return (*none11[:10], record.closed_at_ms)
        case StreamResume():
            return (record.node_id, *none11[1:])
        case _:
            return none11


# A LedgerRecord is unsigned (SPEC §8): its envelope's signature columns.
_UNSIGNED: Final = (None, None, "[]")
# The canonical JSON of a one-signature list, less its 16-character keyid and the 88
# characters of its signature's base64: ``[{"keyid":"…","sig":"…"}]``.
_ONE_SIGNATURE_FRAME: Final = len(b'[{"keyid":"","sig":""}]')
# The canonical envelope, less its payload's base64 and its signatures' JSON.
_ENVELOPE_FRAME: Final = len(b'{"payload":"","signatures":}')


_SignatureColumns = tuple[str | None, bytes | None, str | None]


def _signature_columns(raw: bytes, envelope: Envelope) -> _SignatureColumns:
    """(keyid, sig, signatures) of an input's canonical envelope ``raw`` (module SCHEMA).

    ``raw`` is canonical (it was opened), so ENVELOPE_SQL rebuilds it from these columns
    and the payload; its length is checked against theirs all the same, at the cost of
    some additions: a row that would not rebuild to its length is refused, never stored.
    """
    signatures = envelope.signatures
    payload_b64 = 4 * ((len(envelope.payload) + 2) // 3)
    if len(signatures) == 1:
        one = signatures[0]
        columns: _SignatureColumns = (one.keyid, one.sig, None)
        sigs_len = _ONE_SIGNATURE_FRAME + len(one.keyid) + 4 * ((len(one.sig) + 2) // 3)
    else:
        text = canonical_json(signatures).decode()
        columns = (None, None, text)
        sigs_len = len(text)
    if len(raw) != _ENVELOPE_FRAME + payload_b64 + sigs_len:
        raise StoreError("an input's envelope is not the canonical form of its contents")
    return columns


def _record_row(row: ChainedRow, commit_no: int) -> tuple[Any, ...]:
    r = row.record
    totals = r.totals
    return (
        r.placement_id,
        r.index,
        row.record_payload,
        *_UNSIGNED,
        row.record_hash,
        r.kind,
        r.status,
        r.reason,
        r.delivered_mgms,
        *msgspec.structs.astuple(totals)[:_N_TOTALS],  # TOTALS_FIELDS, in field order
        commit_no,
    )


def _input_row(row: ChainedRow, commit_no: int) -> tuple[Any, ...]:
    r = row.record
    return (
        r.placement_id,
        r.index,
        row.position,
        row.input_hash,
        row.payload_hash,
        row.input_envelope.payload,
        *_signature_columns(row.raw, row.input_envelope),
        r.kind,
        r.status,
        r.reason,
        *_input_columns(row.input_record),
        commit_no,
    )


def _quarantine_row(row: QuarantineRow) -> tuple[Any, ...]:
    # Evidence is bounded: a hostile producer cannot grow the store by more than this per
    # input; the hash and size of the whole input are kept.
    return (
        row.position,
        sha256_hex(row.raw),
        len(row.raw),
        row.raw[:MAX_QUARANTINE_BYTES],
        row.reason,
        row.detail[:MAX_DETAIL_CHARS],
        row.placement_id,
    )


def _seen_rows(chained: Sequence[ChainedRow]) -> list[tuple[str, str]]:
    """(placement_id, input_hash) of each chained input the fold adds to its placement's
    ``seen`` (SPEC §6.1 (2)): all but accepted usage events (known by stream position)."""
    return [
        (r.record.placement_id, r.input_hash)
        for r in chained
        if r.record.kind != "usage" or r.record.status != "accepted"
    ]


def _held_input(row: Sequence[Any]) -> snapshot.HeldInput:
    """(position, raw, node_id, seq, arrived_ms) of ``held_inputs`` as a HeldInput."""
    position, raw, node_id, seq, arrived_ms = row
    return snapshot.HeldInput(
        str(position),
        bytes(raw),
        None if node_id is None else str(node_id),
        None if seq is None else int(seq),
        None if arrived_ms is None else int(arrived_ms),
    )


def _statement_tuple(row: StatementRow) -> tuple[Any, ...]:
    t = row.totals
    return (
        row.placement_id,
        row.through_index,
        row.head,
        row.envelope,
        row.final,
        t.buyer_owes_minor,
        t.operator_receives_minor,
        t.desk_receives_minor,
    )
