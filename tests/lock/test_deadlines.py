"""Every wait ends by the caller's deadline and says what it waited for, against the emulator.

A read lock facing a crashed closer's ``MUTEX~c`` (a service whose process died, with a long lease), and a
cohort whose state file is locked by a process stopped inside it (SIGSTOP, as a debugger or a swapped-out VM
would stop it): before, the first waited up to ``2 x lease + 10 s`` whatever its timeout, and the second until
the stopped process resumed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from test_lease_processes import our_package

from cloudshell_mutex import MutexTimeout, ReservationRWLock, protocol
from cloudshell_mutex.lock.cohort import cohort
from cloudshell_mutex.lock.cohort import files as cohort_files
from cloudshell_mutex.lock.holder import make_token
from cloudshell_mutex.lock.lease import lease
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.rw.readlock import RELEASE_CLOSE_WAIT
from cloudshell_mutex.lock.server import catalog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MUTEX = protocol.DEFAULT_ALIAS
CLOSER = protocol.closer_alias(MUTEX)
FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=0.25)
#: A crashed party's lease: far longer than any wait here, so nothing is broken meanwhile.
DEAD_LEASE = 60
#: What a wait may overrun its deadline by: a poll and a few loopback calls on a busy 2-core machine.
SLACK = 2.0


@pytest.fixture
def emu(cloudshell_emulator_factory):
    return cloudshell_emulator_factory(packages=[our_package()])


def leave_behind(emu, rid: str, alias: str, token: str) -> None:
    """A lock service as a process that died holding it left it: its token, a lease, one heartbeat."""
    nonce = lease.nonce_of(token.replace(protocol.READ_GROUP_MARK, "")) or "0"
    emu.session().AddServiceToReservation(
        rid,
        protocol.SERVICE_MODEL,
        alias,
        [
            AttributeNameValue(protocol.ATTR_OWNER, token),
            AttributeNameValue(protocol.ATTR_LEASE_SECONDS, str(DEAD_LEASE)),
            AttributeNameValue(protocol.ATTR_HEARTBEAT, lease.heartbeat_value(nonce, "dead", 0)),
        ],
    )


def aliases(emu, rid: str):
    return sorted(
        s.Alias for s in emu.session().GetReservationDetails(rid, True).ReservationDescription.Services
    )


def test_a_read_lock_facing_a_crashed_closer_times_out_by_its_deadline_and_names_the_closer(emu):
    rid = emu.create_reservation("deadlines")
    leave_behind(emu, rid, MUTEX, protocol.READ_GROUP_MARK + make_token("dead reader"))
    leave_behind(emu, rid, CLOSER, make_token("dead closer"))
    rw = ReservationRWLock(emu.session(), rid, owner="reader", **FAST)
    started = time.monotonic()
    with pytest.raises(MutexTimeout) as raised:
        rw.read().acquire(timeout=3)
    waited = time.monotonic() - started
    assert waited < 3 + SLACK, f"read(timeout=3) waited {waited:.1f} s"
    assert CLOSER in str(raised.value) and "dead closer" in str(raised.value), str(raised.value)
    assert aliases(emu, rid) == [MUTEX, CLOSER]  # nothing of this reader left behind


def test_a_readers_release_facing_a_crashed_closer_returns_and_leaves_the_group_to_it(emu):
    rid = emu.create_reservation("deadlines")
    leave_behind(emu, rid, CLOSER, make_token("dead closer"))
    rw = ReservationRWLock(emu.session(), rid, owner="reader", **FAST)
    with rw.read():  # MUTEX is free: this reader opens a group
        pass
        started = time.monotonic()
    waited = time.monotonic() - started
    assert waited < RELEASE_CLOSE_WAIT + SLACK, f"the release waited {waited:.1f} s for {CLOSER}"
    # The group is left to the closer at work, the next closer or a writer's lease break (docs/protocol.md).
    assert aliases(emu, rid) == [MUTEX, CLOSER]


def hold_state_lock(path: str, ready) -> None:
    """Hold the cohort's state-file lock, say so, and sleep in it (the test stops this process)."""
    lock = cohort_files.new_file_lock(Path(path))
    lock.acquire()
    ready.set()
    time.sleep(600)


