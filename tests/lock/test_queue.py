"""The fair mode's advisory queue (lock/queue.py), on the fake API with a virtual clock.

Other waiters are played by the test: their tickets are services it adds and removes (directly, or as late
requests at a virtual time with ``api.later``). Each test looks at what the lock under test sent, and when.
A waiter here parks at once (``parked_at_once``): the spin before parking is test_spin.py's.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, List, Optional, Tuple

import pytest
from fakes import RES, FakeApi, api_error, http_500, make, other_holds
from urllib3.exceptions import ProtocolError

from cloudshell_mutex import MutexError, MutexLostError, MutexTimeout, protocol
from cloudshell_mutex.lock.holder import Holder, commitment, releasing_value
from cloudshell_mutex.lock.lease.lease import parse_ticket, ticket_value
from cloudshell_mutex.lock.operation import LANDING_READ_INTERVAL
from cloudshell_mutex.lock.options import FRESH_READ_LAG
from cloudshell_mutex.lock.pacing import CallBudget
from cloudshell_mutex.lock.protocol import ticket_alias, ticket_number
from cloudshell_mutex.lock.queue import queue
from cloudshell_mutex.lock.queue import tickets as queue_values
from cloudshell_mutex.lock.queue.tickets import (
    FALLBACK_AFTER,
    LOCK_BUDGET,
    TICKET_LEASE,
    QueueView,
    queue_calls_per_second,
    queue_view,
    wait_interval,
)

pytestmark = pytest.mark.usefixtures("parked_at_once")

MUTEX = protocol.DEFAULT_ALIAS
HEAD = "Head waiter@host:7:0badcafe"
#: The secret of a holder whose release marks the lock (its token commits to it).
MARKER_SECRET = bytes(range(16))
SECOND = "Second waiter@host:8:0badf00d"


class RecordingApi(FakeApi):
    """The fake, recording (virtual time, alias) of every add."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.adds: List[Tuple[float, str]] = []

    def AddServiceToReservation(self, reservationId="", serviceName="", alias="", attributes=()) -> Any:
        self.adds.append((self.clock.now if self.clock else 0.0, alias))
        return super().AddServiceToReservation(reservationId, serviceName, alias, attributes)


def lose_the_reply_of_the_add_that_finds_the_lock_free(api: FakeApi, clock: Any) -> List[float]:
    """The first add of MUTEX sent while the lock is free gets a connection reset and lands 1 s after its
    error. Returns the list of when it was sent (empty until then)."""
    late: List[float] = []

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if alias == MUTEX and MUTEX not in api.services and not late:
            late.append(clock.now)
            api.later(clock.now + 1.0, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 100
    return late


def queue_up(api: FakeApi, number: int, token: str, count: int = 0) -> None:
    """Another waiter's ticket."""
    api.services[ticket_alias(MUTEX, number)] = {
        protocol.ATTR_OWNER: ticket_value(token, TICKET_LEASE, count)
    }


def tickets(api: FakeApi) -> List[str]:
    return sorted(alias for alias in api.services if ticket_number(alias, MUTEX) is not None)


def crashed_holder(api: FakeApi) -> None:
    """A holder with a 2 s lease that died: its heartbeat never moves again."""
    api.services[MUTEX] = {
        protocol.ATTR_OWNER: "Crashed driver@exec-01:4242:deadbeef",
        protocol.ATTR_LEASE_SECONDS: "2",
        protocol.ATTR_HEARTBEAT: "deadbeef:aa01:3",
    }


def mutex_adds(api: RecordingApi) -> List[float]:
    return [at for at, alias in api.adds if alias == MUTEX]


@pytest.fixture(autouse=True)
def _forget_memories():
    queue_values._memories.clear()  # what this process learned about other tests' locks
    yield
    queue_values._memories.clear()


# ---------------------------------------------------------------- values and views


def test_ticket_values_round_trip_and_foreign_values_are_not_tickets() -> None:
    value = ticket_value(HEAD, 120.0, 3)
    assert parse_ticket(value) == (HEAD, 120.0, "0badcafe:q:3")
    for foreign in (
        "",
        "v1 owner",
        "a#b#c",
        f"{HEAD}#nan#0badcafe:q:1",
        f"{HEAD}#0.1#0badcafe:q:1",
        "#120#x:q:1",
    ):
        assert parse_ticket(foreign) is None, foreign
    assert ticket_number("MUTEX~q~12", "MUTEX") == 12
    assert ticket_number("MUTEX~q~x", "MUTEX") is None
    assert ticket_number("MUTEX~break", "MUTEX") is None
    assert ticket_number("OTHER~q~1", "MUTEX") is None


def _holder(alias: str, owner: str) -> Holder:
    return Holder(alias, owner, owner, protocol.SERVICE_MODEL, {protocol.ATTR_OWNER: owner})


def test_the_view_orders_tickets_by_number_and_leaves_out_the_holders_and_foreign_ones() -> None:
    services = {
        MUTEX: _holder(MUTEX, HEAD),
        "MUTEX~q~10": _holder("MUTEX~q~10", ticket_value("C@h:3:0000000c", 120, 0)),
        "MUTEX~q~9": _holder("MUTEX~q~9", ticket_value(SECOND, 120, 0)),
        "MUTEX~q~2": _holder("MUTEX~q~2", ticket_value(HEAD, 120, 0)),  # the holder's, not removed yet
        "MUTEX~q~11": _holder("MUTEX~q~11", "garbage"),
        "OTHER~q~50": _holder("OTHER~q~50", ticket_value("D@h:4:0000000d", 120, 0)),
    }
    view = queue_view(services, MUTEX, at=5.0)
    assert [t.number for t in view.tickets] == [9, 10]  # 10 after 9: numbers, not text
    assert view.highest == 11  # a foreign ticket still takes its number
    assert view.position(SECOND) == 1 and view.position("C@h:3:0000000c") == 2
    assert view.position(HEAD) is None
    assert view.tickets[0].holder.attributes[protocol.ATTR_LEASE_SECONDS] == "120"


# ---------------------------------------------------------------- the budget


def test_waiters_further_back_read_more_rarely() -> None:
    for period in (0.2, 1.0, 10.0):
        intervals = [wait_interval(p, 32, period) for p in range(2, 33)]
        assert intervals == sorted(intervals)
        assert intervals[0] <= max(queue_values.MIN_INTERVAL, period / 3) + 1e-9
        # Nobody sleeps through its own turn: the next-but-one reads at least once a period.
        assert wait_interval(3, 32, period) <= max(queue_values.MIN_INTERVAL, period) + 1e-9


def test_the_queue_keeps_the_per_lock_budget_when_holds_are_long_and_says_what_it_costs_when_short() -> None:
    # Hold 10 s (a period of about 10.5 s): polling, reads and heartbeats of 32 waiters plus the
    # acquisitions themselves (6 calls each) stay within the lock's budget.
    period = 10.5
    waiting = queue_calls_per_second(32, period)
    assert waiting + queue_values.ACQUISITION_CALLS / period <= LOCK_BUDGET
    # ... and grows much slower than the queue: 8 times the waiters, not 3 times the calls.
    assert queue_calls_per_second(32, period) < 3 * queue_calls_per_second(4, period)
    # Hold 1 s: the acquisitions alone cost more than the budget; the queue does not make it worse than
    # a few calls per second (the default lock made about 50 at N=32).
    assert queue_values.ACQUISITION_CALLS / 1.0 > LOCK_BUDGET
    assert queue_calls_per_second(32, 1.1) < 12


# ---------------------------------------------------------------- the lock in fair mode


def test_an_uncontended_fair_acquire_and_release_costs_three_calls_and_takes_no_ticket(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True)
    lock.acquire()
    lock.release()
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails", "RemoveServicesFromReservation"]
    assert [alias for _, alias in api.adds] == [MUTEX]


def test_a_waiter_takes_the_ticket_after_the_highest_and_only_the_head_polls_the_lock(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    queue_up(api, 3, SECOND)  # numbers need not be dense
    start = clock.now

    def head_takes_the_lock() -> None:  # the holder releases; the head is granted and leaves the queue
        api.services[MUTEX] = {protocol.ATTR_OWNER: HEAD}
        del api.services[ticket_alias(MUTEX, 0)]

    def second_takes_the_lock() -> None:
        api.services[MUTEX] = {protocol.ATTR_OWNER: SECOND}
        del api.services[ticket_alias(MUTEX, 3)]

    api.later(start + 5, head_takes_the_lock)
    api.later(start + 10, second_takes_the_lock)
    api.later(start + 15, lambda: api.services.pop(MUTEX))
    seen: List[List[str]] = []
    api.on_call = lambda method: seen.append(tickets(api))
    lock.acquire()
    assert clock.now >= start + 15
    assert ticket_alias(MUTEX, 4) in [alias for _, alias in api.adds]  # after the highest, 3
    # The lock's add: once at the start, then only as the head (after the second was granted at +10).
    polls = mutex_adds(api)
    assert polls[0] == start
    assert all(at >= start + 10 for at in polls[1:]), polls
    # Granted: our ticket stays until the release removes it with the lock, in the same call.
    assert tickets(api) == [ticket_alias(MUTEX, 4)]
    lock.release()
    assert tickets(api) == [] and MUTEX not in api.services
    assert api.removed[-2:] == [MUTEX, ticket_alias(MUTEX, 4)]


def _granted_after_a_wait(api: RecordingApi, clock) -> Any:
    """A lock that waited behind another holder (so with a ticket, 0), granted when the holder left."""
    lock = make(api, clock, fair=True, timeout=60)
    other_holds(api, "Holder@host:1:deadbeef")
    api.later(clock.now + 3, lambda: api.services.pop(MUTEX))
    lock.acquire()
    return lock


def test_the_granted_ticket_goes_with_the_lock_in_the_releases_one_remove(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)
    assert api.removed == []  # nothing between the grant and the critical section
    assert tickets(api) == [ticket_alias(MUTEX, 0)]
    lock.release()
    # One remove of both, after the release's read showed both ours: six calls for the whole of it.
    assert api.removed == [MUTEX, ticket_alias(MUTEX, 0)]
    assert api.calls.count("RemoveServicesFromReservation") == 1
    assert api.services == {}


def test_a_release_whose_ticket_went_between_its_read_and_its_remove_removes_the_lock_alone(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)

    def the_ticket_goes_first(reservation_id, services) -> bool:
        del api.services[ticket_alias(MUTEX, 0)]  # by hand, say: the remove of both answers "not found"
        return False

    api.faults["RemoveServicesFromReservation"] = [the_ticket_goes_first]
    reads: List[float] = []
    api.on_call = lambda method: reads.append(clock.now) if method == "GetReservationDetails" else None
    lock.release()  # not lost: a read showed the lock still ours, and it went alone
    assert api.removed == [MUTEX, ticket_alias(MUTEX, 0), MUTEX]
    assert api.services == {}
    assert not lock.locked()
    # The read that decided came a fresh read's lag after the remove of both: a read that may lag behind it
    # could show the lock ours after a server removed it with that call, and a successor's would go.
    assert reads[1] - reads[0] >= FRESH_READ_LAG


class PartialRemoveApi(RecordingApi):
    """A server whose remove of several aliases removes those it finds, then says one was not found (the
    emulator, like the fake, removes none of them then: the real server's behaviour is not known)."""

    def commit_remove(self, reservation_id: str, aliases) -> None:
        missing = [alias for alias in aliases if alias not in self.services]
        super().commit_remove(reservation_id, [alias for alias in aliases if alias in self.services])
        if missing:
            raise api_error(
                f"Service with alias '{missing[0]}' was not found in reservation '{reservation_id}'"
            )


def test_on_a_server_that_removes_what_it_finds_a_release_whose_ticket_went_is_released_not_lost(
    clock,
) -> None:
    api = PartialRemoveApi()
    lock = _granted_after_a_wait(api, clock)

    def the_ticket_goes_first(reservation_id, services) -> bool:
        del api.services[ticket_alias(MUTEX, 0)]
        return False

    api.faults["RemoveServicesFromReservation"] = [the_ticket_goes_first]
    lock.release()  # the call took the lock with it: a read shows neither, so it may have been ours
    assert api.removed == [MUTEX, ticket_alias(MUTEX, 0)]  # and no second remove of the lock
    assert api.services == {} and not lock.locked()


def test_a_lost_holds_ticket_is_never_removed_once_its_number_is_a_newcomers(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)
    # An operator's Force Release; waiters remove our ticket as abandoned and a newcomer takes its number.
    del api.services[MUTEX]
    del api.services[ticket_alias(MUTEX, 0)]
    queue_up(api, 0, SECOND)
    with pytest.raises(MutexLostError):
        lock.release()
    for _ in range(3):
        clock.sleep(2)
        lock.runtime.late_adds.sweep()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]  # the newcomer's, left alone
    assert ticket_alias(MUTEX, 0) not in api.removed


def test_a_ticket_that_names_held_locks_goes_at_the_grant(clock) -> None:
    # Kept, it would be a waiter's again in every view once this hold were lost (a lease broken), and its
    # claim on the other lock could make a deadlock cycle that is not there.
    api = RecordingApi()
    other = make(api, clock, fair=True, name="MUTEX-other")
    other.acquire()
    lock = _granted_after_a_wait(api, clock)
    assert tickets(api) == [] and api.removed == [ticket_alias(MUTEX, 0)]
    lock.release()
    other.release()
    assert api.services == {}


def test_without_the_releases_read_the_ticket_still_goes_with_the_lock(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60, release_check_after=5)
    other_holds(api, "Holder@host:1:deadbeef")
    api.later(clock.now + 3, lambda: api.services.pop(MUTEX))
    lock.acquire()
    before = len(api.calls)
    lock.release()
    assert api.calls[before:] == ["RemoveServicesFromReservation"]
    assert api.removed == [MUTEX, ticket_alias(MUTEX, 0)] and api.services == {}


def test_a_release_whose_lock_went_between_its_read_and_its_remove_is_lost_and_its_ticket_goes(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)

    def the_lock_is_taken_first(reservation_id, services) -> bool:
        del api.services[MUTEX]  # force-released: the remove of both finds it gone, and removes neither
        return False

    api.faults["RemoveServicesFromReservation"] = [the_lock_is_taken_first]
    with pytest.raises(MutexLostError):
        lock.release()
    assert MUTEX not in api.services  # nothing of anyone's was removed by a second remove of the lock
    assert api.removed.count(MUTEX) == 1
    # The ticket is not forgotten: the watcher removes it while it shows our token.
    lock.runtime.late_adds.sweep()
    clock.sleep(5)
    lock.runtime.late_adds.sweep()
    assert tickets(api) == []


def test_a_remove_of_both_that_lands_late_is_waited_for_and_its_ticket_never_removed_twice(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)
    lifetime = lock.options.request_lifetime
    both = [MUTEX, ticket_alias(MUTEX, 0)]

    def lost_reply_lands_later(reservation_id, services) -> bool:
        # The request reaches the server 20 s after its error: then it removes both.
        api.later(clock.now + 20, lambda: api.commit_remove(RES, list(services)))
        raise ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))

    api.faults["RemoveServicesFromReservation"] = [lost_reply_lands_later]
    start = clock.now
    lock.release()  # waits for the remove that may still land rather than sending a second one
    assert start + 20 <= clock.now < start + lifetime
    removes = [alias for alias in api.removed if alias != protocol.releasing_alias(MUTEX)]
    assert removes == both  # one remove only, of the lock and the ticket
    assert api.services == {}
    # A newcomer takes the same ticket number now; the watcher must not take it away.
    queue_up(api, 0, SECOND)
    for _ in range(5):
        clock.sleep(lifetime / 4)
        lock.runtime.late_adds.sweep()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]
    assert [alias for alias in api.removed if alias != protocol.releasing_alias(MUTEX)] == both


