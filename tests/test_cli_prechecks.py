"""Issue 16: the CLI refuses before signing what the ledger will refuse (SPEC §6.3, §6.8,
§6.9), from what it knows (the terms, the keys, the token, the record's issued time): one
line naming the option, exit 2, nothing written. What it cannot know (bindings and
assignments the ledger accepted since) a dry run against an export says, with the reason
the ledger then gives. A dry run of an assignment shows both obligations; ``verify`` names
an unusable trust file once and the desk's total once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_cli_records
from test_cli_records import World, _iso
from test_ledger_scenario import T0_MS, WINDOW_MS

from gridledger.cli import main
from proto.attestation import claims_for, issue_evidence
from proto.keys import SigningKey, write_key_pair
from proto.limits import MAX_CLOCK_SKEW_MS, MAX_EVIDENCE_AGE_MS

MINUTE = 60_000
SERVICE = SigningKey.from_seed_text("nras", "tests/prechecks/nras")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    # The ledger's clock (the arrival of what it reads) at minute 10: usage folded to
    # minute 5, the rest of the window still to sell.
    monkeypatch.setattr(test_cli_records, "EARLY_CLOCK_MS", T0_MS + 10 * MINUTE)
    w = World(tmp_path)
    yield w
    w.service.close()


def one_failure(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("FAIL: ") and "Traceback" not in err, err
    return lines[0]


def _pub(world: World, role: str) -> str:
    """The public key file of a party of the cast (written beside its private key)."""
    if role == "ledger":
        _, public = write_key_pair(world.scenario.cast.ledger, world.tmp / "ledgerkeys")
        return str(public)
    if role.startswith("node:"):
        key = world.scenario.cast.node_key(role.removeprefix("node:"))
        _, public = write_key_pair(key, world.tmp / "nodekeys")
        return str(public)
    return world.key(role).removesuffix(".key") + ".pub"


def _assign(world: World, new_buyer: str, public: str, *extra: str) -> list[str]:
    return ["assign", "--terms", str(world.signed_terms), "--new-buyer", new_buyer,
            "--new-buyer-key", public, "--handover-at", _iso(T0_MS + 30 * MINUTE),
            "--rate", "4.00", "--id", "as-1", *extra]  # fmt: skip


def _bind(world: World, node: str, public: str, *extra: str) -> list[str]:
    return ["bind-key", "--terms", str(world.signed_terms), "--node", node,
            "--node-key", public, *extra]  # fmt: skip


def _publish(world: World, record: Path) -> tuple[str, str, str]:
    """Publish a fully signed record to the ledger's transport; the ledger's decision."""
    spool = ["--local-dir", str(world.tmp / "spool")]
    assert main(["publish", str(record), "--terms", str(world.signed_terms), *spool]) == 0
    world.service.run_until_idle()
    return world.last_record()


def _export(world: World, name: str) -> Path:
    from ledger.export import export_placement

    path = world.tmp / name
    export_placement(world.service.store, world.pid, path, key=world.scenario.cast.ledger)
    return path


# ---- 1. refused before signing, from the terms -------------------------------------------------


@pytest.mark.parametrize(
    ("new_buyer", "holder", "option", "said"),
    [
        ("buyer-new", "buyer", "--new-buyer-key", "the buyer's key"),
        ("buyer-new", "desk", "--new-buyer-key", "the desk's key"),
        ("buyer-new", "operator", "--new-buyer-key", "the operator's key"),
        ("buyer-new", "ledger", "--new-buyer-key", "the ledger's key"),
        ("buyer-new", "node", "--new-buyer-key", "the key of node"),
        ("PARTY", "fresh", "--new-buyer", "is a party of the terms (the desk's id)"),
    ],
)
def test_assign_to_a_party_or_a_node_key_of_the_terms_is_refused_before_signing(
    world: World,
    capsys: pytest.CaptureFixture[str],
    new_buyer: str,
    holder: str,
    option: str,
    said: str,
) -> None:
    if holder == "fresh":
        _, fresh = write_key_pair(SigningKey.generate("buyer-new"), world.tmp / "newkeys")
        public = str(fresh)
    else:
        node = world.terms.nodes[0].node_id
        public = _pub(world, f"node:{node}" if holder == "node" else holder)
    if new_buyer == "PARTY":
        new_buyer = world.terms.desk.id
    out = world.tmp / "assignment.json"
    code = main(_assign(world, new_buyer, public, "--key", world.key("buyer"), "--out", str(out)))
    captured = capsys.readouterr()
    assert code == 2
    line = one_failure(captured.err)
    assert line.startswith(f"FAIL: {option} ") and said in line, line
    assert "SPEC §6.8: ASSIGNMENT_INVALID" in line
    assert not out.exists() and "signed" not in captured.out


@pytest.mark.parametrize("holder", ["operator", "buyer", "desk", "ledger"])
def test_binding_a_party_key_to_a_node_is_refused_before_signing(
    world: World, capsys: pytest.CaptureFixture[str], holder: str
) -> None:
    node = world.terms.nodes[0].node_id
    out = world.tmp / "binding.json"
    argv = _bind(world, node, _pub(world, holder), "--key", world.key("operator"))
    code = main([*argv, "--key", world.key("buyer"), "--out", str(out)])
    assert code == 2
    line = one_failure(capsys.readouterr().err)
    assert line.startswith("FAIL: --node-key ") and f"the {holder}'s key" in line, line
    assert "SPEC §6.3: BINDING_INVALID" in line
    assert not out.exists()


def _token(world: World, node: str, key: bytes, iat_s: int) -> Path:
    gpus = {g.uuid: g.model for g in world.terms.gpus if g.node_id == node}
    claims = claims_for(world.pid, node, key, gpus, iss="https://nras.example", iat=iat_s)
    path = world.tmp / f"evidence-{iat_s}.jwt"
    path.write_text(issue_evidence(claims, kid="k1", ed25519=SERVICE) + "\n")
    return path


def test_stale_or_future_evidence_is_refused_against_the_issued_time_with_the_limit_named(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    node = world.terms.nodes[0]
    public = _pub(world, f"node:{node.node_id}")
    issued = T0_MS + 20 * MINUTE
    oldest = (issued - MAX_EVIDENCE_AGE_MS) // 1000  # the window's ends, in whole seconds
    newest = (issued + MAX_CLOCK_SKEW_MS) // 1000
    cases = [
        (oldest - 1, 2, "older than MAX_EVIDENCE_AGE_MS (24 h)"),
        (oldest, 0, ""),
        (newest, 0, ""),
        (newest + 1, 2, "more than MAX_CLOCK_SKEW_MS (60 s) in its future"),
    ]
    for iat, want, said in cases:
        token = _token(world, node.node_id, node.key, iat)
        out = world.tmp / f"binding-{iat}.json"
        code = main(
            [*_bind(world, node.node_id, public, "--evidence", str(token)), "--issued-at",
             _iso(issued), "--key", world.key("operator"), "--out", str(out)]
        )  # fmt: skip
        captured = capsys.readouterr()
        assert code == want, (iat, captured.err)
        if want:
            line = one_failure(captured.err)
            assert line.startswith(f"FAIL: --evidence {token}: ") and said in line, line
            assert f"--issued-at {_iso(issued)}" in line and "EVIDENCE_INVALID" in line
            assert not out.exists()
        else:  # only the unchecked-signature warning (no --trust): signed
            assert "FAIL" not in captured.err and out.exists()
    # Without --issued-at the record is issued now: a token from the scenario's day is old.
    token = _token(world, node.node_id, node.key, T0_MS // 1000)
    code = main(
        [*_bind(world, node.node_id, public, "--evidence", str(token)), "--key",
         world.key("operator"), "--out", str(world.tmp / "now.json")]
    )  # fmt: skip
    assert code == 2
    line = one_failure(capsys.readouterr().err)
    assert "--issued-at (default: now)" in line and "MAX_EVIDENCE_AGE_MS" in line


def test_cosign_and_publish_refuse_a_record_file_the_ledger_will_refuse(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from devtools.builders import assignment, key_binding

    cast, node = world.scenario.cast, world.terms.nodes[0]
    issued = T0_MS + 20 * MINUTE
    stale = _token(world, node.node_id, node.key, (issued - MAX_EVIDENCE_AGE_MS) // 1000 - 1)
    files = {  # signed elsewhere (not by this CLI), each fully signed
        "meter.json": (
            assignment(cast, world.terms, "as-1", cast.node_key(node.node_id),
                       issued, [world.terms.gpus[0].uuid], 400),
            "the new buyer's key is the key of node",
        ),
        "desk.json": (
            key_binding(cast, world.pid, node.node_id, cast.desk, 0, 2**53 - 1, issued),
            "the node key is the desk's key",
        ),
        "stale.json": (
            key_binding(cast, world.pid, node.node_id, cast.node_key(node.node_id), 0,
                        2**53 - 1, issued, signers=[cast.operator],
                        evidence=stale.read_text().strip()),
            f"its evidence: issued at {_iso((issued - MAX_EVIDENCE_AGE_MS) // 1000 * 1000 - 1000)}",
        ),
    }  # fmt: skip
    before = world.last_record()
    spool = ["--local-dir", str(world.tmp / "spool")]
    for name, (raw, said) in files.items():
        path = world.tmp / name
        path.write_bytes(raw + b"\n")
        for argv in (
            ["publish", str(path), "--terms", str(world.signed_terms), *spool],
            ["cosign", str(path), "--terms", str(world.signed_terms), "--key",
             world.key("operator"), *spool],
        ):  # fmt: skip
            assert main(argv) == 2, name
            line = one_failure(capsys.readouterr().err)
            assert line.startswith(f"FAIL: {path}: ") and said in line, line
        assert path.read_bytes() == raw + b"\n"  # not re-signed
    world.service.run_until_idle()
    assert world.last_record() == before  # nothing reached the ledger


# ---- 2. what the CLI cannot know: the dry run says what the ledger then does ----------------


def test_evidence_fresh_when_issued_but_stale_on_arrival_the_dry_run_and_ledger_agree(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    node = world.terms.nodes[0]
    arrival = T0_MS + 10 * MINUTE  # the World's ledger clock: when its inputs arrive
    issued = arrival - MINUTE
    token = _token(world, node.node_id, node.key, (arrival - MAX_EVIDENCE_AGE_MS) // 1000 - 1)
    argv = [*_bind(world, node.node_id, _pub(world, f"node:{node.node_id}"), "--evidence",
            str(token)), "--issued-at", _iso(issued), "--key", world.key("operator")]  # fmt: skip
    dry = ["--dry-run", "--export", str(world.export)]
    # Fresh when issued: no pre-check refuses it. The log is already at minute 10 (SPEC
    # §6.6: arrivals never go back), so the dry run, asked for minute 9, times it there.
    assert main([*argv, *dry, "--arrives-at", _iso(issued)]) == 1
    out = capsys.readouterr().out
    assert f"the log is already at {_iso(arrival)}" in out, out
    assert "rejected EVIDENCE_INVALID" in out and "MAX_EVIDENCE_AGE_MS" in out, out
    record = world.tmp / "binding.json"
    assert main([*argv, "--out", str(record)]) == 0
    assert _publish(world, record) == ("keybinding", "rejected", "EVIDENCE_INVALID")


def test_a_resale_to_a_key_bound_since_the_terms_revoked_too_the_dry_run_and_ledger_agree(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    node = world.terms.nodes[0].node_id
    meter = SigningKey.generate("meter-2")
    private, public = write_key_pair(meter, world.tmp / "meter")
    # The operator and the buyer bind the key to the node; the operator then revokes it.
    bound = world.tmp / "bound.json"
    keys = ["--key", world.key("operator"), "--key", world.key("buyer")]
    assert main([*_bind(world, node, str(public), *keys, "--out", str(bound))]) == 0
    assert _publish(world, bound) == ("keybinding", "accepted", "")
    revoked = world.tmp / "revoked.json"
    until = ["--valid-until", _iso(T0_MS + 11 * MINUTE)]
    assert main([*_bind(world, node, str(public), *until, *keys, "--out", str(revoked))]) == 0
    assert _publish(world, revoked) == ("keybinding", "accepted", "")
    export = _export(world, "bound.duckdb")
    capsys.readouterr()
    # The terms do not name the key: the command signs; the dry run says the ledger's no.
    signers = ["--key", world.key("buyer"), "--key", str(private), "--key", world.key("desk")]
    record = world.tmp / "assignment.json"
    dry = ["--dry-run", "--export", str(export), "--arrives-at", _iso(T0_MS + 12 * MINUTE)]
    assert main(_assign(world, "buyer-new", str(public), *signers, *dry)) == 1
    out = capsys.readouterr().out
    assert f"rejected ASSIGNMENT_INVALID: the new buyer's key is a node key of {node}" in out
    assert main(_assign(world, "buyer-new", str(public), *signers, "--out", str(record))) == 0
    assert _publish(world, record) == ("assignment", "rejected", "ASSIGNMENT_INVALID")


def test_binding_an_accepted_new_buyers_key_the_dry_run_and_ledger_agree(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    node = world.terms.nodes[0].node_id
    private, public = write_key_pair(SigningKey.generate("buyer-new"), world.tmp / "newkeys")
    signers = ["--key", world.key("buyer"), "--key", str(private), "--key", world.key("desk")]
    record = world.tmp / "assignment.json"
    assert main(_assign(world, "buyer-new", str(public), *signers, "--out", str(record))) == 0
    assert _publish(world, record) == ("assignment", "accepted", "")
    export = _export(world, "sold.duckdb")
    capsys.readouterr()
    keys = ["--key", world.key("operator"), "--key", world.key("buyer")]
    dry = ["--dry-run", "--export", str(export), "--arrives-at", _iso(T0_MS + 12 * MINUTE)]
    assert main([*_bind(world, node, str(public), *keys, *dry)]) == 1
    out = capsys.readouterr().out
    assert "rejected BINDING_INVALID: the key is the new buyer 'buyer-new'" in out, out
    binding = world.tmp / "binding.json"
    assert main([*_bind(world, node, str(public), *keys, "--out", str(binding))]) == 0
    assert _publish(world, binding) == ("keybinding", "rejected", "BINDING_INVALID")


# ---- 3. a dry run of an assignment: both obligations -------------------------------------------


def _amount(text: str) -> int:
    """``1.23 USD`` -> 123 (minor units, scale 2)."""
    whole, cents = text.split()[0].lstrip("+").split(".")
    sign = -1 if whole.startswith("-") else 1
    return sign * (abs(int(whole)) * 100 + int(cents))


def test_a_dry_run_of_an_assignment_shows_the_new_buyers_and_the_original_buyers_obligations(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = write_key_pair(SigningKey.generate("buyer-new"), world.tmp / "newkeys")
    gpu = world.terms.gpus[0]
    signers = ["--key", world.key("buyer"), "--key", str(private), "--key", world.key("desk")]
    dry = ["--dry-run", "--export", str(world.export), "--arrives-at", _iso(T0_MS + 12 * MINUTE)]
    code = main(_assign(world, "buyer-new", str(public), "--gpus", gpu.uuid, *signers, *dry))
    out = capsys.readouterr().out
    assert code == 0, out
    owes_now = world.totals()["buyer_owes_minor"]
    desk_now = world.totals()["desk_receives_minor"]
    assert "obligations (SPEC §7.10):" in out
    # Nothing delivered since the handover yet: the new buyer owes 0.00, the original buyer's
    # net is what it owes, the desk's total its fee.
    assert re.search(r"^  buyer-new owes\s+-\s+0\.00 USD\s+$", out, re.M), out
    net = re.search(r"^  original buyer's net\s+(\S+ USD)\s+(\S+ USD)", out, re.M)
    assert net is not None and _amount(net[1]) == _amount(net[2]) == owes_now, out
    desk = re.search(r"^  desk in all\s+(\S+ USD)\s+(\S+ USD)", out, re.M)
    assert desk is not None and _amount(desk[1]) == _amount(desk[2]) == desk_now, out
    # From the handover (minute 30) to the window's end: 30 min of its share at 4.00/GPU-h.
    delivered = gpu.share_milli * (WINDOW_MS - 30 * MINUTE)
    unit = world.terms.increment_ms * 1000
    billable = -(-delivered // unit) * unit
    gross = billable * 400 // 3_600_000_000
    fee = gross * world.terms.desk_fee_bps // 10_000
    full = re.search(r"^  buyer-new owes from 2026-01-01T00:30:00Z: up to (\S+ USD) .*"
                     r"falls by up to (\S+ USD) \(after the desk's resale fee (\S+ USD)\)$",
                     out, re.M)  # fmt: skip
    assert full is not None, out
    assert (_amount(full[1]), _amount(full[2]), _amount(full[3])) == (gross, gross - fee, fee)
    assert gross > 0


# ---- 4. verify: the trust file's path once; the desk's total once ------------------------------


def test_verify_names_an_unusable_trust_file_once(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = world.tmp / "junk.json"
    junk.write_text('{"x": 1}')
    for given in (_pub(world, "desk"), str(junk), str(world.tmp / "missing.json")):
        code = main(["verify", str(world.export), "--trust", given])
        assert code == 2
        line = one_failure(capsys.readouterr().err)
        assert line.count(given) == 1 and line.startswith("FAIL: --trust: "), line


def test_verify_ok_line_with_a_resale_says_the_desk_total_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gridledger.demo import run_demo

    demo = run_demo(tmp_path / "demo")
    assert main(["verify", str(demo.export), "--trust", str(demo.trust)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("OK: ")]
    assert line.count("desk receives") == 1 and line.count("in all") == 1, line
    # As the statement page's desk card (docs/bill.md: fee 0.11, resale fee 0.04).
    assert "desk receives 0.15 USD in all (0.11 fee + 0.04 resale fee)" in line
    assert "finetune-labs owes 1.61 USD" in line and "original buyer's net 2.88 USD" in line
    page = (demo.workdir / "statement" / "pl-demo-0001.desk.html").read_text()
    assert "receives in all (0.11 fee + 0.04 resale fee)" in page
