"""Statements and checkpoints issued on request, and party cosignatures of checkpoints;
``current_statement``, the statement through the head for a read, which never signs.

These work from the store alone (committed records), so the HTTP API of a running ledger
and the CLI on a stopped ledger's file give the same answers. What is issued is stored,
so asking twice for the same head returns the same bytes.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ledger.checkpoints import (
    CosignTimes,
    checkpoint_over_leaves,
    merge_cosignature,
    party_note_keys,
    sign_checkpoint,
)
from ledger.limits import ATTEST_LEAF_RECORDS
from ledger.statements import (
    ledger_record_of,
    make_statement,
    preview_json,
    statement_json,
    statement_of,
    statement_period,
)
from ledger.store import ChainHead, StatementRow, Store, StoreError
from proto import merkle
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.frontier import Frontier
from proto.keys import SigningKey
from proto.note import parse_checkpoint_body, parse_note
from proto.reasons import Reason
from proto.records import ZERO_HASH, Assignment, LedgerRecord, Party, PlacementTerms, Statement

# Placements attested per store transaction by ``attest_all``.
ATTEST_CHUNK: Final = 256
# Rows ``attest_all`` fetches from DuckDB at a time (leaf hashes).
_FETCH_ROWS: Final = 10_000

# The RFC 9162 leaf hash (proto.merkle.leaf_hash) of a stored LedgerRecord's payload,
# computed by DuckDB beside the scan: SHA-256(0x00 || payload), the payload being the
# signed bytes the store keeps (``records.payload``, ledger.store). A test pins it to
# leaf_hash(decode_envelope(envelope).payload).
LEAF_HASH_SQL: Final = "sha256('\\x00'::BLOB || payload)"


class UnknownPlacement(LookupError):
    """The store has no chain for this placement."""


def _head(store: Store, placement_id: str) -> ChainHead:
    head = store.head(placement_id)
    if head is None:
        raise UnknownPlacement(store.no_records_text(placement_id))
    return head


def issue_statement(store: Store, key: SigningKey, placement_id: str) -> bytes:
    """The signed statement through the placement's current head (stored once issued),
    and a checkpoint at that head or later (SPEC §8: records are unsigned; the checkpoint
    is what authenticates the records the statement's head chains back to)."""
    envelope = _issue_statement(store, key, placement_id)
    issue_checkpoint(store, key, placement_id)
    return envelope


def _issue_statement(store: Store, key: SigningKey, placement_id: str) -> bytes:
    head = _head(store, placement_id)
    existing = store.statement(placement_id, head.chain_index)
    if existing is not None:
        return existing
    terms, close_index, previous = _statement_context(store, placement_id, head)
    row = _statement(key, head.envelope, terms, close_index, previous, store.arrival())
    store.add_statement(row)
    return row.envelope


def current_statement(store: Store, placement_id: str) -> tuple[Statement, bytes | None]:
    """The statement through the placement's current head without writing anything: the
    stored one and its envelope, or, where none is stored for the head yet, the same
    statement unsigned (envelope None): a read serves what ``issue_statement`` would
    sign, and signs nothing."""
    head = _head(store, placement_id)
    existing = store.statement(placement_id, head.chain_index)
    if existing is not None:
        stored = open_envelope(existing).record
        if not isinstance(stored, Statement):
            raise UnknownPlacement(f"the stored statement of {placement_id!r} is not a statement")
        return stored, existing
    terms, close_index, previous = _statement_context(store, placement_id, head)
    record, record_hash = ledger_record_of(head.envelope)
    final = close_index is not None and close_index <= record.index
    period = statement_period(record.index, close_index)
    unsigned = statement_of(
        record,
        record_hash,
        terms,
        final,
        period=period,
        previous=previous,
        arrival=_mode(store.arrival()),
    )
    return unsigned, None


def _statement_context(
    store: Store, placement_id: str, head: ChainHead
) -> tuple[PlacementTerms, int | None, str]:
    """(terms, close index, ``previous``) of the statement through ``head`` (SPEC §8)."""
    close_index = store.close_index(placement_id)
    terms = store.terms(placement_id)
    if terms is None:
        raise UnknownPlacement(f"placement {placement_id!r} has no accepted terms")
    previous = ZERO_HASH
    if statement_period(head.chain_index, close_index) > 0:
        # SPEC §8 "Statement periods": the head of the period before.
        before = store.record_hash_at(placement_id, head.chain_index - 1)
        if before is None:
            raise UnknownPlacement(f"placement {placement_id!r}: record {head.chain_index - 1}")
        previous = before
    return terms, close_index, previous


def _statement(
    key: SigningKey,
    head_envelope: bytes,
    terms: PlacementTerms,
    close_index: int | None,
    previous: str,
    arrival: str,
) -> StatementRow:
    """The statement through the head record (``previous``: the hash of the record before
    it when the head is past the close, SPEC §8 "Statement periods"; ``arrival``: the
    store's arrival mode, SPEC §6.6)."""
    record, record_hash = ledger_record_of(head_envelope)
    final = close_index is not None and close_index <= record.index
    period = statement_period(record.index, close_index)
    return make_statement(
        record,
        record_hash,
        terms,
        final,
        key,
        period=period,
        previous=previous,
        arrival=_mode(arrival),
    )


def _mode(arrival: str) -> Literal["log", "sender"]:
    """The store's arrival mode as a statement signs it (SPEC §6.6)."""
    return "sender" if arrival == "sender" else "log"


def issue_checkpoint(store: Store, key: SigningKey, placement_id: str) -> str:
    """The checkpoint note over every record so far, with the cosignatures stored for it."""
    head = _head(store, placement_id)
    size = head.chain_index + 1
    existing = store.checkpoint(placement_id, size)
    if existing is not None:
        return existing
    root = frontier_at(store, placement_id, size).root()
    note = sign_checkpoint(placement_id, size, root, key)
    return store.put_checkpoint(placement_id, size, note.text(), replace=False)


# Per store and placement, the frontiers (RFC 9162 compact ranges) of the last few tree
# sizes a checkpoint was issued or an export cut at: the next checkpoint, and the proof of
# an export since one (SPEC §8.5), hash only the records after it, not the whole log.
_FRONTIERS: weakref.WeakKeyDictionary[Store, dict[str, dict[int, Frontier]]] = (
    weakref.WeakKeyDictionary()
)
KEPT_FRONTIERS: Final = 4


def frontier_at(store: Store, placement_id: str, size: int) -> Frontier:
    """The frontier of the placement's first ``size`` records: a kept one at or below
    ``size`` whose stored checkpoint it still gives (a kept frontier of records that a
    rolled-back batch took away gives none: the log from 0 then), extended by the records
    after it."""
    kept = _FRONTIERS.setdefault(store, {}).setdefault(placement_id, {})
    base = max((s for s in kept if s <= size), default=0)
    frontier = kept.get(base, Frontier.empty())
    if base and not _stored_root_is(store, placement_id, base, frontier.root()):
        kept.clear()
        base, frontier = 0, Frontier.empty()
    for payload in payloads_between(store, placement_id, base, size):
        frontier = frontier.append_leaf_hash(merkle.leaf_hash(payload))
    kept[size] = frontier
    while len(kept) > KEPT_FRONTIERS:
        del kept[min(kept)]
    return frontier


def _stored_root_is(store: Store, placement_id: str, size: int, root: bytes) -> bool:
    note = store.checkpoint(placement_id, size)
    if note is None:
        return False
    try:
        return parse_checkpoint_body(parse_note(note).body).root == root
    except ProtoError:
        return False


def payloads_between(store: Store, placement_id: str, lo: int, hi: int) -> list[bytes]:
    """The signed bytes of records lo..hi-1 of the placement, in index order."""
    if hi <= lo:
        return []
    rows = store.placement_query(
        "SELECT chain_index, payload FROM records WHERE {rows} "
        "AND chain_index >= ? AND chain_index < ? ORDER BY chain_index",
        placement_id,
        [lo, hi],
    )
    if [int(index) for index, _ in rows] != list(range(lo, hi)):
        raise StoreError(f"chain of {placement_id} has a hole in {lo}..{hi - 1}")
    return [bytes(payload) for _, payload in rows]


def cosign_checkpoint(
    store: Store, key: SigningKey, placement_id: str, note_text: str, *, now_ms: int | None = None
) -> tuple[str, list[str]]:
    """Add the valid party signatures of ``note_text`` to the stored checkpoint it signs.

    A party is one of the terms or an accepted assignment's new buyer (SPEC §8.2); each
    cosignature is dated between the last covered record's arrival and the ledger's clock
    (``now_ms``, default the wall clock; never before that arrival), each with its margin
    (SPEC §8.4). Returns (the stored note with every cosignature, parties added). Raises
    ProtoError for a note that is malformed, over a checkpoint this ledger never issued,
    or without a new valid party signature; UnknownPlacement for a placement without a
    chain.
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
        keys = party_note_keys(terms, _new_buyers(store, placement_id, checkpoint.size))
        last = _arrived_ms(store, placement_id, checkpoint.size - 1)
        clock = int(time.time() * 1000) if now_ms is None else now_ms
        times = CosignTimes(last, max(clock, last or 0))
        merged, added = merge_cosignature(stored, note_text, keys, key.public_key, times)
        store.put_checkpoint(placement_id, checkpoint.size, merged, replace=True)
    return merged, added


def _new_buyers(store: Store, placement_id: str, size: int) -> list[Party]:
    """The new buyers of the assignments accepted in the first ``size`` records."""
    rows = store.placement_query(
        "SELECT envelope FROM inputs WHERE {rows} AND kind = 'assignment' "
        "AND status = 'accepted' AND chain_index < ? ORDER BY chain_index",
        placement_id,
        [size],
    )
    out: list[Party] = []
    for (envelope,) in rows:
        record = open_envelope(bytes(envelope)).record
        if isinstance(record, Assignment):
            out.append(record.new_buyer)
    return out


def _arrived_ms(store: Store, placement_id: str, index: int) -> int | None:
    """The ``arrived_ms`` of record ``index`` (None: no such record, or untimed)."""
    rows = store.placement_query(
        "SELECT envelope FROM records WHERE {rows} AND chain_index = ?", placement_id, [index]
    )
    if not rows:
        return None
    record = open_envelope(bytes(rows[0][0])).record
    return record.arrived_ms if isinstance(record, LedgerRecord) else None


@dataclass(frozen=True, slots=True)
class ChainFacts:
    """What ``attest_all`` learnt of one chain while attesting it."""

    records: int
    kinds: frozenset[str]


@dataclass(frozen=True, slots=True)
class Attested:
    """``attest_all``'s answer: the chains attested, and those it could not attest."""

    chains: dict[str, ChainFacts]
    skipped: dict[str, str]  # placement -> why (the UnknownPlacement text of issue_statement)


@dataclass(frozen=True, slots=True)
class _Summary:
    """What ``attest_all`` reads of one chain in SQL: its record count, the kinds it
    holds and the index of its first accepted close (SPEC §8 statement periods)."""

    records: int
    kinds: frozenset[str]
    close_index: int | None


def attest_all(store: Store, key: SigningKey, placement_ids: Sequence[str]) -> Attested:
    """``issue_statement`` and ``issue_checkpoint`` for many placements, set-wise.

    The same statements and checkpoints, byte for byte, as issuing them one placement at
    a time, but read with a few queries per ATTEST_CHUNK placements (taken in commit
    order, so each chunk's reads stay within its placements' row groups) and stored with
    one transaction per chunk. A placement ``issue_statement`` would refuse (no accepted
    terms) is skipped and named, as a placement ``export_placement`` would refuse.
    Raises UnknownPlacement (before issuing anything) for a placement without a chain.

    Memory (bench/export_rss.py): a chain is summed up by DuckDB (count, kinds, close index; its
    indexes checked to be 0..n-1), never held in Python row by row; only the leaf hashes
    of the chains that still need a checkpoint are, ATTEST_LEAF_RECORDS at a time (a
    larger chain alone, 32 bytes a record).
    """
    done = Attested({}, {})
    for part in attest_chunks(store, key, placement_ids):
        done.chains.update(part.chains)
        done.skipped.update(part.skipped)
    return done


def attest_chunks(
    store: Store, key: SigningKey, placement_ids: Sequence[str]
) -> Iterator[Attested]:
    """``attest_all`` one ATTEST_CHUNK of placements at a time (in commit order): each
    answer is yielded once its statements and checkpoints are committed to the store, so
    a caller can export a chunk's placements while the next chunk is attested
    (``export_all``). Raises UnknownPlacement at the first ``next`` (before issuing
    anything) for a placement without a chain."""
    ranges = store.commit_ranges()
    missing = [p for p in placement_ids if p not in ranges]
    if missing:
        raise UnknownPlacement(store.no_records_text(missing[0]))
    have_statements = store.statement_heads()
    have_checkpoints = store.checkpoint_sizes()
    ordered = sorted(set(placement_ids), key=lambda p: (ranges[p], p))
    for at in range(0, len(ordered), ATTEST_CHUNK):
        done = Attested({}, {})
        chunk = ordered[at : at + ATTEST_CHUNK]
        low = min(ranges[p][0] for p in chunk)
        high = max(ranges[p][1] for p in chunk)
        chains = _summaries(store, chunk, low, high)
        need = {p: c.records - 1 for p, c in chains.items()}
        need = {p: head for p, head in need.items() if (p, head) not in have_statements}
        statements, skipped = _statements(store, key, need, chains, low, high)
        done.skipped.update(skipped)
        sizes: dict[str, int] = {}
        for pid, chain in chains.items():
            if pid in skipped:
                continue
            done.chains[pid] = ChainFacts(chain.records, chain.kinds)
            if (pid, chain.records) not in have_checkpoints:
                sizes[pid] = chain.records
        checkpoints = [
            (pid, size, checkpoint_over_leaves(pid, leaves, key).text())
            for pid, size, leaves in _leaves(store, sizes, ranges)
        ]
        store.add_attestations(statements, checkpoints)
        yield done


def _summaries(store: Store, chunk: list[str], low: int, high: int) -> dict[str, _Summary]:
    """The ``_Summary`` of every chain of ``chunk`` (commit range ``low``..``high``), in
    ``chunk``'s order; StoreError when a chain's indexes are not exactly 0..n-1."""
    found = {
        str(pid): (int(n), int(distinct), lo, hi, kinds, close)
        for pid, n, distinct, lo, hi, kinds, close in store.query(
            "SELECT placement_id, count(*), count(DISTINCT chain_index), min(chain_index), "
            "max(chain_index), list(DISTINCT kind), min(chain_index) FILTER "
            "(WHERE kind = 'closed' AND status = 'accepted') FROM records "
            "WHERE placement_id IN (SELECT unnest(?)) AND commit_no BETWEEN ? AND ? "
            "GROUP BY placement_id",
            [chunk, low, high],
        )
    }
    chains: dict[str, _Summary] = {}
    for pid in chunk:
        if pid not in found:
            raise StoreError(f"chain of {pid} has a hole or is empty")
        n, distinct, lo, hi, kinds, close = found[pid]
        if distinct != n or lo != 0 or hi != n - 1:
            raise StoreError(f"chain of {pid} has a hole or is empty")
        chains[pid] = _Summary(n, frozenset(str(k) for k in kinds), close)
    return chains


def _leaves(
    store: Store, sizes: dict[str, int], ranges: dict[str, tuple[int, int]]
) -> Iterator[tuple[str, int, list[bytes]]]:
    """(placement, size, leaf hashes in index order) of every chain of ``sizes``
    (placement -> records, indexes 0..size-1 as ``_summaries`` checked), read
    ATTEST_LEAF_RECORDS at a time (a larger chain alone), unsorted: each leaf is put
    at its index."""
    batch: list[str] = []
    held = 0
    batches: list[list[str]] = []
    for pid, size in sizes.items():
        if batch and held + size > ATTEST_LEAF_RECORDS:
            batches.append(batch)
            batch, held = [], 0
        batch.append(pid)
        held += size
    if batch:
        batches.append(batch)
    for pids in batches:
        leaves = {p: [b""] * sizes[p] for p in pids}
        con = store.cursor()
        try:
            con.execute(
                f"SELECT placement_id, chain_index, unhex({LEAF_HASH_SQL}) FROM records "
                "WHERE placement_id IN (SELECT unnest(?)) AND commit_no BETWEEN ? AND ?",
                [pids, min(ranges[p][0] for p in pids), max(ranges[p][1] for p in pids)],
            )
            for _ in range(sum(sizes[p] for p in pids) // _FETCH_ROWS + 2):
                rows = con.fetchmany(_FETCH_ROWS)
                if not rows:
                    break
                for pid, index, leaf in rows:
                    leaves[str(pid)][int(index)] = bytes(leaf)
            else:
                raise StoreError(f"more leaf hashes than records in chains of {pids}")
        finally:
            con.close()
        for pid in pids:
            yield pid, sizes[pid], leaves.pop(pid)


def _statements(
    store: Store,
    key: SigningKey,
    heads: dict[str, int],
    chains: dict[str, _Summary],
    low: int,
    high: int,
) -> tuple[list[StatementRow], dict[str, str]]:
    """The statements through ``heads`` (placement -> head index), and the placements
    without accepted terms (no statement, as ``issue_statement``)."""
    if not heads:
        return [], {}
    ids = sorted(heads)
    # The head's envelope, and the record hash before it (SPEC §8 "Statement periods":
    # the previous period's head, used when the head is past the close).
    envelopes: dict[str, bytes] = {}
    before: dict[str, str] = {}
    for p, index, envelope, record_hash in store.query(
        "SELECT r.placement_id, r.chain_index, CASE WHEN r.chain_index = h.i THEN "
        "r.envelope END, r.record_hash FROM records r "
        "JOIN (SELECT unnest(?) AS p, unnest(?) AS i) h "
        "ON r.placement_id = h.p AND r.chain_index IN (h.i, h.i - 1) "
        "WHERE r.commit_no BETWEEN ? AND ?",
        [ids, [heads[p] for p in ids], low, high],
    ):
        if index == heads[str(p)]:
            envelopes[str(p)] = bytes(envelope)
        else:
            before[str(p)] = str(record_hash)
    terms_of = {
        str(p): bytes(e)
        for p, e in store.query(
            "SELECT placement_id, arg_max(envelope, chain_index) FROM inputs "
            "WHERE placement_id IN (SELECT unnest(?)) AND commit_no BETWEEN ? AND ? "
            "AND kind = 'terms' AND status = 'accepted' GROUP BY 1",
            [ids, low, high],
        )
    }
    rows: list[StatementRow] = []
    skipped: dict[str, str] = {}
    arrival = store.arrival()  # SPEC §6.6: every statement signs the store's mode
    for pid in ids:
        if pid not in terms_of:
            skipped[pid] = f"placement {pid!r} has no accepted terms"
            continue
        terms = open_envelope(terms_of[pid]).record
        if not isinstance(terms, PlacementTerms):
            raise StoreError(f"stored terms of {pid} decode as {type(terms).__name__}")
        close_index = chains[pid].close_index
        head = heads[pid]
        previous = ZERO_HASH
        if statement_period(head, close_index) > 0:
            previous = before[pid]
        try:
            rows.append(_statement(key, envelopes[pid], terms, close_index, previous, arrival))
        except ProtoError as exc:  # SPEC §7.7: one placement's stored fault, not the run's
            skipped[pid] = f"placement {pid!r}: its head record does not decode ({exc})"
    return rows, skipped


def statement_answer(store: Store, placement_id: str) -> dict[str, Any]:
    """The JSON answer to a read of the statement (``current_statement``): the stored
    statement's, or the unsigned preview's, marked so."""
    statement, envelope = current_statement(store, placement_id)
    return preview_json(statement) if envelope is None else statement_json(envelope)
