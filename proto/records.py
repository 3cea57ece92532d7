"""The signed records of gridledger, as msgspec Structs (SPEC.md, "Records").

A Struct is the schema: frozen, unknown fields forbidden, an explicit wire tag in the
field ``type``. Every integer is bounded to the I-JSON range; identifiers, hashes and
keys are constrained by pattern or length, so a decoded record is well-formed by
construction. Cross-field rules (a window longer than its minimum, GPUs on listed nodes)
live in ``proto.terms`` and in the fold, with their own reason codes.

Schema evolution: append fields with defaults, never reorder or rename; a new meaning
gets a new domain prefix version (``/v2``).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta, Struct

from proto import limits
from proto.invariant import of_type

# ---- field types -------------------------------------------------------------------

NonNegInt = Annotated[int, Meta(ge=0, le=limits.MAX_SAFE_INTEGER)]
TimeMs = Annotated[int, Meta(ge=0, le=limits.MAX_SAFE_INTEGER)]
Bps = Annotated[int, Meta(ge=0, le=limits.MAX_BPS)]
ShareMilli = Annotated[int, Meta(ge=1, le=limits.MAX_SHARE_MILLI)]
Identifier = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$(?!\n)", min_length=1, max_length=limits.MAX_ID_CHARS
    ),
]
Text = Annotated[str, Meta(max_length=limits.MAX_TEXT_CHARS)]
Model = Annotated[str, Meta(min_length=1, max_length=limits.MAX_ID_CHARS)]
Hash = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$(?!\n)")]
PublicKey = Annotated[bytes, Meta(min_length=32, max_length=32)]
Currency = Annotated[str, Meta(pattern=r"^[A-Z]{3}$(?!\n)")]
EvidenceToken = Annotated[
    str,
    Meta(
        pattern=r"^([A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+)?$(?!\n)",
        max_length=limits.MAX_EVIDENCE_CHARS,
    ),
]

ZERO_HASH: Final = "0" * 64

# ---- PlacementTerms ----------------------------------------------------------------


class Party(Struct, frozen=True, forbid_unknown_fields=True):
    """A party to the terms and the Ed25519 public key it signs with."""

    id: Identifier
    key: PublicKey


class NodeSpec(Struct, frozen=True, forbid_unknown_fields=True):
    """A node that hosts GPUs of the placement, and the key its agent signs with."""

    node_id: Identifier
    key: PublicKey
    region: Text
    fabric: Text


class GpuSpec(Struct, frozen=True, forbid_unknown_fields=True):
    """One GPU of the placement: which physical device, and what share of it."""

    node_id: Identifier
    uuid: Identifier
    model: Model
    share_milli: ShareMilli
    memory_mib: NonNegInt


NonEmptyText = Annotated[str, Meta(min_length=1, max_length=limits.MAX_TEXT_CHARS)]


class Metering(Struct, frozen=True, forbid_unknown_fields=True):
    """SPEC §5.3: how the GPUs are measured: the XID table, whether a GPU held by nobody
    is billed, the buyer's workload identities on the scheduler, and the share at which
    degraded (throttled) time is billed."""

    xid_table: Literal[1, 2]
    idle_billed: bool
    holders: Annotated[list[NonEmptyText], Meta(max_length=limits.MAX_HOLDERS)]
    degraded_bps: Bps


class Workload(Struct, frozen=True, forbid_unknown_fields=True):
    """SPEC §5.1: what runs on the capacity. ``class`` on the wire (a Python keyword)."""

    workload_class: Literal["inference", "training", "reseller", "burst", "batch"] = msgspec.field(
        name="class"
    )
    runtime: Text
    isolation: Literal["shared", "mig", "dedicated"]
    data_access: Text


class Delivery(Struct, frozen=True, forbid_unknown_fields=True):
    """SPEC §5.1: who operates the capacity, support, acceptance, and what a reclaim does."""

    operator_of_record: NonEmptyText
    support_contact: Text
    support_hours: Text
    acceptance: Annotated[list[NonEmptyText], Meta(max_length=limits.MAX_ACCEPTANCE_ITEMS)]
    on_reclaim: Literal["checkpoint", "drain", "terminate"]


class Residency(Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """SPEC §5.2: the node regions the work may run in (enforced) and the jurisdictions the
    data stays under (carried and shown; omitted from the bytes when empty)."""

    allowed_regions: Annotated[
        list[NonEmptyText], Meta(min_length=1, max_length=limits.MAX_REGIONS)
    ]
    jurisdictions: Annotated[list[NonEmptyText], Meta(max_length=limits.MAX_JURISDICTIONS)] = []


class PlacementTerms(
    Struct,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag="terms",
    tag_field="type",
):
    """What operator, buyer and desk agreed before the work started. Signed by all three."""

    placement_id: Identifier
    operator: Party
    buyer: Party
    desk: Party
    ledger_key: PublicKey
    nodes: Annotated[list[NodeSpec], Meta(min_length=1, max_length=limits.MAX_NODES)]
    gpus: Annotated[list[GpuSpec], Meta(min_length=1, max_length=limits.MAX_GPUS)]
    window_start_ms: TimeMs
    window_end_ms: TimeMs
    rate_basis: Literal["gpu_hour"]
    rate_per_gpu_hour_minor: Annotated[int, Meta(ge=0, le=limits.MAX_RATE_MINOR)]
    currency: Currency
    currency_scale: Annotated[int, Meta(ge=0, le=9)]
    increment_ms: Annotated[int, Meta(ge=1, le=limits.MAX_WINDOW_MS)]
    minimum_duration_ms: Annotated[int, Meta(ge=0, le=limits.MAX_WINDOW_MS)]
    desk_fee_bps: Bps
    fee_payer: Literal["operator", "buyer"]
    interruptible: bool
    reclaim_notice_ms: Annotated[int, Meta(ge=0, le=limits.MAX_WINDOW_MS)]
    reclaim_penalty_bps: Bps
    sla_availability_target_bps: Bps
    sla_credit_bps: Bps
    settlement_period_ms: Annotated[int, Meta(ge=1, le=limits.MAX_WINDOW_MS)]
    late_grace_ms: Annotated[int, Meta(ge=0, le=limits.MAX_WINDOW_MS)]
    created_at_ms: TimeMs
    # SPEC §5, §6.3 terms: 1 for the original terms; an amendment carries the version it
    # replaces plus one and the record hash of those terms (ZERO_HASH for version 1).
    version: Annotated[int, Meta(ge=1, le=limits.MAX_SAFE_INTEGER)] = 1
    supersedes: Hash = ZERO_HASH
    # SPEC §5.1, §5.2: optional objects, absent (omitted from the bytes) when not agreed,
    # so terms signed before them keep their bytes and hashes.
    workload: Workload | None = None
    delivery: Delivery | None = None
    residency: Residency | None = None
    # SPEC §6.8, §4.0: an assignment (resale) also needs the operator's signature.
    # Omitted at its default (false): terms signed before it keep their bytes.
    resale_requires_operator: bool = False
    # SPEC §6.7, §7.9: how long before its end a buyer's release must reach the log for the
    # buyer to owe nothing past that end. Omitted at 0, so older terms keep their bytes.
    release_notice_ms: Annotated[int, Meta(ge=0, le=limits.MAX_WINDOW_MS)] = 0
    # SPEC §6.9: usage is folded only when signed by a key with accepted hardware evidence
    # naming the sampled GPUs (NOT_ATTESTED); omitted when false.
    attestation_required: bool = False
    # SPEC §11.2: the tax rate the parties agree on what the terms bill (shown on
    # invoices as its own line; it changes no figure of §7). Omitted at 0 (none).
    tax_bps: Bps = 0
    # SPEC §5.3: how the GPUs are measured; absent (omitted): XID table 1, idle billed,
    # degraded time billed in full.
    metering: Metering | None = None


# ---- records from the operator, the nodes and the desk --------------------------


class NodeKeyBinding(
    Struct,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag="keybinding",
    tag_field="type",
):
    """Node ``node_id`` signs with ``key`` for usage inside [valid_from, valid_until).

    A later binding of the same (node, key) replaces the earlier one: that is how a key is
    revoked (``valid_until_ms`` moved back) or rotated (a new key bound). Signed by the
    operator and the buyer; a revocation (it only shortens) by the operator alone may do
    (SPEC §4).
    """

    placement_id: Identifier
    node_id: Identifier
    key: PublicKey
    valid_from_ms: TimeMs
    valid_until_ms: TimeMs
    issued_at_ms: TimeMs
    # SPEC §6.9: hardware evidence for the key — a compact JWS (an attestation service's
    # signed EAT); omitted when absent, so bindings without it keep their bytes.
    evidence: EvidenceToken = ""


Allocation = Literal["unknown", "buyer", "idle", "other"]


class GpuSample(Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """What the node saw of one GPU during the event's interval.

    The evidence fields after ``ecc_errors`` (SPEC §7.1 "Health from evidence") were
    appended with defaults and are omitted from the canonical bytes at their default, so
    events of agents that predate them decode to the same bytes (and read as: no XID, no
    uncorrectable ECC error, no retired page, present).
    """

    uuid: Identifier
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
    # Health evidence (SPEC §7.1): XID codes seen in the interval, uncorrectable ECC
    # errors in the interval, retired pages (cumulative), whether the device answered.
    xids: Annotated[list[NonNegInt], Meta(max_length=limits.MAX_XIDS)] = []
    ecc_uncorrectable: NonNegInt = 0
    retired_pages: NonNegInt = 0
    present: bool = True
    # SPEC §7.1.2, appended with defaults (omitted at them): who held the GPU per the
    # node's scheduler source; the clock-event (throttle) reasons seen in the interval
    # (NVML bitmask); correctable remapped rows so far (evidence only, never unhealthy).
    allocation: Allocation = "unknown"
    clock_events: NonNegInt = 0
    remapped_correctable: NonNegInt = 0


class UsageEvent(
    Struct, frozen=True, forbid_unknown_fields=True, tag="usage", tag_field="type", gc=False
):
    """Node key: the ``seq``-th observation of the (node, placement) stream, over [start, end)."""

    placement_id: Identifier
    node_id: Identifier
    seq: NonNegInt
    prev: Hash
    start_ms: TimeMs
    end_ms: TimeMs
    samples: Annotated[list[GpuSample], Meta(max_length=limits.MAX_SAMPLES)]


class ReclaimNotice(
    Struct, frozen=True, forbid_unknown_fields=True, tag="reclaim", tag_field="type"
):
    """Operator: the placement's GPUs are taken back at ``effective_at_ms``."""

    placement_id: Identifier
    reclaim_id: Identifier
    issued_at_ms: TimeMs
    effective_at_ms: TimeMs
    gpus: Annotated[list[Identifier], Meta(min_length=1, max_length=limits.MAX_GPUS)]
    reason: Text


