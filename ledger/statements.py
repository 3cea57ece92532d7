"""Statements (SPEC.md §8): the ledger-signed obligation through one record of a chain.

Pure: a statement is a function of the record it summarises, the placement's currency and
whether the chain through that record includes an accepted close. Ed25519 signatures
are deterministic, so the same chain always yields byte-identical statements.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ledger.store import StatementRow
from proto.envelope import open_envelope, seal
from proto.keys import SigningKey, b64
from proto.records import ZERO_HASH, LedgerRecord, PlacementTerms, Statement


def statement_period(through_index: int, close_index: int | None) -> int:
    """SPEC §8 "Statement periods": 0 through the close, ``i - c`` for record ``i`` after it."""
    if close_index is None or through_index <= close_index:
        return 0
    return through_index - close_index


def statement_of(
    record: LedgerRecord,
    record_hash: str,
    terms: PlacementTerms,
    final: bool,
    *,
    period: int = 0,
    previous: str = ZERO_HASH,
    arrival: Literal["log", "sender"] = "log",
) -> Statement:
    """The statement through ``record`` (whose payload hash is ``record_hash``), unsigned.

    ``period`` and ``previous`` per SPEC §8 "Statement periods" (``statement_period``);
    ``arrival``: the ledger's arrival mode, which the statement signs (SPEC §6.6)."""
    return Statement(
        placement_id=record.placement_id,
        through_index=record.index,
        head=record_hash,
        currency=terms.currency,
        currency_scale=terms.currency_scale,
        final=final,
        totals=record.totals,
        period=period,
        previous=previous,
        resale=record.resale,
        arrival=arrival,
    )


def make_statement(
    record: LedgerRecord,
    record_hash: str,
    terms: PlacementTerms,
    final: bool,
    key: SigningKey,
    *,
    period: int = 0,
    previous: str = ZERO_HASH,
    arrival: Literal["log", "sender"] = "log",
) -> StatementRow:
    """Sign the statement through ``record`` (``statement_of``), as the store keeps it."""
    statement = statement_of(
        record, record_hash, terms, final, period=period, previous=previous, arrival=arrival
    )
    return StatementRow(
        placement_id=record.placement_id,
        through_index=record.index,
        head=record_hash,
        envelope=seal(statement, [key]),
        final=final,
        totals=record.totals,
    )


def ledger_record_of(envelope: bytes) -> tuple[LedgerRecord, str]:
    """Decode a stored LedgerRecord envelope: (record, record hash)."""
    opened = open_envelope(envelope)
    if not isinstance(opened.record, LedgerRecord):
        raise ValueError(f"expected a LedgerRecord envelope, got {opened.kind}")
    return opened.record, opened.record_hash


def statement_json(envelope: bytes) -> dict[str, Any]:
    """The JSON answer for a statement: its fields plus the envelope (base64)."""
    opened = open_envelope(envelope)
    if not isinstance(opened.record, Statement):
        raise ValueError(f"expected a Statement envelope, got {opened.kind}")
    body: dict[str, Any] = msgspec.to_builtins(opened.record)
    body["envelope"] = b64(envelope)
    return body


# What an unsigned statement says of itself in its JSON answer (``preview_json``).
PREVIEW_NOTE = (
    "unsigned preview through the current head: the ledger signs and stores a statement "
    "at the close (and when it is exported); a read never signs"
)


def preview_json(statement: Statement) -> dict[str, Any]:
    """The JSON answer for a statement the ledger has not signed: its fields, no envelope,
    ``preview`` saying so (``statement_json`` answers for a signed one)."""
    body: dict[str, Any] = msgspec.to_builtins(statement)
    body["envelope"] = None
    body["preview"] = PREVIEW_NOTE
    return body
