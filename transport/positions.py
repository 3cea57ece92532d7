"""Where an input is: the one codec of spool and Kafka positions (SPEC/EXPORT.md).

A spool position is (segment number, byte offset of a frame in it). Its text form is
``SEGMENT:OFFSET`` (decimal), the form the ledger stores as the next position of a spool;
the shipper's ``SHIPPED`` file holds the same position as JSON
``{"segment":S,"offset":O}``.

The ledger's offsets table keys a *source* (one Kafka partition, one spool directory) to
the position of the next input to read; each consumed input carries a position string:
``kafka:<topic>:<partition>:<offset>`` or ``local:<source>:<segment>:<offset>``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

__all__ = [
    "PositionError",
    "SpoolPosition",
    "decode_shipped",
    "encode_shipped",
    "kafka_offset",
    "kafka_position",
    "kafka_source",
    "local_position",
    "local_source",
    "parse_spool_position",
    "partition_of_source",
    "spool_position_text",
]


class PositionError(ValueError):
    """A stored position that is not in its format."""


@dataclass(frozen=True, order=True, slots=True)
class SpoolPosition:
    """A place in the spool: segment file number and byte offset of a frame in it."""

    segment: int
    offset: int


def spool_position_text(position: SpoolPosition) -> str:
    """``SEGMENT:OFFSET``."""
    return f"{position.segment}:{position.offset}"


def parse_spool_position(text: str) -> SpoolPosition:
    """The inverse of ``spool_position_text``; PositionError for anything else."""
    segment, sep, offset = text.partition(":")
    if not sep or not segment.isdigit() or not offset.isdigit():
        raise PositionError(f"stored spool position {text!r} is not SEGMENT:OFFSET")
    return SpoolPosition(int(segment), int(offset))


class _Shipped(msgspec.Struct, forbid_unknown_fields=True):
    segment: int
    offset: int


def encode_shipped(position: SpoolPosition) -> bytes:
    """The bytes of a ``SHIPPED`` file: the position as JSON."""
    return msgspec.json.encode(_Shipped(position.segment, position.offset))


def decode_shipped(raw: bytes) -> SpoolPosition:
    """The position of a ``SHIPPED`` file; PositionError when it is not one."""
    try:
        parsed = msgspec.json.decode(raw, type=_Shipped)
    except msgspec.DecodeError as exc:
        raise PositionError(f"not a shipped position: {exc}") from exc
    if parsed.segment < 0 or parsed.offset < 0:
        raise PositionError(f"shipped position {parsed.segment}:{parsed.offset} is negative")
    return SpoolPosition(parsed.segment, parsed.offset)


def kafka_source(topic: str, partition: int) -> str:
    """The offsets key of one Kafka partition."""
    return f"kafka:{topic}:{partition}"


def partition_of_source(source: str) -> int:
    """The partition number of a ``kafka_source`` key."""
    _, sep, partition = source.rpartition(":")
    if not sep or not partition.isdigit():
        raise PositionError(f"source {source!r} is not kafka:TOPIC:PARTITION")
    return int(partition)


def kafka_position(topic: str, partition: int, offset: int) -> str:
    """The position string of one Kafka message."""
    return f"kafka:{topic}:{partition}:{offset}"


def kafka_offset(text: str) -> int:
    """A stored next offset of a Kafka partition (a decimal number)."""
    if not text.isdigit():
        raise PositionError(f"stored offset {text!r} is not a number")
    return int(text)


def local_source(name: str) -> str:
    """The offsets key of one spool directory under local_dir."""
    return f"local:{name}"


def local_position(name: str, position: SpoolPosition) -> str:
    """The position string of one spool entry."""
    return f"local:{name}:{spool_position_text(position)}"
