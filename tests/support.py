"""Helpers several test files share (import as ``support``; tests/ is on the path)."""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tomli_w

from proto.envelope import open_envelope
from proto.records import UsageEvent


def usage_events(envelopes: Iterable[bytes]) -> list[UsageEvent]:
    """The UsageEvents inside ``envelopes``; anything else in them fails the test."""
    out = []
    for envelope in envelopes:
        record = open_envelope(envelope).record
        assert isinstance(record, UsageEvent), f"a {type(record).__name__}, not a usage event"
        out.append(record)
    return out


def ledger_toml(
    path: Path,
    key_file: Path,
    *,
    ledger_id: str = "ledger-1",
    db: str | Path = "ledger.duckdb",
    transport: str = "local",
    local_dir: str | Path = "spool",
    kafka: dict[str, Any] | None = None,
    **top: Any,
) -> Path:
    """Write a ledger.toml at ``path`` (top-level keys in ``top``, e.g. http, clock_ms)."""
    data: dict[str, Any] = {
        "ledger_id": ledger_id,
        "key_file": str(key_file),
        "db": str(db),
        "transport": transport,
    }
    if transport == "local":
        data["local_dir"] = str(local_dir)
    data.update(top)
    if kafka is not None:
        data["kafka"] = kafka
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


CHROMIUM = Path("/usr/bin/chromium")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (playwright), closed on leaving; the browser tests' fixture."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], timeout=60_000
        )
        try:
            yield browser
        finally:
            browser.close()


def meter_config(tmp: Path, cast_name: str, start_ms: int, end_ms: int, **changes: Any) -> Path:
    """A simulated meter under ``tmp`` (node n1, one GPU, placement pl-m over [start_ms,
    end_ms) of cast ``cast_name``): its config file, with ``changes`` written over."""
    from devtools import builders
    from devtools.scenario import write_meter_setup

    cast = builders.make_cast(cast_name)
    terms = builders.make_terms(cast, "pl-m", [builders.gpu("n1", 0)], start_ms, end_ms)
    config = write_meter_setup(tmp, cast, "n1", [terms], simulate="seed=1")
    data = tomllib.loads(config.read_text())
    data.update(changes)
    config.write_text(tomli_w.dumps(data))
    return config
