"""Issue 15: the replay process's memory does not grow with the events it replays.

Over Kafka with the ledger in a process of its own, the replay process holds the plan,
the agents and the shippers: what it keeps must not grow with the events they sign and
send (the ledger's store, and DuckDB, live in the ledger process; the exports are written
there too). Measured with tracemalloc (Python's own allocations, not RSS) at every step
of a replay of the excerpt's first tasks: from a quarter of the way on to the last step,
what the replay process holds may grow by far less than a byte per event in between.
"""

from __future__ import annotations

import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

import gridledger.replay.measure as replay_measure
from gridledger.replay import ReplayOptions, run_replay

EXCERPT = Path(__file__).parent / "data" / "openb_excerpt"
DAY_MS = 86_400_000

BYTES_PER_EVENT_ALLOWED = 16
"""Growth allowed per event replayed between the two samples (before the fix of issue
15 the replay process kept ~0.65 KiB per event, in RSS)."""
SLACK_BYTES = 1 << 20
"""Growth allowed whatever the events: client buffers, caches warming up, logs."""


def test_the_replay_process_keeps_nothing_per_event(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples: list[tuple[int, int]] = []  # (events signed so far, bytes traced now)
    real = replay_measure._Progress.step

    def step(self: Any, events: int, day: int, days: int, **kwargs: Any) -> None:
        samples.append((events, tracemalloc.get_traced_memory()[0]))
        real(self, events, day, days, **kwargs)

    monkeypatch.setattr(replay_measure._Progress, "step", step)
    tracemalloc.start()
    try:
        report = run_replay(
            ReplayOptions(
                trace_dir=EXCERPT,
                workdir=tmp_path / "run",
                kafka=kafka_bootstrap,
                topic=f"replay-{uuid.uuid4().hex[:12]}",
                partitions=2,
                interval_s=600,
                limit=3,  # the first runs 145 days: ~23,000 events
                step_ms=7 * DAY_MS,
            )
        )
    finally:
        tracemalloc.stop()
    assert report.ok and report.events_accepted > 20_000
    assert len(samples) > 12
    early_events, early_bytes = samples[len(samples) // 4]
    late_events, late_bytes = samples[-1]
    replayed = late_events - early_events
    assert replayed > 10_000  # most of the run lies between the two samples
    grown = late_bytes - early_bytes
    assert grown < SLACK_BYTES + BYTES_PER_EVENT_ALLOWED * replayed, (
        f"the replay process grew by {grown:,} bytes over {replayed:,} events: {samples}"
    )
