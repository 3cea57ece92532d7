"""`gridledger COMMAND ...` imports the module of COMMAND only (not DuckDB, NumPy and every
other subcommand's code), with the same help and errors as the full parser."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from gridledger.cli import _COMMANDS, build_parser, command_of


def _registered(module: str) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)  # type: ignore[attr-defined]
    return tuple(sub.choices)


@pytest.mark.parametrize("module", sorted(_COMMANDS))
def test_the_table_names_what_each_module_registers(module: str) -> None:
    assert _registered(module) == _COMMANDS[module]


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_each_command_has_the_same_help_alone_as_in_the_full_parser() -> None:
    full = _choices(build_parser())
    assert set(full) == {c for commands in _COMMANDS.values() for c in commands}
    for command, parser in full.items():
        alone = _choices(build_parser(command))
        assert command in alone
        assert alone[command].format_help() == parser.format_help(), command


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["verify", "x.duckdb"], "verify"),
        (["--log-level", "debug", "ledger", "run"], "ledger"),
        (["--log-format=json", "keys", "gen"], "keys"),
        (["--log-format", "json", "--", "meter"], "meter"),
        (["--help"], None),
        ([], None),
        (["--log-level"], None),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_the_command_word_is_found_past_the_top_options(
    argv: list[str], command: str | None
) -> None:
    assert command_of(argv) == command


def test_an_unknown_command_still_gets_the_full_list_in_its_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gridledger", "no-such-command"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("FAIL: unknown command 'no-such-command'; the commands: ")
    assert " verify," in done.stderr and " ledger," in done.stderr


def test_a_command_imports_its_module_only() -> None:
    code = (
        "import json, sys; from gridledger.cli import build_parser; "
        "build_parser(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ledger', 'meter', 'witness', 'duckdb', 'numpy'))))"
    )
    loaded = {}
    for command in ("keys", "ledger"):
        done = subprocess.run(
            [sys.executable, "-c", code, command],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        loaded[command] = set(json.loads(done.stdout))
    assert not loaded["keys"] & {"ledger.store", "duckdb", "numpy", "meter.cli", "witness.cli"}
    assert {"ledger.cli", "ledger.store", "duckdb"} <= loaded["ledger"]
