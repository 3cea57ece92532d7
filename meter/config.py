"""meter.toml: what a node agent meters, how it signs, where it spools and ships.

Keys (relative paths are relative to the directory of meter.toml)::

    node_id = "node-a"                    # this node, as named in the terms' nodes
    key_file = "keys/node-a.key"          # the node's Ed25519 key (mode 0600, else refused)
    terms = ["terms/p1.signed.json"]      # signed terms files (envelope JSON), all three
                                          #   parties' signatures present and valid
    interval_s = 60                       # usage interval (seconds; fractions allowed)
    source = "nvml"                       # "nvml" | "simulate"
    simulate = "seed=7,gpus=4"            # the simulator spec (meter/sim.py) for
                                          #   source = "simulate"; --simulate overrides
    spool_dir = "/var/lib/gridledger/spool"   # kafka transport: the agent's spool
    spool_max_bytes = 1073741824          # bound of the spool (full: the agent exits 75)
    segment_max_bytes = 16777216          # segment file size (optional)
    metrics_listen = "127.0.0.1:9101"     # optional Prometheus endpoint (loopback)
    transport = "local"                   # "local" | "kafka"
    local_dir = "/var/lib/gridledger/local"   # local: the spool is local_dir/node-<node_id>
    key_rebound = false                   # true: key_file is not the node key the terms
                                          #   name but one a NodeKeyBinding bound (else the
                                          #   agent refuses to start)
    allocation = "none"                   # who holds each GPU (SPEC §7.1.2): "none" (every
                                          #   sample says allocation "unknown") | "kubelet"
                                          #   | "slurm" | "slurm-prolog" (meter/allocation.py)
    kubelet_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"   # allocation = kubelet
    slurm_node = "gpu01"                  # allocation = slurm: this node's Slurm name
                                          #   (default: the short host name)
    slurm_prolog_dir = "/run/gridledger/slurm-jobs"  # allocation = slurm-prolog: the job
                                          #   files deploy/slurm-prolog.sh writes
    resume_files = ["resume.json"]        # signed resumes (gridledger resume, SPEC §6.3)
                                          #   of this node's streams: a stream with no event
                                          #   in the spool goes on from its resume

    [kafka]                               # transport = "kafka"
    bootstrap = "127.0.0.1:9092"
    topic = "gridledger.records"
    security_protocol = "PLAINTEXT"       # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism = "SCRAM-SHA-512"      # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_username = "node-a"
    sasl_password_env = "GRIDLEDGER_KAFKA_PASSWORD"   # the password, from the environment
    ssl_cafile = "/etc/gridledger/ca.pem"

In local mode the ledger reads the spool directly and nothing is ever deleted from it.

Directories: the agent creates its own spool directory (``spool_dir``, or
``local_dir/node-<node_id>``) but never its parent: a ``local_dir`` (or the parent of
``spool_dir``) that does not exist stops the agent with one line (exit 2), so a typo
never spools signed usage somewhere nobody reads it.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from meter.allocation import ALLOCATION_KINDS, DEFAULT_PROLOG_DIR
from meter.limits import DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS, MAX_TERMS_FILES, MIN_INTERVAL_MS
from meter.podresources import DEFAULT_SOCKET
from proto.unknown_keys import unknown_key
from transport.kafka import DEFAULT_TOPIC, KafkaSettings
from transport.limits import (
    DEFAULT_SEGMENT_MAX_BYTES,
    DEFAULT_SPOOL_MAX_BYTES,
    MIN_SEGMENT_MAX_BYTES,
)
from transport.local import node_source

__all__ = ["ConfigError", "MeterConfig", "load_meter_config"]

_TOP_KEYS: Final = frozenset(
    {
        "node_id",
        "key_file",
        "terms",
        "interval_s",
        "source",
        "simulate",
        "spool_dir",
        "spool_max_bytes",
        "segment_max_bytes",
        "metrics_listen",
        "transport",
        "local_dir",
        "kafka",
        "key_rebound",
        "allocation",
        "kubelet_socket",
        "slurm_node",
        "slurm_prolog_dir",
        "resume_files",
    }
)
_KAFKA_KEYS: Final = frozenset(
    {
        "bootstrap",
        "topic",
        "security_protocol",
        "sasl_mechanism",
        "sasl_username",
        "sasl_password",
        "sasl_password_env",
        "ssl_cafile",
    }
)


class ConfigError(Exception):
    """meter.toml cannot be used; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class MeterConfig:
    """A checked meter.toml."""

    path: Path
    node_id: str
    key_file: Path
    terms: tuple[Path, ...]
    interval_ms: int
    source: Literal["nvml", "simulate"]
    simulate: str
    spool_dir: Path
    spool_max_bytes: int
    segment_max_bytes: int
    transport: Literal["local", "kafka"]
    kafka: KafkaSettings | None
    metrics_listen: tuple[str, int] | None
    key_rebound: bool = False
    allocation: str = "none"  # one of meter.allocation.ALLOCATION_KINDS
    kubelet_socket: str = DEFAULT_SOCKET
    slurm_node: str = ""  # empty: the short host name
    slurm_prolog_dir: str = DEFAULT_PROLOG_DIR
    resume_files: tuple[Path, ...] = ()


