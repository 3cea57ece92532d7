"""`gridledger keys new --id ID --out DIR`: an Ed25519 key pair for a party or a node."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proto.keys import SigningKey, write_key_pair
from proto.records import Identifier  # noqa: F401  (documents the id rule)

_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `keys` command group."""
    keys = sub.add_parser("keys", help="create key pairs")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="SUBCOMMAND", required=True)
    new = keys_sub.add_parser("new", help="write DIR/ID.key (0600) and DIR/ID.pub")
    new.add_argument("--id", required=True, help="who holds the key: a party id or a node id")
    new.add_argument("--out", required=True, type=Path, help="directory for the key files")
    new.set_defaults(handler=_new)


def _new(args: argparse.Namespace) -> int:
    name: str = args.id
    if not name or not name[0].isalnum() or set(name) - _ID_CHARS or len(name) > 128:
        print(
            f"FAIL: --id {name!r}: must be 1-128 characters of [A-Za-z0-9._:-], starting with a "
            "letter or digit",
            file=sys.stderr,
        )
        return 2
    key = SigningKey.generate(name)
    try:
        private_path, public_path = write_key_pair(key, args.out)
    except FileExistsError:
        print(f"FAIL: {args.out / (name + '.key')} exists; not overwriting a key", file=sys.stderr)
        return 1
    print(f"OK: {private_path} (private, 0600)")
    print(f"OK: {public_path} (public, key id {key.key_id})")
    return 0
