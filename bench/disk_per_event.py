"""Benchmark: disk per settled usage event (store + spools + transport + exports), issue 15.

    .venv/bin/python bench/disk_per_event.py [--events 50000] [--nodes 10]
        [--placements 200] [--transport kafka|local|both] [--segment-bytes N]
        [--breakdown] [--keep DIR] [--json]

A real small pipeline on this machine: node agents on the simulator (``meter.agent``,
durable spools) -> the meter's shipper (``meter.shipper``, acks, ``SHIPPED``, garbage
collection of acknowledged segments through ``Agent.collect_garbage``) -> a real Kafka
broker (``devtools.kafka_broker``) — or the embedded transport (the spools are the
transport, the ledger copies them into its intake log) -> one ledger shard
(``ledger.service``; every placement closed at the end, so every event is settled in a
final statement) -> ``ledger.export.export_all``.

It then reports the bytes each part keeps on disk per settled event (accepted usage
event): the meter spools after the shipper's garbage collection, the Kafka log
directory of the topic (or the intake log), the ledger store after CHECKPOINT, the
exports directory, and their sum; beside "the signed bytes" measured in the same run,
under both definitions (stated in the output):

* signed_event  — the meter's signed usage envelope as the ledger received it (sum of the
  envelope lengths of the accepted usage events / events);
* signed_record — that plus the ledger's signed UsageRecord envelope for it (the chain
  record the ledger signs for each event), i.e. every signature-bearing byte one settled
  event needs.

Sizes are bytes allocated on disk (``st_blocks`` x 512: Kafka preallocates its index
files sparsely); apparent sizes are reported beside them. Where the store and export bytes
go is broken down per table and per column (each column copied alone into a fresh DuckDB
file, checkpointed, its size minus an empty file's). No assertions: a benchmark reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import structlog

# devtools/ is not installed (not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import builders
from devtools.kafka_broker import KafkaBroker
from ledger.config import KafkaConfig
from ledger.export import export_all
from ledger.service import KafkaLedgerService, LedgerService
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.shipper import Shipper, simulated_send_ms
from meter.sim import SimDevice, Simulator, parse_sim_spec
from proto.records import PlacementTerms
from transport.kafka import (
    SIMULATION_TOPIC_CONFIG,
    KafkaSettings,
    create_topic_async,
    make_producer,
    publish_kafka,
)
from transport.limits import DEFAULT_SEGMENT_MAX_BYTES
from transport.local import publish_local, publisher_source
from transport.spool import SEGMENT_SUFFIX

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000
STEP_INTERVALS = 60  # agents tick, ship and the ledger folds once per simulated hour
LEDGER_DEADLINE_S = 600.0
TOPIC = "gridledger.bench.disk"
PARTITIONS = 2


# ---- sizes ---------------------------------------------------------------------------------


@dataclass
class Size:
    """Bytes of a set of files: allocated on disk and apparent."""

    allocated: int = 0
    apparent: int = 0
    files: int = 0

    def add(self, path: Path) -> None:
        st = path.stat()
        self.allocated += st.st_blocks * 512
        self.apparent += st.st_size
        self.files += 1

    def __iadd__(self, other: Size) -> Size:
        self.allocated += other.allocated
        self.apparent += other.apparent
        self.files += other.files
        return self


def tree_size(root: Path, match: str = "*") -> Size:
    """Every regular file under ``root`` whose name matches ``match``."""
    size = Size()
    if root.exists():
        for path in root.rglob(match):
            if path.is_file() and not path.is_symlink():
                size.add(path)
    return size


def spool_sizes(spool_root: Path) -> dict[str, Size]:
    """The meter spools by kind of file: segments, delivery log, HEADS/SHIPPED/lock."""
    out = {"segments": Size(), "delivery_log": Size(), "other": Size()}
    for path in sorted(spool_root.rglob("*")):
        if not path.is_file():
            continue
        if path.name.endswith(SEGMENT_SUFFIX):
            out["segments"].add(path)
        elif path.name == "DELIVERED.jsonl":
            out["delivery_log"].add(path)
        else:
            out["other"].add(path)
    return out


# ---- the pipeline --------------------------------------------------------------------------


@dataclass
class Fleet:
    """Terms and agents of the run, on one simulated clock."""

    cast: Any
    terms: list[PlacementTerms]
    envelopes: list[tuple[str, bytes]]  # (placement, signed terms)
    clock: SimClock
    agents: dict[str, Agent] = field(default_factory=dict)
    window_end_ms: int = 0
    late_grace_ms: int = 0

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()


def make_fleet(args: argparse.Namespace, spool_root: Path, *, on_spool: bool) -> Fleet:
    """``args.placements`` one-GPU placements over ``args.nodes`` nodes, windows long
    enough for ``args.events`` events in all."""
    cast = builders.make_cast("disk")
    intervals = -(-args.events // args.placements)
    window_end = T0_MS + intervals * INTERVAL_MS
    terms: list[PlacementTerms] = []
    by_node: dict[str, list[PlacementTerms]] = {}
    for p in range(args.placements):
        node = f"n{p % args.nodes:03d}"
        t = builders.make_terms(
            cast, f"disk-{p:05d}", [builders.gpu(node, p // args.nodes)], T0_MS, window_end
        )
        terms.append(t)
        by_node.setdefault(node, []).append(t)
    clock = SimClock(T0_MS)
    fleet = Fleet(
        cast,
        terms,
        [(t.placement_id, builders.signed_terms(cast, t)) for t in terms],
        clock,
        window_end_ms=window_end,
        late_grace_ms=max(t.late_grace_ms for t in terms),
    )
    spec = parse_sim_spec("seed=1")
    for node, node_terms in sorted(by_node.items()):
        devices = [SimDevice(g.uuid, g.model, g.memory_mib) for t in node_terms for g in t.gpus]
        config = AgentConfig(
            node,
            cast.node_key(node),
            tuple(node_terms),
            spool_root / f"node-{node}",
            interval_ms=INTERVAL_MS,
            segment_max_bytes=args.segment_bytes,
            delivered_on_spool=on_spool,
            collect_read=on_spool,
        )
        fleet.agents[node] = Agent(config, Simulator(spec, devices, T0_MS, node_id=node), clock)
    return fleet


def tick_all(fleet: Fleet, until_ms: int) -> int:
    """Move the clock to ``until_ms``; tick every agent dry; events emitted."""
    fleet.clock.set(until_ms)
    emitted = 0
    for agent in fleet.agents.values():
        for _ in range(1000):
            got = agent.tick()
            if not got:
                break
            emitted += len(got)
    return emitted


def step_ends(fleet: Fleet) -> list[int]:
    """Step ends from the window start to past the last close."""
    last = fleet.window_end_ms + fleet.late_grace_ms + INTERVAL_MS
    step = STEP_INTERVALS * INTERVAL_MS
    return [T0_MS + (k + 1) * step for k in range(-(-(last - T0_MS) // step))]


class _Now:
    def __init__(self) -> None:
        self.value = T0_MS

    def read(self) -> int:
        return self.value


async def run_kafka(args: argparse.Namespace, work: Path, bootstrap: str) -> dict[str, Any]:
    """Agents -> shippers (GC on) -> Kafka -> ledger; then export_all."""
    settings = KafkaSettings(bootstrap=bootstrap, topic=TOPIC)
    await create_topic_async(
        bootstrap, TOPIC, PARTITIONS, exist_ok=True, config=SIMULATION_TOPIC_CONFIG
    )
    fleet = make_fleet(args, work / "spools", on_spool=False)
    store = Store(work / "ledger.duckdb", ledger_public_key=fleet.cast.ledger.public_key)
    now = _Now()
    service = KafkaLedgerService(
        store, fleet.cast.ledger, KafkaConfig(settings=settings), clock=now.read, arrival="sender"
    )
    producer = make_producer(settings, linger_ms=5)
    gc_freed = 0

    def collect(agent: Agent) -> Any:
        def run(position: Any) -> int:
            nonlocal gc_freed
            freed = agent.collect_garbage(position)
            gc_freed += freed
            return freed

        return run

    emitted = 0
    try:
        await producer.start()
        await service.start()
        shippers = [
            Shipper(
                agent.config.spool_dir,
                settings,
                producer=producer,
                collect_garbage=collect(agent),
                now_ms=fleet.clock.now_ms,
                stamp=simulated_send_ms,
            )
            for agent in fleet.agents.values()
        ]
        # Published before the windows open, stating that time (SPEC §6.6 arrival = "sender").
        await publish_kafka(
            settings,
            fleet.envelopes,
            producer=producer,
            timestamps_ms=[T0_MS - INTERVAL_MS] * len(fleet.envelopes),
        )
        for until in step_ends(fleet):
            emitted += tick_all(fleet, until)
            await asyncio.gather(*(s.ship_available() for s in shippers))
            now.value = until
            await service.run_until(deadline_s=LEDGER_DEADLINE_S, idle_poll_ms=200)
    finally:
        fleet.close()
        try:
            await service.stop()
        finally:
            await producer.stop()
    try:
        exported = export_all(store, work / "exports", key=fleet.cast.ledger)
        export_all(store, work / "exports-compact", key=fleet.cast.ledger, compact=True)
    finally:
        service.close()
    return {"emitted": emitted, "gc_freed_bytes": gc_freed, "exports": len(exported.written)}


def run_local(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Agents -> their spools (the embedded transport) -> ledger intake -> export_all."""
    local = work / "local"
    fleet = make_fleet(args, local, on_spool=True)
    store = Store(work / "ledger.duckdb", ledger_public_key=fleet.cast.ledger.public_key)
    now = _Now()
    service = LedgerService(
        store, fleet.cast.ledger, ledger_id="ledger-1", local_dir=local, clock=now.read
    )
    emitted = 0
    try:
        publish_local(local, publisher_source("bench"), [e for _, e in fleet.envelopes])
        for until in step_ends(fleet):
            emitted += tick_all(fleet, until)
            now.value = until
            service.run_until_idle()
    finally:
        fleet.close()
    try:
        exported = export_all(store, work / "exports", key=fleet.cast.ledger)
        export_all(store, work / "exports-compact", key=fleet.cast.ledger, compact=True)
    finally:
        service.close()
    return {"emitted": emitted, "gc_freed_bytes": 0, "exports": len(exported.written)}


