"""``gridledger ledger supervise --shards N``: N ledger shard processes on one host.

One command runs ``gridledger ledger run --config ledger.toml --shard I/N`` for every
I in 0..N-1 (``ledger.config.shard_config``): shard I owns the partitions p of the topic
with p % N == I, keeps its own store ``<db stem>-s<I>of<N><suffix>`` (``ledger.duckdb``
-> ``ledger-s0of2.duckdb``, port file ``ledger-s0of2.duckdb.http.json``) and serves its
HTTP API on the configured port + I (port 0: a free port each, in its port file). Reach a
shard's store or API with ``ledger statement/list/export --shard I/N``.

* A shard process that exits while the supervisor runs (crash, kill -9, exit 75 after a
  broker outage) is restarted after a backoff doubling from ``--backoff`` seconds up to
  ``SUPERVISE_BACKOFF_MAX_S``; it resumes from the offsets committed in its store (the
  store's crash safety holds per process). More than ``--max-restarts`` restarts of one
  shard within ``--restart-window`` seconds: the supervisor stops every shard and exits
  1 with one line naming the shard.
* SIGTERM or SIGINT: forwarded (as SIGTERM) to every shard; the supervisor waits up to
  ``SUPERVISE_STOP_TIMEOUT_S`` for them, SIGKILLs any still running, and exits 0 when
  every shard stopped cleanly (exit 0), 1 otherwise (one line naming the shards).
* Each shard runs in its own process group (a terminal's Ctrl-C reaches the supervisor
  alone, which forwards it) and gets SIGTERM if the supervisor itself dies (Linux
  ``PR_SET_PDEATHSIG``), so no shard outlives it holding its store.
* Refused before anything starts, one line each, exit 2: N < 1, N > the topic's
  partitions (when the broker answers within ``SUPERVISE_METADATA_TIMEOUT_S``; a topic
  that does not exist is refused too), a config that is one shard already (``[kafka]
  partitions`` or ``shard``/``shards`` set), a config or key file that cannot be used.

The shards' own log lines go to the supervisor's stderr; the supervisor's lines
(``shard_started``, ``shard_exited``, ``shard_restart_scheduled``) name shard and pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final

import structlog

from ledger.config import ConfigError, LedgerConfig, shard_config
from ledger.limits import (
    MAX_SHARDS,
    SUPERVISE_BACKOFF_INITIAL_S,
    SUPERVISE_BACKOFF_MAX_S,
    SUPERVISE_MAX_RESTARTS,
    SUPERVISE_METADATA_TIMEOUT_S,
    SUPERVISE_RESTART_WINDOW_S,
    SUPERVISE_STOP_TIMEOUT_S,
)
from proto.invariant import present
from transport.kafka import KafkaSettings, make_consumer, topic_partition_ids

log = structlog.get_logger("ledger.supervise")

# How often the supervisor looks at its children when nothing wakes it earlier.
_TICK_S: Final = 0.1
_PR_SET_PDEATHSIG: Final = 1


class SuperviseError(Exception):
    """``supervise`` cannot start: the message is the one line to print."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often a dying shard is restarted, and how long the supervisor waits for it."""

    max_restarts: int = SUPERVISE_MAX_RESTARTS
    window_s: float = SUPERVISE_RESTART_WINDOW_S
    backoff_initial_s: float = SUPERVISE_BACKOFF_INITIAL_S
    backoff_max_s: float = SUPERVISE_BACKOFF_MAX_S
    stop_timeout_s: float = SUPERVISE_STOP_TIMEOUT_S

    def delay_s(self, recent_restarts: int) -> float:
        """The wait before the next restart, given the restarts already in the window."""
        return min(self.backoff_initial_s * float(2**recent_restarts), self.backoff_max_s)


@dataclass
class _Child:
    shard: int
    shards: int
    popen: subprocess.Popen[bytes] | None = None
    restarts: deque[float] = field(default_factory=deque)
    start_at: float | None = 0.0  # monotonic time of the next (re)start, None: running
    last_code: int | None = None

    @property
    def name(self) -> str:
        return f"{self.shard}/{self.shards}"


def check_shards(config: LedgerConfig, shards: int, config_path: Path) -> list[LedgerConfig]:
    """Every shard's configuration, or SuperviseError naming why ``shards`` cannot run."""
    if shards < 1:
        raise SuperviseError(f"--shards {shards}: need at least 1 shard")
    if shards > MAX_SHARDS:
        raise SuperviseError(f"--shards {shards}: at most {MAX_SHARDS} shards")
    try:
        configs = [shard_config(config, i, shards) for i in range(shards)]
    except ConfigError as exc:
        raise SuperviseError(f"{config_path}: {exc}") from exc
    kafka = present(config.kafka, "the [kafka] table of a sharded config")
    partitions = topic_partitions(kafka.settings, SUPERVISE_METADATA_TIMEOUT_S)
    if partitions is None:
        log.warning(
            "supervise_partitions_unknown",
            bootstrap=kafka.settings.bootstrap,
            topic=kafka.topic,
            note="broker did not answer; the shards wait for it",
        )
    elif partitions == 0:
        raise SuperviseError(
            f"topic {kafka.topic!r} does not exist at {kafka.settings.bootstrap}; "
            "create it with its fixed partition count first"
        )
    elif shards > partitions:
        raise SuperviseError(
            f"--shards {shards}: topic {kafka.topic!r} has only {partitions} "
            f"partition(s); a shard without a partition has nothing to do"
        )
    return configs


