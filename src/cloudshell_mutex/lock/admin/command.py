"""The ``status`` and ``release`` subcommands: see who holds a reservation's lock, and remove it by force.

Connection settings are resolved like ``cloudshell-mutex install``'s (flag, then ``CLOUDSHELL_*`` variable,
then the ``install:`` block of shellfoundry's ``cloudshell_config.yml``, then the default), with one
difference: these commands talk to the **Automation API** (port 8029, ``--api-port`` /
``CLOUDSHELL_API_PORT``), not to the Quali API that ``install`` uses (9000, ``--port`` /
``CLOUDSHELL_PORT``, and the ``port:`` of the config file, which is therefore not read here).
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from ..errors import MutexError
from ..holder import Holder, parse_token, this_host
from ..lease.lease import lease_of, stale_margin
from ..protocol import DEFAULT_ALIAS, check_service_alias
from ..server import connect
from ..server.alias import LockAlias
from ..server.connect import SettingNames
from ..text import MAX_OUTPUT_LENGTH, one_line
from .admin import (
    WATCH_INTERVAL,
    AdminReport,
    Outcome,
    Permission,
    clean_reason,
    force_release,
    force_release_permission,
    lock_status,
)
from .listing import LockObserver

#: Exit codes (docs/admin.md). argparse itself exits with 2 on a malformed command line.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad settings or arguments, as argparse's own errors
EXIT_NO_LOCK = 3
EXIT_RESERVATION = 4
EXIT_REFUSED = 5
EXIT_CONNECTION = 6
EXIT_LOGIN = 7

_EXIT_CODES = {
    Outcome.HELD: EXIT_OK,
    Outcome.RELEASED: EXIT_OK,
    Outcome.FREE: EXIT_NO_LOCK,
    Outcome.NO_LOCK: EXIT_NO_LOCK,
    Outcome.GONE_MEANWHILE: EXIT_NO_LOCK,
    Outcome.RESERVATION_MISSING: EXIT_RESERVATION,
    Outcome.RESERVATION_ENDED: EXIT_RESERVATION,
    Outcome.REFUSED: EXIT_REFUSED,
    Outcome.UNKNOWN: EXIT_FAILED,
    Outcome.FAILED: EXIT_FAILED,
}

#: Setting -> environment variable. The Automation API port has its own variable: CLOUDSHELL_PORT is
#: the Quali API's (``install``).
ENV_VARS = {
    "host": "CLOUDSHELL_HOST",
    "api_port": "CLOUDSHELL_API_PORT",
    "username": "CLOUDSHELL_USERNAME",
    "password": "CLOUDSHELL_PASSWORD",
    "domain": "CLOUDSHELL_DOMAIN",
}
DEFAULT_API_PORT = 8029
#: Read from the config file's install: block; its port: is the Quali API's, so not here.
_CONFIG_KEYS = ("host", "username", "password", "domain")


class SettingsError(Exception):
    """The connection settings are incomplete or invalid; the message never holds the password."""


@dataclass(frozen=True)
class ConnectionSettings:
    """Where the Automation API is, and as whom to log on."""

    host: str
    api_port: int
    username: str
    password: str = field(repr=False)
    domain: str
    timeout: float = 30.0

    @property
    def where(self) -> str:
        """The API's address, for messages."""
        return f"the CloudShell Automation API at {self.host}:{self.api_port}"


def resolve_connection(
    args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None
) -> ConnectionSettings:
    """Combine flags, ``CLOUDSHELL_*`` variables, ``cloudshell_config.yml`` and defaults, in that order."""
    # Imported here: the settings rules (YAML, host forms, shellfoundry's password) serve the CLI only,
    # and the Mutex Service driver's zip bundles this wing without them.
    from cloudshell_mutex import settings

    try:
        defaults = {**settings.DEFAULTS, "api_port": str(DEFAULT_API_PORT)}
        values = settings.pick_settings(args, ENV_VARS, defaults, environ, cwd, _CONFIG_KEYS)
        host, host_port = settings.parse_host(*values["host"][:2])
        port_value, port_origin, port_given = values["api_port"]
        port = int(port_value) if port_value.strip().isdigit() else 0
        if not 0 < port < 65536:
            raise SettingsError(
                f"{port_origin} {port_value!r} is not a TCP port number (the Automation API listens on "
                f"{DEFAULT_API_PORT}; --api-port or {ENV_VARS['api_port']})"
            )
        if host_port is not None:
            if port_given and host_port != port:
                raise SettingsError(
                    f"{values['host'][1]} names port {host_port} but {port_origin} says {port}"
                )
            port = host_port
    except settings.InstallError as error:
        raise SettingsError(str(error)) from None
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise SettingsError("--timeout must be a positive number of seconds")
    return ConnectionSettings(
        host, port, values["username"][0], values["password"][0], values["domain"][0], args.timeout
    )


