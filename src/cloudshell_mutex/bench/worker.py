"""One benchmark client: a separate OS process with its own ``CloudShellAPISession``.

The parent (:mod:`.runner`) starts it with the "spawn" context and sends it one :class:`RunSpec` per
run. The client waits for the window to open, then takes and releases the lock as its role in the
workload says (:func:`.plans.role`: the run's contender or a reader, and its pauses) until the window
closes, and reports when each acquisition *started waiting* (only the client knows that; when it was
granted comes from the server's log).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from ..lock.errors import MutexTimeout
from .contenders import Contender, Seat, WindowClosed, reader_lock
from .plans import role

#: Credentials and address of the emulated server: (host, port, user, password, domain).
Address = Tuple[str, int, str, str, str]


@dataclass(frozen=True)
class RunSpec:
    """One run for one client: the reservation, the contender, the workload, the window and how many
    clients the run has (a client's role in the workload depends on it)."""

    reservation_id: str
    contender: Contender
    workload: str
    hold: float
    start: float  # time.monotonic() at which the window opens
    end: float  # ... and closes
    seed: int
    clients: int = 1


@dataclass
class ClientReport:
    """What one client saw in one run."""

    client: int
    starts: List[float] = field(default_factory=list)  # when each acquisition started waiting
    acquired: int = 0  # acquisitions the client believed it got
    # Each hold as the client saw it: (held from, work done at, passed within a cohort, calls to acquire).
    holds: List[Tuple[float, float, bool, int]] = field(default_factory=list)
    ran_without_lock: int = 0  # the original's "continuing without it" after 100 failed tries
    error: Optional[str] = None


def _window_closed(spec: RunSpec) -> bool:
    return time.monotonic() >= spec.end


def run_client(api: Any, client: int, spec: RunSpec) -> ClientReport:
    """Take and release the lock as the workload says, from the window's start to its end."""
    report = ClientReport(client)
    rng = random.Random(f"{spec.seed}:{client}")  # a str seed is hashed deterministically
    seat = Seat(api, spec.reservation_id, client, spec.end)
    mine = role(spec.workload, client, spec.clients, spec.hold)
    make = reader_lock if mine.reader else spec.contender.make
    time.sleep(max(0.0, spec.start - time.monotonic()))
    try:
        seat.sleep(mine.offset)
        first = True
        while not _window_closed(spec):
            seat.sleep(mine.pause_seconds(rng, spec.hold, first))
            first = False
            report.starts.append(time.monotonic())
            lock = make(seat)
            try:
                with lock:
                    held_from = time.monotonic()
                    report.acquired += 1
                    report.ran_without_lock += bool(getattr(lock, "gave_up", False))
                    calls = int(getattr(lock, "calls", 0))
                    # The window's end cuts the hold short; the release still runs.
                    with contextlib.suppress(WindowClosed):
                        seat.sleep(spec.hold)
                    done = time.monotonic()  # the work under the lock ends here; the release follows
                passed = bool(getattr(lock, "passed", False))
                report.holds.append((held_from, done, passed, calls))
            except MutexTimeout:
                if not _window_closed(spec):  # a timeout before the window's end is a real failure
                    raise
                break
    except WindowClosed:
        pass
    except Exception:
        report.error = traceback.format_exc(limit=5)
    return report


def serve(client: int, address: Address, commands: Any, results: Any) -> None:
    """The worker process: log on as this client's user, then run each :class:`RunSpec` it is sent.

    ``None`` ends it; ``("warmup", reservation_id)`` takes and releases a lock of its own once, so the
    once-per-process catalog read does not fall into a measured run.
    """
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    from ..lock.mutex.mutex import ReservationMutex
    from ..lock.options import LOGGER_NAME

    # A timeout at the window's end is how a run ends, not news: keep the lock's log out of the output.
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    logging.getLogger(LOGGER_NAME).propagate = False

    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        results.put(("ready", client, None))
    except BaseException:
        results.put(("failed", client, traceback.format_exc(limit=5)))
        return
    while True:
        command = commands.get()
        if command is None:
            return
        try:
            if isinstance(command, RunSpec):
                results.put(("report", client, run_client(api, client, command)))
            else:
                _, reservation_id = command
                with ReservationMutex(api, reservation_id, owner="bench warm-up", name=f"WARMUP{client}"):
                    pass
                results.put(("warm", client, None))
        except BaseException:
            results.put(("failed", client, traceback.format_exc(limit=5)))
