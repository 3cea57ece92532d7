"""Test-only export writer for the verifier's tests, and the honest-export tests.

Until the ledger writes exports, tests build their own: signed inputs from
``devtools.builders``, the decision for each input written BY HAND in the scenario (what the
test author reads in SPEC §6), totals from a deliberately plain Python reading of SPEC §7
(``Pricer``, a third implementation, independent of verifier/pricing.py's SQL), and
LedgerRecords, statements and checkpoints signed with the cast's ledger key. The DuckDB
tables follow proto/EXPORT.md.

Other verifier test modules import from here (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    closed,
    gpu,
    key_binding,
    make_cast,
    make_terms,
    reclaim,
    sample,
    signed_terms,
)
from proto.canonical import signed_bytes
from proto.cosign import cosign
from proto.envelope import open_envelope, seal, sha256_hex
from proto.keys import SigningKey
from proto.merkle import root
from proto.note import checkpoint_body, checkpoint_origin, sign_note
from proto.records import (
    ZERO_HASH,
    Adjustment,
    Checkpoint,
    LedgerRecord,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    Statement,
    Totals,
    UsageEvent,
)
from proto.trust import TrustFile, dump_trust
from verifier.findings import Step
from verifier.verify import ExportReport, verify_export

T0 = 1_700_000_000_000
COSIGNED_AT_S = 1_767_300_000
MINUTE = 60_000
HOUR = 60 * MINUTE

TABLES = {
    "terms": "terms",
    "keybinding": "key_bindings",
    "usage": "usage_events",
    "reclaim": "reclaims",
    "adjustment": "adjustments",
    "closed": "closes",
}

DDL = [
    "CREATE TABLE meta(key VARCHAR NOT NULL, value VARCHAR NOT NULL)",
    *[
        f"CREATE TABLE {name}(chain_index BIGINT NOT NULL, position VARCHAR NOT NULL, "
        f"input_hash VARCHAR NOT NULL, envelope BLOB NOT NULL, status VARCHAR NOT NULL, "
        f"reason VARCHAR NOT NULL{extra})"
        for name, extra in (
            ("terms", ""),
            ("key_bindings", ", node_id VARCHAR, valid_from_ms BIGINT, valid_until_ms BIGINT"),
            ("usage_events", ", node_id VARCHAR, seq BIGINT, start_ms BIGINT, end_ms BIGINT"),
            ("reclaims", ", issued_at_ms BIGINT, effective_at_ms BIGINT"),
            ("adjustments", ", direction VARCHAR, amount_minor BIGINT"),
            ("closes", ", closed_at_ms BIGINT"),
        )
    ],
    "CREATE TABLE ledger_records(chain_index BIGINT NOT NULL, envelope BLOB NOT NULL, "
    "record_hash VARCHAR NOT NULL, kind VARCHAR, status VARCHAR, reason VARCHAR, "
    "delivered_mgms BIGINT, gross_minor BIGINT, buyer_owes_minor BIGINT, "
    "operator_receives_minor BIGINT, desk_receives_minor BIGINT)",
    "CREATE TABLE statements(through_index BIGINT NOT NULL, envelope BLOB NOT NULL, "
    "final BOOLEAN, buyer_owes_minor BIGINT, operator_receives_minor BIGINT, "
    "desk_receives_minor BIGINT)",
    "CREATE TABLE checkpoints(size BIGINT NOT NULL, note VARCHAR NOT NULL)",
    "CREATE TABLE held(position VARCHAR NOT NULL, input_hash VARCHAR NOT NULL, "
    "envelope BLOB NOT NULL)",
]

EXTRA_COLUMNS = {
    "terms": (),
    "keybinding": ("node_id", "valid_from_ms", "valid_until_ms"),
    "usage": ("node_id", "seq", "start_ms", "end_ms"),
    "reclaim": ("issued_at_ms", "effective_at_ms"),
    "adjustment": ("direction", "amount_minor"),
    "closed": ("closed_at_ms",),
}


# ---- SPEC §7, plainly -----------------------------------------------------------------


@dataclass
class Pricer:
    """SPEC §7 as a person reads it, one accepted input at a time (test reference)."""

    terms: PlacementTerms
    # A dishonest ledger's reading of §7.1: the ``healthy`` flag alone, evidence ignored.
    trust_the_flag: bool = False
    delivered: int = 0
    # §7.1.1: (node, GPU) -> the highest retired-page count of earlier accepted events.
    retired: dict[tuple[str, str], int] = field(default_factory=dict)
    reclaim_notice: ReclaimNotice | None = None
    reclaim_arrived: int | None = None
    effective_end: int = 0
    credit: int = 0
    charge: int = 0
    sla: int = 0

    def __post_init__(self) -> None:
        self.effective_end = self.terms.window_end_ms

    @property
    def share(self) -> int:
        return sum(g.share_milli for g in self.terms.gpus)

    def event_delivered(self, event: UsageEvent) -> int:
        shares = {g.uuid: g.share_milli for g in self.terms.gpus}
        start = max(self.terms.window_start_ms, 0)
        total = 0
        for s in event.samples:
            baseline = self.retired.get((event.node_id, s.uuid), 0)
            self.retired[(event.node_id, s.uuid)] = max(baseline, s.retired_pages)
            evidence_ok = (
                s.present
                and s.power_mw != 0
                and s.ecc_uncorrectable == 0
                and not {48, 63, 64, 74, 79, 92, 94, 95} & set(s.xids)
                and (event.seq == 0 or s.retired_pages <= baseline)
            )
            if s.allocated and s.healthy and (evidence_ok or self.trust_the_flag):
                lo = max(event.start_ms, start)
                hi = min(event.end_ms, self.effective_end)
                total += shares[s.uuid] * max(0, hi - lo)
        return total

    def gross(self) -> tuple[int, int]:
        unit = self.terms.increment_ms * 1000
        billable = -(-self.delivered // unit) * unit
        return billable, billable * self.terms.rate_per_gpu_hour_minor // 3_600_000_000

    def reclaim_credit(self) -> int:
        r = self.reclaim_notice
        if r is None:
            return 0
        t = self.terms
        # SPEC §7.3, §6.6: the notice runs from the reclaim's arrival (untimed: issued_at).
        start = r.issued_at_ms if self.reclaim_arrived is None else self.reclaim_arrived
        short = max(0, t.reclaim_notice_ms - max(0, r.effective_at_ms - start))
        if t.interruptible:
            taken = max(0, t.window_start_ms + t.minimum_duration_ms - r.effective_at_ms)
        else:
            taken = t.window_end_ms - r.effective_at_ms
        return (
            self.share
            * (short + taken)
            * t.rate_per_gpu_hour_minor
            * t.reclaim_penalty_bps
            // (3_600_000_000 * 10_000)
        )

    def apply(self, record: Any, arrived_ms: int | None = None) -> int:
        """Fold one ACCEPTED input that arrived at ``arrived_ms``; returns its own
        delivered milli-GPU-ms."""
        own = 0
        if isinstance(record, UsageEvent):
            own = self.event_delivered(record)
            self.delivered += own
        elif isinstance(record, ReclaimNotice):
            self.reclaim_notice = record
            self.reclaim_arrived = arrived_ms
            self.effective_end = record.effective_at_ms
        elif isinstance(record, Adjustment):
            if record.direction == "credit":
                self.credit += record.amount_minor
            else:
                self.charge += record.amount_minor
        elif isinstance(record, PlacementClosed):
            span = self.effective_end - self.terms.window_start_ms
            availability = 10_000 if span == 0 else 10_000 * self.delivered // (self.share * span)
            _, gross = self.gross()
            if availability < self.terms.sla_availability_target_bps:
                self.sla = gross * self.terms.sla_credit_bps // 10_000
        return own

    def totals(self) -> Totals:
        billable, gross = self.gross()
        reclaim_credit = self.reclaim_credit()
        credits = min(reclaim_credit + self.sla + self.credit, gross + self.charge)
        net = gross + self.charge - credits
        fee = net * self.terms.desk_fee_bps // 10_000
        buyer = net + fee if self.terms.fee_payer == "buyer" else net
        operator = net - fee if self.terms.fee_payer == "operator" else net
        return Totals(
            delivered_mgms=self.delivered,
            billable_mgms=billable,
            gross_minor=gross,
            reclaim_credit_minor=reclaim_credit,
            sla_credit_minor=self.sla,
            adjustment_credit_minor=self.credit,
            adjustment_charge_minor=self.charge,
            credits_minor=credits,
            net_minor=net,
            fee_minor=fee,
            buyer_owes_minor=buyer,
            operator_receives_minor=operator,
            desk_receives_minor=fee,
        )


# ---- the export writer ------------------------------------------------------------------


@dataclass
class Chained:
    """One chained input: envelope, the hand-written decision, and its ledger record."""

    raw: bytes
    status: str
    reason: str
    record: LedgerRecord | None = None
    record_envelope: bytes = b""
    arrived_ms: int | None = None  # SPEC §6.6; None: an untimed record
    priced_from: int | None = None  # a dishonest ledger pricing a reclaim from this time


@dataclass
class ExportBuilder:
    """Chains inputs with hand-written decisions and writes an EXPORT.md file."""

    cast: Cast
    terms: PlacementTerms
    items: list[Chained] = field(default_factory=list)
    statements_at: list[int] = field(default_factory=list)
    # None: one checkpoint at the head, as the ledger writes every export (SPEC §8).
    checkpoints_at: list[int] | None = None
    # Witnesses on every checkpoint (SPEC §8.2); None: the operator's and the buyer's,
    # what a trust file without a policy requires for a FINAL verdict (SPEC §9).
    cosigners: list[tuple[str, SigningKey]] | None = None
    # When the witnesses cosigned each checkpoint, by size, in seconds (SPEC §8.2); a size
    # not listed: a second after its last record arrived (``_seen_at_s``).
    cosigned_at_s: dict[int, int] = field(default_factory=dict)
    dropped_duplicates: int = 0
    trust_the_flag: bool = False  # price like a ledger that ignores §7.1.1
    # EXPORT.md format_version: "2" records unsigned (SPEC §8); "1" each signed by the ledger.
    format_version: str = "2"
    # SPEC §6.6: the arrival mode the statements sign ("sender": a simulation).
    arrival: str = "log"

    def add(
        self, raw: bytes, status: str = "accepted", reason: str = "", arrived_ms: int | None = None
    ) -> int:
        """Chain one input with the decision the test expects; returns its chain index.
        ``arrived_ms``: the arrival time its record carries (SPEC §6.6)."""
        self.items.append(Chained(raw, status, reason, arrived_ms=arrived_ms))
        return len(self.items) - 1

    def chain(self) -> list[Chained]:
        """Seal a LedgerRecord per input (prices through ``Pricer``); signed in version 1."""
        pricer = Pricer(self.terms, trust_the_flag=self.trust_the_flag)
        prev = ZERO_HASH
        for index, item in enumerate(self.items):
            opened = open_envelope(item.raw)
            accepted = item.status == "accepted"
            at = item.arrived_ms if item.priced_from is None else item.priced_from
            own = pricer.apply(opened.record, at) if accepted else 0
            record = LedgerRecord(
                placement_id=self.terms.placement_id,
                index=index,
                prev=prev,
                kind=opened.kind,  # type: ignore[arg-type]
                source=opened.input_hash,
                status=item.status,  # type: ignore[arg-type]
                reason=item.reason,
                delivered_mgms=own,
                totals=pricer.totals(),
                arrived_ms=item.arrived_ms,
            )
            item.record = record
            signers = [self.cast.ledger] if self.format_version == "1" else []
            item.record_envelope = seal(record, signers)
            prev = sha256_hex(signed_bytes(record))
        return self.items

    def write(self, path: Path) -> Path:
        """Write the export file (overwrites)."""
        items = self.chain()
        if path.exists():
            path.unlink()
        con = duckdb.connect(str(path))
        for ddl in DDL:
            con.execute(ddl)
        meta = {
            "format": "gridledger-export",
            "format_version": self.format_version,
            "placement_id": self.terms.placement_id,
            "ledger_key": base64.b64encode(self.terms.ledger_key).decode(),
            "records": str(len(items)),
            "dropped_duplicates": str(self.dropped_duplicates),
        }
        con.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
        for index, item in enumerate(items):
            opened = open_envelope(item.raw)
            extras = [getattr(opened.record, c) for c in EXTRA_COLUMNS[opened.kind]]
            marks = ", ".join("?" for _ in range(6 + len(extras)))
            con.execute(
                f"INSERT INTO {TABLES[opened.kind]} VALUES ({marks})",
                [
                    index,
                    f"kafka:placements:0:{index}",
                    opened.input_hash,
                    item.raw,
                    item.status,
                    item.reason,
                    *extras,
                ],
            )
            record = item.record
            assert record is not None
            con.execute(
                "INSERT INTO ledger_records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    index,
                    item.record_envelope,
                    sha256_hex(signed_bytes(record)),
                    record.kind,
                    record.status,
                    record.reason,
                    record.delivered_mgms,
                    record.totals.gross_minor,
                    record.totals.buyer_owes_minor,
                    record.totals.operator_receives_minor,
                    record.totals.desk_receives_minor,
                ],
            )
        for through in self.statements_at:
            envelope = self.statement(through)
            record = items[through].record
            assert record is not None
            t = record.totals
            con.execute(
                "INSERT INTO statements VALUES (?, ?, ?, ?, ?, ?)",
                [
                    through,
                    envelope,
                    self.is_final(through),
                    t.buyer_owes_minor,
                    t.operator_receives_minor,
                    t.desk_receives_minor,
                ],
            )
        for size in [len(items)] if self.checkpoints_at is None else self.checkpoints_at:
            con.execute("INSERT INTO checkpoints VALUES (?, ?)", [size, self.checkpoint(size)])
        con.close()
        return path

    def is_final(self, through: int) -> bool:
        return any(
            open_envelope(i.raw).kind == "closed" and i.status == "accepted"
            for i in self.items[: through + 1]
        )

    def statement(self, through: int, key: SigningKey | None = None, **changes: Any) -> bytes:
        """The ledger-signed statement through record ``through``."""
        record = self.items[through].record
        assert record is not None
        close = next(
            (
                i
                for i, item in enumerate(self.items)
                if open_envelope(item.raw).kind == "closed" and item.status == "accepted"
            ),
            None,
        )
        # SPEC §8 statement periods: 0 through the close, each later record its own.
        period = 0 if close is None or through <= close else through - close
        before = self.items[through - 1].record if period else None
        fields: dict[str, Any] = {
            "placement_id": self.terms.placement_id,
            "through_index": through,
            "head": sha256_hex(signed_bytes(record)),
            "currency": self.terms.currency,
            "currency_scale": self.terms.currency_scale,
            "final": self.is_final(through),
            "totals": record.totals,
            "period": period,
            "previous": ZERO_HASH if before is None else sha256_hex(signed_bytes(before)),
            "arrival": self.arrival,
        }
        fields.update(changes)
        return seal(Statement(**fields), [key or self.cast.ledger])

    def checkpoint(self, size: int) -> str:
        """The ledger-signed (and cosigned) checkpoint note of the first ``size`` records."""
        payloads = [signed_bytes(i.record) for i in self.items[:size] if i.record is not None]
        body = checkpoint_body(
            Checkpoint(
                origin=checkpoint_origin(self.terms.placement_id), size=size, root=root(payloads)
            )
        )
        note = sign_note(body, "gridledger-ledger", self.cast.ledger)
        cosigners = self.cosigners
        if cosigners is None:
            # under the parties' ids in the terms (SPEC §8.2)
            cosigners = [
                (self.terms.operator.id, self.cast.operator),
                (self.terms.buyer.id, self.cast.buyer),
            ]
        at_s = self.cosigned_at_s.get(size, _seen_at_s(self.items[:size]))
        for name, key in cosigners:
            note = cosign(note, name, key, at_s)
        return note.text()


def _seen_at_s(items: list[Chained]) -> int:
    """When a witness cosigns a tree of these records by default: a second after the last
    arrived (SPEC §6.6: it bounds their arrival from above and later ones from below), or
    COSIGNED_AT_S for untimed records."""
    arrivals = [i.arrived_ms for i in items if i.arrived_ms is not None]
    return max(arrivals) // 1000 + 1 if arrivals else COSIGNED_AT_S


def write_trust(cast: Cast, path: Path) -> Path:
    """The cast's trust file."""
    path.write_bytes(dump_trust(cast.trust()))
    return path


