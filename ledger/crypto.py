"""The crypto pool beside the fold: usage signatures checked ahead of it.

``preverify`` checks each usage event's signature with the key bound to its node when
the batch is opened (or named by terms or a key binding of this batch or of the batch
ahead of it, not folded yet), in chunks, and hands back one pending check per input; the
fold resolves an input's check just before ``decide`` and passes the result in as data.
``decide`` uses a check only when it was made with the key bound to the node when it gets
there, and verifies inline otherwise: a guess costs time when wrong, never a verdict.

Where the chunks run: a thread pool (libsodium releases the GIL, but a thread takes it
back after every signature and waits up to the switch interval while the fold holds it),
or ``CryptoWorker``, one spawned process that checks whole chunks without the GIL of the
fold, so the Kafka service's next batch is checked while this one folds and commits
(``ledger.service``). A worker that dies or stops answering is ``CryptoWorkerError``
after at most ``CRYPTO_WAIT_S``, never a hang.

Records are not signed (SPEC §8, issue 15: the ledger signs checkpoints, tree heads,
not leaves): ``seal_record`` wraps their bytes in an envelope with no signature.
"""

from __future__ import annotations

import base64
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from typing import Final

import structlog

from ledger.crypto_worker import verify_chunk, watch_parent, worker_pid
from ledger.decide import CheckedSignature
from ledger.limits import CRYPTO_STOP_S, CRYPTO_WAIT_S, CRYPTO_WORKER_CHUNK
from proto.envelope import Opened
from proto.errors import ProtoError
from proto.records import UsageEvent

log = structlog.get_logger("ledger.crypto")

# Signatures checked per job handed to an executor thread.
CRYPTO_CHUNK: Final = 256

# (placement_id, node_id, key id) -> the public key bound to that node now, if known.
KeyFinder = Callable[[str, str, str], bytes | None]

# One signature to check: (public key, signed bytes, signature).
Job = tuple[bytes, bytes, bytes]


class CryptoWorkerError(RuntimeError):
    """The signature-check worker process died or did not answer in time."""


