"""The ``~releasing`` marker under attack: separate OS processes against the emulator over HTTP (real client).

A holder whose remove got no answer adds ``MUTEX~releasing`` so that a waiter that times out can say why the
lock stays held. Anyone can read the holder's token, so an attacker (another process, another session) can add
a marker with it. Such a forgery must not be believed (the waiter's timeout does not say "releasing"), and it
must not outlive the holder's release: it names the holder's token, so the holder removes it, settled like any
other remove (one remove; none more while it may land). A holder whose own marker add meets a forgery
writes its proof over it (it holds the lock, so any marker is stale). The holder's real marker is believed
(``test_unknown_outcomes_emulator.py`` covers it, with the late remove it is for).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any, Dict, Optional

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession
from test_rwlock_processes import collect

from cloudshell_mutex import MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.holder import make_secret, releasing_value
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.server import catalog
from cloudshell_mutex.lock.server.late_adds import LateAdds

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
MUTEX = protocol.DEFAULT_ALIAS
MARKER = protocol.releasing_alias(MUTEX)


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


def attacker(address, rid: str, forgery: str, results) -> None:
    """Read the holder's token, add ``MUTEX~releasing`` with it (``forgery``: the token alone, or with a
    secret of our own), then wait for the lock as any waiter does until the timeout and report its words."""
    report: Dict[str, Any] = {"index": 0, "error": None, "message": None}
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        services = api.GetReservationDetails(rid, True).ReservationDescription.Services or []
        token = next(
            a.Value for s in services if s.Alias == MUTEX for a in s.Attributes if a.Name.endswith("Owner")
        )
        value = token if forgery == "token" else releasing_value(token, make_secret())
        api.AddServiceToReservation(
            rid, protocol.SERVICE_MODEL, MARKER, [AttributeNameValue("Mutex Owner", value)]
        )
        report["forged"] = value
        try:
            ReservationMutex(api, rid, owner="attacker's waiter", timeout=2, pacing=FAST).acquire()
        except MutexTimeout as error:
            report["message"] = str(error)
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def in_a_process(target, emu, rid: str, *args: Any) -> Dict[str, Any]:
    """Run ``target(address, rid, *args, results)`` in its own process; its report."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    address = (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)
    process = context.Process(target=target, args=(address, rid, *args, results))
    process.start()
    (report,) = collect([process], results, timeout=90)
    return report


def attack(emu, rid: str, forgery: str) -> Dict[str, Any]:
    """The attacker, in its own process."""
    return in_a_process(attacker, emu, rid, forgery)


def holder_lock(emu, rid: str, late: Optional[LateAdds] = None, lifetime: float = 30) -> ReservationMutex:
    api = emu.session()
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)  # the faults below are for the release
    return ReservationMutex(
        api, rid, owner="holder", pacing=FAST, request_lifetime=lifetime, runtime=Runtime(late_adds=late)
    )


def aliases(emu, rid: str):
    return [s["alias"] for s in emu.control.reservation(rid)["services"]]


def marker_owner(emu, rid: str) -> Optional[str]:
    """The ``Mutex Owner`` of the marker's service, None when there is none."""
    for service in emu.control.reservation(rid)["services"]:
        if service["alias"] == MARKER:
            return service["attributes"].get(protocol.ATTR_OWNER, "")
    return None


def marker_removes(emu, rid: str):
    return [e for e in emu.control.events(rid) if e["alias"] == MARKER and e["op"] == "service_removed"]


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("forgery", ["token", "token with a secret of its own"])
def test_a_forged_marker_is_not_believed_and_is_gone_after_the_holders_release(emu, forgery):
    rid = emu.create_reservation("forged marker")
    holder = holder_lock(emu, rid)
    holder.acquire()
    report = attack(emu, rid, forgery)
    assert report["message"] is not None and "releasing" not in report["message"], report
    assert MARKER in aliases(emu, rid)  # the forgery is in place while the holder holds
    holder.release()
    assert aliases(emu, rid) == [] and len(marker_removes(emu, rid)) == 1


def test_a_forged_marker_under_a_late_remove_is_overwritten_by_the_holders_proof_and_goes_once_settled(emu):
    """The holder's remove of MUTEX lands late. Meanwhile the forgery holds the marker's alias, so the
    holder's own add of its marker is refused: it holds the lock, so any marker is stale, and it writes its
    proof over the forgery. A waiter that times out then names the release (which is real), never the forged
    value. Once the late remove has landed the release settles, and the marker goes: one remove of it."""
    rid = emu.create_reservation("forged marker, late remove")
    holder = holder_lock(emu, rid)
    holder.acquire()
    forged = attack(emu, rid, "token")["forged"]
    adds = emu.control.call_counts()["AddServiceToReservation"]
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    releasing = threading.Thread(target=holder.release)
    releasing.start()
    # The holder tries its own marker (refused: the forgery holds the alias) and waits for its remove.
    wait_until(lambda: emu.control.call_counts()["AddServiceToReservation"] > adds)
    wait_until(lambda: marker_owner(emu, rid) not in (None, forged))
    assert marker_owner(emu, rid).startswith(forged + "#")  # the holder's token with its secret
    report = in_a_process(waiter, emu, rid)
    assert report["message"] is not None and "releasing" in report["message"], report
    assert forged not in report["message"]
    assert releasing.is_alive()
    assert emu.control.land_late() == 1
    releasing.join(30)
    assert not releasing.is_alive() and not holder.locked()
    assert aliases(emu, rid) == [] and len(marker_removes(emu, rid)) == 1


def waiter(address, rid: str, results) -> None:
    """A waiter in its own process that times out; reports its words."""
    report: Dict[str, Any] = {"index": 1, "error": None, "message": None}
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        try:
            ReservationMutex(api, rid, owner="waiter", timeout=2, pacing=FAST).acquire()
        except MutexTimeout as error:
            report["message"] = str(error)
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def test_a_forged_markers_remove_that_lands_late_is_waited_for_and_never_sent_twice(emu):
    """The holder's remove of the forgery gets no answer and lands later: the late-add watcher sends no second
    remove while it may land; once it has landed, nothing is left and nothing more is sent."""
    rid = emu.create_reservation("forged marker, its remove late")
    late = LateAdds(background=True)  # this test's own watcher
    holder = holder_lock(emu, rid, late, lifetime=10)  # the watcher stops 10 s after its remove
    holder.acquire()
    attack(emu, rid, "token")
    removes_before = emu.control.call_counts().get("RemoveServicesFromReservation", 0)
    # The remove of MUTEX answers (a tiny spike); the remove of the forgery lands late.
    emu.control.inject_fault("RemoveServicesFromReservation", "spike", seconds=0.001)
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reset_after=0.05)
    holder.release()
    assert not holder.locked() and aliases(emu, rid) == [MARKER]  # its remove is on its way
    time.sleep(2.5)  # the watcher looks meanwhile: the marker still names our token, but our remove may land
    assert emu.control.call_counts()["RemoveServicesFromReservation"] == removes_before + 2
    assert emu.control.land_late() == 1
    assert late.settle(20)
    assert aliases(emu, rid) == [] and len(marker_removes(emu, rid)) == 1
    assert emu.control.call_counts()["RemoveServicesFromReservation"] == removes_before + 2
