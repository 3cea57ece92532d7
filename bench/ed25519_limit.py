"""The machine's own limit: Ed25519 verification per core, on 2 threads and 2 processes.

    .venv/bin/python bench/ed25519_limit.py [--seconds 3]

Every other benchmark compares itself with these numbers measured in its own run; this
script prints them alone (and signing, hashing and canonical JSON for context), so
BENCHMARKS.md can show what the machine could do at all. No asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nacl.signing  # noqa: E402

from devtools import builders  # noqa: E402
from proto.canonical import signed_bytes  # noqa: E402
from proto.envelope import open_envelope  # noqa: E402

MESSAGE = b"gridledger/usage/v1\n" + b"x" * 900  # about the size of a usage event payload


def _verify_for(seconds: float) -> int:
    key = nacl.signing.SigningKey(b"\x01" * 32)
    signed = key.sign(MESSAGE)
    verify_key = key.verify_key
    count = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(200):
            verify_key.verify(signed)
        count += 200
    return count


def rate(label: str, work: int, seconds: float) -> float:
    """Print and return ops/s."""
    value = work / seconds
    print(f"{label:<44} {value:>12,.0f}/s")
    return value


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    s = args.seconds
    print(f"cores: {multiprocessing.cpu_count()}, message {len(MESSAGE)} bytes, {s:g} s each")
    one = rate("Ed25519 verify, 1 core (pynacl)", _verify_for(s), s)
    with ThreadPoolExecutor(2) as pool:
        started = time.perf_counter()
        counts = list(pool.map(_verify_for, [s, s]))
        threads = rate("Ed25519 verify, 2 threads", sum(counts), time.perf_counter() - started)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        started = time.perf_counter()
        counts = pool.map(_verify_for, [s, s])
        procs = rate("Ed25519 verify, 2 processes", sum(counts), time.perf_counter() - started)
    key = nacl.signing.SigningKey(b"\x02" * 32)
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < s:
        for _ in range(200):
            key.sign(MESSAGE)
        n += 200
    rate("Ed25519 sign, 1 core", n, time.perf_counter() - started)
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < s:
        for _ in range(1000):
            hashlib.sha256(MESSAGE).digest()
        n += 1000
    rate("SHA-256 of the message", n, time.perf_counter() - started)
    cast = builders.make_cast("bench")
    g = [builders.gpu("n", 0), builders.gpu("n", 1)]
    writer = builders.StreamWriter(cast.node_key("n"), "pl", "n")
    envelope = writer.event(0, 60_000, [builders.sample(x) for x in g])
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < s:
        for _ in range(500):
            open_envelope(envelope)
        n += 500
    rate("open_envelope (decode + canonical check)", n, time.perf_counter() - started)
    record = open_envelope(envelope).record
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < s:
        for _ in range(1000):
            signed_bytes(record)
        n += 1000
    rate("canonical encode of a usage event", n, time.perf_counter() - started)
    print(f"{'ratio 2 threads / 1 core':<44} {threads / one:>12.2f}")
    print(f"{'ratio 2 processes / 1 core':<44} {procs / one:>12.2f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'peak RSS':<44} {peak:>10.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
