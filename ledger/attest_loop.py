"""The ledger's own issuing of statements and checkpoints (SPEC §8.4): a read never writes.

Every ``attest_interval_s`` the running ledger issues a statement and a checkpoint at the
head of each placement whose head has neither yet (``issuer.attest_all``, set-wise), so a
closed placement has its final statement within one period of the close and a reader
(``GET .../statement``, ``.../checkpoint``, ``.../export``) finds the latest one stored.
A party may also ask for one (``POST .../checkpoint``, rate-limited, ``ledger/http.py``).
"""

from __future__ import annotations

import threading
from typing import Final

import structlog

from ledger.issuer import attest_all
from ledger.store import Store
from proto.keys import SigningKey

log = structlog.get_logger("ledger.attest")

DEFAULT_ATTEST_INTERVAL_S: Final = 10.0


def unattested(store: Store) -> list[str]:
    """The placements whose head has no statement or no checkpoint at it."""
    statements = store.statement_heads()
    checkpoints = store.checkpoint_sizes()
    return sorted(
        pid
        for pid, (index, _) in store.heads().items()
        if (pid, index) not in statements or (pid, index + 1) not in checkpoints
    )


def attest_once(store: Store, key: SigningKey) -> int:
    """Issue what ``unattested`` names; how many placements were attested."""
    ids = unattested(store)
    if not ids:
        return 0
    done = attest_all(store, key, ids)
    for pid, why in done.skipped.items():
        log.debug("attest_skipped", placement=pid, why=why)
    return len(done.chains)


class AttestLoop:
    """``attest_once`` on a daemon thread every ``interval_s`` until ``stop``."""

    def __init__(self, store: Store, key: SigningKey, interval_s: float) -> None:
        self.store = store
        self.key = key
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-attest", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                attest_once(self.store, self.key)
            except Exception:  # one failed round is logged; the next tries again
                log.exception("attest_failed")

    def stop(self) -> None:
        """Stop after the round in progress (one more on the way out: the close's)."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 60)
        try:
            attest_once(self.store, self.key)
        except Exception:
            log.exception("attest_failed")
