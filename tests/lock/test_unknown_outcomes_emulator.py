"""Requests that land late, against the emulator with the real CloudShellAPISession (roadmap step 5).

The emulator's ``apply_late`` fault resets the client's connection (or leaves it hanging until the
client's timeout) and applies the request later, when the test calls ``land_late``: so "the request
lands after X" never depends on timing. Each test reads the server's ordered event log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

from cloudshell_mutex import MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.lease.lease import ticket_value
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.queue import tickets as queue_values
from cloudshell_mutex.lock.server import catalog
from cloudshell_mutex.lock.server.late_adds import LateAdds

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
MUTEX = protocol.DEFAULT_ALIAS
#: The token of a queue ticket the tests add by hand (a waiter of another process).
HEAD = "head@elsewhere:1:0badcafe"


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


def mutex(api, rid, **kwargs) -> ReservationMutex:
    """A lock that already knows the original model (as after its process's first add), so that a fault
    injected for "the next add" hits the lock's add, not the add that learns the model."""
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    kwargs.setdefault("pacing", FAST)
    kwargs.setdefault("request_lifetime", 30)
    return ReservationMutex(api, rid, **kwargs)


def lock_history(emu, rid):
    return [
        (e["op"], e["attributes"].get(protocol.ATTR_OWNER))
        for e in emu.control.events(rid)
        if e["alias"] == MUTEX
    ]


def wait_until(condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_late_remove_never_deletes_the_next_holders_lock(emu):
    """Scenario 1 with the real client: the holder's remove is reset and lands later. The release must
    wait for it (reads only): the waiter gets the lock only after it landed, and keeps it."""
    rid = emu.create_reservation()
    holder = mutex(emu.session(), rid, owner="holder")
    holder.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    wait_until(lambda: emu.control.call_counts().get("RemoveServicesFromReservation"))
    time.sleep(0.3)
    assert releasing.is_alive()  # it waits for its remove to land and sends no second one
    waiter = mutex(emu.session(), rid, owner="waiter")
    assert waiter.acquire(blocking=False) is False
    # The holder marks the lock as releasing: a waiter that times out meanwhile says why it waited.
    marker = protocol.releasing_alias(MUTEX)
    wait_until(lambda: any(e["alias"] == marker for e in emu.control.events(rid)))
    with pytest.raises(MutexTimeout, match="the holder is releasing it: its remove got no answer"):
        mutex(emu.session(), rid, owner="impatient").acquire(timeout=1)
    assert emu.control.land_late() == 1
    releasing.join(15)
    assert not holder.locked()
    with waiter:
        token = waiter.token
        assert waiter.holder().token == token
    # The holder's remove (landed late, never sent again), its marker's and the waiter's; tickets aside.
    removed = [
        e["alias"]
        for e in emu.control.events(rid)
        if e["op"] == "service_removed" and "~q~" not in e["alias"]
    ]
    assert removed == [MUTEX, marker, MUTEX]
    tickets = [e for e in emu.control.events(rid) if "~q~" in e["alias"]]
    assert emu.control.call_counts()["RemoveServicesFromReservation"] == 3 + len(tickets) // 2
    assert lock_history(emu, rid)[-2:] == [("service_added", token), ("service_removed", token)]


@pytest.mark.client_resend
@pytest.mark.parametrize("fair", [True, False])
def test_a_waiter_whose_own_add_may_still_land_names_the_holders_stalled_release_in_its_timeout(emu, fair):
    """The holder's remove got no answer (it lands later), so its release waits and marks the lock. A waiter
    whose own add got no answer too (it also lands later) times out meanwhile: its message says both that
    its add may still land and why the lock stayed held, not only the first."""
    rid = emu.create_reservation()
    holder = mutex(emu.session(), rid, owner="holder")
    holder.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    marker = protocol.releasing_alias(MUTEX)
    wait_until(lambda: any(e["alias"] == marker for e in emu.control.events(rid)))
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reset_after=0.05)
    waiter = mutex(emu.session(), rid, owner="impatient", fair=fair)
    with pytest.raises(MutexTimeout) as timeout:
        waiter.acquire(timeout=3)
    message = str(timeout.value)
    assert "an add of this acquisition got no answer and may still be applied" in message
    assert "held by holder" in message and "the holder is releasing it: its remove got no answer" in message
    assert timeout.value.maybe_held
    assert emu.control.land_late() == 2  # the holder's remove, then the waiter's add on the free alias
    releasing.join(15)
    assert not holder.locked()
    assert waiter.runtime.late_adds.settle(15)  # the waiter's watcher removes its late add
    assert emu.control.reservation(rid)["services"] == []


@pytest.mark.client_resend
def test_a_waiter_in_line_whose_add_lands_late_takes_the_lock_it_holds(emu):
    """The waiter's add is reset and lands later, while it waits in line behind a live head (the client's
    re-send found the lock busy). Landing on the free lock, it makes the waiter the holder: the waiter must
    see its own token in its reads in line and take the lock, not wait on behind the head (whose adds now
    fail on the waiter's lock) until its timeout, the lock held by nobody who knows it."""
    rid = emu.create_reservation()
    holder = mutex(emu.session(), rid, owner="holder")
    holder.acquire()
    # A live head of the queue: its heartbeat moves, so the waiter never passes it (and its adds, had it
    # any, would only find the lock busy).
    head = protocol.ticket_alias(MUTEX, 0)
    api = emu.session()
    api.AddServiceToReservation(
        rid,
        protocol.SERVICE_MODEL,
        head,
        [AttributeNameValue(protocol.ATTR_OWNER, ticket_value(HEAD, 120, 0))],
    )
    beating = threading.Event()

    def beat() -> None:
        count = 0
        while not beating.wait(0.2):
            count += 1
            value = ticket_value(HEAD, 120, count)
            api.SetServiceAttributesValues(rid, head, [AttributeNameValue(protocol.ATTR_OWNER, value)])

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reset_after=0.05)
        waiter = mutex(emu.session(), rid, owner="waiter", timeout=20)
        outcome = {}
        waiting = threading.Thread(target=lambda: outcome.setdefault("acquired", waiter.acquire()))
        waiting.start()
        wait_until(lambda: sum("~q~" in s["alias"] for s in emu.control.reservation(rid)["services"]) == 2)
        holder.release()
        assert emu.control.land_late() == 1  # the waiter's first add, on the free lock
        waiting.join(30)
        assert outcome.get("acquired") is True and waiter.locked()  # not a MutexTimeout with the lock ours
        assert waiter.holder().token == waiter.token
        waiter.release()
    finally:
        beating.set()
        beater.join(5)
    api.RemoveServicesFromReservation(rid, [head])
    waiter.runtime.late_adds.settle(15)
    assert emu.control.reservation(rid)["services"] == []


