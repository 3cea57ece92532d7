"""ledger.toml: the configuration of one ledger process (one shard, one DuckDB file).

Keys (relative paths are relative to the directory of the config file)::

    ledger_id = "ledger-1"            # names the ledger's own spool (local transport)
    key_file = "keys/ledger-1.key"    # the ledger's Ed25519 key (mode 0600)
    db = "data/ledger.duckdb"         # the store; one writer: this process
    transport = "local"               # "local" (spool directories) or "kafka"
    local_dir = "spool"               # local: one sub-directory per source, read into the
                                      # intake log "<local_dir>/.intake-<ledger_id>/" (§6.4)
    batch_max_records = 5000          # inputs per transaction
    close = true                      # publish PlacementClosed when window_end + grace passes
    http = "127.0.0.1:0"              # HTTP API: HOST:PORT; port 0 = any free port, written to
                                      # the port file "<db>.http.json"; "off" = no API
    ops_http = "off"                  # /health and /metrics unsigned on their own HOST:PORT
                                      # (for probes and Prometheus; "off": none)
    api_auditors = []                 # SPEC §13: base64 Ed25519 keys that may read every
                                      # placement over the API (the parties of a placement
                                      # are known from its terms)
    tls_cert_file = "certs/api.pem"   # TLS on the API (both or neither; PEM): the
    tls_key_file = "certs/api.key"    # certificate chain and its private key
    attest_interval_s = 10.0          # SPEC §8.4: statements and checkpoints issued at each
                                      # placement's head this often (a read never writes)
    # clock_ms = 1767225600000        # simulated clock (tests, replays): a fixed "now"
    arrival = "log"                   # SPEC §6.6: an input's arrival time is the log's
                                      # (Kafka LogAppendTime; the intake log's clock).
                                      # "sender": the time its sender stated (Kafka
                                      # CreateTime, stamped spool frames) -- ONLY for
                                      # simulations on a compressed simulated clock
    crypto_worker = true              # kafka: usage signatures checked in one worker
                                      # process beside the fold (false: on threads of
                                      # the ledger process, which share its GIL)

    [[attestation_roots]]             # SPEC §6.9: attestation services whose signature
    id = "nras"                       # hardware evidence needs (none: not judged)
    alg = "ES384"                     # or "EdDSA"
    key = "BASE64"                    # ES384: 97-byte SEC1 point; EdDSA: 32 bytes

    [kafka]                           # transport = "kafka"
    bootstrap = "127.0.0.1:9092"
    topic = "gridledger.records"      # created beforehand with a fixed partition count
    # partitions = [0, 1]             # the partitions this shard owns, or:
    shard = 0                         # this shard owns partitions p with p % shards == shard
    shards = 1                        # (leave shard/shards out for `ledger supervise
                                      # --shards N`, which runs shard i of N itself with
                                      # store <db stem>-s<i>of<N><suffix> and HTTP port
                                      # + i: see ``shard_config``)
    security_protocol = "PLAINTEXT"   # or SSL, SASL_PLAINTEXT, SASL_SSL
    # sasl_mechanism = "SCRAM-SHA-512"
    # sasl_username = "ledger"
    # sasl_password_file = "secrets/kafka-password"   # never the password itself
    # ssl_cafile = "certs/ca.pem"
    # capacity_topic = "gridledger.capacity"  # SPEC §6.5 across shards: terms claim their
                                      # GPUs through this topic (LogAppendTime, keyed by
                                      # GPU uuid) before they are accepted; left out:
                                      # claims are compared within each partition only
    # capacity_ledger_keys = ["<base64>"]  # the other shards' ledger public keys: only
                                      # capacity records signed by one of them (or this
                                      # shard's key) count; pinned like any other key
    start_backoff_initial_s = 0.5     # Kafka unreachable at start: wait this long before the
    start_backoff_max_s = 10.0        # next of START_ATTEMPTS (10) attempts, doubling up to
                                      # the max; then exit 75. Both in 0.01..600 s, initial
                                      # <= max (defaults: ledger.limits START_BACKOFF_*;
                                      # max left out: 10 s, or the initial if larger)
"""

from __future__ import annotations

import base64
import binascii
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from ledger.limits import (
    DEFAULT_BATCH_MAX_RECORDS,
    MAX_BATCH_RECORDS,
    MAX_SHARDS,
    START_BACKOFF_INITIAL_S,
    START_BACKOFF_MAX_S,
)
from proto.attestation import AttestationRoot, root_key_ok
from proto.limits import MAX_ATTESTATION_ROOTS
from proto.unknown_keys import unknown_key
from transport.kafka import DEFAULT_TOPIC, KafkaSettings