# ---- measuring -----------------------------------------------------------------------------


def signed_bytes(db: Path) -> dict[str, int]:
    """Accepted usage events and the bytes of their signed envelopes (meter's, ledger's)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute(
            "SELECT count(*), sum(octet_length(envelope)) FROM inputs "
            "WHERE kind = 'usage' AND status = 'accepted'"
        ).fetchone()
        rec = con.execute(
            "SELECT sum(octet_length(envelope)) FROM records "
            "WHERE kind = 'usage' AND status = 'accepted'"
        ).fetchone()
    finally:
        con.close()
    assert row is not None and rec is not None
    return {
        "events": int(row[0]),
        "event_bytes": int(row[1] or 0),
        "record_bytes": int(rec[0] or 0),
    }


def checkpoint(db: Path) -> None:
    """CHECKPOINT the closed store file (folds any WAL in)."""
    con = duckdb.connect(str(db))
    try:
        con.execute("CHECKPOINT")
    finally:
        con.close()


# Column files are written with small blocks: a column's size is then known to
# COLUMN_BLOCK_BYTES, not to a default 256 KiB block (5 B per event at 50k events).
COLUMN_BLOCK_BYTES = 16 * 1024


def _empty_db_bytes(tmp: Path) -> int:
    path = tmp / "empty.duckdb"
    con = duckdb.connect(":memory:")
    con.execute(f"ATTACH '{path}' AS c (BLOCK_SIZE {COLUMN_BLOCK_BYTES})")
    con.execute("CREATE TABLE c.t (x INTEGER)")
    con.execute("DETACH c")
    con.close()
    size = path.stat().st_size
    path.unlink()
    return size


def column_breakdown(
    sources: list[Path], tables: list[str], tmp: Path
) -> dict[str, dict[str, int]]:
    """table -> column -> bytes that column takes alone (all ``sources`` unioned into one
    fresh DuckDB file, checkpointed, minus an empty file). ``sources``: DuckDB files."""
    empty = _empty_db_bytes(tmp)
    out: dict[str, dict[str, int]] = {}
    con = duckdb.connect(":memory:")
    try:
        aliases = []
        for i, src in enumerate(sources):
            con.execute(f"ATTACH '{src}' AS s{i} (READ_ONLY)")
            aliases.append(f"s{i}")
        for table in tables:
            have = [
                a
                for a in aliases
                if con.execute(
                    "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? "
                    "AND table_name = ?",
                    [a, table],
                ).fetchone()
                == (1,)
            ]
            if not have:
                continue
            cols = [
                str(r[0])
                for r in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = ? "
                    "AND table_name = ? ORDER BY column_index",
                    [have[0], table],
                ).fetchall()
            ]
            out[table] = {}
            for col in cols:
                path = tmp / f"col-{table}-{col}.duckdb"
                union = " UNION ALL ".join(f'SELECT "{col}" FROM {a}.{table}' for a in have)
                con.execute(f"ATTACH '{path}' AS c (BLOCK_SIZE {COLUMN_BLOCK_BYTES})")
                con.execute(f"CREATE TABLE c.t AS {union}")
                con.execute("DETACH c")
                out[table][col] = max(0, path.stat().st_size - empty)
                path.unlink()
                Path(str(path) + ".wal").unlink(missing_ok=True)
    finally:
        con.close()
    return out


def table_rows(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        names = [
            str(r[0]) for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        ]
        return {
            n: int(con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0])  # type: ignore[index]
            for n in names
        }
    finally:
        con.close()


def measure(
    label: str, work: Path, kafka_data: Path | None, run: dict[str, Any], breakdown: bool
) -> dict[str, Any]:
    db = work / "ledger.duckdb"
    checkpoint(db)
    signed = signed_bytes(db)
    events = max(1, signed["events"])
    parts: dict[str, Size] = {}
    spool_root = work / ("spools" if label == "kafka" else "local")
    spools = spool_sizes(spool_root) if label == "kafka" else {}
    if label == "kafka":
        parts["meter spools (after GC)"] = spools["segments"]
        parts["meter delivery logs"] = spools["delivery_log"]
        parts["meter HEADS/SHIPPED/locks"] = spools["other"]
        topic = Size()
        if kafka_data is not None:
            for d in kafka_data.glob(f"{TOPIC}-*"):
                topic += tree_size(d)
        parts["kafka topic log dir"] = topic
    else:
        node = Size()
        delivered = Size()
        for d in spool_root.glob("node-*"):
            node += tree_size(d, "*")
        for d in spool_root.glob("node-*"):
            delivered += tree_size(d, "DELIVERED.jsonl")
        node.allocated -= delivered.allocated
        node.apparent -= delivered.apparent
        parts["meter spools (= transport, collected once read)"] = node
        parts["meter delivery logs"] = delivered
        parts["publisher spools"] = Size()
        for d in spool_root.glob("publish-*"):
            parts["publisher spools"] += tree_size(d)
        parts["ledger intake log"] = Size()
        for d in spool_root.glob(".intake-*"):
            parts["ledger intake log"] += tree_size(d)
    parts["ledger store (after CHECKPOINT)"] = tree_size(work, "ledger.duckdb*")
    parts["exports (export_all)"] = tree_size(work / "exports")
    total = Size()
    for size in parts.values():
        total += size
    compact = tree_size(work / "exports-compact")
    with_compact = Size()
    on_demand = Size()  # exports written when asked, not kept (the replay's default)
    for name, size in parts.items():
        with_compact += compact if name.startswith("exports") else size
        on_demand += Size() if name.startswith("exports") else size
    ev_b = signed["event_bytes"] / events
    rec_b = signed["record_bytes"] / events
    result: dict[str, Any] = {
        "transport": label,
        "events_emitted": run["emitted"],
        "events_settled": signed["events"],
        "exports": run["exports"],
        "spool_gc_freed_bytes": run["gc_freed_bytes"],
        "signed_event_bytes_per_event": round(ev_b, 1),
        "signed_record_bytes_per_event": round(rec_b, 1),
        "signed_event_plus_record_bytes_per_event": round(ev_b + rec_b, 1),
        "parts": {
            name: {
                "bytes_per_event": round(s.allocated / events, 1),
                "apparent_bytes_per_event": round(s.apparent / events, 1),
                "files": s.files,
                "x_signed_event": round(s.allocated / events / ev_b, 2),
            }
            for name, s in {
                **parts,
                "SUM": total,
                "(alternative) exports compact=True": compact,
                "(alternative) SUM with compact exports": with_compact,
                "(alternative) SUM with exports on demand": on_demand,
            }.items()
        },
        "ratio_sum_to_signed_event": round(total.allocated / events / ev_b, 2),
        "ratio_sum_to_signed_event_plus_record": round(
            total.allocated / events / (ev_b + rec_b), 2
        ),
        "ratio_sum_with_compact_exports_to_signed_event": round(
            with_compact.allocated / events / ev_b, 2
        ),
        "ratio_sum_with_exports_on_demand_to_signed_event": round(
            on_demand.allocated / events / ev_b, 2
        ),
        "kafka_compressed_estimate": compressed_estimate(db),
        "store_rows": table_rows(db),
    }
    if breakdown:
        with tempfile.TemporaryDirectory(prefix="disk-cols-") as tmp:
            result["store_columns_bytes_per_event"] = _per_event(
                column_breakdown(
                    [db],
                    [
                        # The tables of a store of version <= 2, and those of version 3
                        # (payload + signatures; records/inputs are views over them).
                        "records",
                        "inputs",
                        "record_rows",
                        "input_rows",
                        "placement_state",
                        "statements",
                        "checkpoints",
                        "placement_commits",
                    ],
                    Path(tmp),
                ),
                events,
            )
            exports = sorted((work / "exports").glob("*.duckdb"))
            result["export_columns_bytes_per_event_if_one_file"] = _per_event(
                column_breakdown(
                    exports,
                    [
                        "usage_events",
                        "ledger_records",
                        "statements",
                        "checkpoints",
                        "terms",
                        "closes",
                    ],
                    Path(tmp),
                ),
                events,
            )
            result["export_file"] = export_file_shape(exports, events)
    return result


def _per_event(cols: dict[str, dict[str, int]], events: int) -> dict[str, dict[str, float]]:
    return {
        t: {
            **{c: round(b / events, 1) for c, b in cs.items()},
            "ALL": round(sum(cs.values()) / events, 1),
        }
        for t, cs in cols.items()
    }


def export_file_shape(exports: list[Path], events: int) -> dict[str, Any]:
    """What one export file is made of: its size, DuckDB's blocks (used/free), rows."""
    if not exports:
        return {}
    sample = exports[len(exports) // 2]
    con = duckdb.connect(str(sample), read_only=True)
    try:
        size = con.execute("PRAGMA database_size").fetchone()
        usage = con.execute("SELECT count(*) FROM usage_events").fetchone()
    finally:
        con.close()
    assert size is not None and usage is not None
    sizes = [p.stat().st_size for p in exports]
    return {
        "files": len(exports),
        "mean_file_bytes": round(sum(sizes) / len(sizes)),
        "sample": sample.name,
        "sample_usage_rows": int(usage[0]),
        "sample_database_size": {
            "database_size": size[1],
            "block_size": size[2],
            "total_blocks": size[3],
            "used_blocks": size[4],
            "free_blocks": size[5],
        },
        "bytes_per_event": round(sum(sizes) / events, 1),
    }


def compressed_estimate(db: Path, batch: int = 100) -> dict[str, float]:
    """What the producer's codec (transport/kafka.py PRODUCER_COMPRESSION, through aiokafka's
    own codec functions) makes of the usage envelopes: batches of ``batch`` envelopes of one
    placement, compressed."""
    from aiokafka import codec

    from transport.kafka import PRODUCER_COMPRESSION

    encode = getattr(codec, f"{PRODUCER_COMPRESSION}_encode")
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT placement_id, envelope FROM inputs WHERE kind = 'usage' "
            "ORDER BY placement_id, chain_index"
        ).fetchall()
    finally:
        con.close()
    raw = packed = 0
    for i in range(0, len(rows), batch):
        chunk = b"".join(bytes(r[1]) for r in rows[i : i + batch])
        raw += len(chunk)
        packed += len(encode(chunk))
    events = max(1, len(rows))
    return {
        "batch_envelopes": batch,
        "raw_bytes_per_event": round(raw / events, 1),
        "codec": PRODUCER_COMPRESSION,
        "compressed_bytes_per_event": round(packed / events, 1),
        "ratio": round(packed / max(1, raw), 3),
    }


