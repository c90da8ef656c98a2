"""One benchmark client: a separate OS process with its own ``CloudShellAPISession``.

The parent (:mod:`.runner`) starts it with the "spawn" context and sends it one :class:`RunSpec` per
run. The client waits for the window to open, then takes and releases the lock as its role in the
workload says (:func:`.plans.role`: the run's contender or a reader, and its pauses) until the window
closes, or, in a finite cell, as its schedule says (:func:`.plans.schedule`) until that is done. It
reports when each acquisition *started waiting* (only the client knows that; when it was granted comes
from the server's log) and when its session sent each API call (the server counts calls per method, not
per client: the long hold needs the waiters' calls apart from the job's).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Tuple

from ..lock.errors import MutexTimeout
from .contenders import Contender, Seat, WindowClosed, contender, reader_lock
from .plans import FINITE, JOB_CONTENDER, role, schedule

#: Credentials and address of the emulated server: (host, port, user, password, domain).
Address = Tuple[str, int, str, str, str]


def admin_address(emulator: Any) -> Address:
    """The emulated server's address with its admin's credentials, for a client process to log on with."""
    return (emulator.host, emulator.port, emulator.admin_user, emulator.admin_password, emulator.admin_domain)


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
    first: int = 0  # the process number of the run's client 0 (runs together each have clients of their own)


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
    # When the client's session sent each API call, and the call's method.
    calls: List[Tuple[float, str]] = field(default_factory=list)


def _window_closed(spec: RunSpec) -> bool:
    return time.monotonic() >= spec.end


def record_calls(api: Any) -> List[Tuple[float, str]]:
    """Note the time and the method of every API call ``api`` sends from now on, in the list returned (the
    caller empties it between runs). A session without the client's one request method (``_sendRequest``,
    through which every API method goes, the method's name first) is left alone: its list stays empty and
    its figures say "not measured"."""
    times: List[Tuple[float, str]] = []
    send = getattr(api, "_sendRequest", None)
    if callable(send):

        def counted(*args: Any, **kwargs: Any) -> Any:
            times.append((time.monotonic(), str(args[0] if args else kwargs.get("operation", "?"))))
            return send(*args, **kwargs)

        # On the instance, so this session alone is counted; the lock's own hooks sit on api._http, below.
        api._sendRequest = counted
    return times


def _plan(
    client: int, spec: RunSpec
) -> Tuple[float, Iterator[Tuple[float, float]], Callable[[Seat], ContextManager[Any]]]:
    """The client's offset, its (pause, hold) sections and the lock it takes, as its workload says."""
    if spec.workload in FINITE:
        mine = schedule(spec.workload, spec.hold, spec.clients, client, spec.seed)
        make = contender(JOB_CONTENDER).make if mine.job else spec.contender.make
        return mine.offset, mine.sections(), make
    rng = random.Random(f"{spec.seed}:{client}")  # a str seed is hashed deterministically
    role_ = role(spec.workload, client, spec.clients, spec.hold)
    return role_.offset, role_.sections(rng, spec.hold), reader_lock if role_.reader else spec.contender.make


def run_client(
    api: Any, client: int, spec: RunSpec, calls: Optional[List[Tuple[float, str]]] = None
) -> ClientReport:
    """Take and release the lock as the workload says, from the window's start to its end (or, in a finite
    cell, until the schedule is done). ``client``: the process's number (the run's client ``client -
    spec.first``); ``calls``: the list :func:`record_calls` fills for ``api``."""
    client -= spec.first
    report = ClientReport(client)
    seat = Seat(api, spec.reservation_id, client, spec.end)
    offset, sections, make = _plan(client, spec)
    time.sleep(max(0.0, spec.start - time.monotonic()))
    if calls is not None:
        del calls[:]  # the calls of this run only
    try:
        seat.sleep(offset)
        for pause, hold in sections:
            if _window_closed(spec):
                break
            seat.sleep(pause)
            report.starts.append(time.monotonic())
            lock = make(seat)
            try:
                with lock:
                    held_from = time.monotonic()
                    report.acquired += 1
                    report.ran_without_lock += bool(getattr(lock, "gave_up", False))
                    calls_to_acquire = int(getattr(lock, "calls", 0))
                    # The window's end cuts the hold short; the release still runs.
                    with contextlib.suppress(WindowClosed):
                        seat.sleep(hold)
                    done = time.monotonic()  # the work under the lock ends here; the release follows
                passed = bool(getattr(lock, "passed", False))
                report.holds.append((held_from, done, passed, calls_to_acquire))
            except MutexTimeout:
                if not _window_closed(spec):  # a timeout before the window's end is a real failure
                    raise
                break
    except WindowClosed:
        pass
    except Exception:
        report.error = traceback.format_exc(limit=5)
    if calls is not None:
        report.calls = list(calls)
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
        calls = record_calls(api)
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
                results.put(("report", client, run_client(api, client, command, calls)))
            else:
                _, reservation_id = command
                with ReservationMutex(api, reservation_id, owner="bench warm-up", name=f"WARMUP{client}"):
                    pass
                results.put(("warm", client, None))
        except BaseException:
            results.put(("failed", client, traceback.format_exc(limit=5)))
