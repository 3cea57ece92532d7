"""The placements a ledger holds, one line each (``ledger list``, ``GET /placements``).

For each placement: its id, parties (and the new buyers of accepted resales, SPEC §6.8)
and window (from its accepted terms), how many
records its chain has and the hash of the last, and its status:

* ``open``: accepted terms, not closed yet;
* ``closed``: an accepted PlacementClosed is in the chain;
* ``no terms``: records, but every terms input was rejected (``ledger statement`` says why);
* ``waiting for terms``: inputs held, no terms seen yet (SPEC §6.2).
"""

from __future__ import annotations

from typing import Any

from billview.units import iso_utc
from ledger.store import Store
from proto.envelope import open_envelope
from proto.records import Assignment, PlacementTerms


def _iso(ms: int) -> str:
    return iso_utc(ms)


def placement_list(store: Store) -> list[dict[str, Any]]:
    """Every placement of the store, by id (see the module docstring)."""
    with store.lock:
        heads = store.heads()
        closed = {
            str(r[0])
            for r in store.query(
                "SELECT DISTINCT placement_id FROM records WHERE kind = 'closed' "
                "AND status = 'accepted'"
            )
        }
        terms_rows = store.query(
            "SELECT placement_id, envelope FROM inputs WHERE kind = 'terms' "
            "AND status = 'accepted' ORDER BY placement_id, chain_index"
        )
        assignments = store.query(
            "SELECT placement_id, envelope FROM inputs WHERE kind = 'assignment' "
            "AND status = 'accepted' ORDER BY placement_id, chain_index"
        )
        waiting = [
            str(r[0])
            for r in store.query(
                "SELECT placement_id FROM placement_state WHERE placement_id NOT IN "
                "(SELECT DISTINCT placement_id FROM records) ORDER BY 1"
            )
        ]
        held = {pid: store.held(pid) for pid in waiting}
    terms: dict[str, PlacementTerms] = {}
    for pid, envelope in terms_rows:
        record = open_envelope(bytes(envelope)).record
        if isinstance(record, PlacementTerms):
            terms[str(pid)] = record  # the last accepted: an amendment replaces the first
    new_buyers: dict[str, list[str]] = {}  # SPEC §6.8: whom each placement was resold to
    for pid, envelope in assignments:
        record = open_envelope(bytes(envelope)).record
        if isinstance(record, Assignment):
            names = new_buyers.setdefault(str(pid), [])
            if record.new_buyer.id not in names:
                names.append(record.new_buyer.id)
    out: list[dict[str, Any]] = []
    for pid in sorted(set(heads) | {p for p, h in held.items() if h is not None}):
        t = terms.get(pid)
        head = heads.get(pid)
        summary = held.get(pid)
        if head is None:
            status = "waiting for terms"
        elif t is None:
            status = "no terms"
        else:
            status = "closed" if pid in closed else "open"
        out.append(
            {
                "placement_id": pid,
                "status": status,
                "operator": None if t is None else t.operator.id,
                "buyer": None if t is None else t.buyer.id,
                "desk": None if t is None else t.desk.id,
                "new_buyers": new_buyers.get(pid, []),
                "window_start": None if t is None else _iso(t.window_start_ms),
                "window_end": None if t is None else _iso(t.window_end_ms),
                "records": 0 if head is None else head[0] + 1,
                "head": None if head is None else head[1],
                "held": 0 if summary is None else summary.count,
            }
        )
    return out


def render_table(placements: list[dict[str, Any]]) -> list[str]:
    """The list as lines a person reads."""
    if not placements:
        return ["no placements yet"]
    lines = [
        f"{'PLACEMENT':<24} {'STATUS':<17} {'RECORDS':>7}  {'WINDOW (UTC)':<41} PARTIES "
        "(operator / buyer / desk)"
    ]
    for p in placements:
        window = "-" if p["window_start"] is None else f"{p['window_start']} .. {p['window_end']}"
        parties = "-" if p["operator"] is None else f"{p['operator']} / {p['buyer']} / {p['desk']}"
        if p.get("new_buyers"):
            parties += f" (resold to {', '.join(p['new_buyers'])})"
        status = p["status"] + (f" ({p['held']} held)" if p["held"] else "")
        lines.append(
            f"{p['placement_id']:<24} {status:<17} {p['records']:>7}  {window:<41} {parties}"
        )
    return lines
