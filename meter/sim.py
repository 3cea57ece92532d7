"""A deterministic GPU simulator with injectable faults, described by a spec string.

The same seed gives the same readings, byte for byte: a reading is a pure function of
(seed, GPU uuid, interval), drawn from its own ``random.Random`` — never the global one —
so it does not depend on how often or in which order the agent asks.

Spec grammar (``gridledger meter run --simulate SPEC``)::

    SPEC  := ITEM ("," ITEM)*
    ITEM  := "seed=" INT                       random seed (default 0)
           | "gpus=" INT                       devices on the node (default: the terms' GPUs
                                               of this node; more adds GPUs no placement has)
           | "unhealthy=" UUID "@" MS "-" MS   the GPU reports XID errors in [MS, MS)
           | "vanish=" UUID "@" MS ["-" MS]    the GPU is gone from MS (until MS, if given)
           | "xid=" CODE "/" UUID "@" MS "-" MS  the GPU reports XID CODE in [MS, MS)
           | "ecc=" UUID "@" MS "-" MS         uncorrectable ECC errors in [MS, MS)
           | "retire=" UUID "@" MS             one more page retired at MS (cumulative)
           | "nopower=" UUID "@" MS "-" MS     the power reading is 0 W in [MS, MS)
           | "throttle=" UUID "@" MS "-" MS    hardware thermal slowdown (clock event
                                               0x40, SPEC §7.1.2) in [MS, MS)
           | "claim_healthy=" ("0" | "1")      1: every reading is flagged healthy whatever
                                               the evidence (a lying or broken agent, for
                                               tests of SPEC §7.1.1)
           | "skew_ms=" ["-"] INT              the agent's clock is off by this much (wall-
                                               clock runs; --until-ms drives its own clock)
           | "crash_after=" INT                the agent kills itself (SIGKILL) after it has
                                               spooled this many events (crash tests)
           | "pace_ms=" INT                    with --until-ms: wall-clock pause per step

``unhealthy``, ``vanish``, ``xid``, ``ecc``, ``retire``, ``nopower`` and ``throttle`` may
repeat. Each evidence fault (``xid`` of a code the latest XID table marks unhealthy,
``ecc``, ``retire``, ``nopower``) also clears the reading's ``healthy`` flag, unless
``claim_healthy=1``; an application's XID (13, 31, ...) and a throttle do not.

MIG (SPEC §7.1.2): a device whose model names a MIG profile (``… MIG 3g.20gb``) is a MIG
instance and reads as NVML reads one: no utilisation or energy of its own (0), its own
memory, its parent's power. MS values are milliseconds after the
simulation's epoch: the earliest ``window_start_ms`` of the agent's terms. Example::

    seed=7,gpus=4,unhealthy=GPU-x@600000-900000,vanish=GPU-y@1200000,skew_ms=250
"""

from __future__ import annotations

import _random
import random
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha512 as _sha512
from typing import Final

from meter.mig import profile_of
from meter.sources import UNHEALTHY_XIDS, GpuReading

__all__ = ["SimDevice", "SimSpec", "SimSpecError", "Simulator", "parse_sim_spec"]

_UUID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
_INT_RE: Final = re.compile(r"^-?[0-9]{1,16}$")
MAX_SIM_GPUS: Final = 256
IDLE_POWER_MW: Final = 60_000
POWER_PER_PCT_MW: Final = 3_000


# ``random.Random.seed`` below its Python layer: the C generator's own seeding.
_SEED: Final = _random.Random.seed


def _below(getrandbits: Callable[[int], int], n: int, k: int) -> int:
    """``random.Random._randbelow(n)`` (with getrandbits) for ``k == n.bit_length()``."""
    r = getrandbits(k)
    while r >= n:
        r = getrandbits(k)
    return r


