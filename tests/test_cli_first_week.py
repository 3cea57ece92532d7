"""The rough edges of a first week, each tried with the real command: one line naming the
option or file, the fix suggested, a documented non-zero exit, nothing accepted lost."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

from devtools import builders
from devtools.scenario import write_meter_setup
from proto.envelope import decode_envelope, encode_envelope
from proto.keys import SigningKey, write_key_pair

T0 = 1_767_225_600_000
HOUR = 3_600_000
ROOT = Path(__file__).resolve().parents[1]
GRIDLEDGER = Path(sys.executable).with_name("gridledger")


def _gridledger(
    *args: str, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRIDLEDGER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def _fail_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The FAIL: lines of a run, after checking there is no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    both = done.stderr.splitlines() + done.stdout.splitlines()  # the verifier reports on stdout
    return [line for line in both if line.startswith("FAIL: ")]


def _one_fail(done: subprocess.CompletedProcess[str]) -> str:
    lines = _fail_lines(done)
    assert len(lines) == 1, done.stderr
    return lines[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- 1. ledger run with its HTTP port taken ------------------------------------------------


def test_ledger_run_with_its_http_port_taken_is_one_line(tmp_path: Path) -> None:
    write_key_pair(SigningKey.generate("ledger-1"), tmp_path / "keys")
    (tmp_path / "local").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "ledger.toml"
        config.write_text(
            tomli_w.dumps(
                {
                    "ledger_id": "ledger-1",
                    "key_file": "keys/ledger-1.key",
                    "db": "ledger.duckdb",
                    "local_dir": "local",
                    "http": f"127.0.0.1:{port}",
                }
            )
        )
        done = _gridledger("ledger", "run", "--config", str(config))
    assert done.returncode == 2, done.stderr
    line = _one_fail(done)
    assert f'http = "127.0.0.1:{port}"' in line and str(config) in line
    assert "already in use" in line and '"127.0.0.1:0"' in line


# ---- 4. meter run: config errors as FAIL lines; a signal is heard -----------------------------


def _meter(tmp_path: Path, **changes: object) -> Path:
    cast = builders.make_cast("first-week-meter")
    terms = builders.make_terms(cast, "pl-m", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    config = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    data = tomllib.loads(config.read_text())
    data.update(changes)
    config.write_text(tomli_w.dumps(data))
    return config


def test_meter_config_errors_are_fail_lines(tmp_path: Path) -> None:
    config = _meter(tmp_path, interval_sec=60)
    done = _gridledger("meter", "run", "--config", str(config), "--until-ms", str(T0 + HOUR))
    assert done.returncode == 2
    line = _one_fail(done)
    assert "interval_sec" in line and "did you mean interval_s" in line
    assert not done.stderr.lstrip().startswith("{"), done.stderr


def test_meter_that_cannot_start_says_so_in_one_fail_line(tmp_path: Path) -> None:
    config = _meter(tmp_path)
    other, _ = write_key_pair(SigningKey.generate("n1-other"), tmp_path / "other")
    data = tomllib.loads(config.read_text())
    config.write_text(tomli_w.dumps({**data, "key_file": str(other)}))
    done = _gridledger("meter", "run", "--config", str(config), "--until-ms", str(T0 + HOUR))
    assert done.returncode == 2
    line = _one_fail(done)
    assert str(config) in line and "key_rebound" in line
    assert not (tmp_path / "local" / "node-n1").exists()  # nothing was signed


def test_meter_with_kafka_down_stops_on_sigterm_and_says_so(tmp_path: Path) -> None:
    """A running agent whose broker is down: SIGTERM stops it within the signal's drain
    bound (not the minute-long drain of a clean end), logged; what was signed stays in the
    spool for the next start."""
    from meter.limits import SIGNAL_DRAIN_TIMEOUT_S

    cast = builders.make_cast("first-week-signal")
    now = int(time.time() * 1000)
    terms = builders.make_terms(cast, "pl-s", [builders.gpu("n1", 0)], now - 60_000, now + HOUR)
    config = write_meter_setup(
        tmp_path,
        cast,
        "n1",
        [terms],
        transport="kafka",
        interval_s=1,
        kafka={"bootstrap": f"127.0.0.1:{_free_port()}"},
        simulate="seed=1",
    )
    proc = subprocess.Popen(
        [str(GRIDLEDGER), "meter", "run", "--config", str(config), "--log-format", "json"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:  # bounded: the process ends or the test's timeout fires
            if "ship_failed" in line:  # running, and the broker is not there
                assert "no Kafka broker answered at 127.0.0.1:" in line, line  # (item 12)
                break
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=SIGNAL_DRAIN_TIMEOUT_S + 20)
        took_s = time.monotonic() - sent
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 75, rest
    assert took_s < SIGNAL_DRAIN_TIMEOUT_S + 15, took_s
    events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    asked = [e for e in events if e["event"] == "stop_requested"]
    assert len(asked) == 1 and asked[0]["signal"] == "SIGTERM", rest
    assert not [e for e in events if e.get("logger", "").startswith("aiokafka")], rest
    left = [e for e in events if e["event"] == "spool_not_drained"]
    assert len(left) == 1 and "next start" in left[0]["kept"], rest


# ---- 5. terms publish: a missing topic, missing signatures by party ----------------------------


def _signed_terms(tmp_path: Path, *, drop_desk: bool = False) -> tuple[Path, builders.Cast]:
    cast = builders.make_cast("first-week")
    terms = builders.make_terms(cast, "pl-fw", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    raw = builders.signed_terms(cast, terms)
    if drop_desk:
        envelope = decode_envelope(raw)
        kept = tuple(s for s in envelope.signatures if s.keyid != cast.desk.key_id)
        raw = encode_envelope(type(envelope)(payload=envelope.payload, signatures=kept))
    path = tmp_path / "terms.signed.json"
    path.write_bytes(raw)
    return path, cast


def test_terms_publish_names_a_missing_signature_by_party(tmp_path: Path) -> None:
    path, cast = _signed_terms(tmp_path, drop_desk=True)
    (tmp_path / "local").mkdir()
    done = _gridledger("terms", "publish", str(path), "--local-dir", str(tmp_path / "local"))
    assert done.returncode == 1
    line = _one_fail(done)
    assert f"missing the desk ({cast.desk.name}, key {cast.desk.key_id})" in line, line
    assert "gridledger terms sign" in line
    assert list((tmp_path / "local").iterdir()) == []  # nothing published


def test_terms_publish_to_a_topic_that_does_not_exist(tmp_path: Path, kafka_bootstrap: str) -> None:
    path, _ = _signed_terms(tmp_path)
    started = time.monotonic()
    done = _gridledger(
        "terms", "publish", str(path), "--kafka", kafka_bootstrap, "--topic", "gridledger.recrods"
    )
    assert time.monotonic() - started < 25
    assert done.returncode == 2, done.stderr
    line = _one_fail(done)
    assert "no topic 'gridledger.recrods' (--topic)" in line and "gridledger.records" in line


# ---- 6. verify: a trust file of other parties; a ledger's store --------------------------------


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo run (local transport, a few seconds): its export, store and trust file."""
    workdir = tmp_path_factory.mktemp("demo") / "demo"
    done = _gridledger("demo", "--workdir", str(workdir), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (workdir.parent / "demo.stdout").write_text(done.stdout)
    (workdir.parent / "demo.stderr").write_text(done.stderr)
    return workdir


def test_verify_with_a_trust_file_pinning_none_of_the_keys(demo_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    pubs = {}
    for role in ("operator", "buyer", "desk", "ledger"):
        _, pub = write_key_pair(SigningKey.generate(f"other-{role}"), keys)
        pubs[role] = pub
    trust = tmp_path / "other-trust.json"
    made = _gridledger(
        "trust", "init", *(x for r, p in pubs.items() for x in (f"--{r}", str(p))),
        "--out", str(trust),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    export = demo_dir / "exports" / "pl-demo-0001.duckdb"
    done = _gridledger("verify", str(export), "--trust", str(trust))
    assert done.returncode == 1
    head = done.stdout.splitlines()[0]
    assert head.startswith("FAIL: ") and "pins none of this placement's keys" in head
    assert "--trust" in head and "gridledger trust init" in head


def test_verify_of_a_ledger_store_says_export_it_first(demo_dir: Path) -> None:
    done = _gridledger(
        "verify", str(demo_dir / "ledger.duckdb"), "--trust", str(demo_dir / "trust.json")
    )
    assert done.returncode == 2
    line = _one_fail(done)
    assert "ledger.duckdb" in line and "a ledger's store, not an export" in line
    assert "gridledger ledger export PLACEMENT --out FILE.duckdb" in line


# ---- 12. Kafka errors in words, one line per attempt ---------------------------------------


def test_ledger_with_kafka_down_says_so_once_per_attempt_in_words(tmp_path: Path) -> None:
    write_key_pair(SigningKey.generate("ledger-1"), tmp_path / "keys")
    bootstrap = f"127.0.0.1:{_free_port()}"
    config = tmp_path / "ledger.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "ledger_id": "ledger-1",
                "key_file": "keys/ledger-1.key",
                "db": "ledger.duckdb",
                "transport": "kafka",
                "http": "off",
                "kafka": {
                    "bootstrap": bootstrap,
                    "start_backoff_initial_s": 0.01,
                    "start_backoff_max_s": 0.01,
                },
            }
        )
    )
    done = _gridledger("ledger", "run", "--config", str(config), "--log-format", "json")
    assert done.returncode == 75, done.stderr
    line = _one_fail(done)
    assert f"no Kafka broker answered at {bootstrap}" in line, line
    events = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    attempts = [e for e in events if e["event"] == "kafka_unavailable"]
    assert len(attempts) == 10, done.stderr  # START_ATTEMPTS, one line each
    words = f"no Kafka broker answered at {bootstrap} (not running, another address, or its"
    assert all(e["error"].startswith(words) for e in attempts), attempts
    assert not [e for e in events if e.get("logger", "").startswith("aiokafka")], done.stderr
    assert "AddressFamily" not in done.stderr and "KafkaConnectionError" not in done.stderr


