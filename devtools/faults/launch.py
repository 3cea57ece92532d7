"""Start ``gridledger ...`` processes for the fault harness without paying the imports.

``python -m gridledger`` imports every subcommand's package (DuckDB, numpy, aiokafka, the
verifier, ...) before it parses its arguments: about a second per process on the
reference machine, and the harness starts a process for every kill it injects. Here each
process is forked from a fork server (``multiprocessing`` "forkserver") that imported
those packages once; the child points its stdin at /dev/null and its stdout and stderr
at the process log, then runs ``gridledger.cli.main(argv)`` and exits with its code,
exactly as ``python -m gridledger ARGV`` does. It is a process of its own (its own pid,
memory, file descriptors), killed with SIGKILL or stopped with SIGTERM like any other;
the fork server holds no store, no socket and no thread of the harness.

``GRIDLEDGER_FAULT_LAUNCH=exec`` starts ``python -m gridledger`` instead (the command a
user types; slower); ``fork`` (the default) uses the fork server.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Final, Protocol

__all__ = ["LAUNCH_ENV", "Launched", "launch"]

LAUNCH_ENV: Final = "GRIDLEDGER_FAULT_LAUNCH"
"""Environment variable: ``fork`` (default, from the fork server) or ``exec``."""

_PRELOAD: Final = ("gridledger.cli", "gridledger.logs", "meter.cli", "ledger.cli")
"""Imported once by the fork server (the rest of ``gridledger.cli._COMMAND_MODULES`` too)."""


class Launched(Protocol):
    """What the harness uses of a started process (a ``subprocess.Popen`` has it)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class _Forked:
    """A fork-server child behind the part of the ``Popen`` interface the harness uses.
    Exit codes follow ``Popen``: the code the CLI returned, or ``-signal`` if killed."""

    def __init__(self, process: BaseProcess, argv: Sequence[str]) -> None:
        self._process = process
        self._argv = list(argv)
        pid = process.pid
        assert pid is not None
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self._argv, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)


_CONTEXT: ForkServerContext | None = None


def _fork_server() -> ForkServerContext:
    global _CONTEXT
    if _CONTEXT is None:
        import gridledger.cli

        modules = (*_PRELOAD, *getattr(gridledger.cli, "_COMMAND_MODULES", ()))
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(dict.fromkeys(modules)))
        _CONTEXT = context
    return _CONTEXT


def _child(argv: list[str], log_path: str) -> None:
    """In the forked child: stdio as ``Popen(stdin=DEVNULL, stdout=log, stderr=STDOUT)``
    with PYTHONUNBUFFERED, then ``gridledger ARGV``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ["PYTHONUNBUFFERED"] = "1"
    sys.argv = ["gridledger", *argv]
    from gridledger.cli import main

    sys.exit(main(argv))


def launch(argv: Sequence[str], log_path: Path) -> Launched:
    """Start ``gridledger ARGV`` with its output appended to ``log_path``."""
    if os.environ.get(LAUNCH_ENV, "fork").strip() == "exec":
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "gridledger", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
    process = _fork_server().Process(
        target=_child, args=(list(argv), str(log_path)), name=f"gridledger {argv[0]}"
    )
    process.daemon = True  # never outlives the harness
    process.start()
    return _Forked(process, argv)
