"""Where arrival times come from (SPEC §6.6) travels with the store and every export.

A store remembers the arrival mode that wrote it and refuses a ledger configured with the
other (one chain never mixes log times with times its senders stated); an export's meta
says which it is (EXPORT.md ``arrival``); the verifier reports a simulation's exports as
such and refuses an export whose stated mode it does not know.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_ledger_scenario import build_scenario, local_service, publish_scenario_local
from test_verifier_exports import full_scenario, verify

from ledger.export import export_placement
from ledger.store import Store, StoreError
from verifier.report import export_json, render_export
from verifier.state import UNUSABLE


def test_a_store_keeps_its_arrival_mode_and_refuses_the_other(tmp_path: Path) -> None:
    db = tmp_path / "ledger.duckdb"
    with Store(db) as store:
        assert store.arrival() == "log"  # nothing recorded yet: read as the log's
        store.note_arrival("log")
        store.note_arrival("log")  # the same mode again is fine
    with Store(db) as store:
        with pytest.raises(StoreError) as refused:
            store.note_arrival("sender")
        assert "arrival = 'log'" in str(refused.value)
        assert "\n" not in str(refused.value)
        assert store.arrival() == "log"  # the refusal changed nothing


def test_a_log_ledger_cannot_reopen_a_simulations_store(tmp_path: Path) -> None:
    scenario = build_scenario("arrival-mode", placements=1, nodes=1, events=2)
    with Store(tmp_path / "ledger.duckdb") as store:
        store.note_arrival("sender")
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    with pytest.raises(StoreError, match="arrival = 'sender'"):
        local_service(tmp_path, scenario)


def test_an_export_states_its_arrival_mode(tmp_path: Path) -> None:
    scenario = build_scenario("arrival-export", placements=1, nodes=1, events=2)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    try:
        service.run_until_idle()
        pid = scenario.placement_ids[0]
        out = tmp_path / "out" / f"{pid}.duckdb"
        export_placement(service.store, pid, out, key=scenario.cast.ledger)
    finally:
        service.close()
    with duckdb.connect(str(out), read_only=True) as con:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    assert meta["arrival"] == "log"


def _set_arrival(path: Path, value: str) -> None:
    with duckdb.connect(str(path)) as con:
        con.execute("DELETE FROM meta WHERE key = 'arrival'")
        con.execute("INSERT INTO meta VALUES ('arrival', ?)", [value])


def test_the_verifier_reports_a_simulations_export(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    plain = verify(s.path, s.trust)
    assert plain.ok and plain.arrival == "log"  # no meta row: the log's times
    assert not any("arrival times" in line for line in render_export(plain))

    _set_arrival(s.path, "sender")
    report = verify(s.path, s.trust)
    assert report.ok  # the same records verify; only what they claim to be differs
    assert report.arrival == "sender" and export_json(report)["arrival"] == "sender"
    assert any("stated by the senders" in line for line in render_export(report))


def test_the_verifier_refuses_an_unknown_arrival_mode(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    _set_arrival(s.path, "witness")
    report = verify(s.path, s.trust)
    assert report.verdict == UNUSABLE
    assert "meta.arrival is 'witness'" in report.error
