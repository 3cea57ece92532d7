"""Resale (SPEC §6.8, §7.10) through the real pipeline, and bad input.

Pipeline: node agents (simulated GPUs) sign and spool their events; the ledger reads the
spools (local transport), folds the terms, the events, one accepted assignment and a row
of bad ones, closes; the export is verified offline by the verifier, which re-derives
both obligations on its own.

Figures, hand-computed from SPEC §7 and §7.10 (rate 2.50 USD/GPU-h, S = 2.5 GPU, window
60 min, 1-min increments, desk fee 5 % paid by the operator, SLA 99 % / 10 %):

    GPUs       GPU-n1-0 (whole), GPU-n1-1 (half), GPU-n2-0 (whole); GPU-n1-0 is unhealthy
               in minutes 40-45 (XID errors from the simulator)
    delivered  55 × 1 + 60 × 0.5 + 60 × 1 = 145 GPU-min; gross 145/60 × 250 = 604.17 -> 604
    SLA        145 / (2.5 × 60) = 96.67 % < 99 %: credit 10 % of 604 = 60.4 -> 60
    net        604 − 60 = 544; fee 5 % = 27.2 -> 27 (operator pays)
    original   buyer owes 544, operator receives 517, desk receives 27
    resale     buyer-1 sells GPU-n1-0 and GPU-n1-1 to buyer-2 from minute 30 at 4.00/GPU-h:
               D_0 = 25 × 1 + 30 × 0.5 = 40 GPU-min; G_0 = 40/60 × 400 = 266.67 -> 266;
               F_0 = 5 % of 266 = 13.3 -> 13 (paid by the seller)
    parties    buyer-2 owes 266 (to the desk); buyer-1 gets 266 − 13 = 253, its net
               544 − 253 = 291; desk 27 + 13 = 40; operator 517.
               291 + 266 − 517 − 40 = 0: the sides balance to the minor unit.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from billview.doc import BillDoc
from devtools import builders
from gridledger.cli import main as gridledger_main
from ledger.access import Access
from ledger.bill import bill_doc
from ledger.export import export_placement
from ledger.http import LedgerApi, LedgerHttpServer
from ledger.service import LedgerService
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.envelope import open_envelope, seal
from proto.httpsig import sign_url
from proto.keys import SigningKey
from proto.records import LedgerRecord, PlacementTerms, Statement
from proto.trust import TrustedKey, TrustFile, dump_trust
from transport.local import node_source, publish_local, publisher_source
from verifier.reconcile import reconcile
from verifier.verify import verify_export

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
WINDOW_MS = 60 * MIN
GRACE_MS = 5 * MIN
PID = "pl-resale-1"
SOLD = ["GPU-n1-0", "GPU-n1-1"]

EXPECTED_TOTALS = {
    "delivered_mgms": 145 * MIN * 1000,
    "billable_mgms": 145 * MIN * 1000,
    "gross_minor": 604,
    "reclaim_credit_minor": 0,
    "sla_credit_minor": 60,
    "adjustment_credit_minor": 0,
    "adjustment_charge_minor": 0,
    "credits_minor": 60,
    "net_minor": 544,
    "fee_minor": 27,
    "buyer_owes_minor": 544,
    "operator_receives_minor": 517,
    "desk_receives_minor": 27,
    "release_charge_minor": 0,  # SPEC §7.9: no release
}
EXPECTED_RESALE = [
    {
        "assignment_id": "as-1",
        "new_buyer": "buyer-2",
        "delivered_mgms": 40 * MIN * 1000,
        "billable_mgms": 40 * MIN * 1000,
        "gross_minor": 266,
        "fee_minor": 13,
    }
]


@dataclass
class Run:
    cast: builders.Cast
    buyer2: SigningKey
    terms: PlacementTerms
    store: Store
    service: LedgerService
    spool: Path


Agents = dict[str, tuple[Agent, SimClock]]


def _agents(cast: builders.Cast, terms: PlacementTerms, spool: Path) -> Agents:
    """One simulated agent per node, each on its own simulated clock."""
    specs = {"n1": "seed=5,unhealthy=GPU-n1-0@2400000-2700000", "n2": "seed=6"}
    agents = {}
    for node_id, spec in specs.items():
        devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, node_id)]
        config = AgentConfig(
            node_id, cast.node_key(node_id), (terms,), spool / node_source(node_id)
        )
        clock = SimClock(T0)
        simulator = Simulator(parse_sim_spec(spec), devices, T0)
        agents[node_id] = (Agent(config, simulator, clock), clock)
    return agents


def _advance(agents: Agents, node_id: str, to_ms: int) -> None:
    """The node's agent signs and spools every interval that ended by ``to_ms``."""
    agent, clock = agents[node_id]
    clock.set(to_ms)
    agent.tick()


