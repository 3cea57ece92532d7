"""`gridledger invoice` and `gridledger focus`: the bill finance can pay (SPEC §11).

    invoice EXPORTS... --trust TRUST --out DIR [--month YYYY-MM] [--profiles DIR]
    focus   EXPORTS... --trust TRUST --out FILE.csv|FILE.parquet [--month YYYY-MM]

Each export is verified first, by the verifier's own checklist with the trust file
(``verifier.verify.verify_export``); one that is not FINAL is refused with one line
naming it and why, and nothing is written. The documents are built from what the
verification established only (``billview.invoice``), so buyer and operator, each
building them from its own copy of the exports, get the same numbers and bytes.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from billview.invoice import FinalPeriod, Invoice, Profile, VerifiedPlacement, encode, invoices
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.records import LedgerRecord, Statement, Totals
from proto.trust import TrustError, TrustFile, load_trust

_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class Refused(Exception):
    """Bad input for a finance document: one line, naming what was wrong."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``invoice`` and ``focus``."""
    invoice = sub.add_parser(
        "invoice",
        help="invoices and credit notes (JSON and HTML) from FINAL exports",
        description="One invoice per payer per payee per calendar month, from exports "
        "that verify FINAL with the trust file (SPEC §11).",
    )
    _common(invoice)
    invoice.add_argument("--out", required=True, type=Path, help="directory for the documents")
    invoice.add_argument(
        "--profiles", type=Path, help="directory of signed party profiles (SPEC §12)"
    )
    invoice.set_defaults(handler=_invoice)
    focus = sub.add_parser(
        "focus",
        help="FinOps FOCUS rows (CSV or Parquet) from FINAL exports",
        description="One row per GPU per charge period and one per other charge, "
        "summing to the invoices (SPEC §11.5).",
    )
    _common(focus)
    focus.add_argument("--out", required=True, type=Path, help="FILE.csv or FILE.parquet")
    focus.set_defaults(handler=_focus)
    audit = sub.add_parser(
        "audit",
        help="the auditor's appendix of each export (HTML) and its signed usage (CSV)",
    )
    audit.add_argument("exports", nargs="+", help="export files (.duckdb) or directories")
    audit.add_argument("--trust", required=True, type=Path, help="trust file")
    audit.add_argument("--out", required=True, type=Path, help="directory for the pages")
    audit.set_defaults(handler=_audit)
    profile = sub.add_parser(
        "profile",
        help="sign a party profile (legal name, address, tax id, payment terms; SPEC §12)",
    )
    profile.add_argument("--key", required=True, type=Path, help="the party's private key file")
    profile.add_argument("--legal-name", required=True, help="the party's registered legal name")
    profile.add_argument("--address", action="append", default=[], help="one line; repeat")
    profile.add_argument("--tax-id", default="", help="VAT or tax registration number (optional)")
    profile.add_argument("--net-days", type=int, default=0, help="payment terms (0: on issue)")
    profile.add_argument("--remit-to", default="", help="where payments go (bank details)")
    profile.add_argument(
        "--issued-at-ms",
        type=int,
        required=True,
        help="when the party signed the profile (ms since the epoch, UTC)",
    )
    profile.add_argument("--out", required=True, type=Path, help="FILE.profile.json")
    profile.set_defaults(handler=_profile)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exports", nargs="+", help="export files (.duckdb) or directories")
    parser.add_argument("--trust", required=True, type=Path, help="trust file")
    parser.add_argument("--month", help="only the documents of this month, YYYY-MM")


def _fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return 2


def _invoice(args: argparse.Namespace) -> int:
    from billview.invoice_html import to_html

    try:
        docs = build_documents(args)
        out: Path = args.out
        if out.exists() and not out.is_dir():
            raise Refused(f"--out {out}: not a directory")
        out.mkdir(parents=True, exist_ok=True)
    except Refused as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"--out {args.out}: {exc.strerror}")
    for doc in docs:
        (out / f"{doc.number}.json").write_bytes(encode(doc))
        (out / f"{doc.number}.html").write_text(to_html(doc), encoding="utf-8")
        total = ", ".join(f"{a.total} {a.currency}" for a in doc.amounts)
        print(f"OK: {doc.number} {doc.kind} {doc.payer.id} -> {doc.payee.id} {doc.month}: {total}")
    if not docs:
        print("OK: no documents" + (f" for {args.month}" if args.month else ""))
    return 0


