"""gridledger reclaim / adjust / bind-key / cosign / publish (issue 18): every record a
party signs has a command, signed by whom SPEC §4.0 requires, with a dry run against the
current statement, published to the local transport and folded by a real ledger."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ledger_scenario import (
    EARLY_CLOCK_MS,
    T0_MS,
    Scenario,
    build_scenario,
    local_service,
    publish_scenario_local,
)

from devtools.builders import signed_terms
from gridledger.cli import main
from ledger.export import export_placement
from ledger.service import LedgerService
from proto.envelope import open_envelope
from proto.keys import SigningKey, write_key_pair
from proto.records import Adjustment, NodeKeyBinding, ReclaimNotice


class World:
    """An open placement on a local-transport ledger, the parties' key files, an export."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.scenario: Scenario = build_scenario("rec", placements=1, nodes=2, events=5)
        self.pid = self.scenario.placement_ids[0]
        self.terms = self.scenario.terms[self.pid]
        self.keys = tmp / "keys"
        cast = self.scenario.cast
        for key in (cast.operator, cast.buyer, cast.desk):
            write_key_pair(key, self.keys)
        self.signed_terms = tmp / "terms.signed.json"
        self.signed_terms.write_bytes(signed_terms(cast, self.terms) + b"\n")
        publish_scenario_local(tmp / "spool", self.scenario.inputs)
        self.service: LedgerService = local_service(tmp, self.scenario, clock_ms=EARLY_CLOCK_MS)
        self.service.run_until_idle()
        self.export = tmp / "now.duckdb"
        export_placement(self.service.store, self.pid, self.export, key=cast.ledger)

    def key(self, role: str) -> str:
        return str(self.keys / f"{getattr(self.scenario.cast, role).name}.key")

    def totals(self) -> dict[str, int]:
        from ledger.issuer import issue_statement
        from ledger.statements import statement_json

        body = statement_json(
            issue_statement(self.service.store, self.scenario.cast.ledger, self.pid)
        )
        return dict(body["totals"])

    def last_record(self) -> tuple[str, str, str]:
        row = self.service.store.query(
            "SELECT kind, status, reason FROM records WHERE placement_id = ? "
            "ORDER BY chain_index DESC LIMIT 1",
            [self.pid],
        )[0]
        return str(row[0]), str(row[1]), str(row[2])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.service.close()


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


