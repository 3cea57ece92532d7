"""The docs stay a reference, not a diary (docs/hacking.md, "The rules a change keeps").

* README.md is a front door (at most 300 lines); BENCHMARKS.md holds current figures (at
  most 500 lines), the dated history is left to git.
* Every relative link of README.md and docs/ resolves to a file or folder of the
  repository, and none leaves it.
* Product code cites SPEC sections, files and docs, never tickets or dated work logs
  ("issue 15", "session 14", "close14"): those live in docs/adr/ only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("proto", "transport", "meter", "ledger", "verifier", "witness", "billview", "gridledger")
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# [text](target) and ![alt](target); the target ends at whitespace or the closing paren.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# A ticket or a dated log: "issue 15", "issues 14 and 15", "issue-15", "session 14",
# "Session 13", "close14". Case-insensitive; "issued", "issuer" do not match.
_TICKET = re.compile(r"\b(issues?[ -]?#?\d+|sessions? \d+|close\d+)\b", re.I)


def _links_of(text: str) -> list[str]:
    targets = [m.group(1) for m in _LINK.finditer(_FENCE.sub("", text))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def _relative_links(page: Path) -> list[str]:
    return _links_of(page.read_text(encoding="utf-8"))


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"


def test_benchmarks_holds_current_figures() -> None:
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 500, f"BENCHMARKS.md has {len(lines)} lines; history goes to git"


def test_the_pages_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/architecture.md", "docs/operating.md"} <= names
    assert any(n.startswith("docs/adr/0001-") for n in names)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []


def test_the_link_check_sees_links() -> None:
    """The checker itself: README links into docs/ and to SPEC (else it proves nothing)."""
    links = _relative_links(ROOT / "README.md")
    assert "proto/SPEC.md" in links and "docs/architecture.md" in links
    sample = "```\n[in a fence](a.md)\n```\n[url](https://e.org) [anchor](#x) ![img](b.png)"
    assert _links_of(sample) == ["b.png"]  # fences, URLs and anchors are not checked
    page = ROOT / "docs" / "architecture.md"
    assert "../tests/test_layout.py" in _relative_links(page)


def _product_files() -> list[Path]:
    files = []
    for package in PRODUCT:
        files += sorted((ROOT / package).rglob("*.py"))
        files += sorted((ROOT / package).rglob("*.toml"))
    return files


def test_product_code_cites_no_ticket_or_work_log() -> None:
    found = []
    for path in _product_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _TICKET.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert found == []


@pytest.mark.parametrize(
    ("text", "hit"),
    [
        ("cost (issue 15): 0.37 ms", True),
        ("BENCHMARKS.md session 14", True),
        ("Session 13", True),
        ("close14's first lever", True),
        ("issues 14 and 15", True),
        ("the ledger issues a checkpoint", False),
        ("issued_at_ms", False),
        ("its issuer", False),
        ("a session of the broker", False),
    ],
)
def test_the_ticket_pattern(text: str, hit: bool) -> None:
    assert bool(_TICKET.search(text)) is hit
