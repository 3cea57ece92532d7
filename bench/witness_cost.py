"""What witnessing costs (SPEC §8.3), beside the machine's Ed25519 limit in the same run.

    .venv/bin/python bench/witness_cost.py [--records 50000] [--checkpoints 50]

Builds a placement's log of N LedgerRecords signed by a ledger key (usage events of two
nodes, all delivered and known to the operator), then runs the operator's witness over
it the way a party would: in C checkpoints of N/C new records each (``witness.check``:
decode, ledger signature, frontier, order and completeness checks, cosignature) and the
state file written before each cosignature. Prints records/s and the cost per
checkpoint, and the 1-core Ed25519 verify rate measured in the same run, as a ratio.
No asserts: numbers are for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nacl.signing  # noqa: E402

from devtools import builders  # noqa: E402
from ledger.checkpoints import make_checkpoint  # noqa: E402
from ledger.pricing import ZERO_TOTALS  # noqa: E402
from proto.canonical import signed_bytes  # noqa: E402
from proto.delivery import delivered_usage  # noqa: E402
from proto.envelope import open_envelope, seal, sha256_hex  # noqa: E402
from proto.note import parse_note  # noqa: E402
from proto.records import ZERO_HASH, LedgerRecord  # noqa: E402
from witness.check import Cosigned, witness  # noqa: E402
from witness.known import Known  # noqa: E402
from witness.state import STATE_FORMAT, WitnessState, store_state  # noqa: E402

MINUTE = 60_000
T0 = 1_767_225_600_000


def verify_limit(seconds: float = 2.0) -> float:
    """1-core Ed25519 verifications per second of a usage-sized message."""
    key = nacl.signing.SigningKey(b"\x02" * 32)
    signed = key.sign(b"gridledger/record/v1\n" + b"x" * 600)
    verify_key = key.verify_key
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(200):
            verify_key.verify(signed)
        count += 200
    return count / (time.perf_counter() - started)


def build(records: int) -> tuple[object, list[bytes], list[Known]]:
    cast = builders.make_cast("bench-witness")
    gpus = [builders.gpu("n1", 0), builders.gpu("n2", 0)]
    window = (records // 2 + 2) * MINUTE
    terms = builders.make_terms(cast, "pl-bench", gpus, T0, T0 + window)
    writers = [builders.StreamWriter(cast.node_key(g.node_id), "pl-bench", g.node_id) for g in gpus]
    out, known, prev = [], [], ZERO_HASH
    for index in range(records):
        g, writer = gpus[index % 2], writers[index % 2]
        start = T0 + (index // 2) * MINUTE
        raw = writer.event(start, start + MINUTE, [builders.sample(g)])
        line = delivered_usage(raw, start + MINUTE)
        known.append(
            Known(line.input_hash, "usage", line.node_id, line.seq, line.delivered_at_ms, "log")
        )
        record = LedgerRecord(
            placement_id="pl-bench",
            index=index,
            prev=prev,
            kind="usage",
            source=open_envelope(raw).input_hash,
            status="accepted",
            reason="",
            delivered_mgms=0,
            totals=ZERO_TOTALS,
            arrived_ms=start + MINUTE,  # SPEC §6.6: when it was delivered
        )
        prev = sha256_hex(signed_bytes(record))
        out.append(seal(record, [cast.ledger]))
    return (cast, terms), out, known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--checkpoints", type=int, default=50)
    args = parser.parse_args()
    limit = verify_limit()
    (cast, terms), records, known = build(args.records)
    payloads = [open_envelope(r).payload for r in records]
    step = max(1, args.records // args.checkpoints)
    state = WitnessState(format=STATE_FORMAT, placement_id="pl-bench")
    check_s = store_s = 0.0
    rounds = 0
    with tempfile.TemporaryDirectory() as tmp:
        for size in range(step, args.records + 1, step):
            note = parse_note(make_checkpoint("pl-bench", payloads[:size], cast.ledger).text())  # type: ignore[attr-defined]
            started = time.perf_counter()
            outcome = witness(
                state,
                terms,
                note,
                records[state.size : size],
                known,  # type: ignore[arg-type]
                name=cast.operator.name,
                key=cast.operator,
                # a witness running as the log grows: a second after the last arrival
                now_s=(T0 + ((size - 1) // 2 + 1) * MINUTE) // 1000 + 1,
            )
            check_s += time.perf_counter() - started
            assert isinstance(outcome, Cosigned), outcome
            started = time.perf_counter()
            store_state(Path(tmp), outcome.state)
            store_s += time.perf_counter() - started
            state = outcome.state
            rounds += 1
    rate = state.size / check_s
    print(f"Ed25519 verify, 1 core, same run: {limit:,.0f}/s")
    print(f"witness: {state.size:,} records in {rounds} checkpoints")
    print(
        f"  check (decode, ledger signature, frontier, order, completeness, cosign): "
        f"{rate:,.0f} records/s = {rate / limit:.2f} of the 1-core verify limit "
        f"({1e6 / rate:.1f} us/record)"
    )
    print(
        f"  per checkpoint: check {1e3 * check_s / rounds:.1f} ms, state write "
        f"{1e3 * store_s / rounds:.1f} ms (state of {state.size:,} inputs seen)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
