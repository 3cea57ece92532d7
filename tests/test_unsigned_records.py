"""Issue 15, SPEC §8 "Authenticating records": a LedgerRecord carries no signature of its
own (export format version 2); the ledger-signed checkpoint covering it and the prev chain
authenticate it. Every tamper class a record signature used to catch is still caught.

The attacker here has everything but the ledger key: it rewrites the records and re-links
``prev`` perfectly (no record signature stops it any more), and keeps the ledger-signed
checkpoints and statements of the honest export, or signs its own with another key. The
checkpoint's root (and the statement's head) is what betrays it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import pytest
from test_verifier_exports import (
    ExportBuilder,
    Scenario,
    explain,
    full_scenario,
    verify,
)

from devtools.builders import StreamWriter, sample
from proto.envelope import (
    Envelope,
    Signature,
    add_signatures,
    decode_envelope,
    encode_envelope,
    open_envelope,
)
from proto.keys import SigningKey
from proto.note import checkpoint_body, parse_checkpoint_body, parse_note, sign_note
from verifier.inclusion import make_inclusion_bundle, verify_inclusion_bundle
from verifier.verify import ExportReport


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return full_scenario(tmp_path_factory.mktemp("v2"))


def _copy(b: ExportBuilder, **changes: object) -> ExportBuilder:
    """Another builder over the same inputs (fresh records), e.g. an attacker's."""
    items = [dataclasses.replace(i, record=None, record_envelope=b"") for i in b.items]
    fields = {
        "cast": b.cast,
        "terms": b.terms,
        "items": items,
        "statements_at": list(b.statements_at),
        "checkpoints_at": b.checkpoints_at,
        "format_version": b.format_version,
    }
    fields.update(changes)
    return ExportBuilder(**fields)  # type: ignore[arg-type]


def _rules(report: ExportReport) -> set[str]:
    return report.findings.rules()


def _keep_signed(honest_path: Path, path: Path) -> Path:
    """Put the honest export's ledger-signed statements and checkpoints into ``path``: the
    attacker cannot sign its own under the ledger key."""
    con = duckdb.connect(str(path))
    con.execute(f"ATTACH '{honest_path}' AS h (READ_ONLY)")
    for table in ("statements", "checkpoints"):
        con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} SELECT * FROM h.{table}")
    con.close()
    return path


def _record_envelopes(path: Path) -> list[bytes]:
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute("SELECT envelope FROM ledger_records ORDER BY chain_index").fetchall()
    con.close()
    return [bytes(r[0]) for r in rows]


def test_v2_export_has_unsigned_records_and_verifies_final(honest: Scenario) -> None:
    envelopes = _record_envelopes(honest.path)
    assert envelopes and all(decode_envelope(e).signatures == [] for e in envelopes)
    report = verify(honest.path, honest.trust)
    assert report.ok and report.is_final, explain(report)


def test_v1_export_still_verifies_and_heads_and_roots_are_unchanged(
    honest: Scenario, tmp_path: Path
) -> None:
    v1 = _copy(honest.builder, format_version="1").write(tmp_path / "v1.duckdb")
    report = verify(v1, honest.trust)
    assert report.ok and report.is_final, explain(report)
    assert all(len(decode_envelope(e).signatures) == 1 for e in _record_envelopes(v1))
    # prev, the leaves and the statement heads are over the payload: signing changes none.
    sql = (
        "SELECT (SELECT list(record_hash ORDER BY chain_index) FROM ledger_records),"
        " (SELECT list(note ORDER BY size) FROM checkpoints),"
        " (SELECT list(envelope ORDER BY through_index) FROM statements)"
    )
    seen = []
    for path in (v1, honest.path):
        con = duckdb.connect(str(path), read_only=True)
        seen.append(con.execute(sql).fetchall()[0])
        con.close()
    assert seen[0] == seen[1]
    payloads = [open_envelope(e).payload for e in _record_envelopes(v1)]
    assert payloads == [open_envelope(e).payload for e in _record_envelopes(honest.path)]


