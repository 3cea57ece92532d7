"""Issue 14, sections A (authority) and D (identity, amendments): one row per attack.

Each attack is built with the attacker's keys only (``devtools.builders`` seeds one key per
party). For each: (a) the ledger's fold rejects the attacking input with the reason SPEC
§4.0 / §6.3 names; (b) a dishonest ledger that chains it as accepted anyway (records and
statements signed with the ledger key by ``ExportBuilder``) is caught by the verifier
with a named finding. Honest counterparts (the signers the table asks for) are accepted
and verify without findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from test_verifier_exports import (
    HOUR,
    MINUTE,
    T0,
    ExportBuilder,
    explain,
    verify,
)

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    amendment,
    closed,
    gpu,
    key_binding,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger.fold import Fold, Outcome
from proto.envelope import open_envelope, seal
from proto.keys import SigningKey
from proto.records import PlacementTerms, Statement
from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile

PID = "p-authority"
USD_1M = 100_000_000  # 1,000,000.00 USD in minor units (scale 2)


@dataclass
class Stage:
    """A placement with some honest history, and the attack appended to it."""

    cast: Cast
    terms: PlacementTerms
    honest: list[bytes]  # accepted as they are, in this order
    attack: list[bytes]  # what the attacker adds
    ledger_reasons: list[str]  # what an honest ledger decides for each attack input


def _base(seed: str) -> tuple[Cast, PlacementTerms, StreamWriter, list[bytes]]:
    cast = make_cast(seed)
    terms = make_terms(cast, PID, [gpu("node-a", 0)], T0, T0 + HOUR)
    writer = StreamWriter(cast.node_key("node-a"), PID, "node-a")
    usage = writer.event(T0, T0 + 30 * MINUTE, [sample(terms.gpus[0])])
    return cast, terms, writer, [signed_terms(cast, terms), usage]


def desk_charge_after_close() -> Stage:
    cast, terms, _, honest = _base("attack-desk-charge")
    honest.append(closed(cast, PID, T0 + 2 * HOUR))
    charge = adjustment(cast, PID, "adj-big", "charge", USD_1M, T0 + 3 * HOUR, signers=[cast.desk])
    return Stage(cast, terms, honest, [charge], ["SIG_MISSING"])


def desk_credit_alone() -> Stage:
    cast, terms, _, honest = _base("attack-desk-credit")
    credit = adjustment(cast, PID, "adj-credit", "credit", 5_000, T0, signers=[cast.desk])
    return Stage(cast, terms, honest, [credit], ["SIG_MISSING"])


def buyer_and_desk_credit() -> Stage:
    cast, terms, _, honest = _base("attack-buyer-desk-credit")
    credit = adjustment(
        cast, PID, "adj-credit", "credit", 5_000, T0, signers=[cast.buyer, cast.desk]
    )
    return Stage(cast, terms, honest, [credit], ["SIG_SURPLUS"])


def operator_binds_own_key() -> Stage:
    cast, terms, _, honest = _base("attack-operator-binds")
    rogue = SigningKey.from_seed_text("rogue", "attack-operator-binds/rogue")
    bind = key_binding(cast, PID, "node-a", rogue, T0, T0 + HOUR, T0, signers=[cast.operator])
    # The operator's own key signs a whole hour of usage on the node's stream.
    forged = StreamWriter(rogue, PID, "node-a", seq=1, prev=_last_prev(cast, terms))
    usage = forged.event(T0 + 30 * MINUTE, T0 + HOUR, [sample(terms.gpus[0])])
    return Stage(cast, terms, honest, [bind, usage], ["SIG_MISSING", "NODE_KEY_UNKNOWN"])


def operator_extends_revoked_key() -> Stage:
    cast, terms, _, honest = _base("attack-operator-extends")
    key = cast.node_key("node-a")
    # The operator alone may revoke (shorten) the terms' key ...
    honest.append(key_binding(cast, PID, "node-a", key, 0, T0 + HOUR, T0, signers=[cast.operator]))
    # ... but not give it back a longer life.
    extend = key_binding(cast, PID, "node-a", key, 0, T0 + 9 * HOUR, T0, signers=[cast.operator])
    return Stage(cast, terms, honest, [extend], ["SIG_MISSING"])


def amendment_after_usage() -> Stage:
    cast, terms, _, honest = _base("attack-late-amendment")
    doubled = signed_terms(cast, amendment(terms, rate_per_gpu_hour_minor=490))
    return Stage(cast, terms, honest, [doubled], ["AMENDMENT_TOO_LATE"])


def _last_prev(cast: Cast, terms: PlacementTerms) -> str:
    from proto.canonical import signed_bytes
    from proto.envelope import sha256_hex

    writer = StreamWriter(cast.node_key("node-a"), PID, "node-a")
    record = open_envelope(writer.event(T0, T0 + 30 * MINUTE, [sample(terms.gpus[0])])).record
    return sha256_hex(signed_bytes(record))


ATTACKS: dict[str, tuple[Callable[[], Stage], set[str]]] = {
    # attack -> (stage, the verifier's findings when a dishonest ledger accepts it)
    "the desk alone adds a 1,000,000 USD charge after the close": (
        desk_charge_after_close,
        {"SIG_MISSING"},
    ),
    "the desk alone credits the buyer": (desk_credit_alone, {"SIG_MISSING"}),
    "buyer and desk credit the buyer (operator pays)": (buyer_and_desk_credit, {"SIG_SURPLUS"}),
    "the operator alone binds a new node key it holds": (
        operator_binds_own_key,
        {"SIG_MISSING", "NODE_KEY_UNKNOWN"},
    ),
    "the operator alone extends a key it revoked": (
        operator_extends_revoked_key,
        {"SIG_MISSING"},
    ),
    "an amendment doubling the rate after usage": (
        amendment_after_usage,
        {"AMENDMENT_TOO_LATE"},
    ),
}


def _fold(stage: Stage) -> list[Outcome]:
    fold = Fold(stage.cast.ledger)
    outcomes: list[Outcome] = []
    for i, raw in enumerate(stage.honest + stage.attack):
        outcomes += fold.apply(raw, f"t:{i}", PID)
    return outcomes


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_ledger_rejects_the_attack(name: str) -> None:
    stage = ATTACKS[name][0]()
    outcomes = _fold(stage)
    honest, attack = outcomes[: len(stage.honest)], outcomes[len(stage.honest) :]
    assert [o.status for o in honest] == ["accepted"] * len(honest), honest
    assert [o.reason for o in attack] == stage.ledger_reasons, [o.detail for o in attack]
    assert all(o.status == "rejected" for o in attack)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_dishonest_ledger_that_accepts_it_is_caught(name: str, tmp_path: Path) -> None:
    make, expected = ATTACKS[name]
    stage = make()
    b = ExportBuilder(stage.cast, stage.terms)
    for raw in stage.honest + stage.attack:
        b.add(raw)  # every input chained as accepted, the attack included
    b.statements_at = [len(b.items) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), stage.cast.trust())
    assert expected <= report.findings.rules(), explain(report)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_honest_export_of_the_rejection_verifies(name: str, tmp_path: Path) -> None:
    stage = ATTACKS[name][0]()
    b = ExportBuilder(stage.cast, stage.terms)
    for raw in stage.honest:
        b.add(raw)
    for raw, reason in zip(stage.attack, stage.ledger_reasons, strict=True):
        b.add(raw, "rejected", reason)
    b.statements_at = [len(b.items) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), stage.cast.trust())
    assert not report.findings, explain(report)


# ---- the same money with the right signers ------------------------------------------------


def test_the_signers_the_table_asks_for_are_accepted(tmp_path: Path) -> None:
    cast, terms, _, inputs = _base("authority-honest")
    new_key = SigningKey.from_seed_text("n2", "authority-honest/n2")
    inputs += [
        adjustment(cast, PID, "c-buyer", "charge", 100, T0, signers=[cast.buyer]),
        adjustment(cast, PID, "c-both", "charge", 100, T0, signers=[cast.buyer, cast.desk]),
        adjustment(cast, PID, "r-1", "credit", 50, T0, signers=[cast.operator, cast.desk]),
        key_binding(
            cast, PID, "node-a", new_key, T0, T0 + HOUR, T0, signers=[cast.operator, cast.buyer]
        ),
        key_binding(
            cast, PID, "node-a", new_key, T0, T0 + 40 * MINUTE, T0, signers=[cast.operator]
        ),
        closed(cast, PID, T0 + 2 * HOUR),
        adjustment(cast, PID, "c-late", "charge", USD_1M, T0 + 3 * HOUR, signers=[cast.buyer]),
    ]
    fold = Fold(cast.ledger)
    outcomes = [o for i, raw in enumerate(inputs) for o in fold.apply(raw, f"t:{i}", PID)]
    assert [o.status for o in outcomes] == ["accepted"] * len(inputs), [
        (o.reason, o.detail) for o in outcomes
    ]
    b = ExportBuilder(cast, terms)
    for raw in inputs:
        b.add(raw)
    close, last = len(inputs) - 2, len(inputs) - 1
    b.statements_at = [close, last]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert not report.findings, explain(report)
    # SPEC §8: the late charge opened period 1; both periods are shown, the latest marked.
    periods = [(p["period"], p["through_index"], p["latest"]) for p in report.periods]
    assert periods == [(0, close, False), (1, last, True)]


# ---- statements: nothing changes a final statement ----------------------------------------


def test_two_final_figures_for_one_period_conflict(tmp_path: Path) -> None:
    """The ledger signs a second "final" statement for period 0 with the desk's charge in."""
    stage = desk_charge_after_close()
    b = ExportBuilder(stage.cast, stage.terms)
    for raw in stage.honest:
        b.add(raw)
    close = len(b.items) - 1
    b.statements_at = [close]
    path = b.write(tmp_path / "x.duckdb")
    record = b.items[close].record
    assert record is not None
    t = record.totals
    inflated = type(t)(
        **{
            **{f: getattr(t, f) for f in t.__struct_fields__},
            "adjustment_charge_minor": USD_1M,
            "net_minor": t.net_minor + USD_1M,
            "buyer_owes_minor": t.buyer_owes_minor + USD_1M,
        }
    )
    forged = b.statement(close, totals=inflated)
    con = duckdb.connect(str(path))
    con.execute(
        "INSERT INTO statements VALUES (?, ?, true, ?, ?, ?)",
        [
            close,
            forged,
            inflated.buyer_owes_minor,
            inflated.operator_receives_minor,
            inflated.desk_receives_minor,
        ],
    )
    con.close()
    report = verify(path, stage.cast.trust())
    assert "STATEMENT_CONFLICT" in report.findings.rules(), explain(report)


