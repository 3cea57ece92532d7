"""Verify one export offline: the checklist, step by step (SPEC.md, EXPORT.md).

    (1) format      meta.format is gridledger-export, meta.format_version is 1 (else the
                    input is unusable: exit 2)
    (2) trust       the trust file names which keys belong to which party and role
    (3) terms       exactly one accepted terms row, signed by its three parties, each party
                    key pinned under that role, its ledger_key pinned as a ledger key
    (4) envelopes   every envelope decodes canonically; input_hash = SHA-256(envelope)
    (5) columns     every convenience column equals the value decoded from its envelope
    (6) chain       ledger_records 0..n-1 contiguous, each a canonical LedgerRecord signed by
                    the trusted ledger key only; prev, placement, source, kind, status and
                    reason right; every chain index in exactly one input table
    (7) decisions   every decision re-derived from SPEC §6 (``verifier/decisions.py``) and
                    compared with the ledger's status and reason
    (8) merkle      each checkpoint: origin, size, RFC 9162 root of the record payloads,
                    signed by the ledger key; cosignatures of the parties checked
    (9) obligation  every total of SPEC §7 recomputed in SQL (``verifier/pricing.py``) and
                    compared with every LedgerRecord and every statement

Library code: returns an ``ExportReport``, never exits. Unusable input is reported with
verdict ``unusable``; anything readable that does not check out is a finding.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb
import structlog

from proto.envelope import Envelope, check_signatures, decode_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.merkle import leaf_hash
from proto.note import checkpoint_origin, parse_checkpoint_body, parse_note
from proto.records import (
    ZERO_HASH,
    Adjustment,
    LedgerRecord,
    NodeKeyBinding,
    PlacementClosed,
    PlacementTerms,
    ReclaimNotice,
    Statement,
    UsageEvent,
)
from proto.terms import party_keys
from proto.trust import TrustFile
from verifier import limits
from verifier.decisions import (
    ACCEPTED,
    PENDING,
    REJECTED,
    PendingAdjustment,
    Referee,
    Verdict,
    settle_adjustments,
)
from verifier.errors import UnusableInput
from verifier.findings import Findings, Step
from verifier.merkle_stream import CompactRange
from verifier.opener import OpenResult, open_one
from verifier.pricing import (
    TOTAL_FIELDS,
    base_at,
    compute_base,
    compute_totals,
    create_work_tables,
    load_terms,
    record_mismatches,
    settle_amounts,
    totals_at,
)
from verifier.progress import Progress
from verifier.signers import required_of, signer_failure
from verifier.source import (
    ALIAS,
    EXPORT_FORMAT,
    EXPORT_FORMAT_VERSION,
    INPUT_TABLES,
    TABLE_OF_KIND,
    Batch,
    ExportSource,
    InputRow,
    RecordRow,
    blob,
)
from verifier.workers import OpenPool

log = structlog.get_logger(__name__)

LEDGER_NOTE_NAME: Final = "gridledger-ledger"
_MISSING_LEAF: Final = leaf_hash(b"")  # stands in for a record that is missing or unreadable

VERIFIED: Final = "verified"
FAILED: Final = "failed"
UNUSABLE: Final = "unusable"


@dataclass
class ExportReport:
    """The outcome of verifying one export."""

    path: str
    verdict: str = FAILED
    error: str = ""
    placement_id: str = ""
    findings: Findings = field(default_factory=Findings)
    totals: dict[str, int] | None = None
    head_index: int | None = None
    final: bool = False
    currency: str = ""
    currency_scale: int = 0
    parties: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the export verified."""
        return self.verdict == VERIFIED


