"""Placements for invoices and FOCUS rows: several placements of one cast over several
calendar months, each closed, witnessed by operator and buyer and exported, so the
offline verdict of each export is FINAL.

Figures (rate 2.50 USD/GPU-h, 60-min window, 5-min events, every sample healthy and
allocated, no reclaim): an A100 at share 1000 and an H100 at share 500 deliver
60 GPU-min and 30 GPU-min: D = 90 GPU-min, gross floor(1.5 × 250) = 375 minor units,
fee 5 % of 375 = 18 (paid by the operator); the buyer owes 375.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    assignment,
    gpu,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger.export import export_placement
from ledger.issuer import cosign_checkpoint, issue_checkpoint
from ledger.service import LedgerService
from ledger.store import Store
from proto.cosign import cosign
from proto.keys import SigningKey
from proto.note import parse_note
from proto.trust import TrustedKey, TrustFile
from transport.local import node_source, publish_local, publisher_source

MIN = 60_000
WINDOW_MS = 60 * MIN
GRACE_MS = 5 * MIN
JAN_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FEB_MS = 1_769_904_000_000  # 2026-02-01T00:00:00Z


@dataclass(frozen=True)
class Placed:
    """What one placement of the scenario asked for."""

    placement_id: str
    start_ms: int
    late_credit_minor: int = 0  # a credit adjustment after the close (period 1)
    late_charge_minor: int = 0  # a charge adjustment after the close (period 1)
    resold_to: SigningKey | None = None  # the H100 resold at minute 30 at 4.00 USD/GPU-h
    witnessed: bool = True  # operator and buyer cosign the last checkpoint (FINAL)
    tax_bps: int = 0  # the terms' tax rate (SPEC §11.2)


def finance_cast() -> Cast:
    return make_cast("finance")


def finance_trust(cast: Cast) -> TrustFile:
    """The cast's trust file with the resale's new buyer pinned as a buyer (SPEC §9)."""
    trust = cast.trust()
    buyer2 = new_buyer_key()
    pinned = TrustedKey(id=buyer2.name, role="buyer", key=buyer2.public_key)
    return msgspec.structs.replace(trust, keys=[*trust.keys, pinned])


def new_buyer_key() -> SigningKey:
    return SigningKey.from_seed_text("buyer-2", "finance/party/buyer-2")


def run_placement(tmp: Path, cast: Cast, placed: Placed) -> Store:
    """Fold ``placed`` to its close (and any late adjustment), witnessed by operator and
    buyer; the store of its ledger (under ``tmp/placement_id``)."""
    pid, t0 = placed.placement_id, placed.start_ms
    home = tmp / pid
    home.mkdir(parents=True)
    a100, h100 = gpu("n0", 0), gpu("n0", 1, model="H100-80GB", share_milli=500)
    terms = make_terms(
        cast, pid, [a100, h100], t0, t0 + WINDOW_MS, late_grace_ms=GRACE_MS, tax_bps=placed.tax_bps
    )
    spool = home / "spool"
    publish_local(spool, publisher_source("desk"), [signed_terms(cast, terms)])
    if placed.resold_to is not None:
        sold = assignment(cast, terms, "as-1", placed.resold_to, t0 + 30 * MIN, [h100.uuid], 400)
        publish_local(spool, publisher_source("desk"), [sold])
    writer = StreamWriter(cast.node_key("n0"), pid, "n0")
    events = [
        writer.event(t0 + k * 5 * MIN, t0 + (k + 1) * 5 * MIN, [sample(a100), sample(h100)])
        for k in range(12)
    ]
    store = Store(home / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    now = [t0 + 10 * MIN]
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=spool, clock=lambda: now[0]
    )
    service.run_until_idle()
    now[0] = t0 + WINDOW_MS + MIN
    publish_local(spool, node_source("n0"), events)
    service.run_until_idle()
    now[0] = t0 + WINDOW_MS + GRACE_MS + 1
    service.run_until_idle()  # the close
    late = []
    if placed.late_credit_minor:
        late.append(
            adjustment(cast, pid, "late-credit", "credit", placed.late_credit_minor,
                       t0 + WINDOW_MS + 20 * MIN, "INC-9", "late goodwill")
        )  # fmt: skip
    if placed.late_charge_minor:
        late.append(
            adjustment(cast, pid, "late-charge", "charge", placed.late_charge_minor,
                       t0 + WINDOW_MS + 21 * MIN, "", "late egress")
        )  # fmt: skip
    if late:
        now[0] = t0 + WINDOW_MS + 30 * MIN
        publish_local(spool, publisher_source("operator"), late)
        service.run_until_idle()
    note = parse_note(issue_checkpoint(store, cast.ledger, pid))
    for party in (cast.operator, cast.buyer) if placed.witnessed else ():
        signed = cosign(note, party.name, party, (t0 + WINDOW_MS) // 1000 + 3600)
        cosign_checkpoint(store, cast.ledger, pid, signed.text())
    return store


def export(tmp: Path, cast: Cast, placed: Placed, out: Path) -> Path:
    """The FINAL export of ``placed`` at ``out``."""
    store = run_placement(tmp, cast, placed)
    export_placement(store, placed.placement_id, out, key=cast.ledger)
    store.close()
    return out
