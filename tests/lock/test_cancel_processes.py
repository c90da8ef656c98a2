"""Cancelling a waiting acquire, across OS processes (spawn), against the emulator with the real client.

A waiter in a process of its own waits for a lock the test holds; the test cancels it (shell-core's real
``CancellationContext``, a ``threading.Event`` or a callable, flipped by a thread of the waiter when the test
sets a shared event). The waiter must raise ``MutexCancelled`` within a second of the cancellation
(CLOCK_MONOTONIC is system-wide, so the two processes' times compare) and leave nothing behind: no add, no
queue ticket, no reader slot, no writer-waiting marker, no cohort waiter registration. Adds whose reply is
lost (``apply_late``) are followed until they land, before or after the cancellation.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Dict

import pytest
import test_lease_processes as lease_processes
from cloudshell.shell.core.driver_context import CancellationContext
from test_lease_processes import FAST, Address, address, session

from cloudshell_mutex import MutexCancelled, ReservationMutex, ReservationRWLock, protocol
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.pacing import FixedPacing
from cloudshell_mutex.lock.queue.queue import SPIN_MAX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

emu = lease_processes.emu  # the fixture: an emulator with our package imported
#: The promise: a waiting acquire stops within a second of its cancellation.
WITHIN = 1.0


# ---------------------------------------------------------------- the waiter (a spawned process)


def cancellation_source(source: str, stop: Any) -> Any:
    """What the waiter is cancelled with; ``stop`` (a multiprocessing Event) is set by the test."""
    if source == "callable":
        return stop.is_set
    if source == "event":
        flag: Any = threading.Event()
        setter = flag.set
    else:  # shell-core's own class, flipped as CloudShell flips it when someone clicks Stop
        flag = CancellationContext()

        def setter() -> None:
            flag.is_cancelled = True

    threading.Thread(target=lambda: (stop.wait(120), setter()), daemon=True).start()
    return flag


def waiter_worker(
    kind: str, source: str, addr: Address, rid: str, options: Dict[str, Any], stop, go, out
) -> None:
    """Wait for the lock as ``kind``, cancelled through ``source``; report when and how it ended. After
    ``go``, let this process's late-add watcher settle what may still land (it removes our adds that do)."""
    report: Dict[str, Any] = {"error": None}
    try:
        cancellation = cancellation_source(source, stop)
        api = session(addr)
        common = dict(owner=f"{kind} waiter", timeout=120, cancellation=cancellation, **options)
        if kind == "read":
            lock: Any = ReservationRWLock(api, rid, **common).read()
        elif kind == "write":
            lock = ReservationRWLock(api, rid, **common).write()
        elif kind == "cohort":
            lock = CohortMutex(api, rid, **common)
        else:
            lock = ReservationMutex(api, rid, **common)
        out.put(("waiting", None))
        try:
            lock.acquire()
            report["acquired"] = True
            lock.release()
        except MutexCancelled as error:
            report["cancelled_at"] = time.monotonic()
            report["message"] = str(error)
        if go is not None:
            go.wait(60)
            from cloudshell_mutex.lock.server.late_adds import process_late_adds

            report["settled"] = process_late_adds().settle(30)
    except BaseException as error:  # report, never hang the test
        report["error"] = f"{type(error).__name__}: {error}"
    out.put(("done", report))


def spawn_waiter(emu, rid: str, kind: str, source: str, go=None, **options: Any):
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    args = (kind, source, address(emu), rid, {**FAST, **options}, stop, go, out)
    process = ctx.Process(target=waiter_worker, args=args, daemon=True)
    process.start()
    assert out.get(timeout=60) == ("waiting", None)
    return process, stop, out


def cancel_and_report(process, stop, out, wait_first: float = 1.5) -> Dict[str, Any]:
    time.sleep(wait_first)  # it polls meanwhile
    stop.set()
    cancelled = time.monotonic()
    kind, report = out.get(timeout=60)
    process.join(30)
    assert kind == "done" and report["error"] is None, report
    assert "cancelled_at" in report, report
    report["latency"] = report["cancelled_at"] - cancelled
    return report