def test_a_hold_that_ends_without_a_release_takes_its_ticket_away(clock) -> None:
    api = RecordingApi()
    lock = _granted_after_a_wait(api, clock)
    handle = lock.export()  # the adopter knows nothing of our ticket: it goes now
    assert tickets(api) == []
    assert api.removed == [ticket_alias(MUTEX, 0)]
    assert handle
    lock.release()
    assert api.services == {}


def test_a_releaser_that_asks_again_goes_to_the_back(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    lock.acquire()
    queue_up(api, 0, HEAD)  # someone queued while we held the lock
    lock.release()  # the release's read shows the queue: remembered
    api.adds.clear()
    again = make(api, clock, fair=True, timeout=60)  # a new lock object, as a driver's next item makes
    start = clock.now
    again.acquire()
    # The lock was free, but the first add was a ticket behind the head's, not the lock.
    assert api.adds[0] == (start, ticket_alias(MUTEX, 1))
    # The head never took it (a waiter that stopped polling): after the lock was seen free for
    # FALLBACK_AFTER with the same head, the waiter took it anyway. The queue is only advice.
    assert mutex_adds(api)[0] >= start + FALLBACK_AFTER
    assert tickets(api) == [ticket_alias(MUTEX, 0), ticket_alias(MUTEX, 1)]  # ours goes with the lock
    again.release()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]


