"""`gridledger audit`: the auditor's appendix of each export (``billview/appendix.py``).

Each export is verified with the trust file first (its verdict heads the page, whatever
it is); the rest is read from the export itself, read-only: the terms' signers, when the
terms and each statement reached the log, the rejected inputs with their reasons, the held
ones, and every sample of every usage event as a CSV row (one per GPU per interval).
"""

from __future__ import annotations

import csv
import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import duckdb

from billview.appendix import MAX_LISTED, Appendix, KeyRow, RejectedRow, StatementRow
from billview.units import iso_utc
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.records import LedgerRecord, PlacementTerms, Statement, UsageEvent
from proto.trust import TrustFile

INPUT_TABLES: Final = (
    "terms",
    "key_bindings",
    "usage_events",
    "reclaims",
    "adjustments",
    "closes",
    "assignments",
    "releases",
)
USAGE_COLUMNS: Final = (
    "chain_index", "status", "reason", "node_id", "seq", "start_ms", "end_ms", "start_utc",
    "end_utc", "uuid", "model", "allocated", "healthy", "utilisation_pct", "power_mw", "xids",
    "ecc_uncorrectable", "retired_pages", "present", "input_hash",
)  # fmt: skip
FETCH: Final = 5_000
_SAFE_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
CHUNK: Final = 1 << 20


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _opened(raw: Any) -> Any:
    try:
        return open_envelope(bytes(raw))
    except (ProtoError, TypeError):
        return None


def write_appendix(
    export: Path, trust_path: Path, trust: TrustFile, out: Path, clock_ms: Callable[[], int]
) -> tuple[Appendix, Path, Path]:
    """Verify ``export`` and write ``PID.audit.html`` and ``PID.usage.csv`` into ``out``."""
    from importlib.metadata import PackageNotFoundError, version

    from billview.appendix import to_html
    from verifier.verify import verify_export

    report = verify_export(export, trust)
    verdict = "FINAL" if report.is_final else ("PROVISIONAL" if report.ok else "FAILED")
    reasons = report.provisional if report.ok else [f.line() for f in report.findings.kept[:20]]
    try:
        verifier = f"gridledger {version('gridledger')}"
    except PackageNotFoundError:
        verifier = "gridledger (version unknown: not installed)"
    con = duckdb.connect(str(export), read_only=True)
    try:
        pid = _meta(con).get("placement_id", "")
        if not _SAFE_NAME.match(pid):  # a file name: never a path an export could choose
            pid = export.stem
        usage_path = out / f"{pid}.usage.csv"
        rows = _write_usage(con, usage_path)
        terms, signers, terms_index = _terms(con, trust)
        arrived = _arrivals(con)
        rejected, total = _rejected(con)
        appendix = Appendix(
            placement_id=pid,
            verifier=verifier,
            verified_at_ms=clock_ms(),
            verdict=verdict,
            verdict_reasons=list(reasons),
            export_name=export.name,
            export_sha256=file_sha256(export),
            trust_sha256=file_sha256(trust_path),
            keys=[_key_row(k.id, k.role, k.key) for k in trust.keys],
            terms_signers=signers,
            terms_created_ms=0 if terms is None else terms.created_at_ms,
            terms_arrived_ms=None if terms_index is None else arrived.get(terms_index),
            statements=_statements(con, arrived),
            rejected=rejected,
            rejected_total=total,
            held=_held(con),
            usage_csv=usage_path.name,
            usage_rows=rows,
        )
    finally:
        con.close()
    page = out / f"{pid}.audit.html"
    page.write_text(to_html(appendix), encoding="utf-8")
    return appendix, page, usage_path


def _key_row(name: str, role: str, key: bytes) -> KeyRow:
    return KeyRow(id=name, role=role, key_id=key_id(key), sha256=hashlib.sha256(key).hexdigest())


