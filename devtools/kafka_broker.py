"""A single-node Apache Kafka broker for the test suite and the benchmarks.

The broker is real Apache Kafka (version pinned in ``devtools.kafka_fetch``, which
fetches it with Maven into a cache folder) run as a combined broker+controller KRaft node
on 127.0.0.1. Nothing here is a fake or an emulator: the tests talk to the same broker
code that runs in production.

Library use::

    with KafkaBroker() as broker:          # temp work dir, free ports, removed on exit
        create_topic(broker.bootstrap, "gridledger.records", partitions=12)
        ...
        broker.restart()                   # same ports, same data
        broker.restart(hard=True)          # SIGKILL then start: log recovery path

Command line::

    python -m devtools.kafka_broker fetch            # jars into the cache, print the path
    python -m devtools.kafka_broker start [--workdir DIR] [--port N]   # prints HOST:PORT
    python -m devtools.kafka_broker stop [--workdir DIR] [--purge]
    python -m devtools.kafka_broker create-topic NAME --bootstrap HOST:PORT [--partitions N]

Broker settings worth knowing: infinite retention (``log.retention.ms=-1``; the topics
are event-sourced and a ledger rebuilds by replaying from offset 0), and
``auto.create.topics.enable=false``: a topic must be created with its intended partition
count (``transport.kafka.create_topic``), so a misspelt name or a producer that starts
first fails loudly instead of silently getting a one-partition topic.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from devtools.kafka_fetch import (
    KAFKA_VERSION,
    LOG_TAIL_LINES,
    KafkaLauncherError,
    cache_dir,
    fetch_kafka,
    require_java,
    tail_text,
)
from proto.durable_io import pid_alive
from transport.kafka import TopicError, create_topic, run_sync

__all__ = [
    "DEFAULT_HEAP_OPTS",
    "BrokerStartError",
    "KafkaBroker",
    "fetch_metadata",
    "main",
    "wait_for_broker",
]

# --- defaults --------------------------------------------------------------------------

DEFAULT_HEAP_OPTS: Final[tuple[str, ...]] = ("-Xms256m", "-Xmx512m")
START_TIMEOUT_S: Final = 90.0
STOP_TIMEOUT_S: Final = 30.0
NODE_ID: Final = 1
HOST: Final = "127.0.0.1"

_STATE_FILE: Final = "broker.json"
_PROPERTIES_FILE: Final = "server.properties"
_LOG4J_FILE: Final = "log4j2.properties"

# --- errors ----------------------------------------------------------------------------


class BrokerStartError(KafkaLauncherError):
    """The broker did not come up; the message carries the tail of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        full = f"{message}\n--- broker log tail ---\n{log_tail}" if log_tail else message
        super().__init__(full)
        self.log_tail = log_tail


# --- small helpers ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, base64url without padding (as Kafka's Uuid)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka refuses ids that look like an option
            return text


def _props_value(value: str) -> str:
    return value.replace("\\", "\\\\")


def _read_tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return tail_text(data, lines)


# --- readiness --------------------------------------------------------------

_PROBING: set[str] = set()  # bootstraps being waited for: connection refusals are expected


