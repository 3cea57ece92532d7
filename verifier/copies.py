"""Many exports of one placement, and checkpoints a party kept (SPEC.md §9).

An export is a copy of a placement's log as some ledger handed it out. ``verify DIR``
may read several copies of one placement: the same log twice, an older (shorter) copy
beside a newer one, or — if the ledger equivocated — two logs that disagree. Keyed by
placement id:

* copies with the same size and root count once;
* a shorter copy whose root is the root of the longer copy's first records is an older
  view of the same log: the longer one stands, the shorter is *superseded*;
* anything else is **equivocation**: two ledger-signed views that no append-only log can
  both have produced. Reported with both signed checkpoints as portable evidence.

``check_kept`` asks the same of one export and a checkpoint a party kept: the export
must extend it.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proto.envelope import decode_envelope
from proto.errors import ProtoError
from proto.frontier import Frontier
from proto.merkle import leaf_hash
from proto.note import (
    LEDGER_NOTE_NAME,
    SignedNote,
    checkpoint_origin,
    parse_checkpoint_body,
    parse_note,
)
from proto.records import Checkpoint
from verifier.source import ExportSource

_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class Copy:
    """One verified export as a view of its placement's log."""

    path: str
    placement_id: str
    size: int  # records in the export
    root: bytes  # RFC 9162 root of all its records
    note: str  # its largest ledger-signed checkpoint (evidence), "" if none


@dataclass
class CopyFindings:
    """What the comparison of copies concluded."""

    standing: list[str] = field(default_factory=list)  # paths that count, one per placement
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (path, same as path)
    superseded: list[tuple[str, str]] = field(default_factory=list)  # (older, by newer)
    equivocations: list[dict[str, str]] = field(default_factory=list)


def _root_of(source: ExportSource, size: int) -> bytes:
    """RFC 9162 root of the first ``size`` records, streamed in bounded batches."""
    frontier = Frontier.empty()
    for lo in range(0, size, _BATCH):
        for row in source.record_rows(lo, min(size, lo + _BATCH)):
            frontier = frontier.append_leaf_hash(leaf_hash(decode_envelope(row.envelope).payload))
    return frontier.root()


def prefix_root(path: str, size: int) -> bytes:
    """The root of the first ``size`` records of the export at ``path``."""
    with ExportSource(Path(path)) as source:
        return _root_of(source, size)


def read_copy(path: str, placement_id: str) -> Copy:
    """The view an already verified export holds (its records and largest checkpoint)."""
    with ExportSource(Path(path)) as source:
        size = source.count("ledger_records")
        root = _root_of(source, size)
        notes = source.small_table("checkpoints", "size, note", "size")
    largest = max(((int(s), str(n)) for s, n in notes), default=(0, ""))
    return Copy(path, placement_id, size, root, largest[1])


def compare_copies(
    copies: Sequence[Copy], root_at: Callable[[str, int], bytes] = prefix_root
) -> CopyFindings:
    """Group copies by placement; keep one per placement; name supersessions and forks."""
    out = CopyFindings()
    by_placement: dict[str, list[Copy]] = defaultdict(list)
    for copy in copies:
        by_placement[copy.placement_id].append(copy)
    for placement_id in sorted(by_placement):
        views = sorted(by_placement[placement_id], key=lambda c: (-c.size, c.path))
        longest = views[0]
        out.standing.append(longest.path)
        for other in views[1:]:
            if other.size == longest.size and other.root == longest.root:
                out.duplicates.append((other.path, longest.path))
            elif other.size < longest.size and root_at(longest.path, other.size) == other.root:
                out.superseded.append((other.path, longest.path))
            else:
                out.equivocations.append(
                    {
                        "placement_id": placement_id,
                        "path_a": longest.path,
                        "size_a": str(longest.size),
                        "checkpoint_a": longest.note,
                        "path_b": other.path,
                        "size_b": str(other.size),
                        "checkpoint_b": other.note,
                    }
                )
    return out


@dataclass(frozen=True, slots=True)
class KeptResult:
    """How an export relates to a checkpoint a party kept."""

    ok: bool
    rule: str  # "" | TRUNCATED | EQUIVOCATION | CHECKPOINT_SIGNATURE | CHECKPOINT_ORIGIN
    detail: str


def check_kept(
    export_path: str,
    placement_id: str,
    ledger_keys: Sequence[bytes],
    record_count: int,
    kept_text: str,
) -> KeptResult:
    """Does the export extend the kept checkpoint? (SPEC §9, "A kept checkpoint")."""
    try:
        note: SignedNote = parse_note(kept_text)
        body = parse_checkpoint_body(note.body)
    except ProtoError as exc:
        return KeptResult(False, "CHECKPOINT_MALFORMED", f"the kept checkpoint: {exc.detail}")
    if not any(note.signed_by(LEDGER_NOTE_NAME, key) for key in ledger_keys):
        return KeptResult(
            False, "CHECKPOINT_SIGNATURE", "the kept checkpoint is not signed by a trusted ledger"
        )
    return _extends(export_path, placement_id, record_count, note, body)


def kept_placement(kept_text: str) -> str | None:
    """The placement a kept checkpoint note is of (None: not a checkpoint of ours)."""
    try:
        origin = parse_checkpoint_body(parse_note(kept_text).body).origin
    except ProtoError:
        return None
    prefix = checkpoint_origin("")
    return origin[len(prefix) :] if origin.startswith(prefix) else None


def _extends(
    export_path: str, placement_id: str, record_count: int, note: SignedNote, body: Checkpoint
) -> KeptResult:
    if body.origin != checkpoint_origin(placement_id):
        return KeptResult(False, "CHECKPOINT_ORIGIN", f"the kept checkpoint is of {body.origin!r}")
    if body.size > record_count:
        return KeptResult(
            False,
            "TRUNCATED",
            f"you hold a ledger-signed checkpoint of {body.size} records; "
            f"the export has {record_count}",
        )
    root = prefix_root(export_path, body.size)
    if root != body.root:
        return KeptResult(
            False,
            "EQUIVOCATION",
            f"the export's first {body.size} records have root "
            f"{base64.b64encode(root).decode()}, the kept checkpoint says "
            f"{base64.b64encode(body.root).decode()}",
        )
    return KeptResult(True, "", f"the export extends the kept checkpoint of size {body.size}")
