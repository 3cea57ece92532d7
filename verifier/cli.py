"""``gridledger verify`` (and ``python -m verifier``): check exports offline.

Three shapes of one command:

    verify FILE.duckdb... | DIR --trust TRUST.json [--json]
        Verify each export (every *.duckdb of DIR); with several, also print one
        reconciliation table per party role, per currency. Exit 0 all verified, 1 some
        export does not check out (findings printed), 2 some input unusable.

    verify inclusion --record RECORD.json --proof PROOF.json --checkpoint NOTE
                     --trust TRUST.json [--json]
        Check one LedgerRecord envelope against a checkpoint with its RFC 9162 path
        (``verifier/inclusion.py``): for a party who holds only that record.

    verify prove FILE.duckdb --index N --out DIR [--size N]
        Write record.json, proof.json and checkpoint.note for record N of an export.

The words ``inclusion`` and ``prove`` select a mode only as the first operand; an export
file with such a name is passed as ``./inclusion``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import structlog

from proto.trust import TrustError, TrustFile, load_trust
from verifier import limits
from verifier.errors import UnusableInput
from verifier.findings import Findings
from verifier.inclusion import make_inclusion_bundle, read_bundle_files, verify_inclusion_bundle
from verifier.progress import Progress
from verifier.report import (
    EXIT_FAILED,
    EXIT_UNUSABLE,
    EXIT_VERIFIED,
    exit_code,
    findings_json,
    render_run,
    run_json,
)
from verifier.verify import ExportReport, verify_export
from verifier.workers import OpenPool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``verify`` to the gridledger command."""
    parser = subparsers.add_parser(
        "verify",
        help="verify exports offline (exit 0 verified, 1 findings, 2 unusable input)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verify`` (shared with ``python -m verifier``)."""
    parser.add_argument("paths", nargs="+", metavar="FILE.duckdb|DIR")
    parser.add_argument("--trust", type=Path, help="trust file (gridledger-trust/v1)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument("--record", type=Path, help="inclusion: the LedgerRecord envelope file")
    parser.add_argument("--proof", type=Path, help="inclusion: the proof file")
    parser.add_argument("--checkpoint", type=Path, help="inclusion: the checkpoint note file")
    parser.add_argument("--index", type=int, help="prove: the record index")
    parser.add_argument("--size", type=int, help="prove: the checkpoint size to prove against")
    parser.add_argument("--out", type=Path, help="prove: directory for the bundle files")
    parser.add_argument(
        "--pool",
        choices=("thread", "process", "inline"),
        default="thread",
        help="how signatures are spread over the cores (default: thread)",
    )
    parser.add_argument("--workers", type=int, default=None, help="worker count (default: cores)")


def _quiet_logs() -> None:
    """Logs go to stderr, warnings and worse only: stdout carries the report (or JSON)."""
    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )


def handle(args: argparse.Namespace) -> int:
    """Dispatch to the mode chosen by the first operand."""
    _quiet_logs()
    paths: list[str] = args.paths
    if paths[0] == "inclusion":
        return _inclusion(args)
    if paths[0] == "prove":
        return _prove(args)
    return _verify(args)


def _fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return EXIT_UNUSABLE


def _load_trust(args: argparse.Namespace) -> TrustFile:
    if args.trust is None:
        raise UnusableInput("--trust", "a trust file is required")
    try:
        # load_trust reads at most its bound (proto.trust.MAX_TRUST_FILE_BYTES).
        return load_trust(args.trust)
    except OSError as exc:
        raise UnusableInput(str(args.trust), exc.strerror or "unreadable") from exc
    except TrustError as exc:
        raise UnusableInput(str(args.trust), str(exc)) from exc


def export_paths(operands: list[str]) -> list[Path]:
    """Files as given; a directory stands for its *.duckdb files, sorted."""
    out: list[Path] = []
    for operand in operands:
        path = Path(operand)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix == ".duckdb" and p.is_file())
            if not found:
                raise UnusableInput(operand, "directory holds no .duckdb export")
            out.extend(found)
        else:
            out.append(path)
        if len(out) > limits.MAX_EXPORTS_PER_RUN:
            raise UnusableInput(operand, f"more than {limits.MAX_EXPORTS_PER_RUN} exports")
    return out


def _verify(args: argparse.Namespace) -> int:
    try:
        trust = _load_trust(args)
        paths = export_paths(args.paths)
    except UnusableInput as exc:
        return _fail(str(exc))
    reports: list[ExportReport] = []
    progress = Progress()
    with OpenPool[Any](args.pool, args.workers) as pool:
        for path in paths:
            reports.append(verify_export(path, trust, pool=pool, progress=progress))
    if args.json:
        print(json.dumps(run_json(reports), indent=2))
    else:
        print("\n".join(render_run(reports)))
    return exit_code(reports)


def _inclusion(args: argparse.Namespace) -> int:
    if len(args.paths) != 1 or not (args.record and args.proof and args.checkpoint):
        return _fail("verify inclusion needs --record, --proof, --checkpoint and --trust")
    try:
        trust = _load_trust(args)
        record_raw, proof, note = read_bundle_files(args.record, args.proof, args.checkpoint)
    except UnusableInput as exc:
        return _fail(str(exc))
    findings, record = verify_inclusion_bundle(record_raw, proof, note, trust)
    code = EXIT_FAILED if findings else EXIT_VERIFIED
    if args.json:
        data: dict[str, Any] = {
            "exit_code": code,
            "placement_id": proof.placement_id,
            "index": proof.index,
            "tree_size": proof.tree_size,
            "record": None if record is None else _record_json(record),
            "findings": findings_json(findings),
        }
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(_inclusion_lines(args.record, proof.index, proof.tree_size, findings)))
    return code


def _record_json(record: Any) -> dict[str, Any]:
    import msgspec

    data: dict[str, Any] = msgspec.to_builtins(record)
    return data


def _inclusion_lines(path: Path, index: int, size: int, findings: Findings) -> list[str]:
    if not findings:
        return [f"OK: {path}: record {index} is included in the checkpoint of size {size}"]
    lines = [f"FAIL: {path}: record {index}: {findings.total} finding(s)"]
    return lines + [f"  {f.line()}" for f in findings.kept]


def _prove(args: argparse.Namespace) -> int:
    if len(args.paths) != 2 or args.index is None or args.out is None:
        return _fail("verify prove needs FILE.duckdb, --index and --out")
    try:
        bundle = make_inclusion_bundle(Path(args.paths[1]), args.index, args.size)
    except UnusableInput as exc:
        return _fail(str(exc))
    written = bundle.write(args.out)
    print(f"OK: wrote {', '.join(str(p) for p in written)}")
    return EXIT_VERIFIED


def main(argv: list[str] | None = None) -> int:
    """``python -m verifier``: the same as ``gridledger verify``."""
    parser = argparse.ArgumentParser(
        prog="python -m verifier",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return handle(parser.parse_args(argv))
