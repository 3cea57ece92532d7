"""The parties of a replayed cluster, its price table, and the terms of every placement.

Keys are derived from a seed text (``SigningKey.from_seed_text``), so a replay can be run
again byte for byte: one operator, one desk, one ledger, a few buyers, and one key per
node that hosts a placement. The price table (``replay_prices.toml`` beside this module,
or ``--prices FILE``) gives the rate per GPU-hour of each GPU model and the terms every
placement is signed with; terms are checked with ``proto.terms.validate_terms`` and
signed by operator, buyer and desk, each with its own key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gridledger.placement_plan import Placement
from gridledger.replay_limits import MAX_BUYERS
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import seal
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.records import GpuSpec, NodeSpec, Party, PlacementTerms
from proto.terms import CURRENCY_MINOR_UNITS, require_valid_terms
from proto.trust import TRUST_FORMAT, Role, TrustedKey, TrustFile
from proto.unknown_keys import unknown_key

__all__ = [
    "DEFAULT_PRICES",
    "ModelPrice",
    "PriceTable",
    "PriceTableError",
    "ReplayCast",
    "load_price_table",
    "make_replay_cast",
    "placement_terms",
    "signed_placement_terms",
]

DEFAULT_PRICES: Final = Path(__file__).with_name("replay_prices.toml")
_TERMS_KEYS: Final = (
    "increment_ms",
    "minimum_duration_ms",
    "desk_fee_bps",
    "fee_payer",
    "reclaim_notice_ms",
    "reclaim_penalty_bps",
    "sla_availability_target_bps",
    "sla_credit_bps",
    "settlement_period_ms",
    "late_grace_ms",
)


class PriceTableError(ValueError):
    """A price table that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """What one GPU-hour of a model costs, and the memory of one such GPU."""

    rate_per_gpu_hour_minor: int
    memory_mib: int


@dataclass(frozen=True)
class PriceTable:
    """The replay's configuration: currency, a rate per GPU model, the common terms."""

    currency: str
    currency_scale: int
    models: Mapping[str, ModelPrice]
    terms: Mapping[str, Any]
    region: str = "openb"
    fabric: str = "pcie"
    source: str = ""

    def price(self, model: str) -> ModelPrice:
        """The price of ``model``; PriceTableError when the table lacks it."""
        found = self.models.get(model)
        if found is None:
            raise PriceTableError(f"{self.source}: no price for GPU model {model!r}")
        return found


