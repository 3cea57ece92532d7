"""The seeded fault harness (``devtools.faults``): its pure parts, its checkers, the runs.

* Pure: a seed's scenario and schedule are deterministic, valid, and the default seeds
  draw every scenario feature and fault class; the fault-free reference agrees with
  the simulator and the SPEC (every event chained, late ones rejected AFTER_CLOSE).
* The checkers can fail: a store or spool damaged on purpose is caught.
* The runs (real Kafka broker): for each seed, meter -> Kafka -> ledger with kill -9 of
  agents and ledger, a broker outage and duplicate deliveries; every invariant holds.
  ``GRIDLEDGER_FAULT_SEEDS=N`` runs N seeds, ``GRIDLEDGER_FAULT_CYCLES=N`` N cycles per
  seed, and ``GRIDLEDGER_FAULT_SEED=S pytest tests/test_faults.py -k replay`` replays one.
  The agents and the ledger are forked from a fork server with the package imported
  (``devtools.faults.launch``); ``GRIDLEDGER_FAULT_LAUNCH=exec`` runs ``python -m
  gridledger`` for each instead (about a second more per process start).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from support import ledger_toml

from devtools.faults import (
    CYCLES_ENV,
    DEFAULT_CYCLES_PER_SEED,
    DEFAULT_SEEDS,
    MIN_CYCLES,
    FaultKind,
    Reference,
    Scenario,
    TopicMessage,
    build_reference,
    check_spool,
    check_store,
    compare_final,
    env_int,
    generate_scenario,
    make_schedule,
    read_ledger_state,
    rebuild_local,
    replay_command,
    run_seed,
    suite_seeds,
    write_node_configs,
)
from devtools.kafka_broker import KafkaBroker
from meter.sim import parse_sim_spec
from proto.envelope import open_envelope, sha256_hex
from proto.records import UsageEvent
from proto.terms import validate_terms
from transport.local import publish_local

# A seed whose scenario has a multi-node placement, a key rotation, a skewed node with
# late usage, terms arriving mid-stream, reclaims and late records.
RICH_SEED = 96
SUITE_CYCLES = env_int(CYCLES_ENV, DEFAULT_CYCLES_PER_SEED)


# ---- the scenario and the schedule ---------------------------------------------------------


def _fingerprint(scenario: Scenario) -> tuple[object, ...]:
    return (scenario.describe(), scenario.pre, scenario.post, scenario.late, scenario.terms)


def test_scenarios_are_deterministic_valid_and_differ_by_seed() -> None:
    fingerprints = set()
    for seed in range(40):
        scenario = generate_scenario(seed)
        assert _fingerprint(generate_scenario(seed)) == _fingerprint(scenario)
        fingerprints.add(_fingerprint(scenario)[0])
        assert 1 <= len(scenario.terms) <= 3 and 1 <= len(scenario.nodes) <= 3
        for terms in scenario.terms:
            assert validate_terms(terms) == []
            assert scenario.early_clock_ms < terms.window_end_ms + terms.late_grace_ms
            assert scenario.late_clock_ms >= terms.window_end_ms + terms.late_grace_ms
        for plan in scenario.nodes:
            parse_sim_spec(plan.sim_spec)  # the agents' CLI accepts it
            untils = [s.until_ms for s in plan.segments]
            assert untils == sorted(untils)
            phases = [s.phase for s in plan.segments]
            assert phases == sorted(phases)  # "early" runs before "late"
        for _, envelope in (*scenario.pre, *scenario.post, *scenario.late):
            open_envelope(envelope)  # well-formed, canonical
    assert len(fingerprints) == 40


def test_schedule_is_deterministic_and_has_the_cycles_asked() -> None:
    scenario = generate_scenario(RICH_SEED)
    for cycles in (MIN_CYCLES, 22, 60):
        schedule = make_schedule(scenario, cycles)
        assert schedule == make_schedule(scenario, cycles)
        assert len(schedule.faults) == cycles
        kinds = {f.kind for f in schedule.faults}
        assert FaultKind.LEDGER_KILL in kinds and FaultKind.DUPLICATES in kinds
        assert kinds & {FaultKind.BROKER_KILL, FaultKind.BROKER_RESTART}
        phases = [f.phase for f in schedule.faults]
        assert phases == sorted(phases, key=["early", "before_close", "after_close"].index)
        # No agent runs before the close: those faults are ledger kills and duplicates.
        assert all(
            f.kind in (FaultKind.LEDGER_KILL, FaultKind.DUPLICATES)
            for f in schedule.of_phase("before_close")
        )
    with pytest.raises(ValueError):
        make_schedule(scenario, MIN_CYCLES - 1)


def test_default_suite_runs_100_cycles_and_every_feature() -> None:
    assert len(DEFAULT_SEEDS) * DEFAULT_CYCLES_PER_SEED >= 100
    features: set[str] = set()
    kinds: set[FaultKind] = set()
    for seed in DEFAULT_SEEDS:
        scenario = generate_scenario(seed)
        features.update(f.split(" ", 1)[1] for f in scenario.features)
        kinds.update(f.kind for f in make_schedule(scenario, DEFAULT_CYCLES_PER_SEED).faults)
        if any(not scenario.single_source(p) for p in scenario.placement_ids):
            features.add("multi-node placement")
    text = " | ".join(sorted(features))
    for wanted in (
        "GPU unhealthy",
        "GPU vanishes",
        "key rotated",
        "behind: late usage",
        "terms arrive mid-stream",
        "reclaimed",
        "reclaim behind usage",
        "reclaim after close",
        "key binding after close",
        "late adjustment",
        "multi-node placement",
    ):
        assert wanted in text, f"no default seed draws {wanted!r}: {text}"
    assert kinds == set(FaultKind)


def test_suite_seeds_follow_the_environment() -> None:
    assert suite_seeds({}) == list(DEFAULT_SEEDS)
    assert suite_seeds({"GRIDLEDGER_FAULT_SEEDS": "2"}) == list(DEFAULT_SEEDS[:2])
    assert suite_seeds({"GRIDLEDGER_FAULT_SEEDS": "7"}) == [*DEFAULT_SEEDS, 1000, 1001]
    assert suite_seeds({"GRIDLEDGER_FAULT_SEED": "1234", "GRIDLEDGER_FAULT_SEEDS": "9"}) == [1234]
    with pytest.raises(ValueError):
        suite_seeds({"GRIDLEDGER_FAULT_SEEDS": "many"})
    command = replay_command(1234, 30)
    assert "GRIDLEDGER_FAULT_SEED=1234" in command and "-k replay" in command


# ---- the fault-free reference ----------------------------------------------------------


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scenario, Reference, Path]:
    """The rich seed's scenario and fault-free reference (no Kafka needed)."""
    directory = tmp_path_factory.mktemp("faults-reference")
    scenario = generate_scenario(RICH_SEED)
    configs = write_node_configs(scenario, directory / "meters", "127.0.0.1:9", "unused")
    return scenario, build_reference(scenario, configs, directory / "reference"), directory


