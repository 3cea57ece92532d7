"""Ready-to-run node setups for tests, benchmarks and the demo: key, signed terms, meter.toml.

Deterministic for a ``devtools.builders.Cast``: the node key and the terms signatures come
from the cast's seed, so two runs write the same files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from devtools.builders import Cast, signed_terms
from proto.keys import write_key_pair
from proto.records import PlacementTerms

__all__ = ["write_meter_setup"]


def write_meter_setup(
    workdir: Path,
    cast: Cast,
    node_id: str,
    terms: Sequence[PlacementTerms],
    *,
    transport: str = "local",
    interval_s: float = 60,
    local_dir: Path | None = None,
    kafka: dict[str, Any] | None = None,
    simulate: str | None = None,
    spool_max_bytes: int | None = None,
    segment_max_bytes: int | None = None,
) -> Path:
    """Write ``workdir/<node_id>/`` (key, signed terms, meter.toml); return meter.toml."""
    node_dir = Path(workdir) / node_id
    keys_dir = node_dir / "keys"
    key = cast.node_key(node_id)
    if not (keys_dir / f"{key.name}.key").exists():
        write_key_pair(key, keys_dir)
    terms_files = []
    for placement in terms:
        path = node_dir / "terms" / f"{placement.placement_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(signed_terms(cast, placement) + b"\n")
        terms_files.append(str(path.relative_to(node_dir)))
    config: dict[str, Any] = {
        "node_id": node_id,
        "key_file": str((keys_dir / f"{key.name}.key").relative_to(node_dir)),
        "terms": terms_files,
        "interval_s": interval_s,
        "transport": transport,
        "source": "simulate" if simulate is not None else "nvml",
    }
    if simulate is not None:
        config["simulate"] = simulate
    if spool_max_bytes is not None:
        config["spool_max_bytes"] = spool_max_bytes
    if segment_max_bytes is not None:
        config["segment_max_bytes"] = segment_max_bytes
    if transport == "local":
        local = local_dir if local_dir is not None else Path(workdir) / "local"
        local.mkdir(parents=True, exist_ok=True)  # the operator's to create (meter.config)
        config["local_dir"] = str(local)
    else:
        config["spool_dir"] = "spool"
        config["kafka"] = dict(kafka or {})
    path = node_dir / "meter.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    os.chmod(keys_dir / f"{key.name}.key", 0o600)
    return path
