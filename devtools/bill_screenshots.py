"""Screenshots of the demo's statement for docs/bill.md: ``python -m devtools.bill_screenshots``.

Runs ``gridledger demo`` into a temporary directory, opens the buyer's page that
``gridledger verify --html`` wrote there in headless Chromium (``make browser``), and
writes three small palette PNGs into ``docs/``: the summary and line items, the
delivery per GPU with its timeline, and the verification.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

from gridledger.demo import run_demo

CHROMIUM = "/usr/bin/chromium"
OUT = Path(__file__).resolve().parent.parent / "docs"
PARTS = (
    ("bill-summary.png", "nav", "h2:has-text('Delivery per GPU')"),
    ("bill-delivery.png", "h2:has-text('Delivery per GPU')", "h2:has-text('Terms')"),
    ("bill-verification.png", "h2:has-text('Statement periods')", "body"),
)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gridledger-shots-") as tmp:
        result = run_demo(Path(tmp) / "demo")
        full = Path(tmp) / "full.png"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            page.goto(result.statement_html.as_uri())
            page.screenshot(path=str(full), full_page=True)
            cuts = []
            for name, top, bottom in PARTS:
                upper = page.locator(top).first.bounding_box()
                lower = page.locator(bottom).first.bounding_box()
                if upper is None or lower is None:
                    raise SystemExit(f"cannot find {top} / {bottom} on the page")
                end = lower["y"] + (lower["height"] if bottom == "body" else 0)
                cuts.append((name, int(upper["y"]) - 12, int(end) - 4))
            browser.close()
        with Image.open(full) as image:
            for name, y0, y1 in cuts:
                part = image.convert("RGB").crop((0, max(0, y0), image.width, y1))
                part.quantize(colors=64).save(OUT / name, optimize=True)
                print(f"{OUT / name}: {(OUT / name).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
