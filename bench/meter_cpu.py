"""Benchmark: the node agent's CPU time per event, beside the machine's Ed25519 sign rate.

Runs a real Agent (simulated GPUs, simulated clock, durable spool with fsync) the way
production drives it: one tick per interval, each emitting one event per placement, and
optionally ships the spool to Kafka with the real shipper. Reports the process CPU time
per event, the Ed25519 sign time measured in the same run on the same payload size, their
ratio, and what the agent costs at the production rate (one event per placement per
interval). No assertions: it is a benchmark.

    python bench/meter_cpu.py [--placements 8] [--gpus 1] [--intervals 600]
                              [--kafka HOST:PORT --topic T]
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
from transport.kafka import KafkaSettings

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=8, help="streams on the node")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per placement")
    parser.add_argument("--intervals", type=int, default=600, help="intervals to emit")
    parser.add_argument("--interval-s", type=float, default=60.0, help="production interval")
    parser.add_argument("--kafka", help="HOST:PORT: also ship every event (real shipper)")
    parser.add_argument("--topic", default="gridledger.bench.meter")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

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
