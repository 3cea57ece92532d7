"""The replay's stages of issue 15: prefixes by fraction of the events, the export stage
through ``export_all`` in chunks (the same files and verdicts as one placement at a time),
and over Kafka the ledger in a process of its own (the same heads, totals and verdicts as
the ledger in the replay's process; the process ends cleanly)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import pytest

import gridledger.replay as replay
import gridledger.replay.ledger_process as replay_ledger
import gridledger.replay.run as replay_run
import gridledger.replay.verdicts as replay_verdicts
from gridledger.replay import (
    ReplayOptions,
    ReplayReport,
    planned_events,
    prefix_budgets,
    run_replay,
    select_tasks,
)
from gridledger.replay_terms import make_replay_cast
from gridledger.trace import read_trace
from ledger.export import TABLES, export_placement
from ledger.store import Store

EXCERPT = Path(__file__).parent / "data" / "openb_excerpt"
DAY_MS = 86_400_000


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def _heads(workdir: Path) -> dict[str, tuple[int, str]]:
    """placement -> (head chain index, head record hash) of the replay's ledger store."""
    cast = make_replay_cast("openb", 4)
    with Store(workdir / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        out: dict[str, tuple[int, str]] = {}
        for pid in store.placements():
            head = store.head(pid)
            assert head is not None
            out[pid] = (head.chain_index, head.record_hash)
        return out


def test_prefix_budgets_take_growing_prefixes_by_fraction_of_the_events() -> None:
    tasks = read_trace(EXCERPT).tasks
    interval_ms = 3_600_000
    total = planned_events(tasks, interval_ms)
    budgets = prefix_budgets(tasks, [10, 80, 90, 100], interval_ms)
    assert budgets == [total * 10 // 100, total * 80 // 100, total * 90 // 100, None]
    # The excerpt's first task runs for months (78 % of its events): 10 % holds no task,
    # and a bound that selects nothing is refused, naming the smallest one that selects some.
    first = planned_events(select_tasks(tasks, 1, interval_ms=interval_ms), interval_ms)
    with pytest.raises(ValueError, match=f"give --max-events {first} or more"):
        select_tasks(tasks, None, max_events=budgets[0], interval_ms=interval_ms)
    assert select_tasks(tasks, None, max_events=first, interval_ms=interval_ms) != ()
    chosen = [()] + [
        select_tasks(tasks, None, max_events=b, interval_ms=interval_ms) for b in budgets[1:]
    ]
    sizes = [planned_events(c, interval_ms) for c in chosen]
    assert len(chosen[1]) == 1
    for size, budget in zip(sizes, budgets, strict=True):
        assert size <= (budget if budget is not None else total)
    assert sizes[1] < sizes[2] < sizes[3] == total
    for shorter, longer in itertools.pairwise(chosen[:3]):
        assert longer[: len(shorter)] == shorter  # each a prefix of the next
    assert set(chosen[2]) < set(chosen[3])  # 100 %: every task (in trace order)
    for bad in (0, 101, -5):
        with pytest.raises(ValueError, match=r"percentage in 1\.\.100"):
            prefix_budgets(tasks, [bad], interval_ms)


def test_export_stage_in_chunks_writes_what_one_at_a_time_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (replay_run, replay_ledger):  # the replay's exports, the ledger process's
        monkeypatch.setattr(module, "EXPORT_CHUNK", 3)  # several chunks, the last one short
    monkeypatch.setattr(replay_verdicts, "MAX_VERIFY_IN_FLIGHT", 2)
    monkeypatch.setattr(replay_ledger, "COMPACT_MAX_RECORDS", 40)  # both formats among 8 placements
    workdir = tmp_path / "run"
    report = run_replay(
        ReplayOptions(
            trace_dir=EXCERPT,
            workdir=workdir,
            interval_s=7200,
            limit=8,
            step_ms=DAY_MS,
            keep_exports=True,
        )
    )
    assert report.ok and report.verified == report.placements == report.exports_kept == 8
    assert report.placements % 3 != 0
    exports = sorted((workdir / "exports").glob("*.duckdb"))
    assert len(exports) == 8
    assert not list((workdir / "exports").glob(".*")), "temporary files left behind"
    cast = make_replay_cast("openb", 4)
    with Store(workdir / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        for path in exports:
            one = tmp_path / "one" / path.name
            export_placement(store, path.stem, one, key=cast.ledger)
            assert _tables(one) == _tables(path), path.stem
    # The replay's own exports of small placements are compact where the DuckDB writes
    # that format (the project's does), larger ones portable; `ledger export` writes the
    # portable format, with the same rows.
    assert replay_ledger.compact_exports()
    blocks: dict[int, int] = {}
    for path in exports:
        with duckdb.connect(str(path), read_only=True) as con:
            size = con.execute("PRAGMA database_size").fetchone()
            records = con.execute("SELECT count(*) FROM ledger_records").fetchone()
        assert size is not None and records is not None
        expected = 16 * 1024 if records[0] <= 40 else 256 * 1024
        assert size[2] == expected, (path.stem, records[0], size[2])  # block size
        blocks[size[2]] = blocks.get(size[2], 0) + 1
    assert set(blocks) == {16 * 1024, 256 * 1024}, blocks


def _kafka_run(workdir: Path, bootstrap: str, *, ledger_process: bool) -> ReplayReport:
    return run_replay(
        ReplayOptions(
            trace_dir=EXCERPT,
            workdir=workdir,
            kafka=bootstrap,
            topic=f"replay-{uuid.uuid4().hex[:12]}",
            partitions=2,
            interval_s=7200,
            limit=10,
            step_ms=7 * DAY_MS,  # fewer Kafka rounds: the first task runs for months
            ledger_process=ledger_process,
        )
    )


def test_ledger_process_gives_the_heads_totals_and_verdicts_of_the_ledger_in_process(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agents may run ahead by one step only when a step is over the lag bound.
    monkeypatch.setattr(replay_ledger, "MAX_LEDGER_LAG_EVENTS", 1)
    started: list[Any] = []
    real = replay_ledger._LedgerProcess.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        started.append(self)

    # Overlap: exports are handed to the verifier while steps still run (before the
    # ledger is told to stop), and the replay process never opens the store itself.
    events: list[str] = []
    real_submit, real_step = replay_verdicts._Verdicts.submit, replay_ledger._LedgerProcess.step

    def submit(self: Any, placement: Any) -> None:
        events.append("submit")
        real_submit(self, placement)

    async def step(self: Any, until_ms: int, records: int) -> None:
        events.append("step")
        await real_step(self, until_ms, records)

    def no_store(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the replay process opened the store")

    monkeypatch.setattr(replay_ledger._LedgerProcess, "__init__", spy)
    monkeypatch.setattr(replay_verdicts._Verdicts, "submit", submit)
    monkeypatch.setattr(replay_ledger._LedgerProcess, "step", step)
    with monkeypatch.context() as inside:
        inside.setattr(replay_run, "Store", no_store)
        split = _kafka_run(tmp_path / "split", kafka_bootstrap, ledger_process=True)
    assert events.count("submit") == 10
    # The excerpt's first task runs for months: the others close, are exported by the
    # ledger process and handed to the verifier before the replay sends the last step.
    last_step = len(events) - 1 - events[::-1].index("step")
    assert events[:last_step].count("submit") >= 5, events
    assert split.seconds["export"] > 0
    assert len(started) == 1
    (ledger,) = started
    process = ledger.process
    assert not process.is_alive() and process.exitcode == 0  # ended cleanly, told to
    # Not daemonic: its ledger checked signatures in a worker process of its own.
    assert not process.daemon and ledger.crypto_worker
    assert split.seconds["ledger"] > 0 and "ledger_wait" in split.seconds
    assert split.peak_rss_mib_by_process["ledger"] > 0  # its own peak, reported on stop
    assert 0 < split.peak_rss_mib_by_process["ledger_duckdb"] < 512  # its store's pool
    # where the ledger process's peak was reached: some phase raised it, none above it
    phases = {
        k: v for k, v in split.peak_rss_mib_by_process.items() if k.startswith("ledger_peak_in_")
    }
    named = {f"ledger_peak_in_{p}" for p in ("start", "fold", "export", "stop")}
    assert phases and set(phases) <= named, phases
    assert max(phases.values()) <= split.peak_rss_mib_by_process["ledger"], phases
    assert "ledger_peak_in_fold" in phases  # the fold of 10 placements raises it
    # CPU by process: the ledger process's own (its steps and its exports are parts of
    # it), its signature worker's, the verifier workers', the replay process's.
    cpu = split.cpu_seconds
    named_cpu = {"replay", "ledger", "ledger_fold", "ledger_export", "ledger_workers", "verifier"}
    assert set(cpu) == named_cpu, cpu
    assert all(seconds > 0 for seconds in cpu.values()), cpu
    assert cpu["ledger_fold"] + cpu["ledger_export"] <= cpu["ledger"], cpu
    per_event = split.to_json()["cpu_us_per_event"]
    assert per_event["ledger"] == round(cpu["ledger"] / split.events_accepted * 1e6, 1)
    # the verifier's CPU split by export size: every export counted once, in its class
    by_size = split.to_json()["verifier_cpu_by_records"]
    assert sum(c["exports"] for c in by_size.values()) == 10, by_size
    assert sum(c["cpu_s"] for c in by_size.values()) == pytest.approx(cpu["verifier"], abs=0.01)
    assert sum(c["records"] for c in by_size.values()) == sum(
        h[0] + 1 for h in _heads(tmp_path / "split").values()
    )
    inline = _kafka_run(tmp_path / "inline", kafka_bootstrap, ledger_process=False)
    assert len(started) == 1  # no process for the ledger in the replay's own process
    assert set(inline.cpu_seconds) == {"replay", "verifier"}, inline.cpu_seconds
    assert split.ok and inline.ok
    assert split.verified == inline.verified == 10
    assert split.events_accepted == inline.events_accepted > 0
    assert split.delivered_mgms == inline.delivered_mgms == split.trace.weighted_mgms  # type: ignore[union-attr]
    assert {k: m.to_json() for k, m in split.money.items()} == {
        k: m.to_json() for k, m in inline.money.items()
    }
    heads = _heads(tmp_path / "split")
    assert len(heads) == 10
    assert heads == _heads(tmp_path / "inline")


def test_a_ledger_process_that_fails_is_one_named_error_and_ends(tmp_path: Path) -> None:
    """A ledger process that cannot open its store says why and exits; the replay raises
    LedgerProcessError (one line for the CLI), never waits for it."""
    not_a_store = tmp_path / "ledger.duckdb"
    not_a_store.mkdir()  # a directory where the store file should be
    job = replay_ledger._LedgerJob(
        db=str(not_a_store),
        seed="openb",
        buyers=4,
        bootstrap="127.0.0.1:9",  # never reached: the store fails first
        topic="unused",
        max_commands=2,
    )
    seconds: dict[str, float] = {}
    ledger = replay_ledger._LedgerProcess(job, seconds)
    with pytest.raises(replay.LedgerProcessError, match="the ledger process failed: "):
        asyncio.run(ledger.start())
    asyncio.run(ledger.close())
    assert not ledger.process.is_alive() and ledger.process.exitcode == 1


@pytest.mark.parametrize("keep", [False, True])
def test_a_verified_export_is_removed_unless_kept_and_a_failed_one_is_kept(
    tmp_path: Path, keep: bool
) -> None:
    exports = tmp_path / "run" / "exports"
    exports.mkdir(parents=True)
    run = replay_run._ReplayRun(
        ReplayOptions(trace_dir=EXCERPT, workdir=tmp_path / "run", keep_exports=keep)
    )
    good, bad = (
        SimpleNamespace(placement_id=p, task=SimpleNamespace(qos="LS"), model="V100M16")
        for p in ("pl-good", "pl-bad")
    )
    for p in (good, bad):
        (exports / f"{p.placement_id}.duckdb").write_bytes(b"export")
    totals = dict.fromkeys(("delivered_mgms", *replay.MONEY_FIELDS), 7)
    run.settle_export(exports, good, replay_verdicts.VerifySummary("", totals, "EUR", 2, 0.1))  # type: ignore[arg-type]
    run.settle_export(exports, bad, replay_verdicts.VerifySummary("CHAIN_BROKEN", None, "", 0, 0.1))  # type: ignore[arg-type]
    assert (exports / "pl-good.duckdb").exists() is keep
    assert (exports / "pl-bad.duckdb").exists()
    assert run.report.exports_kept == (2 if keep else 1)
    assert run.report.verified == 1 and run.report.failed == [("pl-bad", "CHAIN_BROKEN")]
    assert run.report.delivered_mgms == 7


def test_the_verifier_queue_counts_what_the_ledger_process_exported_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ledger process names after a step: an export not written is a named
    failure, an unknown or repeated placement is ignored, a written one is verified
    (here a file that is no export: a failed verdict, kept), at most
    MAX_VERIFY_IN_FLIGHT out at once."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(replay_verdicts, "MAX_VERIFY_IN_FLIGHT", 1)
    exports = tmp_path / "run" / "exports"
    exports.mkdir(parents=True)
    run = replay_run._ReplayRun(ReplayOptions(trace_dir=EXCERPT, workdir=tmp_path / "run"))
    placements = [
        SimpleNamespace(placement_id=p, task=SimpleNamespace(qos="LS"), model="V100M16")
        for p in ("pl-a", "pl-b", "pl-c")
    ]
    for p in placements[1:]:
        (exports / f"{p.placement_id}.duckdb").write_bytes(b"not an export")
    with ThreadPoolExecutor(1) as pool:
        verdicts = replay_verdicts._Verdicts(run, exports, pool, placements)  # type: ignore[arg-type]
        verdicts.exported([("pl-a", "no accepted terms"), ("pl-zz", ""), ("pl-b", "")])
        assert len(verdicts.pending) <= 1
        verdicts.exported([("pl-a", ""), ("pl-b", ""), ("pl-c", "")])  # pl-a, pl-b again
        assert len(verdicts.pending) <= 1
        verdicts.drain()
    assert verdicts.handed == {"pl-a", "pl-b", "pl-c"}
    failed = dict(run.report.failed)
    assert failed.keys() == {"pl-a", "pl-b", "pl-c"}
    assert failed["pl-a"] == "not exported: no accepted terms"
    assert failed["pl-b"] and failed["pl-c"]  # the verifier's reason, named
    assert run.report.verified == 0 and run.report.exports_kept == 2


def _small_files(
    tmp_path: Path, n: int, empty: int | None = None
) -> tuple[Any, Path, list[str], list[Any]]:
    """A replay run, its exports directory holding ``n`` small files that are not exports
    (file ``empty`` empty), their placement names and stand-in placements."""
    exports = tmp_path / "run" / "exports"
    exports.mkdir(parents=True)
    run = replay_run._ReplayRun(ReplayOptions(trace_dir=EXCERPT, workdir=tmp_path / "run"))
    names = [f"pl-{k}" for k in range(n)]
    placements = [
        SimpleNamespace(placement_id=p, task=SimpleNamespace(qos="LS"), model="V100M16")
        for p in names
    ]
    for k, p in enumerate(names):
        (exports / f"{p}.duckdb").write_bytes(b"not an export %d" % k if k != empty else b"")
    return run, exports, names, placements


def test_small_exports_go_to_the_verifier_in_batches_counted_in_the_order_handed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small exports wait for a batch (``verify_exports`` in one worker call): a batch
    goes when full or when its oldest export has waited BATCH_WAIT_S; each verdict is
    what ``verify_one`` says of that export alone, counted in the order handed."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(replay_verdicts._Verdicts, "BATCH", 3)
    monkeypatch.setattr(replay_verdicts._Verdicts, "BATCH_WAIT_S", 3600.0)

    run, exports, names, placements = _small_files(tmp_path, 5, empty=2)
    with ThreadPoolExecutor(1) as pool:
        verdicts = replay_verdicts._Verdicts(run, exports, pool, placements)  # type: ignore[arg-type]
        gate = threading.Event()
        pool.submit(gate.wait)  # the one worker busy: nothing handed settles early
        verdicts.exported([(p, "") for p in names])
        # the first three as a full batch; the other two wait (not an hour yet)
        assert [p.placement_id for p in verdicts.queue] == names[3:]
        futures = [id(future) for _, future, _ in verdicts.pending]
        assert len(futures) == 3 and len(set(futures)) == 1
        assert [position for _, _, position in verdicts.pending] == [0, 1, 2]
        monkeypatch.setattr(replay_verdicts._Verdicts, "BATCH_WAIT_S", 0.0)
        verdicts.settle_ready()  # waited long enough: the two go, one batch
        assert verdicts.queue == []
        assert [position for _, _, position in verdicts.pending][-2:] == [0, 1]
        alone = [replay.verify_one(str(exports / f"{p}.duckdb"), verdicts.trust) for p in names]
        gate.set()
        verdicts.drain()
    assert [pid for pid, _ in run.report.failed] == names
    assert [why for _, why in run.report.failed] == [summary.why for summary in alone]
    assert all(why for _, why in run.report.failed)
    assert run.report.to_json()["verifier_batches"] == {"2": 1, "3": 1}  # the batches' sizes


def test_a_lagging_verifier_is_waited_for_without_breaking_the_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the in-flight bound the replay waits for the oldest verdict handed out; the
    small exports queued meanwhile still go as full batches, not one by one (a verifier
    that lags must not lose the batches' saving exactly when it is needed)."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(replay_verdicts._Verdicts, "BATCH", 3)
    monkeypatch.setattr(replay_verdicts._Verdicts, "BATCH_WAIT_S", 3600.0)
    monkeypatch.setattr(replay_verdicts, "MAX_VERIFY_IN_FLIGHT", 4)
    run, exports, names, placements = _small_files(tmp_path, 7)
    with ThreadPoolExecutor(1) as pool:
        verdicts = replay_verdicts._Verdicts(run, exports, pool, placements)  # type: ignore[arg-type]
        for p in names:
            verdicts.exported([(p, "")])
            assert len(verdicts.pending) + len(verdicts.queue) <= 4  # the bound holds
        verdicts.drain()
    # two full batches, and the last one alone at the drain
    assert run.report.to_json()["verifier_batches"] == {"1": 1, "3": 2}
    assert [pid for pid, _ in run.report.failed] == names  # every verdict, in order


def test_the_replay_verifies_a_big_export_reading_its_ranges_in_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verify_one`` opens a big export's envelopes in the worker's own thread (the
    replay's cores are full: no thread pool), reading the chain-index ranges itself; a
    small export is read as planned rows. Both verify as ``verify_export`` says."""
    import threading

    from test_verifier_exports import small_scenario

    import verifier.walk as walk
    from proto.trust import dump_trust
    from verifier import limits as verifier_limits
    from verifier.verify import verify_export

    scenario = small_scenario(tmp_path, name="p-big", minutes=30)
    threads: list[int] = []
    real = walk.open_ranges

    def spy(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(walk, "open_ranges", spy)
    trust = dump_trust(scenario.trust)
    small = replay.verify_one(str(scenario.path), trust)
    assert threads == []  # a small export: its rows as planned
    monkeypatch.setattr(verifier_limits, "SMALL_EXPORT_BYTES", 0)  # every export big
    big = replay.verify_one(str(scenario.path), trust)
    assert threads and set(threads) == {threading.get_ident()}  # in this thread only
    alone = verify_export(scenario.path, scenario.trust)
    assert alone.ok and small.why == big.why == ""
    assert small.totals == big.totals == alone.totals
    assert small.records == big.records == alone.counts["records"] > 30
