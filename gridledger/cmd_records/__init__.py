"""The records parties sign after the terms: reclaim, release, adjust, bind-key, assign,
cosign, publish (the commands' help: ``options``).

One module per command (``command`` handles it, ``options`` adds its own options); the
option table and the help text in ``options``; beside them what the commands share:
``common`` (errors, times, amounts, files), ``signers`` (who signs, SPEC §4.0),
``precheck`` (what the ledger will refuse, known from the terms), ``wire`` (the record's
wire checks, a signed record file) and ``finish`` (sign, dry-run, write, publish).
"""

from gridledger.cmd_records.common import Refused, UsageError, parse_amount_minor, parse_time_ms
from gridledger.cmd_records.options import register
from gridledger.cmd_records.signers import authority, missing_signers

__all__ = [
    "Refused",
    "UsageError",
    "authority",
    "missing_signers",
    "parse_amount_minor",
    "parse_time_ms",
    "register",
]
