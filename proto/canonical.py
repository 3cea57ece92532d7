"""Canonical bytes (SPEC.md, "Canonical bytes"): domain prefix + RFC 8785 profile JSON.

Signed bytes are ``gridledger/<kind>/v1\\n`` followed by the record as JSON with keys
sorted, no whitespace, UTF-8, integers within +-(2^53-1), strings and booleans; never a
float, never null. Decoding is strict and then re-encodes: the bytes are canonical only
if the re-encoding reproduces them exactly, which also rejects duplicate keys, escapes
written another way, and ``-0``.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Final

import msgspec

from proto import limits
from proto.errors import ProtoError
from proto.invariant import of_type
from proto.reasons import Reason
from proto.records import KIND_TO_TYPE, Record

_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_DECODERS: Final = {kind: msgspec.json.Decoder(t) for kind, t in KIND_TO_TYPE.items()}
_PREFIX_RE: Final = re.compile(rb"^gridledger/([a-z]+)/v1$")
_PREFIXES: Final = {kind: f"gridledger/{kind}/v1\n".encode() for kind in KIND_TO_TYPE}


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON of a Struct or plain value (sorted keys, no whitespace)."""
    return _ENCODER.encode(obj)


# The prefix of each record type, to skip the tag lookup per record (``signed_bytes``).
_TYPE_PREFIXES: Final = {t: _PREFIXES[kind] for kind, t in KIND_TO_TYPE.items()}


def signed_bytes(record: Record) -> bytes:
    """The exact bytes that are signed and hashed for ``record``."""
    prefix = _TYPE_PREFIXES.get(type(record))
    if prefix is None:
        kind = of_type(record.__struct_config__.tag, str, "wire tag of a record")
        prefix = _PREFIXES[kind]
    return prefix + _ENCODER.encode(record)


def split_prefix(payload: bytes) -> tuple[str, bytes]:
    """Split signed bytes into (kind, JSON body); reject an unknown or malformed prefix."""
    if len(payload) > limits.MAX_PAYLOAD_BYTES:
        raise ProtoError(
            Reason.OVERSIZE, f"payload is {len(payload)} bytes, limit {limits.MAX_PAYLOAD_BYTES}"
        )
    line, sep, body = payload.partition(b"\n")
    match = _PREFIX_RE.match(line) if sep else None
    if match is None:
        shown = line[:48].decode("utf-8", "replace")
        raise ProtoError(Reason.BAD_PREFIX, f"payload does not start with a prefix line: {shown!r}")
    kind = match.group(1).decode()
    if kind not in _DECODERS:
        raise ProtoError(Reason.BAD_PREFIX, f"unknown record kind {kind!r} in prefix")
    return kind, body


def decode_payload(payload: bytes) -> Record:
    """Decode signed bytes into their record, strictly; raise ProtoError with the reason."""
    return decode_kind_payload(payload)[1]


def decode_kind_payload(payload: bytes) -> tuple[str, Record]:
    """``decode_payload`` with the record's kind (its prefix, which its wire tag equals:
    the kind's decoder accepts no other ``type``)."""
    kind, body = split_prefix(payload)
    try:
        record: Record = _DECODERS[kind].decode(body)
    except msgspec.ValidationError as exc:
        raise ProtoError(_classify_validation(str(exc)), f"{kind}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ProtoError(Reason.MALFORMED, f"{kind}: {exc}") from exc
    if _ENCODER.encode(record) != body:
        raise ProtoError(*_diagnose_non_canonical(kind, body))
    return kind, record


def _classify_validation(message: str) -> Reason:
    if "unknown field" in message:
        return Reason.UNKNOWN_FIELD
    if "got `float`" in message:
        return Reason.FLOAT
    if "Invalid value" in message and "$.type" in message:
        return Reason.KIND_MISMATCH
    if any(op in message for op in (">=", "<=", "length", "matching regex")):
        return Reason.OUT_OF_RANGE
    return Reason.MALFORMED


def _diagnose_non_canonical(kind: str, body: bytes) -> tuple[Reason, str]:
    """Name why decodable bytes are not canonical (only on the rejection path)."""
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                duplicates.append(key)
            seen.add(key)
        return dict(items)

    parsed: Any = None
    with contextlib.suppress(ValueError):
        parsed = json.loads(body, object_pairs_hook=pairs)
    if duplicates:
        return Reason.DUPLICATE_KEY, f"{kind}: duplicate key {duplicates[0]!r}"
    if isinstance(parsed, dict) and None in parsed.values():
        # §2 (3): an optional field written as null (it decodes to its absent default)
        field = next(k for k, v in parsed.items() if v is None)
        return Reason.MALFORMED, f"{kind}: {field!r} is null; an absent field is omitted"
    return Reason.NON_CANONICAL, f"{kind}: bytes differ from their canonical re-encoding"
