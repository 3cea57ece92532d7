"""One (node, placement) usage stream, as pure functions: intervals, samples, events.

A stream's durable state is its head: the next ``seq``, the record hash of the last event
(``prev`` of the next one) and where the last interval ended. Everything here is a pure
function of its arguments; the agent (``meter.agent``) does the I/O.

Interval rules (SPEC.md 6.3 "usage"): intervals are [start, end), at most one agent
interval long, inside the placement window (the last one clipped at ``window_end_ms``),
and never overlap. While the agent runs they are contiguous. When it (re)starts, the
next interval starts where the last one ended if that is within one interval of now
(or in the future: never overlap), else at now; SPEC allows the gap, never an overlap.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from meter.sources import GpuReading, bounded_xids
from proto import limits as proto_limits
from proto.canonical import signed_bytes
from proto.envelope import Envelope, Signature, encode_envelope, sha256_hex, sign_payload
from proto.keys import SigningKey
from proto.records import ZERO_HASH, Allocation, GpuSample, GpuSpec, PlacementTerms, UsageEvent

__all__ = [
    "HandOff",
    "SealedEvent",
    "StreamHead",
    "StreamKey",
    "build_event",
    "due_intervals",
    "node_gpus",
    "resume_start_ms",
    "samples_for",
    "seal_event",
]


@dataclass(frozen=True, order=True, slots=True)
class StreamKey:
    """A usage stream: one node's events for one placement."""

    placement_id: str
    node_id: str


@dataclass(frozen=True, slots=True)
class StreamHead:
    """Where a stream stands: next seq, hash of the last event, end of its interval."""

    next_seq: int = 0
    prev: str = ZERO_HASH
    last_end_ms: int | None = None

    def after(self, event: UsageEvent, record_hash: str) -> StreamHead:
        """The head once ``event`` (with record hash ``record_hash``) is durable."""
        return StreamHead(event.seq + 1, record_hash, event.end_ms)


@dataclass(frozen=True, slots=True)
class SealedEvent:
    """A signed event: the envelope bytes and the record hash its successor links to."""

    event: UsageEvent
    envelope: bytes
    record_hash: str


def node_gpus(terms: PlacementTerms, node_id: str) -> list[GpuSpec]:
    """The GPUs the terms place on ``node_id``, sorted by uuid."""
    return sorted((g for g in terms.gpus if g.node_id == node_id), key=lambda g: g.uuid)


def resume_start_ms(head: StreamHead, now_ms: int, interval_ms: int, window_start_ms: int) -> int:
    """Where a stream's next interval starts when the agent (re)starts at ``now_ms``."""
    anchor = head.last_end_ms if head.last_end_ms is not None else window_start_ms
    if now_ms - anchor <= interval_ms:
        return max(anchor, window_start_ms)  # contiguous (or the clock is behind: wait)
    return max(now_ms, window_start_ms)


def due_intervals(
    next_start_ms: int, now_ms: int, interval_ms: int, window_end_ms: int, limit: int
) -> list[tuple[int, int]]:
    """The contiguous intervals from ``next_start_ms`` that have ended by ``now_ms``."""
    out: list[tuple[int, int]] = []
    start = next_start_ms
    while len(out) < limit and start < window_end_ms:
        end = min(start + interval_ms, window_end_ms)
        if end > now_ms:
            break
        out.append((start, end))
        start = end
    return out


def _bounded(value: int, high: int = proto_limits.MAX_SAFE_INTEGER) -> int:
    return min(high, max(0, int(value)))


def _usable_model(model: str) -> bool:
    return 1 <= len(model) <= proto_limits.MAX_ID_CHARS


_MAX: Final = proto_limits.MAX_SAFE_INTEGER


