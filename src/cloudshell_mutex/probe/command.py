"""``cloudshell-mutex probe``: check a CloudShell server against what the lock assumes, in one command.

The connection settings are ``status``'s and ``release``'s (flags, ``CLOUDSHELL_*`` variables, then the
``install:`` block of ``cloudshell_config.yml``; the Automation API's port 8029).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..lock.admin.command import (
    CONNECTION_HELP,
    EXIT_USAGE,
    ConnectError,
    SettingsError,
    add_connection_options,
    open_session,
    resolve_connection,
)
from .run import DEFAULT_REQUEST_LIFETIME, Probe, ProbeAborted, ProbeSettings
from .verdicts import judge

#: Exit code of a run that was interrupted (after its clean-up), as shells report SIGINT.
EXIT_INTERRUPTED = 130
#: The run could not start (no sandbox could be created, or the one given cannot be used).
EXIT_ABORTED = 5

_EXIT_HELP = """
exit codes: 0 the lock is safe on this server as configured, 3 safe with the recommended settings,
1 not safe, 4 not every fact could be measured, 2 bad settings, 5 no sandbox to probe in,
6 cannot connect, 7 logon refused, 130 interrupted (after its clean-up).
"""


def _client_options() -> dict:
    """One request per call (no hidden re-sends), where the client can be told so: the probe times calls."""
    import inspect

    from cloudshell.api.cloudshell_api import CloudShellAPISession

    takes = "max_attempts" in inspect.signature(CloudShellAPISession.__init__).parameters
    return {"max_attempts": 1} if takes else {}


def run_probe(args: argparse.Namespace) -> int:
    """Run the probe and print its report (a table, or JSON); return the exit code."""
    try:
        settings = resolve_connection(args)
        probe_settings = ProbeSettings(
            reservation_id=args.reservation,
            racers=args.racers,
            rounds=args.rounds,
            max_wait=args.max_wait,
            request_lifetime=args.request_lifetime,
            lease=args.lease,
        )
    except (SettingsError, ValueError) as error:
        return _error(str(error), EXIT_USAGE, args.json)
    options = _client_options()

    def session() -> Any:
        return open_session(settings, **options)

    probe = Probe(session, probe_settings, settings.username, settings.domain)
    if not args.json:
        print(
            f"probing {settings.where} (run {probe.seen.run}; Ctrl-C stops it and cleans up) ...", flush=True
        )
    try:
        observations = probe.run()
    except ConnectError as error:  # the first logon: nothing was created
        return _error(str(error), error.exit_code, args.json)
    except ProbeAborted as error:
        return _error(str(error), EXIT_ABORTED, args.json)
    except KeyboardInterrupt:
        left = probe.seen.left_behind
        message = "interrupted; " + ("left behind: " + "; ".join(left) if left else "nothing was left behind")
        return _error(message, EXIT_INTERRUPTED, args.json)
    report = judge(observations, probe_settings, f"{settings.host}:{settings.api_port}")
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print("\n".join(report.lines()))
    return report.exit_code


def _error(message: str, code: int, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"verdict": "error", "message": message, "exit_code": code}, indent=2))
    else:
        print(f"error: {message}", file=sys.stderr)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``probe`` subcommand."""
    parser = subparsers.add_parser(
        "probe",
        help="check that a CloudShell server behaves as the lock assumes, and which settings fit it",
        description=(
            "In a sandbox of its own (or --reservation), on services of its own, check each fact the lock "
            "relies on (the model, the atomic add, fresh and cached reads, letter case, removes, aliases "
            "with ~, how long requests take, user roles), remove everything it added, and print what each "
            "fact means for the lock and the settings that fit. Run it before the first deployment and "
            "after a server upgrade (docs/deploy.md)."
        ),
        epilog=(
            "examples:\n"
            "  CLOUDSHELL_PASSWORD=... cloudshell-mutex probe --host cs.example.com\n"
            "  cloudshell-mutex probe --reservation 0b9c3d1e-... --json\n"
            "  cloudshell-mutex probe --request-lifetime 300 --lease 90   # the settings your locks use\n"
            + CONNECTION_HELP
            + _EXIT_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--reservation",
        metavar="ID",
        default=None,
        help="probe in this active sandbox, not one of its own (it adds only services mutex-probe-<run>-*)",
    )
    add_connection_options(parser)
    parser.add_argument(
        "--request-lifetime",
        type=float,
        default=DEFAULT_REQUEST_LIFETIME,
        metavar="SECONDS",
        help=f"the request_lifetime your locks use (default: {DEFAULT_REQUEST_LIFETIME:g}, the library's)",
    )
    parser.add_argument(
        "--lease", type=float, default=60.0, metavar="SECONDS", help="the lease your locks use (default: 60)"
    )
    parser.add_argument(
        "--racers", type=int, default=4, help="concurrent adds per round of the race (default: 4)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the race (default: 5)")
    parser.add_argument(
        "--max-wait",
        type=float,
        default=8.0,
        metavar="SECONDS",
        help="the longest a check waits for a change to show in a read (default: 8)",
    )
    parser.set_defaults(func=run_probe)
