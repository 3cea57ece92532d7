"""Inclusion of one LedgerRecord in a checkpoint, for a party who holds only that record.

A bundle is three files:

* the record: the LedgerRecord envelope bytes, as exported (JSON);
* the proof: ``{"format": "gridledger-inclusion/v1", "placement_id": ..., "index": i,
  "tree_size": n, "hashes": [base64 SHA-256, ...]}`` — the RFC 9162 inclusion path of
  leaf i in the tree of the first n records, leaf to root;
* the checkpoint: the C2SP signed note of size n (SPEC §8).

``verify_inclusion_bundle`` checks, offline and against the trust file only: the record
is a canonical LedgerRecord, unsigned (SPEC §8) or signed by a pinned ledger key and
nobody else; the proof names the record's placement and index; the note is signed under
``gridledger-ledger`` by a pinned ledger key (the record's, when it is signed), names
the placement's log and the proof's size; and the path leads from the record's payload
to the note's root. ``make_inclusion_bundle`` produces such a bundle from an export;
``proof_from_leaves`` is the pure core a ledger can call on its own records (e.g. behind
its HTTP API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import msgspec
from msgspec import Meta, Struct

from proto.durable_io import read_at_most
from proto.errors import ProtoError
from proto.merkle import inclusion_proof, verify_inclusion
from proto.note import (
    LEDGER_NOTE_NAME,
    MAX_NOTE_BYTES,
    checkpoint_origin,
    parse_checkpoint_body,
    parse_note,
)
from proto.records import Identifier, LedgerRecord, NonNegInt
from proto.trust import TrustFile
from verifier import limits
from verifier.errors import UnusableInput
from verifier.findings import Findings, Step
from verifier.opener import SIG_VALID, open_one
from verifier.source import ALIAS, ExportSource, blob

PROOF_FORMAT: Final = "gridledger-inclusion/v1"

# RFC 9162 paths of a tree of at most 2^53 leaves have at most 53 hashes.
_MAX_PATH: Final = 64


class InclusionProof(Struct, frozen=True, forbid_unknown_fields=True):
    """The proof file: which leaf of which tree, and the path to its root."""

    format: str
    placement_id: Identifier
    index: NonNegInt
    tree_size: NonNegInt
    hashes: Annotated[
        list[Annotated[bytes, Meta(min_length=32, max_length=32)]], Meta(max_length=_MAX_PATH)
    ]


@dataclass(frozen=True, slots=True)
class InclusionBundle:
    """Everything a party needs to check one record: its envelope, proof and checkpoint."""

    record: bytes
    proof: InclusionProof
    checkpoint: str

    def write(self, out_dir: Path) -> tuple[Path, Path, Path]:
        """Write ``record.json``, ``proof.json`` and ``checkpoint.note`` into ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = (out_dir / "record.json", out_dir / "proof.json", out_dir / "checkpoint.note")
        paths[0].write_bytes(self.record + b"\n")
        paths[1].write_bytes(encode_proof(self.proof))
        paths[2].write_text(self.checkpoint, encoding="utf-8")
        return paths


def encode_proof(proof: InclusionProof) -> bytes:
    """Proof file bytes."""
    return msgspec.json.format(msgspec.json.encode(proof), indent=2) + b"\n"


def decode_proof(raw: bytes) -> InclusionProof:
    """Read a proof file; raise UnusableInput when it is not one."""
    if len(raw) > limits.MAX_PROOF_BYTES:
        raise UnusableInput("proof", f"larger than {limits.MAX_PROOF_BYTES} bytes")
    try:
        proof = msgspec.json.decode(raw, type=InclusionProof)
    except msgspec.MsgspecError as exc:
        raise UnusableInput("proof", f"not an inclusion proof: {exc}") from exc
    if proof.format != PROOF_FORMAT:
        raise UnusableInput("proof", f"format {proof.format!r}, want {PROOF_FORMAT!r}")
    return proof


def make_inclusion_bundle(
    export: Path, index: int, tree_size: int | None = None
) -> InclusionBundle:
    """A bundle for record ``index`` of an export, against one of its checkpoints.

    Uses the checkpoint of ``tree_size`` if given, else the largest checkpoint covering the
    index. Trusts the export (it is the producer's side); the party checks the result.
    """
    with ExportSource(export) as source:
        notes: dict[int, str] = {}
        for (text,) in source.small_table("checkpoints", "note", "size"):
            try:
                notes[parse_checkpoint_body(parse_note(str(text)).body).size] = str(text)
            except ProtoError:
                continue
        sizes = [s for s in notes if s > index and (tree_size is None or s == tree_size)]
        if not sizes:
            raise UnusableInput(str(export), f"no checkpoint covers record {index}")
        size = max(sizes)
        leaves: list[bytes] = []
        record = b""
        cursor = source.con.execute(
            f"SELECT chain_index, envelope FROM {ALIAS}.ledger_records "
            "WHERE chain_index >= 0 AND chain_index < ? ORDER BY chain_index",
            [size],
        )
        while rows := cursor.fetchmany(limits.SMALL_TABLE_FETCH_ROWS):
            for chain_index, raw in rows:
                opened = open_one(int(chain_index), blob(raw), {})
                if opened.error:
                    raise UnusableInput(str(export), f"record {chain_index}: {opened.detail}")
                leaves.append(opened.leaf)
                if chain_index == index:
                    record = blob(raw)
        if len(leaves) != size or not record:
            raise UnusableInput(str(export), f"ledger_records do not hold records 0..{size - 1}")
        placement_id = source.meta.get("placement_id", "")
    proof = proof_from_leaves(placement_id, leaves, index)
    return InclusionBundle(record=record, proof=proof, checkpoint=notes[size])