# ---- 3. the buyer's --known: times from its own receipt log, never a file's mtime ------------


def test_witness_known_needs_receipt_times_and_keep_records_them(
    demo_dir: Path, tmp_path: Path
) -> None:
    received = tmp_path / "received"
    received.mkdir()
    copied = received / "terms.signed.json"
    copied.write_bytes((demo_dir / "terms.signed.json").read_bytes())  # cp, as the user did
    witness = (
        "witness", "run", "--ledger", f"http://127.0.0.1:{_free_port()}",
        "--terms", str(demo_dir / "terms.signed.json"),
        "--key", str(demo_dir / "keys" / "inferco-batch.key"),
        "--state", str(tmp_path / "state"), "--known", str(received),
    )  # fmt: skip
    done = _gridledger(*witness)
    assert done.returncode == 2, done.stderr
    line = _one_fail(done)
    assert str(copied) in line and "DELIVERED.jsonl" in line
    assert f"gridledger witness keep {copied} --known {received}" in line
    # The party says when it received it; the witness then goes on (to a ledger that is
    # not there: 75), the known input accepted.
    at_ms = 1_796_083_100_000
    kept = _gridledger("witness", "keep", str(copied), "--known", str(received),
                       "--received-ms", str(at_ms))  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == f"OK: kept {copied}, received 2026-11-30T23:58:20Z"
    log = [json.loads(x) for x in (received / "DELIVERED.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["delivered_at_ms"]) for e in log] == [("terms", at_ms)]
    again = _gridledger(*witness)
    assert again.returncode == 75, again.stderr
    assert "did not answer" in _one_fail(again)


def test_witness_keep_never_replaces_a_kept_input(demo_dir: Path, tmp_path: Path) -> None:
    received = tmp_path / "received"
    received.mkdir()
    (received / "terms.signed.json").write_text("something else\n")
    done = _gridledger(
        "witness", "keep", str(demo_dir / "terms.signed.json"), "--known", str(received)
    )
    assert done.returncode == 2
    assert "already holds another input" in _one_fail(done)
    assert (received / "terms.signed.json").read_text() == "something else\n"
    assert not (received / "DELIVERED.jsonl").exists()


# ---- 8. mid-window statements; a meter or a check after the window ---------------------------


def test_a_statement_mid_window_does_not_judge_availability(tmp_path: Path) -> None:
    from ledger.service import LedgerService, fixed_clock
    from ledger.store import Store
    from transport.local import publish_local, publisher_source

    cast = builders.make_cast("first-week-mid")
    terms = builders.make_terms(cast, "pl-mid", [builders.gpu("n1", 0)], T0, T0 + HOUR)
    meter = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    ran = _gridledger("meter", "run", "--config", str(meter), "--until-ms", str(T0 + 90_000))
    assert ran.returncode == 0, ran.stderr
    local = tmp_path / "local"
    publish_local(local, publisher_source("terms"), [builders.signed_terms(cast, terms)])
    write_key_pair(cast.ledger, tmp_path / "keys")
    db = tmp_path / "ledger.duckdb"
    store = Store(db, ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="l1", local_dir=local, clock=fixed_clock(T0 + 120_000)
    )
    try:
        service.run_until_idle()
    finally:
        service.close()
    config = tmp_path / "ledger.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "ledger_id": "l1",
                "key_file": f"keys/{cast.ledger.name}.key",
                "db": "ledger.duckdb",
                "local_dir": "local",
                "http": "off",
            }
        )
    )
    done = _gridledger("ledger", "statement", "pl-mid", "--config", str(config))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.lstrip().startswith("Availability"))
    assert "judged at the close" in line and "misses" not in line, done.stdout


