"""Fuzzing every decoder: no crash but the documented rejection, no hang, bounded input.

Decoders and what each may raise (anything else is a bug):

| decoder | may raise |
|---|---|
| proto.envelope.decode_envelope / open_envelope | ProtoError |
| proto.canonical.decode_payload | ProtoError |
| proto.note.parse_note / parse_checkpoint_body | ProtoError |
| proto.trust.load_trust | TrustError |
| proto.terms.load_terms_file (TOML and JSON) | TermsError |
| transport.spool.read_spool | SpoolCorrupt (a SpoolError) |

Inputs: random bytes and text; valid records of every kind, mutated as JSON structures
(keys dropped or added, values replaced by other JSON types, huge integers, floats,
deep nesting), re-encoded in canonical and non-canonical ways; valid bytes with bytes
flipped, inserted, deleted, truncated; random domain prefixes. Accepted inputs must also
be canonical (re-encoding reproduces the bytes exactly).

Budget: ``GRIDLEDGER_FUZZ_EXAMPLES`` examples per property (default 200); a Hypothesis
deadline per example stands for "no hang". Each oversized input (a few MiB) must be
refused by a size limit, quickly.

Bugs these fuzzers found are kept at the end as regression tests with their minimal
input; one not fixed yet is an ``xfail(strict=True)`` tracker naming file:line, and
the random properties tolerate exactly its failure signature (``KNOWN``) until then —
a fix turns the tracker into an XPASS, which fails: the cue to delete both entries.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tomli_w
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from devtools import builders
from proto import limits
from proto.canonical import (
    _decode_usage_fast,
    _LooseGpuSample,
    _LooseUsageEvent,
    canonical_json,
    decode_payload,
    signed_bytes,
)
from proto.cosign import cosign
from proto.envelope import (
    Envelope,
    Signature,
    _LooseEnvelope,
    _LooseSignature,
    decode_envelope,
    decode_envelope_fast,
    encode_envelope,
    open_envelope,
)
from proto.errors import ProtoError
from proto.keys import b64
from proto.note import (
    MAX_NOTE_BYTES,
    checkpoint_body,
    checkpoint_origin,
    parse_checkpoint_body,
    parse_note,
    sign_note,
)
from proto.reasons import Reason
from proto.records import Checkpoint, GpuSample, LedgerRecord, Statement, Totals, UsageEvent
from proto.terms import TermsError, load_terms_file
from proto.trust import TrustError, dump_trust, load_trust
from transport.limits import MAX_RECORD_BYTES
from transport.spool import SpoolCorrupt, SpoolWriter, frame, read_spool, segment_path

FUZZ_EXAMPLES = int(os.environ.get("GRIDLEDGER_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    # "No hang": one example of any decoder runs in well under a second; on a loaded
    # 2-core machine a few hundred milliseconds of jitter must not fail the suite.
    deadline=timedelta(seconds=2),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
OVERSIZE_BYTES = 4 * 1024 * 1024
OVERSIZE_REFUSAL_S = 0.5


# ---- known bugs in others' files (trackers at the end of this file) ------------------------

# Fixed in 309549c (proto): non-ASCII base64 and decimals in notes, lone surrogates,
# terms files not UTF-8 / deeply nested / unbounded. Nothing tolerated at the moment.
KNOWN: dict[str, Callable[[BaseException], bool]] = {}


def known(exc: BaseException) -> str | None:
    """The id of the tracked bug this exception is, or None."""
    for name, matches in KNOWN.items():
        if matches(exc):
            return name
    return None


def expect_only(allowed: tuple[type[BaseException], ...], call: Callable[[], Any]) -> Any:
    """Run ``call``; return its result, or None after an allowed or known exception."""
    try:
        return call()
    except allowed:
        return None
    except Exception as exc:
        name = known(exc)
        if name is None:
            raise
        event(f"known bug: {name}")
        return None


# ---- a corpus of valid inputs ---------------------------------------------------------------

T0_MS = 1_767_225_600_000
MINUTE_MS = 60_000


def _corpus() -> dict[str, bytes]:
    """One valid envelope of every record kind, signed as in production."""
    cast = builders.make_cast("fuzz")
    gpus = [builders.gpu("node-a", 0), builders.gpu("node-a", 1, share_milli=500)]
    terms = builders.make_terms(cast, "p-fuzz", gpus, T0_MS, T0_MS + 3_600_000)
    stream = builders.StreamWriter(cast.node_key("node-a"), "p-fuzz", "node-a")
    usage = stream.event(T0_MS, T0_MS + MINUTE_MS, [builders.sample(g) for g in gpus])
    zero = Totals(*([0] * 13))
    record = LedgerRecord(
        placement_id="p-fuzz",
        index=0,
        prev="0" * 64,
        kind="terms",
        source="a" * 64,
        status="accepted",
        reason="",
        delivered_mgms=0,
        totals=zero,
    )
    statement = Statement(
        placement_id="p-fuzz",
        through_index=0,
        head="b" * 64,
        currency="USD",
        currency_scale=2,
        final=False,
        totals=zero,
    )
    from proto.envelope import seal

    return {
        "terms": builders.signed_terms(cast, terms),
        "usage": usage,
        "reclaim": builders.reclaim(cast, terms, T0_MS + 60_000, T0_MS + 120_000, "r-1"),
        "adjustment": builders.adjustment(cast, "p-fuzz", "a-1", "credit", 5, T0_MS),
        "keybinding": builders.key_binding(
            cast, "p-fuzz", "node-a", cast.node_key("node-a"), T0_MS, T0_MS + 1, T0_MS
        ),
        "closed": builders.closed(cast, "p-fuzz", T0_MS + 3_600_000),
        "record": seal(record, [cast.ledger]),
        "statement": seal(statement, [cast.ledger]),
    }


CORPUS = _corpus()
PAYLOADS = {kind: decode_envelope(raw).payload for kind, raw in CORPUS.items()}
CAST = builders.make_cast("fuzz")


def _note_text() -> str:
    body = checkpoint_body(
        Checkpoint(origin=checkpoint_origin("p-fuzz"), size=7, root=b"\x11" * 32)
    )
    return cosign(
        sign_note(body, "ledger-1", CAST.ledger), "buyer-1", CAST.buyer, 1_700_000_000
    ).text()


NOTE = _note_text()

# ---- strategies -----------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, limits.MAX_SAFE_INTEGER, limits.MAX_SAFE_INTEGER + 1, 2**63, -(2**63)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.binary(max_size=48).map(lambda b: base64.b64encode(b).decode()),
    st.sampled_from(["", "a" * 64, "0" * 64, "usage", "terms", "USD", "accepted", "\u2028"]),
)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=16,
)


def _mutate(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """One random change somewhere inside a JSON value (drawn from ``data``)."""
    here = not isinstance(value, dict | list) or not value or depth > 6
    if here or data.draw(st.integers(0, 3), label="mutate here?") == 0:
        op = data.draw(st.sampled_from(["replace", "wrap", "deep", "dup", "drop", "add"]))
        if op == "replace" or not isinstance(value, dict | list):
            return data.draw(json_values, label="replacement")
        if op == "wrap":
            return [value]
        if op == "deep":
            levels = data.draw(st.integers(1, 900), label="nesting")  # helpers recurse too
            return json.loads("[" * levels + json.dumps(value) + "]" * levels)
        if isinstance(value, list):
            if op == "dup":
                return [*value, *value]
            if op == "drop" and value:
                index = data.draw(st.integers(0, len(value) - 1))
                return value[:index] + value[index + 1 :]
            return [*value, data.draw(json_values)]
        if op == "drop" and value:
            key = data.draw(st.sampled_from(sorted(value)))
            return {k: v for k, v in value.items() if k != key}
        if op == "add":
            key = data.draw(st.one_of(st.text(max_size=12), st.sampled_from(sorted(value))))
            return {**value, key: data.draw(json_values)}
        return value
    if isinstance(value, list):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], _mutate(value[index], data, depth + 1), *value[index + 1 :]]
    key = data.draw(st.sampled_from(sorted(value)))
    return {**value, key: _mutate(value[key], data, depth + 1)}


def _encode_json(value: Any, data: st.DataObject) -> bytes:
    """JSON text of ``value``: canonical-looking or not (spacing, key order, escapes)."""
    style = data.draw(st.sampled_from(["canonical", "spaced", "unsorted", "ascii"]))
    if style == "canonical":
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if style == "spaced":
        return json.dumps(value, sort_keys=True).encode()
    if style == "unsorted":
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@st.composite
def byte_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` with a few bytes flipped, inserted, deleted, or cut off."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "dup"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.sampled_from(b'"\\{}[],:0 \n\x00\xff=+/'))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        elif op == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


kinds = st.sampled_from(sorted(CORPUS))


# ---- envelopes and payloads -------------------------------------------------------------------


def check_envelope(raw: bytes) -> None:
    """The envelope property: ProtoError, or an envelope whose bytes are canonical."""
    opened = expect_only((ProtoError,), lambda: open_envelope(raw))
    if opened is None:
        return
    assert opened.raw == raw
    assert encode_envelope(opened.envelope) == raw
    assert signed_bytes(opened.record) == opened.payload
    event(f"accepted {opened.kind}")


def check_payload(payload: bytes) -> None:
    """The payload property: ProtoError with a reason, or a record whose bytes are canonical."""
    try:
        record = decode_payload(payload)
    except ProtoError as exc:
        assert isinstance(exc.reason, Reason)
        event(f"rejected {exc.reason.value}")
        return
    assert signed_bytes(record) == payload
    event("accepted")


@FUZZ
@given(raw=st.binary(max_size=4096))
def test_random_bytes_as_an_envelope(raw: bytes) -> None:
    check_envelope(raw)


@FUZZ
@given(data=st.data(), kind=kinds)
def test_valid_envelopes_with_bytes_changed(data: st.DataObject, kind: str) -> None:
    check_envelope(data.draw(byte_mutations(CORPUS[kind])))


@FUZZ
@given(data=st.data(), kind=kinds)
def test_envelopes_mutated_as_json(data: st.DataObject, kind: str) -> None:
    structure = json.loads(CORPUS[kind])
    target = data.draw(st.sampled_from(["envelope", "payload"]))
    if target == "payload":
        prefix, _, body = PAYLOADS[kind].partition(b"\n")
        mutated_body = _encode_json(_mutate(json.loads(body), data), data)
        structure["payload"] = b64(prefix + b"\n" + mutated_body)
    else:
        structure = _mutate(structure, data)
    check_envelope(_encode_json(structure, data))


@FUZZ
@given(payload=st.binary(max_size=4096))
def test_random_bytes_as_a_payload(payload: bytes) -> None:
    check_payload(payload)


@FUZZ
@given(data=st.data(), kind=kinds)
def test_payloads_mutated_as_json(data: st.DataObject, kind: str) -> None:
    prefix, _, body = PAYLOADS[kind].partition(b"\n")
    mutated = _mutate(json.loads(body), data)
    check_payload(prefix + b"\n" + _encode_json(mutated, data))


@FUZZ
@given(
    data=st.data(),
    kind=kinds,
    prefix=st.one_of(
        st.binary(max_size=40),
        st.from_regex(rb"\Agridledger/[a-z]{0,12}/v[0-9]{1,2}\Z"),
        st.sampled_from([b"gridledger/usage/v1", b"gridledger/terms/v2", b"GRIDLEDGER/usage/v1"]),
    ),
    separator=st.sampled_from([b"\n", b"\r\n", b"", b" \n", b"\n\n"]),
)
def test_payloads_with_other_prefixes(
    data: st.DataObject, kind: str, prefix: bytes, separator: bytes
) -> None:
    _, _, body = PAYLOADS[kind].partition(b"\n")
    if data.draw(st.booleans()):
        body = data.draw(byte_mutations(body))
    check_payload(prefix + separator + body)


def test_every_corpus_envelope_is_accepted() -> None:
    """The mutation tests start from inputs that do decode (else they fuzz only rejections)."""
    for kind, raw in CORPUS.items():
        opened = open_envelope(raw)
        assert opened.kind == kind
        assert encode_envelope(opened.envelope) == raw


# ---- the fast paths agree with the strict decoders (issue 15) ---------------------------------
#
# ``proto.canonical._decode_usage_fast`` and ``proto.envelope.decode_envelope_fast`` decode
# without msgspec's pattern checks and check the patterned fields by hand; on anything
# they do not accept the strict decoder runs as before. Property: they accept exactly what
# the strict decoder accepts (and is canonical), and build equal Structs of the same types.

USAGE_PREFIX, _, USAGE_BODY = PAYLOADS["usage"].partition(b"\n")
_STRICT_USAGE = msgspec.json.Decoder(UsageEvent)

# Strings for the patterned fields: valid identifiers, hashes and key ids, and near misses
# of them (one character changed, added or dropped, a newline or space at either end;
# upper-case hex, non-ASCII digits and letters, a leading dash), or anything at all.
TRICKY_CHARS = "0aA9fFgG._:-/\n\r\t \x00\u0660\u00aa\uff41\u2028\U0001f600"
valid_texts = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,24}\Z"),
    st.from_regex(r"\A[0-9a-f]{64}\Z"),
    st.from_regex(r"\A[0-9a-f]{16}\Z"),
    st.sampled_from(["a" * 128, "a" * 129]),
)


@st.composite
def near_misses(draw: st.DrawFn) -> str:
    text = draw(valid_texts)
    op = draw(st.sampled_from(["same", "set", "insert", "delete", "affix"]))
    at = draw(st.integers(0, max(0, len(text) - 1)))
    char = draw(st.sampled_from(TRICKY_CHARS))
    if op == "set" and text:
        return text[:at] + char + text[at + 1 :]
    if op == "insert":
        return text[:at] + char + text[at:]
    if op == "delete":
        return text[:at] + text[at + 1 :]
    if op == "affix":
        return char + text if draw(st.booleans()) else text + char
    return text


pattern_texts = st.one_of(near_misses(), st.text(max_size=20), st.sampled_from(["", "\n"]))


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def strict_usage(body: bytes) -> UsageEvent | None:
    """The usage event the strict decoder accepts from ``body`` when it is canonical."""
    try:
        event = _STRICT_USAGE.decode(body)
    except Exception:
        return None
    return event if canonical_json(event) == body else None


def usage_paths_agree(body: bytes) -> bool:
    """Assert both paths give the same answer on ``body``; whether they accepted it."""
    fast = _decode_usage_fast(body)
    strict = strict_usage(body)
    assert fast == strict
    if strict is None:
        return False
    assert type(fast) is UsageEvent
    assert fast is not None and all(type(s) is GpuSample for s in fast.samples)
    assert decode_payload(USAGE_PREFIX + b"\n" + body) == strict
    return True


def check_usage_paths_agree(body: bytes) -> None:
    event("accepted" if usage_paths_agree(body) else "rejected")


@FUZZ
@given(data=st.data())
def test_usage_fast_path_agrees_on_patterned_fields(data: st.DataObject) -> None:
    structure = json.loads(USAGE_BODY)
    for name in data.draw(st.sets(st.sampled_from(["placement_id", "node_id", "prev", "uuid"]))):
        if name == "uuid":
            sample = data.draw(st.integers(0, len(structure["samples"]) - 1))
            structure["samples"][sample]["uuid"] = data.draw(pattern_texts)
        else:
            structure[name] = data.draw(pattern_texts)
    check_usage_paths_agree(_canonical(structure))


@FUZZ
@given(data=st.data())
def test_usage_fast_path_agrees_on_mutated_bodies(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        body = data.draw(byte_mutations(USAGE_BODY))
    else:
        body = _encode_json(_mutate(json.loads(USAGE_BODY), data), data)
    check_usage_paths_agree(body)


# Every ASCII character and a few others, at the start, middle and end of each patterned
# field (replacing a character or added), and each field cut short: deterministic,
# so each character class of the patterns is tried whatever the random draws do.
EDIT_CHARS = [chr(c) for c in range(128)] + list("\u0660\u00aa\u00e9\uff41\u2028\U0001f600")


def _edits(text: str) -> list[str]:
    out = [text[:-1], text[1:], "", text + text]
    for char in EDIT_CHARS:
        for at in (0, len(text) // 2, len(text) - 1):
            out.append(text[:at] + char + text[at + 1 :])
        out += [char + text, text + char]
    return out


@pytest.mark.parametrize("field", ["placement_id", "node_id", "prev", "uuid"])
def test_usage_fast_path_agrees_on_every_character(field: str) -> None:
    original = json.loads(USAGE_BODY)
    current = original["samples"][0]["uuid"] if field == "uuid" else original[field]
    accepted = 0
    for text in _edits(current):
        structure = json.loads(USAGE_BODY)
        if field == "uuid":
            structure["samples"][0]["uuid"] = text
        else:
            structure[field] = text
        accepted += usage_paths_agree(_canonical(structure))
    assert accepted > 20  # both paths accepted many edits, not only refused them


def test_envelope_fast_path_agrees_on_every_keyid_character() -> None:
    accepted = 0
    for text in _edits(json.loads(CORPUS["usage"])["signatures"][0]["keyid"]):
        structure = json.loads(CORPUS["usage"])
        structure["signatures"][0]["keyid"] = text
        raw = _canonical(structure)
        assert decode_envelope_fast(raw) == strict_envelope(raw)
        accepted += strict_envelope(raw) is not None
    assert accepted > 20


def strict_envelope(raw: bytes) -> Envelope | None:
    """The envelope the strict decoder accepts from ``raw`` with at most one signature,
    when it is canonical (what ``decode_envelope_fast`` answers for)."""
    try:
        envelope = msgspec.json.decode(raw, type=Envelope)
    except Exception:
        return None
    if len(envelope.signatures) > 1 or canonical_json(envelope) != raw:
        return None
    return envelope


@FUZZ
@given(data=st.data(), kind=kinds)
def test_envelope_fast_path_agrees_with_the_strict_decoder(data: st.DataObject, kind: str) -> None:
    how = data.draw(st.sampled_from(["keyid", "bytes", "json"]))
    if how == "bytes":
        raw = data.draw(byte_mutations(CORPUS[kind]))
    else:
        structure = json.loads(CORPUS[kind])
        if how == "keyid" and structure["signatures"]:
            structure["signatures"][0]["keyid"] = data.draw(pattern_texts)
            raw = _canonical(structure)
        else:
            raw = _encode_json(_mutate(structure, data), data)
    fast = decode_envelope_fast(raw)
    strict = strict_envelope(raw)
    assert fast == strict
    if strict is not None:
        assert fast is not None and type(fast) is Envelope
        assert all(type(s) is Signature for s in fast.signatures)
        assert decode_envelope(raw) == strict
    event("accepted" if strict is not None else "rejected")


def _schema_without_patterns(struct_type: type) -> Any:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("pattern", "description")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = json.dumps(msgspec.json.schema(struct_type), sort_keys=True)
    return strip(json.loads(text.replace('"_Loose', '"').replace("/_Loose", "/")))


@pytest.mark.parametrize(
    ("loose", "strict"),
    [
        (_LooseUsageEvent, UsageEvent),
        (_LooseGpuSample, GpuSample),
        (_LooseEnvelope, Envelope),
        (_LooseSignature, Signature),
    ],
)
def test_the_loose_shapes_are_the_strict_ones_without_patterns(loose: type, strict: type) -> None:
    """Same fields, defaults, bounds and wire config: only the patterns differ."""
    assert _schema_without_patterns(loose) == _schema_without_patterns(strict)
    assert _schema_without_patterns(loose) != json.loads(
        json.dumps(msgspec.json.schema(strict)).replace('"_Loose', '"')
    )  # the strict one has patterns
    assert [(f.name, f.encode_name, f.default) for f in msgspec.structs.fields(loose)] == [
        (f.name, f.encode_name, f.default) for f in msgspec.structs.fields(strict)
    ]
    config, strict_config = loose.__struct_config__, strict.__struct_config__  # type: ignore[attr-defined]
    for name in ("forbid_unknown_fields", "omit_defaults", "tag", "tag_field", "array_like"):
        assert getattr(config, name) == getattr(strict_config, name)


# ---- notes and checkpoints --------------------------------------------------------------------


def check_note(text: str) -> None:
    """The note property: ProtoError, or a note that prints back to the same text."""
    note = expect_only((ProtoError,), lambda: parse_note(text))
    if note is None:
        return
    # One text per note: a second spelling would be a second text under one signature.
    assert note.text() == text, f"{text!r} prints back as {note.text()!r}"
    body = expect_only((ProtoError,), lambda: parse_checkpoint_body(note.body))
    if body is not None:
        check_checkpoint_roundtrip(note.body, body)


def check_checkpoint_roundtrip(text: str, checkpoint: Checkpoint) -> None:
    """An accepted checkpoint body is the one canonical text of its checkpoint."""
    assert checkpoint_body(checkpoint) == text, f"{text!r} is not the canonical spelling"


@FUZZ
@given(text=st.text(max_size=600))
def test_random_text_as_a_note(text: str) -> None:
    check_note(text)


@FUZZ
@given(text=st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=200))
def test_random_text_with_surrogates_as_a_note(text: str) -> None:
    check_note(text)


@FUZZ
@given(data=st.data())
def test_valid_notes_with_lines_changed(data: st.DataObject) -> None:
    lines = NOTE.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["replace", "drop", "dup", "edit"]))
        at = data.draw(st.integers(0, len(lines) - 1))
        if op == "replace":
            lines[at] = data.draw(st.text(max_size=80))
        elif op == "drop":
            del lines[at]
        elif op == "dup":
            lines.insert(at, lines[at])
        else:
            raw = lines[at].encode()
            mutated = data.draw(byte_mutations(raw)) if raw else b"x"
            lines[at] = mutated.decode("utf-8", "replace")
        if not lines:
            lines = [""]
    check_note("\n".join(lines))


digits_text = st.text(st.sampled_from("0123456789٠١٢٣²³¹₀０１-+ _x"), min_size=0, max_size=20)


@FUZZ
@given(
    origin=st.text(max_size=60),
    size=st.one_of(digits_text, st.integers(0, 2**64).map(str)),
    root=st.one_of(
        st.binary(min_size=30, max_size=34).map(lambda b: base64.b64encode(b).decode()),
        st.text(max_size=48),
    ),
    tail=st.sampled_from(["\n", "", "\n\n", "\nextra\n"]),
)
def test_checkpoint_bodies(origin: str, size: str, root: str, tail: str) -> None:
    text = f"{origin}\n{size}\n{root}{tail}"
    checkpoint = expect_only((ProtoError,), lambda: parse_checkpoint_body(text))
    if checkpoint is not None:
        assert 0 <= checkpoint.size <= limits.MAX_SAFE_INTEGER
        assert len(checkpoint.root) == 32
        check_checkpoint_roundtrip(text, checkpoint)


# ---- trust files -----------------------------------------------------------------------------

TRUST = dump_trust(CAST.trust())


@FUZZ
@given(data=st.data())
def test_trust_files(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    how = data.draw(st.sampled_from(["random", "bytes", "json"]))
    if how == "random":
        raw = data.draw(st.binary(max_size=2048))
    elif how == "bytes":
        raw = data.draw(byte_mutations(TRUST))
    else:
        raw = _encode_json(_mutate(json.loads(TRUST), data), data)
    path = tmp_path_factory.mktemp("trust") / "trust.json"
    path.write_bytes(raw)
    trust = expect_only((TrustError,), lambda: load_trust(path))
    if trust is not None:
        assert all(len(k.key) == 32 for k in trust.keys)
        event("accepted")


# ---- terms files ------------------------------------------------------------------------------


def _terms_toml_mapping() -> dict[str, Any]:
    opened = open_envelope(CORPUS["terms"])
    mapping: dict[str, Any] = msgspec.to_builtins(opened.record)
    return mapping


TERMS_MAPPING = _terms_toml_mapping()


def _toml_safe(value: Any) -> Any:
    """TOML has no null and 64-bit integers only: the nearest TOML-encodable value."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(-(2**63), min(2**63 - 1, value))
    if isinstance(value, list):
        return [_toml_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _toml_safe(v) for k, v in value.items()}
    return value