def verify_export(
    path: Path,
    trust: TrustFile,
    *,
    pool: OpenPool[Any] | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Run the whole checklist on one export file; see the module docstring."""
    started = time.monotonic()
    report = ExportReport(path=str(path))
    own_pool = pool is None
    try:
        with ExportSource(path) as source:
            if pool is None:
                pool = _pool_for(source)
            _Run(source, trust, report, pool, progress or Progress(enabled=False)).run()
    except UnusableInput as exc:
        report.verdict = UNUSABLE
        report.error = exc.detail
    except duckdb.Error as exc:  # a damaged file that attached but cannot be read
        report.verdict = UNUSABLE
        report.error = f"DuckDB cannot read it: {exc}"
    except Exception as exc:  # a verifier bug must not pass for a verdict, nor crash a batch run
        log.error("verifier error", path=str(path), exc_info=True)
        report.findings.add(
            Step.FORMAT,
            "VERIFIER_ERROR",
            str(path),
            "a completed verification",
            type(exc).__name__,
            f"internal error, the export is NOT verified: {exc}",
        )
    finally:
        if own_pool and pool is not None:
            pool.close()
    if report.verdict != UNUSABLE:
        report.verdict = FAILED if report.findings else VERIFIED
    report.elapsed_s = time.monotonic() - started
    log.info(
        "export verified",
        path=str(path),
        verdict=report.verdict,
        findings=report.findings.total,
        elapsed_s=round(report.elapsed_s, 3),
    )
    return report


def _pool_for(source: ExportSource) -> OpenPool[Any]:
    rows = source.count("ledger_records") + source.count("usage_events")
    return OpenPool("thread" if rows >= limits.MIN_ROWS_FOR_POOL else "inline")


class _Run:
    """One verification of one export: state shared by the steps."""

    def __init__(
        self,
        source: ExportSource,
        trust: TrustFile,
        report: ExportReport,
        pool: OpenPool[Any],
        progress: Progress,
    ) -> None:
        self.source = source
        self.con: Any = source.con
        self.trust = trust
        self.report = report
        self.findings = report.findings
        self.pool = pool
        self.progress = progress
        self.terms: PlacementTerms | None = None
        self.ledger_key = b""
        self.placement_id = ""
        self.counts: dict[str, int] = {}
        self.checkpoint_sizes: set[int] = set()
        self.roots: dict[int, bytes] = {}
        self.record_count = 0
        self.pending_claims: dict[int, tuple[Verdict, str]] = {}

    def add(
        self, step: Step, rule: str, where: str, expected: object, actual: object, msg: str
    ) -> None:
        """Shorthand for one finding."""
        self.findings.add(step, rule, where, expected, actual, msg)

    def bump(self, name: str, n: int = 1) -> None:
        """Count something for the report."""
        self.counts[name] = self.counts.get(name, 0) + n

    # ---- the checklist ----------------------------------------------------------------

    def run(self) -> None:
        """Steps (1) to (9), in order."""
        self.check_format()  # (1)
        self.check_sizes()  # (1) small tables small enough to check whole
        self.check_trust()  # (2)
        if not self.check_terms():  # (3)
            self.report.counts = self.counts
            return
        create_work_tables(self.con)
        assert self.terms is not None
        load_terms(self.con, self.terms)
        self.check_chain_sets()  # (6), the set-based half
        self.read_checkpoint_sizes()
        self.walk()  # (4) (5) (6) (7) (8 roots), per chain index
        self.check_held()  # (7) for inputs still held
        self.settle()  # (7) adjustments, (9) totals vs records
        self.check_statements()  # (9) statements
        self.check_checkpoints()  # (8)
        self.summarise()

    # (1) format ------------------------------------------------------------------------

    def check_format(self) -> None:
        """(1) meta.format and meta.format_version; anything else is unusable (exit 2)."""
        meta = self.source.meta
        if meta.get("format") != EXPORT_FORMAT:
            raise UnusableInput(
                str(self.source.path),
                f"meta.format is {meta.get('format')!r}, want {EXPORT_FORMAT!r}",
            )
        if meta.get("format_version") != EXPORT_FORMAT_VERSION:
            raise UnusableInput(
                str(self.source.path),
                f"meta.format_version is {meta.get('format_version')!r}, "
                f"this verifier reads {EXPORT_FORMAT_VERSION!r}",
            )

    def check_sizes(self) -> None:
        """(1) tables read whole must fit their bound: rows past it would go unchecked."""
        for table in ("terms", "key_bindings", "statements", "checkpoints", "held"):
            rows = self.source.count(table)
            if rows > limits.MAX_SMALL_TABLE_ROWS:
                self.add(
                    Step.FORMAT,
                    "TABLE_TOO_LARGE",
                    table,
                    f"<= {limits.MAX_SMALL_TABLE_ROWS} rows",
                    rows,
                    "rows beyond the bound are not checked, so the export cannot verify",
                )

    # (2) trust -------------------------------------------------------------------------

    def check_trust(self) -> None:
        """(2) the trust file must pin at least one ledger key, and no key in two roles."""
        if not self.trust.keys_for("ledger"):
            self.add(
                Step.TRUST,
                "TRUST_NO_LEDGER",
                "trust file",
                "a pinned ledger key",
                "none",
                "nothing an export says can be checked without a trusted ledger key",
            )
        roles: dict[bytes, set[str]] = {}
        for entry in self.trust.keys:
            roles.setdefault(entry.key, set()).add(entry.role)
        for key, held in roles.items():
            if len(held) > 1:
                self.add(
                    Step.TRUST,
                    "TRUST_KEY_TWO_ROLES",
                    f"trust key {key_id(key)}",
                    "one role",
                    ", ".join(sorted(held)),
                    "SPEC §5: the parties and the ledger hold distinct keys",
                )

    # (3) terms -------------------------------------------------------------------------

    def check_terms(self) -> bool:
        """(3) exactly one accepted terms row, signed by its parties, every key pinned.

        Returns False when no terms can be read at all (nothing further can be checked).
        """
        rows = self.source.small_table("terms", "chain_index, envelope, status", "chain_index")
        accepted = [r for r in rows if r[2] == ACCEPTED]
        if len(accepted) != 1:
            self.add(
                Step.TERMS,
                "TERMS_ACCEPTED_COUNT",
                "terms",
                1,
                len(accepted),
                "an export has exactly one accepted terms row",
            )
        chosen: tuple[int, PlacementTerms, Envelope] | None = None
        for index, raw, _ in accepted + [r for r in rows if r[2] != ACCEPTED]:
            try:
                envelope = decode_envelope(blob(raw))
                opened = open_one(0, blob(raw), {})
            except ProtoError:
                continue
            if isinstance(opened.record, PlacementTerms):
                chosen = (int(index), opened.record, envelope)
                break
        if chosen is None:
            for index, raw, _ in rows:
                opened = open_one(0, blob(raw), {})
                self.add(
                    Step.ENVELOPES,
                    opened.error or "KIND_MISMATCH",
                    f"terms chain_index {index}",
                    "a canonical PlacementTerms envelope",
                    opened.error or opened.kind,
                    opened.detail,
                )
            self.add(
                Step.TERMS,
                "TERMS_MISSING",
                "terms",
                "readable terms",
                "none",
                "no terms row decodes: nothing else can be checked",
            )
            return False
        index, terms, envelope = chosen
        where = f"terms chain_index {index}"
        failure = check_signatures(envelope, party_keys(terms)).failure()
        if failure is not None:
            self.add(
                Step.TERMS,
                "TERMS_SIGNATURES",
                where,
                "signed by operator, buyer and desk",
                failure.reason.value,
                failure.detail,
            )
        for role in ("operator", "buyer", "desk"):
            party = getattr(terms, role)
            pinned = self.trust.party_of(party.key, role)
            if pinned is None:
                self.add(
                    Step.TERMS,
                    "TERMS_KEY_NOT_PINNED",
                    where,
                    f"{role} key pinned in the trust file",
                    f"{party.id} key {key_id(party.key)} not pinned as {role}",
                    "terms are trusted only when each party key is pinned under its role",
                )
            self.report.parties[role] = party.id
        if self.trust.party_of(terms.ledger_key, "ledger") is None:
            self.add(
                Step.TERMS,
                "TERMS_LEDGER_NOT_PINNED",
                where,
                "ledger_key pinned as a ledger key",
                f"key {key_id(terms.ledger_key)} not pinned",
                "records, statements and checkpoints are trusted only under a pinned ledger key",
            )
        self.terms = terms
        self.ledger_key = terms.ledger_key
        self.placement_id = terms.placement_id
        self.report.placement_id = terms.placement_id
        self.report.currency = terms.currency
        self.report.currency_scale = terms.currency_scale
        # (5) for meta: its convenience values must match the terms.
        meta = self.source.meta
        for key, expected in (
            ("placement_id", terms.placement_id),
            ("ledger_key", base64.b64encode(terms.ledger_key).decode()),
        ):
            if meta.get(key) != expected:
                self.add(
                    Step.COLUMNS,
                    "META_COLUMN",
                    f"meta.{key}",
                    expected,
                    meta.get(key),
                    "meta disagrees with the accepted terms",
                )
        return True

    # (6) chain, set-based ----------------------------------------------------------------

    def check_chain_sets(self) -> None:
        """(6) contiguity and the one-input-per-index rule, as SQL over the export."""
        x = ALIAS
        self.record_count = self.source.count("ledger_records")
        meta_records = self.source.meta.get("records")
        if meta_records != str(self.record_count):
            self.add(
                Step.COLUMNS,
                "META_COLUMN",
                "meta.records",
                self.record_count,
                meta_records,
                "meta.records is not the number of ledger_records rows",
            )
        self._set_check(
            "CHAIN_DUPLICATE_INDEX",
            f"SELECT chain_index, count(*) FROM {x}.ledger_records GROUP BY 1 HAVING count(*) > 1",
            lambda r: (
                f"ledger_records[{r[0]}]",
                "one record",
                f"{r[1]} records",
                "two records claim one chain index",
            ),
        )
        self._set_check(
            "CHAIN_GAP",
            f"""SELECT lo, hi FROM (
                  SELECT chain_index + 1 AS lo,
                         lead(chain_index) OVER (ORDER BY chain_index) - 1 AS hi
                  FROM (SELECT DISTINCT chain_index FROM {x}.ledger_records
                        UNION SELECT -1)) WHERE hi >= lo""",
            lambda r: (
                f"ledger_records[{r[0]}..{r[1]}]",
                "contiguous indices from 0",
                "missing",
                "the chain has a hole: records were deleted or never exported",
            ),
        )
        self._set_check(
            "CHAIN_INDEX_RANGE",
            f"SELECT chain_index FROM ({self.source.all_indices_sql()}) WHERE chain_index < 0",
            lambda r: (f"chain_index {r[0]}", ">= 0", r[0], "negative chain index"),
        )
        self._set_check(
            "CHAIN_INDEX_NULL",
            f"SELECT 'NULL' FROM ({self.source.all_indices_sql()}) WHERE chain_index IS NULL",
            lambda r: ("chain_index NULL", "an index", "NULL", "a row without a chain index"),
        )
        tagged = " UNION ALL ".join(
            f"SELECT chain_index, '{t.name}' AS tbl FROM {x}.{t.name}" for t in INPUT_TABLES
        )
        self._set_check(
            "CHAIN_INPUT_DUPLICATE",
            f"SELECT chain_index, string_agg(tbl, ',' ORDER BY tbl), count(*) FROM ({tagged}) "
            "GROUP BY 1 HAVING count(*) > 1",
            lambda r: (
                f"chain_index {r[0]}",
                "exactly one input row",
                f"{r[2]} rows in {r[1]}",
                "every chain index appears in exactly one input table",
            ),
        )
        self._set_check(
            "CHAIN_INPUT_MISSING",
            f"SELECT DISTINCT chain_index FROM {x}.ledger_records "
            # NOT IN over a set holding NULL is never true: keep NULLs out of the set.
            f"WHERE chain_index NOT IN (SELECT chain_index FROM ({tagged}) "
            "WHERE chain_index IS NOT NULL)",
            lambda r: (
                f"ledger_records[{r[0]}]",
                "an input row",
                "none",
                "a record whose input is not in the export",
            ),
        )
        self._set_check(
            "CHAIN_RECORD_MISSING",
            f"SELECT DISTINCT chain_index FROM ({tagged}) "
            f"WHERE chain_index NOT IN (SELECT chain_index FROM {x}.ledger_records "
            "WHERE chain_index IS NOT NULL)",
            lambda r: (
                f"chain_index {r[0]}",
                "a ledger record",
                "none",
                "an input without its ledger record (truncated or deleted)",
            ),
        )

    def _set_check(self, rule: str, sql: str, describe: Any) -> None:
        count = int(self.source.scalar(f"SELECT count(*) FROM ({sql})"))
        if not count:
            return
        self.findings.count(rule, count)
        for row in self.con.execute(
            f"{sql} ORDER BY 1 LIMIT {limits.MAX_MISMATCH_ROWS}"
        ).fetchall():
            where, expected, actual, message = describe(row)
            self.findings.add(Step.CHAIN, rule, where, expected, actual, message, counted=True)

    # (8) checkpoint sizes, read before the walk -------------------------------------------

    def read_checkpoint_sizes(self) -> None:
        """Sizes named inside the notes (not the size column), so the walk keeps those roots."""
        for (note_text,) in self.source.small_table("checkpoints", "note", "size"):
            try:
                body = parse_checkpoint_body(parse_note(str(note_text)).body)
            except ProtoError:
                continue
            self.checkpoint_sizes.add(body.size)

    # (4) (5) (6) (7) per chain index --------------------------------------------------------

    def keyring(self) -> dict[str, list[bytes]]:
        """Every key an envelope of this export may be verified against."""
        assert self.terms is not None
        keys: set[bytes] = {self.ledger_key, *(n.key for n in self.terms.nodes)}
        keys.update(p.key for p in (self.terms.operator, self.terms.buyer, self.terms.desk))
        for (raw,) in self.source.small_table("key_bindings", "envelope", "chain_index"):
            opened = open_one(0, blob(raw), {})
            if isinstance(opened.record, NodeKeyBinding):
                keys.add(opened.record.key)
        ring: dict[str, list[bytes]] = {}
        for key in keys:
            ring.setdefault(key_id(key), []).append(key)
        return ring

    def duplicate_indices(self) -> set[int]:
        """Chain indices whose envelope bytes equal those of an earlier chained input."""
        union = " UNION ALL ".join(
            f"SELECT chain_index, rowid AS r, '{t.name}' AS tbl, sha256(envelope) AS h "
            f"FROM {ALIAS}.{t.name}"
            for t in INPUT_TABLES
        )
        rows = self.con.execute(
            f"SELECT chain_index FROM (SELECT chain_index, row_number() OVER "
            f"(PARTITION BY h ORDER BY chain_index, tbl, r) AS n FROM ({union})) WHERE n > 1"
        ).fetchall()
        return {int(r[0]) for r in rows}

    def walk(self) -> None:
        """Stream every chain index in order through the pool and the per-index checks."""
        assert self.terms is not None
        self.duplicates = self.duplicate_indices()
        self.referee = Referee(self.placement_id, self.ledger_key, self._lookup_usage)
        self.compact = CompactRange()
        self.prev_index = -1
        self.prev_hash = ""
        self.max_leaf_size = max(self.checkpoint_sizes, default=0)
        if 0 in self.checkpoint_sizes:
            self.roots[0] = self.compact.root()
        self.close_index: int | None = None
        self.usage_app: Any = self.con.appender("w_usage")
        self.sample_app: Any = self.con.appender("w_samples")
        self.record_app: Any = self.con.appender("w_records")
        self.usage_buffer: list[tuple[Any, ...]] = []
        self.sample_buffer: list[tuple[Any, ...]] = []
        self.record_buffer: list[tuple[Any, ...]] = []
        self.progress.start(self.source.path.name, self.record_count)
        done = 0
        for batch, results in self.pool.run(self._batch_rows(), self.keyring()):
            self._check_batch(batch, results)
            self._flush_buffers()
            done += len(batch.records)
            self.progress.update(done)
        self.progress.finish()
        self._flush_buffers()

    def _flush_buffers(self) -> None:
        """Append what the last batch produced to the work tables (one call per table)."""
        for app, buffer in (
            (self.usage_app, self.usage_buffer),
            (self.sample_app, self.sample_buffer),
            (self.record_app, self.record_buffer),
        ):
            if buffer:
                app.append_rows(buffer)
                app.flush()
                buffer.clear()

    def _batch_rows(self) -> Iterator[tuple[Batch, list[tuple[int, bytes]]]]:
        for batch in self.source.batches():
            rows = [(i, r.envelope) for i, r in enumerate(batch.records)]
            base = len(rows)
            rows += [(base + i, r.envelope) for i, r in enumerate(batch.inputs)]
            yield batch, rows

    def _lookup_usage(self, node_id: str, seq: int) -> str | None:
        self._flush_buffers()
        rows = self.con.execute(
            "SELECT record_hash FROM w_usage WHERE node_id = ? AND seq = ? LIMIT 1", [node_id, seq]
        ).fetchall()
        row = rows[0] if rows else None
        return None if row is None else str(row[0])

    def _check_batch(self, batch: Batch, results: list[OpenResult]) -> None:
        n_records = len(batch.records)
        records: dict[int, tuple[RecordRow, OpenResult]] = {
            row.chain_index: (row, results[i]) for i, row in enumerate(batch.records)
        }
        inputs: dict[int, list[tuple[InputRow, OpenResult]]] = {}
        for i, row in enumerate(batch.inputs):
            inputs.setdefault(row.chain_index, []).append((row, results[n_records + i]))
        for index in sorted(records.keys() | inputs.keys()):
            self._check_index(index, records.get(index), inputs.get(index))

    def _check_index(
        self,
        index: int,
        record_pair: tuple[RecordRow, OpenResult] | None,
        input_pairs: list[tuple[InputRow, OpenResult]] | None,
    ) -> None:
        ledger: LedgerRecord | None = None
        if record_pair is not None:
            ledger = self._check_record(index, *record_pair)
        elif index >= 0:
            self._leaf(index, _MISSING_LEAF)
        chosen: tuple[InputRow, OpenResult] | None = None
        if input_pairs:
            chosen = input_pairs[0]
            if ledger is not None:
                chosen = next((p for p in input_pairs if p[0].kind == ledger.kind), chosen)
            self._check_input(*chosen)
        if ledger is not None:
            self._check_link(index, ledger, chosen)
        if chosen is not None:
            self._decide(index, ledger, *chosen)

    # a LedgerRecord row: (4), (5), (6) ---------------------------------------------------

    def _leaf(self, index: int, leaf: bytes) -> None:
        """Append the leaf of ``index`` (filling holes) while a checkpoint still needs it."""
        while self.compact.size <= index and self.compact.size < self.max_leaf_size:
            self.compact.append(leaf if self.compact.size == index else _MISSING_LEAF)
            if self.compact.size in self.checkpoint_sizes:
                self.roots[self.compact.size] = self.compact.root()

    def _check_record(self, index: int, row: RecordRow, opened: OpenResult) -> LedgerRecord | None:
        self.bump("records")
        where = row.where
        if opened.error:
            self.add(
                Step.ENVELOPES,
                opened.error,
                where,
                "a canonical LedgerRecord envelope",
                opened.error,
                opened.detail,
            )
            self._leaf(index, _MISSING_LEAF)
            self.prev_index = -1
            return None
        self.bump("signatures", len(opened.sigs))
        self._leaf(index, opened.leaf)
        record = opened.record
        if not isinstance(record, LedgerRecord):
            self.add(
                Step.CHAIN,
                "CHAIN_NOT_RECORD",
                where,
                "a LedgerRecord",
                opened.kind,
                "ledger_records holds an envelope of another kind",
            )
            self.prev_index = -1
            return None
        # (5) convenience columns against the envelope.
        totals = record.totals
        expected_columns = (
            opened.record_hash,
            record.kind,
            record.status,
            record.reason,
            record.delivered_mgms,
            totals.gross_minor,
            totals.buyer_owes_minor,
            totals.operator_receives_minor,
            totals.desk_receives_minor,
        )
        names = (
            "record_hash",
            "kind",
            "status",
            "reason",
            "delivered_mgms",
            "gross_minor",
            "buyer_owes_minor",
            "operator_receives_minor",
            "desk_receives_minor",
        )
        if expected_columns != row.columns:  # one tuple compare on the hot path
            self._column_findings(where, names, expected_columns, row.columns)
        # (6) the chain.
        failure = signer_failure(opened.sigs, self.referee.ledger_required)
        if failure is not None:
            self.add(
                Step.CHAIN,
                "CHAIN_SIGNATURE",
                where,
                "signed by the trusted ledger key only",
                failure.value,
                "a record must carry exactly the ledger's valid signature",
            )
        if record.index != index:
            self.add(
                Step.CHAIN,
                "CHAIN_INDEX",
                where,
                index,
                record.index,
                "the record's own index differs from its chain position",
            )
        if record.placement_id != self.placement_id:
            self.add(
                Step.CHAIN,
                "CHAIN_PLACEMENT",
                where,
                self.placement_id,
                record.placement_id,
                "a record of another placement",
            )
        if index == 0 and record.prev != ZERO_HASH:
            self.add(
                Step.CHAIN,
                "CHAIN_PREV",
                where,
                ZERO_HASH,
                record.prev,
                "the first record links to ZERO_HASH",
            )
        elif index > 0 and self.prev_index == index - 1 and record.prev != self.prev_hash:
            self.add(
                Step.CHAIN,
                "CHAIN_PREV",
                where,
                self.prev_hash,
                record.prev,
                "prev is not the record hash of the previous record",
            )
        self.prev_index, self.prev_hash = index, opened.record_hash
        self.record_buffer.append(
            (
                index,
                opened.record_hash,
                record.delivered_mgms,
                *(getattr(totals, name) for name in TOTAL_FIELDS),
            )
        )
        return record

    def _column_findings(
        self, where: str, names: tuple[str, ...], wanted: tuple[Any, ...], have: tuple[Any, ...]
    ) -> None:
        for name, want, got in zip(names, wanted, have, strict=True):
            if want != got:
                self.add(
                    Step.COLUMNS,
                    "COLUMN_MISMATCH",
                    f"{where}.{name}",
                    want,
                    got,
                    "a convenience column disagrees with the signed envelope",
                )

    # an input row: (4), (5) ------------------------------------------------------------

    def _check_input(self, row: InputRow, opened: OpenResult) -> None:
        self.bump(f"inputs.{row.kind}")
        where = row.where
        if opened.error:
            self.add(
                Step.ENVELOPES,
                opened.error,
                where,
                "a canonical envelope",
                opened.error,
                opened.detail,
            )
        else:
            self.bump("signatures", len(opened.sigs))
        if row.input_hash != opened.input_hash:
            self.add(
                Step.ENVELOPES,
                "INPUT_HASH",
                f"{where}.input_hash",
                opened.input_hash,
                row.input_hash,
                "input_hash is not the SHA-256 of the envelope bytes",
            )
        record = opened.record
        if record is None:
            return
        if opened.kind != row.kind:
            self.add(
                Step.COLUMNS,
                "TABLE_KIND",
                where,
                row.kind,
                opened.kind,
                f"a {opened.kind} envelope in table {row.table}",
            )
            return
        extras = TABLE_OF_KIND[row.kind].extras
        wanted = tuple(getattr(record, name) for name, _ in extras)
        if wanted != row.extras:
            self._column_findings(where, tuple(n for n, _ in extras), wanted, row.extras)

    # the link between a record and its input: (6) -----------------------------------------

    def _check_link(
        self, index: int, ledger: LedgerRecord, chosen: tuple[InputRow, OpenResult] | None
    ) -> None:
        if chosen is None:
            return  # CHAIN_INPUT_MISSING, found by SQL
        row, opened = chosen
        where = f"ledger_records[{index}]"
        if ledger.source != opened.input_hash:
            self.add(
                Step.CHAIN,
                "CHAIN_SOURCE",
                where,
                opened.input_hash,
                ledger.source,
                f"source is not the input hash of {row.where}",
            )
        kind = opened.kind or row.kind
        if ledger.kind != kind:
            self.add(
                Step.CHAIN,
                "CHAIN_KIND",
                where,
                kind,
                ledger.kind,
                f"the record's kind differs from its input in {row.table}",
            )
        if (row.status, row.reason) != (ledger.status, ledger.reason):
            self.add(
                Step.CHAIN,
                "CHAIN_STATUS",
                f"{row.where}.status",
                f"{ledger.status} {ledger.reason}".rstrip(),
                f"{row.status} {row.reason}".rstrip(),
                "the input row's status/reason differ from its ledger record",
            )

    # (7) the decision ------------------------------------------------------------------------

    def _decide(
        self, index: int, ledger: LedgerRecord | None, row: InputRow, opened: OpenResult
    ) -> None:
        verdict = self.referee.decide(opened, index in self.duplicates)
        claimed = (
            Verdict(ledger.status, ledger.reason)
            if ledger is not None
            else Verdict(str(row.status), str(row.reason or ""))
        )
        record = opened.record
        if verdict.outcome == PENDING:
            assert isinstance(record, Adjustment)
            self.con.execute(
                "INSERT INTO w_adjust VALUES (?, ?, ?, ?, NULL)",
                [index, record.adjustment_id, record.direction, record.amount_minor],
            )
            self.pending_claims[index] = (claimed, row.where)
            return
        self.bump(f"decided.{verdict.outcome}")
        if verdict != claimed:
            self._decision_finding(row.where, verdict, claimed)
        if verdict.outcome != ACCEPTED:
            return
        if isinstance(record, UsageEvent):
            self.usage_buffer.append(
                (
                    index,
                    record.node_id,
                    record.seq,
                    opened.record_hash,
                    record.start_ms,
                    record.end_ms,
                )
            )
            self.sample_buffer.extend(
                (index, s.uuid, s.allocated, s.healthy) for s in record.samples
            )
        elif isinstance(record, ReclaimNotice):
            self.con.execute(
                "INSERT INTO w_reclaim VALUES (?, ?, ?)",
                [index, record.issued_at_ms, record.effective_at_ms],
            )
        elif isinstance(record, PlacementClosed):
            self.con.execute("INSERT INTO w_close VALUES (?)", [index])
            if self.close_index is None:
                self.close_index = index

    def _decision_finding(self, where: str, verdict: Verdict, claimed: Verdict) -> None:
        if verdict.outcome == ACCEPTED:
            rule = claimed.reason or "DECISION"
        else:
            rule = verdict.reason or verdict.outcome.upper()
        if verdict.outcome in (ACCEPTED, REJECTED):
            message = "the ledger's decision differs from SPEC §6"
        else:
            message = f"SPEC §6 says this input is {verdict.outcome}, never chained"
        self.add(Step.DECISIONS, rule, where, verdict, claimed, message)

    def check_held(self) -> None:
        """(7) inputs held for terms that were accepted should have been processed."""
        rows = self.source.small_table("held", "position, input_hash, envelope", "position")
        for position, input_hash, raw in rows:
            where = f"held {position}"
            actual = open_one(0, blob(raw), {}).input_hash
            if input_hash != actual:
                self.add(
                    Step.ENVELOPES,
                    "INPUT_HASH",
                    f"{where}.input_hash",
                    actual,
                    input_hash,
                    "input_hash is not the SHA-256 of the envelope bytes",
                )
            if self.referee.terms is not None:
                self.add(
                    Step.DECISIONS,
                    "HELD_AFTER_TERMS",
                    where,
                    "processed after the terms",
                    "still held",
                    "SPEC §6.2: held inputs are processed right after the terms",
                )

    # (7) adjustments and (9) the totals -------------------------------------------------------

    def settle(self) -> None:
        """Decide pending adjustments, then recompute every total and compare with records."""
        assert self.terms is not None
        terms = self.terms
        compute_base(self.con)
        pending: list[PendingAdjustment] = []
        for index, adjustment_id, direction, amount in self.con.execute(
            "SELECT chain_index, adjustment_id, direction, amount_minor FROM w_adjust "
            "ORDER BY chain_index"
        ).fetchall():
            base = base_at(self.con, int(index))

            def after(
                credit: int, charge: int, base: tuple[int, int, int, int, int] = base
            ) -> list[int]:
                return settle_amounts(terms, base, credit, charge)

            pending.append(
                PendingAdjustment(int(index), adjustment_id, direction, int(amount), after)
            )
        for index, verdict in settle_adjustments(pending):
            claimed, where = self.pending_claims[index]
            self.bump(f"decided.{verdict.outcome}")
            if verdict != claimed:
                self._decision_finding(where, verdict, claimed)
            self.con.execute(
                "UPDATE w_adjust SET accepted = ? WHERE chain_index = ?",
                [verdict.outcome == ACCEPTED, index],
            )
        compute_totals(self.con)
        seen: set[str] = set()
        for column, count, index, expected, actual in record_mismatches(
            self.con, limits.MAX_MISMATCH_ROWS
        ):
            rule = f"TOTAL_{column.upper()}"
            if rule not in seen:
                self.findings.count(rule, count)
                seen.add(rule)
            self.findings.add(
                Step.OBLIGATION,
                rule,
                f"ledger_records[{index}]",
                expected,
                actual,
                f"{column} differs from SPEC §7 recomputed from the envelopes",
                counted=True,
            )

    # (9) statements -----------------------------------------------------------------------

    def check_statements(self) -> None:
        """(9) each statement: ledger-signed, head and totals equal to the chain at its index."""
        assert self.terms is not None
        ring = {key_id(self.ledger_key): [self.ledger_key]}
        rows = self.source.small_table(
            "statements",
            "through_index, envelope, final, buyer_owes_minor, operator_receives_minor, "
            "desk_receives_minor",
            "through_index",
        )
        chain_at = self._chain_at(
            {int(r[0]) for r in rows if r[0] is not None}
            | {
                int(o.record.through_index)
                for o in (open_one(0, blob(r[1]), {}) for r in rows)
                if isinstance(o.record, Statement)
            }
        )
        for through_index, raw, *columns in rows:
            self.bump("statements")
            where = f"statements through_index {through_index}"
            opened = open_one(0, blob(raw), ring)
            statement = opened.record
            if opened.error or not isinstance(statement, Statement):
                self.add(
                    Step.ENVELOPES,
                    opened.error or "KIND_MISMATCH",
                    where,
                    "a canonical Statement envelope",
                    opened.error or opened.kind,
                    opened.detail,
                )
                continue
            self.bump("signatures", len(opened.sigs))
            failure = signer_failure(opened.sigs, required_of((self.ledger_key,)))
            if failure is not None:
                self.add(
                    Step.OBLIGATION,
                    "STATEMENT_SIGNATURE",
                    where,
                    "signed by the trusted ledger key only",
                    failure.value,
                    "a statement counts only under the ledger's signature",
                )
            t = statement.totals
            for name, want, have in zip(
                (
                    "through_index",
                    "final",
                    "buyer_owes_minor",
                    "operator_receives_minor",
                    "desk_receives_minor",
                ),
                (
                    statement.through_index,
                    statement.final,
                    t.buyer_owes_minor,
                    t.operator_receives_minor,
                    t.desk_receives_minor,
                ),
                (through_index, *columns),
                strict=True,
            ):
                if want != have:
                    self.add(
                        Step.COLUMNS,
                        "COLUMN_MISMATCH",
                        f"{where}.{name}",
                        want,
                        have,
                        "a convenience column disagrees with the signed statement",
                    )
            if statement.placement_id != self.placement_id:
                self.add(
                    Step.OBLIGATION,
                    "STATEMENT_PLACEMENT",
                    where,
                    self.placement_id,
                    statement.placement_id,
                    "a statement of another placement",
                )
            if (statement.currency, statement.currency_scale) != (
                self.terms.currency,
                self.terms.currency_scale,
            ):
                self.add(
                    Step.OBLIGATION,
                    "STATEMENT_CURRENCY",
                    where,
                    f"{self.terms.currency}/{self.terms.currency_scale}",
                    f"{statement.currency}/{statement.currency_scale}",
                    "a statement in other money than the terms",
                )
            index = statement.through_index
            head, mine = chain_at.get(index, (None, None))
            if head is None or head != statement.head:
                self.add(
                    Step.OBLIGATION,
                    "STATEMENT_HEAD",
                    where,
                    head or f"a record at index {index}",
                    statement.head,
                    "head is not the record hash at through_index",
                )
            final = self.close_index is not None and self.close_index <= index
            if statement.final != final:
                self.add(
                    Step.OBLIGATION,
                    "STATEMENT_FINAL",
                    where,
                    final,
                    statement.final,
                    "final is true exactly when the chain through the index holds the close",
                )
            if mine is None:
                continue
            for name in TOTAL_FIELDS:
                have = getattr(t, name)
                if mine[name] != have:
                    self.add(
                        Step.OBLIGATION,
                        "STATEMENT_TOTALS",
                        f"{where}.{name}",
                        mine[name],
                        have,
                        "the statement's amount differs from SPEC §7 at its index",
                    )

    def _chain_at(self, indices: set[int]) -> dict[int, tuple[str, dict[str, int]]]:
        """Record hash and recomputed totals at each index, in one query (not one per row)."""
        self.con.execute("CREATE OR REPLACE TABLE w_wanted(chain_index BIGINT)")
        if indices:
            appender = self.con.appender("w_wanted")
            appender.append_rows([(i,) for i in indices])
            appender.flush()
        names = ", ".join(f"t.{name}" for name in TOTAL_FIELDS)
        rows = self.con.execute(
            f"SELECT r.chain_index, r.record_hash, {names} FROM w_records r "
            "JOIN w_totals t USING (chain_index) JOIN w_wanted w USING (chain_index)"
        ).fetchall()
        return {
            int(r[0]): (str(r[1]), dict(zip(TOTAL_FIELDS, map(int, r[2:]), strict=True)))
            for r in rows
        }

    # (8) checkpoints ----------------------------------------------------------------------

    def check_checkpoints(self) -> None:
        """(8) each checkpoint: ledger-signed note, origin, size and root; cosignatures."""
        assert self.terms is not None
        parties = {p.id: p.key for p in (self.terms.operator, self.terms.buyer, self.terms.desk)}
        for size_column, note_text in self.source.small_table("checkpoints", "size, note", "size"):
            self.bump("checkpoints")
            where = f"checkpoints size {size_column}"
            try:
                note = parse_note(str(note_text))
                body = parse_checkpoint_body(note.body)
            except ProtoError as exc:
                self.add(
                    Step.MERKLE,
                    "CHECKPOINT_MALFORMED",
                    where,
                    "a C2SP checkpoint note",
                    exc.reason.value,
                    exc.detail,
                )
                continue
            summary: dict[str, Any] = {"size": body.size, "cosigned_by": [], "ignored_signers": []}
            if note.text() != str(note_text):
                # Same signatures, other spelling (e.g. base64 with non-zero padding bits):
                # harmless to the maths, but the ledger never writes it, so it was altered.
                self.add(
                    Step.MERKLE,
                    "CHECKPOINT_NON_CANONICAL",
                    where,
                    "the note as the ledger writes it",
                    "a differently spelled note",
                    "the note text is not in canonical form",
                )
            self.report.checkpoints.append(summary)
            if body.size != size_column:
                self.add(
                    Step.COLUMNS,
                    "COLUMN_MISMATCH",
                    f"{where}.size",
                    body.size,
                    size_column,
                    "the size column disagrees with the signed note",
                )
            origin = checkpoint_origin(self.placement_id)
            if body.origin != origin:
                self.add(
                    Step.MERKLE,
                    "CHECKPOINT_ORIGIN",
                    where,
                    origin,
                    body.origin,
                    "a checkpoint of another log",
                )
            if not note.signed_by(LEDGER_NOTE_NAME, self.ledger_key):
                self.add(
                    Step.MERKLE,
                    "CHECKPOINT_SIGNATURE",
                    where,
                    f"signed by {LEDGER_NOTE_NAME} with the trusted ledger key",
                    "no valid signature",
                    "a checkpoint counts only under the ledger's signature",
                )
            if body.size > self.record_count:
                self.add(
                    Step.MERKLE,
                    "CHECKPOINT_SIZE",
                    where,
                    f"<= {self.record_count} records",
                    body.size,
                    "the checkpoint covers records the export does not hold (truncated?)",
                )
            else:
                root = self.roots.get(body.size)
                if root != body.root:
                    self.add(
                        Step.MERKLE,
                        "CHECKPOINT_ROOT",
                        where,
                        base64.b64encode(root).decode() if root else "?",
                        base64.b64encode(body.root).decode(),
                        "the RFC 9162 root of the record payloads differs",
                    )
            for sig in note.signatures:
                if sig.name == LEDGER_NOTE_NAME:
                    continue
                key = parties.get(sig.name)
                if key is None:
                    # C2SP lets verifiers skip unknown signers, but an export carries only the
                    # ledger's and the parties' lines: anything else was added or altered.
                    summary["ignored_signers"].append(sig.name)
                    self.add(
                        Step.MERKLE,
                        "CHECKPOINT_UNKNOWN_SIGNER",
                        where,
                        "signature lines by the ledger or a party of the terms",
                        sig.name,
                        "a signature line by someone the terms do not name",
                    )
                elif note.signed_by(sig.name, key):
                    summary["cosigned_by"].append(sig.name)
                else:
                    self.add(
                        Step.MERKLE,
                        "CHECKPOINT_COSIGNATURE",
                        where,
                        f"a valid cosignature by {sig.name}",
                        "invalid",
                        "a party's cosignature does not verify with its terms key",
                    )

    # the report ---------------------------------------------------------------------------

    def summarise(self) -> None:
        """Head totals, finality and counts into the report."""
        row = self.con.execute("SELECT max(chain_index) FROM w_records").fetchall()[0]
        if row is not None and row[0] is not None:
            self.report.head_index = int(row[0])
            self.report.totals = totals_at(self.con, int(row[0]))
        self.report.final = self.close_index is not None
        self.counts["dropped_duplicates_meta"] = _int_or_zero(
            self.source.meta.get("dropped_duplicates")
        )
        self.report.counts = dict(sorted(self.counts.items()))


def _int_or_zero(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0