class Adjustment(
    Struct, frozen=True, forbid_unknown_fields=True, tag="adjustment", tag_field="type"
):
    """A credit to the buyer or a charge, appended; never a rewrite.

    Signed by the parties it costs (SPEC §4): a charge by the buyer, a credit by the
    operator and the desk; the desk may co-sign a charge.
    """

    placement_id: Identifier
    adjustment_id: Identifier
    direction: Literal["credit", "charge"]
    amount_minor: Annotated[int, Meta(ge=1, le=limits.MAX_SAFE_INTEGER)]
    reference: Text
    reason: Text
    issued_at_ms: TimeMs


class BuyerRelease(
    Struct, frozen=True, forbid_unknown_fields=True, tag="release", tag_field="type"
):
    """Buyer: the placement ends early, at ``effective_at_ms`` or later (SPEC §6.7).

    Signed by the buyer (the operator may co-sign). The minimum duration and the release
    notice of the terms are billed once as the release charge (SPEC §7.9).
    """

    placement_id: Identifier
    release_id: Identifier
    issued_at_ms: TimeMs
    effective_at_ms: TimeMs
    reason: Text


class StreamResume(Struct, frozen=True, forbid_unknown_fields=True, tag="resume", tag_field="type"):
    """Operator and buyer: node ``node_id``'s usage stream restarts at ``from_seq``, its
    next event chained to this record, no interval before ``from_ms`` (SPEC §6.3 resume:
    a node that lost its spool)."""

    placement_id: Identifier
    resume_id: Identifier
    node_id: Identifier
    from_seq: NonNegInt
    from_ms: TimeMs
    reason: Text


