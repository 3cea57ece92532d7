"""Placement terms as parties handle them (SPEC.md, "Terms"): TOML in, rules, signatures.

Each party signs the same canonical bytes on its own machine; a signed terms file is an
envelope (JSON) that collects the signatures. ``validate_terms`` states every
cross-field rule; the ledger rejects terms that break one (TERMS_INVALID).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
import tomllib
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import msgspec

from proto import limits
from proto.canonical import signed_bytes
from proto.durable_io import read_at_most
from proto.envelope import (
    Envelope,
    Opened,
    SignatureReport,
    check_signatures,
    open_envelope,
)
from proto.errors import ProtoError
from proto.keys import key_id, load_public_key
from proto.records import ZERO_HASH, PlacementTerms
from proto.unknown_keys import unknown_key

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


# SPEC §5 (3): the prefixes NVML writes a device's uuid with (upper case in the one spelling).
_UUID_PREFIXES = ("gpu-", "mig-")


def canonical_uuid(uuid: str) -> str:
    """SPEC §5 (3): the one spelling of a GPU uuid: lower case, but for a leading ``GPU-`` or
    ``MIG-`` in upper case (as NVML writes ``GPU-8f2a...``). Two uuids name one device when
    their canonical spellings are equal; terms carry the canonical spelling only."""
    lowered = uuid.lower()
    if lowered.startswith(_UUID_PREFIXES):
        return lowered[:4].upper() + lowered[4:]
    return lowered


def gross_ceiling_minor(terms: PlacementTerms) -> int:
    """SPEC §7.7 M = floor((S × W + U) × rate / 3 600 000 000): the most the gross and the
    release charge together can reach under ``terms``, whatever the usage."""
    window = terms.window_end_ms - terms.window_start_ms
    reach = total_share_milli(terms) * window + terms.increment_ms * 1000
    return reach * terms.rate_per_gpu_hour_minor // limits.MILLI_GPU_MS_PER_GPU_HOUR


def payable_minor(terms: PlacementTerms, net_minor: int) -> int:
    """SPEC §7.7 P(x): what the buyer owes for a net of ``net_minor`` (the fee on top when
    the buyer pays it)."""
    if terms.fee_payer == "buyer":
        return net_minor + net_minor * terms.desk_fee_bps // limits.MAX_BPS
    return net_minor


def adjustment_within_bounds(terms: PlacementTerms, credit_minor: int, charge_minor: int) -> bool:
    """SPEC §6.3 adjustment, §7.7: whether the cumulative sums Ac = ``credit_minor`` and
    Ah = ``charge_minor`` after an adjustment keep every total of every later record
    within 2^53 - 1: ``Ac ≤ 2^53 - 1`` and ``P(M + Ah) ≤ 2^53 - 1``."""
    return (
        credit_minor <= limits.MAX_SAFE_INTEGER
        and payable_minor(terms, gross_ceiling_minor(terms) + charge_minor)
        <= limits.MAX_SAFE_INTEGER
    )


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
    if len({canonical_uuid(u) for u in uuids}) != len(uuids):
        problems.append("a GPU uuid is listed twice in gpus")
    for uuid in uuids:
        if uuid != canonical_uuid(uuid):
            problems.append(
                f"GPU uuid {uuid!r} is not in its canonical spelling {canonical_uuid(uuid)!r} "
                "(SPEC §5 (3): one spelling per device)"
            )
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
    # §5 rule 5, §7.7: the payable ceiling, so usage alone keeps every total in range.
    if window > 0 and reach <= limits.MAX_SAFE_INTEGER:
        ceiling = payable_minor(terms, gross_ceiling_minor(terms))
        if ceiling > limits.MAX_SAFE_INTEGER:
            problems.append(
                f"the payable ceiling P(M) = {ceiling} exceeds 2^53 - 1 (SPEC §7.7: "
                "S x W x rate with the buyer's fee)"
            )
    # §5 rule 7: the amendment link.
    if (terms.version == 1) != (terms.supersedes == ZERO_HASH):
        problems.append("version 1 exactly when supersedes is ZERO_HASH")
    problems += workload_problems(terms)
    problems += residency_problems(terms)
    return problems


def workload_problems(terms: PlacementTerms) -> list[str]:
    """SPEC §5.1 W1-W4: what a machine checks of the workload and delivery terms."""
    problems: list[str] = []
    workload, delivery = terms.workload, terms.delivery
    if workload is not None and workload.isolation == "dedicated":
        for gpu in terms.gpus:
            if gpu.share_milli != limits.MAX_SHARE_MILLI:
                problems.append(
                    f"W1: isolation dedicated needs whole GPUs, but GPU {gpu.uuid} has "
                    f"share_milli {gpu.share_milli}"
                )
    if (
        delivery is not None
        and delivery.on_reclaim in ("checkpoint", "drain")
        and terms.reclaim_notice_ms <= 0
    ):
        problems.append(
            f"W2: on_reclaim {delivery.on_reclaim} needs reclaim_notice_ms > 0 (it is "
            f"{terms.reclaim_notice_ms})"
        )
    if workload is not None and workload.isolation == "mig":
        for gpu in terms.gpus:
            if gpu.share_milli >= limits.MAX_SHARE_MILLI:
                problems.append(
                    f"W3: isolation mig needs GPU slices, but GPU {gpu.uuid} is a whole GPU "
                    "(share_milli 1000; use dedicated or shared)"
                )
    if delivery is not None and len(set(delivery.acceptance)) != len(delivery.acceptance):
        problems.append("W4: delivery.acceptance lists a requirement twice")
    metering = terms.metering
    if metering is not None and len(set(metering.holders)) != len(metering.holders):
        problems.append("M1: metering.holders lists a workload identity twice")
    return problems


def node_inside_residency(terms: PlacementTerms, region: str) -> bool:
    """SPEC §5.2: a node with ``region`` is inside the terms' residency policy."""
    return terms.residency is None or region in terms.residency.allowed_regions