def services(emu, rid: str) -> Dict[str, str]:
    return {
        s["alias"]: s["attributes"].get(protocol.ATTR_OWNER, "")
        for s in emu.control.reservation(rid)["services"]
    }


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "kind, source, options",
    [
        ("mutex", "cancellation_context", {}),
        ("mutex", "callable", {"pacing": FixedPacing(30.0)}),  # cancelled in the middle of a long pause
        ("fair", "event", {"fair": True}),
        ("read", "callable", {}),
        ("write", "cancellation_context", {}),
    ],
)
def test_a_waiter_stops_within_a_second_of_cancellation_and_leaves_nothing(emu, kind, source, options):
    rid = emu.create_reservation()
    holder = ReservationMutex(emu.session(), rid, owner="holder")
    holder.acquire()
    process, stop, out = spawn_waiter(emu, rid, kind, source, **options)
    report = cancel_and_report(process, stop, out)
    print(f"\n{kind} waiter cancelled through {source}: stopped {report['latency'] * 1000:.0f} ms later")
    assert 0 <= report["latency"] < WITHIN
    assert "cancelled after" in report["message"] and "holder" in report["message"]
    # Nothing of the waiter's: no add, no queue ticket, no reader slot, no writer-waiting marker.
    assert services(emu, rid) == {"MUTEX": holder.token}
    holder.release()
    assert services(emu, rid) == {}


def _until_tickets(emu, rid: str, count: int) -> None:
    """Until ``count`` waiters have parked (their tickets show): each spins a few seconds first."""
    deadline = time.monotonic() + SPIN_MAX + 10
    while sum(alias.startswith("MUTEX~q") for alias in services(emu, rid)) < count:
        assert time.monotonic() < deadline, services(emu, rid)
        time.sleep(0.2)
    time.sleep(0.5)  # its first look in line after the ticket's add


def test_fair_waiters_in_line_behind_the_head_stop_and_take_their_tickets_back(emu):
    """The second fair waiter waits in the queue's own loop (not the mutex's): it too stops at once."""
    rid = emu.create_reservation()
    holder = ReservationMutex(emu.session(), rid, owner="holder")
    holder.acquire()
    head = spawn_waiter(emu, rid, "mutex", "event", fair=True)
    _until_tickets(emu, rid, 1)  # the first spins, then parks with ticket 1: the head
    second = spawn_waiter(emu, rid, "mutex", "cancellation_context", fair=True)
    _until_tickets(emu, rid, 2)
    for process, stop, out in (second, head):
        report = cancel_and_report(process, stop, out, wait_first=0.0)
        assert 0 <= report["latency"] < WITHIN
    assert services(emu, rid) == {"MUTEX": holder.token}
    holder.release()


def test_a_cohort_waiter_stops_its_local_wait_and_unregisters(emu, tmp_path):
    """Cohort mode: the waiter waits for the local lock another process holds (no server call)."""
    rid = emu.create_reservation()
    holder = CohortMutex(emu.session(), rid, owner="local holder", cohort_dir=tmp_path)
    holder.acquire()
    process, stop, out = spawn_waiter(emu, rid, "cohort", "cancellation_context", cohort_dir=str(tmp_path))
    time.sleep(0.5)
    assert len(holder.local_state().waiters) == 1
    report = cancel_and_report(process, stop, out)
    assert 0 <= report["latency"] < WITHIN
    assert "local holder" in report["message"] and "cohort mode" in report["message"]
    assert holder.local_state().waiters == {}  # its registration was taken back
    assert not list(tmp_path.glob("*.w.*.lock"))  # and its waiter file
    assert services(emu, rid) == {"MUTEX": holder.token}
    holder.release()
    assert services(emu, rid) == {}


def _waiter_whose_add_gets_no_reply(emu, request_lifetime: float):
    """A holder, and a spawned waiter whose add is held at the server without a reply (the client re-sends
    it and the copy finds the holder's MUTEX); returned once the waiter pauses (FixedPacing(30))."""
    rid = emu.create_reservation()
    holder = ReservationMutex(emu.session(), rid, owner="holder")
    holder.acquire()
    go = multiprocessing.get_context("spawn").Event()
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reset_after=0.05)
    process, stop, out = spawn_waiter(
        emu,
        rid,
        "mutex",
        "cancellation_context",
        go,
        request_lifetime=request_lifetime,
        pacing=FixedPacing(30.0),
        fair=False,  # plain polling sits in its 30 s pause; in line it would read, see its add land and hold
    )
    time.sleep(2.5)  # the reset, the client's re-send 1 s later ("already exists"), a read: now it pauses
    return rid, holder, go, process, stop, out


