"""A CLI that explains itself (issue 18): trust init, terms errors with file and line,
signing with a .pub file, help for every option. One line per problem, never a
traceback, documented exit codes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gridledger.cli import build_parser
from gridledger.demo import _make_keys, _write_terms_toml
from proto.trust import load_trust


def _gridledger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gridledger", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


@pytest.fixture
def demo_files(tmp_path: Path) -> Path:
    """The demo's keys and terms.toml (no ledger run)."""
    keys = _make_keys(tmp_path / "keys")
    _write_terms_toml(tmp_path, keys)
    return tmp_path


def test_terms_errors_list_every_problem_with_file_and_line(demo_files: Path) -> None:
    text = (demo_files / "terms.toml").read_text()
    text = text.replace("rate_per_gpu_hour_minor = 245", "rate_per_gpu_hour_minr = 245")
    text = text.replace("desk_fee_bps = 250 ", "desk_fee_bps = 12000")
    text = text.replace("window_start_ms = 2026-12-01T00:00:00Z", "window_start_ms = 1796083200")
    text = text.replace('currency = "USD"', 'currency = "usd"')
    (demo_files / "bad.toml").write_text(text)
    lines = text.splitlines()

    def line_of(prefix: str) -> int:
        return next(i for i, line in enumerate(lines, start=1) if line.startswith(prefix))

    done = _gridledger(
        "terms", "sign", "bad.toml", "--key", "keys/inferco-batch.key", cwd=demo_files
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = done.stderr.strip().splitlines()
    assert all(e.startswith("FAIL: bad.toml:") for e in errors), errors
    expected = [
        f"bad.toml:{line_of('rate_per_gpu_hour_minr')}: unknown key rate_per_gpu_hour_minr "
        "(did you mean rate_per_gpu_hour_minor?)",
        f"bad.toml:{line_of('desk_fee_bps')}: desk_fee_bps = 12000: must be at most 10000",
        f"bad.toml:{line_of('window_start_ms')}: window_start_ms = 1796083200 looks like "
        "seconds; times are milliseconds (1796083200000)",
        f"bad.toml:{line_of('currency =')}: currency = 'usd': must be a three-letter currency",
        "bad.toml:1: missing key rate_per_gpu_hour_minor",
    ]
    for needle in expected:
        assert any(needle in e for e in errors), (needle, errors)
    assert len(errors) == len(expected)
    # Nothing in the library's words.
    assert not any("Object contains" in e or "Expected `" in e for e in errors), errors


def test_signing_with_a_public_key_file_says_so(demo_files: Path) -> None:
    done = _gridledger(
        "terms", "sign", "terms.toml", "--key", "keys/inferco-batch.pub", cwd=demo_files
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "FAIL: keys/inferco-batch.pub is a public key file; sign with the private key "
        "(keys/inferco-batch.key)"
    )
    assert "chmod" not in done.stderr


def test_trust_init_from_pub_files_checked_against_the_terms(demo_files: Path) -> None:
    keys = {
        "--operator": "keys/acme-gpu-cloud.pub",
        "--buyer": "keys/inferco-batch.pub",
        "--desk": "keys/gridx-desk.pub",
        "--ledger": "keys/gridledger-ledger-1.pub",
    }
    args = [x for pair in keys.items() for x in pair]
    done = _gridledger("trust", "init", *args, "--terms", "terms.toml", cwd=demo_files)
    assert done.returncode == 0, done.stderr
    trust = load_trust(demo_files / "trust.json")
    assert {(k.role, k.id) for k in trust.keys} == {
        ("operator", "acme-gpu-cloud"),
        ("buyer", "inferco-batch"),
        ("desk", "gridx-desk"),
        ("ledger", "gridledger-ledger-1"),
    }
    assert trust.cosigner_policy() == ("operator", "buyer")
    assert not trust.simulations  # production: a simulation is never FINAL under it
    assert b"simulations" not in (demo_files / "trust.json").read_bytes()
    sim = _gridledger("trust", "init", *args, "--simulations", "--out", "sim.json", cwd=demo_files)
    assert sim.returncode == 0 and "admits simulations" in sim.stdout, sim.stderr
    assert load_trust(demo_files / "sim.json").simulations
    # Not replaced without --force.
    again = _gridledger("trust", "init", *args, cwd=demo_files)
    assert again.returncode == 1 and "exists" in again.stderr
    # An id the terms do not use is caught before anything is written.
    renamed = [a.replace("keys/acme", "acme=keys/acme") for a in args]
    bad = _gridledger(
        "trust", "init", *renamed, "--terms", "terms.toml", "--out", "t2.json", cwd=demo_files
    )
    assert bad.returncode == 1
    assert "PARTY_ID_MISMATCH" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (demo_files / "t2.json").exists()
    witness = _gridledger(
        "trust", "init", *args, "--cosigners", "operator,auditor", "--out", "t3.json",
        cwd=demo_files,
    )  # fmt: skip
    assert witness.returncode == 2 and "auditor" in witness.stderr


def _actions(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"{path}: {'/'.join(action.option_strings) or action.dest}"
        for path, action in _actions(build_parser(), "gridledger")
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert missing == []


def test_help_has_no_raw_markup() -> None:
    parser = build_parser()
    texts = {"gridledger": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts.update({name: sub.format_help() for name, sub in action.choices.items()})
    assert [name for name, text in texts.items() if "``" in text] == []


def test_check_finds_what_disagrees_between_configs(tmp_path: Path) -> None:
    import tomllib

    import tomli_w

    from proto.keys import SigningKey, write_key_pair

    stack = tmp_path / "stack"
    setup = _gridledger("example-setup", "--out", str(stack), cwd=tmp_path)
    assert setup.returncode == 0, setup.stderr
    files = [str(p) for p in sorted(stack.glob("*.toml"))] + [str(stack / "trust.json")]
    ok = _gridledger("check", *files, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "OK: 2 meter, 1 ledger, terms of 1 placement, 1 trust file(s) agree" in ok.stdout
    # A ledger started with another key, a meter with a typo in its spool path.
    write_key_pair(SigningKey.generate("other-ledger"), stack / "keys")
    ledger = tomllib.loads((stack / "ledger.toml").read_text())
    ledger["key_file"] = "keys/other-ledger.key"
    (stack / "ledger.toml").write_text(tomli_w.dumps(ledger))
    meter = tomllib.loads((stack / "meter-a.toml").read_text())
    meter["spool_dir"] = "spoool/node-a"
    (stack / "meter-a.toml").write_text(tomli_w.dumps(meter))
    bad = _gridledger("check", *files, cwd=tmp_path)
    assert bad.returncode == 1
    problems = bad.stderr.strip().splitlines()
    assert len(problems) == 2, problems
    assert any("is not the key of the ledger of" in p and "TERMS_INVALID" in p for p in problems)
    assert any("meter-a.toml: spool_dir's parent" in p and "spoool" in p for p in problems)
    assert "Traceback" not in bad.stderr
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello\n")
    assert _gridledger("check", str(unknown), cwd=tmp_path).returncode == 2


def test_times_below_the_plausible_bound_read_as_seconds(demo_files: Path) -> None:
    import tomllib

    from proto.terms import MIN_PLAUSIBLE_MS, TermsError, terms_from_mapping

    text = (demo_files / "terms.toml").read_text()
    for value, refused in ((MIN_PLAUSIBLE_MS - 1, True), (MIN_PLAUSIBLE_MS, False)):
        changed = text.replace("created_at_ms = 2026-11-30T12:00:00Z", f"created_at_ms = {value}")
        data = tomllib.loads(changed)
        try:
            terms_from_mapping(data, demo_files)
            problems: list[str] = []
        except TermsError as exc:
            problems = exc.problems
        assert any("looks like seconds" in p for p in problems) is refused, problems


def test_terms_naming_a_gpu_in_another_spelling_are_refused_before_signing(
    demo_files: Path,
) -> None:
    """SPEC §5 (3): one spelling per device; the terms file is refused in one line that
    names the uuid and its canonical spelling, and nothing is signed."""
    text = (demo_files / "terms.toml").read_text()
    assert 'uuid = "GPU-node-a-1"' in text
    (demo_files / "shout.toml").write_text(text.replace('"GPU-node-a-1"', '"GPU-NODE-A-1"'))
    done = _gridledger(
        "terms", "sign", "shout.toml", "--key", "keys/inferco-batch.key", cwd=demo_files
    )
    assert done.returncode == 1, done.stderr
    assert "'GPU-NODE-A-1'" in done.stderr and "'GPU-node-a-1'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not list(demo_files.glob("shout*.signed*"))
