"""Benchmark: verify a 1M-usage-event export offline, next to the machine's verify limit.

    .venv/bin/python bench/verifier_1m.py [--events 1000000] [--pools thread,process]
    .venv/bin/python bench/verifier_1m.py --events 50000 --pools process --against DIR
    .venv/bin/python bench/verifier_1m.py --events 200000 --pools process --tamper mixed

1. Builds (once; cached under ~/.cache/gridledger/bench/) an honest export of one
   placement: 100 nodes x 1 GPU, one-minute usage events, chain-ordered minute by minute,
   each event Ed25519-signed (signing spread over processes), each LedgerRecord unsigned
   (export format version 2, SPEC §8; ``--format-version 1``: signed too), then a close,
   statements and checkpoints (one at the head). Written to a temporary file and renamed.
2. Measures, in the same run, the machine's Ed25519 verification rate with pynacl: one
   process, and two processes (the limit the verifier is compared with).
3. Runs ``python -m verifier FILE --trust TRUST --json --pool P`` in a child process for
   each pool kind, and reports wall time, usage events/s, signatures/s, the ratio of
   signatures/s to the two-process limit, the CPU the child and its workers used per
   usage event (os.wait4; steadier than wall time on a shared machine) next to the CPU
   its two signature checks take (their quotient is the ratio the run would reach with
   both cores its own), the load average, and the child's peak RSS.

In a version-2 export every usage event needs one signature check (the node's; its
LedgerRecord is covered by the checkpoint), in version 1 two (also the ledger's on the
record), so events/s is at most the signature rate over the checks per event; the ratio
is given for signatures/s and for events/s. No asserts: this prints numbers.

``--tamper mixed`` verifies a copy of the export with scattered tampering instead (rows
edited, deleted, duplicated and re-statused; a deleted usage event makes the rest of its
node's stream disagree): the report is a fail with many findings, and CPU per usage event
should stay near the honest export's. A verifier whose work grows with size x findings
(one was found: 200k events took > 15 min) shows here as CPU per event growing with
``--events``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_verifier_exports import DDL, Pricer, write_trust  # noqa: E402

from devtools.builders import closed, gpu, make_cast, make_terms, sample, signed_terms  # noqa: E402
from proto.canonical import signed_bytes  # noqa: E402
from proto.cosign import cosign  # noqa: E402
from proto.envelope import (  # noqa: E402
    Envelope,
    encode_envelope,
    open_envelope,
    sha256_hex,
    sign_payload,
)
from proto.keys import SigningKey, verify  # noqa: E402
from proto.merkle import leaf_hash  # noqa: E402
from proto.note import checkpoint_body, checkpoint_origin, sign_note  # noqa: E402
from proto.records import (  # noqa: E402
    ZERO_HASH,
    Checkpoint,
    LedgerRecord,
    Statement,
    UsageEvent,
)
from verifier.merkle_stream import CompactRange  # noqa: E402

CACHE = Path.home() / ".cache" / "gridledger" / "bench"
NODES = 100
MINUTE_MS = 60_000
T0 = 1_700_000_000_000
CHUNK = 20_000  # events signed per round trip to the signing processes
SEED = "bench-verifier-1m"

# ---- signing workers -------------------------------------------------------------------

_KEYS: dict[str, SigningKey] = {}


def _init_signer(seeds: dict[str, bytes]) -> None:
    _KEYS.update({name: SigningKey(name, seed) for name, seed in seeds.items()})


def _sign(items: Sequence[tuple[str, bytes]]) -> list[bytes]:
    return [encode_envelope(sign_payload(payload, [_KEYS[name]])) for name, payload in items]


def _split(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


# ---- the export --------------------------------------------------------------------------


def build_export(events: int, out: Path, trust_out: Path, format_version: str = "2") -> None:
    """Write an honest export with ``events`` usage events to ``out`` (via a temp file);
    LedgerRecords signed only in ``format_version`` 1."""
    minutes = -(-events // NODES)
    cast = make_cast(SEED)
    gpus = [gpu(f"n{n:03d}", 0) for n in range(NODES)]
    window_ms = max(minutes, 60) * MINUTE_MS
    terms = make_terms(cast, "p-bench", gpus, T0, T0 + window_ms, late_grace_ms=0)
    node_keys = {g.node_id: cast.node_key(g.node_id) for g in gpus}
    seeds = {k.name: k.seed for k in (*node_keys.values(), cast.ledger)}
    tmp = out.with_name(out.name + ".tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    for ddl in DDL:
        con.execute(ddl)
    pricer = Pricer(terms)
    compact = CompactRange()
    checkpoint_sizes = {events // 2, events + 2}
    statement_at = {events // 2, events + 1}
    heads: dict[int, tuple[str, LedgerRecord]] = {}
    roots: dict[int, bytes] = {}
    prev_record = ZERO_HASH
    stream_prev = {n: ZERO_HASH for n in node_keys}
    usage_app = con.appender("usage_events")
    record_app = con.appender("ledger_records")
    index = 0

    def chain(raws: list[bytes], records_out: list[tuple[str, bytes]]) -> list[LedgerRecord]:
        nonlocal prev_record, index
        made: list[LedgerRecord] = []
        for raw in raws:
            opened = open_envelope(raw)
            own = pricer.apply(opened.record)
            record = LedgerRecord(
                placement_id="p-bench",
                index=index,
                prev=prev_record,
                kind=opened.kind,  # type: ignore[arg-type]
                source=opened.input_hash,
                status="accepted",
                reason="",
                delivered_mgms=own,
                totals=pricer.totals(),
            )
            payload = signed_bytes(record)
            prev_record = sha256_hex(payload)
            compact.append(leaf_hash(payload))
            if compact.size in checkpoint_sizes:
                roots[compact.size] = compact.root()
            if index in statement_at:
                heads[index] = (prev_record, record)
            records_out.append((cast.ledger.name, payload))
            made.append(record)
            index += 1
        return made

    def write_records(made: list[LedgerRecord], envelopes: list[bytes]) -> None:
        rows = []
        for record, env in zip(made, envelopes, strict=True):
            t = record.totals
            rows.append(
                (
                    record.index,
                    env,
                    sha256_hex(signed_bytes(record)),
                    record.kind,
                    record.status,
                    record.reason,
                    record.delivered_mgms,
                    t.gross_minor,
                    t.buyer_owes_minor,
                    t.operator_receives_minor,
                    t.desk_receives_minor,
                )
            )
        record_app.append_rows(rows)
        record_app.flush()

    def seal_records(pool: ProcessPoolExecutor, todo: list[tuple[str, bytes]]) -> list[bytes]:
        if format_version != "1":  # SPEC §8: unsigned, covered by the checkpoints
            return [encode_envelope(Envelope(payload=p, signatures=[])) for _, p in todo]
        return [e for part in pool.map(_sign, _split(todo, 4)) for e in part]

    def input_row(table: str, i: int, raw: bytes, extra: Sequence[Any]) -> None:
        marks = ", ".join("?" for _ in range(6 + len(extra)))
        con.execute(
            f"INSERT INTO {table} VALUES ({marks})",
            [i, f"bench:{i}", sha256_hex(raw), raw, "accepted", "", *extra],
        )

    started = time.monotonic()
    with ProcessPoolExecutor(2, initializer=_init_signer, initargs=(seeds,)) as pool:
        terms_raw = signed_terms(cast, terms)
        pending: list[tuple[str, bytes]] = []
        made = chain([terms_raw], pending)
        write_records(made, seal_records(pool, pending))
        input_row("terms", 0, terms_raw, [])
        produced = 0
        for chunk_start in range(0, events, CHUNK):
            todo: list[tuple[str, bytes]] = []
            meta: list[UsageEvent] = []
            for k in range(chunk_start, min(events, chunk_start + CHUNK)):
                minute, n = divmod(k, NODES)
                node_id = gpus[n].node_id
                event = UsageEvent(
                    placement_id="p-bench",
                    node_id=node_id,
                    seq=minute,
                    prev=stream_prev[node_id],
                    start_ms=T0 + minute * MINUTE_MS,
                    end_ms=T0 + (minute + 1) * MINUTE_MS,
                    samples=[sample(gpus[n])],
                )
                payload = signed_bytes(event)
                stream_prev[node_id] = sha256_hex(payload)
                todo.append((node_id, payload))
                meta.append(event)
            raws = [e for part in pool.map(_sign, _split(todo, 4)) for e in part]
            first = index
            records_todo: list[tuple[str, bytes]] = []
            made = chain(raws, records_todo)
            rows = [
                (
                    first + i,
                    f"bench:{first + i}",
                    sha256_hex(raw),
                    raw,
                    "accepted",
                    "",
                    ev.node_id,
                    ev.seq,
                    ev.start_ms,
                    ev.end_ms,
                )
                for i, (raw, ev) in enumerate(zip(raws, meta, strict=True))
            ]
            usage_app.append_rows(rows)
            usage_app.flush()
            write_records(made, seal_records(pool, records_todo))
            produced += len(raws)
            rate = produced / (time.monotonic() - started)
            print(
                f"\rbuilding: {produced}/{events} events ({rate:,.0f}/s)",
                end="",
                file=sys.stderr,
                flush=True,
            )
        close_raw = closed(cast, "p-bench", terms.window_end_ms + terms.late_grace_ms)
        pending = []
        made = chain([close_raw], pending)
        write_records(made, seal_records(pool, pending))
        input_row("closes", index - 1, close_raw, [terms.window_end_ms + terms.late_grace_ms])
    print(file=sys.stderr)
    for through, (head, record) in sorted(heads.items()):
        final = through == index - 1
        st = Statement(
            placement_id="p-bench",
            through_index=through,
            head=head,
            currency=terms.currency,
            currency_scale=terms.currency_scale,
            final=final,
            totals=record.totals,
        )
        env = encode_envelope(sign_payload(signed_bytes(st), [cast.ledger]))
        t = record.totals
        con.execute(
            "INSERT INTO statements VALUES (?, ?, ?, ?, ?, ?)",
            [
                through,
                env,
                final,
                t.buyer_owes_minor,
                t.operator_receives_minor,
                t.desk_receives_minor,
            ],
        )
    for size, root_hash in sorted(roots.items()):
        body = checkpoint_body(
            Checkpoint(origin=checkpoint_origin("p-bench"), size=size, root=root_hash)
        )
        # The operator's and the buyer's witnesses (the trust file's default policy).
        note = sign_note(body, "gridledger-ledger", cast.ledger)
        for party in (cast.operator, cast.buyer):
            note = cosign(note, party.name, party, 1)
        con.execute("INSERT INTO checkpoints VALUES (?, ?)", [size, note.text()])
    import base64

    meta_rows = {
        "format": "gridledger-export",
        "format_version": format_version,
        "placement_id": "p-bench",
        "ledger_key": base64.b64encode(cast.ledger.public_key).decode(),
        "records": str(index),
        "dropped_duplicates": "0",
    }
    con.executemany("INSERT INTO meta VALUES (?, ?)", list(meta_rows.items()))
    con.execute("CHECKPOINT")
    con.close()
    os.replace(tmp, out)
    write_trust(cast, trust_out)
    print(f"built {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)


def cached_export(
    events: int, format_version: str = "2", *, rebuild: bool = False
) -> tuple[Path, Path]:
    """(export, trust file) of the honest export with ``events`` usage events, built under
    CACHE when missing (or ``rebuild``)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    # v2: statements with periods, checkpoints witnessed by operator and buyer; "-unsigned":
    # export format version 2 (records unsigned, SPEC §8).
    name = f"verifier-{events}-v2" + ("" if format_version == "1" else "-unsigned")
    export = CACHE / f"{name}.duckdb"
    trust = CACHE / f"{name}-trust.json"
    if rebuild or not (export.exists() and trust.exists()):
        build_export(events, export, trust, format_version)
    return export, trust