def test_the_reads_in_line_count_as_the_heads_holder_check(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    lock.acquire()
    clock.now += 1.0  # a hold of 1 s (one of 0 s would make every hold old at once)
    queue_up(api, 0, HEAD)
    lock.release()  # others wait: the next acquisition lines up before its first add
    start = clock.now

    def head_takes_the_lock() -> None:
        api.services[MUTEX] = {protocol.ATTR_OWNER: HEAD}
        del api.services[ticket_alias(MUTEX, 0)]

    api.later(start + 2, head_takes_the_lock)
    api.later(start + 4, lambda: api.services.pop(MUTEX))
    steps: List[str] = []
    api.on_call = lambda method: steps.append(
        api.adds[-1][1] if method == "AddServiceToReservation" else method
    )
    again = make(api, clock, fair=True, timeout=60)
    again.acquire()
    busy = [i for i, step in enumerate(steps[:-1]) if step == MUTEX]
    assert busy, steps  # the head polled the held lock
    # The queue had just read the lock (and its holder): no read of the holder after the head's first add.
    assert all(steps[i + 1] != "GetReservationDetails" for i in busy), steps
    assert again.owned()
    again.release()


def test_without_others_seen_waiting_a_new_acquisition_adds_the_lock_first(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True)
    lock.acquire()
    lock.release()  # nobody queued at the release's read
    make(api, clock, fair=True).acquire()
    assert [alias for _, alias in api.adds] == [MUTEX, MUTEX]


def test_a_foreign_or_corrupt_ticket_does_not_hold_the_queue_up(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    other_holds(api, "Holder@host:1:deadbeef")
    api.services[ticket_alias(MUTEX, 0)] = {protocol.ATTR_OWNER: "not a ticket"}
    start = clock.now
    api.later(start + 3, lambda: api.services.pop(MUTEX))
    lock.acquire()
    assert ticket_alias(MUTEX, 1) in [alias for _, alias in api.adds]
    assert clock.now < start + 4  # we were the head: polled the lock, and got it when it was freed
    lock.release()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]  # not ours: left alone


def _removed_at(api: FakeApi, clock, alias: str) -> List[float]:
    removed_at: List[float] = []

    def watch(method: str) -> None:
        if alias not in api.services and not removed_at:
            removed_at.append(clock.now)

    api.on_call = watch
    return removed_at


def test_an_abandoned_ticket_ahead_is_removed_after_its_lease(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=600)
    other_holds(api, "Holder@host:1:deadbeef")  # no lease: holds until the test frees it
    queue_up(api, 0, HEAD)  # crashed: its heartbeat never changes
    start = clock.now
    removed_at = _removed_at(api, clock, ticket_alias(MUTEX, 0))
    api.later(start + 400, lambda: api.services.pop(MUTEX))
    lock.acquire()
    # Removed once this waiter had seen it unchanged for lease + margin on its own clock, by one breaker
    # (its breaker service is gone again), and then we were the head. On time, though the hold is old and
    # the line reads ever more rarely: a waiter reads when a ticket ahead is due to be judged.
    margin = queue.lease.stale_margin(TICKET_LEASE)
    assert removed_at and start + TICKET_LEASE + margin <= removed_at[0] < start + TICKET_LEASE + margin + 2
    assert "MUTEX~q~0~break" in [alias for _, alias in api.adds]
    assert sorted(api.services) == [MUTEX, ticket_alias(MUTEX, 1)]  # ours goes with the lock
    assert mutex_adds(api)[1] >= removed_at[0]
    lock.release()
    assert sorted(api.services) == []


def test_a_ticket_ahead_that_heartbeats_is_never_removed(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=400)
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    start = clock.now
    for beat in range(1, 11):  # every lease/3, as a live waiter does
        api.later(start + 40 * beat, lambda beat=beat: queue_up(api, 0, HEAD, beat))
    removed_at = _removed_at(api, clock, ticket_alias(MUTEX, 0))
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert not removed_at
    assert tickets(api) == [ticket_alias(MUTEX, 0)]  # ours went with the timeout


def test_our_ticket_heartbeats_while_we_wait(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=200)
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    values: List[str] = []
    api.on_call = lambda method: values.append(
        api.services.get(ticket_alias(MUTEX, 1), {}).get("Mutex Owner", "")
    )
    with pytest.raises(MutexTimeout):
        lock.acquire()
    counts = {parse_ticket(v)[2] for v in values if parse_ticket(v)}
    # 200 s of waiting: beats 1.. every lease/3 (40 s) at least four times.
    assert len(counts) >= 5, counts
    assert ticket_alias(MUTEX, 1) not in api.services  # the timeout removed ours


# ---------------------------------------------------------------- every exit removes the ticket


def _waiting(clock) -> Tuple[RecordingApi, Any]:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=20)
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    return api, lock


def test_a_timeout_removes_our_ticket(clock) -> None:
    api, lock = _waiting(clock)
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert ticket_alias(MUTEX, 1) in [alias for _, alias in api.adds]
    assert tickets(api) == [ticket_alias(MUTEX, 0)]


def test_an_error_removes_our_ticket(clock) -> None:
    api, lock = _waiting(clock)

    def refuse(*args: Any) -> bool:
        raise api_error("Permission denied: the user may not add services", "500")

    def head_granted() -> None:
        # The head is granted; from our next add on, the server refuses us.
        api.services[MUTEX] = {protocol.ATTR_OWNER: HEAD}
        del api.services[ticket_alias(MUTEX, 0)]
        api.faults["AddServiceToReservation"] = [refuse] * 10

    api.later(clock.now + 5, head_granted)
    with pytest.raises(MutexError):
        lock.acquire()
    assert ticket_alias(MUTEX, 1) in [alias for _, alias in api.adds]
    assert tickets(api) == []


def test_ctrl_c_removes_our_ticket(clock) -> None:
    api, lock = _waiting(clock)
    naps = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt
        clock.sleep(seconds)

    lock.runtime.sleep = sleep
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]


def test_a_ticket_add_without_an_answer_goes_to_the_late_add_watcher(clock) -> None:
    api, lock = _waiting(clock)
    late: List[float] = []

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if alias == ticket_alias(MUTEX, 1) and not late:
            late.append(clock.now)
            # The server applies it 30 s later; the reply never comes.
            api.later(clock.now + 30, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 3
    with pytest.raises(MutexTimeout):
        lock.acquire()
    watcher = lock.runtime.late_adds
    assert any(entry.alias.alias == ticket_alias(MUTEX, 1) for entry in watcher.pending())
    # Time passes, the late add lands, the watcher removes it (it shows our token).
    while clock.now < late[0] + 40:
        clock.sleep(1.0)
        watcher.sweep()
    assert ticket_alias(MUTEX, 1) not in api.services


def test_a_ticket_remove_without_an_answer_is_never_sent_again_while_it_may_land(clock) -> None:
    """Our ticket's remove at the end of the wait gets no reply and lands 5 s later. The watcher must not
    remove the ticket again meanwhile: the number would be free, the next waiter would take it, and our
    first remove, landing then, would take that waiter's place in line."""
    api, lock = _waiting(clock)
    mine = ticket_alias(MUTEX, 1)
    removes: List[float] = []

    def lost_reply(reservation_id, aliases) -> bool:
        if aliases == [mine] and not removes:
            removes.append(clock.now)
            api.later(clock.now + 5, lambda: api.services.pop(mine, None))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["RemoveServicesFromReservation"] = [lost_reply] * 10
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert removes and mine in api.services
    watcher, joined = lock.runtime.late_adds, False
    for _ in range(10):
        clock.sleep(1.0)
        watcher.sweep()
        api.land_due()  # what reaches the server meanwhile, whoever calls next
        if not joined and mine not in api.services:
            queue_up(api, 1, SECOND)  # the next waiter takes the free number
            joined = True
    assert joined
    assert mine in api.services, "our first remove landed on the next waiter's ticket"
    assert parse_ticket(api.services[mine][protocol.ATTR_OWNER])[0] == SECOND


@pytest.mark.parametrize("answered_after", [1.1, 0.0], ids=["re-sent, counted", "answered as sent once"])
def test_an_extra_tickets_copy_landing_after_its_remove_is_removed_at_the_end(clock, answered_after) -> None:
    """The waiter's first ticket add commits and its reply is lost (the client's re-send finds it: "already
    exists"), so it adds a further number. A copy of that add lands 2 s later, after the waiter removed the
    extra ticket: counted, when the answer came after the client's re-send (1.1 s); uncounted, when it came
    at once as if sent once. The wait outlasts the request lifetime (5 s): when it ends, any copy's window
    has passed, yet the copy is in place. The watcher must still read once and remove it (seen in a chaos
    run: the ticket stayed in the reservation). An extra ticket is itself proof that copies landed."""
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=20, request_lifetime=5)
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    first = ticket_alias(MUTEX, 1)
    late: List[str] = []

    def copy_lands_late(reservation_id, model, alias, attributes) -> bool:
        if alias == first and first not in api.services:
            api.commit_add(reservation_id, model, alias, list(attributes))  # the first copy, reply lost
            raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)  # the client's re-send finds it
        if alias != first and protocol.TICKET_INFIX in alias and not late:
            late.append(alias)
            copy = list(attributes)
            api.later(clock.now + 2.0, lambda: api.commit_add(reservation_id, model, alias, copy))
            clock.sleep(answered_after)
        return False

    api.faults["AddServiceToReservation"] = [copy_lands_late] * 10
    with pytest.raises(MutexTimeout):
        lock.acquire()
    (extra,) = late
    assert extra in api.removed  # removed as an extra ticket ...
    assert extra in api.services  # ... and back: its earlier copy landed afterwards
    for _ in range(5):
        clock.sleep(1.0)
        lock.runtime.late_adds.sweep()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]  # neither of ours is left


def test_an_extra_ticket_whose_remove_fails_is_settled_and_named_exactly_at_exit(clock, caplog) -> None:
    """The client re-sent a ticket add after its first copy had committed: "already exists", and the waiter
    took a further number, so it has two tickets. Its remove of the extra one fails: the late-add watcher
    keeps it, removes it while it shows our token, and a warning at exit (were it still there) names it."""
    api, lock = _waiting(clock)
    first = ticket_alias(MUTEX, 1)

    def committed_then_resent(reservation_id, model, alias, attributes) -> bool:
        if alias == first and first not in api.services:
            api.commit_add(reservation_id, model, alias, list(attributes))  # the first copy, reply lost
            raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)  # the client's re-send finds it
        return False

    failed: List[str] = []

    def remove_fails(reservation_id, aliases) -> bool:
        if aliases != [first] and any(protocol.TICKET_INFIX in a for a in aliases) and not failed:
            failed.extend(aliases)
            raise http_500()  # not applied
        return False

    api.faults["AddServiceToReservation"] = [committed_then_resent] * 10
    api.faults["RemoveServicesFromReservation"] = [remove_fails] * 10
    watcher = lock.runtime.late_adds
    with pytest.raises(MutexTimeout):
        lock.acquire()
    (extra,) = failed
    assert extra != first and extra in api.services  # the extra ticket's remove failed: still there
    (entry,) = [e for e in watcher.pending() if e.alias.alias == extra]
    with caplog.at_level(logging.WARNING, logger="cloudshell_mutex"):
        watcher.warn_unsettled()
    (warning,) = [r.getMessage() for r in caplog.records if extra in r.getMessage()]
    assert "extra queue ticket" in warning and f"starting with {entry.token + '#'!r}" in warning
    for _ in range(5):
        clock.sleep(1.0)
        watcher.sweep()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]  # neither of ours is left


