"""Where the shared OpenB trace is: ``$GRIDLEDGER_OPENB_TRACE``, else the first
``shared/traces/openb`` beside the checkout or beside any directory above it (a clone
in ``/work/main`` and a worktree in ``/work/wt/x`` both find ``/work/shared``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["TRACE_ENV", "openb_trace"]

TRACE_ENV: Final = "GRIDLEDGER_OPENB_TRACE"
_RELATIVE: Final = Path("shared") / "traces" / "openb"


def openb_trace() -> Path:
    """The trace directory; when none is found, the nearest candidate (for the message)."""
    named = os.environ.get(TRACE_ENV)
    if named:
        return Path(named)
    checkout = Path(__file__).resolve().parents[1]
    for parent in checkout.parents:
        candidate = parent / _RELATIVE
        if candidate.is_dir():
            return candidate
    return checkout.parent / _RELATIVE
