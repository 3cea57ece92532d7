"""The input hashes a placement has seen (SPEC §6.1 (2)) as rows of ``placement_seen``.

Every chained input but an accepted usage event is remembered by its input hash, so a
re-delivery of it is dropped. A usage event of a node the terms do not list is rejected
and chained without any valid signature: kept in the snapshot, its hash was rewritten by
every later commit (quadratic bytes over a flood). The hashes are rows now, appended by
the batch that chains the inputs, in its transaction; the snapshot carries none and does
not grow with them. A restart, an eviction, a kill -9 anywhere in a commit, and the
migration of a version-4 store all read them back: duplicates stay dropped and the
records are those of an uninterrupted fold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pytest
from test_held_rows import ARRIVED, CAST, MINUTE, WS, Feed, events, terms_of

from devtools import builders as b
from ledger import snapshot
from ledger.fold import Fold
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.store import STORE_VERSION, Store

ROOT = Path(__file__).resolve().parent.parent


def intruders(pid: str, count: int) -> list[bytes]:
    """Usage events of node x0, which the terms do not list: each is rejected
    (NODE_UNKNOWN) and chained, its input hash seen."""
    g = b.gpu("x0", 0)
    writer = b.StreamWriter(CAST.node_key("x0"), pid, "x0")
    return [
        writer.event(WS + i * MINUTE, WS + (i + 1) * MINUTE, [b.sample(g)]) for i in range(count)
    ]


def reference_records(items: Sequence[Item]) -> dict[str, list[bytes]]:
    fold = Fold(CAST.ledger)
    out: dict[str, list[bytes]] = {}
    for item in items:
        for o in fold.apply(item.data, item.position, item.stream_key, item.arrived_ms):
            if o.decision == "chained":
                assert o.placement_id is not None and o.record_payload is not None
                out.setdefault(o.placement_id, []).append(o.record_payload)
    return out


def reference_fold(items: Sequence[Item]) -> Fold:
    fold = Fold(CAST.ledger)
    for item in items:
        fold.apply(item.data, item.position, item.stream_key, item.arrived_ms)
    return fold


def stored(store: Store) -> dict[str, list[bytes]]:
    return {p: store.record_payloads(p) for p in store.placements()}


def stored_snapshot(store: Store, pid: str) -> bytes:
    (data,) = store.query("SELECT snapshot FROM placement_state WHERE placement_id = ?", [pid])[0]
    return bytes(data)


def seen_rows(store: Store, pid: str) -> set[str]:
    rows = store.query("SELECT input_hash FROM placement_seen WHERE placement_id = ?", [pid])
    return {str(h) for (h,) in rows}


def ingest_in_batches(ingestor: Ingestor, items: Sequence[Item], size: int) -> None:
    for start in range(0, len(items), size):
        ingestor.ingest(items[start : start + size])


def test_seen_hashes_are_rows_and_the_snapshot_does_not_grow_with_them(tmp_path: Path) -> None:
    """130 or 250 rejected inputs: the same stored snapshot size (its seen is empty; the
    chain length is a msgpack uint8 in both), a row per seen hash; load_state gives the
    whole state back byte for byte."""
    sizes = {}
    for count in (130, 250):
        pid = "p-seen"
        feed = Feed()
        feed.add(pid, [b.signed_terms(CAST, terms_of(pid))])
        feed.add(pid, events(pid, 3))  # accepted usage: not in seen
        feed.add(pid, intruders(pid, count))
        db = tmp_path / f"{count}.duckdb"
        with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
            ingestor = Ingestor(store, CAST.ledger)
            ingest_in_batches(ingestor, feed.items, 25)
            ingestor.close()
            fold = reference_fold(feed.items)
            state = fold.state(pid)
            assert state is not None and len(state.seen) == 1 + count  # terms + rejected
            assert seen_rows(store, pid) == set(state.seen)
            data = stored_snapshot(store, pid)
            assert len(snapshot.decode(pid, data).seen) == 0
            assert store.load_state(pid) == fold.snapshot(pid)
            assert stored(store) == reference_records(feed.items)
            sizes[count] = len(data)
    assert sizes[130] == sizes[250]


def test_duplicates_of_rejected_inputs_are_dropped_after_a_restart_and_an_eviction(
    tmp_path: Path,
) -> None:
    pid = "p-dup"
    feed = Feed()
    flood = intruders(pid, 40)
    first = feed.add(pid, [b.signed_terms(CAST, terms_of(pid))]) + feed.add(pid, flood)
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        ingestor = Ingestor(store, CAST.ledger)
        ingest_in_batches(ingestor, first, 16)
        ingestor.close()
    again = feed.add(pid, flood)  # re-delivered at new positions
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        ingestor = Ingestor(store, CAST.ledger)  # restored by open_states
        report = ingestor.ingest(again[:20])
        assert (report.dropped, report.chained) == (20, 0)
        ingestor.fold.evict(pid)  # restored by load_state
        report = ingestor.ingest(again[20:])
        assert (report.dropped, report.chained) == (20, 0)
        more = feed.add(pid, [b.signed_terms(CAST, terms_of(pid)), *events(pid, 2)])
        report = ingestor.ingest(more)  # the terms again: a duplicate too
        assert (report.dropped, report.chained) == (1, 2)
        ingestor.close()
        assert stored(store) == reference_records(feed.items)
        state = reference_fold(feed.items).state(pid)
        assert state is not None and seen_rows(store, pid) == set(state.seen)


# ---- kill -9 in the middle of a commit --------------------------------------------------------

_CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_seen_rows as t
from ledger.ingest import Ingestor
from ledger.store import Store

feed = t.Feed()
pid = "p-kill"
terms = feed.add(pid, [t.b.signed_terms(t.CAST, t.terms_of(pid))])
flood = t.intruders(pid, {count})
first = feed.add(pid, flood[: {count} // 2])
second = feed.add(pid, flood[{count} // 2 :])
store = Store(Path({db!r}), ledger_public_key=t.CAST.ledger.public_key)
ingestor = Ingestor(store, t.CAST.ledger)
if {phase!r} == "first":
    ingestor.ingest(terms + first)
    os._exit(0)
append = store._append

def killing_append(table, rows, **kw):
    append(table, rows, **kw)
    if table == {table!r}:  # inside the second batch's transaction, before its COMMIT
        os.kill(os.getpid(), signal.SIGKILL)

store._append = killing_append
ingestor.ingest(second)
os._exit(3)  # not reached
"""