def test_the_fair_option_is_checked() -> None:
    from cloudshell_mutex.lock.options import MutexOptions

    with pytest.raises(TypeError, match="fair must be True or False"):
        MutexOptions(fair="yes")


def test_the_view_of_an_empty_reservation_has_no_queue() -> None:
    view = QueueView(None, (), -1, 0.0)
    assert view.position(HEAD) is None and view.others(None) == 0


def test_a_dead_head_passed_by_every_waiter_is_still_judged_across_this_process_acquisitions(clock) -> None:
    api = RecordingApi()
    queue_up(api, 0, HEAD)  # crashed at the head of the queue
    removed_at = _removed_at(api, clock, ticket_alias(MUTEX, 0))
    start = clock.now
    for _ in range(10):
        # Someone else holds the lock for 20 s; our acquisition waits behind the dead head, takes the lock
        # (by the fallback the first time; after that this process passes the dead head) and releases it:
        # each wait is much shorter than the ticket's lease, but this process's judgement goes on across them.
        other_holds(api, "Holder@host:1:deadbeef")
        api.later(clock.now + 20, lambda: api.services.pop(MUTEX, None))
        lock = make(api, clock, fair=True, timeout=60)
        lock.acquire()
        lock.release()
    margin = queue.lease.stale_margin(TICKET_LEASE)
    assert removed_at and start + TICKET_LEASE + margin <= removed_at[0] < start + TICKET_LEASE + margin + 30


def test_a_waiter_in_line_that_breaks_a_stale_holder_adds_at_once_past_a_dead_head(clock) -> None:
    # One execution server died: the holder (its lease runs out) and the head of the queue with it. The waiter
    # behind judges the holder stale on its own clock, breaks it and adds at once; going back to its place
    # behind the dead head, which nobody polls for, it would leave the lock free until the fallback.
    api = RecordingApi(attributes=(protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES))
    crashed_holder(api)
    queue_up(api, 0, HEAD)  # the head that died with it
    lock = make(api, clock, fair=True, lease=2, timeout=60)
    assert lock.acquire() is True
    (broke_at,) = [at for at, alias in api.adds if alias == protocol.breaker_alias(MUTEX)]
    granted_at = mutex_adds(api)[-1]
    assert api.services[MUTEX][protocol.ATTR_OWNER] == lock.token
    # The breaker's own wait for reads that may lag, then our add; not the fallback on top (4.3 s before).
    assert granted_at - broke_at < FRESH_READ_LAG + FALLBACK_AFTER / 2, (broke_at, granted_at)
    assert ticket_alias(MUTEX, 0) in tickets(api)  # the dead head's ticket waits for its own lease
    lock.release()


def test_a_ticket_of_ours_gone_and_taken_by_another_when_our_late_add_lands_is_not_kept(clock) -> None:
    # Our add lands late while we wait in line; meanwhile our ticket was removed (an operator, or judged stale
    # after a long pause) and a newcomer took its number. The read that shows us holding hides the holder's
    # ticket, so it must be checked before it is kept: the release below removes without a read
    # (release_check_after) and would take the newcomer's place with the lock.
    api = RecordingApi(attributes=(protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES), clock=clock)
    crashed_holder(api)
    queue_up(api, 0, HEAD)
    lock = make(api, clock, fair=True, lease=2, holder_check_interval=0.5, timeout=60, release_check_after=5)
    late: List[float] = []
    newcomer = "Newcomer@host:9:0000beef"

    def land_and_lose_our_place(reservation_id, model, alias, attributes) -> None:
        api.commit_add(reservation_id, model, alias, list(attributes))
        ours = [a for a in tickets(api) if a != ticket_alias(MUTEX, 0)]
        for alias_ in ours:  # removed by someone; the newcomer joins on the number
            api.services[alias_] = {protocol.ATTR_OWNER: ticket_value(newcomer, TICKET_LEASE, 0)}

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if alias == MUTEX and MUTEX not in api.services and not late:
            late.append(clock.now)
            landing = (reservation_id, model, alias, attributes)
            api.later(clock.now + 1.0, lambda: land_and_lose_our_place(*landing))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 100
    assert lock.acquire()
    assert late, "the scenario never happened: no add after the break"
    lock.release()
    api.land_due()
    taken = [a for a in tickets(api) if a != ticket_alias(MUTEX, 0)]
    assert taken and all(newcomer in api.services[a][protocol.ATTR_OWNER] for a in taken)
    assert MUTEX not in api.services


def _view(at: float, holder: Optional[str], *waiting: Tuple[int, str], releasing: bool = False) -> QueueView:
    services = {}
    if holder is not None:
        services[MUTEX] = _holder(MUTEX, holder)
        if releasing:  # the holder's remove got no answer: its marker, with its token and secret
            marker = protocol.releasing_alias(MUTEX)
            services[marker] = _holder(marker, releasing_value(holder, MARKER_SECRET))
    for number, token in waiting:
        alias = ticket_alias(MUTEX, number)
        services[alias] = _holder(alias, ticket_value(token, TICKET_LEASE, 0))
    return queue_view(services, MUTEX, at)


def test_a_ticket_a_slow_read_shows_is_judged_from_the_answer_not_from_when_the_read_went_out() -> None:
    # A read sent at 0 and answered at 5 may show a ticket added at 4.9: it has been seen since 5 only.
    memory = queue_values.LockMemory()
    view = _view(0.0, "A@h:1:0000000a", (1, SECOND))
    memory.update(dataclasses.replace(view, answered_at=5.0), None)
    margin = queue.lease.stale_margin(TICKET_LEASE)
    assert memory.judged_by(view.tickets) == pytest.approx(5.0 + TICKET_LEASE + margin)


def test_a_lost_holds_kept_ticket_is_passed_not_waited_for() -> None:
    # H held the lock with the ticket it waited with (kept for its release); it crashed, its lease was
    # broken and Y holds now. H's ticket is a waiter's again in the read, but no one polls for it.
    memory = queue_values.LockMemory()
    crashed = "H@h:1:0000000a"
    memory.update(_view(0.0, crashed, (0, crashed), (1, SECOND)), SECOND)
    view = memory.update(_view(1.0, "Y@h:2:0000000b", (0, crashed), (1, SECOND)), SECOND)
    assert view.position(SECOND) == 1
    assert [t.alias for t in view.passed] == [ticket_alias(MUTEX, 0)]


def test_the_period_counts_the_tickets_that_left_not_the_numbers_between_them() -> None:
    # Waiters that joined together spread their numbers out (10, 14, 20): one grant a second moves the head
    # by 4, then by 6 numbers; the period is still a second, not a quarter or a sixth of one.
    memory = queue_values.LockMemory()
    third = "Third waiter@host:9:0badbeef"
    memory.update(_view(0.0, "A@h:1:0000000a", (10, HEAD), (14, SECOND), (20, third)), None)
    memory.update(_view(1.0, HEAD, (14, SECOND), (20, third)), None)
    memory.update(_view(2.0, SECOND, (20, third)), None)
    assert memory.period == pytest.approx(1.0)


def test_the_memory_learns_the_hold_time_and_when_the_holder_will_release() -> None:
    memory = queue_values.LockMemory()
    memory.update(_view(10.0, "A@h:1:0000000a", (1, SECOND)), None)
    memory.update(_view(10.2, "B@h:2:0000000b", (1, SECOND)), None)  # B granted between 10.0 and 10.2
    # No hold timed from both ends yet: no expected release (the period is no hold time: a head may have sat
    # in front of a hold nobody saw start, and a hint from it would put the head to sleep).
    assert memory.tenure is None and memory.expected_release() is None
    memory.update(_view(12.0, "B@h:2:0000000b", (1, SECOND)), None)
    memory.update(_view(12.2, "C@h:3:0000000c", (1, SECOND)), None)  # B released between 12.0 and 12.2
    assert memory.tenure == pytest.approx(2.0)  # seen from 10.1 to 12.1
    assert memory.expected_release() == pytest.approx(12.1 + 2.0)
    # Reads too far apart to tell: no sample.
    memory.update(_view(20.0, "D@h:4:0000000d", (1, SECOND)), None)
    assert memory.tenure == pytest.approx(2.0)


def test_a_hold_of_this_process_is_timed_as_the_server_saw_it(clock) -> None:
    # Each call reaches the server 0.1 s after it is sent (its answer comes at once). The server saw the
    # lock held from the add's landing to the remove's: the 2 s hold, the release's read (0.1 s) and the
    # remove's way there (0.1 s). Timed from the add's sending to the release's start, it was 2.1 s.
    api = RecordingApi(clock=clock)
    api.on_call = lambda method: clock.sleep(0.1)
    lock = make(api, clock, fair=True)
    lock.acquire()
    clock.sleep(2.0)
    lock.release()
    memory = queue_values.memory_for(api, RES, MUTEX)
    assert memory.tenure == pytest.approx(2.2)


def test_one_hold_stretched_by_a_fault_does_not_move_the_estimates() -> None:
    # Holds of 1 s seen closely, then one of 30 s (a release that waited out its remove): the estimate of
    # the hold time is the median of the recent ones, so the waiters do not sleep through their turns after.
    memory = queue_values.LockMemory()
    at, holds = 0.0, [1.0, 1.0, 1.0, 30.0, 1.0]
    for number, hold in enumerate(holds):
        memory.update(_view(at, f"H{number}@h:1:0000000{number}", (10 + number, SECOND)), None)
        memory.update(_view(at + hold - 0.05, f"H{number}@h:1:0000000{number}", (10 + number, SECOND)), None)
        at += hold
    memory.update(_view(at, "Last@h:1:0000000f", (20, SECOND)), None)
    assert memory.tenure == pytest.approx(1.0, abs=0.1)
    assert memory.period == pytest.approx(1.0, abs=0.1)  # the head's ticket number moved once a hold


