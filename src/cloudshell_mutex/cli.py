"""The ``cloudshell-mutex`` command line.

Each subcommand lives next to the code it drives; this module only collects them. A command module
exposes ``register(subparsers)``, which adds its parser(s) and sets ``func`` to a callable that takes the
parsed arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Optional, Sequence

from .emulator import command as emulator_command
from .lock import command as lock_command
from .packaging import command as packaging_command

#: Modules that contribute subcommands, in help order.
COMMAND_MODULES = (packaging_command, lock_command, emulator_command)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every subcommand registered."""
    # No abbreviated options: argparse's "ambiguous option: --p=SECRET" error would echo a password.
    parser = argparse.ArgumentParser(
        prog="cloudshell-mutex", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    subparsers = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        parser_class=functools.partial(argparse.ArgumentParser, allow_abbrev=False),
    )
    subparsers.required = True
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse would echo them all: a mistyped flag (--passwd SECRET) would print the password.
        options = [token.split("=", 1)[0] for token in unknown if token.startswith("-")]
        parser.error(f"unrecognized arguments: {' '.join(options) or '(values not shown)'}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