def _child(db: Path, phase: str, table: str, count: int) -> int:
    code = _CHILD.format(
        tests=str(ROOT / "tests"), db=str(db), phase=phase, table=table, count=count
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, timeout=120, check=False
    ).returncode


@pytest.mark.parametrize("table", ["record_rows", "placement_state", "placement_seen"])
def test_kill_nine_in_the_middle_of_a_commit_keeps_seen_and_snapshot_together(
    tmp_path: Path, table: str
) -> None:
    """SIGKILL inside the transaction of a batch of rejected inputs (after its records,
    after its snapshot, after its seen rows): the store is as before the batch; run
    again, the records are those of an uninterrupted fold and every duplicate drops."""
    count = 24
    db = tmp_path / "ledger.duckdb"
    assert _child(db, "first", table, count) == 0
    assert _child(db, "second", table, count) == -signal.SIGKILL
    pid = "p-kill"
    feed = Feed()
    terms = feed.add(pid, [b.signed_terms(CAST, terms_of(pid))])
    flood = intruders(pid, count)
    first = feed.add(pid, flood[: count // 2])
    second = feed.add(pid, flood[count // 2 :])
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        assert len(seen_rows(store, pid)) == 1 + count // 2
        assert store.offsets() == {"t:0": f"t:0:{1 + count // 2}"}
        assert len(store.record_payloads(pid)) == 1 + count // 2
        ingestor = Ingestor(store, CAST.ledger)
        assert ingestor.ingest(second).chained == count - count // 2
        assert stored(store) == reference_records(terms + first + second)
        report = ingestor.ingest(feed.add(pid, flood))
        assert (report.dropped, report.chained) == (count, 0)
        ingestor.close()
        assert len(seen_rows(store, pid)) == 1 + count


# ---- migration from store version 4 ---------------------------------------------------------


def test_a_version_4_store_with_seen_in_snapshots_is_migrated_to_rows(tmp_path: Path) -> None:
    """A store of version 4 kept seen in the snapshots: migrated in one transaction, the
    hashes are rows, the snapshots carry none, and the fold goes on as it would have
    (duplicates of inputs seen before the migration dropped)."""
    feed = Feed()
    flood = intruders("p-a", 6)
    first = feed.add("p-a", [b.signed_terms(CAST, terms_of("p-a")), *flood])
    first += feed.add("p-b", [b.signed_terms(CAST, terms_of("p-b")), *events("p-b", 2)])
    first += feed.add("p-c", events("p-c", 2))  # held, nothing seen
    fold = reference_fold(first)
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        ingestor = Ingestor(store, CAST.ledger)
        ingestor.ingest(first)
        ingestor.close()
    # Rewrite it as version 4 wrote it: snapshots with seen (without holds), no table.
    with duckdb.connect(str(db)) as con:
        con.execute("DROP TABLE placement_seen")
        for pid in ("p-a", "p-b", "p-c"):
            con.execute(
                "UPDATE placement_state SET snapshot = ? WHERE placement_id = ?",
                [fold.snapshot(pid, holds=False), pid],
            )
        con.execute("UPDATE meta SET value = '4' WHERE key = 'store_version'")
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'store_version'") == [
            (STORE_VERSION,)
        ]
        for pid in ("p-a", "p-b", "p-c"):
            state = fold.state(pid)
            assert state is not None
            assert seen_rows(store, pid) == set(state.seen)
            assert len(snapshot.decode(pid, stored_snapshot(store, pid)).seen) == 0
            assert store.load_state(pid) == fold.snapshot(pid)  # byte for byte
        assert len(seen_rows(store, "p-a")) == 7 and seen_rows(store, "p-c") == set()
        rest = feed.add("p-a", flood) + feed.add("p-c", [b.signed_terms(CAST, terms_of("p-c"))])
        ingestor = Ingestor(store, CAST.ledger)
        report = ingestor.ingest(rest)
        assert report.dropped == 6
        ingestor.close()
        assert stored(store) == reference_records(feed.items)


# ---- the snapshot codec ---------------------------------------------------------------------


def test_split_and_with_seen_are_inverse() -> None:
    pid = "p-codec"
    fold = Fold(CAST.ledger)
    raws = [b.signed_terms(CAST, terms_of(pid)), *intruders(pid, 5)]
    for i, raw in enumerate(raws):
        fold.apply(raw, f"c:{i}", pid, ARRIVED + i)
    whole = fold.snapshot(pid)
    split = snapshot.split_seen(pid, whole)
    assert split is not None
    without, hashes = split
    assert without == fold.snapshot(pid, seen=False)
    assert len(hashes) == 6 and hashes == sorted(hashes)
    assert snapshot.with_seen(pid, without, list(reversed(hashes))) == whole
    assert snapshot.split_seen(pid, without) is None
    assert snapshot.with_seen(pid, without, []) == without
    with pytest.raises(snapshot.SnapshotError):
        snapshot.with_seen(pid, whole, hashes)
