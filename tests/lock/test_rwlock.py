"""ReservationRWLock's protocol steps on the in-memory fake with a virtual clock.

Each test is a decision the lock must take on a read that may lag, or after a request whose reply was
lost: the fake serves a chosen stale snapshot (``LaggingApi.stale``) or applies a request at a chosen
virtual time (``api.later``), so each scenario is deterministic. Process and emulator tests are in
test_rwlock_processes.py.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any, Dict, List

import pytest
from fakes import RES, FakeApi
from urllib3.exceptions import ProtocolError

from cloudshell_mutex import (
    MutexLostError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
    ReservationMutex,
    ReservationRWLock,
    protocol,
)
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.holder import is_read_group
from cloudshell_mutex.lock.lease.lease import ticket_value
from cloudshell_mutex.lock.pacing import CallBudget, FixedPacing
from cloudshell_mutex.lock.server import catalog
from cloudshell_mutex.lock.server.late_adds import LateAdds

MUTEX = protocol.DEFAULT_ALIAS
GROUP = "read-group#reader X@host:1:0000aaaa"
CLOSER = "reader Y@host:2:0000bbbb"
OWNER = protocol.ATTR_OWNER


class LaggingApi(FakeApi):
    """The fake, whose next reads can be served from older snapshots (reads that lag behind commits)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stale: List[Dict[str, Dict[str, str]]] = []

    def GetReservationDetails(self, reservationId="", disableCache=False) -> Any:
        if not self.stale:
            return super().GetReservationDetails(reservationId, disableCache)
        fresh, self.services = self.services, self.stale.pop(0)
        try:
            return super().GetReservationDetails(reservationId, disableCache)
        finally:
            self.services = fresh


def make_rw(api: FakeApi, clock, owner: str = "reader R", **kwargs: Any) -> ReservationRWLock:
    if api.clock is None:
        api.clock = clock
    kwargs.setdefault("pacing", FixedPacing(0.1))
    kwargs.setdefault("budget", CallBudget(rate=1000, burst=1000, clock=clock))
    kwargs.setdefault("timeout", 30.0)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)  # as after this process's first add
    return ReservationRWLock(
        api,
        RES,
        owner=owner,
        runtime=Runtime(clock, clock.sleep, random.Random(1), LateAdds(clock)),
        max_readers=4,
        **kwargs,
    )


def reset() -> ProtocolError:
    return ProtocolError("Connection aborted.", ConnectionResetError())


def test_one_reader_opens_the_group_and_closes_it(clock):
    api = FakeApi(clock=clock)
    rw = make_rw(api, clock)
    with rw.read() as side:
        assert is_read_group(_holder(api))
        assert api.services[MUTEX][OWNER] == side.token
        assert sorted(api.services) == [MUTEX, side._slot.name]
    assert api.services == {}
    # read, slot add, MUTEX add | group read, slot read + remove, read (others?), closer add, read,
    # group read + remove, closer read + remove
    assert rw.calls == 13


def test_a_second_reader_joins_and_only_the_last_one_closes(clock):
    api = FakeApi(clock=clock)
    first, second = make_rw(api, clock, "reader A"), make_rw(api, clock, "reader B")
    first.read().acquire()
    second.read().acquire()
    assert first.read().token == second.read().token
    first.read().release()
    assert MUTEX in api.services  # B still reads: the group stays
    second.read().release()
    assert api.services == {}


def test_a_joiner_never_joins_on_a_read_that_does_not_show_its_own_slot(clock):
    """Reality: a closer (MUTEX~c) found no readers and is about to remove the group's MUTEX. A read that
    lags shows the group open and no closer. Joining on it would read without MUTEX a moment later."""
    api = LaggingApi(clock=clock)
    api.services = {MUTEX: {OWNER: GROUP}, MUTEX + "~c": {OWNER: CLOSER}}
    old = {MUTEX: {OWNER: GROUP}}
    api.stale = [copy.deepcopy(old), copy.deepcopy(old)]  # the entry read and the one after the slot add
    # The closer's remove of MUTEX and of its MUTEX~c land 2 s from now.
    api.later(clock.now + 2.0, lambda: [api.services.pop(a, None) for a in (MUTEX, MUTEX + "~c")])
    rw = make_rw(api, clock)
    rw.read().acquire()
    token = rw.read().token
    assert token != GROUP and is_read_group(api.services and _holder(api))
    assert api.services[MUTEX][OWNER] == token  # it opened a group of its own after the old one closed
    rw.read().release()
    assert api.services == {}


