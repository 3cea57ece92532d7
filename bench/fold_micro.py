"""Micro-benchmark of the fold alone (no Kafka, no DuckDB), the production wrapper's path.

    .venv/bin/python bench/fold_micro.py [--events 20000] [--placements 50] [--repeat 5]
        [--default-gc] [--store]

Pre-generates signed usage events round-robin over many placements (after their terms),
then folds them through ``ledger.fold.Fold``:

* ``batched``: ``apply_batch`` in batches of 5000 with the ledger's crypto threads (the
  service's path: signatures checked ahead and records signed on the threads);
* ``inline``: ``apply`` one input at a time, all Ed25519 work on this thread;
* ``rejections``: one placement whose node stream is blocked by a SEQ_GAP, so every
  event is chained as rejected (the path whose state grows per input);
* ``ingest-pipe`` (with ``--store``): ``ingest`` as the Kafka service pipelines it, batch
  N+1 opened and its signatures checked in the worker process while batch N folds and
  commits (the worker's CPU, start-up included, counted in "process");
* ``ingest`` (with ``--store``): the service's path without Kafka, ``ledger.ingest.Ingestor``
  committing each batch to a fresh DuckDB store (``ledger.store.Store``); besides the
  main thread, the CPU of the whole process per input (the crypto threads' signature
  checks and DuckDB's threads included), and that less the signature checks (their
  count times the CPU of one verification, measured right after each run).

Prints the best of ``--repeat`` runs as inputs/s (wall clock), and the CPU time of the
main thread per input (``time.thread_time``): the fold's own work, which the other
sessions on a shared machine disturb less than the wall clock. The cyclic collector runs
with the thresholds the ledger's Ingestor sets (``ledger.ingest.tune_gc``), as in the
service; ``--default-gc`` keeps CPython's defaults. No asserts: a benchmark reports.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.builders import Cast, StreamWriter, gpu, make_cast, make_terms, sample, signed_terms  # noqa: E402
from ledger.fold import Fold  # noqa: E402
from ledger.ingest import Ingestor, tune_gc  # noqa: E402
from ledger.inputs import Item as Input  # noqa: E402
from ledger.limits import CRYPTO_THREADS  # noqa: E402
from ledger.store import Store  # noqa: E402
from proto.envelope import decode_envelope  # noqa: E402
from proto.keys import SigningKey, verify  # noqa: E402

T0_MS = 1_767_225_600_000
INTERVAL_MS = 60_000
BATCH = 5000

# (raw input, log position, transport key, arrival at the log in ms)
Item = tuple[bytes, str, str | None, int | None]


def generate(events: int, placements: int) -> tuple[Cast, list[Item]]:
    """Terms for every placement, then usage events round-robin over placements."""
    cast = make_cast("bench")
    per = -(-events // placements)
    window_ms = (per + 2) * INTERVAL_MS
    items: list[Item] = []
    writers = []
    for i in range(placements):
        pid = f"bench-{i:05d}"
        g = gpu(f"{pid}-n0", 0)
        terms = make_terms(cast, pid, [g], T0_MS, T0_MS + window_ms)
        items.append((signed_terms(cast, terms), f"t:{i}", pid, T0_MS))
        writers.append((pid, StreamWriter(cast.node_key(g.node_id), pid, g.node_id), g))
    produced = 0
    for e in range(per):
        for pid, writer, g in writers:
            if produced == events:
                break
            start = T0_MS + e * INTERVAL_MS
            raw = writer.event(start, start + INTERVAL_MS, [sample(g)])
            items.append((raw, f"e:{produced}", pid, start + INTERVAL_MS))
            produced += 1
    return cast, items


def blocked(events: int) -> tuple[Cast, list[Item]]:
    """One placement whose stream skips seq 0: every event is rejected (SEQ_GAP)."""
    cast = make_cast("bench-blocked")
    pid = "bench-blocked"
    g = gpu(f"{pid}-n0", 0)
    terms = make_terms(cast, pid, [g], T0_MS, T0_MS + (events + 2) * INTERVAL_MS)
    items: list[Item] = [(signed_terms(cast, terms), "t:0", pid, T0_MS)]
    writer = StreamWriter(cast.node_key(g.node_id), pid, g.node_id)
    writer.event(T0_MS, T0_MS + INTERVAL_MS, [sample(g)])  # seq 0, never delivered
    for e in range(1, events + 1):
        start = T0_MS + e * INTERVAL_MS
        raw = writer.event(start, start + INTERVAL_MS, [sample(g)])
        items.append((raw, f"e:{e}", pid, start + INTERVAL_MS))
    return cast, items


def best(repeat: int, run: Callable[[], int]) -> str:
    rates, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.thread_time()
        n = run()
        cpu.append((time.thread_time() - started_cpu) / n * 1e6)
        rates.append(n / (time.perf_counter() - started))
    return f"{max(rates):9.0f} inputs/s  main thread {min(cpu):6.1f} us CPU/input"


def verify_cpu_us(seconds: float = 1.0) -> float:
    """CPU time of one Ed25519 verification (pynacl, a ~450-byte payload) on this thread."""
    key = SigningKey.from_seed_text("bench", "verify")
    message = b"x" * 450
    signature = key.sign(message)
    public = key.public_key
    count = 0
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        for _ in range(200):
            verify(public, message, signature)
        count += 200
    return (time.thread_time() - started) / count * 1e6


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def best_process(repeat: int, run: Callable[[], int], signatures: int) -> str:
    """Like ``best``, plus the CPU time of the whole process per input, and that less
    ``signatures`` verifications at the CPU cost of one measured right after each run."""
    rates, cpu, process, rest = [], [], [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.thread_time()
        started_process = time.process_time() + _children_cpu()
        n = run()
        cpu.append((time.thread_time() - started_cpu) / n * 1e6)
        # The signature worker's CPU too (``ingest-pipe``), once it is reaped.
        process.append((time.process_time() + _children_cpu() - started_process) / n * 1e6)
        rates.append(n / (time.perf_counter() - started))
        rest.append(process[-1] - signatures / n * verify_cpu_us())
    return (
        f"{max(rates):9.0f} inputs/s  main thread {min(cpu):6.1f} us CPU/input, "
        f"process {min(process):6.1f} us CPU/input, of which not signatures {min(rest):6.1f}"
    )


def as_inputs(items: list[Item]) -> list[Input]:
    """The items as two Kafka partitions' consumed inputs would be."""
    return [
        Input(
            data=raw,
            position=f"kafka:bench:{i % 2}:{i}",
            stream_key=key,
            source=f"kafka:bench:{i % 2}",
            next_position=str(i + 1),
            arrived_ms=at,
        )
        for i, (raw, _, key, at) in enumerate(items)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--placements", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--default-gc", action="store_true", help="CPython's GC thresholds, not the ledger's"
    )
    parser.add_argument(
        "--store", action="store_true", help="also run the Ingestor over a fresh DuckDB store"
    )
    args = parser.parse_args()
    if not args.default_gc:
        tune_gc()
    cast, items = generate(args.events, args.placements)
    bcast, bitems = blocked(args.events // 4)

    def batched() -> int:
        fold = Fold(cast.ledger)
        with ThreadPoolExecutor(CRYPTO_THREADS) as pool:
            for start in range(0, len(items), BATCH):
                fold.apply_batch(items[start : start + BATCH], pool)
                fold.clear_dirty()
                fold.forget_accepted()
        return len(items)

    def inline() -> int:
        fold = Fold(cast.ledger)
        for raw, position, key, at in items:
            fold.apply(raw, position, key, at)
        return len(items)

    def rejections() -> int:
        fold = Fold(bcast.ledger)
        with ThreadPoolExecutor(CRYPTO_THREADS) as pool:
            for start in range(0, len(bitems), BATCH):
                fold.apply_batch(bitems[start : start + BATCH], pool)
                fold.clear_dirty()
                fold.forget_accepted()
        return len(bitems)

    def ingest() -> int:
        inputs = as_inputs(items)
        with tempfile.TemporaryDirectory(prefix="fold-micro-") as tmp:
            store = Store(Path(tmp) / "bench.duckdb", ledger_public_key=cast.ledger.public_key)
            ingestor = Ingestor(store, cast.ledger)
            try:
                for start in range(0, len(inputs), BATCH):
                    ingestor.ingest(inputs[start : start + BATCH])
            finally:
                ingestor.close()
                store.close()
        return len(inputs)

    def ingest_pipe() -> int:
        inputs = as_inputs(items)
        batches = [inputs[start : start + BATCH] for start in range(0, len(inputs), BATCH)]
        with tempfile.TemporaryDirectory(prefix="fold-micro-") as tmp:
            store = Store(Path(tmp) / "bench.duckdb", ledger_public_key=cast.ledger.public_key)
            ingestor = Ingestor(store, cast.ledger, crypto_worker=True)
            try:
                prepared = ingestor.prepare(batches[0])
                for i in range(len(batches)):
                    # Batch i+1 opened, its checks in the worker, before batch i folds.
                    ahead = (
                        ingestor.prepare(batches[i + 1], ahead_of=[prepared])
                        if i + 1 < len(batches)
                        else None
                    )
                    ingestor.ingest(prepared)
                    if ahead is not None:
                        prepared = ahead
            finally:
                ingestor.close()
                store.close()
        return len(inputs)

    print(f"inputs: {len(items)} over {args.placements} placements; best of {args.repeat}")
    if args.store:
        signatures = sum(len(decode_envelope(raw).signatures) for raw, _, _, _ in items)
        print(f"ingest     {best_process(args.repeat, ingest, signatures)}")
        # The Kafka service's pipeline without Kafka: the worker's start-up included.
        print(f"ingest-pipe {best_process(args.repeat, ingest_pipe, signatures)}")
    print(f"batched    {best(args.repeat, batched)}")
    print(f"inline     {best(args.repeat, inline)}")
    print(f"rejections {best(args.repeat, rejections)} ({len(bitems)} inputs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
