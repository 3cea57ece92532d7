"""The auditor's appendix (issue 42 item 5): ``gridledger audit EXPORT --trust T --out D``
on the bill scenario's export (tests/bill_scenario.py: a rejected adjustment, events of
two nodes, nobody witnessed it, so PROVISIONAL)."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

import pytest
from bill_scenario import PID, run_bill_scenario

from gridledger.cli import main as gridledger_main
from ledger.export import export_placement
from proto.keys import key_id
from proto.trust import dump_trust


def test_the_audit_appendix_records_what_an_audit_file_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = run_bill_scenario(tmp_path)
    export = tmp_path / "export.duckdb"
    export_placement(scenario.service.store, PID, export, key=scenario.service.key)
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(scenario.cast.trust()))
    out = tmp_path / "audit"
    capsys.readouterr()
    assert gridledger_main(["audit", str(export), "--trust", str(trust), "--out", str(out)]) == 0
    assert "(PROVISIONAL)" in capsys.readouterr().out
    page = (out / f"{PID}.audit.html").read_text()
    assert hashlib.sha256(export.read_bytes()).hexdigest() in page
    assert hashlib.sha256(trust.read_bytes()).hexdigest() in page
    for party in (scenario.cast.operator, scenario.cast.buyer, scenario.cast.desk):
        assert key_id(party.public_key) in page and party.name in page
    assert "Signed by operator operator-1, buyer buyer-1, desk desk-1" in page
    assert "not witnessed" in page  # the verdict's reasons
    # The adjustment signed by the operator alone was rejected: listed with its reason.
    assert 'data-rejected="1"' in page and "SIG_MISSING" in page
    rows = list(csv.DictReader(io.StringIO((out / f"{PID}.usage.csv").read_text())))
    # node n0: 10 events of 2 GPUs; node n1: 9 events of 1 GPU (it missed minutes 30-35).
    assert len(rows) == 10 * 2 + 9
    assert {r["status"] for r in rows} == {"accepted"}
    xid = [r for r in rows if r["uuid"] == "GPU-n0-1" and r["xids"] == "79"]
    assert len(xid) == 2 and all(r["healthy"] == "True" for r in xid)  # the flag said so
    assert rows[0]["start_utc"].endswith("Z")


def test_audit_answers_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = tmp_path / "trust.json"
    trust.write_text("{}")
    not_export = tmp_path / "x.duckdb"
    not_export.write_text("not a database")
    assert (
        gridledger_main(
            ["audit", str(not_export), "--trust", str(trust), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    (line,) = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("{")]
    assert line.startswith("FAIL: --trust")
    from devtools.builders import make_cast

    trust.write_bytes(dump_trust(make_cast("audit").trust()))
    assert (
        gridledger_main(
            ["audit", str(not_export), "--trust", str(trust), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    (line,) = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("{")]
    assert line.startswith(f"FAIL: {not_export}: cannot read it as an export")