def render(result: dict[str, Any]) -> list[str]:
    ev = result["signed_event_bytes_per_event"]
    rec = result["signed_record_bytes_per_event"]
    lines = [
        f"--- transport {result['transport']}: {result['events_settled']} settled events "
        f"({result['events_emitted']} emitted), {result['exports']} exports",
        f"signed bytes per event: signed_event = {ev} B (the meter's signed usage envelope); "
        f"signed_record = {rec} B (the ledger's signed UsageRecord for it); "
        f"both = {round(ev + rec, 1)} B",
    ]
    for name, part in result["parts"].items():
        lines.append(
            f"  {name:<44} {part['bytes_per_event']:>9.1f} B/event on disk "
            f"({part['apparent_bytes_per_event']:>9.1f} apparent, {part['files']} files) "
            f"= {part['x_signed_event']:.2f} x signed_event"
        )
    lines.append(
        f"sum / signed_event = {result['ratio_sum_to_signed_event']:.2f}; "
        f"sum / (signed_event + signed_record) = "
        f"{result['ratio_sum_to_signed_event_plus_record']:.2f}; goal <= 2; with compact "
        f"exports: {result['ratio_sum_with_compact_exports_to_signed_event']:.2f}, with exports "
        f"on demand: {result['ratio_sum_with_exports_on_demand_to_signed_event']:.2f}"
        " x signed_event"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--transport", choices=("kafka", "local", "both"), default="kafka")
    parser.add_argument(
        "--segment-bytes",
        type=int,
        default=DEFAULT_SEGMENT_MAX_BYTES,
        help="spool segment size (default: the meter's); only whole segments are collected",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also the bytes of every column of the store and exports (adds ~30 s)",
    )
    parser.add_argument("--no-breakdown", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep the work files here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    load0 = os.getloadavg()
    breakdown = args.breakdown and not args.no_breakdown
    results = []
    started = time.perf_counter()
    for label in ("kafka", "local") if args.transport == "both" else (args.transport,):
        base = args.keep if args.keep is not None else Path(tempfile.mkdtemp(prefix="disk-"))
        work = base / label
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        t = time.perf_counter()
        try:
            if label == "kafka":
                with KafkaBroker() as broker:
                    run = asyncio.run(run_kafka(args, work, broker.bootstrap))
                    data = present_dir(broker.workdir)
                    result = measure(
                        label, work, data, run, args.breakdown and not args.no_breakdown
                    )
            else:
                run = run_local(args, work)
                result = measure(label, work, None, run, breakdown)
        finally:
            if args.keep is None:
                shutil.rmtree(base, ignore_errors=True)
        result["seconds"] = round(time.perf_counter() - t, 1)
        results.append(result)
    out = {
        "definition": {
            "signed_event": "sum of the accepted usage events' signed envelope lengths / events",
            "signed_record": "sum of the ledger's signed UsageRecord envelope lengths / events",
            "bytes": "allocated on disk (st_blocks x 512); apparent sizes beside them",
        },
        "args": vars(args) | {"keep": str(args.keep) if args.keep else None},
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "results": results,
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for result in results:
            for line in render(result):
                print(line)
            print(json.dumps({k: v for k, v in result.items() if k not in ("parts",)}, indent=1))
        print(f"load average before {out['loadavg_before']}, after {out['loadavg_after']}")
    return 0


def present_dir(workdir: Path | None) -> Path | None:
    """The broker's data directory (``log.dirs``) under its work directory."""
    return None if workdir is None else workdir / "data"


if __name__ == "__main__":
    sys.exit(main())
