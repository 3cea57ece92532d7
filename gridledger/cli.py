"""The one `gridledger` command. Each package registers its own subcommands.

Library code never exits; a subcommand handler returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol


class _Registers(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


# Modules that contribute subcommands, each with `register(subparsers)`. A handler is set
# with `parser.set_defaults(handler=fn)` where fn(args) -> int.
_COMMAND_MODULES = (
    "gridledger.cmd_keys",
    "gridledger.cmd_terms",
    "gridledger.cmd_records",
    "gridledger.cmd_trust",
    "gridledger.cmd_check",
    "meter.cli",
    "ledger.cli",
    "verifier.cli",
    "witness.cli",
    "gridledger.demo",
    "gridledger.replay",
    "gridledger.example_stack",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand that is installed."""
    parser = argparse.ArgumentParser(
        prog="gridledger",
        description="Metering and settlement ledger for shared GPU capacity.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gridledger {_version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
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


def _version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gridledger")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
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