class ConnectError(Exception):
    """The session could not be opened; ``exit_code`` says whether it was the network or the login."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def open_session(settings: ConnectionSettings, **client_options: Any) -> Any:
    """A logged-on ``CloudShellAPISession`` (it logs on in its constructor; ``client_options`` go to it);
    :class:`ConnectError` with one line that names the setting to fix (the driver mixin words a context's
    failures alike)."""
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    def logon() -> Any:
        return CloudShellAPISession(
            host=settings.host,
            username=settings.username,
            password=settings.password,
            domain=settings.domain,
            port=settings.api_port,
            timeout=settings.timeout,
            **client_options,
        )

    names = SettingNames(
        host="--host (CLOUDSHELL_HOST)",
        port="--api-port (CLOUDSHELL_API_PORT)",
        credentials="--username and --password (CLOUDSHELL_USERNAME, CLOUDSHELL_PASSWORD)",
        domain="--domain (CLOUDSHELL_DOMAIN)",
        who=f"for user {settings.username!r}",
    )
    try:
        return connect.open_session(
            logon, settings.host, settings.api_port, settings.domain, names, secrets=(settings.password,)
        )
    except connect.SessionFailure as failure:
        raise ConnectError(str(failure), EXIT_LOGIN if failure.logon else EXIT_CONNECTION) from None


def _actor(settings: ConnectionSettings) -> str:
    return f"{settings.username} (cloudshell-mutex release on {socket.gethostname()})"


def _show(report: AdminReport, as_json: bool) -> int:
    """Print the report (JSON, or text: answers to stdout, failures to stderr) and return the exit code."""
    code = _EXIT_CODES[report.outcome]
    if as_json:
        print(json.dumps({**report.as_dict(), "exit_code": code}, indent=2, sort_keys=True))
    elif code in (EXIT_OK, EXIT_NO_LOCK):
        print(report.message)
        if report.holder is not None and report.outcome is Outcome.HELD:
            for name, value in sorted(report.holder.attributes.items()):
                # Values written by other code: one visible line each (no terminal escapes), cut.
                print(f"  {one_line(name)}: {one_line(value, MAX_OUTPUT_LENGTH)}")
    else:
        print(f"error: {report.message}", file=sys.stderr)
    return code


def _error(message: str, code: int, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"outcome": "error", "message": message, "exit_code": code}, indent=2))
    else:
        print(f"error: {message}", file=sys.stderr)
    return code


def _lock_alias(args: argparse.Namespace) -> Tuple[LockAlias, ConnectionSettings]:
    if not args.reservation.strip() or not args.name.strip():
        raise SettingsError("RESERVATION and --name must not be blank (e.g. --name MUTEX)")
    try:
        # Any alias a service can have, not only a lock name of ours: an administrator must be able to see and
        # remove a service whose alias only looks like MUTEX (made by other code). The report says so.
        check_service_alias(args.name)
    except ValueError as error:
        raise SettingsError(f"--name: {error}") from None
    settings = resolve_connection(args)
    return LockAlias(open_session(settings), args.reservation.strip(), args.name), settings


def run_status(args: argparse.Namespace) -> int:
    """Show who holds the lock (optionally watching it for ``--watch`` seconds)."""
    if not (args.watch >= 0 and math.isfinite(args.watch)):
        return _error("--watch must be a number of seconds (0 or more)", EXIT_USAGE, args.json)
    try:
        alias, _ = _lock_alias(args)
    except SettingsError as error:
        return _error(str(error), EXIT_USAGE, args.json)
    except ConnectError as error:
        return _error(str(error), error.exit_code, args.json)
    if getattr(args, "all", False):
        return _show_all(alias, args.watch, args.json)
    report = lock_status(alias, args.watch)
    code = _show(report, args.json)
    if report.outcome is Outcome.HELD and report.holder is not None and not args.json:
        _show_local(alias, report.holder, args.cohort_dir)
        if not args.watch:
            print("  (--watch SECONDS reads again for that long and says how long it stays held)")
    return code


def _show_local(alias: LockAlias, holder: Holder, cohort_dir: Optional[str]) -> None:
    """What this machine can tell of the holder: its cohort's files (other machines' are not visible), and
    whether the holding process, when it ran on this host, still runs."""
    from ..cohort.files import describe_local, local_status, process_alive  # filelock is needed only here

    try:
        state = local_status(alias.api, alias.reservation_id, alias.alias, cohort_dir)
    except Exception as error:  # the lock's status was shown; the local extra is a courtesy
        print(f"  (cohort files unreadable: {type(error).__name__})")
        state = None
    if state is not None:
        print(f"  {describe_local(state, holder.token)}")
    info = parse_token(holder.token)
    if state is not None and state.token == holder.token:  # the cohort's: its local holder holds it now
        local = state.holder or {}
        pid, who = int(local.get("pid") or 0), "the cohort's local holder"
        after = "the next command of this machine's cohort carries on under the lock; "
    elif info is not None and info.host == this_host():
        pid, who, after = info.pid, "the holder", ""
    else:
        return
    if pid and process_alive(pid) is False:
        seconds = lease_of(holder)
        frees = (
            f"waiters break it about {seconds + stale_margin(seconds):g} s after its last heartbeat"
            if seconds
            else "it has no lease: only a force release frees it "
            f"(cloudshell-mutex release {alias.reservation_id} --force --reason ...)"
        )
        print(f"  {who} (pid {pid}) is not running on this host: it died holding the lock; {after}{frees}")


def _show_all(alias: LockAlias, watch: float, as_json: bool) -> int:
    """``status --all``: every lock service in the reservation (list_locks), read once a second while
    watching. Exit 0 when something is locked, 3 when nothing is."""
    observer = LockObserver(alias.api, alias.reservation_id, alias.model)
    start = time.monotonic()
    try:
        while True:
            listing = observer.observe()
            left = start + watch - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(WATCH_INTERVAL, left))
    except MutexError as error:
        return _error(str(error), EXIT_FAILED, as_json)
    code = EXIT_OK if listing.locks else EXIT_NO_LOCK
    if as_json:
        print(json.dumps({**listing.as_dict(), "exit_code": code}, indent=2, sort_keys=True))
    else:
        print("\n".join(listing.lines()))
    return code


def run_release(args: argparse.Namespace) -> int:
    """Remove the lock by force, on the record; refuse without ``--force`` and a reason."""
    if not args.force or not clean_reason(args.reason):
        given = {"--force": args.force, "--reason TEXT": clean_reason(args.reason)}
        missing = [flag for flag, value in given.items() if not value]
        return _error(
            f"refused: a force release removes the lock of whoever holds it; give {' and '.join(missing)} "
            "(the reason goes to the reservation output). See `cloudshell-mutex status` first",
            EXIT_REFUSED,
            args.json,
        )
    try:
        alias, settings = _lock_alias(args)
    except SettingsError as error:
        return _error(str(error), EXIT_USAGE, args.json)
    except ConnectError as error:
        return _error(str(error), error.exit_code, args.json)

    def authorize() -> Permission:
        # The rule of the Mutex Service driver's Force Release, for the user this command logs on as, in the
        # sandbox's own domain (its details say which; else the logon's).
        return force_release_permission(alias.api, settings.username, _domain_of(alias) or settings.domain)

    return _show(force_release(alias, _actor(settings), args.reason, authorize=authorize), args.json)


def _domain_of(alias: LockAlias) -> str:
    """The domain of the lock's reservation ("" when unreadable: the release's own read reports why)."""
    try:
        details = alias.api.GetReservationDetails(alias.reservation_id)
    except Exception:
        return ""
    return str(getattr(details.ReservationDescription, "DomainName", "") or "")


CONNECTION_HELP = f"""
connection: each setting comes from its flag, else CLOUDSHELL_HOST, CLOUDSHELL_API_PORT,
CLOUDSHELL_USERNAME, CLOUDSHELL_PASSWORD, CLOUDSHELL_DOMAIN, else the install: block of
cloudshell_config.yml (host, username, password, domain; its port: is the Quali API's and is not
used), else localhost, {DEFAULT_API_PORT}, admin and Global (there is no default password).
The Automation API port ({DEFAULT_API_PORT}) is not the Quali API port (9000) that `install` uses.
"""

_EXIT_HELP = """
exit codes: 0 done (status: the lock is held), 1 failed, 2 bad settings, 3 no lock held,
4 reservation not found or ended, 5 refused (release without --force or --reason, or by a user who is
neither a system admin nor a domain admin of the sandbox's domain),
6 cannot connect, 7 logon refused.
"""


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reservation", metavar="RESERVATION", help="the reservation (sandbox) id")
    parser.add_argument(
        "--name", default=DEFAULT_ALIAS, help=f"the lock's service alias (default: {DEFAULT_ALIAS})"
    )
    add_connection_options(parser)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` and the connection options that :func:`resolve_connection` reads."""
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--host", help="CloudShell server (default: localhost)")
    parser.add_argument(
        "--api-port", dest="api_port", help=f"Automation API port (default: {DEFAULT_API_PORT})"
    )
    parser.add_argument("--username", help="user (default: admin)")
    parser.add_argument("--password", help="password (no default; prefer CLOUDSHELL_PASSWORD)")
    parser.add_argument("--domain", help="domain (default: Global)")
    parser.add_argument(
        "--config", help="cloudshell_config.yml (default: ./cloudshell_config.yml if present)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per API call (default: 30)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``status`` and ``release`` subcommands."""
    status = subparsers.add_parser(
        "status",
        help="show who holds a reservation's lock",
        description="Read (fresh, never cached) who holds the lock's service alias in a reservation.",
        epilog=(
            "examples:\n"
            "  CLOUDSHELL_PASSWORD=... cloudshell-mutex status 0b9c3d1e-... --host cs.example.com\n"
            "  cloudshell-mutex status 0b9c3d1e-... --name CONFIG_LOCK --json\n"
            "  cloudshell-mutex status 0b9c3d1e-... --watch 30   # how long this observer sees it held\n"
            "  cloudshell-mutex status 0b9c3d1e-... --all        # every lock: readers, writers waiting\n"
            + CONNECTION_HELP
            + _EXIT_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(status)
    status.add_argument(
        "--watch",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep reading for SECONDS (one read a second) and say how long the same holder was seen",
    )
    status.add_argument(
        "--cohort-dir",
        default=None,
        help="the cohort folder of the drivers on THIS machine (default: theirs): shows its local holder",
    )
    status.add_argument(
        "--all",
        action="store_true",
        help="list every lock service in the reservation (locks, read groups and their readers, writers "
        "waiting, breakers, counters), with owners, how long this observer saw them held, and leases",
    )
    status.set_defaults(func=run_status)

    release = subparsers.add_parser(
        "release",
        help="remove a reservation's lock by force, on the record",
        description=(
            "Read who holds the lock, remove its service once, and write who released whose lock, and "
            "why, to the reservation output and to stdout. The remove cannot check the owner: use it on "
            "a lock that is stuck, after `status`."
        ),
        epilog=(
            "examples:\n"
            "  cloudshell-mutex release 0b9c3d1e-... --force --reason 'driver crashed on exec-02'\n"
            "  cloudshell-mutex release 0b9c3d1e-... --name CONFIG_LOCK --force --reason 'stuck' --json\n"
            + CONNECTION_HELP
            + _EXIT_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(release)
    release.add_argument("--force", action="store_true", help="required: yes, remove whoever holds it")
    release.add_argument("--reason", metavar="TEXT", help="required: why (written to the reservation output)")
    release.set_defaults(func=run_release)
