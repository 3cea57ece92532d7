"""The Ingestor pauses the cyclic collector for a batch's fold and commit (issue 15: a
collection inside a batch traversed its tens of thousands of live outcomes and rows for
nothing) and always puts it back as it found it — after a good batch, a failed commit, or
when the caller had it off. Real signed inputs, a real DuckDB store."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger.ingest import IngestBroken, Ingestor, pause_collector, resume_collector
from ledger.inputs import Item
from ledger.store import Store

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000
PID = "pl-gc"
EVENTS = 300


def _items() -> tuple[object, list[Item]]:
    cast = make_cast("gc")
    g = gpu(f"{PID}-n0", 0)
    raws = [signed_terms(cast, make_terms(cast, PID, [g], T0_MS, T0_MS + 400 * INTERVAL_MS))]
    writer = StreamWriter(cast.node_key(g.node_id), PID, g.node_id)
    for e in range(EVENTS):
        start = T0_MS + e * INTERVAL_MS
        raws.append(writer.event(start, start + INTERVAL_MS, [sample(g)]))
    return cast, [
        Item(raw, f"kafka:t:0:{i}", PID, "kafka:t:0", str(i + 1), T0_MS + 500 * INTERVAL_MS)
        for i, raw in enumerate(raws)
    ]


@pytest.fixture
def low_threshold() -> Iterator[None]:
    """A first-generation threshold low enough that a 300-input fold would collect."""
    before = gc.get_threshold()
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()
        else:
            gc.disable()


def test_no_collection_inside_a_batch_and_the_collector_back_on(
    tmp_path: Path, low_threshold: None
) -> None:
    cast, items = _items()
    store = Store(tmp_path / "gc.duckdb", ledger_public_key=cast.ledger.public_key)  # type: ignore[attr-defined]
    ingestor = Ingestor(store, cast.ledger)  # type: ignore[attr-defined]
    seen: list[bool] = []
    inside = [False]  # from the fold's start to the commit's end
    fold_batch = ingestor.fold.apply_batch
    commit = store.commit_batch

    def apply_batch(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        inside[0] = True
        return fold_batch(*args, **kwargs)  # type: ignore[arg-type]

    def commit_batch(*args: object) -> None:
        seen.append(gc.isenabled())
        try:
            commit(*args)  # type: ignore[arg-type]
        finally:
            inside[0] = False

    ingestor.fold.apply_batch = apply_batch  # type: ignore[method-assign]
    store.commit_batch = commit_batch  # type: ignore[method-assign]
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and inside[0]:
            collections.append(info["generation"])

    try:
        gc.enable()
        gc.set_threshold(100, 10, 10)  # after the Ingestor raised it: collect often
        gc.callbacks.append(count)
        try:
            report = ingestor.ingest(items[:200])
        finally:
            gc.callbacks.remove(count)
        assert report.chained == 200
        assert seen == [False, False]  # the fold and the commit ran with it off
        assert collections == []
        assert gc.isenabled()

        # The caller had it off: it stays off.
        gc.disable()
        report = ingestor.ingest(items[200:250])
        assert report.chained == 50
        assert not gc.isenabled()
        gc.enable()

        # A failed commit puts it back on too, and the Ingestor refuses more batches.
        store.close()
        with pytest.raises(duckdb.Error):  # the closed connection
            ingestor.ingest(items[250:])
        assert gc.isenabled()
        with pytest.raises(IngestBroken):
            ingestor.ingest(items[250:])
    finally:
        ingestor.close()


def test_a_paused_collector_resumes_to_its_previous_state(low_threshold: None) -> None:
    gc.enable()
    was_enabled = pause_collector()
    assert not gc.isenabled()
    resume_collector(was_enabled)
    assert gc.isenabled()
    gc.disable()
    was_enabled = pause_collector()
    assert not gc.isenabled()
    resume_collector(was_enabled)
    assert not gc.isenabled()
