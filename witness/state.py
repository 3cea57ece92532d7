"""The witness's durable view of each placement's log (SPEC §8.3).

One JSON file per placement, replaced atomically (temp file, fsync, rename, fsync of the
directory) *before* a cosignature leaves the witness: after a crash it never cosigns a
tree that does not extend one it already cosigned. Refusals are kept beside it as
evidence, one JSON file each.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

import msgspec

from proto.durable_io import read_at_most, write_atomic
from proto.frontier import Frontier
from proto.records import ZERO_HASH

STATE_FORMAT: Final = "gridledger-witness-state/v1"
MAX_STATE_BYTES: Final = 512 * 1024 * 1024
REFUSALS_DIR: Final = "refusals"


class StateError(Exception):
    """A state file that cannot be used; the message names it."""


class WitnessState(msgspec.Struct, forbid_unknown_fields=True):
    """What the witness cosigned last for one placement, and what it saw in the log."""

    format: str
    placement_id: str
    size: int = 0
    frontier: list[bytes] = msgspec.field(default_factory=list)
    last_record_hash: str = ZERO_HASH
    close_index: int = -1  # index of the accepted `closed` record, -1 before the close
    included: dict[str, int] = msgspec.field(default_factory=dict)  # input hash -> index
    terms_arrived_ms: int = -1  # arrived_ms of the accepted terms record (SPEC §6.6)
    last_arrived_ms: int = -1  # the latest arrived_ms of the records so far
    cosigned_note: str = ""
    cosigned_at_s: int = 0

    def tree(self) -> Frontier:
        """The frontier of the cosigned tree."""
        return Frontier(self.size, tuple(self.frontier))


class Refusal(msgspec.Struct, forbid_unknown_fields=True):
    """Why the witness would not cosign, with the evidence (SPEC §8.3)."""

    code: str
    detail: str
    placement_id: str
    refused_at_s: int
    checkpoint: str  # the note it was asked to cosign
    cosigned: str  # the last note it cosigned ("" if none)
    index: int = -1  # the record at fault, if one
    record: str = ""  # its envelope, base64


def state_path(state_dir: Path, placement_id: str) -> Path:
    """Where the state of ``placement_id`` lives."""
    return state_dir / f"{placement_id}.json"


def load_state(state_dir: Path, placement_id: str) -> WitnessState:
    """The stored state, or a fresh one for a placement never witnessed."""
    path = state_path(state_dir, placement_id)
    try:
        raw = read_at_most(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return WitnessState(format=STATE_FORMAT, placement_id=placement_id)
    except OSError as exc:
        raise StateError(f"cannot read witness state {path}: {exc.strerror}") from exc
    if len(raw) > MAX_STATE_BYTES:
        raise StateError(f"witness state {path} is larger than {MAX_STATE_BYTES} bytes")
    try:
        state = msgspec.json.decode(raw, type=WitnessState)
    except msgspec.MsgspecError as exc:
        raise StateError(f"witness state {path} is damaged: {exc}") from exc
    if state.format != STATE_FORMAT or state.placement_id != placement_id:
        raise StateError(f"witness state {path} is not this placement's {STATE_FORMAT}")
    if not state.tree().well_formed():
        raise StateError(f"witness state {path}: frontier does not match size {state.size}")
    return state


def note_path(state_dir: Path, placement_id: str) -> Path:
    """The last note this witness cosigned, to keep (``verify --checkpoint``, SPEC §9)."""
    return state_dir / f"{placement_id}.checkpoint"


def store_state(state_dir: Path, state: WitnessState) -> None:
    """Replace the placement's state file atomically and durably, then the kept note."""
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_path(state_dir, state.placement_id), msgspec.json.encode(state))
    if state.cosigned_note:
        write_atomic(note_path(state_dir, state.placement_id), state.cosigned_note.encode())


def store_refusal(state_dir: Path, refusal: Refusal) -> Path:
    """Keep a refusal as evidence; returns its file."""
    directory = state_dir / REFUSALS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    size = refusal.checkpoint.split("\n", 2)[1] if refusal.checkpoint.count("\n") >= 2 else "x"
    path = directory / f"{refusal.placement_id}.{size}.{refusal.code}.{refusal.refused_at_s}.json"
    write_atomic(path, msgspec.json.format(msgspec.json.encode(refusal), indent=2) + b"\n")
    return path


def list_refusals(state_dir: Path) -> list[Refusal]:
    """Every kept refusal, oldest first."""
    directory = state_dir / REFUSALS_DIR
    if not directory.is_dir():
        return []
    refusals = []
    for path in sorted(directory.glob("*.json")):
        with contextlib.suppress(OSError, msgspec.MsgspecError):
            refusals.append(msgspec.json.decode(read_at_most(path, 1 << 24), type=Refusal))
    return sorted(refusals, key=lambda r: r.refused_at_s)


def list_states(state_dir: Path) -> list[WitnessState]:
    """The state of every placement witnessed here."""
    if not state_dir.is_dir():
        return []
    states = []
    for path in sorted(state_dir.glob("*.json")):
        with contextlib.suppress(StateError):
            states.append(load_state(state_dir, path.stem))
    return states
