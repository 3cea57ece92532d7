"""A three-node Apache Kafka cluster on 127.0.0.1 for failover tests and benchmarks.

The same Maven-fetched jars as ``devtools.kafka_broker`` (one ``KafkaBroker`` per node),
run as three combined broker+controller KRaft nodes with a static controller quorum
(``controller.quorum.voters``: a majority of two keeps the metadata log going when one
node is down). What production runs, in miniature:

* every topic is created with replication factor 3 and ``min.insync.replicas=2``
  (``transport.kafka.replicated_topic_config``), so an ``acks=all`` producer is
  acknowledged only once two replicas hold the record, and one node may be lost;
* the internal topics (offsets, transaction state) are replicated the same way;
* infinite retention, ``LogAppendTime``, no auto-created topics (as the single node).

Library use::

    with KafkaCluster() as cluster:             # temp work dir, free ports, removed on exit
        cluster.create_topic("gridledger.records", partitions=12)   # RF 3, min ISR 2
        leader = cluster.leader_of("gridledger.records", 0)
        cluster.kill(leader)                     # SIGKILL, data kept
        cluster.restart_node(leader)             # same ports, same data; back in sync
        cluster.wait_in_sync(["gridledger.records"])
        cluster.kill(cluster.quorum_leader())    # the active controller
        cluster.rolling_restart()                # SIGTERM and start, one node at a time

Command line (devtools is not in the wheel: run it from a checkout)::

    python -m devtools.kafka_cluster start [--workdir DIR]   # prints the bootstrap list
    python -m devtools.kafka_cluster status [--workdir DIR]
    python -m devtools.kafka_cluster create-topic NAME [--partitions N]
    python -m devtools.kafka_cluster kill NODE | restart NODE | rolling-restart
    python -m devtools.kafka_cluster stop [--workdir DIR] [--purge]

JVM heaps are small (``CLUSTER_HEAP_OPTS``: three brokers share a 2-core machine with
the tests), and each node runs fewer network and I/O threads than Kafka's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from devtools.kafka_broker import (
    HOST,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BrokerStartError,
    KafkaBroker,
    fetch_metadata,
    new_cluster_id,
)
from devtools.kafka_fetch import KAFKA_VERSION, KafkaLauncherError, cache_dir, fetch_kafka
from transport.kafka import (
    MIN_INSYNC_REPLICAS,
    REPLICATION_FACTOR,
    TopicError,
    create_topic,
    replicated_topic_config,
)

__all__ = [
    "CLUSTER_HEAP_OPTS",
    "CLUSTER_SIZE",
    "IN_SYNC_TIMEOUT_S",
    "KafkaCluster",
    "PartitionState",
    "main",
]

CLUSTER_SIZE: Final = REPLICATION_FACTOR
"""Nodes in the cluster: one per replica of a topic."""

CLUSTER_HEAP_OPTS: Final[tuple[str, ...]] = ("-Xms128m", "-Xmx384m", "-XX:+UseSerialGC")
"""Per node: a small heap and the serial collector (no GC threads fighting for 2 cores)."""

IN_SYNC_TIMEOUT_S: Final = 60.0
"""Longest wait for every replica to be back in sync (after a restart) or for a leader."""

POLL_S: Final = 0.2
"""Pause between two looks at the cluster's metadata while waiting for a condition."""

_STATE_FILE: Final = "cluster.json"
_QUORUM_STATE: Final = Path("data") / "__cluster_metadata-0" / "quorum-state"

# Per node, on top of devtools.kafka_broker's single-node settings.
_CLUSTER_CONFIG: Final[Mapping[str, str]] = {
    "default.replication.factor": str(REPLICATION_FACTOR),
    "min.insync.replicas": str(MIN_INSYNC_REPLICAS),
    "offsets.topic.replication.factor": str(REPLICATION_FACTOR),
    "transaction.state.log.replication.factor": str(REPLICATION_FACTOR),
    "transaction.state.log.min.isr": str(MIN_INSYNC_REPLICAS),
    "share.coordinator.state.topic.replication.factor": str(REPLICATION_FACTOR),
    "share.coordinator.state.topic.min.isr": str(MIN_INSYNC_REPLICAS),
    "unclean.leader.election.enable": "false",
    # A follower that stops fetching leaves the ISR after this (default 30 s); a node that
    # dies is fenced sooner, after broker.session.timeout.ms (3 s, kafka_broker).
    "replica.lag.time.max.ms": "10000",
    # Small: three nodes on two shared cores.
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.replica.fetchers": "1",
    "background.threads": "2",
    "log.cleaner.threads": "1",
}