def test_a_hold_and_a_wait_seen_with_the_holders_releasing_marker_are_no_samples() -> None:
    # Holds of 1 s seen closely, the head's ticket moving once a hold; one holder's remove got no answer and
    # its release waited 100 s (its marker in every read meanwhile). That hold and that wait are a fault's:
    # neither is a sample of the hold time nor of the period, which time the waiters' sleeps in line.
    memory = queue_values.LockMemory()
    at, holds = 0.0, [1.0, 1.0, 100.0, 1.0, 1.0]
    for number, hold in enumerate(holds):
        token, ticket = f"H{number}@h:{number}:{commitment(MARKER_SECRET)}", (10 + number, SECOND)
        stalled = hold > 10
        memory.update(_view(at, token, ticket), None)
        if stalled:
            memory.update(_view(at + 1.0, token, ticket, releasing=True), None)
        memory.update(_view(at + hold - 0.05, token, ticket, releasing=stalled), None)
        at += hold
    memory.update(_view(at, "Last@h:1:0000000f", (20, SECOND)), None)
    assert memory.tenure_samples and max(memory.tenure_samples) < 2.0
    assert memory.period_samples and max(memory.period_samples) < 2.0
    assert memory.tenure == pytest.approx(1.0, abs=0.1) and memory.period == pytest.approx(1.0, abs=0.1)
    committed = f"Holder@h:1:{commitment(MARKER_SECRET)}"
    assert _view(0.0, committed, releasing=True).releasing and not _view(0.0, committed).releasing
    # A marker that does not prove itself (the token alone, or a token with no commitment) is no release.
    marker = protocol.releasing_alias(MUTEX)
    forged = {MUTEX: _holder(MUTEX, committed), marker: _holder(marker, committed)}
    assert not queue_view(forged, MUTEX, 0.0).releasing
    assert not _view(0.0, HEAD, releasing=True).releasing


def test_a_new_holder_was_granted_about_when_the_one_before_was_expected_to_release() -> None:
    memory = queue_values.LockMemory()
    memory.tenure = 1.0
    memory.update(_view(9.9, None, (1, SECOND)), None)
    memory.update(_view(10.0, "A@h:1:0000000a", (1, SECOND)), None)  # granted at about 9.95
    # Seen next 1.6 s later, with another holder: B was granted after A's expected release (10.95), not
    # anywhere since 10.0.
    memory.update(_view(11.6, "B@h:2:0000000b", (1, SECOND)), None)
    assert memory.holder_lo == pytest.approx(10.95 - queue_values.RELEASE_SLACK * 1.0)
    assert memory.expected_release() == pytest.approx((memory.holder_lo + 11.6) / 2 + 1.0)


def test_a_head_that_waiters_in_line_were_served_past_is_passed_until_its_heartbeat_moves() -> None:
    memory = queue_values.LockMemory()
    a, b = "A@h:1:0000000a", "B@h:2:0000000b"
    # Waiters (A held the lock: an acquisition waits once, so A never queues again).
    d, e, f, g, h = (f"{name}@h:{n}:0000000{n}" for n, name in enumerate("DEFGH", start=4))
    memory.update(_view(10.0, a, (1, HEAD), (2, SECOND)), None)
    # The head itself granted: its ticket is the holder's, nothing passed.
    view = memory.update(_view(10.5, HEAD, (1, HEAD), (2, SECOND)), None)
    assert [t.token for t in view.tickets] == [SECOND] and not memory.passed
    # SECOND is the head; the lock goes to B, then to A2, acquisitions with no ticket (waiters that spin, or
    # code that does not queue): they win hand-offs from a live head that polls too. No sign: not passed.
    line = ((2, SECOND), (3, d), (4, e), (5, f), (6, g), (7, h))
    memory.update(_view(11.0, None, *line), None)
    memory.update(_view(11.3, "A2@h:5:000000a2", *line), None)
    view = memory.update(_view(11.5, b, *line), None)
    assert [t.token for t in view.tickets] == [SECOND, d, e, f, g, h] and not memory.passed
    # D, behind it in line, is served past it (D's ticket is the holder's now): once is no sign (the next in
    # line may fall back past a head asleep on the hint); E served too: passed, by this process.
    view = memory.update(_view(11.8, d, *line), None)
    assert [t.token for t in view.tickets] == [SECOND, e, f, g, h] and not memory.passed
    view = memory.update(_view(12.0, e, (2, SECOND), (5, f), (6, g), (7, h)), None)
    assert [t.token for t in view.tickets] == [f, g, h] and [t.token for t in view.passed] == [SECOND]
    assert memory.others == 4  # still waiting, for crowded(): a releaser goes behind a passed head too
    # Its own waiter never passes itself.
    mine = memory.update(_view(12.1, e, (2, SECOND), (5, f), (6, g), (7, h)), SECOND)
    assert [t.token for t in mine.tickets] == [SECOND, f, g, h]
    # G and then H are served while F (the new head, here) stays: F is passed too.
    memory.update(_view(12.3, g, (2, SECOND), (5, f), (6, g), (7, h)), None)
    view = memory.update(_view(12.6, h, (2, SECOND), (5, f), (7, h)), None)
    assert view.tickets == () and {t.token for t in view.passed} == {SECOND, f}
    # SECOND's heartbeat moves (its waiter is alive): it is the head again.
    alive = queue_view(
        {
            MUTEX: _holder(MUTEX, h),
            ticket_alias(MUTEX, 2): _holder(ticket_alias(MUTEX, 2), ticket_value(SECOND, TICKET_LEASE, 1)),
            ticket_alias(MUTEX, 5): _holder(ticket_alias(MUTEX, 5), ticket_value(f, TICKET_LEASE, 0)),
        },
        MUTEX,
        13.0,
    )
    view = memory.update(alive, None)
    assert [t.token for t in view.tickets] == [SECOND] and [t.token for t in view.passed] == [f]
    # A ticket gone is forgotten.
    memory.update(_view(14.0, h, (2, SECOND)), None)
    assert memory.passed == {}


def test_a_head_that_code_which_does_not_queue_keeps_beating_is_passed_once_no_spinner_can_be_left() -> None:
    # Grants to acquisitions with no ticket count against the head only once its ticket has stood longer
    # than any spin (TICKETLESS_AFTER): a spinner started before it landed has parked by then, and one that
    # started after sees the line and parks at once. After that they are code that does not queue (v1, or
    # fair=False) beating a dead head, which the line behind it would otherwise wait for until its lease.
    memory = queue_values.LockMemory()
    a, d = "A@h:1:0000000a", "D@h:4:0000000d"
    memory.update(_view(10.0, a, (1, HEAD), (2, d)), None)
    after = 10.0 + queue_values.TICKETLESS_AFTER
    memory.update(_view(after - 0.5, "Spinner@h:2:0000000b", (1, HEAD), (2, d)), None)
    memory.update(_view(after, a, (1, HEAD), (2, d)), None)  # a spinner's grant, within the spin: no sign
    assert not memory.overtaken
    memory.update(_view(after + 0.5, "V1a@h:5:000000a5", (1, HEAD), (2, d)), None)
    view = memory.update(_view(after + 1.0, "V1b@h:6:000000a6", (1, HEAD), (2, d)), None)
    assert [t.token for t in view.tickets] == [d] and [t.token for t in view.passed] == [HEAD]


def test_waiters_that_died_together_are_passed_by_the_same_two_grants() -> None:
    # Four waiters at the front died (one execution server went down); the lock goes, by the fallback, to
    # E behind them and then to F: every dead ticket stood through both grants, so all four are passed at
    # once, not one pair of fallbacks (3 s each) after another.
    memory = queue_values.LockMemory()
    dead = [(n, f"Dead{n}@h:{n}:0000000{n}") for n in range(1, 5)]
    e, f, g = "E@h:5:0000000e", "F@h:6:0000000f", "G@h:7:00000001"
    memory.update(_view(10.0, "H@h:9:00000009", *dead, (5, e), (6, f), (7, g)), None)
    view = memory.update(_view(14.0, e, *dead, (5, e), (6, f), (7, g)), None)  # E's ticket is the holder's
    assert [t.token for t in view.tickets][:4] == [token for _, token in dead] and not memory.passed
    view = memory.update(_view(18.0, f, *dead, (6, f), (7, g)), None)  # E released (its ticket went too)
    assert [t.token for t in view.tickets] == [g]  # behind the grantee: not passed
    assert {t.token for t in view.passed} == {token for _, token in dead}


def test_dead_tickets_are_passed_though_no_read_saw_the_short_holds_that_went_past_them() -> None:
    # Reads every few holds of 0.1 s never see a holder: the waiters that left the line behind the dead
    # tickets (served, released, and back at the end with a new ticket) are the sign.
    memory = queue_values.LockMemory()
    dead = [(1, "Dead1@h:1:00000001"), (2, "Dead2@h:2:00000002")]
    e, f, g = "E@h:5:0000000e", "F@h:6:0000000f", "G@h:7:00000001"
    memory.update(_view(10.0, None, *dead, (5, e), (6, f), (7, g)), None)
    view = memory.update(_view(12.0, None, *dead, (6, f), (7, g), (8, e)), None)  # E served, back
    assert not view.passed
    view = memory.update(_view(14.0, None, *dead, (7, g), (8, e), (9, f)), None)  # F served, back
    assert [t.token for t in view.tickets] == [g, e, f]
    assert {t.token for t in view.passed} == {token for _, token in dead}