def test_reference_agents_tile_their_windows_and_rotate_keys(
    rich: tuple[Scenario, Reference, Path],
) -> None:
    scenario, reference, _ = rich
    for plan in scenario.nodes:
        streams: dict[str, list[UsageEvent]] = {}
        for envelope in reference.nodes[plan.node_id].envelopes:
            opened = open_envelope(envelope)
            event = opened.record
            assert isinstance(event, UsageEvent)
            streams.setdefault(event.placement_id, []).append(event)
            if plan.rotation_ms is not None:
                key = (
                    scenario.rotated_key(plan.node_id)
                    if event.start_ms >= plan.rotation_ms
                    else scenario.cast.node_key(plan.node_id)
                )
                assert opened.envelope.signatures[0].keyid == key.key_id
        for terms in scenario.node_terms(plan.node_id):
            events = streams[terms.placement_id]
            assert [e.seq for e in events] == list(range(len(events)))
            assert events[0].start_ms == terms.window_start_ms
            assert events[-1].end_ms == terms.window_end_ms
            assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(events))


def test_reference_ledger_accepts_on_time_usage_and_rejects_late_usage(
    rich: tuple[Scenario, Reference, Path],
) -> None:
    scenario, reference, _ = rich
    decisions = reference.ledger.decisions
    late_seen = 0
    for node, ref in reference.nodes.items():
        for envelope in ref.envelopes:
            event = open_envelope(envelope).record
            assert isinstance(event, UsageEvent)
            decision = decisions[f"{event.placement_id}/{sha256_hex(envelope)}"]
            if ref.phase[envelope] == "late":
                late_seen += 1
                assert (decision.status, decision.reason) == ("rejected", "AFTER_CLOSE"), node
            else:
                assert (decision.status, decision.reason) == ("accepted", ""), node
    assert late_seen > 0
    assert sorted(reference.ledger.final_statements) == scenario.placement_ids
    # records after the close (the late usage) open later periods: the final statement
    # kept is the latest period's, at the head, as a ledger that stops issues it (SPEC §8)
    for placement_id in scenario.placement_ids:
        head_index = reference.ledger.heads[placement_id][0]
        assert reference.ledger.final_totals[placement_id][0] == head_index
    reasons = {d.reason for d in decisions.values()}
    assert "AFTER_CLOSE" in reasons and "RECLAIM_BEHIND_USAGE" in reasons


