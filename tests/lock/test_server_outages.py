"""The server goes away: waiters keep waiting within their timeout; a server that lost its state does not
leave a lock believing it holds.
"""

from __future__ import annotations

import threading
import time

import pytest

from cloudshell_mutex import MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.emulator import Emulator
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
OUTAGE_SECONDS = 4.0
#: The longest one call takes against a server that refuses connections: the client's own three copies, 1 s
#: and then 2 s apart (a bound of what the lock cannot interrupt, not a speed claim).
CLIENT_CALL_SECONDS = 3.5


def test_waiters_keep_waiting_through_an_outage_and_get_the_lock_after_it(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    holder = ReservationMutex(emu.session(), rid, owner="holder", pacing=FAST)
    waiter = ReservationMutex(emu.session(), rid, owner="waiter", pacing=FAST, timeout=60)
    holder.acquire()
    outcome = {}

    def wait_for_it():
        outcome["acquired"] = waiter.acquire()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    time.sleep(0.3)
    emu.stop()  # connections refused: the waiter backs off and keeps trying
    time.sleep(OUTAGE_SECONDS)
    emu.start()  # same port, same state
    holder.release()
    thread.join(30)
    assert outcome == {"acquired": True}
    token = waiter.token
    waiter.release()
    owners = [
        (e["op"], e["attributes"].get(protocol.ATTR_OWNER))
        for e in emu.control.events(rid)
        if e["alias"] == protocol.DEFAULT_ALIAS  # not the waiter's queue ticket
    ]
    assert owners[-2:] == [("service_added", token), ("service_removed", token)]


def test_a_server_restarted_without_its_state_does_not_leave_a_holder_believing_it_holds(
    original_package_zip,
):
    first = Emulator(port=0, quali_port=0, packages=[original_package_zip]).start()
    port, quali_port = first.port, first.quali_port
    rid = first.create_reservation()
    holder = ReservationMutex(first.session(), rid, owner="holder", pacing=FAST)
    holder.acquire()
    first.stop()
    second = Emulator(port=port, quali_port=quali_port, packages=[original_package_zip]).start()
    try:
        holder.release()  # the reservation is gone with the server's state: the lock went with it
        assert not holder.locked()
        assert second.control.events() == []  # nothing was added or removed on the new server
    finally:
        second.stop()


def test_a_server_that_cannot_be_reached_is_no_unknown_outcome(
    cloudshell_emulator_factory, original_package_zip
):
    """Connections refused from the first add on: nothing was ever sent, so nothing is pending. The acquire
    ends by its deadline plus at most the call on the wire (the client's own retries of one call), says the
    server could not be reached, and leaves nothing to watch (no warning at exit about a MUTEX that cannot
    exist)."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    mutex = ReservationMutex(emu.session(), rid, owner="waiter", timeout=5)
    emu.stop()  # connections refused
    start = time.monotonic()
    with pytest.raises(MutexTimeout) as raised:
        mutex.acquire()
    took = time.monotonic() - start
    message = str(raised.value)
    print(f"\nunreachable: MutexTimeout after {took:.1f} s (timeout 5 s)")
    assert "could not be reached" in message and "left nothing there" in message
    assert "RemoveServicesFromReservation" not in message  # no advice to remove what cannot exist
    assert not raised.value.maybe_held
    watched = [entry for entry in mutex.runtime.late_adds.pending() if entry.alias.reservation_id == rid]
    assert watched == []
    assert took <= 5 + CLIENT_CALL_SECONDS + 1.5  # the deadline, the one call on the wire, some slack
