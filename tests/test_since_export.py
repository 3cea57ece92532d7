"""Exports since a checkpoint and a verifier resuming from its own state (SPEC §8.5).

A placement settled period by period — an export since the last checkpoint each time,
verified from the state the verifier kept — reaches the same head, root, totals and
verdict as one full export of the same log; also when the ledger was killed (-9) between
periods; an edited state file is refused in one line."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from support import ledger_toml
from test_ledger_scenario import (
    EARLY_CLOCK_MS,
    LATE_CLOCK_MS,
    build_scenario,
    ledger_key_file,
    local_service,
    publish_scenario_local,
)

from gridledger.cli import main as gridledger_main
from ledger import issuer
from ledger.export import SinceRefused, export_placement
from ledger.store import Store
from proto import merkle
from proto.frontier import Frontier
from proto.trust import dump_trust
from verifier.cli import main as verify_main
from verifier.resume import read_state, state_of_export, verify_since, write_state
from verifier.verify import verify_export

SEED = "since"
PERIODS = 3


def _chunks(inputs: list[tuple[str, str, bytes]]) -> list[list[tuple[str, str, bytes]]]:
    """The scenario's inputs in PERIODS parts, terms in the first."""
    size = -(-len(inputs) // PERIODS)
    return [inputs[k : k + size] for k in range(0, len(inputs), size)]


def _note(path: Path) -> str:
    with duckdb.connect(str(path), read_only=True) as con:
        row = con.execute("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


def _period(tmp: Path, k: int, since: str | None) -> Path:
    """Publish period k's inputs, fold them, export (since ``since``)."""
    scenario = build_scenario(SEED, placements=1, nodes=2, events=6)
    pid = scenario.placement_ids[0]
    publish_scenario_local(tmp / "spool", _chunks(scenario.inputs)[k])
    clock = LATE_CLOCK_MS if k == PERIODS - 1 else EARLY_CLOCK_MS
    service = local_service(tmp, scenario, clock_ms=clock)
    try:
        service.run_until_idle()
        out = tmp / "out" / f"period-{k}.duckdb"
        export_placement(service.store, pid, out, key=scenario.cast.ledger, since=since)
    finally:
        service.close()
    return out


def _trust(tmp: Path) -> Path:
    path = tmp / "trust.json"
    path.write_bytes(dump_trust(build_scenario(SEED, placements=1).cast.trust()))
    return path


def _chain_of_periods(tmp: Path, export: object = _period) -> tuple[list[Path], Path]:
    paths: list[Path] = []
    since = None
    for k in range(PERIODS):
        out = export(tmp, k, since)  # type: ignore[operator]
        paths.append(out)
        since = _note(out)
    return paths, _trust(tmp)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One chain of period exports and its ledger, built once; tests use copies."""
    tmp = tmp_path_factory.mktemp("since-chain")
    _chain_of_periods(tmp)
    return tmp


def _copy_of_chain(chain: Path, tmp: Path) -> tuple[list[Path], Path]:
    """A copy of ``chain`` in ``tmp``: its period exports (in order) and trust file."""
    shutil.copytree(chain, tmp, dirs_exist_ok=True)
    return sorted((tmp / "out").glob("period-*.duckdb")), tmp / "trust.json"


def _resumed_chain(paths: list[Path], trust_path: Path, tmp: Path) -> list[int]:
    """``verify`` the first export whole, the others each from the state before; codes."""
    state = tmp / "state.json"
    codes = [verify_main([str(paths[0]), "--trust", str(trust_path), "--state-out", str(state)])]
    for path in paths[1:]:
        args = [str(path), "--trust", str(trust_path), "--state", str(state)]
        codes.append(verify_main([*args, "--state-out", str(state)]))
    return codes


def test_a_chain_of_period_exports_reaches_the_full_exports_head_and_totals(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, trust_path = _copy_of_chain(chain, tmp_path)
    # the last period's export holds only its own records
    with duckdb.connect(str(paths[-1]), read_only=True) as con:
        first = con.execute("SELECT min(chain_index) FROM ledger_records").fetchone()
        since = con.execute("SELECT value FROM meta WHERE key = 'since_size'").fetchone()
    assert first is not None and since is not None and first[0] == int(since[0]) > 0
    codes = _resumed_chain(paths, trust_path, tmp_path)
    assert codes == [3, 3, 3], capsys.readouterr()
    scenario = build_scenario(SEED, placements=1, nodes=2, events=6)
    full = tmp_path / "full.duckdb"
    export_placement(
        tmp_path / "ledger.duckdb", scenario.placement_ids[0], full, key=scenario.cast.ledger
    )
    trust = scenario.cast.trust()
    whole = verify_export(full, trust)
    assert whole.ok and whole.final, whole.findings
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["note"] == _note(full)  # same size, same root
    assert state["totals"] == whole.totals
    # the resumed check of the last period: the full export's totals and finality, and a
    # verdict that says what it did not re-derive (SPEC §8.5)
    resumed = read_state(tmp_path / "state.json", trust)
    assert resumed.size == whole.record_count
    # The same chain verified again from the second period's state gives the same answer.
    again = tmp_path / "again.json"
    assert verify_main([str(paths[0]), "--trust", str(trust_path), "--state-out", str(again)]) == 3
    report, nxt = verify_since(paths[1], trust, read_state(again, trust))
    assert nxt is not None and not report.findings.total
    write_state(again, nxt)
    report, nxt = verify_since(paths[2], trust, read_state(again, trust))
    assert nxt is not None and report.totals == whole.totals and report.final == whole.final
    assert any("not re-derived" in p for p in report.provisional)


_PERIOD_CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import test_since_export as t
tmp, k, since = Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t._period(tmp, k, Path(since).read_text() if since else None)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_period(tmp: Path, k: int, since: str | None) -> Path:
    """``_period`` in a real subprocess that is killed -9 once it exported."""
    note = ""
    if since is not None:
        note = str(tmp / f"since-{k}.note")
        Path(note).write_text(since)
    child = subprocess.run(
        [sys.executable, "-c", _PERIOD_CHILD, str(Path(__file__).parent), str(tmp), str(k), note],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    return tmp / "out" / f"period-{k}.duckdb"


def test_periods_after_a_kill_9_chain_as_one_full_export(tmp_path: Path) -> None:
    paths, trust_path = _chain_of_periods(tmp_path, _killed_period)
    assert _resumed_chain(paths, trust_path, tmp_path) == [3, 3, 3]
    scenario = build_scenario(SEED, placements=1, nodes=2, events=6)
    full = tmp_path / "full.duckdb"
    export_placement(
        tmp_path / "ledger.duckdb", scenario.placement_ids[0], full, key=scenario.cast.ledger
    )
    whole = verify_export(full, scenario.cast.trust())
    assert whole.ok and whole.final
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["note"] == _note(full) and state["totals"] == whole.totals


@pytest.mark.parametrize("field", ["totals", "frontier", "head", "note"])
def test_an_edited_state_file_is_refused_in_one_line(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    paths, trust_path = _copy_of_chain(chain, tmp_path)
    state_path = tmp_path / "state.json"
    assert verify_main([str(paths[0]), "--trust", str(trust_path), "--state-out", str(state_path)])
    state = json.loads(state_path.read_text())
    if field == "totals":
        state["totals"]["buyer_owes_minor"] -= 1
    elif field == "frontier":
        state["frontier"][0] = "00" * 32
    elif field == "head":
        raw = bytearray(base64.b64decode(state["head"]))
        raw[-2] ^= 1
        state["head"] = base64.b64encode(bytes(raw)).decode()
    else:
        state["note"] = state["note"].replace("\n\n", "\n\n\n", 1)
    state_path.write_text(json.dumps(state))
    capsys.readouterr()
    code = verify_main([str(paths[1]), "--trust", str(trust_path), "--state", str(state_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("FAIL: state file") and err.count("\n") == 1, err


def test_an_export_since_is_never_read_as_a_whole_log(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, trust_path = _copy_of_chain(chain, tmp_path)
    capsys.readouterr()
    assert verify_main([str(paths[1]), "--trust", str(trust_path)]) == 2
    out = capsys.readouterr()
    assert "--state" in out.out + out.err


def test_the_ledger_refuses_a_note_it_did_not_issue(chain: Path, tmp_path: Path) -> None:
    paths, _ = _copy_of_chain(chain, tmp_path)
    scenario = build_scenario(SEED, placements=1, nodes=2, events=6)
    note = _note(paths[0])
    forged = note.replace(note.splitlines()[1], str(int(note.splitlines()[1]) + 100), 1)
    with pytest.raises(SinceRefused, match=r"not signed|no checkpoint"):
        export_placement(
            tmp_path / "ledger.duckdb",
            scenario.placement_ids[0],
            tmp_path / "x.duckdb",
            key=scenario.cast.ledger,
            since=forged,
        )
    assert not (tmp_path / "x.duckdb").exists()


@pytest.mark.parametrize(
    ("sql", "rule"),
    [
        (
            "DELETE FROM usage_events WHERE chain_index = (SELECT max(chain_index) "
            "FROM usage_events)",
            "CHAIN_INPUT",
        ),
        (
            "DELETE FROM ledger_records WHERE chain_index = (SELECT min(chain_index) "
            "FROM ledger_records) + 1",
            "CHAIN_INDEX",
        ),
        ("UPDATE consistency SET proof = ''", "CONSISTENCY"),
        (
            "DELETE FROM checkpoints WHERE size = (SELECT max(size) FROM checkpoints)",
            "RECORD_UNCOVERED",
        ),
    ],
)
def test_a_tampered_export_since_fails_from_the_state(
    chain: Path, tmp_path: Path, sql: str, rule: str
) -> None:
    paths, _ = _copy_of_chain(chain, tmp_path)
    trust = build_scenario(SEED, placements=1).cast.trust()
    state = tmp_path / "state.json"
    write_state(state, state_of_export(paths[0], verify_export(paths[0], trust)))
    with duckdb.connect(str(paths[1])) as con:
        con.execute(sql)
    report, nxt = verify_since(paths[1], trust, read_state(state, trust))
    assert nxt is None and rule in report.findings.rules(), report.findings


def test_an_export_since_without_its_proof_is_unusable_in_one_line(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, trust_path = _copy_of_chain(chain, tmp_path)
    state = tmp_path / "state.json"
    assert verify_main([str(paths[0]), "--trust", str(trust_path), "--state-out", str(state)])
    with duckdb.connect(str(paths[1])) as con:
        con.execute("DROP TABLE consistency")
    capsys.readouterr()
    code = verify_main([str(paths[1]), "--trust", str(trust_path), "--state", str(state)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("FAIL: ") and err.count("\n") == 1, err


def test_cli_export_since_a_note_and_its_refusals(
    chain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths, trust_path = _copy_of_chain(chain, tmp_path)
    cast = build_scenario(SEED, placements=1).cast
    pid = build_scenario(SEED, placements=1).placement_ids[0]
    config = ledger_toml(
        tmp_path / "ledger.toml",
        ledger_key_file(tmp_path / "keys", cast),
        db=tmp_path / "ledger.duckdb",
        local_dir=tmp_path / "spool",
    )
    note = tmp_path / "p0.note"
    note.write_text(_note(paths[0]))
    out = tmp_path / "cli.duckdb"
    argv = ["ledger", "export", pid, "--out", str(out), "--since", str(note)]
    assert gridledger_main([*argv, "--config", str(config)]) == 0, capsys.readouterr().err
    state = tmp_path / "cli-state.json"
    assert verify_main([str(paths[0]), "--trust", str(trust_path), "--state-out", str(state)])
    assert verify_main([str(out), "--trust", str(trust_path), "--state", str(state)]) == 3
    note.write_text("not a note")
    capsys.readouterr()
    assert gridledger_main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("FAIL: --since: not a checkpoint note") and err.count("\n") == 1, err


def test_a_proof_from_a_frontier_is_rfc_9162s_over_every_leaf() -> None:
    for n in range(1, 40):
        leaves = [merkle.leaf_hash(str(i).encode()) for i in range(n)]
        for m in range(1, n + 1):
            frontier = Frontier.empty()
            for leaf in leaves[:m]:
                frontier = frontier.append_leaf_hash(leaf)
            want = merkle.consistency_proof(leaves, m) if m < n else []
            assert frontier.consistency_proof(leaves[m:]) == want, (m, n)


def test_a_kept_frontier_that_no_stored_checkpoint_gives_is_not_used(
    chain: Path, tmp_path: Path
) -> None:
    """``issuer.frontier_at`` extends a kept frontier only while the stored checkpoint of
    its size has its root (a batch rolled back after it was kept: from 0 instead)."""
    paths, _ = _copy_of_chain(chain, tmp_path)
    scenario = build_scenario(SEED, placements=1, nodes=2, events=6)
    pid = scenario.placement_ids[0]
    first = int(_note(paths[0]).splitlines()[1])
    with Store(tmp_path / "ledger.duckdb", ledger_public_key=scenario.cast.ledger.public_key) as s:
        payloads = s.record_payloads(pid)
        want = merkle.root([*payloads])
        poisoned = Frontier(first, (merkle.leaf_hash(b"not the log"),) * bin(first).count("1"))
        issuer._FRONTIERS.setdefault(s, {})[pid] = {first: poisoned}
        assert issuer.frontier_at(s, pid, len(payloads)).root() == want
        kept = issuer._FRONTIERS[s][pid]
        assert kept[len(payloads)].root() == want and first not in kept