def test_a_statement_that_hides_its_period_is_reported(tmp_path: Path) -> None:
    cast, terms, _, inputs = _base("authority-period")
    inputs += [
        closed(cast, PID, T0 + 2 * HOUR),
        adjustment(cast, PID, "c-late", "charge", 100, T0 + 3 * HOUR, signers=[cast.buyer]),
    ]
    b = ExportBuilder(cast, terms)
    for raw in inputs:
        b.add(raw)
    last = len(inputs) - 1
    path = b.write(tmp_path / "x.duckdb")
    # A statement after the close that claims to be period 0 (as if it were the close's).
    lying = b.statement(last, period=0, previous="0" * 64)
    record = b.items[last].record
    assert record is not None
    t = record.totals
    con = duckdb.connect(str(path))
    con.execute(
        "INSERT INTO statements VALUES (?, ?, true, ?, ?, ?)",
        [
            last,
            lying,
            t.buyer_owes_minor,
            t.operator_receives_minor,
            t.desk_receives_minor,
        ],
    )
    con.close()
    report = verify(path, cast.trust())
    assert "STATEMENT_PERIOD" in report.findings.rules(), explain(report)


def test_the_ledger_issues_statements_with_periods(tmp_path: Path) -> None:
    from ledger.statements import statement_period

    assert [statement_period(i, 3) for i in (0, 3, 4, 6)] == [0, 0, 1, 3]
    assert statement_period(9, None) == 0