def _holder(api: FakeApi):
    from cloudshell_mutex.lock.holder import Holder

    return Holder(MUTEX, api.services[MUTEX][OWNER], "", protocol.SERVICE_MODEL)


def test_a_reader_waits_while_a_writer_waits_and_the_writer_gets_in(clock):
    api = FakeApi(clock=clock)
    reader, writer = make_rw(api, clock, "reader A"), make_rw(api, clock, "writer W")
    reader.read().acquire()
    api.services[MUTEX + "~w"] = {OWNER: "writer W@host:3:0000cccc"}  # W is waiting
    late = make_rw(api, clock, "reader B", timeout=1.0)
    with pytest.raises(MutexTimeout, match="a writer is waiting"):
        late.read().acquire()
    assert sorted(api.services) == sorted([MUTEX, MUTEX + "~w", reader.read()._slot.name])  # none of B's
    reader.read().release()
    del api.services[MUTEX + "~w"]
    with writer.write() as side:
        assert api.services[MUTEX][OWNER] == side.token
        assert not late.read().acquire(blocking=False)
    assert api.services == {}


def test_a_busy_writer_holds_the_waiting_marker_until_it_has_the_lock(clock):
    api = FakeApi(clock=clock)
    reader, writer = make_rw(api, clock, "reader A"), make_rw(api, clock, "writer W")
    reader.read().acquire()
    seen: List[bool] = []

    def release_reader_on_the_third_try(reservation_id, model, alias, attributes) -> bool:
        if alias == MUTEX:
            seen.append(MUTEX + "~w" in api.services)
            if len(seen) == 3:
                reader.read().release()
        return False

    api.faults["AddServiceToReservation"] = [release_reader_on_the_third_try] * 5
    writer.write().acquire()
    assert seen[:3] == [False, True, True]  # the first try without it; then it waited with the marker
    assert _not_tickets(api) == [MUTEX]  # and gave it back once it held MUTEX
    assert not is_read_group(_holder(api))
    writer.write().release()
    assert api.services == {}  # its queue ticket went with the lock


def test_an_opening_add_whose_reply_was_lost_is_settled_as_ours(clock):
    api = FakeApi(clock=clock)
    rw = make_rw(api, clock)

    def commit_then_reset(reservation_id, model, alias, attributes):
        if alias != MUTEX:
            return False  # the slot's add goes through
        api.commit_add(reservation_id, model, alias, list(attributes))
        raise reset()

    api.faults["AddServiceToReservation"] = [commit_then_reset, commit_then_reset]
    rw.read().acquire()
    assert api.services[MUTEX][OWNER] == rw.read().token  # the group is ours: not left behind, not doubled
    rw.read().release()
    assert api.services == {}


def test_a_closer_decides_nothing_on_a_read_that_does_not_show_its_own_closer_service(clock):
    """The leaving reader's read lags: it shows no reader slots, though one was taken since. Removing the
    group on it would leave that reader reading without MUTEX."""
    api = LaggingApi(clock=clock)
    first, second = make_rw(api, clock, "reader A"), make_rw(api, clock, "reader B")
    first.read().acquire()
    second.read().acquire()
    group = first.read().token

    def lagging_from_now(*args: Any) -> bool:
        # From the closer's add on, the next read shows the state before it: no closer, no slot of B's.
        api.stale = [{MUTEX: {OWNER: group}}]
        return False

    api.faults["AddServiceToReservation"] = [lagging_from_now]
    # A's check of its group and its slot's release read fresh; its look for other readers lags too.
    api.stale = [copy.deepcopy(api.services), copy.deepcopy(api.services), {MUTEX: {OWNER: group}}]
    first.read().release()
    assert api.services[MUTEX][OWNER] == group  # B still reads under the group's MUTEX
    assert second.read().locked()
    second.read().release()
    assert api.services == {}


