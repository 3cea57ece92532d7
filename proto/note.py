"""Checkpoints as C2SP signed notes (c2sp.org/signed-note, c2sp.org/tlog-checkpoint).

A note is UTF-8 text: the body (lines ending in newline), one empty line, then one
signature line per signer: ``— <name> <base64(key hash[4] || signature)>``. The key hash
of an Ed25519 key is SHA-256(name || "\\n" || 0x01 || public key)[:4]. Each signer signs
the body bytes; more signers (the parties' cosignatures) are more lines.

The checkpoint body is three lines: origin, tree size in decimal, base64 root hash.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from proto import limits
from proto.errors import ProtoError
from proto.keys import SigningKey, verify
from proto.reasons import Reason
from proto.records import Checkpoint

# The key name under which a ledger signs its checkpoints (SPEC §8.1).
LEDGER_NOTE_NAME: Final = "gridledger-ledger"
_DASH: Final = "\u2014"
_NAME_RE: Final = re.compile(r"^[^\s+]+$")
MAX_NOTE_BYTES: Final = 64 * 1024


_DECIMAL_RE: Final = re.compile(r"^(0|[1-9][0-9]*)$", re.ASCII)
_BASE64_RE: Final = re.compile(r"^[A-Za-z0-9+/]*={0,2}$", re.ASCII)


def _strict_b64(text: str, what: str) -> bytes:
    """Standard base64, canonical: ASCII, padded, and re-encoding gives the same text."""
    if len(text) % 4 or not _BASE64_RE.match(text):
        raise ProtoError(Reason.MALFORMED, f"{what} is not base64")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtoError(Reason.MALFORMED, f"{what} is not base64") from exc
    if base64.b64encode(data).decode("ascii") != text:
        raise ProtoError(Reason.NON_CANONICAL, f"{what} is not canonical base64")
    return data


def note_key_hash(name: str, public_key: bytes) -> bytes:
    """The 4-byte key hash that starts each signature of ``name``'s Ed25519 key."""
    return hashlib.sha256(name.encode() + b"\n\x01" + public_key).digest()[:4]


@dataclass(frozen=True, slots=True)
class NoteSignature:
    """One signature line of a note."""

    name: str
    key_hash: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class SignedNote:
    """A parsed note: body text and its signature lines."""

    body: str
    signatures: tuple[NoteSignature, ...]

    def text(self) -> str:
        """The note as text, signatures in the order held."""
        lines = [
            f"{_DASH} {s.name} {base64.b64encode(s.key_hash + s.signature).decode()}\n"
            for s in self.signatures
        ]
        return self.body + "\n" + "".join(lines)

    def signed_by(self, name: str, public_key: bytes) -> bool:
        """True when some line is a valid signature of the body by (name, key)."""
        key_hash = note_key_hash(name, public_key)
        message = self.body.encode()
        return any(
            s.name == name and s.key_hash == key_hash and verify(public_key, message, s.signature)
            for s in self.signatures
        )

    def add_signature(self, name: str, key: SigningKey) -> SignedNote:
        """The note with one more Ed25519 note signature (type 0x01) of (name, key).

        This is the log's own signature; witnesses cosign with ``proto.cosign.cosign``.
        """
        line = NoteSignature(
            name, note_key_hash(name, key.public_key), key.sign(self.body.encode())
        )
        kept = tuple(s for s in self.signatures if (s.name, s.key_hash) != (name, line.key_hash))
        return SignedNote(self.body, (*kept, line))


def sign_note(body: str, name: str, key: SigningKey) -> SignedNote:
    """A new note over ``body`` signed by (name, key)."""
    if not body.endswith("\n"):
        raise ValueError("a note body ends with a newline")
    return SignedNote(body, ()).add_signature(name, key)


def parse_note(text: str) -> SignedNote:
    """Parse note text; raise ProtoError(MALFORMED) on anything off the format."""
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise ProtoError(Reason.MALFORMED, "note: text is not valid Unicode") from exc
    if size > MAX_NOTE_BYTES:
        raise ProtoError(Reason.OVERSIZE, f"note exceeds {MAX_NOTE_BYTES} bytes")
    body, sep, sigs = text.rpartition("\n\n")
    if not sep or not sigs.endswith("\n"):
        raise ProtoError(Reason.MALFORMED, "note: no blank line before signatures")
    body += "\n"
    parsed: list[NoteSignature] = []
    for line in sigs[:-1].split("\n"):
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != _DASH or not _NAME_RE.match(parts[1]):
            raise ProtoError(Reason.MALFORMED, f"note: bad signature line {line[:80]!r}")
        blob = _strict_b64(parts[2], f"note: signature of {parts[1]}")
        # 4 + 64: an Ed25519 note signature (type 0x01); 4 + 8 + 64: a timestamped
        # cosignature (C2SP tlog-cosignature v1, type 0x04, proto/cosign.py).
        if len(blob) not in (4 + 64, 4 + 8 + 64):
            raise ProtoError(Reason.MALFORMED, f"note: {parts[1]} signature is not Ed25519")
        parsed.append(NoteSignature(parts[1], blob[:4], blob[4:]))
    if not parsed:
        raise ProtoError(Reason.SIG_MISSING, "note: no signature lines")
    return SignedNote(body, tuple(parsed))


def checkpoint_body(checkpoint: Checkpoint) -> str:
    """The tlog-checkpoint body text of a checkpoint."""
    if "\n" in checkpoint.origin:
        raise ValueError("origin is one line")
    return f"{checkpoint.origin}\n{checkpoint.size}\n{base64.b64encode(checkpoint.root).decode()}\n"


def parse_checkpoint_body(body: str) -> Checkpoint:
    """Read the three checkpoint lines back; raise ProtoError(MALFORMED) if they are off."""
    lines = body.split("\n")
    if len(lines) != 4 or lines[3] != "":
        raise ProtoError(Reason.MALFORMED, "checkpoint: body is not three lines")
    origin, size_text, root_text = lines[:3]
    if len(size_text) > 16 or not _DECIMAL_RE.match(size_text):
        raise ProtoError(Reason.MALFORMED, f"checkpoint: size {size_text[:20]!r} is not decimal")
    size = int(size_text)
    if size > limits.MAX_SAFE_INTEGER:
        raise ProtoError(Reason.OUT_OF_RANGE, "checkpoint: size out of range")
    root = _strict_b64(root_text, "checkpoint: root")
    if len(root) != 32 or not origin:
        raise ProtoError(Reason.MALFORMED, "checkpoint: root is not 32 bytes or origin empty")
    return Checkpoint(origin=origin, size=size, root=root)


def checkpoint_origin(placement_id: str) -> str:
    """The origin line of a placement's checkpoints."""
    return f"gridledger/placement/{placement_id}"


def names(signatures: Iterable[NoteSignature]) -> list[str]:
    """The signer names on some signature lines, in order."""
    return [s.name for s in signatures]
