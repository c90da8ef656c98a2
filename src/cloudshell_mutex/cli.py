"""The ``cloudshell-mutex`` command line.

Each subcommand lives next to the code it drives; this module only collects them. A command module
exposes ``register(subparsers)``, which adds its parser(s) and sets ``func`` to a callable that takes the
parsed arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from typing import Optional, Sequence

#: Modules that contribute subcommands, in help order.
COMMAND_MODULES = (
    "cloudshell_mutex.packaging.command",
    "cloudshell_mutex.lock.admin.command",
    "cloudshell_mutex.probe.command",
    "cloudshell_mutex.emulator.command",
)
#: What ``pip install 'cloudshell-mutex[cli]'`` adds to the runtime install (which drivers and scripts get):
#: the Quali API client, YAML for cloudshell_config.yml, and TOML for drivers.toml before Python 3.11.
CLI_EXTRA_MODULES = ("cloudshell.rest", "requests", "requests_toolbelt", "alive_progress", "yaml", "tomli")
#: The exit code when the extra is missing: nothing was attempted (as for a bad command line).
EXIT_MISSING_EXTRA = 2


def missing_cli_extra(error: ModuleNotFoundError) -> Optional[str]:
    """The missing module when ``error`` comes from the ``cli`` extra not being installed, else None."""
    name = error.name or ""
    if any(name == module or name.startswith(f"{module}.") for module in CLI_EXTRA_MODULES):
        return name
    return None


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
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code.

    The commands need the ``cli`` extra, which a driver's or script's install leaves out: without it the
    command says what to install and exits with 2, before any request is made.
    """
    try:
        return _run(argv)
    except ModuleNotFoundError as error:
        missing = missing_cli_extra(error)
        if missing is None:
            raise
        print(
            f"error: the cloudshell-mutex command needs the 'cli' extra ({missing} is not installed): "
            "pip install 'cloudshell-mutex[cli]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA


def _run(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse would echo them all: a mistyped flag (--passwd SECRET) would print the password.
        options = [token.split("=", 1)[0] for token in unknown if token.startswith("-")]
        parser.error(f"unrecognized arguments: {' '.join(options) or '(values not shown)'}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