def _chain(store: Store) -> list[tuple[str, str, str]]:
    """(kind, status, reason) of every chained input, in chain order."""
    rows = store.query(
        f"SELECT kind, status, reason FROM inputs WHERE placement_id = '{PID}' ORDER BY chain_index"
    )
    return [(str(k), str(s), str(r)) for k, s, r in rows]


def _records(store: Store) -> list[LedgerRecord]:
    out = []
    for (envelope,) in store.query(
        f"SELECT envelope FROM records WHERE placement_id = '{PID}' ORDER BY chain_index"
    ):
        record = open_envelope(bytes(envelope)).record
        assert isinstance(record, LedgerRecord)
        out.append(record)
    return out


def _run_pipeline(tmp: Path) -> Run:
    cast = builders.make_cast("resale")
    buyer2 = SigningKey.from_seed_text("buyer-2", "resale/party/buyer-2")
    buyer3 = SigningKey.from_seed_text("buyer-3", "resale/party/buyer-3")
    gpus = [builders.gpu("n1", 0), builders.gpu("n1", 1, share_milli=500), builders.gpu("n2", 0)]
    terms = builders.make_terms(cast, PID, gpus, T0, T0 + WINDOW_MS, late_grace_ms=GRACE_MS)
    spool = tmp / "spool"
    publish_local(spool, publisher_source("desk"), [builders.signed_terms(cast, terms)])
    agents = _agents(cast, terms, spool)
    now = [T0 + 30 * MIN]
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=spool, clock=lambda: now[0]
    )
    # Minute 30: both nodes have delivered to minute 30, n2 one minute more (within the
    # clock skew the log allows); the ledger folds it all.
    _advance(agents, "n1", T0 + 30 * MIN)
    _advance(agents, "n2", T0 + 31 * MIN)
    service.run_until_idle()
    # The resale, and bad ones, reach the log at minute 30.
    good = builders.assignment(cast, terms, "as-1", buyer2, T0 + 30 * MIN, SOLD, 400)
    bad = [
        # unsigned by the new buyer / by the desk
        builders.assignment(
            cast,
            terms,
            "as-x1",
            buyer3,
            T0 + 30 * MIN,
            ["GPU-n2-0"],
            400,
            signers=[cast.buyer, cast.desk],
        ),
        builders.assignment(
            cast,
            terms,
            "as-x2",
            buyer3,
            T0 + 30 * MIN,
            ["GPU-n2-0"],
            400,
            signers=[cast.buyer, buyer3],
        ),
        # the new buyer sells on what it bought (signed as seller by itself)
        builders.assignment(
            cast,
            terms,
            "as-x3",
            buyer3,
            T0 + 30 * MIN,
            ["GPU-n1-0"],
            500,
            signers=[buyer2, buyer3, cast.desk],
        ),
        # more than the buyer holds: a GPU the terms do not have
        builders.assignment(
            cast, terms, "as-x4", buyer3, T0 + 30 * MIN, ["GPU-n2-0", "GPU-n9-0"], 400
        ),
        # overlapping: GPU-n1-1 is already sold to buyer-2
        builders.assignment(cast, terms, "as-x5", buyer3, T0 + 35 * MIN, ["GPU-n1-1"], 400),
        # the same id again, other content
        builders.assignment(cast, terms, "as-1", buyer3, T0 + 30 * MIN, ["GPU-n2-0"], 400),
        # n2 already folded to minute 31: a handover at 30 would move settled usage
        builders.assignment(cast, terms, "as-x6", buyer3, T0 + 30 * MIN, ["GPU-n2-0"], 400),
    ]
    publish_local(spool, publisher_source("desk"), [good, *bad])
    service.run_until_idle()
    # The rest of the window, then the close; a resale after the close is refused.
    now[0] = T0 + WINDOW_MS + GRACE_MS + 1
    _advance(agents, "n1", T0 + 2 * WINDOW_MS)
    _advance(agents, "n2", T0 + 2 * WINDOW_MS)
    service.run_until_idle()
    late = builders.assignment(cast, terms, "as-late", buyer3, T0 + 50 * MIN, ["GPU-n2-0"], 400)
    publish_local(spool, publisher_source("desk"), [late])
    service.run_until_idle()
    for agent, _ in agents.values():
        agent.close()
    return Run(cast, buyer2, terms, store, service, spool)


