"""The worker half of the single pass: one chain index (its LedgerRecord and its usage
event) opened AND checked off the main thread, returned as one compact row.

Almost every chain index of a big export is a usage event with its record, and almost
every one of them is honest. For such a pair the worker does everything of steps (4), (5)
and (6) that needs no sequential state: both envelopes decode (``open_one``, signatures
verified), the record is a LedgerRecord at its own index, of this placement, signed by
the ledger key only, its convenience columns equal its envelope, the input's table, extra
columns and input_hash equal its envelope, and the record's source, kind, status and
reason match the input. When ALL of that holds it returns a ``FastPair``: what the main
thread still needs for the sequential checks (prev link, arrival order, the leaf for (8),
the SPEC §6 decision with the decoded event, the ``w_records`` row) and nothing more.
A record of an export of version 2 may be unsigned (SPEC §8): ``ledger_permitted``.

When ANY of it fails it returns a ``SlowPair`` with both ``OpenResult``s, and the main
thread runs the ordinary per-index checks (``verifier/walk.py``), which name every
finding. So the fast path decides nothing the slow path would not: it only skips
comparisons it has already seen succeed. Any other chain index (no record, several
inputs, another kind) is sent as single envelopes (``ONE``) and opened as before.

Pure functions of their arguments, like ``open_chunk``: inline, thread or process.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple

import msgspec

from proto.records import LedgerRecord, UsageEvent
from verifier.opener import Keyring, OpenResult, open_one, open_plain
from verifier.pricing import TOTAL_FIELDS
from verifier.signers import signer_failure
from verifier.source import TABLE_OF_KIND, InputTable
from verifier.step5_columns import record_column_values

# Job kinds: (PAIR, index, record envelope, record columns, input envelope, input_hash
# column, status, reason, extras) for one usage chain index; (ONE, tag, envelope) else.
PAIR: Final = 0
ONE: Final = 1

Job = tuple[Any, ...]

# The usage_events extra columns, read from the event (step5_columns.check_input_columns).
_USAGE_EXTRAS: Final = attrgetter(*(name for name, _ in TABLE_OF_KIND["usage"].extras))
# A record's totals in TOTAL_FIELDS order (the w_records row), in one call.
_TOTALS: Final = attrgetter(*TOTAL_FIELDS)


class ExportFile(NamedTuple):
    """Where a worker process reads the rows of a chain-index range itself
    (``verifier/walk.py``, process pool): the file, its identity when the run began, and
    what the main process learnt of its schema."""

    path: str
    identity: tuple[int, int, int]  # (st_dev, st_ino, st_mtime_ns)
    placement_column: bool  # ledger_records has placement_id (ExportSource)
    tables: tuple[InputTable, ...]  # the input tables the export has
    # per table, (min, max) of its chain_index, None when it has none: a range outside
    # costs no query (most tables are small, and each query ~0.4 ms however empty)
    spans: tuple[tuple[int, int] | None, ...]


class PairContext(NamedTuple):
    """What every pair check needs besides the rows: the same for the whole export."""

    keyring: Keyring
    placement_id: str
    ledger_required: dict[str, bytes]  # who must sign a record (none in version 2)
    ledger_permitted: dict[str, bytes] | None = None  # who may (SPEC §8: the ledger key)
    export: ExportFile | None = None  # set when workers read their ranges themselves
    # ``open_ranges``: the FastPairs of a range packed in one blob (``pack_pairs``) for a
    # worker process; a worker thread hands over the list itself
    pack: bool = True


class FastPair(NamedTuple):
    """A chain index whose record and usage event passed every stateless check."""

    chain_index: int
    record_hash: str
    leaf: bytes
    prev: str
    arrived_ms: int | None
    status: str
    reason: str
    record_sigs: int
    record_row: tuple[Any, ...]  # the w_records row (step9_obligation.collect_record)
    opened: OpenResult  # the usage event, as open_one returned it


# A worker process sends its FastPairs as ONE msgpack blob per range (``pack_pairs``):
# msgspec encodes the named tuples as arrays and the event as its fields in one C call
# (~1 us a pair, where pickling the tuples and the event's Structs cost ~6-9 us), and
# decodes them in the main process straight into FastPair, OpenResult, SigResult and the
# UsageEvent (validated again, as its JSON was in the worker: same values, same types).
_PAIRS_ENCODER: Final = msgspec.msgpack.Encoder()
_PAIRS_DECODER: Final = msgspec.msgpack.Decoder(list[FastPair])


def pack_pairs(pairs: list[FastPair]) -> bytes:
    """The FastPairs of a range as one blob (``unpack_pairs`` restores them exactly)."""
    return _PAIRS_ENCODER.encode(pairs)


def unpack_pairs(blob: bytes) -> list[FastPair]:
    """The FastPairs ``pack_pairs`` was given, equal field by field (their events too)."""
    return _PAIRS_DECODER.decode(blob)


class SlowPair(NamedTuple):
    """A candidate pair that did not pass: both envelopes opened, nothing concluded."""

    record: OpenResult
    input: OpenResult


def open_jobs(jobs: Sequence[Job], context: PairContext) -> list[Any]:
    """One result per job: FastPair or SlowPair for PAIR, an OpenResult for ONE."""
    keyring = context.keyring
    out: list[Any] = []
    for job in jobs:
        if job[0] == ONE:
            out.append(open_one(job[1], job[2], keyring))
        else:
            out.append(_pair(job, context))
    return out


def _pair(job: Job, context: PairContext) -> FastPair | SlowPair:
    _, index, rec_raw, columns, in_raw, in_hash, status, reason, extras = job
    keyring = context.keyring
    # open_plain: open_one's result in one call for the usual bytes, else open_one
    rec = open_plain(0, rec_raw, "record", keyring) or open_one(0, rec_raw, keyring)
    inp = open_plain(1, in_raw, "usage", keyring) or open_one(1, in_raw, keyring)
    record = rec.record
    event = inp.record
    if (
        rec.error
        or inp.error
        or not isinstance(record, LedgerRecord)
        or not isinstance(event, UsageEvent)
        or inp.kind != "usage"
        # (6) the record itself
        or record.index != index
        or record.placement_id != context.placement_id
        or record.resale
        or signer_failure(rec.sigs, context.ledger_required, context.ledger_permitted) is not None
        # (5) its columns, the input's columns, (4) the input_hash column
        or record_column_values(rec.record_hash, record, columns) != columns
        or _USAGE_EXTRAS(event) != extras
        or in_hash != inp.input_hash
        # (6) the link between them
        or record.source != inp.input_hash
        or record.kind != inp.kind
        or (status, reason) != (record.status, record.reason)
    ):
        return SlowPair(rec, inp)
    totals = record.totals
    return FastPair(
        index,
        rec.record_hash,
        rec.leaf,
        record.prev,
        record.arrived_ms,
        record.status,
        record.reason,
        len(rec.sigs),
        (
            index,
            rec.record_hash,
            record.delivered_mgms,
            *_TOTALS(totals),
        ),
        inp,
    )
