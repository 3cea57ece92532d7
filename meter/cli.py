"""``gridledger meter run``: the node agent as a process.

    gridledger meter run --config meter.toml [--simulate SPEC] [--duration-s N | --until-ms T]

* Without ``--until-ms`` the agent follows the wall clock (shifted by the spec's
  ``skew_ms`` when simulating) until SIGTERM/SIGINT, ``--duration-s`` seconds, or the
  end of every placement window.
* ``--until-ms T`` (simulation only) runs on a simulated clock from the earliest window
  start to T, as fast as it can (``pace_ms`` in the spec slows it down): an hour of
  placement in seconds. A restarted run continues the streams where the spool left them.
  Its shipper states each event's simulated send time as the producer timestamp (its
  interval's end, less the spec's ``skew_ms``): the arrival time of a simulation's
  ledger with ``arrival = "sender"`` on a ``CreateTime`` topic (SPEC §6.6).

Keys of meter.toml: see ``meter.config``. Logs are structured (structlog; JSON when
stderr is not a terminal). Counters are Prometheus metrics in the agent's own registry
(served on ``metrics_listen`` if set) and logged every STATS_LOG_INTERVAL_S and at exit.

Exit codes: 0 done (in Kafka mode: everything spooled was acknowledged); 2 unusable
configuration, key, terms or GPU library; 75 (EX_TEMPFAIL) the spool is full, or events
are still waiting in it at exit because Kafka did not acknowledge them in time.

**Spool-full policy.** The spool has a byte bound (``spool_max_bytes``). When the next
events would pass it, the agent logs an error, sets ``meter_spool_full`` to 1, lets the
shipper drain for a bounded time and exits with 75. It never drops or overwrites signed
data: the events not written are built again, with the same seq, after the restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from meter.agent import Agent, AgentConfig, AgentConfigError
from meter.allocation import build_allocation_source
from meter.clock import Clock, RealClock, SimClock, SkewedClock
from meter.config import ConfigError, MeterConfig, load_meter_config
from meter.limits import SHIP_DRAIN_TIMEOUT_S, SIGNAL_DRAIN_TIMEOUT_S, STATS_LOG_INTERVAL_S
from meter.metrics import MeterMetrics
from meter.shipper import Shipper, simulated_send_ms
from meter.sim import SimDevice, SimSpec, SimSpecError, Simulator, parse_sim_spec
from meter.sources import GpuSource
from meter.stream import node_gpus
from proto.authority import role_keys, signers
from proto.envelope import check_signatures, open_envelope
from proto.errors import KeyFileError, ProtoError
from proto.keys import load_signing_key
from proto.records import PlacementTerms, StreamResume
from proto.terms import TermsError, load_terms_file, terms_signature_problem, validate_terms
from proto.utc import iso_utc
from transport.spool import SpoolCorrupt, SpoolFull, SpoolLocked

__all__ = ["EX_CONFIG", "EX_OK", "EX_TEMPFAIL", "build_agent", "load_terms", "register"]

EX_OK: Final = 0
EX_CONFIG: Final = 2
EX_TEMPFAIL: Final = 75
MAX_WAIT_S: Final = 1.0  # longest sleep of the wall-clock loop (stop and stats stay timely)

_log = structlog.get_logger("meter.cli")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``meter run`` to the gridledger command."""
    meter = subparsers.add_parser("meter", help="the node agent: sign, spool and ship usage")
    sub = meter.add_subparsers(dest="meter_command", metavar="SUBCOMMAND")
    run = sub.add_parser("run", help="run the node agent")
    run.add_argument("--config", type=Path, required=True, help="meter.toml")
    run.add_argument(
        "--simulate", metavar="SPEC", help="simulated GPUs (grammar: meter/sim.py), e.g. seed=7"
    )
    until = run.add_mutually_exclusive_group()
    until.add_argument("--duration-s", type=float, help="stop after N seconds of wall time")
    until.add_argument(
        "--until-ms", type=int, help="simulated clock: run from the window start to T, fast"
    )
    run.set_defaults(handler=_run)
    notice = sub.add_parser(
        "notice",
        help="show a signed reclaim to this node's workloads (meter/notice.py)",
    )
    notice.add_argument("reclaim", type=Path, metavar="RECLAIM.json", help="the signed reclaim")
    notice.add_argument("--config", type=Path, required=True, help="meter.toml")
    notice.set_defaults(handler=_notice)
    serve = sub.add_parser(
        "notice-serve", help="answer GET /reclaim on loopback from the node's notice file"
    )
    serve.add_argument("--config", type=Path, required=True, help="meter.toml")
    serve.add_argument(
        "--listen",
        default="127.0.0.1:9741",
        metavar="HOST:PORT",
        help="where to answer GET /reclaim (default 127.0.0.1:9741; keep it on loopback)",
    )
    serve.add_argument("--duration-s", type=float, help="stop after N seconds (tests)")
    serve.set_defaults(handler=_notice_serve)

    def _help(_: argparse.Namespace) -> int:
        meter.print_help(sys.stderr)
        return EX_CONFIG

    meter.set_defaults(handler=_help)


