"""The statement page in a real browser: headless Chromium (Debian's ``chromium``,
installed by ``make browser``, which ``make test`` runs first) driven by Playwright.

It loads the page from a running ledger's API and the page ``gridledger verify --html``
wrote offline, takes a screenshot of each and checks what a person sees: every party's
amount and the settlement lines present and equal to the signed statement's, the
delivery picture drawn (bars of every state in the SVG, and its colours on the
screenshot), the verdict, and no console error. If Chromium cannot start, the test
fails: it never skips.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bill_scenario import EXPECTED, PID, run_bill_scenario
from PIL import Image

from gridledger.cli import main as gridledger_main
from ledger.export import export_placement
from ledger.http import LedgerApi, LedgerHttpServer
from proto.cosign import cosign
from proto.money import format_minor
from proto.note import parse_note
from proto.trust import dump_trust

CHROMIUM = Path("/usr/bin/chromium")
# The amounts a person reads in the summary cards and the settlement lines.
SHOWN = (
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
    "line:gross_minor",
    "line:reclaim_credit_minor",
    "line:sla_credit_minor",
    "line:credits_minor",
    "line:net_minor",
    "line:fee_minor",
)
DELIVERED_GREEN = (0x2E, 0x7D, 0x32)
UNHEALTHY_RED = (0xC6, 0x28, 0x28)

# Cosignatures are dated by the witness's clock, which the ledger bounds by its own
# (SPEC §8.4).
_NOW_S = int(time.time())


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


def _look(browser: Any, url: str, shot: Path) -> dict[str, Any]:
    """Open ``url``, screenshot it, and read what a person sees."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    try:
        response = page.goto(url, wait_until="load", timeout=60_000)
        page.screenshot(path=str(shot), full_page=True)
        seen = {
            "status": None if response is None else response.status,
            "totals": {
                el.get_attribute("data-total"): el.inner_text()
                for el in page.query_selector_all("[data-total]")
                if el.is_visible()
            },
            "bars": {
                state: page.locator(f'svg g[id^="bill-{state}-"] path').count()
                for state in ("delivered", "unhealthy", "unallocated", "reclaimed", "unreported")
            },
            "svg_box": page.locator(".timeline svg").bounding_box(),
            "verdict": page.locator("[data-verdict]").inner_text(),
            "title": page.title(),
            "problems": problems,
        }
    finally:
        page.close()
    return seen


def _colours(shot: Path) -> set[tuple[int, int, int]]:
    with Image.open(shot) as image:
        small = image.convert("RGB")
        return {
            small.getpixel((x, y))
            for x in range(0, small.width, 3)
            for y in range(0, small.height, 3)
        }  # type: ignore[misc]


def _check(seen: dict[str, Any], shot: Path, verdict: str) -> None:
    assert seen["problems"] == []
    assert seen["title"] == f"Statement {PID} — buyer"
    for name in SHOWN:
        total = name.removeprefix("line:")
        assert seen["totals"].get(name) == f"{format_minor(EXPECTED[total], 2)} USD", name
    assert all(seen["bars"][state] > 0 for state in seen["bars"]), seen["bars"]
    box = seen["svg_box"]
    assert box is not None and box["width"] > 500 and box["height"] > 100
    assert seen["verdict"] == verdict
    assert shot.stat().st_size > 20_000
    colours = _colours(shot)
    assert DELIVERED_GREEN in colours and UNHEALTHY_RED in colours  # the bars, as painted


