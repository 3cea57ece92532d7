"""Putting signed envelopes into the stream, for every command that publishes one.

``--kafka HOST:PORT`` (with ``--topic``) or ``--local-dir DIR`` (the embedded transport:
the envelope is appended, fsynced, to ``DIR/publish-<name>/``). A broker that does not
acknowledge is one line (exit 75, EX_TEMPFAIL); publishing again is always safe: the
ledger drops an exact duplicate (SPEC §6.1 (2)).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiokafka.errors import KafkaError

EX_TEMPFAIL: Final = 75
DEFAULT_TOPIC: Final = "gridledger.records"


class PublishError(Exception):
    """The envelope was not published; ``code`` is the exit code to return."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Target:
    """Where to publish: a Kafka bootstrap and topic, or a local transport directory."""

    kafka: str | None
    local_dir: Path | None
    topic: str = DEFAULT_TOPIC

    def describe(self) -> str:
        """Where, in words."""
        if self.local_dir is not None:
            return f"{self.local_dir}"
        return f"{self.kafka} topic {self.topic}"


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """``--kafka`` / ``--local-dir`` (alias ``--local``) and ``--topic``."""
    target = parser.add_mutually_exclusive_group(required=required)
    target.add_argument(
        "--kafka", metavar="HOST:PORT", help="publish to this Kafka bootstrap server"
    )
    target.add_argument(
        "--local-dir",
        "--local",
        dest="local_dir",
        type=Path,
        metavar="DIR",
        help="publish to the embedded transport: the ledger's local_dir",
    )
    parser.add_argument(
        "--topic",
        default=DEFAULT_TOPIC,
        help=f"Kafka topic (default {DEFAULT_TOPIC}; created beforehand)",
    )


def target_of(args: argparse.Namespace) -> Target | None:
    """The target the arguments name, or None when they name none."""
    kafka: str | None = getattr(args, "kafka", None)
    local_dir: Path | None = getattr(args, "local_dir", None)
    if kafka is None and local_dir is None:
        return None
    return Target(kafka=kafka, local_dir=local_dir, topic=getattr(args, "topic", DEFAULT_TOPIC))


def publish(target: Target, placement_id: str, publisher: str, envelope: bytes) -> None:
    """Publish one envelope, or raise PublishError with a one-line reason."""
    from transport import kafka, local
    from transport.spool import SpoolLocked

    raw = envelope.rstrip(b"\n")
    if target.local_dir is not None:
        if not target.local_dir.is_dir():
            raise PublishError(
                f"local transport directory {target.local_dir} does not exist (the ledger's "
                "local_dir); nothing was published",
                2,
            )
        try:
            local.publish_local(target.local_dir, local.publisher_source(publisher), [raw])
        except SpoolLocked as exc:
            raise PublishError(f"{exc}; nothing was published, try again", EX_TEMPFAIL) from exc
        except OSError as exc:
            raise PublishError(
                f"cannot write to {target.local_dir}: {exc.strerror or exc}; nothing was published",
                2,
            ) from exc
        return
    settings = kafka.KafkaSettings(bootstrap=str(target.kafka), topic=target.topic)
    # aiokafka logs each failed connection attempt itself; the one line below says it.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        asyncio.run(kafka.publish_kafka(settings, [(placement_id, raw)]))
    except kafka.TopicMissing as exc:
        raise PublishError(
            f"Kafka at {target.kafka} has no topic {target.topic!r} (--topic); nothing was "
            f"published: check the name (default {DEFAULT_TOPIC}) or create the topic",
            2,
        ) from exc
    except (OSError, TimeoutError, KafkaError) as exc:
        reason = kafka.kafka_error_text(exc, str(target.kafka))
        raise PublishError(
            f"Kafka at {target.kafka} did not acknowledge (topic {target.topic}): {reason}; "
            "nothing was published, try again",
            EX_TEMPFAIL,
        ) from exc
