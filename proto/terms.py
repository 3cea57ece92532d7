"""Placement terms as parties handle them (SPEC.md, "Terms"): TOML in, rules, signatures.

Each party signs the same canonical bytes on its own machine; a signed terms file is an
envelope (JSON) that collects the signatures. ``validate_terms`` states every
cross-field rule; the ledger rejects terms that break one (TERMS_INVALID).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from proto import limits
from proto.canonical import signed_bytes
from proto.envelope import (
    Envelope,
    Opened,
    SignatureReport,
    check_signatures,
    open_envelope,
)
from proto.errors import ProtoError
from proto.files import read_at_most
from proto.keys import key_id, load_public_key
from proto.records import ZERO_HASH, PlacementTerms

# ISO 4217 minor units of the currencies the ledger knows. A terms' currency_scale must be
# at least the ISO minor units (no rounding of real money) and at most 9.
CURRENCY_MINOR_UNITS: Final[Mapping[str, int]] = {
    "USD": 2,
    "EUR": 2,
    "GBP": 2,
    "CHF": 2,
    "CAD": 2,
    "AUD": 2,
    "SGD": 2,
    "CNY": 2,
    "INR": 2,
    "JPY": 0,
    "KRW": 0,
    "BHD": 3,
    "KWD": 3,
}
MAX_CURRENCY_SCALE: Final = 9
# A terms file (TOML or signed JSON) is read whole; anything larger is refused unread.
MAX_TERMS_FILE_BYTES: Final = limits.MAX_ENVELOPE_BYTES
ROLES: Final = ("operator", "buyer", "desk")


class TermsError(Exception):
    """Terms that cannot be used; ``problems`` lists every rule broken, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def total_share_milli(terms: PlacementTerms) -> int:
    """S: the sum of the shares of the placement's GPUs, in thousandths of a GPU."""
    return sum(g.share_milli for g in terms.gpus)


def validate_terms(terms: PlacementTerms) -> list[str]:
    """Every cross-field rule of SPEC.md "Terms" that ``terms`` breaks (empty: valid)."""
    problems: list[str] = []
    window = terms.window_end_ms - terms.window_start_ms
    if window <= 0:
        problems.append(
            f"window_end_ms {terms.window_end_ms} is not after window_start_ms "
            f"{terms.window_start_ms}"
        )
    elif window > limits.MAX_WINDOW_MS:
        problems.append(f"window of {window} ms exceeds the limit {limits.MAX_WINDOW_MS} ms")
    if window > 0 and window < terms.minimum_duration_ms:
        problems.append(
            f"window of {window} ms is shorter than minimum_duration_ms {terms.minimum_duration_ms}"
        )
    if window > 0 and terms.increment_ms > window:
        problems.append(f"increment_ms {terms.increment_ms} exceeds the window of {window} ms")
    iso = CURRENCY_MINOR_UNITS.get(terms.currency)
    if iso is None:
        problems.append(f"unknown currency {terms.currency!r}")
    elif not iso <= terms.currency_scale <= MAX_CURRENCY_SCALE:
        problems.append(
            f"currency_scale {terms.currency_scale} for {terms.currency} is outside "
            f"{iso}..{MAX_CURRENCY_SCALE} (ISO 4217 minor units {iso})"
        )
    node_ids = [n.node_id for n in terms.nodes]
    if len(set(node_ids)) != len(node_ids):
        problems.append("a node_id is listed twice in nodes")
    uuids = [g.uuid for g in terms.gpus]
    if len(set(uuids)) != len(uuids):
        problems.append("a GPU uuid is listed twice in gpus")
    known_nodes = set(node_ids)
    for gpu in terms.gpus:
        if gpu.node_id not in known_nodes:
            problems.append(f"GPU {gpu.uuid} is on node {gpu.node_id!r}, which is not in nodes")
    parties = [terms.operator, terms.buyer, terms.desk]
    if len({p.id for p in parties}) != 3:
        problems.append("operator, buyer and desk must be three different parties")
    party_keys = [p.key for p in parties] + [terms.ledger_key]
    if len(set(party_keys)) != 4:
        problems.append("operator, buyer, desk and ledger must each have their own key")
    if set(party_keys) & {n.key for n in terms.nodes}:
        problems.append("a node key is also a party's key")
    share = total_share_milli(terms)
    # Bounds that keep every stored value within 2^53 (SPEC "Bounds").
    reach = share * (window + terms.reclaim_notice_ms) + terms.increment_ms * 1000
    if window > 0 and reach > limits.MAX_SAFE_INTEGER:
        problems.append(
            f"S * (window + reclaim_notice) + increment * 1000 = {reach} exceeds 2^53 - 1"
        )
    # §5 rule 7: the amendment link.
    if (terms.version == 1) != (terms.supersedes == ZERO_HASH):
        problems.append("version 1 exactly when supersedes is ZERO_HASH")
    return problems


