"""The emulator's own per-call overhead, from one client and from many processes.

Run with ``-s`` to see the figures quoted in docs/emulator.md (printed, not asserted: the tests check that
every call is counted)::

    .venv/bin/python -m pytest tests/emulator/test_overhead.py -s -q
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from cloudshell_mutex.emulator import Emulator

pytestmark = pytest.mark.integration

CALLS = 400


def served(counted: int, made: int) -> bool:
    """The overhead report counts every call made, and a copy the client re-sent by itself when a kept-alive
    connection closed under it (rare: at most 1 %). The figures are printed, not judged: tests do not time."""
    return made <= counted <= made + made // 100


def overhead_worker(port: int, calls: int, barrier: Any, results: Any) -> None:
    """Log on, wait for all, then make ``calls`` GetServerDateAndTime calls back to back."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    api = CloudShellAPISession("127.0.0.1", "admin", "admin", "Global", port=port)
    api.GetServerDateAndTime()  # connection open
    barrier.wait(timeout=60)
    started = time.perf_counter()
    for _ in range(calls):
        api.GetServerDateAndTime()
    results.put(time.perf_counter() - started)


def test_overhead_from_one_client(cloudshell_emulator: Emulator):
    emu = cloudshell_emulator
    api = emu.session()
    api.GetServerDateAndTime()
    emu.control.reset_counts()
    started = time.perf_counter()
    for _ in range(CALLS):
        api.GetServerDateAndTime()
    round_trip_ms = 1000 * (time.perf_counter() - started) / CALLS
    server = emu.control.overhead()
    print(
        f"\none client, {CALLS} calls: client round trip {round_trip_ms:.2f} ms/call; "
        f"emulator's own time mean {server['mean_ms']:.3f} ms, p50 {server['p50_ms']:.3f} ms, "
        f"p99 {server['p99_ms']:.3f} ms"
    )
    assert served(server["calls"], CALLS)


def test_overhead_of_the_lock_calls_from_one_client(cloudshell_emulator: Emulator):
    """The calls a lock makes: add the service, read details uncached, remove it."""
    from cloudshell.api.cloudshell_api import AttributeNameValue

    from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, SERVICE_MODEL

    emu = cloudshell_emulator
    emu.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.reset_counts()
    cycles = CALLS // 4
    started = time.perf_counter()
    for n in range(cycles):
        api.AddServiceToReservation(
            rid, SERVICE_MODEL, DEFAULT_ALIAS, [AttributeNameValue(ATTR_OWNER, str(n))]
        )
        assert api.GetReservationDetails(rid, True).ReservationDescription.Services
        api.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])
    round_trip_ms = 1000 * (time.perf_counter() - started) / (3 * cycles)
    server = emu.control.overhead()
    print(
        f"\none client, {cycles} add/details/remove cycles: client round trip {round_trip_ms:.2f} ms/call; "
        f"emulator's own time mean {server['mean_ms']:.3f} ms, p50 {server['p50_ms']:.3f} ms, "
        f"p99 {server['p99_ms']:.3f} ms"
    )
    assert served(server["calls"], 3 * cycles)


@pytest.mark.slow
def test_overhead_from_many_processes(cloudshell_emulator: Emulator):
    emu = cloudshell_emulator
    processes, calls = 8, CALLS // 2
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes + 1), ctx.Queue()
    workers = [
        ctx.Process(target=overhead_worker, args=(emu.port, calls, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    while emu.control.call_counts().get("GetServerDateAndTime", 0) < processes:
        time.sleep(0.02)
    emu.control.reset_counts()
    barrier.wait(timeout=120)
    started = time.perf_counter()
    durations = [results.get(timeout=120) for _ in range(processes)]
    elapsed = time.perf_counter() - started
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    total = processes * calls
    server = emu.control.overhead()
    per_client_ms = 1000 * sum(durations) / total
    print(
        f"\n{processes} processes x {calls} calls: {total / elapsed:.0f} calls/s in total, "
        f"client round trip {per_client_ms:.2f} ms/call; "
        f"emulator's own time mean {server['mean_ms']:.3f} ms, p50 {server['p50_ms']:.3f} ms, "
        f"p99 {server['p99_ms']:.3f} ms"
    )
    assert served(server["calls"], total)