def test_statement_page_in_chromium(browser: Any, tmp_path: Path) -> None:
    scenario = run_bill_scenario(tmp_path)
    service, cast = scenario.service, scenario.cast
    api = LedgerApi(service.store, service.key, service.metrics)
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        base = f"{server.url}/placements/{PID}"
        with urllib.request.urlopen(f"{base}/statement", timeout=60) as reply:
            statement = json.loads(reply.read())
        assert (
            statement["final"] and {k: statement["totals"][k] for k in EXPECTED} == EXPECTED
        )  # the signed statement is what the page must show
        # Operator and buyer witness the closed log, so the offline verdict is FINAL.
        # SPEC §8.4: a party asks for a checkpoint (POST); a GET issues none.
        asked = urllib.request.Request(f"{base}/checkpoint", data=b"", method="POST")
        with urllib.request.urlopen(asked, timeout=60) as reply:
            note = parse_note(reply.read().decode())
        for party in (cast.operator, cast.buyer):
            signed = cosign(note, party.name, party, _NOW_S).text().encode()
            request = urllib.request.Request(f"{base}/checkpoint/cosign", data=signed)
            with urllib.request.urlopen(request, timeout=60) as reply:
                assert reply.status == 200
        shot = tmp_path / "api.png"
        seen = _look(browser, f"{base}/statement.html?party=buyer", shot)
        assert seen["status"] == 200
        _check(seen, shot, "FINAL")
    finally:
        server.stop()

    export = tmp_path / "export.duckdb"
    export_placement(service.store, PID, export, key=service.key)
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(cast.trust()))
    out = tmp_path / "offline"
    assert gridledger_main(["verify", str(export), "--trust", str(trust), "--html", str(out)]) == 0
    shot = tmp_path / "offline.png"
    seen = _look(browser, (out / f"{PID}.buyer.html").as_uri(), shot)
    _check(seen, shot, "FINAL")


def _visible_totals(browser: Any, url: str, shot: Path) -> tuple[str, set[str], list[str]]:
    """(data-party, the visible data-total names, console problems) of a page."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.goto(url, wait_until="load", timeout=60_000)
        page.screenshot(path=str(shot), full_page=True)
        party = str(page.locator("body").get_attribute("data-party"))
        totals = {
            str(el.get_attribute("data-total"))
            for el in page.query_selector_all("[data-total]")
            if el.is_visible()
        }
    finally:
        page.close()
    return party, totals, problems


def test_each_partys_page_fetched_with_its_key_in_chromium(browser: Any, tmp_path: Path) -> None:
    """SPEC §13: each party fetches its own page with its own key (``gridledger fetch
    page``) and a person reads it in Chromium: the buyer, operator and desk see theirs; the
    new buyer of a resale sees only its obligation, none of the other parties' amounts."""
    from test_resale import PID as RESALE_PID
    from test_resale import _run_pipeline

    from ledger.access import Access
    from proto.keys import write_key_pair

    run = _run_pipeline(tmp_path / "resale")
    access = Access(run.store, run.cast.ledger.public_key, clock_s=lambda: int(time.time()))
    server = LedgerHttpServer(
        LedgerApi(run.store, run.service.key, run.service.metrics, access=access), "127.0.0.1", 0
    )
    server.start()
    seen: dict[str, tuple[str, set[str], list[str]]] = {}
    try:
        for who, key in (
            ("buyer", run.cast.buyer),
            ("operator", run.cast.operator),
            ("desk", run.cast.desk),
            ("buyer-2", run.buyer2),
        ):
            key_file, _ = write_key_pair(key, tmp_path / "keys" / who)
            out = tmp_path / f"{who}.html"
            argv = ["fetch", "page", RESALE_PID, "--ledger", server.url, "--key", str(key_file)]
            assert gridledger_main([*argv, "--out", str(out)]) == 0
            seen[who] = _visible_totals(browser, out.as_uri(), tmp_path / f"{who}.png")
    finally:
        server.stop()
        run.service.close()
    for who, (party, _totals, problems) in seen.items():
        assert party == who and problems == [], (who, problems)
    assert {"buyer_owes_minor", "buyer_net"} <= seen["buyer"][1]
    assert "operator_receives_minor" in seen["operator"][1]
    assert "desk_total" in seen["desk"][1]
    assert seen["buyer-2"][1] == {"resale:as-1"}, seen["buyer-2"][1]
