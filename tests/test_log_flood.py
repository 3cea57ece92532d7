"""A flood of bad input is stored and counted in full, and logged in bounded lines.

Every quarantined input and every rejected terms input used to get a log line of its own:
anyone who can write to the stream could turn garbage into as many log lines (disk, and a
log nobody can read). Per batch at most ``LOG_INPUT_LINES_PER_BATCH`` lines name one input;
the rest are counted, by event and reason, in one ``inputs_not_logged`` line. Nothing of
the store changes: every such input is still a quarantine row or a chained record.
"""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs
from test_held_rows import CAST, WS, Feed, terms_of

from devtools import builders as b
from ledger.ingest import Ingestor
from ledger.limits import LOG_INPUT_LINES_PER_BATCH
from ledger.store import Store

FLOOD = LOG_INPUT_LINES_PER_BATCH * 3 + 5


def _ingest(tmp_path: Path, feed: Feed) -> tuple[list[dict[str, object]], Store]:
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=CAST.ledger.public_key)
    ingestor = Ingestor(store, CAST.ledger)
    try:
        with capture_logs() as logs:
            report = ingestor.ingest(feed.items)
    finally:
        ingestor.close()
    assert report.inputs == len(feed.items)
    return logs, store


def test_a_flood_of_undecodable_inputs_is_stored_whole_and_logged_in_bounded_lines(
    tmp_path: Path,
) -> None:
    feed = Feed()
    feed.add("flood-1", [b"not an envelope %d" % i for i in range(FLOOD)])
    logs, store = _ingest(tmp_path, feed)
    try:
        named = [e for e in logs if e["event"] == "input_quarantined"]
        assert len(named) == LOG_INPUT_LINES_PER_BATCH
        assert [e["position"] for e in named] == [
            i.position for i in feed.items[:LOG_INPUT_LINES_PER_BATCH]
        ]
        (summary,) = [e for e in logs if e["event"] == "inputs_not_logged"]
        assert summary["count"] == FLOOD - LOG_INPUT_LINES_PER_BATCH
        by = summary["by_event_reason"]
        assert isinstance(by, dict) and sum(by.values()) == summary["count"]
        assert all(k.startswith("input_quarantined:") for k in by)
        # Every input is stored, whatever was logged.
        assert store._rows("SELECT count(*) FROM quarantine")[0][0] == FLOOD
    finally:
        store.close()


def test_rejected_terms_share_the_bound(
    tmp_path: Path,
) -> None:
    feed = Feed()
    # Terms whose window ends before it starts: each rejected (TERMS_INVALID) and chained.
    bad = [
        b.signed_terms(CAST, b.make_terms(CAST, f"bad-{i}", [b.gpu("n0", i % 200)], WS + 1000, WS))
        for i in range(LOG_INPUT_LINES_PER_BATCH + 3)
    ]
    for i, raw in enumerate(bad):
        feed.add(f"bad-{i}", [raw])
    logs, store = _ingest(tmp_path, feed)
    try:
        named = [e for e in logs if e["event"] == "terms_rejected"]
        assert len(named) == LOG_INPUT_LINES_PER_BATCH
        (summary,) = [e for e in logs if e["event"] == "inputs_not_logged"]
        assert summary["count"] == 3
        (key,) = summary["by_event_reason"]  # type: ignore[misc]
        assert key.startswith("terms_rejected:")
        rejected = store._rows("SELECT count(*) FROM record_rows WHERE status = 'rejected'")
        assert rejected[0][0] == len(bad)
    finally:
        store.close()


def test_a_batch_under_the_bound_names_every_input_and_adds_no_summary(tmp_path: Path) -> None:
    feed = Feed()
    feed.add("ok-1", [b.signed_terms(CAST, terms_of("ok-1"))])
    feed.add("flood-2", [b"junk %d" % i for i in range(3)])
    logs, store = _ingest(tmp_path, feed)
    store.close()
    assert len([e for e in logs if e["event"] == "input_quarantined"]) == 3
    assert not [e for e in logs if e["event"] == "inputs_not_logged"]
