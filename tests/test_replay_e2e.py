"""The committed trace excerpt replayed end to end: plan, terms, real meter agents, the
ledger on the local transport and through the real Kafka broker, exports, the verifier.
The delivered total must equal the excerpt's own weighted GPU usage exactly."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from gridledger.cli import main
from gridledger.placement_plan import plan_placements
from gridledger.replay import (
    ReplayOptions,
    ReplayReport,
    planned_events,
    run_replay,
    select_tasks,
)
from gridledger.replay_limits import TRACE_EPOCH_MS
from gridledger.trace import read_trace, trace_usage
from meter.shipper import SHIPPED_FILE

EXCERPT = Path(__file__).parent / "data" / "openb_excerpt"
DAY_MS = 86_400_000


def _expected_events(interval_s: int, limit: int | None = None) -> int:
    """Intervals that tile every window, the last one clipped: ceil(W / I) per placement."""
    trace = read_trace(EXCERPT)
    tasks = select_tasks(trace.tasks, limit)
    plan = plan_placements(trace.nodes, tasks, epoch_ms=TRACE_EPOCH_MS, buyers=4)
    interval_ms = interval_s * 1000
    return sum(-(-(p.window_end_ms - p.window_start_ms) // interval_ms) for p in plan.placements)


def _check(report: ReplayReport, interval_s: int, limit: int | None = None) -> None:
    trace = read_trace(EXCERPT)
    tasks = select_tasks(trace.tasks, limit)
    usage = trace_usage(tasks)
    ran = [t for t in tasks if t.ran]
    assert report.trace is not None
    assert report.trace.weighted_mgms == usage.weighted_mgms
    assert report.placements == len(ran) and report.unplaceable == []
    assert report.failed == [], report.failed[:3]
    assert report.verified == len(ran)
    assert report.events_accepted == _expected_events(interval_s, limit)
    assert report.inputs_rejected == 0
    # Delivered equals the trace's own total, to the milli-GPU-millisecond.
    assert report.delivered_mgms == usage.weighted_mgms
    assert report.delivered_equals_trace
    by_qos: Counter[str] = Counter()
    for t in ran:
        by_qos[t.qos] += t.num_gpu * t.gpu_milli * t.duration_s * 1000
    assert report.delivered_by_qos_mgms == dict(by_qos)
    assert sum(report.delivered_by_model_mgms.values()) == usage.weighted_mgms
    (money,) = report.money.values()
    assert money.gross_minor > 0
    assert money.fee_minor == money.desk_receives_minor > 0
    # fee_payer = operator: the buyer owes the net, the operator receives net minus fee.
    assert money.buyer_owes_minor == money.net_minor
    assert money.operator_receives_minor == money.net_minor - money.fee_minor
    assert report.ok


def test_excerpt_replays_on_the_local_transport(tmp_path: Path) -> None:
    interval_s = 1800
    options = ReplayOptions(
        trace_dir=EXCERPT, workdir=tmp_path / "run", interval_s=interval_s, step_ms=DAY_MS
    )
    report = run_replay(options)
    _check(report, interval_s)
    # Every export verified, then removed (exports on demand); the store keeps all.
    assert report.verified == report.placements > 0
    assert not list((tmp_path / "run" / "exports").glob("*.duckdb"))
    assert report.exports_kept == 0
    assert (tmp_path / "run" / "trust.json").is_file()
    assert report.events_generated == report.events_accepted


def test_excerpt_replays_through_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    # The excerpt's first 40 tasks, a week per step (the whole excerpt, a day per step, runs
    # on the local transport above; through Kafka that took 134 s of a suite that must stay
    # under 20 minutes).
    limit, interval_s = 40, 3600
    options = ReplayOptions(
        trace_dir=EXCERPT,
        workdir=tmp_path / "run",
        kafka=kafka_bootstrap,
        topic=f"replay-{uuid.uuid4().hex[:12]}",
        partitions=4,
        interval_s=interval_s,
        step_ms=7 * DAY_MS,  # a week a step: the ledger process folds after each step
        limit=limit,
    )
    report = run_replay(options)
    assert report.transport == "kafka"
    _check(report, interval_s, limit)
    # Acknowledged spools are garbage-collected: the agents keep only their last segment.
    spools = list((tmp_path / "run" / "spools").iterdir())
    assert spools and all((s / SHIPPED_FILE).is_file() for s in spools)


# One local replay of the excerpt's first tasks, bounded by --max-events, shared by the
# rerun test (which replays it again over its workdir) and the --max-events test (which
# checks the bound held): one run of those tasks instead of three.
PREFIX_TASKS = 40
PREFIX_INTERVAL_S = 3600


@pytest.fixture(scope="module")
def prefix_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ReplayOptions, ReplayReport, int]:
    """(options, the first run's report, how many tasks it replayed)."""
    trace = read_trace(EXCERPT)
    interval_ms = PREFIX_INTERVAL_S * 1000
    every = select_tasks(trace.tasks, None, max_events=10**12, interval_ms=interval_ms)
    budget = planned_events(every[:PREFIX_TASKS], interval_ms) + 1
    options = ReplayOptions(
        trace_dir=EXCERPT,
        workdir=tmp_path_factory.mktemp("prefix") / "run",
        interval_s=PREFIX_INTERVAL_S,
        max_events=budget,
        step_ms=DAY_MS,
    )
    report = run_replay(options)
    tasks = len(select_tasks(trace.tasks, None, max_events=budget, interval_ms=interval_ms))
    return options, report, tasks


def test_a_rerun_over_the_same_workdir_counts_nothing_twice(
    prefix_run: tuple[ReplayOptions, ReplayReport, int],
) -> None:
    """What a restart after a crash does: derive, resend, let the ledger drop repeats.
    The first run is ``prefix_run``'s (the first tasks of the excerpt, bounded by
    --max-events); this test runs it again over the same workdir."""
    options, first, tasks = prefix_run
    _check(first, PREFIX_INTERVAL_S, tasks)
    second = run_replay(options)
    _check(second, PREFIX_INTERVAL_S, tasks)
    assert second.events_generated == 0  # the agents recovered their heads from the spools
    assert second.delivered_mgms == first.delivered_mgms
    assert second.money["USD/4"].gross_minor == first.money["USD/4"].gross_minor


def test_cli_json_report(tmp_path: Path, capsys: object) -> None:
    code = main(
        [
            "replay",
            str(EXCERPT),
            "--workdir",
            str(tmp_path / "run"),
            "--interval-s",
            "7200",
            "--limit",
            "12",
            "--json",
        ]
    )
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    out = captured.out
    data = json.loads(out)
    assert code == 0, out[-2000:]
    # Progress goes to stderr, never into the JSON: what the run will do, the metering,
    # then the exports and their verification, "done" only when those are.
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith("replay: 12 placements on ")
    assert f"{_expected_events(7200, 12):,} events over" in lines[0]
    metered = [line for line in lines if "metered (exports and their verification follow)" in line]
    assert len(metered) == 1 and f"{data['events_generated']:,} of" in metered[0]
    assert lines[-1].startswith("replay: export and verify · 12 of 12 placements")
    assert lines[-1].endswith("done")
    assert not any(line.endswith("done") for line in lines[:-1]), lines
    assert data["format"] == "gridledger-replay-report/v1"
    assert data["delivered_equals_trace"] is True
    assert data["delivered_mgms"] == data["trace"]["weighted_mgms"] > 0
    assert data["verdicts"] == {"verified": 12, "failed": 0}
    assert data["placements"] == 12 and data["unplaceable"] == []


def test_max_events_bounds_the_work_by_events_not_by_task_count(
    prefix_run: tuple[ReplayOptions, ReplayReport, int],
) -> None:
    """--limit counts tasks, whose cost is their duration; --max-events bounds the work."""
    trace = read_trace(EXCERPT)
    interval_ms = PREFIX_INTERVAL_S * 1000
    every = select_tasks(trace.tasks, None, max_events=10**12, interval_ms=interval_ms)
    half = len(every) // 2
    budget = planned_events(every[:half], interval_ms) + 1
    chosen = select_tasks(trace.tasks, None, max_events=budget, interval_ms=interval_ms)
    assert half <= len(chosen) < len(every)
    assert chosen == every[: len(chosen)]  # a prefix in scheduled order
    assert planned_events(chosen, interval_ms) <= budget
    assert planned_events(every[: len(chosen) + 1], interval_ms) > budget  # the longest one
    # --limit and --max-events combine: the tighter of the two wins.
    assert select_tasks(trace.tasks, 2, max_events=budget, interval_ms=interval_ms) == every[:2]
    # The replay itself, bounded by events (the shared run: its budget is the first
    # PREFIX_TASKS tasks' events + 1, so it stops at a task boundary by events alone).
    options, report, tasks = prefix_run
    assert options.limit is None and options.max_events is not None
    replayed = select_tasks(
        trace.tasks, None, max_events=options.max_events, interval_ms=interval_ms
    )
    assert len(replayed) == tasks >= PREFIX_TASKS and replayed == every[:tasks]
    assert planned_events(every[: tasks + 1], interval_ms) > options.max_events
    assert report.placements == len(replayed)
    assert report.events_accepted == planned_events(replayed, interval_ms) <= options.max_events
    assert report.delivered_equals_trace and report.ok


def test_cli_refuses_a_bound_that_is_not_positive(tmp_path: Path, capsys: object) -> None:
    for flag in ("--limit", "--max-events"):
        code = main(["replay", str(EXCERPT), "--workdir", str(tmp_path / "w"), flag, "0"])
        err = capsys.readouterr().err.strip()  # type: ignore[attr-defined]
        assert code == 2
        assert err.splitlines()[-1] == f"FAIL: {flag} must be positive, got 0", err
        assert "Traceback" not in err
