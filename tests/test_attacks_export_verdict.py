"""The export and the verdict, attacked (SPEC §5 (3), §6.6, §8, §9; EXPORT.md).

Each attack is built with only its attacker's keys: none for an export edited at rest
(a WAL laid beside it, a meta row rewritten, later periods cut away), the ledger's for
what the ledger signs. Each is failed (or kept from FINAL) by the verifier with the
evidence named; the honest export of the same scenario stays FINAL.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import msgspec
import pytest
from test_verifier_exports import Scenario, explain, full_scenario, verify

from devtools.builders import signed_terms
from ledger.fold import Fold
from proto.envelope import open_envelope
from proto.records import PlacementTerms
from proto.trust import TrustFile, dump_trust
from verifier.report import render_export
from verifier.state import FAILED


def _write_wal(path: Path) -> None:
    """What anyone with write access to the directory can do: leave a WAL that moves
    money, which every DuckDB reader replays and the file alone does not show."""
    con = duckdb.connect(str(path))
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("SET checkpoint_threshold = '1GB'")
    con.execute("UPDATE ledger_records SET buyer_owes_minor = buyer_owes_minor + 100000")
    con.close()


def test_an_export_with_a_wal_beside_it_is_refused_in_one_line(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    assert verify(s.path, s.trust).is_final
    _write_wal(s.path)
    wal = Path(f"{s.path}.wal")
    assert wal.is_file() and wal.stat().st_size > 0  # the attack is real: a WAL with data
    report = verify(s.path, s.trust)
    assert report.verdict == FAILED and not report.is_final
    assert report.findings.rules() == {"EXPORT_NOT_CLOSED"}, explain(report)
    (finding,) = report.findings.kept
    assert f"{s.path.name}.wal" in finding.line() and "\n" not in finding.line()


def test_any_duckdb_side_file_is_refused(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    for suffix in (".wal.checkpoint", ".wal.recovery", ".tmp"):
        side = Path(f"{s.path}{suffix}")
        side.write_bytes(b"")
        report = verify(s.path, s.trust)
        assert report.findings.rules() == {"EXPORT_NOT_CLOSED"}, suffix
        assert side.name in explain(report)
        side.unlink()
    assert verify(s.path, s.trust).is_final  # nothing beside it: FINAL again


def _set_meta(path: Path, key: str, value: str) -> None:
    with duckdb.connect(str(path)) as con:
        con.execute("DELETE FROM meta WHERE key = ?", [key])
        con.execute("INSERT INTO meta VALUES (?, ?)", [key, value])


def test_a_huge_meta_integer_is_a_finding_never_a_traceback(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    for key in ("dropped_duplicates", "records"):
        _set_meta(s.path, key, "9" * 5000)  # past every meta value's bound: refused unread
        report = verify(s.path, s.trust)
        assert report.verdict == "unusable" and "more than 4096 characters" in report.error
        assert "\n" not in report.error and len(report.error) < 500
        for value in ("9" * 4000, "1" + "0" * 16, "-1", "0x10", "\u00b2", " 1"):
            _set_meta(s.path, key, value)
            report = verify(s.path, s.trust)
            assert report.verdict == FAILED, (key, value)
            assert "VERIFIER_ERROR" not in report.findings.rules(), explain(report)
            lines = [f.line() for f in report.findings.kept if f.rule == "META_COLUMN"]
            assert any(f"meta.{key}" in line for line in lines), explain(report)
            assert all(len(line) < 1000 for line in render_export(report))
        honest = len(s.builder.items) if key == "records" else s.builder.dropped_duplicates
        _set_meta(s.path, key, str(honest))
    assert verify(s.path, s.trust).is_final


def test_a_meta_value_past_its_bound_is_refused_unread(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    _set_meta(s.path, "placement_id", "p" * 100_000)
    report = verify(s.path, s.trust)
    assert report.verdict == "unusable" and "more than 4096 characters" in report.error


def test_the_ledger_writes_a_closed_file_and_clears_stale_side_files(tmp_path: Path) -> None:
    from test_ledger_scenario import build_scenario, local_service, publish_scenario_local

    from ledger.export import export_placement

    scenario = build_scenario("closed-file", placements=1, nodes=1, events=2)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    pid = scenario.placement_ids[0]
    out = tmp_path / "out" / f"{pid}.duckdb"
    out.parent.mkdir()
    # Left by an earlier file of the name: DuckDB would replay this WAL onto the new one.
    for suffix in (".wal", ".wal.recovery"):
        Path(f"{out}{suffix}").write_bytes(b"stale")
    service = local_service(tmp_path, scenario)
    try:
        service.run_until_idle()
        export_placement(service.store, pid, out, key=scenario.cast.ledger)
    finally:
        service.close()
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    trust = scenario.cast.trust()
    report = verify(out, trust)
    assert "EXPORT_NOT_CLOSED" not in report.findings.rules(), explain(report)


# ---- one spelling per GPU (SPEC §5 (3)) ---------------------------------------------


def test_terms_carry_only_the_canonical_spelling_of_a_gpu_uuid() -> None:
    from devtools.builders import gpu, make_cast, make_terms
    from proto.terms import canonical_uuid, validate_terms
    from verifier.terms_rules import broken_rules, spelled

    assert canonical_uuid("gpu-8F2A-00") == spelled("gpu-8F2A-00") == "GPU-8f2a-00"
    assert canonical_uuid("MIG-GPU-AB") == spelled("MIG-GPU-AB") == "MIG-gpu-ab"
    assert canonical_uuid("Abc") == spelled("Abc") == "abc"
    cast = make_cast("t37-uuid")
    honest = make_terms(cast, "p-u", [gpu("n1", 0), gpu("n1", 1)], 0, 3_600_000)
    assert validate_terms(honest) == [] and broken_rules(honest) == []
    for odd in ("GPU-N1-0", "gpu-n1-0", "Gpu-n1-0"):
        gpus = [msgspec.structs.replace(honest.gpus[0], uuid=odd), honest.gpus[1]]
        bad = msgspec.structs.replace(honest, gpus=gpus)
        assert any("canonical" in p for p in validate_terms(bad)), odd
        assert any("not canonical" in p for p in broken_rules(bad)), odd
    # Two spellings of one device in one terms: listed twice, whatever else.
    twice = msgspec.structs.replace(
        honest, gpus=[honest.gpus[0], msgspec.structs.replace(honest.gpus[1], uuid="GPU-N1-0")]
    )
    assert "a GPU uuid is listed twice in gpus" in validate_terms(twice)
    assert any("not unique" in p for p in broken_rules(twice))


def test_verify_dir_keys_claims_by_the_canonical_spelling() -> None:
    from verifier.capacity import Claim, find_oversold

    claims = [
        Claim("GPU-n1-0", "p-a", "op", 0, 100, 1000, "p-a.duckdb"),
        Claim("gpu-N1-0", "p-b", "op", 50, 150, 1000, "p-b.duckdb"),
    ]
    (found,) = find_oversold(claims)
    assert found.uuid == "GPU-n1-0" and found.placements == ("p-a", "p-b")
    assert (found.start_ms, found.end_ms) == (50, 100)


def test_a_second_spelling_sold_on_another_shard_never_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator, a second buyer and the desk sign terms naming the first buyer's GPU in
    upper case, on another shard. An honest ledger refuses them (TERMS_INVALID); a ledger
    that accepts them (its rule replaced) is failed by the verifier, which re-derives the
    decision, so ``verify DIR`` never reports two sales of the GPU as FINAL."""
    import test_capacity as cap

    import proto.terms

    first = cap.Sale("p-a", "buyer-a", 1000, 0, 60)
    second = cap.Sale("p-b", "buyer-b", 1000, 0, 60)
    raws_b = cap._raws(second)
    cast_b = cap._cast("buyer-b")
    terms_b = open_envelope(raws_b[0]).record
    assert isinstance(terms_b, PlacementTerms)
    gpus = [msgspec.structs.replace(g, uuid=g.uuid.upper()) for g in terms_b.gpus]
    shouted = msgspec.structs.replace(terms_b, gpus=gpus)
    raws_b[0] = signed_terms(cast_b, shouted)
    trust = cap._trust(["buyer-a", "buyer-b"])
    exports = tmp_path / "exports"
    exports.mkdir()
    a = cap._shard_export(tmp_path, "shard0", "p-a", cap._raws(first), exports / "p-a.duckdb")
    assert verify(a, trust).is_final
    (outcome,) = Fold(cast_b.ledger).apply(raws_b[0], "local:shard1", None, None)
    assert (outcome.status, outcome.reason) == ("rejected", "TERMS_INVALID"), outcome.detail
    assert "canonical" in outcome.detail
    # A dishonest second ledger: its canonical-spelling rule switched off.
    monkeypatch.setattr(proto.terms, "canonical_uuid", lambda uuid: uuid)
    b = cap._shard_export(tmp_path, "shard2", "p-b", raws_b, exports / "p-b.duckdb")
    monkeypatch.undo()
    report = verify(b, trust)
    assert report.verdict == FAILED and not report.is_final
    assert "TERMS_INVALID" in explain(report) or "DECISION" in explain(report), explain(report)
    trust_path = tmp_path / "trust.json"
    trust_path.write_bytes(dump_trust(trust))
    code, _, text = cap._cli(exports, trust_path)
    assert code == 1, text


