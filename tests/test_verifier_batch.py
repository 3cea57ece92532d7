"""``verify_exports``: a batch of small exports with the obligation's SQL run once over all
of them (``pricing.batch_mismatches``) — each report byte-identical to ``verify_export``
of that export alone, whatever else is in the batch: honest, tampered, lying only in its
totals, unusable, hiding a view; and the keyed SQL computes for each export exactly what
the export's own SQL computes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import HOUR, MINUTE, T0, ExportBuilder, full_scenario, small_scenario
from test_verifier_ledger import _ledger_export
from test_verifier_reuse import TAMPERING

import verifier.verify as verify_module
from devtools.builders import (
    StreamWriter,
    closed,
    gpu,
    make_cast,
    make_terms,
    reclaim,
    release,
    sample,
    signed_terms,
)
from proto.trust import TrustFile
from verifier import pricing, small_export_db
from verifier.pricing import DeferredPricing
from verifier.report import export_json
from verifier.verify import verify_export, verify_exports

SEED = "verifier-small"  # small_scenario's cast: one trust file for every export here


def text(report: Any) -> str:
    """A report as ``python -m verifier --json`` prints it, without its timing."""
    body = export_json(report)
    body.pop("elapsed_s")
    return json.dumps(body, sort_keys=True)


def _events(cast: Any, terms: Any, node: StreamWriter, minutes: range) -> list[bytes]:
    g = terms.gpus[0]
    return [
        node.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(g, retired_pages=1)])
        for m in minutes
    ]


def _ledger_placement(tmp: Path, name: str, gpu_index: int, middle: str) -> Path:
    """A real ledger's export of one GPU: ten minutes, ``middle`` (a reclaim or a buyer
    release at minute 10, effective at 20), ten more minutes, the close."""
    cast = make_cast(SEED)
    terms = make_terms(
        cast, name, [gpu("node-a", gpu_index)], T0, T0 + HOUR, reclaim_penalty_bps=1000
    )
    node = StreamWriter(cast.node_key("node-a"), name, "node-a")
    raws = [signed_terms(cast, terms), *_events(cast, terms, node, range(10))]
    if middle == "reclaim":
        raws.append(reclaim(cast, terms, T0 + 10 * MINUTE, T0 + 20 * MINUTE, "rc-1"))
    else:
        raws.append(release(cast, terms, T0 + 10 * MINUTE, T0 + 20 * MINUTE, "rl-1"))
    raws += _events(cast, terms, node, range(10, 20))
    raws.append(closed(cast, name, terms.window_end_ms + terms.late_grace_ms))
    own = tmp / name
    own.mkdir()
    return _ledger_export(own, cast.ledger, name, raws)


def _dishonest(tmp: Path, name: str, gpu_index: int) -> Path:
    """An export whose chain, statements and checkpoints agree, of a ledger that bills
    the healthy flag of a GPU drawing no power (SPEC §7.1.1): only the obligation's SQL
    finds it (TOTAL_ findings), nothing before the pricing does."""
    cast = make_cast(SEED)
    g = gpu("node-a", gpu_index)
    terms = make_terms(cast, name, [g], T0, T0 + HOUR)
    node = StreamWriter(cast.node_key("node-a"), name, "node-a")
    b = ExportBuilder(cast, terms, trust_the_flag=True)
    b.add(signed_terms(cast, terms))
    middle = sample(g, power_mw=0, retired_pages=1)
    for m, s in enumerate([sample(g, retired_pages=1), middle, sample(g, retired_pages=1)]):
        b.add(node.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [s]))
    b.add(closed(cast, name, terms.window_end_ms + terms.late_grace_ms))
    b.statements_at = [len(b.items) - 1]
    b.checkpoints_at = [len(b.items)]
    return b.write(tmp / f"{name}.duckdb")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], TrustFile]:
    """name -> export (every one under the one trust file), and that trust file."""
    tmp = tmp_path_factory.mktemp("batch")
    out: dict[str, Path] = {}
    trust = None
    for k, minutes in enumerate((2, 5, 11, 13)):
        s = small_scenario(tmp, name=f"b-small-{k}", minutes=minutes)
        out[f"small-{minutes}"] = s.path
        trust = s.trust
    assert trust is not None
    # more records than pricing.CHAIN_ROWS_MAX: still small, still deferred
    s = small_scenario(tmp, name="b-small-300", minutes=300, window_ms=6 * HOUR)
    out["small-300"] = s.path
    out["reclaim"] = _ledger_placement(tmp, "b-reclaim", 1, "reclaim")
    out["release"] = _ledger_placement(tmp, "b-release", 2, "release")
    out["dishonest"] = _dishonest(tmp, "b-dishonest", 3)
    for name, sql in TAMPERING:
        path = tmp / f"tampered-{name}.duckdb"
        shutil.copyfile(out["small-11"], path)
        con = duckdb.connect(str(path))
        con.execute(sql)
        con.close()
        out[name] = path
    # A VIEW where a table must be, reading the verifier's own work tables; and a view
    # under another name beside the tables (never read).
    for name, sql in (
        (
            "view-statements",
            "DROP TABLE statements; ATTACH ':memory:' AS w; "
            "CREATE TABLE w.w_records(chain_index BIGINT); "
            "CREATE VIEW statements AS SELECT * FROM w.main.w_records; DETACH w",
        ),
        ("view-beside", "CREATE VIEW peek AS SELECT * FROM ledger_records"),
    ):
        path = tmp / f"{name}.duckdb"
        shutil.copyfile(out["small-5"], path)
        con = duckdb.connect(str(path))
        con.execute(sql)
        con.close()
        out[name] = path
    (tmp / "not-duckdb.duckdb").write_bytes(b"not a database at all, just bytes" * 10)
    out["not-duckdb"] = tmp / "not-duckdb.duckdb"
    raw = out["small-5"].read_bytes()
    (tmp / "truncated.duckdb").write_bytes(raw[: len(raw) // 3])
    out["truncated"] = tmp / "truncated.duckdb"
    out["missing"] = tmp / "missing.duckdb"
    out["full"] = full_scenario(tmp, name="b-full").path  # adjustments: priced alone
    return out, trust


HONEST = (
    "small-2",
    "small-5",
    "small-11",
    "small-13",
    "small-300",
    "reclaim",
    "release",
    "view-beside",
)


def test_the_honest_exports_verify_alone(exports: tuple[dict[str, Path], TrustFile]) -> None:
    paths, trust = exports
    for name in HONEST:
        assert verify_export(paths[name], trust).ok, name
    dishonest = verify_export(paths["dishonest"], trust)
    rules = {f.rule for f in dishonest.findings.kept}
    assert {"TOTAL_EVENT_DELIVERED_MGMS", "TOTAL_DELIVERED_MGMS"} <= rules, rules
    assert verify_export(paths["view-statements"], trust).verdict == "unusable"


def _alone(paths: list[Path], trust: TrustFile) -> list[str]:
    return [text(verify_export(path, trust)) for path in paths]


def _batched(
    paths: list[Path], trust: TrustFile, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[Path]]:
    """The batch's reports, and the exports it verified again alone (``verify_export``)."""
    again: list[Path] = []

    def spy(path: Path, *args: Any, **kwargs: Any) -> Any:
        again.append(path)
        return verify_export(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(verify_module, "verify_export", spy)
        reports = verify_exports(paths, trust)
    assert len(reports) == len(paths)
    assert [r.path for r in reports] == [str(p) for p in paths]
    return [text(r) for r in reports], again


def test_a_batch_of_honest_exports_reports_each_as_alone_in_one_sql_pass(
    exports: tuple[dict[str, Path], TrustFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, trust = exports
    batch = [paths[name] for name in HONEST]
    passes: list[int] = []
    real = pricing.batch_mismatches

    def counted(con: Any, items: list[DeferredPricing]) -> set[int]:
        passes.append(len(items))
        return real(con, items)

    monkeypatch.setattr(verify_module, "batch_mismatches", counted)
    reports, again = _batched(batch, trust, monkeypatch)
    assert reports == _alone(batch, trust)
    assert again == []  # none verified twice: every one confirmed by the batch
    assert passes == [len(batch)]  # one SQL pass for all of them


@pytest.mark.parametrize("order", ["as listed", "reversed"])
def test_a_mixed_batch_reports_each_export_as_alone(
    exports: tuple[dict[str, Path], TrustFile], monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    paths, trust = exports
    names = list(paths)
    if order == "reversed":
        names.reverse()
    batch = [paths[name] for name in names]
    expected = _alone(batch, trust)
    reports, again = _batched(batch, trust, monkeypatch)
    for name, report, alone in zip(names, reports, expected, strict=True):
        assert report == alone, name
    verdicts = {name: json.loads(r)["verdict"] for name, r in zip(names, reports, strict=True)}
    assert {n for n, v in verdicts.items() if v == "verified"} == set(HONEST)
    assert verdicts["dishonest"] == "failed"
    # Exactly the exports that are not honest were verified again on their own, but the
    # full scenario: under this trust file its terms are not trusted, nothing is priced,
    # its one run is the whole of verify_export's.
    assert verdicts["full"] == "failed"
    again_names = {p.name for p in again}
    assert again_names == {paths[n].name for n in names if n not in (*HONEST, "full")}


def test_a_lie_only_the_sql_finds_is_found_in_the_batch_and_nowhere_else(
    exports: tuple[dict[str, Path], TrustFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, trust = exports
    batch = [paths["small-5"], paths["dishonest"], paths["small-11"]]
    found: list[set[int]] = []
    real = pricing.batch_mismatches

    def noted(con: Any, items: list[DeferredPricing]) -> set[int]:
        found.append(real(con, items))
        return found[-1]

    monkeypatch.setattr(verify_module, "batch_mismatches", noted)
    reports, again = _batched(batch, trust, monkeypatch)
    assert found == [{1}]  # the batch's SQL, and only it, told the dishonest one apart
    assert again == [paths["dishonest"]]
    assert reports == _alone(batch, trust)
    assert [json.loads(r)["verdict"] for r in reports] == ["verified", "failed", "verified"]


def test_a_batch_that_cannot_be_priced_verifies_each_alone(
    exports: tuple[dict[str, Path], TrustFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, trust = exports
    batch = [paths["small-5"], paths["dishonest"], paths["reclaim"]]

    def broken(con: Any, items: list[DeferredPricing]) -> set[int]:
        con.execute("SELECT * FROM no_such_table")
        return set()

    monkeypatch.setattr(verify_module, "batch_mismatches", broken)
    reports, again = _batched(batch, trust, monkeypatch)
    assert again == batch
    assert reports == _alone(batch, trust)


def test_only_one_export_is_ever_attached_and_the_batch_database_holds_none(
    exports: tuple[dict[str, Path], TrustFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VIEW hidden in one export cannot read another's tables: the exports are attached
    one at a time (and detached before the next), and the batch's SQL runs on a database
    that never attaches an export, over rows taken from decoded envelopes."""
    paths, trust = exports
    attached: list[list[str]] = []
    real_attach = small_export_db.WarmDatabase.attach

    def attach(self: small_export_db.WarmDatabase, path: Path) -> Path:
        link = real_attach(self, path)
        rows = self.con.execute(
            "SELECT database_name FROM duckdb_databases() WHERE NOT internal ORDER BY 1"
        ).fetchall()
        attached.append([str(r[0]) for r in rows])
        return link

    batch_databases: list[list[str]] = []
    real = pricing.batch_mismatches

    def batched(con: Any, items: list[DeferredPricing]) -> set[int]:
        rows = con.execute(
            "SELECT database_name FROM duckdb_databases() WHERE NOT internal ORDER BY 1"
        ).fetchall()
        batch_databases.append([str(r[0]) for r in rows])
        return real(con, items)

    monkeypatch.setattr(small_export_db.WarmDatabase, "attach", attach)
    monkeypatch.setattr(verify_module, "batch_mismatches", batched)
    batch = [paths[n] for n in ("small-5", "view-statements", "view-beside", "small-11")]
    reports = verify_exports(batch, trust)
    assert attached and all(names == ["memory", "w", "x"] for names in attached), attached
    assert batch_databases == [["memory"]]
    assert [r.verdict for r in reports] == ["verified", "unusable", "verified", "verified"]
    assert "statements is a view" in reports[1].error


def _work_tables(con: Any, rows: dict[str, list[tuple[Any, ...]]], key: int | None) -> None:
    for table in pricing.BATCH_TABLES:
        data = [row if key is None else (key, *row) for row in rows.get(table, ())]
        if data:
            appender = con.appender(table)
            appender.append_rows(data)
            appender.flush()


def test_the_keyed_sql_computes_for_each_export_what_its_own_sql_does(
    exports: tuple[dict[str, Path], TrustFile],
) -> None:
    """w_base and w_totals of the batch's SQL, per export key, equal row for row what the
    single export's SQL makes of the same work rows (reclaim, release, close, several
    sizes, a health-evidence case)."""
    paths, trust = exports
    names = [*HONEST, "dishonest"]
    deferred: list[DeferredPricing] = []
    for name in names:
        d = DeferredPricing()
        verify_module._verify(paths[name], trust, None, None, False, share=True, deferred=d)
        assert d.rows is not None, name  # each one deferred
        deferred.append(d)
    assert any(d.rows and d.rows.get("w_reclaim") for d in deferred)
    assert any(d.rows and d.rows.get("w_release") for d in deferred)
    order = "ORDER BY chain_index"
    own: list[tuple[list[Any], list[Any]]] = []
    for d in deferred:
        con = duckdb.connect()
        pricing.create_work_tables(con)
        _work_tables(con, d.rows or {}, None)
        pricing.compute_base(con)
        pricing.compute_totals(con, adjustments=False)
        base = con.execute(f"SELECT * FROM w_base {order}").fetchall()
        totals = con.execute(f"SELECT * FROM w_totals {order}").fetchall()
        assert base and totals
        own.append((base, totals))
        con.close()
    con = duckdb.connect()
    con.execute(pricing._BATCH_DDL)
    for key, d in enumerate(deferred):
        _work_tables(con, d.rows or {}, key)
    con.execute(pricing._BATCH_BASE_SQL)
    con.execute(pricing._BATCH_TOTALS_SQL)
    for key, (base, totals) in enumerate(own):
        keyed_base = con.execute(
            f"SELECT * EXCLUDE (ek) FROM w_base WHERE ek = ? {order}", [key]
        ).fetchall()
        keyed_totals = con.execute(
            f"SELECT * EXCLUDE (ek) FROM w_totals WHERE ek = ? {order}", [key]
        ).fetchall()
        assert keyed_base == base, names[key]
        assert keyed_totals == totals, names[key]
    # and the batch's own comparison names exactly the dishonest export
    assert pricing.batch_mismatches(duckdb.connect(), deferred) == {names.index("dishonest")}


def test_the_cli_over_many_exports_prices_them_together_and_reports_each_as_alone(
    exports: tuple[dict[str, Path], TrustFile],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """``verify`` over many files hands them to ``verify_exports`` a batch at a time; each
    export's JSON is what verifying that file alone says (timing aside), and the run's
    exit code the same."""
    from proto.trust import dump_trust
    from verifier import cli, limits

    paths, trust = exports
    trust_path = tmp_path / "trust.json"
    trust_path.write_bytes(dump_trust(trust))
    names = [n for n in paths if n != "missing"]
    files = [str(paths[n]) for n in names]
    passes: list[int] = []
    real = pricing.batch_mismatches

    def counted(con: Any, items: list[DeferredPricing]) -> set[int]:
        passes.append(len(items))
        return real(con, items)

    def bodies(argv: list[str]) -> tuple[int, list[dict[str, Any]]]:
        code = cli.main([*argv, "--trust", str(trust_path), "--json"])
        out = json.loads(capsys.readouterr().out)["exports"]
        for report in out:
            report.pop("elapsed_s", None)
        return code, out

    monkeypatch.setattr(verify_module, "batch_mismatches", counted)
    monkeypatch.setattr(limits, "VERIFY_BATCH_EXPORTS", 5)
    code, together = bodies(files)
    assert passes and max(passes) <= 5  # priced together, a batch at a time
    assert len(passes) >= 2  # more exports than one batch holds
    each = [bodies([f]) for f in files]
    assert together == [report for _, (report,) in each]
    assert code == 2 and 2 in {c for c, _ in each}  # unusable ones among them, as alone
    verified = {n for n, r in zip(names, together, strict=True) if r["verdict"] == "verified"}
    assert verified == set(HONEST)


def test_the_redelivery_lookup_answers_alike_held_and_written() -> None:
    """While a deferrable checklist holds w_usage back (kept in Python, not written) the
    referee's lookup of an accepted (node, seq) reads the kept rows; written, the table:
    the same answers either way, for rows still in the buffer too."""
    from verifier.work_tables import WorkTables

    rows = [
        (0, "node-a", 0, "h-a0", 0, 60),
        (1, "node-b", 0, "h-b0", 0, 60),
        (2, "node-a", 1, "h-a1", 60, 120),
    ]
    asks = [("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1), ("node-c", 0)]
    answers = []
    for hold in (pricing.HELD_TABLES, frozenset()):
        con = duckdb.connect(":memory:")
        pricing.create_work_tables(con, skip=hold)
        work = WorkTables(con)
        work.keeping(hold=hold)
        work.usage.extend(rows[:2])
        work.flush()
        work.usage.append(rows[2])  # in the buffer: the lookup flushes first
        got = [work.usage_record_hash(node, seq) for node, seq in asks]
        work.usage.append((3, "node-b", 1, "h-b1", 60, 120))  # after the lookups began
        got.append(work.usage_record_hash("node-b", 1))
        if hold:
            assert "w_usage" in work.held and "w_usage" not in work.filled
            assert con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'w_usage'"
            ).fetchall() == [(0,)]  # never made while held
        answers.append(got)
        con.close()
    assert answers[0] == answers[1] == ["h-a0", "h-a1", "h-b0", None, None, "h-b1"]
