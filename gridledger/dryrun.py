"""What a record would do to the bill, before anyone publishes it (``--dry-run``).

The current state of the placement is rebuilt locally: every input of an export (a file
the user has, or one the running ledger serves at ``GET /placements/<id>/export``) is
folded again in chain order with the ledger's own pure fold (``ledger.decide``), and
the result must equal the export's last record (else the export is not one this fold
reproduces, and the dry run says so instead of guessing). The new record is then folded
on top of that state: its verdict (accepted, or rejected with the reason the ledger
would give) and the totals before and after, line by line.

Nothing is signed by the ledger and nothing is published: the dry run needs no key but
the party's own, which already signed the record.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import duckdb

from billview.units import iso_utc
from ledger.cache import PlacementCache
from ledger.decide import (
    NOT_LOOKED_UP,
    AcceptedEvent,
    NotLookedUp,
    decide,
    resale_of,
    usage_lookup,
)
from ledger.export import INPUT_TABLES
from ledger.pricing import price, reclaim_credit_minor, release_charge_minor, resale_entry
from ledger.state import PlacementState
from proto.envelope import Opened, open_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.money import format_gpu_hours, format_minor
from proto.records import (
    Adjustment,
    BuyerRelease,
    LedgerRecord,
    PlacementTerms,
    ReclaimNotice,
    ResaleTotals,
    Totals,
)

# The lines of the comparison: (Totals field, label, unit). GPU-hours or money.
LINES: Final[tuple[tuple[str, str, str], ...]] = (
    ("delivered_mgms", "delivered", "gpu"),
    ("billable_mgms", "billable", "gpu"),
    ("gross_minor", "gross", "money"),
    ("reclaim_credit_minor", "reclaim credit", "money"),
    ("sla_credit_minor", "SLA credit", "money"),
    ("adjustment_credit_minor", "adjustment credits", "money"),
    ("adjustment_charge_minor", "adjustment charges", "money"),
    ("release_charge_minor", "release charge", "money"),
    ("net_minor", "net", "money"),
    ("fee_minor", "desk fee", "money"),
    ("buyer_owes_minor", "buyer owes", "money"),
    ("operator_receives_minor", "operator receives", "money"),
    ("desk_receives_minor", "desk receives", "money"),
)


class DryRunError(Exception):
    """The current state could not be rebuilt (unreadable export, no such placement)."""


@dataclass(frozen=True)
class Current:
    """The placement's state as rebuilt from an export, and where it came from."""

    state: PlacementState
    cache: PlacementCache
    ledger_key: bytes
    records: int
    source: str


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
    import base64

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


def current_from_export(export: Path, placement_id: str, source: str | None = None) -> Current:
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


def current_from_ledger(base_url: str, placement_id: str) -> Current:
    """Fetch the export from a running ledger's API and rebuild from it."""
    from ledger.client import ApiError, download_export

    with tempfile.TemporaryDirectory(prefix="gridledger-dryrun-") as tmp:
        path = Path(tmp) / f"{placement_id}.duckdb"
        try:
            download_export(base_url.rstrip("/"), placement_id, path)
        except ApiError as exc:
            raise DryRunError(str(exc)) from exc
        return current_from_export(path, placement_id, source=f"{base_url} (ledger API)")


def _accepted_at(
    cache: PlacementCache, state: PlacementState, opened: Opened
) -> AcceptedEvent | NotLookedUp | None:
    """What ``decide`` asks about the past (the accepted usage event at an old seq)."""
    wanted = usage_lookup(state, opened)
    if wanted is None:
        return NOT_LOOKED_UP
    return cache.accepted_at(state.placement_id, *wanted)


def dry_run(
    current: Current, envelope: bytes, missing_signers: tuple[str, ...], *, arrives_at_ms: int
) -> DryRun:
    """Fold ``envelope`` on top of ``current`` as if it reached the log at ``arrives_at_ms``
    (SPEC §6.6: a reclaim's notice counts from there); nothing is kept."""
    opened = open_envelope(envelope)
    state = current.state
    verdict, new = decide(
        state,
        opened,
        "dry-run",
        ledger_key=current.ledger_key,
        accepted_at=_accepted_at(current.cache, state, opened),
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
        records=current.records,
        source=current.source,
        once_signed=once_signed,
    )


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


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


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


