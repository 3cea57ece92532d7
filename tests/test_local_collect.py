"""The embedded transport's spools are collected once the ledger has read them (issue 15).

An agent with ``collect_read`` deletes the segments of its spool that every ledger reading
its ``local_dir`` has durably appended to its intake log (the READ file of
``transport.intake``), as a Kafka shipper deletes what the broker acknowledged. The
spool stays small while the ledger reaches the same chain heads and final statements
as a ledger over spools that are never collected; a kill -9 at any point of the
collection (and of the ledger between its intake append and its READ file) loses
nothing and folds nothing twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools import builders
from ledger.service import LedgerService
from ledger.store import Store
from meter.agent import HEADS_FILE, Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.records import PlacementTerms
from transport.intake import (
    READ_FILE,
    ReadByLedgers,
    intake_dir_for,
    read_position,
    store_read,
)
from transport.limits import LOCAL_SEAL_READ_BYTES, MAX_READ_FILE_BYTES
from transport.local import node_source, publish_local, publisher_source
from transport.positions import SpoolPosition
from transport.spool import list_segments, segment_path

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
STEP_MS = 10 * MINUTE_MS
STEPS = 30  # 5 h: the 4 h window, its grace, the close
KILL_AT_STEP = 8
SEGMENT_BYTES = 4096  # below one step's events: every step's append starts a segment
SEAL_BYTES = 2048
NODE = "n1"


def _terms() -> tuple[builders.Cast, PlacementTerms]:
    cast = builders.make_cast("local-collect")
    gpus = [builders.gpu(NODE, 0), builders.gpu(NODE, 1, share_milli=500)]
    return cast, builders.make_terms(cast, "lc1", gpus, T0, T0 + 4 * HOUR_MS)


def _spool(root: Path) -> Path:
    return root / "local" / node_source(NODE)


def segment_bytes(spool: Path) -> int:
    """Bytes of the segment files a spool directory holds now."""
    return sum(segment_path(spool, n).stat().st_size for n in list_segments(spool))


def drive(
    root: Path,
    *,
    collect: bool,
    first_step: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> int:
    """Agent ticks, ledger reads, step by step from ``first_step`` (the step an earlier,
    killed run was in: ``root/STEP``); the most segment bytes the spool held."""
    cast, terms = _terms()
    local = root / "local"
    clock = SimClock(T0 + first_step * STEP_MS)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, NODE)]
    config = AgentConfig(
        NODE,
        cast.node_key(NODE),
        (terms,),
        _spool(root),
        segment_max_bytes=SEGMENT_BYTES,
        seal_acked_bytes=SEAL_BYTES,
        delivered_on_spool=True,
        collect_read=collect,
    )
    if first_step == 0:
        publish_local(local, publisher_source("desk"), [builders.signed_terms(cast, terms)])
    agent = Agent(config, Simulator(parse_sim_spec("seed=5"), devices, T0), clock)
    store = Store(root / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=local, clock=clock.now_ms
    )
    peak = 0
    try:
        for step in range(first_step, STEPS):
            (root / "STEP").write_text(str(step))
            if on_step is not None:
                on_step(step)
            clock.set(T0 + (step + 1) * STEP_MS)
            agent.tick()
            peak = max(peak, segment_bytes(_spool(root)))
            service.run_until_idle()
    finally:
        agent.close()
        service.close()
    return peak


def results(root: Path) -> tuple[dict[str, tuple[int, str]], dict[str, bytes], list[tuple]]:
    """Chain heads, final statements, and (kind, status, reason, count) of the inputs."""
    with Store(root / "ledger.duckdb") as store:
        statements = store.query("SELECT placement_id, envelope FROM statements WHERE final")
        inputs = store.query(
            "SELECT kind, status, reason, count(*) FROM inputs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        )
        return store.heads(), {str(p): bytes(e) for p, e in statements}, inputs


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple]:
    """The same run over spools that are never collected."""
    root = tmp_path_factory.mktemp("never-collected")
    drive(root, collect=False)
    return root, results(root)


def test_read_segments_are_collected_and_the_results_are_the_same(
    tmp_path: Path, reference: tuple[Path, tuple]
) -> None:
    ref_root, ref_results = reference
    peak = drive(tmp_path, collect=True)
    kept = segment_bytes(ref_root / "local" / node_source(NODE))
    heads, statements, inputs = ref_results
    assert heads
    assert statements and results(tmp_path) == ref_results
    assert ("usage", "accepted", "", 24 * 10) in inputs  # every event, once
    # Before each append the spool held at most the last step's segment (read, sealed)
    # and after it the new one: never more than two steps' events, of 240.
    assert kept > 10 * peak
    assert segment_bytes(_spool(tmp_path)) <= peak
    assert (_spool(tmp_path) / HEADS_FILE).exists()


_KILL_POINTS = {
    # the agent read a new READ position and is about to collect
    "before_collect": ("meter.agent", "Agent", "collect_garbage"),
    # the segment being written was sealed (a new, empty one created): heads not saved
    "after_seal": ("meter.agent", "Agent", "save_heads"),
    # the ledger appended to its intake log (fdatasync) and did not state it in READ
    "before_read_file": ("ledger.consume", None, "store_read"),
}


def _child(root: str, point: str) -> None:
    """Run ``drive`` and SIGKILL this process at ``point`` once KILL_AT_STEP is reached."""
    import importlib

    def kill(*_: object, **__: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def arm(step: int) -> None:
        if step != KILL_AT_STEP:
            return
        if point == "mid_delete":  # after the first segment file of a collection is gone
            real = Path.unlink

            def unlink(self: Path, missing_ok: bool = False) -> None:
                real(self, missing_ok)
                if self.suffix == ".seg":
                    kill()

            Path.unlink = unlink  # type: ignore[method-assign]
            return
        module_name, class_name, name = _KILL_POINTS[point]
        module = importlib.import_module(module_name)
        owner = getattr(module, class_name) if class_name else module
        setattr(owner, name, kill)

    drive(Path(root), collect=True, on_step=arm)


@pytest.mark.parametrize("point", [*_KILL_POINTS, "mid_delete"])
def test_a_kill_during_collection_loses_nothing_and_folds_nothing_twice(
    tmp_path: Path, reference: tuple[Path, tuple], point: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    code = f"import test_local_collect as t; t._child({str(tmp_path)!r}, {point!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    killed_at = int((tmp_path / "STEP").read_text())
    assert killed_at == KILL_AT_STEP
    drive(tmp_path, collect=True, first_step=killed_at)  # both restart from their files
    assert results(tmp_path) == reference[1]
    assert segment_bytes(_spool(tmp_path)) < segment_bytes(reference[0] / "local" / "node-n1") / 10


def test_nothing_is_collected_unless_every_ledger_has_read_it(tmp_path: Path) -> None:
    """ReadByLedgers: the least position over every intake log in the directory; None when
    one has no READ file, does not name the spool, or its file is not whole."""
    local = tmp_path / "local"
    first, second = intake_dir_for(local, "a"), intake_dir_for(local, "b")
    first.mkdir(parents=True)
    read = ReadByLedgers(local, "node-n1")
    assert read.position() is None  # no READ file yet
    store_read(first, {"node-n1": SpoolPosition(3, 100), "node-n2": SpoolPosition(9, 9)})
    assert read.position() == SpoolPosition(3, 100)
    assert read.position(only_if_changed=True) is None  # nothing new
    second.mkdir()
    assert read.position() is None  # ledger b has read nothing
    store_read(second, {"node-n1": SpoolPosition(2, 5000)})
    assert read.position(only_if_changed=True) == SpoolPosition(2, 5000)
    store_read(second, {"node-n2": SpoolPosition(2, 5000)})
    assert read.position() is None  # b never read node-n1
    whole = (first / READ_FILE).read_bytes()
    assert read_position(whole, "node-n1") == SpoolPosition(3, 100)
    assert read_position(whole, "node-n") is None
    for cut in range(len(whole)):  # any prefix (a crash before the data reached the disk)
        assert read_position(whole[:cut], "node-n1") is None
    assert read_position(b"\0" * len(whole), "node-n1") is None


def test_a_read_position_past_the_spool_end_is_ignored(tmp_path: Path) -> None:
    """A spool replaced under the same name (the ledger read further than it holds): the
    agent collects nothing."""
    cast, terms = _terms()
    local = tmp_path / "local"
    clock = SimClock(T0)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, NODE)]
    config = AgentConfig(
        NODE,
        cast.node_key(NODE),
        (terms,),
        _spool(tmp_path),
        segment_max_bytes=SEGMENT_BYTES,
        seal_acked_bytes=SEAL_BYTES,
        collect_read=True,
    )
    agent = Agent(config, Simulator(parse_sim_spec("seed=5"), devices, T0), clock)
    try:
        for step in range(4):
            clock.set(T0 + (step + 1) * STEP_MS)
            agent.tick()
        intake = intake_dir_for(local, "ledger-1")
        intake.mkdir()
        store_read(intake, {node_source(NODE): SpoolPosition(99, 0)})
        held = list_segments(_spool(tmp_path))
        clock.set(T0 + 5 * STEP_MS)
        agent.tick()
        assert list_segments(_spool(tmp_path))[: len(held)] == held
        # and the position it has really read: everything before it goes
        store_read(intake, {node_source(NODE): agent.spool.end_position()})
        clock.set(T0 + 6 * STEP_MS)
        agent.tick()
        assert len(list_segments(_spool(tmp_path))) == 1
    finally:
        agent.close()


def test_a_read_file_up_to_the_bound_is_read_one_byte_more_is_not(tmp_path: Path) -> None:
    local = tmp_path / "local"
    intake = intake_dir_for(local, "ledger-1")
    intake.mkdir(parents=True)
    store_read(intake, {"node-n1": SpoolPosition(4, 40), "x": SpoolPosition(0, 0)})
    whole = (intake / READ_FILE).read_bytes()
    filler = "x" * (MAX_READ_FILE_BYTES - len(whole) + 1)
    store_read(intake, {"node-n1": SpoolPosition(4, 40), filler: SpoolPosition(0, 0)})
    assert (intake / READ_FILE).stat().st_size == MAX_READ_FILE_BYTES
    assert ReadByLedgers(local, "node-n1").position() == SpoolPosition(4, 40)
    store_read(intake, {"node-n1": SpoolPosition(4, 40), filler + "x": SpoolPosition(0, 0)})
    assert ReadByLedgers(local, "node-n1").position() is None


def test_publisher_spools_are_collected_once_read_from_the_seal_bound(tmp_path: Path) -> None:
    """publish_local collects too (the publishers' and the ledger's own close spools): a
    segment all read that holds LOCAL_SEAL_READ_BYTES is sealed and deleted before the
    next append; one below the bound stays; nothing unread is touched."""
    cast = builders.make_cast("local-collect-publish")
    local = tmp_path / "local"
    source = publisher_source("desk")
    spool = local / source
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="ledger-1", local_dir=local, clock=lambda: T0
    )

    def terms(n: int) -> bytes:
        gpus = [builders.gpu(f"p{n}", 0)]
        return builders.signed_terms(
            cast, builders.make_terms(cast, f"t{n}", gpus, T0, T0 + HOUR_MS)
        )

    try:
        publish_local(local, source, [terms(0)])
        service.run_until_idle()
        publish_local(local, source, [terms(1)])  # all read, below the bound: kept
        assert list_segments(spool) == [0]
        batch = [terms(n) for n in range(2, 400)]
        size = sum(len(t) for t in batch)
        assert size >= LOCAL_SEAL_READ_BYTES
        publish_local(local, source, batch)
        publish_local(local, source, [terms(400)])  # not read yet: kept
        assert list_segments(spool) == [0]
        service.run_until_idle()
        publish_local(local, source, [terms(401)])  # all read, past the bound: collected
        assert list_segments(spool) == [1] and segment_bytes(spool) < 4096
        service.run_until_idle()
        accepted = store.query(
            "SELECT count(*) FROM inputs WHERE kind = 'terms' AND status = 'accepted'"
        )
        assert accepted == [(402,)]
    finally:
        service.close()
