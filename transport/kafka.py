"""The Kafka transport: settings, client arguments, producer, consumer, topic creation.

One topic (``DEFAULT_TOPIC``), message key = ``placement_id``, an idempotent producer
with ``acks="all"``; every send is awaited until acknowledged. Topics are created
explicitly with their partition count and infinite retention (event-sourced,
``EVENT_SOURCED_TOPIC_CONFIG``), so a misspelt name or a producer that starts first fails
loudly instead of auto-creating a one-partition topic.

Every envelope is opened (``proto.envelope.open_envelope``) before it is sent: bytes that
are not a well-formed envelope, or whose key is not their placement, are refused with a
ProtoError and nothing of the batch is sent. The local transport is ``transport.local``.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.reasons import Reason
from transport.limits import SHIP_ATTEMPT_TIMEOUT_S

__all__ = [
    "DEFAULT_TOPIC",
    "EVENT_SOURCED_TOPIC_CONFIG",
    "LOG_APPEND_TIME",
    "MIN_INSYNC_REPLICAS",
    "REPLICATION_FACTOR",
    "SIMULATION_TOPIC_CONFIG",
    "KafkaSettings",
    "OutRecord",
    "TopicError",
    "TopicMissing",
    "client_kwargs",
    "create_topic",
    "create_topic_async",
    "kafka_error_text",
    "make_consumer",
    "make_producer",
    "partitioner_for",
    "placement_of",
    "publish_kafka",
    "replicated_topic_config",
    "run_sync",
    "send_batched",
    "topic_partition_ids",
]

DEFAULT_TOPIC: Final = "gridledger.records"
_SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Topic-level settings for event-sourced topics: never delete anything by age or size.
EVENT_SOURCED_TOPIC_CONFIG: Final[Mapping[str, str]] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    # Time from the log, not from the party (SPEC §8.3): the broker stamps each record when
    # it appends it, and the acknowledgement carries that time back to the producer.
    "message.timestamp.type": "LogAppendTime",
}

REPLICATION_FACTOR: Final = 3
"""Replicas of the records topic in production: one broker may be lost (and one more
may be in maintenance) without losing an acknowledged record."""

MIN_INSYNC_REPLICAS: Final = 2
"""At replication factor 3: an ``acks=all`` write is acknowledged only once two replicas
hold it, so the loss of any one broker loses nothing acknowledged."""


def replicated_topic_config(replication_factor: int) -> dict[str, str]:
    """``EVENT_SOURCED_TOPIC_CONFIG`` plus ``min.insync.replicas`` for a topic with
    ``replication_factor`` replicas: 2 from 3 replicas up (``MIN_INSYNC_REPLICAS``), 1
    below (a single broker, or 2 replicas where requiring both would stop every write
    while either broker is down)."""
    if replication_factor < 1:
        raise ValueError(f"replication factor {replication_factor} is below 1")
    floor = MIN_INSYNC_REPLICAS if replication_factor >= REPLICATION_FACTOR else 1
    return {**EVENT_SOURCED_TOPIC_CONFIG, "min.insync.replicas": str(floor)}


# A simulation's topic (SPEC §6.6 ``arrival = "sender"``, never production): the same,
# but each record keeps the timestamp its producer set (the sender's simulated clock).
SIMULATION_TOPIC_CONFIG: Final[Mapping[str, str]] = {
    **EVENT_SOURCED_TOPIC_CONFIG,
    "message.timestamp.type": "CreateTime",
}

_T = TypeVar("_T")


class TopicError(RuntimeError):
    """A topic could not be created (the broker's error code is in the message)."""


@dataclass(frozen=True)
class KafkaSettings:
    """Where and how to reach Kafka. TLS/SASL become client arguments in ``client_kwargs``."""

    bootstrap: str
    topic: str = DEFAULT_TOPIC
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("kafka bootstrap is empty")
        if self.security_protocol not in _SECURITY_PROTOCOLS:
            raise ValueError(
                f"security_protocol {self.security_protocol!r} is not one of "
                f"{', '.join(_SECURITY_PROTOCOLS)}"
            )
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in _SASL_MECHANISMS:
                raise ValueError(
                    f"sasl_mechanism {self.sasl_mechanism!r} is not one of "
                    f"{', '.join(_SASL_MECHANISMS)}"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(f"{self.security_protocol} needs sasl_username and sasl_password")

    def __repr__(self) -> str:  # never print the password
        shown = "***" if self.sasl_password is not None else None
        return (
            f"KafkaSettings(bootstrap={self.bootstrap!r}, topic={self.topic!r}, "
            f"security_protocol={self.security_protocol!r}, "
            f"sasl_mechanism={self.sasl_mechanism!r}, sasl_username={self.sasl_username!r}, "
            f"sasl_password={shown!r}, ssl_cafile={self.ssl_cafile!r})"
        )


def client_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Connection arguments for AIOKafkaProducer / AIOKafkaConsumer / admin clients."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        kwargs["ssl_context"] = create_ssl_context(cafile=settings.ssl_cafile)
    if settings.security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = settings.sasl_mechanism
        kwargs["sasl_plain_username"] = settings.sasl_username
        kwargs["sasl_plain_password"] = settings.sasl_password
    return kwargs


# Record batches are zstd-compressed by the producer (level 3, Kafka's default, through
# cramjam, the codec package aiokafka itself uses): a batch of signed envelopes shrinks to
# about a fifth (~145 bytes per usage event, as with gzip), and the topic keeps everything
# forever at its replication factor. Measured on real envelopes: zstd 2.3 µs per
# event to compress and 0.9 to decompress against gzip's 10.2 and 2.2 (aiokafka's gzip runs
# at level 9, fixed). The broker stores batches as produced (compression.type=producer);
# consumers decompress transparently, gzip batches of older producers included; log-append
# time stays per batch, as the ledger reads it.
PRODUCER_COMPRESSION: Final = "zstd"

# The uncompressed bytes a producer batch may hold (aiokafka's default: 16 KiB, ~22 usage
# events). The client's and the broker's CPU go per batch, not per record: a batch costs
# the producer ~0.5 ms of asyncio and protocol Python whatever it holds, and the broker a
# request; one partition's batches go one at a time. Measured (bench/kafka_records.py,
# 100k signed usage events over 8 partitions, µs of CPU per event): 16 KiB produce 39.8,
# broker 76.9, consume 6.3; 256 KiB 9.6, 6.2, 4.1. A 256 KiB batch stays far under the
# broker's message.max.bytes (1 MiB) uncompressed too; a record larger than a batch still
# goes, alone in its batch.
PRODUCER_BATCH_BYTES: Final = 256 * 1024


# ConsumerRecord.timestamp_type / produce acknowledgement timestamp_type of a timestamp the
# broker stamped at append (message.timestamp.type=LogAppendTime); 0 is CreateTime.
LOG_APPEND_TIME: Final = 1


def kafka_error_text(exc: BaseException, bootstrap: str) -> str:
    """A Kafka client's failure in a person's words: no Python reprs, no class name said
    twice (a KafkaError's str() starts with its class name, and is often nothing more)."""
    name = type(exc).__name__
    message = str(exc)
    if message.startswith(f"{name}:"):
        message = message[len(name) + 1 :].strip()
    if "Unable to bootstrap" in message or isinstance(exc, ConnectionRefusedError):
        return (
            f"no Kafka broker answered at {bootstrap} (not running, another address, or its "
            "TLS/SASL settings refused the connection; --log-level debug shows each attempt)"
        )
    if isinstance(exc, TimeoutError):
        return f"Kafka at {bootstrap} did not answer in time"
    return f"{name}: {message}" if message else name


class TopicMissing(Exception):
    """The broker has no such topic (nothing was sent); ``topic`` names it."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


async def topic_partition_ids(client_owner: Any, topic: str) -> list[int] | None:
    """The sorted partition ids of ``topic`` (None: no such topic) from the cluster metadata
    of a started consumer, admin client or producer. ``consumer.topics()`` discards the partition
    lists; the cluster metadata it reads keeps them."""
    # A consumer or admin client holds it as _client, a producer as client.
    client = getattr(client_owner, "_client", None) or client_owner.client
    cluster = await client.fetch_all_metadata()
    if topic not in cluster.topics():
        return None
    return sorted(cluster.partitions_for_topic(topic) or ())


def make_producer(settings: KafkaSettings, **extra: Any) -> Any:
    """An idempotent, zstd-compressing producer (acks=all, batches of up to
    PRODUCER_BATCH_BYTES) for ``settings``; the caller starts and stops it. ``extra``
    overrides (``compression_type=None`` sends uncompressed)."""
    from aiokafka import AIOKafkaProducer

    options: dict[str, Any] = {
        "enable_idempotence": True,
        "acks": "all",
        "client_id": "gridledger-publisher",
        "compression_type": PRODUCER_COMPRESSION,
        "max_batch_size": PRODUCER_BATCH_BYTES,
        **extra,
    }
    return AIOKafkaProducer(**client_kwargs(settings), **options)


def make_consumer(settings: KafkaSettings, **extra: Any) -> Any:
    """A consumer for ``settings`` that commits nothing to Kafka (no group, no auto commit):
    the reader stores its own positions. The caller assigns, starts and stops it."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        **client_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        **extra,
    )


def placement_of(envelope: bytes) -> str:
    """The placement_id inside an envelope; ProtoError when it is not a valid envelope."""
    record = open_envelope(envelope).record
    placement_id = getattr(record, "placement_id", None)
    if not isinstance(placement_id, str):
        raise ProtoError(Reason.KIND_MISMATCH, f"a {type(record).__name__} has no placement_id")
    return placement_id


# ---- kafka ------------------------------------------------------------------------------


async def publish_kafka(
    settings: KafkaSettings,
    items: Sequence[tuple[str, bytes]],
    *,
    timeout_s: float = SHIP_ATTEMPT_TIMEOUT_S,
    producer: Any = None,
    timestamps_ms: Sequence[int] | None = None,
) -> None:
    """Send (placement_id, envelope) pairs in order, keyed by placement; await every ack.

    ``producer``: a started producer to send with (left running); without one a producer
    is made for this call and stopped after it.

    ``timestamps_ms`` (one per item): the producer timestamp of each record, the time a
    simulation's sender states (SPEC §6.6 ``arrival = "sender"``; a log-append topic
    replaces it with the broker's). None: the client's wall clock.

    Raises ProtoError (nothing sent) when an envelope does not open or does not belong
    to the placement it is keyed by; TimeoutError or a KafkaError when not every record
    was acknowledged within ``timeout_s`` (some may have been: resending is safe, the
    ledger drops exact duplicates).
    """
    if timestamps_ms is not None and len(timestamps_ms) != len(items):
        raise ValueError(f"{len(timestamps_ms)} timestamps for {len(items)} records")
    stamps: Sequence[int | None] = [None] * len(items) if timestamps_ms is None else timestamps_ms
    for key, envelope in items:
        inside = placement_of(envelope)
        if inside != key:
            raise ProtoError(
                Reason.PLACEMENT_MISMATCH, f"keyed by {key!r}, envelope is for {inside!r}"
            )
    if producer is not None:
        async with asyncio.timeout(timeout_s):
            await _send_all(producer, settings.topic, items, stamps)
        return
    own = make_producer(settings)
    try:
        async with asyncio.timeout(timeout_s):
            await own.start()
            # A producer waits for a missing topic's metadata until its timeout; say so now.
            if await topic_partition_ids(own, settings.topic) is None:
                raise TopicMissing(settings.topic)
            await _send_all(own, settings.topic, items, stamps)
    finally:
        async with asyncio.timeout(timeout_s):
            await own.stop()


async def _send_all(
    producer: Any,
    topic: str,
    items: Sequence[tuple[str, bytes]],
    stamps: Sequence[int | None],
) -> None:
    partition_of = await partitioner_for(producer, topic)
    records = []
    for (key, envelope), stamp in zip(items, stamps, strict=True):
        key_bytes = key.encode()
        records.append(OutRecord(key_bytes, envelope, partition_of(key_bytes), stamp))
    await send_batched(producer, topic, records)


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce: its key, value, partition and producer timestamp (None: the
    client's clock)."""

    key: bytes
    value: bytes
    partition: int
    timestamp_ms: int | None


async def partitioner_for(producer: Any, topic: str) -> Callable[[bytes], int]:
    """The partition the producer's default partitioner gives a key (murmur2 of the key
    over the topic's partitions: what ``producer.send`` would choose itself), computed
    once per key."""
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    partitions = sorted(await producer.partitions_for(topic))
    cache: dict[bytes, int] = {}

    def partition_of(key: bytes) -> int:
        partition = cache.get(key)
        if partition is None:
            partition = cache[key] = partitioner(key, partitions, partitions)
        return int(partition)

    return partition_of


async def send_batched(producer: Any, topic: str, records: Sequence[OutRecord]) -> list[Any]:
    """Produce ``records`` and await every acknowledgement; return, for each record, the
    acknowledgement of the batch that carried it (its base offset; its log-append time
    when the topic stamps one, which is per batch in Kafka anyway).

    The records of one partition go in the order given, in producer batches this function
    fills itself (``create_batch`` / ``send_batch``: half the client CPU of one ``send``
    and one future per record, bench/meter_cpu.py). A batch holds at least one record,
    whatever its size, as ``send`` would; the producer sends one partition's batches in
    order (one in its queue at a time) and, idempotent, without duplicates or reordering
    on retry. Raises what the producer raises when a batch is not acknowledged; nothing
    after it is acknowledged by this call (resending is safe: the ledger drops exact
    duplicates)."""
    lock = _send_locks.get(producer)
    if lock is None:
        lock = _send_locks[producer] = asyncio.Lock()
    async with lock:
        futures = await _submit(producer, topic, records)
    acks = await asyncio.gather(*(future for future, _ in futures))
    batch_of: list[Any] = [None] * len(records)
    for (_, members), ack in zip(futures, acks, strict=True):
        for position in members:
            batch_of[position] = ack
    return batch_of


# One submitter at a time per producer: aiokafka queues one batch per partition and makes
# every other ``send_batch`` for that partition wait for it to drain, taking the time it
# waited off its timeout once per wake-up, so several concurrent submitters (the replay's
# shippers share one producer) time out while the broker is healthy. The acknowledgements
# are awaited outside the lock.
_send_locks: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()


async def _submit(
    producer: Any, topic: str, records: Sequence[OutRecord]
) -> list[tuple[Any, list[int]]]:
    """Fill and submit the producer batches of ``records``: (the batch's future, the
    positions of the records it carries), in submission order."""
    builders: dict[int, Any] = {}
    waiting: dict[int, list[int]] = {}  # partition -> the records in its open batch
    futures: list[tuple[Any, list[int]]] = []

    async def flush(partition: int) -> None:
        future = await producer.send_batch(builders[partition], topic, partition=partition)
        futures.append((future, waiting[partition]))
        waiting[partition] = []

    for position, record in enumerate(records):
        partition = record.partition
        if partition not in builders:
            builders[partition] = producer.create_batch()
            waiting[partition] = []
        if _append(builders[partition], record) is None:  # full: send it, start the next
            await flush(partition)
            builders[partition] = producer.create_batch()
            if _append(builders[partition], record) is None:
                raise ValueError(f"a record of {len(record.value)} bytes fits no producer batch")
        waiting[partition].append(position)
    for partition in builders:
        await flush(partition)
    return futures


def _append(builder: Any, record: OutRecord) -> Any:
    return builder.append(key=record.key, value=record.value, timestamp=record.timestamp_ms)


# ---- topics -----------------------------------------------------------------------------


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=runner, name="gridledger-kafka-sync", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: _T = box["value"]
    return value


async def create_topic_async(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Create a topic and wait until every partition has a leader.

    `config` defaults to `EVENT_SOURCED_TOPIC_CONFIG` (infinite retention); pass `{}` for
    the broker's defaults. Raises TopicError naming the broker's error.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import for_code
    from aiokafka.structs import TopicPartition

    topic_config = dict(EVENT_SOURCED_TOPIC_CONFIG if config is None else config)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(1000, int(timeout_s * 1000)),
        client_id="gridledger-kafka-admin",
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            response = await admin.create_topics(
                [NewTopic(name, partitions, replication_factor, topic_configs=topic_config)]
            )
            for entry in response.topic_errors:
                topic, code = entry[0], entry[1]
                message = entry[2] if len(entry) > 2 else ""
                if code == 0:
                    continue
                error = for_code(code)
                if exist_ok and error.__name__ == "TopicAlreadyExistsError":
                    continue
                raise TopicError(
                    f"creating topic {topic!r}: {error.__name__} ({code}) {message or ''}"
                )
            client = admin._client  # the admin's own connection, to watch metadata
            while True:
                metadata = await client.fetch_all_metadata()
                found = metadata.partitions_for_topic(name) or set()
                if len(found) >= partitions and all(
                    (metadata.leader_for_partition(TopicPartition(name, p)) or -1) >= 0
                    for p in found
                ):
                    return
                await asyncio.sleep(0.05)
    finally:
        await admin.close()


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Synchronous `create_topic_async` (works inside a running event loop too)."""
    run_sync(
        create_topic_async(
            bootstrap,
            name,
            partitions,
            replication_factor=replication_factor,
            config=config,
            exist_ok=exist_ok,
            timeout_s=timeout_s,
        )
    )