# ---- setup ------------------------------------------------------------------------------


def _configure_logging() -> None:
    if structlog.is_configured():  # by `gridledger --log-format ...` (gridledger/logs.py)
        return
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer()
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def load_terms(paths: tuple[Path, ...]) -> tuple[PlacementTerms, ...]:
    """Signed terms files: every one fully signed by its three parties and valid."""
    problems: list[str] = []
    loaded: list[PlacementTerms] = []
    for path in paths:
        try:
            terms, envelope = load_terms_file(path)
        except TermsError as exc:
            problems.extend(exc.problems)
            continue
        if envelope is None:
            problems.append(f"{path}: unsigned TOML terms; the agent meters signed terms only")
            continue
        failure = terms_signature_problem(envelope, terms)
        if failure is not None:
            problems.append(f"{path}: {failure}")
            continue
        problems.extend(f"{path}: {p}" for p in validate_terms(terms))
        loaded.append(terms)
    if problems:
        raise TermsError(problems)
    return tuple(loaded)


def load_resumes(
    paths: tuple[Path, ...], node_id: str, terms: tuple[PlacementTerms, ...]
) -> tuple[tuple[StreamResume, str], ...]:
    """The signed resumes of meter.toml's resume_files (SPEC §6.3 resume), each with its
    record hash; TermsError lists every file that is not a resume of this node's stream
    in a placement the agent meters, signed by the terms' operator and buyer."""
    problems: list[str] = []
    loaded: list[tuple[StreamResume, str]] = []
    by_placement = {t.placement_id: t for t in terms}
    for path in paths:
        try:
            opened = open_envelope(path.read_bytes().rstrip(b"\n"))
        except OSError as exc:
            problems.append(f"{path}: cannot read it: {exc.strerror}")
            continue
        except ProtoError as exc:
            problems.append(f"{path}: not a signed record: {exc}")
            continue
        record = opened.record
        if not isinstance(record, StreamResume):
            problems.append(f"{path}: a {opened.kind} record, not a resume (gridledger resume)")
            continue
        placement = by_placement.get(record.placement_id)
        if record.node_id != node_id or placement is None:
            problems.append(
                f"{path}: resumes node {record.node_id} of {record.placement_id}; this agent "
                f"is node {node_id} of {', '.join(sorted(by_placement)) or 'no placement'}"
            )
            continue
        wanted = role_keys(placement, signers(placement, record)[0], record)
        report = check_signatures(opened.envelope, wanted)
        failure = report.failure()
        if failure is not None:
            problems.append(f"{path}: {failure.detail} (operator and buyer sign a resume)")
            continue
        loaded.append((record, opened.record_hash))
    if problems:
        raise TermsError(problems)
    return tuple(loaded)


def _sim_devices(node_id: str, terms: tuple[PlacementTerms, ...]) -> list[SimDevice]:
    devices: dict[str, SimDevice] = {}
    for placement in terms:
        for gpu in node_gpus(placement, node_id):
            devices.setdefault(gpu.uuid, SimDevice(gpu.uuid, gpu.model, gpu.memory_mib))
    return [devices[u] for u in sorted(devices)]