def test_a_lost_group_is_reported_at_release(clock):
    api = FakeApi(clock=clock)
    rw = make_rw(api, clock)
    rw.read().acquire()
    api.services[MUTEX] = {OWNER: "someone else@host:4:0000dddd"}  # force-released and taken meanwhile
    with pytest.raises(MutexLostError):
        rw.read().release()
    assert MUTEX in api.services and len(api.services) == 1  # nothing of the other holder's was removed


def test_one_side_at_a_time_and_no_nesting(clock):
    api = FakeApi(clock=clock)
    rw = make_rw(api, clock)
    with rw.read():
        with pytest.raises(MutexUsageError, match="release the read side"):
            rw.write().acquire()
        with pytest.raises(MutexUsageError, match="already reads"):
            rw.read().acquire()
    with rw.write(), pytest.raises(MutexUsageError, match="for writing"):
        rw.read().acquire()


@pytest.mark.parametrize("bad", [0, 65, 2.5, True, "8"])
def test_bad_max_readers_is_refused_when_the_lock_is_made(clock, bad):
    with pytest.raises((TypeError, ValueError), match="max_readers"):
        ReservationRWLock(FakeApi(clock=clock), RES, max_readers=bad)


LEASED_MODEL = (
    protocol.ATTR_OWNER,
    protocol.ATTR_LABEL,
    protocol.ATTR_LEASE_SECONDS,
    protocol.ATTR_HEARTBEAT,
    protocol.ATTR_GENERATION,
)


@pytest.mark.parametrize("alias", [MUTEX, MUTEX + "~r1"])
def test_readers_break_a_crashed_writers_lock_or_a_crashed_readers_slot_after_lease_and_margin(clock, alias):
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    dead = "dead party@host:9:0000eeee"
    api.services[alias] = {
        OWNER: dead,
        protocol.ATTR_LEASE_SECONDS: "2",
        protocol.ATTR_HEARTBEAT: "0000eeee:p:1",
    }
    if alias != MUTEX:  # a dead reader in a group: every slot taken, so the slot must be recovered
        api.services[MUTEX] = {OWNER: GROUP}
        for index in range(2, 5):
            api.services[f"{MUTEX}~r{index}"] = {OWNER: f"dead party@host:9:0000eee{index}"}
    rw = make_rw(api, clock, lease=2.0)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    start = clock.now
    rw.read().acquire()
    assert 3.0 <= clock.now - start < 6.0  # lease 2 s + margin 1 s on the reader's own clock, then the break
    assert any(
        f"broke the stale {'lock' if alias == MUTEX else 'reader slot'} {alias!r}" in m for m in api.output
    )
    assert "~break" not in "".join(api.services)  # the breaker gave its alias back


def test_a_writers_lock_without_a_lease_is_never_broken_by_readers(clock):
    api = FakeApi(clock=clock)
    api.services[MUTEX] = {OWNER: "v1 or old code"}
    rw = make_rw(api, clock, timeout=120.0)
    with pytest.raises(MutexTimeout, match="MUTEX is held by"):
        rw.read().acquire()
    assert api.services[MUTEX] == {OWNER: "v1 or old code"}


