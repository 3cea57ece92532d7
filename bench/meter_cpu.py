"""Benchmark: the node agent's CPU time per event, beside the machine's Ed25519 sign rate.

Runs a real Agent (simulated GPUs, simulated clock, durable spool with fsync) the way
production drives it: one tick per interval, each emitting one event per placement, and
optionally ships the spool to Kafka with the real shipper. Reports the process CPU time
per event, the Ed25519 sign time measured in the same run on the same payload size, their
ratio, and what the agent costs at the production rate (one event per placement per
interval). No assertions: it is a benchmark.

    python bench/meter_cpu.py [--placements 8] [--gpus 1] [--intervals 600]
                              [--kafka HOST:PORT --topic T]

``--replay-events N``: instead, the trace replay's own workload (``gridledger replay``):
the OpenB trace's first GPU tasks within N usage events, planned onto their nodes, one
real agent per node on one simulated clock (``gridledger.replay_cluster``), ticked one
replay step at a time; with ``--kafka`` every node's spool is shipped after each step by
its own Shipper, all sharing one producer, as the Kafka replay does. Reports the CPU per
event of the agents and of the shipping separately.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import structlog

# devtools/ is not installed (not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import builders
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.shipper import Shipper
from meter.sim import SimDevice, Simulator, parse_sim_spec
from proto.canonical import signed_bytes
from proto.envelope import open_envelope
from transport.kafka import KafkaSettings, create_topic

T0 = 1_700_000_000_000


def sign_rate(payload: bytes, seconds: float = 1.0) -> float:
    """Ed25519 signatures per second of ``payload`` with pynacl, on one core."""
    key = builders.make_cast("bench").node_key("bench")
    key.sign(payload)  # warm the key cache
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(200):
            key.sign(payload)
        count += 200
    return count / (time.perf_counter() - start)


def replay_main(args: argparse.Namespace) -> None:
    """The ``--replay-events`` mode (module docstring)."""
    from devtools.openb import openb_trace
    from gridledger.placement_plan import plan_placements
    from gridledger.replay import planned_events, select_tasks
    from gridledger.replay_cluster import ReplayCluster
    from gridledger.replay_limits import STEP_MS, TRACE_EPOCH_MS
    from gridledger.replay_terms import (
        load_price_table,
        make_replay_cast,
        signed_placement_terms,
    )
    from gridledger.trace import read_trace
    from transport.kafka import SIMULATION_TOPIC_CONFIG, make_producer

    interval_ms = round(args.interval_s * 1000)
    trace = read_trace(openb_trace())
    # The trace's first tasks run for months: take the GPU tasks that ran, in scheduled
    # order, each at most a twentieth of the budget, until the budget is spent.
    tasks, budget = [], args.replay_events
    for task in select_tasks(trace.tasks, None, max_events=None, interval_ms=interval_ms):
        cost = planned_events((task,), interval_ms)
        if task.ran and 0 < cost <= args.replay_events // 20 and cost <= budget:
            tasks.append(task)
            budget -= cost
    plan = plan_placements(trace.nodes, tasks, epoch_ms=TRACE_EPOCH_MS, buyers=4)
    cast, prices = make_replay_cast("openb", 4), load_price_table(None)
    terms = {p.placement_id: signed_placement_terms(p, cast, prices)[0] for p in plan.placements}
    start = min(p.window_start_ms for p in plan.placements)
    end = max(p.window_end_ms for p in plan.placements)
    steps = [start + (k + 1) * STEP_MS for k in range(-(-(end - start) // STEP_MS))]
    settings = KafkaSettings(args.kafka, args.topic) if args.kafka else None
    if settings is not None:
        create_topic(args.kafka, args.topic, 8, config=SIMULATION_TOPIC_CONFIG, exist_ok=True)
    cpu = {"agents": 0.0, "ship": 0.0}
    wall = {"agents": 0.0, "ship": 0.0}
    with tempfile.TemporaryDirectory(prefix="meter-bench-") as tmp:
        cluster = ReplayCluster(
            plan, terms, cast, prices, Path(tmp), interval_ms=interval_ms, start_ms=start
        )

        async def drive() -> int:
            events = 0
            producer = make_producer(settings, linger_ms=5) if settings is not None else None
            if producer is not None:
                await producer.start()
            try:
                shippers = cluster.shippers(settings, producer) if settings is not None else {}
                previous = 0
                for until in steps:
                    touched: dict[str, Shipper] = {}
                    c0, w0 = time.process_time(), time.perf_counter()
                    for node, envelopes in cluster.tick_to(previous, until):
                        events += len(envelopes)
                        if shippers:
                            touched[node.node_id] = shippers[node.node_id]
                    c1, w1 = time.process_time(), time.perf_counter()
                    await asyncio.gather(*(s.ship_available() for s in touched.values()))
                    cpu["agents"] += c1 - c0
                    wall["agents"] += w1 - w0
                    cpu["ship"] += time.process_time() - c1
                    wall["ship"] += time.perf_counter() - w1
                    previous = until
            finally:
                if producer is not None:
                    await producer.stop()
            return events

        try:
            events = asyncio.run(drive())
        finally:
            cluster.close()
    result = {
        "mode": "replay",
        "events": events,
        "placements": len(plan.placements),
        "nodes": len(plan.nodes_used),
        "shipped_to_kafka": settings is not None,
        "agents_cpu_us_per_event": round(cpu["agents"] / events * 1e6, 1),
        "agents_wall_us_per_event": round(wall["agents"] / events * 1e6, 1),
        "ship_cpu_us_per_event": round(cpu["ship"] / events * 1e6, 1),
        "ship_wall_us_per_event": round(wall["ship"] / events * 1e6, 1),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=8, help="streams on the node")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per placement")
    parser.add_argument("--intervals", type=int, default=600, help="intervals to emit")
    parser.add_argument("--interval-s", type=float, default=60.0, help="production interval")
    parser.add_argument("--kafka", help="HOST:PORT: also ship every event (real shipper)")
    parser.add_argument("--topic", default="gridledger.bench.meter")
    parser.add_argument(
        "--replay-events", type=int, metavar="N", help="the replay's workload (docstring)"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.replay_events is not None:
        replay_main(args)
        return
    if args.kafka:  # topics are never auto-created (devtools.kafka_broker)
        create_topic(args.kafka, args.topic, 8, exist_ok=True)

    cast = builders.make_cast("bench")
    interval_ms = round(args.interval_s * 1000)
    window_ms = (args.intervals + 1) * interval_ms
    terms = tuple(
        builders.make_terms(
            cast,
            f"bench-{p}",
            [builders.gpu("n1", p * args.gpus + g) for g in range(args.gpus)],
            T0,
            T0 + window_ms,
        )
        for p in range(args.placements)
    )
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for t in terms for g in t.gpus]
    with tempfile.TemporaryDirectory(prefix="meter-bench-") as tmp:
        spool_dir = Path(tmp) / "spool"
        config = AgentConfig("n1", cast.node_key("n1"), terms, spool_dir, interval_ms=interval_ms)
        clock = SimClock(T0)
        agent = Agent(config, Simulator(parse_sim_spec("seed=1"), devices, T0), clock)
        shipper = (
            Shipper(spool_dir, KafkaSettings(args.kafka, args.topic), metrics=agent.metrics)
            if args.kafka
            else None
        )

        async def drive() -> tuple[int, bytes]:
            # One event loop for the whole run: the producer belongs to it.
            count, last = 0, b""
            try:
                for _ in range(args.intervals):
                    clock.advance(interval_ms)
                    emitted = agent.tick()
                    count += len(emitted)
                    last = emitted[-1] if emitted else last
                    if shipper is not None:
                        await shipper.ship_available()
            finally:
                if shipper is not None:
                    await shipper.close()
            return count, last

        cpu0, wall0 = time.process_time(), time.perf_counter()
        events, sample_envelope = asyncio.run(drive())
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        spool_bytes = agent.spool.bytes_used
        agent.close()

    record = open_envelope(sample_envelope).record
    payload = signed_bytes(record)
    rate = sign_rate(payload)
    cpu_per_event_us = cpu_s / events * 1e6
    sign_us = 1e6 / rate
    events_per_s_production = args.placements / args.interval_s
    result = {
        "placements": args.placements,
        "gpus_per_placement": args.gpus,
        "events": events,
        "shipped_to_kafka": bool(args.kafka),
        "payload_bytes": len(payload),
        "envelope_bytes": len(sample_envelope),
        "spool_bytes_per_event": round(spool_bytes / events, 1),
        "agent_cpu_us_per_event": round(cpu_per_event_us, 1),
        "agent_wall_us_per_event": round(wall_s / events * 1e6, 1),
        "ed25519_sign_per_s": round(rate),
        "ed25519_sign_us": round(sign_us, 1),
        "ratio_cpu_per_event_to_sign": round(cpu_per_event_us / sign_us, 2),
        "max_events_per_s_one_core": round(1e6 / cpu_per_event_us),
        "production_events_per_s": round(events_per_s_production, 4),
        "production_cpu_fraction_of_one_core": cpu_per_event_us * 1e-6 * events_per_s_production,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=1))
    print(
        f"agent: {cpu_per_event_us:.1f} us CPU per event (sign alone: {sign_us:.1f} us, "
        f"{rate:,.0f}/s; ratio {cpu_per_event_us / sign_us:.2f}); at {args.placements} "
        f"placements x 1 event/{args.interval_s:g} s that is "
        f"{result['production_cpu_fraction_of_one_core']:.2e} of one core"
    )


if __name__ == "__main__":
    main()
