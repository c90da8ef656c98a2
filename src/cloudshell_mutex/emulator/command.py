"""``cloudshell-mutex emulator``: run the CloudShell API emulator in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Tuple

from .faults import FAULT_KINDS, RandomFaults, fault_kind
from .runtime import DEFAULT_HEADER_TIMEOUT
from .state import (
    ADD_ATOMICITY_MODES,
    ALIAS_CASE_MODES,
    CATALOG_MODES,
    DISABLE_CACHE_MODES,
    ENDED_RESERVATION_MODES,
    REMOVE_MISSING_MODES,
    TILDE_ALIAS_MODES,
    USER_GROUPS_MODES,
)

#: The real-server modes that are a choice of words, with their help (the first value is the default).
_MODE_OPTIONS = (
    ("alias_case", ALIAS_CASE_MODES, "exact: MUTEX and mutex are two aliases; insensitive: one"),
    (
        "add_atomicity",
        ADD_ATOMICITY_MODES,
        "atomic: an add checks the alias and inserts in one step; racy: in two, so overlapping adds of one "
        "alias all succeed",
    ),
    (
        "remove_missing",
        REMOVE_MISSING_MODES,
        "what a remove that names a missing alias does: refuse_all (fails, removes nothing), remove_found "
        "(removes the others, then fails), ignore (removes the others, succeeds)",
    ),
    (
        "disable_cache",
        DISABLE_CACHE_MODES,
        "honored: disableCache reads are fresh; ignored: they come from the details cache too",
    ),
    ("tilde_aliases", TILDE_ALIAS_MODES, "whether aliases with a ~ (MUTEX~r1) are accepted"),
    (
        "user_groups",
        USER_GROUPS_MODES,
        "listed: GetUserDetails shows the user's groups with roles and domains; omitted: no groups",
    ),
)

#: Where the CLI takes the admin password from when ``--admin-password`` is not given.
PASSWORD_ENV = "CLOUDSHELL_EMULATOR_ADMIN_PASSWORD"


def admin_password(option: Optional[str], environ: Mapping[str, str]) -> str:
    """The admin password: the option, else the environment variable, else ``admin``."""
    if option is not None:
        return option
    return environ.get(PASSWORD_ENV) or "admin"


def _latency(text: str) -> Optional[Dict[str, Any]]:
    """``LOW_MS[:HIGH_MS]``: a fixed or uniform per-call latency in milliseconds."""
    try:
        parts = [float(p) / 1000.0 for p in text.split(":")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"latency must be LOW_MS or LOW_MS:HIGH_MS, got {text!r}") from None
    if len(parts) == 1:
        return {"distribution": "fixed", "seconds": parts[0]}
    if len(parts) == 2:
        return {"distribution": "uniform", "low": parts[0], "high": parts[1]}
    raise argparse.ArgumentTypeError(f"latency must be LOW_MS or LOW_MS:HIGH_MS, got {text!r}")


_FAULT_FORM = "METHOD:KIND[:COUNT[:NAME=VALUE,...]]"


def _fault_value(text: str) -> Any:
    """A fault parameter value from the command line: JSON when it parses (numbers, true, null), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _fault(text: str) -> Tuple[str, str, int, Dict[str, Any]]:
    """``METHOD:KIND[:COUNT[:NAME=VALUE,...]]``, e.g. ``AddServiceToReservation:apply_late:1:delay=3``."""
    parts = text.split(":", 3)
    if len(parts) < 2 or not all(parts[:3]):
        raise argparse.ArgumentTypeError(f"fault must be {_FAULT_FORM}, got {text!r}")
    try:
        count = int(parts[2]) if len(parts) > 2 else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"fault count must be a number, got {parts[2]!r}") from None
    params: Dict[str, Any] = {}
    for item in parts[3].split(",") if len(parts) > 3 and parts[3] else ():
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise argparse.ArgumentTypeError(f"fault parameter must be NAME=VALUE, got {item!r} in {text!r}")
        params[name] = _fault_value(value)
    try:
        fault_kind(parts[1]).check(params)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return parts[0], parts[1], count, params


def _random_faults(text: str) -> Dict[str, Any]:
    """A JSON object of random fault settings, checked now so that a typo stops the start."""
    try:
        settings = json.loads(text)
        RandomFaults(settings)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"random faults: {error}") from None
    return settings


