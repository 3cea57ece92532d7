"""Checkpoints (SPEC.md §8): C2SP signed notes over the RFC 9162 root of a chain.

The leaves are the signed bytes (payloads) of the placement's LedgerRecords in index
order. The ledger signs under the name ``gridledger-ledger``; each party cosigns under
its party id with the key the terms name for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proto import merkle
from proto.cosign import MAX_COSIGNATURE_FUTURE_S, cosignature_of
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.limits import MAX_CLOCK_SKEW_MS
from proto.note import (
    LEDGER_NOTE_NAME,
    SignedNote,
    checkpoint_body,
    checkpoint_origin,
    parse_note,
    sign_note,
)
from proto.reasons import Reason
from proto.records import Checkpoint, Party, PlacementTerms


def make_checkpoint(placement_id: str, payloads: Sequence[bytes], key: SigningKey) -> SignedNote:
    """The ledger-signed checkpoint note over ``payloads`` (every record so far)."""
    return checkpoint_over_leaves(placement_id, [merkle.leaf_hash(p) for p in payloads], key)


def checkpoint_over_leaves(
    placement_id: str, leaf_hashes: Sequence[bytes], key: SigningKey
) -> SignedNote:
    """The same note from the RFC 9162 leaf hashes of the payloads, in index order."""
    return sign_checkpoint(
        placement_id, len(leaf_hashes), merkle.root_from_leaf_hashes(leaf_hashes), key
    )


def sign_checkpoint(placement_id: str, size: int, root: bytes, key: SigningKey) -> SignedNote:
    """The ledger-signed checkpoint note of a tree of ``size`` records with ``root``."""
    checkpoint = Checkpoint(origin=checkpoint_origin(placement_id), size=size, root=root)
    return sign_note(checkpoint_body(checkpoint), LEDGER_NOTE_NAME, key)


def party_note_keys(terms: PlacementTerms, new_buyers: Sequence[Party] = ()) -> dict[str, bytes]:
    """Party id -> public key, for the parties that may cosign the placement's checkpoints:
    the terms' three, and each accepted assignment's new buyer (SPEC §8.2)."""
    keys = {p.id: p.key for p in new_buyers}
    keys.update({p.id: p.key for p in (terms.operator, terms.buyer, terms.desk)})
    return keys


@dataclass(frozen=True, slots=True)
class CosignTimes:
    """When a cosignature of one checkpoint may be dated (SPEC §6.6, §8.4): not before
    the last covered record's arrival, not past the ledger's clock, each with its margin."""

    last_arrived_ms: int | None
    now_ms: int

    def check(self, name: str, timestamp_s: int) -> None:
        """Raise ProtoError for a timestamp outside the bounds."""
        at_ms = timestamp_s * 1000
        if self.last_arrived_ms is not None and at_ms < self.last_arrived_ms - MAX_CLOCK_SKEW_MS:
            raise ProtoError(
                Reason.OUT_OF_RANGE,
                f"cosignature of {name!r} at {timestamp_s} s predates the last record it "
                f"covers (arrived {self.last_arrived_ms} ms) - {MAX_CLOCK_SKEW_MS} ms",
            )
        if at_ms > self.now_ms + MAX_COSIGNATURE_FUTURE_S * 1000:
            raise ProtoError(
                Reason.OUT_OF_RANGE,
                f"cosignature of {name!r} at {timestamp_s} s is more than "
                f"{MAX_COSIGNATURE_FUTURE_S} s past the ledger's clock ({self.now_ms} ms)",
            )


def merge_cosignature(
    stored: str,
    submitted: str,
    keys: dict[str, bytes],
    ledger_public_key: bytes,
    times: CosignTimes | None = None,
) -> tuple[str, list[str]]:
    """Merge the valid party cosignatures (SPEC §8.2) of ``submitted`` into ``stored``.

    ``keys`` are the cosigners ``party_note_keys`` allows. Returns (merged note text,
    names of the parties whose cosignatures were added or renewed). Raises ProtoError
    when the submitted note is over another body, or carries no valid party cosignature
    (each line must verify as a C2SP cosignature/v1 under the key of that party id), or
    one dated outside ``times`` (SPEC §8.4).
    """
    current = parse_note(stored)
    offered = parse_note(submitted)
    if offered.body != current.body:
        raise ProtoError(Reason.MALFORMED, "cosigned note is over another checkpoint body")
    if not current.signed_by(LEDGER_NOTE_NAME, ledger_public_key):
        raise ProtoError(Reason.SIG_INVALID, "stored checkpoint lacks the ledger signature")
    added: list[str] = []
    lines = list(current.signatures)
    for line in offered.signatures:
        if line.name == LEDGER_NOTE_NAME or line in lines:
            continue
        key = keys.get(line.name)
        if key is None:
            raise ProtoError(Reason.SIG_SURPLUS, f"{line.name!r} is not a party of the terms")
        cosigned = cosignature_of(SignedNote(offered.body, (line,)), line.name, key)
        if cosigned is None:
            raise ProtoError(Reason.SIG_INVALID, f"cosignature of {line.name!r} does not verify")
        if times is not None:
            times.check(line.name, cosigned.timestamp_s)
        lines = [s for s in lines if s.name != line.name] + [line]
        added.append(line.name)
    if not added:
        raise ProtoError(Reason.SIG_MISSING, "no new party cosignature in the submitted note")
    return SignedNote(current.body, tuple(lines)).text(), added