class _ProbeNoiseFilter(logging.Filter):
    """Drop aiokafka's 'Unable connect' errors about a broker we are waiting for."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _PROBING or not str(record.msg).startswith("Unable connect to"):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        target = f"{args[0]}:{args[1]}" if len(args) >= 2 else ""
        return target not in _PROBING


logging.getLogger("aiokafka").addFilter(_ProbeNoiseFilter())


@contextlib.contextmanager
def _probing(bootstrap: str) -> Iterator[None]:
    _PROBING.add(bootstrap)
    try:
        yield
    finally:
        _PROBING.discard(bootstrap)


async def fetch_metadata(
    bootstrap: str, timeout_s: float, client_id: str = "gridledger-kafka-probe"
) -> Any:
    """One full metadata round trip (aiokafka ClusterMetadata) from ``bootstrap``."""
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(1000, int(timeout_s * 1000)),
        client_id=client_id,
    )
    try:
        async with asyncio.timeout(timeout_s):
            await client.bootstrap()
            return await client.fetch_all_metadata()
    finally:
        await client.close()


async def _probe(bootstrap: str, timeout_s: float) -> None:
    """One metadata round trip; succeeds once the broker serves clients."""
    metadata = await fetch_metadata(bootstrap, timeout_s)
    if not metadata.brokers():
        raise KafkaLauncherError(f"{bootstrap} answered but lists no broker")


def wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Return once the broker at `bootstrap` answers a metadata request, or raise."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaLauncherError(
                f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s: {last!r}"
            )
        try:
            with _probing(bootstrap):
                run_sync(_probe(bootstrap, min(5.0, remaining)))
            return
        except Exception as exc:
            last = exc
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


# --- the broker ------------------------------------------------------------------------

_LIVE: weakref.WeakSet[KafkaBroker] = weakref.WeakSet()


@atexit.register
def _stop_live_brokers() -> None:
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop()


class KafkaBroker:
    """One combined broker+controller KRaft node on 127.0.0.1.

    `workdir=None` makes a temp folder that `stop()` removes. With a `workdir` of your
    own, data and ports are kept across `stop()`/`start()` (and across processes: the
    ports and cluster id are recorded in `<workdir>/broker.json`).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        libs: str | os.PathLike[str] | None = None,
        heap_opts: Sequence[str] = DEFAULT_HEAP_OPTS,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        extra_config: Mapping[str, str] | None = None,
        node_id: int = NODE_ID,
        quorum_voters: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self._workdir: Path | None = Path(workdir).resolve() if workdir is not None else None
        self._node_id = node_id
        # "1@HOST:PORT,2@HOST:PORT,...": a node of a static controller quorum (a cluster,
        # devtools.kafka_cluster); None: a standalone single-node quorum of its own.
        self._quorum_voters = quorum_voters
        self._owns_workdir = False
        self._port = port
        self._controller_port = controller_port
        self._ports_pinned = port is not None or controller_port is not None  # else: state
        self._libs = Path(libs) if libs is not None else None
        self._heap_opts = tuple(heap_opts)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._extra_config = dict(extra_config or {})
        self._cluster_id: str | None = cluster_id  # else a new one when it is formatted
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None  # set when attached to a broker of another process
        if self._workdir is not None:
            self._load_state()

    # -- public properties --

    @property
    def bootstrap(self) -> str:
        """`127.0.0.1:PORT` of the PLAINTEXT listener."""
        if self._port is None:
            raise KafkaLauncherError("the broker has not been started")
        return f"{HOST}:{self._port}"

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def controller_port(self) -> int | None:
        return self._controller_port

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def workdir(self) -> Path | None:
        return self._workdir

    @property
    def log_file(self) -> Path | None:
        """The broker's log4j2 log (`<workdir>/logs/server.log`)."""
        return self._workdir / "logs" / "server.log" if self._workdir else None

    @property
    def stdout_file(self) -> Path | None:
        """The JVM's stdout+stderr (`<workdir>/logs/stdout.log`)."""
        return self._workdir / "logs" / "stdout.log" if self._workdir else None

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self._pid

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._pid is not None and _pid_alive(self._pid)

    # -- lifecycle --

    def start(self, *, wait: bool = True) -> Self:
        """Fetch (once), configure, format (once) and start; return when it serves clients.

        Raises `BrokerStartError` (with the log tail) if it does not come up within
        `start_timeout_s`. A no-op if it is already running. `wait=False` returns once the
        JVM is launched; `wait_ready()` then waits (a cluster's nodes serve clients only
        once a majority of its controllers runs, so they are launched first, then awaited).
        """
        if self.running:
            return self
        libs = self._libs if self._libs is not None else fetch_kafka()
        java = require_java()
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="gridledger-kafka-")).resolve()
            self._owns_workdir = True
        try:
            self._start_in_workdir(java, libs, wait=wait)
        except BaseException:
            if self._owns_workdir and not self.running:
                self._remove_workdir()
            raise
        _LIVE.add(self)
        return self

    def stop(self) -> None:
        """SIGTERM, wait (bounded), SIGKILL if needed; remove the work dir if it is ours."""
        self._terminate(hard=False)
        _LIVE.discard(self)
        if self._owns_workdir:
            self._remove_workdir()

    def kill(self) -> None:
        """SIGKILL the broker, keeping its data (a crash, for fault tests)."""
        self._terminate(hard=True)

    def wait_ready(self) -> None:
        """Wait (bounded by `start_timeout_s`) until a node launched with `start(wait=False)`
        serves clients; on failure it is killed and `BrokerStartError` raised."""
        try:
            self._wait_ready()
        except BaseException:
            self._terminate(hard=True)
            raise
        self._write_state()

    def restart(self, *, hard: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with `hard=True`) and start again: same ports, same data."""
        if self._workdir is None or self._port is None:
            raise KafkaLauncherError("restart() of a broker that was never started or was stopped")
        self._terminate(hard=hard)
        java = require_java()
        libs = self._libs if self._libs is not None else fetch_kafka()
        for port in (self._port, self._controller_port):
            if port is not None and not _port_is_free(port):
                raise BrokerStartError(
                    f"cannot restart the broker: port {port} on {HOST} is taken by another process"
                )
        self._launch(java, libs)
        _LIVE.add(self)

    def detach(self) -> None:
        """Forget the broker without stopping it (it keeps running after this process)."""
        _LIVE.discard(self)
        if self._proc is not None:
            self._pid = self._proc.pid
            self._proc = None
        self._owns_workdir = False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the broker log and of the JVM's stdout/stderr."""
        parts: list[str] = []
        for path in (self.log_file, self.stdout_file):
            if path is None:
                continue
            text = _read_tail(path, lines)
            if text:
                parts.append(f"==> {path} <==\n{text}")
        return "\n".join(parts) if parts else "(no broker output)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"KafkaBroker({self._workdir}, port={self._port}, {state})"

    @classmethod
    def attach(cls, workdir: str | os.PathLike[str]) -> KafkaBroker:
        """The broker recorded in `<workdir>/broker.json` (started by another process)."""
        broker = cls(workdir)
        if broker._port is None:
            raise KafkaLauncherError(f"no broker state in {workdir}")
        return broker

    # -- internals --

    def _state_path(self) -> Path:
        assert self._workdir is not None
        return self._workdir / _STATE_FILE

    def _load_state(self) -> None:
        path = self._state_path()
        if not path.is_file():
            return
        state = json.loads(path.read_text(encoding="utf-8"))
        if not self._ports_pinned:
            self._port = int(state["port"])
            self._controller_port = int(state["controller_port"])
        self._cluster_id = str(state["cluster_id"])
        pid = state.get("pid")
        if isinstance(pid, int) and _pid_alive(pid) and self._is_our_java(pid):
            self._pid = pid

    def _write_state(self) -> None:
        state = {
            "kafka": KAFKA_VERSION,
            "bootstrap": self.bootstrap,
            "port": self._port,
            "controller_port": self._controller_port,
            "cluster_id": self._cluster_id,
            "pid": self.pid if self.running else None,
        }
        path = self._state_path()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def _is_our_java(self, pid: int) -> bool:
        """Guard against a recycled pid: its command line must name our config file."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        props = str(self._workdir_path() / _PROPERTIES_FILE).encode()
        return props in cmdline

    def _workdir_path(self) -> Path:
        if self._workdir is None:
            raise KafkaLauncherError("the broker has no work dir")
        return self._workdir

    def _data_dir(self) -> Path:
        return self._workdir_path() / "data"

    @property
    def log_dir(self) -> Path:
        """The broker's ``log.dirs``: one directory per topic partition (for tests that
        look at what the broker stored)."""
        return self._data_dir()

    def _formatted(self) -> bool:
        return (self._data_dir() / "meta.properties").is_file()

    def _start_in_workdir(self, java: str, libs: Path, *, wait: bool = True) -> None:
        port_pinned, controller_pinned = self._port is not None, self._controller_port is not None
        # Free ports are picked before the JVM binds them; another process can win that
        # race. Only then, and only for a node formatted by this very call, pick again.
        attempts = 1 if self._formatted() or port_pinned else 3
        for port in (self._port, self._controller_port):
            if port is not None and not _port_is_free(port):
                raise BrokerStartError(f"port {port} on {HOST} is taken by another process")
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                shutil.rmtree(self._data_dir(), ignore_errors=True)
                if not port_pinned:
                    self._port = None
                if not controller_pinned:
                    self._controller_port = None
            if self._port is None:
                self._port = _free_port()
            while self._controller_port is None or self._controller_port == self._port:
                self._controller_port = _free_port()
            self._write_config(libs)
            if not self._formatted():
                self._cluster_id = self._cluster_id or new_cluster_id()
                self._format(java, libs)
            try:
                self._launch(java, libs, wait=wait)
                return
            except BrokerStartError as exc:
                if attempt == attempts or "Address already in use" not in exc.log_tail:
                    raise

    def _write_config(self, libs: Path) -> None:
        work = self._workdir_path()
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._data_dir().mkdir(parents=True, exist_ok=True)
        settings: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": str(self._node_id),
            **(
                {"controller.quorum.voters": self._quorum_voters}
                if self._quorum_voters is not None
                else {"controller.quorum.bootstrap.servers": f"{HOST}:{self._controller_port}"}
            ),
            "listeners": f"PLAINTEXT://{HOST}:{self._port},CONTROLLER://{HOST}:{self._controller_port}",
            "advertised.listeners": (
                f"PLAINTEXT://{HOST}:{self._port},CONTROLLER://{HOST}:{self._controller_port}"
            ),
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self._data_dir()),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # After a SIGKILL the restarted node waits for its old broker session to
            # expire before it can register again (default 9 s): keep that short.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # Event-sourced: nothing is ever deleted by age or size.
            "log.retention.ms": "-1",
            "log.retention.bytes": "-1",
            # Topics are created explicitly with their partition count (create_topic).
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
        }
        settings.update(self._extra_config)
        lines = [
            f"# Generated by devtools.kafka_broker for Apache Kafka {KAFKA_VERSION}.",
            *(f"{key}={_props_value(value)}" for key, value in settings.items()),
        ]
        (work / _PROPERTIES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
        log4j = f"""# Generated by devtools.kafka_broker: the broker logs to logs/server.log.
