"""What a record would do to the bill, before anyone publishes it: the ledger's side of
``--dry-run`` (the command's side, fetching an export and the words, is
``gridledger/dryrun.py``).

``rebuild`` is the one way in. It folds every input of an export again in chain order
with the ledger's own pure fold (``ledger.rules``), and the result must equal the
export's last record (else the export is not one this fold reproduces, and it says so
instead of guessing). ``Current.dry_run`` then folds the new record on top of that state:
its verdict (accepted, or rejected with the reason the ledger would give) and the totals
before and after.

Nothing is signed by the ledger and nothing is kept.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ledger.cache import PlacementCache
from ledger.export import INPUT_TABLES
from ledger.pricing import price, reclaim_credit_minor, release_charge_minor, resale_entry
from ledger.rules import NOT_LOOKED_UP, AcceptedEvent, NotLookedUp, decide, resale_of, usage_lookup
from ledger.state import PlacementState
from proto.envelope import Opened, open_envelope
from proto.errors import ProtoError
from proto.records import (
    Adjustment,
    BuyerRelease,
    LedgerRecord,
    PlacementTerms,
    ReclaimNotice,
    ResaleTotals,
    Totals,
)

__all__ = ["Current", "DryRun", "DryRunError", "rebuild"]


class DryRunError(Exception):
    """The current state could not be rebuilt (unreadable export, no such placement)."""


@dataclass(frozen=True)
class Current:
    """The placement's state as rebuilt from an export, and where it came from; ``dry_run``
    folds a record on top of it."""

    state: PlacementState
    cache: PlacementCache
    ledger_key: bytes
    records: int
    source: str

    @property
    def logged_ms(self) -> int | None:
        """SPEC §6.6: the last arrival the placement's chain carries (None: untimed)."""
        return self.state.arrived_ms

    def dry_run(
        self, envelope: bytes, missing_signers: tuple[str, ...], *, arrives_at_ms: int
    ) -> DryRun:
        """Fold ``envelope`` on top of this state as if it reached the log at ``arrives_at_ms``
        (SPEC §6.6: a reclaim's notice counts from there); nothing is kept."""
        opened = open_envelope(envelope)
        state = self.state
        verdict, new = decide(
            state,
            opened,
            "dry-run",
            ledger_key=self.ledger_key,
            accepted_at=_accepted_at(self.cache, state, opened),
            arrived_ms=arrives_at_ms,
        )
        status = verdict.status or verdict.decision
        reason = "" if verdict.reason is None else verdict.reason.value
        once_signed = None
        if missing_signers and reason.startswith("SIG_MISSING") and state.terms is not None:
            arrived = (
                arrives_at_ms if state.arrived_ms is None else max(state.arrived_ms, arrives_at_ms)
            )
            once_signed = _priced_once_signed(state.terms, state, opened.record, arrived)
        handover = None
        full = None
        if status == "accepted" and len(new.assignments) > len(state.assignments):
            handover = new.assignments[-1].handover_ms
            full = _resale_in_full(new)
        return DryRun(
            handover_ms=handover,
            resale_before=tuple(resale_of(state, state.assignments)),
            resale_after=tuple(resale_of(new, new.assignments)),
            resale_full=full,
            resale_end_ms=new.effective_end_ms,
            resale_gpus=len(new.assignments[-1].gpus) if full is not None else 0,
            status=status,
            reason=reason,
            detail=verdict.detail,
            before=state.totals,
            after=new.totals,
            records=self.records,
            source=self.source,
            once_signed=once_signed,
        )


