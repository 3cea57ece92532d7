"""The signature worker process (``ledger.crypto.CryptoWorker``): what it imports, how it
ends (issue 15: ``crypto_worker_killed`` logged under load by ``bench/fold_micro.py``).

It was a ``multiprocessing`` spawn, which re-runs the parent's main script in the worker
(as ``__mp_main__``): every import of the ledger (DuckDB, the store, the fold) before it
could check a signature, and again on the way out. Now it is ``python -m
ledger.crypto_worker`` on two pipes: it imports the checks only, ends when its input
ends (``close``, or the ledger dying), and ``close`` owns the process it started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ledger.limits import CRYPTO_STOP_S
from proto.keys import SigningKey

EXIT_TIMEOUT_S = 30.0

_PARENT = """
import os, sys, time
from pathlib import Path

Path(sys.argv[1]).open("a").write(f"main script run in {os.getpid()}\\n")

if __name__ == "__main__":
    from ledger.crypto import CryptoWorker

    worker = CryptoWorker()
    pid = worker.pid()
    print(pid, flush=True)
    key, payload, sig = bytes.fromhex(sys.argv[2]), b"signed", bytes.fromhex(sys.argv[3])
    assert worker.submit([(key, payload, sig), (key, b"other", sig)]).result(30) == [True, False]
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        print(cmdline.read().split(b"\\0")[1:3], flush=True)
    if sys.argv[4] == "kill":
        os.kill(os.getpid(), 9)
    started = time.monotonic()
    worker.close()
    print(round(time.monotonic() - started, 3), flush=True)
"""


def _run_parent(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    key = SigningKey.generate("crypto-worker-test")
    marker = tmp_path / "marker"
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(marker),
            key.public_key.hex(),
            key.sign(b"signed").hex(),
            how,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, marker.read_text().splitlines()


def test_the_worker_runs_only_the_checks_and_close_ends_it_at_once(tmp_path: Path) -> None:
    """The parent's main script runs once (in the parent), the worker answers, and close
    ends it well within CRYPTO_STOP_S: nothing to kill, nothing logged."""
    done, runs = _run_parent(tmp_path, "close")
    assert done.returncode == 0, done.stderr[-3000:]
    pid, cmdline, seconds = done.stdout.split("\n")[:3]
    assert len(runs) == 1, runs  # a spawn re-ran it in the worker: two lines
    assert cmdline == "[b'-m', b'ledger.crypto_worker']"
    assert float(seconds) < CRYPTO_STOP_S / 2
    assert "crypto_worker_killed" not in done.stderr
    assert not Path(f"/proc/{int(pid)}").exists()


def test_the_worker_ends_when_the_ledger_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the ledger: the worker's input ends, and so does the worker."""
    done, runs = _run_parent(tmp_path, "kill")
    assert done.returncode == -9, done.stderr[-3000:]
    assert len(runs) == 1
    pid = int(done.stdout.split("\n")[0])
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while _alive(pid):  # bounded: the worker's exit is asynchronous to ours
        assert time.monotonic() < deadline, f"worker {pid} outlived the killed ledger"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited (its new parent reaps it)