def _epoch_ms(node_id: str, terms: tuple[PlacementTerms, ...]) -> int:
    mine = [t.window_start_ms for t in terms if any(n.node_id == node_id for n in t.nodes)]
    return min(mine or [t.window_start_ms for t in terms])


def _uuid_of_index(source: GpuSource) -> Callable[[int], str | None]:
    """GPU index -> uuid for Slurm (NVML's order; a simulator's device order)."""
    if isinstance(source, Simulator):
        devices = source.devices
        return lambda i: devices[i].uuid if 0 <= i < len(devices) else None
    by_index = getattr(source, "uuid_of_index", None)
    return by_index if callable(by_index) else (lambda i: None)


def build_agent(
    config: MeterConfig, spec: SimSpec | None, clock: Clock, metrics: MeterMetrics
) -> Agent:
    """The agent of a checked config: key, terms, source and spool (raises on problems)."""
    key = load_signing_key(config.key_file)
    terms = load_terms(config.terms)
    source: GpuSource
    if spec is not None:
        source = Simulator(
            spec,
            _sim_devices(config.node_id, terms),
            _epoch_ms(config.node_id, terms),
            node_id=config.node_id,
        )
    else:
        from meter.nvml import NvmlSource

        source = NvmlSource()
    agent_config = AgentConfig(
        node_id=config.node_id,
        signing_key=key,
        terms=terms,
        spool_dir=config.spool_dir,
        interval_ms=config.interval_ms,
        spool_max_bytes=config.spool_max_bytes,
        segment_max_bytes=config.segment_max_bytes,
        delivered_on_spool=config.transport != "kafka",
        collect_read=config.transport != "kafka",
        key_rebound=config.key_rebound,
        resumes=load_resumes(config.resume_files, config.node_id, terms),
    )
    try:
        allocation = build_allocation_source(
            config.allocation,
            kubelet_socket=config.kubelet_socket,
            slurm_node=config.slurm_node,
            uuid_of_index=_uuid_of_index(source),
            slurm_prolog_dir=config.slurm_prolog_dir,
        )
        return Agent(agent_config, source, clock, metrics=metrics, allocation=allocation)
    except BaseException:
        source.close()
        raise


# ---- the process ------------------------------------------------------------------------


