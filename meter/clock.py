"""Time for the agent, injected: the wall clock in production, a simulated clock in tests.

Every time the agent uses comes from a Clock, so a test or the demo can run an hour of
placement in milliseconds by advancing a SimClock, and replay it exactly.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "RealClock", "SimClock", "SkewedClock"]


class Clock(Protocol):
    """Milliseconds since the Unix epoch, UTC."""

    def now_ms(self) -> int:
        """The current time."""
        ...


class RealClock:
    """The system's wall clock."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch."""
        return time.time_ns() // 1_000_000


class SimClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int) -> None:
        if start_ms < 0:
            raise ValueError(f"start_ms {start_ms} is negative")
        self._now_ms = start_ms

    def now_ms(self) -> int:
        """The simulated time."""
        return self._now_ms

    def advance(self, delta_ms: int) -> int:
        """Move forward by ``delta_ms`` (never backwards) and return the new time."""
        if delta_ms < 0:
            raise ValueError(f"a SimClock does not go backwards (delta {delta_ms} ms)")
        self._now_ms += delta_ms
        return self._now_ms

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms``, backwards too (to test an agent whose clock was reset)."""
        if now_ms < 0:
            raise ValueError(f"now_ms {now_ms} is negative")
        self._now_ms = now_ms


class SkewedClock:
    """Another clock, off by a constant ``skew_ms`` (positive: ahead)."""

    def __init__(self, base: Clock, skew_ms: int) -> None:
        self._base = base
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        """The base clock's time plus the skew, never below 0."""
        return max(0, self._base.now_ms() + self.skew_ms)