def residency_problems(terms: PlacementTerms) -> list[str]:
    """SPEC §5.2 R1 and R3: GPUs only on nodes inside the policy; no entry listed twice."""
    residency = terms.residency
    if residency is None:
        return []
    problems: list[str] = []
    carrying = {g.node_id for g in terms.gpus}
    for node in terms.nodes:
        if node.node_id in carrying and not node_inside_residency(terms, node.region):
            problems.append(
                f"R1: node {node.node_id} carries GPUs in region {node.region!r}, outside "
                f"the allowed regions {', '.join(residency.allowed_regions)}"
            )
    if len(set(residency.allowed_regions)) != len(residency.allowed_regions):
        problems.append("R3: residency.allowed_regions lists a region twice")
    if len(set(residency.jurisdictions)) != len(residency.jurisdictions):
        problems.append("R3: residency.jurisdictions lists a jurisdiction twice")
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


def terms_signature_problem(envelope: Envelope, terms: PlacementTerms) -> str | None:
    """What is wrong with the terms' signatures, naming each party by role and id (its key
    id in brackets), or None when all three signed validly: the words a person acts on."""
    report = check_terms_signatures(envelope, terms)

    def who(keyid: str) -> str:
        role = role_of_key(terms, keyid)
        if role is None:
            return f"key {keyid}, who is not a party to these terms"
        return f"the {role} ({getattr(terms, role).id}, key {keyid})"

    if report.invalid:
        return f"bad signature by {who(report.invalid[0])}"
    if report.unexpected:
        return f"signed by {who(report.unexpected[0])}"
    if report.missing:
        missing = " and ".join(who(k) for k in report.missing)
        return (
            f"signed by {len(report.valid)} of 3 parties; missing {missing} "
            "(each signs with: gridledger terms sign FILE --key THEIR.key)"
        )
    return None