def require_valid_terms(terms: PlacementTerms) -> None:
    """Raise TermsError listing every broken rule."""
    problems = validate_terms(terms)
    if problems:
        raise TermsError(problems)


def party_keys(terms: PlacementTerms) -> dict[str, bytes]:
    """Key id -> public key of the three parties who must sign the terms."""
    return {key_id(p.key): p.key for p in (terms.operator, terms.buyer, terms.desk)}


def role_of_key(terms: PlacementTerms, keyid: str) -> str | None:
    """Which party of the terms holds key ``keyid`` (None if nobody)."""
    for role in ROLES:
        party = getattr(terms, role)
        if key_id(party.key) == keyid:
            return role
    return None


def check_terms_signatures(envelope: Envelope, terms: PlacementTerms) -> SignatureReport:
    """Who of operator, buyer and desk has signed, who is missing, what is wrong."""
    return check_signatures(envelope, party_keys(terms))


# ---- TOML -------------------------------------------------------------------------------

_TIME_FIELDS: Final = ("window_start_ms", "window_end_ms", "created_at_ms")


def _to_ms(value: Any, field: str) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise TermsError([f"{field}: a datetime needs a UTC offset (e.g. ...Z)"])
        return int(value.timestamp() * 1000)
    return value


def _resolve_key(value: Any, where: str, base: Path) -> Any:
    """A key is base64 text, or ``file:NAME.pub`` relative to the TOML file."""
    if isinstance(value, str) and value.startswith("file:"):
        try:
            return load_public_key(base / value[5:]).key
        except Exception as exc:
            raise TermsError([f"{where}: {exc}"]) from exc
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII text
            raise TermsError([f"{where}: key is neither base64 nor file:PATH"]) from exc
        return raw
    return value


def terms_from_mapping(data: Mapping[str, Any], base: Path = Path(".")) -> PlacementTerms:
    """Build terms from TOML data (times as integers or datetimes, keys as base64/file:)."""
    obj = dict(data)
    obj.pop("type", None)
    for field in _TIME_FIELDS:
        if field in obj:
            obj[field] = _to_ms(obj[field], field)
    for role in (*ROLES,):
        if isinstance(obj.get(role), Mapping):
            party = dict(obj[role])
            party["key"] = _resolve_key(party.get("key"), f"{role}.key", base)
            obj[role] = party
    if "ledger_key" in obj:
        obj["ledger_key"] = _resolve_key(obj["ledger_key"], "ledger_key", base)
    for list_name in ("nodes",):
        items = obj.get(list_name)
        if isinstance(items, list):
            obj[list_name] = [
                {**n, "key": _resolve_key(n.get("key"), f"nodes[{i}].key", base)}
                if isinstance(n, Mapping)
                else n
                for i, n in enumerate(items)
            ]
    try:
        terms = msgspec.convert(obj, PlacementTerms)
    except msgspec.ValidationError as exc:
        raise TermsError([f"terms: {exc}"]) from exc
    # Round trip through the canonical decoder: it is what every party will verify.
    signed_bytes(terms)
    return terms


def _terms_from_toml_bytes(raw: bytes, path: Path) -> PlacementTerms:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TermsError([f"{path} is not UTF-8 text (byte {exc.start})"]) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TermsError([f"{path} is not valid TOML: {exc}"]) from exc
    except RecursionError as exc:
        raise TermsError([f"{path} nests arrays or tables too deeply"]) from exc
    return terms_from_mapping(data, path.parent)


def _read_bounded(path: Path) -> bytes:
    """A terms file's bytes, refused past MAX_TERMS_FILE_BYTES before it is parsed."""
    try:
        raw = read_at_most(path, MAX_TERMS_FILE_BYTES)
    except OSError as exc:
        raise TermsError([f"cannot read {path}: {exc.strerror}"]) from exc
    if len(raw) > MAX_TERMS_FILE_BYTES:
        raise TermsError([f"{path} is larger than {MAX_TERMS_FILE_BYTES} bytes"])
    return raw


def load_terms_file(path: Path) -> tuple[PlacementTerms, Envelope | None]:
    """Read TOML terms (unsigned) or a signed terms envelope (JSON)."""
    raw = _read_bounded(path)
    if raw.lstrip().startswith(b"{"):
        try:
            opened: Opened = open_envelope(raw.rstrip(b"\n"))
        except ProtoError as exc:
            raise TermsError([f"{path}: {exc}"]) from exc
        if not isinstance(opened.record, PlacementTerms):
            raise TermsError([f"{path} holds a {opened.kind} record, not terms"])
        return opened.record, opened.envelope
    return _terms_from_toml_bytes(raw, path), None


__all__ = [
    "CURRENCY_MINOR_UNITS",
    "TermsError",
    "check_terms_signatures",
    "load_terms_file",
    "party_keys",
    "require_valid_terms",
    "role_of_key",
    "terms_from_mapping",
    "total_share_milli",
    "validate_terms",
]