# ---- the arrival mode is signed (SPEC §6.6, §9) ----------------------------------------


def _no_witness(trust: TrustFile, *, simulations: bool = False) -> TrustFile:
    return msgspec.structs.replace(trust, cosigners=[], simulations=simulations)


def test_a_simulations_export_is_final_only_where_the_trust_file_admits_it(
    tmp_path: Path,
) -> None:
    s = full_scenario(tmp_path)
    s.builder.arrival = "sender"
    s.builder.write(s.path)
    _set_meta(s.path, "arrival", "sender")
    report = verify(s.path, s.trust)
    assert report.ok and not report.is_final and report.arrival == "sender"
    assert any("a simulation" in r for r in report.provisional), report.provisional
    assert render_export(report)[0].startswith("PROVISIONAL:")
    assert "not final, not payable" in render_export(report)[0]  # SPEC §9
    admitting = msgspec.structs.replace(s.trust, simulations=True)
    assert verify(s.path, admitting).is_final
    # Relabelling the unsigned meta row (no key needed) changes nothing: the statements
    # sign "sender".
    _set_meta(s.path, "arrival", "log")
    again = verify(s.path, s.trust)
    assert (again.verdict, again.level, again.provisional, again.arrival) == (
        report.verdict,
        report.level,
        report.provisional,
        "sender",
    )
    assert verify(s.path, admitting).is_final


