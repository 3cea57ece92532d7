"""`gridledger meter run` as a process: local transport, exit codes, crash point, signals."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w
from support import usage_events

from devtools import builders
from devtools.scenario import write_meter_setup
from proto.envelope import seal
from proto.records import PlacementTerms, UsageEvent
from transport.spool import read_spool

T0 = 1_700_000_000_000
MINUTE_MS = 60_000
ROOT = Path(__file__).resolve().parents[1]


def _terms(cast: builders.Cast, start_ms: int = T0, minutes: int = 60) -> list[PlacementTerms]:
    end = start_ms + minutes * MINUTE_MS
    return [
        builders.make_terms(cast, "c1", [builders.gpu("n1", 0)], start_ms, end),
        builders.make_terms(cast, "c2", [builders.gpu("n1", 1)], start_ms + 7_000, end - 1_000),
    ]


def _run(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gridledger", "meter", "run", "--config", str(config), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _events(spool: Path) -> list[UsageEvent]:
    return usage_events(entry.data for entry in read_spool(spool))


def _setup(
    tmp_path: Path, *, spool_max_bytes: int | None = None, segment_max_bytes: int | None = None
) -> tuple[Path, Path]:
    cast = builders.make_cast("cli")
    config = write_meter_setup(
        tmp_path,
        cast,
        "n1",
        _terms(cast),
        simulate="seed=1",
        spool_max_bytes=spool_max_bytes,
        segment_max_bytes=segment_max_bytes,
    )
    return config, tmp_path / "local" / "node-n1"


def test_local_run_until_then_resume(tmp_path: Path) -> None:
    config, spool = _setup(tmp_path)
    half = _run(config, "--until-ms", str(T0 + 30 * MINUTE_MS))
    assert half.returncode == 0, half.stderr
    first = _events(spool)
    assert len([e for e in first if e.placement_id == "c1"]) == 30
    again = _run(config, "--until-ms", str(T0 + 30 * MINUTE_MS))  # nothing new is due
    assert again.returncode == 0 and _events(spool) == first
    rest = _run(config, "--until-ms", str(T0 + 2 * 60 * MINUTE_MS))
    assert rest.returncode == 0, rest.stderr
    events = _events(spool)
    for placement_id in ("c1", "c2"):
        stream = [e for e in events if e.placement_id == placement_id]
        assert [e.seq for e in stream] == list(range(len(stream)))
        assert all(b.start_ms == a.end_ms for a, b in itertools.pairwise(stream))
    assert '"event": "agent_stopped"' in rest.stderr  # JSON logs when not a terminal


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda c: c.update(colour="red"), "unknown key colour"),
        (lambda c: c.update(transport="kafka"), "needs spool_dir"),
        (lambda c: c.update(interval_s=0), "interval_s"),
        (lambda c: c.update(simulate="seed=x"), "not an integer"),
        (lambda c: c.pop("terms"), "terms must be"),
        (lambda c: c.update(terms=["missing.json"]), "cannot read"),
    ],
)
def test_bad_configuration_exits_2(tmp_path: Path, mutate: object, needle: str) -> None:
    config, _ = _setup(tmp_path)
    data = tomllib.loads(config.read_text())
    mutate(data)  # type: ignore[operator]
    config.write_text(tomli_w.dumps(data))
    done = _run(config, "--until-ms", str(T0 + MINUTE_MS))
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr


def test_until_needs_a_simulated_source(tmp_path: Path) -> None:
    config, _ = _setup(tmp_path)
    data = tomllib.loads(config.read_text())
    data["source"] = "nvml"
    config.write_text(tomli_w.dumps(data))
    done = _run(config, "--until-ms", str(T0 + MINUTE_MS))
    assert done.returncode == 2 and "--until-ms needs a simulated source" in done.stderr


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    config, spool = _setup(tmp_path)
    os.chmod(config.parent / "keys" / "n1.key", 0o644)
    done = _run(config, "--until-ms", str(T0 + 10 * MINUTE_MS))
    assert done.returncode == 2 and "chmod 600" in done.stderr
    assert not list(read_spool(spool))


def test_terms_missing_a_signature_are_refused(tmp_path: Path) -> None:
    config, spool = _setup(tmp_path)
    cast = builders.make_cast("cli")
    partly = seal(_terms(cast)[0], [cast.operator, cast.buyer])  # the desk has not signed
    (config.parent / "terms" / "c1.json").write_bytes(partly + b"\n")
    done = _run(config, "--until-ms", str(T0 + 10 * MINUTE_MS))
    assert done.returncode == 2 and "missing the desk" in done.stderr
    assert not list(read_spool(spool))


def test_spool_full_exits_75_and_keeps_what_it_wrote(tmp_path: Path) -> None:
    config, spool = _setup(tmp_path, spool_max_bytes=8192, segment_max_bytes=4096)
    done = _run(config, "--until-ms", str(T0 + 60 * MINUTE_MS))
    assert done.returncode == 75, done.stderr
    assert '"event": "spool_full"' in done.stderr
    assert '"meter_spool_full": 1.0' in done.stderr
    events = _events(spool)
    assert 0 < len(events) < 119
    assert sum(p.stat().st_size for p in spool.glob("*.seg")) <= 8192
    # With room again, the streams continue where they stopped: nothing was dropped.
    data = tomllib.loads(config.read_text())
    data["spool_max_bytes"] = 1 << 20
    config.write_text(tomli_w.dumps(data))
    more = _run(config, "--until-ms", str(T0 + 60 * MINUTE_MS))
    assert more.returncode == 0, more.stderr
    c1 = [e for e in _events(spool) if e.placement_id == "c1"]
    assert [e.seq for e in c1] == list(range(60))


def test_crash_point_kills_the_agent_and_a_restart_continues(tmp_path: Path) -> None:
    config, spool = _setup(tmp_path)
    crashed = _run(config, "--simulate", "seed=1,crash_after=9", "--until-ms", str(T0 + 3600_000))
    assert crashed.returncode == -signal.SIGKILL
    assert 9 <= len(_events(spool)) <= 10  # a tick emits both streams' events together
    done = _run(config, "--simulate", "seed=1", "--until-ms", str(T0 + 3600_000))
    assert done.returncode == 0, done.stderr
    c1 = [e for e in _events(spool) if e.placement_id == "c1"]
    assert [(e.start_ms - T0) // MINUTE_MS for e in c1] == list(range(60))


def test_wall_clock_run_and_sigterm(tmp_path: Path) -> None:
    cast = builders.make_cast("cli-wall")
    now_ms = time.time_ns() // 1_000_000
    config = write_meter_setup(
        tmp_path, cast, "n1", _terms(cast, now_ms - 1000), simulate="seed=1", interval_s=0.05
    )
    spool = tmp_path / "local" / "node-n1"
    timed = _run(config, "--duration-s", "1.0")
    assert timed.returncode == 0, timed.stderr
    assert len(_events(spool)) >= 10  # ~20 intervals of 50 ms per stream in a second
    proc = subprocess.Popen(
        [sys.executable, "-m", "gridledger", "meter", "run", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        count = len(_events(spool))
        deadline = time.monotonic() + 30
        while len(_events(spool)) < count + 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        # A second agent on the same spool is refused while the first holds it.
        second = _run(config, "--duration-s", "0.1")
        assert second.returncode == 2 and "another writer" in second.stderr
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, stderr
    events = _events(spool)
    assert len(events) >= count + 6
    for placement_id in ("c1", "c2"):
        stream = [e for e in events if e.placement_id == placement_id]
        assert [e.seq for e in stream] == list(range(len(stream)))
        assert all(b.start_ms >= a.end_ms for a, b in itertools.pairwise(stream))