def _audit(args: argparse.Namespace) -> int:
    import time

    import duckdb

    from gridledger.audit import write_appendix

    try:
        trust = _trust(args.trust)
        paths = _paths(args.exports)
        if args.out.exists() and not args.out.is_dir():
            raise Refused(f"--out {args.out}: not a directory")
        args.out.mkdir(parents=True, exist_ok=True)
    except Refused as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"--out {args.out}: {exc.strerror}")
    for path in paths:
        try:
            appendix, page, usage = write_appendix(
                path, args.trust, trust, args.out, lambda: time.time_ns() // 1_000_000
            )
        except (duckdb.Error, OSError) as exc:
            return _fail(f"{path}: cannot read it as an export: {str(exc).splitlines()[0]}")
        print(f"OK: {page} ({appendix.verdict}), {usage} ({appendix.usage_rows} samples)")
    return 0


def _profile(args: argparse.Namespace) -> int:
    import msgspec

    from proto.errors import KeyFileError
    from proto.keys import load_signing_key
    from proto.profile import PartyProfile, sign_profile

    try:
        key = load_signing_key(args.key)
    except KeyFileError as exc:
        return _fail(f"--key {args.key}: {exc}")
    try:
        profile = msgspec.convert(
            {
                "type": "profile",
                "party_id": key.name,
                "legal_name": args.legal_name,
                "address": args.address,
                "tax_id": args.tax_id,
                "net_days": args.net_days,
                "remit_to": args.remit_to,
                "issued_at_ms": args.issued_at_ms,
            },
            PartyProfile,
        )
    except msgspec.ValidationError as exc:
        return _fail(f"profile: {exc}")
    if args.out.exists():
        return _fail(f"--out {args.out} exists; not overwriting")
    try:
        args.out.write_bytes(sign_profile(profile, key))
    except OSError as exc:
        return _fail(f"--out {args.out}: {exc.strerror}")
    print(f"OK: {args.out} (profile of {key.name})")
    return 0


def _focus(args: argparse.Namespace) -> int:
    from billview.focus import focus_rows, write_focus

    out: Path = args.out
    try:
        if out.suffix not in (".csv", ".parquet"):
            raise Refused(f"--out {out}: FILE.csv or FILE.parquet")
        docs = build_documents(args)
        rows = focus_rows(docs)
        write_focus(rows, out)
    except Refused as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"--out {out}: {exc.strerror}")
    print(f"OK: {out}: {len(rows)} rows from {len(docs)} documents")
    return 0


def build_documents(args: argparse.Namespace) -> list[Invoice]:
    """Verify every export; the documents of the FINAL ones (Refused if any is not)."""
    if args.month is not None and not _MONTH.match(args.month):
        raise Refused(f"--month {args.month!r}: YYYY-MM, e.g. 2026-01")
    trust = _trust(args.trust)
    profiles: dict[str, Profile] = {}
    if getattr(args, "profiles", None) is not None:
        from proto.profile import ProfileError, load_profiles

        try:
            signed = load_profiles(args.profiles, trust)
        except (ProfileError, OSError) as exc:
            raise Refused(str(exc)) from exc
        profiles = {
            pid: Profile(
                legal_name=p.legal_name,
                address=list(p.address),
                tax_id=p.tax_id,
                net_days=p.net_days,
                remit_to=p.remit_to,
            )
            for pid, p in signed.items()
        }
    placements = verified_placements(_paths(args.exports), trust)
    try:
        return invoices(placements, profiles, args.month)
    except ValueError as exc:  # lines that do not give the statement's figure
        raise Refused(str(exc)) from exc


def _trust(path: Path) -> TrustFile:
    try:
        return load_trust(path)
    except OSError as exc:
        raise Refused(f"--trust {path}: {exc.strerror or 'unreadable'}") from exc
    except TrustError as exc:
        raise Refused(f"--trust: {exc}") from exc


def _paths(operands: list[str]) -> list[Path]:
    from verifier.cli import export_paths
    from verifier.errors import UnusableInput

    try:
        paths = export_paths(operands)
    except UnusableInput as exc:
        raise Refused(str(exc)) from exc
    for path in paths:
        if not path.is_file():
            raise Refused(f"{path}: no such export file")
    return paths


