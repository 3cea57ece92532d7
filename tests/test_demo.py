"""`gridledger demo`: the main job end to end, on the embedded transport and through Kafka."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from gridledger.demo import PLACEMENT_ID, RECLAIM_ISSUED_MS, run_demo
from ledger.config import ConfigError, config_from_mapping
from proto.envelope import open_envelope
from proto.records import LedgerRecord, Statement

# 2 whole GPUs and 2 half GPUs until the reclaim at minute 52; one half GPU unhealthy
# for minutes 20-30: (2 + 0.5) * 52 min + 0.5 * 42 min, in milli-GPU-ms.
EXPECTED_DELIVERED_MGMS = (2500 * 52 + 500 * 42) * 60_000


def check(result_dir: Path, statement: Statement) -> None:
    assert (result_dir / "trust.json").is_file()
    export = result_dir / "exports" / f"{PLACEMENT_ID}.duckdb"
    assert export.is_file()
    totals = statement.totals
    assert statement.final
    assert totals.delivered_mgms == EXPECTED_DELIVERED_MGMS
    # 6 minutes short of the agreed notice + 8 minutes taken (not interruptible), S = 3 GPUs.
    assert totals.reclaim_credit_minor == 3000 * 14 * 60_000 * 245 // 3_600_000_000
    assert totals.buyer_owes_minor == totals.net_minor
    assert totals.operator_receives_minor + totals.desk_receives_minor == totals.net_minor
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
    finally:
        con.close()
    assert envelope is not None
    assert open_envelope(bytes(envelope[0])).record == statement
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
    check(result.workdir, result.statement)
    # The verifier as a user runs it, in a separate process.
    done = subprocess.run(
        [sys.executable, "-m", "verifier", str(result.export), "--trust", str(result.trust)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tampered = subprocess.run(
        [sys.executable, "-m", "verifier", str(result.tampered), "--trust", str(result.trust)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tampered.returncode == 1
    # The README's ledger commands work on the demo's store from inside the workdir.
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
    assert main(["demo", "--workdir", str(other)]) == 1
    assert (other / "precious.txt").read_text() == "keep me"


def test_demo_through_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    result = run_demo(tmp_path / "demo", kafka=kafka_bootstrap)
    assert result.verified and result.tamper_caught
    check(result.workdir, result.statement)
