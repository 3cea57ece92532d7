"""`gridledger demo`: the main job end to end, on the embedded transport and through Kafka."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import msgspec
import pytest

from gridledger.demo import HANDOVER_MS, PLACEMENT_ID, RECLAIM_ISSUED_MS, DemoResult, run_demo
from ledger.config import ConfigError, config_from_mapping
from proto.envelope import check_signatures, open_envelope
from proto.keys import key_id
from proto.records import Assignment, LedgerRecord, Statement
from proto.trust import load_trust

MIN_MGMS = 60_000 * 1000  # one GPU-minute in milli-GPU-milliseconds

# The bill, hand-computed from SPEC §7 and §7.10. Terms: GPU-node-a-0 and -a-1 whole H100s,
# GPU-node-b-0 and -b-1 half A100s (S = 3 GPU), 2.45 USD/GPU-h per started minute,
# 10 min reclaim notice at 100 %, SLA 95 % / 10 %, desk fee 2.5 % paid by the operator.
#
# The original terms (the resale changes none of this, §7.10):
#   D = (1 + 1 + 0.5) GPU × 52 min (to the reclaim) + 0.5 GPU × 42 min (GPU-node-b-1
#       unhealthy in minutes 20-30) = 130 + 21 = 151 GPU-min; B = D (whole minutes)
#   G = floor(151 × 245 / 60) = floor(616.58) = 616
#   R: the reclaim reached the log at minute 48, effective at 52: 4 min notice of 10,
#      short 6 + taken 8 (52 to 60, not interruptible) = 14 min × 3 GPU × 245 / 60
#      = 171.5 -> 171
#   Q = 0: availability 151 / (3 × 52) = 96.79 % >= 95 %
#   C = min(171 + 0, 616) = 171; N = 616 - 171 = 445
#   F = floor(445 × 250 / 10 000) = floor(11.125) = 11 (the operator pays it)
#   buyer owes 445, operator receives 445 - 11 = 434, desk receives 11
EXPECTED_TOTALS = {
    "delivered_mgms": 151 * MIN_MGMS,
    "billable_mgms": 151 * MIN_MGMS,
    "gross_minor": 616,
    "reclaim_credit_minor": 171,
    "sla_credit_minor": 0,
    "adjustment_credit_minor": 0,
    "adjustment_charge_minor": 0,
    "credits_minor": 171,
    "net_minor": 445,
    "fee_minor": 11,
    "buyer_owes_minor": 445,
    "operator_receives_minor": 434,
    "desk_receives_minor": 11,
}
# The resale: at minute 30 inferco-batch sells GPU-node-a-0 and GPU-node-a-1 (whole, both
# healthy) to finetune-labs at 2.20 USD/GPU-h; the reclaim ends their delivery at minute 52:
#   D_0 = 2 GPU × (52 - 30) min = 44 GPU-min; B_0 = D_0
#   G_0 = floor(44 × 220 / 60) = floor(161.33) = 161   (the new buyer owes it, to the desk)
#   F_0 = floor(161 × 250 / 10 000) = floor(4.025) = 4  (resale fee, paid by the seller)
EXPECTED_RESALE = [
    {
        "assignment_id": "resale-0001",
        "new_buyer": "finetune-labs",
        "delivered_mgms": 44 * MIN_MGMS,
        "billable_mgms": 44 * MIN_MGMS,
        "gross_minor": 161,
        "fee_minor": 4,
    }
]
# Every party (payments positive, receipts negative, minor units):
#   original buyer inferco-batch: owes 445, the resale brings 161 - 4 = 157: net 288
#   new buyer finetune-labs:      161
#   operator acme-gpu-cloud:      -434 (unchanged by the resale)
#   desk gridx-desk:              -(11 + 4) = -15
#   288 + 161 - 434 - 15 = 0: balanced to the cent.
EXPECTED_PARTIES = {
    "inferco-batch": 288,
    "finetune-labs": 161,
    "acme-gpu-cloud": -434,
    "gridx-desk": -15,
}


def _parties(statement: Statement) -> dict[str, int]:
    """Each party's amount from the signed statement, by SPEC §7.10."""
    t = statement.totals
    (e,) = statement.resale
    return {
        "inferco-batch": t.buyer_owes_minor - (e.gross_minor - e.fee_minor),
        e.new_buyer: e.gross_minor,
        "acme-gpu-cloud": -t.operator_receives_minor,
        "gridx-desk": -(t.desk_receives_minor + e.fee_minor),
    }