# ---- D: identity and amendments ---------------------------------------------------------


def test_a_party_id_the_trust_file_does_not_pin_is_reported(tmp_path: Path) -> None:
    """The buyer's key pinned as ``mallory-buyer``; the terms call it ``inferco-batch``."""
    cast = make_cast("identity", buyer="mallory-buyer")
    terms = make_terms(cast, PID, [gpu("node-a", 0)], T0, T0 + HOUR)
    terms = make_terms(
        cast,
        PID,
        [gpu("node-a", 0)],
        T0,
        T0 + HOUR,
        buyer=type(terms.buyer)(id="inferco-batch", key=cast.buyer.public_key),
    )
    b = ExportBuilder(cast, terms)
    b.add(signed_terms(cast, terms))
    b.statements_at = [0]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert "PARTY_ID_MISMATCH" in report.findings.rules(), explain(report)
    # The same key pinned under the name the terms use: no finding.
    renamed = TrustFile(
        format=TRUST_FORMAT,
        keys=[
            TrustedKey(id="inferco-batch", role=k.role, key=k.key) if k.role == "buyer" else k
            for k in cast.trust().keys
        ],
    )
    assert not verify(tmp_path / "x.duckdb", renamed).findings


def _two_terms(seed: str) -> tuple[Cast, PlacementTerms, PlacementTerms]:
    cast = make_cast(seed)
    gpus = [gpu("node-a", 0)]
    cheap = make_terms(cast, PID, gpus, T0, T0 + HOUR, rate_per_gpu_hour_minor=245)
    dear = make_terms(cast, PID, gpus, T0, T0 + HOUR, rate_per_gpu_hour_minor=490)
    return cast, cheap, dear


