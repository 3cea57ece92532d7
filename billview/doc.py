"""The rendered bill as data (``gridledger-bill/v1``): what the HTML, CSV, text and
JSON forms all show. Amounts are integers of minor units plus their decimal text."""

from __future__ import annotations

from typing import Final

import msgspec
from msgspec import Struct

BILL_FORMAT: Final = "gridledger-bill/v1"


class Line(Struct, frozen=True, kw_only=True):
    """One line item: what it is, how much, who pays whom, and the numbers behind it.

    ``key`` is stable for accounting systems (``gross``, ``reclaim:<id>``, ``gpu:<uuid>``);
    ``amount_minor`` is None for quantities that are not money (hours, availability).
    """

    key: str
    section: str
    label: str
    quantity: str = ""
    unit: str = ""
    amount_minor: int | None = None
    amount: str = ""
    payer: str = ""
    payee: str = ""
    derivation: str = ""
    signers: list[str] = []
    unit_price: str = ""  # what one unit costs, with its currency: "2.50 USD/GPU-h"


class Segment(Struct, frozen=True, array_like=True):
    """``[start_ms, end_ms)`` of one GPU in one state."""

    start_ms: int
    end_ms: int
    state: str


class GpuRow(Struct, frozen=True, kw_only=True):
    """One GPU's delivery over the window: milliseconds per state and what counted."""

    uuid: str
    node_id: str
    model: str
    share_milli: int
    owed_ms: int
    ms: dict[str, int]
    delivered_mgms: int
    delivered_gpu_h: str
    availability: str
    segments: list[Segment] = []
    # SPEC §7.1.2: delivered time priced at the terms' degraded share, and delivered time
    # no scheduler vouched for (allocation "unknown").
    degraded_ms: int = 0
    allocation_unknown_ms: int = 0


class Period(Struct, frozen=True, kw_only=True):
    """A period with a final statement (SPEC §8)."""

    period: int
    through_index: int
    buyer_owes_minor: int
    operator_receives_minor: int
    desk_receives_minor: int
    latest: bool


class Verdict(Struct, frozen=True, kw_only=True):
    """FINAL / PROVISIONAL / FAILED, who judged, and why not final."""

    level: str
    by: str
    reasons: list[str] = []


class Checkpoint(Struct, frozen=True, kw_only=True):
    """The checkpoint the figures sit under: tree size, RFC 9162 root, cosigners."""

    size: int
    root_b64: str
    cosigners: list[str]
    covers_statement: bool


class Attested(Struct, frozen=True, kw_only=True):
    """SPEC §6.9: GPUs of a node key attested by an attestation service."""

    node_id: str
    key_id: str
    gpus: list[str]
    attester: str  # "" when not checked against a root
    iss: str
    iat_s: int
    chain_index: int


class StatementRef(Struct, frozen=True, kw_only=True):
    """Which signed statement the bill shows."""

    through_index: int
    head: str
    final: bool
    period: int
    previous: str


class Resale(Struct, frozen=True, kw_only=True):
    """One accepted assignment and its figures (SPEC §6.8, §7.10)."""

    assignment_id: str
    new_buyer: str
    handover_ms: int
    gpus: list[str]
    rate_per_gpu_hour_minor: int
    delivered_mgms: int
    billable_mgms: int
    gross_minor: int  # what the new buyer owes, paid to the desk
    fee_minor: int  # the desk's fee on it, paid by the seller
    proceeds_minor: int  # gross - fee: what the original buyer receives


class BillDoc(Struct, frozen=True, kw_only=True):
    """The whole bill of one placement (every party sees the same lines)."""

    format: str = BILL_FORMAT
    placement_id: str
    renderer: str
    source: str
    currency: str
    currency_scale: int
    parties: dict[str, str]
    terms: list[tuple[str, str]]
    window_start_ms: int
    window_end_ms: int
    effective_end_ms: int
    statement: StatementRef
    record_count: int
    totals: dict[str, int]
    lines: list[Line]
    gpus: list[GpuRow]
    timeline_note: str = ""
    periods: list[Period] = []
    verdict: Verdict
    checkpoint: Checkpoint | None = None
    checks: list[str] = []
    # SPEC §7.10 (empty without resale): each assignment, the original buyer's net after
    # the resale (negative: it receives) and what the desk receives in all.
    resale: list[Resale] = []
    original_buyer_net_minor: int | None = None
    desk_total_minor: int | None = None
    attested: list[Attested] = []  # SPEC §6.9


def encode(doc: BillDoc) -> bytes:
    """The JSON form (stable key order of the Structs)."""
    return msgspec.json.encode(doc)


def decode(raw: bytes) -> BillDoc:
    """Read the JSON form back (the CLI reads a running ledger's ``statement.json``)."""
    return msgspec.json.decode(raw, type=BillDoc)