# ---- scenarios --------------------------------------------------------------------------


@dataclass(repr=False)
class Scenario:
    """A built export with everything a test may want to poke at."""

    cast: Cast
    terms: PlacementTerms
    builder: ExportBuilder
    path: Path
    trust: TrustFile
    trust_path: Path
    expected: dict[str, Any] = field(default_factory=dict)

    def index_of(self, kind: str, status: str | None = None, reason: str | None = None) -> int:
        """The first chain index of an input of ``kind`` (and status / reason if given)."""
        for i, item in enumerate(self.builder.items):
            if open_envelope(item.raw).kind != kind:
                continue
            if status is not None and item.status != status:
                continue
            if reason is not None and item.reason != reason:
                continue
            return i
        raise LookupError(kind)

    def __repr__(self) -> str:
        return f"Scenario({self.terms.placement_id!r}, {self.path.name})"


def full_scenario(
    tmp: Path, name: str = "p-full", seed: str = "verifier-full", **term_overrides: Any
) -> Scenario:
    """Every kind of input and decision: usage accepted and rejected, key rotation,
    reclaim with short notice, adjustments, SLA credit at close, late data after close."""
    cast = make_cast(seed)
    gpus = [gpu("node-a", 0), gpu("node-a", 1), gpu("node-b", 0, share_milli=500)]
    overrides = {"reclaim_penalty_bps": 1000, **term_overrides}
    terms = make_terms(cast, name, gpus, T0, T0 + HOUR, **overrides)
    b = ExportBuilder(cast, terms)
    a = StreamWriter(cast.node_key("node-a"), name, "node-a")
    nb = StreamWriter(cast.node_key("node-b"), name, "node-b")
    b.add(signed_terms(cast, terms))
    # Node a: ten good minutes; one with an unhealthy GPU.
    for m in range(10):
        samples = [sample(gpus[0]), sample(gpus[1], healthy=m != 3)]
        b.add(a.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, samples))
    # Node b: five minutes, then rotates to a new key bound by the operator.
    for m in range(5):
        b.add(nb.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(gpus[2])]))
    new_key = SigningKey.from_seed_text("node-b-2", f"{seed}/rotated")
    b.add(key_binding(cast, name, "node-b", new_key, T0 + 5 * MINUTE, T0 + 2 * HOUR, T0))
    nb.key = new_key
    for m in range(5, 8):
        b.add(nb.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(gpus[2])]))
    # Rejections, each named by SPEC §6.3.
    forged = StreamWriter(SigningKey.from_seed_text("x", "stranger"), name, "node-a", seq=10)
    forged.prev = a.prev
    b.add(
        forged.event(T0 + 10 * MINUTE, T0 + 11 * MINUTE, [sample(gpus[0])]),
        "rejected",
        "NODE_KEY_UNKNOWN",
    )
    # A node's own rejected event takes its seq (SPEC §6.3 usage (3)): node b's last.
    wrong_gpu = StreamWriter(new_key, name, "node-b", seq=nb.seq, prev=nb.prev)
    b.add(
        wrong_gpu.event(T0 + 8 * MINUTE, T0 + 9 * MINUTE, [sample(gpus[0])]),
        "rejected",
        "GPU_NOT_IN_TERMS",
    )
    # Beyond a gap: held in its stream (SPEC §6.2), chained by the close flush below.
    gap = StreamWriter(new_key, name, "node-b", seq=nb.seq + 4, prev=nb.prev)
    gap_event = gap.event(T0 + 12 * MINUTE, T0 + 13 * MINUTE, [sample(gpus[2])])
    for m in range(10, 20):
        b.add(a.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(gpus[0]), sample(gpus[1])]))
    b.add(adjustment(cast, name, "adj-1", "credit", 7, T0 + 20 * MINUTE))
    b.add(
        adjustment(cast, name, "adj-1", "credit", 9, T0 + 20 * MINUTE, reason="again"),
        "rejected",
        "ADJUSTMENT_DUPLICATE",
    )
    b.add(adjustment(cast, name, "adj-2", "charge", 11, T0 + 21 * MINUTE))
    # Reclaim at minute 30 with five minutes' notice (ten agreed): a credit for the short
    # notice and the rest of the window. One earlier attempt behind usage is rejected.
    b.add(
        reclaim(cast, terms, T0 + 10 * MINUTE, T0 + 15 * MINUTE, "rc-0"),
        "rejected",
        "RECLAIM_BEHIND_USAGE",
    )
    b.add(reclaim(cast, terms, T0 + 25 * MINUTE, T0 + 30 * MINUTE, "rc-1"))
    # Usage after the effective end: accepted, delivers nothing.
    b.add(a.event(T0 + 30 * MINUTE, T0 + 31 * MINUTE, [sample(gpus[0])]))
    b.add(closed(cast, name, T0 + HOUR), "rejected", "CLOSE_INVALID")
    b.add(gap_event, "rejected", "SEQ_GAP")  # the close flush
    b.add(closed(cast, name, T0 + HOUR + terms.late_grace_ms))
    # Late data: usage after the close is kept, not folded; an adjustment still folds.
    b.add(a.event(T0 + 31 * MINUTE, T0 + 32 * MINUTE, [sample(gpus[0])]), "rejected", "AFTER_CLOSE")
    b.add(adjustment(cast, name, "adj-3", "credit", 5, T0 + 2 * HOUR))
    n = len(b.items)
    b.statements_at = [14, n - 3, n - 1]
    b.checkpoints_at = [1, 14, n]
    path = b.write(tmp / f"{name}.duckdb")
    trust_path = write_trust(cast, tmp / f"{name}-trust.json")
    return Scenario(cast, terms, b, path, cast.trust(), trust_path)