class SimSpecError(ValueError):
    """A simulation spec that does not follow the grammar of this module."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A GPU fault over [start_ms, end_ms) after the epoch (end None: forever)."""

    uuid: str
    start_ms: int
    end_ms: int | None

    def overlaps(self, start_ms: int, end_ms: int) -> bool:
        """Whether the fault touches [start_ms, end_ms) (both relative to the epoch)."""
        fault_end_ms = end_ms if self.end_ms is None else self.end_ms
        return self.start_ms < end_ms and start_ms < fault_end_ms


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What the evidence faults make one GPU report over one interval (SPEC §7.1.1)."""

    xids: tuple[int, ...]
    ecc_uncorrectable: int
    retired_pages: int  # cumulative: every retire fault at or before the interval
    retired_now: bool  # a page was retired during the interval
    no_power: bool
    clock_events: int = 0


_NO_EVIDENCE: Final = _Evidence((), 0, 0, False, False)
THROTTLE_CLOCK_EVENTS: Final = 0x40  # NVML's hardware thermal slowdown


@dataclass(frozen=True, slots=True)
class SimSpec:
    """A parsed simulation spec."""

    seed: int = 0
    gpus: int | None = None
    unhealthy: tuple[Fault, ...] = ()
    vanish: tuple[Fault, ...] = ()
    skew_ms: int = 0
    crash_after: int | None = None
    pace_ms: int = 0
    xid: tuple[tuple[int, Fault], ...] = ()
    ecc: tuple[Fault, ...] = ()
    retire: tuple[Fault, ...] = ()
    nopower: tuple[Fault, ...] = ()
    throttle: tuple[Fault, ...] = ()
    claim_healthy: bool = False
    text: str = field(default="", compare=False)


def _int(key: str, value: str, *, minimum: int | None = 0) -> int:
    if not _INT_RE.match(value):
        raise SimSpecError(f"{key}={value!r}: not an integer")
    number = int(value)
    if minimum is not None and number < minimum:
        raise SimSpecError(f"{key}={value}: below {minimum}")
    return number


def _fault(key: str, value: str, *, need_end: bool) -> Fault:
    uuid, at, times = value.rpartition("@")
    if not at or not _UUID_RE.match(uuid):
        raise SimSpecError(f"{key}={value!r}: want UUID@START_MS{'-END_MS' if need_end else ''}")
    start_text, dash, end_text = times.partition("-")
    start = _int(key, start_text)
    if not dash:
        if need_end:
            raise SimSpecError(f"{key}={value!r}: want UUID@START_MS-END_MS")
        return Fault(uuid, start, None)
    end = _int(key, end_text)
    if end <= start:
        raise SimSpecError(f"{key}={value!r}: end {end} is not after start {start}")
    return Fault(uuid, start, end)


def parse_sim_spec(text: str) -> SimSpec:
    """Parse a spec string (grammar in the module docstring); SimSpecError names the item."""
    values: dict[str, int | None] = {}
    unhealthy: list[Fault] = []
    vanish: list[Fault] = []
    xid: list[tuple[int, Fault]] = []
    evidence: dict[str, list[Fault]] = {"ecc": [], "retire": [], "nopower": [], "throttle": []}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq:
            raise SimSpecError(f"{item!r}: want KEY=VALUE")
        if key == "unhealthy":
            unhealthy.append(_fault(key, value, need_end=True))
        elif key == "vanish":
            vanish.append(_fault(key, value, need_end=False))
        elif key == "xid":
            code, slash, fault = value.partition("/")
            if not slash:
                raise SimSpecError(f"xid={value!r}: want CODE/UUID@START_MS-END_MS")
            xid.append((_int(key, code), _fault(key, fault, need_end=True)))
        elif key in ("ecc", "nopower", "throttle"):
            evidence[key].append(_fault(key, value, need_end=True))
        elif key == "retire":
            retired = _fault(key, value, need_end=False)
            if retired.end_ms is not None:
                raise SimSpecError(f"retire={value!r}: want UUID@MS")
            evidence[key].append(retired)
        elif key in ("seed", "gpus", "skew_ms", "crash_after", "pace_ms", "claim_healthy"):
            if key in values:
                raise SimSpecError(f"{key} is given twice")
            minimum = {"skew_ms": None, "crash_after": 1, "gpus": 1}.get(key, 0)
            values[key] = _int(key, value, minimum=minimum)
            if key == "claim_healthy" and values[key] not in (0, 1):
                raise SimSpecError(f"claim_healthy={value}: want 0 or 1")
        else:
            raise SimSpecError(f"unknown key {key!r}")
    gpus = values.get("gpus")
    if gpus is not None and gpus > MAX_SIM_GPUS:
        raise SimSpecError(f"gpus={gpus}: at most {MAX_SIM_GPUS}")
    return SimSpec(
        seed=values.get("seed") or 0,
        gpus=gpus,
        unhealthy=tuple(unhealthy),
        vanish=tuple(vanish),
        skew_ms=values.get("skew_ms") or 0,
        crash_after=values.get("crash_after"),
        pace_ms=values.get("pace_ms") or 0,
        xid=tuple(xid),
        ecc=tuple(evidence["ecc"]),
        retire=tuple(evidence["retire"]),
        nopower=tuple(evidence["nopower"]),
        throttle=tuple(evidence["throttle"]),
        claim_healthy=values.get("claim_healthy") == 1,
        text=text,
    )


@dataclass(frozen=True, slots=True)
class SimDevice:
    """A simulated device: the identity it reports."""

    uuid: str
    model: str
    memory_total_mib: int


class Simulator:
    """A GpuSource of simulated devices (see the module docstring)."""

    def __init__(
        self, spec: SimSpec, devices: Sequence[SimDevice], epoch_ms: int, *, node_id: str = "sim"
    ) -> None:
        listed = list(devices)
        uuids = [d.uuid for d in listed]
        if len(set(uuids)) != len(uuids):
            raise SimSpecError("a simulated device uuid is listed twice")
        extra = 0
        while spec.gpus is not None and len(listed) < spec.gpus:
            listed.append(SimDevice(f"GPU-sim-{node_id}-{extra}", "SIM-GPU", 81920))
            extra += 1
        self._devices = tuple(listed)
        known = {d.uuid for d in listed}
        named = [
            (kind, fault.uuid)
            for kind, faults in (
                ("unhealthy", spec.unhealthy),
                ("vanish", spec.vanish),
                ("xid", tuple(f for _, f in spec.xid)),
                ("ecc", spec.ecc),
                ("retire", spec.retire),
                ("nopower", spec.nopower),
                ("throttle", spec.throttle),
            )
            for fault in faults
        ]
        for kind, uuid in named:
            if uuid not in known:
                raise SimSpecError(
                    f"{kind}={uuid}: no such GPU on node {node_id} (its GPUs in the terms: "
                    f"{', '.join(sorted(known)) or 'none'})"
                )
        self._spec = spec
        self._epoch_ms = epoch_ms
        # Without any fault every device is present and healthy and its evidence empty:
        # the hot path of long simulations (the trace replay) skips the fault scans.
        self._faulty = bool(
            spec.unhealthy
            or spec.vanish
            or spec.xid
            or spec.ecc
            or spec.retire
            or spec.nopower
            or spec.throttle
        )
        # MIG instances (a profile in the model): read as NVML reads them.
        self._mig = frozenset(d.uuid for d in listed if profile_of(d.model))
        # A device's typical load: fixed per (seed, device), drawn once.
        self._base: dict[str, int] = {}
        # Re-seeded for every reading (``_reading``): a generator of its own per interval.
        self._rng = random.Random()

    @property
    def devices(self) -> tuple[SimDevice, ...]:
        """Every device of the simulated node."""
        return self._devices

    def read(self, start_ms: int, end_ms: int) -> Mapping[str, GpuReading]:
        """Readings over [start_ms, end_ms): a pure function of seed, device and interval."""
        return self.read_only(start_ms, end_ms, None)

    def read_only(
        self, start_ms: int, end_ms: int, uuids: Collection[str] | None
    ) -> Mapping[str, GpuReading]:
        """``read`` for the devices in ``uuids`` only (None: every device). Each reading is
        a pure function of (seed, device, interval), so a device's reading is the same
        whether or not the others are read with it."""
        rel_start, rel_end = start_ms - self._epoch_ms, end_ms - self._epoch_ms
        readings: dict[str, GpuReading] = {}
        spec = self._spec
        for device in self._devices:
            if uuids is not None and device.uuid not in uuids:
                continue
            if not self._faulty:
                readings[device.uuid] = self._reading(device, start_ms, end_ms, sick=False)
                continue
            if any(f.uuid == device.uuid and f.overlaps(rel_start, rel_end) for f in spec.vanish):
                continue
            sick = any(
                f.uuid == device.uuid and f.overlaps(rel_start, rel_end) for f in spec.unhealthy
            )
            readings[device.uuid] = self._reading(device, start_ms, end_ms, sick=sick)
        return readings

    def _evidence(self, uuid: str, rel_start: int, rel_end: int) -> _Evidence:
        """The evidence faults of one GPU over [rel_start, rel_end) after the epoch."""
        spec = self._spec

        def hits(faults: tuple[Fault, ...]) -> list[Fault]:
            return [f for f in faults if f.uuid == uuid and f.overlaps(rel_start, rel_end)]

        retired = [f for f in spec.retire if f.uuid == uuid and f.start_ms < rel_end]
        return _Evidence(
            xids=tuple(
                sorted(
                    {c for c, f in spec.xid if f.uuid == uuid and f.overlaps(rel_start, rel_end)}
                )
            ),
            ecc_uncorrectable=2 * len(hits(spec.ecc)),
            retired_pages=len(retired),
            retired_now=any(rel_start <= f.start_ms for f in retired),
            no_power=bool(hits(spec.nopower)),
            clock_events=THROTTLE_CLOCK_EVENTS if hits(spec.throttle) else 0,
        )

    def _reading(self, device: SimDevice, start_ms: int, end_ms: int, *, sick: bool) -> GpuReading:
        # The device's character (its typical load) is fixed per seed; each interval draws
        # its own variation from a generator of its own.
        base = self._base.get(device.uuid)
        if base is None:
            base = random.Random(f"{self._spec.seed}/{device.uuid}").randint(35, 95)
            self._base[device.uuid] = base
        # ``random.Random(text)`` and its ``randint`` draws, without their Python layers
        # (~4 of the ~10 us of a reading, bench/meter_cpu.py): the same seed integer (version 2 of a
        # str: its UTF-8 bytes and their SHA-512), the C seeding, and ``randint(a, b)`` as
        # ``a + _randbelow(b - a + 1)`` from ``getrandbits`` (``_below``); tests/
        # test_meter_agent.py checks the draws against ``random.Random`` itself.
        text = f"{self._spec.seed}/{device.uuid}/{start_ms}/{end_ms}".encode()
        rng = self._rng
        _SEED(rng, int.from_bytes(text + _sha512(text).digest(), "big"))
        bits = rng.getrandbits
        utilisation = min(100, max(0, base - 10 + _below(bits, 21, 5)))
        evidence = (
            self._evidence(device.uuid, start_ms - self._epoch_ms, end_ms - self._epoch_ms)
            if self._faulty
            else _NO_EVIDENCE
        )
        if sick or evidence.no_power:
            utilisation = 0
        power_mw = IDLE_POWER_MW + POWER_PER_PCT_MW * utilisation + _below(bits, 5_001, 13)
        used = device.memory_total_mib * min(95, utilisation + _below(bits, 6, 3)) // 100
        if evidence.no_power:
            power_mw = 0
        faulty = (
            sick
            or not UNHEALTHY_XIDS.isdisjoint(evidence.xids)
            or evidence.ecc_uncorrectable > 0
            or evidence.retired_now
            or evidence.no_power
        )
        mig = device.uuid in self._mig
        return GpuReading(
            uuid=device.uuid,
            model=device.model,
            healthy=self._spec.claim_healthy or not faulty,
            utilisation_pct=0 if mig else utilisation,
            memory_used_mib=used,
            memory_total_mib=device.memory_total_mib,
            power_mw=power_mw,
            # mW x ms = uJ; / 1000 = mJ. A MIG instance has no energy counter of its own.
            energy_mj=0 if mig else power_mw * max(0, end_ms - start_ms) // 1000,
            xid_errors=(1 + _below(bits, 3, 2) if sick else 0) + len(evidence.xids),
            ecc_errors=evidence.ecc_uncorrectable,
            xids=evidence.xids,
            ecc_uncorrectable=evidence.ecc_uncorrectable,
            retired_pages=evidence.retired_pages,
            clock_events=evidence.clock_events,
        )

    def close(self) -> None:
        """Nothing to release."""
