"""The node agent: every interval, one signed UsageEvent per placement, spooled first.

``Agent.tick()`` emits every interval that has ended by the clock's now, for every
(node, placement) stream of the terms it holds, appends all the envelopes to the spool
with one fsync, and only then advances its in-memory heads and returns them: nothing
can be shipped or counted that is not durable. A SpoolFull leaves the heads where they
were, so the same events are built again once there is room (never a gap).

State comes from durable data only: on start the agent reads the stream heads back from
the spool (newest segment first, stopping once every stream is found) and from the
``HEADS`` file that is written before acknowledged segments are garbage-collected
(acknowledged by Kafka; on the embedded transport, with ``collect_read``, read into the
ledger's intake log). A restarted agent continues each stream with the next seq and prev.

Library use (demo, replay, tests; many agents in one process, no Kafka)::

    agent = Agent(config, Simulator(...), SimClock(t0))
    clock.advance(3_600_000)
    envelopes = agent.tick()      # an hour of events, spooled, in stream order
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
import structlog

from meter.allocation import AllocationSource, allocations_for
from meter.clock import Clock
from meter.durable import read_small_file, write_atomic
from meter.limits import (
    DEFAULT_INTERVAL_MS,
    MAX_EVENTS_PER_TICK,
    MAX_HANDED_OFF,
    MAX_INTERVAL_MS,
    MAX_STREAMS,
    MIN_INTERVAL_MS,
    SPOOL_SEAL_ACKED_BYTES,
)
from meter.metrics import MeterMetrics
from meter.sources import GpuReading, GpuSource, PureGpuSource
from meter.stream import (
    HandOff,
    SealedEvent,
    StreamHead,
    StreamKey,
    build_event,
    due_intervals,
    node_gpus,
    resume_start_ms,
    samples_for,
    seal_event,
)
from proto.delivery import DELIVERY_LOG_FILE, append_delivered, delivered_usage
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.invariant import present
from proto.keys import SigningKey, key_id, signer
from proto.records import GpuSpec, PlacementTerms, StreamResume, UsageEvent
from transport.intake import ReadByLedgers
from transport.limits import DEFAULT_SEGMENT_MAX_BYTES, DEFAULT_SPOOL_MAX_BYTES
from transport.positions import SpoolPosition
from transport.spool import SpoolWriter, list_segments, read_spool

__all__ = ["HEADS_FILE", "Agent", "AgentConfig", "AgentConfigError", "recover_heads"]

HEADS_FILE: Final = "HEADS"
_log = structlog.get_logger("meter.agent")


class AgentConfigError(ValueError):
    """A configuration the agent cannot run with."""


@dataclass(frozen=True)
class AgentConfig:
    """What one agent meters and where it keeps its spool."""

    node_id: str
    signing_key: SigningKey
    terms: tuple[PlacementTerms, ...]
    spool_dir: Path
    interval_ms: int = DEFAULT_INTERVAL_MS
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    # On the embedded transport the spool is the delivery: log each event as delivered
    # once it is in the spool (with Kafka the shipper logs it when acknowledged).
    delivered_on_spool: bool = False
    # The node signs with a key the terms do not list, bound by a NodeKeyBinding
    # (``gridledger bind-key``). Without it a key that differs from the terms' stops the
    # agent: every event it signed would be rejected NODE_KEY_UNKNOWN.
    key_rebound: bool = False
    # SPEC §6.3 resume: signed resumes of this node's streams, each with its record hash.
    # A stream with no event in the spool (a spool lost mid-window) goes on from one:
    # its next event carries from_seq and, as prev, the resume's record hash.
    resumes: tuple[tuple[StreamResume, str], ...] = ()
    # Kafka mode: an acknowledged segment being written is sealed (and collected) once it
    # holds this many bytes (``Agent.collect_garbage``).
    seal_acked_bytes: int = SPOOL_SEAL_ACKED_BYTES
    # The embedded transport (the spool is the transport, its directory one of the
    # ledger's ``local_dir``): what every ledger reading that directory has read into its
    # intake log counts as acknowledged, and is collected like a shipper's acknowledged
    # records (``Agent.tick``; ``transport.intake.ReadByLedgers``).
    collect_read: bool = False

    def __post_init__(self) -> None:
        if not MIN_INTERVAL_MS <= self.interval_ms <= MAX_INTERVAL_MS:
            raise AgentConfigError(
                f"interval of {self.interval_ms} ms is outside {MIN_INTERVAL_MS}.."
                f"{MAX_INTERVAL_MS} ms"
            )
        ids = [t.placement_id for t in self.terms]
        if len(set(ids)) != len(ids):
            raise AgentConfigError("two terms files are for the same placement")
        if len(ids) > MAX_STREAMS:
            raise AgentConfigError(f"{len(ids)} placements; at most {MAX_STREAMS}")
        if self.seal_acked_bytes < 1:
            raise AgentConfigError(f"seal_acked_bytes {self.seal_acked_bytes} is below 1")


@dataclass
class _Stream:
    key: StreamKey
    terms: PlacementTerms
    gpus: list[GpuSpec]
    head: StreamHead
    uuids: frozenset[str] = frozenset()  # of ``gpus``
    next_start_ms: int | None = None  # decided when the agent (re)starts
    done: bool = False


class _HeadsFile(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    envelopes: list[str] = msgspec.field(default_factory=list)  # base64, last event of each


_HEADS_FORMAT: Final = "gridledger-meter-heads/v1"


def _event_of(data: bytes) -> tuple[UsageEvent, str] | None:
    try:
        opened = open_envelope(data)
    except ProtoError:
        return None
    if not isinstance(opened.record, UsageEvent):
        return None
    return opened.record, opened.record_hash


def recover_heads(
    spool_dir: Path, streams: Sequence[StreamKey], metrics: MeterMetrics | None = None
) -> dict[StreamKey, tuple[StreamHead, bytes]]:
    """The last durable event of each stream (head and envelope), from HEADS and the spool.

    Segments are scanned newest first; the scan stops once every stream has been found.
    """
    wanted = set(streams)
    found: dict[StreamKey, tuple[StreamHead, bytes]] = {}

    def consider(data: bytes) -> StreamKey | None:
        parsed = _event_of(data)
        if parsed is None:
            if metrics is not None:
                metrics.records_skipped.labels(reason="undecodable").inc()
            _log.error("spool_record_undecodable", bytes=len(data))
            return None
        event, record_hash = parsed
        key = StreamKey(event.placement_id, event.node_id)
        if key not in wanted:
            return None
        current = found.get(key)
        if current is None or current[0].next_seq <= event.seq:
            found[key] = (StreamHead(event.seq + 1, record_hash, event.end_ms), data)
        return key

    raw = read_small_file(spool_dir / HEADS_FILE)
    if raw is not None:
        heads = msgspec.json.decode(raw, type=_HeadsFile)
        if heads.format != _HEADS_FORMAT:
            raise AgentConfigError(f"{spool_dir / HEADS_FILE}: unknown format {heads.format!r}")
        for text in heads.envelopes:
            consider(base64.b64decode(text))
    # Events of a stream are appended in seq order, so the newest segment holding one of
    # its events holds its last: stop once every stream was seen in the spool.
    seen_in_spool: set[StreamKey] = set()
    for segment in reversed(list_segments(spool_dir)):
        if wanted <= seen_in_spool:
            break
        for entry in read_spool(spool_dir, SpoolPosition(segment, 0)):
            if entry.position.segment != segment:
                break
            key = consider(entry.data)
            if key is not None:
                seen_in_spool.add(key)
    return found


class Agent:
    """One node's agent: streams, source, clock, spool (see the module docstring)."""

    def __init__(
        self,
        config: AgentConfig,
        source: GpuSource,
        clock: Clock,
        *,
        metrics: MeterMetrics | None = None,
        allocation: AllocationSource | None = None,
    ) -> None:
        self.config = config
        self._source, self._allocation = source, allocation  # allocation: SPEC §7.1.2
        # A pure source is asked only for the GPUs of the streams due in an interval; the
        # others are read whole, once per interval (NVML: counters since the last read).
        self._pure_source = source if isinstance(source, PureGpuSource) else None
        self._key_id = config.signing_key.key_id
        self._sign = signer(config.signing_key)
        self._clock = clock
        self.metrics = metrics if metrics is not None else MeterMetrics()
        self._streams: list[_Stream] = []
        for terms in sorted(config.terms, key=lambda t: t.placement_id):
            if config.node_id not in {n.node_id for n in terms.nodes}:
                _log.warning(
                    "terms_without_this_node", placement=terms.placement_id, node=config.node_id
                )
                continue
            node_key = next(n.key for n in terms.nodes if n.node_id == config.node_id)
            if node_key != config.signing_key.public_key and not config.key_rebound:
                raise AgentConfigError(
                    f"node {config.node_id} signs with key {config.signing_key.key_id}, the "
                    f"terms of {terms.placement_id} name key {key_id(node_key)}: use the "
                    "node key the terms name, or set key_rebound = true if a key binding "
                    "(gridledger bind-key) bound this one"
                )
            gpus = node_gpus(terms, config.node_id)
            if node_key != config.signing_key.public_key:
                # A key binding rotated the node key (key_rebound); the ledger decides.
                _log.warning(
                    "node_key_differs_from_terms",
                    placement=terms.placement_id,
                    node=config.node_id,
                    key_id=config.signing_key.key_id,
                )
            self._streams.append(
                _Stream(
                    StreamKey(terms.placement_id, config.node_id),
                    terms,
                    gpus,
                    StreamHead(),
                    frozenset(g.uuid for g in gpus),
                )
            )
        self._spool = SpoolWriter(
            config.spool_dir,
            max_bytes=config.spool_max_bytes,
            segment_max_bytes=config.segment_max_bytes,
        )
        try:
            self._last_envelopes: dict[StreamKey, bytes] = {}
            recovered = recover_heads(
                config.spool_dir, [s.key for s in self._streams], self.metrics
            )
            now_ms = clock.now_ms()
            for stream in self._streams:
                stream.head = self._recovered(stream, recovered, now_ms)
                _log.info(
                    "stream_recovered",
                    placement=stream.key.placement_id,
                    node=stream.key.node_id,
                    next_seq=stream.head.next_seq,
                    last_end_ms=stream.head.last_end_ms,
                )
        except BaseException:
            self._spool.close()
            raise
        self._read_by_ledgers = (
            ReadByLedgers(config.spool_dir.parent, config.spool_dir.name)
            if config.collect_read
            else None
        )
        self.metrics.spool_bytes.set(self._spool.bytes_used)
        self._hand_off: HandOff | None = None
        # The agent (re)starts now: that is when each stream decides where it resumes.
        self._decide_starts(clock.now_ms())

    def _recovered(
        self,
        stream: _Stream,
        recovered: Mapping[StreamKey, tuple[StreamHead, bytes]],
        now_ms: int,
    ) -> StreamHead:
        """The head a stream starts from: its last event in the spool, else a resume's."""
        if stream.key not in recovered:
            return self._without_spool(stream, now_ms)
        head, envelope = recovered[stream.key]
        self._last_envelopes[stream.key] = envelope
        return head

    def _without_spool(self, stream: _Stream, now_ms: int) -> StreamHead:
        """The head of a stream the spool has no event of: a resume's (SPEC §6.3 resume),
        else seq 0. Mid-window that seq 0 is the ledger's EQUIVOCATION if the node signed
        before (a lost spool): the log says so and names the one command to run."""
        key = stream.key
        for resume, record_hash in self.config.resumes:
            if (resume.placement_id, resume.node_id) == (key.placement_id, key.node_id):
                _log.info(
                    "stream_resumed",
                    placement=key.placement_id,
                    node=key.node_id,
                    resume_id=resume.resume_id,
                    from_seq=resume.from_seq,
                )
                return StreamHead(resume.from_seq, record_hash, resume.from_ms)
        terms = stream.terms
        if terms.window_start_ms + self.config.interval_ms < now_ms < terms.window_end_ms:
            _log.warning(
                "stream_without_spool",
                placement=key.placement_id,
                node=key.node_id,
                advice=(
                    "the spool has no event of this stream mid-window: if the node signed "
                    "for it before (a lost spool), seq 0 is EQUIVOCATION; stop the agent "
                    "and have operator and buyer sign `gridledger resume --terms TERMS "
                    f"--node {key.node_id} --from-seq SEQ --from TIME` (SEQ past the "
                    "ledger's next seq, TIME not before its last accepted end), then add "
                    "it to resume_files in meter.toml (docs/runbook.md)"
                ),
            )
        return StreamHead()

    # -- introspection --

    def hand_off(self, limit: int = MAX_HANDED_OFF) -> HandOff:
        """From now on, keep every event spooled for the shipper of this spool in this
        process (``meter.stream.HandOff``; ``Shipper(handed_off=...)``); the same one on
        every call."""
        if self._hand_off is None:
            self._hand_off = HandOff(limit)
        return self._hand_off

    @property
    def spool(self) -> SpoolWriter:
        """The agent's spool writer (the shipper garbage-collects through it)."""
        return self._spool

    @property
    def heads(self) -> dict[StreamKey, StreamHead]:
        """The durable head of every stream."""
        return {s.key: s.head for s in self._streams}

    def now_ms(self) -> int:
        """The agent's clock."""
        return self._clock.now_ms()

    def _decide_starts(self, now_ms: int) -> None:
        for stream in self._streams:
            if stream.next_start_ms is None:
                stream.next_start_ms = resume_start_ms(
                    stream.head, now_ms, self.config.interval_ms, stream.terms.window_start_ms
                )

    def next_due_ms(self) -> int | None:
        """When the next interval of any stream ends (None: every window is over)."""
        self._decide_starts(self._clock.now_ms())
        due: list[int] = []
        for stream in self._streams:
            next_start_ms = present(stream.next_start_ms, "start of a decided stream")
            if next_start_ms < stream.terms.window_end_ms:
                due.append(
                    min(
                        next_start_ms + self.config.interval_ms,
                        stream.terms.window_end_ms,
                    )
                )
        return min(due, default=None)

    # -- the work --

    def tick(self) -> list[bytes]:
        """Emit every interval due at the clock's now: sign, spool (one fsync), return them.

        Raises SpoolFull (nothing advanced) when the spool has no room.
        """
        now_ms = self._clock.now_ms()
        self._decide_starts(now_ms)
        budget = MAX_EVENTS_PER_TICK
        jobs: list[tuple[_Stream, int, int]] = []
        for stream in self._streams:
            intervals = due_intervals(
                present(stream.next_start_ms, "start of a decided stream"),
                now_ms,
                self.config.interval_ms,
                stream.terms.window_end_ms,
                budget,
            )
            budget -= len(intervals)
            jobs.extend((stream, start, end) for start, end in intervals)
        if not jobs:
            return []
        readings: dict[tuple[int, int], Mapping[str, GpuReading]] = {}
        wanted: dict[tuple[int, int], set[str]] | None = None
        if self._pure_source is not None:
            wanted = {}
            for stream, start, end in jobs:
                wanted.setdefault((start, end), set()).update(stream.uuids)
        holders = self._holders()
        heads = {s.key: s.head for s in self._streams}
        sealed: list[tuple[_Stream, SealedEvent, StreamHead]] = []
        key, key_id, sign = self.config.signing_key, self._key_id, self._sign
        for stream, start, end in jobs:
            interval = (start, end)
            reading = readings.get(interval)
            if reading is None:
                reading = readings[interval] = self._read_source(
                    start, end, None if wanted is None else wanted[interval]
                )
            head = heads[stream.key]
            # The scheduler says who holds a GPU now: that is evidence for an interval
            # that ends within one interval of now, not for one caught up from the past.
            recent = holders is not None and now_ms - end < self.config.interval_ms
            metering = stream.terms.metering
            samples = samples_for(
                stream.gpus,
                reading,
                allocations_for(stream.terms, stream.gpus, holders) if recent else None,
                metering is None or metering.idle_billed,
            )
            event = build_event(stream.key, head, start, end, samples)
            item = seal_event(event, key, key_id, sign)
            heads[stream.key] = after = head.after(event, item.record_hash)
            sealed.append((stream, item, after))
        envelopes = [item.envelope for _, item, _ in sealed]
        self._collect_read()
        self._spool.append(envelopes)  # durable before anything else may see them
        if self.config.delivered_on_spool:
            append_delivered(
                self.config.spool_dir / DELIVERY_LOG_FILE,
                [delivered_usage(e, now_ms) for e in envelopes],
            )
        if self._hand_off is not None:
            self._hand_off.add([item for _, item, _ in sealed])
        last_envelopes = self._last_envelopes
        for stream, item, after in sealed:  # in stream order: each stream's last wins
            stream.head = after
            stream.next_start_ms = item.event.end_ms
            last_envelopes[stream.key] = item.envelope
        self.metrics.events_emitted.inc(len(envelopes))
        self.metrics.spool_bytes.set(self._spool.bytes_used)
        return envelopes

    def _collect_read(self) -> None:
        """The embedded transport: collect what the ledgers have read (``collect_read``),
        before an append, when the spool holds a sealed segment or ``seal_acked_bytes`` in
        the one being written, and a ledger stated a new read position since the last
        time. A position past the spool's end (a spool replaced under the same name) is
        logged and ignored."""
        if self._read_by_ledgers is None:
            return
        spool = self._spool
        end = spool.end_position()
        if spool.first_segment == end.segment and (
            spool.current_segment_bytes < self.config.seal_acked_bytes
        ):
            return
        read = self._read_by_ledgers.position(only_if_changed=True)
        if read is None:
            return
        if read > end:
            _log.warning(
                "ledger_read_past_spool_end",
                spool=str(self.config.spool_dir),
                read=f"{read.segment}:{read.offset}",
                end=f"{end.segment}:{end.offset}",
            )
            return
        self.collect_garbage(read)

    def _holders(self) -> Mapping[str, str] | None:
        """The allocation source's holders now (None: no source, or it failed)."""
        if self._allocation is None:
            return None
        try:
            return self._allocation.holders()
        except Exception as exc:  # a source's own failure: unknown, never a crash
            self.metrics.source_errors.inc()
            _log.error("allocation_source_failed", error=f"{type(exc).__name__}: {exc}")
            return None

    def _read_source(
        self, start_ms: int, end_ms: int, uuids: set[str] | None = None
    ) -> Mapping[str, GpuReading]:
        """The source's readings (with ``uuids``, from a pure source, of those GPUs only);
        a failing source is counted and every GPU of the interval reported unhealthy (it
        could not be seen), never a crash of the agent."""
        try:
            if uuids is not None and self._pure_source is not None:
                return self._pure_source.read_only(start_ms, end_ms, uuids)
            return self._source.read(start_ms, end_ms)
        except Exception as exc:
            self.metrics.source_errors.inc()
            _log.error("gpu_source_failed", error=f"{type(exc).__name__}: {exc}")
            return {}

    def save_heads(self) -> None:
        """Write the last event of every stream to HEADS (before segments are deleted)."""
        heads = _HeadsFile(
            format=_HEADS_FORMAT,
            envelopes=[
                base64.b64encode(self._last_envelopes[k]).decode()
                for k in sorted(self._last_envelopes)
            ],
        )
        write_atomic(self.config.spool_dir / HEADS_FILE, msgspec.json.encode(heads))

    def collect_garbage(self, acked: SpoolPosition) -> int:
        """Save the heads, then delete segments wholly before ``acked`` (acknowledged by
        Kafka, or read into every ledger's intake log on the embedded transport).

        When ``acked`` is the spool's end (everything spooled is acknowledged) and the
        segment being written holds at least ``seal_acked_bytes``, that segment is sealed
        first (a new empty one started), so it is deleted too: a spool keeps less than
        ``seal_acked_bytes`` of acknowledged records, not up to a whole segment. A
        shipper's recorded position in a deleted segment reads on from the next one.
        """
        spool = self._spool
        if acked == spool.end_position() and (
            spool.current_segment_bytes >= self.config.seal_acked_bytes
        ):
            spool.seal()
            acked = spool.end_position()
        if acked.segment <= min(list_segments(self.config.spool_dir), default=acked.segment):
            return 0
        self.save_heads()
        freed = self._spool.delete_segments_before(acked)
        self.metrics.spool_bytes.set(self._spool.bytes_used)
        return freed

    def close(self) -> None:
        """Release the spool and the source."""
        self._spool.close()
        self._source.close()
