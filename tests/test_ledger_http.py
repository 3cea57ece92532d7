"""The HTTP API of a running ledger, and the CLI that uses it (or the DB when stopped)."""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import structlog
from support import ledger_toml
from test_ledger_scenario import (
    LATE_CLOCK_MS,
    build_scenario,
    ledger_key_file,
    local_service,
    publish_scenario_local,
)

from devtools.builders import signed_terms
from gridledger.cli import main as gridledger_main
from ledger.client import find_running
from ledger.config import load_config
from ledger.http import LedgerApi, LedgerHttpServer
from ledger.issuer import issue_statement
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from proto import merkle
from proto.cosign import cosign, cosignature_of
from proto.envelope import decode_envelope
from proto.keys import SigningKey, write_key_pair
from proto.note import LEDGER_NOTE_NAME, parse_checkpoint_body, parse_note

# Cosignatures are dated by the witness's clock, which the ledger bounds by its own
# (SPEC §8.4).
_NOW_S = int(time.time())


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """The server runs in this process: keep its info logs off the CLI's stdout."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


def test_http_api_and_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet_logs: None
) -> None:
    scenario = build_scenario("http", placements=2, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    pid = scenario.placement_ids[0]
    config_path = ledger_toml(
        tmp_path / "ledger.toml",
        ledger_key_file(tmp_path / "keys", scenario.cast),
        http="127.0.0.1:0",
    )
    config = load_config(config_path)
    api = LedgerApi(service.store, service.key, service.metrics, health=lambda: {"x": 1})
    server = LedgerHttpServer(api, "127.0.0.1", 0, port_file=config.port_file)
    server.start()
    try:
        base = server.url
        assert find_running(config) == base

        status, body = _get(f"{base}/health")
        assert status == 200 and json.loads(body) == {"status": "ok", "x": 1}
        status, body = _get(f"{base}/metrics")
        assert status == 200
        assert b'gridledger_ledger_records_folded_total{status="accepted"} 10.0' in body
        assert b"gridledger_ledger_batch_seconds_bucket" in body

        status, body = _get(f"{base}/placements/{pid}/statement")
        statement = json.loads(body)
        head_index, head_hash = service.store.heads()[pid]
        assert status == 200
        assert (statement["through_index"], statement["head"]) == (head_index, head_hash)
        assert statement["final"] is True
        assert statement["totals"]["delivered_mgms"] == scenario.expected_delivered_mgms(pid)

        status, body = _get(f"{base}/placements/nope/statement")
        assert status == 404
        status, body = _get(f"{base}/placements/{pid}/elsewhere")
        assert status == 404

        # SPEC §8.4: a GET never issues one; a party asks with a POST.
        status, body = _get(f"{base}/placements/{pid}/checkpoint")
        assert status == 503 and "POST" in json.loads(body)["error"]
        status, body = _post(f"{base}/placements/{pid}/checkpoint", b"")
        note = parse_note(body.decode())
        assert status == 200 and note.signed_by(LEDGER_NOTE_NAME, scenario.cast.ledger.public_key)

        buyer = scenario.cast.buyer
        signed = cosign(note, buyer.name, buyer, _NOW_S).text().encode()
        status, body = _post(f"{base}/placements/{pid}/checkpoint/cosign", signed)
        assert status == 200, body
        merged = parse_note(body.decode())
        assert cosignature_of(merged, buyer.name, buyer.public_key) is not None
        assert merged.signed_by(LEDGER_NOTE_NAME, scenario.cast.ledger.public_key)
        # Stored: asking again returns the cosigned note.
        assert parse_note(_get(f"{base}/placements/{pid}/checkpoint")[1].decode()) == merged

        impostor = SigningKey.from_seed_text(buyer.name, "not the buyer")
        forged = cosign(note, buyer.name, impostor, _NOW_S).text().encode()
        status, body = _post(f"{base}/placements/{pid}/checkpoint/cosign", forged)
        assert status == 400 and json.loads(body)["reason"] == "SIG_INVALID"
        stranger = cosign(note, "stranger-1", impostor, _NOW_S).text().encode()
        status, body = _post(f"{base}/placements/{pid}/checkpoint/cosign", stranger)
        assert status == 400 and json.loads(body)["reason"] == "SIG_SURPLUS"
        status, body = _post(f"{base}/placements/{pid}/checkpoint/cosign", b"garbage")
        assert status == 400

        status, body = _get(f"{base}/placements/{pid}/export")
        assert status == 200
        exported = tmp_path / "downloaded.duckdb"
        exported.write_bytes(body)
        with duckdb.connect(str(exported), read_only=True) as con:
            assert con.execute("SELECT count(*) FROM ledger_records").fetchone() == (
                head_index + 1,
            )
            cosigned = con.execute("SELECT note FROM checkpoints").fetchall()
            assert any(
                cosignature_of(parse_note(n), buyer.name, buyer.public_key) for (n,) in cosigned
            )

        # The CLI finds the running ledger through the port file and asks over HTTP.
        capsys.readouterr()
        assert (
            gridledger_main(["ledger", "statement", pid, "--json", "--config", str(config_path)])
            == 0
        )
        printed = json.loads(capsys.readouterr().out)
        assert printed["head"] == head_hash
        out = tmp_path / "cli-export.duckdb"
        argv = ["ledger", "export", pid, "--out", str(out), "--config", str(config_path)]
        assert gridledger_main(argv) == 0
        assert out.stat().st_size > 0
        assert "OK: exported" in capsys.readouterr().out
        # The desk's witness checks the log through the API and cosigns it.
        desk_key_path, _ = write_key_pair(scenario.cast.desk, tmp_path / "desk")
        terms_path = tmp_path / "terms.signed.json"
        terms_path.write_bytes(signed_terms(scenario.cast, scenario.terms[pid]))
        argv = ["witness", "run", "--ledger", base, "--terms", str(terms_path)]
        argv += ["--key", str(desk_key_path), "--state", str(tmp_path / "desk-witness")]
        assert gridledger_main(argv) == 0
        assert "OK: " in capsys.readouterr().out
        stored = parse_note(_get(f"{base}/placements/{pid}/checkpoint")[1].decode())
        assert cosignature_of(stored, "desk-1", scenario.cast.desk.public_key) is not None
        assert cosignature_of(stored, buyer.name, buyer.public_key) is not None
        records = _get(f"{base}/placements/{pid}/records?from=1&to=3")[1].decode().splitlines()
        assert len(records) == 2
        assert _get(f"{base}/placements/{pid}/records?from=3&to=1")[0] == 400
        assert _get(f"{base}/placements/{pid}/records?from=x")[0] == 400
        proof_text = _get(f"{base}/placements/{pid}/consistency?from=2&to=5")[1].decode()
        proof = [base64.b64decode(line) for line in proof_text.splitlines()]
        leaves = service.store.record_payloads(pid, 4)
        assert merkle.verify_consistency(
            2, 5, merkle.root(leaves[:2]), merkle.root(leaves[:5]), proof
        ), "the served consistency proof does not verify (RFC 9162 2.1.4.2)"
        assert _get(f"{base}/placements/{pid}/consistency?from=0")[1] == b""
    finally:
        server.stop()
        service.close()
    assert not config.port_file.exists()

    # Stopped: the CLI opens the DB itself and gives the same statement.
    capsys.readouterr()
    assert find_running(config) is None
    assert (
        gridledger_main(["ledger", "statement", pid, "--json", "--config", str(config_path)]) == 0
    )
    assert json.loads(capsys.readouterr().out)["head"] == head_hash
    assert gridledger_main(["ledger", "statement", pid, "--config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "Buyer owes" in out  # the bill, line by line, each with its derivation
    assert "Gross" in out and "SPEC §7.2" in out
    assert gridledger_main(["ledger", "statement", "nope", "--config", str(config_path)]) == 1


def test_records_are_served_only_under_a_checkpoint(tmp_path: Path, quiet_logs: None) -> None:
    """SPEC §8.4: records are unsigned, so ``/records`` never serves one that no checkpoint
    covers, and a read issues none: past the latest checkpoint it is a 400; once the ledger
    issued one (its loop, or a party's POST), the records under it are served."""
    scenario = build_scenario("http-cover", placements=1, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    try:
        service.run_until_idle()
        pid = scenario.placement_ids[0]
        store = service.store
        size = store.heads()[pid][0] + 1
        assert store.checkpoints(pid) == []  # folding alone issues none
        api = LedgerApi(store, service.key, service.metrics)
        assert api.records(pid, 0, 0) == ""
        with pytest.raises(Exception, match=r"outside 0\.\.0"):
            api.records(pid, 0, 2)
        assert store.checkpoints(pid) == []  # the read issued nothing
        api.request_checkpoint(pid)
        lines = api.records(pid, 0, 2).splitlines()
        assert len(lines) == 2
        assert all(decode_envelope(base64.b64decode(x)).signatures == [] for x in lines)
        assert [s for s, _ in store.checkpoints(pid)] == [size]
        payloads = store.record_payloads(pid, size - 1)
        note = parse_note(store.checkpoints(pid)[0][1])
        assert note.signed_by(LEDGER_NOTE_NAME, service.key.public_key)
        assert parse_checkpoint_body(note.body).root == merkle.root(payloads)
        assert len(api.records(pid, 0, None).splitlines()) == size
        assert [s for s, _ in store.checkpoints(pid)] == [size]
    finally:
        service.close()


def _row_counts(store: Store) -> dict[str, int]:
    """Every table of the store -> its rows."""
    tables = sorted(str(name) for (name,) in store.query("SHOW TABLES"))
    assert "statements" in tables and "checkpoints" in tables
    return {t: int(store.query(f'SELECT count(*) FROM "{t}"')[0][0]) for t in tables}


def test_reads_never_write(tmp_path: Path, quiet_logs: None) -> None:
    """A GET never writes: reads of the statement and the bill, of an open placement (no
    statement stored for its head) and of closed ones, leave every table as it was. The
    open one's statement is an unsigned preview, marked so, with the very fields the ledger
    signs when it does issue one (here: an export's ``issue_statement``)."""
    scenario = build_scenario("http-reads", placements=2, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=scenario.cast.ledger.public_key)
    service = LedgerService(
        store,
        scenario.cast.ledger,
        ledger_id="ledger-1",
        local_dir=tmp_path / "spool",
        clock=fixed_clock(LATE_CLOCK_MS),
        close=False,  # the placements stay open: nothing signs a statement for them
    )
    api = LedgerApi(store, service.key, service.metrics)
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        service.run_until_idle()
        open_pid = scenario.placement_ids[0]
        before = _row_counts(store)
        paths = ("statement", "statement.json", "statement.csv", "statement.html?party=buyer")
        for _ in range(3):
            for pid in scenario.placement_ids:
                for path in paths:
                    status, body = _get(f"{server.url}/placements/{pid}/{path}")
                    assert status == 200, (pid, path, body[:200])
        assert _row_counts(store) == before
        preview = json.loads(_get(f"{server.url}/placements/{open_pid}/statement")[1])
        assert preview["envelope"] is None and "unsigned preview" in preview["preview"]
        assert preview["final"] is False
        bill = json.loads(_get(f"{server.url}/placements/{open_pid}/statement.json")[1])
        assert "a preview" in json.dumps(bill)

        issue_statement(store, service.key, open_pid)  # the ledger signs (as an export does)
        assert _row_counts(store)["statements"] == before["statements"] + 1
        signed = api.statement(open_pid)
        assert signed["envelope"] and "preview" not in signed
        assert {k: v for k, v in preview.items() if k not in ("envelope", "preview")} == {
            k: v for k, v in signed.items() if k != "envelope"
        }
    finally:
        server.stop()
        service.close()
