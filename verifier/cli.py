"""``gridledger verify`` (and ``python -m verifier``): check exports offline.

Three shapes of one command:

    verify FILE.duckdb... | DIR --trust TRUST.json [--checkpoint NOTE] [--witness-state DIR]
           [--json] [--html OUT]
        Verify each export (every *.duckdb of DIR); with several, also print one
        reconciliation table per party role, per currency, counting each placement once
        (copies and older views set aside; two views that disagree are equivocation).
        ``--checkpoint NOTE``: a checkpoint you kept — the export must extend it.
        ``--witness-state DIR``: your witness's state directory — each export must extend
        the last checkpoint your witness cosigned of its placement (SPEC §9).
        Exit 0 every export FINAL (closed, final statement, witnessed as the trust file
        requires), 3 verified but PROVISIONAL (open, unwitnessed, cut short), 1 some
        export does not check out or the exports disagree, 2 some input unusable.
        ``--html OUT``: also write each placement's bill as the verifier recomputed it —
        OUT/<placement>.<buyer|operator|desk>.html (printable), OUT/<placement>.csv and
        .json line items (``verifier/bill.py``); the verdict is on every page.

    verify inclusion --record RECORD.json --proof PROOF.json --checkpoint NOTE
                     --trust TRUST.json [--json]
        Check one LedgerRecord envelope against a checkpoint with its RFC 9162 path
        (``verifier/inclusion.py``): for a party who holds only that record.

    verify prove FILE.duckdb --index N --out DIR [--size N]
        Write record.json, proof.json and checkpoint.note for record N of an export.

    verify prove FILE.duckdb --from N --out DIR [--size M]
        Write consistency.json (RFC 9162 proof from size N to M) and the two checkpoint
        notes (``verifier/consistency.py``).

    verify consistency --proof consistency.json --old OLD.note --new NEW.note --trust T
        Check that the newer ledger-signed checkpoint extends the older one.

The words ``inclusion`` and ``prove`` select a mode only as the first operand; an export
file with such a name is passed as ``./inclusion``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from proto.durable_io import read_at_most
from proto.note import MAX_NOTE_BYTES
from proto.trust import TrustError, TrustFile, load_trust
from verifier import limits
from verifier.consistency import (
    check_consistency,
    make_consistency_bundle,
    read_consistency_files,
)
from verifier.copies import CopyFindings, compare_copies, kept_placement, read_copy
from verifier.errors import UnusableInput
from verifier.findings import Findings
from verifier.inclusion import make_inclusion_bundle, read_bundle_files, verify_inclusion_bundle
from verifier.kept import judge_kept, kept_for
from verifier.progress import Progress
from verifier.reconcile import reconcile, render
from verifier.report import (
    EXIT_FAILED,
    EXIT_UNUSABLE,
    EXIT_VERIFIED,
    exit_code,
    export_json,
    findings_json,
    render_export,
    run_json,
)
from verifier.resume import read_state, state_of_export, verify_since, write_state
from verifier.state import VERIFIED
from verifier.verify import ExportReport, small_export, verify_export, verify_exports
from verifier.workers import OpenPool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``verify`` to the gridledger command."""
    parser = subparsers.add_parser(
        "verify",
        help="verify exports offline (exit 0 final, 3 provisional, 1 findings, 2 unusable input)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``verify`` (shared with ``python -m verifier``)."""
    parser.add_argument(
        "paths", nargs="+", metavar="FILE.duckdb|DIR", help="exports, or directories of them"
    )
    parser.add_argument("--trust", type=Path, help="trust file (gridledger-trust/v1)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="also write each placement's bill (HTML per party, CSV, JSON) into OUT",
    )
    parser.add_argument("--record", type=Path, help="inclusion: the LedgerRecord envelope file")
    parser.add_argument("--proof", type=Path, help="inclusion: the proof file")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="a checkpoint note you kept: the export must extend it (inclusion: the note)",
    )
    parser.add_argument(
        "--witness-state",
        type=Path,
        metavar="DIR",
        help="your witness's state directory: each export must extend the last checkpoint "
        "it cosigned of that placement",
    )
    parser.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="resume from your verified state at a checkpoint: the export is one since it "
        "(SPEC §8.5)",
    )
    parser.add_argument(
        "--state-out",
        type=Path,
        metavar="FILE",
        help="keep your verified state at the export's head checkpoint (SPEC §8.5)",
    )
    parser.add_argument("--index", type=int, help="prove: the record index")
    parser.add_argument("--size", type=int, help="prove: the checkpoint size to prove against")
    parser.add_argument("--out", type=Path, help="prove: directory for the bundle files")
    parser.add_argument(
        "--from",
        dest="from_size",
        type=int,
        help="prove: a consistency proof from this tree size (to --size, default: all)",
    )
    parser.add_argument("--old", type=Path, help="consistency: the older checkpoint note")
    parser.add_argument("--new", type=Path, help="consistency: the newer checkpoint note")
    parser.add_argument(
        "--pool",
        choices=("thread", "process", "inline"),
        default=None,
        help="how signatures are spread over the cores (default: a process per core for a "
        "big export, this one for a small one); given, it serves every export verified alone "
        "and, with several files, the big ones",
    )
    parser.add_argument("--workers", type=int, default=None, help="worker count (default: cores)")


