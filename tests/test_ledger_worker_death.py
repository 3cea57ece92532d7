"""The ledger's signature worker process killed under a running ``gridledger ledger run``.

The ledger (a real process on a real broker, so it has its worker) must stop with exit
code 1 and one ``FAIL:`` line naming the worker, never a traceback and never a hang; a
restart then folds the topic to the same heads and statements as a ledger that never
lost its worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from test_ledger_kafka import heads_and_statements, publish, run_ledger
from test_ledger_kill import kafka_ledger_config, simulation_topic
from test_ledger_scenario import EARLY_CLOCK_MS, build_scenario, ledger_key_file

from ledger.store import Store

START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text(encoding="ascii")
        found += [int(p) for p in text.split()]
    return found


def _worker_of(pid: int, process: subprocess.Popen[bytes], log: Path) -> int:
    """The ledger's signature worker process (``python -m ledger.crypto_worker``)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert process.poll() is None, log.read_text(encoding="utf-8")[-3000:]
        for child in _children(pid):
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"ledger.crypto_worker" in cmdline:
                return child
        assert time.monotonic() < deadline, "no signature worker process appeared"
        time.sleep(0.05)


def test_a_killed_signature_worker_stops_the_ledger_in_one_line_and_a_restart_resumes(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    scenario = build_scenario("wd", placements=3, nodes=2, events=20)
    inputs = scenario.keyed()
    key_file = ledger_key_file(tmp_path / "keys", scenario.cast)
    topic = simulation_topic(kafka_bootstrap, tmp_topic)
    config = kafka_ledger_config(tmp_path, key_file, kafka_bootstrap, topic, EARLY_CLOCK_MS)
    log = tmp_path / "ledger.log"
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
        )
    try:
        worker = _worker_of(process.pid, process, log)
        os.kill(worker, signal.SIGKILL)
        publish(kafka_bootstrap, topic, inputs, EARLY_CLOCK_MS)
        code = process.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    text = log.read_text(encoding="utf-8")
    assert code == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    fails = [line for line in text.splitlines() if line.startswith("FAIL:")]
    assert len(fails) == 1 and "signature worker" in fails[0], text[-3000:]

    # Nothing half-stored: a restart folds everything, as a ledger that never lost it.
    db = tmp_path / "kill.duckdb"  # kafka_ledger_config's store
    run_ledger(db, scenario, kafka_bootstrap, topic, batch_max_records=4, arrival="sender")
    fresh = tmp_path / "fresh.duckdb"
    run_ledger(fresh, scenario, kafka_bootstrap, topic, batch_max_records=64, arrival="sender")
    assert heads_and_statements(db) == heads_and_statements(fresh)
    with Store(db) as store:
        assert store.counts()["records"] > 0
