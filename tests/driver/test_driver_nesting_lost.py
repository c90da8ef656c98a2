"""A nested acquire is served only by a hold that one fresh read shows alive.

The command's lock is removed on the server (the admin's Force Release, or another session's remove) and, in
the worst case, taken by someone else; a helper of the command then takes the lock again. It must fail with
MutexLostError (not run unprotected, not acquire afresh), add nothing, and tell the sandbox output once; the
command's own release then raises too and removes nothing. The normal nested case costs exactly one read.
Real client, against the emulator, with the original package (no lease) and ours (leased).
"""

from __future__ import annotations

import pytest
from driver_support import context_for
from test_driver_nesting import Driver

from cloudshell_mutex import MutexError, MutexLostError, ReservationMutex
from cloudshell_mutex.lock.admin.admin import force_release
from cloudshell_mutex.lock.server.alias import LockAlias

pytestmark = pytest.mark.integration

LOST_LINE = "lost the MUTEX lock it held"


@pytest.fixture(params=["original package", "our package"])
def any_emu(
    request, cloudshell_emulator_factory, original_package_zip, our_package_zip, tmp_path, monkeypatch
):
    """An emulator with the original package (holds without a lease) or ours (leased holds)."""
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    package = original_package_zip if request.param == "original package" else our_package_zip
    return cloudshell_emulator_factory(packages=[package])


def mutex_events(emu, rid, op):
    return [e for e in emu.control.events(rid) if e["op"] == op and e["alias"] == "MUTEX"]


def lost_lines(emu, rid):
    return [line for line in emu.control.output(rid) if LOST_LINE in line]


def remove_behind_its_back(emu, rid, how):
    """Take the command's lock away: the admin's Force Release, or another session's plain remove."""
    api = emu.session()
    if how == "force release":
        report = force_release(LockAlias(api, rid, "MUTEX"), "admin (test)", "stuck, says the test")
        assert report.outcome.name == "RELEASED", report
    else:
        api.RemoveServicesFromReservation(rid, ["MUTEX"])


@pytest.mark.parametrize("how", ["force release", "remove by another session"])
@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_a_nested_acquire_after_the_hold_was_removed_fails_adds_nothing_and_the_release_removes_nothing(
    any_emu, tmp_path, cohort, how
):
    emu = any_emu
    rid = emu.create_reservation("lost")
    driver = Driver(tmp_path / "cohort", cohort)
    context = context_for(emu, rid)
    outer = driver.reservation_mutex(context, command="reconfigure", timeout=5, **driver.options)
    outer.acquire()
    remove_behind_its_back(emu, rid, how)
    other = ReservationMutex(emu.session(), rid, owner="Other party", timeout=5)
    other.acquire()  # the lock is someone else's now
    adds_before = len(mutex_events(emu, rid, "service_added"))

    with pytest.raises(MutexLostError) as nested:
        driver.apply_settings(context)  # the helper takes the command's lock again
    message = str(nested.value)
    assert "nested acquire of 'MUTEX'" in message and "not served" in message and "Other party" in message
    assert driver.seen == []  # its block never ran
    assert len(mutex_events(emu, rid, "service_added")) == adds_before  # no fresh acquire either
    assert len(lost_lines(emu, rid)) == 1  # the people watching the sandbox are told, once

    with pytest.raises(MutexLostError):
        driver.apply_settings(context)  # known lost now: refused again, without a read
    with pytest.raises(MutexLostError):
        outer.release()
    assert not outer.locked()
    removed = mutex_events(emu, rid, "service_removed")
    assert len(removed) == 1  # only the removal behind its back: the other party's lock stays
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == ["MUTEX"]
    assert other.holder().token == other.token
    assert len(lost_lines(emu, rid)) == 1
    other.release()