def test_a_meter_started_after_its_window_fails(tmp_path: Path) -> None:
    cast = builders.make_cast("first-week-late")
    now = int(time.time() * 1000)
    terms = builders.make_terms(
        cast, "pl-late", [builders.gpu("n1", 0)], now - 2 * HOUR, now - HOUR
    )
    config = write_meter_setup(tmp_path, cast, "n1", [terms], simulate="seed=1")
    done = _gridledger("meter", "run", "--config", str(config))
    assert done.returncode == 2, done.stderr
    line = _one_fail(done)
    assert str(config) in line and "every placement window in its terms is over" in line
    assert "give it the terms of a current placement" in line
    # `gridledger check` says the same before anything runs.
    checked = _gridledger("check", str(config))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "every placement in its terms ended" in _one_fail(checked)
    assert "OK:" not in checked.stdout


# ---- 10. the demo: its narrative alone, said once; a workdir it does not own -------------------


def test_demo_tells_its_story_without_log_lines_and_closes_once(demo_dir: Path) -> None:
    stdout = (demo_dir.parent / "demo.stdout").read_text()
    stderr = (demo_dir.parent / "demo.stderr").read_text()
    assert stderr == "", stderr  # no info lines between the narrative's (warning and up only)
    closed = [line for line in stdout.splitlines() if "placement closed" in line]
    assert len(closed) == 1, closed


