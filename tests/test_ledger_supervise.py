"""``gridledger ledger supervise --shards N``: N shard processes from one command.

On the real broker: a 4-partition topic, ``supervise --shards 2``; half of the inputs are
published, shard 1's process is SIGKILLed once it has folded something, the supervisor
restarts it, the rest is published. Every placement is folded by the shard owning its
partition and by no other, and the two shard stores together equal one process over
the same topic (chain heads; records, inputs, quarantined and dropped counts). SIGTERM
stops both shards and the supervisor exits 0. A shard that keeps dying makes the
supervisor stop everything and exit 1 with one line naming it; bad arguments are one
line each, exit 2, before anything starts.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from support import ledger_toml
from test_ledger_kafka import heads_and_statements, publish, run_ledger
from test_ledger_scenario import EARLY_CLOCK_MS, Scenario, build_scenario, ledger_key_file

from devtools.faults import read_topic
from gridledger.cli import main as gridledger_main
from ledger.config import (
    ConfigError,
    LedgerConfig,
    config_from_mapping,
    port_file_for,
    shard_config,
    shard_store,
)
from ledger.store import Store
from transport.kafka import KafkaSettings

PARTITIONS = 4
SHARDS = 2
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05


def _config(tmp: Path, key_file: Path, bootstrap: str, topic: str, **kafka: Any) -> Path:
    # EARLY clock: no close is due, so what each shard folds depends on the inputs alone,
    # not on when it caught up (a close signed before the second half would change it).
    return ledger_toml(
        tmp / "ledger.toml",
        key_file,
        ledger_id="supervised",
        db=tmp / "data" / "ledger.duckdb",
        transport="kafka",
        kafka={"bootstrap": bootstrap, "topic": topic, **kafka},
        batch_max_records=3,
        http="127.0.0.1:0",
        clock_ms=EARLY_CLOCK_MS,
    )


def _supervise(config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gridledger",
                "--log-format",
                "json",
                "ledger",
                "supervise",
                "--shards",
                str(SHARDS),
                "--config",
                str(config),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    """The JSON log lines of event ``name`` (supervisor's and shards' alike)."""
    out = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            out.append(event)
    return out


def _port_file(db: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(port_file_for(db).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _health(db: Path) -> dict[str, Any] | None:
    data = _port_file(db)
    if data is None:
        return None
    try:
        url = f"http://{data['host']}:{data['port']}/health"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, ValueError, KeyError):
        return None
    return body if isinstance(body, dict) else None


def _records(db: Path) -> int:
    return int(((_health(db) or {}).get("counts") or {}).get("records", 0))


def _wait(
    condition: Callable[[], bool], what: str, supervisor: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not condition():
        assert supervisor.poll() is None, f"supervise exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out: {what}: {log.read_text()[-3000:]}"
        time.sleep(POLL_S)


def _counts(db: Path) -> dict[str, int]:
    with Store(db) as store:
        counts = store.counts()
    return {k: counts[k] for k in ("records", "inputs", "quarantine", "dropped")}


def test_supervise_two_shards_kill_nine_one_restarted_equals_one_process(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    scenario: Scenario = build_scenario("supervise", placements=8, nodes=1, events=16)
    keyed = scenario.keyed()
    half = len(keyed) // 2
    publish(kafka_bootstrap, topic, keyed[:half])
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, kafka_bootstrap, topic)
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "ledger.duckdb"
    stores = [shard_store(db, i, SHARDS) for i in range(SHARDS)]
    assert [s.name for s in stores] == ["ledger-s0of2.duckdb", "ledger-s1of2.duckdb"]
    log = tmp_path / "supervise.log"
    supervisor = _supervise(config, log, "--backoff", "0.2")
    try:
        _wait(lambda: _records(stores[1]) > 0, "shard 1 folds something", supervisor, log)
        victim = _port_file(stores[1])
        assert victim is not None
        started = [e for e in _events(log, "shard_started") if e["shard"] == "1/2"]
        assert [e["pid"] for e in started] == [victim["pid"]]
        os.kill(int(victim["pid"]), signal.SIGKILL)
        _wait(
            lambda: len([e for e in _events(log, "shard_started") if e["shard"] == "1/2"]) == 2,
            "shard 1 restarted",
            supervisor,
            log,
        )
        exited = _events(log, "shard_exited")
        assert [(e["shard"], e["pid"], e["code"]) for e in exited] == [
            ("1/2", victim["pid"], -signal.SIGKILL)
        ]
        restarted = [e for e in _events(log, "shard_started") if e["shard"] == "1/2"][-1]
        assert restarted["pid"] != victim["pid"] and restarted["restarts"] == 1
        assert len([e for e in _events(log, "shard_started") if e["shard"] == "0/2"]) == 1

        publish(kafka_bootstrap, topic, keyed[half:])
        # One process over the same topic (the shards publish nothing: no close is due).
        whole = tmp_path / "whole.duckdb"
        run_ledger(whole, scenario, kafka_bootstrap, topic, clock_ms=EARLY_CLOCK_MS)
        want = _counts(whole)
        assert want["records"] > 0
        _wait(
            lambda: sum(_records(s) for s in stores) == want["records"],
            f"both shards fold {want['records']} records",
            supervisor,
            log,
        )
        # Reach a running shard through --shard I/N (its API, found by its port file).
        for i in range(SHARDS):
            out = io.StringIO()
            with redirect_stdout(out):
                code = gridledger_main(
                    ["ledger", "list", "--json", "--config", str(config), "--shard", f"{i}/2"]
                )
            assert code == 0
            assert json.loads(out.getvalue())["placements"]
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=STOP_TIMEOUT_S)
    stopped = _events(log, "shard_stopped")
    assert sorted((e["shard"], e["code"]) for e in stopped) == [("0/2", 0), ("1/2", 0)]
    for store in stores:
        assert not port_file_for(store).exists()  # each shard stopped cleanly

    # Disjoint partition sets: shard i was assigned the partitions p % 2 == i (twice for
    # the restarted shard 1, the same ones).
    assigned = [e["partitions"] for e in _events(log, "kafka_assigned")]
    assert sorted(assigned) == [[0, 2], [1, 3], [1, 3]]

    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    partition_of = {
        m.key.decode(): m.partition for m in read_topic(settings, PARTITIONS) if m.key is not None
    }
    assert set(partition_of.values()) == set(range(PARTITIONS))
    whole_heads, _ = heads_and_statements(whole)
    assert sorted(whole_heads) == sorted(scenario.placement_ids)
    shard_heads = [heads_and_statements(s)[0] for s in stores]
    for i, heads in enumerate(shard_heads):
        assert sorted(heads) == sorted(p for p in whole_heads if partition_of[p] % SHARDS == i)
    assert {**shard_heads[0], **shard_heads[1]} == whole_heads
    # Every input of the topic folded (or quarantined, or dropped) exactly once overall.
    got = [_counts(s) for s in stores]
    assert {k: got[0][k] + got[1][k] for k in want} == want


def test_a_shard_that_keeps_dying_stops_the_supervisor_with_one_line(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(PARTITIONS)
    scenario = build_scenario("supervise-dies", placements=2, nodes=1, events=2)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, kafka_bootstrap, topic)
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "ledger.duckdb"
    log = tmp_path / "supervise.log"
    # Another process (this one) holds shard 1's store: its ledger cannot open it.
    with Store(shard_store(db, 1, SHARDS), ledger_public_key=scenario.cast.ledger.public_key):
        supervisor = _supervise(config, log, "--backoff", "0.05", "--max-restarts", "2")
        try:
            code = supervisor.wait(timeout=READY_TIMEOUT_S)
        finally:
            if supervisor.poll() is None:
                supervisor.kill()
                supervisor.wait(timeout=STOP_TIMEOUT_S)
    assert code == 1
    fails = [line for line in log.read_text().splitlines() if line.startswith("FAIL: shard 1/2 ")]
    assert fails == [log.read_text().splitlines()[-1]], log.read_text()[-3000:]
    assert "after 2 restarts" in fails[0] and "stopped every shard" in fails[0]
    exits = [e for e in _events(log, "shard_exited") if e["shard"] == "1/2"]
    assert len(exits) == 3 and all(e["code"] == 2 for e in exits)
    # Shard 0 was stopped by the supervisor (SIGTERM, clean exit), not left running.
    assert [(e["shard"], e["code"]) for e in _events(log, "shard_stopped")] == [("0/2", 0)]
    zero = _port_file(shard_store(db, 0, SHARDS))
    assert zero is None


def test_sigint_is_forwarded_and_both_shards_stop_cleanly(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    """Ctrl-C reaches the supervisor alone (each shard has its own process group); it
    forwards the stop, waits, and exits 0 once both shards stopped cleanly."""
    topic = tmp_topic(PARTITIONS)
    scenario = build_scenario("supervise-int", placements=1, nodes=1, events=1)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, kafka_bootstrap, topic)
    (tmp_path / "data").mkdir()
    stores = [shard_store(tmp_path / "data" / "ledger.duckdb", i, SHARDS) for i in range(SHARDS)]
    log = tmp_path / "supervise.log"
    supervisor = _supervise(config, log)
    try:
        _wait(lambda: all(_health(s) is not None for s in stores), "both APIs", supervisor, log)
        pids = [int((_port_file(s) or {})["pid"]) for s in stores]
        assert len(set(pids)) == SHARDS and supervisor.pid not in pids
        assert all(os.getpgid(pid) == pid for pid in pids)  # own groups: Ctrl-C skips them
        supervisor.send_signal(signal.SIGINT)
        assert supervisor.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=STOP_TIMEOUT_S)
    stopped = sorted((e["shard"], e["code"]) for e in _events(log, "shard_stopped"))
    assert stopped == [("0/2", 0), ("1/2", 0)]
    assert [e["signal"] for e in _events(log, "supervise_stopping")] == ["SIGINT"]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_no_shard_outlives_a_killed_supervisor(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    """kill -9 of the supervisor: each shard gets SIGTERM from the kernel (parent-death
    signal) and stops cleanly (its port file removed), so none keeps its store locked."""
    topic = tmp_topic(PARTITIONS)
    scenario = build_scenario("supervise-orphan", placements=1, nodes=1, events=1)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, kafka_bootstrap, topic)
    (tmp_path / "data").mkdir()
    stores = [shard_store(tmp_path / "data" / "ledger.duckdb", i, SHARDS) for i in range(SHARDS)]
    log = tmp_path / "supervise.log"
    supervisor = _supervise(config, log)
    try:
        _wait(lambda: all(_health(s) is not None for s in stores), "both APIs", supervisor, log)
        pids = [int((_port_file(s) or {})["pid"]) for s in stores]
    finally:
        supervisor.kill()
        supervisor.wait(timeout=STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        while not all(_gone(pid) for pid in pids):
            assert time.monotonic() < deadline, (
                f"a shard outlived its supervisor: {log.read_text()}"
            )
            time.sleep(POLL_S)
    finally:
        for pid in pids:  # never leave an orphan behind, whatever the outcome
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert not any(port_file_for(s).exists() for s in stores)  # each stopped cleanly
    for store in stores:  # the stores are free: a new writer opens each
        Store(store).close()


def _gone(pid: int) -> bool:
    """The process has exited (no entry, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.mark.parametrize(
    ("argv", "kafka", "expect"),
    [
        (["--shards", "0"], {}, "--shards 0: give 1 to 64 shards"),
        (["--shards", "5"], {}, "has only 4 partition(s)"),
        (["--shards", "65"], {}, "--shards 65: give 1 to 64 shards"),
        (["--shards", "2"], {"shard": 1, "shards": 2}, "shard/shards is set (1/2)"),
        (["--shards", "2"], {"partitions": [0, 1]}, "[kafka] partitions is set"),
        (["--shards", "2", "--backoff", "-1"], {}, "--backoff >= 0"),
    ],
)
def test_supervise_refuses_bad_arguments_in_one_line(
    argv: list[str],
    kafka: dict[str, Any],
    expect: str,
    tmp_path: Path,
    kafka_bootstrap: str,
    tmp_topic: Callable[..., str],
) -> None:
    topic = tmp_topic(PARTITIONS)
    scenario = build_scenario("supervise-args", placements=1, nodes=1, events=1)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, kafka_bootstrap, topic, **kafka)
    err = io.StringIO()
    with redirect_stderr(err):
        code = gridledger_main(
            ["--log-format", "json", "ledger", "supervise", "--config", str(config), *argv]
        )
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("FAIL: "), lines
    assert expect in lines[0]
    assert not list(tmp_path.glob("data*"))  # nothing started, no store created


