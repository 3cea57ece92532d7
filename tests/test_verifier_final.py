"""Verdicts that say what was proven (SPEC §9): FINAL only for a closed, complete,
witnessed log; PROVISIONAL (exit 3) for an open, cut or unwitnessed one; copies of one
placement counted once; two views of one placement are equivocation; an export must
extend a checkpoint the user kept.

The attacks here need no key: an export edited at rest, or two exports side by side.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import duckdb
import msgspec
import pytest
from test_verifier_exports import Scenario, full_scenario, small_scenario

from gridledger.cli import main as gridledger_main
from proto.trust import dump_trust
from verifier.source import INPUT_TABLES


def _dir(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir()
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = gridledger_main(["verify", *argv])
    return code, capsys.readouterr().out


def cut_after(src: Path, out: Path, last_index: int) -> Path:
    """The export as someone without a key would hand it out: cut after a record."""
    shutil.copyfile(src, out)
    with duckdb.connect(str(out)) as con:
        con.execute("DELETE FROM ledger_records WHERE chain_index > ?", [last_index])
        present = {str(name) for (name,) in con.execute("SHOW TABLES").fetchall()}
        for table in INPUT_TABLES:
            if table.name in present:  # an export written before a table existed lacks it
                con.execute(f"DELETE FROM {table.name} WHERE chain_index > ?", [last_index])
        con.execute("DELETE FROM statements WHERE through_index > ?", [last_index])
        con.execute("DELETE FROM checkpoints WHERE size > ?", [last_index + 1])
        con.execute("UPDATE meta SET value = ? WHERE key = 'records'", [str(last_index + 1)])
    return out


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("final-full"))


@pytest.fixture(scope="module")
def full_v1(tmp_path_factory: pytest.TempPathFactory, full: Scenario) -> Path:
    """The same export in format version 1: every record signed by the ledger."""
    items = [dataclasses.replace(i) for i in full.builder.items]
    b = dataclasses.replace(full.builder, items=items, format_version="1")
    return b.write(tmp_path_factory.mktemp("final-v1") / "p-full.duckdb")


def test_honest_final_export_exits_0_and_names_its_witnesses(
    full: Scenario, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, str(full.path), "--trust", str(full.trust_path))
    assert code == 0, out
    assert "(final, witnessed by operator-1, buyer-1)" in out
    # SPEC §8 statement periods: FINAL says for which period (the latest)
    assert re.search(r"records through index \d+, period \d+ \(final,", out), out


def test_export_cut_before_the_close_is_provisional_never_ok(
    full: Scenario, full_v1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Version 1: the records past the last checkpoint are signed, so: provisional.
    cut = cut_after(full_v1, tmp_path / "cut.duckdb", 20)
    code, out = run(capsys, str(cut), "--trust", str(full.trust_path))
    assert code == 3, out
    assert out.startswith("PROVISIONAL:") and "open: the log holds no accepted close" in out
    assert "OK:" not in out
    # Version 2 (SPEC §8): nothing signs them, so they are a finding.
    cut = cut_after(full.path, tmp_path / "cut2.duckdb", 20)
    code, out = run(capsys, str(cut), "--trust", str(full.trust_path))
    assert code == 1 and "RECORD_UNCOVERED" in out and "OK:" not in out, out


def test_export_cut_after_the_close_without_its_final_statement_fails(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = len(full.builder.items)
    cut = cut_after(full.path, tmp_path / "cut.duckdb", n - 2)  # the late adjustment cut
    code, out = run(capsys, str(cut), "--trust", str(full.trust_path))
    assert code == 1, out
    assert "FINAL_STATEMENT_MISSING" in out


def test_missing_cosignature_is_provisional_and_policy_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = small_scenario(_dir(tmp_path, "a"))
    s.builder.cosigners = [(s.cast.buyer.name, s.cast.buyer)]
    s.builder.write(s.path)
    code, out = run(capsys, str(s.path), "--trust", str(s.trust_path))
    assert code == 3 and "not witnessed by the operator (operator-1)" in out, out
    # A trust file whose policy names only the buyer takes it as final.
    policy = tmp_path / "buyer-only.json"
    policy.write_bytes(dump_trust(msgspec.structs.replace(s.trust, cosigners=["buyer"])))
    code, out = run(capsys, str(s.path), "--trust", str(policy))
    assert code == 0 and "witnessed by buyer-1" in out, out
    # A witness the policy names but the trust file does not pin can never be satisfied.
    auditor = tmp_path / "auditor.json"
    auditor.write_bytes(dump_trust(msgspec.structs.replace(s.trust, cosigners=["auditor-9"])))
    code, out = run(capsys, str(s.path), "--trust", str(auditor))
    assert code == 3 and "'auditor-9' is not pinned" in out, out


def test_two_copies_count_once_and_an_older_view_is_superseded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = small_scenario(_dir(tmp_path, "s"))
    exports = tmp_path / "exports"
    exports.mkdir()
    shutil.copyfile(s.path, exports / "a.duckdb")
    shutil.copyfile(s.path, exports / "b.duckdb")
    cut_after(s.path, exports / "c-old.duckdb", 2)
    with duckdb.connect(str(exports / "c-old.duckdb")) as con:
        # As the ledger exported it then: a checkpoint at its head (SPEC §8, version 2).
        con.execute("INSERT INTO checkpoints VALUES (3, ?)", [s.builder.checkpoint(3)])
    code, out = run(capsys, str(exports), "--trust", str(s.trust_path), "--json")
    data = msgspec.json.decode(out)
    assert code == 3  # the older view is provisional on its own
    assert data["copies"]["duplicates"] == [[str(exports / "b.duckdb"), str(exports / "a.duckdb")]]
    assert data["copies"]["superseded"] == [
        [str(exports / "c-old.duckdb"), str(exports / "a.duckdb")]
    ]
    # The buyer owes once, not three times.
    owes = data["exports"][0]["totals"]["buyer_owes_minor"]
    buyers = [p for p in data["reconciliation"]["parties"] if p["role"] == "buyer"]
    assert [p["amount_minor"] for p in buyers] == [owes]


def test_two_diverging_views_of_one_placement_are_equivocation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    five = small_scenario(_dir(tmp_path, "five"), minutes=5)
    six = small_scenario(_dir(tmp_path, "six"), minutes=6)  # same placement, ledger, parties
    exports = tmp_path / "exports"
    exports.mkdir()
    shutil.copyfile(five.path, exports / "five.duckdb")
    shutil.copyfile(six.path, exports / "six.duckdb")
    code, out = run(capsys, str(exports), "--trust", str(five.trust_path))
    assert code == 1, out
    assert "FAIL: EQUIVOCATION: placement p-small" in out
    assert out.count("gridledger/placement/p-small") == 2  # both signed checkpoints shown


def test_export_must_extend_a_kept_checkpoint(
    full: Scenario, full_v1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with duckdb.connect(str(full.path), read_only=True) as con:
        (note,) = con.execute("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    kept = tmp_path / "kept.note"
    kept.write_text(note)
    code, out = run(
        capsys, str(full.path), "--trust", str(full.trust_path), "--checkpoint", str(kept)
    )
    assert code == 0 and "extends the kept checkpoint" in out, out
    cut = cut_after(full_v1, tmp_path / "cut.duckdb", 20)  # v1: the cut alone verifies
    code, out = run(capsys, str(cut), "--trust", str(full.trust_path), "--checkpoint", str(kept))
    assert code == 1 and "TRUNCATED" in out, out
    other = small_scenario(_dir(tmp_path, "other"), name="p-full", seed="verifier-full")
    code, out = run(
        capsys, str(other.path), "--trust", str(full.trust_path), "--checkpoint", str(kept)
    )
    assert code == 1 and ("TRUNCATED" in out or "EQUIVOCATION" in out), out
    bogus = tmp_path / "bogus.note"
    bogus.write_text("not a note\n")
    code, _ = run(
        capsys, str(full.path), "--trust", str(full.trust_path), "--checkpoint", str(bogus)
    )
    assert code == 2


def test_consistency_proof_between_two_kept_checkpoints(
    full: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    code, printed = run(capsys, "prove", str(full.path), "--from", "14", "--out", str(out))
    assert code == 0, printed
    trust = str(full.trust_path)
    argv = ["consistency", "--proof", str(out / "consistency.json"), "--trust", trust]
    code, printed = run(
        capsys, *argv, "--old", str(out / "old.note"), "--new", str(out / "new.note")
    )
    assert code == 0 and "extends the one of size 14" in printed, printed
    # Notes swapped: the proof no longer matches them.
    code, printed = run(
        capsys, *argv, "--old", str(out / "new.note"), "--new", str(out / "old.note")
    )
    assert code == 1 and printed.startswith("FAIL:"), printed
    # A fork: the "new" note is the checkpoint of another log of the same placement.
    other = small_scenario(_dir(tmp_path, "fork"), name="p-full", seed="verifier-full")
    fork = tmp_path / "fork-bundle"
    assert run(capsys, "prove", str(other.path), "--from", "1", "--out", str(fork))[0] == 0
    code, printed = run(
        capsys, *argv, "--old", str(out / "old.note"), "--new", str(fork / "new.note")
    )
    assert code == 1, printed
    code, _ = run(capsys, "prove", str(full.path), "--from", "0", "--out", str(out))
    assert code == 2
