"""What a party knows it handed to the ledger: the inputs its witness looks for (SPEC §8.3).

* Delivery logs (``proto.delivery``): the usage events an agent of the operator
  delivered, with the time it delivered them.
* Known envelope files: any signed input the party holds (the terms it signed, a reclaim
  it published or received, an adjustment), one envelope per file in one directory, and
  beside them that directory's own ``DELIVERED.jsonl``: the time the party received or
  sent each one, written when it kept the file (``keep``; ``gridledger witness keep``).
  A file's modification time is never taken for it (a copy made later would date the
  input late, and the witness would refuse an honest ledger): a file with no line there
  is bad input, named with the command that records it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from proto import limits
from proto.delivery import (
    DELIVERY_LOG_FILE,
    DeliveryLogError,
    append_delivered,
    read_delivered,
    received_input,
)
from proto.durable_io import read_at_most
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.records import Assignment, UsageEvent

MAX_KNOWN_FILES: Final = 100_000


class KnownError(Exception):
    """A known-input source that cannot be read; the message names it."""


@dataclass(frozen=True, slots=True)
class Known:
    """One input the party delivered: its hash, what it is, and when it was delivered."""

    input_hash: str
    kind: str
    node_id: str  # "" unless usage
    seq: int  # -1 unless usage
    delivered_at_ms: int
    origin: str  # where the witness learned of it (file name), for refusals
    new_buyer: tuple[str, bytes] | None = None  # an assignment's new buyer (id, key)

    def describe(self) -> str:
        """How a refusal names this input."""
        if self.kind == "usage":
            return f"node {self.node_id} seq {self.seq} input {self.input_hash}"
        return f"{self.kind} input {self.input_hash}"


def from_delivery_logs(paths: Iterable[Path], placement_id: str) -> list[Known]:
    """The usage events of ``placement_id`` in these delivery logs, first delivery kept."""
    found: dict[str, Known] = {}
    for path in paths:
        try:
            for line in read_delivered(path):
                if line.placement_id != placement_id or line.input_hash in found:
                    continue
                found[line.input_hash] = Known(
                    line.input_hash,
                    line.kind,
                    line.node_id,
                    line.seq,
                    line.delivered_at_ms,
                    path.name,
                )
        except OSError as exc:
            raise KnownError(f"cannot read delivery log {path}: {exc.strerror}") from exc
        except DeliveryLogError as exc:
            raise KnownError(str(exc)) from exc
    return list(found.values())


def keep(directory: Path, envelope: bytes, received_at_ms: int, name: str | None = None) -> Path:
    """Keep a signed input the party received or sent in ``directory`` (its ``--known``):
    the envelope as a file (``name``, else ``<kind>-<hash prefix>.json``) and the time in
    the directory's ``DELIVERED.jsonl``, appended and fsync'd. Returns the file."""
    raw = envelope.rstrip(b"\n")
    try:
        line = received_input(raw, received_at_ms)
    except (ProtoError, DeliveryLogError) as exc:
        raise KnownError(f"not a signed input of a placement: {exc}") from exc
    path = directory / (name or f"{line.kind}-{line.input_hash[:16]}.json")
    if path.name == DELIVERY_LOG_FILE:
        raise KnownError(f"{path}: that name is the directory's receipt log")
    try:
        if path.exists():
            if path.read_bytes().rstrip(b"\n") != raw:
                raise KnownError(f"{path} already holds another input; nothing was kept")
        else:
            path.write_bytes(raw + b"\n")
        append_delivered(directory / DELIVERY_LOG_FILE, [line])
    except OSError as exc:
        raise KnownError(f"cannot write to {directory}: {exc.strerror}") from exc
    return path


def _receipt_times(directory: Path) -> dict[str, int]:
    """Input hash -> the earliest time the directory's receipt log gives it."""
    log_path = directory / DELIVERY_LOG_FILE
    if not log_path.exists():
        return {}
    times: dict[str, int] = {}
    try:
        for line in read_delivered(log_path):
            times[line.input_hash] = min(
                times.get(line.input_hash, line.delivered_at_ms), line.delivered_at_ms
            )
    except OSError as exc:
        raise KnownError(f"cannot read {log_path}: {exc.strerror}") from exc
    except DeliveryLogError as exc:
        raise KnownError(str(exc)) from exc
    return times


def from_envelope_files(directory: Path, placement_id: str) -> list[Known]:
    """Signed inputs of ``placement_id`` saved as files in ``directory`` (others skipped),
    each at the time the directory's receipt log gives it."""
    try:
        paths = sorted(
            p for p in directory.iterdir() if p.is_file() and p.name != DELIVERY_LOG_FILE
        )
    except OSError as exc:
        raise KnownError(f"cannot read known-inputs directory {directory}: {exc.strerror}") from exc
    if len(paths) > MAX_KNOWN_FILES:
        raise KnownError(f"{directory} holds more than {MAX_KNOWN_FILES} files")
    times = _receipt_times(directory)
    known: list[Known] = []
    for path in paths:
        try:
            raw = read_at_most(path, limits.MAX_ENVELOPE_BYTES + 1).rstrip(b"\n")
        except OSError as exc:
            raise KnownError(f"cannot read {path}: {exc.strerror}") from exc
        try:
            opened = open_envelope(raw)
        except ProtoError as exc:
            raise KnownError(f"{path} is not a signed input: {exc}") from exc
        if getattr(opened.record, "placement_id", None) != placement_id:
            continue
        delivered_at_ms = times.get(opened.input_hash)
        if delivered_at_ms is None:
            raise KnownError(
                f"{path}: no time for it in {directory / DELIVERY_LOG_FILE}: say when you "
                f"received or sent it with gridledger witness keep {path} --known {directory} "
                "[--received-ms T] (a copied file's own time is not taken)"
            )
        record = opened.record
        node_id, seq = ("", -1)
        if isinstance(record, UsageEvent):
            node_id, seq = record.node_id, record.seq
        new_buyer = None
        if isinstance(record, Assignment):
            new_buyer = (record.new_buyer.id, record.new_buyer.key)
        known.append(
            Known(
                opened.input_hash,
                opened.kind,
                node_id,
                seq,
                delivered_at_ms,
                path.name,
                new_buyer,
            )
        )
    return known