def samples_for(
    gpus: Sequence[GpuSpec],
    readings: Mapping[str, GpuReading],
    allocations: Mapping[str, Allocation] | None = None,
    idle_billed: bool = True,
) -> list[GpuSample]:
    """One sample per GPU of the terms on this node.

    A GPU the source does not see is reported unhealthy with zero readings: it delivered
    nothing. Readings are clamped into the record's ranges (a device is input too).
    ``allocations``: each GPU's SPEC §7.1.2 ``allocation`` (``meter.allocation``; absent:
    ``unknown``); ``allocated`` is false where the sample is not held for the buyer
    (another workload's GPU, or, with ``idle_billed`` false, any GPU not the buyer's).
    """
    samples = []
    for spec in gpus:
        reading = readings.get(spec.uuid)
        allocation: Allocation = "unknown"
        if allocations is not None:
            allocation = allocations.get(spec.uuid, "unknown")
        allocated = allocation != "other" and (idle_billed or allocation == "buyer")
        if reading is None or not _usable_model(reading.model):
            samples.append(
                GpuSample(
                    uuid=spec.uuid,
                    model=spec.model,
                    allocated=allocated,
                    healthy=False,
                    utilisation_pct=0,
                    memory_used_mib=0,
                    memory_total_mib=0,
                    power_mw=0,
                    energy_mj=0,
                    xid_errors=_bounded(reading.xid_errors) if reading is not None else 0,
                    ecc_errors=_bounded(reading.ecc_errors) if reading is not None else 0,
                    present=reading is not None,
                    allocation=allocation,
                )
            )
            continue
        # ``_bounded`` of each field, without the call for a plain int already in range
        # (every reading of the simulator, most of NVML's): the same value.
        u = reading.utilisation_pct
        mu = reading.memory_used_mib
        mt = reading.memory_total_mib
        pw = reading.power_mw
        en = reading.energy_mj
        xe = reading.xid_errors
        ee = reading.ecc_errors
        eu = reading.ecc_uncorrectable
        rp = reading.retired_pages
        ce = reading.clock_events
        rc = reading.remapped_correctable
        samples.append(
            GpuSample(
                spec.uuid,
                reading.model,
                allocated,
                bool(reading.healthy),
                u if u.__class__ is int and 0 <= u <= 100 else _bounded(u, 100),
                mu if mu.__class__ is int and 0 <= mu <= _MAX else _bounded(mu),
                mt if mt.__class__ is int and 0 <= mt <= _MAX else _bounded(mt),
                pw if pw.__class__ is int and 0 <= pw <= _MAX else _bounded(pw),
                en if en.__class__ is int and 0 <= en <= _MAX else _bounded(en),
                xe if xe.__class__ is int and 0 <= xe <= _MAX else _bounded(xe),
                ee if ee.__class__ is int and 0 <= ee <= _MAX else _bounded(ee),
                list(bounded_xids(_bounded(x) for x in reading.xids)) if reading.xids else [],
                eu if eu.__class__ is int and 0 <= eu <= _MAX else _bounded(eu),
                rp if rp.__class__ is int and 0 <= rp <= _MAX else _bounded(rp),
                True,
                allocation,
                ce if ce.__class__ is int and 0 <= ce <= _MAX else _bounded(ce),
                rc if rc.__class__ is int and 0 <= rc <= _MAX else _bounded(rc),
            )
        )
    return samples


def build_event(
    key: StreamKey, head: StreamHead, start_ms: int, end_ms: int, samples: list[GpuSample]
) -> UsageEvent:
    """The stream's next event over [start_ms, end_ms)."""
    if not 0 <= start_ms < end_ms or end_ms - start_ms > proto_limits.MAX_INTERVAL_MS:
        raise ValueError(f"interval [{start_ms}, {end_ms}) is empty, reversed or too long")
    if head.last_end_ms is not None and start_ms < head.last_end_ms:
        raise ValueError(f"interval starts at {start_ms}, before the last end {head.last_end_ms}")
    return UsageEvent(
        placement_id=key.placement_id,
        node_id=key.node_id,
        seq=head.next_seq,
        prev=head.prev,
        start_ms=start_ms,
        end_ms=end_ms,
        samples=samples,
    )


def seal_event(
    event: UsageEvent,
    key: SigningKey,
    key_id: str | None = None,
    sign: Callable[[bytes], bytes] | None = None,
) -> SealedEvent:
    """Sign the event with the node key: envelope bytes and record hash.

    ``key_id``: the key's id (``key.key_id``) when the caller knows it: the agent signs
    every event with the same key, and deriving the id takes a public key and a hash.
    ``sign``: ``key.sign`` itself or its equal (``proto.keys.signer``), with ``key_id``.
    The envelope is ``sign_payload(payload, [key])``'s: one signature, by that key.
    """
    payload = signed_bytes(event)
    if key_id is None:
        envelope = encode_envelope(sign_payload(payload, [key]))
    else:
        signature = Signature(keyid=key_id, sig=(key.sign if sign is None else sign)(payload))
        envelope = encode_envelope(Envelope(payload=payload, signatures=[signature]))
    return SealedEvent(event, envelope, sha256_hex(payload))


class HandOff:
    """Usage events an agent has spooled, by input hash (SHA-256 of the envelope bytes),
    for the shipper of the same spool in the same process (``Agent.hand_off``): what the
    shipper would otherwise open each envelope again for (its key, stated time and
    delivery line), ~6 us per event (bench/meter_cpu.py).

    Exact: an envelope the agent sealed opens (``proto.envelope.open_envelope``) to the
    very event it was built from (canonical bytes of a record valid by construction: ids
    from decoded terms, readings clamped into their ranges; tests/test_meter_agent.py
    checks it event by event), and a hash names those bytes. A record the shipper does not
    find here (an earlier run's, one dropped at the bound, one already taken) it opens
    itself, as before. At most ``limit`` events are kept; beyond, the oldest are dropped.
    """

    __slots__ = ("_events", "_limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a hand-off keeps at least one event, not {limit}")
        self._events: dict[str, UsageEvent] = {}
        self._limit = limit

    def __len__(self) -> int:
        return len(self._events)

    def add(self, sealed: Sequence[SealedEvent]) -> None:
        """Keep the events of ``sealed`` (spooled, durable) until the shipper takes them."""
        events = self._events
        sha256 = hashlib.sha256
        for item in sealed:
            events[sha256(item.envelope).hexdigest()] = item.event
        excess = len(events) - self._limit
        if excess > 0:
            for old in list(itertools.islice(events, excess)):
                del events[old]

    def take(self, input_hash: str) -> UsageEvent | None:
        """The event of the envelope whose SHA-256 is ``input_hash`` (None: not kept)."""
        return self._events.pop(input_hash, None)