def test_a_group_add_that_lands_after_its_opener_gave_it_up_is_never_removed_blindly(clock):
    """The opener's add of MUTEX gets no answer and lands 3 s later, after the opener gave it up. A plain
    mutex's watcher removes such an add when it sees its token; for a group that would pull MUTEX from under
    the readers who joined it meanwhile. Here the opener itself joins it, and the watcher must leave it."""
    api = FakeApi(clock=clock)
    late_adds = LateAdds(clock)
    rw = make_rw(api, clock)
    # What a plain mutex of this process would hand its late adds to.
    args = rw._core.mutex_args
    args["runtime"] = dataclasses.replace(args["runtime"], late_adds=late_adds)
    lands_at = clock.now + 3.0

    def unanswered(reservation_id, model, alias, attributes):
        if alias != MUTEX or clock.now >= lands_at:
            return False
        if not api.scheduled:
            api.later(lands_at, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
        raise reset()

    api.faults["AddServiceToReservation"] = [unanswered] * 200
    rw.read().acquire()
    phantom = api.services[MUTEX][OWNER]
    assert rw.read().token == phantom  # it joined the group its own lost add opened
    late_adds.sweep()
    clock.now += 200
    late_adds.sweep()
    assert api.services[MUTEX][OWNER] == phantom  # still there: no watcher removed it under the reader
    rw.read().release()
    assert api.services == {}


def test_a_waiting_reader_closes_a_group_left_without_readers_so_a_waiting_writer_gets_in(clock):
    api = FakeApi(clock=clock)  # the original model: no lease, so no writer could ever break the group
    api.services = {MUTEX: {OWNER: GROUP}, MUTEX + "~w": {OWNER: "writer W@host:3:0000cccc"}}
    reader = make_rw(api, clock, "reader B")
    assert not reader.read().acquire(blocking=False)
    assert sorted(api.services) == [MUTEX + "~w"]  # the empty group was closed; the writer's turn


def test_a_waiting_reader_closes_a_group_left_without_readers_so_a_queued_waiter_gets_in(clock):
    """A plain waiter parks behind a read group (its ticket stops readers joining), so nobody would ever close
    a group left without readers: on the original model no lease ends it either."""
    api = FakeApi(clock=clock)
    ticket = protocol.ticket_alias(MUTEX, 1)
    waiter = ticket_value("waiter W@host:3:0000cccc", 120.0, 0)
    api.services = {MUTEX: {OWNER: GROUP}, ticket: {OWNER: waiter}}
    reader = make_rw(api, clock, "reader B")
    assert not reader.read().acquire(blocking=False)
    assert sorted(api.services) == [ticket]  # the empty group was closed; the queued waiter's turn


def test_a_waiting_reader_leaves_a_group_without_readers_to_the_closer_at_work_on_it(clock):
    """The last reader gave its slot back and is closing (its MUTEX~c is there): a second close would only
    wait for MUTEX~c, calling the server meanwhile."""
    api = FakeApi(clock=clock)
    waiter = ticket_value("waiter W@host:3:0000cccc", 120.0, 0)
    ticket = protocol.ticket_alias(MUTEX, 1)
    closing = {MUTEX: {OWNER: GROUP}, MUTEX + "~c": {OWNER: CLOSER}, ticket: {OWNER: waiter}}
    api.services = copy.deepcopy(closing)
    reader = make_rw(api, clock, "reader B")
    assert not reader.read().acquire(blocking=False)
    assert api.services == closing
    assert api.calls == ["GetReservationDetails"]


def test_a_closer_whose_remove_may_still_land_keeps_the_closer_service_until_release_finishes_it(
    clock, caplog
):
    """The last reader's remove of the group's MUTEX gets no answer (it lands 60 s later), and its next reads
    fail: release() raises. If the closer then let go of MUTEX~c and forgot its remove, a reader could join
    the group before the remove lands, and read beside the writer who adds MUTEX after it."""
    api = FakeApi(clock=clock)
    first = make_rw(api, clock, "reader A")
    first.read().acquire()
    group = first.read().token
    failing = {"reads": 0}

    def remove_lands_late(reservation_id, services):
        if MUTEX in services and not api.scheduled:
            api.later(clock.now + 60.0, lambda: api.services.pop(MUTEX, None))
            failing["reads"] = 5
            raise reset()
        return False

    def read_fails(reservation_id):
        if failing["reads"] > 0:
            failing["reads"] -= 1
            raise reset()
        return False

    api.faults["RemoveServicesFromReservation"] = [remove_lands_late] * 50
    api.faults["GetReservationDetails"] = [read_fails] * 500
    with pytest.raises(MutexReleaseError, match="read group") as raised:
        first.read().release()
    assert "MUTEX~c" in str(raised.value) and "Do not remove 'MUTEX' by hand" in str(raised.value)
    assert "remove it from the reservation" not in caplog.text  # nobody is told to remove a shared group
    assert not first.read().locked()
    assert api.services[MUTEX][OWNER] == group and MUTEX + "~c" in api.services  # still held, both

    second = make_rw(api, clock, "reader B")
    assert not second.read().acquire(blocking=False)  # no joining while the close is unfinished
    clock.now += 61  # the remove lands
    writer = ReservationMutex(api, RES, owner="writer W", runtime=Runtime(clock, clock.sleep), timeout=5.0)
    assert writer.acquire()
    assert not second.read().locked()

    first.read().release()  # finishes the close: its remove landed; the writer's MUTEX is left alone
    assert writer.locked() and api.services[MUTEX][OWNER] == writer.token
    assert sorted(api.services) == [MUTEX]
    first.read().release()  # nothing left to do


def test_an_opener_interrupted_at_its_add_never_removes_the_group_a_reader_joined_meanwhile(clock):
    """Ctrl-C reaches the opener just after its add of MUTEX committed, and another reader joins the group in
    that instant. A plain mutex's interrupt clean-up removes its add when a read shows it: for a group that
    would leave the joiner reading without MUTEX. The opener only gives its slot back and closes."""
    api = FakeApi(clock=clock)
    opener, joiner = make_rw(api, clock, "reader A"), make_rw(api, clock, "reader B")
    state = {"interrupted": False}

    def commit_then_interrupt(reservation_id, model, alias, attributes):
        if alias != MUTEX or state["interrupted"]:
            return False
        state["interrupted"] = True
        api.commit_add(reservation_id, model, alias, list(attributes))
        assert joiner.read().acquire()  # the joiner's snapshot shows its slot, the group and no closer
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [commit_then_interrupt] * 20
    with pytest.raises(KeyboardInterrupt):
        opener.read().acquire()
    assert not opener.read().locked() and joiner.read().locked()
    assert api.services[MUTEX][OWNER] == joiner.read().token  # the joiner still reads under the group
    assert sorted(api.services) == [MUTEX, joiner.read()._slot.name]  # the opener's slot was given back
    joiner.read().ensure_held(read=True)
    joiner.read().release()
    assert api.services == {}


def _not_tickets(api: FakeApi) -> List[str]:
    """The services, without queue tickets (a holder keeps its own until its release removes it)."""
    return sorted(a for a in api.services if protocol.ticket_number(a, MUTEX) is None)


def _silent_group(api: FakeApi) -> None:
    """A group left without heartbeats (its members crashed, or both skipped the close on lagging reads)."""
    api.services[MUTEX] = {
        OWNER: GROUP,
        protocol.ATTR_LEASE_SECONDS: "2",
        protocol.ATTR_HEARTBEAT: "0000aaaa:p1:7",
    }


def _waiter(api: FakeApi, clock, owner: str = "writer W", timeout: float = 30.0) -> ReservationMutex:
    budget = CallBudget(rate=1000, burst=1000, clock=clock)
    return ReservationMutex(
        api, RES, owner=owner, runtime=Runtime(clock, clock.sleep), lease=2.0, timeout=timeout, budget=budget
    )


def test_a_reader_never_joins_a_group_a_waiter_is_breaking(clock):
    """The waiter judged the silent group stale, took MUTEX~break and re-read it unchanged; its remove is on
    the wire. A reader whose read shows its own slot and the group (no closer, no writer marker) must not
    join now: the remove lands, the waiter adds MUTEX, and both would hold it."""
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    _silent_group(api)
    reader = make_rw(api, clock, lease=2.0)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    joined: Dict[str, bool] = {}

    def reader_comes_before_the_remove(reservation_id, services):
        if MUTEX in services and not joined:
            joined["ok"] = reader.read().acquire(blocking=False)
        return False

    api.faults["RemoveServicesFromReservation"] = [reader_comes_before_the_remove] * 10
    writer = _waiter(api, clock)
    assert writer.acquire()
    assert joined == {"ok": False} and not reader.read().locked()
    assert api.services[MUTEX][OWNER] == writer.token and _not_tickets(api) == [MUTEX]
    writer.release()
    assert api.services == {}  # its queue ticket went with the lock


def test_a_waiter_breaks_a_silent_group_only_once_its_reader_slots_show_no_sign_of_life(clock):
    """A group's own heartbeat is silent, but a reader slot keeps changing (a reader joining, whose heartbeat
    of the group is yet to come): the waiter must not break the group under it. Once the slot too is silent
    for its lease + margin (a crashed reader's), the group is broken."""
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    _silent_group(api)
    slot = MUTEX + "~r1"
    api.services[slot] = {OWNER: "reader Z@host:5:0000ffff", protocol.ATTR_LEASE_SECONDS: "2"}
    beats = {"n": 0}

    def slot_beats(method: str) -> None:
        beats["n"] += 1
        api.services[slot][protocol.ATTR_HEARTBEAT] = f"0000ffff:p:{beats['n']}"

    api.on_call = slot_beats
    with pytest.raises(MutexTimeout):
        _waiter(api, clock, timeout=20.0).acquire()
    assert api.services[MUTEX][OWNER] == GROUP  # not broken under a live reader
    api.on_call = None  # the reader crashed
    start = clock.now
    writer = _waiter(api, clock, "writer V")
    assert writer.acquire()
    assert clock.now - start >= 6.0  # the group's lease + margin, then the slot's, on the waiter's clock
    assert api.services[MUTEX][OWNER] == writer.token


def test_a_waiter_never_breaks_a_group_on_a_re_read_that_does_not_show_its_own_breaker(clock):
    """A reader took its slot just before the waiter's MUTEX~break add; the waiter's re-read lags behind both
    and shows the bare group. Breaking on it would pull MUTEX from under that reader."""
    api = LaggingApi(attributes=LEASED_MODEL, clock=clock)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    _silent_group(api)
    slot = MUTEX + "~r1"
    before, fresh = copy.deepcopy(api.services), api.services  # the fake serves a lagging read from `before`

    def slot_taken_first(reservation_id, model, alias, attributes):
        if alias == MUTEX + "~break" and slot not in api.services:
            api.services[slot] = {OWNER: "reader Z@host:5:0000ffff", protocol.ATTR_LEASE_SECONDS: "2"}
            api.stale = [copy.deepcopy(before)]  # the re-read: neither the slot nor the breaker
            api.on_call = slot_beats  # the reader heartbeats its slot from now on
        return False

    def slot_beats(method: str) -> None:
        fresh[slot][protocol.ATTR_HEARTBEAT] = f"0000ffff:p:{len(api.calls)}"

    api.faults["AddServiceToReservation"] = [slot_taken_first] * 50
    with pytest.raises(MutexTimeout):
        _waiter(api, clock, timeout=10.0).acquire()
    assert api.services[MUTEX][OWNER] == GROUP and slot in api.services


def test_a_blocking_writer_waits_on_when_its_first_try_meets_a_failing_server(clock):
    """The writer's one non-blocking try of MUTEX gets HTTP 500s; a blocking acquire must go on waiting (as
    a blocking mutex does through transient failures), not raise a 0 s timeout."""
    api = FakeApi(clock=clock)
    writer = make_rw(api, clock, "writer W")
    failures = {"left": 3}

    def server_error(*args: Any) -> bool:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise reset()
        return False

    api.faults["AddServiceToReservation"] = [server_error] * 10
    api.faults["GetReservationDetails"] = [server_error] * 10
    assert writer.write().acquire()
    assert api.services[MUTEX][OWNER] == writer.write().token
    writer.write().release()
    assert api.services == {}


def test_a_closer_leaves_the_group_to_a_breaker_at_work(clock):
    """A waiter breaking the group re-read it before this closer's MUTEX~c: its remove, sent blind, may land
    after the closer's, on a group a new reader opened meanwhile. So the closer leaves the group to it."""
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    reader = make_rw(api, clock, lease=2.0)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    reader.read().acquire()
    group = reader.read().token
    breaker = {OWNER: "writer W@host:3:0000cccc", protocol.ATTR_LEASE_SECONDS: "2"}
    api.services[MUTEX + "~break"] = breaker
    reader.read().release()
    assert api.services == {MUTEX: api.services[MUTEX], MUTEX + "~break": breaker}
    assert api.services[MUTEX][OWNER] == group  # left to the breaker; no closer service left behind
