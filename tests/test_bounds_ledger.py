"""Resource bounds of the ledger service (``ledger/limits.py``).

A batch never holds more than ``batch_max_records`` inputs and a config past
MAX_BATCH_RECORDS is refused; quarantined evidence is cut at MAX_QUARANTINE_BYTES and
its detail at MAX_DETAIL_CHARS (the whole size and hash kept); the HTTP API answers 413
past MAX_HTTP_BODY_BYTES without reading the body and stores nothing, and drops a stalled
client after HTTP_TIMEOUT_S; the idle loop and the close publisher give up after their
named counts with a clear error, losing nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support import ledger_toml
from test_ledger_scenario import (
    EARLY_CLOCK_MS,
    build_scenario,
    chain_heads,
    ledger_key_file,
    local_service,
    publish_scenario_local,
)

from devtools import builders
from gridledger.cli import main as gridledger_main
from ledger import client, service
from ledger import http as ledger_http
from ledger.config import ConfigError, KafkaConfig, config_from_mapping, port_file_for
from ledger.http import LedgerApi, LedgerHttpServer, write_port_file
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.limits import (
    CLOSE_PUBLISH_ATTEMPTS,
    MAX_BATCH_RECORDS,
    MAX_DETAIL_CHARS,
    MAX_HTTP_BODY_BYTES,
    MAX_QUARANTINE_BYTES,
)
from ledger.service import KafkaLedgerService, LedgerService, fixed_clock
from ledger.store import Store
from proto.envelope import open_envelope
from transport.kafka import KafkaSettings

T0_MS = 1_767_225_600_000
HOUR_MS = 3_600_000
WAIT_S = 10.0
READ_TIMEOUT_S = 0.5  # HTTP_TIMEOUT_S of the test server


# ---- batches ----------------------------------------------------------------------------------


def _config(batch: Any) -> dict[str, Any]:
    return {
        "ledger_id": "ledger-1",
        "key_file": "ledger.key",
        "db": "ledger.duckdb",
        "transport": "local",
        "local_dir": "spool",
        "batch_max_records": batch,
    }


@pytest.mark.parametrize(
    ("batch", "ok"),
    [(1, True), (MAX_BATCH_RECORDS, True), (0, False), (MAX_BATCH_RECORDS + 1, False)],
)
def test_batch_max_records_is_one_to_max_batch_records(
    tmp_path: Path, batch: int, ok: bool
) -> None:
    if ok:
        assert config_from_mapping(_config(batch), tmp_path).batch_max_records == batch
    else:
        with pytest.raises(
            ConfigError, match=f"batch_max_records must be an integer in 1..{MAX_BATCH_RECORDS}"
        ):
            config_from_mapping(_config(batch), tmp_path)


def test_a_batch_never_holds_more_than_batch_max_records(tmp_path: Path) -> None:
    # More spools (5) than the batch size (2): the fair share per spool is cut to fit.
    scenario = build_scenario("bounds-batch", placements=2, nodes=2, events=4)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    batch = 2
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=scenario.cast.ledger.public_key)
    ledger = LedgerService(
        store,
        scenario.cast.ledger,
        ledger_id="ledger-1",
        local_dir=tmp_path / "spool",
        # nothing closes (every input is the scenario's), and every event ended before it
        # reached the intake log (SPEC §6.6: none is FUTURE_DATED)
        clock=fixed_clock(EARLY_CLOCK_MS),
        batch_max_records=batch,
    )
    sizes = []
    for _ in range(10 * len(scenario.inputs)):  # bounded: each step takes at least one
        report = ledger.step()
        if report is None:
            break
        sizes.append(report.inputs)
    counts = store.counts()
    ledger.close()
    assert sizes and max(sizes) <= batch
    assert sum(sizes) == len(scenario.inputs)  # every input once, none lost
    assert counts["records"] == len(scenario.inputs)


def test_run_until_idle_gives_up_after_max_passes_and_resumes_losing_nothing(
    tmp_path: Path,
) -> None:
    scenario = build_scenario("bounds-passes", placements=2, nodes=1, events=5)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    ledger = local_service(tmp_path, scenario)  # batches of 7: more than 2 passes of work
    with pytest.raises(RuntimeError, match="did not settle in 2 passes"):
        ledger.run_until_idle(max_passes=2)
    ledger.run_until_idle()
    heads = chain_heads(ledger.store)
    ledger.close()
    # The same inputs in one uninterrupted run reach the same chains.
    (tmp_path / "again").mkdir()
    publish_scenario_local(tmp_path / "again" / "spool", scenario.inputs)
    fresh = local_service(tmp_path / "again", scenario)
    fresh.run_until_idle()
    assert chain_heads(fresh.store) == heads
    fresh.close()


# ---- quarantined evidence ---------------------------------------------------------------------


@pytest.fixture
def ingestor(tmp_path: Path) -> Iterator[Ingestor]:
    cast = builders.make_cast("bounds-ledger")
    store = Store(tmp_path / "q.duckdb", ledger_public_key=cast.ledger.public_key)
    ingest = Ingestor(store, cast.ledger)
    yield ingest
    ingest.close()
    store.close()


def _item(data: bytes, n: int, stream_key: str | None = None) -> Item:
    return Item(data, f"kafka:t:0:{n}", stream_key, "kafka:t:0", str(n + 1))


def test_quarantined_bytes_are_kept_whole_up_to_the_bound_then_cut(ingestor: Ingestor) -> None:
    at_limit = b"x" * MAX_QUARANTINE_BYTES
    past = b"y" * (MAX_QUARANTINE_BYTES + 1)
    report = ingestor.ingest([_item(at_limit, 0), _item(past, 1)])
    assert report.quarantined == 2
    rows = ingestor.store.query(
        "SELECT position, size_bytes, octet_length(envelope), input_hash, envelope[1:4] "
        "FROM quarantine ORDER BY position"
    )
    assert rows == [
        ("kafka:t:0:0", MAX_QUARANTINE_BYTES, MAX_QUARANTINE_BYTES,
         hashlib.sha256(at_limit).hexdigest(), b"xxxx"),
        ("kafka:t:0:1", MAX_QUARANTINE_BYTES + 1, MAX_QUARANTINE_BYTES,
         hashlib.sha256(past).hexdigest(), b"yyyy"),
    ]  # fmt: skip
    assert ingestor.store.offsets() == {"kafka:t:0": "2"}  # both accounted for


def _usage_envelope() -> tuple[str, bytes]:
    cast = builders.make_cast("bounds-ledger")
    terms = builders.make_terms(cast, "p-detail", [builders.gpu("n0", 0)], T0_MS, T0_MS + HOUR_MS)
    writer = builders.StreamWriter(cast.node_key("n0"), terms.placement_id, "n0")
    return terms.placement_id, writer.event(T0_MS, T0_MS + 60_000, [builders.sample(terms.gpus[0])])


def test_quarantine_detail_is_kept_up_to_max_detail_chars(ingestor: Ingestor) -> None:
    # The detail of a stream-key mismatch quotes the key, which the producer chose: a key
    # long enough makes the detail exactly MAX_DETAIL_CHARS, one more character passes it.
    placement_id, envelope = _usage_envelope()

    def detail(key: str) -> str:
        return f"stream key {key!r} differs from placement_id {placement_id!r}"

    fixed = len(detail(""))
    exact_key = "k" * (MAX_DETAIL_CHARS - fixed)
    assert len(detail(exact_key)) == MAX_DETAIL_CHARS
    items = [
        _item(envelope, 0, exact_key),
        _item(envelope, 1, exact_key + "k"),
        _item(envelope, 2, "k" * 100_000),
    ]
    report = ingestor.ingest(items)
    assert report.quarantined == 3
    rows = ingestor.store.query("SELECT reason, detail FROM quarantine ORDER BY position")
    assert [r[0] for r in rows] == ["PLACEMENT_MISMATCH"] * 3
    assert rows[0][1] == detail(exact_key)  # whole at the bound
    assert rows[1][1] == detail(exact_key + "k")[:MAX_DETAIL_CHARS]
    assert [len(r[1]) for r in rows] == [MAX_DETAIL_CHARS] * 3


# ---- the HTTP API --------------------------------------------------------------------------


@pytest.fixture
def api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Store, str]]:
    """A ledger with one placement behind its HTTP API (HTTP_TIMEOUT_S cut to 0.5 s)."""
    monkeypatch.setattr(ledger_http, "HTTP_TIMEOUT_S", READ_TIMEOUT_S)  # read by _handler()
    scenario = build_scenario("bounds-http", placements=1, nodes=1, events=2)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    ledger = local_service(tmp_path, scenario)
    ledger.run_until_idle()
    server = LedgerHttpServer(LedgerApi(ledger.store, ledger.key, ledger.metrics), "127.0.0.1", 0)
    server.start()
    try:
        yield server.url, ledger.store, scenario.placement_ids[0]
    finally:
        server.stop()
        ledger.close()


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as reply:
            return reply.status, {}
    except urllib.error.HTTPError as exc:
        data: dict[str, Any] = json.loads(exc.read())
        return exc.code, data


def _health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=WAIT_S) as reply:
        status: int = reply.status
        return status


def test_a_body_at_the_bound_is_read_one_byte_more_is_413_and_nothing_stored(
    api_server: tuple[str, Store, str],
) -> None:
    url, store, pid = api_server
    cosign = f"{url}/placements/{pid}/checkpoint/cosign"
    before = store.checkpoints(pid)
    # At the bound the body is read and judged: not a note, a 400 with a named reason.
    status, body = _post(cosign, b"a" * MAX_HTTP_BODY_BYTES)
    assert (status, body.get("reason")) == (400, "MALFORMED"), body
    status, body = _post(cosign, b"a" * (MAX_HTTP_BODY_BYTES + 1))
    assert status == 413 and str(MAX_HTTP_BODY_BYTES) in body["error"]
    assert store.checkpoints(pid) == before
    assert _health(url) == 200


def _raw_exchange(url: str, request: bytes) -> tuple[bytes, float]:
    """Send ``request`` on a raw socket; everything the server sends until it closes."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):  # bounded by the socket timeout
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - started