def _held(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    rows = con.execute(
        f"SELECT position, input_hash FROM held ORDER BY position LIMIT {MAX_LISTED}"
    ).fetchall()
    return [(str(p), str(h)) for p, h in rows]


def _meta(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    return {str(k): str(v) for k, v in con.execute("SELECT key, value FROM meta").fetchall()}


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {str(r[0]) for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _terms(
    con: duckdb.DuckDBPyConnection, trust: TrustFile
) -> tuple[PlacementTerms | None, list[str], int | None]:
    """The accepted terms, who signed them (by the trust file's names), their record."""
    rows = con.execute(
        "SELECT chain_index, envelope FROM terms WHERE status = 'accepted' "
        "ORDER BY chain_index LIMIT 1"
    ).fetchall()
    if not rows:
        return None, [], None
    opened = _opened(rows[0][1])
    if opened is None or not isinstance(opened.record, PlacementTerms):
        return None, [], int(rows[0][0])
    names = {key_id(k.key): f"{k.role} {k.id}" for k in trust.keys}
    signers = [names.get(s.keyid, f"key {s.keyid}") for s in opened.envelope.signatures]
    return opened.record, signers, int(rows[0][0])


def _arrivals(con: duckdb.DuckDBPyConnection) -> dict[int, int]:
    """Record index -> arrived_ms (SPEC §6.6), for the records statements and terms end at."""
    wanted = {int(r[0]) for r in con.execute("SELECT through_index FROM statements").fetchall()}
    wanted |= {int(r[0]) for r in con.execute("SELECT chain_index FROM terms").fetchall()}
    if not wanted:
        return {}
    listed = ", ".join(str(i) for i in sorted(wanted))
    out: dict[int, int] = {}
    for index, raw in con.execute(
        f"SELECT chain_index, envelope FROM ledger_records WHERE chain_index IN ({listed})"
    ).fetchall():
        opened = _opened(raw)
        record = None if opened is None else opened.record
        if isinstance(record, LedgerRecord) and record.arrived_ms is not None:
            out[int(index)] = record.arrived_ms
    return out


def _statements(con: duckdb.DuckDBPyConnection, arrived: dict[int, int]) -> list[StatementRow]:
    out = []
    for index, raw in con.execute(
        f"SELECT through_index, envelope FROM statements ORDER BY through_index LIMIT {MAX_LISTED}"
    ).fetchall():
        opened = _opened(raw)
        if opened is None or not isinstance(opened.record, Statement):
            continue
        s = opened.record
        out.append(
            StatementRow(period=s.period, through_index=s.through_index, head=s.head,
                         final=s.final, arrived_ms=arrived.get(int(index)))
        )  # fmt: skip
    return out


def _rejected(con: duckdb.DuckDBPyConnection) -> tuple[list[RejectedRow], int]:
    present = [t for t in INPUT_TABLES if t in _tables(con)]
    union = " UNION ALL ".join(
        f"SELECT '{t}' AS tbl, chain_index, position, input_hash, status, reason FROM {t} "
        "WHERE status <> 'accepted'"
        for t in present
    )
    total = int((con.execute(f"SELECT count(*) FROM ({union})").fetchone() or (0,))[0])
    rows = con.execute(f"SELECT * FROM ({union}) ORDER BY chain_index LIMIT {MAX_LISTED}")
    listed = [
        RejectedRow(table=str(t), chain_index=int(i), position=str(p), input_hash=str(h),
                    status=str(s), reason=str(r))
        for t, i, p, h, s, r in rows.fetchall()
    ]  # fmt: skip
    return listed, total


def _usage_rows(con: duckdb.DuckDBPyConnection) -> Iterator[tuple[object, ...]]:
    cursor = con.execute(
        "SELECT chain_index, status, reason, input_hash, envelope FROM usage_events "
        "ORDER BY chain_index"
    )
    while batch := cursor.fetchmany(FETCH):
        for index, status, reason, input_hash, raw in batch:
            opened = _opened(raw)
            if opened is None or not isinstance(opened.record, UsageEvent):
                yield (index, status, reason, "", "", "", "", "", "", "", "", "", "", "", "",
                       "", "", "", "", input_hash)  # fmt: skip
                continue
            e = opened.record
            for s in e.samples:
                yield (
                    index, status, reason, e.node_id, e.seq, e.start_ms, e.end_ms,
                    iso_utc(e.start_ms), iso_utc(e.end_ms), s.uuid, s.model, s.allocated,
                    s.healthy, s.utilisation_pct, s.power_mw, " ".join(map(str, s.xids)),
                    s.ecc_uncorrectable, s.retired_pages, s.present, input_hash,
                )  # fmt: skip


def _write_usage(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    count = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(USAGE_COLUMNS)
        for row in _usage_rows(con):
            writer.writerow(row)
            count += 1
    return count