def proof_from_leaves(placement_id: str, leaves: Sequence[bytes], index: int) -> InclusionProof:
    """The proof of leaf ``index`` in the tree of ``leaves`` (``proto.merkle.leaf_hash`` of
    each record payload, in index order). Pure: a ledger can serve it from its own store."""
    return InclusionProof(
        format=PROOF_FORMAT,
        placement_id=placement_id,
        index=index,
        tree_size=len(leaves),
        hashes=inclusion_proof(leaves, index),
    )


def verify_inclusion_bundle(
    record_envelope: bytes, proof: InclusionProof, note_text: str, trust: TrustFile
) -> tuple[Findings, LedgerRecord | None]:
    """Check one record against a checkpoint; see the module docstring. Never raises."""
    findings = Findings()
    ledger_keys = trust.keys_for("ledger")
    opened = open_one(0, record_envelope, {k: [v] for k, v in ledger_keys.items()})
    where = f"record index {proof.index}"
    record = opened.record
    if opened.error or not isinstance(record, LedgerRecord):
        findings.add(
            Step.ENVELOPES,
            opened.error or "KIND_MISMATCH",
            where,
            "a canonical LedgerRecord envelope",
            opened.error or opened.kind,
            opened.detail,
        )
        return findings, None
    signers = [s for s in opened.sigs if s.outcome == SIG_VALID and s.keyid in ledger_keys]
    # SPEC §8: a record need not be signed (the checkpoint authenticates it); a signature
    # that is present must be one pinned ledger key's, and valid.
    if opened.sigs and (len(signers) != 1 or len(opened.sigs) != 1):
        findings.add(
            Step.CHAIN,
            "CHAIN_SIGNATURE",
            where,
            "unsigned, or signed by one pinned ledger key only",
            f"{len(signers)} valid pinned of {len(opened.sigs)} signatures",
            "a record signature counts only under a pinned ledger key",
        )
    ledger_key = signers[0].key if signers else b""
    record_signed = bool(opened.sigs)
    if (record.placement_id, record.index) != (proof.placement_id, proof.index):
        findings.add(
            Step.MERKLE,
            "PROOF_RECORD",
            where,
            f"{record.placement_id}[{record.index}]",
            f"{proof.placement_id}[{proof.index}]",
            "the proof is for another record",
        )
    try:
        note = parse_note(note_text)
        body = parse_checkpoint_body(note.body)
    except ProtoError as exc:
        findings.add(
            Step.MERKLE,
            "CHECKPOINT_MALFORMED",
            "checkpoint",
            "a C2SP checkpoint note",
            exc.reason.value,
            exc.detail,
        )
        return findings, record
    if not record_signed:  # an unsigned record: the note names which pinned key it is
        ledger_key = next(
            (k for k in ledger_keys.values() if note.signed_by(LEDGER_NOTE_NAME, k)), b""
        )
    if not ledger_key or not note.signed_by(LEDGER_NOTE_NAME, ledger_key):
        findings.add(
            Step.MERKLE,
            "CHECKPOINT_SIGNATURE",
            "checkpoint",
            f"signed by {LEDGER_NOTE_NAME} with a pinned ledger key (the record's, if signed)",
            "no valid signature",
            "a checkpoint counts only under the ledger's signature",
        )
    origin = checkpoint_origin(record.placement_id)
    if body.origin != origin:
        findings.add(
            Step.MERKLE,
            "CHECKPOINT_ORIGIN",
            "checkpoint",
            origin,
            body.origin,
            "a checkpoint of another log",
        )
    if body.size != proof.tree_size:
        findings.add(
            Step.MERKLE,
            "PROOF_SIZE",
            "checkpoint",
            proof.tree_size,
            body.size,
            "the proof is for a tree of another size",
        )
    leaf = opened.leaf
    if not verify_inclusion(leaf, record.index, body.size, proof.hashes, body.root):
        findings.add(
            Step.MERKLE,
            "PROOF_PATH",
            where,
            "a path to the checkpoint root",
            "no path",
            "the record is not at its index in the tree the checkpoint signs",
        )
    return findings, record


def read_bundle_files(
    record_path: Path, proof_path: Path, note_path: Path
) -> tuple[bytes, InclusionProof, str]:
    """Read the three files of a bundle; raise UnusableInput when one cannot be used."""
    try:
        record = read_at_most(record_path, limits.MAX_RECORD_FILE_BYTES)
        proof_raw = read_at_most(proof_path, limits.MAX_PROOF_BYTES)
        note = read_at_most(note_path, MAX_NOTE_BYTES)
    except OSError as exc:
        raise UnusableInput(str(exc.filename), exc.strerror or "unreadable") from exc
    if len(record) > limits.MAX_RECORD_FILE_BYTES:
        raise UnusableInput(str(record_path), "larger than any record envelope")
    if len(proof_raw) > limits.MAX_PROOF_BYTES:
        raise UnusableInput(str(proof_path), f"larger than {limits.MAX_PROOF_BYTES} bytes")
    if len(note) > MAX_NOTE_BYTES:
        raise UnusableInput(str(note_path), f"larger than {MAX_NOTE_BYTES} bytes")
    try:
        note_text = note.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableInput(str(note_path), "not UTF-8") from exc
    return record.rstrip(b"\n"), decode_proof(proof_raw), note_text