def test_a_declared_oversize_body_is_refused_before_it_is_sent(
    api_server: tuple[str, Store, str],
) -> None:
    url, _, pid = api_server
    head = (
        f"POST /placements/{pid}/checkpoint/cosign HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {10 * MAX_HTTP_BODY_BYTES}\r\n\r\n"
    ).encode()
    reply, elapsed = _raw_exchange(url, head)  # no body follows: the server must not wait
    assert reply.startswith(b"HTTP/1.0 413 ")
    assert elapsed < READ_TIMEOUT_S  # answered at once, not after a read timeout


def test_a_stalled_client_is_dropped_after_the_read_timeout(
    api_server: tuple[str, Store, str],
) -> None:
    url, store, pid = api_server
    before = store.checkpoints(pid)
    # Headers never finished, then a body that never finishes: each connection is closed
    # by the server after HTTP_TIMEOUT_S, and the server keeps serving.
    _, elapsed = _raw_exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert READ_TIMEOUT_S <= elapsed < WAIT_S
    partial = (
        f"POST /placements/{pid}/checkpoint/cosign HTTP/1.1\r\nHost: x\r\n"
        "Content-Length: 100\r\n\r\nonly a few bytes"
    ).encode()
    _, elapsed = _raw_exchange(url, partial)
    assert READ_TIMEOUT_S <= elapsed < WAIT_S
    assert store.checkpoints(pid) == before
    assert _health(url) == 200