@dataclass(frozen=True)
class DryRun:
    """The verdict on the new record and the totals before and after."""

    status: str  # "accepted" | "rejected" | "dropped" | "held"
    reason: str
    detail: str
    before: Totals
    after: Totals
    records: int
    source: str
    # Totals once the missing signers sign, when only signatures are missing.
    once_signed: Totals | None = None
    # SPEC §6.8: an accepted assignment's effective handover (the later of its handover
    # and its arrival), from which its new buyer is billed.
    handover_ms: int | None = None
    # SPEC §7.10: the resale figures (one per accepted assignment) before and after; and
    # for an assignment the fold accepts, what its new buyer owes if every GPU it buys
    # delivers from the handover to the effective end (``resale_end_ms``).
    resale_before: tuple[ResaleTotals, ...] = ()
    resale_after: tuple[ResaleTotals, ...] = ()
    resale_full: ResaleTotals | None = None
    resale_end_ms: int = 0
    resale_gpus: int = 0


def _first_line(exc: BaseException) -> str:
    """DuckDB's messages run over several lines (hints, a caret under the SQL)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _check_duckdb_file(export: Path, what: str = "--export") -> None:
    """One line for what is not an export at all: missing, a directory, not DuckDB."""
    try:
        with export.open("rb") as f:
            head = f.read(12)
    except IsADirectoryError as exc:
        raise DryRunError(f"{what} {export} is a directory; give an export FILE.duckdb") from exc
    except OSError as exc:
        raise DryRunError(f"cannot read {what} {export}: {exc.strerror or exc}") from exc
    # A DuckDB file has the magic "DUCK" at byte 8 (as verifier/source.py checks).
    if len(head) < 12 or head[8:12] != b"DUCK":
        raise DryRunError(
            f"{what} {export} is not a DuckDB file; give an export written by "
            "gridledger ledger export (or --ledger URL)"
        )


def _input_rows(
    export: Path, what: str = "--export"
) -> tuple[list[tuple[int, str, bytes]], bytes, int, tuple[int, ...], dict[int, int]]:
    _check_duckdb_file(export, what)
    try:
        con = duckdb.connect(str(export), read_only=True)
    except duckdb.Error as exc:
        raise DryRunError(f"cannot open export {export}: {_first_line(exc)}") from exc
    try:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        present = {str(name) for (name,) in con.execute("SHOW TABLES").fetchall()}
        union = " UNION ALL ".join(  # an export written before a table existed lacks it
            f"SELECT chain_index, position, envelope FROM {table}"
            for table in INPUT_TABLES
            if table in present
        )
        rows = [
            (int(i), str(p), bytes(e))
            for i, p, e in con.execute(f"{union} ORDER BY chain_index").fetchall()
        ]
        last = con.execute(
            "SELECT chain_index, gross_minor, buyer_owes_minor, operator_receives_minor, "
            "desk_receives_minor FROM ledger_records ORDER BY chain_index DESC LIMIT 1"
        ).fetchone()
        arrivals = _arrivals(con.execute("SELECT chain_index, envelope FROM ledger_records"))
    except duckdb.Error as exc:
        raise DryRunError(
            f"{export} is a DuckDB file but not a gridledger export: {_first_line(exc)}"
        ) from exc
    finally:
        con.close()
    if meta.get("format") != "gridledger-export":
        raise DryRunError(f"{export} is not a gridledger export (meta format)")
    ledger_key = base64.b64decode(meta.get("ledger_key", ""))
    records = 0 if last is None else int(last[0]) + 1
    expected = () if last is None else tuple(int(v) for v in last[1:])
    return rows, ledger_key, records, expected, arrivals


def _arrivals(cursor: duckdb.DuckDBPyConnection) -> dict[int, int]:
    """chain index -> the ``arrived_ms`` the ledger chained (SPEC §6.6), where it has one."""
    arrivals: dict[int, int] = {}
    for index, raw in cursor.fetchall():
        try:
            record = open_envelope(bytes(raw)).record
        except ProtoError as exc:
            raise DryRunError(f"ledger record {index} does not open: {exc}") from exc
        if isinstance(record, LedgerRecord) and record.arrived_ms is not None:
            arrivals[int(index)] = record.arrived_ms
    return arrivals


def rebuild(export: Path, placement_id: str, source: str | None = None) -> Current:
    """Refold every input of ``export``; check the result against its last record."""
    what = "--export" if source is None else f"the export {source} served"
    rows, ledger_key, records, expected, arrivals = _input_rows(export, what)
    cache = PlacementCache()
    state = cache.get(placement_id)
    for index, position, raw in rows:
        try:
            opened = open_envelope(raw)
        except ProtoError as exc:
            raise DryRunError(f"{export}: an input does not open: {exc}") from exc
        if opened.record.placement_id != placement_id:
            raise DryRunError(
                f"{export} is the export of {opened.record.placement_id}, not {placement_id}"
            )
        verdict, new = decide(
            state,
            opened,
            position,
            ledger_key=ledger_key,
            accepted_at=_accepted_at(cache, state, opened),
            arrived_ms=arrivals.get(index),
        )
        if new is not state:
            cache.put(new, verdict.flatten())
            state = new
    if state.terms is None:
        raise DryRunError(f"{export}: placement {placement_id} has no accepted terms")
    t = state.totals
    got = (t.gross_minor, t.buyer_owes_minor, t.operator_receives_minor, t.desk_receives_minor)
    if expected and got != expected:
        raise DryRunError(
            f"{export}: folding its inputs again gives totals {got}, its last record says "
            f"{expected}; run gridledger verify on it"
        )
    return Current(state, cache, ledger_key, records, source or str(export))


def _accepted_at(
    cache: PlacementCache, state: PlacementState, opened: Opened
) -> AcceptedEvent | NotLookedUp | None:
    """What ``decide`` asks about the past (the accepted usage event at an old seq)."""
    wanted = usage_lookup(state, opened)
    if wanted is None:
        return NOT_LOOKED_UP
    return cache.accepted_at(state.placement_id, *wanted)


def _resale_in_full(state: PlacementState) -> ResaleTotals | None:
    """SPEC §7.10 for the last accepted assignment as if each of its GPUs delivered its
    whole share from the handover ``h`` to the effective end: what its new buyer owes
    at most (less when a GPU delivers less, or a reclaim or release ends it earlier)."""
    terms = state.terms
    if terms is None or not state.assignments:
        return None
    last = state.assignments[-1]
    span = max(0, state.effective_end_ms - last.handover_ms)
    shares = sum(state.gpus[u].share_milli for u in last.gpus if u in state.gpus)
    return resale_entry(
        terms, last.assignment_id, last.new_buyer.id, last.rate_per_gpu_hour_minor, shares * span
    )


def _priced_once_signed(
    terms: PlacementTerms, state: PlacementState, record: object, arrived_ms: int
) -> Totals | None:
    """The totals the record gives once every required party signed (SPEC §7.3, §7.4);
    None for records that change no total by themselves (key bindings)."""
    t = state.totals
    values = {
        "delivered_mgms": t.delivered_mgms,
        "reclaim_credit": t.reclaim_credit_minor,
        "sla_credit": t.sla_credit_minor,
        "adjustment_credit": t.adjustment_credit_minor,
        "adjustment_charge": t.adjustment_charge_minor,
        "release_charge": t.release_charge_minor,
    }
    if isinstance(record, ReclaimNotice):
        values["reclaim_credit"] = reclaim_credit_minor(
            terms, arrived_ms, record.effective_at_ms, state.release_end_ms
        )
    elif isinstance(record, BuyerRelease):
        end = max(record.effective_at_ms, arrived_ms, state.max_usage_end_ms)
        values["release_charge"] = release_charge_minor(
            terms, arrived_ms, end, state.effective_end_ms
        )
    elif isinstance(record, Adjustment):
        name = "adjustment_credit" if record.direction == "credit" else "adjustment_charge"
        values[name] += record.amount_minor
    else:
        return None
    return price(terms, **values)
