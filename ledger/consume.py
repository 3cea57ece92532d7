"""Where inputs come from: Kafka partitions or local spool directories.

Both sources hand out batches of ``Item`` and resume from the positions stored in the
ledger's offsets table; neither commits anything anywhere else (no consumer group, no
Kafka offset commits): the store is the only record of how far the ledger has read.

* ``KafkaSource``: manual assignment of the shard's partitions of the topic (a group join
  takes seconds, LIMITS.md), ``seek`` to the stored next offset, else the beginning (a
  fresh store replays from offset 0). ``auto_offset_reset="none"``: a stored offset the
  broker no longer has is an error, never a silent jump.
* ``LocalSource``: the embedded transport. Every spool directory under ``local_dir``
  is read (``transport.spool.read_spool``) into the ledger's own intake log
  (``transport.intake``), fsynced, and the fold consumes that log: one total order,
  the same for every reader and every rebuild (SPEC §6.4). The stored positions are
  the intake log's next entry and each spool's next record. The intake log's ``READ``
  file tells the spools' writers how far it holds each spool, so that they can delete
  what it holds (``transport.intake``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from ledger.config import Arrival, KafkaConfig
from ledger.inputs import Item
from transport.intake import INTAKE_SOURCE, IntakeEntry, IntakeLog, store_read
from transport.kafka import LOG_APPEND_TIME, kafka_error_text, make_consumer, topic_partition_ids
from transport.local import ledger_source, publisher_source
from transport.positions import (
    PositionError,
    SpoolPosition,
    kafka_offset,
    kafka_position,
    kafka_source,
    local_position,
    local_source,
    parse_spool_position,
    partition_of_source,
    spool_position_text,
)
from transport.spool import SpoolCorrupt, SpoolFull, SpoolLocked, read_spool

log = structlog.get_logger("ledger.consume")

_METADATA_TIMEOUT_S: Final = 30.0
# Bytes fetched per partition per request, per input a poll may return: a fetch of the
# client's default (1 MiB, ~1,300 inputs of ~760 bytes) made polls of a 5,000-input batch
# return a few hundred to a thousand, and every batch pays a commit and a snapshot per
# touched placement. At least the default; the caller's consumer_kwargs win.
_FETCH_BYTES_PER_INPUT: Final = 2048
_MIN_PARTITION_FETCH_BYTES: Final = 1 << 20
# Polls without waiting that top a batch up with what the client already fetched.
_TOP_UP_POLLS: Final = 8


class SourceError(Exception):
    """The source cannot be read (topic missing, no partitions for this shard, bad offset)."""


class SourceUnavailable(SourceError):
    """The broker did not answer; trying again later may succeed."""


# ---- local spools, through the intake log ------------------------------------------------------


def _stored_spool_position(text: str) -> SpoolPosition:
    try:
        return parse_spool_position(text)
    except PositionError as exc:
        raise SourceError(str(exc)) from exc


def _pass_rank(name: str) -> tuple[int, str]:
    # Within one intake pass: publishers (terms, bindings, reclaims, adjustments) first,
    # then the nodes, the ledgers' own close spools last. Only the order of the live
    # intake; a rebuild replays the intake log, whatever the names.
    if name.startswith(publisher_source("")):
        return 0, name
    if name.startswith(ledger_source("")):
        return 2, name
    return 1, name


class LocalSource:
    """Spools -> the ledger's intake log -> the fold (see the module docstring).

    ``poll`` hands out inputs from the intake log, after the last committed one; when
    the fold has caught up with the log it first reads more from the spools and appends
    it to the log (durably, with ``arrived_ms = clock()``; under ``arrival = "sender"``
    the time a stamped spool frame states, SPEC §6.6). ``advance`` moves past the
    inputs of a committed batch. On start the spool read positions are those stored
    with the last committed batch, moved on past every entry the log holds after it
    (appended, then killed before the commit): nothing is appended twice, nothing lost.
    """

    def __init__(
        self,
        local_dir: Path,
        offsets: Mapping[str, str],
        *,
        intake_dir: Path,
        clock: Callable[[], int],
        arrival: Arrival = "log",
    ) -> None:
        self.local_dir = local_dir
        self.intake_dir = intake_dir
        self._clock = clock
        self._arrival = arrival
        self._spools: dict[str, SpoolPosition] = {}
        # The positions last stated in the intake log's READ file (``_state_read``), and
        # whether the read positions moved since (at start: state them once).
        self._stated: dict[str, SpoolPosition] = {}
        self._unstated = True
        self._stalled: dict[str, str] = {}
        prefix = local_source("")
        for source, position in offsets.items():
            if source.startswith(prefix):
                self._spools[source[len(prefix) :]] = _stored_spool_position(position)
        stored = offsets.get(INTAKE_SOURCE)
        self._next: SpoolPosition | None = (
            None if stored is None else _stored_spool_position(stored)
        )
        try:
            self._intake = IntakeLog(intake_dir)
        except SpoolLocked as exc:
            raise SourceError(f"another ledger holds the intake log {intake_dir}") from exc
        except SpoolCorrupt as exc:
            raise SourceError(f"the intake log is damaged: {exc}") from exc
        try:
            self._recover()
        except BaseException:
            self._intake.close()
            raise

    def _recover(self) -> None:
        end = self._intake.end_position()
        if self._next is not None and self._next > end:
            raise SourceError(
                f"the store has folded the intake log {self.intake_dir} up to "
                f"{spool_position_text(self._next)}, but the log ends at "
                f"{spool_position_text(end)}: it was lost or replaced. Put it back, or "
                "rebuild from an empty store"
            )
        tail = 0
        try:
            for _, entry in self._intake.read(self._next):
                self._spools[entry.spool] = entry.next_position
                tail += 1
        except SpoolCorrupt as exc:
            raise SourceError(f"the intake log is damaged: {exc}") from exc
        log.info(
            "intake_opened",
            intake=str(self.intake_dir),
            fold_from=None if self._next is None else spool_position_text(self._next),
            entries_to_fold=tail,
        )

    def directories(self) -> list[str]:
        """Names of the spool directories, in the order one intake pass reads them."""
        if not self.local_dir.is_dir():
            return []
        intake = self.intake_dir.resolve()
        names = [p.name for p in self.local_dir.iterdir() if p.is_dir() and p.resolve() != intake]
        return sorted(names, key=_pass_rank)

    def poll(self, max_records: int) -> list[Item]:
        """Up to ``max_records`` inputs from the intake log, in its order."""
        items = self._from_intake(max_records)
        if not items and self._take(max_records):
            items = self._from_intake(max_records)
        return items

    def _from_intake(self, max_records: int) -> list[Item]:
        items: list[Item] = []
        try:
            for frame, entry in self._intake.read(self._next, max_records):
                items.append(
                    Item(
                        data=entry.data,
                        position=local_position(entry.spool, entry.position),
                        stream_key=None,
                        source=INTAKE_SOURCE,
                        next_position=spool_position_text(frame.next_position),
                        arrived_ms=entry.arrived_ms,
                        fed_by=(
                            (local_source(entry.spool), spool_position_text(entry.next_position)),
                        ),
                    )
                )
        except SpoolCorrupt as exc:
            # The ledger's own log is damaged: folding past it would change the order.
            raise SourceError(f"the intake log is damaged: {exc}") from exc
        return items

    def _take(self, max_records: int) -> int:
        """Read up to ``max_records`` from the spools into the intake log; how many."""
        names = [n for n in self.directories() if n not in self._stalled]
        if not names:
            return 0
        quota = max(1, max_records // len(names))
        entries: list[IntakeEntry] = []
        now = self._clock()
        drained = True  # every spool read to its end
        for name in names:
            budget = min(quota, max_records - len(entries))
            if budget <= 0:
                drained = False
                break
            got = self._read(name, budget, now)
            drained = drained and len(got) < budget
            entries.extend(got)
        if entries:
            try:
                self._intake.append(entries)
            except SpoolFull as exc:
                self._stalled[INTAKE_SOURCE] = str(exc)
                log.error("intake_full", intake=str(self.intake_dir), error=str(exc))
                return 0
            for entry in entries:
                self._spools[entry.spool] = entry.next_position
            self._unstated = True
        self._state_read(drained, {entry.spool for entry in entries})
        return len(entries)

    def _state_read(self, drained: bool, touched: set[str]) -> None:
        """Tell the spools' writers how far the intake log holds them (``READ``, after the
        append's fdatasync: ``transport.intake``) when they moved, and every spool was
        read to its end or a read position (of the spools ``touched``) moved to a later
        segment."""
        if not self._unstated:
            return
        if not drained and not any(
            self._spools[name].segment > self._stated[name].segment
            for name in touched
            if name in self._stated
        ):
            return
        try:
            store_read(self.intake_dir, self._spools)
        except OSError as exc:  # only collection waits; nothing read is lost
            log.warning("intake_read_file_not_written", intake=str(self.intake_dir), error=str(exc))
            return
        self._stated = dict(self._spools)
        self._unstated = False

    def _read(self, name: str, budget: int, now: int) -> list[IntakeEntry]:
        out: list[IntakeEntry] = []
        try:
            for entry in read_spool(
                self.local_dir / name, self._spools.get(name), max_records=budget
            ):
                out.append(
                    IntakeEntry(
                        spool=name,
                        segment=entry.position.segment,
                        offset=entry.position.offset,
                        next_segment=entry.next_position.segment,
                        next_offset=entry.next_position.offset,
                        # SPEC §6.6: the log's clock; a simulation's sender's stated time.
                        arrived_ms=(
                            entry.stamp_ms
                            if self._arrival == "sender" and entry.stamp_ms is not None
                            else now
                        ),
                        data=entry.data,
                    )
                )
        except SpoolCorrupt as exc:
            # Acknowledged data is damaged: stop reading this spool (never skip records
            # silently); the others keep flowing. An operator repairs and restarts.
            self._stalled[name] = str(exc)
            log.error("spool_corrupt", spool=name, error=str(exc))
        return out

    def advance(self, items: list[Item]) -> None:
        """Move past ``items`` (after their batch is committed)."""
        for item in items:
            if item.source == INTAKE_SOURCE:
                self._next = parse_spool_position(item.next_position)

    def stalled(self) -> dict[str, str]:
        """Spools (and the intake log, when full) that stopped, with the error."""
        return dict(self._stalled)

    def close(self) -> None:
        """Release the intake log (safe to call twice)."""
        self._intake.close()


# ---- Kafka -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """Consumer lag of one partition."""

    partition: int
    next_offset: int
    end_offset: int


async def _stop_consumer(consumer: Any) -> None:
    """Stop an aiokafka consumer, also when aiokafka's close trips over its own fetch task.

    A fetch that failed (e.g. timed out while the process was busy: a long commit or
    export on the event loop's thread) leaves aiokafka's fetch task asleep in its retry
    backoff; ``close`` cancels that task and awaits it, and the CancelledError escapes
    ``consumer.stop()`` (aiokafka 0.12), skipping the close of its broker connections. Such
    an error is not a cancellation of the caller: it is logged, and the connections are
    closed here. A cancellation of the caller itself still propagates."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("kafka_consumer_stop_interrupted", why="a fetch retry cancelled by close")
        await consumer._client.close()


class KafkaSource:
    """Consumes the shard's partitions of the topic (see the module docstring)."""

    def __init__(
        self,
        config: KafkaConfig,
        offsets: Mapping[str, str],
        *,
        max_poll_records: int,
        consumer_kwargs: Mapping[str, Any] | None = None,
        arrival: Arrival = "log",
    ) -> None:
        self.config = config
        self.arrival = arrival
        self._offsets = dict(offsets)
        self._max_poll_records = max_poll_records
        self._extra = {
            "max_partition_fetch_bytes": max(
                _MIN_PARTITION_FETCH_BYTES, max_poll_records * _FETCH_BYTES_PER_INPUT
            ),
            **(consumer_kwargs or {}),
        }
        self._consumer: Any = None
        # End offsets are asked on a connection of their own: the broker answers the
        # requests of one connection in order, so a ListOffsets behind the consumer's
        # parked fetch waited out fetch_max_wait_ms (~0.5 s per lag check, measured: 71 s
        # of a 95 s one-placement replay).
        self._offsets_client: Any = None
        self._partitions: list[TopicPartition] = []
        self._next: dict[int, int] = {}

    @property
    def partitions(self) -> list[int]:
        """The partitions this source reads."""
        return [tp.partition for tp in self._partitions]

    async def start(self) -> None:
        """Connect, assign the shard's partitions and seek to the stored offsets."""
        topic = self.config.topic
        consumer = make_consumer(
            self.config.settings,
            auto_offset_reset="none",
            max_poll_records=self._max_poll_records,
            **self._extra,
        )
        await self._start_client(consumer)
        self._consumer = consumer
        try:
            async with asyncio.timeout(_METADATA_TIMEOUT_S):
                available = await topic_partition_ids(consumer, topic)
            if available is None:
                raise SourceError(
                    f"topic {topic!r} does not exist; create it with its fixed partition count"
                )
            owned = [p for p in available if self.config.owns(p)]
            if self.config.partitions is not None:
                missing = sorted(set(self.config.partitions) - set(available))
                if missing:
                    raise SourceError(f"topic {topic!r} has no partition(s) {missing}")
            if not owned:
                raise SourceError(
                    f"shard {self.config.shard}/{self.config.shards} owns none of the "
                    f"{len(available)} partitions of {topic!r}"
                )
            self._partitions = [TopicPartition(topic, p) for p in owned]
            consumer.assign(self._partitions)
            for tp in self._partitions:
                stored = self._offsets.get(kafka_source(topic, tp.partition))
                if stored is None:
                    await consumer.seek_to_beginning(tp)
                    self._next[tp.partition] = -1  # known after the first fetch
                else:
                    try:
                        offset = kafka_offset(stored)
                    except PositionError as exc:
                        raise SourceError(f"{tp}: {exc}") from exc
                    consumer.seek(tp, offset)
                    self._next[tp.partition] = offset
            offsets_client = make_consumer(self.config.settings)
            await self._start_client(offsets_client)
            self._offsets_client = offsets_client
            log.info("kafka_assigned", topic=topic, partitions=self.partitions)
        except BaseException:
            await self.stop()
            raise

    async def _start_client(self, client: Any) -> None:
        """Start an aiokafka client, or stop it and raise SourceUnavailable naming the broker."""
        try:
            await client.start()
        except (KafkaError, OSError) as exc:
            with contextlib.suppress(Exception):
                await client.stop()
            raise SourceUnavailable(kafka_error_text(exc, self.config.settings.bootstrap)) from exc

    async def poll(self, max_records: int, timeout_ms: int) -> list[Item]:
        """Up to ``max_records`` inputs; waits at most ``timeout_ms`` when none are ready."""
        consumer = self._require()
        batches = await consumer.getmany(
            *self._partitions, timeout_ms=timeout_ms, max_records=max_records
        )
        got = sum(len(records) for records in batches.values())
        for _ in range(_TOP_UP_POLLS):  # top up from what is already fetched, never wait
            if got == 0 or got >= max_records:
                break
            more = await consumer.getmany(
                *self._partitions, timeout_ms=0, max_records=max_records - got
            )
            if not more:
                break
            for tp, records in more.items():  # each partition's records stay in order
                batches.setdefault(tp, []).extend(records)
                got += len(records)
        topic = self.config.topic
        log_time = self.arrival == "log"
        items: list[Item] = []
        append = items.append
        for tp in sorted(batches, key=lambda t: t.partition):
            source = kafka_source(topic, tp.partition)
            # kafka_position(topic, partition, offset) is this prefix and the offset: built
            # once per partition, not once per message (tests/test_kafka_poll_positions.py).
            prefix = kafka_position(topic, tp.partition, 0)[:-1]
            for message in batches[tp]:
                key: bytes | None = message.key
                offset: int = message.offset
                if log_time and message.timestamp_type != LOG_APPEND_TIME:
                    # SPEC §6.6: arrival time comes from the log, never from the producer
                    # (arrival = "sender", simulations only, takes the producer's).
                    raise SourceError(
                        f"{topic}[{tp.partition}]@{offset} carries a CreateTime "
                        "timestamp: the topic needs message.timestamp.type=LogAppendTime"
                    )
                value: bytes | None = message.value
                append(
                    Item(
                        data=b"" if value is None else value,
                        position=prefix + str(offset),
                        # Undecodable keys cannot equal a placement id: PLACEMENT_MISMATCH.
                        stream_key=None if key is None else key.decode("utf-8", "replace"),
                        source=source,
                        next_position=str(offset + 1),
                        arrived_ms=int(message.timestamp),
                    )
                )
        return items

    def advance(self, items: Sequence[Item]) -> None:
        """Move past ``items`` (after their batch is committed)."""
        # The last item of each source wins, as if each were applied in order.
        last = {item.source: item.next_position for item in items}
        for source, next_position in last.items():
            self._next[partition_of_source(source)] = kafka_offset(next_position)

    async def lag(self) -> list[PartitionLag]:
        """Per partition: the next offset to read and the log end offset now."""
        consumer = self._require()
        ends = await self._offsets_client.end_offsets(self._partitions)
        out: list[PartitionLag] = []
        for tp in self._partitions:
            nxt = self._next.get(tp.partition, -1)
            if nxt < 0:
                nxt = await consumer.position(tp)
                self._next[tp.partition] = nxt
            out.append(PartitionLag(tp.partition, nxt, int(ends[tp])))
        return out

    async def caught_up(self) -> bool:
        """True when every owned partition has been read to its end offset."""
        return all(p.next_offset >= p.end_offset for p in await self.lag())

    async def stop(self) -> None:
        """Close the consumer and the offsets client (safe to call twice)."""
        consumer, self._consumer = self._consumer, None
        offsets_client, self._offsets_client = self._offsets_client, None
        try:
            if consumer is not None:
                await _stop_consumer(consumer)
        finally:
            if offsets_client is not None:
                await offsets_client.stop()

    def _require(self) -> Any:
        if self._consumer is None:
            raise SourceError("the Kafka source is not started")
        return self._consumer
