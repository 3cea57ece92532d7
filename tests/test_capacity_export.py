"""SPEC §6.5 "What the export carries": the capacity records a terms' decision read,
exported with the placement (EXPORT.md ``capacity_records``), re-folded by the verifier.

An honest export verifies with no capacity finding; the same export with a record removed
(the release that freed the GPU, the terms' own request), a record altered (re-signed by
another key), two records at one offset, or a request that is not the terms' fails with a
named finding. Rejected terms are checked the same way (``check_capacity_records``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pytest
from test_verifier_exports import ExportBuilder, verify

from devtools.builders import gpu, make_cast, make_terms, signed_terms
from proto.capacity_log import CapRelease, CapRequest, seal_capacity
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.records import ZERO_HASH
from proto.terms import canonical_uuid
from proto.trust import TrustedKey
from verifier.capacity_export import COLUMNS, TABLE, TermsInput, check_capacity_records
from verifier.findings import Findings

T0 = 1_767_225_600_000
HOUR = 3_600_000
CAST = make_cast("capacity-export")
OTHER = make_cast("capacity-export-2", ledger="ledger-2")  # another shard's ledger
OUTSIDER = SigningKey.from_seed_text("outsider", "capacity-export outsider")
TERMS = make_terms(CAST, "pl-x", [gpu("node-a", 0)], T0 + HOUR, T0 + 2 * HOUR)
RAW = signed_terms(CAST, TERMS)
HASH = open_envelope(RAW).record_hash
UUID = canonical_uuid(TERMS.gpus[0].uuid)
ARRIVED = T0 + 5_000
RULES = {
    "CAPACITY_RECORDS",
    "CAPACITY_REQUEST_MISSING",
    "CAPACITY_REQUEST_MISMATCH",
    "CAPACITY_DECISION",
}

Row = tuple[str, str, int, int, int, bytes]


def _request(arrived: int = ARRIVED) -> CapRequest:
    return CapRequest(
        "pl-x", HASH, UUID, 1000, TERMS.window_start_ms, TERMS.window_end_ms, arrived,
        CAST.ledger.public_key, ZERO_HASH,
    )  # fmt: skip


def _rows(*, signer: SigningKey | None = None, arrived: int = ARRIVED) -> list[Row]:
    """Another shard's sale of the GPU granted, then released; then this terms' request."""
    other = OTHER.ledger
    earlier = CapRequest(
        "pl-o", "0" * 64, UUID, 1000, T0, T0 + 3 * HOUR, ARRIVED, other.public_key, ZERO_HASH
    )
    release = CapRelease("pl-o", "0" * 64, UUID, 0, "rejected", "1" * 64, other.public_key)
    return [
        (HASH, UUID, 0, 3, ARRIVED, seal_capacity(earlier, other)),
        (HASH, UUID, 0, 5, ARRIVED + 1, seal_capacity(release, signer or other)),
        (HASH, UUID, 0, 8, ARRIVED + 2, seal_capacity(_request(arrived), CAST.ledger)),
    ]


def _export(tmp_path: Path, rows: list[Row]) -> Path:
    builder = ExportBuilder(CAST, TERMS)
    builder.add(RAW, arrived_ms=ARRIVED)
    path = builder.write(tmp_path / "x.duckdb")
    con = duckdb.connect(str(path))
    # as an editor at rest may write it: without NOT NULL
    con.execute(f"CREATE TABLE {TABLE} ({', '.join(f'{c} {t}' for c, t in COLUMNS)})")
    if rows:
        con.executemany(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.execute("CHECKPOINT")
    con.close()
    return path


def _capacity_rules(tmp_path: Path, rows: list[Row]) -> set[str]:
    trust = CAST.trust()  # and the other shard's ledger key, pinned beside this one's
    other = TrustedKey(id="ledger-2", role="ledger", key=OTHER.ledger.public_key)
    trust = msgspec.structs.replace(trust, keys=[*trust.keys, other])
    report = verify(_export(tmp_path, rows), trust)
    return report.findings.rules() & RULES


def test_an_honest_export_re_derives_the_grant(tmp_path: Path) -> None:
    assert _capacity_rules(tmp_path, _rows()) == set()


@pytest.mark.parametrize(
    "tamper, rule",
    [
        (lambda rows: [rows[0], rows[2]], "CAPACITY_DECISION"),  # the release removed
        (lambda rows: rows[:2], "CAPACITY_REQUEST_MISSING"),  # the terms' request removed
        (lambda rows: [], "CAPACITY_REQUEST_MISSING"),  # every record removed
        (lambda rows: _rows(signer=OUTSIDER), "CAPACITY_DECISION"),  # release re-signed
        (lambda rows: [*rows, (*rows[0][:5], rows[1][5])], "CAPACITY_RECORDS"),  # two at 3
        (lambda rows: _rows(arrived=ARRIVED - 1), "CAPACITY_REQUEST_MISMATCH"),
        (lambda rows: [*rows, (HASH, UUID, 0, 9, None, rows[0][5])], "CAPACITY_RECORDS"),
        (lambda rows: [*rows, (HASH, UUID, 1, 9, ARRIVED, rows[0][5])], "CAPACITY_RECORDS"),
        (lambda rows: [*rows, (HASH, UUID, 0, 9, ARRIVED, b"not an envelope")], "CAPACITY_RECORDS"),
    ],
)
def test_records_removed_or_altered_fail_with_a_named_finding(
    tmp_path: Path, tamper: Any, rule: str
) -> None:
    assert rule in _capacity_rules(tmp_path, tamper(_rows()))


def test_rejected_terms_are_re_derived_too() -> None:
    """Rejected OVERSOLD: the fold must deny the request; with the grant it collided with
    removed, it grants it, and the export's refusal is named."""
    keys = {CAST.ledger.public_key, OTHER.ledger.public_key}
    refused = [TermsInput("chain index 0", TERMS, HASH, "rejected", "OVERSOLD", ARRIVED)]
    rows = _rows()
    honest, removed = Findings(), Findings()
    check_capacity_records([rows[0], rows[2]], refused, keys, honest)
    check_capacity_records([rows[2]], refused, keys, removed)
    assert honest.rules() == set(), [f.line() for f in honest.kept]
    assert removed.rules() == {"CAPACITY_DECISION"}
    late = [TermsInput("chain index 0", TERMS, HASH, "rejected", "CAPACITY_LATE", ARRIVED)]
    wrong = Findings()
    check_capacity_records([rows[0], rows[2]], late, keys, wrong)
    assert wrong.rules() == {"CAPACITY_DECISION"}  # the fold says OVERSOLD, not late
