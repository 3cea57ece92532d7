"""Spreading envelope opening and Ed25519 checks over both cores, in bounded chunks.

pynacl releases the GIL while it verifies, so two threads reach about twice the
single-core rate (LIMITS.md); a process pool also parallelises the JSON decoding but
pays for pickling, so its workers read their own chain-index ranges from the export and
send back compact rows (``reads_ranges``, ``verifier/walk.py``; a thread pool's workers
read their ranges too). ``bench/verifier_1m.py``
measures both on the same export; ``python -m verifier`` opens a big export with
processes by default (less wall and less CPU than threads since they read their own
ranges: bench/verifier_1m.py). ``inline`` runs in the caller, for small exports,
where the cores are busy anyway (the trace replay's verifier workers), and for debugging.

``OpenPool.run`` keeps at most MAX_BATCHES_IN_FLIGHT batches in the pool and yields
results in submission order, so memory is bounded and the fold sees chain order.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, Literal, TypeVar

from verifier import limits
from verifier.connections import forget_exports
from verifier.opener import Keyring, OpenResult, open_chunk

PoolKind = Literal["inline", "thread", "process"]
T = TypeVar("T")


def default_workers() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Young-generation garbage collection every GC_GEN0_THRESHOLD allocations instead of
    700, for the duration (limits.py says why); the thresholds are restored after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], limits.GC_GEN0_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _worker_started() -> None:
    """A pool process only runs the pass: it keeps the pass's collection threshold. It
    holds no export connection of its parent's (spawned; had it been forked, it would drop
    the ones it inherited: ``verifier/walk.py``)."""
    forget_exports(close=False)
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], limits.GC_GEN0_THRESHOLD), *old[1:])


class OpenPool(Generic[T]):
    """Opens batches of envelopes with ``open_chunk`` on a pool; see the module docstring."""

    def __init__(
        self,
        kind: PoolKind = "thread",
        workers: int | None = None,
        *,
        reads_ranges: bool | None = None,
    ) -> None:
        self.kind = kind
        # Workers read their chain-index ranges from the export themselves
        # (``verifier/walk.py``): worth it where every row would otherwise be pickled, and
        # for threads too: the main thread then neither reads nor plans a row (it built a
        # row object per row and planned the batch, ~4 us of CPU per usage event more than
        # the workers' reads of DuckDB's tuples; bench/verifier_1m.py, BENCHMARKS.md).
        # Inline, when asked (a big export: ~6 % less CPU per usage event than the rows
        # read and planned, bench/verifier_1m.py; a small one pays more for the
        # second connection to its file than it saves).
        self.reads_ranges = kind in ("process", "thread") if reads_ranges is None else reads_ranges
        # A range's FastPairs cross a process boundary packed (``pair_worker.pack_pairs``); a
        # thread, or the caller's own, hands over the list itself.
        self.packs = kind == "process"
        self.workers = workers or default_workers()
        self._executor: Executor | None = None
        if kind == "thread":
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="verify")
        elif kind == "process":
            # Spawned, never forked: the caller holds DuckDB databases (the export, the
            # work tables), and a fork copies their memory and locks mid-state. Each worker
            # pays its imports once (~0.3 s of CPU) where a big export costs seconds.
            self._executor = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started,
            )

    def close(self) -> None:
        """Stop the workers."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> OpenPool[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self, batches: Iterable[tuple[T, Sequence[tuple[int, bytes]]]], keyring: Keyring
    ) -> Iterator[tuple[T, list[OpenResult]]]:
        """For each (batch, rows) in order: the batch and the opened rows, same order."""
        return self.run_jobs(open_chunk, batches, keyring)

    def run_jobs(
        self,
        fn: Callable[[Sequence[Any], Any], list[Any]],
        batches: Iterable[tuple[T, Sequence[Any]]],
        context: Any,
        chunk: int = limits.OPEN_CHUNK_ROWS,
    ) -> Iterator[tuple[T, list[Any]]]:
        """``run`` with any pure, picklable ``fn(jobs, context) -> one result per job``
        (``verifier/pair_worker.py``): chunked (``chunk`` jobs per task), bounded and in order
        the same way."""
        executor = self._executor
        if executor is None:
            for batch, rows in batches:
                yield batch, fn(rows, context)
            return
        pending: deque[tuple[T, list[Future[list[Any]]]]] = deque()
        for batch, rows in batches:
            futures = [
                executor.submit(fn, rows[i : i + chunk], context)
                for i in range(0, len(rows), chunk)
            ]
            pending.append((batch, futures))
            if len(pending) >= limits.MAX_BATCHES_IN_FLIGHT:
                yield _collect(pending.popleft())
        while pending:
            yield _collect(pending.popleft())


def _collect(item: tuple[T, list[Future[list[Any]]]]) -> tuple[T, list[Any]]:
    batch, futures = item
    results: list[Any] = []
    for future in futures:
        results.extend(future.result())
    return batch, results
