"""Resuming a verification from the verifier's own state at a checkpoint (SPEC §8.5).

``verify EXPORT --state-out FILE`` keeps, after an export verified with no finding, the
state at its largest checkpoint; ``verify SINCE --state FILE [--state-out NEXT]`` checks an
export since that checkpoint (EXPORT.md "Since a checkpoint") from it, and keeps the state
at the new head. So a placement's check costs what its new records hold, not its age.

The state file carries nothing the verifier must take on trust but ``verdict``: its
note is ledger-signed, and ``frontier`` + ``head`` re-derive the note's size and root,
``totals`` equal ``head``'s (``read_state``). A resumed check re-derives neither the
decisions nor the totals of the new records (that fold state cannot be re-derived from a
root): its verdict is at most PROVISIONAL, saying so.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import duckdb
import msgspec

from proto import merkle
from proto.canonical import decode_kind_payload
from proto.durable_io import fsync_dir, read_at_most
from proto.envelope import open_envelope, require_signatures, sha256_hex
from proto.errors import ProtoError
from proto.frontier import Frontier
from proto.keys import key_id
from proto.note import LEDGER_NOTE_NAME, checkpoint_origin, parse_checkpoint_body, parse_note
from proto.records import ZERO_HASH, LedgerRecord, Statement
from proto.trust import TrustFile
from verifier.errors import UnusableInput
from verifier.findings import Step
from verifier.limits import MAX_SMALL_TABLE_ROWS
from verifier.pricing import TOTAL_FIELDS
from verifier.source import INPUT_TABLES, side_file_message, side_files
from verifier.state import VERIFIED, ExportReport

STATE_FORMAT: Final = "gridledger-verifier-state/v1"
MAX_STATE_BYTES: Final = 256 * 1024
# A compact range of a tree of at most 2^64 leaves has at most 64 roots.
MAX_FRONTIER: Final = 64
# Records read from the export per query.
BATCH: Final = 4096
NOT_RE_DERIVED: Final = "decisions and totals of records {m}..{n} not re-derived (resumed)"


class VerifierState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The state file (SPEC §8.5)."""

    format: str
    placement_id: str
    ledger_key: str  # base64
    note: str
    frontier: list[str]  # hex, the tree of the first size - 1 records, largest first
    head: str  # base64 of record size - 1's signed bytes
    totals: dict[str, int]
    verdict: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """A state file that passed every check of SPEC §8.5, decoded."""

    state: VerifierState
    size: int
    root: bytes
    frontier: Frontier  # of the first ``size`` records
    head_hash: str
    ledger_key: bytes


def _hashes(texts: list[str], what: str) -> tuple[bytes, ...]:
    out = []
    for text in texts:
        try:
            raw = bytes.fromhex(text)
        except ValueError as exc:
            raise UnusableInput(what, "frontier: not hex") from exc
        if len(raw) != 32:
            raise UnusableInput(what, "frontier: a hash that is not 32 bytes")
        out.append(raw)
    return tuple(out)


