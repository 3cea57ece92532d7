"""A progress line on stderr while a big export is verified; silent unless stderr is a TTY."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from verifier import limits


class Progress:
    """``verifying NAME: done/total (rate/s)``, redrawn at most every PROGRESS_INTERVAL_S."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._name = ""
        self._total = 0
        self._start = 0.0
        self._last = 0.0

    def start(self, name: str, total: int) -> None:
        """Begin a new line for ``name`` with ``total`` units of work."""
        self._name, self._total = name, total
        self._start = self._last = time.monotonic()

    def update(self, done: int) -> None:
        """Report ``done`` units; draws only when enough time has passed."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < limits.PROGRESS_INTERVAL_S:
            return
        self._last = now
        rate = done / max(now - self._start, 1e-9)
        share = f"{100 * done / self._total:5.1f}%" if self._total else ""
        self.stream.write(
            f"\rverifying {self._name}: {done}/{self._total} {share} ({rate:,.0f} records/s)"
        )
        self.stream.flush()

    def finish(self) -> None:
        """End the line."""
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
