"""The verifier's one exception: input it cannot use at all (the CLI exits 2 on it)."""

from __future__ import annotations


class UnusableInput(Exception):
    """Not a DuckDB file, an unknown format or version, a missing or malformed trust file.

    Anything readable that does not check out is a finding, never this exception.
    """

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail
