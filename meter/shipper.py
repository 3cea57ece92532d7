"""Ships the spool to Kafka: in order, keyed by placement, acknowledged, at least once.

The shipper reads the spool from the last acknowledged position, sends every record with
an idempotent producer (``acks="all"``, key = the record's ``placement_id``), awaits
every acknowledgement, and only then records the new position in ``SHIPPED`` (a small
file replaced atomically: temp file, fsync, rename, fsync of the directory).

After a crash, everything after the recorded position is sent again: delivery is at
least once, and the ledger drops exact duplicates. A failed batch tears the producer
down and is resent from the recorded position after a pause that doubles up to
SHIP_BACKOFF_MAX_S: while Kafka is unreachable the records wait in the spool (bounded by
its byte limit) and drain when it returns. In Kafka mode, segments wholly before the
acknowledged position are garbage-collected through a callback (the agent saves its
stream heads first); in local mode nothing ships, and the agent itself deletes what the
ledger has read into its intake log (``AgentConfig.collect_read``).

A simulation (``meter run --until-ms``) gives the shipper ``stamp``: the producer timestamp
of each record, the time the agent states it sent it on its simulated clock (SPEC §6.6
``arrival = "sender"``: ``simulated_send_ms``). It is a function of the record, so every
re-send states the same time. Without it the producer stamps the wall clock, which a
topic with ``LogAppendTime`` (production) replaces with the broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from meter.durable import read_small_file, write_atomic
from meter.limits import (
    PRODUCER_STOP_TIMEOUT_S,
    SHIP_BACKOFF_INITIAL_S,
    SHIP_BACKOFF_MAX_S,
    SHIP_BATCH_MAX_RECORDS,
    SHIP_IDLE_POLL_S,
)
from meter.metrics import MeterMetrics
from meter.stream import HandOff
from proto.delivery import DELIVERY_LOG_FILE, Delivered, append_delivered
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.reasons import Reason
from proto.records import Record, UsageEvent
from transport.kafka import (
    LOG_APPEND_TIME,
    KafkaSettings,
    OutRecord,
    kafka_error_text,
    make_producer,
    partitioner_for,
    send_batched,
)
from transport.limits import SHIP_ATTEMPT_TIMEOUT_S
from transport.positions import SpoolPosition, decode_shipped, encode_shipped
from transport.spool import SpoolEntry, read_spool

__all__ = ["SHIPPED_FILE", "Shipper", "load_shipped", "simulated_send_ms", "store_shipped"]

SHIPPED_FILE: Final = "SHIPPED"
_log = structlog.get_logger("meter.shipper")


def load_shipped(spool_dir: Path) -> SpoolPosition | None:
    """The acknowledged position recorded in ``spool_dir`` (None: nothing shipped yet)."""
    raw = read_small_file(spool_dir / SHIPPED_FILE)
    if raw is None:
        return None
    return decode_shipped(raw)


def simulated_send_ms(envelope: bytes, skew_ms: int = 0) -> int | None:
    """When an agent on a simulated clock sent ``envelope``, in the simulation's true time.

    The agent signs and spools a usage event when its interval ends on its own clock
    (``meter run --until-ms`` ticks exactly to each end), and that clock is ``skew_ms``
    ahead of the true time (negative: behind). None for anything but a usage event.
    """
    try:
        record, _ = _open(envelope)
    except ProtoError:
        return None
    if not isinstance(record, UsageEvent):
        return None
    return max(0, record.end_ms - skew_ms)


_last_opened: list[tuple[bytes, tuple[Record, str]]] = []


def _open(envelope: bytes) -> tuple[Record, str]:
    """The record and input hash of ``envelope`` (``open_envelope``), remembering the last
    envelope opened: the shipper opens each record once for its key and delivery line, and
    a ``stamp`` function (``simulated_send_ms``) asked next about the same bytes object
    gets it again."""
    if _last_opened and _last_opened[0][0] is envelope:
        return _last_opened[0][1]
    opened = open_envelope(envelope)
    return _remember(envelope, opened.record, opened.input_hash)


def _remember(envelope: bytes, record: Record, input_hash: str) -> tuple[Record, str]:
    """Make (record, input hash) what ``_open`` answers next for ``envelope``."""
    peeked = (record, input_hash)
    _last_opened[:] = [(envelope, peeked)]
    return peeked


def _placement_id(record: Record) -> str:
    """``transport.kafka.placement_of`` of an opened envelope's record."""
    placement_id = getattr(record, "placement_id", None)
    if not isinstance(placement_id, str):
        raise ProtoError(Reason.KIND_MISMATCH, f"a {type(record).__name__} has no placement_id")
    return placement_id


