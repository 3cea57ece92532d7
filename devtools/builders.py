"""Builders of signed records for a placement: used by the demo, the replay and tests.

Everything here is deterministic for a seed text: keys are derived from it, so a run can
be replayed byte for byte. Real parties generate their keys with ``gridledger keys new``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from proto.envelope import seal
from proto.keys import SigningKey
from proto.records import (
    ZERO_HASH,
    Adjustment,
    Allocation,
    Assignment,
    BuyerRelease,
    GpuSample,
    GpuSpec,
    NodeKeyBinding,
    NodeSpec,
    Party,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    StreamResume,
    UsageEvent,
)
from proto.trust import TRUST_FORMAT, Role, TrustedKey, TrustFile


@dataclass(frozen=True)
class Cast:
    """The keys of one scenario: three parties, the ledger, one key per node."""

    seed: str
    operator: SigningKey
    buyer: SigningKey
    desk: SigningKey
    ledger: SigningKey
    nodes: dict[str, SigningKey] = field(default_factory=dict)

    def node_key(self, node_id: str) -> SigningKey:
        """The key of a node, derived on first use."""
        if node_id not in self.nodes:
            self.nodes[node_id] = SigningKey.from_seed_text(node_id, f"{self.seed}/node/{node_id}")
        return self.nodes[node_id]

    def trust(self, *, simulations: bool = False) -> TrustFile:
        """A trust file pinning the three parties and the ledger; ``simulations``: it
        admits a simulation's exports (``arrival = "sender"``, SPEC §6.6, §9) as FINAL."""
        pairs: tuple[tuple[Role, SigningKey], ...] = (
            ("operator", self.operator),
            ("buyer", self.buyer),
            ("desk", self.desk),
            ("ledger", self.ledger),
        )
        keys = [TrustedKey(id=k.name, role=role, key=k.public_key) for role, k in pairs]
        return TrustFile(format=TRUST_FORMAT, keys=keys, simulations=simulations)


def make_cast(
    seed: str,
    *,
    operator: str = "operator-1",
    buyer: str = "buyer-1",
    desk: str = "desk-1",
    ledger: str = "ledger-1",
) -> Cast:
    """Deterministic keys for a scenario named by ``seed``."""

    def key(name: str) -> SigningKey:
        return SigningKey.from_seed_text(name, f"{seed}/party/{name}")

    return Cast(seed, key(operator), key(buyer), key(desk), key(ledger))


def gpu(node_id: str, index: int, model: str = "A100-80GB", share_milli: int = 1000) -> GpuSpec:
    """A GPU spec with a deterministic uuid for (node, index)."""
    return GpuSpec(
        node_id=node_id,
        uuid=f"GPU-{node_id}-{index}",
        model=model,
        share_milli=share_milli,
        memory_mib=81920,
    )


DEFAULT_TERMS: dict[str, Any] = {
    "rate_basis": "gpu_hour",
    "rate_per_gpu_hour_minor": 250,
    "currency": "USD",
    "currency_scale": 2,
    "increment_ms": 60_000,
    "minimum_duration_ms": 0,
    "desk_fee_bps": 500,
    "fee_payer": "operator",
    "interruptible": False,
    "reclaim_notice_ms": 600_000,
    "reclaim_penalty_bps": 10_000,
    "sla_availability_target_bps": 9_900,
    "sla_credit_bps": 1_000,
    "settlement_period_ms": 3_600_000,
    "late_grace_ms": 300_000,
}


def make_terms(
    cast: Cast,
    placement_id: str,
    gpus: Sequence[GpuSpec],
    window_start_ms: int,
    window_end_ms: int,
    **overrides: Any,
) -> PlacementTerms:
    """Terms for ``gpus`` over the window; any field can be overridden by keyword."""
    node_ids = sorted({g.node_id for g in gpus})
    fields: dict[str, Any] = {
        **DEFAULT_TERMS,
        "placement_id": placement_id,
        "operator": Party(id=cast.operator.name, key=cast.operator.public_key),
        "buyer": Party(id=cast.buyer.name, key=cast.buyer.public_key),
        "desk": Party(id=cast.desk.name, key=cast.desk.public_key),
        "ledger_key": cast.ledger.public_key,
        "nodes": [
            NodeSpec(node_id=n, key=cast.node_key(n).public_key, region="eu-west", fabric="nvlink")
            for n in node_ids
        ],
        "gpus": list(gpus),
        "window_start_ms": window_start_ms,
        "window_end_ms": window_end_ms,
        "created_at_ms": window_start_ms,
    }
    fields.update(overrides)
    return PlacementTerms(**fields)


