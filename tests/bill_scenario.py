"""A placement whose bill has every kind of line: shares, an unhealthy GPU (by its
evidence), an unallocated interval, an interval nobody reported, a reclaim with short
notice, a credit and a charge adjustment, a rejected adjustment and the SLA missed.

Figures (hand-computed from SPEC §7; rate 2.50 USD/GPU-h, S = 2.5 GPU, window 60 min,
reclaim issued at minute 46, effective at 50, 10 min notice agreed):

    delivered  GPU-n0-0 50 min × 1 + GPU-n0-1 40 min × 0.5 + GPU-n1-0 40 min × 1
               = 110 GPU-min;  billable 110 GPU-min;  gross 110/60 × 250 = 458.33 -> 458
    availability 110 / (2.5 × 50) = 88.00 % < 99 %: SLA credit 10 % of 458 = 45
    reclaim    (6 min short + 10 min taken) × 2.5 GPU = 40 GPU-min × 250 / 60 = 166.67 -> 166
    adjustments credit 30 (operator + desk), charge 45 (buyer); a credit signed by the
               operator alone is rejected SIG_MISSING
    credits    min(166 + 45 + 30, 458 + 45) = 241;  net 458 + 45 - 241 = 262
    fee        5 % of 262 = 13.1 -> 13, paid by the operator
    buyer owes 262, operator receives 249, desk receives 13
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from test_ledger_scenario import GRACE_MS, LATE_CLOCK_MS, T0_MS, WINDOW_MS

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    gpu,
    make_cast,
    make_terms,
    reclaim,
    sample,
    signed_terms,
)
from ledger.export import export_placement
from ledger.service import LedgerService
from ledger.store import Store
from proto.records import PlacementTerms
from proto.trust import dump_trust
from transport.local import node_source, publish_local, publisher_source

PID = "pl-bill-1"
MIN = 60_000
EXPECTED = {
    "delivered_mgms": 110 * MIN * 1000,
    "gross_minor": 458,
    "reclaim_credit_minor": 166,
    "sla_credit_minor": 45,
    "adjustment_credit_minor": 30,
    "adjustment_charge_minor": 45,
    "credits_minor": 241,
    "net_minor": 262,
    "fee_minor": 13,
    "buyer_owes_minor": 262,
    "operator_receives_minor": 249,
    "desk_receives_minor": 13,
}


@dataclass
class BillScenario:
    cast: Cast
    terms: PlacementTerms
    service: LedgerService

    def export(self, directory: Path) -> tuple[Path, Path]:
        """The placement exported to ``directory/export.duckdb``, beside the cast's trust
        file ``directory/trust.json``: (export, trust)."""
        export = directory / "export.duckdb"
        export_placement(self.service.store, PID, export, key=self.service.key)
        trust = directory / "trust.json"
        trust.write_bytes(dump_trust(self.cast.trust()))
        return export, trust


def run_bill_scenario(tmp: Path) -> BillScenario:
    """Publish the scenario to spools under ``tmp/spool`` and fold it to the close."""
    cast = make_cast("bill")
    g00, g01, g10 = gpu("n0", 0), gpu("n0", 1, share_milli=500), gpu("n1", 0)
    terms = make_terms(cast, PID, [g00, g01, g10], T0_MS, T0_MS + WINDOW_MS, late_grace_ms=GRACE_MS)
    spool = tmp / "spool"
    publish_local(spool, publisher_source("desk"), [signed_terms(cast, terms)])
    n0 = StreamWriter(cast.node_key("n0"), PID, "n0")
    n1 = StreamWriter(cast.node_key("n1"), PID, "n1")
    events0: list[bytes] = []
    events1: list[bytes] = []
    for k in range(10):  # 5-minute intervals to the reclaim at minute 50
        start, end = T0_MS + k * 5 * MIN, T0_MS + (k + 1) * 5 * MIN
        bad = k in (4, 5)  # minutes 20-30: XID 79, the flag says healthy
        events0.append(n0.event(start, end, [sample(g00), sample(g01, xids=[79] if bad else [])]))
        if k == 6:
            continue  # minutes 30-35: node n1 reported nothing
        events1.append(n1.event(start, end, [sample(g10, allocated=k != 2)]))
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    # Arrival is the ledger's clock when an input reaches its intake (SPEC §6.6): the
    # events to minute 45 and the reclaim reach it at minute 46 (4 min before it takes
    # effect), the rest after the window.
    now = [T0_MS + 46 * MIN]
    service = LedgerService(
        store,
        cast.ledger,
        ledger_id="ledger-1",
        local_dir=spool,
        clock=lambda: now[0],
    )
    publish_local(spool, node_source("n0"), events0[:9])
    publish_local(spool, node_source("n1"), events1[:8])
    reclaim_notice = reclaim(cast, terms, T0_MS + 46 * MIN, T0_MS + 50 * MIN, "rc-1")
    publish_local(spool, publisher_source("operator"), [reclaim_notice])
    service.run_until_idle()
    now[0] = LATE_CLOCK_MS
    publish_local(spool, node_source("n0"), events0[9:])
    publish_local(spool, node_source("n1"), events1[8:])
    operator = [
        adjustment(cast, PID, "goodwill-1", "credit", 30, T0_MS + 55 * MIN, "INC-7", "goodwill"),
        adjustment(cast, PID, "egress-1", "charge", 45, T0_MS + 56 * MIN, "", "egress traffic"),
        adjustment(cast, PID, "alone-1", "credit", 99, T0_MS + 57 * MIN, signers=[cast.operator]),
    ]
    publish_local(spool, publisher_source("operator"), operator)
    service.run_until_idle()
    return BillScenario(cast, terms, service)
