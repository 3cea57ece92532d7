"""Write fresh checkpoint notes for the Go peer check (bench/peer_c2sp/run.sh).

Each file has the shape of proto/vectors/checkpoint.json: a checkpoint signed by
``gridledger-ledger`` (proto.note.sign_note) and cosigned by one or more witnesses
(proto.cosign.cosign), with fresh random keys, the public keys, and the expected
origin, size, root and cosignature time. Nothing here is checked in Python; the Go
program (main.go) does the checking with other implementations.

Usage: python bench/peer_c2sp/make_notes.py OUT_DIR
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from proto import limits, merkle
from proto.cosign import MAX_TIMESTAMP_S, cosign
from proto.keys import SigningKey
from proto.note import checkpoint_body, checkpoint_origin, sign_note
from proto.records import Checkpoint

LEDGER = "gridledger-ledger"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def make(placement_id: str, size: int, root: bytes, cosigners: list[str], at_s: int) -> Any:
    """One ledger-signed, witness-cosigned checkpoint note with fresh keys."""
    ledger = SigningKey.generate(LEDGER)
    origin = checkpoint_origin(placement_id)
    body = checkpoint_body(Checkpoint(origin=origin, size=size, root=root))
    note = sign_note(body, LEDGER, ledger)
    signers = {LEDGER: _b64(ledger.public_key)}
    for name in cosigners:
        key = SigningKey.generate(name)
        note = cosign(note, name, key, at_s)
        signers[name] = _b64(key.public_key)
    return {
        "note": note.text(),
        "signers": signers,
        "origin": origin,
        "size": size,
        "root_b64": _b64(root),
        "cosigned_at_s": at_s,
    }


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    now = int(time.time())
    leaves = [os.urandom(40) for _ in range(1 + os.urandom(1)[0] % 50)]
    cases = {
        # A real RFC 9162 root of random records, one buyer witness, cosigned now.
        "fresh-one-cosigner.json": make(
            f"pl-{os.urandom(6).hex()}", len(leaves), merkle.root(leaves), ["buyer-1"], now
        ),
        # The empty tree (size 0, root SHA-256 of nothing), both parties and an auditor.
        "fresh-empty-three-cosigners.json": make(
            f"pl-{os.urandom(6).hex()}",
            0,
            merkle.root([]),
            ["buyer-7", "seller-3", "auditor-eu"],
            now,
        ),
        # Edge values: the largest size gridledger allows, the largest timestamp.
        "fresh-edges.json": make(
            f"pl-{os.urandom(6).hex()}",
            limits.MAX_SAFE_INTEGER,
            os.urandom(32),
            ["seller-1"],
            MAX_TIMESTAMP_S,
        ),
    }
    for name, data in cases.items():
        (out / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(out / name)


if __name__ == "__main__":
    main()
