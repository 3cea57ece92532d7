"""The crypto pool beside the fold: usage signatures checked ahead of it.

``preverify`` checks each usage event's signature with the key bound to its node when
the batch is opened (or named by terms or a key binding of this batch or of the batch
ahead of it, not folded yet), in chunks, and hands back one pending check per input; the
fold resolves an input's check just before ``decide`` and passes the result in as data.
``decide`` uses a check only when it was made with the key bound to the node when it gets
there, and verifies inline otherwise: a guess costs time when wrong, never a verdict.

Where the chunks run: a thread pool (libsodium releases the GIL, but a thread takes it
back after every signature and waits up to the switch interval while the fold holds it),
or ``CryptoWorker``, one worker process (``ledger.crypto_worker``) that checks whole chunks
without the GIL of the fold, so the Kafka service's next batch is checked while this one
folds and commits (``ledger.service``). A worker that dies or stops answering is
``CryptoWorkerError`` after at most ``CRYPTO_WAIT_S``, never a hang.

Records are not signed (SPEC §8, docs/adr/0003-sign-tree-heads.md: the ledger signs
checkpoints, tree heads, not leaves): ``seal_record`` wraps their bytes in an envelope
with no signature.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, InvalidStateError
from typing import Final

import msgspec
import structlog

from ledger.crypto_worker import frame, read_frame, verify_chunk
from ledger.limits import CRYPTO_STOP_S, CRYPTO_WAIT_S, CRYPTO_WORKER_CHUNK
from ledger.rules import CheckedSignature
from proto.envelope import Opened
from proto.errors import ProtoError
from proto.invariant import present
from proto.records import UsageEvent

log = structlog.get_logger("ledger.crypto")

# Signatures checked per job handed to an executor thread.
CRYPTO_CHUNK: Final = 256

# Chunks the worker process holds at once (one checked, one read ahead); the others wait
# in the parent, where the fold can still take them back.
_IN_FLIGHT: Final = 2

# (placement_id, node_id, key id) -> the public key bound to that node now, if known.
KeyFinder = Callable[[str, str, str], bytes | None]

# One signature to check: (public key, signed bytes, signature).
Job = tuple[bytes, bytes, bytes]


class CryptoWorkerError(RuntimeError):
    """The signature-check worker process died or did not answer in time."""


class CryptoWorker:
    """One worker process checking chunks of signatures (see the module docstring).

    ``python -m ledger.crypto_worker`` (its protocol is there), started with
    ``subprocess`` on ``start`` (or the first chunk), never forked: the ledger process
    holds DuckDB and threads. This object keeps the process (``pid``, ``close``), two
    threads (one sends chunks, one reads answers) and the futures of the chunks: at most
    ``_IN_FLIGHT`` are sent ahead, the rest wait here, where the fold can take one back
    (``Future.cancel``) and check it itself.
    """

    chunk = CRYPTO_WORKER_CHUNK

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Condition()
        self._waiting: deque[tuple[Future[list[bool]], list[Job]]] = deque()
        self._sent: deque[Future[list[bool]]] = deque()
        self._gone: str | None = None  # why the process can take no more chunks
        self._ready = threading.Event()  # it said it is ready, or it is gone
        self._closed = False

    def start(self) -> None:
        """Start the process now (its start-up then overlaps the caller's)."""
        with self._lock:
            if self._process is not None or self._closed:
                return
            # The parent's import path, so the worker imports this very code.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "ledger.crypto_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                )
            except OSError as exc:
                self._gone = f"it could not start: {exc}"
                self._ready.set()
                return
            process = self._process
        for name, target in (("send", self._send), ("receive", self._receive)):
            thread = threading.Thread(
                target=target, args=(process,), name=f"ledger-crypto-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def pid(self) -> int:
        """The worker's process id, once it is ready (starts it; waits at most
        ``CRYPTO_WAIT_S``)."""
        self.start()
        ready = self._ready.wait(CRYPTO_WAIT_S)
        if self._process is None or not ready or self._gone is not None:
            why = self._gone or f"not ready within {CRYPTO_WAIT_S} s"
            raise CryptoWorkerError(f"the signature worker process did not start: {why}")
        return self._process.pid

    def submit(self, jobs: list[Job]) -> Future[list[bool]]:
        """Check ``jobs`` in the worker; raises CryptoWorkerError if it is gone."""
        self.start()
        future: Future[list[bool]] = Future()
        with self._lock:
            if self._gone is not None or self._closed:
                why = self._gone or "closed"
                raise CryptoWorkerError(f"the signature worker process is gone: {why}")
            self._waiting.append((future, jobs))
            self._lock.notify_all()
        return future

    def _send(self, process: subprocess.Popen[bytes]) -> None:
        """Thread: hand waiting chunks to the process, ``_IN_FLIGHT`` at most ahead of its
        answers; at close, end its input (it exits once it has answered)."""
        sink = present(process.stdin, "the worker's input pipe")
        encode = msgspec.msgpack.Encoder().encode
        try:
            while True:
                with self._lock:
                    while not (
                        self._closed
                        or self._gone is not None
                        or (self._waiting and len(self._sent) < _IN_FLIGHT)
                    ):
                        self._lock.wait()
                    if self._closed or self._gone is not None:
                        return
                    future, jobs = self._waiting.popleft()
                    if not future.set_running_or_notify_cancel():
                        continue  # taken back by the fold
                    self._sent.append(future)
                sink.write(frame(encode(jobs)))
                sink.flush()
        except OSError as exc:  # the process is gone (EPIPE): the reader says why
            log.debug("crypto_worker_send_failed", error=str(exc))
        finally:
            with contextlib.suppress(OSError):
                sink.close()

    def _receive(self, process: subprocess.Popen[bytes]) -> None:
        """Thread: resolve the sent chunks' futures with the answers, in order; at the
        end of the process's output fail every chunk it did not answer."""
        source = present(process.stdout, "the worker's output pipe")
        decode = msgspec.msgpack.Decoder(list[bool]).decode
        why = "it exited"
        try:
            if read_frame(source) is None:  # its process id: ready
                why = "it exited before it was ready"
            else:
                self._ready.set()
            while (body := read_frame(source)) is not None:
                with self._lock:
                    future = self._sent.popleft() if self._sent else None
                    self._lock.notify_all()
                if future is None:
                    why = "it answered a chunk it was never sent"
                    break
                try:
                    future.set_result(decode(body))
                except msgspec.DecodeError as exc:
                    future.set_exception(CryptoWorkerError(f"unreadable answer: {exc}"))
        except OSError as exc:
            why = f"its output failed: {exc}"
        with self._lock:
            closed = self._closed
            if self._gone is None:
                self._gone = why if closed else f"{why} (died)"
            failed = [*self._sent, *(f for f, _ in self._waiting)]
            self._sent.clear()
            self._waiting.clear()
            self._lock.notify_all()
        self._ready.set()
        error = CryptoWorkerError(f"the signature worker process died: {self._gone}")
        for future in failed:
            with contextlib.suppress(InvalidStateError):  # taken back by the fold meanwhile
                future.set_exception(error)

    def close(self) -> None:
        """Stop the worker: chunks not sent are dropped, those it has are answered within
        ``CRYPTO_STOP_S`` or the process is killed (safe to call twice)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            dropped = [f for f, _ in self._waiting]
            self._waiting.clear()
            self._lock.notify_all()
            process = self._process
        for future in dropped:
            future.cancel()
        if process is None:
            return
        try:
            process.wait(CRYPTO_STOP_S)
        except subprocess.TimeoutExpired:
            log.error("crypto_worker_killed", pid=process.pid, waited_s=CRYPTO_STOP_S)
            process.kill()
            process.wait(CRYPTO_STOP_S)
        for thread in self._threads:
            thread.join(CRYPTO_STOP_S)
        if process.stdout is not None:
            process.stdout.close()


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


class PendingCheck(msgspec.Struct, frozen=True, gc=False):
    """One signature of a chunk being checked on a thread. (A Struct: one is made per
    usage input, and a class with ``__slots__`` sets each field in Python. Untracked by
    the cyclic collector: a chunk never refers back to its checks.)"""

    _public_key: bytes
    _chunk: _Chunk
    _index: int

    def result(self) -> CheckedSignature:
        """Wait for the chunk; the check of this signature."""
        return CheckedSignature(self._public_key, self._chunk.results()[self._index])


def preverify(
    executor: Executor | CryptoWorker,
    opened: Sequence[Opened | ProtoError],
    key_for: KeyFinder,
) -> list[PendingCheck | None]:
    """A pending check per input: for usage events with one signature by a known key.

    ``key_for`` is asked once per (placement, node, key id) of the batch: it reads the
    fold's state, which nothing changes while the batch is opened, and a batch has many
    events of each stream (~0.7 us of the main thread per input)."""
    pending: list[PendingCheck | None] = [None] * len(opened)
    jobs: list[tuple[int, bytes, bytes, bytes]] = []
    size = executor.chunk if isinstance(executor, CryptoWorker) else CRYPTO_CHUNK
    found: dict[tuple[str, str, str], bytes | None] = {}

    for i, op in enumerate(opened):
        if not isinstance(op, Opened):
            continue
        record = op.record
        if not isinstance(record, UsageEvent):
            continue
        signatures = op.envelope.signatures
        if len(signatures) != 1:
            continue
        signature = signatures[0]
        asked = (record.placement_id, record.node_id, signature.keyid)
        if asked in found:
            public_key = found[asked]
        else:
            public_key = found[asked] = key_for(*asked)
        if public_key is not None:
            jobs.append((i, public_key, op.payload, signature.sig))
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