def _fail(problem: str) -> None:
    """One ``FAIL:`` line on stderr, as every gridledger command answers bad input."""
    print(f"FAIL: {problem}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    _configure_logging()
    try:
        config = load_meter_config(args.config)
        spec_text = args.simulate if args.simulate is not None else None
        if spec_text is None and config.source == "simulate":
            spec_text = config.simulate
        spec = parse_sim_spec(spec_text) if spec_text is not None else None
        if args.until_ms is not None and spec is None:
            raise ConfigError(["--until-ms needs a simulated source (--simulate SPEC)"])
        parent = config.spool_dir.parent
        if not parent.is_dir():
            where = "local_dir" if config.transport == "local" else "the parent of spool_dir"
            raise ConfigError(
                [
                    f"{args.config}: {where} {parent} does not exist; create it (the agent "
                    "creates only its own spool directory inside it)"
                ]
            )
    except (ConfigError, SimSpecError) as exc:
        for problem in getattr(exc, "problems", [str(exc)]):
            _fail(problem if problem.startswith(str(args.config)) else f"{args.config}: {problem}")
        return EX_CONFIG
    metrics = MeterMetrics()
    sim_clock: SimClock | None = None
    clock: Clock
    if args.until_ms is not None:
        sim_clock = SimClock(0)
        clock = sim_clock
    else:
        clock = SkewedClock(RealClock(), spec.skew_ms) if spec is not None else RealClock()
    try:
        if sim_clock is not None:
            sim_clock.set(_epoch_ms(config.node_id, load_terms(config.terms)))
        agent = build_agent(config, spec, clock, metrics)
    except (
        KeyFileError,
        TermsError,
        AgentConfigError,
        SimSpecError,
        SpoolLocked,
        SpoolCorrupt,
    ) as exc:
        for problem in getattr(exc, "problems", [str(exc)]):
            _fail(f"{args.config}: the agent cannot start: {problem}")
        return EX_CONFIG
    except Exception as exc:  # the GPU library (NVML) could not start
        _fail(
            f"{args.config}: the agent cannot start: {type(exc).__name__}: {exc} "
            '(no GPU library here? source = "simulate" runs without one)'
        )
        return EX_CONFIG
    if config.metrics_listen is not None:
        from prometheus_client import start_http_server

        start_http_server(
            config.metrics_listen[1], addr=config.metrics_listen[0], registry=metrics.registry
        )
    _log.info(
        "agent_started",
        node=config.node_id,
        streams=len(agent.heads),
        transport=config.transport,
        spool=str(config.spool_dir),
        simulate=spec.text if spec is not None else None,
    )
    try:
        return asyncio.run(_serve(agent, config, spec, sim_clock, args, metrics))
    finally:
        agent.close()
        _log.info("agent_stopped", **metrics.snapshot())


def _simulated_stamp(spec: SimSpec) -> Callable[[bytes], int | None]:
    """The producer timestamp of a simulated agent's records: ``simulated_send_ms``."""
    return lambda envelope: simulated_send_ms(envelope, spec.skew_ms)


async def _serve(
    agent: Agent,
    config: MeterConfig,
    spec: SimSpec | None,
    sim_clock: SimClock | None,
    args: argparse.Namespace,
    metrics: MeterMetrics,
) -> int:
    stop = asyncio.Event()
    abort = asyncio.Event()
    ship_task: asyncio.Task[bool] | None = None
    ship_stop = asyncio.Event()
    shipper = _shipper(agent, config, spec if sim_clock is not None else None, metrics)
    if shipper is not None:
        ship_task = asyncio.create_task(
            shipper.run(ship_stop, drain_timeout_s=SHIP_DRAIN_TIMEOUT_S)
        )
    _on_signals(stop, abort, draining=shipper is not None)
    crash_after = spec.crash_after if spec is not None else None
    pace_s = (spec.pace_ms if spec is not None else 0) / 1000
    deadline = time.monotonic() + args.duration_s if args.duration_s is not None else None
    emitted = 0
    over_at_start = False
    next_stats = time.monotonic() + STATS_LOG_INTERVAL_S
    code = EX_OK

    def emit() -> None:
        nonlocal emitted
        envelopes = agent.tick()
        if envelopes:
            emitted += len(envelopes)
            if shipper is not None:
                shipper.wake()
            if crash_after is not None and emitted >= crash_after:
                _log.warning("simulated_crash", events=emitted)
                os.kill(os.getpid(), signal.SIGKILL)

    try:
        while not stop.is_set():
            if time.monotonic() >= next_stats:
                _log.info("agent_stats", **metrics.snapshot())
                next_stats = time.monotonic() + STATS_LOG_INTERVAL_S
            due = agent.next_due_ms()
            if sim_clock is not None:
                if due is None or due > args.until_ms:
                    sim_clock.set(max(sim_clock.now_ms(), args.until_ms))
                    emit()
                    break
                sim_clock.set(max(sim_clock.now_ms(), due))
                emit()
                await asyncio.sleep(pace_s)  # also lets the shipper run
                continue
            emit()
            if due is None:
                _log.info("all_windows_over")
                over_at_start = emitted == 0
                break
            wait_s = min(MAX_WAIT_S, max(0.0, (due - agent.now_ms()) / 1000))
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait_s = min(wait_s, remaining)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await stop.wait()
    except SpoolFull as exc:
        metrics.spool_full.set(1)
        _log.error("spool_full", error=str(exc), policy="exit 75; no signed data dropped")
        code = EX_TEMPFAIL
    finally:
        ship_stop.set()
        drained = ship_task is None or await _drained(ship_task, abort)
        if not drained and shipper is not None:
            _log.error(
                "spool_not_drained",
                pending=shipper.pending(),
                kept="in the spool; the next start ships it",
            )
            code = EX_TEMPFAIL
    if over_at_start and code == EX_OK:
        return _over_at_start(args.config, agent)
    return code


# ---- reclaim notices (meter/notice.py) ---------------------------------------------------


def _notice(args: argparse.Namespace) -> int:
    """``meter notice RECLAIM.json``: check it against the metered terms, write the file."""
    from meter.notice import NoticeRefused, check_notice, notice_path, write_notice

    try:
        config = load_meter_config(args.config)
        terms = load_terms(config.terms)
        raw = args.reclaim.read_bytes()
    except (ConfigError, TermsError) as exc:
        print(f"FAIL: {'; '.join(exc.problems)}", file=sys.stderr)
        return EX_CONFIG
    except OSError as exc:
        print(f"FAIL: cannot read {args.reclaim}: {exc.strerror}", file=sys.stderr)
        return EX_CONFIG
    try:
        notice = check_notice(raw, terms, config.node_id)
    except NoticeRefused as exc:
        print(f"FAIL: {args.reclaim}: {exc}", file=sys.stderr)
        return 1
    path = notice_path(config.spool_dir)
    write_notice(path, notice)
    print(f"OK: reclaim {notice.reclaim_id} of {', '.join(notice.gpus)} shown at {path}")
    return EX_OK


def _notice_serve(args: argparse.Namespace) -> int:
    """``meter notice-serve``: GET /reclaim on loopback until stopped."""
    import threading

    from meter.notice import NoticeServer, notice_path

    try:
        config = load_meter_config(args.config)
    except ConfigError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return EX_CONFIG
    host, _, port = str(args.listen).rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        print(f"FAIL: --listen {args.listen!r}: expected HOST:PORT", file=sys.stderr)
        return EX_CONFIG
    try:
        server = NoticeServer(notice_path(config.spool_dir), host.strip("[]"), int(port))
    except OSError as exc:
        print(f"FAIL: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return EX_CONFIG
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"OK: reclaim notices at {server.url}/reclaim", flush=True)
    try:
        stop.wait(args.duration_s)
    finally:
        server.stop()
    return EX_OK


def _shipper(
    agent: Agent, config: MeterConfig, simulated: SimSpec | None, metrics: MeterMetrics
) -> Shipper | None:
    """The shipper of a Kafka meter (None on the embedded transport)."""
    if config.transport != "kafka" or config.kafka is None:
        return None
    return Shipper(
        config.spool_dir,
        config.kafka,
        metrics=metrics,
        collect_garbage=agent.collect_garbage,
        now_ms=agent.now_ms,
        # A simulation states the simulated time it sent each event (SPEC §6.6).
        stamp=_simulated_stamp(simulated) if simulated is not None else None,
    )


def _on_signals(stop: asyncio.Event, abort: asyncio.Event, *, draining: bool) -> None:
    """SIGTERM/SIGINT stop the agent, said in a log line: the shipper drains for at most
    SIGNAL_DRAIN_TIMEOUT_S (then ``abort``); a second signal aborts the drain at once."""
    loop = asyncio.get_running_loop()
    heard: list[str] = []

    def on_signal(signum: signal.Signals) -> None:
        heard.append(signum.name)
        if len(heard) == 1:
            loop.call_later(SIGNAL_DRAIN_TIMEOUT_S, abort.set)
            _log.warning(
                "stop_requested",
                signal=signum.name,
                drain_s=SIGNAL_DRAIN_TIMEOUT_S if draining else 0,
                note="a second signal stops at once; what is not shipped stays spooled",
            )
        else:
            abort.set()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


def _over_at_start(config_path: Path, agent: Agent) -> int:
    """A meter started after every window of its terms: one line, exit 2."""
    last_ms = max(t.window_end_ms for t in agent.config.terms)
    _fail(
        f"{config_path}: every placement window in its terms is over (the last ended "
        f"{iso_utc(last_ms)}): nothing to meter; give it the terms of a current placement"
    )
    return EX_CONFIG


async def _drained(ship_task: asyncio.Task[bool], abort: asyncio.Event) -> bool:
    """The shipper's drain result (bounded by its own drain timeout), unless ``abort`` is
    set first (a signal's drain bound passed, or a second signal): then the drain is
    cancelled and the answer is False."""
    waiter = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({ship_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if ship_task.done():
        return ship_task.result()
    ship_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ship_task
    return False