def load_meter_config(path: Path) -> MeterConfig:
    """Read and check meter.toml; ConfigError lists every problem found."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path} is not valid TOML: {exc}"]) from exc
    return parse_meter_config(data, Path(path))


def _path(base: Path, value: str) -> Path:
    candidate = Path(value).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def parse_meter_config(data: dict[str, Any], path: Path) -> MeterConfig:
    """Check the parsed TOML of ``path`` (see the module docstring for the keys)."""
    base = path.parent
    problems: list[str] = [unknown_key(k, _TOP_KEYS) for k in sorted(set(data) - _TOP_KEYS)]

    def text(key: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or not value:
            problems.append(f"{key} must be a non-empty string")
            return ""
        return value

    def integer(key: str, default: int, low: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{key} must be an integer >= {low}")
            return default
        return value

    node_id = text("node_id")
    key_file = _path(base, text("key_file")) if data.get("key_file") else Path()
    if not data.get("key_file"):
        problems.append("key_file is required")
    terms_value = data.get("terms")
    terms: tuple[Path, ...] = ()
    if (
        not isinstance(terms_value, list)
        or not terms_value
        or not all(isinstance(t, str) and t for t in terms_value)
    ):
        problems.append("terms must be a non-empty list of file names")
    elif len(terms_value) > MAX_TERMS_FILES:
        problems.append(f"terms lists {len(terms_value)} files; at most {MAX_TERMS_FILES}")
    else:
        terms = tuple(_path(base, t) for t in terms_value)

    interval_ms = DEFAULT_INTERVAL_MS
    if "interval_s" in data:
        interval_s = data["interval_s"]
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float):
            problems.append("interval_s must be a number of seconds")
        else:
            interval_ms = round(interval_s * 1000)
            if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
                problems.append(
                    f"interval_s {interval_s} is outside {MIN_INTERVAL_MS / 1000}.."
                    f"{MAX_INTERVAL_MS // 1000} s"
                )

    source = data.get("source", "nvml")
    if source not in ("nvml", "simulate"):
        problems.append(f"source must be 'nvml' or 'simulate', not {source!r}")
        source = "nvml"
    simulate = data.get("simulate", "")
    if not isinstance(simulate, str):
        problems.append("simulate must be a spec string")
        simulate = ""

    spool_max_bytes = integer("spool_max_bytes", DEFAULT_SPOOL_MAX_BYTES, MIN_SEGMENT_MAX_BYTES)
    segment_max_bytes = integer(
        "segment_max_bytes", min(DEFAULT_SEGMENT_MAX_BYTES, spool_max_bytes), MIN_SEGMENT_MAX_BYTES
    )
    if segment_max_bytes > spool_max_bytes:
        problems.append("segment_max_bytes is larger than spool_max_bytes")

    transport = data.get("transport", "local")
    kafka: KafkaSettings | None = None
    spool_dir = Path()
    if transport == "local":
        if "local_dir" not in data:
            problems.append("transport 'local' needs local_dir")
        else:
            local_dir = _path(base, text("local_dir"))
            spool_dir = local_dir / node_source(node_id)
            if "spool_dir" in data and _path(base, str(data["spool_dir"])) != spool_dir:
                problems.append(
                    f"with transport 'local' the spool is {spool_dir}; drop spool_dir or make "
                    "it that"
                )
    elif transport == "kafka":
        if "spool_dir" not in data:
            problems.append("transport 'kafka' needs spool_dir")
        else:
            spool_dir = _path(base, text("spool_dir"))
        kafka = _kafka_settings(data.get("kafka"), base, problems)
    else:
        problems.append(f"transport must be 'local' or 'kafka', not {transport!r}")
        transport = "local"

    metrics_listen: tuple[str, int] | None = None
    if "metrics_listen" in data:
        host, _, port = str(data["metrics_listen"]).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append("metrics_listen must be HOST:PORT")
        else:
            metrics_listen = (host, int(port))

    node_settings = _node_settings(data, problems, base)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return MeterConfig(
        path=path,
        node_id=node_id,
        key_file=key_file,
        terms=terms,
        interval_ms=interval_ms,
        source=source,
        simulate=simulate,
        spool_dir=spool_dir,
        spool_max_bytes=spool_max_bytes,
        segment_max_bytes=segment_max_bytes,
        transport=transport,
        kafka=kafka,
        metrics_listen=metrics_listen,
        **node_settings,
    )


def _resume_files(data: dict[str, Any], base: Path, problems: list[str]) -> dict[str, Any]:
    """``resume_files``: signed resumes of this node's streams (SPEC §6.3 resume)."""
    listed = data.get("resume_files", [])
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        problems.append("resume_files must be a list of file names")
        return {}
    return {"resume_files": tuple(_path(base, f) for f in listed)}