@pytest.mark.parametrize("order", ["245 first", "490 first"])
def test_two_fully_signed_terms_are_disputed_whichever_came_first(
    order: str, tmp_path: Path
) -> None:
    cast, cheap, dear = _two_terms("two-terms")
    first, second = (cheap, dear) if order == "245 first" else (dear, cheap)
    # (a) the ledger keeps the first and rejects the second
    fold = Fold(cast.ledger)
    outcomes = [
        *fold.apply(signed_terms(cast, first), "t:0", PID),
        *fold.apply(signed_terms(cast, second), "t:1", PID),
    ]
    assert [(o.status, o.reason) for o in outcomes] == [
        ("accepted", None),
        ("rejected", "TERMS_CONFLICT"),
    ]
    # (b) honest export: the verifier reports the dispute, so it cannot verify
    b = ExportBuilder(cast, first)
    b.add(signed_terms(cast, first))
    b.add(signed_terms(cast, second), "rejected", "TERMS_CONFLICT")
    b.statements_at = [1]
    report = verify(b.write(tmp_path / "honest.duckdb"), cast.trust())
    assert report.findings.rules() == {"TERMS_DISPUTED"}, explain(report)
    # (c) a dishonest ledger that accepts both
    b = ExportBuilder(cast, first)
    b.add(signed_terms(cast, first))
    b.add(signed_terms(cast, second))
    b.statements_at = [1]
    report = verify(b.write(tmp_path / "both.duckdb"), cast.trust())
    assert {"TERMS_CONFLICT", "TERMS_DISPUTED"} <= report.findings.rules(), explain(report)


