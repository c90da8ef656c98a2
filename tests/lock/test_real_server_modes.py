"""The lock on an emulator that behaves like a real server where the two may differ (roadmap step 6).

Reworded errors (only "Service with given alias already exists" is a documented text), a catalog that
hides the model, ended sandboxes that still answer reads, models without Mutex Owner, a server that grants
an alias twice, fresh reads that lag behind the commits, transient ``Success="false"`` answers and hangs.
"""

from __future__ import annotations

import time

import pytest

from cloudshell_mutex import MutexLostError, MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.errors import MutexNotInstalled, ReservationNotActive
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.server import catalog
from cloudshell_mutex.lock.server.late_adds import LateAdds

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
MUTEX = protocol.DEFAULT_ALIAS


def mutex(api, rid, **kwargs) -> ReservationMutex:
    kwargs.setdefault("pacing", FAST)
    return ReservationMutex(api, rid, **kwargs)


def owner(emu, rid):
    for service in emu.control.reservation(rid)["services"]:
        if service["alias"] == MUTEX:
            return service["attributes"].get(protocol.ATTR_OWNER)
    return None


@pytest.fixture
def worded(cloudshell_emulator_factory, original_package_zip):
    """The original package, a strict catalog (the default), and every guessed error text reworded."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip], reword_errors=True)
    assert emu.control.settings()["catalog"] == "strict"
    return emu


# ---------------------------------------------------------------- decisions that do not rest on wording


def test_with_reworded_errors_and_a_hidden_model_the_lock_still_works(worded):
    rid = worded.create_reservation()
    api = worded.session()
    assert api.GetServices("", protocol.SERVICE_MODEL).Services == []  # the catalog hides the model
    first, second = mutex(api, rid, owner="first"), mutex(worded.session(), rid, owner="second")
    with first:  # the model's attributes are learned from the add itself
        assert owner(worded, rid) == first.token
        assert second.acquire(blocking=False) is False  # contention: the one documented text
    with second:
        pass


def test_with_reworded_errors_reservation_problems_come_from_the_status_read(worded):
    api = worded.session()
    with pytest.raises(ReservationNotActive, match="was not found"):
        mutex(api, "00000000-0000-4000-8000-000000000000", timeout=5).acquire()
    rid = worded.create_reservation()
    held = mutex(api, rid)
    held.acquire()
    api.EndReservation(rid)
    held.release()  # the sandbox ended: the lock went with it, quietly
    assert not held.locked()
    with pytest.raises(ReservationNotActive, match="has ended"):
        mutex(api, rid, timeout=5).acquire()


def test_with_reworded_errors_a_missing_model_is_still_named(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory(reword_errors=True)
    with pytest.raises(MutexNotInstalled, match="is not installed"):
        mutex(emu.session(), emu.create_reservation(), timeout=5).acquire()


@pytest.mark.parametrize("reword", [False, True])
def test_a_model_without_mutex_owner_fails_at_once_and_leaves_nothing(
    cloudshell_emulator_factory, original_package_no_attributes_zip, reword
):
    """The original repository's current source builds a Mutex Service without attributes."""
    emu = cloudshell_emulator_factory(packages=[original_package_no_attributes_zip], reword_errors=reword)
    rid = emu.create_reservation()
    with pytest.raises(MutexNotInstalled, match=r"has no 'Mutex Owner' attribute.*safe") as raised:
        mutex(emu.session(), rid, timeout=60).acquire()
    assert "Mutex_Package.zip" in str(raised.value)
    assert owner(emu, rid) is None and emu.control.reservation(rid)["services"] == []


# ---------------------------------------------------------------- a server that grants twice


def test_double_grant_is_caught_by_verify_and_otherwise_found_at_release(
    cloudshell_emulator_factory, original_package_zip
):
    """The original v2's reason to read the owner back. Without verify the lock believes the grant and
    only its release finds out (MutexLostError); with verify it does not take the lock."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    holder = mutex(emu.session(), rid, owner="holder")
    holder.acquire()
    trusting = mutex(emu.session(), rid, owner="trusting")
    catalog.learn(trusting.api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    emu.control.inject_fault("AddServiceToReservation", "double_grant")
    assert trusting.acquire(timeout=5)  # the server said yes: two holders now
    with pytest.raises(MutexLostError):
        trusting.release()
    verifying = mutex(emu.session(), rid, owner="verifying", verify=True)
    catalog.learn(verifying.api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    emu.control.inject_fault("AddServiceToReservation", "double_grant")
    with pytest.raises(MutexTimeout):
        verifying.acquire(timeout=1)
    holder.release()
    assert owner(emu, rid) is None


# ---------------------------------------------------------------- fresh reads that lag


def test_a_lagging_read_at_release_is_asked_again_rather_than_reported_lost(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    lock = mutex(emu.session(), rid)
    lock.acquire()
    emu.control.inject_fault("GetReservationDetails", "stale_fresh_read", ms=5000)  # shows it free
    lock.release()  # not MutexLostError, and nothing left behind
    assert owner(emu, rid) is None


def test_a_lagging_read_after_an_unsure_add_never_raises_while_the_add_is_in_place(
    cloudshell_emulator_factory, original_package_zip
):
    """The add commits and its reply is lost; every read for a while shows the past. The lock must not
    leave its add behind: it either holds, or hands the add to the watcher, which removes it."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    api = emu.session(max_attempts=1)  # no client re-send: the lock sees the dropped reply itself
    late = LateAdds()
    lock = mutex(api, rid, runtime=Runtime(late_adds=late), timeout=0.5)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    emu.control.inject_fault("AddServiceToReservation", "drop_after_commit")
    emu.control.inject_fault("GetReservationDetails", "stale_fresh_read", count=20, ms=5000)
    try:
        acquired = lock.acquire()
    except MutexTimeout:
        acquired = False
    if acquired:
        lock.release()
    else:
        assert late.settle(10)
    assert owner(emu, rid) is None


# ---------------------------------------------------------------- other troubles of a real server


def test_a_transient_success_false_is_retried(cloudshell_emulator_factory, original_package_zip):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "transient_false", count=2)
    with mutex(emu.session(), rid, timeout=10) as lock:
        assert owner(emu, rid) == lock.token


@pytest.mark.client_timeout
def test_a_hang_that_commits_is_a_request_that_may_land(cloudshell_emulator_factory, original_package_zip):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    api = emu.session(timeout=1)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    emu.control.inject_fault("AddServiceToReservation", "hang", commit=True)
    started = time.monotonic()
    with mutex(api, rid, timeout=30) as lock:
        assert owner(emu, rid) == lock.token
    assert time.monotonic() - started < 30
