"""What witnessing every minute costs (SPEC §6.6, §8.2): per placement, per 1,000 placements.

    .venv/bin/python bench/witness_every_minute.py [--nodes 2] [--minutes 60,1440,10080]
        [--rounds 20]

A placement whose ``--nodes`` nodes each deliver one usage event a minute. For a log
that has run M minutes (M from ``--minutes``: an hour, a day, a week by default), one
witnessing round — what happens every minute per placement and per party — is timed
piece by piece, ``--rounds`` times:

* ledger, checkpoint: the note over every record so far (``make_checkpoint`` over the
  payloads: the RFC 9162 root of all n leaves, then one Ed25519 signature — what
  ``issue_checkpoint`` computes after reading the payloads from its store);
* ledger, cosignature: ``merge_cosignature`` of the witness's line (parse, one verify);
* witness, read: the operator's delivery log of every event so far (``from_delivery_logs``,
  what ``witness run`` reads each round);
* witness, check: ``witness.check.witness`` over the minute's new records with every
  delivered event known (decode, frontier, order, W_TIME both sides, owed inputs,
  cosignature), then the state written (atomic, fsync) before the cosignature leaves;
* verifier, per checkpoint in the export: ``read_stamps`` of one note cosigned by two
  parties (parse, ledger signature, two cosignature verifies) — an export carries one
  checkpoint per minute witnessed.

Prints ms per round for each piece, the sum per placement-minute for each party's witness
(operator and buyer: two rounds), the CPU that 1,000 placements witnessed every minute
take (cores), and the checkpoint rows an export gains per placement-day. HTTP and DuckDB
reads are not in it. No asserts: numbers are for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import builders  # noqa: E402
from ledger.checkpoints import make_checkpoint, merge_cosignature, party_note_keys  # noqa: E402
from ledger.pricing import ZERO_TOTALS  # noqa: E402
from proto.canonical import signed_bytes  # noqa: E402
from proto.cosign import cosign  # noqa: E402
from proto.delivery import append_delivered, delivered_usage  # noqa: E402
from proto.envelope import open_envelope, seal, sha256_hex  # noqa: E402
from proto.records import ZERO_HASH, LedgerRecord, PlacementTerms  # noqa: E402
from verifier.cosigned_time import read_stamps  # noqa: E402
from witness.check import Cosigned, witness  # noqa: E402
from witness.known import from_delivery_logs  # noqa: E402
from witness.state import STATE_FORMAT, WitnessState, store_state  # noqa: E402

MINUTE = 60_000
T0 = 1_796_083_200_000  # 2026-12-01: a timed placement (SPEC §6.6)
PID = "pl-bench"


def build(
    nodes: int, minutes: int, tmp: Path
) -> tuple[builders.Cast, PlacementTerms, list[bytes], Path]:
    """The log of ``minutes`` minutes (terms record first) and the delivery log."""
    cast = builders.make_cast("bench-every-minute")
    gpus = [builders.gpu(f"n{k}", 0) for k in range(nodes)]
    terms = builders.make_terms(cast, PID, gpus, T0, T0 + (minutes + 60) * MINUTE)
    writers = [builders.StreamWriter(cast.node_key(g.node_id), PID, g.node_id) for g in gpus]
    inputs = [(builders.signed_terms(cast, terms), T0)]
    delivered = []
    for minute in range(minutes):
        start = T0 + minute * MINUTE
        for g, writer in zip(gpus, writers, strict=True):
            raw = writer.event(start, start + MINUTE, [builders.sample(g)])
            inputs.append((raw, start + MINUTE))
            delivered.append(delivered_usage(raw, start + MINUTE))
    log = tmp / "DELIVERED.jsonl"
    append_delivered(log, delivered)
    records, prev = [], ZERO_HASH
    for index, (raw, arrived) in enumerate(inputs):
        opened = open_envelope(raw)
        record = LedgerRecord(
            placement_id=PID,
            index=index,
            prev=prev,
            kind=opened.kind,  # type: ignore[arg-type]
            source=opened.input_hash,
            status="accepted",
            reason="",
            delivered_mgms=0,
            totals=ZERO_TOTALS,
            arrived_ms=arrived,
        )
        prev = sha256_hex(signed_bytes(record))
        records.append(seal(record, []))
    return cast, terms, records, log


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, object]:
    """Median ms of ``rounds`` calls, and the last result."""
    samples, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples), result


def one(nodes: int, minutes: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cast, terms, records, log = build(nodes, minutes, tmp)
        payloads = [open_envelope(r).payload for r in records]
        n = len(records)
        before = n - nodes  # the tree the witness cosigned a minute ago
        now_s = (T0 + minutes * MINUTE) // 1000 + 1
        prior = make_checkpoint(PID, payloads[:before], cast.ledger)
        # The witness's state at the tree of a minute ago (built by one round from empty).
        empty = WitnessState(format=STATE_FORMAT, placement_id=PID)
        known = from_delivery_logs([log], PID)
        first = witness(
            empty,
            terms,
            prior,
            records[:before],
            known,
            name=cast.operator.name,
            key=cast.operator,
            now_s=now_s - 60,
        )
        assert isinstance(first, Cosigned), first
        state = first.state
        out: dict[str, float] = {"records": float(n)}
        out["ledger_checkpoint"], note = timed(
            lambda: make_checkpoint(PID, payloads, cast.ledger), rounds
        )
        out["witness_read"], _ = timed(lambda: from_delivery_logs([log], PID), rounds)

        def check() -> Cosigned:
            outcome = witness(
                state,
                terms,
                note,  # type: ignore[arg-type]
                records[before:],
                known,
                name=cast.operator.name,
                key=cast.operator,
                now_s=now_s,
            )
            assert isinstance(outcome, Cosigned), outcome
            store_state(tmp / "state", outcome.state)
            return outcome

        out["witness_check"], cosigned = timed(check, rounds)
        stored = note.text()  # type: ignore[attr-defined]
        submitted = cosigned.note.text()  # type: ignore[attr-defined]
        keys = party_note_keys(terms)
        out["ledger_cosign"], _ = timed(
            lambda: merge_cosignature(stored, submitted, keys, cast.ledger.public_key), rounds
        )
        both = cosign(cosigned.note, cast.buyer.name, cast.buyer, now_s).text()  # type: ignore[attr-defined]
        out["verifier_note"], _ = timed(lambda: read_stamps([both], terms, keys), rounds)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--minutes", default="60,1440,10080")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.nodes} nodes, one event per node per minute; median of {args.rounds} rounds")
    print(
        "minutes | records | ledger checkpoint | ledger cosign | witness read | witness check "
        "| verifier/note | per placement-minute (2 witnesses) | 1,000 placements"
    )
    for minutes in (int(m) for m in args.minutes.split(",")):
        r = one(args.nodes, minutes, args.rounds)
        # every minute: one checkpoint, and per party (operator, buyer) a read, a check
        # and a merged cosignature; the verifier's share once per export, per minute
        per_minute = r["ledger_checkpoint"] + 2 * (
            r["witness_read"] + r["witness_check"] + r["ledger_cosign"]
        )
        cores = per_minute * 1000 / 60_000  # ms of CPU per minute over 1,000 placements
        print(
            f"{minutes:>7} | {int(r['records']):>7} | {r['ledger_checkpoint']:8.2f} ms | "
            f"{r['ledger_cosign']:6.2f} ms | {r['witness_read']:7.2f} ms | "
            f"{r['witness_check']:7.2f} ms | {r['verifier_note']:5.2f} ms | "
            f"{per_minute:7.2f} ms | {cores:5.2f} cores"
        )
    print("an export gains one checkpoint row per placement-minute: 1,440 a day")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
