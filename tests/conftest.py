"""Session fixtures for the real Kafka broker.

* `kafka_bootstrap` (session): "HOST:PORT" of a broker. `GRIDLEDGER_KAFKA` if set, else a
  broker started by `devtools.kafka_broker` the first time a test asks for it, stopped
  at the end of the session. A broker that cannot start fails the tests that need it.
* `kafka_broker` (function): the launcher object, for tests that stop/restart/kill the
  broker; after the test it is running again. Fails with an external broker.
* `tmp_topic` (function): a factory `tmp_topic(partitions=1, *, create=True) -> str`
  giving a unique topic name for the test, created on the broker unless `create=False`.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from devtools.kafka_broker import KafkaBroker, wait_for_broker
from devtools.kafka_fetch import KafkaLauncherError
from transport.kafka import create_topic

_EXTERNAL = "GRIDLEDGER_KAFKA"
_KAFKA_FIXTURES = frozenset({"kafka_bootstrap", "kafka_broker", "tmp_topic"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the broker carry the `kafka` marker (`-m "not kafka"` skips them)."""
    for item in items:
        if _KAFKA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


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