def test_terms_signed_by_strangers_are_a_conflict_not_a_dispute(tmp_path: Path) -> None:
    """Anyone can publish other terms under the placement id, signed by keys of their own:
    rejected, but no dispute (the placement's parties did not sign them)."""
    cast, cheap, _ = _two_terms("strangers")
    mallory = make_cast("strangers-mallory")
    junk = make_terms(mallory, PID, [gpu("node-a", 0)], T0, T0 + HOUR)
    b = ExportBuilder(cast, cheap)
    b.add(signed_terms(cast, cheap))
    b.add(signed_terms(mallory, junk), "rejected", "TERMS_CONFLICT")
    b.statements_at = [1]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert not report.findings, explain(report)


def test_an_amendment_before_usage_replaces_the_terms(tmp_path: Path) -> None:
    cast, cheap, _ = _two_terms("amend")
    amended = amendment(cheap, rate_per_gpu_hour_minor=300)
    writer = StreamWriter(cast.node_key("node-a"), PID, "node-a")
    inputs = [
        signed_terms(cast, cheap),
        seal(amended, [cast.operator, cast.buyer]),  # the desk did not sign
        signed_terms(cast, amended),
        writer.event(T0, T0 + HOUR, [sample(amended.gpus[0])]),
        closed(cast, PID, T0 + 2 * HOUR),
    ]
    fold = Fold(cast.ledger)
    outcomes = [o for i, raw in enumerate(inputs) for o in fold.apply(raw, f"t:{i}", PID)]
    assert [(o.status, o.reason) for o in outcomes] == [
        ("accepted", None),
        ("rejected", "SIG_MISSING"),
        ("accepted", None),
        ("accepted", None),
        ("accepted", None),
    ]
    # Priced at the amended rate: one GPU-hour at 3.00.
    assert outcomes[-1].record is not None
    assert outcomes[-1].record.totals.gross_minor == 300
    b = ExportBuilder(cast, amended)
    for raw, o in zip(inputs, outcomes, strict=True):
        b.add(raw, str(o.status), "" if o.reason is None else o.reason.value)
    b.statements_at = [len(inputs) - 1]
    report = verify(b.write(tmp_path / "x.duckdb"), cast.trust())
    assert not report.findings, explain(report)
    statement = open_envelope(b.statement(len(inputs) - 1)).record
    assert isinstance(statement, Statement) and statement.totals.gross_minor == 300


def test_the_ledger_opens_a_period_for_a_late_charge_and_the_export_verifies(
    tmp_path: Path,
) -> None:
    """End to end: a running ledger closes, the buyer signs a late charge, the export's
    statements are period 0 (through the close) and period 1 (previous = the close record)."""
    from test_ledger_scenario import build_scenario, local_service, publish_scenario_local

    from ledger.export import export_placement

    scenario = build_scenario("late-charge", placements=1, nodes=1, events=3)
    pid = scenario.placement_ids[0]
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    try:
        assert list(service.run_until_idle().closed) == [pid]
        close = service.store.close_index(pid)
        assert close is not None
        late = adjustment(
            scenario.cast, pid, "late-1", "charge", 500, T0, signers=[scenario.cast.buyer]
        )
        publish_scenario_local(tmp_path / "spool", [(pid, "publish-buyer", late)])
        service.run_until_idle()
        out = tmp_path / f"{pid}.duckdb"
        export_placement(service.store, pid, out, key=scenario.cast.ledger)
        close_hash = service.store.record_hash_at(pid, close)
    finally:
        service.close()
    with duckdb.connect(str(out), read_only=True) as con:
        rows = con.execute("SELECT envelope FROM statements ORDER BY through_index").fetchall()
    statements = [open_envelope(bytes(r[0])).record for r in rows]
    assert [(s.period, s.previous, s.final) for s in statements if isinstance(s, Statement)] == [
        (0, "0" * 64, True),
        (1, close_hash, True),
    ]
    report = verify(out, scenario.cast.trust())
    assert not report.findings, explain(report)
    assert [(p["period"], p["latest"]) for p in report.periods] == [(0, False), (1, True)]