def test_holds_stretched_by_releases_waiting_for_late_removes_are_no_samples_of_the_hold_time(emu):
    """Quick holds, and every other release's remove reset and landed 3 s later (the lock stays held and
    marked as releasing meanwhile). Those 3 s are a fault's, not a hold: the process's estimate of how long
    holders hold, which times its waiters' sleeps in line, stays the quick holds' (after two such releases
    it had become a minute in a chaos run, and a waiter slept through its turn for 30 s)."""
    rid = emu.create_reservation()
    api = emu.session()
    lock = mutex(api, rid, owner="holder")
    marker = protocol.releasing_alias(MUTEX)
    for number in range(6):
        lock.acquire()
        if number % 2 == 0:
            lock.release()
            continue
        emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
        marked = sum(e["alias"] == marker for e in emu.control.events(rid))
        releasing = threading.Thread(target=lock.release)
        releasing.start()
        wait_until(lambda marked=marked: sum(e["alias"] == marker for e in emu.control.events(rid)) > marked)
        time.sleep(3.0)  # the release reads meanwhile: our token, with the marker
        assert emu.control.land_late() == 1
        releasing.join(15)
        assert not lock.locked()
    memory = queue_values.memory_for(api, rid, MUTEX)
    assert memory.tenure_samples and memory.hold_estimate() < 1.0, list(memory.tenure_samples)


