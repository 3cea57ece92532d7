"""What a party kept, against the export it is shown (SPEC §9, "A kept checkpoint").

A checkpoint the user kept (``verify --checkpoint NOTE``) or the last checkpoint its
witness cosigned (``verify --witness-state DIR``: the witness's state file of the
placement) is ledger-signed evidence of how far the log had grown. An export that does
not extend it — fewer records (``TRUNCATED``: later periods, their statements and
checkpoints cut away at rest), or other ones (``EQUIVOCATION``) — is a finding of that
export, so its verdict is FAILED, never FINAL.

The witness's state is read here on its own terms (the format its witness writes:
``gridledger-witness-state/v1``, a JSON object whose ``cosigned_note`` is the last note it
cosigned), never through ``witness/``: the verifier imports ``proto/`` and ``billview/``
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from proto.durable_io import read_at_most
from proto.trust import TrustFile
from verifier import limits
from verifier.copies import check_kept, kept_placement
from verifier.errors import UnusableInput
from verifier.findings import Step
from verifier.state import FAILED, ExportReport

WITNESS_STATE_FORMAT: Final = "gridledger-witness-state/v1"


class _StateView(msgspec.Struct):
    """The fields of a witness's state file the verifier reads (others are ignored)."""

    format: str
    placement_id: str
    cosigned_note: str = ""


@dataclass(frozen=True, slots=True)
class Kept:
    """One piece of kept evidence: where it came from and the note."""

    source: str  # "the kept checkpoint" or "the witness state <path>"
    note: str


def witness_state_note(state_dir: Path, placement_id: str) -> Kept | None:
    """The last note the witness cosigned for ``placement_id`` (None: it witnessed none);
    a state file that is not one is unusable input (one line)."""
    if not state_dir.is_dir():
        raise UnusableInput(str(state_dir), "--witness-state is not a directory")
    if "/" in placement_id or placement_id.startswith("."):
        return None  # not a name of a file of that directory
    path = state_dir / f"{placement_id}.json"
    if not path.is_file():
        return None
    try:
        raw = read_at_most(path, limits.MAX_WITNESS_STATE_BYTES)
    except OSError as exc:
        raise UnusableInput(str(path), f"cannot read the witness state: {exc.strerror}") from exc
    if len(raw) > limits.MAX_WITNESS_STATE_BYTES:
        raise UnusableInput(str(path), f"larger than {limits.MAX_WITNESS_STATE_BYTES} bytes")
    try:
        view = msgspec.json.decode(raw, type=_StateView)
    except msgspec.MsgspecError as exc:
        raise UnusableInput(str(path), f"not a witness state: {str(exc)[:200]}") from exc
    if view.format != WITNESS_STATE_FORMAT or view.placement_id != placement_id:
        raise UnusableInput(str(path), f"not a {WITNESS_STATE_FORMAT} file of {placement_id}")
    if not view.cosigned_note:
        return None
    return Kept(f"the witness state {path}", view.cosigned_note)


def kept_for(report: ExportReport, kept: str | None, witness_state: Path | None) -> list[Kept]:
    """The kept evidence that applies to ``report``'s placement."""
    out: list[Kept] = []
    if kept is not None and kept_placement(kept) == report.placement_id:
        out.append(Kept("the kept checkpoint", kept))
    if witness_state is not None and report.placement_id:
        state = witness_state_note(witness_state, report.placement_id)
        if state is not None:
            out.append(state)
    return out


def judge_kept(
    report: ExportReport, trust: TrustFile, evidence: Sequence[Kept]
) -> list[dict[str, object]]:
    """Check each piece of ``evidence`` against the export of ``report``; every one it does
    not extend is a finding of the export (its verdict FAILED). Returns one result each."""
    ledger_keys = [k.key for k in trust.keys if k.role == "ledger"]
    results: list[dict[str, object]] = []
    for item in evidence:
        result = check_kept(
            report.path, report.placement_id, ledger_keys, report.record_count, item.note
        )
        results.append(
            {
                "path": report.path,
                "source": item.source,
                "ok": result.ok,
                "rule": result.rule,
                "detail": result.detail,
            }
        )
        if not result.ok:
            report.findings.add(
                Step.COMPLETENESS,
                result.rule,
                item.source,
                "an export that extends it",
                f"{report.record_count} records",
                result.detail,
            )
            report.verdict = FAILED
    return results
