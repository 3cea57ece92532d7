"""The CLI as a person uses it: the operator, the buyer, a new buyer by resale and an
auditor following docs/operating.md on the demo's files. Every refusal is one line naming
the option the user gave, with an exit code, never a traceback; the docs' commands exist."""

from __future__ import annotations

import argparse
import base64
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gridledger.cli import build_parser
from gridledger.cli import main as gridledger_main
from gridledger.demo import PLACEMENT_ID, DemoResult, run_demo
from proto.attestation import claims_for, issue_evidence
from proto.keys import SigningKey, load_public_key, write_key_pair
from proto.terms import load_terms_file

ROOT = Path(__file__).resolve().parent.parent
OPERATING = ROOT / "docs" / "operating.md"
# Every page a person copies commands from: the README and the docs.
DOC_PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PARTIES = ("acme-gpu-cloud", "inferco-batch", "gridx-desk")


# ---- the demo's files, copied per test ------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return run_demo(tmp_path_factory.mktemp("walkthrough") / "demo")


@pytest.fixture
def here(demo: DemoResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch copy of the demo's directory, the working directory of the test."""
    work = tmp_path / "demo"
    shutil.copytree(demo.workdir, work, symlinks=True)
    monkeypatch.chdir(work)
    yield work


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = gridledger_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_failure(err: str) -> str:
    """The single ``FAIL:`` line of stderr (and nothing else there)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("FAIL: "), err
    assert "Traceback" not in err
    return lines[0]


def trust_init(*extra: str) -> list[str]:
    return [
        "trust",
        "init",
        "--operator",
        "keys/acme-gpu-cloud.pub",
        "--buyer",
        "keys/inferco-batch.pub",
        "--desk",
        "keys/gridx-desk.pub",
        "--ledger",
        "keys/gridledger-ledger-1.pub",
        *extra,
    ]


# ---- the docs' commands ------------------------------------------------------------------------


def _doc_commands(*pages: Path) -> list[str]:
    """Every ``gridledger`` command of the pages' ``sh`` blocks, continuations joined."""
    blocks = [
        block
        for page in pages
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    ]
    commands: list[str] = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = line.strip()
            if re.match(r"^(\S*/)?gridledger\s", words):
                commands.append(words)
    return commands


def _parser_for(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """Descend the subcommands the words name (``verify prove``, ``ledger export``...)."""
    for word in words:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
    return parser


def test_doc_commands_use_only_options_the_parsers_have() -> None:
    commands = _doc_commands(*DOC_PAGES)
    # The commands parties sign records with are all there (docs that lost them fail here).
    for needed in ("release", "assign", "cosign", "bind-key", "trust init", "check"):
        assert any(f"gridledger {needed} " in c for c in commands), needed
    parser = build_parser()
    checked = 0
    for command in commands:
        words = [w.strip("[]") for w in shlex.split(command, comments=True)][1:]
        sub = _parser_for(parser, words)
        known = {o for a in sub._actions for o in a.option_strings}
        for word in words:
            if word.startswith("--"):
                option = word.split("=", 1)[0]
                assert option in known, f"docs: {command!r}: {option} is not an option"
                checked += 1
    assert checked > 50  # the docs' examples were read, not skipped


def test_operating_release_and_assign_examples_run_on_the_demo(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resale and release blocks, as written, run on the demo's files (``DIR``: the
    demo's local transport; ``now.duckdb``: its export)."""
    commands = [
        c.replace("now.duckdb", "exports/pl-demo-0001.duckdb").replace(" DIR", " local")
        for c in _doc_commands(OPERATING)
        if re.search(r"gridledger (keys new --id resell-co|assign|cosign as-0001|release)\b", c)
    ]
    assert len(commands) == 5, commands
    codes: list[tuple[int, str]] = []
    for command in commands:
        code, out, err = run(capsys, *shlex.split(command, comments=True)[1:])
        assert "FAIL" not in err and "Traceback" not in err, (command, err)
        codes.append((code, out))
    assert [c for c, _ in codes] == [0, 0, 0, 0, 1]
    assert "OK: published to local" in codes[3][1]  # the desk's cosignature completes it
    assert "rejected AFTER_CLOSE" in codes[4][1]  # the demo's placement is closed


# ---- trust init --new-buyer -----------------------------------------------------------------


def test_trust_init_pins_the_new_buyer_the_verifier_needs(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = "exports/pl-demo-0001.duckdb"
    code, _, err = run(capsys, *trust_init("--out", "without.json", "--terms", "terms.signed.json"))
    assert code == 0, err
    code, out, _ = run(capsys, "verify", export, "--trust", "without.json")
    assert code == 1 and "ASSIGNMENT_KEY_NOT_PINNED" in out
    assert "--new-buyer finetune-labs=FILE.pub" in out  # what to do about it
    code, out, err = run(
        capsys,
        *trust_init(
            "--new-buyer",
            "keys/finetune-labs.pub",
            "--terms",
            "terms.signed.json",
            "--out",
            "t.json",
        ),
    )
    assert code == 0, err
    assert "new buyer finetune-labs" in out
    pinned = json.loads(Path("t.json").read_text())["keys"]
    assert {"id": "finetune-labs", "role": "buyer"}.items() <= pinned[-1].items()
    assert (
        pinned[-1]["key"]
        == base64.b64encode(load_public_key(Path("keys/finetune-labs.pub")).key).decode()
    )
    code, out, _ = run(capsys, "verify", export, "--trust", "t.json")
    assert code in (0, 3), out  # verified (final, or provisional: witnessed by two)
    assert "ASSIGNMENT_KEY_NOT_PINNED" not in out


@pytest.mark.parametrize(
    ("new_buyers", "said"),
    [
        (["keys/finetune-labs.pub", "keys/finetune-labs.pub"], "already pinned by --new-buyer"),
        (["keys/inferco-batch.pub"], "already pinned by --buyer"),
        (["inferco-batch=keys/finetune-labs.pub"], "id 'inferco-batch' is already pinned"),
        (["finetune-labs=keys/node-a.pub", "keys/finetune-labs.pub"], "one id, one key"),
    ],
)
def test_trust_init_refuses_a_duplicate_pin_in_one_line(
    here: Path, capsys: pytest.CaptureFixture[str], new_buyers: list[str], said: str
) -> None:
    extra = [arg for spec in new_buyers for arg in ("--new-buyer", spec)]
    code, _, err = run(capsys, *trust_init(*extra, "--out", "dup.json"))
    assert code == 2
    assert said in one_failure(err) and "--new-buyer" in err
    assert not Path("dup.json").exists()


# ---- a private key where a public key is expected --------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        trust_init("--new-buyer", "keys/finetune-labs.key", "--out", "x.json"),
        [
            "trust",
            "init",
            "--operator",
            "keys/acme-gpu-cloud.key",
            "--buyer",
            "keys/inferco-batch.pub",
            "--desk",
            "keys/gridx-desk.pub",
            "--ledger",
            "keys/gridledger-ledger-1.pub",
            "--out",
            "x.json",
        ],
        [
            "assign",
            "--terms",
            "terms.signed.json",
            "--new-buyer",
            "resell-co",
            "--new-buyer-key",
            "keys/finetune-labs.key",
            "--handover-at",
            "2026-12-01T00:30:00Z",
            "--rate",
            "3.10",
            "--key",
            "keys/inferco-batch.key",
            "--out",
            "x.json",
        ],
        [
            "bind-key",
            "--terms",
            "terms.signed.json",
            "--node",
            "node-a",
            "--node-key",
            "keys/node-a.key",
            "--key",
            "keys/acme-gpu-cloud.key",
            "--out",
            "x.json",
        ],
    ],
)
def test_a_private_key_file_given_for_a_public_key_says_so(
    here: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = one_failure(err)
    assert "is a private key file; give the public key" in line
    private = next(a for a in argv if a.endswith(".key") and a != "keys/inferco-batch.key")
    assert f"({private[:-4]}.pub)" in line  # the file beside it, by name
    seed = json.loads(Path(private).read_text())["seed"]
    assert seed not in err  # never echoed
    assert not Path("x.json").exists()


# ---- validation errors name the option --------------------------------------------------------


def _assign(*extra: str) -> list[str]:
    return [
        "assign",
        "--terms",
        "terms.signed.json",
        "--new-buyer",
        "resell-co",
        "--new-buyer-key",
        "keys/finetune-labs.pub",
        "--handover-at",
        "2026-12-01T00:30:00Z",
        "--issued-at",
        "2026-12-01T00:29:00Z",
        "--key",
        "keys/inferco-batch.key",
        "--out",
        "x.json",
        *extra,
    ]


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (_assign("--rate", "abc"), "FAIL: --rate 'abc' is not a decimal number"),
        (_assign("--rate", "3.105"), "FAIL: --rate 3.105 has more than 2 decimals"),
        (_assign("--rate", "0"), "FAIL: --rate '0' must be a positive number"),
        (_assign("--rate", "3.10", "--id", "bad id!"), "FAIL: --id 'bad id!': must be 1-128"),
        (
            [*_assign("--rate", "3.10")[:4], "bad buyer", *_assign("--rate", "3.10")[5:]],
            "FAIL: --new-buyer 'bad buyer': must be 1-128",
        ),
        (
            [
                "adjust",
                "--terms",
                "terms.signed.json",
                "--credit",
                "1.001",
                "--reason",
                "x",
                "--key",
                "keys/acme-gpu-cloud.key",
            ],
            "FAIL: --credit 1.001 has more than 2 decimals",
        ),
        (
            [
                "reclaim",
                "--terms",
                "terms.signed.json",
                "--effective-at",
                "2026-12-01T00:52:00Z",
                "--issued-at",
                "2026-12-01T00:48:00Z",
                "--reason",
                "r" * 513,
                "--key",
                "keys/acme-gpu-cloud.key",
            ],
            "FAIL: --reason: must have at most 512 characters",
        ),
        (
            [
                "release",
                "--terms",
                "terms.signed.json",
                "--effective-at",
                "2026-12-01T00:40:00Z",
                "--key",
                "keys/inferco-batch.key",
            ],
            "FAIL: --effective-at 2026-12-01T00:40:00Z is before --issued-at (default: now)",
        ),
    ],
)
def test_validation_errors_name_the_option_given(
    here: Path, capsys: pytest.CaptureFixture[str], argv: list[str], starts: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = one_failure(err)
    assert line.startswith(starts), line
    for internal in ("_minor", "_ms", "$.", "_id", "msgspec"):
        assert internal not in line, line
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", line)  # no microseconds
    assert not Path("x.json").exists()


def test_a_key_that_may_not_sign_names_the_new_buyer_in_words(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, *_assign("--rate", "3.10"), "--key", "keys/node-a.key")
    assert code == 1
    line = one_failure(err)
    assert "the buyer and new buyer and desk" in line and "new_buyer" not in line


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("class", "inferencing", "(inference, training, reseller, burst, batch)"),
        ("isolation", "vm", "(shared, mig, dedicated)"),
        ("on_reclaim", "kill", "(checkpoint, drain, terminate)"),
    ],
)
def test_an_enum_value_lists_the_allowed_values(
    here: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, allowed: str
) -> None:
    text = Path("terms.toml").read_text()
    edited = re.sub(rf'^{key} = "[a-z]+"', f'{key} = "{value}"', text, count=1, flags=re.M)
    assert edited != text
    Path("bad.toml").write_text(edited)
    code, _, err = run(capsys, "terms", "sign", "bad.toml", "--key", "keys/inferco-batch.key")
    assert code == 2
    line = one_failure(err)
    assert f"= '{value}': not one of the allowed values {allowed}" in line