def test_a_release_whose_marker_is_still_an_earlier_releases_names_itself_in_it(emu):
    """A release's marker is left behind: its remove was reset and never lands, and it may land for the
    request lifetime, so nothing removes it before then. The same holder's next release waits for its own
    late remove: its marker's add finds the alias taken, and the marker must name this release all the same,
    or waiters ignore it (a marker of another token) and time out without saying why."""
    rid = emu.create_reservation()
    holder = mutex(emu.session(), rid, owner="holder")
    marker = protocol.releasing_alias(MUTEX)
    holder.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    wait_until(lambda: any(e["alias"] == marker for e in emu.control.events(rid)))
    emu.control.inject_fault("RemoveServicesFromReservation", "reset_before_commit")  # the marker's remove
    assert emu.control.land_late() == 1
    releasing.join(15)
    first = next(s for s in emu.control.reservation(rid)["services"] if s["alias"] == marker)
    assert first["attributes"][protocol.ATTR_OWNER] != holder.token  # the first release's, left behind
    holder.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    wait_until(lambda: emu.control.call_counts().get("RemoveServicesFromReservation", 0) >= 3)
    with pytest.raises(MutexTimeout, match="the holder is releasing it: its remove got no answer"):
        mutex(emu.session(), rid, owner="impatient").acquire(timeout=3)
    assert emu.control.land_late() == 1
    releasing.join(15)
    assert not holder.locked()
    assert emu.control.reservation(rid)["services"] == []  # this release took its marker away


def test_a_late_remove_of_the_lock_and_its_ticket_is_waited_for_and_takes_nobody_elses(emu):
    """A holder that waited in line removes its ticket with the lock, in one call. That call is reset and
    lands later: the release waits for it (no second remove), the next waiter gets the lock only after it
    landed, and that waiter's ticket (queued meanwhile) is never touched by the holder."""
    rid = emu.create_reservation()
    first = mutex(emu.session(), rid, owner="first")
    first.acquire()
    holder = mutex(emu.session(), rid, owner="holder", timeout=30)
    granted = threading.Thread(target=holder.acquire)
    granted.start()
    wait_until(lambda: any("~q~" in e["alias"] for e in emu.control.events(rid)))  # it waits in line
    first.release()
    granted.join(15)
    assert holder.locked()
    ticket = next(s["alias"] for s in emu.control.reservation(rid)["services"] if "~q~" in s["alias"])
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    wait_until(lambda: emu.control.call_counts().get("RemoveServicesFromReservation", 0) >= 2)
    waiter = mutex(emu.session(), rid, owner="waiter", timeout=30)
    waiting = threading.Thread(target=waiter.acquire)
    waiting.start()
    wait_until(lambda: sum("~q~" in s["alias"] for s in emu.control.reservation(rid)["services"]) == 2)
    time.sleep(0.3)
    assert releasing.is_alive() and waiting.is_alive() and not waiter.locked()
    assert emu.control.land_late() == 1
    releasing.join(15)
    waiting.join(15)
    assert not holder.locked() and waiter.locked()
    removed = [e["alias"] for e in emu.control.events(rid) if e["op"] == "service_removed"]
    assert removed.count(ticket) == 1  # with the lock, in the call that landed late
    # The waiter's own ticket (a higher number: it joined while the holder's was there) stays with it.
    left = [s["alias"] for s in emu.control.reservation(rid)["services"] if "~q~" in s["alias"]]
    assert len(left) == 1 and left[0] != ticket
    token = waiter.token
    waiter.release()
    first.runtime.late_adds.settle(5)
    assert emu.control.reservation(rid)["services"] == []
    assert lock_history(emu, rid)[-2:] == [("service_added", token), ("service_removed", token)]


