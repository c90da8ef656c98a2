"""The demo's race: two driver processes rewire one sandbox, first without the lock, then with it.

The sandbox holds resources A and B joined by a connector A--B. Driver X (a command on A) replaces A with A2
and moves A's connectors to A2; driver Y (a command on B) does the same for B. Run one after the other they
always leave A2--B2. Run at once, each acts on a topology the other is changing: calls fail and the sandbox
ends up wired wrong. With the reservation lock they take turns.

Everything is real except the server: the package is built and imported through ``PackagingRestApiClient``,
the drivers are :class:`~cloudshell_mutex.demo.driver.RewireDriver` objects in two OS processes ("spawn"),
called with shell-core ``ResourceCommandContext`` objects, and every call goes over HTTP through
``CloudShellAPISession`` to the embedded emulator. :func:`run_demo` returns a :class:`DemoResult`; the
``make demo`` printout is :mod:`cloudshell_mutex.demo.__main__`.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: The resource each driver runs on, and the resource it puts in its place.
REPLACEMENTS = (("A", "A2"), ("B", "B2"))
DEMO_RESOURCES = ("A", "A2", "B", "B2")
RESOURCE_MODEL = "Demo Device"
RESOURCE_FAMILY = "Demo Family"
#: How long a process step may take before the demo gives up (a hung or dead process), in seconds.
STEP_TIMEOUT = 120.0

ProgressHook = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Topology:
    """The demo resources in the sandbox and the connectors between them (``"A--B"``, endpoints sorted)."""

    resources: Tuple[str, ...]
    connectors: Tuple[str, ...]

    def __str__(self) -> str:
        wired = " ".join(self.connectors) if self.connectors else "no connector"
        connected = {end for connector in self.connectors for end in connector.split("--")}
        loose = [name for name in self.resources if name not in connected]
        return f"{wired} (+{', '.join(loose)})" if loose else wired


START = Topology(("A", "B"), ("A--B",))
GOAL = Topology(("A2", "B2"), ("A2--B2",))


@dataclass(frozen=True)
class RoundResult:
    """One round: the API calls that failed (each aborts its driver's command) and the final topology."""

    index: int
    locked: bool
    failed_calls: int
    errors: Tuple[str, ...]
    topology: Topology

    @property
    def correct(self) -> bool:
        """Both commands succeeded and the sandbox is wired A2--B2."""
        return self.failed_calls == 0 and self.topology == GOAL


@dataclass
class ModeResult:
    """All rounds of one mode (without or with the lock)."""

    locked: bool
    rounds: List[RoundResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        """ "with the lock" or "without the lock"."""
        return "with the lock" if self.locked else "without the lock"

    @property
    def failed_calls(self) -> int:
        """API calls that failed, over all rounds."""
        return sum(r.failed_calls for r in self.rounds)

    @property
    def wrong_topologies(self) -> int:
        """Rounds that ended with a topology other than A2--B2."""
        return sum(r.topology != GOAL for r in self.rounds)

    @property
    def broken_rounds(self) -> int:
        """Rounds with a failed call or a wrong topology."""
        return sum(not r.correct for r in self.rounds)

    def topologies(self) -> List[Tuple[Topology, int]]:
        """The final topologies seen, most frequent first."""
        return Counter(r.topology for r in self.rounds).most_common()

    def errors(self) -> List[Tuple[str, int]]:
        """The error messages seen, most frequent first."""
        return Counter(e for r in self.rounds for e in r.errors).most_common()


@dataclass
class DemoResult:
    """What :func:`run_demo` saw."""

    without_lock: ModeResult
    with_lock: ModeResult
    window: float
    seconds: float
    api_url: str
    package: str
    services_left: Tuple[str, ...]

    @property
    def as_expected(self) -> bool:
        """Without the lock something broke; with it every round ended A2--B2 and no lock was left behind."""
        return (
            self.without_lock.broken_rounds > 0
            and bool(self.with_lock.rounds)
            and self.with_lock.broken_rounds == 0
            and not self.services_left
        )


def read_topology(api: Any, reservation_id: str) -> Topology:
    """The demo resources and their connectors, from one fresh (uncached) read."""
    details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
    resources = tuple(sorted(r.Name for r in details.Resources if r.Name in DEMO_RESOURCES))
    connectors = tuple(sorted("--".join(sorted((c.Source, c.Target))) for c in details.Connectors))
    return Topology(resources, connectors)


def reset_topology(api: Any, reservation_id: str) -> None:
    """Put the sandbox back to A--B (A2 and B2 out), and check that it is."""
    from cloudshell.api.cloudshell_api import SetConnectorRequest

    present = list(read_topology(api, reservation_id).resources)
    if present:
        api.RemoveResourcesFromReservation(reservation_id, present)  # their connectors go with them
    api.AddResourcesToReservation(reservation_id, ["A", "B"])
    api.SetConnectorsInReservation(reservation_id, [SetConnectorRequest("A", "B", "bi", "")])
    found = read_topology(api, reservation_id)
    if found != START:
        raise RuntimeError(f"could not reset the sandbox to {START}: it is {found}")


def _driver_process(
    host: str,
    port: int,
    token: str,
    reservation_id: str,
    resource: str,
    new_resource: str,
    plan: Sequence[bool],
    window: float,
    barrier: Any,
    mine: Any,
    other: Any,
    results: Any,
    log_path: str,
) -> None:
    """One driver process: for each round, wait for the start, run the command, report, wait for the end."""
    os.environ["LOG_PATH"] = log_path  # cloudshell-logging writes under $LOG_PATH/<reservation>/
    from cloudshell.api.cloudshell_api import CloudShellAPIError

    from cloudshell_mutex.demo.contexts import resource_command_context
    from cloudshell_mutex.demo.driver import RewireDriver

    def after_read() -> None:
        # The deliberate race window: tell the other driver this one has read, then wait (at most
        # ``window`` seconds) until it has read too. With the lock the other cannot read meanwhile, so
        # the first holder waits the whole window and the second none; the pause is the same code.
        mine.set()
        other.wait(window)

    driver = RewireDriver(after_read=after_read)
    try:
        for index, locked in enumerate(plan):
            barrier.wait(STEP_TIMEOUT)
            context = resource_command_context(host, port, token, reservation_id, resource)
            command = driver.replace_resource_locked if locked else driver.replace_resource
            errors: List[str] = []
            try:
                command(context, new_resource)
            except CloudShellAPIError as error:  # a driver stops at its first failed call
                # The sandbox's id only lengthens the report: every round runs in the same sandbox.
                errors.append(f"{error.code}: {error.message}".replace(f" '{reservation_id}'", " <sandbox>"))
            except Exception as error:  # reported as a failure of the round, never hidden
                errors.append(f"{type(error).__name__}: {error}")
            results.put((index, resource, errors))
            barrier.wait(STEP_TIMEOUT)
    finally:
        driver.cleanup()


def _prepare(emulator: Any, root: Path, workdir: Path) -> Tuple[str, str]:
    """Build and import the package, create the resources and the sandbox; return (package, reservation)."""
    from cloudshell_mutex.packaging.build import PackageSources, build_package
    from cloudshell_mutex.packaging.install import InstallSettings, install_package

    built = build_package(PackageSources.in_tree(root), workdir / "Mutex_Package.zip")
    install_package(
        InstallSettings(
            host=emulator.host,
            port=emulator.quali_port,
            username=emulator.admin_user,
            password=emulator.admin_password,
            domain=emulator.admin_domain,
            package=built.path,
        )
    )
    # The emulator has no API call that defines a resource model (a real server gets one from a package
    # or the Resource Manager); it is registered directly, everything else goes through the API.
    emulator.add_resource_model(RESOURCE_MODEL, RESOURCE_FAMILY)
    api = emulator.session()
    for name in DEMO_RESOURCES:
        api.CreateResource(RESOURCE_FAMILY, RESOURCE_MODEL, name, f"10.0.0.{DEMO_RESOURCES.index(name) + 1}")
    reservation_id = api.CreateImmediateReservation(
        "cloudshell-mutex demo", emulator.admin_user, 60
    ).Reservation.Id
    reset_topology(api, reservation_id)
    return built.path.name, reservation_id


def run_demo(
    rounds: int = 10,
    window: float = 0.5,
    root: Optional[Path] = None,
    progress: Optional[ProgressHook] = None,
    latency: Optional[Dict[str, Any]] = None,
) -> DemoResult:
    """Run ``rounds`` rounds without the lock, then ``rounds`` with it, and return what happened.

    ``root`` is the source tree the package is built from (default: the current directory). ``window``
    is the longest pause (seconds) a driver makes after reading the topology, waiting for the other to
    have read it too. ``progress(label, round, rounds)`` is called before each round. ``latency`` is the
    emulator's latency model (default: 2-10 ms per call).
    """
    from cloudshell_mutex.emulator import Emulator

    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if window < 0:
        raise ValueError("window must be >= 0 seconds")
    root = Path.cwd() if root is None else Path(root)
    latency = latency if latency is not None else {"distribution": "uniform", "low": 0.002, "high": 0.01}
    started = time.monotonic()
    plan = [False] * rounds + [True] * rounds
    modes = {False: ModeResult(locked=False), True: ModeResult(locked=True)}
    with (
        tempfile.TemporaryDirectory(prefix="cloudshell-mutex-demo-") as work,
        Emulator(port=0, quali_port=0, latency=latency) as emulator,
    ):
        package, reservation_id = _prepare(emulator, root, Path(work))
        api = emulator.session()
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(len(REPLACEMENTS) + 1)
        read_flags = [spawn.Event() for _ in REPLACEMENTS]
        results = spawn.Queue()
        token = emulator.issue_token()
        workers = [
            spawn.Process(
                target=_driver_process,
                args=(
                    emulator.host,
                    emulator.port,
                    token,
                    reservation_id,
                    resource,
                    new_resource,
                    plan,
                    window,
                    barrier,
                    read_flags[i],
                    read_flags[1 - i],
                    results,
                    str(Path(work) / "logs"),
                ),
                name=f"driver on {resource}",
                daemon=True,
            )
            for i, (resource, new_resource) in enumerate(REPLACEMENTS)
        ]
        for worker in workers:
            worker.start()
        try:
            for index, locked in enumerate(plan):
                mode = modes[locked]
                if progress is not None:
                    progress(mode.label, len(mode.rounds) + 1, rounds)
                if index:
                    reset_topology(api, reservation_id)
                for flag in read_flags:
                    flag.clear()
                barrier.wait(STEP_TIMEOUT)  # start the round
                barrier.wait(STEP_TIMEOUT)  # both commands are done
                errors: List[str] = []
                for _ in workers:
                    _, _, worker_errors = results.get(timeout=STEP_TIMEOUT)
                    errors.extend(worker_errors)
                topology = read_topology(api, reservation_id)
                mode.rounds.append(
                    RoundResult(len(mode.rounds) + 1, locked, len(errors), tuple(errors), topology)
                )
        except Exception:
            barrier.abort()  # a failed step must not leave the driver processes waiting
            raise
        finally:
            for worker in workers:
                worker.join(timeout=STEP_TIMEOUT)
                if worker.is_alive():
                    worker.terminate()
        details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
        services_left = tuple(s.Alias for s in details.Services)
        api_url = emulator.api_url
    return DemoResult(
        without_lock=modes[False],
        with_lock=modes[True],
        window=window,
        seconds=time.monotonic() - started,
        api_url=api_url,
        package=package,
        services_left=services_left,
    )