def read_state(path: Path, trust: TrustFile) -> Resumed:
    """The state file ``path``, checked as SPEC §8.5 says; UnusableInput names the check a
    file fails (an edited file fails one, or describes a prefix the ledger signed)."""
    what = f"state file {path}"
    try:
        raw = read_at_most(path, MAX_STATE_BYTES)
    except OSError as exc:
        raise UnusableInput(what, f"cannot read it: {exc.strerror}") from exc
    if len(raw) > MAX_STATE_BYTES:
        raise UnusableInput(what, f"larger than {MAX_STATE_BYTES} bytes")
    try:
        state = msgspec.json.decode(raw, type=VerifierState)
    except msgspec.MsgspecError as exc:
        raise UnusableInput(what, f"not a {STATE_FORMAT} file: {str(exc)[:200]}") from exc
    if state.format != STATE_FORMAT:
        raise UnusableInput(what, f"format is {state.format[:40]!r}, want {STATE_FORMAT!r}")
    try:
        ledger_key = base64.b64decode(state.ledger_key, validate=True)
        head = base64.b64decode(state.head, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UnusableInput(what, "ledger_key or head is not base64") from exc
    if not any(k.role == "ledger" and k.key == ledger_key for k in trust.keys):
        raise UnusableInput(what, "its ledger key is not a ledger key of the trust file")
    try:
        note = parse_note(state.note)
        checkpoint = parse_checkpoint_body(note.body)
    except ProtoError as exc:
        raise UnusableInput(what, f"its note is not a checkpoint: {exc}") from exc
    if checkpoint.origin != checkpoint_origin(state.placement_id):
        raise UnusableInput(what, "its note is not a checkpoint of its placement")
    if not note.signed_by(LEDGER_NOTE_NAME, ledger_key):
        raise UnusableInput(what, "its note is not signed by its ledger key")
    size = checkpoint.size
    if not size > 0 or len(state.frontier) > MAX_FRONTIER:
        raise UnusableInput(what, "its note's size or its frontier is out of bounds")
    record = ledger_record(head)
    if record is None:
        raise UnusableInput(what, "head is not a LedgerRecord")
    if record.index != size - 1 or record.placement_id != state.placement_id:
        raise UnusableInput(what, f"head is not record {size - 1} of {state.placement_id}")
    before = Frontier(size - 1, _hashes(state.frontier, what))
    if not before.well_formed():
        raise UnusableInput(what, "frontier does not fit its size: edited")
    frontier = before.append_leaf_hash(merkle.leaf_hash(head))
    if frontier.root() != checkpoint.root:
        raise UnusableInput(what, "frontier and head do not give its note's root: edited")
    if state.totals != totals_of(record):
        raise UnusableInput(what, "totals are not its head record's: edited")
    return Resumed(state, size, checkpoint.root, frontier, sha256_hex(head), ledger_key)


def ledger_record(payload: bytes) -> LedgerRecord | None:
    """The LedgerRecord whose signed bytes are ``payload``; None when they are not one."""
    try:
        _, record = decode_kind_payload(payload)
    except ProtoError:
        return None
    return record if isinstance(record, LedgerRecord) else None


def totals_of(record: LedgerRecord) -> dict[str, int]:
    """A record's totals as a report shows them (``verifier.pricing.TOTAL_FIELDS``)."""
    return {name: int(getattr(record.totals, name)) for name in TOTAL_FIELDS}


def write_state(path: Path, state: VerifierState) -> None:
    """Write ``state`` to ``path`` durably: a temporary file, fsync, rename, fsync dir."""
    tmp = path.with_name(f".{path.name}.tmp")
    data = msgspec.json.format(msgspec.json.encode(state)) + b"\n"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _connect(path: Path) -> duckdb.DuckDBPyConnection:
    found = side_files(path)
    if found:
        raise UnusableInput(str(path), side_file_message(found))
    if not path.is_file():
        raise UnusableInput(str(path), "no such export file")
    try:
        return duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UnusableInput(str(path), f"not a DuckDB export: {first}") from exc


def _meta(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, str]:
    try:
        rows = con.execute("SELECT key, left(value, 4096) FROM meta").fetchall()
    except duckdb.Error as exc:
        raise UnusableInput(str(path), "no meta table: not an export") from exc
    meta = {str(k): str(v) for k, v in rows}
    if len(meta) != len(rows):
        raise UnusableInput(str(path), "meta names a key twice")
    if meta.get("format") != "gridledger-export" or meta.get("format_version") != "2":
        raise UnusableInput(str(path), "not a gridledger-export of format version 2")
    return meta


def _records(con: duckdb.DuckDBPyConnection, first: int) -> Iterator[tuple[int, bytes, str]]:
    """(chain_index, envelope, record_hash) of every ledger_records row from ``first`` on,
    in chain order, BATCH rows a fetch."""
    cursor = con.execute(
        "SELECT chain_index, envelope, record_hash FROM ledger_records "
        "WHERE chain_index >= ? ORDER BY chain_index",
        [first],
    )
    while rows := cursor.fetchmany(BATCH):
        for index, envelope, record_hash in rows:
            yield int(index), bytes(envelope), str(record_hash)


def state_of_export(path: Path, report: ExportReport) -> VerifierState:
    """The state at the largest checkpoint of the full export ``path`` that ``report``
    verified with no finding: it reads the records again for the frontier and the head."""
    if report.verdict != VERIFIED or report.findings.total:
        raise UnusableInput(str(path), "--state-out: the export did not verify; no state kept")
    with contextlib.closing(_connect(path)) as con:
        meta = _meta(con, path)
        if "since_size" in meta:
            raise UnusableInput(str(path), "an export since a checkpoint needs --state")
        note, size = _largest_checkpoint(con)
        frontier = Frontier.empty()
        head = b""
        for index, envelope, _ in _records(con, 0):
            if index >= size:
                break
            payload = open_envelope(envelope).payload
            if index < size - 1:
                frontier = frontier.append_leaf_hash(merkle.leaf_hash(payload))
            head = payload
        record = ledger_record(head)
        if record is None or record.index != size - 1:
            raise UnusableInput(str(path), "--state-out: no record under the checkpoint")
        return VerifierState(
            STATE_FORMAT,
            report.placement_id,
            meta["ledger_key"],
            note,
            [h.hex() for h in frontier.hashes],
            base64.b64encode(head).decode(),
            totals_of(record),
            "FINAL" if not report.provisional else "PROVISIONAL",
        )


def _largest_checkpoint(con: duckdb.DuckDBPyConnection) -> tuple[str, int]:
    row = con.execute("SELECT note, size FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    if row is None:
        raise UnusableInput("export", "no checkpoint")
    return str(row[0]), int(row[1])


@dataclass(slots=True)
class _Walk:
    """What the pass over the new records carries from one to the next."""

    report: ExportReport
    frontier: Frontier
    prev_hash: str
    want_roots: set[int]
    roots: dict[int, bytes]
    hashes: dict[int, str]  # record hash by index, for the statements' heads
    totals: dict[int, dict[str, int]]  # of the records statements are through
    last: LedgerRecord | None = None
    last_payload: bytes = b""
    before_last: Frontier | None = None


def verify_since(
    path: Path, trust: TrustFile, resumed: Resumed
) -> tuple[ExportReport, VerifierState | None]:
    """Check the export since a checkpoint ``path`` from ``resumed`` (SPEC §8.5): the report,
    and the state at its head (a ``VerifierState``; None when there was a finding)."""
    with contextlib.closing(_connect(path)) as con:
        try:
            return _verify_since(con, path, resumed)
        except duckdb.Error as exc:  # a table or column missing: not what EXPORT.md says
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise UnusableInput(str(path), f"not an export since a checkpoint: {first}") from exc


def _verify_since(
    con: duckdb.DuckDBPyConnection, path: Path, resumed: Resumed
) -> tuple[ExportReport, VerifierState | None]:
    report = ExportReport(path=str(path))
    _check_meta(path, _meta(con, path), resumed)
    report.placement_id = resumed.state.placement_id
    checkpoints = _checkpoints(con, report, resumed)
    statements = _statements(con, report, resumed)
    walk = _Walk(
        report,
        resumed.frontier,
        resumed.head_hash,
        set(checkpoints) | {resumed.size},
        {resumed.size: resumed.root},
        {},
        {},
    )
    n = _walk_records(con, walk, resumed, set(statements))
    if n == resumed.size and walk.last is None:
        walk.last = ledger_record(base64.b64decode(resumed.state.head))
    _judge_checkpoints(con, report, walk, checkpoints, resumed, n)
    _judge_statements(report, walk, statements)
    report.record_count = n - resumed.size
    report.head_index = n - 1
    if walk.last is not None:
        report.totals = totals_of(walk.last)
    latest = statements.get(n - 1)
    report.final = latest is not None and latest.final
    report.provisional = [NOT_RE_DERIVED.format(m=resumed.size, n=n - 1)]
    if not report.final:
        report.provisional.append("the placement is open: no final statement covers the log")
    if report.findings.total:
        return report, None
    report.verdict = VERIFIED
    return report, _next_state(walk, checkpoints, resumed, n)


def _check_meta(path: Path, meta: dict[str, str], resumed: Resumed) -> None:
    """The export is since the state's checkpoint, of its placement and ledger key."""
    state = resumed.state
    if "since_size" not in meta:
        raise UnusableInput(str(path), "--state: a full export, not one since a checkpoint")
    if meta.get("placement_id") != state.placement_id:
        raise UnusableInput(str(path), f"--state: not an export of {state.placement_id}")
    if meta.get("ledger_key") != state.ledger_key:
        raise UnusableInput(str(path), "--state: another ledger key than the state's")
    if meta["since_size"] != str(resumed.size) or meta.get("since_root") != base64.b64encode(
        resumed.root
    ).decode("ascii"):
        raise UnusableInput(
            str(path),
            f"--state: an export since checkpoint {meta['since_size'][:20]}, the state is at "
            f"{resumed.size}",
        )


def _finding(report: ExportReport, step: Step, rule: str, where: str, message: str) -> None:
    report.findings.add(step, rule, where, "", "", message)


def _checkpoints(
    con: duckdb.DuckDBPyConnection, report: ExportReport, resumed: Resumed
) -> dict[int, str]:
    """Size -> note of each ledger-signed checkpoint of the placement the export holds;
    any other is a finding."""
    out: dict[int, str] = {}
    rows = con.execute(
        "SELECT size, note FROM checkpoints ORDER BY size LIMIT ?", [MAX_SMALL_TABLE_ROWS + 1]
    ).fetchall()
    if len(rows) > MAX_SMALL_TABLE_ROWS:
        _finding(report, Step.FORMAT, "TABLE_TOO_LARGE", "checkpoints", "too many rows")
    origin = checkpoint_origin(resumed.state.placement_id)
    for size, text in rows[:MAX_SMALL_TABLE_ROWS]:
        where = f"checkpoints[size={size}]"
        try:
            note = parse_note(str(text))
            body = parse_checkpoint_body(note.body)
        except ProtoError as exc:
            _finding(report, Step.MERKLE, "CHECKPOINT", where, f"not a checkpoint note: {exc}")
            continue
        if body.origin != origin or body.size != size or size < resumed.size:
            _finding(report, Step.MERKLE, "CHECKPOINT", where, "origin or size is not its row's")
        elif not note.signed_by(LEDGER_NOTE_NAME, resumed.ledger_key):
            _finding(report, Step.MERKLE, "CHECKPOINT", where, "not signed by the ledger key")
        else:
            out[int(size)] = str(text)
    return out


def _statements(
    con: duckdb.DuckDBPyConnection, report: ExportReport, resumed: Resumed
) -> dict[int, Statement]:
    """through_index -> each ledger-signed Statement of the placement; others are findings."""
    out: dict[int, Statement] = {}
    required = {key_id(resumed.ledger_key): resumed.ledger_key}
    rows = con.execute(
        "SELECT through_index, envelope FROM statements ORDER BY through_index LIMIT ?",
        [MAX_SMALL_TABLE_ROWS + 1],
    ).fetchall()
    if len(rows) > MAX_SMALL_TABLE_ROWS:
        _finding(report, Step.FORMAT, "TABLE_TOO_LARGE", "statements", "too many rows")
    for through, envelope in rows[:MAX_SMALL_TABLE_ROWS]:
        where = f"statements[{through}]"
        try:
            opened = open_envelope(bytes(envelope))
            require_signatures(opened.envelope, required)
        except ProtoError as exc:
            _finding(report, Step.OBLIGATION, "STATEMENT", where, f"not a signed statement: {exc}")
            continue
        record = opened.record
        if (
            not isinstance(record, Statement)
            or record.placement_id != resumed.state.placement_id
            or record.through_index != through
            or through < resumed.size
        ):
            _finding(report, Step.OBLIGATION, "STATEMENT", where, "not a statement of this row")
            continue
        out[int(through)] = record
    return out


def _input_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    names = {str(r[0]) for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    return [t.name for t in INPUT_TABLES if t.name in names]


def _inputs(
    con: duckdb.DuckDBPyConnection, tables: list[str], lo: int, hi: int
) -> dict[int, list[tuple[str, str, bytes, str, str]]]:
    """chain_index -> (table, input_hash, envelope, status, reason) of [lo, hi)."""
    out: dict[int, list[tuple[str, str, bytes, str, str]]] = {}
    for table in tables:
        rows = con.execute(
            f"SELECT chain_index, input_hash, envelope, status, reason FROM {table} "
            "WHERE chain_index >= ? AND chain_index < ?",
            [lo, hi],
        ).fetchall()
        for index, input_hash, envelope, status, reason in rows:
            out.setdefault(int(index), []).append(
                (table, str(input_hash), bytes(envelope), str(status), str(reason))
            )
    return out


def _walk_records(
    con: duckdb.DuckDBPyConnection, walk: _Walk, resumed: Resumed, through: set[int]
) -> int:
    """Every record from the checkpoint on, in order (SPEC §8.5 "Resuming"); returns the
    log's size n."""
    tables = _input_tables(con)
    reader = con.cursor()
    try:
        cursor = reader.execute(
            "SELECT chain_index, envelope, record_hash FROM ledger_records "
            "WHERE chain_index >= 0 ORDER BY chain_index"
        )
        expected = resumed.size
        while rows := cursor.fetchmany(BATCH):
            lo = int(rows[0][0])
            inputs = _inputs(con, tables, lo, int(rows[-1][0]) + 1)
            for index, envelope, record_hash in rows:
                if index != expected:
                    _finding(
                        walk.report,
                        Step.CHAIN,
                        "CHAIN_INDEX",
                        f"ledger_records[{index}]",
                        f"records are not contiguous from {resumed.size}: want {expected}",
                    )
                    return expected
                _check_one(walk, int(index), bytes(envelope), str(record_hash), inputs, through)
                expected += 1
        return expected
    finally:
        reader.close()


def _check_one(
    walk: _Walk,
    index: int,
    raw: bytes,
    record_hash: str,
    inputs: dict[int, list[tuple[str, str, bytes, str, str]]],
    through: set[int],
) -> None:
    report = walk.report
    where = f"ledger_records[{index}]"
    try:
        opened = open_envelope(raw)
    except ProtoError as exc:
        _finding(report, Step.ENVELOPES, "ENVELOPE", where, str(exc))
        walk.prev_hash = ""
        return
    record = opened.record
    walk.before_last = walk.frontier
    walk.frontier = walk.frontier.append_leaf_hash(merkle.leaf_hash(opened.payload))
    size = index + 1
    if size in walk.want_roots:
        walk.roots[size] = walk.frontier.root()
    if not isinstance(record, LedgerRecord) or opened.envelope.signatures:
        _finding(report, Step.CHAIN, "CHAIN_RECORD", where, "not an unsigned LedgerRecord")
        walk.prev_hash = ""
        return
    if record.index != index or record.placement_id != walk.report.placement_id:
        _finding(report, Step.CHAIN, "CHAIN_RECORD", where, "index or placement is not its own")
    if record.prev != walk.prev_hash or (index == 0 and record.prev != ZERO_HASH):
        _finding(report, Step.CHAIN, "PREV_LINK", where, "prev is not the record before's hash")
    if record_hash != opened.record_hash:
        _finding(report, Step.COLUMNS, "COLUMN", where, "record_hash is not SHA-256 of it")
    walk.prev_hash = opened.record_hash
    walk.last, walk.last_payload = record, opened.payload
    if index in through:
        walk.hashes[index] = opened.record_hash
        walk.totals[index] = totals_of(record)
    rows = inputs.get(index, [])
    if len(rows) != 1:
        _finding(report, Step.CHAIN, "CHAIN_INPUT", where, f"{len(rows)} input rows, want 1")
        return
    table, input_hash, envelope, status, reason = rows[0]
    kind = ""
    with contextlib.suppress(ProtoError):
        kind = open_envelope(envelope).kind
    if (
        input_hash != sha256_hex(envelope)
        or record.source != input_hash
        or kind != record.kind
        or (status, reason) != (record.status, record.reason)
    ):
        _finding(
            report,
            Step.CHAIN,
            "CHAIN_INPUT",
            f"{table}[{index}]",
            "input hash, source, kind, status or reason differs from its record's",
        )


def _judge_checkpoints(
    con: duckdb.DuckDBPyConnection,
    report: ExportReport,
    walk: _Walk,
    checkpoints: dict[int, str],
    resumed: Resumed,
    n: int,
) -> None:
    """Each checkpoint's root re-derived; the largest covers every record; the proof."""
    for size in sorted(checkpoints):
        where = f"checkpoints[size={size}]"
        if size > n:
            _finding(report, Step.MERKLE, "TRUNCATED", where, f"larger than the log ({n})")
        elif parse_checkpoint_body(parse_note(checkpoints[size]).body).root != walk.roots.get(size):
            _finding(report, Step.MERKLE, "CHECKPOINT", where, "root is not the records' root")
    if max(checkpoints, default=0) < n:
        _finding(report, Step.MERKLE, "RECORD_UNCOVERED", f"ledger_records[{n - 1}]", "uncovered")
    if resumed.size in checkpoints and walk.roots.get(resumed.size) != resumed.root:
        _finding(report, Step.MERKLE, "EQUIVOCATION", "checkpoints", "not the state's root")
    row = con.execute("SELECT first_size, size, proof FROM consistency").fetchall()
    ok = len(row) == 1 and int(row[0][0]) == resumed.size and int(row[0][1]) == n
    if ok:
        try:
            proof = [base64.b64decode(h, validate=True) for h in str(row[0][2]).split()]
        except (binascii.Error, ValueError):
            ok = False
        else:
            new_root = walk.roots.get(n, walk.frontier.root())
            ok = merkle.verify_consistency(resumed.size, n, resumed.root, new_root, proof)
    if not ok:
        _finding(report, Step.MERKLE, "CONSISTENCY", "consistency", "proof does not verify")


def _judge_statements(report: ExportReport, walk: _Walk, statements: dict[int, Statement]) -> None:
    """Each statement's head is its record's hash, its totals its record's."""
    for through, statement in statements.items():
        where = f"statements[{through}]"
        if walk.hashes.get(through) != statement.head:
            _finding(report, Step.OBLIGATION, "STATEMENT", where, "head is not its record's")
        elif walk.totals.get(through) != totals_of_statement(statement):
            _finding(report, Step.OBLIGATION, "STATEMENT", where, "totals are not its record's")


def totals_of_statement(statement: Statement) -> dict[str, int]:
    """A statement's totals as ``totals_of`` shows a record's."""
    return {name: int(getattr(statement.totals, name)) for name in TOTAL_FIELDS}


def _next_state(
    walk: _Walk, checkpoints: dict[int, str], resumed: Resumed, n: int
) -> VerifierState:
    """The state at the head n (its checkpoint is in the export: no finding said otherwise)."""
    state = resumed.state
    if n == resumed.size or walk.before_last is None or walk.last is None:
        return msgspec.structs.replace(state, verdict="PROVISIONAL")
    return VerifierState(
        STATE_FORMAT,
        state.placement_id,
        state.ledger_key,
        checkpoints[n],
        [h.hex() for h in walk.before_last.hashes],
        base64.b64encode(walk.last_payload).decode("ascii"),
        totals_of(walk.last),
        "PROVISIONAL",
    )
