"""The ``package`` and ``install`` subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cloudshell_mutex.packaging.build import PACKAGE_FILE_NAME, PackageSources, build_package
from cloudshell_mutex.packaging.format import PackageError

DEFAULT_PACKAGE = Path("dist") / PACKAGE_FILE_NAME


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def run_package(args: argparse.Namespace) -> int:
    """Build the package; print where it went and its sha256."""
    root = Path(args.root)
    output = Path(args.output) if args.output else root / DEFAULT_PACKAGE
    sources = PackageSources.in_tree(root, Path(args.manifest) if args.manifest else None)
    try:
        result = build_package(sources, output)
    except PackageError as error:
        return _error(str(error))
    drivers = ", ".join(result.drivers) if result.drivers else "none"
    print(f"wrote {result.path} ({result.size} bytes, drivers: {drivers})")
    print(f"sha256 {result.sha256}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    """Import the package into CloudShell through the Quali API."""
    # Imported here: the REST client and its progress-bar dependencies are only needed by this command.
    from cloudshell_mutex.packaging.install import InstallError, install_package, resolve_settings
    from cloudshell_mutex.settings import DEFAULTS, ENV_VARS, redact_userinfo, scrub

    # Every password this run may know of is masked in whatever is printed: a last line of defence, since
    # the messages are built not to hold one. Passwords shorter than 4 characters are left out: masking
    # them would garble every message, and such a password is a substring of any text anyway.
    secrets = [args.password, os.environ.get(ENV_VARS["password"])]
    # A password that is the user name itself (admin/admin, the emulator's and a new server's) is shown as the
    # user name: masking it only hid the user ('********') from whoever already knew it.
    users = [args.username or os.environ.get(ENV_VARS["username"]) or DEFAULTS["username"]]

    def safe(message: str) -> str:
        for secret in secrets:
            if secret and len(secret) >= 4 and secret not in users:
                message = scrub(message, secret)
        return redact_userinfo(message)

    try:
        settings = resolve_settings(args)
        secrets.append(settings.password)
        users.append(settings.username)
        message = install_package(settings)
    except (InstallError, PackageError) as error:
        return _error(safe(str(error)))
    print(safe(message))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``package`` and ``install`` subcommands."""
    package = subparsers.add_parser(
        "package",
        help="build dist/Mutex_Package.zip reproducibly",
        description="Validate DataModel/, package/ and drivers.toml, then write the package zip.",
    )
    package.add_argument("--root", default=".", help="source tree (default: current directory)")
    package.add_argument("--manifest", help="drivers manifest (default: ROOT/drivers.toml)")
    package.add_argument("--output", help=f"zip to write (default: ROOT/{DEFAULT_PACKAGE.as_posix()})")
    package.set_defaults(func=run_package)

    install = subparsers.add_parser(
        "install",
        help="import the package into CloudShell (Quali API)",
        description=(
            "Import the package through the Quali API. Each setting comes from its flag, else its "
            "environment variable (CLOUDSHELL_HOST, CLOUDSHELL_PORT, CLOUDSHELL_USERNAME, "
            "CLOUDSHELL_PASSWORD, CLOUDSHELL_DOMAIN), else the install: block of cloudshell_config.yml, "
            "else the default. Prefer the variable or the file for the password: flags are visible to "
            "other local users."
        ),
    )
    install.add_argument("--host", help="CloudShell server (default: localhost)")
    install.add_argument("--port", help="Quali API port (default: 9000)")
    install.add_argument("--username", help="system administrator (default: admin)")
    install.add_argument("--password", help="password (no default; prefer CLOUDSHELL_PASSWORD)")
    install.add_argument("--domain", help="domain (default: Global)")
    install.add_argument(
        "--package",
        default=str(DEFAULT_PACKAGE),
        help=f"zip to import (default: {DEFAULT_PACKAGE.as_posix()})",
    )
    install.add_argument(
        "--config", help="cloudshell_config.yml (default: ./cloudshell_config.yml if present)"
    )
    install.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default: 30)")
    install.set_defaults(func=run_install)