def _quiet_logs() -> None:
    """Logs go to stderr, warnings and worse only: stdout carries the report (or JSON)."""
    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def handle(args: argparse.Namespace) -> int:
    """Dispatch to the mode chosen by the first operand."""
    _quiet_logs()
    paths: list[str] = args.paths
    if paths[0] == "inclusion":
        return _inclusion(args)
    if paths[0] == "prove":
        return _prove(args)
    if paths[0] == "consistency":
        return _consistency(args)
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
    except TrustError as exc:  # its message names the file: the option, not the path again
        raise UnusableInput("--trust", str(exc)) from exc


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
    if args.state is not None or args.state_out is not None:
        return _verify_resumable(args)
    try:
        trust = _load_trust(args)
        paths = export_paths(args.paths)
        kept = _read_kept(args.checkpoint) if args.checkpoint is not None else None
        if args.witness_state is not None and not args.witness_state.is_dir():
            raise UnusableInput(str(args.witness_state), "--witness-state is not a directory")
        if args.html is not None:
            _html_dir(args.html)
    except UnusableInput as exc:
        return _fail(str(exc))
    reports: list[ExportReport] = []
    progress = Progress()
    # A process pool by default: its workers read their own chain-index ranges, and a
    # 200k-event export took 15.4 s and 145 us of CPU per event against the thread
    # pool's 22.8 s and 162 (bench/verifier_1m.py). No process starts before a big
    # export needs one; a small one is verified in this process unless --pool says so
    # for a file verified alone (several files: ``verify_exports`` keeps small ones inline).
    asked = args.pool is not None
    with OpenPool[Any](args.pool or "process", args.workers) as pool:
        if args.html is None and len(paths) > 1:
            # Many exports: small ones priced together, each report as the export's alone
            # (``verify_exports``), a batch at a time (the rows it keeps are bounded).
            for at in range(0, len(paths), limits.VERIFY_BATCH_EXPORTS):
                chunk = paths[at : at + limits.VERIFY_BATCH_EXPORTS]
                reports += verify_exports(chunk, trust, pool=pool, progress=progress)
        else:
            for path in paths:
                reports.append(
                    verify_export(
                        path,
                        trust,
                        pool=pool if asked or not small_export(path) else None,
                        progress=progress,
                        bill=args.html is not None,
                    )
                )
    try:
        across = _across_exports(reports, trust, kept, args.witness_state)
    except UnusableInput as exc:  # a witness state that is not one
        return _fail(str(exc))
    standing = [r for r in reports if r.path not in across.set_aside]
    code = exit_code(reports, run_failed=across.failed)
    written = _write_bills(standing, args.html) if args.html is not None else []
    if args.json:
        data = run_json(standing, {"copies": across.to_json(), "exit_code": code})
        data["exports"] = [export_json(r) for r in reports]
        if args.html is not None:
            data["statement_files"] = [str(p) for p in written]
        if len(reports) > 1:  # each placement once: copies and older views set aside
            data["reconciliation"] = reconcile(standing).to_json()
        print(json.dumps(data, indent=2))
    else:
        lines: list[str] = []
        for report in reports:
            lines += render_export(report)
        lines += across.lines
        if len(reports) > 1:
            lines += render(reconcile(standing))
        if args.html is not None:
            lines += _bill_lines(standing, written)
        print("\n".join(lines))
    return code