status = warn
name = gridledger-kafka
appender.file.type = File
appender.file.name = file
appender.file.fileName = {_props_value(str(logs / "server.log"))}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d{{ISO8601}}] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""
        (work / _LOG4J_FILE).write_text(log4j, encoding="utf-8")

    def _java_cmd(self, java: str, libs: Path, heap: Sequence[str]) -> list[str]:
        work = self._workdir_path()
        return [
            java,
            *heap,
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={work / _LOG4J_FILE}",
            f"-Dkafka.logs.dir={work / 'logs'}",
            "-cp",
            f"{libs}/*",
        ]

    def _format(self, java: str, libs: Path) -> None:
        work = self._workdir_path()
        assert self._cluster_id is not None
        cmd = [
            *self._java_cmd(java, libs, ("-Xmx256m",)),
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self._cluster_id,
            "--config",
            str(work / _PROPERTIES_FILE),
            # A static quorum (voters in the config) is formatted without this.
            *(["--standalone"] if self._quorum_voters is None else []),
            *self._format_args(),
        ]
        try:
            done = subprocess.run(
                cmd,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=self._start_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerStartError("formatting the KRaft storage timed out") from exc
        if done.returncode != 0:
            raise BrokerStartError(
                f"formatting the KRaft storage failed (exit {done.returncode})",
                self._redact(tail_text(done.stdout + done.stderr)) + "\n" + self.log_tail(),
            )

    def _format_args(self) -> list[str]:
        """Extra arguments of the storage format step (a subclass adds SCRAM users)."""
        return []

    def _redact(self, text: str) -> str:
        """Output of the format step as it may be shown (a subclass hides secrets)."""
        return text

    def _launch(self, java: str, libs: Path, *, wait: bool = True) -> None:
        work = self._workdir_path()
        cmd = [
            *self._java_cmd(java, libs, self._heap_opts),
            "kafka.Kafka",
            str(work / _PROPERTIES_FILE),
        ]
        stdout_path = work / "logs" / "stdout.log"
        with stdout_path.open("ab") as out:
            out.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} start\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: no stray terminal signals
            )
        self._pid = None
        if wait:
            self.wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._start_timeout_s
        last: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the Kafka broker exited with code {code} during start-up", self.log_tail()
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"the Kafka broker did not answer on {self.bootstrap} within "
                    f"{self._start_timeout_s:.0f} s (last probe: {last!r})",
                    self.log_tail(),
                )
            try:
                with _probing(self.bootstrap):
                    run_sync(_probe(self.bootstrap, min(5.0, remaining)))
                return
            except Exception as exc:
                last = exc
            # Doubles as the pause between probes and an immediate exit check.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=min(0.2, max(0.01, deadline - time.monotonic())))

    def _terminate(self, *, hard: bool) -> None:
        proc, pid = self._proc, self.pid
        if pid is None:
            return
        sig = signal.SIGKILL if hard else signal.SIGTERM
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                try:
                    proc.wait(timeout=self._stop_timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=self._stop_timeout_s)
        elif _pid_alive(pid) and self._is_our_java(pid):
            os.kill(pid, sig)
            if not _wait_pid_gone(pid, self._stop_timeout_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_pid_gone(pid, self._stop_timeout_s)
        self._proc = None
        self._pid = None
        if self._workdir is not None and self._workdir.is_dir() and self._port is not None:
            with contextlib.suppress(OSError):
                self._write_state()

    def _remove_workdir(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._owns_workdir = False


def _pid_alive(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_pid_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# --- command line ----------------------------------------------------------------------


def _default_workdir() -> Path:
    return cache_dir() / "kafka" / "broker"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.kafka_broker",
        description=f"A single-node Apache Kafka {KAFKA_VERSION} broker on 127.0.0.1.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the Kafka jars with Maven; print the libs folder")
    p_start = sub.add_parser("start", help="start a broker in the background; print HOST:PORT")
    p_start.add_argument("--workdir", type=Path, default=None, help="data, logs, config")
    p_start.add_argument("--port", type=int, default=None, help="PLAINTEXT port")
    p_start.add_argument("--controller-port", type=int, default=None)
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    p_start.add_argument(
        "--foreground", action="store_true", help="stay attached; stop on Ctrl-C or SIGTERM"
    )
    p_stop = sub.add_parser("stop", help="stop the broker started with `start`")
    p_stop.add_argument("--workdir", type=Path, default=None)
    p_stop.add_argument("--purge", action="store_true", help="also delete its data and logs")
    p_topic = sub.add_parser("create-topic", help="create a topic (infinite retention)")
    p_topic.add_argument("name")
    p_topic.add_argument("--bootstrap", required=True, help="HOST:PORT")
    p_topic.add_argument("--partitions", type=int, default=1)
    p_topic.add_argument("--exist-ok", action="store_true")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            print(fetch_kafka())
            return 0
        if args.command == "create-topic":
            create_topic(args.bootstrap, args.name, args.partitions, exist_ok=args.exist_ok)
            return 0
        workdir: Path = args.workdir or _default_workdir()
        if args.command == "stop":
            if not (workdir / _STATE_FILE).is_file():
                print(f"no broker state in {workdir}", file=sys.stderr)
                return 0 if not args.purge else _purge(workdir)
            broker = KafkaBroker.attach(workdir)
            broker.stop()
            return _purge(workdir) if args.purge else 0
        # start
        workdir.mkdir(parents=True, exist_ok=True)
        broker = KafkaBroker(
            workdir,
            port=args.port,
            controller_port=args.controller_port,
            start_timeout_s=args.timeout,
        )
        broker.start()
        print(broker.bootstrap, flush=True)
        if not args.foreground:
            broker.detach()
            return 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0) and broker.running:
                pass
        except KeyboardInterrupt:
            pass
        broker.stop()
        return 0
    except (KafkaLauncherError, TopicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _purge(workdir: Path) -> int:
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