# ---- TOML ----------------------------------------------------------------------------

_TIME_FIELDS: Final = ("window_start_ms", "window_end_ms", "created_at_ms")
# Milliseconds below this read as seconds: 10^11 ms is 1973, 10^11 s is the year 5138.
MIN_PLAUSIBLE_MS: Final = 100_000_000_000
# Where a problem is: ("desk_fee_bps",), ("gpus", 2, "share_milli"), ("operator", "key").
Where = tuple[str | int, ...]
Locate = Callable[[Where], str]


def _to_ms(value: Any, field: str) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise TermsError([f"{field}: a datetime needs a UTC offset (e.g. ...Z)"])
        return int(value.timestamp() * 1000)
    if isinstance(value, dt.date):
        raise TermsError([f"{field}: a date needs a time and a UTC offset (e.g. ...T00:00:00Z)"])
    return value


def _resolve_key(value: Any, where: str, base: Path) -> Any:
    """A key is base64 text, or ``file:NAME.pub`` relative to the TOML file."""
    if isinstance(value, str) and value.startswith("file:"):
        name = value[5:]
        try:
            return load_public_key(base / name).key
        except Exception as exc:
            raise TermsError([f"{where}: {exc}"]) from exc
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII text
            raise TermsError([f"{where}: key is neither base64 nor file:PATH"]) from exc
        return raw
    return value


def _dotted(where: Where) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _no_location(where: Where) -> str:
    return "terms"


def _in_words(name: str, value: Any, message: str, tp: Any = None) -> str:
    """msgspec's validation message as a person reads it (``tp``: the field's type, for
    the allowed values of an enumeration)."""
    return in_words(name, value, message, allowed=_allowed(tp))