# ---- the machine's limit -------------------------------------------------------------------

_VECTORS: list[tuple[bytes, bytes, bytes]] = []


def _vectors(n: int = 2000) -> list[tuple[bytes, bytes, bytes]]:
    key = SigningKey.from_seed_text("bench", "limit")
    msg = b"gridledger/usage/v1\n" + b"x" * 480
    sig = key.sign(msg)
    return [(key.public_key, msg, sig)] * n


def _verify_for(seconds: float) -> int:
    vectors = _vectors()
    done = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for public_key, msg, sig in vectors:
            verify(public_key, msg, sig)
        done += len(vectors)
    return done


def verify_cpu_us(rounds: int = 5) -> float:
    """CPU microseconds one Ed25519 verification takes here (the least of a few rounds of
    2000): unlike a rate, it hardly moves when other processes share the cores."""
    best = float("inf")
    for _ in range(rounds):
        vectors = _vectors()
        started = time.process_time()
        for public_key, msg, sig in vectors:
            verify(public_key, msg, sig)
        best = min(best, (time.process_time() - started) / len(vectors) * 1e6)
    return best


def verify_rate(processes: int, seconds: float = 3.0) -> float:
    """Ed25519 verifications per second with ``processes`` processes (pynacl)."""
    if processes == 1:
        started = time.monotonic()
        done = _verify_for(seconds)
        return done / (time.monotonic() - started)
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_verify_for, [0.2] * processes))  # warm up
        started = time.monotonic()
        done = sum(pool.map(_verify_for, [seconds] * processes))
        return done / (time.monotonic() - started)


