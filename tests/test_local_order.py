"""The embedded (``local``) transport keeps one order: the ledger's intake log (SPEC §6.4).

A placement is settled over spools in the natural order of work (terms published,
meters spool, the ledger closes it, late usage arrives after the close and is rejected
AFTER_CLOSE). Then the store is lost and rebuilt from the same files: the chains, the
chained inputs and the final statements must be byte-identical — also with the spool
directories renamed so that the ledger's own close spool sorts first or last, also with
kill -9 at random points during the intake, the fold and the rebuild. Without the intake
log the same rebuild reads the spools in a new order and the bill changes: the check is
not vacuous.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ledger_toml
from test_ledger_scenario import (
    INTERVAL_MS,
    LATE_CLOCK_MS,
    T0_MS,
    Scenario,
    build_scenario,
    ledger_key_file,
    publish_scenario_local,
)

from devtools.faults.launch import launch
from ledger.config import load_config
from ledger.issuer import issue_statement
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.records import Statement, UsageEvent
from transport.intake import intake_dir_for, read_intake
from transport.local import ledger_source
from transport.spool import read_spool

LEDGER_ID = "ledger-1"
ON_TIME_EVENTS = 6
READY_TIMEOUT_S = 30.0
MAX_KILL_DELAY_S = 0.4


@dataclass(frozen=True)
class Result:
    """What a rebuild must reproduce byte for byte."""

    records: list[tuple[str, int, bytes]]
    inputs: list[tuple[str, int, str, str, str, str]]
    final_statements: dict[str, bytes]
    totals: dict[str, tuple[int, int, int]]
    head_statements: dict[str, bytes]


def result_of(db: Path, key: SigningKey) -> Result:
    """The store's chains, chained inputs, final statements, and a statement through
    each head issued now (signatures are deterministic: equal heads, equal bytes)."""
    with Store(db) as store:
        heads = {p: issue_statement(store, key, p) for p in store.placements()}
        records = [
            (str(p), int(i), bytes(e))
            for p, i, e in store.query(
                "SELECT placement_id, chain_index, envelope FROM records ORDER BY 1, 2"
            )
        ]
        inputs = [
            (str(p), int(i), str(pos), str(h), str(s), str(r))
            for p, i, pos, h, s, r in store.query(
                "SELECT placement_id, chain_index, position, input_hash, status, reason "
                "FROM inputs ORDER BY 1, 2"
            )
        ]
        finals = {
            str(p): bytes(e)
            for p, e in store.query("SELECT placement_id, envelope FROM statements WHERE final")
        }
    totals: dict[str, tuple[int, int, int]] = {}
    for pid, envelope in finals.items():
        statement = open_envelope(envelope).record
        assert isinstance(statement, Statement)
        t = statement.totals
        totals[pid] = (t.delivered_mgms, t.buyer_owes_minor, t.operator_receives_minor)
    return Result(records, inputs, finals, totals, heads)


def split_on_time(scenario: Scenario) -> tuple[list[tuple[str, str, bytes]], ...]:
    """(terms and usage before the close, usage that arrives after it)."""
    cut = T0_MS + ON_TIME_EVENTS * INTERVAL_MS
    on_time, late = [], []
    for item in scenario.inputs:
        record = open_envelope(item[2]).record
        (late if isinstance(record, UsageEvent) and record.start_ms >= cut else on_time).append(
            item
        )
    return on_time, late


def service(tmp: Path, scenario: Scenario, batch_max_records: int = 5) -> LedgerService:
    store = Store(tmp / "ledger.duckdb", ledger_public_key=scenario.cast.ledger.public_key)
    return LedgerService(
        store,
        scenario.cast.ledger,
        ledger_id=LEDGER_ID,
        local_dir=tmp / "spool",
        clock=fixed_clock(LATE_CLOCK_MS),
        batch_max_records=batch_max_records,
    )


def run_once(tmp: Path, scenario: Scenario) -> None:
    ledger = service(tmp, scenario)
    try:
        ledger.run_until_idle()
    finally:
        ledger.close()


def settle(tmp: Path, scenario: Scenario) -> Result:
    """Natural order: terms and meters spool, the ledger settles (and closes), then the
    late usage arrives and is rejected after the close."""
    on_time, late = split_on_time(scenario)
    publish_scenario_local(tmp / "spool", on_time)
    run_once(tmp, scenario)
    publish_scenario_local(tmp / "spool", late)
    run_once(tmp, scenario)
    return result_of(tmp / "ledger.duckdb", scenario.cast.ledger)


def lose_store(tmp: Path) -> None:
    for name in ("ledger.duckdb", "ledger.duckdb.wal"):
        (tmp / name).unlink(missing_ok=True)


def spool_entries(local: Path) -> Counter[tuple[str, int, int]]:
    out: Counter[tuple[str, int, int]] = Counter()
    for spool in sorted(p for p in local.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for entry in read_spool(spool):
            out[(spool.name, entry.position.segment, entry.position.offset)] += 1
    return out


def intake_entries(local: Path) -> Counter[tuple[str, int, int]]:
    entries = read_intake(intake_dir_for(local, LEDGER_ID))
    return Counter((e.spool, e.segment, e.offset) for _, e in entries)


def check_settled(result: Result, scenario: Scenario) -> None:
    """Every on-time event delivered, every late one rejected after the close."""
    assert sorted(result.final_statements) == scenario.placement_ids
    for pid in scenario.placement_ids:
        delivered = result.totals[pid][0]
        assert delivered == 2 * ON_TIME_EVENTS * INTERVAL_MS * 1000
        late = [row for row in result.inputs if row[0] == pid and row[5] == "AFTER_CLOSE"]
        assert late, f"{pid}: no late usage rejected"


def test_rebuild_after_store_lost_is_identical(tmp_path: Path) -> None:
    scenario = build_scenario("order-rebuild", placements=2, nodes=2, events=9)
    settled = settle(tmp_path, scenario)
    check_settled(settled, scenario)
    local = tmp_path / "spool"
    assert (local / ledger_source(LEDGER_ID)).is_dir()
    # The intake log holds each spool record exactly once, with its arrival time.
    db = tmp_path / "ledger.duckdb"
    assert intake_entries(local) == spool_entries(local)
    assert all(
        e.arrived_ms == LATE_CLOCK_MS for _, e in read_intake(intake_dir_for(local, LEDGER_ID))
    )

    lose_store(tmp_path)
    run_once(tmp_path, scenario)
    assert result_of(db, scenario.cast.ledger) == settled
    assert intake_entries(local) == spool_entries(local)  # nothing appended twice
    with Store(db) as store:
        assert sum(store.dropped_count(p) for p in scenario.placement_ids) == 0

    # A second ledger on a copy of the files reaches the same bytes.
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(local, copy / "spool")  # the spools and the intake log among them
    run_once(copy, scenario)
    assert result_of(copy / "ledger.duckdb", scenario.cast.ledger) == settled


def _rename(local: Path, new_names: dict[str, str]) -> None:
    for old, new in new_names.items():
        (local / old).rename(local / new)


def test_rebuild_is_identical_whatever_the_spool_directory_names(tmp_path: Path) -> None:
    scenario = build_scenario("order-names", placements=2, nodes=2, events=9)
    settled = settle(tmp_path, scenario)
    check_settled(settled, scenario)
    local = tmp_path / "spool"
    db = tmp_path / "ledger.duckdb"
    own = ledger_source(LEDGER_ID)
    names = sorted(p.name for p in local.iterdir() if not p.name.startswith("."))
    for first in (True, False):
        # The ledger's own close spool sorts first, then last; the others are renamed too.
        prefix = "0" if first else "z"
        mapping = {own: f"{prefix}-closes"}
        mapping.update({n: f"m-{i}-{n}" for i, n in enumerate(names) if n != own})
        _rename(local, mapping)
        ordered = sorted(p.name for p in local.iterdir() if not p.name.startswith("."))
        assert (ordered[0] if first else ordered[-1]) == f"{prefix}-closes"
        lose_store(tmp_path)
        run_once(tmp_path, scenario)
        rebuilt = result_of(db, scenario.cast.ledger)
        assert rebuilt == settled
        with Store(db) as store:
            # A renamed spool is a new spool to the intake: read again, every input a
            # re-delivery, dropped (SPEC §6.4), never chained twice.
            assert sum(store.dropped_count(p) for p in scenario.placement_ids) > 0
        _rename(local, {new: old for old, new in mapping.items()})

    # The check can fail: without the intake log, the same rebuild reads the spools in a
    # new order (the closes first) and the bill changes.
    lose_store(tmp_path)
    shutil.rmtree(intake_dir_for(local, LEDGER_ID))
    _rename(local, {own: "0-closes"})
    run_once(tmp_path, scenario)
    reordered = result_of(db, scenario.cast.ledger)
    assert reordered.totals != settled.totals

    def after_close(result: Result) -> int:
        return sum(1 for row in result.inputs if row[5] == "AFTER_CLOSE")

    assert after_close(reordered) > after_close(settled)  # on-time usage read after the close


# ---- kill -9 ----------------------------------------------------------------------------------


def _start_and_kill(config: Path, log_path: Path, db: Path, rng: random.Random) -> tuple[str, int]:
    """Start ``ledger run``, SIGKILL it at a random moment; (when, records stored)."""
    start = log_path.stat().st_size
    # Forked from the harness's fork server (the package imported once): the start-up
    # kills land in the ledger's own start-up, not in Python's imports.
    process = launch(["ledger", "run", "--config", str(config)], log_path)
    try:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.8))  # a random kill point during start-up
            when = "startup"
        else:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while b"intake_opened" not in log_path.read_bytes()[start:]:
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the ledger did not open its intake log"
                time.sleep(0.01)
            limit = MAX_KILL_DELAY_S if rng.random() < 0.5 else MAX_KILL_DELAY_S / 10
            time.sleep(rng.uniform(0.0, limit))  # the random kill point
            when = "running"
        assert process.poll() is None, f"the ledger exited: {log_path.read_text()[-3000:]}"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
    records = 0
    if db.exists():
        with Store(db) as store:
            records = store.counts()["records"]
    return when, records


def _finish(config: Path) -> None:
    ledger = LedgerService.from_config(load_config(config))
    try:
        ledger.run_until_idle()
    finally:
        ledger.close()


def test_kill_nine_during_intake_fold_and_rebuild(tmp_path: Path) -> None:
    rng = random.Random(20261219)
    scenario = build_scenario("order-kill", placements=3, nodes=2, events=30)
    on_time, late = split_on_time(scenario)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)

    # The uninterrupted reference, on its own copy of the spools.
    reference = tmp_path / "reference"
    reference.mkdir()
    reference_result = settle(reference, scenario)
    check_settled(reference_result, scenario)

    work = tmp_path / "work"
    work.mkdir()
    db = work / "ledger.duckdb"
    config = ledger_toml(
        work / "ledger.toml",
        key_file,
        ledger_id=LEDGER_ID,
        db="ledger.duckdb",
        local_dir="spool",
        batch_max_records=4,
        http="off",
        clock_ms=LATE_CLOCK_MS,
    )
    log_path = work / "ledger.log"
    log_path.touch()
    kills: list[tuple[str, int]] = []
    for phase in (on_time, late):
        publish_scenario_local(work / "spool", phase)
        kills.extend(_start_and_kill(config, log_path, db, rng) for _ in range(5))
        _finish(config)
    settled = result_of(db, scenario.cast.ledger)
    check_settled(settled, scenario)
    # Kills may cut an intake pass short, so inputs of different spools can interleave
    # differently from the reference; decisions and totals cannot differ.
    assert settled.totals == reference_result.totals
    decisions = Counter((row[0], row[3], row[4], row[5]) for row in settled.inputs)
    assert decisions == Counter((row[0], row[3], row[4], row[5]) for row in reference_result.inputs)
    assert intake_entries(work / "spool") == spool_entries(
        work / "spool"
    )  # none lost, none doubled

    # The store is lost; the rebuild is killed at random points, then finishes.
    lose_store(work)
    total = len(settled.records)
    for _ in range(8):
        kills.append(_start_and_kill(config, log_path, db, rng))
    _finish(config)
    assert result_of(db, scenario.cast.ledger) == settled
    assert intake_entries(work / "spool") == spool_entries(work / "spool")
    rebuild_kills = [records for _, records in kills[-8:]]
    assert any(0 < records < total for records in rebuild_kills), rebuild_kills
    assert "running" in {when for when, _ in kills}


# ---- ledger statement: held inputs, no store, a running ledger without HTTP ------------------


def _statement(config: Path, placement: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from gridledger.cli import main

    capsys.readouterr()  # what ran before (a ledger's own log lines on stderr) is not asked
    code = main(["ledger", "statement", placement, "--config", str(config)])
    captured = capsys.readouterr()
    return code, captured.err.strip()


def test_statement_says_what_is_held_missing_or_locked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = build_scenario("order-cli", placements=1, nodes=2, events=3)
    pid = scenario.placement_ids[0]
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = ledger_toml(
        tmp_path / "ledger.toml",
        key_file,
        ledger_id=LEDGER_ID,
        db="ledger.duckdb",
        local_dir="spool",
        http="off",
        clock_ms=LATE_CLOCK_MS,
    )
    # Before the store exists: one sentence, and no store is created by asking.
    code, err = _statement(config, pid, capsys)
    assert code == 2
    assert err.count("\n") == 0 and "no ledger store" in err and "ledger run" in err
    assert not (tmp_path / "ledger.duckdb").exists()

    # Usage without terms: held, and the statement says so.
    usage = [item for item in scenario.inputs if open_envelope(item[2]).kind == "usage"]
    publish_scenario_local(tmp_path / "spool", usage)
    _finish(config)
    code, err = _statement(config, pid, capsys)
    assert code == 1
    assert err.count("\n") == 0
    assert f"{len(usage)} input(s) held since" in err and "waiting for its terms" in err
    assert str(LATE_CLOCK_MS) in err

    # A running ledger with http = "off" holds the store: one sentence on what to do.
    log_path = tmp_path / "ledger.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while b"ledger_running" not in log_path.read_bytes():
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the ledger did not start"
                time.sleep(0.01)
            code, err = _statement(config, pid, capsys)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    assert code == 2
    assert err.count("\n") == 0 and "in use by a running ledger" in err
    assert "Traceback" not in err and "IO Error" not in err

    # Terms arrive: the held inputs are released in the order of the intake log.
    terms = [item for item in scenario.inputs if open_envelope(item[2]).kind == "terms"]
    publish_scenario_local(tmp_path / "spool", terms)
    _finish(config)
    code, _ = _statement(config, pid, capsys)
    assert code == 0
    db = tmp_path / "ledger.duckdb"
    with Store(db) as store:
        chained = [
            str(p)
            for (p,) in store.query(
                "SELECT position FROM inputs WHERE kind = 'usage' ORDER BY chain_index"
            )
        ]
    logged = [
        f"local:{e.spool}:{e.segment}:{e.offset}"
        for _, e in read_intake(intake_dir_for(tmp_path / "spool", LEDGER_ID))
        if open_envelope(e.data).kind == "usage"
    ]
    assert chained == logged
