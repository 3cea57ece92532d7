"""The crypto pool beside the fold: usage signatures checked ahead of it.

libsodium releases the GIL, so Ed25519 work on a few threads runs beside the fold on
the main thread. ``preverify`` checks each usage event's signature with the key bound
to its node when the batch starts, in chunks, and hands back one pending check per
input; the fold resolves an input's check just before ``decide`` and passes the result
in as data (a key bound inside the batch is simply checked inline by ``decide``).
Records are not signed (SPEC §8, issue 15: the ledger signs checkpoints, tree heads,
not leaves): ``seal_record`` wraps their bytes in an envelope with no signature.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Final

from ledger.decide import CheckedSignature
from proto.envelope import Opened
from proto.errors import ProtoError
from proto.keys import verify
from proto.records import UsageEvent

# Signatures checked per job handed to an executor thread.
CRYPTO_CHUNK: Final = 256

# (placement_id, node_id, key id) -> the public key bound to that node now, if known.
KeyFinder = Callable[[str, str, str], bytes | None]


class _Chunk:
    """The checks of one chunk, waited for once (not once per signature of it)."""

    __slots__ = ("_future", "_results")

    def __init__(self, future: Future[list[bool]]) -> None:
        self._future = future
        self._results: list[bool] | None = None

    def results(self) -> list[bool]:
        results = self._results
        if results is None:
            results = self._results = self._future.result()
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
    executor: Executor, opened: Sequence[Opened | ProtoError], key_for: KeyFinder
) -> list[PendingCheck | None]:
    """A pending check per input: for usage events with one signature by a known key."""
    pending: list[PendingCheck | None] = [None] * len(opened)
    jobs: list[tuple[int, bytes, bytes, bytes]] = []
    for i, op in enumerate(opened):
        if not isinstance(op, Opened) or not isinstance(op.record, UsageEvent):
            continue
        signatures = op.envelope.signatures
        if len(signatures) != 1:
            continue
        public_key = key_for(op.record.placement_id, op.record.node_id, signatures[0].keyid)
        if public_key is not None:
            jobs.append((i, public_key, op.payload, signatures[0].sig))
    for start in range(0, len(jobs), CRYPTO_CHUNK):
        chunk = jobs[start : start + CRYPTO_CHUNK]
        checks = _Chunk(executor.submit(_verify_chunk, [(k, p, s) for _, k, p, s in chunk]))
        for j, (i, public_key, _, _) in enumerate(chunk):
            pending[i] = PendingCheck(public_key, checks, j)
    return pending


def seal_record(payload: bytes) -> bytes:
    """A LedgerRecord envelope over its signed bytes, with no signature (SPEC §8: the
    checkpoint covering the record and the prev chain authenticate it).

    The canonical bytes of ``Envelope(payload, [])`` (``encode_envelope``), written
    directly: sorted keys, standard padded base64, no whitespace."""
    return _SEALED_HEAD + base64.b64encode(payload) + _SEALED_TAIL


# The canonical envelope with no signature around the base64 of its payload.
_SEALED_HEAD: Final = b'{"payload":"'
_SEALED_TAIL: Final = b'","signatures":[]}'


def _verify_chunk(jobs: Sequence[tuple[bytes, bytes, bytes]]) -> list[bool]:
    return [verify(public_key, payload, sig) for public_key, payload, sig in jobs]