@dataclass(frozen=True)
class PartitionState:
    """One partition as the cluster's metadata describes it."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def in_sync(self) -> bool:
        """A leader, and every replica in the in-sync set."""
        return self.leader >= 0 and set(self.isr) == set(self.replicas)


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports on 127.0.0.1 (held open together while picked)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


_QUIET_THREADS: set[int] = set()  # threads fetching our own metadata (see below)


class _OwnClientNoiseFilter(logging.Filter):
    """Drop aiokafka's 'Unable connect to node ...' errors of the launcher's own metadata
    client: a node that was just killed is still listed until it is fenced, and the
    client tries it on the way to one that answers. Other clients' errors stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.thread in _QUIET_THREADS and str(record.msg).startswith("Unable connect to")
        )


logging.getLogger("aiokafka").addFilter(_OwnClientNoiseFilter())


def _run_quiet(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` to completion on a thread of its own whose connection errors are quiet."""
    box: dict[str, Any] = {}

    def runner() -> None:
        _QUIET_THREADS.add(threading.get_ident())
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc
        finally:
            _QUIET_THREADS.discard(threading.get_ident())

    thread = threading.Thread(target=runner, name="kafka-cluster-metadata", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _metadata(bootstrap: str, timeout_s: float) -> Any:
    """One full metadata fetch (aiokafka ClusterMetadata) from `bootstrap`."""
    return await fetch_metadata(bootstrap, timeout_s, client_id="gridledger-kafka-cluster")


class KafkaCluster:
    """`size` combined broker+controller KRaft nodes on 127.0.0.1 (see the module doc).

    `workdir=None` makes a temp folder that `stop()` removes. With a `workdir` of your
    own, ports, cluster id and data are kept across `stop()`/`start()` and across
    processes (`<workdir>/cluster.json`, one `node-<id>/` folder per node).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        size: int = CLUSTER_SIZE,
        libs: str | os.PathLike[str] | None = None,
        heap_opts: Sequence[str] = CLUSTER_HEAP_OPTS,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        self._workdir: Path | None = Path(workdir).resolve() if workdir is not None else None
        self._owns_workdir = False
        self._size = size
        self._libs = Path(libs) if libs is not None else None
        self._heap_opts = tuple(heap_opts)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._extra_config = dict(extra_config or {})
        self._cluster_id: str | None = None
        self._ports: dict[int, tuple[int, int]] = {}  # node id -> (client port, controller)
        self._nodes: dict[int, KafkaBroker] = {}
        if self._workdir is not None and (self._workdir / _STATE_FILE).is_file():
            self._load_state()

    # -- properties --

    @property
    def bootstrap(self) -> str:
        """`127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`: every node's PLAINTEXT listener."""
        if not self._ports:
            raise KafkaLauncherError("the cluster has not been started")
        return ",".join(f"{HOST}:{port}" for port, _ in self._ports.values())

    @property
    def workdir(self) -> Path | None:
        return self._workdir

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    @property
    def node_ids(self) -> list[int]:
        """The node ids, 1..size."""
        return list(range(1, self._size + 1))

    @property
    def nodes(self) -> list[KafkaBroker]:
        """The nodes' launchers, by node id."""
        return [self._nodes[n] for n in sorted(self._nodes)]

    def node(self, node_id: int) -> KafkaBroker:
        """The launcher of node `node_id` (kill, restart, log_tail, pid, ...)."""
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KafkaLauncherError(f"no node {node_id} in this cluster") from None

    @property
    def running(self) -> bool:
        """True when every node runs."""
        return bool(self._nodes) and all(n.running for n in self._nodes.values())

    def running_bootstrap(self) -> str:
        """The bootstrap list of the nodes that run now (none: KafkaLauncherError)."""
        alive = [n for n in self.nodes if n.running]
        if not alive:
            raise KafkaLauncherError("no node of the cluster is running")
        return ",".join(n.bootstrap for n in alive)

    # -- lifecycle --

    def start(self) -> Self:
        """Fetch (once), configure and format (once) every node, launch them all, and
        return once each serves clients and every node is registered. A no-op when
        every node runs; starts the ones that do not."""
        if self.running:
            return self
        libs = self._libs if self._libs is not None else fetch_kafka()
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="gridledger-kafka-cluster-")).resolve()
            self._owns_workdir = True
        try:
            if not self._ports:
                self._cluster_id = new_cluster_id()
                ports = _free_ports(2 * self._size)
                self._ports = {
                    n: (ports[2 * i], ports[2 * i + 1]) for i, n in enumerate(self.node_ids)
                }
                self._write_state()
            self._make_nodes(libs)
            stopped = [n for n in self.nodes if not n.running]
            # A node serves clients only once a majority of controllers runs: launch all
            # (format included), then wait for each.
            self._each(stopped, lambda n: n.start(wait=False))
            self._each(stopped, lambda n: n.wait_ready())
            self.wait_registered()
        except BaseException:
            self._stop_nodes(hard=True)
            if self._owns_workdir:
                self._remove_workdir()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every node at once (bounded wait, then SIGKILL); remove the work dir
        if it is ours."""
        self._stop_nodes(hard=False)
        if self._owns_workdir:
            self._remove_workdir()

    def kill(self, node_id: int) -> None:
        """SIGKILL one node, keeping its data (a crash)."""
        self.node(node_id).kill()

    def restart_node(
        self, node_id: int, *, hard: bool = False, in_sync_timeout_s: float = IN_SYNC_TIMEOUT_S
    ) -> None:
        """(Re)start one node — stopped first with SIGTERM, or SIGKILL with `hard` — and
        return once it serves clients and every replica of every topic is in sync again."""
        node = self.node(node_id)
        if node.running:
            node.restart(hard=hard)
        else:
            node.restart()  # same ports, same data
        self.wait_registered()
        self.wait_in_sync(timeout_s=in_sync_timeout_s)

    def rolling_restart(
        self, *, hard: bool = False, in_sync_timeout_s: float = IN_SYNC_TIMEOUT_S
    ) -> list[int]:
        """Restart every node in turn (SIGTERM: a controlled shutdown moves leadership
        away first; `hard`: SIGKILL), each back in sync before the next; the node order."""
        order = self.node_ids
        for node_id in order:
            self.restart_node(node_id, hard=hard, in_sync_timeout_s=in_sync_timeout_s)
        return order

    def detach(self) -> None:
        """Forget the nodes without stopping them (they keep running after this process)."""
        for node in self._nodes.values():
            node.detach()
        self._owns_workdir = False

    @classmethod
    def attach(cls, workdir: str | os.PathLike[str]) -> KafkaCluster:
        """The cluster recorded in `<workdir>/cluster.json` (started by another process)."""
        cluster = cls(workdir)
        if not cluster._ports:
            raise KafkaLauncherError(f"no cluster state in {workdir}")
        cluster._make_nodes(cluster._libs)
        return cluster

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
        states = (
            ", ".join(f"{n.node_id}:{'up' if n.running else 'down'}" for n in self.nodes)
            or "not started"
        )
        return f"KafkaCluster({self._workdir}, {states})"

    # -- topics and metadata --

    def create_topic(self, name: str, partitions: int, *, exist_ok: bool = False) -> None:
        """Create a topic replicated on every node (RF = size, at most 3) with
        `replicated_topic_config` (min.insync.replicas 2 at RF 3, infinite retention,
        LogAppendTime); return once every partition has a leader and a full ISR."""
        factor = min(self._size, REPLICATION_FACTOR)
        create_topic(
            self.running_bootstrap(),
            name,
            partitions,
            replication_factor=factor,
            config=replicated_topic_config(factor),
            exist_ok=exist_ok,
        )
        self.wait_in_sync([name])

    def describe(self, topic: str, *, timeout_s: float = 10.0) -> dict[int, PartitionState]:
        """Leader, replicas and ISR of every partition of `topic`, from a running node."""
        metadata = self._fetch_metadata(self.running_bootstrap(), timeout_s)
        return _partitions_of(metadata, topic)

    def leader_of(self, topic: str, partition: int) -> int:
        """The node leading `partition` now (KafkaLauncherError when it has none)."""
        state = self.describe(topic).get(partition)
        if state is None or state.leader < 0:
            raise KafkaLauncherError(f"{topic}[{partition}] has no leader now")
        return state.leader

    def quorum_leader(self) -> int | None:
        """The active controller (the KRaft quorum leader), from the nodes' own
        `quorum-state` files: the leader of the newest epoch any node recorded."""
        best: tuple[int, int] | None = None
        for node in self.nodes:
            assert node.workdir is not None
            try:
                state = json.loads((node.workdir / _QUORUM_STATE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            epoch, leader = int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))
            if leader >= 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        return None if best is None else best[1]

    def wait_quorum_leader(
        self, *, other_than: int | None = None, timeout_s: float = IN_SYNC_TIMEOUT_S
    ) -> int:
        """Wait (bounded) for an active controller other than `other_than`; its id."""
        found: list[int] = []

        def elected() -> bool:
            leader = self.quorum_leader()
            if leader is None or leader == other_than or not self.node(leader).running:
                return False
            found.append(leader)
            return True

        self._poll(elected, timeout_s, "an elected controller")
        return found[-1]

    def wait_registered(self, *, timeout_s: float | None = None) -> None:
        """Wait (bounded) until every running node lists every running node as a broker."""
        wanted = {n.node_id for n in self.nodes if n.running}

        def registered() -> bool:
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    metadata = self._fetch_metadata(node.bootstrap, 5.0)
                except Exception:
                    return False
                if {b.nodeId for b in metadata.brokers()} < wanted:
                    return False
            return True

        self._poll(
            registered,
            self._start_timeout_s if timeout_s is None else timeout_s,
            f"nodes {sorted(wanted)} to register",
        )

    def wait_in_sync(
        self, topics: Iterable[str] | None = None, *, timeout_s: float = IN_SYNC_TIMEOUT_S
    ) -> None:
        """Wait (bounded) until every partition of `topics` (default: every topic) has a
        leader and all its replicas in sync, as every running node sees it."""
        names = None if topics is None else set(topics)
        problems: list[str] = []

        def in_sync() -> bool:
            problems.clear()
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    metadata = self._fetch_metadata(node.bootstrap, 5.0)
                except Exception as exc:
                    problems.append(f"node {node.node_id}: {exc!r}")
                    return False
                wanted = set(metadata.topics(exclude_internal_topics=False))
                if names is not None:
                    missing = names - wanted
                    if missing:
                        problems.append(f"node {node.node_id} does not know {sorted(missing)}")
                        return False
                    wanted = names
                for topic in sorted(wanted):
                    for state in _partitions_of(metadata, topic).values():
                        if not state.in_sync:
                            problems.append(f"node {node.node_id}: {topic} {state}")
                            return False
            return True

        self._poll(in_sync, timeout_s, "every replica in sync", problems)

    # -- internals --

    def _poll(
        self,
        condition: Callable[[], bool],
        timeout_s: float,
        what: str,
        last: Sequence[str] = (),
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                detail = f" (last: {'; '.join(last)})" if last else ""
                raise KafkaLauncherError(
                    f"timed out after {timeout_s:.0f} s waiting for {what}{detail}"
                )
            time.sleep(POLL_S)

    def _fetch_metadata(self, bootstrap: str, timeout_s: float) -> Any:
        return _run_quiet(_metadata(bootstrap, timeout_s))

    def _voters(self) -> str:
        return ",".join(f"{n}@{HOST}:{ports[1]}" for n, ports in sorted(self._ports.items()))

    def _make_nodes(self, libs: Path | None) -> None:
        if self._nodes:
            return
        assert self._workdir is not None
        for node_id, (port, controller_port) in sorted(self._ports.items()):
            self._nodes[node_id] = KafkaBroker(
                self._workdir / f"node-{node_id}",
                port=port,
                controller_port=controller_port,
                libs=libs,
                heap_opts=self._heap_opts,
                start_timeout_s=self._start_timeout_s,
                stop_timeout_s=self._stop_timeout_s,
                extra_config={**_CLUSTER_CONFIG, **self._extra_config},
                node_id=node_id,
                quorum_voters=self._voters(),
                cluster_id=self._cluster_id,
            )

    def _each(self, nodes: Sequence[KafkaBroker], action: Callable[[KafkaBroker], object]) -> None:
        if not nodes:
            return
        with ThreadPoolExecutor(len(nodes), thread_name_prefix="kafka-node") as pool:
            futures = [pool.submit(action, n) for n in nodes]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            first = errors[0]
            assert first is not None
            if isinstance(first, KafkaLauncherError):
                raise first
            raise BrokerStartError(f"a cluster node failed: {first!r}") from first

    def _stop_nodes(self, *, hard: bool) -> None:
        nodes = [n for n in self.nodes if n.running]
        if not nodes:
            return
        # All at once: a node stopped alone waits for a controller to acknowledge its
        # controlled shutdown, which the last ones would not get.
        errors: list[BaseException] = []

        def stop(node: KafkaBroker) -> None:
            try:
                node.kill() if hard else node.stop()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=stop, args=(n,), name="kafka-stop") for n in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors and not hard:
            raise KafkaLauncherError(f"stopping the cluster: {errors[0]!r}")

    def _load_state(self) -> None:
        assert self._workdir is not None
        state = json.loads((self._workdir / _STATE_FILE).read_text(encoding="utf-8"))
        self._cluster_id = str(state["cluster_id"])
        self._ports = {
            int(node["node_id"]): (int(node["port"]), int(node["controller_port"]))
            for node in state["nodes"]
        }
        self._size = len(self._ports)

    def _write_state(self) -> None:
        assert self._workdir is not None
        self._workdir.mkdir(parents=True, exist_ok=True)
        state = {
            "kafka": KAFKA_VERSION,
            "cluster_id": self._cluster_id,
            "bootstrap": self.bootstrap,
            "nodes": [
                {"node_id": n, "port": p, "controller_port": c}
                for n, (p, c) in sorted(self._ports.items())
            ],
        }
        path = self._workdir / _STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def _remove_workdir(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._owns_workdir = False
        self._nodes = {}
        self._ports = {}


def _partitions_of(metadata: Any, topic: str) -> dict[int, PartitionState]:
    partitions: Mapping[int, Any] = metadata._partitions.get(topic, {})
    return {
        p: PartitionState(p, int(m.leader), tuple(m.replicas), tuple(m.isr))
        for p, m in sorted(partitions.items())
    }


# --- command line ----------------------------------------------------------------------


def _default_workdir() -> Path:
    return cache_dir() / "kafka" / "cluster"


@contextlib.contextmanager
def _attached(workdir: Path) -> Iterator[KafkaCluster]:
    if not (workdir / _STATE_FILE).is_file():
        raise KafkaLauncherError(f"no cluster state in {workdir}: start one first")
    cluster = KafkaCluster.attach(workdir)
    try:
        yield cluster
    finally:
        cluster.detach()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m devtools.kafka_cluster ...`; exit 0 done, 1 failed (one line why)."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.kafka_cluster",
        description=(
            f"A {CLUSTER_SIZE}-node Apache Kafka {KAFKA_VERSION} KRaft cluster on 127.0.0.1 "
            "(replication factor 3, min.insync.replicas 2)."
        ),
    )
    parser.add_argument("--workdir", type=Path, default=None, help="data, logs, config, state")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start the cluster in the background; print bootstrap")
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    p_start.add_argument(
        "--foreground", action="store_true", help="stay attached; stop on Ctrl-C or SIGTERM"
    )
    sub.add_parser("status", help="each node: pid, port, up or down; the active controller")
    p_topic = sub.add_parser("create-topic", help="create a topic (RF 3, min ISR 2, infinite)")
    p_topic.add_argument("name")
    p_topic.add_argument("--partitions", type=int, default=12)
    p_topic.add_argument("--exist-ok", action="store_true")
    p_kill = sub.add_parser("kill", help="SIGKILL one node (its data is kept)")
    p_kill.add_argument("node", type=int)
    p_restart = sub.add_parser("restart", help="start one node again; wait until in sync")
    p_restart.add_argument("node", type=int)
    sub.add_parser("rolling-restart", help="restart every node in turn, each back in sync")
    p_stop = sub.add_parser("stop", help="stop every node")
    p_stop.add_argument("--purge", action="store_true", help="also delete data and logs")
    args = parser.parse_args(argv)
    workdir: Path = args.workdir or _default_workdir()
    try:
        if args.command == "start":
            workdir.mkdir(parents=True, exist_ok=True)
            cluster = KafkaCluster(workdir, start_timeout_s=args.timeout)
            cluster.start()
            print(cluster.bootstrap, flush=True)
            if not args.foreground:
                cluster.detach()
                return 0
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(1.0) and cluster.running:
                    pass
            cluster.stop()
            return 0
        if args.command == "stop":
            if not (workdir / _STATE_FILE).is_file():
                print(f"no cluster state in {workdir}", file=sys.stderr)
            else:
                cluster = KafkaCluster.attach(workdir)
                cluster.stop()
            if args.purge:
                shutil.rmtree(workdir, ignore_errors=True)
            return 0
        with _attached(workdir) as cluster:
            if args.command == "status":
                for node in cluster.nodes:
                    state = f"up pid {node.pid}" if node.running else "down"
                    print(f"node {node.node_id}  {node.bootstrap}  {state}")
                print(f"bootstrap {cluster.bootstrap}")
                print(f"active controller: node {cluster.quorum_leader()}")
            elif args.command == "create-topic":
                cluster.create_topic(args.name, args.partitions, exist_ok=args.exist_ok)
            elif args.command == "kill":
                cluster.kill(args.node)
            elif args.command == "restart":
                cluster.restart_node(args.node)
            else:
                print(" ".join(str(n) for n in cluster.rolling_restart()))
        return 0
    except (KafkaLauncherError, TopicError, ValueError) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