def test_v1_record_without_its_signature_is_caught(honest: Scenario, tmp_path: Path) -> None:
    v1 = _copy(honest.builder, format_version="1")
    path = v1.write(tmp_path / "v1.duckdb")
    unsigned = encode_envelope(
        Envelope(payload=open_envelope(v1.items[3].record_envelope).payload, signatures=[])
    )
    con = duckdb.connect(str(path))
    con.execute("UPDATE ledger_records SET envelope = ? WHERE chain_index = 3", [unsigned])
    con.close()
    report = verify(path, honest.trust)
    assert not report.ok and "CHAIN_SIGNATURE" in _rules(report), explain(report)


@pytest.mark.parametrize("key", ["ledger", "stranger", "bad"])
def test_a_signature_present_on_a_v2_record_is_still_checked(
    honest: Scenario, tmp_path: Path, key: str
) -> None:
    path = _copy(honest.builder).write(tmp_path / "v2.duckdb")
    envelope = decode_envelope(_record_envelopes(path)[5])
    if key == "ledger":
        signed = add_signatures(envelope, [honest.cast.ledger])
    elif key == "stranger":
        signed = add_signatures(envelope, [SigningKey.from_seed_text("x", "not-the-ledger")])
    else:
        good = add_signatures(envelope, [honest.cast.ledger]).signatures[0]
        flipped = bytes([good.sig[0] ^ 1]) + good.sig[1:]
        signed = Envelope(envelope.payload, [Signature(keyid=good.keyid, sig=flipped)])
    con = duckdb.connect(str(path))
    con.execute(
        "UPDATE ledger_records SET envelope = ? WHERE chain_index = 5", [encode_envelope(signed)]
    )
    con.close()
    report = verify(path, honest.trust)
    if key == "ledger":  # a record written under version 1 in a v2 export: fine
        assert report.ok and report.is_final, explain(report)
    else:
        assert not report.ok and "CHAIN_SIGNATURE" in _rules(report), explain(report)


# ---- tamper classes on a v2 export: the attacker re-chains, keeps the signed objects ----


def _tampered(honest: Scenario, tmp: Path, edit: str) -> ExportReport:
    # The signed objects come from the honest export (``_keep_signed``), not from here.
    b = _copy(honest.builder, statements_at=[], checkpoints_at=[])
    items = b.items
    if edit == "changed":  # one record's decision rewritten
        i = honest.index_of("usage", "rejected", "GPU_NOT_IN_TERMS")
        items[i] = dataclasses.replace(items[i], status="accepted", reason="")
    elif edit == "dropped":  # a rejected input (and its record) removed
        del items[honest.index_of("usage", "rejected", "NODE_KEY_UNKNOWN")]
    elif edit == "reordered":
        i = honest.index_of("adjustment", "accepted")
        items[i], items[i + 2] = items[i + 2], items[i]
    elif edit == "inserted":  # an input that was never in the log
        intruder = StreamWriter(SigningKey.from_seed_text("y", "intruder"), "p-full", "node-a")
        gpus = honest.terms.gpus
        raw = intruder.event(
            honest.terms.window_start_ms, honest.terms.window_start_ms + 1000, [sample(gpus[0])]
        )
        items.insert(
            4, dataclasses.replace(items[4], raw=raw, status="rejected", reason="NODE_KEY_UNKNOWN")
        )
    else:
        raise AssertionError(edit)
    path = b.write(tmp / f"{edit}.duckdb")
    return verify(_keep_signed(honest.path, path), honest.trust)


@pytest.mark.parametrize("edit", ["changed", "dropped", "reordered", "inserted"])
def test_each_tamper_class_is_caught_by_the_checkpoint_root(
    honest: Scenario, tmp_path: Path, edit: str
) -> None:
    report = _tampered(honest, tmp_path, edit)
    rules = _rules(report)
    assert not report.ok, explain(report)
    # The ledger-signed root no longer matches (or, one record fewer, the signed size is
    # past the log), and what it covered is not covered now.
    assert "RECORD_UNCOVERED" in rules, explain(report)
    shown = {"CHECKPOINT_ROOT", "CHECKPOINT_SIZE"} if edit == "dropped" else {"CHECKPOINT_ROOT"}
    assert shown & rules, explain(report)