DEFAULT_HTTP: Final = "127.0.0.1:0"

_TOP_KEYS: Final = frozenset(
    {
        "ledger_id",
        "key_file",
        "db",
        "transport",
        "local_dir",
        "batch_max_records",
        "close",
        "http",
        "clock_ms",
        "arrival",
        "crypto_worker",
        "kafka",
        "attestation_roots",
        "ops_http",
        "api_auditors",
        "attest_interval_s",
        "tls_cert_file",
        "tls_key_file",
    }
)
# SPEC §13: at most this many auditor keys; attest_interval_s within this range (seconds).
MAX_API_AUDITORS: Final = 64
ATTEST_INTERVAL_RANGE_S: Final = (0.05, 3600.0)
_KAFKA_KEYS: Final = frozenset(
    {
        "bootstrap",
        "topic",
        "partitions",
        "shard",
        "shards",
        "security_protocol",
        "sasl_mechanism",
        "sasl_username",
        "sasl_password_file",
        "ssl_cafile",
        "start_backoff_initial_s",
        "start_backoff_max_s",
        "capacity_topic",
        "capacity_ledger_keys",
    }
)
# [kafka] capacity_ledger_keys: at most this many shards' keys.
MAX_CAPACITY_LEDGER_KEYS: Final = 1024
# [kafka] start_backoff_initial_s / start_backoff_max_s: each in this range (seconds).
START_BACKOFF_RANGE_S: Final = (0.01, 600.0)


Arrival = Literal["log", "sender"]
"""Where an input's arrival time comes from (SPEC §6.6): the log (always, in production)
or, for simulations alone, the time its sender stated."""

ARRIVAL_MODES: Final[tuple[Arrival, ...]] = ("log", "sender")


class ConfigError(Exception):
    """ledger.toml cannot be used; the message names the key and what is wrong."""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """Where the ledger reads (and publishes its closes) when transport = "kafka"."""

    settings: KafkaSettings
    partitions: tuple[int, ...] | None = None
    shard: int = 0
    shards: int = 1
    # `ledger run` with the broker unreachable: the first wait between start attempts,
    # doubled per attempt up to the max (ledger.limits START_BACKOFF_*, START_ATTEMPTS).
    start_backoff_initial_s: float = START_BACKOFF_INITIAL_S
    start_backoff_max_s: float = START_BACKOFF_MAX_S
    # SPEC §6.5 across shards: the capacity topic through which terms claim their GPUs
    # (None: claims compared within each ordered stream only).
    capacity_topic: str | None = None
    # the other shards' ledger public keys, pinned: only capacity records signed by one of
    # them or by this shard's own key count (SPEC §6.5 capacity fold rule 1).
    capacity_ledger_keys: tuple[bytes, ...] = ()

    @property
    def topic(self) -> str:
        """The topic every record of every placement travels on."""
        return self.settings.topic

    def owns(self, partition: int) -> bool:
        """True when this shard consumes ``partition``."""
        if self.partitions is not None:
            return partition in self.partitions
        return partition % self.shards == self.shard


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """A parsed ledger.toml."""

    ledger_id: str
    key_file: Path
    db: Path
    transport: Literal["local", "kafka"] = "local"
    local_dir: Path | None = None
    batch_max_records: int = DEFAULT_BATCH_MAX_RECORDS
    close: bool = True
    http: tuple[str, int] | None = ("127.0.0.1", 0)
    clock_ms: int | None = None
    arrival: Arrival = "log"
    # transport = "kafka": signature checks in a worker process (False: on threads).
    crypto_worker: bool = True
    kafka: KafkaConfig | None = None
    # SPEC §6.9: None when ledger.toml names no attestation root.
    attestation_roots: tuple[AttestationRoot, ...] | None = None
    ops_http: tuple[str, int] | None = None
    api_auditors: tuple[bytes, ...] = ()
    attest_interval_s: float = 10.0
    # TLS on the API: (certificate chain, private key), PEM files; None: plain HTTP.
    tls: tuple[Path, Path] | None = None

    @property
    def port_file(self) -> Path:
        """Where a running ledger writes its HTTP address (next to the DB)."""
        return port_file_for(self.db)


