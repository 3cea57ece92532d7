"""Buyer release (SPEC §6.7) and the release charge K (SPEC §7.9), through the real pipeline.

A node agent meters on a simulated clock and spools; the ledger reads the spools (local
transport), folds, closes and exports; the verifier recomputes everything from the
export. The expected bill is computed by hand from SPEC §7 below, never by the code
under test.

Terms: node n1 with GPU-n1-0 (whole) and GPU-n1-1 (half): S = 1.5 GPU; window 60 min,
minimum duration 40 min, release notice 15 min, 3.00 USD/GPU-h, 1-minute increments,
desk fee 5 % paid by the operator, SLA target 99 %.

The agent meters from minute 0; the buyer's release is issued at minute 20 for minute
22 and reaches the log at minute 21 (the events to minute 20 are folded by then):

    e          = max(effective 22, arrival 21, usage folded to 20) = minute 22
    owed until = min(window end 60, max(start + minimum 40, arrival 21 + notice 15 = 36))
               = minute 40
    K          = 1.5 GPU × (40 − 22) min × 3.00 USD/h = 27 GPU-min × 5 ¢/min = 135 ¢
    delivered  = 22 min × 1.5 GPU = 33 GPU-min (minutes 20-21 and 21-22 start before e
                 and count; the event of minute 22 is AFTER_RELEASE, the rest wait in
                 their stream and are SEQ_GAP at the close)
    gross      = 33 GPU-min × 5 ¢ = 165 ¢
    availability 33 / (1.5 × 22) = 100 % (measured to e): no SLA credit
    net        = 165 + 135 = 300;  fee 5 % = 15;  buyer owes 300, operator 285, desk 15
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import msgspec
import pytest
from test_ledger_scenario import GRACE_MS, LATE_CLOCK_MS, T0_MS, WINDOW_MS

from devtools.builders import Cast, gpu, make_cast, make_terms, release, signed_terms
from ledger.export import export_placement
from ledger.pricing import price
from ledger.service import LedgerService
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.canonical import signed_bytes
from proto.envelope import open_envelope, seal, sha256_hex
from proto.records import LedgerRecord, PlacementTerms
from transport.local import node_source, publish_local, publisher_source
from verifier.verify import ExportReport, verify_export

PID = "pl-release-1"
MIN = 60_000
EXPECTED = {
    "delivered_mgms": 33 * MIN * 1000,
    "billable_mgms": 33 * MIN * 1000,
    "gross_minor": 165,
    "reclaim_credit_minor": 0,
    "sla_credit_minor": 0,
    "adjustment_credit_minor": 0,
    "adjustment_charge_minor": 0,
    "credits_minor": 0,
    "net_minor": 300,
    "fee_minor": 15,
    "buyer_owes_minor": 300,
    "operator_receives_minor": 285,
    "desk_receives_minor": 15,
    "release_charge_minor": 135,
}


@dataclass
class ReleaseScenario:
    cast: Cast
    terms: PlacementTerms
    service: LedgerService
    export: Path


def _run(tmp: Path) -> ReleaseScenario:
    cast = make_cast("release")
    terms = make_terms(
        cast,
        PID,
        [gpu("n1", 0), gpu("n1", 1, share_milli=500)],
        T0_MS,
        T0_MS + WINDOW_MS,
        late_grace_ms=GRACE_MS,
        minimum_duration_ms=40 * MIN,
        release_notice_ms=15 * MIN,
        rate_per_gpu_hour_minor=300,
    )
    spool = tmp / "spool"
    publish_local(spool, publisher_source("desk"), [signed_terms(cast, terms)])

    clock = SimClock(T0_MS)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, "n1")]
    config = AgentConfig("n1", cast.node_key("n1"), (terms,), spool / node_source("n1"), MIN)
    agent = Agent(config, Simulator(parse_sim_spec("seed=5"), devices, T0_MS), clock)

    now = [T0_MS + 21 * MIN]
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="l1", local_dir=spool, clock=lambda: now[0]
    )
    clock.advance(20 * MIN)
    agent.tick()  # minutes 0-20
    service.run_until_idle()

    buyer = publisher_source("buyer")
    publish_local(
        spool,
        buyer,
        [
            # unsigned: SIG_MISSING; the desk signing too: SIG_SURPLUS (SPEC §4.0)
            release(cast, terms, T0_MS + 20 * MIN, T0_MS + 22 * MIN, "rl-0", signers=[]),
            release(
                cast, terms, T0_MS + 20 * MIN, T0_MS + 22 * MIN, "rl-0", [cast.buyer, cast.desk]
            ),
            # the buyer's release, co-signed by the operator (it MAY)
            release(
                cast, terms, T0_MS + 20 * MIN, T0_MS + 22 * MIN, "rl-1", [cast.buyer, cast.operator]
            ),
        ],
    )
    service.run_until_idle()  # they reach the log at minute 21

    now[0] = T0_MS + 31 * MIN
    clock.advance(10 * MIN)
    agent.tick()  # minutes 20-30: the agent does not know of the release
    agent.close()
    service.run_until_idle()
    publish_local(spool, buyer, [release(cast, terms, T0_MS + 31 * MIN, T0_MS + 32 * MIN, "rl-2")])
    service.run_until_idle()  # a second release: RELEASE_DUPLICATE

    now[0] = LATE_CLOCK_MS
    service.run_until_idle()  # the close at window end + grace, whatever e is
    publish_local(spool, buyer, [release(cast, terms, now[0], now[0], "rl-3")])
    service.run_until_idle()  # after the close: AFTER_CLOSE

    export = tmp / "export.duckdb"
    export_placement(store, PID, export, key=cast.ledger)
    return ReleaseScenario(cast, terms, service, export)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> ReleaseScenario:
    return _run(tmp_path_factory.mktemp("release"))


def _chain(path: Path) -> list[tuple[str, str, str, LedgerRecord]]:
    """(kind, status, reason, record) per chain index, from the export's envelopes."""
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT envelope FROM ledger_records ORDER BY chain_index").fetchall()
    out = []
    for (raw,) in rows:
        record = open_envelope(bytes(raw)).record
        assert isinstance(record, LedgerRecord)
        out.append((record.kind, record.status, record.reason, record))
    return out


