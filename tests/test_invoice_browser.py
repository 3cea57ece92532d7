"""Invoices and credit notes in a real browser: headless Chromium (Debian's ``chromium``,
``make browser``) driven by Playwright, as tests/test_bill_browser.py does for the
statement page. Each page is opened from the file ``gridledger invoice`` wrote, shown at
the width of an A4 sheet and printed to PDF; what a person reads is checked against the
JSON document. ``GRIDLEDGER_SCREENSHOTS=DIR`` also keeps the screenshots there (the ones
in docs/ were made so)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from billview.invoice import decode
from gridledger.cli import main as gridledger_main
from proto.profile import PartyProfile, sign_profile
from proto.trust import dump_trust

CHROMIUM = Path("/usr/bin/chromium")
A4_WIDTH_PX = 794  # 210 mm at 96 px per inch


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)"
    )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], timeout=60_000
        )
        try:
            yield chromium
        finally:
            chromium.close()


def _profiles(tmp: Path) -> Path:
    cast = finance_cast()
    out = tmp / "profiles"
    out.mkdir()
    for key, name, lines, days in (
        (cast.operator, "Acme GPU Cloud Ltd", ["1 Dock Road", "Dublin D02 X285", "Ireland"], 30),
        (cast.buyer, "Example Labs GmbH", ["Invalidenstraße 1", "10115 Berlin", "Germany"], 14),
    ):
        profile = PartyProfile(
            party_id=key.name, legal_name=name, address=lines, tax_id="EU123456789",
            net_days=days, remit_to="IBAN IE29 AIBK 9311 5212 3456 78", issued_at_ms=JAN_MS,
        )  # fmt: skip
        (out / f"{key.name}.profile.json").write_bytes(sign_profile(profile, key))
    return out


def test_invoice_and_credit_note_pages_in_chromium(browser: Any, tmp_path: Path) -> None:
    cast = finance_cast()
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(finance_trust(cast)))
    placed = (
        Placed("pl-a", JAN_MS, late_credit_minor=40, resold_to=new_buyer_key()),
        Placed("pl-b", JAN_MS + 86_400_000),
        Placed("pl-c", FEB_MS),
    )
    exports = [
        str(export(tmp_path, cast, p, tmp_path / f"{p.placement_id}.duckdb")) for p in placed
    ]
    out = tmp_path / "docs"
    argv = ["invoice", *exports, "--trust", str(trust), "--out", str(out), "--month", "2026-01",
            "--profiles", str(_profiles(tmp_path))]  # fmt: skip
    assert gridledger_main(argv) == 0
    docs = [decode(p.read_bytes()) for p in sorted(out.glob("*.json"))]
    invoice = next(d for d in docs if d.kind == "invoice" and d.payee.id == "operator-1")
    credit = next(d for d in docs if d.kind == "credit_note" and d.payee.id == "operator-1")
    keep = os.environ.get("GRIDLEDGER_SCREENSHOTS")
    for doc, name in ((invoice, "invoice.png"), (credit, "credit-note.png")):
        page = browser.new_page(viewport={"width": A4_WIDTH_PX, "height": 1123})
        problems: list[str] = []
        page.on(
            "console", lambda m, seen=problems: seen.append(m.text) if m.type == "error" else None
        )
        page.on("pageerror", lambda e, seen=problems: seen.append(str(e)))
        try:
            page.goto((out / f"{doc.number}.html").as_uri(), wait_until="load", timeout=60_000)
            shot = tmp_path / name
            page.screenshot(path=str(shot), full_page=True)
            assert problems == []
            assert page.locator("[data-number]").inner_text() == doc.number
            total = doc.amounts[0]
            shown = page.locator(f'[data-total="{total.currency}"]').inner_text()
            assert shown == f"{total.total.lstrip('-')} {total.currency}"  # a credit: to the payer
            amounts = [int(a) for a in page.locator("[data-amount]").evaluate_all(
                "els => els.map(e => e.dataset.amount)")]  # fmt: skip
            assert amounts == [line.amount_minor for line in doc.lines]
            assert sum(amounts) == total.total_minor
            text = page.inner_text("body")
            for seen in ("Acme GPU Cloud Ltd", "Example Labs GmbH", "Dublin D02 X285",
                          doc.issue_date, doc.due_date, *doc.corrects):  # fmt: skip
                assert seen in text
            # Fits an A4 sheet's width: nothing runs off the side.
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= A4_WIDTH_PX, width
            pdf = page.pdf(format="A4")
            assert pdf.startswith(b"%PDF") and len(pdf) > 5_000
            assert shot.stat().st_size > 10_000
            if keep:
                shutil.copy(shot, Path(keep) / name)
        finally:
            page.close()
    assert credit.corrects == [invoice.number]
    assert (invoice.due_date, credit.kind) == ("2026-03-03", "credit_note")  # net 30


def test_statement_pages_for_their_readers_in_chromium(browser: Any, tmp_path: Path) -> None:
    """Issue 42 item 4 on the demo's verified pages: each total says who pays whom, the
    original buyer's page names what it pays the operator and what the desk pays it after
    the resale, the new buyer's page shows its own obligation only, a unit-price column,
    formulas folded away, and the per-GPU table within an A4 sheet's width."""
    from gridledger.demo import run_demo

    result = run_demo(tmp_path / "demo")
    pages = result.statement_html.parent
    seen: dict[str, dict[str, Any]] = {}
    for party in ("buyer", "finetune-labs"):
        page = browser.new_page(viewport={"width": A4_WIDTH_PX, "height": 1123})
        try:
            page.goto((pages / f"{result.statement_html.name.split('.')[0]}.{party}.html").as_uri())
            seen[party] = {
                "cards": page.locator(".summary .card").all_inner_texts(),
                "width": page.evaluate("document.documentElement.scrollWidth"),
                "unit_price": page.locator('tr[data-line="gross"] td').nth(2).inner_text()
                if party == "buyer"
                else "",
                "folded": page.locator("details.derivation[open]").count(),
                "flows": {
                    key: page.locator(f'tr[data-line="{key}"] td').nth(3).inner_text()
                    for key in ("buyer_owes", "operator_receives", "desk_receives")
                }
                if party == "buyer"
                else {},
                "details": page.locator("details.derivation").count(),
            }
            if party == "buyer" and os.environ.get("GRIDLEDGER_SCREENSHOTS"):
                shot = Path(os.environ["GRIDLEDGER_SCREENSHOTS"]) / "statement-buyer.png"
                page.screenshot(path=str(shot), full_page=True)
        finally:
            page.close()
    buyer = seen["buyer"]
    assert buyer["cards"][0].splitlines() == [
        "You, the buyer (inferco-batch), pays the operator (acme-gpu-cloud)", "4.45 USD"
    ]  # fmt: skip
    assert any(c.startswith("The desk (gridx-desk) pays you the resale proceeds") and
               c.endswith("1.57 USD") for c in buyer["cards"])  # fmt: skip
    assert any(c.startswith("Your net: you pay in all") and c.endswith("2.88 USD")
               for c in buyer["cards"])  # fmt: skip
    assert buyer["unit_price"] == "2.45 USD/GPU-h"
    assert buyer["flows"] == {  # every total says who pays whom (the operator pays the fee)
        "buyer_owes": "buyer → operator",
        "operator_receives": "buyer → operator (less the fee it pays the desk)",
        "desk_receives": "operator → desk",
    }
    assert buyer["details"] > 10 and buyer["folded"] == 0
    new_buyer = seen["finetune-labs"]
    assert new_buyer["cards"] == [
        "You, the new buyer (finetune-labs) pays the desk (gridx-desk) for resale "
        "resale-0001\n1.61 USD"
    ]
    for party, page_seen in seen.items():
        assert page_seen["width"] <= A4_WIDTH_PX, (party, page_seen["width"])