class _HangingLedger(BaseHTTPRequestHandler):
    """Answers /health; every other request hangs until the test releases it."""

    release = threading.Event()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.release.wait(WAIT_S)


def test_the_cli_gives_up_on_a_hanging_ledger_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(client, "HTTP_CLIENT_TIMEOUT_S", 0.5)
    cast = builders.make_cast("bounds-client")
    key_file = ledger_key_file(tmp_path / "keys", cast)
    config = ledger_toml(tmp_path / "ledger.toml", key_file)
    hanging = ThreadingHTTPServer(("127.0.0.1", 0), _HangingLedger)
    hanging.daemon_threads = True
    thread = threading.Thread(target=hanging.serve_forever, daemon=True)
    thread.start()
    write_port_file(
        port_file_for(tmp_path / "ledger.duckdb"), "127.0.0.1", hanging.server_address[1]
    )
    try:
        started = time.monotonic()
        code = gridledger_main(["ledger", "statement", "p-1", "--config", str(config)])
        elapsed = time.monotonic() - started
    finally:
        _HangingLedger.release.set()
        hanging.shutdown()
        hanging.server_close()
    assert code != 0
    assert elapsed < WAIT_S
    assert "timed out" in capsys.readouterr().err


# ---- closes published into a stream that does not answer ------------------------------------


def test_close_publishing_gives_up_after_its_attempts_and_republishes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = build_scenario("bounds-close", placements=1, nodes=1, events=2)
    pid = scenario.placement_ids[0]
    terms = scenario.terms[pid]
    store = Store(tmp_path / "k.duckdb", ledger_public_key=scenario.cast.ledger.public_key)
    kafka = KafkaConfig(settings=KafkaSettings(bootstrap="127.0.0.1:9", topic="t"))
    due_ms = terms.window_end_ms + terms.late_grace_ms
    ledger = KafkaLedgerService(store, scenario.cast.ledger, kafka, clock=fixed_clock(due_ms))
    ledger.ingestor.ingest([_item(env, n) for n, (_, _, env) in enumerate(scenario.inputs)])
    attempts: list[list[tuple[str, bytes]]] = []
    broker_up = False

    async def publish(
        settings: KafkaSettings,
        records: list[tuple[str, bytes]],
        *,
        timestamps_ms: list[int] | None = None,
    ) -> None:
        assert timestamps_ms is None  # arrival = "log": the broker's time, not the ledger's
        attempts.append(list(records))
        if not broker_up:
            raise ConnectionError("broker unreachable")

    monkeypatch.setattr(service, "publish_kafka", publish)
    monkeypatch.setattr(service, "CLOSE_PUBLISH_BACKOFF_S", 0.001)
    assert asyncio.run(ledger.close_due()) == 0  # gave up this round
    assert len(attempts) == CLOSE_PUBLISH_ATTEMPTS
    unpublished = store.unpublished_closes()
    assert [p for p, _ in unpublished] == [pid]  # recorded, still to publish
    broker_up = True
    assert asyncio.run(ledger.close_due()) == 1
    assert attempts[-1] == unpublished  # the same signed bytes, not a second close
    assert store.unpublished_closes() == []
    record = open_envelope(unpublished[0][1]).record
    assert getattr(record, "closed_at_ms", None) == due_ms
    ledger.close()