def _verify_resumable(args: argparse.Namespace) -> int:
    """``verify EXPORT [--state FILE] [--state-out FILE]`` (SPEC §8.5): one export, checked
    from the state at the checkpoint it is since (``--state``) or whole, and the state at
    its head kept (``--state-out``) when nothing was found."""
    try:
        trust = _load_trust(args)
        paths = export_paths(args.paths)
        if len(paths) != 1:
            raise UnusableInput("--state", "one export at a time")
        path = paths[0]
        if args.state is not None:
            report, state = verify_since(path, trust, read_state(args.state, trust))
        else:
            report = verify_export(path, trust)
            state = None
            if args.state_out is not None and report.verdict == VERIFIED:
                state = state_of_export(path, report)
        if args.state_out is not None and state is not None:
            write_state(args.state_out, state)
    except UnusableInput as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{args.state_out}: cannot write the state: {exc.strerror}")
    code = exit_code([report], run_failed=False)
    if args.json:
        data = run_json([report], {"exit_code": code})
        data["exports"] = [export_json(report)]
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(render_export(report)))
    return code


def _html_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnusableInput(
            str(out), f"cannot create the --html directory: {exc.strerror}"
        ) from exc


def _write_bills(reports: list[ExportReport], out: Path) -> list[Path]:
    """Each verified placement's bill: a page per party, CSV and JSON (see --html)."""
    from billview import render as bill_render

    written: list[Path] = []
    names: Counter[str] = Counter()
    for report in reports:
        if report.bill is None:
            continue
        doc = report.bill.doc(report)
        stem = doc.placement_id
        names[stem] += 1
        if names[stem] > 1:  # two standing exports of one placement (they disagree)
            stem = f"{stem}.{Path(report.path).stem}-{names[stem]}"
        forms = [("CSV", f"{stem}.csv"), ("JSON", f"{stem}.json")]
        parties = bill_render.parties_of(doc)  # the roles, then each new buyer (SPEC §7.10)
        links = forms + [(f"{p}'s page", f"{stem}.{p}.html") for p in parties]
        files = {f"{stem}.{p}.html": bill_render.to_html(doc, p, links) for p in parties}
        files[f"{stem}.csv"] = bill_render.to_csv(doc)
        files[f"{stem}.json"] = bill_render.to_json(doc).decode()
        for name, text in files.items():
            path = out / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def _bill_lines(reports: list[ExportReport], written: list[Path]) -> list[str]:
    lines = [f"statement: {p}" for p in written if p.name.endswith(".buyer.html")]
    if written:
        lines.append("  (the operator's and desk's pages, CSV and JSON line items beside it)")
    lines += [f"statement: {r.path}: not written: {r.bill_error}" for r in reports if r.bill_error]
    return lines


def _read_kept(path: Path) -> str:
    try:
        raw = read_at_most(path, MAX_NOTE_BYTES)
    except OSError as exc:
        raise UnusableInput(str(path), f"cannot read the kept checkpoint: {exc.strerror}") from exc
    if len(raw) > MAX_NOTE_BYTES:
        raise UnusableInput(str(path), f"a checkpoint note is at most {MAX_NOTE_BYTES} bytes")
    text = raw.decode("utf-8", "replace")
    if kept_placement(text) is None:
        raise UnusableInput(str(path), "not a gridledger checkpoint note")
    return text


@dataclass
class _Across:
    """What comparing the exports with each other (and a kept checkpoint) found."""

    lines: list[str] = field(default_factory=list)
    set_aside: set[str] = field(default_factory=set)  # copies that do not count twice
    failed: bool = False
    copies: CopyFindings | None = None
    kept: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        c = self.copies
        return {
            "duplicates": [list(d) for d in c.duplicates] if c else [],
            "superseded": [list(d) for d in c.superseded] if c else [],
            "equivocations": c.equivocations if c else [],
            "kept_checkpoint": self.kept,
        }