def test_release_is_billed_as_computed_by_hand(scenario: ReleaseScenario) -> None:
    chain = _chain(scenario.export)
    releases = [(status, reason) for kind, status, reason, _ in chain if kind == "release"]
    assert releases == [
        ("rejected", "SIG_MISSING"),
        ("rejected", "SIG_SURPLUS"),
        ("accepted", ""),
        ("rejected", "RELEASE_DUPLICATE"),
        ("rejected", "AFTER_CLOSE"),
    ]
    usage = [(status, reason) for kind, status, reason, _ in chain if kind == "usage"]
    # SPEC §6.3 usage: each event after e is rejected for its content and advances the
    # stream (terms of REJECTION_ADVANCES_FROM_MS on), so none waits for a SEQ_GAP flush.
    assert usage == [("accepted", "")] * 22 + [("rejected", "AFTER_RELEASE")] * 8
    # The rejected releases before the good one changed nothing; the good one added K.
    first = next(i for i, (kind, *_rest) in enumerate(chain) if kind == "release")
    before = chain[first - 1][3].totals
    assert chain[first][3].totals == before and chain[first + 1][3].totals == before
    assert chain[first + 2][3].totals.release_charge_minor == 135
    assert chain[first + 2][3].arrived_ms == T0_MS + 21 * MIN
    close = next(i for i, (kind, status, *_r) in enumerate(chain) if kind == "closed")
    assert msgspec.to_builtins(chain[close][3].totals) == EXPECTED
    assert chain[-1][3].totals == chain[close][3].totals  # nothing after changes it

    report = verify_export(scenario.export, scenario.cast.trust())
    assert not report.findings, [f.line() for f in report.findings.kept]
    assert report.totals == EXPECTED