# ---- the checkers can fail ---------------------------------------------------------------


def _copy_db(rich: tuple[Scenario, Reference, Path], tmp_path: Path) -> Path:
    _, _, directory = rich
    target = tmp_path / "copy.duckdb"
    shutil.copy(directory / "reference" / "canonical" / "ledger.duckdb", target)
    return target


def test_check_store_passes_the_reference_and_catches_damage(
    rich: tuple[Scenario, Reference, Path], tmp_path: Path
) -> None:
    _, reference, _ = rich
    db = _copy_db(rich, tmp_path)
    problems, state = check_store(db, reference)
    assert problems == [] and state is not None
    assert state.heads == reference.ledger.heads
    damages = {
        "a record lost": "DELETE FROM record_rows WHERE chain_index = 3 AND placement_id = "
        "(SELECT min(placement_id) FROM records)",
        "an input chained twice": "INSERT INTO input_rows SELECT * REPLACE (chain_index + 1000 AS "
        "chain_index) FROM input_rows WHERE chain_index = 2",
        "a decision changed": "UPDATE input_rows SET reason = 'SEQ_GAP', status = 'rejected' "
        "WHERE chain_index = 4",
    }
    for what, sql in damages.items():
        damaged = tmp_path / f"{len(what)}.duckdb"
        shutil.copy(db, damaged)
        with duckdb.connect(str(damaged)) as con:
            con.execute(sql)
        problems, state = check_store(damaged, reference)
        assert problems and state is None, what


def test_check_spool_catches_foreign_and_missing_events(
    rich: tuple[Scenario, Reference, Path], tmp_path: Path
) -> None:
    scenario, reference, directory = rich
    node = scenario.nodes[0].node_id
    spool = directory / "reference" / "agents" / node
    problems, held = check_spool(spool, node, reference)
    assert problems == [] and held == reference.nodes[node].envelopes
    events = reference.nodes[node].envelopes
    # A gap in a stream (an event lost from the middle).
    publish_local(tmp_path, "gap", [e for i, e in enumerate(events) if i != 2])
    problems, _ = check_spool(tmp_path / "gap", node, reference)
    assert any("seq" in p for p in problems)
    # An event the fault-free agent never signs (another node's, standing in for a
    # re-signed event after a crash).
    other = reference.nodes[scenario.nodes[1].node_id].envelopes[0]
    publish_local(tmp_path, "foreign", [events[0], other])
    problems, _ = check_spool(tmp_path / "foreign", node, reference)
    assert any("never signs" in p for p in problems)


def test_compare_final_passes_the_reference_and_catches_differences(
    rich: tuple[Scenario, Reference, Path], tmp_path: Path
) -> None:
    scenario, reference, _ = rich
    state = reference.ledger
    with duckdb.connect(
        str(rich[2] / "reference" / "canonical" / "ledger.duckdb"), read_only=True
    ) as con:
        rows = con.execute("SELECT placement_id, envelope FROM inputs ORDER BY 1").fetchall()
    messages = [TopicMessage(0, i, str(p).encode(), bytes(e)) for i, (p, e) in enumerate(rows)]
    observed = set(reference.nodes[scenario.nodes[0].node_id].envelopes)
    assert compare_final(scenario, reference, state, state, messages, observed) == []
    # One message more in the topic than the ledger accounted for.
    extra = [*messages, messages[0]]
    assert any(
        "messages in the topic" in p
        for p in compare_final(scenario, reference, state, state, extra, observed)
    )
    # A faulty ledger whose head differs from the same-stream fold.
    db = _copy_db(rich, tmp_path)
    with duckdb.connect(str(db)) as con:
        con.execute(
            "DELETE FROM record_rows WHERE (placement_id, chain_index) IN "
            "(SELECT placement_id, max(chain_index) FROM records GROUP BY 1)"
        )
    shorter = read_ledger_state(db)
    problems = compare_final(scenario, reference, shorter, state, messages, observed)
    assert any("same-stream" in p for p in problems)
    assert any("head index" in p for p in problems)
    # A spooled event no fault-free agent signs.
    problems = compare_final(scenario, reference, state, state, messages, {b"{}"})
    assert any("no fault-free agent signs" in p for p in problems)