def test_supervise_refuses_a_missing_topic_and_a_local_ledger(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    scenario = build_scenario("supervise-topic", placements=1, nodes=1, events=1)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    missing = _config(tmp_path, key_file, kafka_bootstrap, tmp_topic(1, create=False))
    local = ledger_toml(tmp_path / "local.toml", key_file, db=tmp_path / "l.duckdb")
    for config, expect in ((missing, "does not exist"), (local, "need transport = 'kafka'")):
        err = io.StringIO()
        with redirect_stderr(err):
            argv = ["ledger", "supervise", "--shards", "2", "--config", str(config)]
            code = gridledger_main(["--log-format", "json", *argv])
        lines = err.getvalue().splitlines()
        assert code == 2 and len(lines) == 1 and expect in lines[0], lines


def test_shard_option_names_the_shards_store_and_refuses_nonsense(tmp_path: Path) -> None:
    scenario = build_scenario("supervise-shard-opt", placements=1, nodes=1, events=1)
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    config = _config(tmp_path, key_file, "127.0.0.1:1", "t")
    for shard, expect in (
        ("1/2", "no ledger store at " + str(tmp_path / "data" / "ledger-s1of2.duckdb")),
        ("2/2", "--shard '2/2': need 0 <= I < N"),
        ("0/65", "--shard '0/65': need 0 <= I < N <= 64"),
        ("x", "--shard 'x': expected I/N"),
    ):
        err = io.StringIO()
        with redirect_stderr(err):
            code = gridledger_main(["ledger", "list", "--config", str(config), "--shard", shard])
        lines = err.getvalue().splitlines()
        assert code == 2 and len(lines) == 1 and expect in lines[0], lines


def test_bad_shard_arguments_are_named_before_any_file_is_read(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    for argv, expect in (
        (["ledger", "list", "--config", str(missing), "--shard", "3/2"], "--shard '3/2'"),
        (["ledger", "supervise", "--config", str(missing), "--shards", "0"], "--shards 0"),
    ):
        err = io.StringIO()
        with redirect_stderr(err):
            code = gridledger_main(argv)
        lines = err.getvalue().splitlines()
        assert code == 2 and len(lines) == 1 and expect in lines[0], lines


def test_each_shard_serves_on_its_port_plus_its_index(tmp_path: Path) -> None:
    def config(http: str, ops_http: str) -> LedgerConfig:
        kafka = {"bootstrap": "127.0.0.1:1", "topic": "t"}
        data = {"ledger_id": "l", "key_file": "k.key", "db": "d.duckdb", "transport": "kafka"}
        return config_from_mapping(
            {**data, "kafka": kafka, "http": http, "ops_http": ops_http}, tmp_path
        )

    shard = shard_config(config("127.0.0.1:8080", "0.0.0.0:9090"), 2, 3)
    assert (shard.http, shard.ops_http) == (("127.0.0.1", 8082), ("0.0.0.0", 9092))
    shard = shard_config(config("127.0.0.1:0", "off"), 2, 3)  # any free port; none
    assert (shard.http, shard.ops_http) == (("127.0.0.1", 0), None)
    for http, ops_http, expect in (
        ("127.0.0.1:65534", "off", "http port 65534 + 2 shards passes 65535"),
        ("127.0.0.1:0", "127.0.0.1:65534", "ops_http port 65534 + 2 shards passes 65535"),
    ):
        with pytest.raises(ConfigError, match=re.escape(expect)):
            shard_config(config(http, ops_http), 0, 3)
    assert shard_config(config("127.0.0.1:65533", "off"), 2, 3).http == ("127.0.0.1", 65535)