# ---- one verification in a child process ---------------------------------------------------


def _hwm_kib(pid: int) -> int:
    """VmHWM (peak RSS of the process's current image) from /proc, 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out.extend(int(c) for c in text)
    except OSError:
        pass
    return out


def run_verifier(export: Path, trust: Path, pool: str, root: Path = ROOT) -> dict[str, Any]:
    """Run the verifier CLI in a child; wall time, its JSON report, peak RSS.

    Peak RSS is polled from /proc (VmHWM) because ru_maxrss survives exec on Linux and
    would report this (export-building) parent's peak instead of the verifier's.
    """
    started = time.monotonic()
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verifier",
            str(export),
            "--trust",
            str(trust),
            "--json",
            "--pool",
            pool,
        ],
        stdout=subprocess.PIPE,
        cwd=root,  # ``python -m verifier`` imports the verifier of this checkout
    )
    assert child.stdout is not None
    chunks: list[bytes] = []
    main_kib = 0
    workers_kib: dict[int, int] = {}

    import threading

    def drain() -> None:
        assert child.stdout is not None
        chunks.append(child.stdout.read())

    reader = threading.Thread(target=drain)
    reader.start()
    cpu_s = 0.0
    while True:
        # wait4, not poll: its rusage is the child's CPU plus its reaped workers'.
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            cpu_s = usage.ru_utime + usage.ru_stime
            break
        main_kib = max(main_kib, _hwm_kib(child.pid))
        for worker in _children(child.pid):
            workers_kib[worker] = max(workers_kib.get(worker, 0), _hwm_kib(worker))
        time.sleep(0.2)
    reader.join()
    wall = time.monotonic() - started
    report = json.loads(b"".join(chunks))
    return {
        "pool": pool,
        "wall_s": wall,
        "cpu_s": cpu_s,
        "exit_code": child.returncode,
        "peak_rss_mib": main_kib / 1024,
        "workers_peak_rss_mib": sum(workers_kib.values()) / 1024,
        "report": report["exports"][0],
    }


# Scattered tampering (--tamper mixed), each a few per thousand rows: a usage event
# deleted, its record re-statused, a ledger record duplicated, an envelope edited.
MIXED_TAMPERING = (
    "DELETE FROM usage_events WHERE chain_index % 997 = 13",
    "UPDATE usage_events SET status = 'rejected', reason = 'SEQ_GAP' WHERE chain_index % 991 = 17",
    "INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index % 983 = 19",
    "UPDATE ledger_records SET envelope = envelope || '\\x00'::BLOB WHERE chain_index % 977 = 23",
)


def tampered_copy(export: Path) -> Path:
    """A copy of ``export`` with MIXED_TAMPERING applied (rebuilt on each run)."""
    import shutil

    copy = export.with_name(export.stem + "-tampered-mixed.duckdb")
    copy.unlink(missing_ok=True)
    shutil.copyfile(export, copy)
    with duckdb.connect(str(copy)) as con:
        for statement in MIXED_TAMPERING:
            con.execute(statement)
    return copy


def compare(export: Path, trust: Path, pools: list[str], against: Path) -> int:
    """Both verifiers at once on one export, per pool: CPU per usage event (the child
    and its reaped workers) of each, their quotient, and whether their reports (JSON,
    timing aside) are identical; exit status 1 when they differ."""
    import threading

    for pool in pools:
        results: dict[str, dict[str, Any]] = {}

        def one(name: str, root: Path) -> None:
            results[name] = run_verifier(export, trust, pool, root)  # noqa: B023

        threads = [
            threading.Thread(target=one, args=("this", ROOT)),
            threading.Thread(target=one, args=("against", against)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu: dict[str, float] = {}
        for name, result in results.items():
            usage = result["report"]["counts"].get("inputs.usage", 0)
            cpu[name] = result["cpu_s"] / max(usage, 1) * 1e6
            print(
                f"{name} ({ROOT if name == 'this' else against}) pool={pool}: exit "
                f"{result['exit_code']} ({result['report']['verdict']}), "
                f"{result['wall_s']:.1f} s wall, CPU {cpu[name]:.0f} us/event, peak RSS "
                f"{result['peak_rss_mib']:.0f} MiB + workers "
                f"{result['workers_peak_rss_mib']:.0f} MiB"
            )
        same = _comparable(results["this"]["report"]) == _comparable(results["against"]["report"])
        print(
            f"pool={pool}: CPU per event this/against = {cpu['this'] / cpu['against']:.3f} "
            f"(run at the same time; load {os.getloadavg()[0]:.1f}); reports "
            + ("identical" if same else "DIFFER")
        )
        if not same:
            return 1
    return 0


def _comparable(report: dict[str, Any]) -> str:
    """A report's JSON without its timing (``elapsed_s``): what two verifiers of the same
    export must agree on byte for byte."""
    return json.dumps({k: v for k, v in report.items() if k != "elapsed_s"}, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--pools", default="thread,process")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--format-version", choices=("1", "2"), default="2")
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (e.g. `git archive BASE | tar -x -C DIR`): run its verifier "
        "at the same time as this one's on the same export and compare CPU per event "
        "(on a shared machine, runs one after the other differ by more than a change)",
    )
    parser.add_argument(
        "--tamper",
        choices=("mixed",),
        help="verify a copy of the export with scattered tampering (a failing report with "
        "many findings) instead of the honest export",
    )
    args = parser.parse_args(argv)
    export, trust = cached_export(args.events, args.format_version, rebuild=args.rebuild)
    if args.tamper == "mixed":
        export = tampered_copy(export)
    if args.against is not None:
        return compare(export, trust, args.pools.split(","), args.against.resolve())
    one = verify_rate(1)
    verify_us = verify_cpu_us()
    print(
        f"machine: Ed25519 verify (pynacl), 1 process: {one:,.0f}/s; "
        f"{verify_us:.1f} us CPU per verification; load {os.getloadavg()[0]:.1f}"
    )
    for pool in args.pools.split(","):
        # The machine is shared and noisy: bracket each run with the 2-process limit.
        before = verify_rate(2)
        result = run_verifier(export, trust, pool)
        after = verify_rate(2)
        limit = (before + after) / 2
        report = result["report"]
        counts = report["counts"]
        usage = counts.get("inputs.usage", 0)
        sigs = counts.get("signatures", 0)
        wall = result["wall_s"]
        cpu_us = result["cpu_s"] / max(usage, 1) * 1e6
        checks = sigs / max(usage, 1)  # signature checks per usage event (2 in v1, 1 in v2)
        print(
            f"verifier pool={pool}: exit {result['exit_code']} ({report['verdict']}), "
            f"{report['findings']['total']:,} findings; "
            f"{wall:.1f} s wall ({report['elapsed_s']:.1f} s in verify_export); "
            f"{usage:,} usage events -> {usage / wall:,.0f} events/s; "
            f"{sigs:,} signatures -> {sigs / wall:,.0f} sig/s; 2-process limit "
            f"{before:,.0f}/s before, {after:,.0f}/s after -> "
            f"{sigs / wall / limit:.2f}x the limit in signatures "
            f"({usage / wall / limit:.2f}x in events; {checks:.2f} checks per event, "
            f"format_version {args.format_version}); "
            f"CPU {result['cpu_s']:.1f} s = {cpu_us:.0f} us/event (verifier and workers; "
            f"its {checks:.2f} verifications alone {checks * verify_us:.0f} us -> CPU-bound "
            f"ratio {checks * verify_us / cpu_us:.2f}x); load {os.getloadavg()[0]:.1f}; "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB"
            + (
                f" + workers {result['workers_peak_rss_mib']:.0f} MiB"
                if result["workers_peak_rss_mib"]
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