def test_demo_refuses_a_workdir_it_does_not_own(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    done = _gridledger("demo", "--workdir", str(mine))
    assert done.returncode == 2, done.stderr
    line = _one_fail(done)
    assert f"--workdir {mine}" in line and "choose a new or empty directory" in line
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me\n"


def test_make_demo_says_it_is_installing_before_it_does(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = next(i for i, x in enumerate(lines) if "installing gridledger" in x)
    pip = next(i for i, x in enumerate(lines) if "pip" in x and "install -e" in x)
    assert said < pip, lines


# ---- 11. docs that say what the code does -------------------------------------------------------


def test_the_example_ledger_toml_names_the_intake_log_where_it_is() -> None:
    from transport.intake import intake_dir_for

    text = (ROOT / "deploy" / "ledger.example.toml").read_text()
    where = intake_dir_for(Path("<local_dir>"), "<ledger_id>")
    assert f'"{where}/"' in text, where
    assert "<db>.intake" not in text


def test_witness_help_names_the_port_the_example_ledger_serves() -> None:
    example = tomllib.loads((ROOT / "deploy" / "ledger.example.toml").read_text())
    port = example["http"].rsplit(":", 1)[1]
    done = _gridledger("witness", "run", "--help")
    assert done.returncode == 0
    assert f"http://127.0.0.1:{port}" in " ".join(done.stdout.split()), done.stdout


# ---- 13. exports, check, compose and the image ---------------------------------------------------


def test_export_compact_is_a_fraction_of_the_default_and_verifies(
    demo_dir: Path, tmp_path: Path
) -> None:
    config = demo_dir / "ledger.toml"
    default = demo_dir / "exports" / "pl-demo-0001.duckdb"
    compact = tmp_path / "compact.duckdb"
    done = _gridledger(
        "ledger", "export", "pl-demo-0001", "--out", str(compact), "--compact",
        "--config", str(config),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # 124 records: the default's 256 KiB blocks, one per table with rows at least (~2.8 MB);
    # the compact file's 16 KiB blocks (~0.3 MB).
    assert compact.stat().st_size * 5 < default.stat().st_size, (
        compact.stat().st_size,
        default.stat().st_size,
    )
    verified = _gridledger("verify", str(compact), "--trust", str(demo_dir / "trust.json"))
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.startswith(f"OK: {compact}: placement pl-demo-0001, 124 records")


def test_check_counts_terms_by_placement(demo_dir: Path, tmp_path: Path) -> None:
    copies = []
    for name in ("a.json", "b.json"):
        copy = tmp_path / name
        copy.write_bytes((demo_dir / "terms.signed.json").read_bytes())
        copies.append(str(copy))
    done = _gridledger("check", str(demo_dir / "terms.signed.json"), *copies)
    assert done.returncode == 0, done.stderr
    assert "terms of 1 placement (3 files)" in done.stdout, done.stdout


def test_the_compose_placement_closes_within_the_hour_and_the_image_pins_versions() -> None:
    import yaml
    from packaging.requirements import Requirement
    from packaging.version import Version

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("setup", "setup-cluster"):
        command = compose["services"][name]["command"]
        assert command[command.index("--hours") + 1] == "1", name
    pins = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name] = Version(version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in deploy/constraints.txt"
        assert pins[name] in requirement.specifier, (name, pins[name], requirement.specifier)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml README.md deploy/constraints.txt ./" in dockerfile
    assert "pip install --constraint constraints.txt ." in dockerfile


# ---- 9. times and spans in a person's words ------------------------------------------------------


def test_reclaim_says_its_notice_in_seconds_not_fractions_of_a_minute(
    demo_dir: Path, tmp_path: Path
) -> None:
    done = _gridledger(
        "reclaim", "--terms", "terms.signed.json", "--key", "keys/acme-gpu-cloud.key",
        "--issued-at", "2026-12-01T00:30:00Z", "--effective-at", "2026-12-01T00:30:08.419Z",
        "--out", str(tmp_path / "reclaim.json"),
        cwd=demo_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert " s ahead (10 min agreed;" in first and "0.14" not in first, first


def test_witness_status_and_refusals_print_utc_times(demo_dir: Path) -> None:
    state = demo_dir / "witness" / "buyer"
    done = _gridledger("witness", "status", "--state", str(state))
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("pl-demo-0001: cosigned size 124, closed at record 123, at 20"), line
    assert re.search(r", at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; ", line), line


# ---- 2. replay: a bound that selects nothing; the subset said as one -----------------------------

EXCERPT = ROOT / "tests" / "data" / "openb_excerpt"


def test_replay_bound_that_selects_nothing_names_the_smallest_that_does(tmp_path: Path) -> None:
    done = _gridledger(
        "replay", str(EXCERPT), "--workdir", str(tmp_path / "run"), "--max-events", "100000"
    )
    assert done.returncode == 2, done.stdout[-2000:]
    line = _one_fail(done)
    assert "--max-events 100,000 selects no task" in line
    assert "208,959 usage events alone; give --max-events 208959 or more" in line
    assert "OK" not in done.stdout and not (tmp_path / "run" / "ledger.duckdb").exists()


def test_replay_of_a_subset_says_so(tmp_path: Path) -> None:
    done = _gridledger(
        "replay", str(EXCERPT), "--workdir", str(tmp_path / "run"),
        "--interval-s", "7200", "--limit", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[1].startswith("replayed the first 2 of the 245 GPU tasks that ran (--limit 2)")
    assert not any(line.startswith("trace:") for line in lines)
    # (9) progress: "done" only once the exports are verified.
    progress = done.stderr.strip().splitlines()
    assert progress[-1].startswith("replay: export and verify · 2 of 2 placements")
    assert progress[-1].endswith("done")
    assert not any(line.endswith("done") for line in progress[:-1]), progress


def test_buyer_witness_with_kept_inputs_cosigns_and_a_refusal_reads_in_utc(
    demo_dir: Path, tmp_path: Path
) -> None:
    """(3, 9) The buyer keeps the terms with the time it published them and its witness
    cosigns the honest ledger; kept with a time a day later, the ledger's arrival is
    before it: the refusal, and `witness refusals`, give times in UTC."""
    import shutil

    from proto.terms import load_terms_file

    work = tmp_path / "demo"
    shutil.copytree(demo_dir, work, ignore=shutil.ignore_patterns("exports", "statement"))
    config = tomllib.loads((work / "ledger.toml").read_text())
    (work / "ledger.toml").write_text(tomli_w.dumps({**config, "http": "127.0.0.1:0"}))
    log = (tmp_path / "ledger.log").open("w")  # a file: a pipe nobody reads could fill
    ledger = subprocess.Popen(
        [str(GRIDLEDGER), "ledger", "run", "--config", "ledger.toml"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    port_file = work / "ledger.duckdb.http.json"
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():  # written once the API listens
            assert ledger.poll() is None and time.monotonic() < deadline, (
                tmp_path / "ledger.log"
            ).read_text()
            time.sleep(0.1)
        port = json.loads(port_file.read_text())["port"]
        created_ms = load_terms_file(work / "terms.signed.json")[0].created_at_ms
        results = {}
        for name, at_ms in (("honest", created_ms), ("late", created_ms + 24 * HOUR)):
            known = work / f"known-{name}"
            known.mkdir()
            kept = _gridledger(
                "witness", "keep", "terms.signed.json", "--known", str(known),
                "--received-ms", str(at_ms), cwd=work,
            )  # fmt: skip
            assert kept.returncode == 0, kept.stderr
            results[name] = _gridledger(
                "witness", "run", "--ledger", f"http://127.0.0.1:{port}",
                "--terms", "terms.signed.json", "--key", "keys/inferco-batch.key",
                "--state", f"state-{name}", "--known", str(known), cwd=work,
            )  # fmt: skip
    finally:
        ledger.terminate()
        ledger.wait(timeout=60)
        log.close()
    honest, late = results["honest"], results["late"]
    assert honest.returncode == 0, honest.stdout + honest.stderr
    assert honest.stdout.startswith("OK: pl-demo-0001: cosigned size 124 (closed)")
    assert late.returncode == 1, late.stdout + late.stderr
    assert late.stdout.startswith("REFUSED: pl-demo-0001: W_TIME: record 0 arrived_ms 2026-")
    assert "is before its input was delivered (2026-" in late.stdout
    listed = _gridledger("witness", "refusals", "--state", str(work / "state-late"))
    assert listed.returncode == 0
    assert listed.stdout.startswith("20") and "Z pl-demo-0001 W_TIME: " in listed.stdout


# ---- 7. a mistyped command or key: the closest one suggested, in one wording ------------------


def test_a_mistyped_command_suggests_the_closest() -> None:
    done = _gridledger("verfy", "x.duckdb")
    assert done.returncode == 2
    line = _one_fail(done)
    assert line.startswith("FAIL: unknown command 'verfy'; did you mean gridledger verify?")
    sub = _gridledger("ledger", "rnu")
    assert sub.returncode == 2
    assert sub.stderr.strip().splitlines()[-1].endswith("; did you mean run?"), sub.stderr


def test_unknown_keys_are_worded_alike_in_ledger_and_meter_configs(tmp_path: Path) -> None:
    write_key_pair(SigningKey.generate("ledger-1"), tmp_path / "keys")
    (tmp_path / "local").mkdir()
    ledger = tmp_path / "ledger.toml"
    ledger.write_text(
        tomli_w.dumps(
            {
                "ledger_id": "ledger-1",
                "key_file": "keys/ledger-1.key",
                "db": "ledger.duckdb",
                "local_dir": "local",
                "htp": "off",
            }
        )
    )
    done = _gridledger("ledger", "run", "--config", str(ledger))
    assert done.returncode == 2
    assert _one_fail(done) == f"FAIL: {ledger}: unknown key htp (did you mean http?)"
    meter = _meter(tmp_path / "m", interval_sec=60)
    ran = _gridledger("meter", "run", "--config", str(meter), "--until-ms", str(T0 + HOUR))
    assert ran.returncode == 2
    assert _one_fail(ran) == f"FAIL: {meter}: unknown key interval_sec (did you mean interval_s?)"


def test_a_replay_price_table_words_an_unknown_key_alike(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "USD"\ncurency_scale = 4\n')
    done = _gridledger(
        "replay", str(EXCERPT), "--workdir", str(tmp_path / "run"), "--prices", str(prices)
    )
    assert done.returncode == 2
    assert f"{prices}: unknown key curency_scale (did you mean currency_scale?)" in _one_fail(done)
