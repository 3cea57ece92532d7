"""Ledger shards as separate hosts: processes with their own data directory and HTTP port.

Two ``gridledger ledger run`` processes own the even and the odd partitions of a
4-partition topic (``shard``/``shards`` in ledger.toml); each has its own DuckDB file in
its own data directory and its own HTTP API. Shard 1 is SIGKILLed once it has folded
something, its whole data directory is deleted (the host is lost), and a third process
with a fresh directory and another port takes its partitions over, replaying them from
offset 0. Then:

* the two live shards together equal one process over the same stream: chain heads and
  final statements byte for byte, disjoint placements;
* the rebuilt shard reached the identical heads of the lost one's partitions;
* the operator's and the buyer's witnesses cosign every placement at its own shard, and
  ``gridledger verify DIR`` over the union of both shards' exports exits 0 (final), with
  a reconciliation per party whose sums equal the single process's statements.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import ledger_toml
from test_ledger_kafka import heads_and_statements, publish, run_ledger
from test_ledger_scenario import LATE_CLOCK_MS, build_scenario, ledger_key_file

from devtools import builders
from devtools.faults import read_topic
from ledger.config import port_file_for
from proto.envelope import open_envelope
from proto.httpsig import sign_url
from proto.keys import SigningKey, write_key_pair
from proto.records import Statement
from proto.trust import dump_trust
from transport.kafka import KafkaSettings

PARTITIONS = 4
SHARDS = 2
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.05


@dataclass
class _Shard:
    """One ledger process: its config, data directory, log and process."""

    name: str
    config: Path
    db: Path
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    partitions: list[int] = field(default_factory=list)
    key: SigningKey | None = None  # signs API requests (SPEC §13): the ledger's own key

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def url(self) -> str | None:
        """The HTTP API's address from the port file, once it is written."""
        try:
            data = json.loads(port_file_for(self.db).read_text())
        except (OSError, ValueError):
            return None
        return f"http://{data['host']}:{data['port']}"

    def get(self, path: str) -> Any:
        """GET a JSON resource of the running ledger; None when it is not there yet."""
        url = self.url()
        if url is None:
            return None
        request = urllib.request.Request(url + path)
        if self.key is not None:
            for name, value in sign_url(self.key, "GET", url + path, b"", int(time.time())).items():
                request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, ValueError):
            return None

    def alive(self) -> None:
        assert self.popen is not None and self.popen.poll() is None, (
            f"{self.name} exited: {self.log.read_text()[-3000:]}"
        )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.popen is not None
        self.popen.send_signal(sig)
        code = self.popen.wait(timeout=STOP_TIMEOUT_S)
        self.popen = None
        return code