# ---- the runs -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", suite_seeds())
def test_fault_cycles_replay(seed: int, tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    """One seed through meter -> Kafka -> ledger with its fault schedule (``-k replay``)."""
    report = run_seed(
        seed,
        bootstrap=kafka_broker.bootstrap,
        broker=kafka_broker,
        workdir=tmp_path / f"seed-{seed}",
        cycles=SUITE_CYCLES,
    )
    print(report.summary())
    replay = replay_command(seed, SUITE_CYCLES)
    # Processes may exit by themselves only in the known way (the xfail tracker below).
    assert report.unexplained_exits() == [], f"{report.summary()}\nreplay: {replay}"
    assert report.total_cycles == SUITE_CYCLES, f"{report.summary()}\nreplay: {replay}"
    # The kills landed on processes (a kill with no agent left becomes a ledger kill).
    kills = report.cycles[FaultKind.METER_KILL] + report.cycles[FaultKind.LEDGER_KILL]
    assert kills >= SUITE_CYCLES // 2, f"{report.summary()}\nreplay: {replay}"
    assert report.exports_verified == len(generate_scenario(seed).placement_ids)
    assert report.topic_messages > report.duplicates_dropped > 0


# ---- findings ---------------------------------------------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# The no-broker run waits a few hundredths of a second between attempts instead of the
# default backoff (about a minute in all); the attempts, their log lines, the exit and the
# FAIL line are the same. The default itself is checked by reading the config below.
SHORT_BACKOFF_S = (0.01, 0.04)


def _no_broker_config(tmp_path: Path, bootstrap: str, **kafka: object) -> Path:
    from devtools.builders import make_cast
    from proto.keys import write_key_pair

    key_file, _ = write_key_pair(make_cast("no-broker").ledger, tmp_path / "keys")
    return ledger_toml(
        tmp_path / "ledger.toml",
        key_file,
        ledger_id="x",
        db="l.duckdb",
        transport="kafka",
        kafka={"bootstrap": bootstrap, "topic": "t", **kafka},
        http="off",
    )


def test_ledger_run_waits_or_fails_cleanly_without_a_broker(tmp_path: Path) -> None:
    """Kafka never answers: START_ATTEMPTS tries, each logged, then exit 75 with one FAIL
    line naming the broker. A process still running after the whole backoff is a hang.
    The run uses a short ``[kafka] start_backoff_*``; the default's total is checked in
    ``test_default_start_backoff_is_the_documented_one``."""
    from ledger.limits import START_ATTEMPTS

    initial_s, max_s = SHORT_BACKOFF_S
    bootstrap = f"127.0.0.1:{_closed_port()}"
    config = _no_broker_config(
        tmp_path, bootstrap, start_backoff_initial_s=initial_s, start_backoff_max_s=max_s
    )
    backoff_s = sum(min(initial_s * 2**i, max_s) for i in range(START_ATTEMPTS - 1))
    process = subprocess.Popen(
        [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        raw = process.communicate(timeout=backoff_s + 60)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=30)
        pytest.fail(f"ledger run still running {backoff_s + 60:.0f} s without a broker: a hang")
    output = raw.decode(errors="replace")
    assert "Traceback" not in output, output[-2000:]
    assert process.returncode == 75, output[-2000:]
    assert output.count("kafka_unavailable") == START_ATTEMPTS, output[-2000:]
    fails = [line for line in output.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and bootstrap in fails[0], output[-2000:]


def test_default_start_backoff_is_the_documented_one(tmp_path: Path) -> None:
    """A ledger.toml without ``start_backoff_*`` waits as BOUNDS.md states: 0.5 s first,
    doubling, at most 10 s, START_ATTEMPTS (10) attempts: about a minute in all."""
    from ledger.config import load_config
    from ledger.limits import START_ATTEMPTS

    config = load_config(_no_broker_config(tmp_path, "127.0.0.1:9"))
    assert config.kafka is not None
    initial_s, max_s = config.kafka.start_backoff_initial_s, config.kafka.start_backoff_max_s
    assert (initial_s, max_s, START_ATTEMPTS) == (0.5, 10.0, 10)
    bounds = (Path(__file__).resolve().parents[1] / "BOUNDS.md").read_text(encoding="utf-8")
    assert "| `START_BACKOFF_INITIAL_S` | `ledger/limits.py` | 0.5 s |" in bounds
    assert "| `START_BACKOFF_MAX_S` | `ledger/limits.py` | 10 s |" in bounds
    assert "| `START_ATTEMPTS` | `ledger/limits.py` | 10 |" in bounds
    waits = [min(initial_s * 2**i, max_s) for i in range(START_ATTEMPTS - 1)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0]
    assert 50 <= sum(waits) <= 70  # "10 attempts take about a minute"


@pytest.mark.parametrize(
    ("kafka", "named"),
    [
        ({"start_backoff_initial_s": 0}, "start_backoff_initial_s"),
        ({"start_backoff_initial_s": 601}, "start_backoff_initial_s"),
        ({"start_backoff_initial_s": "fast"}, "start_backoff_initial_s"),
        ({"start_backoff_initial_s": True}, "start_backoff_initial_s"),
        ({"start_backoff_max_s": 0.005}, "start_backoff_max_s"),
        ({"start_backoff_initial_s": 2, "start_backoff_max_s": 1}, "start_backoff_max_s"),
        ({"start_backoff_max_s": 600.5}, "start_backoff_max_s"),
    ],
)
def test_start_backoff_out_of_bounds_is_refused_in_one_line(
    tmp_path: Path, kafka: dict[str, object], named: str
) -> None:
    """Each start_backoff_* in 0.01..600 s, the initial wait at most the ceiling; anything
    else is refused when the config is read, naming the key and the range."""
    from ledger.config import ConfigError, load_config

    config = _no_broker_config(tmp_path, "127.0.0.1:9", **kafka)
    with pytest.raises(ConfigError, match=rf"\[kafka\] {named} must be a number of seconds"):
        load_config(config)


def test_start_backoff_bounds_are_inclusive(tmp_path: Path) -> None:
    from ledger.config import load_config

    for i, (initial_s, max_s) in enumerate([(0.01, 0.01), (600, 600), (1, 600), (0.01, 1)]):
        config = load_config(
            _no_broker_config(
                tmp_path / str(i),
                "127.0.0.1:9",
                start_backoff_initial_s=initial_s,
                start_backoff_max_s=max_s,
            )
        )
        assert config.kafka is not None
        assert (config.kafka.start_backoff_initial_s, config.kafka.start_backoff_max_s) == (
            initial_s,
            max_s,
        )


def test_ledger_run_refuses_a_bad_start_backoff_in_one_line(tmp_path: Path) -> None:
    config = _no_broker_config(tmp_path, "127.0.0.1:9", start_backoff_initial_s=-1)
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "ledger", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("FAIL:"), done.stderr
    assert "start_backoff_initial_s" in lines[0] and "0.01..600" in lines[0], lines[0]


def test_store_lost_on_the_embedded_transport_rebuilds_the_reference_identically(
    rich: tuple[Scenario, Reference, Path],
) -> None:
    """The ``store_lost`` fault, local half: the canonical reference (its spools include
    the ledger's own close spool, which sorts before ``publish-canonical``) loses its
    store and rebuilds it from its intake log: the same chains, statements, decisions."""
    scenario, reference, directory = rich
    canonical = directory / "reference" / "canonical"
    assert (canonical / "spool" / "ledger-reference").is_dir()
    rebuilt = rebuild_local(scenario.cast.ledger, canonical, scenario.late_clock_ms)
    assert rebuilt == reference.ledger
    assert any(d.reason == "AFTER_CLOSE" for d in rebuilt.decisions.values())
