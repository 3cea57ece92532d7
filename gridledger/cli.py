"""The one `gridledger` command. Each package registers its own subcommands.

Library code never exits; a subcommand handler returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol, cast


class _Registers(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


# Modules that contribute subcommands, each with `register(subparsers)`, and the top-level
# commands each registers (tests/test_cli_lazy.py holds this table to what the modules
# register). A handler is set with `parser.set_defaults(handler=fn)` where fn(args) -> int.
_COMMANDS: dict[str, tuple[str, ...]] = {
    "gridledger.cmd_keys": ("keys",),
    "gridledger.cmd_terms": ("terms",),
    "gridledger.cmd_records": (
        "reclaim",
        "release",
        "adjust",
        "resume",
        "bind-key",
        "assign",
        "cosign",
        "publish",
    ),
    "gridledger.cmd_trust": ("trust",),
    "gridledger.cmd_check": ("check",),
    "gridledger.cmd_fetch": ("fetch",),
    "gridledger.cmd_invoice": ("invoice", "focus", "audit", "profile"),
    "meter.cli": ("meter",),
    "ledger.cli": ("ledger",),
    "verifier.cli": ("verify",),
    "witness.cli": ("witness",),
    "gridledger.demo": ("demo",),
    "gridledger.replay": ("replay",),
    "gridledger.example_stack": ("example-setup",),
}
_COMMAND_MODULES = tuple(_COMMANDS)
# Top-level options that take a value (the command is the first word that is neither).
_VALUED_OPTIONS = ("--log-format", "--log-level")


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand word of a command line (None: none given, e.g. ``--help``)."""
    words = iter(argv)
    for word in words:
        if word in _VALUED_OPTIONS:
            next(words, None)
        elif word == "--":
            return next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every installed subcommand, or, when ``command`` is one of
    them, with that one's module only: a run imports what it uses (the whole set costs
    ~0.9 s of imports, DuckDB and NumPy among them), and its help and errors are the same."""
    parser = _Parser(
        prog="gridledger",
        description="Metering and settlement ledger for shared GPU capacity.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gridledger {_version()}", help="print the version"
    )
    # Subparsers are _Parsers too; the modules' register() takes the base class.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
    wanted = [m for m, commands in _COMMANDS.items() if command in commands]
    for name in wanted or _COMMAND_MODULES:
        try:
            module: _Registers = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    _plain(parser)
    _log_options(parser, top=True)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse, with the closest choice suggested for a mistyped subcommand or value (its
    subparsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        import difflib
        import re

        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            choices = re.findall(r"'([^']*)'", bad.group(2))
            hint = difflib.get_close_matches(bad.group(1), choices, n=1)
            if hint:
                message += f"; did you mean {hint[0]}?"
        super().error(message)


def _log_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--log-format and --log-level on the top command and on every subcommand (given
    anywhere on the line; a subcommand's default never hides the top command's value)."""
    from gridledger.logs import FORMATS, LEVELS

    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default,
        help="log lines on stderr: json or console (default: console on a terminal, else json)",
    )
    parser.add_argument(
        "--log-level", choices=LEVELS, default=default, help="least severe level logged (info)"
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action.choices.values():
                _log_options(choice)


def _plain(parser: argparse.ArgumentParser) -> None:
    """Help a person reads: docstrings' reStructuredText literals (double backticks) shown
    as plain text, in every description and option help of every subcommand."""
    if parser.description:
        parser.description = parser.description.replace("``", "")
    for action in parser._actions:
        if action.help:
            action.help = action.help.replace("``", "")
        if isinstance(action, argparse._SubParsersAction):
            for choice in action.choices.values():
                _plain(choice)


def _unknown_command(command: str, known: list[str]) -> int:
    """One line for a mistyped command, with the closest one (argparse lists them all)."""
    import difflib

    hint = difflib.get_close_matches(command, known, n=1)
    also = f"did you mean gridledger {hint[0]}? " if hint else ""
    print(
        f"FAIL: unknown command {command!r}; {also}the commands: {', '.join(sorted(known))} "
        "(gridledger --help says what each does)",
        file=sys.stderr,
    )
    return 2


def _version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gridledger")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    command = command_of(sys.argv[1:] if argv is None else argv)
    known = [c for commands in _COMMANDS.values() for c in commands]
    if command is not None and command not in known:
        return _unknown_command(command, known)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    from gridledger.logs import configure_logging

    configure_logging(args.log_format, args.log_level)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`... | head`): what it read stands; say nothing more.
        # stdout is pointed at devnull so the interpreter's exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