def test_a_releases_table_dropped_from_an_export_is_caught(
    scenario: ReleaseScenario, tmp_path: Path
) -> None:
    """The releases table is optional (exports written before §6.7 have none, and verify
    as before: the builders of tests/test_verifier_exports.py write no such table); an
    export whose chain holds releases but that lost the table fails, it is not unusable."""
    out = tmp_path / "no-releases.duckdb"
    shutil.copyfile(scenario.export, out)
    with duckdb.connect(str(out)) as con:
        con.execute("DROP TABLE releases")
    report = verify_export(out, scenario.cast.trust())
    assert report.error == "" and "CHAIN_INPUT_MISSING" in report.findings.rules()


def _rechained(
    s: ReleaseScenario, out: Path, edit: Callable[[int, LedgerRecord], LedgerRecord]
) -> Path:
    """A ledger (holding its key) that rewrites records with ``edit``, re-chained and
    re-signed: every signature is valid; only the rules say the records are wrong.
    Statements and checkpoints it would have to re-issue are left out (so the export is
    not final either way)."""
    shutil.copyfile(s.export, out)
    chain = _chain(out)
    prev = chain[0][3].prev
    with duckdb.connect(str(out)) as con:
        for index, (_, _, _, record) in enumerate(chain):
            record = msgspec.structs.replace(edit(index, record), prev=prev)
            prev = sha256_hex(signed_bytes(record))
            t = record.totals
            con.execute(
                "UPDATE ledger_records SET envelope = ?, record_hash = ?, status = ?, "
                "reason = ?, gross_minor = ?, buyer_owes_minor = ?, "
                "operator_receives_minor = ?, desk_receives_minor = ? WHERE chain_index = ?",
                [
                    seal(record, [s.cast.ledger]),
                    prev,
                    record.status,
                    record.reason,
                    t.gross_minor,
                    t.buyer_owes_minor,
                    t.operator_receives_minor,
                    t.desk_receives_minor,
                    index,
                ],
            )
        con.execute("DELETE FROM statements")
        con.execute("DELETE FROM checkpoints")
    return out


def _dishonest(s: ReleaseScenario, out: Path, charge: int) -> Path:
    """A ledger that prices the release charge as ``charge`` from the release on."""

    def edit(_: int, record: LedgerRecord) -> LedgerRecord:
        t = record.totals
        if not t.release_charge_minor:
            return record
        t = price(
            s.terms,
            delivered_mgms=t.delivered_mgms,
            reclaim_credit=t.reclaim_credit_minor,
            sla_credit=t.sla_credit_minor,
            adjustment_credit=t.adjustment_credit_minor,
            adjustment_charge=t.adjustment_charge_minor,
            release_charge=charge,
        )
        return msgspec.structs.replace(record, totals=t)

    return _rechained(s, out, edit)


def test_verifier_catches_a_ledger_that_folds_usage_after_the_release(
    scenario: ReleaseScenario, tmp_path: Path
) -> None:
    """The event of minute 22 (at e) recorded as accepted: the verifier's own referee
    says AFTER_RELEASE, whatever the ledger signed."""

    edited: list[int] = []

    def edit(index: int, record: LedgerRecord) -> LedgerRecord:
        if record.reason != "AFTER_RELEASE" or edited:
            return record
        edited.append(index)
        return msgspec.structs.replace(record, status="accepted", reason="")

    report = verify_export(
        _rechained(scenario, tmp_path / "bad.duckdb", edit), scenario.cast.trust()
    )
    found = [f for f in report.findings.kept if f.rule == "AFTER_RELEASE"]
    assert len(found) == 1, [f.line() for f in report.findings.kept]
    assert (found[0].expected, found[0].actual) == ("rejected AFTER_RELEASE", "accepted")