def test_statements_that_mix_arrival_modes_are_a_finding(tmp_path: Path) -> None:
    """A ledger (its key) that signs ``log`` in the final statement of a chain whose
    earlier statements said ``sender``: one store has one mode."""
    s = full_scenario(tmp_path)
    first = s.builder.statements_at[0]
    with duckdb.connect(str(s.path)) as con:
        con.execute(
            "UPDATE statements SET envelope = ? WHERE through_index = ?",
            [s.builder.statement(first, arrival="sender"), first],
        )
    report = verify(s.path, s.trust)
    assert report.verdict == FAILED and "ARRIVAL_MODE" in report.findings.rules(), explain(report)


def test_the_ledger_signs_its_arrival_mode_in_every_statement(tmp_path: Path) -> None:
    from test_ledger_scenario import build_scenario, publish_scenario_local

    from ledger.export import export_placement
    from ledger.service import LedgerService
    from ledger.store import Store
    from proto.records import Statement

    for arrival in ("log", "sender"):
        work = tmp_path / arrival
        scenario = build_scenario(f"signed-{arrival}", placements=1, nodes=1, events=2)
        publish_scenario_local(work / "spool", scenario.inputs)
        store = Store(work / "ledger.duckdb", ledger_public_key=scenario.cast.ledger.public_key)
        service = LedgerService(
            store,
            scenario.cast.ledger,
            ledger_id="l",
            local_dir=work / "spool",
            clock=lambda: 1_900_000_000_000,
            arrival=arrival,  # type: ignore[arg-type]
        )
        pid = scenario.placement_ids[0]
        out = work / f"{pid}.duckdb"
        try:
            service.run_until_idle()
            export_placement(store, pid, out, key=scenario.cast.ledger)
        finally:
            service.close()
        with duckdb.connect(str(out), read_only=True) as con:
            rows = con.execute("SELECT envelope FROM statements").fetchall()
        signed = [open_envelope(bytes(e)).record for (e,) in rows]
        assert signed and all(isinstance(x, Statement) and x.arrival == arrival for x in signed)
        trust = _no_witness(scenario.cast.trust())
        report = verify(out, trust)
        assert report.ok, explain(report)
        assert report.is_final == (arrival == "log"), report.provisional
        if arrival == "sender":
            _set_meta(out, "arrival", "log")  # relabelled at rest: still a simulation
            relabelled = verify(out, trust)
            assert relabelled.ok and not relabelled.is_final and relabelled.arrival == "sender"
            assert verify(out, _no_witness(scenario.cast.trust(), simulations=True)).is_final


