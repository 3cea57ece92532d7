"""Real GPUs through NVML (``pynvml``, package nvidia-ml-py).

Per device and read: uuid, name, memory, utilisation, power, and the deltas since the
previous read of the total-energy counter, the volatile uncorrected ECC counter and the
XID critical-error events (drained from an NVML event set). A field the device does not
support (``NVMLError_NotSupported``) reads as 0 and never makes a GPU unhealthy.

Health evidence (SPEC §7.1.1): the XID codes of the drained events (``eventData``), the
uncorrected ECC delta, and the cumulative count of retired pages
(``nvmlDeviceGetRetiredPages``, both causes) plus remapped rows (``nvmlDeviceGetRemappedRows``,
the Ampere-and-later successor of page retirement). A device without a power reading
reports its average power over the interval from the energy counter, when it has one.

Health: a GPU is unhealthy for an interval when an XID the latest XID table attributes to
the driver or the hardware (``proto/xids.py``; or an XID event without a code) or an
uncorrected ECC error was seen during it, or when pages are pending retirement. An XID of
the application's own (13, 31, 43, ...) is evidence in ``xids``, never a fault of the GPU.
Rows remapped for correctable errors are evidence (``remapped_correctable``), not retired
pages (SPEC §7.1.2).

Throttling (SPEC §7.1.2): the clock-event reasons (``nvmlDeviceGetCurrentClocksEventReasons``,
before driver 535 ``…ThrottleReasons``) read at the end of the interval.

MIG (SPEC §7.1.2 *MIG*): a GPU in MIG mode is read as its instances as well, each under
its own ``MIG-…`` uuid with its own memory, the parent's power, and the parent's health
evidence; ``mig_instances`` lists them (``meter/mig.py``). A device that NVML no longer
enumerates, or that fails with any other NVML error (GPU lost, unknown error), is left
out of the readings: the agent reports a GPU of the terms it cannot see as unhealthy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

import structlog

from meter.mig import MigInstance
from meter.sources import UNHEALTHY_XIDS, GpuReading, bounded_xids
from proto import limits as proto_limits

__all__ = ["MAX_MIG_PER_GPU", "MAX_XID_EVENTS_PER_READ", "NvmlSource"]

MAX_MIG_PER_GPU: Final = 16
"""MIG instances read per parent GPU (NVML allows at most 7 today)."""

MAX_XID_EVENTS_PER_READ: Final = 10_000
"""XID events drained from the event set in one read (an error storm cannot stall us)."""

_MIB: Final = 1024 * 1024
_log = structlog.get_logger("meter.nvml")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """A GpuSource reading the node's NVIDIA GPUs. ``nvml`` is the pynvml module (tests
    pass a fake)."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        nvml.nvmlInit()
        self._event_set: Any = None
        with contextlib.suppress(nvml.NVMLError):
            self._event_set = nvml.nvmlEventSetCreate()
        self._registered: set[str] = set()
        self._energy_mj: dict[str, int] = {}
        self._ecc: dict[str, int] = {}
        self._xid_pending: dict[str, int] = {}
        self._xid_faults: dict[str, int] = {}
        self._xid_codes: dict[str, set[int]] = {}
        # Baselines: the first interval's deltas count from the agent's start.
        self.read(0, 0)
        self._xid_pending.clear()
        self._xid_faults.clear()
        self._xid_codes.clear()

    def _optional(self, fn: Any, *args: Any) -> Any:
        """Call an NVML getter; None when the device does not support it."""
        try:
            return fn(*args)
        except self._nvml.NVMLError_NotSupported:
            return None

    def _evidence(self, fn: Any, *args: Any) -> Any:
        """Like ``_optional``, and None too when the driver predates the call."""
        try:
            return self._optional(fn, *args)
        except self._nvml.NVMLError_FunctionNotFound:
            return None

    def _extra(self, name: str, *args: Any) -> Any:
        """An NVML getter newer than the agent's core readings (clock events, MIG): None
        when the module, the driver or the device lacks it or refuses it; a lost GPU
        still fails the device."""
        nvml = self._nvml
        fn = getattr(nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError:
            return None

    def _clock_events(self, handle: Any) -> int:
        """The clock-event (throttle) reasons now, as NVML's bitmask (0: none or unknown)."""
        reasons = self._extra("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = self._extra("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if not isinstance(reasons, int) or not 0 <= reasons <= proto_limits.MAX_SAFE_INTEGER:
            return 0
        return reasons

    def _mig_handles(self, handle: Any) -> list[Any]:
        """The MIG instances of a GPU in MIG mode (none otherwise)."""
        nvml = self._nvml
        mode = self._extra("nvmlDeviceGetMigMode", handle)
        enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        if mode is None or not mode or mode[0] != enabled:
            return []
        count = self._extra("nvmlDeviceGetMaxMigDeviceCount", handle)
        out = []
        for index in range(min(int(count or 0), MAX_MIG_PER_GPU)):
            mig = self._extra("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
            if mig is not None:  # NVML_ERROR_NOT_FOUND: no instance at this index
                out.append(mig)
        return out

    def uuid_of_index(self, index: int) -> str | None:
        """The uuid of the GPU NVML enumerates at ``index`` (Slurm names GPUs so); None
        when there is none."""
        nvml = self._nvml
        try:
            return _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))
        except nvml.NVMLError:
            return None

    def mig_instances(self) -> list[MigInstance]:
        """Every MIG instance NVML lists now: parent, GPU and compute instance ids,
        slices, memory (SPEC §5.3: the terms name them, ``share_milli`` follows)."""
        nvml = self._nvml
        out: list[MigInstance] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            parent = nvml.nvmlDeviceGetHandleByIndex(index)
            parent_uuid = _text(nvml.nvmlDeviceGetUUID(parent))
            handles = self._mig_handles(parent)
            parent_slices = int(self._extra("nvmlDeviceGetMaxMigDeviceCount", parent) or 0)
            for mig in handles:
                attributes = self._extra("nvmlDeviceGetAttributes", mig)
                memory = self._extra("nvmlDeviceGetMemoryInfo", mig)
                out.append(
                    MigInstance(
                        parent_uuid=parent_uuid,
                        uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                        name=_text(nvml.nvmlDeviceGetName(mig)),
                        gpu_instance_id=int(self._extra("nvmlDeviceGetGpuInstanceId", mig) or 0),
                        compute_instance_id=int(
                            self._extra("nvmlDeviceGetComputeInstanceId", mig) or 0
                        ),
                        slices=int(getattr(attributes, "gpuInstanceSliceCount", 0) or 0),
                        parent_slices=parent_slices,
                        memory_mib=int(memory.total) // _MIB if memory is not None else 0,
                    )
                )
        return out

    def _drain_xid_events(self) -> None:
        if self._event_set is None:
            return
        nvml = self._nvml
        for _ in range(MAX_XID_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as exc:
                _log.warning("nvml_event_wait_failed", error=str(exc))
                return
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                continue  # the device is gone: it will be missing from the readings
            self._xid_pending[uuid] = self._xid_pending.get(uuid, 0) + 1
            code = getattr(data, "eventData", None)
            if isinstance(code, int) and 0 <= code <= proto_limits.MAX_SAFE_INTEGER:
                self._xid_codes.setdefault(uuid, set()).add(code)
            if not isinstance(code, int) or code in UNHEALTHY_XIDS:  # no code: a fault
                self._xid_faults[uuid] = self._xid_faults.get(uuid, 0) + 1
            _log.warning("gpu_xid_error", uuid=uuid, xid=code)

    def _register(self, handle: Any, uuid: str) -> None:
        if self._event_set is None or uuid in self._registered:
            return
        nvml = self._nvml
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlDeviceRegisterEvents(
                handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
            )
        self._registered.add(uuid)

    def read(self, start_ms: int, end_ms: int) -> Mapping[str, GpuReading]:
        """The devices NVML enumerates now; counters are deltas since the previous read."""
        nvml = self._nvml
        self._drain_xid_events()
        readings: dict[str, GpuReading] = {}
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            _log.error("nvml_device_count_failed", error=str(exc))
            return readings
        for index in range(count):
            try:
                reading, instances = self._read_device(index, max(0, end_ms - start_ms))
            except nvml.NVMLError as exc:
                _log.warning("nvml_device_unreadable", index=index, error=str(exc))
                continue
            readings[reading.uuid] = reading
            for instance in instances:
                readings[instance.uuid] = instance
        return readings

    def _instances(self, handle: Any, parent: GpuReading) -> list[GpuReading]:
        """The readings of a parent's MIG instances: each its own uuid, name and memory;
        the parent's power and health evidence; no utilisation or energy of its own."""
        nvml = self._nvml
        out = []
        for mig in self._mig_handles(handle):
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                name = _text(nvml.nvmlDeviceGetName(mig))
            except nvml.NVMLError:
                continue
            memory = self._extra("nvmlDeviceGetMemoryInfo", mig)
            out.append(
                replace(
                    parent,
                    uuid=uuid,
                    model=name,
                    utilisation_pct=0,
                    memory_used_mib=int(memory.used) // _MIB if memory is not None else 0,
                    memory_total_mib=int(memory.total) // _MIB if memory is not None else 0,
                    energy_mj=0,
                )
            )
        return out

    def _retired_pages(self, handle: Any) -> tuple[int, int]:
        """Pages retired (both causes) plus rows remapped for uncorrectable errors, so
        far; and the rows remapped for correctable errors (evidence only, SPEC §7.1.2).
        What the device does not support counts 0."""
        nvml = self._nvml
        total = 0
        for cause in (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = self._evidence(nvml.nvmlDeviceGetRetiredPages, handle, cause)
            total += len(pages) if pages is not None else 0
        remapped = self._evidence(nvml.nvmlDeviceGetRemappedRows, handle)
        correctable = 0
        if remapped is not None:
            correctable = int(remapped[0])
            total += int(remapped[1])
        return total, correctable

    def _read_device(self, index: int, interval_ms: int = 0) -> tuple[GpuReading, list[GpuReading]]:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        model = _text(nvml.nvmlDeviceGetName(handle))
        self._register(handle, uuid)
        memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        energy_total_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        ecc_total = self._optional(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        retire_pending = self._optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        retired_pages, remapped_correctable = self._retired_pages(handle)
        clock_events = self._clock_events(handle)

        energy_mj = 0
        if energy_total_mj is not None:
            previous = self._energy_mj.get(uuid)
            if previous is not None and energy_total_mj >= previous:
                energy_mj = int(energy_total_mj) - previous
            self._energy_mj[uuid] = int(energy_total_mj)
        ecc_errors = 0
        if ecc_total is not None:
            previous = self._ecc.get(uuid)
            if previous is not None and ecc_total > previous:
                ecc_errors = int(ecc_total) - previous
            self._ecc[uuid] = int(ecc_total)
        xid_errors = self._xid_pending.pop(uuid, 0)
        xid_faults = self._xid_faults.pop(uuid, 0)
        xids = bounded_xids(self._xid_codes.pop(uuid, set()))
        if power_mw is None and energy_total_mj is not None and interval_ms > 0:
            # mJ per ms is W; x 1000 is mW: the interval's average power.
            power_mw = energy_mj * 1000 // interval_ms
        pending = bool(retire_pending) and retire_pending == getattr(
            nvml, "NVML_FEATURE_ENABLED", 1
        )
        reading = GpuReading(
            uuid=uuid,
            model=model,
            healthy=xid_faults == 0 and ecc_errors == 0 and not pending,
            utilisation_pct=min(100, max(0, int(rates.gpu))) if rates is not None else 0,
            memory_used_mib=int(memory.used) // _MIB if memory is not None else 0,
            memory_total_mib=int(memory.total) // _MIB if memory is not None else 0,
            power_mw=max(0, int(power_mw)) if power_mw is not None else 0,
            energy_mj=energy_mj,
            xid_errors=xid_errors,
            ecc_errors=ecc_errors,
            xids=xids,
            ecc_uncorrectable=ecc_errors,
            retired_pages=retired_pages,
            clock_events=clock_events,
            remapped_correctable=remapped_correctable,
        )
        return reading, self._instances(handle, reading)

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        nvml = self._nvml
        if self._event_set is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
