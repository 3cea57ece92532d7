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
from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta, Struct

from proto import limits
from proto.errors import ProtoError
from proto.invariant import of_type
from proto.reasons import Reason
from proto.records import (
    KIND_TO_TYPE,
    Allocation,
    GpuSample,
    Model,
    NonNegInt,
    Record,
    TimeMs,
    UsageEvent,
)

_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_DECODERS: Final = {kind: msgspec.json.Decoder(t) for kind, t in KIND_TO_TYPE.items()}
_PREFIX_RE: Final = re.compile(rb"^gridledger/([a-z]+)/v1$")
_PREFIXES: Final = {kind: f"gridledger/{kind}/v1\n".encode() for kind in KIND_TO_TYPE}
# The prefix line (without its newline) of each kind: ``split_prefix``'s common case.
_PREFIX_LINES: Final = {prefix[:-1]: kind for kind, prefix in _PREFIXES.items()}


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
    line, sep, body = payload.partition(b"\n")
    kind = _PREFIX_LINES.get(line)
    if kind is not None and sep and len(payload) <= limits.MAX_PAYLOAD_BYTES:
        return kind, body  # a known prefix line: what the checks below would find
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
    if kind == "usage":
        usage = _decode_usage_fast(body)
        if usage is not None:
            return kind, usage
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


# ---- the usage fast path ------------------------------------------------------------------
#
# msgspec checks a ``Meta(pattern=...)`` by calling ``re.Pattern.search`` from C, which
# builds a match object: ~0.3 us per field, the four pattern fields of a usage event
# (placement_id, node_id, prev, each sample's uuid) about half of its strict decode
# (bench/floor.py, "open usage"). ``_decode_usage_fast`` decodes into the same
# shape without the patterns (same fields, defaults, bounds and strictness otherwise),
# checks those fields with regexes equivalent to the patterns, and builds the
# UsageEvent; anything it does not accept goes to the strict decoder, which names the
# reason exactly as before. tests/test_fuzz_decoders.py checks that both accept the same
# bodies and build equal records.

_LooseIdentifier = Annotated[str, Meta(min_length=1, max_length=limits.MAX_ID_CHARS)]


class _LooseGpuSample(
    Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False
):
    """``proto.records.GpuSample`` without the pattern of ``uuid``."""

    uuid: _LooseIdentifier
    model: Model
    allocated: bool
    healthy: bool
    utilisation_pct: Annotated[int, Meta(ge=0, le=100)]
    memory_used_mib: NonNegInt
    memory_total_mib: NonNegInt
    power_mw: NonNegInt
    energy_mj: NonNegInt
    xid_errors: NonNegInt
    ecc_errors: NonNegInt
    xids: Annotated[list[NonNegInt], Meta(max_length=limits.MAX_XIDS)] = []
    ecc_uncorrectable: NonNegInt = 0
    retired_pages: NonNegInt = 0
    present: bool = True
    allocation: Allocation = "unknown"
    clock_events: NonNegInt = 0
    remapped_correctable: NonNegInt = 0


class _LooseUsageEvent(
    Struct, frozen=True, forbid_unknown_fields=True, tag="usage", tag_field="type", gc=False
):
    """``proto.records.UsageEvent`` without the patterns of its identifiers and ``prev``."""

    placement_id: _LooseIdentifier
    node_id: _LooseIdentifier
    seq: NonNegInt
    prev: str
    start_ms: TimeMs
    end_ms: TimeMs
    samples: Annotated[list[_LooseGpuSample], Meta(max_length=limits.MAX_SAMPLES)]


_LOOSE_USAGE_DECODER: Final = msgspec.json.Decoder(_LooseUsageEvent)
# The patterns of proto.records' Identifier and Hash (``^...$(?!\n)``: the whole string).
_IDENTIFIER: Final = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
_HASH: Final = r"[0-9a-f]{64}"
_IS_IDENTIFIER: Final = re.compile(_IDENTIFIER).fullmatch
# A usage event's placement_id, node_id and prev as three lines, in one call: neither
# pattern admits a newline, so a field holding one makes a fourth line and fails.
_ARE_USAGE_HEAD: Final = re.compile(rf"{_IDENTIFIER}\n{_IDENTIFIER}\n{_HASH}").fullmatch


def _decode_usage_fast(body: bytes) -> UsageEvent | None:
    """The UsageEvent of a canonical usage body that the strict decoder accepts; None
    when this path cannot say (the caller then decodes strictly)."""
    try:
        loose = _LOOSE_USAGE_DECODER.decode(body)
    except Exception:  # whatever it is, the strict decoder names it
        return None
    if _ARE_USAGE_HEAD(f"{loose.placement_id}\n{loose.node_id}\n{loose.prev}") is None:
        return None
    for s in loose.samples:
        if _IS_IDENTIFIER(s.uuid) is None:
            return None
    if _ENCODER.encode(loose) != body:
        return None
    samples: list[GpuSample] = []
    for s in loose.samples:  # a loop, not a comprehension: most events have one sample
        samples.append(
            GpuSample(
                s.uuid,
                s.model,
                s.allocated,
                s.healthy,
                s.utilisation_pct,
                s.memory_used_mib,
                s.memory_total_mib,
                s.power_mw,
                s.energy_mj,
                s.xid_errors,
                s.ecc_errors,
                s.xids,
                s.ecc_uncorrectable,
                s.retired_pages,
                s.present,
                s.allocation,
                s.clock_events,
                s.remapped_correctable,
            )
        )
    return UsageEvent(
        loose.placement_id,
        loose.node_id,
        loose.seq,
        loose.prev,
        loose.start_ms,
        loose.end_ms,
        samples,
    )
