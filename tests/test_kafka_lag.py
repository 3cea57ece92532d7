"""The ledger's lag check (``KafkaSource.lag``: end offsets vs the next offset to read) is
answered on a connection of its own, so it never queues behind the consumer's fetch parked
at the broker. Kafka answers one connection's requests in order: behind a fetch waiting
out ``fetch_max_wait_ms`` with nothing to read, a ListOffsets on the same connection waited
the whole fetch (0.5 s per check by default; 71 s of a 95 s one-placement replay). Real
broker; the fetch wait is raised to 20 s so the difference is unmistakable."""

from __future__ import annotations

import asyncio
import time
import uuid

from devtools.builders import gpu, make_cast, make_terms, signed_terms
from ledger.config import KafkaConfig
from ledger.consume import KafkaSource
from transport.kafka import KafkaSettings, create_topic, publish_kafka

FETCH_MAX_WAIT_MS = 20_000
TIMEOUT_S = 60.0
T0_MS = 1_767_225_600_000


def test_lag_is_answered_while_the_consumer_waits_on_an_idle_fetch(kafka_bootstrap: str) -> None:
    topic = f"lag-{uuid.uuid4().hex[:12]}"
    create_topic(kafka_bootstrap, topic, 2)
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    cast = make_cast("lag")
    signed = {
        pid: signed_terms(
            cast, make_terms(cast, pid, [gpu(f"{pid}-n0", 0)], T0_MS, T0_MS + 3_600_000)
        )
        for pid in ("pl-lag-0", "pl-lag-1", "pl-lag-2")
    }
    items = [(pid, signed[pid]) for pid in sorted(signed) for _ in range(4)]

    async def run() -> tuple[list[tuple[int, int, int]], float, list[tuple[int, int, int]]]:
        await publish_kafka(settings, items, timeout_s=TIMEOUT_S)
        source = KafkaSource(
            KafkaConfig(settings=settings),
            {},
            max_poll_records=100,
            consumer_kwargs={"fetch_max_wait_ms": FETCH_MAX_WAIT_MS},
        )
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await source.start()
                before = [(p.partition, p.next_offset, p.end_offset) for p in await source.lag()]
                got = []
                while len(got) < len(items):  # bounded by the timeout above
                    batch = await source.poll(100, timeout_ms=1000)
                    got.extend(batch)
                    source.advance(batch)
                # Caught up: the consumer's next fetch is now parked at the broker for up
                # to FETCH_MAX_WAIT_MS (nothing to read). Ask for the lag behind it.
                await source.poll(100, timeout_ms=200)
                started = time.monotonic()
                after = [(p.partition, p.next_offset, p.end_offset) for p in await source.lag()]
                took = time.monotonic() - started
        finally:
            await source.stop()
        return before, took, after

    before, took, after = asyncio.run(run())
    ends = {partition: end for partition, _, end in after}
    assert sum(ends.values()) == len(items)
    assert {p: end for p, _, end in before} == ends
    assert all(nxt == end for _, nxt, end in after), after  # caught up: no lag
    assert took < FETCH_MAX_WAIT_MS / 1000 / 2, f"lag() waited {took:.1f} s behind the fetch"