# ---- an export cut at a period boundary (SPEC §8, §9) -----------------------------------


def _periods_export(tmp: Path) -> tuple[Scenario, int]:
    """The full scenario with a checkpoint after each statement, as the ledger issues them
    (SPEC §8.1): period 0 ends at the close; two later periods follow. Returns it and the
    close's index."""
    s = full_scenario(tmp)
    n = len(s.builder.items)
    close = n - 3
    s.builder.checkpoints_at = [1, 14, close + 1, n]
    s.builder.write(s.path)
    return s, close


def _witness_state(directory: Path, placement_id: str, note: str) -> Path:
    """A witness's state file as ``witness/state.py`` writes it (the fields it has)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "format": "gridledger-witness-state/v1",
        "placement_id": placement_id,
        "size": 0,
        "frontier": [],
        "last_record_hash": "0" * 64,
        "close_index": -1,
        "included": {},
        "cosigned_note": note,
        "cosigned_at_s": 1,
    }
    (directory / f"{placement_id}.json").write_bytes(msgspec.json.encode(state))
    return directory


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from gridledger.cli import main as gridledger_main

    code = gridledger_main(["verify", *argv])
    return code, capsys.readouterr().out


def test_an_export_cut_at_a_period_boundary_is_never_final_against_what_a_party_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_verifier_final import cut_after

    s, close = _periods_export(tmp_path)
    n = len(s.builder.items)
    full = verify(s.path, s.trust)
    assert full.is_final, explain(full)
    latest = s.builder.checkpoint(n)  # what a party (or its witness) kept: the latest
    # Cut at rest, no key: the later periods, their statements and checkpoints removed.
    cut = cut_after(s.path, tmp_path / "cut.duckdb", close)
    alone = verify(cut, s.trust)
    assert alone.is_final  # alone, the cut is indistinguishable from an honest period 0
    kept = tmp_path / "kept.note"
    kept.write_text(latest)
    trust = str(s.trust_path)
    code, out = _cli(capsys, str(cut), "--trust", trust, "--checkpoint", str(kept))
    assert code == 1 and "TRUNCATED" in out and "OK:" not in out, out
    assert f"checkpoint of {n} records; the export has {close + 1}" in out, out
    state = _witness_state(tmp_path / "witness", s.terms.placement_id, latest)
    code, out = _cli(capsys, str(cut), "--trust", trust, "--witness-state", str(state))
    assert code == 1 and "TRUNCATED" in out and "OK:" not in out, out
    assert f"the witness state {state}" in out
    code, out = _cli(capsys, str(cut), "--trust", trust, "--witness-state", str(state), "--json")
    data = json.loads(out)
    (export,) = data["exports"]
    assert export["verdict"] == "failed" and export["final_period"] is None
    assert export["findings"]["by_rule"] == {"TRUNCATED": 1}
    # The whole export extends both: FINAL, and it says for which period.
    code, out = _cli(capsys, str(s.path), "--trust", trust, "--checkpoint", str(kept))
    assert code == 0, out
    assert f"FINAL for period {n - 1 - close} (through record {n - 1})" in out, out
    code, out = _cli(capsys, str(s.path), "--trust", trust, "--witness-state", str(state))
    assert code == 0 and "extends the kept checkpoint" in out, out


def test_a_witness_state_that_is_not_one_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gridledger.cli import main as gridledger_main

    s = full_scenario(tmp_path)
    trust = str(s.trust_path)
    bad = tmp_path / "witness"
    bad.mkdir()
    (bad / f"{s.terms.placement_id}.json").write_text('{"format": "x", "placement_id": 7}')
    for where in (bad, tmp_path / "no-such-dir"):
        code = gridledger_main(
            ["verify", str(s.path), "--trust", trust, "--witness-state", str(where)]
        )
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith("FAIL: ") and err.count("\n") == 1 and str(where) in err, err
        assert "Traceback" not in err
    # A witness that cosigned nothing yet (no note) leaves the verdict alone.
    empty = _witness_state(tmp_path / "empty", s.terms.placement_id, "")
    code, out = _cli(capsys, str(s.path), "--trust", trust, "--witness-state", str(empty))
    assert code == 0, out
