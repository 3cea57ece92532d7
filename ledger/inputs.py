"""One consumed input and where it came from (transport positions, SPEC/EXPORT.md).

Positions are strings: ``kafka:<topic>:<partition>:<offset>`` or
``local:<source>:<segment>:<offset>``. The offsets table keys a *source* (one Kafka
partition, one spool directory) to the position of the next input to read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Item:
    """An input as consumed: bytes, position, transport key, and the source's next position."""

    data: bytes
    position: str
    stream_key: str | None
    source: str
    next_position: str


def kafka_source(topic: str, partition: int) -> str:
    """The offsets key of one Kafka partition."""
    return f"kafka:{topic}:{partition}"


def kafka_position(topic: str, partition: int, offset: int) -> str:
    """The position string of one Kafka message."""
    return f"kafka:{topic}:{partition}:{offset}"


def local_source(name: str) -> str:
    """The offsets key of one spool directory under local_dir."""
    return f"local:{name}"


def local_position(name: str, segment: int, offset: int) -> str:
    """The position string of one spool entry."""
    return f"local:{name}:{segment}:{offset}"