def test_a_hold_found_lost_is_never_removed_blindly_even_when_its_release_would_skip_the_read(emu, tmp_path):
    """release_check_after lets a release remove without reading when ownership was confirmed a moment ago:
    a hold a nested acquire found lost must still remove nothing (the successor's lock)."""
    rid = emu.create_reservation("lost")
    driver = Driver(tmp_path / "cohort", cohort=False)
    context = context_for(emu, rid)
    outer = driver.reservation_mutex(context, timeout=5, release_check_after=60, **driver.options)
    outer.acquire()
    remove_behind_its_back(emu, rid, "remove by another session")
    other = ReservationMutex(emu.session(), rid, owner="Other party", timeout=5)
    other.acquire()
    with pytest.raises(MutexLostError):
        driver.apply_settings(context)
    with pytest.raises(MutexLostError):
        outer.release()
    assert other.holder().token == other.token  # not removed from under the other party
    assert len(lost_lines(emu, rid)) == 1
    other.release()


@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_a_nested_acquire_of_a_live_hold_is_served_with_exactly_one_read(any_emu, tmp_path, cohort):
    emu = any_emu
    rid = emu.create_reservation("served")
    driver = Driver(tmp_path / "cohort", cohort)
    context = context_for(emu, rid)
    with driver.reservation_mutex(context, timeout=5, **driver.options) as outer:
        before = emu.control.call_counts()
        token = driver.apply_settings(context)
        after = emu.control.call_counts()
        assert token == outer.token
    spent = {method: after.get(method, 0) - before.get(method, 0) for method in after}
    assert {method: n for method, n in spent.items() if n} == {"GetReservationDetails": 1}, spent
    assert driver.seen == [(True, token)]
    assert lost_lines(emu, rid) == [] and emu.control.reservation(rid)["services"] == []


def test_a_first_read_that_lags_behind_the_hold_is_asked_again_and_the_nested_acquire_is_served(
    emu, tmp_path
):
    rid = emu.create_reservation("lagging read")
    driver = Driver(tmp_path / "cohort", cohort=False)
    context = context_for(emu, rid)
    with driver.reservation_mutex(context, timeout=5, **driver.options) as outer:
        # The next fresh read shows the reservation as it was a minute ago: without the lock.
        emu.control.inject_fault("GetReservationDetails", "stale_fresh_read", ms=60_000)
        before = emu.control.call_counts()
        assert driver.apply_settings(context) == outer.token
        after = emu.control.call_counts()
    assert after["GetReservationDetails"] - before.get("GetReservationDetails", 0) == 2
    assert lost_lines(emu, rid) == [] and emu.control.reservation(rid)["services"] == []


@pytest.mark.parametrize("fault", ["error_before_commit", "transient_false"])
def test_a_nested_acquire_waits_out_a_failing_read_and_raises_clearly_only_at_its_timeout(
    emu, tmp_path, fault
):
    """A read that fails (an answered 500, a deadlock victim) is backed off and read again, as every other
    wait of the lock does; only a read that keeps failing until the nested acquire's timeout raises, clearly,
    and the hold stays the command's either way."""
    rid = emu.create_reservation("failed read")
    driver = Driver(tmp_path / "cohort", cohort=False)
    context = context_for(emu, rid)
    outer = driver.reservation_mutex(context, timeout=5, **driver.options)
    outer.acquire()
    emu.control.inject_fault("GetReservationDetails", fault, count=2)
    assert driver.apply_settings(context) == outer.token  # served, after the server recovered
    emu.control.inject_fault("GetReservationDetails", fault, count=1000)
    with pytest.raises(MutexError) as failed, driver.reservation_mutex(context, timeout=1, **driver.options):
        pass
    assert not isinstance(failed.value, MutexLostError), failed.value
    assert "checking the lock owner" in str(failed.value)
    emu.control.clear_faults()
    assert outer.locked()
    outer.release()  # still the command's: removed as usual
    assert emu.control.reservation(rid)["services"] == [] and lost_lines(emu, rid) == []


@pytest.mark.client_resend
def test_a_nested_acquire_whose_read_reply_is_lost_is_served_by_the_clients_resent_read(emu, tmp_path):
    """A read has no effect to land late; its lost reply costs the client's re-send, and the answer stands."""
    rid = emu.create_reservation("dropped read")
    driver = Driver(tmp_path / "cohort", cohort=False)
    context = context_for(emu, rid)
    with driver.reservation_mutex(context, timeout=5, **driver.options) as outer:
        emu.control.inject_fault("GetReservationDetails", "drop_after_commit")
        assert driver.apply_settings(context) == outer.token
    assert emu.control.reservation(rid)["services"] == [] and lost_lines(emu, rid) == []