@pytest.mark.client_resend
@pytest.mark.parametrize("lands", ["after the cancellation", "before the cancellation"])
def test_a_cancelled_waiter_whose_add_lands_late_leaves_nothing_behind(emu, lands):
    """The waiter's add gets no reply (the connection is reset, the client re-sends it, and the copy finds
    the holder's MUTEX); the first copy lands later, when the holder has gone. Landed after the
    cancellation, the waiter's late-add watcher removes it; landed before (the waiter pausing long), the
    cancellation's own read finds it and removes it. Nothing stays either way."""
    rid, holder, go, process, stop, out = _waiter_whose_add_gets_no_reply(emu, request_lifetime=30)
    if lands == "before the cancellation":
        holder.release()
        assert emu.control.land_late() == 1
        token = services(emu, rid)["MUTEX"]
        assert token.startswith("mutex waiter@")  # its add landed: the lock is the waiter's, unknown to it
    stop.set()
    cancelled = time.monotonic()
    if lands == "after the cancellation":
        time.sleep(1.0)
        holder.release()
        assert emu.control.land_late() == 1
        token = services(emu, rid)["MUTEX"]
        assert token.startswith("mutex waiter@")
    go.set()
    kind, report = out.get(timeout=90)
    process.join(30)
    assert kind == "done" and report["error"] is None, report
    assert report["cancelled_at"] - cancelled < WITHIN
    if lands == "after the cancellation":
        assert "may still be applied" in report["message"]  # and it says what to do if it exits first
    else:
        assert "nothing of this acquisition stays" in report["message"]
    assert report["settled"]
    assert services(emu, rid) == {}
    history = [
        (e["op"], e["attributes"].get(protocol.ATTR_OWNER))
        for e in emu.control.events(rid)
        if e["alias"] == "MUTEX"
    ]
    assert history[-2:] == [("service_added", token), ("service_removed", token)]


@pytest.mark.client_resend
def test_a_cancelled_waiter_never_removes_its_add_again_while_its_first_remove_may_land(emu):
    """The waiter's add lands late (the lock is the waiter's, unknown to it); its cancellation's read finds
    it and removes it once, but that remove gets no reply and stays at the server. The late-add watcher
    must not send a second remove meanwhile: that one would free the lock, a successor would take it, and
    the first remove, landing then, would delete the successor's lock (two holders from there on)."""
    rid, holder, go, process, stop, out = _waiter_whose_add_gets_no_reply(emu, request_lifetime=10)
    holder.release()
    assert emu.control.land_late() == 1
    token = services(emu, rid)["MUTEX"]
    assert token.startswith("mutex waiter@")
    # The cancellation's remove of it: no reply, held at the server until the test lands it.
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    stop.set()
    deadline = time.monotonic() + 10
    while not any(f["method"] == "RemoveServicesFromReservation" for f in emu.control.faults_injected()):
        assert time.monotonic() < deadline, "the waiter never removed its add"
        time.sleep(0.05)
    time.sleep(3.0)  # the waiter's late-add watcher reads every second meanwhile
    successor = ReservationMutex(emu.session(), rid, owner="successor")
    early = successor.acquire(blocking=False)
    assert emu.control.land_late() == 1  # the waiter's remove lands now
    if early:
        assert services(emu, rid).get("MUTEX") == successor.token, (
            "the waiter sent a second remove while its first could still land: the first one then deleted "
            "the successor's lock"
        )
    assert not early, "a second remove of the waiter freed the lock while its first could still land"
    assert successor.acquire(timeout=30)
    go.set()
    kind, report = out.get(timeout=90)
    process.join(30)
    assert kind == "done" and report["error"] is None, report
    assert report["settled"]
    assert services(emu, rid) == {"MUTEX": successor.token}
    successor.release()
    removes = [
        e["attributes"].get(protocol.ATTR_OWNER)
        for e in emu.control.events(rid)
        if e["alias"] == "MUTEX" and e["op"] == "service_removed"
    ]
    assert removes.count(token) == 1