def test_the_head_sleeps_until_shortly_before_the_expected_release_then_polls_fast(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True)
    fair = lock._queue
    memory = fair.memory
    memory.holder, memory.holder_lo, memory.holder_hi, memory.tenure = "A@h:1:0000000a", 99.0, 101.0, 4.0
    memory.period = 4.5
    clock.now = 102.0
    fair.ticket, fair.head = fair._alias(0), True
    first = fair._head_delay(queue_values.head_interval(memory.cadence()))
    assert first == pytest.approx(100.0 + 4.0 - queue.HINT_LEAD * 4.0 - 102.0)  # one sleep
    clock.now += first
    fast = 4.0 / 10 * (1 + queue.JITTER)
    normal = queue_values.head_interval(memory.cadence())
    around = [fair._head_delay(normal) for _ in range(2)]  # around the expected release: every 1/10 of a hold
    assert all(delay <= fast for delay in around)
    clock.now = 104.0 + queue.HINT_LEAD * 4.0 + 0.1  # past it: slower after each miss, up to the normal
    later = [fair._head_delay(queue_values.head_interval(memory.cadence())) for _ in range(4)]
    assert later[0] > fast and max(later) <= queue_values.head_interval(memory.cadence()) * (1 + queue.JITTER)


def _head_behind(api: RecordingApi, clock, lo: float, hi: float, seen_to: float) -> Tuple[Any, Any]:
    """A head (ticket 0) whose reads showed A, granted between ``lo`` and ``hi`` and last seen at
    ``seen_to``, holds of 0.5 s; the lock under test and its operation."""
    lock = make(api, clock, fair=True)
    fair, memory = lock._queue, lock._queue.memory
    memory.holder, memory.holder_lo, memory.holder_hi, memory.tenure = "A@h:1:0000000a", lo, hi, 0.5
    memory.holder_seen_to, memory.seen_at, memory.period = seen_to, seen_to, 0.75
    op = lock._core.operation("Ours@host:9:0000abcd")
    fair.token, fair.ticket, fair.head = op.token, fair._alias(0), True
    queue_up(api, 0, op.token)
    fair._beat_at = clock.now = seen_to
    return lock, op


def _young_pace(memory: Any) -> float:
    """The longest interval between a head's polls of a young hold."""
    return queue_values.head_interval(memory.cadence()) * (1 + queue.JITTER)


def test_the_head_reads_once_before_it_slows_down_for_a_hold_it_saw_young(clock) -> None:
    # The head polls an old hold (three holds) by the pacing. It times the hold from the reads; between them
    # the lock may have changed hands (a hand-off it lost), and the holder now is young. So the first poll
    # that finds the hold old reads first, once: the read shows B granted since, and the head polls at a
    # young hold's pace again instead of the pacing's 1 s.
    api = RecordingApi()
    lock, op = _head_behind(api, clock, 99.0, 101.0, 101.0)
    fair, memory = lock._queue, lock._queue.memory
    api.services[MUTEX] = {protocol.ATTR_OWNER: "B@h:2:0000000b"}  # B took over, unseen
    clock.now = 102.4  # A seen since 101: surely 1.4 s old, young
    api.calls.clear()
    fair.after_busy(op, 1.0)
    assert api.count("GetReservationDetails") == 0  # young: no read
    clock.now = 102.6  # surely three holds of 0.5 s old by the clock, and no read since
    delay = fair.after_busy(op, 1.0)
    assert api.count("GetReservationDetails") == 1  # read once before slowing down
    assert memory.holder == "B@h:2:0000000b" and not fair._old_hold(clock.now)  # B is young
    assert delay <= _young_pace(memory)
    clock.now = 102.7
    fair.after_busy(op, 1.0)
    assert api.count("GetReservationDetails") == 1  # and not again while B is young


def test_the_head_of_a_long_hold_looks_again_each_time_its_age_doubles(clock) -> None:
    # A read shows A still holding once the hold is old: the head polls by the pacing, and looks again only
    # when the hold's age (from its first read) has doubled since the last look (holds of 0.5 s, seen
    # first at 101), so a hand-off it loses at the end of a long hold is seen in a fraction of it.
    api = RecordingApi()
    lock, op = _head_behind(api, clock, 99.0, 101.0, 101.0)
    fair = lock._queue
    api.services[MUTEX] = {protocol.ATTR_OWNER: "A@h:1:0000000a"}
    api.calls.clear()
    reads = []
    for now in (102.6, 102.8, 103.5, 104.0, 104.3, 106.0, 107.4, 107.7):
        clock.now = now
        fair._beat_at = now  # no heartbeat due
        before = api.count("GetReservationDetails")
        delay = fair.after_busy(op, 1.0)
        if api.count("GetReservationDetails") > before:
            reads.append(now)
    assert reads == [102.6, 104.3, 107.7]
    assert delay >= 1.0  # an old hold, polled by the pacing


def test_a_hold_counts_as_old_only_from_the_first_read_that_showed_it(clock) -> None:
    # Reads far apart (a waiter far back that became the head) date A's grant half way between them: 3 s
    # ago, six holds. But A may have been granted just before the second read, and a young hold polled as
    # old (every second) leaves the lock free for up to a second at its end.
    api = RecordingApi()
    lock, op = _head_behind(api, clock, 95.0, 101.0, 101.0)
    fair = lock._queue
    api.services[MUTEX] = {protocol.ATTR_OWNER: "A@h:1:0000000a"}
    clock.now = 101.2
    assert fair.memory.holder_age(clock.now) > queue.SPIN_HOLDS * 0.5  # old by the estimate ...
    assert fair.after_busy(op, 1.0) <= _young_pace(fair.memory)  # ... but polled as the young hold it may be


def test_the_head_reads_once_when_the_hold_turns_old_even_while_reads_fail(clock) -> None:
    # A failed look is a look: the head does not read before every poll while the server fails reads.
    api = RecordingApi()
    lock, op = _head_behind(api, clock, 99.0, 101.0, 101.0)
    fair = lock._queue
    api.services[MUTEX] = {protocol.ATTR_OWNER: "A@h:1:0000000a"}

    def failing_read(*args: Any) -> bool:
        raise http_500()

    api.faults["GetReservationDetails"] = [failing_read] * 10
    api.calls.clear()
    for now in (102.6, 102.8, 103.0, 103.5, 104.0):
        clock.now = fair._beat_at = now
        fair.after_busy(op, 1.0)
    assert api.count("GetReservationDetails") == 1


def test_a_head_that_lost_a_hand_off_sleeps_on_the_hint_for_the_new_holder(clock) -> None:
    # The hint's state (asleep once, the polls missed since) is about one holder's release: a head that
    # saw B take over from A, granted between reads close together, sleeps until B's expected release
    # instead of polling on at A's missed pace. A grant dated between reads far apart is no time to sleep
    # until: the head polls around it.
    api = RecordingApi()
    lock, _ = _head_behind(api, clock, 99.0, 101.0, 101.0)
    fair, memory = lock._queue, lock._queue.memory
    memory.tenure = 4.0
    clock.now = 101.0
    assert fair._head_delay(1.0) == pytest.approx(100.0 + 4.0 - queue.HINT_LEAD * 4.0 - 101.0)  # asleep
    clock.now = 106.0  # past A's expected release (104): missed polls
    fair._head_delay(1.0)
    fair._head_delay(1.0)
    assert fair._hinted and fair._misses == 2
    memory.holder, memory.holder_lo, memory.holder_hi = "B@h:2:0000000b", 105.8, 106.0
    delay = fair._head_delay(1.0)
    assert delay == pytest.approx(105.9 + 4.0 - queue.HINT_LEAD * 4.0 - 106.0)  # asleep until B's release
    assert fair._misses == 0
    clock.now = 110.0
    memory.holder, memory.holder_lo, memory.holder_hi = "C@h:3:0000000c", 104.0, 110.0  # a wide bracket
    assert fair._head_delay(1.0) <= _young_pace(memory)


def test_progress_is_written_while_waiting_in_line(clock) -> None:
    api, lock = _waiting(clock)
    lock = make(api, clock, fair=True, timeout=40, progress=True, progress_interval=10)
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert ticket_alias(MUTEX, 1) in [alias for _, alias in api.adds]
    assert len(api.output) >= 3 and "waiting for MUTEX held by Holder" in api.output[0]


def test_a_ticket_a_lagging_read_did_not_show_is_still_removed_in_the_end(clock) -> None:
    """A read that lags behind our ticket's add makes the waiter join again; if it is granted before any
    read shows the first ticket, that one must not be forgotten: the late-add watcher removes it."""
    api, lock = _waiting(clock)
    api.clock = clock  # the fake applies what it schedules on virtual time
    first = ticket_alias(MUTEX, 1)
    lagged: List[float] = []

    def lagging_read(*args: Any) -> bool:
        if first in api.services and not lagged:
            lagged.append(clock.now)
            hidden = api.services.pop(first)
            # This read shows the past: our ticket not there yet, and the holder and the head gone.
            api.services.pop(MUTEX, None)
            api.services.pop(ticket_alias(MUTEX, 0), None)
            api.later(clock.now + 0.01, lambda: api.services.__setitem__(first, hidden))
        return False

    api.faults["GetReservationDetails"] = [lagging_read] * 50
    assert lock.acquire()
    assert lagged, "the scenario never happened"
    lock.release()
    watcher = lock.runtime.late_adds
    for _ in range(30):
        clock.sleep(1.0)
        api.land_due()  # the first ticket shows up again, as a read that does not lag shows it
        watcher.sweep()
    assert tickets(api) == []


