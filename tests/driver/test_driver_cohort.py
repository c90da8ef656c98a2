"""The driver mixin in cohort mode: on by default, off by class or call, and passing between commands."""

from __future__ import annotations

import threading

import pytest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface
from driver_support import context_for

from cloudshell_mutex import MutexUsageError, ReservationMutex
from cloudshell_mutex.driver import ReservationMutexMixin
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


class Driver(ResourceDriverInterface, ReservationMutexMixin):
    """A driver as a shell author writes it."""

    def initialize(self, context):
        pass

    def cleanup(self):
        self.close_reservation_mutex_sessions()


class PlainDriver(Driver):
    reservation_mutex_cohort = False


def test_the_mixin_makes_a_cohort_lock_unless_told_not_to(emu, tmp_path):
    rid = emu.create_reservation("driver cohort")
    context = context_for(emu, rid)
    lock = Driver().reservation_mutex(context, cohort_dir=tmp_path)
    assert isinstance(lock, CohortMutex) and lock.cohort_dir == tmp_path
    plain = (Driver().reservation_mutex(context, cohort=False), PlainDriver().reservation_mutex(context))
    for lock_object in plain:
        assert isinstance(lock_object, ReservationMutex) and not isinstance(lock_object, CohortMutex)
    with lock, pytest.raises(MutexUsageError, match="cohort=False"):
        lock.export()


def test_two_commands_of_one_execution_server_pass_the_lock_without_a_server_call(emu, tmp_path):
    rid = emu.create_reservation("driver cohort")
    driver = Driver()
    first = driver.reservation_mutex(context_for(emu, rid, "Port 1"), cohort_dir=tmp_path, pacing=FAST)
    second = driver.reservation_mutex(context_for(emu, rid, "Port 2"), cohort_dir=tmp_path, pacing=FAST)
    first.acquire()
    token = first.token
    waiting = threading.Thread(target=second.acquire)  # a second command, waiting on the local lock
    waiting.start()
    for _ in range(3000):  # until it registered as a local waiter (30 s at most)
        if first.local_state().waiters:
            break
        waiting.join(0.01)
    emu.control.reset_counts()
    first.release()
    waiting.join(30)
    assert second.locked() and second.passed and second.token == token
    assert emu.control.call_counts() == {}  # the pass made no server call
    second.release()
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == []
