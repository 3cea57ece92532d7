"""`gridledger example-setup`: everything a first real stack needs, in one directory.

Writes, into ``--out DIR`` (reused if it exists: keys are never replaced):

* ``keys/`` — key pairs for an operator, a buyer, a desk, the ledger and two nodes;
* ``terms/<placement>.signed.json`` — one placement on both nodes, signed by the three
  parties, for ``--hours`` from the start time;
* ``trust.json`` — the keys the parties pin for verification;
* ``ledger.toml``, ``meter-a.toml``, ``meter-b.toml`` — configurations for a ledger and
  two simulated meters shipping to Kafka at ``--bootstrap``, with paths relative to DIR
  so the same directory works inside the compose containers and on a host.

With ``--publish`` the signed terms are published to the topic (retrying, bounded, while
the broker comes up). ``docker-compose.yml`` runs this once before the ledger and the
meters start; on a host the same files run with ``gridledger ledger run --config
DIR/ledger.toml`` and ``gridledger meter run --config DIR/meter-a.toml``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Final

import tomli_w

from proto.canonical import signed_bytes
from proto.envelope import encode_envelope, sign_payload
from proto.keys import SigningKey, load_signing_key, write_key_pair
from proto.records import GpuSpec, NodeSpec, Party, PlacementTerms
from proto.terms import require_valid_terms
from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile, dump_trust

PARTIES: Final = {
    "operator": "example-operator",
    "buyer": "example-buyer",
    "desk": "example-desk",
    "ledger": "example-ledger",
}
NODE_GPUS: Final = {"node-a": 8, "node-b": 4}
PUBLISH_ATTEMPTS: Final = 30
PUBLISH_BACKOFF_S: Final = 2.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `example-setup` command."""
    parser = sub.add_parser(
        "example-setup",
        help="write keys, signed terms, trust file and configs for a first real stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for keys, terms, trust and configs"
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka, as configs see it")
    parser.add_argument(
        "--topic", default="gridledger.records", help="Kafka topic (default gridledger.records)"
    )
    parser.add_argument("--hours", type=int, default=24, help="length of the placement window")
    parser.add_argument("--start-ms", type=int, help="window start (default: now, to the minute)")
    parser.add_argument("--http", default="127.0.0.1:8080", help="the ledger's HTTP API address")
    parser.add_argument("--publish", action="store_true", help="publish the terms to Kafka")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if not 1 <= args.hours <= 24 * 366:
        print("FAIL: --hours must be 1..8784", file=sys.stderr)
        return 2
    start_ms = args.start_ms
    if start_ms is None:
        start_ms = time.time_ns() // 1_000_000 // 60_000 * 60_000
    terms_path = write_stack(
        args.out,
        bootstrap=args.bootstrap,
        topic=args.topic,
        start_ms=start_ms,
        hours=args.hours,
        http=args.http,
    )
    print(f"OK: stack files in {args.out} (terms {terms_path.name})")
    if args.publish:
        return _publish(terms_path, args.bootstrap, args.topic)
    return 0


def _key(keys_dir: Path, name: str) -> SigningKey:
    path = keys_dir / f"{name}.key"
    if not path.exists():
        write_key_pair(SigningKey.generate(name), keys_dir)
    return load_signing_key(path)


def write_stack(
    out: Path, *, bootstrap: str, topic: str, start_ms: int, hours: int, http: str
) -> Path:
    """Write the stack files (see the module docstring); return the signed terms' path."""
    out.mkdir(parents=True, exist_ok=True)
    keys_dir = out / "keys"
    keys = {name: _key(keys_dir, name) for name in [*PARTIES.values(), *NODE_GPUS]}
    terms_dir = out / "terms"
    existing = sorted(terms_dir.glob("*.signed.json")) if terms_dir.exists() else []
    # A stack restarted keeps its placement (same bytes; the ledger drops the re-send).
    terms_path = existing[0] if existing else _write_terms(terms_dir, keys, start_ms, hours)
    _write_configs(out, terms_path, bootstrap=bootstrap, topic=topic, http=http, keys=keys)
    return terms_path


def _write_terms(terms_dir: Path, keys: dict[str, SigningKey], start_ms: int, hours: int) -> Path:
    placement_id = f"pl-example-{start_ms // 60_000}"
    gpus = [
        GpuSpec(
            node_id=node,
            uuid=f"GPU-{node}-{i}",
            model="SIM-GPU",
            share_milli=1000,
            memory_mib=81920,
        )
        for node, n in NODE_GPUS.items()
        for i in range(n)
    ]
    terms = PlacementTerms(
        placement_id=placement_id,
        operator=Party(id=PARTIES["operator"], key=keys[PARTIES["operator"]].public_key),
        buyer=Party(id=PARTIES["buyer"], key=keys[PARTIES["buyer"]].public_key),
        desk=Party(id=PARTIES["desk"], key=keys[PARTIES["desk"]].public_key),
        ledger_key=keys[PARTIES["ledger"]].public_key,
        nodes=[
            NodeSpec(node_id=n, key=keys[n].public_key, region="local", fabric="pcie")
            for n in NODE_GPUS
        ],
        gpus=gpus,
        window_start_ms=start_ms,
        window_end_ms=start_ms + hours * 3_600_000,
        rate_basis="gpu_hour",
        rate_per_gpu_hour_minor=199,
        currency="USD",
        currency_scale=2,
        increment_ms=60_000,
        minimum_duration_ms=3_600_000,
        desk_fee_bps=300,
        fee_payer="buyer",
        interruptible=True,
        reclaim_notice_ms=900_000,
        reclaim_penalty_bps=5_000,
        sla_availability_target_bps=9_900,
        sla_credit_bps=1_000,
        settlement_period_ms=3_600_000,
        late_grace_ms=300_000,
        created_at_ms=start_ms,
    )
    require_valid_terms(terms)
    signers = [keys[PARTIES[r]] for r in ("operator", "buyer", "desk")]
    terms_dir.mkdir(exist_ok=True)
    terms_path = terms_dir / f"{placement_id}.signed.json"
    envelope = encode_envelope(sign_payload(signed_bytes(terms), signers))
    terms_path.write_bytes(envelope + b"\n")
    return terms_path


def _write_configs(
    out: Path,
    terms_path: Path,
    *,
    bootstrap: str,
    topic: str,
    http: str,
    keys: dict[str, SigningKey],
) -> None:
    trust = TrustFile(
        format=TRUST_FORMAT,
        keys=[
            TrustedKey(id=name, role=role, key=keys[name].public_key)  # type: ignore[arg-type]
            for role, name in PARTIES.items()
        ],
    )
    (out / "trust.json").write_bytes(dump_trust(trust))
    (out / "spool").mkdir(exist_ok=True)  # the meters create only their own spool in it
    kafka: dict[str, Any] = {"bootstrap": bootstrap, "topic": topic}
    ledger: dict[str, Any] = {
        "ledger_id": PARTIES["ledger"],
        "key_file": f"keys/{PARTIES['ledger']}.key",
        "db": "data/ledger.duckdb",
        "transport": "kafka",
        "http": http,
        "kafka": kafka,
    }
    _write_toml(out / "ledger.toml", ledger, "gridledger ledger run --config ledger.toml")
    for suffix, node in (("a", "node-a"), ("b", "node-b")):
        meter: dict[str, Any] = {
            "node_id": node,
            "key_file": f"keys/{node}.key",
            "terms": [str(terms_path.relative_to(out))],
            "interval_s": 60,
            "source": "simulate",
            "simulate": f"seed={ord(suffix)}",
            "spool_dir": f"spool/{node}",
            "transport": "kafka",
            "kafka": kafka,
        }
        _write_toml(
            out / f"meter-{suffix}.toml",
            meter,
            f"gridledger meter run --config meter-{suffix}.toml",
        )


def _write_toml(path: Path, data: dict[str, Any], command: str) -> None:
    header = f"# Written by `gridledger example-setup`; run: {command}\n"
    path.write_text(header + tomli_w.dumps(data))


def _publish(terms_path: Path, bootstrap: str, topic: str) -> int:
    from transport.kafka import KafkaSettings, placement_of, publish_kafka

    envelope = terms_path.read_bytes().rstrip(b"\n")
    settings = KafkaSettings(bootstrap=bootstrap, topic=topic)
    item = (placement_of(envelope), envelope)
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        try:
            asyncio.run(publish_kafka(settings, [item]))
        except Exception as exc:  # the broker may still be starting
            print(f"waiting for Kafka at {bootstrap} ({attempt}/{PUBLISH_ATTEMPTS}): {exc}")
            time.sleep(PUBLISH_BACKOFF_S)
            continue
        print(f"OK: terms published to {topic} at {bootstrap}")
        return 0
    print(f"FAIL: could not publish to Kafka at {bootstrap}", file=sys.stderr)
    return 1
