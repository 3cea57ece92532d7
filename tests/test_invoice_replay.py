"""Invoices over the replay excerpt (slow: run with ``--run-slow``; ~5 min on 2 cores).

The committed OpenB excerpt (tests/data/openb_excerpt/, docs/replay.md) replayed with its
exports kept: 245 placements of four buyers over two calendar months. With a trust file
that requires no witness (SPEC §9: its ``cosigners`` empty) every export is FINAL, and the
invoices must move, per payer and payee, exactly what the exports' final statements say.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import msgspec
import pytest

from billview.invoice import decode
from gridledger.cli import main as gridledger_main
from proto.envelope import open_envelope
from proto.records import PlacementTerms, Statement
from proto.trust import dump_trust, load_trust

EXCERPT = Path(__file__).resolve().parent / "data" / "openb_excerpt"


def _owed(export: Path) -> Counter[tuple[str, str]]:
    con = duckdb.connect(str(export), read_only=True)
    try:
        (statement,) = con.execute(
            "SELECT envelope FROM statements WHERE final ORDER BY through_index DESC LIMIT 1"
        ).fetchone() or (None,)
        (terms,) = con.execute(
            "SELECT envelope FROM terms WHERE status = 'accepted' ORDER BY chain_index LIMIT 1"
        ).fetchone() or (None,)
    finally:
        con.close()
    s, t = open_envelope(bytes(statement)).record, open_envelope(bytes(terms)).record
    assert isinstance(s, Statement) and isinstance(t, PlacementTerms)
    fee_payer = t.operator.id if t.fee_payer == "operator" else t.buyer.id
    return Counter({(t.buyer.id, t.operator.id): s.totals.net_minor,
                    (fee_payer, t.desk.id): s.totals.fee_minor})  # fmt: skip


@pytest.mark.slow
def test_invoices_of_the_replay_excerpt_equal_its_final_statements(tmp_path: Path) -> None:
    work = tmp_path / "run"
    argv = ["replay", str(EXCERPT), "--workdir", str(work), "--interval-s", "1800",
            "--keep-exports"]  # fmt: skip
    assert gridledger_main(argv) == 0
    trust = msgspec.structs.replace(load_trust(work / "trust.json"), cosigners=[])
    trust_path = tmp_path / "trust.json"
    trust_path.write_bytes(dump_trust(trust))
    exports = sorted((work / "exports").glob("*.duckdb"))
    assert len(exports) > 200
    out = tmp_path / "invoices"
    assert gridledger_main(
        ["invoice", str(work / "exports"), "--trust", str(trust_path), "--out", str(out)]
    ) == 0  # fmt: skip
    expected: Counter[tuple[str, str]] = Counter()
    for export in exports:
        expected.update(_owed(export))
    moved: Counter[tuple[str, str]] = Counter()
    docs = [decode(p.read_bytes()) for p in out.glob("*.json")]
    for doc in docs:
        moved[(doc.payer.id, doc.payee.id)] += sum(a.total_minor for a in doc.amounts)
    assert +moved == +expected
    assert len({d.month for d in docs}) >= 2 and len({d.payer.id for d in docs}) >= 4
