"""Secure transport: a broker with a SASL_SSL (SCRAM) listener refuses whoever it should.

The test starts its own broker (not the session's PLAINTEXT one) with a throwaway CA
(``devtools.kafka_tls``). Every client is built the way the meter and the ledger build
theirs: ``KafkaSettings`` -> ``transport.kafka.client_kwargs``; the authenticated
round trip goes through ``publish_kafka`` (the publisher's producer) and the ledger's
own ``KafkaSource`` configured from a ``[kafka]`` table with a password file.

Refusals are shown at two levels: a single connection plus one metadata request gets the
specific error (SASL authentication failed, TLS certificate not trusted, connection
closed by the broker), and the real producer and consumer fail to start, within a bound,
with nothing delivered to the topic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import TopicPartition

from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from devtools.kafka_fetch import KafkaLauncherError
from devtools.kafka_tls import ScramUser, SecureKafkaBroker, TestPki, make_test_pki
from ledger.config import config_from_mapping
from ledger.consume import KafkaSource, SourceUnavailable
from transport.kafka import KafkaSettings, client_kwargs, create_topic, publish_kafka

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

# Bounds of one refused attempt: long enough for a loaded 2-core machine, short enough
# that a client which hangs instead of failing fails the test quickly.
REFUSAL_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_MS = 5000
ROUND_TRIP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Secured:
    """The running secured broker and what clients need to reach it."""

    broker: SecureKafkaBroker
    pki: TestPki
    meter: ScramUser
    ledger: ScramUser
    tmp: Path

    def topic(self) -> str:
        """A new one-partition topic (created through the launcher's listener)."""
        name = f"sec.{uuid.uuid4().hex[:12]}"
        create_topic(self.broker.bootstrap, name, 1)
        return name


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secure-kafka")
    pki = make_test_pki(tmp / "pki")
    meter = ScramUser("meter-1", secrets.token_hex(16))
    ledger = ScramUser("ledger-1", secrets.token_hex(16))
    broker = SecureKafkaBroker(pki, [meter, ledger])
    error = None
    try:
        broker.start()
    except KafkaLauncherError as exc:
        error = str(exc)
    if error is not None:
        pytest.fail(f"the secured Kafka broker could not start:\n{error}", pytrace=False)
    try:
        yield Secured(broker, pki, meter, ledger, tmp)
    finally:
        broker.stop()


def _envelopes(placement_id: str) -> list[tuple[str, bytes]]:
    """Terms and three usage events of one placement, signed, keyed by placement."""
    cast = make_cast(f"tls/{placement_id}")
    gpus = [gpu("node-a", 0)]
    start_ms = 1_767_225_600_000
    terms = make_terms(cast, placement_id, gpus, start_ms, start_ms + 3_600_000)
    stream = StreamWriter(cast.node_key("node-a"), placement_id, "node-a")
    minute = 60_000
    events = [
        stream.event(start_ms + i * minute, start_ms + (i + 1) * minute, [sample(gpus[0])])
        for i in range(3)
    ]
    return [(placement_id, e) for e in [signed_terms(cast, terms), *events]]


async def _end_offset(settings: KafkaSettings) -> int:
    """The end offset of partition 0 of the settings' topic, read as an allowed client."""
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)
    try:
        async with asyncio.timeout(ROUND_TRIP_TIMEOUT_S):
            await consumer.start()
            tp = TopicPartition(settings.topic, 0)
            ends = await consumer.end_offsets([tp])
            return int(ends[tp])
    finally:
        await consumer.stop()


# ---- the allowed client -------------------------------------------------------------------


def test_authenticated_client_publishes_and_the_ledger_reads(secured: Secured) -> None:
    topic = secured.topic()
    items = _envelopes("p-tls-ok")
    meter_settings = secured.broker.client_settings(secured.meter, topic=topic)
    assert meter_settings.security_protocol == "SASL_SSL"
    assert secured.meter.password not in repr(meter_settings)

    # The ledger's side, as an operator would configure it: password in a 0600 file.
    password_file = secured.tmp / "ledger-kafka-password"
    password_file.write_text(secured.ledger.password + "\n")
    password_file.chmod(0o600)
    config = config_from_mapping(
        {
            "ledger_id": "ledger-1",
            "key_file": "ledger-1.key",
            "db": "ledger.duckdb",
            "transport": "kafka",
            "kafka": {
                "bootstrap": secured.broker.secure_bootstrap,
                "topic": topic,
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": secured.broker.mechanism,
                "sasl_username": secured.ledger.name,
                "sasl_password_file": password_file.name,
                "ssl_cafile": str(secured.pki.ca_cert),
            },
        },
        secured.tmp,
    )
    assert config.kafka is not None
    assert config.kafka.settings.sasl_password == secured.ledger.password

    async def run() -> list[bytes]:
        await publish_kafka(meter_settings, items, timeout_s=ROUND_TRIP_TIMEOUT_S)
        source = KafkaSource(config.kafka, {}, max_poll_records=100)  # type: ignore[arg-type]
        got: list[bytes] = []
        try:
            async with asyncio.timeout(ROUND_TRIP_TIMEOUT_S):
                await source.start()
                deadline = time.monotonic() + ROUND_TRIP_TIMEOUT_S
                while len(got) < len(items) and time.monotonic() < deadline:
                    got.extend(i.data for i in await source.poll(100, timeout_ms=500))
        finally:
            await source.stop()
        return got

    got = asyncio.run(run())
    assert got == [envelope for _, envelope in items]
    assert asyncio.run(_end_offset(meter_settings)) == len(items)