@pytest.mark.client_resend
def test_a_late_add_after_release_is_removed_and_blocks_nobody(emu):
    """Scenario 4: the first copy of the add is reset and lands after the lock was released (the
    client's own re-send acquired it). The late add re-creates MUTEX with our token; it is removed."""
    rid = emu.create_reservation()
    late = LateAdds(background=True)  # this test's own watcher: other tests' entries are not its business
    lock = mutex(emu.session(), rid, owner="late", runtime=Runtime(late_adds=late))
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reset_after=0.05)
    with lock:  # the client re-sends the add 1 s later; that copy grants the lock
        token = lock.token
    assert emu.control.land_late() == 1  # now the first copy lands, on a free alias
    # The watcher sweeps every second in the background: it may have removed it already.
    assert lock_history(emu, rid)[2] == ("service_added", token)
    assert late.settle(15)  # the watcher finds it and removes it
    assert lock_history(emu, rid)[-1] == ("service_removed", token)
    other = mutex(emu.session(), rid, owner="next")
    assert other.acquire(timeout=5)
    other.release()


@pytest.mark.client_timeout
def test_a_client_timeout_on_the_remove_is_a_request_that_may_land(emu):
    """CloudShellAPISession(timeout=1): the remove hangs past the client's timeout, then lands."""
    rid = emu.create_reservation()
    api = CloudShellAPISession(
        emu.host, emu.admin_user, emu.admin_password, emu.admin_domain, port=emu.port, timeout=1
    )
    holder = mutex(api, rid, owner="timeout=1")
    holder.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reply="hang")
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    time.sleep(1.8)  # past the client's timeout: the release now polls
    assert releasing.is_alive()
    emu.control.land_late()
    releasing.join(15)
    assert not holder.locked()
    assert [op for op, _ in lock_history(emu, rid)] == ["service_added", "service_removed"]


CHILD = textwrap.dedent(
    """
    import faulthandler, sys, time
    faulthandler.dump_traceback_later(45, exit=True)  # never hang the test run: say where it stuck
    from cloudshell.api.cloudshell_api import CloudShellAPISession
    from cloudshell_mutex import ReservationMutex
    host, port, user, password, domain, rid, stay = sys.argv[1:]
    api = CloudShellAPISession(host, user, password, domain, port=int(port))
    from cloudshell_mutex.lock.server import catalog
    catalog.learn(api, "Mutex Service", catalog.OWNER_ONLY)  # the fault is for the lock's add
    lock = ReservationMutex(api, rid, owner="interrupted", request_lifetime=30)
    print("ready", flush=True)
    try:
        lock.acquire(timeout=60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    if stay == "stay":
        line = sys.stdin.readline()  # the parent lets the add land meanwhile
        from cloudshell_mutex.lock.server.late_adds import process_late_adds
        print("settled" if process_late_adds().settle(15) else "unsettled", flush=True)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
@pytest.mark.parametrize("stay", ["stay", "exit"])
def test_ctrl_c_while_the_add_is_at_the_server(emu, stay):
    """Scenario 5: Ctrl-C before the add's reply; the undo reads nothing yet; then the add lands. A
    process that lives on removes it; one that exits says, once, exactly how to remove it."""
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reply="hang")
    args = [emu.host, str(emu.port), emu.admin_user, emu.admin_password, emu.admin_domain, rid, stay]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        wait_until(lambda: emu.control.call_counts().get("AddServiceToReservation"))
        time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        said = child.stdout.readline().strip()
        if said != "interrupted":  # the child died or was stopped by its watchdog: show why
            child.kill()
            pytest.fail(f"the child said {said!r}, not 'interrupted'; its stderr:\n{child.stderr.read()}")
        emu.control.land_late()
        token = lock_history(emu, rid)[-1][1]
        assert token.startswith("interrupted@")
        if stay == "stay":
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "settled"
            assert lock_history(emu, rid)[-1] == ("service_removed", token)
        _, stderr = child.communicate(timeout=30)
    finally:
        child.kill()
    if stay == "exit":
        warnings = [line for line in stderr.splitlines() if "RemoveServicesFromReservation" in line]
        assert len(warnings) == 1
        assert rid in warnings[0] and repr(MUTEX) in warnings[0]
        assert emu.admin_password not in stderr
