"""Session fixtures for the real Kafka broker.

* `kafka_bootstrap` (session): "HOST:PORT" of a broker. `GRIDLEDGER_KAFKA` if set, else a
  broker started by `devtools.kafka_broker` the first time a test asks for it, stopped
  at the end of the session. A broker that cannot start fails the tests that need it.
* `kafka_broker` (function): the launcher object, for tests that stop/restart/kill the
  broker; after the test it is running again. Fails with an external broker.
* `tmp_topic` (function): a factory `tmp_topic(partitions=1, *, create=True) -> str`
  giving a unique topic name for the test, created on the broker unless `create=False`.
* `kafka_cluster` (function, over one session cluster): a three-node KRaft cluster
  (`devtools.kafka_cluster`, replication factor 3, min.insync.replicas 2) started the
  first time a test asks for it — only the tests that need it pay for it — and stopped
  at the end of the session; after each test every node runs and every replica is in
  sync again. Tests using it carry the `kafka` and `cluster` markers.

A SIGTERM to the test run (a CI timeout, `kill`) ends it as Ctrl-C does: pytest tears the
session down, so the brokers and clusters it started are stopped, not orphaned.

Option `--run-slow`: also run the tests marked `slow` (skipped by default, each says
why it is long; e.g. the cluster's clean rolling restart).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import uuid
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from devtools.kafka_broker import KafkaBroker, wait_for_broker
from devtools.kafka_cluster import KafkaCluster
from devtools.kafka_fetch import KafkaLauncherError
from transport.kafka import create_topic

_EXTERNAL = "GRIDLEDGER_KAFKA"
_KAFKA_FIXTURES = frozenset({"kafka_bootstrap", "kafka_broker", "tmp_topic", "kafka_cluster"})
_RUN_SLOW = "--run-slow"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends the run like Ctrl-C: fixtures tear down and stop their brokers."""
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        _RUN_SLOW,
        action="store_true",
        default=False,
        help="also run the tests marked `slow` (e.g. the cluster's rolling restart)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the broker carry the `kafka` marker (`-m "not kafka"` skips them),
    those on the cluster also `cluster`; `slow` ones run only with `--run-slow`."""
    run_slow = bool(config.getoption(_RUN_SLOW))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if _KAFKA_FIXTURES & fixtures:
            item.add_marker(pytest.mark.kafka)
        if "kafka_cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
        if not run_slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason=f"slow: run with {_RUN_SLOW}"))


@pytest.fixture(scope="session")
def _kafka_launcher() -> Iterator[KafkaBroker]:
    broker = KafkaBroker()
    error = None
    try:
        broker.start()
    except KafkaLauncherError as exc:
        error = str(exc)
    if error is not None:
        pytest.fail(f"the test Kafka broker could not start:\n{error}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    external = os.environ.get(_EXTERNAL, "").strip()
    if external:
        error = None
        try:
            wait_for_broker(external, timeout_s=30.0)
        except KafkaLauncherError as exc:
            error = str(exc)
        if error is not None:
            pytest.fail(f"{_EXTERNAL}={external}: {error}", pytrace=False)
        return external
    broker: KafkaBroker = request.getfixturevalue("_kafka_launcher")
    return broker.bootstrap


@pytest.fixture
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    if os.environ.get(_EXTERNAL, "").strip():
        pytest.fail(
            f"this test stops and restarts the broker, which needs the launcher's own "
            f"broker: unset {_EXTERNAL}",
            pytrace=False,
        )
    broker: KafkaBroker = request.getfixturevalue("_kafka_launcher")
    yield broker
    if not broker.running:  # leave a running broker for the rest of the session
        error = None
        try:
            broker.restart()
        except KafkaLauncherError as exc:
            error = str(exc)
        if error is not None:
            pytest.fail(f"the test Kafka broker did not come back:\n{error}", pytrace=False)


@pytest.fixture(scope="session")
def _kafka_cluster_launcher() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster()
    error = None
    try:
        cluster.start()
    except KafkaLauncherError as exc:
        error = str(exc)
    if error is not None:
        pytest.fail(f"the test Kafka cluster could not start:\n{error}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_cluster(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    cluster: KafkaCluster = request.getfixturevalue("_kafka_cluster_launcher")
    yield cluster
    error = None
    try:  # leave every node running and in sync for the rest of the session
        for node in cluster.nodes:
            if not node.running:
                cluster.restart_node(node.node_id)
        cluster.wait_in_sync()
    except KafkaLauncherError as exc:
        error = str(exc)
    if error is not None:
        pytest.fail(f"the test Kafka cluster did not come back:\n{error}", pytrace=False)


_topic_counter = itertools.count()


@pytest.fixture
def tmp_topic(request: pytest.FixtureRequest) -> Callable[..., str]:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:120].strip("-.")

    def make(partitions: int = 1, *, create: bool = True) -> str:
        name = f"t.{stem}.{next(_topic_counter)}.{uuid.uuid4().hex[:8]}"
        if create:
            bootstrap: str = request.getfixturevalue("kafka_bootstrap")
            create_topic(bootstrap, name, partitions)
        return name

    return make


@pytest.fixture(autouse=True)
def _structlog_isolated() -> Iterator[None]:
    """A CLI run in-process configures structlog with the stream it saw (pytest's capture
    of that test); reset it after every test so no later test logs to a closed file."""
    yield
    import structlog

    structlog.reset_defaults()