def small_scenario(
    tmp: Path,
    name: str = "p-small",
    seed: str = "verifier-small",
    minutes: int = 5,
    rate: int = 250,
    window_ms: int = HOUR,
    gpu_index: int = 0,
    **overrides: Any,
) -> Scenario:
    """Terms, a few minutes of one GPU, a close: the smallest honest export.

    ``gpu_index``: which GPU of node-a (placements read together must not oversell one
    GPU, SPEC §6.5)."""
    cast = make_cast(seed)
    gpus = [gpu("node-a", gpu_index)]
    terms = make_terms(
        cast, name, gpus, T0, T0 + window_ms, rate_per_gpu_hour_minor=rate, **overrides
    )
    b = ExportBuilder(cast, terms)
    a = StreamWriter(cast.node_key("node-a"), name, "node-a")
    b.add(signed_terms(cast, terms))
    for m in range(minutes):
        b.add(a.event(T0 + m * MINUTE, T0 + (m + 1) * MINUTE, [sample(gpus[0])]))
    b.add(closed(cast, name, terms.window_end_ms + terms.late_grace_ms))
    b.statements_at = [len(b.items) - 1]
    b.checkpoints_at = [len(b.items)]
    path = b.write(tmp / f"{name}.duckdb")
    return Scenario(
        cast, terms, b, path, cast.trust(), write_trust(cast, tmp / f"{name}-trust.json")
    )


