"""Consistency of two checkpoints of one placement, for a party who holds only the notes
(SPEC §8.1, RFC 9162 §2.1.4): does the tree of the newer one extend the older one?

``verify prove EXPORT --from N [--size M] --out DIR`` writes ``consistency.json`` (the
RFC 9162 proof from size N to M, computed from the export's records) with the two
ledger-signed checkpoint notes of those sizes when the export holds them.
``verify consistency --proof consistency.json --old OLD.note --new NEW.note --trust T``
checks it with nothing else: both notes signed by a pinned ledger key, of the same
placement, sizes and roots as the proof says, and the proof valid.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from proto import merkle
from proto.durable_io import read_at_most
from proto.envelope import decode_envelope
from proto.errors import ProtoError
from proto.note import (
    LEDGER_NOTE_NAME,
    MAX_NOTE_BYTES,
    checkpoint_origin,
    parse_checkpoint_body,
    parse_note,
)
from proto.trust import TrustFile
from verifier.errors import UnusableInput
from verifier.source import ExportSource

CONSISTENCY_FORMAT: Final = "gridledger-consistency/v1"
MAX_CONSISTENCY_FILE_BYTES: Final = 64 * 1024


class ConsistencyProof(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The file ``verify prove --from`` writes."""

    format: str
    placement_id: str
    first: int
    second: int
    first_root: str  # base64
    second_root: str  # base64
    proof: list[str]  # base64 hashes, RFC 9162 order


@dataclass(frozen=True, slots=True)
class ConsistencyBundle:
    """The proof and the notes of its two sizes (empty text when the export has none)."""

    proof: ConsistencyProof
    first_note: str
    second_note: str

    def write(self, out_dir: Path) -> list[Path]:
        """Write consistency.json and the notes into ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written = [out_dir / "consistency.json"]
        written[0].write_bytes(msgspec.json.format(msgspec.json.encode(self.proof)) + b"\n")
        for name, text in (("old.note", self.first_note), ("new.note", self.second_note)):
            if text:
                (out_dir / name).write_text(text, encoding="utf-8")
                written.append(out_dir / name)
        return written


def make_consistency_bundle(export: Path, first: int, second: int | None) -> ConsistencyBundle:
    """The RFC 9162 proof from ``first`` to ``second`` (default: all records)."""
    with ExportSource(export) as source:
        size = source.count("ledger_records")
        second = size if second is None else second
        if not 0 < first <= second <= size:
            raise UnusableInput(str(export), f"sizes {first}..{second} outside 1..{size}")
        rows = source.record_rows(0, second)
        notes = {int(s): str(n) for s, n in source.small_table("checkpoints", "size, note", "size")}
        placement_id = source.meta.get("placement_id", "")
    leaves = [merkle.leaf_hash(decode_envelope(r.envelope).payload) for r in rows]
    proof = ConsistencyProof(
        format=CONSISTENCY_FORMAT,
        placement_id=placement_id,
        first=first,
        second=second,
        first_root=_b64(merkle.root_from_leaf_hashes(leaves[:first])),
        second_root=_b64(merkle.root_from_leaf_hashes(leaves)),
        proof=[_b64(h) for h in merkle.consistency_proof(leaves, first)],
    )
    return ConsistencyBundle(proof, notes.get(first, ""), notes.get(second, ""))


def read_consistency_files(proof: Path, old: Path, new: Path) -> tuple[ConsistencyProof, str, str]:
    """Read the three files; UnusableInput when one cannot be used."""
    try:
        raw = read_at_most(proof, MAX_CONSISTENCY_FILE_BYTES)
        texts = [read_at_most(p, MAX_NOTE_BYTES) for p in (old, new)]
    except OSError as exc:
        raise UnusableInput(str(exc.filename), exc.strerror or "unreadable") from exc
    if len(raw) > MAX_CONSISTENCY_FILE_BYTES:
        raise UnusableInput(str(proof), f"larger than {MAX_CONSISTENCY_FILE_BYTES} bytes")
    try:
        decoded = msgspec.json.decode(raw, type=ConsistencyProof)
    except msgspec.MsgspecError as exc:
        raise UnusableInput(str(proof), f"not a consistency proof: {exc}") from exc
    if decoded.format != CONSISTENCY_FORMAT:
        raise UnusableInput(str(proof), f"format {decoded.format!r}, want {CONSISTENCY_FORMAT}")
    try:
        old_text, new_text = (t.decode("utf-8") for t in texts)
    except UnicodeDecodeError as exc:
        raise UnusableInput(str(old), "a note is not UTF-8") from exc
    return decoded, old_text, new_text


def check_consistency(
    proof: ConsistencyProof, old_text: str, new_text: str, trust: TrustFile
) -> list[str]:
    """Every problem found (empty: the new checkpoint extends the old one)."""
    ledger_keys = [k.key for k in trust.keys if k.role == "ledger"]
    problems: list[str] = []
    bodies: list[Any] = []
    for label, text in (("old", old_text), ("new", new_text)):
        try:
            note = parse_note(text)
            body = parse_checkpoint_body(note.body)
        except ProtoError as exc:
            problems.append(f"the {label} note: {exc.detail}")
            continue
        if not any(note.signed_by(LEDGER_NOTE_NAME, key) for key in ledger_keys):
            problems.append(f"the {label} note is not signed by a pinned ledger key")
        if body.origin != checkpoint_origin(proof.placement_id):
            problems.append(f"the {label} note is of {body.origin!r}, not {proof.placement_id}")
        bodies.append(body)
    if problems:
        return problems
    old, new = bodies
    try:
        roots = [base64.b64decode(r, validate=True) for r in (proof.first_root, proof.second_root)]
        hashes = [base64.b64decode(h, validate=True) for h in proof.proof]
    except binascii.Error:
        return ["the proof file holds a value that is not base64"]
    if (old.size, old.root, new.size, new.root) != (proof.first, roots[0], proof.second, roots[1]):
        problems.append("the proof is for other sizes or roots than the two notes")
    elif not merkle.verify_consistency(old.size, new.size, old.root, new.root, hashes):
        problems.append(
            f"EQUIVOCATION: the tree of size {new.size} does not extend the tree of size "
            f"{old.size} (both notes are signed by the ledger: keep them as evidence)"
        )
    return problems


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
