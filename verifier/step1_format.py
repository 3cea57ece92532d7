"""(1) format: meta.format is gridledger-export and meta.format_version is 1 or 2, else the input
is unusable (exit 2); the tables read whole must fit their bound; meta integers are
decimal and bounded."""

from __future__ import annotations

from verifier import limits
from verifier.errors import UnusableInput
from verifier.findings import Findings, Step
from verifier.source import (
    EXPORT_FORMAT,
    EXPORT_FORMAT_VERSIONS,
    META_INTEGERS,
    ExportSource,
    meta_int,
)

# SPEC §6.6, EXPORT.md meta ``arrival``: the log's time, or the senders' (simulations).
ARRIVAL_MODES = ("log", "sender")

SMALL_TABLES = ("terms", "key_bindings", "statements", "checkpoints", "held")


def check_format(source: ExportSource) -> None:
    """meta.format and meta.format_version; anything else is unusable (exit 2)."""
    meta = source.meta
    if meta.get("format") != EXPORT_FORMAT:
        raise UnusableInput(
            str(source.path),
            f"meta.format is {meta.get('format')!r}, want {EXPORT_FORMAT!r}",
        )
    if meta.get("format_version") not in EXPORT_FORMAT_VERSIONS:
        raise UnusableInput(
            str(source.path),
            f"meta.format_version is {meta.get('format_version')!r}, "
            f"this verifier reads {' or '.join(map(repr, EXPORT_FORMAT_VERSIONS))}",
        )
    if "since_size" in meta:  # EXPORT.md "Since a checkpoint": never read as a whole log
        raise UnusableInput(
            str(source.path),
            f"an export since checkpoint {meta['since_size'][:20]}: verify it with --state, "
            "your verified state at that checkpoint (SPEC §8.5)",
        )
    if meta.get("arrival", "log") not in ARRIVAL_MODES:
        raise UnusableInput(
            str(source.path),
            f"meta.arrival is {meta.get('arrival')!r}, want one of {', '.join(ARRIVAL_MODES)}",
        )


def check_sizes(source: ExportSource, findings: Findings) -> None:
    """Tables read whole must fit their bound: rows past it would go unchecked."""
    for table in SMALL_TABLES:
        rows = source.count(table)
        if rows > limits.MAX_SMALL_TABLE_ROWS:
            findings.add(
                Step.FORMAT,
                "TABLE_TOO_LARGE",
                table,
                f"<= {limits.MAX_SMALL_TABLE_ROWS} rows",
                rows,
                "rows beyond the bound are not checked, so the export cannot verify",
            )


def check_meta_integers(source: ExportSource, findings: Findings) -> None:
    """Every integer meta row (EXPORT.md) is decimal within 0..2^53 - 1, checked on its
    text before any conversion: anything else is a finding naming the row and its length."""
    for key in META_INTEGERS:
        text = source.meta.get(key)
        if text is not None and meta_int(text) is None:
            findings.add(
                Step.FORMAT,
                "META_COLUMN",
                f"meta.{key}",
                "a decimal integer within 0..2^53-1",
                f"{text[:20]!r}{'...' if len(text) > 20 else ''} ({len(text)} characters)",
                "a meta integer out of its bounds is refused before it is read",
            )
