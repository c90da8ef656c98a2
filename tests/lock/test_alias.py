"""LockAlias, the primitive under every lock, against the emulator with the real client.

``TryOnceLock`` is a second, deliberately different user of the primitive (one add, no waiting): it
shares the calls with ReservationMutex without copying anything from it, and excludes it.
"""

from __future__ import annotations

from typing import Optional

import pytest

from cloudshell_mutex import ReservationMutex
from cloudshell_mutex.lock.holder import make_token
from cloudshell_mutex.lock.server.alias import LockAlias, Status

pytestmark = pytest.mark.integration


class TryOnceLock:
    """A test-only lock: one add; held on success, busy otherwise; release reads, then removes once."""

    def __init__(self, api, reservation_id: str, alias: str = "MUTEX") -> None:
        self.alias = LockAlias(api, reservation_id, alias)
        self.token: Optional[str] = None

    def try_lock(self) -> bool:
        token = make_token("try-once")
        result = self.alias.add_owner(token, "try-once")
        if result.ok:
            self.token = token
        return result.ok

    def unlock(self) -> bool:
        read = self.alias.read()
        if not read.ok or read.holder is None or read.holder.token != self.token:
            return False
        self.token = None
        return self.alias.remove_once().ok


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


def test_try_once_lock_and_reservation_mutex_exclude_each_other(emu):
    rid = emu.create_reservation()
    first, second = TryOnceLock(emu.session(), rid), TryOnceLock(emu.session(), rid)
    assert first.try_lock() and not second.try_lock()
    mutex = ReservationMutex(emu.session(), rid, owner="mutex")
    assert mutex.acquire(blocking=False) is False
    assert mutex.holder().token == first.token
    assert first.unlock()
    with mutex:
        assert not second.try_lock()
    assert second.try_lock() and second.unlock()


def test_the_primitive_reports_what_each_call_came_to(emu):
    rid = emu.create_reservation()
    alias = LockAlias(emu.session(), rid, "CONFIG")
    assert alias.read().ok and alias.read().holder is None
    assert alias.add_owner("t1", "x").status is Status.DONE  # the original model: 2 adds, then learned
    busy = alias.add_owner("t1", "x")
    assert busy.status is Status.BUSY and busy.failure.code == "100" and not busy.may_land_later
    assert alias.read().holder.token == "t1"
    assert alias.remove_once().status is Status.DONE
    assert alias.remove_once().status is Status.MISSING
    assert alias.reservation_state() == "active"
    assert alias.calls == 9  # every call counted: 2 reads, 3 adds, read, 2 removes, state
    emu.control.inject_fault("RemoveServicesFromReservation", "drop_after_commit")
    assert alias.add_owner("t2", "x").ok
    dropped = alias.remove_once()
    assert dropped.status is Status.TRANSIENT and dropped.may_land_later
    assert emu.control.call_counts()["RemoveServicesFromReservation"] == 3  # sent once: no client re-send
    api = emu.session()
    api.EndReservation(rid)
    assert LockAlias(api, rid).reservation_state() == "ended"