def test_reclaim_dry_run_shows_the_credit_then_publishes_and_the_ledger_agrees(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # Usage is folded through minute 5; reclaim at minute 30, issued at minute 27 (3 of 10).
    args = [
        "reclaim",
        "--terms", str(world.signed_terms),
        "--key", world.key("operator"),
        "--issued-at", _iso(T0_MS + 27 * 60_000),
        "--effective-at", _iso(T0_MS + 30 * 60_000),
        "--reason", "maintenance",
        "--id", "rc-1",
    ]  # fmt: skip
    before = world.totals()
    # The ledger times the notice by its arrival (SPEC §6.6): the dry run says when.
    arrives = ["--arrives-at", _iso(EARLY_CLOCK_MS)]
    assert main([*args, "--dry-run", "--export", str(world.export), *arrives]) == 0
    out = capsys.readouterr().out
    assert "the ledger would accept it" in out
    assert "reclaim credit" in out and "nothing written, nothing published" in out
    assert not (Path.cwd() / "reclaim-rc-1.signed.json").exists()
    # Published for real: the ledger's reclaim credit is what the dry run said.
    out_file = world.tmp / "rc-1.json"
    code = main([*args, "--out", str(out_file), "--local-dir", str(world.tmp / "spool")])
    assert code == 0, capsys.readouterr().err
    world.service.run_until_idle()
    assert world.last_record() == ("reclaim", "accepted", "")
    after = world.totals()
    assert after["reclaim_credit_minor"] > before["reclaim_credit_minor"] == 0
    shown = f"{after['reclaim_credit_minor'] / 100:.2f} USD"
    assert shown in out
    record = open_envelope(out_file.read_bytes().rstrip()).record
    assert isinstance(record, ReclaimNotice)
    assert sorted(record.gpus) == sorted(g.uuid for g in world.terms.gpus)


def test_a_credit_needs_operator_and_desk_signed_apart(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    record = world.tmp / "credit.json"
    base = ["--terms", str(world.signed_terms)]
    code = main(
        ["adjust", *base, "--credit", "0.10", "--reason", "slow start", "--id", "c-1",
         "--key", world.key("operator"), "--out", str(record)]
    )  # fmt: skip
    assert code == 0
    assert "missing: desk" in capsys.readouterr().out
    # Publishing before the desk signs is refused, and nothing reaches the spool.
    target = ["--local-dir", str(world.tmp / "spool")]
    assert main(["publish", str(record), *base, *target]) == 1
    assert "the desk must sign first" in capsys.readouterr().err
    world.service.run_until_idle()
    assert world.last_record()[0] == "usage"
    # The buyer may not sign a credit: refused, file unchanged.
    before = record.read_bytes()
    assert main(["cosign", str(record), *base, "--key", world.key("buyer")]) == 1
    assert "may not sign a credit" in capsys.readouterr().err
    assert record.read_bytes() == before
    # The desk cosigns (with a dry run first), then anyone publishes.
    dry = ["--dry-run", "--export", str(world.export)]
    assert main(["cosign", str(record), *base, "--key", world.key("desk"), *dry]) == 0
    assert "+0.10 USD" in capsys.readouterr().out
    assert record.read_bytes() == before  # a dry run writes nothing
    assert main(["cosign", str(record), *base, "--key", world.key("desk")]) == 0
    assert main(["publish", str(record), *base, *target]) == 0
    world.service.run_until_idle()
    assert world.last_record() == ("adjustment", "accepted", "")
    assert world.totals()["adjustment_credit_minor"] == 10
    adjustment = open_envelope(record.read_bytes().rstrip()).record
    assert isinstance(adjustment, Adjustment) and adjustment.direction == "credit"


def test_a_charge_is_the_buyers_and_several_keys_sign_at_once(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--terms", str(world.signed_terms), "--reason", "extra storage", "--id", "ch-1"]
    # The operator cannot charge the buyer.
    assert main(["adjust", "--charge", "3", *base, "--key", world.key("operator")]) == 1
    assert "may not sign a charge" in capsys.readouterr().err
    out = world.tmp / "charge.json"
    code = main(
        ["adjust", "--charge", "3", *base, "--key", world.key("buyer"), "--key",
         world.key("desk"), "--out", str(out), "--local-dir", str(world.tmp / "spool")]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    world.service.run_until_idle()
    assert world.last_record() == ("adjustment", "accepted", "")
    assert world.totals()["adjustment_charge_minor"] == 300


def test_bind_key_needs_operator_and_buyer(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    node = world.terms.nodes[0].node_id
    _, public = write_key_pair(SigningKey.generate("node-new"), world.tmp / "nodekeys")
    base = ["bind-key", "--terms", str(world.signed_terms), "--node", node, "--node-key",
            str(public), "--valid-from", _iso(T0_MS + 10 * 60_000)]  # fmt: skip
    out = world.tmp / "binding.json"
    assert main([*base, "--key", world.key("operator"), "--out", str(out)]) == 0
    assert "missing: buyer" in capsys.readouterr().out
    assert main(["cosign", str(out), "--terms", str(world.signed_terms), "--key",
                 world.key("buyer"), "--local-dir", str(world.tmp / "spool")]) == 0  # fmt: skip
    world.service.run_until_idle()
    assert world.last_record() == ("keybinding", "accepted", "")
    assert isinstance(open_envelope(out.read_bytes().rstrip()).record, NodeKeyBinding)


def test_dry_run_says_what_the_ledger_would_reject(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # Effective before usage already folded (minute 5): RECLAIM_BEHIND_USAGE, exit 1.
    code = main(
        ["reclaim", "--terms", str(world.signed_terms), "--key", world.key("operator"),
         "--issued-at", _iso(T0_MS), "--effective-at", _iso(T0_MS + 60_000),
         "--dry-run", "--export", str(world.export)]
    )  # fmt: skip
    assert code == 1
    assert "rejected RECLAIM_BEHIND_USAGE" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--effective-at", "1796086320"], "looks like seconds"),
        (["--effective-at", "tomorrow"], "neither an ISO time"),
        (["--effective-at", "2026-01-01T00:30:00"], "needs a UTC offset"),
        (["--effective-at", "now", "--dry-run"], "--dry-run needs the current state"),
    ],
)
def test_bad_input_is_one_line_exit_2(world: World, extra: list[str], needle: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "reclaim", "--terms", str(world.signed_terms),
         "--key", world.key("operator"), *extra],
        capture_output=True, text=True, timeout=60, check=False, cwd=world.tmp,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL: ") and needle in lines[0], done.stderr


def test_dry_run_against_the_running_ledgers_api(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from ledger.http import LedgerApi, LedgerHttpServer
    from ledger.metrics import LedgerMetrics

    api = LedgerApi(world.service.store, world.scenario.cast.ledger, LedgerMetrics())
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        code = main(
            ["adjust", "--terms", str(world.signed_terms), "--charge", "0.50", "--reason", "x",
             "--key", world.key("buyer"), "--dry-run", "--ledger", server.url]
        )  # fmt: skip
    finally:
        server.stop()
    out = capsys.readouterr().out
    assert code == 0
    assert "the ledger would accept it" in out and "+0.50 USD" in out
    head = world.service.store.head(world.pid)
    assert head is not None and f"through record {head.chain_index} " in out


def test_placements_listed_by_the_api_and_by_ledger_list(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import urllib.request

    import tomli_w

    from devtools.builders import StreamWriter, gpu, make_terms, sample
    from ledger.http import LedgerApi, LedgerHttpServer
    from ledger.metrics import LedgerMetrics
    from transport.local import node_source, publish_local

    # A second placement whose usage arrives before its terms: held, waiting.
    cast = world.scenario.cast
    g = gpu("late-n0", 0)
    make_terms(cast, "late-p", [g], T0_MS, T0_MS + 3_600_000)
    writer = StreamWriter(cast.node_key("late-n0"), "late-p", "late-n0")
    event = writer.event(T0_MS, T0_MS + 60_000, [sample(g)])
    publish_local(world.tmp / "spool", node_source("late-n0"), [event])
    world.service.run_until_idle()
    api = LedgerApi(world.service.store, cast.ledger, LedgerMetrics())
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.url}/placements", timeout=30) as reply:
            body = json.loads(reply.read())
    finally:
        server.stop()
    by_id = {p["placement_id"]: p for p in body["placements"]}
    head = world.service.store.head(world.pid)
    assert head is not None
    assert by_id[world.pid] == {
        "placement_id": world.pid,
        "status": "open",
        "operator": cast.operator.name,
        "buyer": cast.buyer.name,
        "desk": cast.desk.name,
        "new_buyers": [],
        "window_start": "2026-01-01T00:00:00Z",
        "window_end": "2026-01-01T01:00:00Z",
        "records": head.chain_index + 1,
        "head": head.record_hash,
        "held": 0,
    }
    assert by_id["late-p"]["status"] == "waiting for terms" and by_id["late-p"]["held"] == 1
    # The same from the stopped ledger's file, through the CLI.
    world.service.close()
    private, _ = write_key_pair(cast.ledger, world.tmp / "ledger-keys")
    config = world.tmp / "ledger.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "ledger_id": "ledger-1",
                "key_file": str(private),
                "db": str(world.tmp / "ledger.duckdb"),
                "local_dir": str(world.tmp / "spool"),
                "http": "off",
            }
        )
    )
    capsys.readouterr()
    assert main(["ledger", "list", "--config", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == body
    assert main(["ledger", "list", "--config", str(config)]) == 0
    table = capsys.readouterr().out
    assert world.pid in table and "open" in table and "waiting for terms (1 held)" in table


def test_resume_needs_operator_and_buyer_and_dry_runs(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gridledger resume` (SPEC §6.3 resume): the operator alone is not enough; a dry run
    says what the ledger decides (below the stream's next seq: RESUME_INVALID); signed by
    both and published, the ledger accepts it."""
    node = world.terms.nodes[0].node_id
    base = ["resume", "--terms", str(world.signed_terms), "--node", node,
            "--from", _iso(T0_MS + 10 * 60_000), "--reason", "disk replaced"]  # fmt: skip
    dry = ["--dry-run", "--export", str(world.export)]
    both = ["--key", world.key("operator"), "--key", world.key("buyer")]
    assert main([*base, "--from-seq", "1", *both, *dry]) == 1
    assert "rejected RESUME_INVALID" in capsys.readouterr().out
    assert main([*base, "--from-seq", "20", *both, *dry]) == 0
    assert "the ledger would accept it" in capsys.readouterr().out
    out = world.tmp / "resume.json"
    assert main([*base, "--from-seq", "20", "--key", world.key("operator"), "--out", str(out)]) == 0
    assert "missing: buyer" in capsys.readouterr().out
    assert main(["cosign", str(out), "--terms", str(world.signed_terms), "--key",
                 world.key("buyer"), "--local-dir", str(world.tmp / "spool")]) == 0  # fmt: skip
    world.service.run_until_idle()
    assert world.last_record() == ("resume", "accepted", "")
    # A node the terms do not name: one line, exit 2.
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", *base[:3], "--node", "node-zz", *base[5:],
         "--from-seq", "20", *both],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "node-zz" in done.stderr, done.stderr
