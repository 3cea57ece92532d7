"""An export's capacity records against its terms' decisions (SPEC §6.5 "What the export
carries", EXPORT.md ``capacity_records``).

A shard decides terms through the capacity log; the export carries, for each GPU of each
terms input so decided, the records of that GPU's key its decision read. Without taking
the ledger's word, the verifier

* reads the rows (one record per partition and offset: two different rows at one offset
  are ``CAPACITY_RECORDS``), one partition per GPU key;
* re-runs the capacity fold on each key (``verifier/capacity_log.py``, records counting
  only when signed by a ledger key of the trust file);
* for every terms input accepted, or rejected ``OVERSOLD`` or ``CAPACITY_LATE``, finds its
  request on each GPU (``CAPACITY_REQUEST_MISSING`` when absent and the key's time has not
  passed the deadline), compares it with the terms and their record's ``arrived_ms``
  (``CAPACITY_REQUEST_MISMATCH``), and derives the terms' decision: accepted when every
  GPU's request is granted, else the first denied GPU's reason (``CAPACITY_DECISION`` when
  the export's differs).

So records removed or altered at rest (a signature no longer valid, a grant or a release
gone) change what the fold derives and fail the export with a named finding. An export
without the table (the embedded transport, or written before it) is not checked here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from proto.capacity_log import DENIED, GRANTED, CapEntry, CapRequest
from proto.envelope import decode_envelope, open_envelope
from proto.errors import ProtoError
from proto.limits import MAX_CAPACITY_WAIT_MS
from proto.records import LedgerRecord, PlacementTerms
from verifier.capacity_log import Derived, decisions_for_terms, record_of
from verifier.findings import Findings, Step
from verifier.small_export_db import EXPORT_ALIAS as ALIAS
from verifier.terms_rules import spelled

TABLE: Final = "capacity_records"
COLUMNS: Final = (
    ("terms_hash", "VARCHAR"),
    ("uuid", "VARCHAR"),
    ("log_partition", "BIGINT"),
    ("log_offset", "BIGINT"),
    ("log_ms", "BIGINT"),
    ("envelope", "BLOB"),
)
# At most this many terms inputs are read (an honest export holds a handful).
MAX_TERMS_ROWS: Final = 10_000
# The decisions the capacity log takes part in: accepted terms, and these refusals.
LOG_REASONS: Final = frozenset({"OVERSOLD", "CAPACITY_LATE"})


@dataclass(frozen=True, slots=True)
class TermsInput:
    """One terms input of the export: where, the terms, its record hash and decision."""

    where: str
    terms: PlacementTerms
    record_hash: str
    status: str
    reason: str
    arrived_ms: int | None


def check_capacity_records(
    rows: Iterable[Sequence[Any]],
    inputs: Sequence[TermsInput],
    ledger_keys: Iterable[bytes],
    findings: Findings,
) -> None:
    """SPEC §6.5: every capacity-decided terms input re-derived from the export's rows
    (``COLUMNS`` order, any row order)."""
    known = frozenset(ledger_keys)
    keys = _entries(rows, findings)
    for item in inputs:
        if item.status == "accepted" or item.reason in LOG_REASONS:
            _check_terms(item, keys, known, findings)


def _entries(rows: Iterable[Sequence[Any]], findings: Findings) -> dict[str, list[CapEntry]]:
    """The rows as fold entries per key, in offset order; equivocation named."""
    at: dict[tuple[int, int], tuple[str, int, bytes]] = {}
    partition_of: dict[str, int] = {}
    keys: dict[str, list[CapEntry]] = {}
    listed: set[tuple[int, int]] = set()
    for _, uuid, partition, offset, log_ms, envelope in rows:
        where = f"capacity record {partition}:{offset}"
        if None in (uuid, partition, offset, log_ms, envelope):
            findings.add(
                Step.DECISIONS,
                "CAPACITY_RECORDS",
                where,
                "every column set",
                "a NULL",
                "EXPORT.md capacity_records: every column is NOT NULL",
            )
            continue
        place, value = (int(partition), int(offset)), (str(uuid), int(log_ms), bytes(envelope))
        if at.setdefault(place, value) != value:
            findings.add(
                Step.DECISIONS,
                "CAPACITY_RECORDS",
                where,
                "one record per partition and offset",
                "two different records",
                "SPEC §6.5: the ledger shows two logs (equivocation)",
            )
            continue
        if place in listed:
            continue  # the same record listed again (for other terms): once in the fold
        listed.add(place)
        if partition_of.setdefault(str(uuid), int(partition)) != int(partition):
            findings.add(
                Step.DECISIONS,
                "CAPACITY_RECORDS",
                where,
                f"partition {partition_of[str(uuid)]}",
                f"partition {partition}",
                "SPEC §6.5: one GPU key lies in one partition",
            )
            continue
        try:
            sealed = decode_envelope(bytes(envelope))
        except ProtoError as exc:
            findings.add(
                Step.DECISIONS,
                "CAPACITY_RECORDS",
                where,
                "an envelope",
                str(exc),
                "SPEC §6.5: each capacity record is a signed envelope",
            )
            continue
        keys.setdefault(str(uuid), []).append(CapEntry(str(uuid), int(offset), int(log_ms), sealed))
    for entries in keys.values():
        entries.sort(key=lambda e: e.offset)
    return keys


def _check_terms(
    item: TermsInput, keys: dict[str, list[CapEntry]], known: frozenset[bytes], findings: Findings
) -> None:
    terms = item.terms
    first_denied: tuple[str, str] | None = None  # (uuid, reason)
    for gpu in terms.gpus:
        uuid = spelled(gpu.uuid)
        entries = keys.get(uuid, [])
        found = decisions_for_terms(
            entries, terms.placement_id, item.record_hash, terms.ledger_key, known
        ).get(uuid)
        if found is None:
            latest = max((e.log_ms for e in entries), default=0)
            deadline = (item.arrived_ms or 0) + MAX_CAPACITY_WAIT_MS
            if item.arrived_ms is None or latest <= deadline:
                findings.add(
                    Step.DECISIONS,
                    "CAPACITY_REQUEST_MISSING",
                    item.where,
                    f"a signed claim request for GPU {uuid}",
                    "none in capacity_records",
                    "SPEC §6.5: the export carries the capacity records its terms' decision read",
                )
                return
            found = Derived(-1, DENIED, "CAPACITY_LATE")  # the key's time passed unread
        else:
            _compare(item, uuid, entries, found, known, findings)
        if found.outcome != GRANTED and first_denied is None:
            first_denied = (uuid, found.reason or "")
    derived = "accepted" if first_denied is None else f"rejected {first_denied[1]}"
    actual = "accepted" if item.status == "accepted" else f"{item.status} {item.reason}"
    if derived != actual:
        findings.add(
            Step.DECISIONS,
            "CAPACITY_DECISION",
            item.where,
            derived,
            actual,
            "SPEC §6.5: the capacity fold over the export's records decides otherwise"
            + ("" if first_denied is None else f" (GPU {first_denied[0]})"),
        )


def _compare(
    item: TermsInput,
    uuid: str,
    entries: list[CapEntry],
    found: Derived,
    known: frozenset[bytes],
    findings: Findings,
) -> None:
    """The request that decided is the terms' own: window, share, amends, arrival."""
    entry = next(e for e in entries if e.offset == (found.duplicate_of or found.offset))
    request = record_of(entry.envelope, known)
    if not isinstance(request, CapRequest):
        # decisions_for_terms decided on this entry, so it opens as a request; were it
        # not one, the decision rests on no request of the terms: name it, never crash.
        findings.add(
            Step.DECISIONS,
            "CAPACITY_REQUEST_MISSING",
            item.where,
            f"a signed claim request for GPU {uuid}",
            f"entry at offset {entry.offset} is not one",
            "SPEC §6.5: the decision rests on the terms' own claim request",
        )
        return
    terms = item.terms
    share = next(g.share_milli for g in terms.gpus if spelled(g.uuid) == uuid)
    want: tuple[object, ...] = (terms.window_start_ms, terms.window_end_ms, share, terms.supersedes)
    got: tuple[object, ...] = (
        request.start_ms,
        request.end_ms,
        request.share_milli,
        request.supersedes,
    )
    if item.arrived_ms is not None:
        want, got = (*want, item.arrived_ms), (*got, request.terms_arrived_ms)
    if want != got:
        findings.add(
            Step.DECISIONS,
            "CAPACITY_REQUEST_MISMATCH",
            item.where,
            str(want),
            str(got),
            f"SPEC §6.5: the claim request on GPU {uuid} is not the terms' (window, share, "
            "supersedes, terms_arrived_ms)",
        )


def terms_inputs(source: Any) -> list[TermsInput]:
    """The export's terms inputs with their records' ``arrived_ms`` (bounded reads)."""
    alias = ALIAS
    records = {
        int(i): bytes(env)
        for i, env in source.con.execute(
            f"SELECT chain_index, envelope FROM {alias}.ledger_records WHERE chain_index IN "
            f"(SELECT chain_index FROM {alias}.terms) LIMIT {MAX_TERMS_ROWS}"
        ).fetchall()
    }
    out = []
    for index, envelope, status, reason in source.small_table(
        "terms", "chain_index, envelope, status, reason", "chain_index"
    ):
        try:
            opened = open_envelope(bytes(envelope))
            ledger = open_envelope(records[int(index)]).record if int(index) in records else None
        except ProtoError:
            continue  # (4) names it
        if not isinstance(opened.record, PlacementTerms):
            continue
        arrived = ledger.arrived_ms if isinstance(ledger, LedgerRecord) else None
        where = f"chain index {index}"
        out.append(
            TermsInput(where, opened.record, opened.record_hash, str(status), str(reason), arrived)
        )
    return out