def topic_partitions(settings: KafkaSettings, timeout_s: float) -> int | None:
    """The topic's partition count (0: no such topic), None when the broker is silent."""

    async def ask() -> int | None:
        consumer = make_consumer(settings, request_timeout_ms=max(1000, int(timeout_s * 1000)))
        try:
            async with asyncio.timeout(timeout_s):
                await consumer.start()
                return len(await topic_partition_ids(consumer, settings.topic) or ())
        except Exception:  # unreachable, refused, timed out: not knowable
            return None
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    return asyncio.run(ask())


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class Supervisor:
    """Runs ``command(shard)`` for every shard and keeps it running (module docstring)."""

    def __init__(
        self,
        shards: int,
        command: Callable[[int], Sequence[str]],
        policy: RestartPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = [_Child(i, shards) for i in range(shards)]
        self.command = command
        self.policy = policy
        self.clock = clock
        self.stop = threading.Event()

    def _start(self, child: _Child) -> None:
        child.popen = subprocess.Popen(
            list(self.command(child.shard)),
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        child.start_at = None
        log.info(
            "shard_started",
            shard=child.name,
            pid=child.popen.pid,
            restarts=len(child.restarts),
        )

    def _handle_exit(self, child: _Child, code: int, now: float) -> str | None:
        """Schedule the restart of a shard that exited; the failure line when it may not."""
        pid = present(child.popen, "the process of an exited shard").pid
        child.popen = None
        child.last_code = code
        while child.restarts and child.restarts[0] <= now - self.policy.window_s:
            child.restarts.popleft()
        log.warning("shard_exited", shard=child.name, pid=pid, code=code)
        if len(child.restarts) >= self.policy.max_restarts:
            return (
                f"shard {child.name} exited (code {code}) after {len(child.restarts)} "
                f"restarts within {self.policy.window_s:g} s; stopped every shard"
            )
        delay = self.policy.delay_s(len(child.restarts))
        child.restarts.append(now)
        child.start_at = now + delay
        log.info("shard_restart_scheduled", shard=child.name, in_s=round(delay, 3))
        return None

    def run(self) -> tuple[int, str | None]:
        """Until stopped (``self.stop``) or a shard fails too often: (exit code, line)."""
        failure: str | None = None
        try:
            while not self.stop.is_set():
                now = self.clock()
                for child in self.children:
                    if child.popen is not None:
                        code = child.popen.poll()
                        if code is not None and not self.stop.is_set():
                            failure = self._handle_exit(child, code, now)
                            if failure is not None:
                                break
                    if (
                        child.popen is None
                        and child.start_at is not None
                        and now >= child.start_at
                        and not self.stop.is_set()
                    ):
                        self._start(child)
                if failure is not None:
                    break
                time.sleep(_TICK_S)  # an Event.wait could deadlock with the handler's set()
        finally:
            unclean = self._stop_all()
        if failure is not None:
            return 1, failure
        if unclean:
            return 1, "shard(s) did not stop cleanly: " + ", ".join(unclean)
        return 0, None

    def _stop_all(self) -> list[str]:
        """SIGTERM every running shard, wait (bounded), SIGKILL the rest; the unclean ones."""
        running = [(c, c.popen) for c in self.children if c.popen is not None]
        for _, popen in running:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
        deadline = self.clock() + self.policy.stop_timeout_s
        unclean: list[str] = []
        for child, popen in running:
            try:
                code = popen.wait(timeout=max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=self.policy.stop_timeout_s)
                unclean.append(f"{child.name} (killed after {self.policy.stop_timeout_s:g} s)")
                continue
            log.info("shard_stopped", shard=child.name, pid=popen.pid, code=code)
            if code != 0:
                unclean.append(f"{child.name} (exit {code})")
        return unclean


def supervise(
    config_path: Path,
    configs: list[LedgerConfig],
    policy: RestartPolicy,
    passthrough: Sequence[str] = (),
) -> tuple[int, str | None]:
    """Run every shard of ``configs`` until SIGTERM/SIGINT: (exit code, failure line)."""
    shards = len(configs)

    def command(shard: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gridledger",
            *passthrough,
            "ledger",
            "run",
            "--config",
            str(config_path),
            "--shard",
            f"{shard}/{shards}",
        ]

    supervisor = Supervisor(shards, command, policy)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("supervise_stopping", signal=signal.Signals(signum).name)
        supervisor.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info(
            "supervise_running",
            shards=shards,
            stores=[str(c.db) for c in configs],
            http=[None if c.http is None else f"{c.http[0]}:{c.http[1]}" for c in configs],
        )
        return supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
