"""gridledger assign (SPEC §6.8): the buyer, the new buyer and the desk sign apart, a dry
run says what the ledger would decide, the record is published to the local transport and
folded by a real ledger; bad input is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_cli_records
from test_cli_records import World, _iso
from test_ledger_scenario import T0_MS

from gridledger.cli import main
from proto.envelope import open_envelope
from proto.keys import SigningKey, write_key_pair
from proto.records import Assignment, LedgerRecord


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # The ledger's clock (the arrival of what it reads) at minute 10: usage folded to
    # minute 5, the rest of the window still to sell.
    monkeypatch.setattr(test_cli_records, "EARLY_CLOCK_MS", T0_MS + 10 * 60_000)
    w = World(tmp_path)
    yield w
    w.service.close()


def _new_buyer(world: World) -> tuple[Path, Path]:
    return write_key_pair(SigningKey.generate("buyer-new"), world.tmp / "newkeys")


def test_assign_signed_apart_dry_run_publish_and_the_ledger_bills_the_new_buyer(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = _new_buyer(world)
    gpu = world.terms.gpus[0].uuid
    record = world.tmp / "assign.json"
    base = ["--terms", str(world.signed_terms)]
    code = main(
        ["assign", *base, "--new-buyer", "buyer-new", "--new-buyer-key", str(public),
         "--handover-at", _iso(T0_MS + 30 * 60_000), "--rate", "4.00", "--gpus", gpu,
         "--id", "as-1", "--key", world.key("buyer"), "--out", str(record)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "sells 1 of 2 GPUs" in out and "missing: new buyer buyer-new, desk" in out
    # Publishing before the new buyer and the desk sign is refused.
    target = ["--local-dir", str(world.tmp / "spool")]
    assert main(["publish", str(record), *base, *target]) == 1
    assert "must sign first" in capsys.readouterr().err
    # A stranger's key is refused.
    _, _ = write_key_pair(SigningKey.generate("stranger"), world.tmp / "other")
    assert main(["cosign", str(record), *base, "--key", str(world.tmp / "other/stranger.key")]) == 1
    assert "may not sign an assignment" in capsys.readouterr().err
    # The new buyer and the desk cosign; a dry run first says the ledger would accept it.
    assert main(["cosign", str(record), *base, "--key", str(private)]) == 0
    dry = ["--dry-run", "--export", str(world.export), "--arrives-at", _iso(T0_MS + 29 * 60_000)]
    assert main(["cosign", str(record), *base, "--key", world.key("desk"), *dry]) == 0
    dry_out = capsys.readouterr().out
    assert "the ledger would accept it" in dry_out
    # arriving at minute 29, before the handover: billed from the handover, minute 30
    assert "the new buyer is billed from 2026-01-01T00:30:00Z" in dry_out
    assert main(["cosign", str(record), *base, "--key", world.key("desk"), *target]) == 0
    world.service.run_until_idle()
    assert world.last_record() == ("assignment", "accepted", "")
    assignment = open_envelope(record.read_bytes().rstrip()).record
    assert isinstance(assignment, Assignment)
    assert (assignment.gpus, assignment.rate_per_gpu_hour_minor) == ([gpu], 400)
    (envelope,) = world.service.store.query(
        "SELECT envelope FROM records WHERE placement_id = ? ORDER BY chain_index DESC LIMIT 1",
        [world.pid],
    )[0]
    ledger_record = open_envelope(bytes(envelope)).record
    assert isinstance(ledger_record, LedgerRecord)
    assert [e.new_buyer for e in ledger_record.resale] == ["buyer-new"]


def test_assign_to_a_node_key_of_the_terms_is_refused_before_signing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # A "new buyer" holding a node's key of the terms (SPEC §6.8): refused before signing,
    # one line naming the option, exit 2 (tests/test_cli_prechecks.py: keys bound since).
    node = world.terms.nodes[0].node_id
    node_key = world.scenario.cast.node_key(node)
    private, public = write_key_pair(node_key, world.tmp / "nodekeys")
    code = main(
        ["assign", "--terms", str(world.signed_terms), "--new-buyer", "buyer-new",
         "--new-buyer-key", str(public), "--handover-at", _iso(T0_MS + 30 * 60_000),
         "--rate", "4", "--key", world.key("buyer"), "--key", str(private), "--key",
         world.key("desk"), "--dry-run", "--export", str(world.export),
         "--arrives-at", _iso(T0_MS + 20 * 60_000)]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--new-buyer-key" in err and f"node {node}" in err and "ASSIGNMENT_INVALID" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gpus", "GPU-nope-0"], "is not in the terms"),
        (["--handover-at", "2030-01-01T00:00:00Z"], "outside the window"),
        (["--rate", "four"], ""),
        (["--new-buyer", "buyer-1"], "is a party of the terms"),
    ],
)
def test_assign_bad_input_is_one_line_exit_2(world: World, extra: list[str], needle: str) -> None:
    _, public = _new_buyer(world)
    args = {"--new-buyer": "buyer-new", "--new-buyer-key": str(public),
            "--handover-at": _iso(T0_MS + 30 * 60_000), "--rate": "4.00"}  # fmt: skip
    for i in range(0, len(extra), 2):
        args[extra[i]] = extra[i + 1]
    flat = [x for pair in args.items() for x in pair]
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "assign", "--terms", str(world.signed_terms),
         "--key", world.key("buyer"), *flat],
        capture_output=True, text=True, timeout=60, check=False, cwd=world.tmp,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL: ") and needle in lines[0], done.stderr
