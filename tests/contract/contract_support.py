"""The contract suite's target: which CloudShell server it talks to, and how.

Without ``CLOUDSHELL_TEST_HOST`` the target is a fresh emulator (see ``conftest.py``); with it, the real
server the ``CLOUDSHELL_TEST_*`` variables describe. Everything here uses only the PyPI clients, so the
same code runs against both. Worker functions for spawned processes live here too: a spawned child
imports this small module, not a test module.

Must import on Python 3.9 (the unit run collects every test module).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import urllib3
from cloudshell.api.cloudshell_api import CloudShellAPISession

from client_features import CLIENT_RESENDS, CLIENT_TAKES_TIMEOUT
from cloudshell_mutex import ReservationMutex, protocol
from cloudshell_mutex.probe import checks

ROOT = Path(__file__).resolve().parents[2]

#: The variables that point the suite at a real server, with what each means (shown when one is wrong).
ENV_HELP: Tuple[Tuple[str, str], ...] = (
    ("CLOUDSHELL_TEST_HOST", "the CloudShell server's host name or address (required; unset = emulator)"),
    ("CLOUDSHELL_TEST_USER", "a CloudShell user allowed to create sandboxes (default: admin)"),
    ("CLOUDSHELL_TEST_PASSWORD", "that user's password (required)"),
    ("CLOUDSHELL_TEST_DOMAIN", "the user's CloudShell domain (default: Global)"),
    ("CLOUDSHELL_TEST_API_PORT", "the Automation API port (default: 8029)"),
    ("CLOUDSHELL_TEST_QUALI_PORT", "the Quali API port, used for the package import (default: 9000)"),
    (
        "CLOUDSHELL_TEST_IMPORT_PACKAGE",
        "1 = import the Mutex_Package.zip built from this tree (needs an admin)",
    ),
    (
        "CLOUDSHELL_TEST_OTHER_DOMAIN",
        "a domain other than Global the user may log on to: the lock in a sandbox there (unset: skipped)",
    ),
    ("CLOUDSHELL_TEST_TIMEOUT", "seconds before a connect or an API call is given up (default: 60)"),
    ("CLOUDSHELL_TEST_RACE_PROCESSES", "processes in the add race (default: 6)"),
    ("CLOUDSHELL_TEST_RACE_ROUNDS", "rounds of the add race (default: 15)"),
    ("CLOUDSHELL_TEST_END_SECONDS", "how long an ended sandbox may take to report Completed (default: 120)"),
)

#: Prefix of every alias the suite adds besides the lock's own, so a person can tell them apart.
ALIAS_PREFIX = "contract-"


class TargetError(Exception):
    """The target is misconfigured or unreachable; the message says what to check."""


def env_help() -> str:
    """One line per variable: its name and what it means."""
    return "\n".join(f"  {name:32} {meaning}" for name, meaning in ENV_HELP)


@dataclass(frozen=True)
class Target:
    """Where the suite's CloudShell server is, and how to log on. Picklable, for spawned workers.

    The password is left out of ``repr`` so that a failing assertion never prints it.
    """

    host: str
    api_port: int
    quali_port: int
    user: str
    password: str = field(repr=False)
    domain: str
    live: bool
    timeout: float = 60.0
    #: A domain other than Global for the other-domain tests ("" on a live server without one: skipped).
    other_domain: str = ""

    def where(self) -> str:
        """``host:port as user@domain``, for messages (never the password)."""
        return f"{self.host}:{self.api_port} as {self.user}@{self.domain}"

    def session(self, **kwargs: Any) -> CloudShellAPISession:
        """A new, logged-on ``CloudShellAPISession`` with socket timeouts.

        The client sets no timeout by itself, so a silent server would hang a test forever. The
        timeout goes to the client's urllib3 pool.
        """
        if CLIENT_TAKES_TIMEOUT:  # clients before 2024.1 take none (and wait as long as the server does)
            kwargs.setdefault("timeout", urllib3.Timeout(connect=min(self.timeout, 10.0), read=self.timeout))
        return CloudShellAPISession(
            self.host, self.user, self.password, self.domain, port=self.api_port, **kwargs
        )


def _int(environ: Mapping[str, str], name: str, default: int, low: int = 1, high: int = 65535) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise TargetError(f"{name}={raw!r} must be a whole number from {low} to {high}")
    return value


def race_size(environ: Mapping[str, str] = os.environ) -> Tuple[int, int]:
    """(processes, rounds) of the add race; small against the emulator, overridable for a live run."""
    return (
        _int(environ, "CLOUDSHELL_TEST_RACE_PROCESSES", 6, 2, 256),
        _int(environ, "CLOUDSHELL_TEST_RACE_ROUNDS", 15, 1, 100_000),
    )


def end_seconds(environ: Mapping[str, str] = os.environ) -> int:
    """How long an ended sandbox may take (teardown) until its status says Completed."""
    return _int(environ, "CLOUDSHELL_TEST_END_SECONDS", 120, 1, 3600)


def live_target(environ: Mapping[str, str] = os.environ) -> Optional[Target]:
    """The real server the variables describe, or None when ``CLOUDSHELL_TEST_HOST`` is unset."""
    host = environ.get("CLOUDSHELL_TEST_HOST", "").strip()
    if not host:
        return None
    password = environ.get("CLOUDSHELL_TEST_PASSWORD", "")
    if not password:
        raise TargetError(
            f"CLOUDSHELL_TEST_HOST={host} is set but CLOUDSHELL_TEST_PASSWORD is not. Set:\n{env_help()}"
        )
    return Target(
        host=host,
        api_port=_int(environ, "CLOUDSHELL_TEST_API_PORT", 8029),
        quali_port=_int(environ, "CLOUDSHELL_TEST_QUALI_PORT", 9000),
        user=environ.get("CLOUDSHELL_TEST_USER", "").strip() or "admin",
        password=password,
        domain=environ.get("CLOUDSHELL_TEST_DOMAIN", "").strip() or "Global",
        live=True,
        timeout=float(_int(environ, "CLOUDSHELL_TEST_TIMEOUT", 60, 1, 3600)),
        other_domain=environ.get("CLOUDSHELL_TEST_OTHER_DOMAIN", "").strip(),
    )


def check_reachable(host: str, port: int, what: str, variables: str, timeout: float = 5.0) -> None:
    """Fail at once, with what was tried, when nothing accepts TCP connections at ``host:port``.

    Without this, the client's first call would wait for the OS's connect timeout (minutes) or be
    retried by it; a bounded connect says "unreachable" in seconds.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise TargetError(
            f"cannot reach the {what} at {host}:{port} ({reason}). Check {variables}, that the server is "
            f"up and that no firewall blocks the port. The variables:\n{env_help()}"
        ) from None


