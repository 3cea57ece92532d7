"""Witness cosignatures on checkpoints: C2SP tlog-cosignature v1, Ed25519 (SPEC.md §8.2).

A cosignature is one more signature line on a checkpoint note::

    — <cosigner name> base64(keyid[4] || timestamp[8] || sig[64])

``keyid`` hashes the name and key with signature type 0x04 (the log's own signature uses
0x01), ``timestamp`` is POSIX seconds big-endian, and ``sig`` is Ed25519 over::

    cosignature/v1 LF "time " DECIMAL(timestamp) LF <checkpoint body>

so a cosignature says *when* the witness saw the tree and can never be mistaken for the
ledger's signature, nor for any ``gridledger/KIND/v1`` payload signed with the same key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from proto.keys import SigningKey, verify
from proto.note import NoteSignature, SignedNote

COSIGNATURE_HEADER: Final = "cosignature/v1\n"
COSIGNATURE_TYPE: Final = 0x04
TIMESTAMP_BYTES: Final = 8
MAX_TIMESTAMP_S: Final = 2**63 - 1
# A verifier may refuse cosignatures dated further than this past its own clock.
MAX_COSIGNATURE_FUTURE_S: Final = 300


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    """SHA-256(name || LF || 0x04 || public key)[:4]: the key id of a cosigner's lines."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([COSIGNATURE_TYPE]) + public_key).digest()[
        :4
    ]


def cosignature_message(body: str, timestamp_s: int) -> bytes:
    """The bytes a cosigner signs for ``body`` at ``timestamp_s``."""
    if not 0 <= timestamp_s <= MAX_TIMESTAMP_S:
        raise ValueError(f"cosignature timestamp {timestamp_s} out of range")
    return f"{COSIGNATURE_HEADER}time {timestamp_s}\n{body}".encode()


def cosign(note: SignedNote, name: str, key: SigningKey, timestamp_s: int) -> SignedNote:
    """``note`` with this cosigner's line added (an earlier line of the same key replaced)."""
    key_hash = cosigner_key_id(name, key.public_key)
    sig = key.sign(cosignature_message(note.body, timestamp_s))
    line = NoteSignature(name, key_hash, timestamp_s.to_bytes(TIMESTAMP_BYTES, "big") + sig)
    kept = tuple(s for s in note.signatures if (s.name, s.key_hash) != (name, key_hash))
    return SignedNote(note.body, (*kept, line))


@dataclass(frozen=True, slots=True)
class Cosignature:
    """A cosignature line that verified: who, and when by the cosigner's clock."""

    name: str
    timestamp_s: int


def cosignature_of(note: SignedNote, name: str, public_key: bytes) -> Cosignature | None:
    """The valid cosignature of (name, key) on ``note``, or None (absent or not verifying).

    Lines of other names or key ids are ignored, as C2SP signed-note asks of verifiers.
    """
    key_hash = cosigner_key_id(name, public_key)
    for line in note.signatures:
        if line.name != name or line.key_hash != key_hash:
            continue
        if len(line.signature) != TIMESTAMP_BYTES + 64:
            continue
        timestamp_s = int.from_bytes(line.signature[:TIMESTAMP_BYTES], "big")
        if timestamp_s > MAX_TIMESTAMP_S:
            continue
        message = cosignature_message(note.body, timestamp_s)
        if verify(public_key, message, line.signature[TIMESTAMP_BYTES:]):
            return Cosignature(name, timestamp_s)
    return None


def has_cosigner_line(note: SignedNote, name: str, public_key: bytes) -> bool:
    """True when some line claims to be this cosigner's (same name and key id)."""
    key_hash = cosigner_key_id(name, public_key)
    return any(s.name == name and s.key_hash == key_hash for s in note.signatures)
