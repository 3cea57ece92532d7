"""(8) merkle: each checkpoint's origin, size and RFC 9162 root of the record payloads,
signed by the ledger key; the parties' cosignatures checked; in a version-2 export (records
unsigned, SPEC §8) every record covered by a valid checkpoint.

All of step 8 is here, in three moments of one run: ``read_sizes`` (before the pass: which
tree sizes the checkpoints name), ``CheckpointRoots.leaf`` (during the pass: each record's
leaf, keeping the root at each named size; ``verifier/merkle_stream.py``, which the run's
state holds) and ``check_checkpoints`` (after it).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from proto.cosign import cosignature_of
from proto.errors import ProtoError
from proto.note import (
    LEDGER_NOTE_NAME,
    SignedNote,
    checkpoint_origin,
    parse_checkpoint_body,
    parse_note,
)
from verifier.findings import Step
from verifier.step5_columns import check_checkpoint_size

if TYPE_CHECKING:
    from verifier.state import Verification


def read_sizes(run: Verification) -> None:
    """Before the pass: the sizes named inside the notes (not the size column)."""
    sizes: set[int] = set()
    for (note_text,) in run.source.small_table("checkpoints", "note", "size"):
        try:
            body = parse_checkpoint_body(parse_note(str(note_text)).body)
        except ProtoError:
            continue
        sizes.add(body.size)
    run.roots.want(sizes)


def check_checkpoints(run: Verification) -> None:
    """After the pass: each checkpoint's note, origin, size, root and cosignatures."""
    parties = _cosigners(run)
    covered = 0  # the largest valid checkpoint: ledger-signed, this log, root matching
    for size_column, note_text in run.source.small_table("checkpoints", "size, note", "size"):
        run.bump("checkpoints")
        valid = True
        where = f"checkpoints size {size_column}"
        try:
            note = parse_note(str(note_text))
            body = parse_checkpoint_body(note.body)
        except ProtoError as exc:
            run.add(
                Step.MERKLE,
                "CHECKPOINT_MALFORMED",
                where,
                "a C2SP checkpoint note",
                exc.reason.value,
                exc.detail,
            )
            continue
        summary: dict[str, Any] = {"size": body.size, "cosigned_by": [], "ignored_signers": []}
        if note.text() != str(note_text):
            # Same signatures, other spelling (e.g. base64 with non-zero padding bits):
            # harmless to the maths, but the ledger never writes it, so it was altered.
            run.add(
                Step.MERKLE,
                "CHECKPOINT_NON_CANONICAL",
                where,
                "the note as the ledger writes it",
                "a differently spelled note",
                "the note text is not in canonical form",
            )
        run.report.checkpoints.append(summary)
        check_checkpoint_size(run, where, body.size, size_column)
        origin = checkpoint_origin(run.placement_id)
        if body.origin != origin:
            run.add(
                Step.MERKLE,
                "CHECKPOINT_ORIGIN",
                where,
                origin,
                body.origin,
                "a checkpoint of another log",
            )
            valid = False
        if not note.signed_by(LEDGER_NOTE_NAME, run.ledger_key):
            valid = False
            run.add(
                Step.MERKLE,
                "CHECKPOINT_SIGNATURE",
                where,
                f"signed by {LEDGER_NOTE_NAME} with the trusted ledger key",
                "no valid signature",
                "a checkpoint counts only under the ledger's signature",
            )
        if body.size > run.record_count:
            valid = False
            run.add(
                Step.MERKLE,
                "CHECKPOINT_SIZE",
                where,
                f"<= {run.record_count} records",
                body.size,
                "the checkpoint covers records the export does not hold (truncated?)",
            )
        else:
            root = run.roots.roots.get(body.size)
            if root != body.root:
                valid = False
                run.add(
                    Step.MERKLE,
                    "CHECKPOINT_ROOT",
                    where,
                    base64.b64encode(root).decode() if root else "?",
                    base64.b64encode(body.root).decode(),
                    "the RFC 9162 root of the record payloads differs",
                )
        if valid:
            covered = max(covered, body.size)
        for sig in note.signatures:
            if sig.name == LEDGER_NOTE_NAME:
                continue
            key = parties.get(sig.name)
            if key is None:
                # C2SP lets verifiers skip unknown signers, but an export carries only the
                # ledger's and the parties' lines: anything else was added or altered.
                summary["ignored_signers"].append(sig.name)
                run.add(
                    Step.MERKLE,
                    "CHECKPOINT_UNKNOWN_SIGNER",
                    where,
                    "signature lines by the ledger or a party of the terms",
                    sig.name,
                    "a signature line by someone the terms do not name",
                )
            else:
                cosigned = cosignature_of(SignedNote(note.body, (sig,)), sig.name, key)
                if cosigned is not None:
                    summary["cosigned_by"].append(sig.name)
                    summary.setdefault("cosigned_at_s", {})[sig.name] = cosigned.timestamp_s
                else:
                    run.add(
                        Step.MERKLE,
                        "CHECKPOINT_COSIGNATURE",
                        where,
                        f"a valid C2SP cosignature/v1 by {sig.name}",
                        "invalid",
                        "a party's cosignature does not verify with its terms key (SPEC §8.2)",
                    )
    check_coverage(run, covered)


def _cosigners(run: Verification) -> dict[str, bytes]:
    """SPEC §8.2: who may cosign — the terms' parties and each accepted assignment's new
    buyer, by id."""
    terms = run.terms
    parties = {a.new_buyer.id: a.new_buyer.key for a in run.referee.assignments}
    parties.update({p.id: p.key for p in (terms.operator, terms.buyer, terms.desk)})
    return parties


def check_coverage(run: Verification, covered: int) -> None:
    """SPEC §8: in a version-2 export no record carries a signature of its own, so every
    record must lie inside a valid checkpoint; records past the largest are not trusted.
    (Version 1: they are signed, and step (10) reports an uncovered tail as provisional.)"""
    if run.unsigned_records and covered < run.record_count:
        run.add(
            Step.MERKLE,
            "RECORD_UNCOVERED",
            f"ledger_records {covered}..{run.record_count - 1}",
            f"a valid ledger-signed checkpoint of size {run.record_count}",
            f"largest valid checkpoint covers {covered}",
            "records no checkpoint signature covers are not authenticated (SPEC §8)",
        )
