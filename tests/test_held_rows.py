"""Held inputs (SPEC §6.2) as rows of the store's ``held_inputs``, and the ledger-wide bound.

A held input's raw bytes are written once, as a row, in the transaction of the batch that
holds it, and deleted in the transaction of the batch that releases it (terms accepted,
its stream advanced, the close flush); the placement's snapshot carries none of them. A
restart (or a kill -9 anywhere) reads the rows back and gives the records an uninterrupted
fold gives. The ledger-wide bound (``MAX_HELD_BYTES_LEDGER``, shrunk here through the
Ingestor's override) quarantines what would pass it, counted over every placement and
restored from the rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pytest

from devtools import builders as b
from ledger import snapshot
from ledger.fold import Fold
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.store import STORE_VERSION, Store
from proto import limits
from proto.envelope import open_envelope
from proto.records import PlacementTerms

ROOT = Path(__file__).resolve().parent.parent
WS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000
MINUTE = 60_000
CAST = b.make_cast("held-rows")
ARRIVED = WS + 2 * HOUR  # the log's clock for every input (after each event's end)


def terms_of(pid: str) -> PlacementTerms:
    """One whole GPU of node n0 for an hour: a GPU of its own per placement (SPEC §6.5)."""
    return b.make_terms(CAST, pid, [b.gpu("n0", zlib.crc32(pid.encode()) % 256)], WS, WS + HOUR)


def events(pid: str, count: int) -> list[bytes]:
    """Usage events seq 0 .. count-1 of node n0, a minute each."""
    terms = terms_of(pid)
    writer = b.StreamWriter(CAST.node_key("n0"), pid, "n0")
    samples = [b.sample(g) for g in terms.gpus]
    return [writer.event(WS + i * MINUTE, WS + (i + 1) * MINUTE, samples) for i in range(count)]


class Feed:
    """Inputs at positions t:0:0, t:0:1, ... in one ordered stream, cut into batches."""

    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, pid: str, raws: Sequence[bytes]) -> list[Item]:
        out = []
        for raw in raws:
            i = len(self.items)
            item = Item(raw, f"t:0:{i}", pid, "t:0", f"t:0:{i + 1}", ARRIVED + i)
            self.items.append(item)
            out.append(item)
        return out


def reference(items: Sequence[Item], max_held_bytes: int | None = None) -> list[tuple[str, ...]]:
    """(decision, position, status/reason, record hash) of an uninterrupted fold."""
    fold = Fold(CAST.ledger, max_held_bytes=max_held_bytes)
    out = []
    for item in items:
        for o in fold.apply(item.data, item.position, item.stream_key, item.arrived_ms):
            out.append((o.decision, o.position, str(o.status or o.reason), o.record_hash or ""))
    return out


def stored(store: Store) -> dict[str, list[bytes]]:
    return {p: store.record_payloads(p) for p in store.placements()}


def reference_records(items: Sequence[Item]) -> dict[str, list[bytes]]:
    fold = Fold(CAST.ledger)
    out: dict[str, list[bytes]] = {}
    for item in items:
        for o in fold.apply(item.data, item.position, item.stream_key, item.arrived_ms):
            if o.decision == "chained":
                assert o.placement_id is not None and o.record_payload is not None
                out.setdefault(o.placement_id, []).append(o.record_payload)
    return out


def held_rows(store: Store) -> list[tuple[str, str, int | None, int, str | None, int | None]]:
    """(placement, position, arrived_ms, raw length, node_id, seq) in the order held."""
    return [
        (str(p), str(q), a, int(n), d, s)
        for p, q, a, n, d, s in store.query(
            "SELECT placement_id, position, arrived_ms, octet_length(raw), node_id, seq "
            "FROM held_inputs ORDER BY ordinal"
        )
    ]


def snapshot_holds(store: Store, pid: str) -> tuple[int, int, int]:
    """(held, stream holds, held arrivals) in the STORED snapshot bytes (not merged)."""
    (data,) = store.query("SELECT snapshot FROM placement_state WHERE placement_id = ?", [pid])[0]
    state = snapshot.decode(pid, bytes(data))
    return (
        len(state.held),
        sum(len(h) for h in state.stream_held.values()),
        len(state.held_arrived),
    )


# ---- before the terms ---------------------------------------------------------------------


def test_held_inputs_are_rows_not_snapshot_and_survive_a_restart_in_order(tmp_path: Path) -> None:
    pid = "p-rows"
    feed = Feed()
    evs = events(pid, 7)
    # Held out of seq order too: the release keeps arrival order (SPEC §6.2).
    first = feed.add(pid, [evs[0], evs[2], evs[1]])
    second = feed.add(pid, [evs[3], evs[5], evs[4], evs[6]])
    terms = feed.add(pid, [b.signed_terms(CAST, terms_of(pid))])
    db = tmp_path / "ledger.duckdb"
    for batch in (first, second):
        with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
            ingestor = Ingestor(store, CAST.ledger)
            report = ingestor.ingest(batch)
            ingestor.close()
            assert report.held == len(batch)
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        rows = held_rows(store)
        assert [r[1] for r in rows] == [i.position for i in first + second]
        assert [r[2] for r in rows] == [i.arrived_ms for i in first + second]
        assert [r[3] for r in rows] == [len(i.data) for i in first + second]
        assert all(r[4] is None and r[5] is None for r in rows)  # not stream holds
        assert snapshot_holds(store, pid) == (0, 0, 0)  # no held byte in the snapshot
        summary = store.held(pid)
        assert summary is not None and summary.count == 7 and summary.since_ms == ARRIVED
        # A restart: the rows come back into the fold, in the order held.
        ingestor = Ingestor(store, CAST.ledger)
        restored = ingestor.fold.state(pid)
        assert restored is not None
        assert [p for _, p in restored.held] == [i.position for i in first + second]
        assert ingestor.fold.held_bytes == sum(len(i.data) for i in first + second)
        report = ingestor.ingest(terms)
        ingestor.close()
        assert report.chained == 8
        assert held_rows(store) == []  # released in the batch that chained them
        assert store.held(pid) is None
        assert stored(store) == reference_records(feed.items)


# ---- stream holds ---------------------------------------------------------------------------


def test_stream_holds_are_rows_released_as_the_stream_advances(tmp_path: Path) -> None:
    pid = "p-stream"
    feed = Feed()
    evs = events(pid, 6)
    start = feed.add(pid, [b.signed_terms(CAST, terms_of(pid)), evs[0]])
    gap = feed.add(pid, [evs[3], evs[2], evs[5]])  # seq 1 missing: 2, 3, 5 wait
    fill = feed.add(pid, [evs[1]])  # releases 2 and 3; 5 waits for 4
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        for batch in (start, gap):
            ingestor = Ingestor(store, CAST.ledger)
            ingestor.ingest(batch)
            ingestor.close()
        assert [(r[1], r[4], r[5]) for r in held_rows(store)] == [
            ("t:0:2", "n0", 3),
            ("t:0:3", "n0", 2),
            ("t:0:4", "n0", 5),
        ]
        assert snapshot_holds(store, pid) == (0, 0, 0)
        ingestor = Ingestor(store, CAST.ledger)  # restart: stream holds from the rows
        state = ingestor.fold.state(pid)
        assert state is not None and sorted(state.stream_held["n0"]) == [2, 3, 5]
        report = ingestor.ingest(fill)
        assert report.chained == 3
        assert [(r[1], r[5]) for r in held_rows(store)] == [("t:0:4", 5)]
        # The close flushes seq 5 as SEQ_GAP: its row goes with the flush.
        close = feed.add(pid, [b.closed(CAST, pid, WS + HOUR + 300_000)])
        ingestor.ingest(close)
        ingestor.close()
        assert held_rows(store) == []
        assert stored(store) == reference_records(feed.items)
        reasons = store.query(
            "SELECT position, reason FROM inputs WHERE reason = 'SEQ_GAP' ORDER BY 1"
        )
        assert reasons == [("t:0:4", "SEQ_GAP")]


def test_inputs_held_before_terms_beyond_a_gap_become_stream_hold_rows(tmp_path: Path) -> None:
    """Terms release the inputs held before them; one beyond a gap is held again, in its
    stream, in the same batch: its row is renewed as a stream hold."""
    pid = "p-rehold"
    feed = Feed()
    evs = events(pid, 4)
    before = feed.add(pid, [evs[0], evs[2], evs[3]])
    terms = feed.add(pid, [b.signed_terms(CAST, terms_of(pid))])
    fill = feed.add(pid, [evs[1]])
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        for batch in (before, terms):
            ingestor = Ingestor(store, CAST.ledger)
            ingestor.ingest(batch)
            ingestor.close()
        # Held again as they are released: after the terms (SPEC §6.6, max(a_prev, own)).
        assert [(r[1], r[2], r[4], r[5]) for r in held_rows(store)] == [
            ("t:0:1", ARRIVED + 3, "n0", 2),
            ("t:0:2", ARRIVED + 3, "n0", 3),
        ]
        ingestor = Ingestor(store, CAST.ledger)
        ingestor.ingest(fill)
        ingestor.close()
        assert held_rows(store) == []
        assert stored(store) == reference_records(feed.items)


# ---- the ledger-wide bound ------------------------------------------------------------------


def test_the_ledger_wide_bound_counts_every_placement_and_is_restored_from_rows(
    tmp_path: Path,
) -> None:
    feed = Feed()
    a, c = events("p-a", 3), events("p-c", 2)
    size = len(a[0])
    assert all(len(raw) == size for raw in a + c)
    bound = 3 * size  # room for three held inputs over the ledger
    held_a = feed.add("p-a", a[:2])
    held_c = feed.add("p-c", c[:1])
    over = feed.add("p-c", c[1:2])  # a fourth: past the ledger-wide bound
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        ingestor = Ingestor(store, CAST.ledger, max_held_bytes=bound)
        assert ingestor.ingest(held_a + held_c).held == 3
        ingestor.close()
        ingestor = Ingestor(store, CAST.ledger, max_held_bytes=bound)  # restart
        assert ingestor.fold.held_bytes == 3 * size
        report = ingestor.ingest(over)
        assert (report.held, report.quarantined) == (0, 1)
        reason, detail = store.query("SELECT reason, detail FROM quarantine")[0]
        assert reason == "UNKNOWN_PLACEMENT" and detail.startswith("ledger-wide")
        # p-a's terms release its two: the room is back, p-c's next input is held.
        released = feed.add("p-a", [b.signed_terms(CAST, terms_of("p-a"))])
        again = feed.add("p-c", c[1:2])
        report = ingestor.ingest(released + again)
        ingestor.close()
        assert (report.chained, report.held) == (3, 1)
        assert [r[0] for r in held_rows(store)] == ["p-c", "p-c"]
    # The fold with the same bound over the same order decides alike.
    assert [d for d, *_ in reference(feed.items, bound)] == (
        ["held"] * 3 + ["quarantined"] + ["chained"] * 3 + ["held"]
    )


def test_the_ledger_wide_bound_quarantines_a_stream_hold_as_hold_full() -> None:
    pid = "p-wide"
    evs = events(pid, 4)
    fold = Fold(CAST.ledger, max_held_bytes=len(evs[2]) + len(evs[3]) - 1)
    assert fold.apply(b.signed_terms(CAST, terms_of(pid)), "x:0", pid)[0].status == "accepted"
    assert [o.decision for o in fold.apply(evs[2], "x:1", pid)] == ["held"]
    (over,) = fold.apply(evs[3], "x:2", pid)
    assert (over.decision, str(over.reason)) == ("quarantined", "HOLD_FULL")
    assert over.detail.startswith("ledger-wide")
    (full,) = fold.apply(evs[1], "x:3", pid)  # seq 1 would wait too: no room either
    assert (full.decision, str(full.reason)) == ("quarantined", "HOLD_FULL")
    assert [o.decision for o in fold.apply(evs[0], "x:4", pid)] == ["chained"]
    assert fold.held_bytes == len(evs[2])  # seq 2 still waits for seq 1
    # Seq 1 again: chained, and releases seq 2 (the room it leaves is the ledger's again).
    assert [o.status for o in fold.apply(evs[1], "x:5", pid)] == ["accepted", "accepted"]
    assert fold.held_bytes == 0


# ---- kill -9 in the middle of a release -----------------------------------------------------

_CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import test_held_rows as t
from ledger.ingest import Ingestor
from ledger.store import Store

feed = t.Feed()
pid = "p-kill"
evs = t.events(pid, {count})
held = feed.add(pid, evs)
terms = feed.add(pid, [t.b.signed_terms(t.CAST, t.terms_of(pid))])
store = Store(Path({db!r}), ledger_public_key=t.CAST.ledger.public_key)
ingestor = Ingestor(store, t.CAST.ledger)
if {phase!r} == "hold":
    ingestor.ingest(held)
    os._exit(0)
append = store._append

def killing_append(table, rows, **kw):
    append(table, rows, **kw)
    if table == {table!r}:  # inside the release's transaction, before its COMMIT
        os.kill(os.getpid(), signal.SIGKILL)

store._append = killing_append
ingestor.ingest(terms)
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


@pytest.mark.parametrize("table", ["record_rows", "offsets", "capacity_claims"])
def test_kill_nine_in_the_middle_of_a_release_keeps_the_holds(tmp_path: Path, table: str) -> None:
    """SIGKILL inside the transaction that releases held inputs (after the records, after
    the held rows' delete, after their last write): the store is as before the batch; run
    again, the records are those of an uninterrupted fold."""
    count = 12
    db = tmp_path / "ledger.duckdb"
    assert _child(db, "hold", table, count) == 0
    assert _child(db, "release", table, count) == -signal.SIGKILL
    pid = "p-kill"
    feed = Feed()
    feed.add(pid, events(pid, count))
    terms = feed.add(pid, [b.signed_terms(CAST, terms_of(pid))])
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        assert len(held_rows(store)) == count and stored(store) == {}
        assert store.offsets() == {"t:0": f"t:0:{count}"}
        ingestor = Ingestor(store, CAST.ledger)
        assert ingestor.ingest(terms).chained == count + 1
        ingestor.close()
        assert held_rows(store) == []
        assert stored(store) == reference_records(feed.items)


# ---- migration from store version 3 ---------------------------------------------------------


def test_a_version_3_store_holding_inputs_is_migrated_to_rows(tmp_path: Path) -> None:
    """A store of version 3 kept held inputs in snapshots (and a row per input ever held,
    released ones too, without bytes): migrated in one transaction, the holds are rows,
    the snapshots carry none, and the fold goes on as it would have."""
    feed = Feed()
    r, s = events("p-r", 4), events("p-s", 5)
    first = feed.add("p-r", r[:2]) + feed.add("p-s", [b.signed_terms(CAST, terms_of("p-s"))])
    first += feed.add("p-s", [s[0], s[3], s[2]])
    rest = feed.add("p-r", [b.signed_terms(CAST, terms_of("p-r")), r[2], r[3]])
    rest += feed.add("p-s", [s[1], s[4]])
    fold = Fold(CAST.ledger)
    for item in first:
        fold.apply(item.data, item.position, item.stream_key, item.arrived_ms)
    db = tmp_path / "ledger.duckdb"
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        ingestor = Ingestor(store, CAST.ledger)
        ingestor.ingest(first)
        ingestor.close()
    # Rewrite it as version 3 wrote it: whole snapshots, held_inputs of three columns
    # with a row per input ever held (here also a stale one, released long ago).
    with duckdb.connect(str(db)) as con:
        con.execute("DROP TABLE held_inputs")
        con.execute(
            "CREATE TABLE held_inputs (placement_id VARCHAR NOT NULL, "
            "position VARCHAR NOT NULL, arrived_ms BIGINT)"
        )
        con.execute("INSERT INTO held_inputs VALUES ('p-old', 'z:9', 1)")
        for pid in ("p-r", "p-s"):
            con.execute(
                "UPDATE placement_state SET snapshot = ? WHERE placement_id = ?",
                [fold.snapshot(pid), pid],
            )
        con.execute("UPDATE meta SET value = '3' WHERE key = 'store_version'")
    with Store(db, ledger_public_key=CAST.ledger.public_key) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'store_version'") == [
            (STORE_VERSION,)
        ]
        assert [(r[0], r[1], r[2], r[4], r[5]) for r in held_rows(store)] == [
            ("p-r", "t:0:0", ARRIVED + 0, None, None),
            ("p-r", "t:0:1", ARRIVED + 1, None, None),
            ("p-s", "t:0:5", ARRIVED + 5, "n0", 2),
            ("p-s", "t:0:4", ARRIVED + 4, "n0", 3),
        ]
        assert snapshot_holds(store, "p-r") == snapshot_holds(store, "p-s") == (0, 0, 0)
        # load_state gives the whole state back, byte for byte.
        assert store.load_state("p-r") == fold.snapshot("p-r")
        assert store.load_state("p-s") == fold.snapshot("p-s")
        ingestor = Ingestor(store, CAST.ledger)
        ingestor.ingest(rest)
        ingestor.close()
        assert held_rows(store) == []
        assert stored(store) == reference_records(feed.items)


# ---- the snapshot codec ---------------------------------------------------------------------


def test_split_and_with_holds_are_inverse_and_old_snapshots_decode() -> None:
    pid = "p-codec"
    evs = events(pid, 3)
    fold = Fold(CAST.ledger)
    for i, raw in enumerate(evs):
        fold.apply(raw, f"c:{i}", pid, ARRIVED + i)
    whole = fold.snapshot(pid)  # the old snapshot, with its holds
    state = snapshot.decode(pid, whole)
    assert [p for _, p in state.held] == ["c:0", "c:1", "c:2"]
    assert state.held_bytes() == sum(len(raw) for raw in evs)
    split = snapshot.split_holds(pid, whole)
    assert split is not None
    without, rows = split
    assert without == fold.snapshot(pid, holds=False)
    assert [(h.position, h.arrived_ms) for h in rows] == [(f"c:{i}", ARRIVED + i) for i in range(3)]
    assert snapshot.with_holds(pid, without, rows) == whole
    assert snapshot.split_holds(pid, without) is None
    assert open_envelope(rows[0].raw).input_hash == open_envelope(evs[0]).input_hash
    assert limits.MAX_HELD_BYTES_LEDGER > limits.MAX_HELD_BYTES_PER_PLACEMENT