@pytest.mark.parametrize("charge", [0, 134, 136])
def test_verifier_catches_a_ledger_that_ignores_or_misprices_k(
    scenario: ReleaseScenario, tmp_path: Path, charge: int
) -> None:
    report: ExportReport = verify_export(
        _dishonest(scenario, tmp_path / "bad.duckdb", charge), scenario.cast.trust()
    )
    rules = report.findings.rules()
    assert {"TOTAL_RELEASE_CHARGE_MINOR", "TOTAL_BUYER_OWES_MINOR"} <= rules, rules
    found = next(f for f in report.findings.kept if f.rule == "TOTAL_RELEASE_CHARGE_MINOR")
    assert (found.expected, found.actual) == ("135", str(charge))
    # First at the release's own record: 20 min x 1.5 GPU = 150 gross, plus K.
    owed = next(f for f in report.findings.kept if f.rule == "TOTAL_BUYER_OWES_MINOR")
    assert (owed.expected, owed.actual) == (str(150 + 135), str(150 + charge))
    # The honest export of the same run has none of them.
    assert not verify_export(scenario.export, scenario.cast.trust()).findings


# ---- with a reclaim, and the freed capacity (SPEC §6.7) --------------------------------------
#
# One whole GPU per placement, window 60 min, 6.00 USD/GPU-h (10 ¢ a minute), minimum 50 min,
# release notice 30 min, reclaim notice 10 min, not interruptible, penalty 100 %, no SLA
# target, no desk fee. Events of minutes 0-10 reach the log at minute 10.
#
# A, reclaim first: reclaim at minute 10 for 40 (full notice; taken 60 - 40 = 20 min:
#    R = 200); a release for 45 is RELEASE_INVALID (the reclaim ends the placement first);
#    a release arriving at 12 for 15: e = 15, owed until min(40, max(50, 12 + 30)) = 40,
#    K = 25 min = 250. Delivered 15 min (the event of minute 15 is AFTER_RELEASE): G = 150.
#    N = 150 + 250 - min(200, 400) = 200.
# B, release first: a release arriving at 10 for 30: e = 30, owed until min(60, max(50,
#    40)) = 50, K = 200; a reclaim for 35 is RECLAIM_INVALID (released from 30); a reclaim
#    arriving at 11 for 25: full notice, taken only up to e: 30 - 25 = 5 min, R = 50.
#    Events to minute 30 are accepted, those from 25 deliver nothing; minute 30 is
#    AFTER_RELEASE. G = 25 min = 250; N = 250 + 200 - 50 = 400.
# C on A's GPU from minute 15 (A's claim ends at e = 15): accepted; D from minute 14: OVERSOLD.

INTERPLAY = {
    "pl-a": {"gross_minor": 150, "release_charge_minor": 250, "reclaim_credit_minor": 200,
             "net_minor": 200, "buyer_owes_minor": 200},
    "pl-b": {"gross_minor": 250, "release_charge_minor": 200, "reclaim_credit_minor": 50,
             "net_minor": 400, "buyer_owes_minor": 400},
}  # fmt: skip