def build_package(output_dir: Path) -> Path:
    """Build Mutex_Package.zip from this tree with the project's own packaging command (as ``make package``).

    Run as a subprocess of the CLI, so the suite depends on the command, not on module layout.
    """
    output = output_dir / "Mutex_Package.zip"
    command = [sys.executable, "-m", "cloudshell_mutex.cli", "package", "--root", str(ROOT)]
    done = subprocess.run(
        [*command, "--output", str(output)], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0 or not output.is_file():
        raise TargetError(
            f"building Mutex_Package.zip failed ({done.returncode}): {done.stderr or done.stdout}"
        )
    return output


def new_reservation(api: Any, target: Target, name: str, minutes: int = 30) -> str:
    """Create an empty sandbox that starts now, through ``CreateImmediateReservation``."""
    return api.CreateImmediateReservation(name, target.user, minutes).Reservation.Id


def owner_of(api: Any, reservation_id: str, alias: str) -> Optional[str]:
    """The ``Mutex Owner`` of ``alias`` (fresh read), "" when it has none, None when the alias is absent."""
    return checks.owner_in(checks.services(api, reservation_id), alias)


def add_mutex(api: Any, reservation_id: str, alias: str, owner: Optional[str]) -> None:
    """The protocol's acquire: add the Mutex Service under ``alias`` (with ``Mutex Owner`` unless None);
    raises what the server answered when it refuses."""
    api.AddServiceToReservation(reservation_id, protocol.SERVICE_MODEL, alias, checks.owner_values(owner))


def run_processes(
    worker: Callable[..., None], arguments: Sequence[Tuple[Any, ...]], timeout: float = 600
) -> List[Dict[str, Any]]:
    """Run ``worker(*args, barrier, results)`` in one "spawn" process per ``args``; return their reports.

    The workers share one barrier (so they start together) and put one report each (a dict with
    ``index`` and ``error``) on ``results``. Reports come back sorted by index; any worker error fails.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(arguments))
    results = ctx.Queue()
    processes = [ctx.Process(target=worker, args=(*args, barrier, results)) for args in arguments]
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=timeout) for _ in processes]
    except queue.Empty:
        raise AssertionError(f"a worker process sent no report within {timeout} s") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    errors = [f"process {report['index']}: {report['error']}" for report in reports if report["error"]]
    assert not errors, errors
    return sorted(reports, key=lambda report: report["index"])


# ---------------------------------------------------------------- workers (run in spawned processes)


def race_worker(
    target: Target, reservation_id: str, aliases: List[str], index: int, barrier, results
) -> None:
    """The probe's racer (``checks.race_adds``) in a process of its own: add each round's alias once, right
    after the round's barrier; report what each add answered."""
    report: Dict[str, Any] = {"index": index, "owner": f"racer {index}", "outcomes": [], "error": None}
    try:
        # No re-send by the client: a re-sent add would collide with its own first copy.
        api = target.session(**({"max_attempts": 1} if CLIENT_RESENDS else {}))
        wait = functools.partial(barrier.wait, timeout=120)
        report["outcomes"] = checks.race_adds(api, reservation_id, aliases, report["owner"], wait)
    except BaseException as error:  # report, never leave the parent waiting
        report["error"] = f"{type(error).__name__}: {error}"
        barrier.abort()
    results.put(report)


def _critical_section(
    api: Any, reservation_id: str, counter_alias: str, writer: str
) -> Tuple[float, float, int]:
    """Read the counter fresh, pause, write it + 1: two holders at once would lose an update."""
    start = time.monotonic()
    seen = int(owner_of(api, reservation_id, counter_alias) or "0")
    time.sleep(0.01)  # widen the window an overlap would need
    api.SetServiceAttributesValues(reservation_id, counter_alias, checks.owner_values(str(seen + 1)))
    return start, time.monotonic(), seen


def lock_worker(
    target: Target,
    reservation_id: str,
    counter_alias: str,
    kind: str,
    index: int,
    rounds: int,
    barrier,
    results,
) -> None:
    """``rounds`` counter increments under ReservationMutex ("lock") or the original snippet ("v1"/"v2")."""
    from original_protocol import OriginalMutex  # tests/ is on the spawned child's sys.path too

    report: Dict[str, Any] = {"kind": kind, "index": index, "holds": [], "gave_up": 0, "error": None}
    try:
        api = target.session()
        barrier.wait(timeout=120)
        for round_ in range(rounds):
            if kind == "lock":
                lock = ReservationMutex(
                    api,
                    reservation_id,
                    owner=f"contract worker {index}",
                    timeout=max(60.0, target.timeout),
                )
                with lock:
                    report["holds"].append(_critical_section(api, reservation_id, counter_alias, lock.token))
            else:
                original = OriginalMutex(
                    api,
                    reservation_id,
                    variant=kind,
                    my_unique_name=f"{kind}:{index}:{round_}",
                    attempts=100_000,
                    sleep_range=(0.01, 0.05),
                )
                with original:
                    report["holds"].append(_critical_section(api, reservation_id, counter_alias, kind))
                report["gave_up"] += original.gave_up
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
        barrier.abort()
    results.put(report)
