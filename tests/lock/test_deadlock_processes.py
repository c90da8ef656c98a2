"""Deadlocks between named locks, with separate OS processes against the emulator over HTTP (real client).

* **Two locks, opposite orders:** one process holds ``A`` and waits for ``B``, the other holds ``B`` and
  waits for ``A``. One raises :class:`MutexDeadlock` naming the cycle (not a timeout: the timeout is 120 s),
  the other gets its lock; nothing is left on the server.
* **Three locks, three processes** (``A`` then ``B``, ``B`` then ``C``, ``C`` then ``A``): the same.
* **No false positive:** processes that take random subsets of three locks in one global order, with random
  short holds, looking for cycles sooner and more often than by default (every wait while holding a lock is
  judged, many times): no MutexDeadlock, and no read shows a cycle at all, in 200 acquisitions (1,000 in
  ``make stress``: ``CLOUDSHELL_MUTEX_DEADLOCK_ACQUISITIONS``).

The detection time (from the server's event log: the last ticket of the cycle added, to the victim's ticket
removed) is printed (``pytest -s``); tests assert correctness, not speed.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import time
from typing import Any, Dict, List, Sequence, Tuple

import pytest
from cloudshell.api.cloudshell_api import CloudShellAPISession
from test_rwlock_processes import collect

from cloudshell_mutex import ReservationMutex
from cloudshell_mutex.lock import MutexDeadlock, acquire_all, protocol, queue, waitfor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LATENCY = {"distribution": "fixed", "seconds": 0.05, "commit_fraction": 0.5}
#: The many-acquisitions run: the latency of the queue's other process tests (1,000 acquisitions in time).
SHORT_LATENCY = {"distribution": "uniform", "low": 0.005, "high": 0.02, "commit_fraction": 0.5}
#: ... whose waiters look for cycles after this wait (s), and this often (s) after it: many more judged reads.
DETECT_AFTER, DETECT_INTERVAL = 0.0, 0.1
TIMEOUT = 120.0
#: Acquisitions of the no-false-positive run: 200 in make test (under a minute), 1,000 in make stress.
ACQUISITIONS = int(os.environ.get("CLOUDSHELL_MUTEX_DEADLOCK_ACQUISITIONS", "200"))


def _address(emu) -> Tuple[str, int, str, str, str]:
    return (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)


def crosser(index: int, address, rid: str, first: str, second: str, barrier, results) -> None:
    """Hold ``first``; once every process holds its first lock, take ``second`` too."""
    report: Dict[str, Any] = {"index": index, "error": None, "outcome": None}
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        outer = ReservationMutex(api, rid, owner=f"crosser {index}", name=first, timeout=TIMEOUT)
        inner = ReservationMutex(api, rid, owner=f"crosser {index}", name=second, timeout=TIMEOUT)
        with outer:
            barrier.wait(timeout=TIMEOUT)
            report["waiting_at"] = time.monotonic()
            try:
                with inner:
                    time.sleep(0.1)
                report["outcome"] = "acquired"
            except MutexDeadlock as error:
                report.update(outcome="deadlock", cycle=error.cycle, message=str(error))
            report["done_at"] = time.monotonic()
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def _services(api: Any, rid: str) -> List[str]:
    services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services or []
    return sorted(s.Alias for s in services)


def _run_cycle(emu, names: Sequence[str]) -> Tuple[List[Dict[str, Any]], str]:
    """One process per name: process i holds names[i], then takes names[i + 1] (a cycle over all)."""
    rid = emu.create_reservation(f"deadlock {len(names)}")
    emu.control.configure(latency=LATENCY)
    ctx = multiprocessing.get_context("spawn")
    results, barrier = ctx.Queue(), ctx.Barrier(len(names))
    processes = [
        ctx.Process(
            target=crosser,
            args=(i, _address(emu), rid, names[i], names[(i + 1) % len(names)], barrier, results),
        )
        for i in range(len(names))
    ]
    for process in processes:
        process.start()
    reports = collect(processes, results, timeout=TIMEOUT + 60)  # every report, no process left, no error
    return sorted(reports, key=lambda r: r["index"]), rid


def _detection_seconds(emu, rid: str) -> float:
    """From the server's log: the last ticket added (the cycle complete) to the first ticket removed (the
    victim leaving)."""
    events = sorted(emu.control.events(rid), key=lambda e: e["seq"])
    tickets = [e for e in events if protocol.TICKET_INFIX in e["alias"]]
    added = [e["monotonic"] for e in tickets if e["op"] == "service_added"]
    removed = [e["monotonic"] for e in tickets if e["op"] == "service_removed"]
    formed = max(added)
    return min(r for r in removed if r >= formed) - formed


@pytest.mark.parametrize("names", [("A", "B"), ("A", "B", "C")], ids=["two locks", "three locks"])
def test_a_cycle_makes_exactly_one_waiter_give_up_and_the_others_get_their_locks(
    cloudshell_emulator_factory, original_package_zip, names
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    reports, rid = _run_cycle(emu, names)
    outcomes = [r["outcome"] for r in reports]
    assert outcomes.count("deadlock") == 1 and outcomes.count("acquired") == len(names) - 1, reports
    victim = next(r for r in reports if r["outcome"] == "deadlock")
    # The cycle, from the victim's wait: every lock, its holder, and what that holder waits for.
    steps = victim["cycle"]
    assert len(steps) == len(names)
    assert {lock for lock, _, _ in steps} == set(names)
    for (_, holder, waits_for), following in zip(steps, steps[1:] + steps[:1]):
        assert holder.startswith("crosser ") and waits_for == following[0]
    assert steps[0][0] == names[(victim["index"] + 1) % len(names)]  # it waited for the next one's lock
    assert "deadlock" in victim["message"] and "(this thread)" in victim["message"]
    assert emu.admin_password not in victim["message"]
    assert _services(emu.session(), rid) == []  # no lock, no ticket left behind
    detected = _detection_seconds(emu, rid)
    print(f"\n{len(names)} locks: the victim left {detected:.2f} s after the cycle formed")


def random_taker(index: int, address, rid: str, count: int, seed: int, results) -> None:
    """``count`` acquisitions: random non-empty subsets of A, B, C, always in that order (nested with
    blocks, or acquire_all), with random short holds."""
    report: Dict[str, Any] = {
        "index": index,
        "error": None,
        "acquisitions": 0,
        "deadlocks": 0,
        "long": 0,
        "judged": 0,
        "cycles": 0,
    }
    rng = random.Random(seed)
    queue.DETECT_AFTER, queue.DETECT_INTERVAL = DETECT_AFTER, DETECT_INTERVAL  # this process only
    graph = waitfor.wait_for

    def judged(services):  # every read a waiter judged: no cycle at all may show, through anyone
        found = graph(services)
        report["judged"] += 1
        report["cycles"] += len(found.cycles())
        return found

    queue.waitfor.wait_for = judged
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        while report["acquisitions"] < count:
            names = sorted(rng.sample("ABC", rng.choice((1, 2, 2, 3, 3))))  # mostly several: chains form
            locks = [
                ReservationMutex(api, rid, owner=f"taker {index}", name=n, timeout=TIMEOUT) for n in names
            ]
            try:
                if rng.random() < 0.5:
                    with contextlib.ExitStack() as stack:
                        for position, lock in enumerate(locks):
                            started = time.monotonic()
                            stack.enter_context(lock)
                            if position and time.monotonic() - started > DETECT_AFTER:
                                report["long"] += 1  # waited long enough, holding, to look for cycles
                            time.sleep(_hold(rng))  # holding what it has: the others wait longer
                        time.sleep(_hold(rng))
                else:
                    with acquire_all(*reversed(locks)):
                        time.sleep(_hold(rng))
            except MutexDeadlock as error:
                report["deadlocks"] += 1
                report["error"] = str(error)
            report["acquisitions"] += len(locks)
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def _hold(rng: random.Random) -> float:
    """Mostly short, sometimes long enough that the waiters behind look for cycles."""
    return rng.uniform(0.2, 0.5) if rng.random() < 0.3 else rng.uniform(0, 0.05)


def test_no_deadlock_is_seen_among_parties_that_take_locks_in_one_order(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation("one order")
    emu.control.configure(latency=SHORT_LATENCY)
    takers = 6
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    per_taker = -(-ACQUISITIONS // takers)
    processes = [
        ctx.Process(target=random_taker, args=(i, _address(emu), rid, per_taker, 1000 + i, results))
        for i in range(takers)
    ]
    for process in processes:
        process.start()
    reports = collect(processes, results, timeout=900)  # every report, no process left, no error
    assert sum(r["deadlocks"] for r in reports) == 0
    assert sum(r["cycles"] for r in reports) == 0  # nor did any judged read show a cycle through others
    judged = sum(r["judged"] for r in reports)
    assert judged > 0, "no waiter that held a lock looked for a cycle: the test did not test the detection"
    assert sum(r["acquisitions"] for r in reports) >= ACQUISITIONS
    long_waits = sum(r["long"] for r in reports)
    assert _services(emu.session(), rid) == []
    print(f"\n{ACQUISITIONS} acquisitions; {judged} reads judged; {long_waits} waits past {DETECT_AFTER} s")


def test_status_all_shows_who_waits_for_what_and_a_deadlock(
    cloudshell_emulator_factory, original_package_zip, monkeypatch, capsys
):
    from cloudshell.api.cloudshell_api import AttributeNameValue

    from cloudshell_mutex import cli
    from cloudshell_mutex.lock.lease import ticket_value

    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    api = emu.session()
    rid = emu.create_reservation("status of waits")
    held_a, held_b = "job one@exec-1:11:0000aaaa", "job two@exec-2:22:0000bbbb"
    values = {
        "A": held_a,
        "B": held_b,
        "B~q~1": ticket_value("job one@exec-1:11:1111aaaa", 120, 0, [held_a]),  # holds A, waits for B
        "A~q~1": ticket_value("job two@exec-2:22:2222bbbb", 120, 0, [held_b]),  # holds B, waits for A
        "C": "old snippet owner",
        "C~q~0": ticket_value("job three@exec-3:33:3333cccc", 120, 0),  # an older waiter: holds nothing
    }
    for alias, value in values.items():
        attributes = [AttributeNameValue(protocol.ATTR_OWNER, value)]
        api.AddServiceToReservation(rid, protocol.SERVICE_MODEL, alias, attributes)
    monkeypatch.setenv("CLOUDSHELL_HOST", emu.host)
    monkeypatch.setenv("CLOUDSHELL_API_PORT", str(emu.port))
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", emu.admin_password)
    assert cli.main(["status", rid, "--all"]) == 0
    out = capsys.readouterr().out
    assert "B~q~1: queue ticket of B, held by job one (host exec-1, pid 11), which holds A" in out
    assert (
        "job one (host exec-1, pid 11) waits for B (held by job two (host exec-2, pid 22)); it holds A" in out
    )
    assert "job three (host exec-3, pid 33) waits for C (held by 'old snippet owner')" in out
    assert (
        "DEADLOCK: A is held by job one (host exec-1, pid 11), which waits for B; B is held by job two "
        "(host exec-2, pid 22), which waits for A. job two (host exec-2, pid 22) gives up" in out
    )
    assert emu.admin_password not in out
    assert cli.main(["status", rid, "--all", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(w["lock"], tuple(w["holds"])) for w in data["waits"]} == {
        ("A", ("B",)),
        ("B", ("A",)),
        ("C", ()),
    }
    assert [len(d["cycle"]) for d in data["deadlocks"]] == [2]
