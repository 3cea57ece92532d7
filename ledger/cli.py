"""``gridledger ledger ...``: run the ledger, ask it for statements and exports.

Parties cosign checkpoints with ``gridledger witness run`` (SPEC §8.3), never through
the ledger's own tools.

    gridledger ledger run --config ledger.toml [--shard I/N]
    gridledger ledger supervise --shards N [--config ledger.toml]
    gridledger ledger statement PLACEMENT [--json] [--config ledger.toml]
    gridledger ledger list [--json] [--config ledger.toml]
    gridledger ledger export PLACEMENT --out FILE.duckdb [--parquet DIR] [--compact]
        [--since NOTE]
                             [--config ledger.toml]
    gridledger ledger export --all DIR [--compact] [--config ledger.toml]

The keys of ledger.toml are documented in ``ledger.config`` and
``deploy/ledger.example.toml``. statement/export use the HTTP API of the running
ledger when there is one (the DB has one writer) and open the DB directly otherwise;
``export --all`` writes DIR/<placement>.duckdb for every placement in one pass over the
DB and needs the ledger stopped.

``supervise --shards N`` runs ``run --shard I/N`` for I in 0..N-1 and keeps them running
(``ledger.supervise``). ``--shard I/N`` on run/statement/list/export means shard I of N
of that ledger.toml (``ledger.config.shard_config``): store ``<db stem>-s<I>of<N><suffix>``
(``ledger.duckdb`` -> ``ledger-s1of2.duckdb``), HTTP port = the configured port + I.
Exit codes: 0 done, 1 the request failed (unknown placement; for ``export --all``: some
placement could not be exported, each named on a SKIPPED line, the others written; for
``run``: it stopped on a failure it cannot go on from, its signature worker process gone
or a batch that failed to fold or commit, nothing of that batch stored), 2
unusable input (config, key file, store).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import structlog

from billview import render
from billview.doc import decode as decode_bill
from ledger.access import Access
from ledger.attest_loop import AttestLoop
from ledger.bill import bill_doc
from ledger.client import (
    ApiError,
    download_export,
    find_running,
    get_bill,
    get_placements,
    get_statement,
)
from ledger.config import ConfigError, LedgerConfig, load_config, parse_shard, shard_config
from ledger.consume import SourceError, SourceUnavailable
from ledger.crypto import CryptoWorkerError
from ledger.export import SinceRefused, export_all, export_placement, write_parquet
from ledger.http import LedgerApi, LedgerHttpServer, OpsBindError, TlsConfigError
from ledger.ingest import IngestBroken
from ledger.issuer import UnknownPlacement, statement_answer
from ledger.limits import (
    MAX_SHARDS,
    START_ATTEMPTS,
    START_BACKOFF_INITIAL_S,
    START_BACKOFF_MAX_S,
    SUPERVISE_BACKOFF_INITIAL_S,
    SUPERVISE_MAX_RESTARTS,
    SUPERVISE_RESTART_WINDOW_S,
)
from ledger.listing import placement_list, render_table
from ledger.service import KafkaLedgerService, LedgerService
from ledger.store import Store, StoreError
from proto.durable_io import read_at_most
from proto.errors import KeyFileError, ProtoError
from proto.invariant import present
from proto.keys import SigningKey, load_signing_key
from proto.note import MAX_NOTE_BYTES

# Exit code when Kafka stayed unreachable: try again later (sysexits EX_TEMPFAIL).
EX_TEMPFAIL = 75

log = structlog.get_logger("ledger.cli")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ledger`` and its subcommands."""
    ledger = subparsers.add_parser("ledger", help="the ledger service")
    sub = ledger.add_subparsers(dest="ledger_command", metavar="SUBCOMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, default=Path("ledger.toml"), help="ledger.toml")
        p.add_argument(
            "--shard",
            metavar="I/N",
            default=None,
            help="shard I of N of this config (as run by supervise): its store and port",
        )

    run = sub.add_parser("run", help="consume, fold, store; serve the HTTP API")
    with_config(run)
    run.set_defaults(handler=cmd_run)

    statement = sub.add_parser("statement", help="signed statement through the current head")
    statement.add_argument("placement", help="the placement id")
    statement.add_argument("--json", action="store_true", help="machine-readable output")
    with_config(statement)
    statement.set_defaults(handler=cmd_statement)

    _add_export(
        sub.add_parser("export", help="export one placement, or all (EXPORT.md)"), with_config
    )

    listing = sub.add_parser("list", help="every placement: status, records, window, parties")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    with_config(listing)
    listing.set_defaults(handler=cmd_list)

    supervise = sub.add_parser(
        "supervise", help="run N shard processes over disjoint partitions, restart the dead"
    )
    supervise.add_argument("--shards", type=int, required=True, metavar="N", help="processes")
    supervise.add_argument("--config", type=Path, default=Path("ledger.toml"), help="ledger.toml")
    supervise.add_argument(
        "--max-restarts",
        type=int,
        default=SUPERVISE_MAX_RESTARTS,
        metavar="K",
        help=f"restarts of one shard within the window before giving up ({SUPERVISE_MAX_RESTARTS})",
    )
    supervise.add_argument(
        "--restart-window",
        type=float,
        default=SUPERVISE_RESTART_WINDOW_S,
        metavar="S",
        help=f"the window in seconds ({SUPERVISE_RESTART_WINDOW_S:g})",
    )
    supervise.add_argument(
        "--backoff",
        type=float,
        default=SUPERVISE_BACKOFF_INITIAL_S,
        metavar="S",
        help=f"first restart delay, doubled per restart ({SUPERVISE_BACKOFF_INITIAL_S:g})",
    )
    supervise.set_defaults(handler=cmd_supervise)

    ledger.set_defaults(handler=lambda args: _usage(ledger))


def _add_export(
    export: argparse.ArgumentParser, with_config: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The options of ``ledger export``."""
    export.add_argument("placement", nargs="?", help="the placement id (or --all DIR)")
    export.add_argument("--out", type=Path, help="FILE.duckdb to write")
    export.add_argument(
        "--all",
        type=Path,
        metavar="DIR",
        dest="all_dir",
        help="export every placement to DIR/<placement>.duckdb (ledger stopped)",
    )
    export.add_argument(
        "--parquet",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write DIR/<table>/<placement>.parquet (glob DIR/<table>/*.parquet)",
    )
    export.add_argument(
        "--compact",
        action="store_true",
        help="DuckDB 1.2's storage with 16 KiB blocks: ~0.3 MiB instead of ~2.7 MiB for a "
        "small placement, the same tables and rows; DuckDB 1.2 and later read it "
        "(proto/EXPORT.md, Readers); needs the ledger stopped",
    )
    export.add_argument(
        "--since",
        type=Path,
        default=None,
        metavar="NOTE",
        help="only the records after this checkpoint note (one this ledger issued), with a "
        "consistency proof to it (SPEC §8.5); needs the ledger stopped",
    )
    with_config(export)
    export.set_defaults(handler=cmd_export)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(message: str, code: int) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return code


def _load(path: Path, shard: str | None = None) -> tuple[LedgerConfig, SigningKey]:
    config = _config(path, shard)
    return config, load_signing_key(config.key_file)


def _config(path: Path, shard: str | None) -> LedgerConfig:
    """ledger.toml, or shard I/N of it (``--shard I/N``)."""
    if shard is None:
        return load_config(path)
    index, count = parse_shard(shard)  # a bad --shard is named before any file is read
    config = load_config(path)
    try:
        return shard_config(config, index, count)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


# ---- run ----------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """``ledger run``: the daemon, until SIGTERM or SIGINT."""
    try:
        config = _config(args.config, args.shard)
        if config.transport == "local" and not (config.local_dir and config.local_dir.is_dir()):
            raise ConfigError(
                f"{args.config}: local_dir {config.local_dir} does not exist; create it or "
                "point local_dir at the directory the meters and publishers write"
            )
        service: LedgerService | KafkaLedgerService
        if config.transport == "local":
            service = LedgerService.from_config(config)
        else:
            service = KafkaLedgerService.from_config(config)
    except (ConfigError, KeyFileError, StoreError, SourceError, ValueError) as exc:
        return _fail(str(exc), 2)
    server: LedgerHttpServer | None = None
    attest: AttestLoop | None = None
    try:
        if config.http is not None:
            try:
                server = _api_server(config, service)
            except OpsBindError as exc:
                ops = present(config.ops_http, "ops_http")
                return _fail(_http_bind_failure(args.config, ops, exc, "ops_http"), 2)
            except OSError as exc:
                return _fail(_http_bind_failure(args.config, config.http, exc), 2)
            server.start()
        attest = AttestLoop(service.store, service.key, config.attest_interval_s)
        attest.start()
        if isinstance(service, LedgerService):
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            log.info("ledger_running", transport="local", db=str(config.db), arrival=config.arrival)
            service.run_forever(stop)
        else:
            try:
                # transport = "kafka" needs [kafka] (config_from_mapping)
                kafka = present(config.kafka, "the [kafka] table of a Kafka ledger")
                asyncio.run(
                    _run_kafka(service, kafka.start_backoff_initial_s, kafka.start_backoff_max_s)
                )
            except SourceUnavailable as exc:
                return _fail(f"{exc} (gave up after {START_ATTEMPTS} attempts)", EX_TEMPFAIL)
            except SourceError as exc:
                return _fail(str(exc), 2)
            except (CryptoWorkerError, IngestBroken) as exc:
                # Nothing of the failed batch was stored; a restart resumes after the
                # last committed one.
                return _fail(f"{exc}; restart the ledger: it resumes after its last batch", 1)
    except TlsConfigError as exc:
        return _fail(str(exc), 2)
    finally:
        if server is not None:
            server.stop()
        if attest is not None:
            attest.stop()
        service.close()
    return 0


def _api_server(
    config: LedgerConfig, service: LedgerService | KafkaLedgerService
) -> LedgerHttpServer:
    """The HTTP API of a running ledger (SPEC §8.4, §13), bound, not started yet: every
    request authenticated by ``Access``. OSError (OpsBindError) when an address is taken."""
    http = present(config.http, "http")
    api = LedgerApi(
        service.store,
        service.key,
        service.metrics,
        health=lambda: {
            "counts": service.store.counts(),
            "transport": config.transport,
            "arrival": config.arrival,
        },
        behind=service.behind_log if isinstance(service, KafkaLedgerService) else None,
        access=Access(
            service.store,
            service.key.public_key,
            frozenset(config.api_auditors),
            clock_s=lambda: int(time.time()),
        ),
    )
    return LedgerHttpServer(
        api, *http, port_file=config.port_file, ops=config.ops_http, tls=config.tls
    )


def _http_bind_failure(path: Path, http: tuple[str, int], exc: OSError, key: str = "http") -> str:
    """One line for an HTTP address the ledger cannot listen on (taken, not local, no
    permission), naming the config key that sets it (``http``, ``ops_http``) and the way
    out."""
    host, port = http
    why = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        why = "the port is already in use (another ledger, or another program)"
    return (
        f'{path}: {key} = "{host}:{port}": cannot listen there: {why}; stop what holds it, '
        f'or set {key} to a free port ("{host}:0" picks any free one) or "off"'
    )


async def _run_kafka(
    service: KafkaLedgerService,
    backoff_initial_s: float = START_BACKOFF_INITIAL_S,
    backoff_max_s: float = START_BACKOFF_MAX_S,
) -> None:
    """Start (START_ATTEMPTS tries, waits doubling from ``backoff_initial_s`` up to
    ``backoff_max_s``: [kafka] start_backoff_*), then run until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    delay_s = backoff_initial_s
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            await service.start()
            break
        except SourceUnavailable as exc:
            # A ledger restarted during a broker outage waits for it, within a bound.
            log.warning("kafka_unavailable", attempt=attempt, of=START_ATTEMPTS, error=str(exc))
            if attempt == START_ATTEMPTS:
                raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)
            if stop.is_set():
                return
            delay_s = min(delay_s * 2, backoff_max_s)
    try:
        log.info(
            "ledger_running",
            transport="kafka",
            partitions=service.source.partitions,
            arrival=service.arrival,
        )
        await service.run_forever(stop)
    finally:
        await service.stop()


# ---- statement ---------------------------------------------------------------------------------


def _print_statement(body: dict[str, Any], bill: bytes | None) -> None:
    """``--json``: the signed statement's fields; otherwise the bill, line by line with
    each derivation (``billview.render.to_text``)."""
    if bill is None:
        print(json.dumps(body, sort_keys=True, indent=2))
        return
    print(render.to_text(decode_bill(bill)), end="")


def _faulted(placement_id: str, exc: ProtoError) -> int:
    """SPEC §7.7: one placement's stored record that does not decode (a total past
    2^53 - 1 a ledger older than the bounds stored): one line, not a traceback."""
    return _fail(
        f"placement {placement_id}: a stored record does not decode ({exc}); it cannot be "
        "signed or exported as it is (SPEC §7.7); the other placements are not affected",
        1,
    )


# What a command on one placement (statement, export) answers in one line: bad input or
# store, an export's --since refused (exit 2), an unknown placement or the running
# ledger's refusal (1), a stored record that does not decode (1, ``_faulted``).
_PLACEMENT_ERRORS: Final = (
    ConfigError,
    KeyFileError,
    StoreError,
    SinceRefused,
    UnknownPlacement,
    ApiError,
    ProtoError,
)


def _placement_failed(placement_id: str, exc: Exception) -> int:
    """The line and exit code of one of ``_PLACEMENT_ERRORS``."""
    if isinstance(exc, ConfigError | KeyFileError | StoreError | SinceRefused):
        return _fail(str(exc), 2)
    if isinstance(exc, ProtoError):
        return _faulted(placement_id, exc)
    return _fail(str(exc), 1)


def _require_store(config: LedgerConfig, config_path: Path) -> None:
    """A stopped ledger's store is opened directly; one that was never started has none."""
    if not config.db.exists():
        raise StoreError(
            f"there is no ledger store at {config.db} yet: start the ledger first "
            f"(gridledger ledger run --config {config_path})"
        )


def cmd_statement(args: argparse.Namespace) -> int:
    """``ledger statement``: through the API if the ledger runs, else from the DB."""
    try:
        config, key = _load(args.config, args.shard)
        base = find_running(config)
        bill: bytes | None = None
        if base is not None:
            body = get_statement(base, args.placement, key)
            if not args.json:
                bill = get_bill(base, args.placement, key)
        else:
            _require_store(config, args.config)
            with Store(config.db, ledger_public_key=key.public_key) as store:
                body = statement_answer(store, args.placement)
                if not args.json:
                    bill = render.to_json(bill_doc(store, key, args.placement))
    except _PLACEMENT_ERRORS as exc:
        return _placement_failed(args.placement, exc)
    _print_statement(body, bill)
    return 0


# ---- list ------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """``ledger list``: through the API if the ledger runs, else from the DB."""
    try:
        config, key = _load(args.config, args.shard)
        base = find_running(config)
        if base is not None:
            placements = get_placements(base, key)
        else:
            _require_store(config, args.config)
            with Store(config.db, ledger_public_key=key.public_key) as store:
                placements = placement_list(store)
    except (ConfigError, KeyFileError, StoreError) as exc:
        return _fail(str(exc), 2)
    except ApiError as exc:
        return _fail(str(exc), 1)
    if args.json:
        print(json.dumps({"placements": placements}, sort_keys=True, indent=2))
    else:
        for line in render_table(placements):
            print(line)
    return 0


# ---- export ------------------------------------------------------------------------------------


def _read_note(path: Path) -> str:
    """The text of the checkpoint note file ``path`` (``export --since``)."""
    try:
        raw = read_at_most(path, MAX_NOTE_BYTES)
    except OSError as exc:
        raise SinceRefused(f"--since: cannot read {path}: {exc.strerror}") from exc
    if len(raw) > MAX_NOTE_BYTES:
        raise SinceRefused(f"--since: {path} is larger than a note ({MAX_NOTE_BYTES} bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SinceRefused(f"--since: {path} is not UTF-8 text") from exc


def cmd_export(args: argparse.Namespace) -> int:
    """``ledger export``: the export file (and Parquet tables) of one placement, or all."""
    if args.all_dir is not None:
        return _export_all(args)
    if args.placement is None or args.out is None:
        return _fail("export needs PLACEMENT --out FILE.duckdb, or --all DIR", 2)
    try:
        config, key = _load(args.config, args.shard)
        base = find_running(config)
        if base is not None and args.compact:
            return _fail(
                "--compact: the running ledger serves exports in the DuckDB 1.0 format; "
                "stop it to write a compact one, or leave out --compact",
                2,
            )
        if base is not None and args.since is not None:
            return _fail("--since: the running ledger serves whole exports; stop it first", 2)
        since = None if args.since is None else _read_note(args.since)
        if base is not None:
            download_export(base, args.placement, args.out, key)
            if args.parquet is not None:
                write_parquet(args.out, args.parquet)
        else:
            _require_store(config, args.config)
            export_placement(
                config.db,
                args.placement,
                args.out,
                key=key,
                parquet_dir=args.parquet,
                compact=args.compact,
                since=since,
            )
    except _PLACEMENT_ERRORS as exc:
        return _placement_failed(args.placement, exc)
    print(f"OK: exported {args.placement} to {args.out}")
    return 0


def _export_all(args: argparse.Namespace) -> int:
    if args.placement is not None or args.out is not None or args.parquet is not None:
        return _fail("--all DIR takes no PLACEMENT, --out or --parquet", 2)
    try:
        config, key = _load(args.config, args.shard)
        if find_running(config) is not None:
            return _fail(
                "the ledger is running: export --all reads its store directly; stop it, "
                "or export placements one at a time (export PLACEMENT --out FILE)",
                1,
            )
        _require_store(config, args.config)
        done = export_all(config.db, args.all_dir, key=key, compact=args.compact)
    except (ConfigError, KeyFileError, StoreError) as exc:
        return _fail(str(exc), 2)
    except UnknownPlacement as exc:
        return _fail(str(exc), 1)
    except OSError as exc:
        return _fail(f"cannot write the exports to {args.all_dir}: {exc}", 2)
    print(f"OK: exported {len(done.written)} placement(s) to {args.all_dir}")
    for placement_id, why in sorted(done.skipped.items()):
        print(f"SKIPPED: {placement_id}: {why}")
    return 0 if not done.skipped else 1


# ---- supervise ---------------------------------------------------------------------------------


def cmd_supervise(args: argparse.Namespace) -> int:
    """``ledger supervise``: N shard processes of one ledger.toml (``ledger.supervise``)."""
    from ledger.supervise import RestartPolicy, SuperviseError, check_shards, supervise

    if args.max_restarts < 0 or args.restart_window <= 0 or args.backoff < 0:
        return _fail("--max-restarts >= 0, --restart-window > 0 and --backoff >= 0 please", 2)
    if not 1 <= args.shards <= MAX_SHARDS:  # the arguments first, then the files
        return _fail(f"--shards {args.shards}: give 1 to {MAX_SHARDS} shards", 2)
    try:
        config, _key = _load(args.config)
        configs = check_shards(config, args.shards, args.config)
    except (ConfigError, KeyFileError, SuperviseError) as exc:
        return _fail(str(exc), 2)
    passthrough: list[str] = []
    for option, value in (
        ("--log-format", getattr(args, "log_format", None)),
        ("--log-level", getattr(args, "log_level", None)),
    ):
        if value is not None:
            passthrough += [option, value]
    policy = RestartPolicy(
        max_restarts=args.max_restarts,
        window_s=args.restart_window,
        backoff_initial_s=args.backoff,
    )
    code, line = supervise(args.config, configs, policy, passthrough)
    if line is not None:
        return _fail(line, code)
    return code