def _allowed(tp: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` field (also inside Optional), else ()."""
    if get_origin(tp) in (Union, UnionType):
        return tuple(v for arg in get_args(tp) for v in _allowed(arg))
    if get_origin(tp) is Literal:
        return tuple(str(v) for v in get_args(tp))
    return ()


def in_words(
    name: str, value: Any, message: str, *, allowed: tuple[str, ...] = (), sep: str = " = "
) -> str:
    """msgspec's validation message for ``name`` (a terms key, or a CLI option with
    ``sep=" "``) as a person reads it; ``allowed``: the values an enumeration takes."""
    shown = repr(value) if not isinstance(value, bytes) else f"{len(value)} bytes"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    got = re.search(r"got `(\w+)`", message)
    expected = re.match(r"Expected `(\w+)`", message)
    kinds = {
        "int": "an integer",
        "str": "a string",
        "bool": "true or false",
        "float": "a number",
        "array": "a list",
        "object": "a table",
        "bytes": "a key",
        "null": "nothing",
    }
    if got and expected:
        want = kinds.get(expected.group(1), expected.group(1))
        return f"{name}{sep}{shown}: must be {want}, not {kinds.get(got.group(1), got.group(1))}"
    bound = re.search(r"Expected `\w+` (<=|>=|<|>) (-?\d+)", message)
    if bound:
        words = {"<=": "at most", ">=": "at least", "<": "below", ">": "above"}[bound.group(1)]
        return f"{name}{sep}{shown}: must be {words} {bound.group(2)}"
    if "matching regex '^[A-Z]{3}$" in message:
        return f"{name}{sep}{shown}: must be a three-letter currency code such as USD"
    if "matching regex '^[0-9a-f]{64}$" in message:
        return f"{name}{sep}{shown}: must be 64 lowercase hex characters"
    if "matching regex" in message:
        return (
            f"{name}{sep}{shown}: must be 1-128 characters of A-Z a-z 0-9 . _ : -, "
            "starting with a letter or digit"
        )
    length = re.search(r"Expected `(\w+)` of length (<=|>=) (\d+)", message)
    if length and length.group(1) == "bytes":
        return f"{name}: must be a 32-byte Ed25519 public key (file:NAME.pub or base64)"
    if length:
        words = "at most" if length.group(2) == "<=" else "at least"
        unit = "characters" if length.group(1) == "str" else "entries"
        return f"{name}: must have {words} {length.group(3)} {unit}"
    enum = re.match(r"Invalid enum value (.*)", message)
    if enum:
        values = f" ({', '.join(allowed)})" if allowed else ""
        return f"{name}{sep}{enum.group(1)}: not one of the allowed values{values}"
    return f"{name}{sep}{shown}: {message}"


def _struct_of(tp: Any) -> tuple[type[msgspec.Struct] | None, bool, Any]:
    """(struct type, is a list of it, the Meta of the list) for nested terms fields."""
    meta = None
    args = get_args(tp)
    if get_origin(tp) in (Union, UnionType) and len(args) == 2 and type(None) in args:
        tp = next(a for a in args if a is not type(None))  # an optional object (§5.1)
    if get_origin(tp) is Annotated:
        tp, *extras = get_args(tp)
        meta = next((m for m in extras if isinstance(m, msgspec.Meta)), None)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp, False, meta
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            return item, True, meta
    return None, False, meta


def _schema_problems(
    obj: Mapping[str, Any], struct: type[msgspec.Struct], where: Where, skip: set[Where]
) -> list[tuple[Where, str]]:
    """Every way ``obj`` misses the schema of ``struct``, field by field, in the user's words."""
    fields = msgspec.structs.fields(struct)
    names = [f.encode_name for f in fields]
    problems: list[tuple[Where, str]] = []
    for key in obj:
        if key not in names:
            table = _dotted(where)
            problems.append(((*where, str(key)), unknown_key(str(key), names, table=table)))
    for f in fields:
        here: Where = (*where, f.encode_name)
        name = _dotted(here)
        if here in skip:
            continue
        if f.encode_name not in obj:
            if f.required:
                problems.append((where, f"missing key {name}"))
            continue
        value = obj[f.encode_name]
        nested, is_list, meta = _struct_of(f.type)
        if nested is not None and not is_list and isinstance(value, Mapping):
            problems += _schema_problems(value, nested, here, skip)
        elif nested is not None and is_list and isinstance(value, list):
            low = getattr(meta, "min_length", None) or 0
            high = getattr(meta, "max_length", None)
            if len(value) < low:
                problems.append((here, f"{name}: at least {low} needed, {len(value)} given"))
            if high is not None and len(value) > high:
                problems.append((here, f"{name}: at most {high} allowed, {len(value)} given"))
            for i, item in enumerate(value[: high or len(value)]):
                if isinstance(item, Mapping):
                    problems += _schema_problems(item, nested, (*here, i), skip)
                else:
                    problems.append(((*here, i), f"{_dotted((*here, i))} must be a table"))
        else:
            try:
                msgspec.convert(value, f.type)
            except msgspec.ValidationError as exc:
                problems.append((here, _in_words(name, value, str(exc), f.type)))
                continue
        if f.name in _TIME_FIELDS and isinstance(value, int) and 0 < value < MIN_PLAUSIBLE_MS:
            problems.append(
                (
                    here,
                    f"{name} = {value} looks like seconds; times are milliseconds "
                    f"({value * 1000}) or a TOML datetime such as 2026-12-01T00:00:00Z",
                )
            )
    return problems


def terms_from_mapping(
    data: Mapping[str, Any], base: Path = Path("."), locate: Locate = _no_location
) -> PlacementTerms:
    """Build terms from TOML data (times as integers or datetimes, keys as base64/file:).

    TermsError lists every problem, each prefixed by where it is (``locate``: the file
    and line of a TOML file)."""
    obj = dict(data)
    obj.pop("type", None)
    problems: list[tuple[Where, str]] = []
    skip: set[Where] = set()

    def resolve(where: Where, convert: Callable[[], Any]) -> Any:
        try:
            return convert()
        except TermsError as exc:
            problems.extend((where, p) for p in exc.problems)
            skip.add(where)
            return None

    for field in _TIME_FIELDS:
        if field in obj:
            value = obj[field]
            obj[field] = resolve((field,), partial(_to_ms, value, field))
    for role in ROLES:
        if isinstance(obj.get(role), Mapping):
            party = dict(obj[role])
            if "key" in party:
                key = party["key"]
                party["key"] = resolve(
                    (role, "key"), partial(_resolve_key, key, f"{role}.key", base)
                )
            obj[role] = party
    if "ledger_key" in obj:
        value = obj["ledger_key"]
        obj["ledger_key"] = resolve(
            ("ledger_key",), partial(_resolve_key, value, "ledger_key", base)
        )
    items = obj.get("nodes")
    if isinstance(items, list):
        nodes: list[Any] = []
        for i, n in enumerate(items):
            if isinstance(n, Mapping) and "key" in n:
                key = n["key"]
                resolved = resolve(
                    ("nodes", i, "key"), partial(_resolve_key, key, f"nodes[{i}].key", base)
                )
                n = {**n, "key": resolved}
            nodes.append(n)
        obj["nodes"] = nodes
    problems += _schema_problems(obj, PlacementTerms, (), skip)
    if problems:
        located = [(locate(where), problem) for where, problem in problems]
        located.sort(key=lambda item: _line_number(item[0]))  # stable: file order, then found
        raise TermsError([f"{where}: {problem}" for where, problem in located])
    try:
        terms = msgspec.convert(obj, PlacementTerms)
    except msgspec.ValidationError as exc:  # the field checks above missed one
        raise TermsError([f"{locate(())}: {exc}"]) from exc
    # Round trip through the canonical decoder: it is what every party will verify.
    signed_bytes(terms)
    return terms


def _line_number(location: str) -> int:
    _, _, line = location.rpartition(":")
    return int(line) if line.isdigit() else 0


def _toml_lines(text: str) -> dict[Where, int]:
    """Line (1-based) of each table header and key of a TOML text, by where it is."""
    lines: dict[Where, int] = {(): 1}
    current: Where = ()
    counts: dict[str, int] = {}
    key_line = re.compile(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*=')
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[["):
            name = stripped.strip("[] \t").split("#")[0].strip().rstrip("]").strip()
            counts[name] = counts.get(name, -1) + 1
            current = (name, counts[name])
            lines.setdefault(current, number)
            lines.setdefault((name,), number)
        elif stripped.startswith("["):
            name = stripped.strip("[] \t").split("#")[0].strip().rstrip("]").strip()
            current = (name,)
            lines.setdefault(current, number)
        else:
            match = key_line.match(line)
            if match:
                lines.setdefault((*current, match.group(1)), number)
    return lines


def _locator(path: Path, text: str) -> Locate:
    lines = _toml_lines(text)

    def locate(where: Where) -> str:
        for end in range(len(where), -1, -1):
            line = lines.get(where[:end])
            if line is not None:
                return f"{path}:{line}"
        return str(path)

    return locate


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
    return terms_from_mapping(data, path.parent, _locator(path, text))


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
            article = "an" if opened.kind[0] in "aeiou" else "a"
            raise TermsError([f"{path} holds {article} {opened.kind} record, not terms"])
        return opened.record, opened.envelope
    return _terms_from_toml_bytes(raw, path), None


__all__ = [
    "CURRENCY_MINOR_UNITS",
    "TermsError",
    "check_terms_signatures",
    "load_terms_file",
    "node_inside_residency",
    "party_keys",
    "require_valid_terms",
    "residency_problems",
    "role_of_key",
    "terms_from_mapping",
    "terms_signature_problem",
    "total_share_milli",
    "validate_terms",
    "workload_problems",
]