def check(result: DemoResult) -> None:
    result_dir, statement = result.workdir, result.statement
    assert (result_dir / "trust.json").is_file()
    export = result_dir / "exports" / f"{PLACEMENT_ID}.duckdb"
    assert export.is_file()
    assert statement.final
    assert msgspec.to_builtins(statement.totals) == EXPECTED_TOTALS
    assert msgspec.to_builtins(statement.resale) == EXPECTED_RESALE
    assert _parties(statement) == EXPECTED_PARTIES
    assert sum(EXPECTED_PARTIES.values()) == 0
    # The resale as the three parties signed it apart: buyer, new buyer and desk, and
    # nobody else; the new buyer's key is the one the trust file pins under its id.
    assignment = open_envelope(result.assignment.read_bytes().rstrip(b"\n"))
    assert isinstance(assignment.record, Assignment)
    trust = load_trust(result.trust)
    pinned = {k.id: k.key for k in trust.keys}
    assert assignment.record.new_buyer.key == pinned["finetune-labs"]
    signers = [pinned[p] for p in ("inferco-batch", "finetune-labs", "gridx-desk")]
    report = check_signatures(assignment.envelope, {key_id(k): k for k in signers})
    assert (report.missing, report.invalid, report.unexpected) == ([], [], [])
    assert len(assignment.envelope.signatures) == 3
    # verify --html wrote a page per party, the new buyer's among them, from the
    # verifier's own figures.
    pages = result.statement_html.parent
    assert sorted(p.name for p in pages.glob("*.html")) == [
        f"{PLACEMENT_ID}.{p}.html" for p in ("buyer", "desk", "finetune-labs", "operator")
    ]
    new_buyer = result.new_buyer_html.read_text(encoding="utf-8")
    assert 'data-party="finetune-labs"' in new_buyer
    assert 'data-total="resale:resale-0001" data-minor="161"' in new_buyer
    buyer = result.statement_html.read_text(encoding="utf-8")
    assert 'data-party="buyer"' in buyer
    assert 'data-total="buyer_owes_minor" data-minor="445"' in buyer
    assert 'data-total="buyer_net" data-minor="288"' in buyer
    con = duckdb.connect(str(export), read_only=True)
    try:
        envelope = con.execute(
            "SELECT envelope FROM statements ORDER BY through_index DESC LIMIT 1"
        ).fetchone()
        records = [
            open_envelope(bytes(row[0])).record
            for row in con.execute(
                "SELECT envelope FROM ledger_records ORDER BY chain_index"
            ).fetchall()
        ]
        assignments = con.execute(
            "SELECT chain_index, status, reason, envelope FROM assignments"
        ).fetchall()
    finally:
        con.close()
    assert envelope is not None
    assert open_envelope(bytes(envelope[0])).record == statement
    # The resale was accepted as signed, reached the log at minute 30 (its effective
    # handover, SPEC §6.8), and from its record on every record carries the resale list;
    # before it none does (SPEC §7.10).
    ((at, status, reason, raw),) = assignments
    assert (status, reason) == ("accepted", "")
    assert bytes(raw).rstrip(b"\n") == result.assignment.read_bytes().rstrip(b"\n")
    ledger = [r for r in records if isinstance(r, LedgerRecord)]
    assert ledger[at].arrived_ms == HANDOVER_MS
    assert all(not r.resale for r in ledger[:at])
    assert all(len(r.resale) == 1 for r in ledger[at:])
    assert ledger[at].resale[0].delivered_mgms == 0  # nothing before the handover moves
    # SPEC §6.6: every record is timed, monotone; the reclaim reached the log at minute 48,
    # so its notice (4 minutes of 10) runs from there.
    arrivals = [
        r.arrived_ms for r in records if isinstance(r, LedgerRecord) and r.arrived_ms is not None
    ]
    assert len(arrivals) == len(records) and arrivals == sorted(arrivals)
    reclaims = [r for r in records if isinstance(r, LedgerRecord) and r.kind == "reclaim"]
    assert [r.arrived_ms for r in reclaims] == [RECLAIM_ISSUED_MS]


def test_a_ledger_takes_arrival_from_the_log_unless_told_otherwise(tmp_path: Path) -> None:
    base = {"ledger_id": "l", "key_file": "k", "db": "d", "local_dir": "s"}
    assert config_from_mapping(base, tmp_path).arrival == "log"
    assert config_from_mapping({**base, "arrival": "sender"}, tmp_path).arrival == "sender"
    with pytest.raises(ConfigError, match="arrival"):
        config_from_mapping({**base, "arrival": "broker"}, tmp_path)


def test_demo_on_the_embedded_transport(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "demo")
    assert result.verified
    assert result.tamper_caught
    assert "SIG_INVALID" in result.tamper_findings
    check(result)
    # The verifier as a user runs it, in a separate process: both obligations recomputed
    # from the signed bytes alone.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "verifier",
            str(result.export),
            "--trust",
            str(result.trust),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (verified,) = json.loads(done.stdout)["exports"]
    # the report lists every total, the release charge (SPEC §7.9; none here) included
    assert verified["totals"] == {**EXPECTED_TOTALS, "release_charge_minor": 0}
    assert verified["resale"] == EXPECTED_RESALE
    tampered = subprocess.run(
        [sys.executable, "-m", "verifier", str(result.tampered), "--trust", str(result.trust)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tampered.returncode == 1
    # The ledger commands of docs/operating.md work on the demo's store from inside the workdir.
    ledger = subprocess.run(
        [sys.executable, "-m", "gridledger", "ledger", "statement", PLACEMENT_ID, "--json"],
        cwd=result.workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ledger.returncode == 0, ledger.stdout + ledger.stderr
    shown = json.loads(ledger.stdout)
    assert shown["placement_id"] == PLACEMENT_ID and shown["final"] is True
    assert shown["totals"]["buyer_owes_minor"] == result.statement.totals.buyer_owes_minor


def test_demo_cli_exit_code_and_rerun(tmp_path: Path) -> None:
    from gridledger.cli import main

    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir)]) == 0
    assert main(["demo", "--workdir", str(workdir)]) == 0  # a demo workdir is replaced
    other = tmp_path / "not-a-demo"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    assert main(["demo", "--workdir", str(other)]) == 2  # a workdir it does not own is bad input
    assert (other / "precious.txt").read_text() == "keep me"


def test_demo_through_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    result = run_demo(tmp_path / "demo", kafka=kafka_bootstrap)
    assert result.verified and result.tamper_caught
    check(result)
