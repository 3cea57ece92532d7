"""One round of a party's witness (SPEC §8.3): fetch, check, keep state, cosign or refuse.

``witness_once`` is what ``gridledger witness run`` does, as a function that returns the
exit code and the one line to print (the demo and tests call it in-process).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from proto.errors import KeyFileError, ProtoError
from proto.keys import load_signing_key
from proto.limits import WITNESS_INTERVAL_S
from proto.note import parse_checkpoint_body, parse_note
from proto.terms import TermsError, load_terms_file
from witness.check import Cosigned, witness
from witness.client import LedgerClient, LedgerRefused, LedgerUnreachable
from witness.known import Known, KnownError, from_delivery_logs, from_envelope_files
from witness.state import StateError, load_state, store_refusal, store_state

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 75


@dataclass(frozen=True, slots=True)
class WitnessResult:
    """The exit code and the one line a person reads."""

    code: int
    line: str


def witness_once(
    *,
    ledger_url: str,
    terms_path: Path,
    key_path: Path,
    state_dir: Path,
    delivery_logs: Sequence[Path] = (),
    known_dir: Path | None = None,
    now_s: int,
    interval_s: int = WITNESS_INTERVAL_S,
    simulation: bool = False,
) -> WitnessResult:
    """Check the ledger's latest checkpoint of the terms' placement; cosign or refuse.

    A checkpoint this witness already cosigned is cosigned again once its cosignature is
    ``interval_s`` old (SPEC §8.2: the timestamp bounds every later arrival from below).
    The key is a party key of the terms, or the new buyer's key of an assignment among
    the known inputs (SPEC §8.2: a resale's new buyer witnesses its own obligation).
    ``simulation``: the ledger runs ``arrival = "sender"`` (``witness.check.witness``).
    """
    try:
        terms, _ = load_terms_file(terms_path)
    except TermsError as exc:
        return WitnessResult(EXIT_USAGE, "FAIL: " + "; ".join(exc.problems))
    try:
        key = load_signing_key(key_path)
    except (KeyFileError, OSError, ValueError) as exc:
        return WitnessResult(EXIT_USAGE, f"FAIL: cannot use key {key_path}: {exc}")
    pid = terms.placement_id
    try:
        known: list[Known] = from_delivery_logs(delivery_logs, pid)
        if known_dir is not None:
            known += from_envelope_files(known_dir, pid)
        state = load_state(state_dir, pid)
    except (KnownError, StateError) as exc:
        return WitnessResult(EXIT_USAGE, f"FAIL: {exc}")
    parties = {p.key: p.id for p in (terms.operator, terms.buyer, terms.desk)}
    parties.update({k.new_buyer[1]: k.new_buyer[0] for k in known if k.new_buyer is not None})
    name = parties.get(key.public_key)
    if name is None:
        return WitnessResult(
            EXIT_USAGE,
            f"FAIL: the key {key_path} is not a party key of placement {pid}, nor the new "
            "buyer's of an assignment among the known inputs",
        )
    client = LedgerClient(ledger_url, pid, key)
    try:
        note = parse_note(client.checkpoint())
        size = parse_checkpoint_body(note.body).size
        fresh = now_s - state.cosigned_at_s < interval_s
        if size == state.size and state.cosigned_note.startswith(note.body) and fresh:
            return WitnessResult(EXIT_OK, f"OK: {pid}: size {size} already cosigned as {name}")
        records = client.records(state.size, size) if size > state.size else []
    except LedgerUnreachable as exc:
        return WitnessResult(EXIT_UNAVAILABLE, f"FAIL: {exc}")
    except (LedgerRefused, ProtoError) as exc:
        return WitnessResult(EXIT_REFUSED, f"FAIL: {pid}: {exc}")
    outcome = witness(
        state, terms, note, records, known, name=name, key=key, now_s=now_s, simulation=simulation
    )
    if not isinstance(outcome, Cosigned):
        refusal = outcome.refusal
        path = store_refusal(state_dir, refusal)
        return WitnessResult(
            EXIT_REFUSED, f"REFUSED: {pid}: {refusal.code}: {refusal.detail} (evidence: {path})"
        )
    store_state(state_dir, outcome.state)  # before the cosignature leaves (SPEC §8.3)
    try:
        client.submit(outcome.note.text())
    except LedgerUnreachable as exc:
        return WitnessResult(EXIT_UNAVAILABLE, f"FAIL: cosigned size {size}, but {exc}")
    except LedgerRefused as exc:
        return WitnessResult(
            EXIT_REFUSED, f"FAIL: cosigned size {size}, but the ledger did not take it: {exc}"
        )
    closed = " (closed)" if outcome.state.close_index >= 0 else ""
    return WitnessResult(EXIT_OK, f"OK: {pid}: cosigned size {size}{closed} as {name}")