def signed_terms(cast: Cast, terms: PlacementTerms) -> bytes:
    """Terms signed by operator, buyer and desk."""
    return seal(terms, [cast.operator, cast.buyer, cast.desk])


def amendment(terms: PlacementTerms, **changes: Any) -> PlacementTerms:
    """An amendment of ``terms`` (SPEC §6.3 terms): version + 1, ``supersedes`` = the
    record hash of ``terms``, and the given fields changed. Sign it with ``signed_terms``."""
    from proto.canonical import signed_bytes
    from proto.envelope import sha256_hex

    fields: dict[str, Any] = {
        "version": terms.version + 1,
        "supersedes": sha256_hex(signed_bytes(terms)),
        **changes,
    }
    return msgspec.structs.replace(terms, **fields)


def sample(
    gpu_spec: GpuSpec,
    *,
    allocated: bool = True,
    healthy: bool = True,
    utilisation_pct: int = 90,
    power_mw: int = 300_000,
    xids: Iterable[int] = (),
    ecc_uncorrectable: int = 0,
    retired_pages: int = 0,
    present: bool = True,
    allocation: Allocation = "unknown",
    clock_events: int = 0,
    remapped_correctable: int = 0,
) -> GpuSample:
    """A plausible sample of one GPU; the keywords after ``utilisation_pct`` set its
    health evidence (SPEC §7.1.1) and its allocation and degradation (§7.1.2)."""
    codes = list(xids)
    return GpuSample(
        uuid=gpu_spec.uuid,
        model=gpu_spec.model,
        allocated=allocated,
        healthy=healthy,
        utilisation_pct=utilisation_pct,
        memory_used_mib=gpu_spec.memory_mib // 2,
        memory_total_mib=gpu_spec.memory_mib,
        power_mw=power_mw,
        energy_mj=0,
        xid_errors=len(codes),
        ecc_errors=ecc_uncorrectable,
        xids=codes,
        ecc_uncorrectable=ecc_uncorrectable,
        retired_pages=retired_pages,
        present=present,
        allocation=allocation,
        clock_events=clock_events,
        remapped_correctable=remapped_correctable,
    )


@dataclass
class StreamWriter:
    """Signs the consecutive usage events of one (node, placement) stream."""

    key: SigningKey
    placement_id: str
    node_id: str
    seq: int = 0
    prev: str = ZERO_HASH

    def event(self, start_ms: int, end_ms: int, samples: Iterable[GpuSample]) -> bytes:
        """The next event's envelope; advances seq and prev."""
        from proto.canonical import signed_bytes
        from proto.envelope import sha256_hex

        record = UsageEvent(
            placement_id=self.placement_id,
            node_id=self.node_id,
            seq=self.seq,
            prev=self.prev,
            start_ms=start_ms,
            end_ms=end_ms,
            samples=list(samples),
        )
        self.seq += 1
        self.prev = sha256_hex(signed_bytes(record))
        return seal(record, [self.key])


def reclaim(
    cast: Cast, terms: PlacementTerms, issued_at_ms: int, effective_at_ms: int, reclaim_id: str
) -> bytes:
    """An operator-signed reclaim of the whole placement."""
    record = ReclaimNotice(
        placement_id=terms.placement_id,
        reclaim_id=reclaim_id,
        issued_at_ms=issued_at_ms,
        effective_at_ms=effective_at_ms,
        gpus=[g.uuid for g in terms.gpus],
        reason="capacity needed by the operator",
    )
    return seal(record, [cast.operator])


def release(
    cast: Cast,
    terms: PlacementTerms,
    issued_at_ms: int,
    effective_at_ms: int,
    release_id: str,
    signers: Sequence[SigningKey] | None = None,
) -> bytes:
    """A buyer release of the placement (SPEC §6.7), signed by the buyer unless
    ``signers`` says otherwise."""
    record = BuyerRelease(
        placement_id=terms.placement_id,
        release_id=release_id,
        issued_at_ms=issued_at_ms,
        effective_at_ms=effective_at_ms,
        reason="the buyer no longer needs the capacity",
    )
    return seal(record, list(signers) if signers is not None else [cast.buyer])