def _trust(run: Run, buyer2_id: str = "buyer-2") -> TrustFile:
    base = run.cast.trust()
    keys = [*base.keys, TrustedKey(id=buyer2_id, role="buyer", key=run.buyer2.public_key)]
    return msgspec.structs.replace(base, keys=keys)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = _run_pipeline(tmp_path_factory.mktemp("resale"))
    yield run
    run.service.close()


def test_pipeline_bills_both_obligations(pipeline: Run) -> None:
    chain = _chain(pipeline.store)
    assignments = [(s, r) for k, s, r in chain if k == "assignment"]
    assert assignments == [
        ("accepted", ""),
        ("rejected", "SIG_MISSING"),  # no new buyer
        ("rejected", "SIG_MISSING"),  # no desk
        ("rejected", "SIG_SURPLUS"),  # the new buyer as seller: not the terms' buyer (§3)
        ("rejected", "ASSIGNMENT_INVALID"),  # a GPU the buyer does not hold
        ("rejected", "ASSIGNMENT_OVERLAP"),
        ("rejected", "ASSIGNMENT_DUPLICATE"),
        ("rejected", "ASSIGNMENT_BEHIND_USAGE"),
        ("rejected", "AFTER_CLOSE"),
    ]
    assert {(k, s) for k, s, _ in chain if k == "usage"} == {("usage", "accepted")}
    records = _records(pipeline.store)
    head = records[-1]
    assert {f: getattr(head.totals, f) for f in head.totals.__struct_fields__} == EXPECTED_TOTALS
    assert [msgspec.to_builtins(e) for e in head.resale] == EXPECTED_RESALE
    # The four sides balance to the minor unit (SPEC §7.10).
    t, e = head.totals, head.resale[0]
    original_net = t.buyer_owes_minor - (e.gross_minor - e.fee_minor)
    assert original_net == 291
    desk = t.desk_receives_minor + e.fee_minor
    assert original_net + e.gross_minor - t.operator_receives_minor - desk == 0
    # The final statement carries the resale list of its record.
    (envelope,) = [
        bytes(x) for (x,) in pipeline.store.query("SELECT envelope FROM statements WHERE final")
    ]
    statement = open_envelope(envelope).record
    assert isinstance(statement, Statement)
    assert statement.resale == head.resale
    assert statement.totals == head.totals


def test_nothing_settled_changes_and_records_before_the_resale_keep_their_bytes(
    pipeline: Run,
) -> None:
    chain = _chain(pipeline.store)
    records = _records(pipeline.store)
    first = next(i for i, (k, s, _) in enumerate(chain) if k == "assignment" and s == "accepted")
    # Before the accepted assignment no record carries a resale list (their bytes are
    # those of a ledger without resale); from it on, every record does.
    assert all(not r.resale for r in records[:first])
    assert all(len(r.resale) == 1 for r in records[first:])
    # A rejected input changes no total and no resale figure.
    for i, (_, status, _) in enumerate(chain):
        if status == "rejected" and i > 0:
            assert records[i].totals == records[i - 1].totals
            assert records[i].resale == records[i - 1].resale
    # Usage folded before the handover is billed to the original buyer only.
    assert records[first].resale[0].delivered_mgms == 0
    assert records[first].totals == records[first - 1].totals


