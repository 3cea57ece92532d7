"""The bill a person reads: the ledger's and the verifier's renderings of one placement,
each line's derivation, the forms (CSV, JSON, text), the API routes, ``terms show``."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest
from bill_scenario import EXPECTED, PID, run_bill_scenario

from billview import render
from billview.build import build
from billview.doc import BillDoc, decode
from billview.units import duration, exact_decimal, iso_utc
from devtools.builders import gpu, make_cast, make_terms, signed_terms
from gridledger.cli import main as gridledger_main
from ledger.bill import bill_doc, bill_facts
from ledger.export import export_placement
from ledger.http import LedgerApi, LedgerHttpServer
from verifier.verify import verify_export


def _line(doc: BillDoc, key: str) -> dict[str, object]:
    found = [line for line in doc.lines if line.key == key]
    assert len(found) == 1, f"{key} in {[line.key for line in doc.lines]}"
    return {f: getattr(found[0], f) for f in found[0].__struct_fields__}


def test_units_are_exact() -> None:
    assert duration(240_000) == "4 min"
    assert duration(5_400_000) == "1 h 30 min"
    assert duration(1_500) == "1.5 s"
    assert iso_utc(1_796_083_200_000) == "2026-12-01T00:00:00Z"
    assert exact_decimal(1715, 10, 2) == "1.715"  # 171.5 minor units
    assert exact_decimal(1, 3, 2).endswith("…")


def test_ledger_and_verifier_render_the_same_bill(tmp_path: Path) -> None:
    scenario = run_bill_scenario(tmp_path)
    store, key = scenario.service.store, scenario.service.key
    ledger = bill_doc(store, key, PID)
    assert ledger.checks == []  # every derivation gives the statement's amount
    assert ledger.statement.final
    for name, value in EXPECTED.items():
        assert ledger.totals[name] == value, name

    export = tmp_path / "export.duckdb"
    export_placement(store, PID, export, key=key)
    report = verify_export(export, scenario.cast.trust(), bill=True)
    assert report.ok and report.bill is not None, report.findings.kept
    mine = report.bill.doc(report)
    assert mine.checks == []
    # Independent figures, one bill: the verifier's recomputation renders line for line
    # what the ledger's store renders.
    assert mine.lines == ledger.lines
    assert mine.gpus == ledger.gpus
    assert mine.totals == ledger.totals
    assert (mine.renderer, ledger.renderer) == ("verifier", "ledger")
    assert mine.verdict.level == "PROVISIONAL"  # nobody witnessed it
    assert any("not witnessed" in r for r in mine.verdict.reasons)

    gpus = {g.uuid: g.ms for g in mine.gpus}
    assert gpus["GPU-n0-0"] == {
        "delivered": 50 * 60_000, "unhealthy": 0, "unallocated": 0,
        "reclaimed": 10 * 60_000, "unreported": 0,
    }  # fmt: skip
    assert gpus["GPU-n0-1"]["unhealthy"] == 10 * 60_000  # XID 79, whatever the flag said
    assert gpus["GPU-n1-0"]["unallocated"] == 5 * 60_000
    assert gpus["GPU-n1-0"]["unreported"] == 5 * 60_000

    reclaim = _line(mine, "reclaim:rc-1")
    assert reclaim["label"] == "Reclaim credit (4 min notice of 10 min)"
    assert reclaim["amount"] == "1.66"
    derivation = str(reclaim["derivation"])
    for part in (
        "short 6 min",
        "window taken 10 min",
        "(6 min + 10 min) × 2.5 GPU = 40 GPU-min",
        "2.50 USD/GPU-h × penalty 100.00 %",
        "rounded down to 1.66 USD",
    ):
        assert part in derivation
    assert reclaim["signers"] == ["operator operator-1"]
    availability = _line(mine, "availability")
    assert availability["quantity"] == "88.00 %"
    assert "misses the target 99.00 %" in str(availability["derivation"])
    assert "10.00 % of gross 4.58 USD" in str(_line(mine, "sla")["derivation"])
    goodwill = _line(mine, "adjustment:goodwill-1")
    assert goodwill["signers"] == ["operator operator-1", "desk desk-1"]
    assert goodwill["amount_minor"] == 30 and goodwill["payee"] == "buyer"
    assert _line(mine, "adjustment:egress-1")["signers"] == ["buyer buyer-1", "desk desk-1"]
    alone = _line(mine, "adjustment:alone-1")
    assert alone["amount_minor"] == 0 and "REJECTED SIG_MISSING" in str(alone["derivation"])
    fee = _line(mine, "fee")
    assert "5.00 % of net 2.62 USD = 0.131 USD, rounded down to 0.13 USD" in str(fee["derivation"])
    assert fee["payer"] == "operator"

    # CSV and JSON carry the same lines; amounts in minor units for accounting systems.
    rows = list(csv.DictReader(io.StringIO(render.to_csv(mine))))
    by_key = {r["key"]: r for r in rows}
    assert by_key["buyer_owes"]["amount_minor"] == "262"
    assert by_key["reclaim:rc-1"]["amount"] == "1.66" and by_key["gross"]["currency"] == "USD"
    assert decode(render.to_json(mine)) == mine
    text = render.to_text(mine)
    assert "Reclaim credit (4 min notice of 10 min)" in text and "rounded down" in text


def test_a_bill_whose_amount_does_not_follow_says_so(tmp_path: Path) -> None:
    """Each derivation is recomputed beside the stated figure: a difference shows."""
    scenario = run_bill_scenario(tmp_path)
    facts, rows, note = bill_facts(scenario.service.store, scenario.service.key, PID)
    honest = build(facts, rows, note)
    assert honest.checks == [] and "CHECK:" not in render.to_html(honest, "buyer")
    stated = facts.statement.totals
    forged = dataclasses.replace(
        facts,
        statement=dataclasses.replace(
            facts.statement,
            totals=msgspec.structs.replace(stated, reclaim_credit_minor=167),
        ),
    )
    doc = build(forged, rows, note)
    assert "reclaim credit: the derivation gives 166, the statement says 167" in doc.checks
    assert "CHECK: reclaim credit" in render.to_html(doc, "operator")
    assert _line(doc, "reclaim:rc-1")["amount"] == "1.67"  # the stated figure, flagged


def test_statement_pages_on_the_api(tmp_path: Path) -> None:
    scenario = run_bill_scenario(tmp_path)
    service = scenario.service
    server = LedgerHttpServer(
        LedgerApi(service.store, service.key, service.metrics), "127.0.0.1", 0
    )
    server.start()
    try:
        base = f"{server.url}/placements/{PID}"
        status, kind, body = _get(f"{base}/statement.html?party=operator")
        assert status == 200 and kind.startswith("text/html")
        page = body.decode()
        assert 'data-party="operator"' in page and "<svg" in page and "bill-delivered-0" in page
        assert 'data-total="operator_receives_minor" data-minor="249"' in page
        status, kind, body = _get(f"{base}/statement.csv")
        assert status == 200 and kind.startswith("text/csv")
        assert body.decode().splitlines()[0] == ",".join(render.CSV_COLUMNS)
        status, kind, body = _get(f"{base}/statement.json")
        assert status == 200 and decode(body).totals["buyer_owes_minor"] == 262
        status, _, body = _get(f"{base}/statement.html?party=auditor")
        assert status == 400 and "party" in json.loads(body)["error"]
        status, _, _ = _get(f"{server.url}/placements/nope/statement.html")
        assert status == 404
    finally:
        server.stop()


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, "", exc.read()


def test_verify_html_writes_a_page_per_party(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = run_bill_scenario(tmp_path)
    export, trust = scenario.export(tmp_path)
    out = tmp_path / "bill"
    code = gridledger_main(["verify", str(export), "--trust", str(trust), "--html", str(out)])
    assert code == 3  # verified, not witnessed: PROVISIONAL, and so says every page
    assert f"statement: {out / (PID + '.buyer.html')}" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"{PID}.{n}" for n in ("buyer.html", "operator.html", "desk.html", "csv", "json")
    )
    page = (out / f"{PID}.desk.html").read_text()
    assert "data-verdict>PROVISIONAL" in page and "gridledger verify" in page
    code = gridledger_main(
        ["verify", str(export), "--trust", str(trust), "--html", str(out), "--json"]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 3 and len(data["statement_files"]) == 5
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = gridledger_main(
        ["verify", str(export), "--trust", str(trust), "--html", str(blocker / "x")]
    )
    assert code == 2 and "--html" in capsys.readouterr().err


def test_terms_show_reads_as_terms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ISO-8601 UTC window, reclaim and SLA terms, "1 node" (issue 18)."""
    cast = make_cast("show")
    terms = make_terms(cast, "pl-show", [gpu("n0", 0)], 1_796_083_200_000, 1_796_086_800_000)
    path = tmp_path / "terms.signed.json"
    path.write_bytes(signed_terms(cast, terms) + b"\n")
    assert gridledger_main(["terms", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2026-12-01T00:00:00Z to 2026-12-01T01:00:00Z (1 h)" in out
    assert "on 1 node\n" in out and "1 nodes" not in out
    assert "10 min notice; penalty 100.00 %" in out
    assert "availability target 99.00 %; credit 10.00 % of gross" in out
    assert "1796083200000" not in out


def test_timeline_keeps_max_segments_and_one_more_leaves_the_picture_out() -> None:
    """MAX_TIMELINE_SEGMENTS: at the bound every segment is drawn; one past it the
    picture is left out with a sentence, and the hours per state stay exact."""
    from billview.timeline import MAX_TIMELINE_SEGMENTS, TimelineBuilder

    n = MAX_TIMELINE_SEGMENTS
    cast = make_cast("segments")
    for count, truncated in ((n, False), (n + 1, True)):
        start = 1_796_083_200_000
        terms = make_terms(cast, "pl-seg", [gpu("n0", 0)], start, start + count * 1000)
        builder = TimelineBuilder(terms, terms.window_end_ms)
        for k in range(count):  # 1 s each, the state alternating: no two merge
            state = "delivered" if k % 2 == 0 else "unhealthy"
            builder.add("GPU-n0-0", start + k * 1000, start + (k + 1) * 1000, state)
        rows, note = builder.finish()
        assert builder.truncated is truncated
        assert rows[0].ms["delivered"] == (count + 1) // 2 * 1000
        assert rows[0].ms["unhealthy"] == count // 2 * 1000
        if truncated:
            assert rows[0].segments == [] and "left out" in note
        else:
            assert len(rows[0].segments) == n and note == ""


def test_adjustment_lines_past_the_bound_count_and_say_how_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_ADJUSTMENT_LINES (shown here lowered to 2; the scenario chains 3): both sides
    list two, one line says one more, the totals and every check still hold."""
    import ledger.bill
    import verifier.bill

    monkeypatch.setattr(ledger.bill, "MAX_ADJUSTMENT_LINES", 2)
    monkeypatch.setattr(verifier.bill, "MAX_ADJUSTMENT_LINES", 2)
    scenario = run_bill_scenario(tmp_path)
    store, key = scenario.service.store, scenario.service.key
    theirs = bill_doc(store, key, PID)
    export = tmp_path / "export.duckdb"
    export_placement(store, PID, export, key=key)
    report = verify_export(export, scenario.cast.trust(), bill=True)
    assert report.bill is not None
    mine = report.bill.doc(report)
    for doc in (theirs, mine):
        keys = [line.key for line in doc.lines if line.key.startswith("adjustment")]
        assert keys == ["adjustment:egress-1", "adjustment:goodwill-1", "adjustments:left-out"]
        assert _line(doc, "adjustments:left-out")["label"] == "… 1 more adjustments"
        assert doc.checks == [] and doc.totals["buyer_owes_minor"] == 262
    assert mine.lines == theirs.lines
