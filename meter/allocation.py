"""Who holds each GPU now, from the node's scheduler (SPEC §7.1.2 ``allocation``).

A source answers one question at the end of each interval: which workload holds each
device id. The NVIDIA device plugin names a device by its uuid (``GPU-…``, or ``MIG-…`` for
a MIG instance), and so do the samples; the agent compares the holder with the terms'
``metering.holders`` (SPEC §5.3):

* ``buyer``: a workload of one of the terms' holders holds the GPU;
* ``other``: another workload holds it (not delivered to this buyer);
* ``idle``: nobody holds it;
* ``unknown``: no source, a failed source, or terms that name no holder (nothing to match).

Three sources, each with its transport injected so that tests run them against fakes of
the real shapes: ``KubeletSource`` (the kubelet PodResources API v1 ``List``; ``meter/
podresources.py`` is its gRPC client, an optional extra), ``SlurmSource`` (``scontrol -o
-d show jobs``: each running job's account, partition and GPU indices on this node) and
``SlurmPrologSource`` (what a Slurm prolog wrote of its job's environment, one file per
running job, removed by the epilog: ``deploy/slurm-prolog.sh``).
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from proto.records import Allocation, GpuSpec, PlacementTerms

__all__ = [
    "ALLOCATION_KINDS",
    "GPU_RESOURCES",
    "MAX_SCHEDULER_OUTPUT_BYTES",
    "AllocationSource",
    "KubeletSource",
    "SlurmPrologSource",
    "SlurmSource",
    "allocations_for",
    "build_allocation_source",
    "expand_hostlist",
    "holder_matches",
]

GPU_RESOURCES: Final = frozenset({"nvidia.com/gpu"})
"""Device-plugin resource names whose device ids are GPUs; ``nvidia.com/mig-<profile>``
(the plugin's mixed MIG strategy) is matched by prefix."""

ALLOCATION_KINDS: Final = ("none", "kubelet", "slurm", "slurm-prolog")
"""meter.toml's ``allocation`` values."""
DEFAULT_PROLOG_DIR: Final = "/run/gridledger/slurm-jobs"
MAX_SCHEDULER_OUTPUT_BYTES: Final = 4 * 1024 * 1024
"""The most a scheduler answer may hold (a larger one is a failure: ``unknown``)."""
MAX_HOSTLIST_NAMES: Final = 4096
"""Host names one Slurm hostlist expression may expand to."""
SCONTROL_TIMEOUT_S: Final = 10.0

_log = structlog.get_logger("meter.allocation")


class AllocationSource(Protocol):
    """Who holds the node's GPUs now."""

    def holders(self) -> Mapping[str, str] | None:
        """Device id (uuid) -> holder identity (``k8s:<namespace>``,
        ``slurm:<account>/<partition>``); a device held by nobody is absent. None: the
        source could not say (every sample then reads ``unknown``)."""
        ...


def holder_matches(holder: str, wanted: Iterable[str]) -> bool:
    """Whether ``holder`` is one of the terms' identities (SPEC §5.3): exact, or
    ``slurm:<account>`` for any partition of that account."""
    for identity in wanted:
        if holder == identity:
            return True
        if (
            identity.startswith("slurm:")
            and "/" not in identity
            and holder.startswith(identity + "/")
        ):
            return True
    return False


def allocations_for(
    terms: PlacementTerms, gpus: Sequence[GpuSpec], holders: Mapping[str, str] | None
) -> dict[str, Allocation]:
    """Each GPU's ``allocation`` for a sample of ``terms`` (see the module docstring)."""
    wanted = terms.metering.holders if terms.metering is not None else []
    if holders is None or not wanted:
        return {g.uuid: "unknown" for g in gpus}
    out: dict[str, Allocation] = {}
    for gpu in gpus:
        holder = holders.get(gpu.uuid)
        if holder is None:
            out[gpu.uuid] = "idle"
        else:
            out[gpu.uuid] = "buyer" if holder_matches(holder, wanted) else "other"
    return out


def _is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith("nvidia.com/mig-")


class KubeletSource:
    """Holders from the kubelet PodResources API v1 ``List``.

    ``list_pod_resources`` returns the response as a mapping of the protobuf's field names
    (``ListPodResourcesResponse``: ``pod_resources`` -> ``name``, ``namespace``,
    ``containers`` -> ``name``, ``devices`` -> ``resource_name``, ``device_ids``), as
    ``meter.podresources.list_pod_resources`` decodes it from the socket.
    """

    def __init__(self, list_pod_resources: Callable[[], Mapping[str, Any]]) -> None:
        self._list = list_pod_resources

    def holders(self) -> Mapping[str, str] | None:
        """Each GPU device id given to a container, held by ``k8s:<pod namespace>``."""
        try:
            response = self._list()
            out: dict[str, str] = {}
            for pod in response.get("pod_resources", []):
                namespace = str(pod["namespace"])
                for container in pod.get("containers", []):
                    for device in container.get("devices", []):
                        if not _is_gpu_resource(str(device["resource_name"])):
                            continue
                        for device_id in device.get("device_ids", []):
                            out[str(device_id)] = f"k8s:{namespace}"
            return out
        except Exception as exc:  # any failure of the socket or the shape: unknown
            _log.warning("kubelet_podresources_failed", error=f"{type(exc).__name__}: {exc}")
            return None


def expand_hostlist(expression: str) -> list[str]:
    """A Slurm hostlist (``gpu[01-03,7],login1``) as host names, at most
    ``MAX_HOSTLIST_NAMES``; ValueError when it is malformed or longer."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", expression):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"malformed hostlist range {item!r} in {expression!r}")
            width = len(low)
            top = int(high) if high else int(low)
            if top - int(low) > MAX_HOSTLIST_NAMES:
                raise ValueError(f"hostlist {expression!r} names too many hosts")
            names.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), top + 1))
        if len(names) > MAX_HOSTLIST_NAMES:
            raise ValueError(f"hostlist {expression!r} names too many hosts")
    return names


def _gres_indices(gres: str) -> list[int]:
    """The GPU indices of a job's per-node GRES detail (``gpu:a100:2(IDX:0,2-3)``)."""
    out: list[int] = []
    for idx in re.findall(r"gpu[^()]*\(IDX:([0-9,\-]+)\)", gres):
        for item in idx.split(","):
            low, _, high = item.partition("-")
            if low.isdigit():
                top = int(high) if high.isdigit() else int(low)
                out.extend(range(int(low), min(top, int(low) + 1024) + 1))
    return out


def _run_scontrol() -> str:
    result = subprocess.run(
        ["scontrol", "-o", "-d", "show", "jobs"],
        capture_output=True,
        check=True,
        timeout=SCONTROL_TIMEOUT_S,
    )
    if len(result.stdout) > MAX_SCHEDULER_OUTPUT_BYTES:
        raise ValueError(f"scontrol answered {len(result.stdout)} bytes")
    return result.stdout.decode("utf-8", "replace")


class SlurmSource:
    """Holders from Slurm: the running jobs' GPUs on this node (``scontrol -o -d show
    jobs``: one line per job, with ``Account=``, ``Partition=``, ``JobState=`` and, per node
    set, ``Nodes=<hostlist> … GRES=gpu…(IDX:…)``). Slurm names GPUs by index on the node;
    ``uuid_of_index`` maps them to uuids (NVML's ``nvmlDeviceGetHandleByIndex`` order, which
    Slurm's gres.conf ``AutoDetect=nvml`` follows)."""

    def __init__(
        self,
        node_name: str,
        uuid_of_index: Callable[[int], str | None],
        run: Callable[[], str] = _run_scontrol,
    ) -> None:
        self._node = node_name
        self._uuid_of_index = uuid_of_index
        self._run = run

    def holders(self) -> Mapping[str, str] | None:
        """Each GPU of a running job on this node, held by ``slurm:<account>/<partition>``."""
        try:
            text = self._run()
            out: dict[str, str] = {}
            for line in text.splitlines():
                fields = dict(re.findall(r"(\w+)=(\S*)", line))
                if fields.get("JobState") != "RUNNING":
                    continue
                holder = f"slurm:{fields.get('Account', '')}/{fields.get('Partition', '')}"
                # Per node set: " Nodes=<hostlist> CPU_IDs=… Mem=… GRES=gpu…(IDX:…)".
                for part in re.split(r"(?:^|\s)Nodes=", line)[1:]:
                    nodes = part.split(maxsplit=1)[0] if part.strip() else ""
                    gres = re.search(r"\bGRES(?:_IDX)?=(\S+)", part)
                    if gres is None or self._node not in expand_hostlist(nodes):
                        continue
                    for index in _gres_indices(gres.group(1)):
                        uuid = self._uuid_of_index(index)
                        if uuid is not None:
                            out[uuid] = holder
            return out
        except Exception as exc:  # scontrol missing, failing, slow or odd: unknown
            _log.warning("slurm_scontrol_failed", error=f"{type(exc).__name__}: {exc}")
            return None


MAX_PROLOG_FILES: Final = 1024
"""Job files a prolog directory may hold (more: a failure, ``unknown``)."""
MAX_PROLOG_FILE_BYTES: Final = 65_536


class SlurmPrologSource:
    """Holders from the files a Slurm prolog writes (``deploy/slurm-prolog.sh``): one
    ``<job id>.env`` per running job, lines ``KEY=VALUE`` of the prolog's environment:
    ``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_PARTITION`` and ``SLURM_JOB_GPUS`` (the job's GPU
    indices on this node, comma-separated); the epilog removes the file."""

    def __init__(self, directory: Path, uuid_of_index: Callable[[int], str | None]) -> None:
        self._directory = directory
        self._uuid_of_index = uuid_of_index

    def holders(self) -> Mapping[str, str] | None:
        """Each GPU of a job with a file, held by ``slurm:<account>/<partition>``."""
        try:
            if not self._directory.is_dir():  # no prolog wrote here: nobody can say
                raise FileNotFoundError(f"no directory {self._directory}")
            files = sorted(self._directory.glob("*.env"))
            if len(files) > MAX_PROLOG_FILES:
                raise ValueError(f"{len(files)} job files in {self._directory}")
            out: dict[str, str] = {}
            for path in files:
                with path.open("rb") as f:
                    text = f.read(MAX_PROLOG_FILE_BYTES + 1)
                if len(text) > MAX_PROLOG_FILE_BYTES:
                    raise ValueError(f"{path} is larger than {MAX_PROLOG_FILE_BYTES} bytes")
                env = dict(
                    line.split("=", 1)
                    for line in text.decode("utf-8", "replace").splitlines()
                    if "=" in line
                )
                holder = (
                    f"slurm:{env.get('SLURM_JOB_ACCOUNT', '')}/{env.get('SLURM_JOB_PARTITION', '')}"
                )
                for index in env.get("SLURM_JOB_GPUS", "").split(","):
                    uuid = self._uuid_of_index(int(index)) if index.strip().isdigit() else None
                    if uuid is not None:
                        out[uuid] = holder
            return out
        except Exception as exc:  # unreadable, too many, too large: unknown
            _log.warning("slurm_prolog_files_failed", error=f"{type(exc).__name__}: {exc}")
            return None


def build_allocation_source(
    kind: str,
    *,
    kubelet_socket: str,
    slurm_node: str,
    uuid_of_index: Callable[[int], str | None],
    slurm_prolog_dir: str = "",
) -> AllocationSource | None:
    """The source meter.toml's ``allocation`` names (None for ``none``)."""
    if kind == "kubelet":
        from meter.podresources import list_pod_resources

        return KubeletSource(lambda: list_pod_resources(kubelet_socket))
    if kind == "slurm":
        node = slurm_node or socket.gethostname().split(".")[0]
        return SlurmSource(node, uuid_of_index)
    if kind == "slurm-prolog":
        return SlurmPrologSource(Path(slurm_prolog_dir or DEFAULT_PROLOG_DIR), uuid_of_index)
    if kind == "none":
        return None
    raise ValueError(f"allocation must be one of {', '.join(ALLOCATION_KINDS)}, not {kind!r}")