def test_export_verifies_with_both_obligations(pipeline: Run, tmp_path: Path) -> None:
    export = tmp_path / "resale.duckdb"
    export_placement(pipeline.store, PID, export, key=pipeline.service.key)
    report = verify_export(export, _trust(pipeline))
    assert [f.line() for f in report.findings.kept] == []
    assert report.ok
    assert report.totals == EXPECTED_TOTALS
    assert report.resale == EXPECTED_RESALE


def test_verifier_wants_the_new_buyer_pinned_under_its_id(pipeline: Run, tmp_path: Path) -> None:
    export = tmp_path / "resale.duckdb"
    export_placement(pipeline.store, PID, export, key=pipeline.service.key)
    unpinned = verify_export(export, pipeline.cast.trust())
    assert {f.rule for f in unpinned.findings.kept} == {"ASSIGNMENT_KEY_NOT_PINNED"}
    renamed = verify_export(export, _trust(pipeline, "buyer-two"))
    assert {f.rule for f in renamed.findings.kept} == {"PARTY_ID_MISMATCH"}


def _sealed_like(envelope: bytes, key: SigningKey, **changes: object) -> bytes:
    record = open_envelope(envelope).record
    return seal(msgspec.structs.replace(record, **changes), [key])


def test_verifier_catches_a_ledger_that_bills_the_resale_wrong(
    pipeline: Run, tmp_path: Path
) -> None:
    import duckdb

    export = tmp_path / "resale.duckdb"
    export_placement(pipeline.store, PID, export, key=pipeline.service.key)
    key = pipeline.cast.ledger
    with duckdb.connect(str(export)) as con:
        (last,) = con.execute("SELECT max(chain_index) FROM ledger_records").fetchone() or (0,)
        (raw,) = con.execute(
            "SELECT envelope FROM ledger_records WHERE chain_index = ?", [last]
        ).fetchone() or (b"",)
        record = open_envelope(bytes(raw)).record
        assert isinstance(record, LedgerRecord)
        wrong = msgspec.structs.replace(record.resale[0], gross_minor=300)
        forged = seal(msgspec.structs.replace(record, resale=[wrong]), [key])
        con.execute("UPDATE ledger_records SET envelope = ? WHERE chain_index = ?", [forged, last])
    report = verify_export(export, _trust(pipeline))
    assert "RESALE_MISMATCH" in {f.rule for f in report.findings.kept}
    assert not report.ok


def _line(doc: BillDoc, key: str) -> dict[str, object]:
    (found,) = [line for line in doc.lines if line.key == key]
    return {f: getattr(found, f) for f in found.__struct_fields__}


def test_ledger_statements_per_party_show_both_obligations(pipeline: Run) -> None:
    doc = bill_doc(pipeline.store, pipeline.service.key, PID)
    assert doc.checks == []  # every derivation gives its amount
    assert _line(doc, "resale:as-1")["amount_minor"] == 266
    assert (_line(doc, "resale:as-1")["payer"], _line(doc, "resale:as-1")["payee"]) == (
        "buyer-2",
        "desk",
    )
    assert _line(doc, "resale_fee:as-1")["amount_minor"] == 13
    assert _line(doc, "resale_proceeds:as-1")["amount_minor"] == 253
    assert _line(doc, "original_buyer_net")["amount_minor"] == 291
    assert _line(doc, "desk_total")["amount_minor"] == 40
    assert (doc.original_buyer_net_minor, doc.desk_total_minor) == (291, 40)
    server = LedgerHttpServer(
        LedgerApi(pipeline.store, pipeline.service.key, pipeline.service.metrics), "127.0.0.1", 0
    )
    server.start()
    try:
        base = f"{server.url}/placements/{PID}/statement.html"
        status, page = _get(f"{base}?party=buyer-2")
        assert status == 200
        assert 'data-party="buyer-2"' in page
        assert 'data-new-buyer="buyer-2"' in page
        assert 'data-total="resale:as-1" data-minor="266"' in page
        assert "you pay" in page  # the resale line is the new buyer's to pay
        status, page = _get(f"{base}?party=buyer")
        assert status == 200
        assert 'data-total="buyer_owes_minor" data-minor="544"' in page
        assert 'data-total="buyer_net" data-minor="291"' in page
        status, page = _get(f"{base}?party=buyer-3")  # refused: not a party of this bill
        assert status == 400 and "buyer-2" in page
    finally:
        server.stop()