def register(subparsers: Any) -> None:
    """Add the ``emulator`` subcommand."""
    parser = subparsers.add_parser(
        "emulator",
        help="run the CloudShell API emulator (Automation API and Quali API package import)",
        description="Run the CloudShell API emulator in the foreground until Ctrl-C. It binds loopback by "
        "default; the control endpoint /_emulator/ answers loopback clients only.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8029, help="Automation API port (default: 8029; 0: free)")
    parser.add_argument(
        "--quali-port", type=int, default=9000, help="Quali API port (default: 9000; 0: free)"
    )
    parser.add_argument("--admin-user", default="admin", help="admin user name (default: admin)")
    parser.add_argument(
        "--admin-password",
        default=None,
        help=f"admin password (default: the environment variable {PASSWORD_ENV}, else 'admin'); prefer the "
        "environment variable, which other users cannot see in the process list",
    )
    parser.add_argument("--admin-domain", default="Global", help="admin domain (default: Global)")
    parser.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="ZIP",
        help="import this package at start (repeatable)",
    )
    parser.add_argument(
        "--latency-ms",
        type=_latency,
        default=None,
        metavar="LOW[:HIGH]",
        help="per-call latency in milliseconds",
    )
    parser.add_argument(
        "--commit-fraction",
        type=float,
        default=0.5,
        help="where inside the latency a call takes effect, 0..1 (default: 0.5)",
    )
    parser.add_argument(
        "--details-cache-seconds",
        type=float,
        default=5.0,
        help="how long GetReservationDetails answers from its snapshot (default: 5, as the real server)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        type=_fault,
        metavar=_FAULT_FORM,
        help="queue a fault at start (repeatable); METHOD may be *; KIND is one of "
        f"{', '.join(FAULT_KINDS)}; e.g. RemoveServicesFromReservation:apply_late:1:delay=3,reply=hang "
        "(docs/emulator.md)",
    )
    parser.add_argument(
        "--random-faults",
        type=_random_faults,
        default=None,
        metavar="JSON",
        help='seeded random faults, e.g. \'{"seed": 7, "rates": {"apply_late": 0.02, "spike": 0.05}}\'',
    )
    parser.add_argument(
        "--catalog",
        choices=CATALOG_MODES,
        default="strict",
        help="strict (default): GetServices lists only families linked to a category, admin-only families "
        "to admins only (as the real server most likely does); permissive: every service model",
    )
    parser.add_argument(
        "--ended-reservations",
        choices=ENDED_RESERVATION_MODES,
        default="readable",
        help="readable (default): reads of an ended reservation answer (status Completed), changes fail; "
        "closed: every call on it fails",
    )
    for name, choices, text in _MODE_OPTIONS:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            choices=choices,
            default=choices[0],
            help=f"{text} (default: {choices[0]})",
        )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="SECONDS",
        help="close connections that do not finish their request headers, or sit idle, this long "
        f"(default: {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--reword-errors",
        action="store_true",
        help="send every error text except the documented 'Service with given alias already exists' in "
        "other words (same codes), to show a client does not depend on guessed wording",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the emulator and block until interrupted."""
    from cloudshell_mutex.emulator import Emulator

    latency = args.latency_ms
    if latency is not None:
        latency = dict(latency, commit_fraction=args.commit_fraction)
    try:
        emulator = Emulator(
            host=args.host,
            port=args.port,
            quali_port=args.quali_port,
            admin_user=args.admin_user,
            admin_password=admin_password(args.admin_password, os.environ),
            admin_domain=args.admin_domain,
            packages=args.package,
            latency=latency,
            details_cache_seconds=args.details_cache_seconds,
            faults=args.fault,
            random_faults=args.random_faults,
            reword_errors=args.reword_errors,
            catalog=args.catalog,
            ended_reservations=args.ended_reservations,
            header_timeout=args.header_timeout,
            **{name: getattr(args, name) for name, _, _ in _MODE_OPTIONS},
        )
        emulator.start()
    except (OSError, ValueError) as error:
        print(f"cloudshell-mutex emulator: cannot start: {error}", file=sys.stderr)
        return 1
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"CloudShell Automation API: {emulator.api_url}/ResourceManagerApiService/", flush=True)
        print(f"Quali API:                 {emulator.quali_url}/API/", flush=True)
        print(f"Control endpoint:          {emulator.api_url}/_emulator/ (loopback only)", flush=True)
        print(
            f"Admin user: {emulator.admin_user} (domain {emulator.admin_domain}); press Ctrl-C to stop",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        emulator.stop()
        print("emulator stopped", flush=True)
    return 0
