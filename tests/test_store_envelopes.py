"""The store keeps envelopes as payload + signatures (store version 3, issue 15: disk) and
rebuilds them byte for byte; a store of version 2 (envelopes as bytes) is migrated in one
transaction, a kill -9 during it leaves the old store, and its exports do not change."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_ledger_scenario import build_scenario, local_service, publish_scenario_local

from devtools.builders import adjustment
from ledger.crypto import seal_record
from ledger.export import TABLES, export_all
from ledger.store import STORE_VERSION, TOTALS_COLUMNS, Store, StoreError
from proto.envelope import decode_envelope

# The tables ``records`` and ``inputs`` of store version 2, as its SCHEMA created them.
_TOTALS = ",\n".join(f"    {name} BIGINT NOT NULL" for name in TOTALS_COLUMNS)
V2_TABLES = f"""
CREATE TABLE records (
    placement_id VARCHAR NOT NULL,
    chain_index BIGINT NOT NULL,
    envelope BLOB NOT NULL,
    record_hash VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    delivered_mgms BIGINT NOT NULL,
{_TOTALS},
    commit_no BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE inputs (
    placement_id VARCHAR NOT NULL,
    chain_index BIGINT NOT NULL,
    position VARCHAR NOT NULL,
    input_hash VARCHAR NOT NULL,
    payload_hash VARCHAR NOT NULL,
    envelope BLOB NOT NULL,
    kind VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    node_id VARCHAR,
    seq BIGINT,
    start_ms BIGINT,
    end_ms BIGINT,
    valid_from_ms BIGINT,
    valid_until_ms BIGINT,
    issued_at_ms BIGINT,
    effective_at_ms BIGINT,
    direction VARCHAR,
    amount_minor BIGINT,
    closed_at_ms BIGINT,
    commit_no BIGINT NOT NULL DEFAULT 0
);
"""


def to_version_2(db: Path) -> None:
    """Rewrite the store ``db`` (closed) in the layout of store version 2: ``records`` and
    ``inputs`` tables holding each envelope's bytes, in the rows' stored order."""
    with duckdb.connect(str(db)) as con:
        con.execute("BEGIN")
        for view, table in (("records", "record_rows"), ("inputs", "input_rows")):
            con.execute(f"CREATE TABLE {view}_v2 AS SELECT * EXCLUDE (payload) FROM {view}")
            con.execute(f"DROP VIEW {view}")
            con.execute(f"DROP TABLE {table}")
        con.execute(V2_TABLES)
        for view in ("records", "inputs"):
            con.execute(f"INSERT INTO {view} SELECT * FROM {view}_v2")
            con.execute(f"DROP TABLE {view}_v2")
        con.execute("UPDATE meta SET value = '2' WHERE key = 'store_version'")
        con.execute("COMMIT")


def _layout(db: Path) -> tuple[str, dict[str, str]]:
    """(store_version, table name -> BASE TABLE or VIEW) of records/inputs and their rows."""
    with duckdb.connect(str(db), read_only=True) as con:
        version = con.execute("SELECT value FROM meta WHERE key = 'store_version'").fetchone()
        kinds = con.execute(
            "SELECT table_name, table_type FROM information_schema.tables WHERE table_name "
            "IN ('records', 'inputs', 'record_rows', 'input_rows')"
        ).fetchall()
    assert version is not None
    return str(version[0]), {str(n): str(t) for n, t in kinds}


def _ledger(tmp_path: Path) -> tuple[Any, Path, list[bytes]]:
    """A folded scenario (terms signed by three parties, usage, an adjustment, closes),
    the store closed; also every input published."""
    scenario = build_scenario("envelopes", placements=3, nodes=2, events=4)
    pid = scenario.placement_ids[0]
    extra = [(pid, "publish-desk", adjustment(scenario.cast, pid, "adj-1", "credit", 9, 0))]
    inputs = scenario.inputs + extra
    publish_scenario_local(tmp_path / "spool", inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    service.close()
    return scenario, tmp_path / "ledger.duckdb", [raw for _, _, raw in inputs]


def _export_tables(db: Path, out: Path, scenario: Any) -> dict[str, dict[str, list[Any]]]:
    with Store(db, ledger_public_key=scenario.cast.ledger.public_key) as store:
        done = export_all(store, out, key=scenario.cast.ledger)
    assert sorted(done.written) == scenario.placement_ids
    tables: dict[str, dict[str, list[Any]]] = {}
    for pid in scenario.placement_ids:
        with duckdb.connect(str(out / f"{pid}.duckdb"), read_only=True) as con:
            tables[pid] = {
                t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES
            }
    return tables


def _answers(db: Path, scenario: Any) -> dict[str, Any]:
    """What readers get from the store: heads, record envelopes and payloads, terms,
    statements, the inputs' rows."""
    with Store(db, ledger_public_key=scenario.cast.ledger.public_key) as store:
        return {
            "heads": store.heads(),
            "chain": {p: store.record_envelopes(p) for p in scenario.placement_ids},
            "leaves": {p: store.record_payloads(p) for p in scenario.placement_ids},
            "terms": {p: store.terms(p) for p in scenario.placement_ids},
            "statements": {p: store.statements(p) for p in scenario.placement_ids},
            "inputs": store.query("SELECT * EXCLUDE (payload) FROM inputs ORDER BY ALL"),
            "records": store.query("SELECT * EXCLUDE (payload) FROM records ORDER BY ALL"),
        }


def test_stored_envelopes_are_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    _, db, published = _ledger(tmp_path)
    version, layout = _layout(db)
    assert version == STORE_VERSION == "5"
    assert layout == {
        "records": "VIEW",
        "inputs": "VIEW",
        "record_rows": "BASE TABLE",
        "input_rows": "BASE TABLE",
    }
    with duckdb.connect(str(db), read_only=True) as con:
        inputs = con.execute("SELECT envelope, input_hash, payload_hash, kind FROM inputs")
        input_rows = inputs.fetchall()
        records = con.execute("SELECT envelope, payload, record_hash FROM records").fetchall()
        one = con.execute("SELECT count(*) FROM input_rows WHERE sig IS NOT NULL").fetchone()
        # The closes the ledger itself published, as it recorded them before publishing.
        closes = [bytes(e) for (e,) in con.execute("SELECT envelope FROM closes").fetchall()]
    assert len(closes) == 3
    published = published + closes
    # Every chained input is stored as the very bytes published (hash and all), whatever
    # its number of signatures: terms carry three, adjustments two, usage events one.
    assert len(input_rows) > 20
    signatures: dict[str, set[int]] = {}
    single = 0
    for envelope, input_hash, payload_hash, kind in input_rows:
        raw = bytes(envelope)
        assert raw in published
        assert hashlib.sha256(raw).hexdigest() == input_hash
        opened = decode_envelope(raw)
        assert hashlib.sha256(opened.payload).hexdigest() == payload_hash
        signatures.setdefault(str(kind), set()).add(len(opened.signatures))
        single += len(opened.signatures) == 1
    assert signatures["terms"] == {3} and signatures["usage"] == {1}
    assert signatures["adjustment"] == {2} and signatures["closed"] == {1}
    # One signature is kept as (keyid, sig), any other number as the list's JSON.
    assert one is not None and one[0] == single < len(input_rows)
    # Every record is the unsigned envelope of its payload (SPEC §8), as sealed.
    assert len(records) == len(input_rows)
    for envelope, payload, record_hash in records:
        assert bytes(envelope) == seal_record(bytes(payload))
        assert hashlib.sha256(bytes(payload)).hexdigest() == record_hash


def test_a_version_2_store_migrates_and_answers_the_same(tmp_path: Path) -> None:
    scenario, db, _ = _ledger(tmp_path)
    new_answers = _answers(db, scenario)
    new_exports = _export_tables(db, tmp_path / "new", scenario)
    old = tmp_path / "old.duckdb"
    db.rename(old)
    to_version_2(old)
    assert _layout(old) == ("2", {"records": "BASE TABLE", "inputs": "BASE TABLE"})
    with duckdb.connect(str(old), read_only=True) as con:
        envelopes = con.execute("SELECT count(*) FROM records").fetchone()
    assert envelopes is not None and envelopes[0] == len(new_answers["records"])

    old_answers = _answers(old, scenario)  # opening migrates
    assert _layout(old) == (
        STORE_VERSION,
        {
            "records": "VIEW",
            "inputs": "VIEW",
            "record_rows": "BASE TABLE",
            "input_rows": "BASE TABLE",
        },
    )
    assert old_answers == new_answers
    assert _export_tables(old, tmp_path / "old", scenario) == new_exports


def test_a_non_canonical_envelope_is_not_migrated(tmp_path: Path) -> None:
    scenario, db, _ = _ledger(tmp_path)
    to_version_2(db)
    with duckdb.connect(str(db)) as con:
        # The same JSON with a space: decodes, but is not the bytes a rebuild gives.
        con.execute(
            "UPDATE inputs SET envelope = encode(replace(decode(envelope), "
            "'\"signatures\":', '\"signatures\": ')) WHERE chain_index = 1"
        )
    with pytest.raises(StoreError, match=r"cannot migrate store version '2'.*not canonical"):
        Store(db, ledger_public_key=scenario.cast.ledger.public_key)
    assert _layout(db) == ("2", {"records": "BASE TABLE", "inputs": "BASE TABLE"})


_KILL_MID_MIGRATION = """
import os, signal, sys
import ledger.store.store as store
migrate = store._migrate

def migrate_then_die(con, version):
    migrate(con, version)  # everything written, nothing committed
    os.kill(os.getpid(), signal.SIGKILL)

store._migrate = migrate_then_die
store.Store(sys.argv[1])
"""


def test_kill_nine_during_migration_leaves_the_old_store(tmp_path: Path) -> None:
    scenario, db, _ = _ledger(tmp_path)
    new_answers = _answers(db, scenario)
    to_version_2(db)
    old_rows = _answers_v2(db)
    done = subprocess.run(
        [sys.executable, "-c", _KILL_MID_MIGRATION, str(db)],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    assert _layout(db) == ("2", {"records": "BASE TABLE", "inputs": "BASE TABLE"})
    assert _answers_v2(db) == old_rows
    assert _answers(db, scenario) == new_answers  # the restart migrates
    assert _layout(db)[0] == STORE_VERSION


def _answers_v2(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {
            t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
            for t in ("records", "inputs")
        }


# The last commit whose ledger writes store version 2 (envelopes as bytes).
VERSION_2_COMMIT = "6923b3c"

_WRITE_WITH_THAT_CODE = """
import sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], str(Path(sys.argv[1]) / "tests")]
from test_ledger_scenario import build_scenario, local_service, publish_scenario_local
from devtools.builders import adjustment
import ledger.store
assert ledger.store.STORE_VERSION == "2" and ledger.store.__file__.startswith(sys.argv[1])
tmp = Path(sys.argv[2])
scenario = build_scenario("envelopes", placements=3, nodes=2, events=4)
pid = scenario.placement_ids[0]
extra = [(pid, "publish-desk", adjustment(scenario.cast, pid, "adj-1", "credit", 9, 0))]
publish_scenario_local(tmp / "spool", scenario.inputs + extra)
service = local_service(tmp, scenario)
service.run_until_idle()
service.close()
"""


def test_a_store_written_by_the_version_2_code_migrates_to_the_same_answers(
    tmp_path: Path,
) -> None:
    """The ledger of VERSION_2_COMMIT (taken from git) writes the scenario's store; this
    code opens it (migrating) and answers and exports exactly as a store it wrote."""
    root = Path(__file__).resolve().parent.parent
    found = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{VERSION_2_COMMIT}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.skip(f"no git history with commit {VERSION_2_COMMIT} here")
    code = tmp_path / "v2-code"
    code.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", VERSION_2_COMMIT],
        capture_output=True,
        check=True,
        timeout=60,
    )
    subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True, timeout=60)
    old = tmp_path / "old"
    old.mkdir()
    subprocess.run(
        [sys.executable, "-c", _WRITE_WITH_THAT_CODE, str(code), str(old)],
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
        capture_output=True,
        check=True,
        timeout=300,
    )
    assert _layout(old / "ledger.duckdb") == (
        "2",
        {"records": "BASE TABLE", "inputs": "BASE TABLE"},
    )
    (tmp_path / "new-store").mkdir()
    scenario, db, _ = _ledger(tmp_path / "new-store")
    assert _answers(old / "ledger.duckdb", scenario) == _answers(db, scenario)
    assert _layout(old / "ledger.duckdb")[0] == STORE_VERSION
    assert _export_tables(old / "ledger.duckdb", tmp_path / "old-x", scenario) == (
        _export_tables(db, tmp_path / "new-x", scenario)
    )


def test_the_write_path_refuses_an_envelope_its_columns_would_not_rebuild(
    tmp_path: Path,
) -> None:
    """Rows reach the store opened (canonical), so this never happens; if it did, the
    batch is refused rather than stored as bytes the views would rebuild differently."""
    from ledger.store.rows import _signature_columns  # the helper itself: no other way in

    _, db, _ = _ledger(tmp_path)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT envelope FROM inputs WHERE kind IN ('usage', 'terms') ORDER BY kind"
        ).fetchall()
    for (envelope,) in rows:
        raw = bytes(envelope)
        keyid, sig, text = _signature_columns(raw, decode_envelope(raw))
        assert (text is None) == (sig is not None) == (keyid is not None)
        with pytest.raises(StoreError, match="not the canonical form"):
            _signature_columns(raw[:-1] + b" }", decode_envelope(raw))