def _interplay(tmp: Path) -> tuple[Cast, dict[str, Path], list[tuple[str, str, str, str]]]:
    from devtools.builders import StreamWriter, reclaim, sample

    cast = make_cast("release-interplay")
    common = {
        "late_grace_ms": GRACE_MS,
        "minimum_duration_ms": 50 * MIN,
        "release_notice_ms": 30 * MIN,
        "rate_per_gpu_hour_minor": 600,
        "sla_availability_target_bps": 0,
        "desk_fee_bps": 0,
    }
    end = T0_MS + WINDOW_MS
    a = make_terms(cast, "pl-a", [gpu("n1", 0)], T0_MS, end, **common)
    b = make_terms(cast, "pl-b", [gpu("n2", 0)], T0_MS, end, **common)
    later = {**common, "minimum_duration_ms": 0}
    c = make_terms(cast, "pl-c", [gpu("n1", 0)], T0_MS + 15 * MIN, end, **later)
    d = make_terms(cast, "pl-d", [gpu("n1", 0)], T0_MS + 14 * MIN, end, **later)
    spool = tmp / "spool"
    desk = publisher_source("desk")
    publish_local(spool, desk, [signed_terms(cast, a), signed_terms(cast, b)])
    writers = {
        pid: StreamWriter(cast.node_key(node), pid, node)
        for pid, node in (("pl-a", "n1"), ("pl-b", "n2"))
    }
    gpus = {"pl-a": a.gpus[0], "pl-b": b.gpus[0]}

    def events(pid: str, lo: int, hi: int) -> None:
        w, g = writers[pid], gpus[pid]
        node = g.node_id
        raws = [w.event(T0_MS + m * MIN, T0_MS + (m + 1) * MIN, [sample(g)]) for m in range(lo, hi)]
        publish_local(spool, node_source(f"{node}-{pid}"), raws)

    now = [T0_MS + 10 * MIN]
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="l1", local_dir=spool, clock=lambda: now[0]
    )
    events("pl-a", 0, 10)
    events("pl-b", 0, 10)
    operator, buyer = publisher_source("operator"), publisher_source("buyer")
    publish_local(spool, operator, [reclaim(cast, a, T0_MS + 10 * MIN, T0_MS + 40 * MIN, "rc-a")])
    publish_local(spool, buyer, [release(cast, b, T0_MS + 10 * MIN, T0_MS + 30 * MIN, "rl-b")])
    service.run_until_idle()  # all at minute 10
    now[0] = T0_MS + 11 * MIN
    publish_local(spool, operator, [reclaim(cast, b, T0_MS + 11 * MIN, T0_MS + 35 * MIN, "x")])
    service.run_until_idle()
    publish_local(spool, operator, [reclaim(cast, b, T0_MS + 11 * MIN, T0_MS + 25 * MIN, "y")])
    publish_local(spool, buyer, [release(cast, a, T0_MS + 11 * MIN, T0_MS + 45 * MIN, "x")])
    service.run_until_idle()
    now[0] = T0_MS + 12 * MIN
    publish_local(spool, buyer, [release(cast, a, T0_MS + 11 * MIN, T0_MS + 15 * MIN, "rl-a")])
    service.run_until_idle()
    publish_local(spool, desk, [signed_terms(cast, c), signed_terms(cast, d)])
    service.run_until_idle()
    now[0] = T0_MS + 40 * MIN
    events("pl-a", 10, 16)
    events("pl-b", 10, 31)
    service.run_until_idle()
    now[0] = LATE_CLOCK_MS
    service.run_until_idle()
    exports = {}
    for pid in ("pl-a", "pl-b", "pl-c"):
        exports[pid] = tmp / f"{pid}.duckdb"
        export_placement(store, pid, exports[pid], key=cast.ledger)
    decisions = [
        (pid, kind, status, reason)
        for pid in ("pl-a", "pl-b", "pl-c", "pl-d")
        for kind, status, reason, _ in (
            _chain(exports[pid]) if pid in exports else _store_chain(store, pid)
        )
    ]
    return cast, exports, decisions


def _store_chain(store: Store, pid: str) -> list[tuple[str, str, str, LedgerRecord]]:
    out = []
    for raw in store.record_envelopes(pid):
        record = open_envelope(bytes(raw)).record
        assert isinstance(record, LedgerRecord)
        out.append((record.kind, record.status, record.reason, record))
    return out


def test_release_and_reclaim_whichever_ends_first_and_the_freed_window(tmp_path: Path) -> None:
    from verifier.capacity import claims_of, find_oversold

    cast, exports, decisions = _interplay(tmp_path)
    notices = [d for d in decisions if d[1] in ("reclaim", "release", "terms")]
    assert notices == [
        ("pl-a", "terms", "accepted", ""),
        ("pl-a", "reclaim", "accepted", ""),
        ("pl-a", "release", "rejected", "RELEASE_INVALID"),
        ("pl-a", "release", "accepted", ""),
        ("pl-b", "terms", "accepted", ""),
        ("pl-b", "release", "accepted", ""),
        ("pl-b", "reclaim", "rejected", "RECLAIM_INVALID"),
        ("pl-b", "reclaim", "accepted", ""),
        ("pl-c", "terms", "accepted", ""),
        ("pl-d", "terms", "rejected", "OVERSOLD"),
    ]
    usage = {
        pid: [(s, r) for p, kind, s, r in decisions if p == pid and kind == "usage"]
        for pid in ("pl-a", "pl-b")
    }
    assert usage["pl-a"] == [("accepted", "")] * 15 + [("rejected", "AFTER_RELEASE")]
    assert usage["pl-b"] == [("accepted", "")] * 30 + [("rejected", "AFTER_RELEASE")]
    for pid, expected in INTERPLAY.items():
        report = verify_export(exports[pid], cast.trust())
        assert not report.findings, [f.line() for f in report.findings.kept]
        assert report.totals is not None
        assert {k: report.totals[k] for k in expected} == expected, pid
    # Across exports (SPEC §6.5): A's claim on GPU-n1-0 ends at e = minute 15, where C's
    # begins: nothing oversold.
    claims = [c for pid in ("pl-a", "pl-c") for c in claims_of(str(exports[pid]))[1]]
    a_claim = next(c for c in claims if c.placement_id == "pl-a")
    assert a_claim.end_ms == T0_MS + 15 * MIN
    assert find_oversold(claims) == []