def _int(table: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise PriceTableError(f"{where}.{key} = {value!r}: want an integer in {lo}..{hi}")
    return value


def load_price_table(path: Path | None = None) -> PriceTable:
    """Read a price table (the default one when ``path`` is None)."""
    path = DEFAULT_PRICES if path is None else Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PriceTableError(f"cannot read {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PriceTableError(f"{path} is not valid TOML: {exc}") from exc
    known = {"currency", "currency_scale", "models", "terms"}
    if set(data) - known:
        words = "; ".join(unknown_key(k, known) for k in sorted(set(data) - known))
        raise PriceTableError(f"{path}: {words}")
    currency = data.get("currency")
    if not isinstance(currency, str) or currency not in CURRENCY_MINOR_UNITS:
        raise PriceTableError(f"{path}: currency {currency!r} is not one the ledger knows")
    scale = _int(data, "currency_scale", str(path), CURRENCY_MINOR_UNITS[currency], 9)
    models_raw = data.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise PriceTableError(f"{path}: [models.NAME] tables are missing")
    models: dict[str, ModelPrice] = {}
    for name, entry in models_raw.items():
        where = f"{path}: models.{name}"
        if not isinstance(entry, dict) or set(entry) != {"rate_per_gpu_hour_minor", "memory_mib"}:
            raise PriceTableError(f"{where}: want rate_per_gpu_hour_minor and memory_mib")
        models[name] = ModelPrice(
            _int(entry, "rate_per_gpu_hour_minor", where, 0, 3_600_000_000),
            _int(entry, "memory_mib", where, 0, 2**40),
        )
    terms_raw = data.get("terms", {})
    if not isinstance(terms_raw, dict):
        raise PriceTableError(f"{path}: [terms] must be a table")
    extra = set(terms_raw) - {*_TERMS_KEYS, "region", "fabric"}
    if extra:
        raise PriceTableError(f"{path}: unknown [terms] key(s) {sorted(extra)}")
    missing = set(_TERMS_KEYS) - set(terms_raw)
    if missing:
        raise PriceTableError(f"{path}: [terms] lacks {sorted(missing)}")
    terms = {k: terms_raw[k] for k in _TERMS_KEYS}
    return PriceTable(
        currency=currency,
        currency_scale=scale,
        models=models,
        terms=terms,
        region=str(terms_raw.get("region", "openb")),
        fabric=str(terms_raw.get("fabric", "pcie")),
        source=str(path),
    )


@dataclass
class ReplayCast:
    """The keys of a replayed cluster, all derived from ``seed``."""

    seed: str
    operator: SigningKey
    desk: SigningKey
    ledger: SigningKey
    buyers: tuple[SigningKey, ...]
    nodes: dict[str, SigningKey] = field(default_factory=dict)

    def node_key(self, node_id: str) -> SigningKey:
        """The agent key of a node, derived on first use."""
        key = self.nodes.get(node_id)
        if key is None:
            key = SigningKey.from_seed_text(node_id, f"{self.seed}/node/{node_id}")
            self.nodes[node_id] = key
        return key

    def trust(self, *, simulations: bool = False) -> TrustFile:
        """A trust file pinning operator, desk, every buyer and the ledger; ``simulations``:
        it admits a simulation's exports as FINAL (SPEC §6.6, §9)."""
        pairs: list[tuple[Role, SigningKey]] = [
            ("operator", self.operator),
            ("desk", self.desk),
            *(("buyer", b) for b in self.buyers),
            ("ledger", self.ledger),
        ]
        return TrustFile(
            format=TRUST_FORMAT,
            keys=[TrustedKey(id=k.name, role=role, key=k.public_key) for role, k in pairs],
            simulations=simulations,
        )


def make_replay_cast(seed: str, buyers: int) -> ReplayCast:
    """Deterministic keys for a replay named by ``seed``, with ``buyers`` buyers."""
    if not 1 <= buyers <= MAX_BUYERS:
        raise ValueError(f"buyers must be 1..{MAX_BUYERS}, got {buyers}")

    def key(name: str) -> SigningKey:
        return SigningKey.from_seed_text(name, f"{seed}/party/{name}")

    return ReplayCast(
        seed=seed,
        operator=key("operator-openb"),
        desk=key("desk-1"),
        ledger=key("ledger-1"),
        buyers=tuple(key(f"buyer-{i + 1}") for i in range(buyers)),
    )


def placement_terms(placement: Placement, cast: ReplayCast, prices: PriceTable) -> PlacementTerms:
    """The terms of one planned placement; TermsError if they break a rule of SPEC §5."""
    price = prices.price(placement.model)
    buyer = cast.buyers[placement.buyer]
    node_key = cast.node_key(placement.node_id)
    fields: dict[str, Any] = {
        **prices.terms,
        "placement_id": placement.placement_id,
        "operator": Party(id=cast.operator.name, key=cast.operator.public_key),
        "buyer": Party(id=buyer.name, key=buyer.public_key),
        "desk": Party(id=cast.desk.name, key=cast.desk.public_key),
        "ledger_key": cast.ledger.public_key,
        "nodes": [
            NodeSpec(
                node_id=placement.node_id,
                key=node_key.public_key,
                region=prices.region,
                fabric=prices.fabric,
            )
        ],
        "gpus": [
            GpuSpec(
                node_id=g.node_id,
                uuid=g.uuid,
                model=g.model,
                share_milli=g.share_milli,
                memory_mib=price.memory_mib,
            )
            for g in placement.gpus
        ],
        "window_start_ms": placement.window_start_ms,
        "window_end_ms": placement.window_end_ms,
        "rate_basis": "gpu_hour",
        "rate_per_gpu_hour_minor": price.rate_per_gpu_hour_minor,
        "currency": prices.currency,
        "currency_scale": prices.currency_scale,
        "interruptible": placement.interruptible,
        "created_at_ms": min(placement.created_at_ms, placement.window_start_ms),
    }
    terms = PlacementTerms(**fields)
    # A Struct does not check its field constraints on construction: decode the signed
    # bytes as every party and the ledger will, so a bad value fails here, named.
    try:
        decode_payload(signed_bytes(terms))
    except ProtoError as exc:
        raise PriceTableError(f"terms of {placement.placement_id}: {exc}") from exc
    require_valid_terms(terms)
    return terms


def signed_placement_terms(
    placement: Placement, cast: ReplayCast, prices: PriceTable
) -> tuple[PlacementTerms, bytes]:
    """The terms and their envelope, signed by the operator, the buyer and the desk."""
    terms = placement_terms(placement, cast, prices)
    buyer = cast.buyers[placement.buyer]
    return terms, seal(terms, [cast.operator, buyer, cast.desk])
