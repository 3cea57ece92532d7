"""Putting signed envelopes into the stream: the local directory or Kafka.

Two transports carry the same records (DESIGN.md, "Embedded default"):

* **local** — a directory ``LOCAL_DIR`` holding one spool directory (``meter.spool``) per
  writer: node agents write ``LOCAL_DIR/node-<node_id>/``, publishers of terms, reclaims
  and adjustments ``LOCAL_DIR/publish-<name>/``, the ledger its PlacementClosed records
  ``LOCAL_DIR/ledger-<ledger_id>/``. The ledger reads every subdirectory, sorted by name.
* **kafka** — one topic, message key = ``placement_id``, an idempotent producer with
  ``acks="all"``; every send is awaited until acknowledged.

Every envelope is opened (``proto.envelope.open_envelope``) before it is written: bytes
that are not a well-formed envelope, or whose key is not their placement, are refused
with a ProtoError and nothing of the batch is written.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from meter.limits import SHIP_ATTEMPT_TIMEOUT_S, SPOOL_LOCK_POLL_S, SPOOL_LOCK_WAIT_S
from meter.spool import SpoolLocked, SpoolPosition, SpoolWriter
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.reasons import Reason

__all__ = [
    "DEFAULT_TOPIC",
    "KafkaSettings",
    "client_kwargs",
    "ledger_source",
    "make_producer",
    "node_source",
    "placement_of",
    "publish_kafka",
    "publish_local",
    "publisher_source",
]

DEFAULT_TOPIC: Final = "gridledger.records"
_SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SOURCE_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,200}$")


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


def make_producer(settings: KafkaSettings, **extra: Any) -> Any:
    """An idempotent producer (acks=all) for ``settings``; the caller starts and stops it."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(
        **client_kwargs(settings),
        enable_idempotence=True,
        acks="all",
        client_id="gridledger-publisher",
        **extra,
    )


def placement_of(envelope: bytes) -> str:
    """The placement_id inside an envelope; ProtoError when it is not a valid envelope."""
    record = open_envelope(envelope).record
    placement_id = getattr(record, "placement_id", None)
    if not isinstance(placement_id, str):
        raise ProtoError(Reason.KIND_MISMATCH, f"a {type(record).__name__} has no placement_id")
    return placement_id


# ---- local ------------------------------------------------------------------------------


def node_source(node_id: str) -> str:
    """The local-directory subfolder of a node agent."""
    return f"node-{node_id}"


def publisher_source(name: str) -> str:
    """The local-directory subfolder of a publisher of terms, reclaims, adjustments."""
    return f"publish-{name}"


def ledger_source(ledger_id: str) -> str:
    """The local-directory subfolder where a ledger publishes its PlacementClosed records."""
    return f"ledger-{ledger_id}"


def publish_local(local_dir: Path, source: str, envelopes: Sequence[bytes]) -> list[SpoolPosition]:
    """Append ``envelopes`` durably to ``local_dir/source/``; return their spool positions.

    Waits up to SPOOL_LOCK_WAIT_S for another writer of the same directory; raises
    SpoolLocked after that, ProtoError (nothing written) for an envelope that does not
    open, ValueError for a source name that is not a plain directory name.
    """
    if not _SOURCE_RE.match(source):
        raise ValueError(f"source {source!r} is not a plain directory name")
    for envelope in envelopes:
        placement_of(envelope)
    deadline = time.monotonic() + SPOOL_LOCK_WAIT_S
    while True:
        try:
            writer = SpoolWriter(Path(local_dir) / source)
            break
        except SpoolLocked:
            if time.monotonic() >= deadline:
                raise
            time.sleep(SPOOL_LOCK_POLL_S)
    with writer:
        return writer.append(list(envelopes))


# ---- kafka ------------------------------------------------------------------------------


async def publish_kafka(
    settings: KafkaSettings,
    items: Sequence[tuple[str, bytes]],
    *,
    timeout_s: float = SHIP_ATTEMPT_TIMEOUT_S,
) -> None:
    """Send (placement_id, envelope) pairs in order, keyed by placement; await every ack.

    Raises ProtoError (nothing sent) when an envelope does not open or does not belong
    to the placement it is keyed by; TimeoutError or a KafkaError when not every record
    was acknowledged within ``timeout_s`` (some may have been: resending is safe, the
    ledger drops exact duplicates).
    """
    for key, envelope in items:
        inside = placement_of(envelope)
        if inside != key:
            raise ProtoError(
                Reason.PLACEMENT_MISMATCH, f"keyed by {key!r}, envelope is for {inside!r}"
            )
    producer = make_producer(settings)
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
            futures = [
                await producer.send(settings.topic, value=envelope, key=key.encode())
                for key, envelope in items
            ]
            await asyncio.gather(*futures)
    finally:
        async with asyncio.timeout(timeout_s):
            await producer.stop()