def test_a_releaser_that_passed_a_live_head_still_goes_behind_it() -> None:
    # The head let two hand-offs go to waiters behind it (it was slow, say): this process passes it, but it
    # still waits, so this process's next acquisition lines up (behind it, in its own view ahead of it)
    # instead of racing.
    memory = queue_values.LockMemory()
    c, d = "C@h:3:0000000c", "D@h:4:0000000d"
    memory.update(_view(10.0, "A@h:1:0000000a", (1, HEAD), (2, c), (3, d)), None)
    memory.update(_view(10.3, c, (1, HEAD), (2, c), (3, d)), None)
    view = memory.update(_view(10.5, d, (1, HEAD), (3, d)), None)
    assert view.tickets == () and [t.token for t in view.passed] == [HEAD]
    assert memory.crowded(10.6)


def test_the_head_adds_at_once_when_the_lock_shows_its_own_late_add(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    op = lock._core.operation("Ours@host:9:0000abcd")
    api.services[MUTEX] = {protocol.ATTR_OWNER: op.token}  # an add of ours without an answer landed
    done, delay = lock._queue.step(op, first=False, default=0.0)
    # Our ticket is the holder's, so we join again, at the head: the add comes at once (it settles that the
    # lock is ours) instead of after the hint's sleep through "the holder's" hold.
    assert done and delay == 0.0


def test_the_heads_sleep_before_a_long_release_wakes_in_time_to_beat_its_ticket(clock) -> None:
    api = RecordingApi()
    lock = make(api, clock, fair=True)
    fair, memory = lock._queue, lock._queue.memory
    memory.holder, memory.holder_lo, memory.holder_hi, memory.tenure = "A@h:1:0000000a", 99.0, 101.0, 600.0
    memory.period = 600.0
    clock.now = 102.0
    fair.ticket, fair.head = fair._alias(0), True
    normal = queue_values.head_interval(memory.cadence())
    assert fair._head_delay(normal) == pytest.approx(
        TICKET_LEASE / 3
    )  # not 538 s: its ticket would look dead
    assert not fair._hinted  # it sleeps again after the beat, until shortly before the release


def _line(first: int, count: int) -> List[Tuple[int, str]]:
    return [(n, f"W{n}@h:{n}:{n:08x}") for n in range(first, first + count)]


def test_a_process_that_has_learnt_no_pace_looks_again_after_two_places_not_half_its_wait(clock) -> None:
    # A fresh process joins 18th in a line of 10 ms holds (a grant every ~0.3 s): its first read and the one
    # it joined by showed different holders, and one ticket leave (no sample: that head's turn began before
    # the first read). One cadence a place is a guess (1 s): half of 17 guesses was a sleep of 8.5 s,
    # through its own turn at ~5 s, the lock idle meanwhile.
    lock = make(RecordingApi(), clock, fair=True)
    fair, memory = lock._queue, lock._queue.memory
    memory.update(_view(0.0, "A@h:1:0000000a", *_line(1, 17)), None)
    memory.update(_view(0.5, "B@h:2:0000000b", *_line(2, 17)), None)
    assert memory.period == queue_values.DEFAULT_PERIOD and memory.tenure is None  # nothing timed
    assert fair._half_way(18, 0.5) <= 1.0  # a look within a second sees the line move, and times the rest


def test_a_look_in_line_takes_the_faster_of_the_rate_it_saw_and_the_cadence(clock) -> None:
    # One place in 0.6 s between two looks (one departure: mostly noise) against a grant every 0.3 s seen
    # by this process: 16 places ahead are 4.8 s away, not 9.6 s, and the look comes half way there.
    lock = make(RecordingApi(), clock, fair=True)
    fair, memory = lock._queue, lock._queue.memory
    memory.period, memory.period_samples = 0.3, collections.deque([0.3])
    fair._place = (18, 3.0)
    assert fair._half_way(17, 3.6) == pytest.approx(16 * 0.3 / 2)


def _next_in_line_behind(clock: Any, own_holds: List[float], line_moved: Optional[float] = None) -> Any:
    """A lock whose process timed ``own_holds`` (and saw the line move every ``line_moved`` s) and saw the
    holder A granted 0.1 s ago, one waiter in front of our ticket: (the lock's queue, our operation)."""
    api = RecordingApi(clock=clock)
    lock = make(api, clock, fair=True, timeout=600)
    fair, memory = lock._queue, lock._queue.memory
    for hold in own_holds:
        memory.own_hold(hold)
    if line_moved is not None:
        memory.period, memory.period_samples = line_moved, collections.deque([line_moved])
    start = clock.now
    memory.update(_view(start - 0.2, "Z@h:0:00000000", (1, HEAD)), None)
    memory.update(_view(start, "A@h:1:0000000a", (1, HEAD)), None)  # granted at start - 0.1
    api.services[MUTEX] = {protocol.ATTR_OWNER: "A@h:1:0000000a"}
    queue_up(api, 1, HEAD)
    op = lock._core.operation("Ours@host:9:0000abcd")
    queue_up(api, 2, op.token)
    fair.ticket, fair._beat_at = fair._alias(2), start  # in line since before those reads, its ticket new
    clock.now = start + 0.1
    return fair, op


def test_the_next_in_line_reads_no_sooner_than_the_hold_it_saw_granted_can_be_over(clock) -> None:
    # Holds of 1 s timed, the holder granted 0.1 s ago: our waiter is the head only once that hold is over and
    # the head's add has landed. A read every third of a hold before then only shows the line where it was.
    fair, op = _next_in_line_behind(clock, [1.0, 1.0, 1.0])
    granted = clock.now - 0.2
    done, delay = fair.step(op, first=False, default=0.0)
    assert not done
    assert clock.now + delay == pytest.approx(granted + 1.0 + queue_values.HANDOFF)


def test_a_releaser_that_lines_up_again_does_not_wait_out_its_own_hold(clock) -> None:
    # The release's read showed this process's own hold (1 s timed): the releaser joins behind the head from
    # that read. Its hold is over, so the head is granted at once: waiting as if that hold could still run
    # would make its first look late, and the head's grant, timed between its looks, seem later than it was.
    fair, op = _next_in_line_behind(clock, [1.0, 1.0, 1.0])
    fair.memory.own_hold(1.0, "A@h:1:0000000a")  # the holder seen is the hold this process just released
    done, delay = fair.step(op, first=False, default=0.0)
    assert not done and delay < 0.5  # not the 1 s hold + HANDOFF


def test_the_next_in_line_still_looks_soon_while_an_add_of_ours_may_land_late(clock) -> None:
    # An add of ours got no answer: the server may apply it seconds later, making the lock ours. The wait for
    # the hold it saw (1.15 s here) must not delay the look that finds it: a landing 0.4 s after our look is
    # seen at the next one, within the landing interval, and the lock is taken as ours at once.
    fair, op = _next_in_line_behind(clock, [1.0, 1.0, 1.0])
    op.add_in_flight(clock.now + 30.0)
    done, delay = fair.step(op, first=False, default=0.0)
    assert not done and delay <= LANDING_READ_INTERVAL
    fair.lock.api.services[MUTEX] = {protocol.ATTR_OWNER: op.token}  # the add lands meanwhile
    clock.now += delay
    assert fair.step(op, first=False, default=0.0) == (True, 0.0)


def test_the_next_in_line_reads_by_the_pace_of_the_line_not_by_one_long_hold_of_its_own(clock) -> None:
    # This process held the lock 30 s once; the line has moved every 0.35 s since. A read after 30 s would
    # sleep through dozens of turns, its own too.
    fair, op = _next_in_line_behind(clock, [30.0], line_moved=0.35)
    done, delay = fair.step(op, first=False, default=0.0)
    assert not done and delay <= 0.35 + queue_values.HANDOFF


def test_the_next_in_line_behind_long_holds_still_reads_before_its_ticket_is_due_a_heartbeat(clock) -> None:
    # Holds of 10 minutes, a grant every 10 minutes: the hold can be over only in 600 s, but the ticket's
    # heartbeat is due every lease/3 after a read, and the line must not wait longer than MAX_INTERVAL.
    fair, op = _next_in_line_behind(clock, [600.0], line_moved=600.0)
    done, delay = fair.step(op, first=False, default=0.0)
    assert not done and delay <= min(TICKET_LEASE / 3, queue_values.MAX_INTERVAL) * (1 + queue.JITTER)


def test_a_long_hold_keeps_the_line_reading_by_the_cadence(clock) -> None:
    # A job's long hold, seen at reads 3.5 s apart: the line does not move, and a look every two places would
    # only cost calls (20 waiters: about 4 calls/s more). Whether this process saw the job come or not.
    for first in ("Job@h:1:0000000a", "Before@h:3:0000000c"):
        lock = make(RecordingApi(), clock, fair=True)
        fair, memory = lock._queue, lock._queue.memory
        memory.update(_view(0.0, first, *_line(1, 9)), None)
        memory.update(_view(0.5, "Job@h:1:0000000a", *_line(1, 9)), None)
        memory.update(_view(4.0, "Job@h:1:0000000a", *_line(1, 9)), None)
        assert not memory.knows_pace()
        assert fair._half_way(10, 4.0) == pytest.approx(9 * memory.cadence() / 2)


def test_holds_of_its_own_longer_than_the_guessed_period_teach_no_pace(clock) -> None:
    # This process held the lock 5 s once: its cadence is still the guessed 1 s a place, and a line of short
    # holds by others still moves many times faster.
    lock = make(RecordingApi(), clock, fair=True)
    fair, memory = lock._queue, lock._queue.memory
    memory.own_hold(5.0)
    assert memory.cadence() == queue_values.DEFAULT_PERIOD and not memory.knows_pace()
    memory.update(_view(0.0, "A@h:1:0000000a", *_line(1, 17)), None)
    memory.update(_view(0.5, "B@h:2:0000000b", *_line(2, 17)), None)
    assert fair._half_way(18, 0.5) <= 1.0
    memory.own_hold(0.1)
    memory.own_hold(0.1)  # the median of its holds: 0.1 s, and a cadence of 0.35 s it can trust
    assert memory.knows_pace()


def test_a_holder_first_seen_in_line_is_timed_from_that_read() -> None:
    from cloudshell_mutex.lock.operation import Operation

    op = Operation("Ours@host:9:0000abcd", 0.0)
    op.contended(0.0)
    op.read_answered(0.1)
    op.see_holder(Holder(MUTEX, "A@h:1:0000000a", "A", "Mutex Service"))
    op.see_holder(Holder(MUTEX, "B@h:2:0000000b", "B", "Mutex Service"), at=12.0)  # a read in line
    assert op.holder_since == 12.0  # not 0.1: B was not seen before 12 s


class SlowAddsApi(RecordingApi):
    """Every add takes ``seconds`` of virtual time, from its send to its answer."""

    def __init__(self, seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def AddServiceToReservation(self, reservationId="", serviceName="", alias="", attributes=()) -> Any:
        try:
            return super().AddServiceToReservation(reservationId, serviceName, alias, attributes)
        finally:  # a busy add answers as late
            self.clock.now += self.seconds


@pytest.mark.parametrize("add_seconds", [0.2, 0.4])
def test_the_head_polls_by_its_interval_from_each_adds_send_and_rests_after_a_slow_answer(
    clock, add_seconds: float
) -> None:
    # Counted from each add's answer, the head's polls came a round trip later than its interval says (at
    # short holds a third of every hand-off's gap); a slow server still slows them down: each add goes out
    # at least HEAD_REST after the last one's answer.
    api = SlowAddsApi(add_seconds)
    api.clock = clock
    lock = make(api, clock, fair=True, timeout=3.2)  # the hold young throughout (3 holds of 1 s, guessed)
    other_holds(api, "Holder@host:1:deadbeef")
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert ticket_alias(MUTEX, 0) in [alias for _, alias in api.adds]  # the head (nobody else waits)
    sends = mutex_adds(api)[2:]  # once it polls as the head
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert len(gaps) >= 3, sends
    interval = queue_values.head_interval(queue_values.DEFAULT_PERIOD)  # nothing learnt: 0.25 s
    for gap in gaps:
        expected = max(interval * (1 - queue.JITTER), add_seconds + queue_values.HEAD_REST)
        latest = max(interval * (1 + queue.JITTER), add_seconds + queue_values.HEAD_REST)
        assert expected - 1e-6 <= gap <= latest + 1e-6, (gaps, add_seconds)


@pytest.mark.parametrize("hold, fallback", [(0.5, queue_values.FALLBACK_FLOOR), (6.0, FALLBACK_AFTER)])
def test_once_the_pace_is_known_a_head_that_does_not_come_after_a_young_hold_is_passed_sooner(
    clock, hold: float, fallback: float
) -> None:
    """A process that saw the line move a grant every 0.3 s, and holds 0.3 s itself, passes a head that
    leaves the lock free after a young hold in FALLBACK_FLOOR (1 s), not FALLBACK_AFTER (3 s): at short
    holds the fixed fallback left the lock idle for ten hand-offs per dead head. After a hold of 3 holds
    or more (one a live head polls by the pacing, a second or more apart) it still waits FALLBACK_AFTER."""
    api = RecordingApi()
    memory = queue_values.memory_for(api, RES, MUTEX)
    now = clock.now
    a, b, c, d = "A@h:1:0000000a", "B@h:2:0000000b", "C@h:3:0000000c", "D@h:4:0000000d"
    memory.update(_view(now - 0.9, a, (1, b), (2, c), (3, d)), None)
    memory.update(_view(now - 0.6, b, (2, c), (3, d)), None)
    memory.update(_view(now - 0.3, c, (3, d)), None)  # the line moved a grant every 0.3 s
    assert memory.fallback_after() == queue_values.FALLBACK_FLOOR
    lock = make(api, clock, fair=True, timeout=60)
    lock.acquire()
    clock.sleep(0.3)
    queue_up(api, 0, HEAD)  # a head that never polls
    lock.release()
    api.services[MUTEX] = {protocol.ATTR_OWNER: "E@h:5:0000000e"}  # the lock goes to a waiter that spun
    released_at = clock.now + hold
    api.later(released_at, lambda: api.services.pop(MUTEX))
    api.adds.clear()
    again = make(api, clock, fair=True, timeout=60)
    again.acquire()
    assert ticket_number(api.adds[0][1], MUTEX) is not None  # parked behind the head
    added = mutex_adds(api)[0] - released_at
    assert fallback <= added < fallback + 0.75, added
    again.release()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]


def test_the_paced_fallbacks_add_that_lands_late_after_its_error_is_its_own(clock) -> None:
    """The add sent by the paced fallback past a dead head gets no reply and lands a second after its
    error: the waiter ends up holding the lock (not waiting on for the dead head), and leaves nothing."""
    api = RecordingApi()
    memory = queue_values.memory_for(api, RES, MUTEX)
    now = clock.now
    a, b, c, d = "A@h:1:0000000a", "B@h:2:0000000b", "C@h:3:0000000c", "D@h:4:0000000d"
    memory.update(_view(now - 0.9, a, (1, b), (2, c), (3, d)), None)
    memory.update(_view(now - 0.6, b, (2, c), (3, d)), None)
    memory.update(_view(now - 0.3, c, (3, d)), None)  # the line moved a grant every 0.3 s
    lock = make(api, clock, fair=True, timeout=60)
    lock.acquire()
    clock.sleep(0.3)
    queue_up(api, 0, HEAD)  # a head that never polls
    lock.release()
    late = lose_the_reply_of_the_add_that_finds_the_lock_free(api, clock)
    again = make(api, clock, fair=True, timeout=60)
    start = clock.now
    assert again.acquire()
    assert late and late[0] - start < FALLBACK_AFTER, (late, start)  # the paced fallback sent it
    assert api.services[MUTEX][protocol.ATTR_OWNER] == again.token
    again.release()
    api.land_due()
    assert MUTEX not in api.services and tickets(api) == [ticket_alias(MUTEX, 0)]  # only the dead head's


def test_a_deadline_in_line_before_the_first_add_still_tries_the_add_once(clock) -> None:
    """Lined up before the first add (others were seen waiting), the deadline comes while in line: the
    first add is still tried once, as the turn comes or the deadline does (here the lock is free: ours)."""
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60)
    lock.acquire()
    queue_up(api, 0, HEAD)  # a head that never polls
    lock.release()  # the release's read shows the queue: the next acquisition lines up first
    api.adds.clear()
    again = make(api, clock, fair=True, timeout=FALLBACK_AFTER / 2)  # ends before the fallback
    start = clock.now
    assert again.acquire()
    assert api.adds[0] == (start, ticket_alias(MUTEX, 1))
    assert mutex_adds(api) and mutex_adds(api)[0] >= start + FALLBACK_AFTER / 2
    again.release()
    assert tickets(api) == [ticket_alias(MUTEX, 0)]