# ---- refused clients ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A client that must be refused, and the error one connection must end with."""

    name: str
    settings: Callable[[Secured, str], KafkaSettings]
    error: type[BaseException]


def _allowed(s: Secured, topic: str) -> KafkaSettings:
    return s.broker.client_settings(s.meter, topic=topic)


def _other_ca(s: Secured) -> str:
    other = s.tmp / "other-pki"
    if not (other / "ca.pem").exists():
        make_test_pki(other, ca_name="someone else's CA")
    return str(other / "ca.pem")


REFUSALS = [
    Refusal(
        "wrong password",
        lambda s, t: dataclasses.replace(_allowed(s, t), sasl_password="not-" + s.meter.password),
        SaslAuthenticationFailed,
    ),
    Refusal(
        "unknown user",
        lambda s, t: dataclasses.replace(_allowed(s, t), sasl_username="mallory"),
        SaslAuthenticationFailed,
    ),
    Refusal(
        # Another user's password: credentials are per user, not one shared secret.
        "password of another user",
        lambda s, t: dataclasses.replace(_allowed(s, t), sasl_password=s.ledger.password),
        SaslAuthenticationFailed,
    ),
    Refusal(
        "mechanism without credentials (SCRAM-SHA-256)",
        lambda s, t: dataclasses.replace(_allowed(s, t), sasl_mechanism="SCRAM-SHA-256"),
        UnsupportedSaslMechanismError,
    ),
    Refusal(
        "TLS without SASL",
        lambda s, t: KafkaSettings(
            bootstrap=s.broker.secure_bootstrap,
            topic=t,
            security_protocol="SSL",
            ssl_cafile=str(s.pki.ca_cert),
        ),
        KafkaConnectionError,
    ),
    Refusal(
        "PLAINTEXT to the TLS port",
        lambda s, t: KafkaSettings(bootstrap=s.broker.secure_bootstrap, topic=t),
        KafkaConnectionError,
    ),
    Refusal(
        "SASL without TLS (right credentials)",
        lambda s, t: dataclasses.replace(_allowed(s, t), security_protocol="SASL_PLAINTEXT"),
        KafkaConnectionError,
    ),
    Refusal(
        "client pins another CA",
        lambda s, t: dataclasses.replace(_allowed(s, t), ssl_cafile=_other_ca(s)),
        ssl.SSLCertVerificationError,
    ),
    Refusal(
        "client trusts only the system CAs",
        lambda s, t: dataclasses.replace(_allowed(s, t), ssl_cafile=None),
        ssl.SSLCertVerificationError,
    ),
]


async def _one_connection(settings: KafkaSettings) -> None:
    """Connect once (TLS, SASL as configured) and ask for metadata."""
    kwargs = client_kwargs(settings)
    host, _, port = str(kwargs.pop("bootstrap_servers")).rpartition(":")
    conn = await create_conn(host, int(port), request_timeout_ms=REQUEST_TIMEOUT_MS, **kwargs)
    try:
        await conn.send(MetadataRequest([]))
    finally:
        conn.close()


async def _publish(settings: KafkaSettings, items: list[tuple[str, bytes]]) -> None:
    await publish_kafka(settings, items, timeout_s=REFUSAL_TIMEOUT_S)


async def _consume(settings: KafkaSettings) -> None:
    config = config_from_mapping(
        {
            "ledger_id": "ledger-x",
            "key_file": "k.key",
            "db": "x.duckdb",
            "transport": "kafka",
            "kafka": {"bootstrap": settings.bootstrap, "topic": settings.topic},
        },
        Path("."),
    )
    assert config.kafka is not None
    source = KafkaSource(
        dataclasses.replace(config.kafka, settings=settings),
        {},
        max_poll_records=10,
        consumer_kwargs={"request_timeout_ms": REQUEST_TIMEOUT_MS},
    )
    try:
        await source.start()
        await source.poll(10, timeout_ms=1000)
    finally:
        await source.stop()


@pytest.mark.parametrize("case", REFUSALS, ids=[r.name for r in REFUSALS])
def test_refused_client_gets_nothing_in_and_nothing_out(secured: Secured, case: Refusal) -> None:
    topic = secured.topic()
    allowed = _allowed(secured, topic)
    items = _envelopes("p-tls-refused")
    asyncio.run(publish_kafka(allowed, items[:1], timeout_s=ROUND_TRIP_TIMEOUT_S))
    settings = case.settings(secured, topic)

    async def attempt(coro: Callable[[], object]) -> BaseException | None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(REFUSAL_TIMEOUT_S):
                await coro()  # type: ignore[misc]
        except BaseException as exc:
            assert time.monotonic() - started < REFUSAL_TIMEOUT_S
            return exc
        return None

    # (1) One connection: the specific refusal.
    error = asyncio.run(attempt(lambda: _one_connection(settings)))
    assert isinstance(error, case.error), f"{case.name}: got {error!r}"
    # (2) The publisher's producer cannot start: nothing is written.
    error = asyncio.run(attempt(lambda: _publish(settings, items[1:])))
    assert isinstance(error, KafkaError), f"{case.name}: publish got {error!r}"
    # (3) The ledger's consumer cannot start: nothing is read. The source names the broker
    # that refused (SourceUnavailable, which `ledger run` retries) over aiokafka's error.
    error = asyncio.run(attempt(lambda: _consume(settings)))
    assert isinstance(error, SourceUnavailable), f"{case.name}: consume got {error!r}"
    assert isinstance(error.__cause__, KafkaError), f"{case.name}: cause {error.__cause__!r}"
    # Only the allowed client's one record is in the topic.
    assert asyncio.run(_end_offset(allowed)) == 1