# ---- records from the ledger ----------------------------------------------------------


class PlacementClosed(
    Struct, frozen=True, forbid_unknown_fields=True, tag="closed", tag_field="type"
):
    """Ledger: the stream of the placement is closed; later usage is kept, not folded."""

    placement_id: Identifier
    closed_at_ms: TimeMs


class Assignment(
    Struct, frozen=True, forbid_unknown_fields=True, tag="assignment", tag_field="type"
):
    """Original buyer, new buyer and desk (and the operator when the terms say so): the
    buyer sells ``gpus`` of the placement from ``handover_at_ms`` on to ``new_buyer`` at
    the resale rate (SPEC §6.8, §7.10)."""

    placement_id: Identifier
    assignment_id: Identifier
    new_buyer: Party
    handover_at_ms: TimeMs
    gpus: Annotated[list[Identifier], Meta(min_length=1, max_length=limits.MAX_GPUS)]
    rate_per_gpu_hour_minor: Annotated[int, Meta(ge=0, le=limits.MAX_RATE_MINOR)]
    issued_at_ms: TimeMs


class ResaleTotals(Struct, frozen=True, forbid_unknown_fields=True):
    """One accepted assignment's cumulative resale figures (SPEC §7.10): what its new buyer
    owes (``gross_minor``, paid to the desk) and the desk's fee on it (paid by the seller)."""

    assignment_id: Identifier
    new_buyer: Identifier
    delivered_mgms: NonNegInt
    billable_mgms: NonNegInt
    gross_minor: NonNegInt
    fee_minor: NonNegInt


