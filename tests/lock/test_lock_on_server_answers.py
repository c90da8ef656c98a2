"""What the lock does on each answer a server may give to the site probe's questions (docs/protocol.md, "On a
real server"): the emulator's modes, the real client, over HTTP."""

from __future__ import annotations

import threading
import time

import pytest

from cloudshell_mutex import MutexLostError, ReservationMutex, ReservationRWLock, protocol
from cloudshell_mutex.lock.admin.admin import force_release_permission
from cloudshell_mutex.lock.errors import MutexNotInstalled
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=0.2)
MUTEX = protocol.DEFAULT_ALIAS


@pytest.fixture
def emulator(cloudshell_emulator_factory, our_model_package):
    return lambda **modes: cloudshell_emulator_factory(packages=[our_model_package], **modes)


def aliases(emu, rid):
    return sorted(service["alias"] for service in emu.control.reservation(rid)["services"])


@pytest.mark.client_resend  # max_attempts=1: one request per add
@pytest.mark.parametrize("mode, holders", [("atomic", 1), ("racy", 2)])
def test_on_a_racy_add_two_locks_are_held_at_once(emulator, mode: str, holders: int):
    """The protocol rests on the atomic add: on a racy server two lock objects both acquire (not safe)."""
    emu = emulator(add_atomicity=mode)
    rid = emu.create_reservation()
    locks = [ReservationMutex(emu.session(max_attempts=1), rid, owner=f"racer {i}", **FAST) for i in (1, 2)]
    barrier, got = threading.Barrier(2), []

    def take(lock: ReservationMutex) -> None:
        barrier.wait(timeout=10)
        got.append(lock.acquire(blocking=False))

    threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert got.count(True) == holders


@pytest.mark.usefixtures("parked_at_once")  # the parked queue's steps
@pytest.mark.parametrize("mode", ["refuse_all", "remove_found", "ignore"])
def test_a_release_whose_merged_remove_names_a_gone_ticket_is_settled_on_every_remove_answer(emulator, mode):
    """The holder keeps its queue ticket and removes it with the lock in one call; if the ticket is gone by
    then, the call names a missing alias: whatever the server does with it, the release ends released."""
    emu = emulator(remove_missing=mode)
    rid = emu.create_reservation()
    first = ReservationMutex(emu.session(), rid, owner="first", **FAST)
    second = ReservationMutex(emu.session(), rid, owner="second", timeout=30, release_check_after=60, **FAST)
    first.acquire()
    tokens = [first.token]
    threading.Timer(0.5, first.release).start()
    second.acquire()  # it waited in line: it holds its ticket too
    tokens.append(second.token)
    [ticket] = [alias for alias in aliases(emu, rid) if alias != MUTEX]
    assert protocol.alias_kind(ticket) == (MUTEX, "queue ticket")
    emu.session().RemoveServicesFromReservation(rid, [ticket])  # a waiter took it for abandoned
    second.release()  # no read first (release_check_after): one remove of [MUTEX, ticket]
    assert aliases(emu, rid) == []
    removes = [e for e in emu.control.events(rid) if e["op"] == "service_removed" and e["alias"] == MUTEX]
    assert [e["attributes"][protocol.ATTR_OWNER] for e in removes] == tokens


@pytest.mark.parametrize("cache, lost", [(0.5, False), (3.0, True)])
def test_fresh_reads_from_the_cache_are_safe_within_a_second_and_not_beyond(
    emulator, cache: float, lost: bool
):
    """A server that answers disableCache reads from its cache: within FRESH_READ_LAG (1 s) the release asks
    again and releases; beyond it the release calls its own lock lost and leaves it behind (not safe)."""
    emu = emulator(disable_cache="ignored", details_cache_seconds=cache)
    rid = emu.create_reservation()
    api = emu.session()
    api.GetReservationDetails(rid, disableCache=True)  # the snapshot every read answers from for a while
    lock = ReservationMutex(api, rid, owner="holder", lease=0, **FAST)
    lock.acquire()
    if lost:
        with pytest.raises(MutexLostError):
            lock.release()
        assert aliases(emu, rid) == [MUTEX]  # its own lock, left behind
    else:
        lock.release()
        assert aliases(emu, rid) == []


def test_without_aliases_with_a_tilde_the_lock_waits_without_the_queue_and_a_read_lock_is_refused(emulator):
    emu = emulator(tilde_aliases="refused")
    rid = emu.create_reservation()
    first = ReservationMutex(emu.session(), rid, owner="first", **FAST)
    second = ReservationMutex(emu.session(), rid, owner="second", timeout=30, **FAST)  # fair: the default
    first.acquire()
    threading.Timer(0.5, first.release).start()
    started = time.monotonic()
    assert second.acquire() is True  # its ticket was refused: it polled instead
    assert time.monotonic() - started < 10
    second.release()
    reader = ReservationRWLock(emu.session(), rid, owner="reader", timeout=5)
    with pytest.raises(MutexNotInstalled):
        reader.read().acquire()  # its reader slot (MUTEX~r1) is refused: at once, not at the timeout
    assert aliases(emu, rid) == []


@pytest.mark.parametrize("groups, allowed", [("listed", True), ("omitted", False)])
def test_force_release_needs_the_roles_in_the_user_details(emulator, groups: str, allowed: bool):
    emu = emulator(user_groups=groups)
    emu.add_user("dana", "pw", domain="Sales", role="DomainAdmin")
    api = emu.session()
    assert force_release_permission(api, "dana", "Sales").allowed is allowed
    assert force_release_permission(api, emu.admin_user, "Sales").allowed  # IsAdmin is enough