@dataclass(frozen=True, slots=True)
class _Sent:
    """A record handed to the producer: its stated time, the index of its acknowledgement,
    and for a usage event its delivery line's fields (input hash, node, placement, seq)."""

    stamp: int | None
    ack: int
    usage: tuple[str, str, str, int] | None


def _usage_line(record: Record, input_hash: str) -> tuple[str, str, str, int] | None:
    if not isinstance(record, UsageEvent):
        return None
    return (input_hash, record.node_id, record.placement_id, record.seq)


def store_shipped(spool_dir: Path, position: SpoolPosition) -> None:
    """Record ``position`` as acknowledged, atomically and durably."""
    write_atomic(spool_dir / SHIPPED_FILE, encode_shipped(position))


class Shipper:
    """Sends one spool directory to Kafka (see the module docstring)."""

    def __init__(
        self,
        spool_dir: Path,
        settings: KafkaSettings,
        *,
        metrics: MeterMetrics | None = None,
        collect_garbage: Callable[[SpoolPosition], int] | None = None,
        batch_max_records: int = SHIP_BATCH_MAX_RECORDS,
        attempt_timeout_s: float = SHIP_ATTEMPT_TIMEOUT_S,
        now_ms: Callable[[], int] | None = None,
        producer: Any = None,
        stamp: Callable[[bytes], int | None] | None = None,
        handed_off: HandOff | None = None,
    ) -> None:
        self._spool_dir = Path(spool_dir)
        # The events the agent of this spool (same process) spooled, so as not to open
        # their envelopes again (``Agent.hand_off``); anything else is opened here.
        self._handed_off = handed_off
        self._stamp = stamp
        # A started producer shared by several shippers (one host shipping many spools, as
        # the trace replay does) is used as is and never stopped here; without one the
        # shipper makes its own and tears it down after a failed batch.
        self._shared_producer = producer
        # The clock that dates deliveries in the delivery log (the agent's clock).
        self._now_ms = now_ms if now_ms is not None else (lambda: int(time.time() * 1000))
        self._settings = settings
        self.metrics = metrics if metrics is not None else MeterMetrics()
        self._collect_garbage = collect_garbage
        self._batch_max_records = batch_max_records
        self._attempt_timeout_s = attempt_timeout_s
        self._acked = load_shipped(self._spool_dir)
        self._producer: Any = producer
        self._wake = asyncio.Event()

    @property
    def acked(self) -> SpoolPosition | None:
        """The last acknowledged position (None: nothing acknowledged yet)."""
        return self._acked

    def wake(self) -> None:
        """Tell the shipper new records are in the spool (it also polls)."""
        self._wake.set()

    def pending(self) -> int:
        """Records in the spool after the acknowledged position."""
        return sum(1 for _ in read_spool(self._spool_dir, self._acked))

    async def _ensure_producer(self) -> Any:
        if self._producer is None:
            producer = make_producer(
                self._settings,
                linger_ms=5,
                request_timeout_ms=int(self._attempt_timeout_s * 1000),
            )
            try:
                async with asyncio.timeout(self._attempt_timeout_s):
                    await producer.start()
            except BaseException:
                await self._stop_producer(producer)
                raise
            self._producer = producer
        return self._producer

    async def _stop_producer(self, producer: Any) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(PRODUCER_STOP_TIMEOUT_S):
                await producer.stop()

    async def close(self) -> None:
        """Stop the producer (the shipper can be used again: it makes a new one)."""
        await self._discard_producer()

    async def _discard_producer(self) -> None:
        if self._shared_producer is not None:
            return  # its owner stops it
        producer, self._producer = self._producer, None
        if producer is not None:
            await self._stop_producer(producer)

    async def ship_available(self) -> int:
        """Ship everything the spool holds now, batch by batch; return how many records.

        Raises on the first batch not acknowledged in time (nothing after the recorded
        position is considered shipped).
        """
        shipped = 0
        while True:
            entries = list(
                read_spool(self._spool_dir, self._acked, max_records=self._batch_max_records)
            )
            if not entries:
                return shipped
            producer = await self._ensure_producer()
            async with asyncio.timeout(self._attempt_timeout_s):
                sent, acks = await self._send(producer, entries)
            # Acknowledged: the delivery log (for the operator's witness) first, then the
            # position. A crash between the two re-sends and logs again; readers dedupe.
            self._log_delivered(sent, acks)
            self._acked = entries[-1].next_position
            store_shipped(self._spool_dir, self._acked)
            shipped += len(sent)
            self.metrics.events_shipped.inc(len(sent))
            if self._collect_garbage is not None:
                self._collect_garbage(self._acked)

    async def _send(
        self, producer: Any, entries: list[SpoolEntry]
    ) -> tuple[list[_Sent], list[Any]]:
        """Send ``entries`` in spool order and await every acknowledgement: (what was sent,
        its acknowledgements, one per record sent).

        Each envelope is opened once (key, stated time, delivery line). The partition is
        the producer's default partitioner's (murmur2 of the key, what ``send`` would
        choose itself), computed once per key; the records go in producer batches
        (``transport.kafka.send_batched``), not one ``send`` each.
        """
        topic = self._settings.topic
        partition_of = await partitioner_for(producer, topic)
        records: list[OutRecord] = []
        sent: list[_Sent] = []
        handed_off = self._handed_off
        sha256 = hashlib.sha256
        for entry in entries:
            data = entry.data
            try:
                if handed_off is not None:
                    input_hash = sha256(data).hexdigest()
                    event = handed_off.take(input_hash)
                    record, input_hash = (
                        _open(data) if event is None else _remember(data, event, input_hash)
                    )
                else:
                    record, input_hash = _open(data)
                placement_id = _placement_id(record)
            except ProtoError as exc:
                # Not attributable to a placement: it cannot be keyed. Counted and logged;
                # it stays in the spool as evidence.
                self.metrics.records_skipped.labels(reason=exc.reason.value).inc()
                _log.error(
                    "spool_record_unshippable",
                    position=str(entry.position),
                    reason=exc.reason.value,
                )
                continue
            key = placement_id.encode()
            stamp = None if self._stamp is None else self._stamp(data)
            records.append(OutRecord(key, data, partition_of(key), stamp))
            sent.append(_Sent(stamp, len(records) - 1, _usage_line(record, input_hash)))
        acks = await send_batched(producer, topic, records)
        return sent, acks

    def _log_delivered(self, sent: list[_Sent], acks: list[Any]) -> None:
        now_ms = self._now_ms()
        lines = []
        for item in sent:
            if item.usage is None:
                continue  # not a usage event: nothing a node witness tracks
            input_hash, node_id, placement_id, seq = item.usage
            # The broker's log-append time when the topic keeps one (SPEC §8.3: time from
            # the log); the time a simulation stated; else the agent's clock. (The line
            # ``proto.delivery.delivered_usage`` makes, from the envelope opened once.)
            logged = _log_append_ms(acks[item.ack])
            stated = item.stamp if logged is None else logged
            lines.append(
                Delivered(
                    delivered_at_ms=now_ms if stated is None else stated,
                    input_hash=input_hash,
                    kind="usage",
                    node_id=node_id,
                    placement_id=placement_id,
                    seq=seq,
                )
            )
        append_delivered(self._spool_dir / DELIVERY_LOG_FILE, lines)

    async def run(self, stop: asyncio.Event, *, drain_timeout_s: float) -> bool:
        """Ship until ``stop`` is set, then drain for at most ``drain_timeout_s``.

        Returns True when everything spooled was acknowledged at the end.
        """
        backoff_s = SHIP_BACKOFF_INITIAL_S
        drain_deadline: float | None = None
        try:
            while True:
                if stop.is_set() and drain_deadline is None:
                    drain_deadline = time.monotonic() + drain_timeout_s
                try:
                    await self.ship_available()
                    self.metrics.events_pending.set(0)
                    backoff_s = SHIP_BACKOFF_INITIAL_S
                    failed = False
                except Exception as exc:
                    failed = True
                    self.metrics.ship_failures.inc()
                    pending = self.pending()
                    self.metrics.events_pending.set(pending)
                    _log.warning(
                        "ship_failed",
                        error=kafka_error_text(exc, self._settings.bootstrap),
                        pending=pending,
                        retry_in_s=backoff_s,
                    )
                    await self._discard_producer()
                if drain_deadline is not None:
                    if not failed and self.pending() == 0:
                        return True
                    if time.monotonic() >= drain_deadline:
                        return self.pending() == 0
                pause = backoff_s if failed else SHIP_IDLE_POLL_S
                if failed:
                    backoff_s = min(SHIP_BACKOFF_MAX_S, backoff_s * 2)
                if drain_deadline is not None:
                    pause = min(pause, max(0.0, drain_deadline - time.monotonic()))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        if failed or stop.is_set():
                            await asyncio.sleep(pause)
                        else:
                            await _first(self._wake.wait(), stop.wait())
        finally:
            await self._discard_producer()


def _log_append_ms(ack: Any) -> int | None:
    """The broker's append time from a produce acknowledgement, if the topic stamps one."""
    if getattr(ack, "timestamp_type", None) == LOG_APPEND_TIME:
        stamp = getattr(ack, "timestamp", None)
        if isinstance(stamp, int) and stamp >= 0:
            return stamp
    return None


async def _first(*waits: Any) -> None:
    """Wait until the first of the awaitables completes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
