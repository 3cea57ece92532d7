"""What a replay measures and says as it runs: progress lines, phase timers, peak RSS
and CPU seconds, its log level."""

from __future__ import annotations

import contextlib
import logging
import resource
import time
from collections.abc import Callable

import structlog

from gridledger.replay_limits import PROGRESS_EVERY_S


class _Progress:
    """One line per PROGRESS_EVERY_S: simulated day, events, rate and time left."""

    def __init__(self, emit: Callable[[str], None] | None, total_events: int) -> None:
        self.emit = emit
        self.total = total_events
        self.started = time.monotonic()
        self.last = self.started

    def step(
        self, events: int, day: int, days: int, *, final: bool = False, lag: int | None = None
    ) -> None:
        """``lag``: records the ledger process has yet to fold (Kafka), shown when given."""
        if self.emit is None:
            return
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        elapsed = now - self.started
        rate = events / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - events)
        eta = (
            "metered (exports and their verification follow)"
            if final or left == 0
            else (f"ETA {_duration(left / rate)}" if rate > 0 else "ETA unknown")
        )
        self.emit(
            f"replay: day {day} of {days} · {events:,} of {self.total:,} events · "
            f"{rate:,.0f} events/s · "
            + ("" if lag is None else f"ledger {lag:,} records behind · ")
            + f"{_duration(elapsed)} elapsed · {eta}"
        )


class _VerifyProgress:
    """One line per PROGRESS_EVERY_S while exports are written and verified: placements
    settled of those to settle, rate and time left; "done" with the last."""

    def __init__(self, emit: Callable[[str], None] | None, total: int) -> None:
        self.emit = emit
        self.total = total
        self.started = time.monotonic()
        self.last = self.started

    def step(self, settled: int) -> None:
        """``settled``: placements whose export has a verdict (verified or failed)."""
        if self.emit is None:
            return
        now = time.monotonic()
        final = settled >= self.total
        if not final and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        elapsed = now - self.started
        rate = settled / elapsed if elapsed > 0 else 0.0
        left = self.total - settled
        eta = "done" if final else (f"ETA {_duration(left / rate)}" if rate > 0 else "ETA unknown")
        self.emit(
            f"replay: export and verify · {settled:,} of {self.total:,} placements · "
            f"{rate:,.1f} placements/s · {_duration(elapsed)} elapsed · {eta}"
        )


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def peak_rss_mib() -> float:
    """Peak resident memory of this process and its waited-for children, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024  # Linux reports KiB


def own_peak_rss_mib() -> float:
    """Peak resident memory of this process alone, in MiB: VmHWM of /proc/self/status
    (``ru_maxrss`` survives exec on Linux, so a spawned child would report its parent's
    peak until it passed it); ``ru_maxrss`` where /proc has no such line."""
    with (
        contextlib.suppress(OSError),
        open("/proc/self/status", encoding="ascii", errors="replace") as status,
    ):
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """CPU seconds (user + system) of this process, all its threads (``RUSAGE_SELF``), or
    of its children it has waited for (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _Timer:
    def __init__(self, seconds: dict[str, float], phase: str) -> None:
        self.seconds = seconds
        self.phase = phase
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + elapsed


def quiet_logs(level: int = logging.WARNING) -> None:
    """Per-placement info logs (thousands of them) off: the report says what matters."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
