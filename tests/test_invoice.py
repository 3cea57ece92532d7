"""Invoices, credit notes and FOCUS rows from FINAL exports (SPEC §11, §12).

Three placements of one cast over two calendar months (tests/finance_scenario.py): pl-a
in January with a resale and a credit after its close, pl-b in January, pl-c in February
with a charge after its close. Every figure below is checked against the verifier's own
report of each export, and the hand-computed ones against SPEC §7.
"""

from __future__ import annotations

import csv
import io
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from finance_scenario import (
    FEB_MS,
    JAN_MS,
    Placed,
    export,
    finance_cast,
    finance_trust,
    new_buyer_key,
)

from billview.invoice import Invoice, decode, split
from gridledger.cli import main as gridledger_main
from proto.keys import SigningKey
from proto.profile import PartyProfile, sign_profile
from proto.trust import dump_trust
from verifier.verify import verify_export

DAY_MS = 86_400_000
PLACED = (
    Placed("pl-a", JAN_MS, late_credit_minor=40, resold_to=new_buyer_key()),
    Placed("pl-b", JAN_MS + 3 * DAY_MS),
    Placed("pl-c", FEB_MS, late_charge_minor=25),
)


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cast = finance_cast()
        self.trust = root / "trust.json"
        self.trust.write_bytes(dump_trust(finance_trust(self.cast)))
        self.exports = [
            export(root, self.cast, p, root / f"{p.placement_id}.duckdb") for p in PLACED
        ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield Setup(tmp_path_factory.mktemp("finance"))


def _invoice(setup: Setup, out: Path, *extra: str, exports: list[Path] | None = None) -> int:
    paths = [str(p) for p in (setup.exports if exports is None else exports)]
    return gridledger_main(
        ["invoice", *paths, "--trust", str(setup.trust), "--out", str(out), *extra]
    )


def _fails(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The FAIL lines on stderr (log lines, JSON by default off a terminal, aside)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if not line.startswith("{")]


def _docs(out: Path) -> list[Invoice]:
    return [decode(p.read_bytes()) for p in sorted(out.glob("*.json"))]


def test_split_is_exact_and_deterministic() -> None:
    assert split(375, [("a", 3_600_000_000), ("b", 1_800_000_000)]) == {"a": 250, "b": 125}
    parts = split(100, [("x", 1), ("y", 1), ("z", 1)])
    assert parts == {"x": 34, "y": 33, "z": 33}  # the unit left goes to the smaller key
    assert sum(split(-7, [("p", 2), ("q", 1)]).values()) == -7
    assert split(5, [("b", 0), ("a", 0)]) == {"a": 5, "b": 0}


def test_invoices_equal_the_verified_statements(setup: Setup, tmp_path: Path) -> None:
    assert _invoice(setup, tmp_path / "inv") == 0
    docs = _docs(tmp_path / "inv")
    # What the documents move between each payer and payee, per placement...
    moved: dict[tuple[str, str, str], int] = defaultdict(int)
    for doc in docs:
        assert sum(a.total_minor for a in doc.amounts) == sum(x.amount_minor for x in doc.lines)
        for line in doc.lines:
            moved[(line.placement_id, doc.payer.id, doc.payee.id)] += line.amount_minor
        for line in doc.lines:
            if line.gpus:
                assert sum(g.amount_minor for g in line.gpus) == line.amount_minor
    # ... equals what the verifier recomputed for each export's latest final statement.
    expected: dict[tuple[str, str, str], int] = defaultdict(int)
    for path in setup.exports:
        report = verify_export(path, finance_trust(setup.cast))
        assert report.is_final and report.totals is not None
        pid, t = report.placement_id, report.totals
        expected[(pid, "buyer-1", "operator-1")] += t["net_minor"]
        expected[(pid, "operator-1", "desk-1")] += t["fee_minor"]  # fee_payer operator
        for r in report.resale:
            expected[(pid, str(r["new_buyer"]), "desk-1")] += int(r["gross_minor"])
            expected[(pid, "desk-1", "buyer-1")] += int(r["gross_minor"]) - int(r["fee_minor"])
    assert {k: v for k, v in moved.items() if v} == {k: v for k, v in expected.items() if v}
    # Hand-computed (tests/finance_scenario.py): gross 375, fee 18; pl-a credit 40 after
    # its close (net 335, fee 16), resale 1.00 USD less 0.05; pl-c charge 25 (fee 20).
    assert expected[("pl-b", "buyer-1", "operator-1")] == 375
    assert expected[("pl-a", "buyer-1", "operator-1")] == 335
    assert expected[("pl-a", "operator-1", "desk-1")] == 16
    assert expected[("pl-a", "buyer-2", "desk-1")] == 100
    assert expected[("pl-a", "desk-1", "buyer-1")] == 95
    assert expected[("pl-c", "buyer-1", "operator-1")] == 400
    # One invoice per payer per payee per month: January's buyer-1 -> operator-1 covers
    # pl-a and pl-b, with a line per GPU model of each, split by delivered time.
    jan = [d for d in docs if d.kind == "invoice" and d.month == "2026-01"
           and (d.payer.id, d.payee.id) == ("buyer-1", "operator-1")]  # fmt: skip
    assert len(jan) == 1
    inv = jan[0]
    assert [(c.placement_id, c.period) for c in inv.covers] == [("pl-a", 0), ("pl-b", 0)]
    usage = [(x.placement_id, x.sku, x.quantity, x.unit_price, x.amount) for x in inv.lines]
    assert usage == [
        ("pl-a", "A100-80GB", "1.000000", "2.50 / GPU-h", "2.50"),
        ("pl-a", "H100-80GB", "0.500000", "2.50 / GPU-h", "1.25"),
        ("pl-b", "A100-80GB", "1.000000", "2.50 / GPU-h", "2.50"),
        ("pl-b", "H100-80GB", "0.500000", "2.50 / GPU-h", "1.25"),
    ]
    assert inv.amounts[0].total == "7.50" and inv.amounts[0].currency == "USD"
    assert (inv.issue_date, inv.due_date) == ("2026-02-01", "2026-02-01")  # no profile: on issue
    assert len(inv.number) == len("INV-202601-") + 12
    html = (tmp_path / "inv" / f"{inv.number}.html").read_text()
    assert inv.number in html and "7.50 USD" in html and "Due date" in html
    only_feb = tmp_path / "feb"
    assert _invoice(setup, only_feb, "--month", "2026-02") == 0
    assert {d.month for d in _docs(only_feb)} == {"2026-02"}


def test_a_change_after_the_close_yields_a_credit_note_or_supplementary_invoice(
    setup: Setup, tmp_path: Path
) -> None:
    assert _invoice(setup, tmp_path) == 0
    docs = {d.number: d for d in _docs(tmp_path)}
    credit = [d for d in docs.values() if d.kind == "credit_note" and d.payee.id == "operator-1"]
    assert len(credit) == 1
    note = credit[0]
    assert note.number.startswith("CN-202601-") and note.amounts[0].total_minor == -40
    assert [(c.placement_id, c.period, c.previously_invoiced_minor) for c in note.covers] == [
        ("pl-a", 1, 375)
    ]
    (original,) = note.corrects
    assert docs[original].kind == "invoice" and "pl-a" in {
        c.placement_id for c in docs[original].covers
    }
    supplementary = [d for d in docs.values() if d.kind == "supplementary_invoice"
                     and d.payee.id == "operator-1"]  # fmt: skip
    assert [d.amounts[0].total_minor for d in supplementary] == [25]
    assert supplementary[0].corrects and supplementary[0].month == "2026-02"
    # The desk's fee follows the net: 18 -> 16 on pl-a (a credit note to the operator).
    fee_notes = [d for d in docs.values() if d.kind == "credit_note" and d.payee.id == "desk-1"]
    assert [d.amounts[0].total_minor for d in fee_notes] == [-2]


def test_a_tax_rate_in_the_terms_is_its_own_line_rounded_on_cumulative_flows(
    setup: Setup, tmp_path: Path
) -> None:
    """20 % tax (SPEC §11.2): 375 -> 75, the fee 18 -> 3; after a late credit of 40 the
    obligation is 335 (tax 67: -8) and the fee 16 (tax floor(3.2) = 3: no change)."""
    taxed = export(tmp_path, setup.cast, Placed("pl-t", JAN_MS, late_credit_minor=40, tax_bps=2000),
                   tmp_path / "pl-t.duckdb")  # fmt: skip
    assert _invoice(setup, tmp_path / "out", exports=[taxed]) == 0
    docs = {(d.kind, d.payee.id): d for d in _docs(tmp_path / "out")}
    inv = docs[("invoice", "operator-1")]
    assert [(a.subtotal_minor, a.tax_minor, a.total_minor) for a in inv.amounts] == [(375, 75, 450)]
    (tax,) = [x for x in inv.lines if x.kind == "tax"]
    assert tax.description == "Tax 20.00 % of 3.75 USD" and tax.amount == "0.75"
    assert docs[("invoice", "desk-1")].amounts[0].tax_minor == 3
    note = docs[("credit_note", "operator-1")]
    assert [(a.subtotal_minor, a.tax_minor, a.total_minor) for a in note.amounts] == [
        (-40, -8, -48)
    ]
    assert note.covers[0].previously_invoiced_minor == 450
    fee_note = docs[("credit_note", "desk-1")]
    assert [(a.subtotal_minor, a.tax_minor) for a in fee_note.amounts] == [(-2, 0)]
    html = (tmp_path / "out" / f"{inv.number}.html").read_text()
    assert "Tax 20.00 % of 3.75 USD" in html
    focus = tmp_path / "focus.csv"
    argv = ["focus", str(taxed), "--trust", str(setup.trust), "--out", str(focus)]
    assert gridledger_main(argv) == 0
    taxes = [
        r for r in csv.DictReader(io.StringIO(focus.read_text())) if r["ChargeCategory"] == "Tax"
    ]
    assert sorted(r["BilledCost"] for r in taxes) == ["-0.08", "0.03", "0.75"]


def test_buyer_and_operator_build_the_same_bytes(setup: Setup, tmp_path: Path) -> None:
    """Each side verifies its own copy of the exports (another file, another name, another
    order) with its own trust file: the same documents, byte for byte."""
    buyer_dir = tmp_path / "buyer-copies"
    buyer_dir.mkdir()
    copies = [shutil.copy(p, buyer_dir / f"copy-{i}.duckdb") for i, p in enumerate(setup.exports)]
    buyer_trust = tmp_path / "buyer-trust.json"
    buyer_trust.write_bytes(setup.trust.read_bytes())
    assert _invoice(setup, tmp_path / "operator") == 0
    assert gridledger_main(
        ["invoice", *map(str, reversed(copies)), "--trust", str(buyer_trust),
         "--out", str(tmp_path / "buyer")]
    ) == 0  # fmt: skip
    mine = {p.name: p.read_bytes() for p in (tmp_path / "operator").iterdir()}
    theirs = {p.name: p.read_bytes() for p in (tmp_path / "buyer").iterdir()}
    assert len(mine) >= 16 and mine == theirs


def test_an_export_that_is_not_final_is_refused_in_one_line(
    setup: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unwitnessed = export(tmp_path, setup.cast, Placed("pl-d", FEB_MS, witnessed=False),
                         tmp_path / "pl-d.duckdb")  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "out"
    assert _invoice(setup, out, exports=[*setup.exports, unwitnessed]) == 2
    err = _fails(capsys)
    assert len(err) == 1 and err[0].startswith(f"FAIL: {unwitnessed}: PROVISIONAL, not FINAL")
    assert not out.exists()  # nothing written
    # A forged export (a byte of a statement changed) is not verified: refused too.
    forged = tmp_path / "forged.duckdb"
    shutil.copy(setup.exports[1], forged)
    con = duckdb.connect(str(forged))
    con.execute("UPDATE statements SET envelope = envelope || '\\x20'::BLOB")
    con.close()
    capsys.readouterr()
    assert _invoice(setup, out, exports=[forged]) == 2
    err = _fails(capsys)
    assert len(err) == 1 and err[0].startswith(f"FAIL: {forged}: not verified"), err
    for bad, says in (
        (["--month", "2026-13"], "--month '2026-13'"),
        (["--month", "jan"], "--month 'jan'"),
    ):
        assert _invoice(setup, out, *bad) == 2
        assert _fails(capsys) == [f"FAIL: {says}: YYYY-MM, e.g. 2026-01"]
    twice = [setup.exports[1], shutil.copy(setup.exports[1], tmp_path / "again.duckdb")]
    assert _invoice(setup, out, exports=twice) == 2
    (line,) = _fails(capsys)
    assert "placement pl-b is also in" in line


def test_focus_rows_sum_to_the_invoices_and_read_back_in_duckdb_and_arrow(
    setup: Setup, tmp_path: Path
) -> None:
    assert _invoice(setup, tmp_path / "inv") == 0
    docs = _docs(tmp_path / "inv")
    trust = str(setup.trust)
    exports = [str(p) for p in setup.exports]
    csv_path, parquet_path = tmp_path / "focus.csv", tmp_path / "focus.parquet"
    assert gridledger_main(["focus", *exports, "--trust", trust, "--out", str(csv_path)]) == 0
    assert gridledger_main(["focus", *exports, "--trust", trust, "--out", str(parquet_path)]) == 0
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    from decimal import Decimal

    by_invoice: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        assert row["BilledCost"] == row["EffectiveCost"]
        by_invoice[row["InvoiceId"]] += Decimal(row["BilledCost"])
    assert by_invoice == {d.number: Decimal(d.amounts[0].total) for d in docs}
    # One row per GPU per charge period for GPU time, named by the GPU's uuid.
    gpu_rows = [r for r in rows if r["ResourceId"]]
    assert sorted((r["Tags"].split('"gridledger/placement":"')[1][:4], r["ResourceId"])
                  for r in gpu_rows) == sorted(
        (p, u) for p in ("pl-a", "pl-b", "pl-c") for u in ("GPU-n0-0", "GPU-n0-1")
    )  # fmt: skip
    a100 = next(r for r in gpu_rows if r["ResourceId"] == "GPU-n0-0")
    assert (a100["ConsumedQuantity"], a100["ConsumedUnit"], a100["BilledCost"]) == (
        "1.000000", "GPU-Hours", "2.50"
    )  # fmt: skip
    assert a100["SkuId"] == "A100-80GB" and a100["ChargeCategory"] == "Usage"
    assert a100["ChargePeriodStart"] == "2026-01-01T00:00:00Z"
    con = duckdb.connect()
    back = con.execute(
        "SELECT InvoiceId, sum(BilledCost), typeof(sum(BilledCost)), count(*) "
        f"FROM read_parquet('{parquet_path}') GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(n, s, c) for n, s, _, c in back] == sorted(
        (n, v, sum(1 for r in rows if r["InvoiceId"] == n)) for n, v in by_invoice.items()
    )
    assert all(t.startswith("DECIMAL") for _, _, t, _ in back)
    (kinds,) = con.execute(
        f"SELECT list(DISTINCT typeof(ChargePeriodStart)) FROM read_parquet('{parquet_path}')"
    ).fetchone() or ([],)
    assert kinds == ["TIMESTAMP"]
    # A FinOps tool reading with Arrow (pyarrow) sees the same exact decimals.
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_path)
    assert pa.types.is_decimal(table.schema.field("BilledCost").type)
    assert pa.types.is_timestamp(table.schema.field("ChargePeriodStart").type)
    arrow: dict[str, Decimal] = defaultdict(Decimal)
    for number, cost in zip(
        table.column("InvoiceId").to_pylist(), table.column("BilledCost").to_pylist(), strict=True
    ):
        arrow[number] += cost
    assert arrow == by_invoice


def test_focus_refuses_an_unknown_suffix(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["focus", str(setup.exports[0]), "--trust", str(setup.trust), "--out", "rows.xlsx"]
    assert gridledger_main(argv) == 2
    assert _fails(capsys) == ["FAIL: --out rows.xlsx: FILE.csv or FILE.parquet"]


def _profile(key: SigningKey, legal_name: str, net_days: int) -> PartyProfile:
    return PartyProfile(
        party_id=key.name,
        legal_name=legal_name,
        address=["1 Dock Road", "Dublin D02 X285", "Ireland"],
        tax_id="IE1234567T",
        net_days=net_days,
        remit_to="IBAN IE29 AIBK 9311 5212 3456 78",
        issued_at_ms=JAN_MS,
    )


def test_signed_profiles_show_on_every_document(
    setup: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    cast = setup.cast
    (profiles / "op.profile.json").write_bytes(
        sign_profile(_profile(cast.operator, "Acme GPU Cloud Ltd", 30), cast.operator)
    )
    (profiles / "buyer.profile.json").write_bytes(
        sign_profile(_profile(cast.buyer, "Example Labs GmbH", 14), cast.buyer)
    )
    out = tmp_path / "out"
    assert _invoice(setup, out, "--profiles", str(profiles), "--month", "2026-01") == 0
    inv = next(d for d in _docs(out) if d.kind == "invoice" and d.payee.id == "operator-1")
    assert inv.payee.profile is not None and inv.payee.profile.legal_name == "Acme GPU Cloud Ltd"
    assert inv.payer.profile is not None and inv.payer.profile.tax_id == "IE1234567T"
    assert (inv.issue_date, inv.due_date) == ("2026-02-01", "2026-03-03")  # net 30
    html = (out / f"{inv.number}.html").read_text()
    for shown in ("Acme GPU Cloud Ltd", "Example Labs GmbH", "IE1234567T", "net 30 days"):
        assert shown in html
    # A profile signed by another party's key is refused, naming the file.
    forged = profiles / "z.profile.json"
    forged.write_bytes(sign_profile(_profile(cast.desk, "Desk", 0), cast.buyer))
    assert _invoice(setup, tmp_path / "x", "--profiles", str(profiles)) == 2
    assert _fails(capsys) == [f"FAIL: {forged}: not signed by the key pinned for desk-1"]
