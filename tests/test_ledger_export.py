"""Exports per proto/EXPORT.md: tables, convenience columns, statement, checkpoint, Parquet."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from test_ledger_scenario import (
    build_scenario,
    local_service,
    publish_scenario_local,
)

from devtools.builders import adjustment
from ledger.export import TABLES, export_placement
from ledger.issuer import UnknownPlacement
from proto import merkle
from proto.envelope import decode_envelope, open_envelope
from proto.keys import b64, verify
from proto.note import LEDGER_NOTE_NAME, parse_checkpoint_body, parse_note
from proto.records import LedgerRecord, Statement


def _exported(tmp_path: Path) -> tuple[Path, str, int]:
    scenario = build_scenario("export", placements=2, nodes=2, events=3)
    pid = scenario.placement_ids[0]
    extra = [(pid, "publish-desk", adjustment(scenario.cast, pid, "adj-1", "credit", 7, 0))]
    publish_scenario_local(tmp_path / "spool", scenario.inputs + extra)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    out = tmp_path / "out" / f"{pid}.duckdb"
    counts = export_placement(
        service.store, pid, out, key=scenario.cast.ledger, parquet_dir=tmp_path / "pq"
    )
    records = counts["ledger_records"]
    service.close()
    return out, pid, records


def test_export_tables_follow_the_format(tmp_path: Path) -> None:
    out, pid, n = _exported(tmp_path)
    with duckdb.connect(str(out), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert tables == set(TABLES)
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        assert meta["format"] == "gridledger-export"
        assert meta["format_version"] == "2"  # records unsigned (SPEC §8)
        envelopes = [
            bytes(e) for (e,) in con.execute("SELECT envelope FROM ledger_records").fetchall()
        ]
        assert len(envelopes) == n
        assert all(decode_envelope(e).signatures == [] for e in envelopes)
        # ...and every one covered by the checkpoint at the head
        sizes = [s for (s,) in con.execute("SELECT size FROM checkpoints").fetchall()]
        assert max(sizes) == n
        assert meta["placement_id"] == pid
        assert meta["records"] == str(n)
        assert meta["dropped_duplicates"] == "0"
        # terms + 6 usage + adjustment + close
        assert n == 9
        # Every chain index 0..n-1 in exactly one input table and in ledger_records.
        indexes: list[int] = []
        for table in ("terms", "key_bindings", "usage_events", "reclaims", "adjustments", "closes"):
            indexes += [r[0] for r in con.execute(f"SELECT chain_index FROM {table}").fetchall()]
        assert sorted(indexes) == list(range(n))
        rows = con.execute(
            "SELECT chain_index, envelope, record_hash, kind, status, delivered_mgms, "
            "buyer_owes_minor FROM ledger_records ORDER BY chain_index"
        ).fetchall()
        assert [r[0] for r in rows] == list(range(n))
        payloads = []
        for index, envelope, record_hash, kind, status, delivered, owes in rows:
            opened = open_envelope(bytes(envelope))
            record = opened.record
            assert isinstance(record, LedgerRecord)
            assert (record.index, record.kind, record.status) == (index, kind, status)
            assert opened.record_hash == record_hash
            assert record.delivered_mgms == delivered
            assert record.totals.buyer_owes_minor == owes
            payloads.append(opened.payload)
        usage = con.execute(
            "SELECT node_id, seq, start_ms, end_ms, envelope FROM usage_events"
        ).fetchall()
        for node_id, seq, start_ms, end_ms, envelope in usage:
            event = open_envelope(bytes(envelope)).record
            assert (event.node_id, event.seq, event.start_ms, event.end_ms) == (  # type: ignore[union-attr]
                node_id,
                seq,
                start_ms,
                end_ms,
            )
        assert con.execute("SELECT direction, amount_minor FROM adjustments").fetchall() == [
            ("credit", 7)
        ]
        # A statement through the head, signed by the ledger key in meta.
        public_key = base64.b64decode(meta["ledger_key"])
        statements = con.execute(
            "SELECT through_index, envelope, final FROM statements ORDER BY through_index"
        ).fetchall()
        assert statements[-1][0] == n - 1
        assert statements[-1][2]  # the chain through the head includes the close
        env = decode_envelope(bytes(statements[-1][1]))
        assert verify(public_key, env.payload, env.signatures[0].sig)
        statement = open_envelope(bytes(statements[-1][1])).record
        assert isinstance(statement, Statement)
        assert statement.totals.adjustment_credit_minor == 7
        # The checkpoint covers every record: RFC 9162 root over the payloads.
        ((size, note_text),) = con.execute("SELECT size, note FROM checkpoints").fetchall()
        note = parse_note(note_text)
        checkpoint = parse_checkpoint_body(note.body)
        assert size == checkpoint.size == n
        assert checkpoint.root == merkle.root(payloads)
        assert note.signed_by(LEDGER_NOTE_NAME, public_key)
        assert b64(public_key) == meta["ledger_key"]
        assert con.execute("SELECT count(*) FROM held").fetchone() == (0,)


def test_parquet_tables_match_the_export(tmp_path: Path) -> None:
    _, pid, n = _exported(tmp_path)
    for table in TABLES:
        assert (tmp_path / "pq" / table / f"{pid}.parquet").is_file()
    with duckdb.connect() as con:
        parquet = str(tmp_path / "pq" / "ledger_records" / f"{pid}.parquet")
        assert con.execute(f"SELECT count(*) FROM read_parquet('{parquet}')").fetchone() == (n,)
    assert not list((tmp_path / "out").glob(".*tmp*"))


def test_export_of_unknown_placement_leaves_nothing(tmp_path: Path) -> None:
    scenario = build_scenario("export-none", placements=1, nodes=1, events=1)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    out = tmp_path / "x.duckdb"
    out.write_bytes(b"previous export")
    with pytest.raises(UnknownPlacement):
        export_placement(service.store, "no-such-placement", out, key=scenario.cast.ledger)
    assert out.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".x")) == []
    service.close()


def test_export_from_a_closed_db_path(tmp_path: Path) -> None:
    scenario = build_scenario("export-path", placements=1, nodes=1, events=2)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    pid = scenario.placement_ids[0]
    service.close()
    out = tmp_path / "e.duckdb"
    counts = export_placement(tmp_path / "ledger.duckdb", pid, out, key=scenario.cast.ledger)
    assert counts["ledger_records"] == 4  # terms, 2 usage, close
    assert counts["statements"] == 1  # the final statement is through the head already
    with duckdb.connect(str(out), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ledger_records").fetchone() == (4,)


def test_export_is_written_in_a_storage_format_duckdb_1_reads(tmp_path: Path) -> None:
    """Issue 18: exports written by DuckDB 2 in its own format could not be opened by the
    DuckDB 1.x CLI ("version number 69, ... only read versions between 64 and 68"). The
    file header carries storage version 64 (DuckDB 1.0), which every 1.x reader accepts."""
    out, _, _ = _exported(tmp_path)
    header = out.read_bytes()[:20]
    assert header[8:12] == b"DUCK"
    assert int.from_bytes(header[12:20], "little") == 64
    with duckdb.connect(str(out), read_only=True) as con:
        tags = con.execute(
            "SELECT tags FROM duckdb_databases() WHERE database_name = ?", [out.stem]
        ).fetchone()
    assert tags is not None and tags[0]["storage_version"].startswith("v1.0.0")


def test_ledger_records_carry_placement_id_and_parquet_globs_across_exports(
    tmp_path: Path,
) -> None:
    """A sum per placement across exports needs no join, from the DuckDB files or from one
    Parquet glob; the verifier checks the column against the signed records."""
    scenario = build_scenario("glob", placements=2, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    outs = []
    for pid in scenario.placement_ids:
        out = tmp_path / "exports" / f"{pid}.duckdb"
        export_placement(
            service.store, pid, out, key=scenario.cast.ledger, parquet_dir=tmp_path / "pq"
        )
        outs.append(out)
    service.close()
    with duckdb.connect() as con:
        glob = str(tmp_path / "pq" / "ledger_records" / "*.parquet")
        per_placement = con.execute(
            f"SELECT placement_id, count(*), max(buyer_owes_minor) FROM read_parquet('{glob}') "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert [row[0] for row in per_placement] == sorted(scenario.placement_ids)
    assert all(row[1] > 0 and row[2] > 0 for row in per_placement)
    # The verifier verifies these exports, and catches an edited placement_id column.
    from verifier.verify import verify_export

    trust = scenario.cast.trust()
    assert verify_export(outs[0], trust).findings.total == 0
    with duckdb.connect(str(outs[1])) as con:
        con.execute("UPDATE ledger_records SET placement_id = 'someone-else' WHERE chain_index = 1")
    report = verify_export(outs[1], trust)
    assert [(f.rule, f.record) for f in report.findings.kept] == [
        ("COLUMN_MISMATCH", "ledger_records[1].placement_id")
    ]


def _export_killed_at(root: str, pid: str, suffix: str) -> None:
    """Child of the test below: ``export_placement`` with Parquet, SIGKILLed when it is
    about to rename its first temporary file to a name ending in ``suffix``."""
    from ledger import export

    scenario = build_scenario("export-kill", placements=2, nodes=2, events=3)
    real = os.replace

    def replace(src: object, dst: object) -> None:
        if str(dst).endswith(suffix):
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)  # type: ignore[arg-type]

    export.os.replace = replace  # type: ignore[assignment]
    base = Path(root)
    export_placement(
        base / "ledger.duckdb",
        pid,
        base / "out" / f"{pid}.duckdb",
        key=scenario.cast.ledger,
        parquet_dir=base / "pq",
    )


@pytest.mark.parametrize("suffix", [".duckdb", ".parquet"])
def test_a_rerun_after_a_killed_export_leaves_only_finished_files(
    tmp_path: Path, suffix: str
) -> None:
    """kill -9 of ``ledger export --out F --parquet DIR`` before the rename of the export
    file, or of a Parquet file: the rerun removes the dead process's temporary files
    (export_all's rule, ``proto.durable_io.pid_alive``) and leaves only finished files."""
    scenario = build_scenario("export-kill", placements=2, nodes=2, events=3)
    pid = scenario.placement_ids[0]
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    service.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    code = (
        "import test_ledger_export as t; "
        f"t._export_killed_at({str(tmp_path)!r}, {pid!r}, {suffix!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    left = [p for p in [*(tmp_path / "out").iterdir(), *(tmp_path / "pq").rglob("*")]]
    assert any(p.name.startswith(".") and ".tmp-" in p.name for p in left), left
    export_placement(
        tmp_path / "ledger.duckdb",
        pid,
        tmp_path / "out" / f"{pid}.duckdb",
        key=scenario.cast.ledger,
        parquet_dir=tmp_path / "pq",
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"{pid}.duckdb"]
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == sorted(TABLES)
    for table in TABLES:
        assert [p.name for p in (tmp_path / "pq" / table).iterdir()] == [f"{pid}.parquet"]