def check_terms(path: Path) -> None:
    """The terms property: TermsError, or terms that pass their own canonical encoding."""
    loaded = expect_only((TermsError,), lambda: load_terms_file(path))
    if loaded is None:
        return
    terms, envelope = loaded
    assert decode_payload(signed_bytes(terms)) == terms
    event("accepted " + ("envelope" if envelope is not None else "toml"))


@FUZZ
@given(data=st.data())
def test_terms_files_toml(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    how = data.draw(st.sampled_from(["random", "text", "mutated", "bytes"]))
    directory = tmp_path_factory.mktemp("terms")
    if how == "random":
        raw = data.draw(st.binary(max_size=2048))
    elif how == "text":
        raw = data.draw(st.text(max_size=1000)).encode("utf-8", "surrogatepass")
    else:
        mutated = _toml_safe(_mutate(TERMS_MAPPING, data))
        if not isinstance(mutated, dict):
            mutated = {"terms": mutated}
        try:
            raw = tomli_w.dumps(mutated).encode()
        except (TypeError, ValueError, RecursionError):  # what TOML cannot say
            raw = tomli_w.dumps(_toml_safe(TERMS_MAPPING)).encode()
        if how == "bytes":
            raw = data.draw(byte_mutations(raw))
    path = directory / "terms.toml"
    path.write_bytes(raw)
    check_terms(path)


@FUZZ
@given(data=st.data())
def test_terms_files_json(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    how = data.draw(st.sampled_from(["bytes", "json", "other kind"]))
    if how == "bytes":
        raw = data.draw(byte_mutations(CORPUS["terms"]))
    elif how == "json":
        raw = _encode_json(_mutate(json.loads(CORPUS["terms"]), data), data)
    else:
        raw = CORPUS[data.draw(kinds)]
    if not raw.lstrip().startswith(b"{"):
        raw = b"{" + raw
    path = tmp_path_factory.mktemp("terms") / "terms.json"
    path.write_bytes(raw + data.draw(st.sampled_from([b"", b"\n", b"\n\n", b" "])))
    check_terms(path)


# ---- the spool --------------------------------------------------------------------------------

SPOOL_RECORDS = [CORPUS[k] for k in sorted(CORPUS)] * 2


def _is_subsequence(got: list[bytes], written: list[bytes]) -> bool:
    remaining = iter(written)
    return all(any(g == w for w in remaining) for g in got)


def check_spool(directory: Path, written: list[bytes]) -> None:
    """Read the whole spool: records that were written, in order, then a stop or SpoolCorrupt.

    Not necessarily a prefix: a sealed segment cut exactly at a frame boundary (or
    emptied) reads as a shorter sealed segment, and the reader goes on with the next one.
    The format has no per-segment length or sequence that could tell (reported; the
    signed event chains downstream do catch the gap as SEQ_GAP).
    """
    got: list[bytes] = []
    try:
        for entry in read_spool(directory):
            got.append(entry.data)
            assert len(got) <= len(written), "more records than were ever written"
    except SpoolCorrupt as exc:
        assert exc.path.parent == directory
        event("SpoolCorrupt")
    assert _is_subsequence(got, written), "a record never written, or out of order, was read"
    if got != written[: len(got)]:
        event("records skipped silently (sealed segment cut at a frame boundary)")
    event(f"read {len(got)}/{len(written)}")


@FUZZ
@given(
    segments=st.lists(st.binary(max_size=1024), min_size=1, max_size=3),
    numbers=st.lists(st.integers(0, 2**40), min_size=3, max_size=3, unique=True),
)
def test_random_segment_files(
    segments: list[bytes], numbers: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    for number, content in zip(sorted(numbers), segments, strict=False):
        segment_path(directory, number).write_bytes(content)
    check_spool(directory, [])


@FUZZ
@given(data=st.data(), segment_max=st.sampled_from([4096, 8192, 1 << 20]))
def test_written_spools_with_bytes_changed(
    data: st.DataObject, segment_max: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    count = data.draw(st.integers(1, len(SPOOL_RECORDS)))
    written = SPOOL_RECORDS[:count]
    with SpoolWriter(directory, segment_max_bytes=segment_max, max_bytes=1 << 24) as writer:
        for record in written:
            writer.append([record])
    files = sorted(directory.glob("*.seg"))
    target = data.draw(st.sampled_from(files))
    original = target.read_bytes()
    how = data.draw(st.sampled_from(["bytes", "append", "header"]))
    if how == "bytes":
        target.write_bytes(data.draw(byte_mutations(original)))
    elif how == "append":
        target.write_bytes(original + data.draw(st.binary(min_size=1, max_size=64)))
    else:  # a header claiming a frame length at or beyond the limit
        length = data.draw(st.sampled_from([MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1, 2**32 - 1]))
        target.write_bytes(original + bytes([0xA7]) + length.to_bytes(4, "big") + b"\0" * 4)
    check_spool(directory, written)


# ---- size limits: refused quickly ----------------------------------------------------------


def _timed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.perf_counter()
    try:
        call()
    except Exception as exc:
        return time.perf_counter() - started, exc
    return time.perf_counter() - started, None


BIG = b'{"payload":"' + b"A" * OVERSIZE_BYTES + b'","signatures":[]}'


@pytest.mark.parametrize(
    ("name", "call", "reason"),
    [
        ("decode_envelope", lambda: decode_envelope(BIG), Reason.OVERSIZE),
        ("open_envelope", lambda: open_envelope(BIG), Reason.OVERSIZE),
        (
            "decode_payload",
            lambda: decode_payload(b"gridledger/usage/v1\n" + b" " * OVERSIZE_BYTES),
            Reason.OVERSIZE,
        ),
        ("parse_note", lambda: parse_note("x\n" * (OVERSIZE_BYTES // 2)), Reason.OVERSIZE),
        (
            # The largest payload that fits an envelope: refused inside it, not decoded.
            "payload in envelope",
            lambda: open_envelope(
                b'{"payload":"'
                + base64.b64encode(b"gridledger/usage/v1\n" + b"x" * limits.MAX_PAYLOAD_BYTES)
                + b'","signatures":[]}'
            ),
            Reason.OVERSIZE,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_oversized_inputs_are_refused_by_a_limit_quickly(
    name: str, call: Callable[[], Any], reason: Reason
) -> None:
    elapsed, error = _timed(call)
    assert isinstance(error, ProtoError), f"{name}: {error!r}"
    assert error.reason is reason
    assert elapsed < OVERSIZE_REFUSAL_S, f"{name} took {elapsed:.3f} s"


def test_a_note_at_the_limit_is_parsed_and_one_byte_more_is_refused() -> None:
    signatures = NOTE[NOTE.index("\n\n") + 2 :]
    body_bytes = MAX_NOTE_BYTES - len(signatures.encode()) - 1
    body = "a" * (body_bytes - 1) + "\n"
    assert len((body + "\n" + signatures).encode()) == MAX_NOTE_BYTES
    assert parse_note(body + "\n" + signatures).body == body
    with pytest.raises(ProtoError) as caught:
        parse_note("a" + body + "\n" + signatures)
    assert caught.value.reason is Reason.OVERSIZE


def test_a_spool_frame_claiming_more_than_the_limit_is_not_allocated(tmp_path: Path) -> None:
    good = frame(CORPUS["usage"])
    huge_header = bytes([0xA7]) + (2**32 - 1).to_bytes(4, "big") + b"\0" * 4
    segment_path(tmp_path, 0).write_bytes(good + huge_header + good)
    elapsed, error = _timed(lambda: list(read_spool(tmp_path)))
    # A bad length followed by bytes that are not findable as a frame: torn-tail rules.
    assert error is None or isinstance(error, SpoolCorrupt)
    assert elapsed < OVERSIZE_REFUSAL_S


def _multi_mib(path: Path, what: str) -> tuple[Callable[[], Any], type[Exception]]:
    if what == "trust":
        junk = b"1," * (OVERSIZE_BYTES // 2)
        path.write_bytes(b'{"format":"gridledger-trust/v1","keys":[' + junk + b"1]}")
        return (lambda: load_trust(path)), TrustError
    if what == "terms-json":
        path.write_bytes(BIG)
        return (lambda: load_terms_file(path)), TermsError
    path.write_bytes(b"a = [" + b"1," * (OVERSIZE_BYTES // 2) + b"]\nb = ")
    return (lambda: load_terms_file(path)), TermsError


@pytest.mark.parametrize("what", ["trust", "terms-json"])
def test_multi_mib_files_are_refused_quickly(tmp_path: Path, what: str) -> None:
    """Files without a stated size limit of their own still fail fast on a few MiB of junk."""
    call, allowed = _multi_mib(tmp_path / what, what)
    elapsed, error = _timed(call)
    assert isinstance(error, allowed), repr(error)
    assert elapsed < OVERSIZE_REFUSAL_S, f"{what}: {elapsed:.2f} s"


# ---- regressions: bugs the fuzzers found (fixed unless marked xfail) ---------------------


def test_regression_note_signature_with_non_ascii_base64() -> None:
    with pytest.raises(ProtoError):
        parse_note("a\n\n\u2014 ledger-1 \u00e9\n")


def test_regression_checkpoint_root_with_non_ascii() -> None:
    with pytest.raises(ProtoError):
        parse_checkpoint_body("o\n1\n\u00e9\n")


def test_regression_checkpoint_size_superscript_digit() -> None:
    with pytest.raises(ProtoError):
        parse_checkpoint_body("o\n\u00b2\n" + "A" * 43 + "=\n")


def test_regression_note_and_checkpoint_texts_are_canonical() -> None:
    root = "A" * 42 + "B="  # non-zero padding bits: decodes like "A" * 43 + "="
    for text in ("o\n\u0661\n" + "A" * 43 + "=\n", f"o\n1\n{root}\n"):
        with pytest.raises(ProtoError):
            parse_checkpoint_body(text)
    line = next(x for x in NOTE.splitlines() if x.startswith("\u2014 ledger-1 "))
    blob = line.rsplit(" ", 1)[1]  # 68 bytes: base64 ends in "=", 2 padding bits
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".index(blob[-2])
    altered = (
        blob[:-2]
        + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[last | 1]
        + "="
    )
    assert altered != blob
    with pytest.raises(ProtoError):
        parse_note(NOTE.replace(blob, altered))


def test_regression_note_with_a_lone_surrogate() -> None:
    with pytest.raises(ProtoError):
        parse_note("a\ud800\n\n\u2014 n AAAA\n")


def test_regression_terms_toml_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "terms.toml"
    path.write_bytes(b"a = \xff\n")
    with pytest.raises(TermsError):
        load_terms_file(path)


def test_regression_terms_toml_deeply_nested(tmp_path: Path) -> None:
    path = tmp_path / "terms.toml"
    path.write_bytes(b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n")
    with pytest.raises(TermsError):
        load_terms_file(path)


def test_regression_spool_damaged_length_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    records = [CORPUS["usage"], CORPUS["adjustment"], CORPUS["closed"]]
    with SpoolWriter(tmp_path) as writer:
        writer.append(records)
    path = segment_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[1] ^= 0x80  # high bit of frame 0's length: now far beyond MAX_RECORD_BYTES
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt):
        list(read_spool(tmp_path))
    with pytest.raises(SpoolCorrupt):
        SpoolWriter(tmp_path).close()


def test_regression_terms_toml_has_a_size_limit(tmp_path: Path) -> None:
    call, allowed = _multi_mib(tmp_path / "terms.toml", "terms-toml")
    elapsed, error = _timed(call)
    assert isinstance(error, allowed), repr(error)
    assert elapsed < OVERSIZE_REFUSAL_S, f"{elapsed:.2f} s"


def test_canonical_json_of_builtins_is_what_the_mutators_call_canonical() -> None:
    """The 'canonical' encoding style above matches proto's encoder on real records."""
    for payload in PAYLOADS.values():
        _, _, body = payload.partition(b"\n")
        value = json.loads(body)
        ours = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert ours.encode() == body == canonical_json(value)


def test_regression_terms_key_with_non_ascii_text_is_a_terms_error() -> None:
    # Found by test_terms_files_toml: base64 of non-ASCII text raised ValueError, not a
    # TermsError naming the field.
    from proto.terms import TermsError, _resolve_key

    with pytest.raises(TermsError, match=r"buyer\.key: key is neither base64"):
        _resolve_key("\x80abc", "buyer.key", Path("."))
