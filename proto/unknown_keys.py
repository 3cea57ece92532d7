"""One wording for an unknown key in any file a person writes (terms TOML, meter.toml,
ledger.toml): ``unknown key NAME (did you mean CLOSEST?)``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["unknown_key"]


def unknown_key(key: str, known: Iterable[str], *, table: str = "") -> str:
    """The problem line for ``key`` (in ``table``, dotted, when given), with the closest
    known key as a suggestion when one is close enough."""
    hint = difflib.get_close_matches(key, sorted(known), n=1)
    also = f" (did you mean {hint[0]}?)" if hint else ""
    return f"unknown key {table + '.' if table else ''}{key}{also}"