def _wait(condition: Callable[[], bool], what: str, shards: list[_Shard]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not condition():
        for shard in shards:
            shard.alive()
        assert time.monotonic() < deadline, f"timed out after {READY_TIMEOUT_S:.0f} s: {what}"
        time.sleep(POLL_S)


def test_shard_processes_equal_one_and_a_lost_shard_is_rebuilt_elsewhere(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    scenario = build_scenario("hosts", placements=8, nodes=1, events=12)
    cast = scenario.cast
    publish(kafka_bootstrap, topic, scenario.keyed())
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    partition_of = {
        m.key.decode(): m.partition for m in read_topic(settings, PARTITIONS) if m.key is not None
    }
    assert set(partition_of.values()) == set(range(PARTITIONS)), partition_of
    owner = {pid: p % SHARDS for pid, p in partition_of.items()}
    key_file = ledger_key_file(tmp_path / "keys", cast)

    def shard(name: str, number: int) -> _Shard:
        host = tmp_path / name  # a host of its own: config, data directory, log
        (host / "data").mkdir(parents=True)
        config = ledger_toml(
            host / "ledger.toml",
            key_file,
            ledger_id=name,
            db=host / "data" / "ledger.duckdb",
            transport="kafka",
            kafka={"bootstrap": kafka_bootstrap, "topic": topic, "shard": number, "shards": 2},
            batch_max_records=5,
            http="127.0.0.1:0",
            clock_ms=LATE_CLOCK_MS,
        )
        db = host / "data" / "ledger.duckdb"
        return _Shard(name, config, db, host / "ledger.log", key=cast.ledger)

    def final_at(ledger: _Shard, placements: list[str]) -> bool:
        for pid in placements:
            body = ledger.get(f"/placements/{pid}/statement")
            if body is None or not body.get("final"):
                return False
        return True

    even, odd = shard("shard-0", 0), shard("shard-1", 1)
    live: list[_Shard] = []
    try:
        for ledger in (even, odd):
            ledger.start()
            live.append(ledger)
        # Shard 1 dies once it has folded something; its host (data directory) is lost.
        _wait(
            lambda: (odd.get("/health") or {}).get("counts", {}).get("records", 0) > 0,
            "shard 1 to fold something",
            live,
        )
        assert odd.stop(signal.SIGKILL) == -signal.SIGKILL
        live.remove(odd)
        shutil.rmtree(odd.db.parent)
        # A third process, elsewhere, takes shard 1's partitions over from offset 0.
        rebuilt = shard("shard-1-rebuilt", 1)
        rebuilt.start()
        live.append(rebuilt)
        mine = {0: [p for p in owner if owner[p] == 0], 1: [p for p in owner if owner[p] == 1]}
        _wait(
            lambda: final_at(even, mine[0]) and final_at(rebuilt, mine[1]),
            "every placement final at its shard",
            live,
        )
        urls = {even.url(), rebuilt.url()}
        assert len(urls) == 2 and None not in urls  # two HTTP APIs, two ports
        assert _assigned(rebuilt.log) == [1, 3]
        assert _assigned(even.log) == [0, 2]

        # The parties' witnesses cosign at each shard; the desk collects both shards'
        # exports into one directory.
        union = tmp_path / "union"
        union.mkdir()
        witness_dir = tmp_path / "witness"
        for party in (cast.operator, cast.buyer):
            write_key_pair(party, witness_dir / "keys")
        from gridledger.cli import main as gridledger_main
        from witness.runner import EXIT_OK, witness_once

        for pid in scenario.placement_ids:
            at = even if owner[pid] == 0 else rebuilt
            terms_file = witness_dir / f"{pid}.terms.signed.json"
            terms_file.write_bytes(builders.signed_terms(cast, scenario.terms[pid]))
            for role, key in (("operator", cast.operator), ("buyer", cast.buyer)):
                result = witness_once(
                    ledger_url=str(at.url()),
                    terms_path=terms_file,
                    key_path=witness_dir / "keys" / f"{key.name}.key",
                    state_dir=witness_dir / role,
                    now_s=int(time.time()),
                )
                assert result.code == EXIT_OK, result.line
            out = union / f"{pid}.duckdb"
            with redirect_stdout(io.StringIO()):
                code = gridledger_main(
                    ["ledger", "export", pid, "--config", str(at.config), "--out", str(out)]
                )
            assert code == 0 and out.is_file()
        for ledger in list(live):
            assert ledger.stop() == 0, ledger.log.read_text()[-3000:]
            live.remove(ledger)
    finally:
        for ledger in live:
            if ledger.popen is not None and ledger.popen.poll() is None:
                ledger.stop(signal.SIGKILL)

    # One process over the same stream (closes included: the shards published them).
    whole = tmp_path / "whole.duckdb"
    report = run_ledger(whole, scenario, kafka_bootstrap, topic, batch_max_records=50)
    assert report.closes_published == 0
    whole_heads, whole_statements = heads_and_statements(whole)
    assert sorted(whole_heads) == sorted(scenario.placement_ids)
    even_heads, even_statements = heads_and_statements(even.db)
    rebuilt_heads, rebuilt_statements = heads_and_statements(rebuilt.db)
    assert sorted(even_heads) == sorted(mine[0]) and sorted(rebuilt_heads) == sorted(mine[1])
    assert {**even_heads, **rebuilt_heads} == whole_heads
    assert {**even_statements, **rebuilt_statements} == whole_statements

    # verify DIR over the union of both shards' exports: final, and reconciled per party.
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(cast.trust()))
    from verifier.cli import main as verify_main

    printed = io.StringIO()
    with redirect_stdout(printed):
        code = verify_main([str(union), "--trust", str(trust), "--json"])
    assert code == 0, printed.getvalue()[-3000:]
    rec = json.loads(printed.getvalue())["reconciliation"]
    assert len(rec["verified"]) == len(scenario.placement_ids) and not rec["excluded"]
    assert rec["reconciled"] is True
    statements = [open_envelope(e).record for e in whole_statements.values()]
    assert all(isinstance(s, Statement) for s in statements)
    for role, column in (
        ("buyer", "buyer_owes_minor"),
        ("operator", "operator_receives_minor"),
        ("desk", "desk_receives_minor"),
    ):
        lines = [line for line in rec["parties"] if line["role"] == role]
        assert len(lines) == 1 and lines[0]["placements"] == len(statements)
        assert lines[0]["final_placements"] == len(statements)
        want = sum(getattr(s.totals, column) for s in statements if isinstance(s, Statement))
        assert lines[0]["amount_minor"] == want > 0, (role, lines[0], want)


def test_a_rebuilding_shard_signs_no_close_before_it_has_read_its_partitions(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    """A shard replaying from offset 0 with a clock past the close must not sign a close
    (with its own closed_at_ms) while its predecessor's is still ahead in the partition:
    that second close would be chained after the first (AFTER_CLOSE) and the rebuilt
    heads would differ. ``close_when_caught_up`` waits for the end offsets."""
    import asyncio

    from ledger.config import KafkaConfig
    from ledger.service import KafkaLedgerService, fixed_clock
    from ledger.store import Store

    topic = tmp_topic(1)
    scenario = build_scenario("rebuild-close", placements=1, nodes=1, events=6)
    (pid,) = scenario.placement_ids
    publish(kafka_bootstrap, topic, scenario.keyed())
    first = tmp_path / "first.duckdb"
    assert run_ledger(first, scenario, kafka_bootstrap, topic).closes_published == 1
    later_ms = LATE_CLOCK_MS + 3_600_000  # a real clock has moved on since

    async def rebuild() -> tuple[int, int]:
        store = Store(tmp_path / "rebuilt.duckdb", ledger_public_key=cast.ledger.public_key)
        kafka = KafkaConfig(settings=KafkaSettings(bootstrap=kafka_bootstrap, topic=topic))
        service = KafkaLedgerService(
            store, cast.ledger, kafka, clock=fixed_clock(later_ms), batch_max_records=1
        )
        await service.start()
        try:
            folded = 0
            deadline = time.monotonic() + READY_TIMEOUT_S
            while folded < 3:  # terms and two usage events: open, and due to close
                assert time.monotonic() < deadline, "the rebuild read nothing"
                report = await service.step(200)
                folded += 0 if report is None else report.inputs
            due = service.ingestor.fold.close_due_ms(pid)
            assert due is not None and due <= later_ms  # due; its close lies further on
            early = await service.close_when_caught_up()
            run = await service.run_until(deadline_s=READY_TIMEOUT_S, idle_poll_ms=100)
            return early, run.closes_published
        finally:
            await service.stop()
            service.close()

    cast = scenario.cast
    early, later = asyncio.run(rebuild())
    assert (early, later) == (0, 0)
    assert heads_and_statements(tmp_path / "rebuilt.duckdb") == heads_and_statements(first)


def _assigned(log: Path) -> list[int] | None:
    """The partitions a ledger process logged as assigned (its JSON log lines)."""
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line of another format (a JVM or library line)
        if isinstance(event, dict) and event.get("event") == "kafka_assigned":
            return list(event["partitions"])
    return None