# ---- dry run against something that is not an export --------------------------------------------


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p.write_text("hello\n"), "is not a DuckDB file"),
        (lambda p: p.write_text('{"payload": "x"}\n'), "is not a DuckDB file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: None, "cannot read --export"),
    ],
)
def test_dry_run_on_a_file_that_is_not_an_export_is_one_line(
    here: Path, capsys: pytest.CaptureFixture[str], make: object, said: str
) -> None:
    target = here / "given.duckdb"
    make(target)  # type: ignore[operator]
    code, _, err = run(
        capsys,
        "release",
        "--terms",
        "terms.signed.json",
        "--key",
        "keys/inferco-batch.key",
        "--effective-at",
        "2026-12-01T00:40:00Z",
        "--issued-at",
        "2026-12-01T00:34:00Z",
        "--dry-run",
        "--export",
        str(target),
    )
    assert code == 2
    assert said in one_failure(err)


def test_dry_run_on_a_duckdb_file_that_is_no_export_is_one_line(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import duckdb

    con = duckdb.connect("other.duckdb")
    con.execute("CREATE TABLE t (a INTEGER)")
    con.close()
    code, _, err = run(
        capsys,
        "reclaim",
        "--terms",
        "terms.signed.json",
        "--key",
        "keys/acme-gpu-cloud.key",
        "--effective-at",
        "2026-12-01T00:52:00Z",
        "--issued-at",
        "2026-12-01T00:48:00Z",
        "--dry-run",
        "--export",
        "other.duckdb",
    )
    assert code == 2
    assert "is a DuckDB file but not a gridledger export" in one_failure(err)


# ---- attestation: evidence of an unpinned root, terms that require it ---------------------------


def _evidence(service: SigningKey) -> None:
    terms, _ = load_terms_file(Path("terms.signed.json"))
    key = load_public_key(Path("keys/node-a.pub")).key
    gpus = {g.uuid: g.model for g in terms.gpus if g.node_id == "node-a"}
    claims = claims_for(  # issued when the binding is (its --issued-at): fresh, SPEC §6.9
        terms.placement_id, "node-a", key, gpus, iss="https://nras.example", iat=1_796_083_800
    )
    Path("node-a.jwt").write_text(issue_evidence(claims, kid="k1", ed25519=service) + "\n")


def _bind(*extra: str) -> list[str]:
    return [
        "bind-key",
        "--terms",
        "terms.signed.json",
        "--node",
        "node-a",
        "--node-key",
        "keys/node-a.pub",
        "--evidence",
        "node-a.jwt",
        "--key",
        "keys/acme-gpu-cloud.key",
        "--issued-at",
        "2026-12-01T00:10:00Z",
        *extra,
    ]


def test_bind_key_warns_in_one_line_on_evidence_no_pinned_root_signs(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = SigningKey.from_seed_text("nras", "tests/issue16/nras")
    other = SigningKey.from_seed_text("other", "tests/issue16/other")
    write_key_pair(service, here / "svc")
    write_key_pair(other, here / "svc")
    _evidence(service)
    for name, root in (("trust-nras.json", "nras"), ("trust-other.json", "other")):
        code, _, err = run(
            capsys, *trust_init("--attestation", f"{root}=svc/{root}.pub", "--out", name)
        )
        assert code == 0, err
    cases = (
        ([], "is not checked here (no --trust FILE"),
        (["--trust", "trust-other.json"], "is signed by no attestation key pinned in"),
        (["--trust", "trust.json"], "(pinned: none)"),
    )
    for extra, said in cases:
        code, out, err = run(capsys, *_bind(*extra, "--out", "b.json"))
        assert code == 0, err  # it proceeds: the ledger decides
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("warning: --evidence node-a.jwt"), err
        assert said in lines[0] and "'https://nras.example'" in lines[0]
        assert "OK: signed -> b.json" in out
        Path("b.json").unlink()
    code, out, err = run(capsys, *_bind("--trust", "trust-nras.json", "--out", "b.json"))
    assert code == 0 and err == ""
    assert "signed by the attestation key 'nras' of trust-nras.json" in out


def test_check_warns_when_terms_require_attestation_and_the_ledger_has_no_root(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = Path("terms.toml").read_text()
    required = re.sub(
        r"^(placement_id = .*)$", r"\1\nattestation_required = true", text, count=1, flags=re.M
    )
    assert required != text
    Path("required.toml").write_text(required)
    code, _, err = run(capsys, "check", "ledger.toml", "required.toml")
    assert code == 0, err  # a warning, not a problem
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: required.toml"), err
    assert "no [[attestation_roots]]" in lines[0] and "NOT_ATTESTED" in lines[0]
    service = SigningKey.from_seed_text("nras", "tests/issue16/nras")
    root = base64.b64encode(service.public_key).decode()
    Path("rooted.toml").write_text(
        Path("ledger.toml").read_text()
        + f'\n[[attestation_roots]]\nid = "nras"\nalg = "EdDSA"\nkey = "{root}"\n'
    )
    code, _, err = run(capsys, "check", "rooted.toml", "required.toml")
    assert code == 0 and "warning" not in err, err
    code, _, err = run(capsys, "check", "ledger.toml", "terms.toml")  # not required: quiet
    assert code == 0 and "warning" not in err, err


# ---- the desk's card: its total across both obligations ------------------------------------------


def _card(page: str, total: str) -> int:
    found = re.search(rf'data-total="{total}" data-minor="(-?\d+)"', page)
    assert found is not None, total
    return int(found.group(1))


def test_the_desk_card_shows_its_total_across_both_obligations(
    demo: DemoResult, capsys: pytest.CaptureFixture[str]
) -> None:
    from billview import render
    from ledger.access import Roles
    from ledger.bill import bill_doc
    from ledger.config import load_config
    from ledger.http import LedgerApi
    from ledger.metrics import LedgerMetrics
    from ledger.store import Store
    from proto.keys import load_signing_key

    # Offline (verify --html, as the demo wrote it): the desk's page leads with 0.15.
    offline = (demo.workdir / "statement" / f"{PLACEMENT_ID}.desk.html").read_text()
    fee = 11  # 2.5 % of 4.45, the original terms (docs/bill.md)
    resale_fee = 4  # 2.5 % of the resale's 1.61
    assert _card(offline, "desk_total") == fee + resale_fee
    assert "receives in all (0.11 fee + 0.04 resale fee)" in offline
    assert 'data-total="desk_receives_minor"' not in offline.split("<h2>Line items")[0]
    # The ledger's own page, asked for by the desk's id or its role: the same card,
    # equal to the desk's line "Desk receives in all".
    config = load_config(demo.workdir / "ledger.toml")
    key = load_signing_key(config.key_file)
    with Store(config.db, ledger_public_key=key.public_key) as store:
        api = LedgerApi(store, key, LedgerMetrics())
        ledger_view = Roles(everything=True)  # the ledger's own key: any page (SPEC §13)
        _, by_id = api.bill(PLACEMENT_ID, "html", "gridx-desk", ledger_view)
        _, by_role = api.bill(PLACEMENT_ID, "html", "desk", ledger_view)
        doc = bill_doc(store, key, PLACEMENT_ID)
    assert by_id == by_role
    page = by_id.decode()
    assert 'data-party="desk"' in page
    (line,) = [ln for ln in doc.lines if ln.key == "desk_total"]
    assert _card(page, "desk_total") == line.amount_minor == doc.desk_total_minor == 15
    # The three parties' pages show the desk the same total; the new buyer's page shows
    # its own obligation only (the resale it pays the desk), nobody else's figures.
    for party in render.PARTY_ROLES:
        assert _card(render.to_html(doc, party), "desk_total") == 15
    new_buyer = render.to_html(doc, "finetune-labs")
    assert _card(new_buyer, "resale:resale-0001") == 161
    for other in ("desk_total", "buyer_owes_minor", "buyer_net", "operator_receives_minor"):
        assert f'data-total="{other}"' not in new_buyer, other
    # Without a resale the card is unchanged.
    no_resale = msgspec.structs.replace(
        doc, resale=[], original_buyer_net_minor=None, desk_total_minor=None
    )
    plain = render.to_html(no_resale, "desk")
    assert _card(plain, "desk_receives_minor") == doc.totals["desk_receives_minor"] == fee
    # The periods table holds the original terms' figures (0.11 for the desk): it says so.
    assert "These are the original terms' figures" in page
    assert "These are the original terms' figures" not in plain


def test_the_cli_never_prints_a_traceback_for_these(here: Path) -> None:
    """The console script itself (not ``main`` in-process): one line, exit 2."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gridledger",
            *trust_init("--new-buyer", "keys/finetune-labs.key", "--out", "x.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "private key file" in one_failure(done.stderr)


def test_ledger_list_names_whom_a_placement_was_resold_to(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "ledger", "list")
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith(PLACEMENT_ID)]
    assert row.endswith("acme-gpu-cloud / inferco-batch / gridx-desk (resold to finetune-labs)")
    code, out, err = run(capsys, "ledger", "list", "--json")
    assert code == 0, err
    (listed,) = json.loads(out)["placements"]
    assert listed["new_buyers"] == ["finetune-labs"]


def test_ledger_statement_keeps_its_amounts_in_one_column(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "ledger", "statement", PLACEMENT_ID)
    assert code == 0, err
    ends = {
        line.index(" USD") for line in out.splitlines() if re.match(r"^\S.* -?\d+\.\d\d USD$", line)
    }
    assert len(ends) == 1, ends  # "Resale resale-0001: finetune-labs owes ..." included
    assert "Resale resale-0001: finetune-labs owes" in out


def test_publishing_before_everyone_signed_names_the_file_and_who_is_missing(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "keys", "new", "--id", "resell-co", "--out", "keys/")
    assert code == 0, err
    argv = _assign("--rate", "3.10")
    argv[argv.index("keys/finetune-labs.pub")] = "keys/resell-co.pub"
    argv[argv.index("x.json")] = "as-0001.json"
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    code, out, err = run(
        capsys,
        "cosign",
        "as-0001.json",
        "--terms",
        "terms.signed.json",
        "--key",
        "keys/inferco-batch.key",
    )
    assert code == 0, err
    assert "note: the buyer (inferco-batch) had signed already" in out
    code, out, err = run(
        capsys, "publish", "as-0001.json", "--terms", "terms.signed.json", "--local-dir", "local"
    )
    assert code == 1
    line = one_failure(err)
    assert "the new buyer resell-co and desk must sign first" in line
    assert "gridledger publish as-0001.json" in line and "FILE" not in line
    assert "gridledger cosign as-0001.json" in out
    help_text = build_parser().format_help()
    # cosign and publish say they take an assignment (and a resume, listed after it)
    assert help_text.count("assignment, resume)") == 2


def test_check_takes_an_assignment_and_wants_its_new_buyer_pinned(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "check", "ledger.toml", "terms.signed.json", "trust.json", "assignment.signed.json"
    )
    assert code == 0, err  # the demo's trust file pins finetune-labs
    assert "1 assignment" in out
    code, _, err = run(capsys, *trust_init("--out", "no-resale.json"))
    assert code == 0, err
    code, _, err = run(
        capsys, "check", "terms.signed.json", "no-resale.json", "assignment.signed.json"
    )
    assert code == 1
    line = one_failure(err)
    assert "does not pin the new buyer finetune-labs" in line
    assert "--new-buyer finetune-labs=FILE.pub" in line


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("keys/gridx-desk.pub", "is a public key file, not a trust file"),
        ("keys/gridx-desk.key", "is a private key file, not a trust file"),
        ("terms.signed.json", "is a signed record (terms, or a record signed after them)"),
    ],
)
def test_verify_given_another_file_as_its_trust_file_says_what_it_is(
    here: Path, capsys: pytest.CaptureFixture[str], given: str, said: str
) -> None:
    code, _, err = run(capsys, "verify", "exports/pl-demo-0001.duckdb", "--trust", given)
    assert code == 2
    line = one_failure(err)
    assert said in line and "trust init" in line
    if given.endswith(".key"):
        assert json.loads(Path(given).read_text())["seed"] not in err


def test_a_ledger_that_refuses_the_connection_is_not_said_to_time_out(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = run(
        capsys,
        "release",
        "--terms",
        "terms.signed.json",
        "--key",
        "keys/inferco-batch.key",
        "--effective-at",
        "2026-12-01T00:40:00Z",
        "--issued-at",
        "2026-12-01T00:34:00Z",
        "--dry-run",
        "--ledger",
        f"http://127.0.0.1:{port}",
    )
    assert code == 2
    line = one_failure(err)
    assert f"cannot reach the ledger at http://127.0.0.1:{port}/" in line
    assert "within" not in line and "HTTP 0" not in line  # refused at once, no wait
