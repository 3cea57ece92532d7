"""`gridledger fetch`: a party's statement, page or export from a remote ledger (SPEC §13).

    gridledger fetch statement PLACEMENT --ledger URL --key KEY [--out FILE.json]
    gridledger fetch page PLACEMENT --ledger URL --key KEY [--party P] [--out FILE.html]
    gridledger fetch export PLACEMENT --ledger URL --key KEY [--out FILE.duckdb]
    (each also takes --cafile PEM: the CA that signed an https ledger's certificate)

Every request is signed with KEY (RFC 9421, Ed25519): the key the placement's terms pin for
you (operator, buyer, desk, or the new buyer of a resale), or an auditor key the ledger
lists. The ledger shows each key only its own: another placement is "not found". An
export is then checked offline with ``gridledger verify EXPORT --trust trust.json``.

Exit codes: 0 fetched; 1 the ledger refused (its words are printed); 2 bad usage (a key
file); 75 the ledger did not answer (try again).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from proto.keys import SigningKey

EX_TEMPFAIL: Final = 75


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `fetch` command."""
    fetch = sub.add_parser(
        "fetch",
        help="fetch a statement, page or export from a remote ledger, signed with your key",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fetch.add_argument(
        "what",
        choices=("statement", "page", "export"),
        help="statement (signed JSON), page (HTML bill) or export (DuckDB file)",
    )
    fetch.add_argument("placement", metavar="PLACEMENT", help="the placement id")
    fetch.add_argument("--ledger", required=True, metavar="URL", help="the ledger's API URL")
    fetch.add_argument("--key", required=True, type=Path, metavar="KEY", help="your key file")
    fetch.add_argument("--out", type=Path, metavar="FILE", help="where to write it")
    fetch.add_argument("--party", metavar="P", help="page: which of your pages (default: yours)")
    fetch.add_argument(
        "--cafile",
        type=Path,
        metavar="PEM",
        help="https: check the ledger's certificate against this CA (default: the system's)",
    )
    fetch.set_defaults(handler=cmd_fetch)


def _fail(message: str, code: int) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return code


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch and write (or print) what was asked for."""
    from ledger.client import forget_tls, trust_tls
    from proto.errors import KeyFileError
    from proto.keys import load_signing_key

    try:
        key = load_signing_key(args.key)
    except (KeyFileError, OSError) as exc:
        return _fail(f"cannot use key {args.key}: {exc}", 2)
    base = str(args.ledger).rstrip("/")
    if not base.startswith(("http://", "https://")):
        return _fail(f"--ledger {args.ledger!r}: expected an http:// or https:// URL", 2)
    if args.cafile is not None:
        if not args.cafile.is_file():
            return _fail(f"--cafile {args.cafile}: no such file", 2)
        try:
            trust_tls(base, args.cafile)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return _fail(f"--cafile {args.cafile}: {exc}", 2)
    try:
        return _fetch(args, base, key)
    finally:
        forget_tls(base)


def _fetch(args: argparse.Namespace, base: str, key: SigningKey) -> int:
    from ledger.client import ApiError, download_export, get_page, get_statement

    try:
        if args.what == "export":
            out = args.out or Path(f"{args.placement}.duckdb")
            size = download_export(base, args.placement, out, key)
            print(f"OK: export of {args.placement} ({size} bytes) written to {out}")
            return 0
        if args.what == "page":
            body = get_page(base, args.placement, key, args.party)
        else:
            import json

            body = (json.dumps(get_statement(base, args.placement, key), indent=2) + "\n").encode()
    except ApiError as exc:
        return _fail(str(exc), 1 if exc.status else EX_TEMPFAIL)
    except OSError as exc:
        return _fail(f"cannot write {args.out}: {exc}", 2)
    if args.out is None:
        sys.stdout.write(body.decode("utf-8", "replace"))
        return 0
    try:
        args.out.write_bytes(body)
    except OSError as exc:
        return _fail(f"cannot write {args.out}: {exc}", 2)
    print(f"OK: {args.what} of {args.placement} written to {args.out}")
    return 0