def shard_store(db: Path, shard: int, shards: int) -> Path:
    """The store of shard ``shard`` of ``shards`` run by ``ledger supervise`` (or ``ledger
    run --shard I/N``): ``data/ledger.duckdb`` -> ``data/ledger-s0of2.duckdb``. Its port
    file is ``<that store>.http.json``."""
    return db.with_name(f"{db.stem}-s{shard}of{shards}{db.suffix}")


def parse_shard(text: str) -> tuple[int, int]:
    """ "I/N" -> (I, N) with 0 <= I < N; ConfigError otherwise."""
    head, sep, tail = text.partition("/")
    if not sep or not head.isdigit() or not tail.isdigit():
        raise ConfigError(f"--shard {text!r}: expected I/N, e.g. 0/2")
    shard, shards = int(head), int(tail)
    if not 0 <= shard < shards <= MAX_SHARDS:
        raise ConfigError(f"--shard {text!r}: need 0 <= I < N <= {MAX_SHARDS}")
    return shard, shards


def shard_config(config: LedgerConfig, shard: int, shards: int) -> LedgerConfig:
    """The configuration of shard ``shard`` of ``shards`` derived from one ledger.toml.

    The shard owns the partitions p with p % shards == shard, keeps its own store
    (``shard_store``) and serves its HTTP API on the configured port + shard (port 0: any
    free port each, written to each store's own port file). A config that already names
    its partitions or a shard of several is refused: it describes one shard already."""
    if config.transport != "kafka" or config.kafka is None:
        raise ConfigError("shards need transport = 'kafka' (partitions are what they split)")
    if config.kafka.partitions is not None:
        raise ConfigError(
            "[kafka] partitions is set: that config is one shard already; remove it to shard"
        )
    if config.kafka.shards != 1:
        raise ConfigError(
            f"[kafka] shard/shards is set ({config.kafka.shard}/{config.kafka.shards}): that "
            "config is one shard already; remove shard and shards to shard it here"
        )
    http = config.http
    if http is not None and http[1] != 0:
        if http[1] + shards - 1 > 65535:
            raise ConfigError(
                f"http port {http[1]} + {shards - 1} shards passes 65535; choose a lower port"
            )
        http = (http[0], http[1] + shard)
    ops = config.ops_http
    if ops is not None and ops[1] != 0:
        if ops[1] + shards - 1 > 65535:
            raise ConfigError(
                f"ops_http port {ops[1]} + {shards - 1} shards passes 65535; choose a lower port"
            )
        ops = (ops[0], ops[1] + shard)
    return replace(
        config,
        db=shard_store(config.db, shard, shards),
        http=http,
        ops_http=ops,
        kafka=replace(config.kafka, shard=shard, shards=shards),
    )


def port_file_for(db: Path) -> Path:
    """The port file of the ledger that owns ``db``."""
    return db.with_name(db.name + ".http.json")


def parse_http(value: str) -> tuple[str, int] | None:
    """ "HOST:PORT" -> (host, port); "off" or "" -> None."""
    if value.strip().lower() in ("", "off", "none", "false"):
        return None
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"http = {value!r}: expected HOST:PORT (port 0 = any) or 'off'")
    return host.strip("[]"), int(port_text)