def _across_exports(
    reports: list[ExportReport],
    trust: TrustFile,
    kept: str | None,
    witness_state: Path | None = None,
) -> _Across:
    """SPEC §9 "Many exports" and "A kept checkpoint" (a kept note, a witness's state)."""
    out = _Across()
    verified = [r for r in reports if r.ok]
    _judge_kept(out, verified, trust, kept, witness_state)
    verified = [r for r in verified if r.ok]  # an export a kept checkpoint fails is out
    counts = Counter(r.placement_id for r in verified)
    several = [r for r in verified if counts[r.placement_id] > 1]
    if several:
        out.copies = compare_copies([read_copy(r.path, r.placement_id) for r in several])
        for copy, same in out.copies.duplicates:
            out.set_aside.add(copy)
            out.lines.append(f"COPY: {copy} is the same log as {same} (counted once)")
        for older, newer in out.copies.superseded:
            out.set_aside.add(older)
            out.lines.append(f"SUPERSEDED: {older} is an older view of {newer} (not counted)")
        for fork in out.copies.equivocations:
            out.failed = True
            out.lines.append(
                f"FAIL: EQUIVOCATION: placement {fork['placement_id']}: {fork['path_a']} "
                f"({fork['size_a']} records) and {fork['path_b']} ({fork['size_b']} records) "
                "are two ledger-signed views that no append-only log can both produce"
            )
            out.lines += _indent_note("checkpoint A", fork["checkpoint_a"])
            out.lines += _indent_note("checkpoint B", fork["checkpoint_b"])
    return out


def _judge_kept(
    out: _Across,
    verified: list[ExportReport],
    trust: TrustFile,
    kept: str | None,
    witness_state: Path | None,
) -> None:
    """Each verified export against the kept checkpoint and the witness's state of its
    placement: one it does not extend gets the finding (``verifier/kept.py``)."""
    if kept is not None and not any(r.placement_id == kept_placement(kept) for r in verified):
        out.failed = True
        out.lines.append(
            f"FAIL: the kept checkpoint is of placement {kept_placement(kept)}; no verified "
            "export of it was given"
        )
    for r in verified:
        for result in judge_kept(r, trust, kept_for(r, kept, witness_state)):
            out.kept.append(result)
            if result["ok"]:
                out.lines.append(f"OK: {r.path}: {result['detail']} ({result['source']})")
            else:
                out.failed = True
                out.lines.append(
                    f"FAIL: {r.path}: {result['rule']}: {result['detail']} ({result['source']})"
                )


def _indent_note(label: str, note: str) -> list[str]:
    if not note:
        return [f"  {label}: (none in the export)"]
    return [f"  {label}:"] + [f"    {line}" for line in note.rstrip("\n").split("\n")]


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
    if args.from_size is not None:
        return _prove_consistency(args)
    if len(args.paths) != 2 or args.index is None or args.out is None:
        return _fail("verify prove needs FILE.duckdb, --index (or --from) and --out")
    path = Path(args.paths[1])
    return _write_bundle(lambda: make_inclusion_bundle(path, args.index, args.size), args.out)


def _prove_consistency(args: argparse.Namespace) -> int:
    if len(args.paths) != 2 or args.out is None:
        return _fail("verify prove --from needs FILE.duckdb and --out")
    path = Path(args.paths[1])
    return _write_bundle(lambda: make_consistency_bundle(path, args.from_size, args.size), args.out)


class _Bundle(Protocol):
    def write(self, out_dir: Path) -> Sequence[Path]: ...


def _write_bundle(make: Callable[[], _Bundle], out: Path) -> int:
    """Build a proof bundle and write its files; one FAIL line if the export cannot serve."""
    try:
        bundle = make()
    except UnusableInput as exc:
        return _fail(str(exc))
    written = bundle.write(out)
    print(f"OK: wrote {', '.join(str(p) for p in written)}")
    return EXIT_VERIFIED


def _consistency(args: argparse.Namespace) -> int:
    if len(args.paths) != 1 or not (args.proof and args.old and args.new):
        return _fail("verify consistency needs --proof, --old, --new and --trust")
    try:
        trust = _load_trust(args)
        proof, old_text, new_text = read_consistency_files(args.proof, args.old, args.new)
    except UnusableInput as exc:
        return _fail(str(exc))
    problems = check_consistency(proof, old_text, new_text, trust)
    if problems:
        print(f"FAIL: {args.new} does not extend {args.old}: " + "; ".join(problems))
        return EXIT_FAILED
    print(
        f"OK: placement {proof.placement_id}: the checkpoint of size {proof.second} extends "
        f"the one of size {proof.first}"
    )
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