def verify(path: Path, trust: TrustFile) -> ExportReport:
    """Verify inline (no pool): what most tests need."""
    from verifier.workers import OpenPool

    with OpenPool[Any]("inline") as pool:
        return verify_export(path, trust, pool=pool)


def explain(report: ExportReport) -> str:
    """Every kept finding, for assertion messages."""
    return "\n".join(f.line() for f in report.findings.kept) or "(no findings)"


# ---- tests of honest exports ----------------------------------------------------------


def test_full_honest_export_verifies(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    report = verify(s.path, s.trust)
    assert report.ok, explain(report)
    last = s.builder.items[-1].record
    assert last is not None
    # The recomputed head totals are exactly the ledger's (Pricer's) last totals.
    assert report.totals == {k: getattr(last.totals, k) for k in report.totals}
    assert report.final
    assert report.head_index == len(s.builder.items) - 1
    # The scenario exercises the interesting terms: reclaim credit, SLA credit, adjustments.
    t = last.totals
    assert t.reclaim_credit_minor > 0 and t.sla_credit_minor > 0
    assert t.adjustment_credit_minor == 12 and t.adjustment_charge_minor == 11
    rejected = sum(1 for i in s.builder.items if i.status == "rejected")
    assert report.counts["decided.rejected"] == rejected
    assert report.counts["decided.accepted"] == len(s.builder.items) - rejected
    assert report.counts["statements"] == 3 and report.counts["checkpoints"] == 3
    parties = [s.cast.operator.name, s.cast.buyer.name]
    assert all(c["cosigned_by"] == parties for c in report.checkpoints)
    # Step (10): closed, final statement last, witnessed by both (the default policy).
    assert report.is_final and report.witnessed_by == parties and report.provisional == []


def test_small_honest_export_verifies_with_exact_amounts(tmp_path: Path) -> None:
    # 5 GPU-minutes at 250 minor/GPU-hour: D = 1000 * 5 * 60_000 mgms; B = D (whole
    # minutes); G = floor(B * 250 / 3.6e9) = 20; fee 5% paid by the operator = 1.
    # Availability 5/60 < 99%: SLA credit 10% of G = 2. N = 18, F = 0 (floor 0.9).
    s = small_scenario(tmp_path)
    report = verify(s.path, s.trust)
    assert report.ok, explain(report)
    assert report.totals is not None
    assert report.totals["delivered_mgms"] == 1000 * 5 * MINUTE
    assert report.totals["gross_minor"] == 20
    assert report.totals["sla_credit_minor"] == 2
    assert report.totals["buyer_owes_minor"] == 18
    assert report.totals["desk_receives_minor"] == 0
    assert report.totals["operator_receives_minor"] == 18


def test_wide_products_do_not_overflow(tmp_path: Path) -> None:
    # The largest rate and a long window: B x rate passes 2^64 and must stay exact.
    window_ms = 100 * HOUR
    s = small_scenario(
        tmp_path, minutes=3, rate=3_600_000_000, window_ms=window_ms, increment_ms=window_ms
    )
    report = verify(s.path, s.trust)
    assert report.ok, explain(report)
    assert report.totals is not None
    billable = window_ms * 1000
    assert billable * 3_600_000_000 > 2**64
    assert report.totals["gross_minor"] == billable * 3_600_000_000 // 3_600_000_000


def test_buyer_pays_fee(tmp_path: Path) -> None:
    s = small_scenario(tmp_path, minutes=30, fee_payer="buyer", desk_fee_bps=1000)
    report = verify(s.path, s.trust)
    assert report.ok, explain(report)
    t = report.totals
    assert t is not None
    assert t["buyer_owes_minor"] == t["net_minor"] + t["fee_minor"] > t["operator_receives_minor"]


@pytest.mark.parametrize("direction", ["credit", "charge"])
@pytest.mark.parametrize("below", [0, 1])
def test_adjustment_past_the_bounds_is_re_derived(
    tmp_path: Path, direction: str, below: int
) -> None:
    """SPEC §7.7: an adjustment after which Ac > 2^53 - 1 or P(M + Ah) > 2^53 - 1 is
    rejected ADJUSTMENT_INVALID; the verifier decides it from the terms on its own
    (``verifier/terms_rules.adjustment_bounded``). The first one takes its sum to the
    limit less ``below``; the ledger here always rejects the second (+1): right at the
    limit, wrong below it (the sum then reaches the limit exactly, which is allowed)."""
    cast = make_cast("verifier-adjustment-bound")
    name = "p-adj-bound"
    gpus = [gpu("node-a", 0)]
    terms = make_terms(cast, name, gpus, T0, T0 + HOUR, desk_fee_bps=0)
    # M: one GPU for the hour at the terms' rate, plus one increment (SPEC §7.7)
    ceiling = (1000 * HOUR + terms.increment_ms * 1000) * terms.rate_per_gpu_hour_minor
    limit = 2**53 - 1 - (0 if direction == "credit" else ceiling // 3_600_000_000)
    first = limit - below
    b = ExportBuilder(cast, terms)
    b.add(signed_terms(cast, terms))
    b.add(adjustment(cast, name, "adj-first", direction, first, T0))
    b.add(
        adjustment(cast, name, "adj-one-more", direction, 1, T0), "rejected", "ADJUSTMENT_INVALID"
    )
    b.add(closed(cast, name, terms.window_end_ms + terms.late_grace_ms))
    b.statements_at = [len(b.items) - 1]
    b.checkpoints_at = [len(b.items)]
    path = b.write(tmp_path / f"{name}.duckdb")
    report = verify(path, cast.trust())
    if first == limit:
        assert report.ok, explain(report)
        assert report.counts["decided.rejected"] == 1
        return
    found = [f for f in report.findings.kept if f.step == Step.DECISIONS]
    assert [(f.rule, f.expected, f.actual) for f in found] == [
        ("ADJUSTMENT_INVALID", "accepted", "rejected ADJUSTMENT_INVALID")
    ], explain(report)


def test_sha256_of_envelope_is_input_hash(tmp_path: Path) -> None:
    # Guard the helper itself: the export it writes follows EXPORT.md's hash rule.
    s = small_scenario(tmp_path)
    con = duckdb.connect(str(s.path), read_only=True)
    rows = con.execute("SELECT input_hash, envelope FROM usage_events").fetchall()
    con.close()
    assert rows and all(h == hashlib.sha256(bytes(e)).hexdigest() for h, e in rows)


__all__: Sequence[str] = (
    "ExportBuilder",
    "Pricer",
    "Scenario",
    "explain",
    "full_scenario",
    "small_scenario",
    "verify",
    "write_trust",
)
