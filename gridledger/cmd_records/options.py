"""The records parties sign after the terms: reclaim, adjust, bind-key, cosign, publish.

    gridledger reclaim  --terms T --key OPERATOR.key --effective-at TIME ...
    gridledger release  --terms T --key BUYER.key --effective-at TIME ...  # the buyer ends early
    gridledger resume   --terms T --node NODE --from-seq SEQ --from TIME --key K [--key K]
    gridledger adjust   --terms T (--credit | --charge) AMOUNT --reason TEXT --key K [--key K]
    gridledger bind-key --terms T --node NODE --node-key NODE.pub --valid-from TIME ...
    gridledger assign   --terms T --new-buyer ID --new-buyer-key NEW.pub --handover-at TIME
                        --rate AMOUNT [--gpus UUID,...] --key BUYER.key [--key DESK.key]
    gridledger cosign   RECORD.json --terms T --key K       # the next party adds its signature
    gridledger publish  RECORD.json --terms T (--kafka HOST:PORT | --local-dir DIR)

Each signs with the party's own key file, writes the signed record (an envelope, JSON),
and publishes it once every signature SPEC §4.0 requires is there: a reclaim needs the
operator; a charge the buyer (the desk may co-sign); a credit the operator **and** the
desk; a key binding the operator and the buyer (one that only shortens a binding, the
operator alone); an assignment (a resale, SPEC §6.8) the buyer, the new buyer and the
desk (and the operator when the terms say ``resale_requires_operator``); a resume of a
node's stream (a node that lost its spool) the operator and the buyer. Several
``--key`` sign at once; otherwise one party signs, sends the
file, and the next runs ``gridledger cosign``.

``--dry-run`` shows what the record does to the bill before anything is published: the
current statement against the same with the record, folded locally by the ledger's own
rules from an export (``--export FILE``) or from the running ledger's API (``--ledger
URL``). It writes and publishes nothing.

Times are ISO 8601 with an offset (``2026-12-01T00:52:00Z``) or integer milliseconds
since the epoch; amounts are decimal currency units (``12.50``), exact at the terms'
scale.

Exit codes: 0 done (signed and written; published when asked; a dry run the ledger
would accept); 1 refused (a key that may not sign this record, signatures missing for
publishing, a dry run the ledger would reject); 2 unusable input (a file, a time, an
amount, an export) or a record the ledger will refuse, known from the terms before
signing (a party's, the ledger's or a node's key where it may not be; stale or
future-dated evidence, SPEC §6.3, §6.8, §6.9); 75 Kafka did not acknowledge (nothing was
published; try again).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final

from gridledger.cmd_records import (
    adjust,
    assign,
    bind_key,
    cosign,
    publish,
    reclaim,
    release,
    resume,
)
from gridledger.cmd_records.common import run_handler
from gridledger.publishing import add_target_arguments


def add_common(p: argparse.ArgumentParser, *, keys: bool, out: bool, target_required: bool) -> None:
    p.add_argument(
        "--terms",
        type=Path,
        required=True,
        metavar="FILE",
        help="the placement's signed terms (terms.signed.json): parties, keys, GPUs",
    )
    if keys:
        p.add_argument(
            "--key",
            type=Path,
            action="append",
            required=True,
            metavar="FILE",
            help="a signing party's private key file (repeat for several signers)",
        )
    if out:
        p.add_argument("--out", type=Path, metavar="FILE", help="where to write the signed record")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the statement now and with this record; write and publish nothing",
    )
    p.add_argument(
        "--arrives-at",
        default="now",
        metavar="TIME",
        help="dry run: when the record reaches the log (ISO time or epoch ms; default now) — "
        "the ledger times it by arrival (SPEC §6.6), e.g. a reclaim's notice",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--export", type=Path, metavar="FILE", help="dry run: the current state from this export"
    )
    source.add_argument(
        "--ledger",
        metavar="URL",
        help="dry run: the current state from the running ledger's API (http://HOST:PORT)",
    )
    add_target_arguments(p, required=target_required)


# The option table: each command, its one-line help, its module (``command`` handles it,
# ``options`` adds what is its own), whether it signs with --key and writes --out. Every
# command then takes the common options (``add_common``); the order is the --help order.
COMMANDS: Final[tuple[tuple[str, str, ModuleType, bool], ...]] = (
    ("reclaim", "operator: take the placement's GPUs back (a ReclaimNotice)", reclaim, True),
    ("release", "buyer: end the placement early (a BuyerRelease, SPEC §6.7)", release, True),
    ("adjust", "a credit to the buyer or a charge, signed by whom it costs", adjust, True),
    (
        "resume",
        "operator and buyer: a node that lost its spool goes on (a StreamResume, SPEC §6.3)",
        resume,
        True,
    ),
    (
        "bind-key",
        "operator and buyer: a node signs with this key (NodeKeyBinding)",
        bind_key,
        True,
    ),
    (
        "assign",
        "buyer, new buyer and desk: resell GPUs of the window (an Assignment)",
        assign,
        True,
    ),
    (
        "cosign",
        "add your signature to a signed record (reclaim, release, adjustment, key binding, "
        "assignment, resume)",
        cosign,
        True,
    ),
    (
        "publish",
        "publish a fully signed record (reclaim, release, adjustment, key binding, assignment, "
        "resume)",
        publish,
        False,
    ),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add reclaim, release, adjust, resume, bind-key, assign, cosign and publish."""
    for name, help_text, module, signs in COMMANDS:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text + ".\n\n" + (__doc__ or ""),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.options(p)
        add_common(p, keys=signs, out=signs, target_required=False)
        handler: Callable[[argparse.Namespace], int] = module.command
        p.set_defaults(handler=functools.partial(run_handler, handler))