class StoppedInside:
    """A process that takes a cohort's state-file lock and is stopped (SIGSTOP) inside it."""

    def __init__(self, path: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready = ctx.Event()
        self.process = ctx.Process(target=hold_state_lock, args=(str(path), self.ready), daemon=True)

    def stop_inside(self) -> None:
        self.process.start()
        assert self.ready.wait(60)
        os.kill(self.process.pid, signal.SIGSTOP)

    def end(self) -> None:
        """Resume it and kill it: the OS frees its lock."""
        if self.process.pid is not None and self.process.is_alive():
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.join(10)


@pytest.fixture
def state_holder(emu, tmp_path):
    """(reservation, cohort folder, StoppedInside on that reservation's MUTEX cohort)."""
    rid = emu.create_reservation("deadlines")
    key = cohort_files.cohort_key(catalog.server_key(emu.session()), rid, MUTEX)
    holder = StoppedInside(tmp_path / f"{key}.state.lock")
    yield rid, tmp_path, holder
    holder.end()


def test_a_cohort_acquire_ends_by_its_deadline_while_a_stopped_process_holds_the_state_file(
    emu, state_holder
):
    rid, folder, holder = state_holder
    holder.stop_inside()
    lock = cohort.CohortMutex(emu.session(), rid, owner="waiter", cohort_dir=folder, lease=2, **FAST)
    started = time.monotonic()
    with pytest.raises(MutexTimeout) as raised:
        lock.acquire(timeout=2)
    waited = time.monotonic() - started
    assert waited < 2 + SLACK, f"acquire(timeout=2) waited {waited:.1f} s"
    assert "state file" in str(raised.value), str(raised.value)
    assert aliases(emu, rid) == [] and not lock.locked()


def test_a_cohort_release_goes_on_without_the_state_while_a_stopped_process_holds_its_file(emu, state_holder):
    rid, folder, holder = state_holder
    lock = cohort.CohortMutex(emu.session(), rid, owner="holder", cohort_dir=folder, lease=2, **FAST)
    lock.acquire(timeout=10)
    released_token = lock.token
    holder.stop_inside()
    started = time.monotonic()
    lock.release()
    waited = time.monotonic() - started
    assert waited < cohort_files.STATE_WAIT + SLACK, f"release waited {waited:.1f} s"
    assert aliases(emu, rid) == []  # released to the server all the same
    holder.end()
    # The state still names the released token (it could not be cleared): the next holder on this machine
    # takes the lock from the server, never over.
    assert lock.local_state().token == released_token
    following = cohort.CohortMutex(emu.session(), rid, owner="next", cohort_dir=folder, lease=2, **FAST)
    with following:
        assert not following.passed and following.token != released_token
        assert aliases(emu, rid) == [MUTEX]


def hold_state_lock_on_cue(path: str, go, ready) -> None:
    """Wait for ``go``, then hold the cohort's state-file lock, say so, and sleep in it (then stopped)."""
    lock = cohort_files.new_file_lock(Path(path))
    go.wait(60)
    lock.acquire()
    ready.set()
    time.sleep(600)


def die_holding(addr, rid: str, folder: str, events) -> None:
    """Take the cohort lock with a long lease, say so, and wait to be killed holding it."""
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    host, port, user, password, domain = addr
    api = CloudShellAPISession(host, user, password, domain, port=port)
    lock = cohort.CohortMutex(api, rid, owner="dies holding", cohort_dir=folder, lease=DEAD_LEASE, **FAST)
    lock.acquire(timeout=30)
    events.put(lock.token)
    time.sleep(600)


def test_a_cohort_acquire_that_verifies_a_dead_holders_lock_ends_by_its_deadline_while_the_state_is_stuck(
    emu, tmp_path
):
    """The successor of a local holder that died checks the cohort's lock with one read, then records the
    check in the state file. A process stopped inside the state-file lock meanwhile (it took it while the
    read was on the wire) must not hold the acquire past its deadline: before, it waited STATE_WAIT (5 s)."""
    rid = emu.create_reservation("deadlines")
    key = cohort_files.cohort_key(catalog.server_key(emu.session()), rid, MUTEX)
    ctx = multiprocessing.get_context("spawn")
    go, ready, events = ctx.Event(), ctx.Event(), ctx.Queue()
    addr = (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)
    victim = ctx.Process(target=die_holding, args=(addr, rid, str(tmp_path), events), daemon=True)
    stuck = ctx.Process(
        target=hold_state_lock_on_cue, args=(str(tmp_path / f"{key}.state.lock"), go, ready), daemon=True
    )
    victim.start()
    stuck.start()
    try:
        token = events.get(timeout=60)
        victim.kill()  # dies holding: its successor here verifies the lock with one read
        victim.join(10)
        emu.control.inject_fault("GetReservationDetails", "spike", seconds=2.0)

        def stop_inside_during_the_read() -> None:
            while not emu.control.faults_injected():
                time.sleep(0.01)
            go.set()
            assert ready.wait(30)
            os.kill(stuck.pid, signal.SIGSTOP)

        import threading

        staller = threading.Thread(target=stop_inside_during_the_read, daemon=True)
        staller.start()
        lock = cohort.CohortMutex(emu.session(), rid, owner="successor", cohort_dir=tmp_path, **FAST)
        started = time.monotonic()
        try:
            acquired = lock.acquire(timeout=3)
        except MutexTimeout:
            acquired = False
        waited = time.monotonic() - started
        staller.join(10)
        assert ready.is_set(), "the stuck process never took the state-file lock"
        if acquired:
            assert lock.token == token and lock.passed  # carried on under the dead holder's lock
            lock.release()
        assert waited < 3 + SLACK, f"acquire(timeout=3) took {waited:.1f} s"
    finally:
        if stuck.is_alive():
            os.kill(stuck.pid, signal.SIGCONT)
            stuck.kill()
        stuck.join(10)
        if victim.is_alive():
            victim.kill()
