"""Deadlocks between named locks, with separate OS processes against the emulator over HTTP (real client).

* **Two locks, opposite orders:** one process holds ``A`` and waits for ``B``, the other holds ``B`` and
  waits for ``A``. One raises :class:`MutexDeadlock` naming the cycle (not a timeout: the timeout is 120 s),
  the other gets its lock; nothing is left on the server.
* **Three locks, three processes** (``A`` then ``B``, ``B`` then ``C``, ``C`` then ``A``): the same.
* **No false positive:** processes that take random subsets of three locks in one global order, with random
  short holds, looking for cycles sooner and more often than by default (every wait while holding a lock is
  judged, many times): no MutexDeadlock, and no read shows a cycle at all, in 90 acquisitions (1,000 in
  ``make stress``: ``CLOUDSHELL_MUTEX_DEADLOCK_ACQUISITIONS``).

The detection time (from the server's event log: the last ticket of the cycle added, to the victim's ticket
removed) is printed (``pytest -s``); tests assert correctness, not speed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
from cloudshell.api.cloudshell_api import CloudShellAPISession
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface
from test_lease_processes import our_package
from test_rwlock_processes import collect

from cloudshell_mutex import CohortMutex, MutexTimeout, ReservationMutex
from cloudshell_mutex.driver import ReservationMutexMixin
from cloudshell_mutex.emulated import EmulatedSite
from cloudshell_mutex.lock import MutexDeadlock, acquire_all, protocol
from cloudshell_mutex.lock import holder as tokens
from cloudshell_mutex.lock.queue import queue, waitfor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LATENCY = {"distribution": "fixed", "seconds": 0.05, "commit_fraction": 0.5}
#: The many-acquisitions run: the latency of the queue's other process tests (1,000 acquisitions in time).
SHORT_LATENCY = {"distribution": "uniform", "low": 0.005, "high": 0.02, "commit_fraction": 0.5}
#: ... whose waiters look for cycles after this wait (s), and this often (s) after it: many more judged reads.
DETECT_AFTER, DETECT_INTERVAL = 0.0, 0.1
TIMEOUT = 120.0
#: Acquisitions of the no-false-positive run: 200 in make test (under a minute), 1,000 in make stress.
ACQUISITIONS = int(os.environ.get("CLOUDSHELL_MUTEX_DEADLOCK_ACQUISITIONS", "90"))


def _address(emu) -> Tuple[str, int, str, str, str]:
    return (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)


#: How a party takes its locks: ReservationMutex (the queue), ("cohort", dir) CohortMutex in that cohort
#: folder (one folder: one execution server), ("mixin", dir) a driver command's self.reservation_mutex
#: (cohort mode, the mixin's default), ("plain", None) ReservationMutex with fair=False.
How = Tuple[str, Optional[str]]
QUEUE: How = ("queue", None)


class CrossingDriver(ResourceDriverInterface, ReservationMutexMixin):
    """A driver whose command takes two locks of its sandbox, one inside the other."""

    def initialize(self, context: Any) -> None:
        pass

    def cross(self, context: Any, first: str, second: str, cohort_dir: str, inside: Any) -> None:
        with self.reservation_mutex(context, first, cohort_dir=cohort_dir, timeout=TIMEOUT):
            inside(lambda: self.reservation_mutex(context, second, cohort_dir=cohort_dir, timeout=TIMEOUT))


def _lock(api: Any, rid: str, index: int, name: str, how: How) -> Any:
    kind, folder = how
    owner = f"crosser {index}"
    if kind == "cohort":
        return CohortMutex(api, rid, owner=owner, name=name, timeout=TIMEOUT, cohort_dir=folder)
    return ReservationMutex(api, rid, owner=owner, name=name, timeout=TIMEOUT, fair=kind != "plain")


def crosser(
    index: int, address, rid: str, first: str, second: str, barrier, results, how: How = QUEUE
) -> None:
    """Hold ``first``; once every process holds its first lock, take ``second`` too (``how``: see How)."""
    report: Dict[str, Any] = {"index": index, "error": None, "outcome": None}

    def inside(second_lock: Callable[[], Any]) -> None:
        barrier.wait(timeout=TIMEOUT)
        report["waiting_at"] = time.monotonic()
        try:
            with second_lock():
                time.sleep(0.1)
            report["outcome"] = "acquired"
        except MutexDeadlock as error:
            report.update(outcome="deadlock", cycle=error.cycle, message=str(error))
        report["done_at"] = time.monotonic()

    try:
        host, port, user, password, domain = address
        if how[0] == "mixin":
            site = EmulatedSite(host, port, user, password, domain)
            context = site.driver_context(rid, f"Router {index}")
            CrossingDriver().cross(context, first, second, str(how[1]), inside)
        else:
            api = CloudShellAPISession(host, user, password, domain, port=port)
            with _lock(api, rid, index, first, how):
                inside(lambda: _lock(api, rid, index, second, how))
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def _services(api: Any, rid: str) -> List[str]:
    services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services or []
    return sorted(s.Alias for s in services)


def _run_cycle(
    emu, names: Sequence[str], hows: Optional[Sequence[How]] = None
) -> Tuple[List[Dict[str, Any]], str]:
    """One process per name: process i holds names[i], then takes names[i + 1] (a cycle over all), taking
    its locks as ``hows[i]`` says (default: ReservationMutex, waiting in line)."""
    rid = emu.create_reservation(f"deadlock {len(names)}")
    emu.control.configure(latency=LATENCY)
    ctx = multiprocessing.get_context("spawn")
    results, barrier = ctx.Queue(), ctx.Barrier(len(names))
    hows = hows or [QUEUE] * len(names)
    processes = [
        ctx.Process(
            target=crosser,
            args=(i, _address(emu), rid, names[i], names[(i + 1) % len(names)], barrier, results, hows[i]),
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


def _one_victim(reports: List[Dict[str, Any]], names: Sequence[str]) -> Dict[str, Any]:
    """Exactly one MutexDeadlock, naming the whole cycle; every other party got its lock."""
    outcomes = [r["outcome"] for r in reports]
    assert outcomes.count("deadlock") == 1 and outcomes.count("acquired") == len(names) - 1, reports
    victim = next(r for r in reports if r["outcome"] == "deadlock")
    assert {lock for lock, _, _ in victim["cycle"]} == set(names), victim
    assert "deadlock" in victim["message"] and "(this thread)" in victim["message"]
    return victim


@pytest.mark.parametrize("kind", ["cohort", "mixin"])
def test_a_cycle_between_two_cohort_members_on_one_machine_is_seen(
    cloudshell_emulator_factory, original_package_zip, tmp_path, kind
):
    """Both wait for the local lock the other holds: waits no queue sees, seen through their wait records
    (``mixin``: two driver commands, each in its own process, with the mixin's default, cohort mode)."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    how: How = (kind, str(tmp_path))
    reports, rid = _run_cycle(emu, ("A", "B"), [how, how])
    victim = _one_victim(reports, ("A", "B"))
    assert _services(emu.session(), rid) == []  # no lock, no record left behind
    waited = victim["done_at"] - victim["waiting_at"]
    print(f"\n{kind}: the victim gave up {waited:.2f} s after it began waiting")


def test_a_cycle_of_local_and_remote_waits_is_seen(
    cloudshell_emulator_factory, original_package_zip, tmp_path
):
    """Two cohort members of one execution server and a party elsewhere: 0 holds A and waits for B (on the
    server), 1 (elsewhere) holds B and waits for C (held by the cohort), 2 holds C and waits for A (its
    machine's local lock, which 0 holds)."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    here: How = ("cohort", str(tmp_path / "exec-1"))
    elsewhere: How = ("cohort", str(tmp_path / "exec-2"))
    reports, rid = _run_cycle(emu, ("A", "B", "C"), [here, elsewhere, here])
    victim = _one_victim(reports, ("A", "B", "C"))
    assert _services(emu.session(), rid) == []
    print(
        f"\nmixed: the victim gave up {victim['done_at'] - victim['waiting_at']:.2f} s after it began waiting"
    )


def test_a_cycle_of_plain_polling_waiters_is_seen(cloudshell_emulator_factory, original_package_zip):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    plain: How = ("plain", None)
    reports, rid = _run_cycle(emu, ("A", "B"), [plain, plain])
    victim = _one_victim(reports, ("A", "B"))
    assert _services(emu.session(), rid) == []
    waited = victim["done_at"] - victim["waiting_at"]
    print(f"\nfair=False: the victim gave up {waited:.2f} s after it began waiting")


# ---------------------------------------------------------------- waits that are not live make no cycle

#: The lease of the held locks in the tests below (seconds): short, so a dead holder's lock is broken soon.
LEASE = 2.0


def _nonces_counting_from(first: int) -> None:
    """This process's tokens get nonces counting up from ``first``: a test decides which party is a cycle's
    victim (the greatest nonce) instead of leaving it to chance."""
    counter = itertools.count(first)
    tokens.commitment = lambda secret: f"{next(counter):0{tokens.NONCE_DIGITS}x}"


def other_party(address, rid: str, give_up_after: Optional[float], hold_after: float, events, go) -> None:
    """Holds L2 (leased), then waits for L1: until killed (``give_up_after`` None), or gives up after that
    many seconds and keeps L2 ``hold_after`` seconds more. Its nonces are small: it is never the victim."""
    _nonces_counting_from(0x10)
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        with ReservationMutex(api, rid, owner="party 2", name="L2", lease=LEASE):
            events.put("holds")
            go.wait(TIMEOUT)
            try:
                timeout = TIMEOUT if give_up_after is None else give_up_after
                with ReservationMutex(api, rid, owner="party 2", name="L1", timeout=timeout):
                    events.put("acquired L1")
            except MutexTimeout:
                events.put("gave up")
            time.sleep(hold_after)
    except BaseException as error:  # report, never hang the parent
        events.put(f"error: {type(error).__name__}: {error}")


def _tickets_of(api: Any, rid: str, lock: str) -> List[str]:
    return [alias for alias in _services(api, rid) if alias.startswith(lock + protocol.TICKET_INFIX)]


def _leased_emulator(cloudshell_emulator_factory):
    return cloudshell_emulator_factory(packages=[our_package()])


def test_a_party_killed_while_it_waits_makes_no_deadlock_and_its_lock_is_broken(
    cloudshell_emulator_factory, monkeypatch
):
    """Party 2 holds L2 and waits for L1, and is killed; party 1 holds L1 and waits for L2. Party 2's ticket
    still shows the cycle, but it never moves: party 1 (the victim, were it live) waits, breaks L2 when its
    lease lapses, and gets it."""
    emu = _leased_emulator(cloudshell_emulator_factory)
    rid = emu.create_reservation("a dead party")
    emu.control.configure(latency=LATENCY)
    monkeypatch.setattr(tokens, "commitment", tokens.commitment)  # restored after the test
    _nonces_counting_from(0xF000000000000000)
    api = emu.session()
    ctx = multiprocessing.get_context("spawn")
    events, go = ctx.Queue(), ctx.Event()
    with ReservationMutex(api, rid, owner="party 1", name="L1", lease=LEASE):
        process = ctx.Process(target=other_party, args=(_address(emu), rid, None, 0.0, events, go))
        process.start()
        try:
            assert events.get(timeout=60) == "holds"
            go.set()
            deadline = time.monotonic() + 30
            while not _tickets_of(api, rid, "L1") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _tickets_of(api, rid, "L1"), "party 2 never waited for L1"
        finally:
            process.kill()  # SIGKILL: its ticket stays, naming L2
            process.join(10)
        waiter = ReservationMutex(api, rid, owner="party 1", name="L2", lease=LEASE, timeout=30)
        with waiter:  # a MutexDeadlock here is the defect: a dead party's wait counted
            pass


def test_a_party_that_gave_up_but_whose_ticket_remove_lands_late_makes_no_deadlock(
    cloudshell_emulator_factory, monkeypatch
):
    """Party 2 holds L2, waits for L1 and gives up after 1 s (before anyone looks for a cycle), keeping L2 for
    a while; its ticket's remove lands 5 s late, so reads still show it waiting for L1. Party 1 holds L1 and
    waits for L2: it waits for L2's release, with no MutexDeadlock."""
    emu = _leased_emulator(cloudshell_emulator_factory)
    rid = emu.create_reservation("a party that gave up")
    emu.control.configure(latency=LATENCY)
    monkeypatch.setattr(tokens, "commitment", tokens.commitment)
    _nonces_counting_from(0xF000000000000000)
    api = emu.session()
    ctx = multiprocessing.get_context("spawn")
    events, go = ctx.Queue(), ctx.Event()
    hold_after = 8.0
    with ReservationMutex(api, rid, owner="party 1", name="L1", lease=LEASE):
        process = ctx.Process(target=other_party, args=(_address(emu), rid, 1.0, hold_after, events, go))
        process.start()
        try:
            assert events.get(timeout=60) == "holds"
            # The next remove (party 2's ticket, when it gives up) is reset and lands 5 s later.
            emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=5.0)
            go.set()
            start = time.monotonic()
            with ReservationMutex(api, rid, owner="party 1", name="L2", lease=LEASE, timeout=30):
                waited = time.monotonic() - start
            assert events.get(timeout=30) == "gave up"
        finally:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert waited >= hold_after  # it waited for L2's release
    print(f"\nparty 1 got L2 after {waited:.2f} s, when party 2 released it")


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
    waitfor.DETECT_AFTER, waitfor.DETECT_INTERVAL = DETECT_AFTER, DETECT_INTERVAL  # this process only
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
    from cloudshell_mutex.lock.lease.lease import ticket_value

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