def verified_placements(paths: list[Path], trust: TrustFile) -> list[VerifiedPlacement]:
    """Each export verified with ``trust`` and FINAL, as the invoice builder reads it."""
    seen: dict[str, Path] = {}
    out = []
    for path in paths:
        placed = verified_placement(path, trust)
        pid = placed.terms.placement_id
        if pid in seen:
            raise Refused(f"{path}: placement {pid} is also in {seen[pid]}; give one export each")
        seen[pid] = path
        out.append(placed)
    return out


def verified_placement(path: Path, trust: TrustFile) -> VerifiedPlacement:
    """One export through the verifier's checklist; refused unless FINAL."""
    from verifier.verify import verify_export

    report = verify_export(path, trust, bill=True)
    if not report.ok:
        first = report.findings.kept[0].line() if report.findings.kept else report.error
        raise Refused(f"{path}: not verified ({report.verdict}): {first}")
    if not report.is_final:
        why = "; ".join(report.provisional) or "not final"
        raise Refused(f"{path}: PROVISIONAL, not FINAL: {why}")
    if report.bill is None:
        raise Refused(f"{path}: no bill could be gathered: {report.bill_error or 'no statement'}")
    doc = report.bill.doc(report)
    facts = report.bill.facts
    periods = _final_periods(path, report.periods)
    if not periods:
        raise Refused(f"{path}: no final statement")
    delivered = sum(g.delivered_mgms for g in doc.gpus)
    if delivered != periods[0].totals.delivered_mgms:  # the split's weights (SPEC §11.3)
        raise Refused(
            f"{path}: the GPUs delivered {delivered} milli-GPU-ms, period 0's statement "
            f"{periods[0].totals.delivered_mgms}"
        )
    return VerifiedPlacement(
        terms=facts.terms,
        periods=periods,
        delivered_mgms={g.uuid: g.delivered_mgms for g in doc.gpus},
        service_end_ms=doc.effective_end_ms,
        assignments={
            r.assignment_id: (tuple(r.gpus), r.rate_per_gpu_hour_minor) for r in doc.resale
        },
    )


@dataclass(frozen=True)
class _Row:
    statement: Statement
    arrived_ms: int


def _final_periods(path: Path, periods: list[dict[str, object]]) -> tuple[FinalPeriod, ...]:
    """The verified periods with their statements' heads and resale lists, and when each
    period's last record reached the log, read from the export the verifier just passed;
    a statement that does not carry the verified figures is refused."""
    rows = _statement_rows(path, [int(str(p["through_index"])) for p in periods])
    out = []
    for p in periods:
        through = int(str(p["through_index"]))
        totals = Totals(**{name: int(str(p[name])) for name in Totals.__struct_fields__})
        row = rows.get(through)
        if row is None or not row.statement.final or row.statement.totals != totals:
            raise Refused(f"{path}: no final statement through {through} with the verified totals")
        out.append(
            FinalPeriod(
                period=int(str(p["period"])),
                through_index=through,
                head=row.statement.head,
                arrived_ms=row.arrived_ms,
                totals=totals,
                resale=tuple(row.statement.resale),
            )
        )
    return tuple(out)


def _statement_rows(path: Path, indices: list[int]) -> dict[int, _Row]:
    import duckdb

    from verifier.source import blob

    if not indices:
        return {}
    con = duckdb.connect(str(path), read_only=True)
    try:
        wanted = ", ".join(str(int(i)) for i in indices)  # integers: nothing to quote
        statements = con.execute(
            f"SELECT through_index, envelope FROM statements WHERE through_index IN ({wanted})"
        ).fetchall()
        records = con.execute(
            f"SELECT chain_index, envelope FROM ledger_records WHERE chain_index IN ({wanted})"
        ).fetchall()
    except duckdb.Error as exc:
        raise Refused(f"{path}: cannot read its statements: {exc}") from exc
    finally:
        con.close()
    arrived: dict[int, int] = {}
    for index, raw in records:
        record = _open(path, blob(raw))
        if isinstance(record, LedgerRecord) and record.arrived_ms is not None:
            arrived[int(index)] = record.arrived_ms
    out: dict[int, _Row] = {}
    for index, raw in statements:
        record = _open(path, blob(raw))
        if isinstance(record, Statement) and record.final:
            out[int(index)] = _Row(record, arrived.get(int(index), 0))
    return out


def _open(path: Path, raw: bytes) -> object:
    try:
        return open_envelope(raw).record
    except ProtoError as exc:
        raise Refused(f"{path}: an envelope does not decode: {exc}") from exc
