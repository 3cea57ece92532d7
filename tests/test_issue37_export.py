"""Issue 37, the export and the verdict (SPEC §5 (3), §6.6, §8, §9; EXPORT.md).

Each attack is built with only its attacker's keys: none for an export edited at rest
(a WAL laid beside it, a meta row rewritten, later periods cut away), the ledger's for
what the ledger signs. Each is failed (or kept from FINAL) by the verifier with the
evidence named; the honest export of the same scenario stays FINAL.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from test_verifier_exports import explain, full_scenario, verify

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
