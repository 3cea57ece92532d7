"""Statements and checkpoints issued on request, and party cosignatures of checkpoints.

These work from the store alone (committed records), so the HTTP API of a running ledger
and the CLI on a stopped ledger's file give the same answers. What is issued is stored,
so asking twice for the same head returns the same bytes.
"""

from __future__ import annotations

from ledger.checkpoints import make_checkpoint, merge_cosignature
from ledger.statements import ledger_record_of, make_statement, statement_period
from ledger.store import ChainHead, Store
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.note import parse_checkpoint_body, parse_note
from proto.reasons import Reason
from proto.records import ZERO_HASH


class UnknownPlacement(LookupError):
    """The store has no chain for this placement."""


def _head(store: Store, placement_id: str) -> ChainHead:
    head = store.head(placement_id)
    if head is None:
        raise UnknownPlacement(store.no_records_text(placement_id))
    return head


def issue_statement(store: Store, key: SigningKey, placement_id: str) -> bytes:
    """The signed statement through the placement's current head (stored once issued)."""
    head = _head(store, placement_id)
    existing = store.statement(placement_id, head.chain_index)
    if existing is not None:
        return existing
    record, record_hash = ledger_record_of(head.envelope)
    close_index = store.close_index(placement_id)
    final = close_index is not None and close_index <= head.chain_index
    terms = store.terms(placement_id)
    if terms is None:
        raise UnknownPlacement(f"placement {placement_id!r} has no accepted terms")
    period = statement_period(head.chain_index, close_index)
    previous = ZERO_HASH
    if period > 0:
        # SPEC §8 "Statement periods": the head of the period before.
        before = store.record_hash_at(placement_id, head.chain_index - 1)
        if before is None:
            raise UnknownPlacement(f"placement {placement_id!r}: record {head.chain_index - 1}")
        previous = before
    row = make_statement(record, record_hash, terms, final, key, period=period, previous=previous)
    store.add_statement(row)
    return row.envelope


def issue_checkpoint(store: Store, key: SigningKey, placement_id: str) -> str:
    """The checkpoint note over every record so far, with the cosignatures stored for it."""
    head = _head(store, placement_id)
    size = head.chain_index + 1
    existing = store.checkpoint(placement_id, size)
    if existing is not None:
        return existing
    note = make_checkpoint(placement_id, store.record_payloads(placement_id, head.chain_index), key)
    return store.put_checkpoint(placement_id, size, note.text(), replace=False)


def cosign_checkpoint(
    store: Store, key: SigningKey, placement_id: str, note_text: str
) -> tuple[str, list[str]]:
    """Add the valid party signatures of ``note_text`` to the stored checkpoint it signs.

    Returns (the stored note with every cosignature, parties added). Raises ProtoError for
    a note that is malformed, over a checkpoint this ledger never issued, or without a
    new valid party signature; UnknownPlacement for a placement without a chain.
    """
    submitted = parse_note(note_text)
    checkpoint = parse_checkpoint_body(submitted.body)
    terms = store.terms(placement_id)
    if terms is None:
        raise UnknownPlacement(f"placement {placement_id!r} has no accepted terms")
    with store.lock:
        stored = store.checkpoint(placement_id, checkpoint.size)
        if stored is None:
            head = _head(store, placement_id)
            if checkpoint.size != head.chain_index + 1:
                raise ProtoError(
                    Reason.MALFORMED,
                    f"no checkpoint of size {checkpoint.size} was issued for {placement_id}",
                )
            stored = issue_checkpoint(store, key, placement_id)
        merged, added = merge_cosignature(stored, note_text, terms, key.public_key)
        store.put_checkpoint(placement_id, checkpoint.size, merged, replace=True)
    return merged, added
