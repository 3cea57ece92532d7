"""What the ledger's signature-check worker process runs (``ledger.crypto.CryptoWorker``).

Kept apart from ``ledger.crypto`` so that a spawned worker imports only ``proto.keys``
(pynacl) to unpickle its jobs, not the fold.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence

from proto.keys import verify


def verify_chunk(jobs: Sequence[tuple[bytes, bytes, bytes]]) -> list[bool]:
    """For each (public key, signed bytes, signature): whether the signature verifies."""
    return [verify(public_key, payload, sig) for public_key, payload, sig in jobs]


def watch_parent() -> None:
    """The worker's initializer: exit as soon as the ledger process is gone.

    A worker waits on its job queue, which it holds both ends of: a ledger killed with
    SIGKILL would leave it waiting forever. The parent's sentinel becomes ready when the
    parent exits, however it exits. Ctrl-C reaches the whole foreground process group:
    the worker ignores it and the ledger stops it as it stops (no traceback from here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait_for_parent() -> None:
        parent.join()
        os._exit(0)

    threading.Thread(target=wait_for_parent, name="ledger-parent-watch", daemon=True).start()


def worker_pid() -> int:
    """The worker's process id (its first job: it starts the process and names it)."""
    return os.getpid()