def _path(base: Path, value: Any, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty path string, got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _seconds(value: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{key} must be a number of seconds in {lo:g}..{hi:g}, got {value!r}")
    return float(value)


def _kafka(data: Any, base: Path) -> KafkaConfig:
    if not isinstance(data, dict):
        raise ConfigError("[kafka] must be a table")
    unknown = set(data) - _KAFKA_KEYS
    if unknown:
        raise ConfigError(
            "; ".join(unknown_key(k, _KAFKA_KEYS, table="kafka") for k in sorted(unknown))
        )
    bootstrap = data.get("bootstrap")
    if not isinstance(bootstrap, str) or not bootstrap:
        raise ConfigError("[kafka] bootstrap = 'HOST:PORT' is required")
    topic = data.get("topic", DEFAULT_TOPIC)
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"[kafka] topic must be a non-empty string, got {topic!r}")
    partitions: tuple[int, ...] | None = None
    if "partitions" in data:
        raw = data["partitions"]
        if not isinstance(raw, list) or not raw:
            raise ConfigError("[kafka] partitions must be a non-empty list of integers")
        partitions = tuple(sorted({_int(p, "[kafka] partitions", 0, 1 << 20) for p in raw}))
        if "shard" in data or "shards" in data:
            raise ConfigError("[kafka]: give either partitions or shard/shards, not both")
    shards = _int(data.get("shards", 1), "[kafka] shards", 1, 1 << 20)
    shard = _int(data.get("shard", 0), "[kafka] shard", 0, shards - 1)
    password: str | None = None
    if "sasl_password_file" in data:
        password_path = _path(base, data["sasl_password_file"], "sasl_password_file")
        try:
            password = password_path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {password_path}: {exc.strerror}") from exc
    cafile = _path(base, data["ssl_cafile"], "ssl_cafile") if "ssl_cafile" in data else None
    try:
        settings = KafkaSettings(
            bootstrap=bootstrap,
            topic=topic,
            security_protocol=str(data.get("security_protocol", "PLAINTEXT")),
            sasl_mechanism=data.get("sasl_mechanism"),
            sasl_username=data.get("sasl_username"),
            sasl_password=password,
            ssl_cafile=None if cafile is None else str(cafile),
        )
    except ValueError as exc:
        raise ConfigError(f"[kafka]: {exc}") from exc
    lo, hi = START_BACKOFF_RANGE_S
    initial_s = _seconds(
        data.get("start_backoff_initial_s", START_BACKOFF_INITIAL_S),
        "[kafka] start_backoff_initial_s",
        lo,
        hi,
    )
    max_s = _seconds(
        data.get("start_backoff_max_s", max(START_BACKOFF_MAX_S, initial_s)),
        "[kafka] start_backoff_max_s",
        initial_s,
        hi,
    )
    capacity_topic = data.get("capacity_topic")
    if capacity_topic is not None and (
        not isinstance(capacity_topic, str) or not capacity_topic or capacity_topic == topic
    ):
        raise ConfigError(
            f"[kafka] capacity_topic must be a non-empty string other than topic, got "
            f"{capacity_topic!r}"
        )
    return KafkaConfig(
        settings=settings,
        partitions=partitions,
        shard=shard,
        shards=shards,
        start_backoff_initial_s=initial_s,
        start_backoff_max_s=max_s,
        capacity_topic=capacity_topic,
        capacity_ledger_keys=_ledger_keys(data.get("capacity_ledger_keys", [])),
    )


def _ledger_keys(value: Any) -> tuple[bytes, ...]:
    """[kafka] capacity_ledger_keys: a list of base64 Ed25519 public keys (32 bytes each)."""
    where = "[kafka] capacity_ledger_keys"
    if not isinstance(value, list) or len(value) > MAX_CAPACITY_LEDGER_KEYS:
        raise ConfigError(f"{where} must be a list of at most {MAX_CAPACITY_LEDGER_KEYS} keys")
    keys = []
    for n, text in enumerate(value):
        try:
            key = base64.b64decode(str(text), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{where}[{n}] is not base64") from exc
        if len(key) != 32:
            raise ConfigError(f"{where}[{n}] is {len(key)} bytes, an Ed25519 key is 32")
        keys.append(key)
    return tuple(keys)


def config_from_mapping(data: Mapping[str, Any], base: Path) -> LedgerConfig:
    """Validate a ledger.toml mapping; every problem raises ConfigError naming the key."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError("; ".join(unknown_key(k, _TOP_KEYS) for k in sorted(unknown)))
    ledger_id = data.get("ledger_id")
    if not isinstance(ledger_id, str) or not ledger_id or "/" in ledger_id:
        raise ConfigError(f"ledger_id must be a non-empty name without '/', got {ledger_id!r}")
    transport = data.get("transport", "local")
    if transport not in ("local", "kafka"):
        raise ConfigError(f"transport must be 'local' or 'kafka', got {transport!r}")
    local_dir = _path(base, data["local_dir"], "local_dir") if "local_dir" in data else None
    if transport == "local" and local_dir is None:
        raise ConfigError("transport = 'local' needs local_dir")
    kafka = _kafka(data["kafka"], base) if "kafka" in data else None
    if transport == "kafka" and kafka is None:
        raise ConfigError("transport = 'kafka' needs a [kafka] table with bootstrap")
    close = data.get("close", True)
    if not isinstance(close, bool):
        raise ConfigError(f"close must be true or false, got {close!r}")
    http_value = data.get("http", DEFAULT_HTTP)
    if not isinstance(http_value, str):
        raise ConfigError(f"http must be a string 'HOST:PORT' or 'off', got {http_value!r}")
    ops_value = data.get("ops_http", "off")
    if not isinstance(ops_value, str):
        raise ConfigError(f"ops_http must be a string 'HOST:PORT' or 'off', got {ops_value!r}")
    clock = data.get("clock_ms")
    arrival = data.get("arrival", "log")
    if arrival not in ARRIVAL_MODES:
        raise ConfigError(
            f"arrival must be 'log' (the default) or 'sender' (simulations only), got {arrival!r}"
        )
    crypto_worker = data.get("crypto_worker", True)
    if not isinstance(crypto_worker, bool):
        raise ConfigError(f"crypto_worker must be true or false, got {crypto_worker!r}")
    return LedgerConfig(
        ledger_id=ledger_id,
        key_file=_path(base, data.get("key_file"), "key_file"),
        db=_path(base, data.get("db"), "db"),
        transport=transport,
        local_dir=local_dir,
        batch_max_records=_int(
            data.get("batch_max_records", DEFAULT_BATCH_MAX_RECORDS),
            "batch_max_records",
            1,
            MAX_BATCH_RECORDS,
        ),
        close=close,
        http=parse_http(http_value),
        clock_ms=None if clock is None else _int(clock, "clock_ms", 0, 2**53 - 1),
        arrival=arrival,
        crypto_worker=crypto_worker,
        kafka=kafka,
        attestation_roots=_roots(data["attestation_roots"])
        if "attestation_roots" in data
        else None,
        ops_http=parse_http(ops_value),
        api_auditors=_auditors(data.get("api_auditors", [])),
        tls=_tls(data, base),
        attest_interval_s=_seconds(
            data.get("attest_interval_s", 10.0), "attest_interval_s", *ATTEST_INTERVAL_RANGE_S
        ),
    )


def _tls(data: Mapping[str, Any], base: Path) -> tuple[Path, Path] | None:
    """tls_cert_file and tls_key_file: both (TLS on the API) or neither."""
    given = [k for k in ("tls_cert_file", "tls_key_file") if k in data]
    if not given:
        return None
    if len(given) == 1:
        raise ConfigError("tls_cert_file and tls_key_file go together: give both or neither")
    cert = _path(base, data["tls_cert_file"], "tls_cert_file")
    key = _path(base, data["tls_key_file"], "tls_key_file")
    return cert, key


def _auditors(data: Any) -> tuple[bytes, ...]:
    """api_auditors: a list of base64 Ed25519 public keys (32 bytes each)."""
    if not isinstance(data, list) or len(data) > MAX_API_AUDITORS:
        raise ConfigError(f"api_auditors must be a list of at most {MAX_API_AUDITORS} keys")
    keys: list[bytes] = []
    for i, text in enumerate(data):
        try:
            raw = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
        except binascii.Error:
            raw = b""
        if len(raw) != 32:
            raise ConfigError(f"api_auditors[{i}] is not a base64 32-byte Ed25519 public key")
        keys.append(raw)
    return tuple(keys)


def _roots(data: Any) -> tuple[AttestationRoot, ...]:
    """[[attestation_roots]]: id, alg ("EdDSA" | "ES384"), key (base64) each."""
    if not isinstance(data, list) or not 1 <= len(data) <= MAX_ATTESTATION_ROOTS:
        raise ConfigError(
            f"attestation_roots must be 1..{MAX_ATTESTATION_ROOTS} tables [[attestation_roots]]"
        )
    roots = []
    for i, entry in enumerate(data):
        where = f"attestation_roots[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"id", "alg", "key"}:
            raise ConfigError(f"{where} needs exactly id, alg and key")
        root_id, alg, key_text = entry["id"], entry["alg"], entry["key"]
        if not isinstance(root_id, str) or not root_id:
            raise ConfigError(f"{where}: id must be a non-empty string")
        if alg not in ("EdDSA", "ES384"):
            raise ConfigError(f"{where}: alg must be 'EdDSA' or 'ES384', got {alg!r}")
        try:
            key = base64.b64decode(str(key_text), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{where}: key is not base64") from exc
        if not root_key_ok(alg, key):
            raise ConfigError(f"{where}: key is not a {alg} public key")
        roots.append(AttestationRoot(root_id, alg, key))
    return tuple(roots)


def load_config(path: Path) -> LedgerConfig:
    """Read and validate ledger.toml."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return config_from_mapping(data, path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