def _node_settings(data: dict[str, Any], problems: list[str], base: Path) -> dict[str, Any]:
    """``key_rebound``; ``allocation``, ``kubelet_socket`` and ``slurm_node`` (SPEC §7.1.2);
    ``resume_files`` (SPEC §6.3 resume)."""
    key_rebound = data.get("key_rebound", False)
    if not isinstance(key_rebound, bool):
        problems.append("key_rebound must be true or false")
        key_rebound = False
    allocation = data.get("allocation", "none")
    if allocation not in ALLOCATION_KINDS:
        kinds = ", ".join(repr(k) for k in ALLOCATION_KINDS)
        problems.append(f"allocation must be one of {kinds}, not {allocation!r}")
        allocation = "none"
    texts = {k: data.get(k, "") for k in ("kubelet_socket", "slurm_node", "slurm_prolog_dir")}
    for name, value in texts.items():
        if not isinstance(value, str):
            problems.append(f"{name} must be a string")
    return {
        "key_rebound": key_rebound,
        "allocation": allocation,
        "kubelet_socket": str(texts["kubelet_socket"] or DEFAULT_SOCKET),
        "slurm_node": str(texts["slurm_node"]),
        "slurm_prolog_dir": str(texts["slurm_prolog_dir"] or DEFAULT_PROLOG_DIR),
        **_resume_files(data, base, problems),
    }


def _kafka_settings(value: Any, base: Path, problems: list[str]) -> KafkaSettings | None:
    if not isinstance(value, dict):
        problems.append("transport 'kafka' needs a [kafka] table with bootstrap")
        return None
    unknown = sorted(set(value) - _KAFKA_KEYS)
    problems.extend(unknown_key(k, _KAFKA_KEYS, table="kafka") for k in unknown)
    password = value.get("sasl_password")
    env_name = value.get("sasl_password_env")
    if env_name is not None:
        password = os.environ.get(str(env_name))
        if password is None:
            problems.append(f"kafka.sasl_password_env: ${env_name} is not set")
    cafile = value.get("ssl_cafile")
    try:
        return KafkaSettings(
            bootstrap=str(value.get("bootstrap", "")),
            topic=str(value.get("topic", DEFAULT_TOPIC)),
            security_protocol=str(value.get("security_protocol", "PLAINTEXT")),
            sasl_mechanism=value.get("sasl_mechanism"),
            sasl_username=value.get("sasl_username"),
            sasl_password=password,
            ssl_cafile=str(_path(base, str(cafile))) if cafile else None,
        )
    except ValueError as exc:
        problems.append(f"kafka: {exc}")
        return None