# ---- gridledger release (CLI) ----------------------------------------------------------------


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


def test_cli_release_dry_run_prices_from_arrival_then_the_ledger_agrees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One whole GPU, 6.00 USD/GPU-h, minimum 40 min, notice 15 min; usage folded to
    minute 5. A release for minute 10 reaching the log at minute 7: e = 10, owed until
    min(60, max(40, 7 + 15)) = 40, K = 30 min x 10 c = 3.00 USD."""
    from devtools.builders import StreamWriter, sample
    from gridledger.cli import main
    from proto.keys import write_key_pair

    cast = make_cast("release-cli")
    terms = make_terms(
        cast, "pl-cli", [gpu("n1", 0)], T0_MS, T0_MS + WINDOW_MS, late_grace_ms=GRACE_MS,
        minimum_duration_ms=40 * MIN, release_notice_ms=15 * MIN, rate_per_gpu_hour_minor=600,
    )  # fmt: skip
    keys = tmp_path / "keys"
    for key in (cast.operator, cast.buyer, cast.desk):
        write_key_pair(key, keys)
    signed = tmp_path / "terms.signed.json"
    signed.write_bytes(signed_terms(cast, terms) + b"\n")
    spool = tmp_path / "spool"
    publish_local(spool, publisher_source("desk"), [signed_terms(cast, terms)])
    w = StreamWriter(cast.node_key("n1"), "pl-cli", "n1")
    g = terms.gpus[0]
    events = [w.event(T0_MS + m * MIN, T0_MS + (m + 1) * MIN, [sample(g)]) for m in range(5)]
    publish_local(spool, node_source("n1"), events)
    now = [T0_MS + 6 * MIN]
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="l1", local_dir=spool, clock=lambda: now[0]
    )
    try:
        service.run_until_idle()
        export = tmp_path / "now.duckdb"
        export_placement(store, "pl-cli", export, key=cast.ledger)

        def key(role: str) -> str:
            return str(keys / f"{getattr(cast, role).name}.key")

        args = [
            "release", "--terms", str(signed), "--key", key("buyer"),
            "--issued-at", _iso(T0_MS + 6 * MIN), "--effective-at", _iso(T0_MS + 10 * MIN),
            "--id", "rl-1", "--reason", "job finished early",
        ]  # fmt: skip
        dry = ["--dry-run", "--export", str(export), "--arrives-at", _iso(T0_MS + 7 * MIN)]
        assert main([*args, *dry]) == 0
        out = capsys.readouterr().out
        assert "the ledger would accept it" in out
        line = next(x for x in out.splitlines() if x.strip().startswith("release charge"))
        assert line.split()[-2:] == ["+3.00", "USD"], line
        # Arriving at minute 12 instead, the notice runs to 27 < 40: the same 3.00 USD;
        # arriving at minute 30 moves e to 30 and owed-until to 45: 1.50 USD.
        late = ["--dry-run", "--export", str(export), "--arrives-at", _iso(T0_MS + 30 * MIN)]
        assert main([*args, *late]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.strip().startswith("release charge"))
        assert line.split()[-2:] == ["+1.50", "USD"], line

        # A desk key may not sign a release (SPEC §4.0): refused in one line, exit 1.
        code = main([*args[:3], "--key", key("desk"), *args[5:], *dry])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and "may not sign a release" in err[0], err

        record = tmp_path / "rl-1.json"
        now[0] = T0_MS + 7 * MIN
        assert main([*args, "--out", str(record)]) == 0  # the buyer signs ...
        assert "every required signature is there" in capsys.readouterr().out
        # ... the operator co-signs (it MAY, SPEC §4.0), and either publishes
        cosign = ["cosign", str(record), "--terms", str(signed), "--key", key("operator")]
        assert main(cosign) == 0
        publish = ["publish", str(record), "--terms", str(signed), "--local-dir", str(spool)]
        assert main(publish) == 0, capsys.readouterr().err
        assert len(open_envelope(record.read_bytes().rstrip()).envelope.signatures) == 2
        service.run_until_idle()
        last = _store_chain(store, "pl-cli")[-1]
        assert last[:3] == ("release", "accepted", "")
        assert last[3].totals.release_charge_minor == 300
        assert last[3].arrived_ms == T0_MS + 7 * MIN
    finally:
        service.close()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--effective-at", "2026-01-01T02:00:00Z"], "outside the window"),
        (
            ["--issued-at", "2026-01-01T00:30:00Z", "--effective-at", "2026-01-01T00:20:00Z"],
            "before --issued-at",
        ),
        (["--effective-at", "2026-01-01T00:30:00Z", "--id", "bad id"], "--id 'bad id': must be"),
        (["--effective-at", "2026-01-01T00:30:00Z", "--dry-run"], "needs the current state"),
    ],
)
def test_cli_release_bad_input_is_one_line(tmp_path: Path, extra: list[str], needle: str) -> None:
    import subprocess
    import sys

    from proto.keys import write_key_pair

    cast = make_cast("release-cli-bad")
    terms = make_terms(cast, "pl-bad", [gpu("n1", 0)], T0_MS, T0_MS + WINDOW_MS)
    write_key_pair(cast.buyer, tmp_path)
    signed = tmp_path / "terms.signed.json"
    signed.write_bytes(signed_terms(cast, terms) + b"\n")
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "release", "--terms", str(signed),
         "--key", str(tmp_path / f"{cast.buyer.name}.key"),
         "--issued-at", "2026-01-01T00:05:00Z", *extra],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL: ") and needle in lines[0], done.stderr


def test_both_bills_show_the_release_charge_line(scenario: ReleaseScenario) -> None:
    """The statement page (§7.8, §7.9): the ledger's bill from its store and the verifier's
    from its own recomputation show one release line, line for line the same, and every
    derivation reproduces its amount."""
    from ledger.bill import bill_doc

    store, key = scenario.service.store, scenario.cast.ledger
    # The ledger's latest statement is of period 1 (the late release after the close);
    # its totals are those of the close.
    ledger = bill_doc(store, key, PID)
    assert ledger.checks == []
    report = verify_export(scenario.export, scenario.cast.trust(), bill=True)
    assert not report.findings and report.bill is not None
    mine = report.bill.doc(report)
    assert mine.checks == []
    assert mine.lines == ledger.lines
    line = next(x for x in mine.lines if x.key == "release:rl-1")
    assert (line.section, line.amount_minor, line.amount) == ("charges", 135, "1.35")
    assert (line.payer, line.payee) == ("buyer", "operator")
    assert sorted(line.signers) == ["buyer buyer-1", "operator operator-1"]
    for part in (
        "released from 2026-01-01T00:22:00Z",
        "reached the log 2026-01-01T00:21:00Z",
        "notice 15 min after arrival 2026-01-01T00:36:00Z",
        "= 2026-01-01T00:40:00Z",
        "18 min × 1.5 GPU",
        "rounded down to 1.35 USD (SPEC §7.9)",
    ):
        assert part in line.derivation, (part, line.derivation)
    net = next(x for x in mine.lines if x.key == "net")
    assert "N = G + Ah + K − C = 1.65 USD + 0.00 USD + 1.35 USD − 0.00 USD" in net.derivation
    assert mine.effective_end_ms == T0_MS + 22 * MIN


def test_a_release_survives_the_fold_state_snapshot() -> None:
    """The fold state is stored as a snapshot beside the records (a restart restores it):
    the release end e comes back, so a later event at e is still AFTER_RELEASE and the
    charge is not billed twice."""
    import base64
    import json

    import vectorgen

    from ledger.fold import Fold

    data = json.loads((vectorgen.VECTORS_DIR / "release.json").read_text())
    cast = vectorgen._cast()
    fold = Fold(cast.ledger)
    steps = data["steps"]
    cut = next(i for i, s in enumerate(steps) if s["note"].startswith("starts at e"))
    for i, step in enumerate(steps[:cut]):
        fold.apply(base64.b64decode(step["envelope_b64"]), f"r:{i}", None, step["arrived_ms"])
    before = fold.state("pl-vector")
    assert before is not None and before.release_end_ms == WS_VECTOR + 13 * MIN
    restored = Fold(cast.ledger)
    restored.restore("pl-vector", fold.snapshot("pl-vector"))
    assert restored.state("pl-vector") == before
    rest = [(i, s) for i, s in enumerate(steps) if i >= cut]
    for i, step in rest:
        raw = base64.b64decode(step["envelope_b64"])
        got = restored.apply(raw, f"r:{i}", None, step["arrived_ms"])
        assert [(o.status, o.record_hash) for o in got] == [
            (o["status"], o["record_hash"]) for o in step["outcomes"]
        ], step["note"]
    totals = restored.totals("pl-vector")
    assert totals is not None and totals.release_charge_minor == 281


WS_VECTOR = 1_767_225_600_000  # tests/vectorgen.py WS


def test_optional_fields_keep_old_bytes_and_refuse_a_written_out_default() -> None:
    """SPEC §2 (4): ``release_notice_ms`` (terms) and ``release_charge_minor`` (totals) are
    omitted at 0, so terms and records signed before them keep their bytes and hashes;
    written out at 0 they are NON_CANONICAL; a release's fields are all required."""
    from proto.canonical import decode_payload
    from proto.errors import ProtoError
    from proto.records import BuyerRelease

    cast = make_cast("release-bytes")
    old = make_terms(cast, "pl-b", [gpu("n1", 0)], T0_MS, T0_MS + WINDOW_MS)
    assert b"release_notice_ms" not in signed_bytes(old)
    agreed = msgspec.structs.replace(old, release_notice_ms=15 * MIN)
    assert b'"release_notice_ms":900000' in signed_bytes(agreed)
    assert decode_payload(signed_bytes(agreed)) == agreed
    zero = signed_bytes(old).replace(
        b'"settlement_period_ms"', b'"release_notice_ms":0,"settlement_period_ms"'
    )  # in its sorted place
    with pytest.raises(ProtoError) as caught:
        decode_payload(zero)
    assert caught.value.reason.value == "NON_CANONICAL"
    record = _chain_record_with_zero_charge()
    assert b"release_charge_minor" not in signed_bytes(record)
    written = signed_bytes(record).replace(
        b'"sla_credit_minor"', b'"release_charge_minor":0,"sla_credit_minor"'
    )  # in its sorted place
    with pytest.raises(ProtoError) as caught:
        decode_payload(written)
    assert caught.value.reason.value == "NON_CANONICAL"
    payload = signed_bytes(
        BuyerRelease(placement_id="pl-b", release_id="r", issued_at_ms=1, effective_at_ms=2,
                     reason="")
    )  # fmt: skip
    with pytest.raises(ProtoError) as caught:
        decode_payload(payload.replace(b',"reason":""', b""))
    assert caught.value.reason.value == "MALFORMED"


def _chain_record_with_zero_charge() -> LedgerRecord:
    from ledger.pricing import ZERO_TOTALS

    return LedgerRecord(
        placement_id="pl-b", index=0, prev="0" * 64, kind="release", source="0" * 64,
        status="accepted", reason="", delivered_mgms=0, totals=ZERO_TOTALS, arrived_ms=T0_MS,
    )  # fmt: skip
