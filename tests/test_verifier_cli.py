"""The verify command: exit codes, OK/FAIL lines, JSON, directories, reconciliation,
inclusion bundles, and ``python -m verifier``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import Scenario, full_scenario, small_scenario

from gridledger.cli import main as gridledger_main


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("cli-full"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = gridledger_main(["verify", *argv])
    return code, capsys.readouterr().out


def test_ok_line_and_exit_0(full: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, str(full.path), "--trust", str(full.trust_path))
    assert code == 0
    assert out.startswith(f"OK: {full.path}: placement p-full")
    last = full.builder.items[-1].record
    assert last is not None
    owes = last.totals.buyer_owes_minor
    assert f"buyer owes {owes // 100}.{owes % 100:02d} USD" in out


def test_json_report(full: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, str(full.path), "--trust", str(full.trust_path), "--json")
    data = json.loads(out)
    assert code == 0 == data["exit_code"]
    (export,) = data["exports"]
    last = full.builder.items[-1].record
    assert last is not None
    assert export["verdict"] == "verified"
    assert export["totals"] == {k: getattr(last.totals, k) for k in export["totals"]}
    assert export["findings"]["total"] == 0
    assert export["parties"] == {"operator": "operator-1", "buyer": "buyer-1", "desk": "desk-1"}


def test_fail_lines_and_exit_1(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.duckdb"
    shutil.copyfile(full.path, bad)
    with duckdb.connect(str(bad)) as con:
        con.execute("UPDATE usage_events SET seq = seq + 1 WHERE chain_index = 2")
    code, out = run(capsys, str(bad), "--trust", str(full.trust_path))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"FAIL: {bad}: placement p-full: 1 finding(s)"
    assert lines[1].startswith("  (5) columns COLUMN_MISMATCH at usage_events chain_index 2.seq:")
    code, out = run(capsys, str(bad), "--trust", str(full.trust_path), "--json")
    item = json.loads(out)["exports"][0]["findings"]["items"][0]
    assert item == {
        "step": 5,
        "step_name": "columns",
        "rule": "COLUMN_MISMATCH",
        "record": "usage_events chain_index 2.seq",
        "expected": "1",
        "actual": "2",
        "message": "a convenience column disagrees with the signed envelope",
    }


def test_not_duckdb_is_exit_2(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    code, out = run(capsys, str(junk), "--trust", str(full.trust_path))
    assert code == 2
    assert out.startswith(f"FAIL: {junk}: unusable input: not a DuckDB file")


def test_wrong_format_version_is_exit_2(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v3 = tmp_path / "v3.duckdb"  # versions 1 and 2 are read (SPEC §8), 3 is not
    shutil.copyfile(full.path, v3)
    with duckdb.connect(str(v3)) as con:
        con.execute("UPDATE meta SET value = '3' WHERE key = 'format_version'")
    code, out = run(capsys, str(v3), "--trust", str(full.trust_path), "--json")
    assert code == 2
    export = json.loads(out)["exports"][0]
    assert export["verdict"] == "unusable" and "format_version is '3'" in export["error"]


def test_missing_table_is_exit_2(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.duckdb"
    shutil.copyfile(full.path, broken)
    with duckdb.connect(str(broken)) as con:
        con.execute("DROP TABLE ledger_records")
    code, _ = run(capsys, str(broken), "--trust", str(full.trust_path))
    assert code == 2


@pytest.mark.parametrize("trust", ["missing", "malformed", "wrong-format", "none"])
def test_bad_trust_file_is_exit_2(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str], trust: str
) -> None:
    path = tmp_path / "trust.json"
    if trust == "malformed":
        path.write_text("{not json")
    elif trust == "wrong-format":
        path.write_text(json.dumps({"format": "gridledger-trust/v9", "keys": []}))
    args = [str(full.path)] + ([] if trust == "none" else ["--trust", str(path)])
    code = gridledger_main(["verify", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("FAIL: ")


def test_directory_reconciles_per_party(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "exports"
    d.mkdir()
    shutil.copyfile(full.path, d / "a.duckdb")
    # Same parties (same seed), another placement; and a third export that fails.
    small = small_scenario(tmp_path, name="p-second", seed="verifier-full", minutes=20, gpu_index=7)
    shutil.copyfile(small.path, d / "b.duckdb")
    shutil.copyfile(small.path, d / "c.duckdb")
    with duckdb.connect(str(d / "c.duckdb")) as con:
        con.execute("UPDATE ledger_records SET gross_minor = 0")
    code, out = run(capsys, str(d), "--trust", str(full.trust_path), "--json")
    assert code == 1
    data = json.loads(out)
    verdicts = {Path(e["path"]).name: e["verdict"] for e in data["exports"]}
    assert verdicts == {"a.duckdb": "verified", "b.duckdb": "verified", "c.duckdb": "failed"}
    rec = data["reconciliation"]
    assert [Path(e["path"]).name for e in rec["excluded"]] == ["c.duckdb"]
    totals = [e["totals"] for e in data["exports"] if e["verdict"] == "verified"]
    buyer = next(p for p in rec["parties"] if p["role"] == "buyer")
    assert buyer["party"] == "buyer-1" and buyer["placements"] == 2
    assert buyer["amount_minor"] == sum(t["buyer_owes_minor"] for t in totals)
    assert buyer["credits_minor"] == sum(t["credits_minor"] for t in totals)
    desk = next(p for p in rec["parties"] if p["role"] == "desk")
    assert desk["amount_minor"] == sum(t["desk_receives_minor"] for t in totals)
    (balance,) = rec["balances"]
    assert balance["currency"] == "USD" and balance["balanced"]
    # Human form: one table per role, failed placements listed apart.
    code, out = run(capsys, str(d), "--trust", str(full.trust_path))
    assert "excluded (failed): " in out and "Buyers: owe" in out and "Desks: receive" in out
    assert "USD/2: buyers owe" in out and out.rstrip().endswith("balanced")


def test_python_dash_m_verifier(full: Scenario) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "verifier", str(full.path), "--trust", str(full.trust_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK: ")


def test_process_pool_gives_the_same_verdict(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.duckdb"
    shutil.copyfile(full.path, bad)
    with duckdb.connect(str(bad)) as con:
        con.execute("UPDATE usage_events SET status = 'rejected' WHERE chain_index = 3")
    outs = {}
    for pool in ("process", "thread", "inline"):
        code, out = run(capsys, str(bad), "--trust", str(full.trust_path), "--json", "--pool", pool)
        assert code == 1
        findings = json.loads(out)["exports"][0]["findings"]
        outs[pool] = findings["by_rule"]
    assert outs["process"] == outs["thread"] == outs["inline"] == {"CHAIN_STATUS": 1}


# ---- inclusion ------------------------------------------------------------------------


def test_inclusion_bundle_round_trip(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "bundle"
    code, out = run(capsys, "prove", str(full.path), "--index", "9", "--out", str(out_dir))
    assert code == 0, out
    args = [
        "inclusion",
        "--record",
        str(out_dir / "record.json"),
        "--proof",
        str(out_dir / "proof.json"),
        "--checkpoint",
        str(out_dir / "checkpoint.note"),
        "--trust",
        str(full.trust_path),
    ]
    code, out = run(capsys, *args)
    assert code == 0, out
    assert out.startswith(f"OK: {out_dir / 'record.json'}: record 9 is included")
    code, out = run(capsys, *args, "--json")
    data = json.loads(out)
    assert data["record"]["index"] == 9 and data["tree_size"] == len(full.builder.items)


@pytest.mark.parametrize("tamper", ["hash", "index", "record", "untrusted"])
def test_inclusion_tampering_is_caught(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str
) -> None:
    from test_verifier_exports import write_trust

    from devtools.builders import make_cast
    from verifier.inclusion import decode_proof, encode_proof, make_inclusion_bundle

    bundle = make_inclusion_bundle(full.path, 9)
    out_dir = tmp_path / "b"
    bundle.write(out_dir)
    trust = full.trust_path
    proof = decode_proof((out_dir / "proof.json").read_bytes())
    if tamper == "hash":
        hashes = list(proof.hashes)
        hashes[0] = bytes(32)
        (out_dir / "proof.json").write_bytes(
            encode_proof(
                proof.__class__(
                    proof.format, proof.placement_id, proof.index, proof.tree_size, hashes
                )
            )
        )
    elif tamper == "index":
        (out_dir / "proof.json").write_bytes(
            encode_proof(
                proof.__class__(proof.format, proof.placement_id, 8, proof.tree_size, proof.hashes)
            )
        )
    elif tamper == "record":  # another record of the same chain, with 9's proof
        other = make_inclusion_bundle(full.path, 8)
        (out_dir / "record.json").write_bytes(other.record)
    else:
        trust = write_trust(make_cast("someone else"), tmp_path / "other-trust.json")
    code, out = run(
        capsys,
        "inclusion",
        "--record",
        str(out_dir / "record.json"),
        "--proof",
        str(out_dir / "proof.json"),
        "--checkpoint",
        str(out_dir / "checkpoint.note"),
        "--trust",
        str(trust),
    )
    assert code == 1, out
    assert out.startswith("FAIL: ")


def test_inclusion_with_unreadable_proof_is_exit_2(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.json").write_text("[]")
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "c.note").write_text("x")
    code = gridledger_main(
        [
            "verify",
            "inclusion",
            "--record",
            str(tmp_path / "r.json"),
            "--proof",
            str(tmp_path / "p.json"),
            "--checkpoint",
            str(tmp_path / "c.note"),
            "--trust",
            str(full.trust_path),
        ]
    )
    assert code == 2


def test_the_default_pool_is_processes_for_a_big_export_and_none_for_a_small_one(
    full: Scenario, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --pool a small export is verified in the command's own process (no worker
    process started for it), a big one by a process per core; --pool is obeyed for any.
    The report is the same every way."""
    from concurrent.futures import ProcessPoolExecutor

    from verifier import limits

    submitted: list[int] = []
    real = ProcessPoolExecutor.submit

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        submitted.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counting)
    args = (str(full.path), "--trust", str(full.trust_path), "--json")
    outs = []
    code, out = run(capsys, *args)
    outs.append(out)
    assert code == 0 and submitted == []  # small: no worker process
    code, out = run(capsys, *args, "--pool", "process")
    outs.append(out)
    assert code == 0 and submitted  # asked for: used
    submitted.clear()
    monkeypatch.setattr(limits, "SMALL_EXPORT_BYTES", 0)  # every export is big
    code, out = run(capsys, *args)
    outs.append(out)
    assert code == 0 and submitted  # big: worker processes by default
    bodies = [json.loads(o)["exports"][0] for o in outs]
    for body in bodies:
        body.pop("elapsed_s", None)
    assert bodies[0] == bodies[1] == bodies[2]
