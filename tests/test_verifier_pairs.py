"""The pass's fast path (``verifier/pair_worker.py``, ``verifier/walk.py``): a usage chain index
checked in a worker and returned as a compact row must give exactly the report the
ordinary per-index checks give, on honest and on tampered exports alike.

The ordinary path is forced by switching ``walk.pairable`` off; the reports are compared
whole (verdict, totals, counts, every finding kept), so a check the fast path skipped, or
a finding it named differently, fails here.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_verifier_exports import Scenario, explain, full_scenario, verify

from proto.envelope import add_signatures, decode_envelope, encode_envelope
from proto.keys import key_id
from verifier import limits, walk
from verifier.opener import SIG_INVALID, open_one, open_plain
from verifier.pair_worker import ONE, PAIR, FastPair, PairContext, SlowPair, open_jobs
from verifier.signers import required_of
from verifier.source import ExportSource, first_per_index
from verifier.state import ExportReport
from verifier.verify import verify_export
from verifier.workers import OpenPool


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("pairs"))


def _whole(report: ExportReport) -> tuple[Any, ...]:
    return (
        report.verdict,
        report.totals,
        report.head_index,
        report.counts,
        report.findings.counts,
        [f.line() for f in report.findings.kept],
    )


def _mutated(s: Scenario, tmp: Path, *sql: str) -> Path:
    path = tmp / "mutated.duckdb"
    shutil.copyfile(s.path, path)
    with duckdb.connect(str(path)) as con:
        for statement in sql:
            con.execute(statement)
    return path


def _usage_index(s: Scenario, k: int) -> int:
    with duckdb.connect(str(s.path), read_only=True) as con:
        rows = con.execute(
            "SELECT chain_index FROM usage_events WHERE status = 'accepted' ORDER BY chain_index"
        ).fetchall()
    return int(rows[k][0])


# Each: SQL on a copy of the honest export (``{i}``: the chain index of an accepted usage
# event, ``{j}``: another one), and a rule the report must then carry ('' for none).
MUTATIONS = {
    "honest": ((), ""),
    "usage column": (
        ("UPDATE usage_events SET start_ms = start_ms + 1 WHERE chain_index = {i}",),
        "COLUMN_MISMATCH",
    ),
    "record column": (
        ("UPDATE ledger_records SET gross_minor = gross_minor + 1 WHERE chain_index = {i}",),
        "COLUMN_MISMATCH",
    ),
    "input_hash column": (
        ("UPDATE usage_events SET input_hash = repeat('0', 64) WHERE chain_index = {i}",),
        "INPUT_HASH",
    ),
    "input status": (
        (
            "UPDATE usage_events SET status = 'rejected', reason = 'SEQ_GAP' "
            "WHERE chain_index = {i}",
        ),
        "CHAIN_STATUS",
    ),
    "records swapped": (
        (
            "UPDATE ledger_records SET chain_index = -1 WHERE chain_index = {i}",
            "UPDATE ledger_records SET chain_index = {i} WHERE chain_index = {j}",
            "UPDATE ledger_records SET chain_index = {j} WHERE chain_index = -1",
        ),
        "CHAIN_INDEX",
    ),
    "envelope of another event": (
        (
            "UPDATE usage_events SET envelope = (SELECT envelope FROM usage_events "
            "WHERE chain_index = {j}) WHERE chain_index = {i}",
        ),
        "CHAIN_SOURCE",
    ),
    "record dropped": (("DELETE FROM ledger_records WHERE chain_index = {i}",), "CHAIN_GAP"),
    "record duplicated": (
        ("INSERT INTO ledger_records SELECT * FROM ledger_records WHERE chain_index = {i}",),
        "CHAIN_DUPLICATE_INDEX",
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_fast_path_reports_exactly_what_the_ordinary_path_reports(
    honest: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    sql, rule = MUTATIONS[name]
    i, j = _usage_index(honest, 1), _usage_index(honest, 3)
    path = _mutated(honest, tmp_path, *(s.format(i=i, j=j) for s in sql))
    fast_taken = 0
    check_fast = walk._check_fast

    def counting(*args: Any) -> str:
        nonlocal fast_taken
        fast_taken += 1
        return check_fast(*args)

    monkeypatch.setattr(walk, "_check_fast", counting)
    fast = verify(path, honest.trust)
    assert fast_taken > 0, "no chain index went through the fast path"
    if rule:
        assert rule in fast.findings.rules(), explain(fast)
    else:
        assert fast.ok, explain(fast)
    monkeypatch.setattr(walk, "pairable", lambda record, rows: False)
    fast_taken = 0
    ordinary = verify(path, honest.trust)
    assert fast_taken == 0
    assert _whole(fast) == _whole(ordinary)


def test_a_process_pool_gives_the_inline_report(honest: Scenario, tmp_path: Path) -> None:
    i = _usage_index(honest, 2)
    path = _mutated(
        honest, tmp_path, f"UPDATE usage_events SET end_ms = end_ms + 7 WHERE chain_index = {i}"
    )
    for export in (honest.path, path):
        with OpenPool[Any]("process", 2) as pool:
            pooled = verify_export(export, honest.trust, pool=pool)
        assert _whole(pooled) == _whole(verify(export, honest.trust))
    assert not pooled.ok


def test_workers_return_a_fast_row_only_when_every_stateless_check_passes(
    honest: Scenario,
) -> None:
    i = _usage_index(honest, 0)
    with ExportSource(honest.path) as source:
        batch = next(iter(source.batches()))
    record = next(r for r in batch.records if r.chain_index == i)
    row = next(r for r in batch.inputs if r.chain_index == i)
    keys = {honest.terms.ledger_key, *(n.key for n in honest.terms.nodes)}
    ring = {key_id(k): [k] for k in keys}
    ledger = required_of([honest.terms.ledger_key])
    # Export format version 2 (SPEC §8): no record signature required, the ledger's allowed.
    context = PairContext(ring, honest.terms.placement_id, {}, ledger)

    def job(**change: Any) -> tuple[Any, ...]:
        fields = {
            "index": i,
            "rec": record.envelope,
            "columns": record.columns,
            "inp": row.envelope,
            "input_hash": row.input_hash,
            "status": row.status,
            "reason": row.reason,
            "extras": row.extras,
            **change,
        }
        return (PAIR, *fields.values())

    bumped = (record.columns[0], *record.columns[1:4], record.columns[4] + 1, *record.columns[5:])
    results = open_jobs(
        [
            job(),
            job(index=i + 1),  # the record's own index differs
            job(columns=bumped),  # a record column
            job(extras=(*row.extras[:3], row.extras[3] + 1)),  # a usage column
            job(input_hash="0" * 64),
            job(status="rejected"),
            job(rec=record.envelope[:-2] + b"}}"),  # not canonical
            (ONE, 7, row.envelope),
        ],
        context,
    )
    assert type(results[0]) is FastPair
    fast = results[0]
    assert (fast.chain_index, fast.record_hash, fast.opened.input_hash) == (
        i,
        record.columns[0],
        row.input_hash,
    )
    assert fast.record_row[:2] == (i, record.columns[0])
    assert [type(r) for r in results[1:7]] == [SlowPair] * 6
    assert results[7].tag == 7 and results[7].input_hash == row.input_hash
    # without the ledger key in the ring its signature does not verify: not fast either
    # version 1 requires the ledger's signature on the record: the unsigned one is not fast
    v1 = PairContext(ring, context.placement_id, ledger)
    assert type(open_jobs([job()], v1)[0]) is SlowPair
    # a signature present is checked: without the ledger key in the ring it does not verify
    signed = add_signatures(decode_envelope(record.envelope), [honest.cast.ledger])
    with_sig = job(rec=encode_envelope(signed))
    assert type(open_jobs([with_sig], context)[0]) is FastPair
    blind = PairContext({}, context.placement_id, context.ledger_required, ledger)
    assert type(open_jobs([with_sig], blind)[0]) is SlowPair


def test_first_per_index_keeps_the_lowest_rowid_of_each_index_in_chain_order() -> None:
    ordered = [(10, 0, "a"), (11, 1, "b"), (12, 2, "c")]
    assert first_per_index(ordered) is ordered
    shuffled = [(12, 2, "c"), (30, 1, "b2"), (11, 1, "b"), (10, 0, "a"), (5, 2, "c0")]
    assert first_per_index(shuffled) == [(10, 0, "a"), (11, 1, "b"), (5, 2, "c0")]
    assert first_per_index([]) == []


def test_the_pass_collects_garbage_less_often_and_restores_the_threshold(
    honest: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = gc.get_threshold()
    during: list[tuple[int, int, int]] = []
    check_planned = walk._check_planned

    def recording(*args: Any) -> None:
        during.append(gc.get_threshold())
        check_planned(*args)

    monkeypatch.setattr(walk, "_check_planned", recording)
    report = verify(honest.path, honest.trust)
    assert report.ok, explain(report)
    assert during and all(t[0] >= limits.GC_GEN0_THRESHOLD for t in during), during
    assert all(t[1:] == before[1:] for t in during)
    assert gc.get_threshold() == before


def test_open_plain_opens_exactly_as_open_one_or_leaves_it_to_it(honest: Scenario) -> None:
    """``open_plain`` (the pair's one-call opener) returns what ``open_one`` returns, or
    None: on every envelope of the export and on broken, resigned and swapped variants."""
    with ExportSource(honest.path) as source:
        batch = next(iter(source.batches()))
    keys = {honest.terms.ledger_key, *(n.key for n in honest.terms.nodes)}
    ring = {key_id(k): [k] for k in keys}
    usage = [r.envelope for r in batch.inputs if r.kind == "usage"]
    records = [r.envelope for r in batch.records]
    others = [r.envelope for r in batch.inputs if r.kind != "usage"]
    assert usage and records and others
    signed = encode_envelope(add_signatures(decode_envelope(records[0]), [honest.cast.ledger]))
    twice = encode_envelope(
        add_signatures(decode_envelope(usage[0]), [honest.cast.ledger, honest.cast.operator])
    )
    broken = [
        usage[0][:-2] + b"}}",  # not canonical
        usage[0].replace(b'"payload":"', b'"payload": "', 1),  # whitespace
        usage[0][:40],  # truncated
        b"[]",
        b"",
        usage[0][:-10] + (b"B" if usage[0][-10:-9] == b"A" else b"A") + usage[0][-9:],  # a sig
        usage[0] + b" ",
        signed,  # a record signed by the ledger
        twice,  # two signatures: left to open_one
        b"x" * 300_000,  # over MAX_ENVELOPE_BYTES
    ]
    opened = 0
    for kind in ("usage", "record"):
        for raw in usage + records + others + broken:
            for keyring in (ring, {}):
                plain = open_plain(3, raw, kind, keyring)
                if plain is not None:
                    opened += 1
                    assert plain == open_one(3, raw, keyring)
                    assert plain.kind == kind and plain.record == open_one(3, raw, keyring).record
    assert open_plain(0, twice, "usage", ring) is None
    assert open_plain(0, signed, "record", ring) == open_one(0, signed, ring)
    assert open_plain(0, usage[0], "record", ring) is None  # another kind
    assert opened >= 2 * (len(usage) + len(records)) + 2
    # a signature byte changed: opened, the signature invalid, as open_one says
    bad = open_plain(0, broken[5], "usage", ring)
    assert bad is not None and bad.sigs[0].outcome == SIG_INVALID