def test_forged_log_with_checkpoints_signed_without_the_ledger_key(
    honest: Scenario, tmp_path: Path
) -> None:
    # A whole log re-chained after one rejection was flipped, with every checkpoint and
    # statement re-signed by a key that is not the trusted ledger key.
    forger = dataclasses.replace(honest.cast, ledger=SigningKey.from_seed_text("l", "forger"))
    b = _copy(honest.builder, cast=forger)
    i = honest.index_of("usage", "rejected", "GPU_NOT_IN_TERMS")
    b.items[i] = dataclasses.replace(b.items[i], status="accepted", reason="")
    report = verify(b.write(tmp_path / "forged.duckdb"), honest.trust)
    rules = _rules(report)
    assert {"CHECKPOINT_SIGNATURE", "RECORD_UNCOVERED"} <= rules, explain(report)


def test_records_past_the_last_checkpoint_are_a_finding_in_v2_only(
    honest: Scenario, tmp_path: Path
) -> None:
    n = len(honest.builder.items)
    v2 = _copy(honest.builder, checkpoints_at=[1, 14]).write(tmp_path / "v2.duckdb")
    report = verify(v2, honest.trust)
    assert not report.ok, explain(report)
    uncovered = next(f for f in report.findings.kept if f.rule == "RECORD_UNCOVERED")
    assert uncovered.record == f"ledger_records 14..{n - 1}"
    none = _copy(honest.builder, checkpoints_at=[]).write(tmp_path / "none.duckdb")
    assert "RECORD_UNCOVERED" in _rules(verify(none, honest.trust))
    # Version 1: each record is signed, so the tail is only provisional (SPEC §9).
    v1 = _copy(honest.builder, checkpoints_at=[1, 14], format_version="1")
    report = verify(v1.write(tmp_path / "v1.duckdb"), honest.trust)
    assert report.ok and not report.is_final, explain(report)
    assert any("unwitnessed tail" in r for r in report.provisional)


def test_a_checkpoint_from_another_key_covers_nothing(honest: Scenario, tmp_path: Path) -> None:
    # The honest records, but the head checkpoint replaced by one a stranger signed.
    path = _copy(honest.builder).write(tmp_path / "v2.duckdb")
    n = len(honest.builder.items)
    con = duckdb.connect(str(path))
    note = str(con.execute("SELECT note FROM checkpoints WHERE size = ?", [n]).fetchall()[0][0])
    body = parse_checkpoint_body(parse_note(note).body)
    stranger = sign_note(
        checkpoint_body(body), "gridledger-ledger", SigningKey.from_seed_text("s", "s")
    )
    con.execute("UPDATE checkpoints SET note = ? WHERE size = ?", [stranger.text(), n])
    con.close()
    rules = _rules(verify(path, honest.trust))
    assert {"CHECKPOINT_SIGNATURE", "RECORD_UNCOVERED"} <= rules


def test_inclusion_bundle_of_an_unsigned_record(honest: Scenario) -> None:
    bundle = make_inclusion_bundle(honest.path, 7)
    assert decode_envelope(bundle.record).signatures == []
    findings, record = verify_inclusion_bundle(
        bundle.record, bundle.proof, bundle.checkpoint, honest.trust
    )
    assert record is not None and record.index == 7 and findings.total == 0
    # The same record under another index's proof does not verify.
    other = make_inclusion_bundle(honest.path, 8)
    findings, _ = verify_inclusion_bundle(
        bundle.record, other.proof, other.checkpoint, honest.trust
    )
    assert {"PROOF_RECORD", "PROOF_PATH"} <= findings.rules()
