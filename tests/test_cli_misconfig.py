"""Silent misconfiguration made loud (issue 18): each reproduces one friction of the issue
and checks it is now one line with a documented exit code, never a traceback, and that
nothing is lost or created where it should not be."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from structlog.testing import capture_logs

from devtools import builders
from devtools.scenario import write_meter_setup
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from proto.keys import SigningKey, write_key_pair
from transport.local import publish_local, publisher_source

T0 = 1_767_225_600_000
HOUR = 3_600_000
ROOT = Path(__file__).resolve().parents[1]


def _gridledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gridledger", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a run (a FAIL: line or one structured log line)."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if '"level": "info"' not in line]
    lines = [line for line in lines if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_ledger_warns_naming_both_keys_when_the_terms_name_another_ledger(
    tmp_path: Path,
) -> None:
    cast = builders.make_cast("misconfig")
    terms = builders.make_terms(cast, "pl-other", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    publish_local(
        tmp_path / "local", publisher_source("terms"), [builders.signed_terms(cast, terms)]
    )
    wrong = SigningKey.from_seed_text("ledger-x", "another ledger")
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=wrong.public_key)
    service = LedgerService(
        store, wrong, ledger_id="x", local_dir=tmp_path / "local", clock=fixed_clock(T0)
    )
    try:
        with capture_logs() as logs:
            service.run_until_idle()
    finally:
        service.close()
    rejected = [e for e in logs if e["event"] == "terms_rejected"]
    assert len(rejected) == 1, logs
    entry = rejected[0]
    assert entry["log_level"] == "warning"
    assert entry["reason"] == "TERMS_INVALID" and entry["placement"] == "pl-other"
    assert entry["terms_ledger_key"] == cast.ledger.key_id
    assert entry["this_ledger_key"] == wrong.key_id


def test_ledger_with_a_missing_local_dir_fails_at_start(tmp_path: Path) -> None:
    write_key_pair(SigningKey.generate("ledger-1"), tmp_path / "keys")
    config = tmp_path / "ledger.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "ledger_id": "ledger-1",
                "key_file": "keys/ledger-1.key",
                "db": "data/ledger.duckdb",
                "local_dir": "no-such-dir",
                "http": "off",
            }
        )
    )
    done = _gridledger("ledger", "run", "--config", str(config))
    assert done.returncode == 2
    line = _one_error(done)
    assert line.startswith("FAIL: ") and "no-such-dir does not exist" in line
    assert not (tmp_path / "no-such-dir").exists()


def _meter(tmp_path: Path, **changes: object) -> Path:
    cast = builders.make_cast("misconfig-meter")
    terms = builders.make_terms(cast, "pl-m", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    config = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    data = tomllib.loads(config.read_text())
    data.update(changes)
    config.write_text(tomli_w.dumps(data))
    return config


def test_meter_does_not_create_a_missing_local_dir(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "local"
    config = _meter(tmp_path, local_dir=str(missing))
    done = _gridledger("meter", "run", "--config", str(config), "--until-ms", str(T0 + HOUR))
    assert done.returncode == 2
    assert "does not exist" in _one_error(done)
    assert not (tmp_path / "typo").exists()


def test_meter_with_a_key_the_terms_do_not_name_stops(tmp_path: Path) -> None:
    config = _meter(tmp_path)
    other, _ = write_key_pair(SigningKey.generate("n1-other"), tmp_path / "other")
    data = tomllib.loads(config.read_text())
    config.write_text(tomli_w.dumps({**data, "key_file": str(other)}))
    done = _gridledger("meter", "run", "--config", str(config), "--until-ms", str(T0 + HOUR))
    assert done.returncode == 2
    error = _one_error(done)
    assert error.startswith("FAIL: ") and "the agent cannot start" in error
    assert "key_rebound" in error and "n1" in error
    assert not (tmp_path / "local" / "node-n1").exists()  # nothing was signed
    # A key bound by a NodeKeyBinding: the operator says so, and the agent runs.
    config.write_text(tomli_w.dumps({**data, "key_file": str(other), "key_rebound": True}))
    ok = _gridledger("meter", "run", "--config", str(config), "--until-ms", str(T0 + 5 * 60_000))
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("fault", ["unhealthy=GPU-x@0-60000", "vanish=GPU-x@0", "ecc=GPU-x@0-1"])
def test_simulated_fault_on_a_gpu_not_in_the_terms_is_an_error(tmp_path: Path, fault: str) -> None:
    config = _meter(tmp_path)
    done = _gridledger(
        "meter", "run", "--config", str(config), "--simulate", f"seed=1,{fault}",
        "--until-ms", str(T0 + HOUR),
    )  # fmt: skip
    assert done.returncode == 2
    error = _one_error(done)
    assert error.startswith("FAIL: ") and "GPU-x: no such GPU on node n1" in error
    assert "GPU-n1-0" in error


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_one_log_format_for_a_process(tmp_path: Path, fmt: str) -> None:
    """--log-format, given after the subcommand: every stderr line in that format."""
    config = _meter(tmp_path)
    done = _gridledger(
        "meter", "run", "--config", str(config), "--until-ms", str(T0 + 5 * 60_000),
        "--log-format", fmt,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert any("agent_started" in line for line in lines)
    if fmt == "json":
        assert all(json.loads(line)["level"] for line in lines)
    else:
        assert not any(line.startswith("{") for line in lines)
        assert all("[info" in line or "[warning" in line for line in lines), lines


def test_library_log_lines_are_folded_into_the_same_format(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """aiokafka logs through the standard library: its lines come out as our JSON."""
    import logging

    import structlog

    from gridledger.logs import configure_logging

    configure_logging("json", "info")
    try:
        structlog.get_logger("ledger.test").warning("ours", placement="p1")
        logging.getLogger("aiokafka.conn").error("Unable connect to node with id %s", 1)
        logging.getLogger("aiokafka.consumer").info("chatter below warning is not shown")
        lines = [json.loads(line) for line in capfd.readouterr().err.strip().splitlines()]
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        root.handlers = [h for h in root.handlers if h.get_name() != "gridledger-structlog"]
    assert [(e["event"], e["level"]) for e in lines] == [
        ("ours", "warning"),
        ("Unable connect to node with id 1", "error"),
    ]
    assert lines[1]["logger"] == "aiokafka.conn" and "timestamp" in lines[1]