def render(result: DryRun, terms: PlacementTerms, missing: tuple[str, ...]) -> list[str]:
    """The dry run as lines a person reads."""
    scale, currency = terms.currency_scale, terms.currency
    lines = [
        f"dry run against {terms.placement_id} through record {result.records - 1} "
        f"(from {result.source})"
    ]
    if result.status == "accepted":
        lines.append("verdict: the ledger would accept it")
    else:
        why = f" {result.reason}" if result.reason else ""
        detail = f": {result.detail}" if result.detail else ""
        lines.append(f"verdict: the ledger would record it {result.status}{why}{detail}")
    after = result.after
    label_after = "with it"
    if result.once_signed is not None:
        after = result.once_signed
        label_after = "once signed"
        lines.append(f"         (missing signature of {', '.join(missing)}; shown as once signed)")
    if result.handover_ms is not None:
        when = iso_utc(result.handover_ms)
        lines.append(
            f"resale: the new buyer is billed from {when} at the resale "
            "rate (SPEC §7.10); the totals below stay the original terms', the obligations "
            "after them are both sides'"
        )
    lines.append(f"  {'':<19}{'now':>14}{label_after:>14}{'change':>14}")
    for field, label, unit in LINES:
        old, new = getattr(result.before, field), getattr(after, field)

        def show(value: int, signed: bool = False, unit: str = unit) -> str:
            sign = "+" if signed and value > 0 else ""
            if unit == "gpu":
                return sign + format_gpu_hours(value) + " GPU-h"
            return sign + format_minor(value, scale) + f" {currency}"

        change = show(new - old, signed=True) if new != old else ""
        lines.append(f"  {label:<19}{show(old):>14}{show(new):>14}{change:>14}")
    if result.resale_after or result.resale_before:
        lines += _obligations(result, result.before, after, terms)
    return lines


def _obligations(result: DryRun, before: Totals, after: Totals, terms: PlacementTerms) -> list[str]:
    """SPEC §7.10: with a resale, what each new buyer owes (via the desk), the original
    buyer's net (what it owes less what the resale brings it) and the desk's total."""
    scale, currency = terms.currency_scale, terms.currency

    def money(value: int | None, signed: bool = False) -> str:
        if value is None:
            return "-"
        sign = "+" if signed and value > 0 else ""
        return sign + format_minor(value, scale) + f" {currency}"

    def row(label: str, old: int | None, new: int | None) -> str:
        change = "" if new is None or new == (old or 0) else money(new - (old or 0), signed=True)
        first = 14 - max(0, len(label) - 19)  # a longer label: the columns stay aligned
        return f"  {label:<19}{money(old):>{first}}{money(new):>14}{change:>14}"

    def net(totals: Totals, resale: tuple[ResaleTotals, ...]) -> int:
        return totals.buyer_owes_minor - sum(e.gross_minor - e.fee_minor for e in resale)

    def desk(totals: Totals, resale: tuple[ResaleTotals, ...]) -> int:
        return totals.desk_receives_minor + sum(e.fee_minor for e in resale)

    old = {e.assignment_id: e for e in result.resale_before}
    lines = ["obligations (SPEC §7.10):"]
    for entry in result.resale_after:
        was = old.get(entry.assignment_id)
        label = f"{entry.new_buyer} owes"
        lines.append(row(label, None if was is None else was.gross_minor, entry.gross_minor))
    lines.append(
        row(
            "original buyer's net",
            net(before, result.resale_before),
            net(after, result.resale_after),
        )
    )
    lines.append(
        row("desk in all", desk(before, result.resale_before), desk(after, result.resale_after))
    )
    full = result.resale_full
    if full is not None and result.handover_ms is not None:
        lines.append(
            f"  {full.new_buyer} owes from {iso_utc(result.handover_ms)}: up to "
            f"{money(full.gross_minor)} if the {_gpus(result.resale_gpus)} it buys "
            f"deliver{'s' if result.resale_gpus == 1 else ''} until "
            f"{iso_utc(result.resale_end_ms)} ({full.assignment_id}, paid to the desk); the "
            f"original buyer's net falls by up to {money(full.gross_minor - full.fee_minor)} "
            f"(after the desk's resale fee {money(full.fee_minor)})"
        )
    return lines


def signer_roles(terms: PlacementTerms, keyids: list[str]) -> list[str]:
    """The roles of the terms these key ids belong to (for messages)."""
    roles = {key_id(getattr(terms, r).key): r for r in ("operator", "buyer", "desk")}
    return [roles.get(k, k) for k in keyids]