def resume(
    cast: Cast,
    placement_id: str,
    node_id: str,
    from_seq: int,
    from_ms: int,
    resume_id: str = "resume-1",
    signers: Sequence[SigningKey] | None = None,
) -> bytes:
    """A resume of node ``node_id``'s stream at ``from_seq`` from ``from_ms`` (SPEC §6.3
    resume), signed by operator and buyer unless ``signers`` says otherwise."""
    record = StreamResume(
        placement_id=placement_id,
        resume_id=resume_id,
        node_id=node_id,
        from_seq=from_seq,
        from_ms=from_ms,
        reason="the node lost its spool (disk replaced)",
    )
    return seal(record, list(signers) if signers is not None else [cast.operator, cast.buyer])


def adjustment(
    cast: Cast,
    placement_id: str,
    adjustment_id: str,
    direction: str,
    amount_minor: int,
    issued_at_ms: int,
    reference: str = "",
    reason: str = "desk adjustment",
    signers: Sequence[SigningKey] | None = None,
) -> bytes:
    """An adjustment signed as SPEC §4.0 requires: a charge by the buyer and the desk
    (desk optional), a credit by the operator and the desk; ``signers`` overrides."""
    record = Adjustment(
        placement_id=placement_id,
        adjustment_id=adjustment_id,
        direction=direction,  # type: ignore[arg-type]
        amount_minor=amount_minor,
        reference=reference,
        reason=reason,
        issued_at_ms=issued_at_ms,
    )
    if signers is None:
        payer = cast.buyer if direction == "charge" else cast.operator
        signers = [payer, cast.desk]
    return seal(record, list(signers))


def key_binding(
    cast: Cast,
    placement_id: str,
    node_id: str,
    key: SigningKey,
    valid_from_ms: int,
    valid_until_ms: int,
    issued_at_ms: int,
    signers: Sequence[SigningKey] | None = None,
    evidence: str = "",
) -> bytes:
    """A node key binding (rotation or revocation) signed by the operator and the buyer
    (SPEC §4.0; a revocation needs only the operator); ``signers`` overrides.
    ``evidence``: hardware evidence for the key (SPEC §6.9)."""
    record = NodeKeyBinding(
        placement_id=placement_id,
        node_id=node_id,
        key=key.public_key,
        valid_from_ms=valid_from_ms,
        valid_until_ms=valid_until_ms,
        issued_at_ms=issued_at_ms,
        evidence=evidence,
    )
    return seal(record, list(signers) if signers is not None else [cast.operator, cast.buyer])


def closed(cast: Cast, placement_id: str, closed_at_ms: int) -> bytes:
    """A ledger-signed PlacementClosed."""
    record = PlacementClosed(placement_id=placement_id, closed_at_ms=closed_at_ms)
    return seal(record, [cast.ledger])


def assignment(
    cast: Cast,
    terms: PlacementTerms,
    assignment_id: str,
    new_buyer: SigningKey,
    handover_at_ms: int,
    gpus: Sequence[str],
    rate_per_gpu_hour_minor: int,
    issued_at_ms: int | None = None,
    signers: Sequence[SigningKey] | None = None,
) -> bytes:
    """A resale (SPEC §6.8) signed as §4.0 requires: the terms' buyer, the new buyer and
    the desk (and the operator when the terms require it); ``signers`` overrides."""
    record = Assignment(
        placement_id=terms.placement_id,
        assignment_id=assignment_id,
        new_buyer=Party(id=new_buyer.name, key=new_buyer.public_key),
        handover_at_ms=handover_at_ms,
        gpus=list(gpus),
        rate_per_gpu_hour_minor=rate_per_gpu_hour_minor,
        issued_at_ms=handover_at_ms if issued_at_ms is None else issued_at_ms,
    )
    if signers is None:
        signers = [cast.buyer, new_buyer, cast.desk]
        if terms.resale_requires_operator:
            signers.append(cast.operator)
    return seal(record, list(signers))
