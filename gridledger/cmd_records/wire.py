"""A record as the wire takes it: its checks reported by the option the user gave, and a
signed record file opened for cosign and publish."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from gridledger.cmd_records.common import RECORD, UsageError
from proto.canonical import decode_payload, signed_bytes
from proto.durable_io import read_at_most
from proto.envelope import Opened, open_envelope
from proto.errors import ProtoError
from proto.limits import MAX_ENVELOPE_BYTES
from proto.records import (
    Adjustment,
    Assignment,
    BuyerRelease,
    NodeKeyBinding,
    PlacementTerms,
    ReclaimNotice,
    StreamResume,
)
from proto.terms import in_words

# A record's field -> the option the user gave it with (messages use the user's words).
_OPTION_OF: Final = {
    "reclaim_id": "--id",
    "release_id": "--id",
    "resume_id": "--id",
    "from_seq": "--from-seq",
    "from_ms": "--from",
    "adjustment_id": "--id",
    "assignment_id": "--id",
    "new_buyer.id": "--new-buyer",
    "new_buyer.key": "--new-buyer-key",
    "reason": "--reason",
    "reference": "--reference",
    "gpus": "--gpus",
    "rate_per_gpu_hour_minor": "--rate",
    "amount_minor": "the amount",
    "issued_at_ms": "--issued-at",
    "effective_at_ms": "--effective-at",
    "handover_at_ms": "--handover-at",
    "valid_from_ms": "--valid-from",
    "valid_until_ms": "--valid-until",
    "node_id": "--node",
    "key": "--node-key",
    "evidence": "--evidence",
    "placement_id": "the terms' placement_id",
}

_AT: Final = re.compile(r"^(?:\w+: )?(?P<message>.*) - at `\$\.(?P<path>[\w.\[\]]+)`$", re.S)


def _field_value(record: RECORD, path: str) -> object:
    value: object = record
    for part in re.findall(r"\w+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])] if isinstance(value, list) else None
        else:
            value = getattr(value, part, None)
    return value


def check_record(record: RECORD) -> None:
    """The wire's checks (identifiers, text, bounds), reported by the option given."""
    try:
        decode_payload(signed_bytes(record))
    except ProtoError as exc:
        found = _AT.match(exc.detail)
        path = "" if found is None else found["path"]
        option = _OPTION_OF.get(path) or _OPTION_OF.get(re.sub(r"\[\d+\]$", "", path))
        if found is None or option is None:
            raise UsageError(f"the record is not valid: {exc}") from exc
        if option == "the amount" and isinstance(record, Adjustment):
            option = f"--{record.direction}"
        words = in_words(option, _field_value(record, path), found["message"], sep=" ")
        raise UsageError(words) from exc


def open_record(path: Path, terms: PlacementTerms) -> tuple[Opened, RECORD]:
    try:
        raw = read_at_most(path, MAX_ENVELOPE_BYTES + 2)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        opened = open_envelope(raw.rstrip(b"\n"))
    except ProtoError as exc:
        raise UsageError(f"{path} is not a signed record: {exc}") from exc
    record = opened.record
    if not isinstance(
        record,
        ReclaimNotice | Adjustment | NodeKeyBinding | Assignment | BuyerRelease | StreamResume,
    ):
        raise UsageError(
            f"{path} holds a {opened.kind} record; this command takes reclaim, adjustment, "
            "keybinding, assignment, release and resume records (terms: gridledger terms "
            "sign/publish)"
        )
    if record.placement_id != terms.placement_id:
        raise UsageError(
            f"{path} is for placement {record.placement_id}, the terms for {terms.placement_id}"
        )
    return opened, record