def test_audit_appendix_in_chromium(browser: Any, tmp_path: Path) -> None:
    """Issue 42 item 5: the appendix opens without error, fits an A4 width, and shows the
    verdict, the export's SHA-256 and the rejected input with its reason."""
    import hashlib

    from bill_scenario import PID, run_bill_scenario

    from ledger.export import export_placement

    scenario = run_bill_scenario(tmp_path)
    export_file = tmp_path / "export.duckdb"
    export_placement(scenario.service.store, PID, export_file, key=scenario.service.key)
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(scenario.cast.trust()))
    out = tmp_path / "audit"
    argv = ["audit", str(export_file), "--trust", str(trust), "--out", str(out)]
    assert gridledger_main(argv) == 0
    page = browser.new_page(viewport={"width": A4_WIDTH_PX, "height": 1123})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.goto((out / f"{PID}.audit.html").as_uri(), wait_until="load")
        assert problems == []
        assert page.locator("[data-verdict]").inner_text() == "PROVISIONAL"
        sha = hashlib.sha256(export_file.read_bytes()).hexdigest()
        assert page.locator("[data-export-sha256]").inner_text() == sha
        assert "SIG_MISSING" in page.inner_text("body")
        assert page.evaluate("document.documentElement.scrollWidth") <= A4_WIDTH_PX
        if os.environ.get("GRIDLEDGER_SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["GRIDLEDGER_SCREENSHOTS"]) / "audit.png"))
    finally:
        page.close()