def test_the_looks_in_line_after_a_busy_add_wait_on_the_call_budget(clock) -> None:
    """Each look in line is a try of the acquire's loop: after the first busy add it waits on the call
    budget, as every call of a waiting acquisition does."""
    api = RecordingApi()
    lock = make(api, clock, fair=True, timeout=60, budget=CallBudget(rate=0.1, burst=1, clock=clock))
    other_holds(api, "Holder@host:1:deadbeef")
    queue_up(api, 0, HEAD)
    reads: List[float] = []
    api.on_call = lambda method: reads.append(clock.now) if method == "GetReservationDetails" else None
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert len(reads) <= 8, reads  # one per 10 s


def test_a_waiter_in_line_breaks_a_stale_holder_and_its_add_that_lands_late_is_its_own(clock) -> None:
    # The holder and the head died together. The waiter behind them judges the holder from the line; the
    # add it sends once the holder is broken gets no reply and lands a second later, after the reply's
    # error: the waiter must end up holding it (not waiting on for the dead head), and leave nothing behind.
    api = RecordingApi(attributes=(protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES), clock=clock)
    crashed_holder(api)
    queue_up(api, 0, HEAD)  # the dead head: nobody polls for it
    lock = make(api, clock, fair=True, lease=2, holder_check_interval=0.5, timeout=60)
    late = lose_the_reply_of_the_add_that_finds_the_lock_free(api, clock)
    start = clock.now
    assert lock.acquire()
    assert late, "the scenario never happened: no add after the break"
    assert api.services[MUTEX][protocol.ATTR_OWNER] == lock.token
    assert clock.now - start < 30  # the holder's lease and margin, not the dead ticket's 150 s
    lock.release()
    api.land_due()
    assert MUTEX not in api.services and tickets(api) == [ticket_alias(MUTEX, 0)]  # only the dead head's