class Totals(Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """Cumulative amounts of a placement through one ledger record (SPEC.md, "Pricing").

    Fields appended after version 1 have a default and are omitted from the canonical
    bytes at it (SPEC §2 (4)), so records without them keep their bytes and hashes.
    """

    delivered_mgms: NonNegInt
    billable_mgms: NonNegInt
    gross_minor: NonNegInt
    reclaim_credit_minor: NonNegInt
    sla_credit_minor: NonNegInt
    adjustment_credit_minor: NonNegInt
    adjustment_charge_minor: NonNegInt
    credits_minor: NonNegInt
    net_minor: NonNegInt
    fee_minor: NonNegInt
    buyer_owes_minor: NonNegInt
    operator_receives_minor: NonNegInt
    desk_receives_minor: NonNegInt
    # SPEC §7.9: the release charge K (the minimum-duration shortfall of a buyer release).
    release_charge_minor: NonNegInt = 0


RecordKind = Literal[
    "terms",
    "keybinding",
    "usage",
    "reclaim",
    "adjustment",
    "closed",
    "assignment",
    "release",
    "resume",
]
Status = Literal["accepted", "rejected"]


class LedgerRecord(
    Struct,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag="record",
    tag_field="type",
    gc=False,
):
    """Ledger: one entry of the placement's chain, for exactly one input.

    ``source`` is the SHA-256 of the input envelope's bytes; ``reason`` is empty when the
    input was accepted and a Reason code when it was rejected. ``arrived_ms`` (SPEC §6.6):
    when the input reached the log; None (omitted from the canonical bytes) only on
    records written before §6.6, whose bytes and hashes are therefore unchanged. Every
    other field is always written (none of them has a default).
    """

    placement_id: Identifier
    index: NonNegInt
    prev: Hash
    kind: RecordKind
    source: Hash
    status: Status
    reason: Annotated[str, Meta(pattern=r"^[A-Z_]{0,40}$(?!\n)")]
    delivered_mgms: NonNegInt
    totals: Totals
    arrived_ms: TimeMs | None = None
    # SPEC §7.10: one entry per accepted assignment, from the first on (omitted when empty).
    resale: Annotated[list[ResaleTotals], Meta(max_length=limits.MAX_ASSIGNMENTS)] = []


class Statement(
    Struct,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag="statement",
    tag_field="type",
):
    """Ledger: the cumulative obligation through record ``through_index`` (hash ``head``).

    ``period`` (SPEC §8, "Statement periods"): 0 through the close; each record after the
    close opens the next period. ``previous``: ZERO_HASH in period 0, else the record hash
    of the last record of the period before (``through_index - 1``). ``arrival``: the
    ledger's arrival mode (SPEC §6.6), signed here so no one relabels it.
    """

    placement_id: Identifier
    through_index: NonNegInt
    head: Hash
    currency: Currency
    currency_scale: Annotated[int, Meta(ge=0, le=9)]
    final: bool
    totals: Totals
    period: NonNegInt = 0
    previous: Hash = ZERO_HASH
    # SPEC §7.10: the resale list of the record through_index (omitted when empty).
    resale: Annotated[list[ResaleTotals], Meta(max_length=limits.MAX_ASSIGNMENTS)] = []
    # SPEC §6.6, §8: where the arrival times of the records come from, signed: "log"
    # (omitted: production) or "sender" (a simulation on a simulated clock).
    arrival: Literal["log", "sender"] = "log"


class Checkpoint(
    Struct, frozen=True, forbid_unknown_fields=True, tag="checkpoint", tag_field="type"
):
    """The body of a C2SP signed note: origin, tree size, RFC 9162 root hash."""

    origin: Annotated[str, Meta(min_length=1, max_length=limits.MAX_TEXT_CHARS)]
    size: NonNegInt
    root: Annotated[bytes, Meta(min_length=32, max_length=32)]


Record = (
    PlacementTerms
    | NodeKeyBinding
    | UsageEvent
    | ReclaimNotice
    | Adjustment
    | PlacementClosed
    | LedgerRecord
    | Statement
    | Assignment
    | BuyerRelease
    | StreamResume
)

# Kinds that travel inside envelopes, in the order of SPEC.md.
RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    PlacementTerms,
    NodeKeyBinding,
    UsageEvent,
    ReclaimNotice,
    Adjustment,
    PlacementClosed,
    LedgerRecord,
    Statement,
    Assignment,
    BuyerRelease,
    StreamResume,
)


def kind_of(record_type: type[Record]) -> str:
    """The wire tag of a record type (``"usage"`` for UsageEvent)."""
    tag = msgspec.inspect.type_info(record_type).tag  # type: ignore[attr-defined]
    return of_type(tag, str, "wire tag of a record type")


KIND_TO_TYPE: Final[dict[str, type[Record]]] = {kind_of(t): t for t in RECORD_TYPES}
