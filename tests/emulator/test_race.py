"""Separate OS processes against one emulator: the atomic alias check, and 64 concurrent clients."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Dict, List

import pytest

from cloudshell_mutex.emulator import Emulator
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, SERVICE_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROCESSES = 8
ROUNDS = 30


def race_worker(index: int, port: int, reservation_id: str, barrier: Any, results: Any) -> None:
    """Each round: wait for all, try to add the alias, wait for all, the winner removes it."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession
    from cloudshell.api.common_cloudshell_api import CloudShellAPIError

    api = CloudShellAPISession("127.0.0.1", "admin", "admin", "Global", port=port)
    for round_no in range(ROUNDS):
        barrier.wait(timeout=60)
        name = f"p{index}-r{round_no}"
        try:
            api.AddServiceToReservation(
                reservation_id, SERVICE_MODEL, DEFAULT_ALIAS, [AttributeNameValue(ATTR_OWNER, name)]
            )
            outcome = "won"
        except CloudShellAPIError as error:
            outcome = "busy" if error.code == "100" and "already exists" in error.message else repr(error)
        results.put((round_no, index, outcome))
        barrier.wait(timeout=60)
        if outcome == "won":
            # Fails only when two processes "won" a round; the assertions in the test report that.
            with contextlib.suppress(CloudShellAPIError):
                api.RemoveServicesFromReservation(reservation_id, [DEFAULT_ALIAS])


def test_processes_racing_for_one_alias_get_exactly_one_winner_per_round(cloudshell_emulator_factory):
    emu: Emulator = cloudshell_emulator_factory(
        latency={"distribution": "uniform", "low": 0.001, "high": 0.006, "commit_fraction": 0.5}
    )
    emu.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    rid = emu.create_reservation()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    workers = [
        ctx.Process(target=race_worker, args=(i, emu.port, rid, barrier, results)) for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in range(PROCESSES * ROUNDS)]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    by_round: Dict[int, List[str]] = defaultdict(list)
    winners: Dict[int, int] = {}
    for round_no, index, outcome in outcomes:
        by_round[round_no].append(outcome)
        if outcome == "won":
            winners[round_no] = index
    for round_no in range(ROUNDS):
        assert Counter(by_round[round_no]) == {"won": 1, "busy": PROCESSES - 1}, round_no

    # The server's own log agrees: adds and removes alternate, and each add is that round's winner.
    events = emu.control.events(rid)
    assert [e["op"] for e in events] == ["service_added", "service_removed"] * ROUNDS
    added = [e["attributes"][ATTR_OWNER] for e in events if e["op"] == "service_added"]
    assert added == [f"p{winners[r]}-r{r}" for r in range(ROUNDS)]
    assert len(set(winners.values())) > 1  # the race was real: not always the same process
    assert emu.control.call_counts()["AddServiceToReservation"] == PROCESSES * ROUNDS


def concurrency_worker(port: int, threads: int, barrier: Any, results: Any) -> None:
    """``threads`` clients, each with its own session (connection), one call each after the barrier."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    sessions = [
        CloudShellAPISession("127.0.0.1", "admin", "admin", "Global", port=port) for _ in range(threads)
    ]

    def one(api: CloudShellAPISession) -> None:
        barrier.wait(timeout=60)
        started = time.monotonic()
        ok = bool(api.GetServerDateAndTime().ServerDateTime)
        results.put((ok, time.monotonic() - started))

    pool = [threading.Thread(target=one, args=(api,)) for api in sessions]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def test_64_concurrent_clients_are_served_in_parallel(cloudshell_emulator_factory):
    emu: Emulator = cloudshell_emulator_factory()
    latency = 1.0
    processes, threads = 8, 8
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes * threads + 1), ctx.Queue()
    workers = [
        ctx.Process(target=concurrency_worker, args=(emu.port, threads, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    while emu.control.call_counts().get("Logon", 0) < processes * threads:  # all sessions logged on
        time.sleep(0.05)
    emu.control.configure(latency={"distribution": "fixed", "seconds": latency})
    barrier.wait(timeout=120)
    started = time.monotonic()
    answers = [results.get(timeout=60) for _ in range(processes * threads)]
    elapsed = time.monotonic() - started
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    assert all(ok for ok, _ in answers)
    assert all(duration >= latency for _, duration in answers)
    # Served one after another this would take 64 s; in parallel it takes about one latency.
    assert elapsed < 3 * latency, elapsed