def _signed_get(url: str, key: SigningKey, body: bytes | None = None) -> tuple[int, str]:
    method = "POST" if body is not None else "GET"
    request = urllib.request.Request(url, data=body, method=method)
    for name, value in sign_url(key, method, url, body or b"", int(time.time())).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_new_buyer_sees_only_its_own_obligation_over_the_api(pipeline: Run) -> None:
    """SPEC §13: signed with its own key, the new buyer lists the placement without the
    seller's parties, reads its own page (not the buyer's, nor the bill's JSON or CSV,
    nor the statement), and may witness and fetch the export it verifies with."""
    access = Access(
        pipeline.store, pipeline.cast.ledger.public_key, clock_s=lambda: int(time.time())
    )
    api = LedgerApi(pipeline.store, pipeline.service.key, pipeline.service.metrics, access=access)
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        base = f"{server.url}/placements/{PID}"
        status, body = _signed_get(f"{server.url}/placements", pipeline.buyer2)
        (entry,) = json.loads(body)["placements"]
        assert entry["roles"] == ["buyer-2"] and entry["new_buyers"] == ["buyer-2"]
        assert not {"operator", "buyer", "desk", "head"} & set(entry)
        status, page = _signed_get(f"{base}/statement.html", pipeline.buyer2)
        assert status == 200 and 'data-party="buyer-2"' in page
        assert 'data-total="resale:as-1" data-minor="266"' in page
        assert 'data-total="buyer_net"' not in page and "statement.csv" not in page
        for path in ("statement.html?party=buyer", "statement", "statement.json", "statement.csv"):
            assert _signed_get(f"{base}/{path}", pipeline.buyer2)[0] == 404, path
        assert _signed_get(f"{base}/checkpoint", pipeline.buyer2, b"")[0] == 200
        assert _signed_get(f"{base}/export", pipeline.buyer2)[0] == 200
        # The original buyer's own page is the buyer's, with its net.
        status, page = _signed_get(f"{base}/statement.html", pipeline.cast.buyer)
        assert status == 200 and 'data-total="buyer_net" data-minor="291"' in page
        assert _signed_get(f"{base}/statement.html?party=buyer-2", pipeline.cast.buyer)[0] == 404
    finally:
        server.stop()


def test_verify_html_writes_the_new_buyers_page_from_its_own_figures(
    pipeline: Run, tmp_path: Path
) -> None:
    export = tmp_path / "resale.duckdb"
    export_placement(pipeline.store, PID, export, key=pipeline.service.key)
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(_trust(pipeline)))
    out = tmp_path / "html"
    code = gridledger_main(["verify", str(export), "--trust", str(trust), "--html", str(out)])
    assert code in (0, 3)  # verified (final or provisional: nobody cosigned here)
    page = (out / f"{PID}.buyer-2.html").read_text(encoding="utf-8")
    assert 'data-total="resale:as-1" data-minor="266"' in page
    assert "Recomputed by gridledger verify" in page
    buyer = (out / f"{PID}.buyer.html").read_text(encoding="utf-8")
    assert 'data-total="buyer_net" data-minor="291"' in buyer


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_reconciliation_across_exports_balances_with_the_resale(
    pipeline: Run, tmp_path: Path
) -> None:
    export = tmp_path / "resale.duckdb"
    export_placement(pipeline.store, PID, export, key=pipeline.service.key)
    report = verify_export(export, _trust(pipeline))
    rec = reconcile([report])
    amounts = {(line.role, line.party): line.amount_minor for line in rec.lines}
    assert amounts == {
        ("buyer", "buyer-1"): 291,
        ("buyer", "buyer-2"): 266,
        ("operator", "operator-1"): 517,
        ("desk", "desk-1"): 40,
    }
    (balance,) = rec.balances
    assert balance.balanced
    assert balance.buyer_owes_minor == 291 + 266 == 517 + 40
    assert rec.to_json()["reconciled"]
