"""A dishonest ledger that orders a node's stream its own way is caught from the export
alone (SPEC §6.2-§6.3): an event chained beyond a gap outside the close flush (a dropped
or swapped event), a flush out of order, a node's rejected seq replaced.

Each export here is signed with the ledger key only — what a dishonest ledger holds.
"""

from __future__ import annotations

from pathlib import Path

from test_verifier_exports import HOUR, MINUTE, T0, ExportBuilder, explain, verify

from devtools.builders import StreamWriter, closed, gpu, make_cast, make_terms, sample, signed_terms

NAME = "p-streams"


def _setup() -> tuple[ExportBuilder, StreamWriter, list[bytes]]:
    cast = make_cast("verifier-streams")
    g = gpu("node-a", 0)
    terms = make_terms(cast, NAME, [g], T0, T0 + HOUR)
    builder = ExportBuilder(cast, terms)
    builder.add(signed_terms(cast, terms))
    writer = StreamWriter(cast.node_key("node-a"), NAME, "node-a")
    events = [writer.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(g)]) for m in range(6)]
    return builder, writer, events


def _close(builder: ExportBuilder) -> None:
    terms = builder.terms
    builder.add(closed(builder.cast, NAME, terms.window_end_ms + terms.late_grace_ms))
    builder.statements_at = [len(builder.items) - 1]
    builder.checkpoints_at = [len(builder.items)]


def rules(tmp: Path, builder: ExportBuilder) -> set[str]:
    report = verify(builder.write(tmp / "e.duckdb"), builder.cast.trust())
    return report.findings.rules() if not report.ok else set()


def test_honest_stream_with_a_flushed_gap_verifies(tmp_path: Path) -> None:
    builder, _, events = _setup()
    for e in events[:3]:
        builder.add(e)
    builder.add(events[4], "rejected", "SEQ_GAP")  # seq 3 never arrived: flushed at close
    builder.add(events[5], "rejected", "SEQ_GAP")
    _close(builder)
    report = verify(builder.write(tmp_path / "e.duckdb"), builder.cast.trust())
    assert report.ok, explain(report)


def test_dropped_event_then_rejected_tail_is_caught(tmp_path: Path) -> None:
    # The ledger drops seq 2 and chains the rest as SEQ_GAP where they arrived.
    builder, _, events = _setup()
    builder.add(events[0])
    builder.add(events[1])
    for e in events[3:]:
        builder.add(e, "rejected", "SEQ_GAP")
    # Not at the close: a rejected early close comes between them and the accepted one.
    # (Dropped seq 2 with the rest flushed right before the close looks honest here: the
    # operator's witness is the one that proves the drop, SPEC §8.3 W_MISSING.)
    builder.add(closed(builder.cast, NAME, T0), "rejected", "CLOSE_INVALID")
    _close(builder)
    assert "SEQ_GAP_OUT_OF_FLUSH" in rules(tmp_path, builder)


def test_swapped_events_are_caught(tmp_path: Path) -> None:
    builder, _, events = _setup()
    builder.add(events[0])
    builder.add(events[2], "rejected", "SEQ_GAP")  # chained before seq 1
    builder.add(events[1])
    for e in events[3:]:
        builder.add(e, "rejected", "SEQ_GAP")
    _close(builder)
    assert "SEQ_GAP_OUT_OF_FLUSH" in rules(tmp_path, builder)


def test_flush_out_of_order_is_caught(tmp_path: Path) -> None:
    builder, _, events = _setup()
    builder.add(events[0])
    builder.add(events[5], "rejected", "SEQ_GAP")
    builder.add(events[3], "rejected", "SEQ_GAP")
    _close(builder)
    assert "FLUSH_ORDER" in rules(tmp_path, builder)


def test_a_replaced_rejected_seq_is_caught(tmp_path: Path) -> None:
    builder, writer, events = _setup()
    builder.add(events[0])
    bad = StreamWriter(writer.key, NAME, "node-a", seq=1, prev="ab" * 32)
    builder.add(bad.event(T0 + MINUTE, T0 + 2 * MINUTE, []), "rejected", "PREV_MISMATCH")
    builder.add(events[1])  # the node's other seq 1, which the ledger accepted
    _close(builder)
    assert "EQUIVOCATION" in rules(tmp_path, builder)