class CryptoWorker:
    """One spawned process checking chunks of signatures (see the module docstring).

    Spawned, never forked: the ledger process holds DuckDB and threads. The process
    starts on ``start`` (or the first chunk) and imports ``ledger.crypto_worker`` only.
    """

    chunk = CRYPTO_WORKER_CHUNK

    def __init__(self) -> None:
        self._executor = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=watch_parent
        )
        self._started: Future[int] | None = None
        self._closed = False

    def start(self) -> None:
        """Start the process now (its start-up then overlaps the caller's)."""
        if self._started is None:
            self._started = self._executor.submit(worker_pid)

    def pid(self) -> int:
        """The worker's process id (starts it; waits at most ``CRYPTO_WAIT_S``)."""
        self.start()
        if self._started is None:
            raise CryptoWorkerError("the signature worker process did not start")
        try:
            return self._started.result(timeout=CRYPTO_WAIT_S)
        except (BrokenExecutor, TimeoutError) as exc:
            raise CryptoWorkerError(f"the signature worker process did not start: {exc}") from exc

    def submit(self, jobs: list[Job]) -> Future[list[bool]]:
        """Check ``jobs`` in the worker; raises CryptoWorkerError if it is gone."""
        self.start()
        try:
            return self._executor.submit(verify_chunk, jobs)
        except (BrokenExecutor, RuntimeError) as exc:
            raise CryptoWorkerError(f"the signature worker process is gone: {exc}") from exc

    def close(self) -> None:
        """Stop the worker: chunks not started are dropped, the one running finishes
        within ``CRYPTO_STOP_S`` or the process is killed (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        # CPython's pool keeps its processes in ``_processes`` (3.8-3.13); read before the
        # shutdown, which clears it.
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(CRYPTO_STOP_S)
            if process.is_alive():
                log.error("crypto_worker_killed", pid=process.pid, waited_s=CRYPTO_STOP_S)
                process.kill()
                process.join(CRYPTO_STOP_S)
        self._executor.shutdown(wait=True)


class _Chunk:
    """The checks of one chunk, waited for once (not once per signature of it).

    A chunk still queued when the fold needs it (the worker is behind: a batch not
    checked ahead, a busy machine) is taken back and checked by the fold itself rather
    than waited for: the same pure function of the same bytes."""

    __slots__ = ("_future", "_jobs", "_results")

    def __init__(self, future: Future[list[bool]], jobs: list[Job]) -> None:
        self._future = future
        self._jobs: list[Job] | None = jobs
        self._results: list[bool] | None = None

    def results(self) -> list[bool]:
        results = self._results
        if results is None:
            future, jobs = self._future, self._jobs
            self._jobs = None
            if jobs is not None and not future.done() and future.cancel():
                results = self._results = verify_chunk(jobs)
                return results
            try:
                results = self._results = future.result(timeout=CRYPTO_WAIT_S)
            except BrokenExecutor as exc:
                raise CryptoWorkerError(f"the signature worker process died: {exc}") from exc
            except TimeoutError as exc:
                raise CryptoWorkerError(
                    f"the signature checks did not finish within {CRYPTO_WAIT_S} s"
                ) from exc
        return results


class PendingCheck:
    """One signature of a chunk being checked on a thread."""

    __slots__ = ("_chunk", "_index", "_public_key")

    def __init__(self, public_key: bytes, chunk: _Chunk, index: int) -> None:
        self._public_key = public_key
        self._chunk = chunk
        self._index = index

    def result(self) -> CheckedSignature:
        """Wait for the chunk; the check of this signature."""
        return CheckedSignature(self._public_key, self._chunk.results()[self._index])


def preverify(
    executor: Executor | CryptoWorker,
    opened: Sequence[Opened | ProtoError],
    key_for: KeyFinder,
) -> list[PendingCheck | None]:
    """A pending check per input: for usage events with one signature by a known key."""
    pending: list[PendingCheck | None] = [None] * len(opened)
    jobs: list[tuple[int, bytes, bytes, bytes]] = []
    size = executor.chunk if isinstance(executor, CryptoWorker) else CRYPTO_CHUNK

    for i, op in enumerate(opened):
        if not isinstance(op, Opened) or not isinstance(op.record, UsageEvent):
            continue
        signatures = op.envelope.signatures
        if len(signatures) != 1:
            continue
        public_key = key_for(op.record.placement_id, op.record.node_id, signatures[0].keyid)
        if public_key is not None:
            jobs.append((i, public_key, op.payload, signatures[0].sig))
    for start in range(0, len(jobs), size):
        chunk = jobs[start : start + size]
        chunk_jobs = [(k, p, s) for _, k, p, s in chunk]
        checks = _Chunk(_submit(executor, chunk_jobs), chunk_jobs)
        for j, (i, public_key, _, _) in enumerate(chunk):
            pending[i] = PendingCheck(public_key, checks, j)
    return pending


def _submit(executor: Executor | CryptoWorker, jobs: list[Job]) -> Future[list[bool]]:
    if isinstance(executor, CryptoWorker):
        return executor.submit(jobs)
    return executor.submit(verify_chunk, jobs)


def seal_record(payload: bytes) -> bytes:
    """A LedgerRecord envelope over its signed bytes, with no signature (SPEC §8: the
    checkpoint covering the record and the prev chain authenticate it).

    The canonical bytes of ``Envelope(payload, [])`` (``encode_envelope``), written
    directly: sorted keys, standard padded base64, no whitespace."""
    return _SEALED_HEAD + base64.b64encode(payload) + _SEALED_TAIL


# The canonical envelope with no signature around the base64 of its payload.
_SEALED_HEAD: Final = b'{"payload":"'
_SEALED_TAIL: Final = b'","signatures":[]}'
