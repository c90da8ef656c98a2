"""Cohort mode on the virtual clock: passes without server calls, the K and T bounds, dead local holders and
waiters, trusted and verified joins. The local lock is the real OS file lock (in a temp dir); processes are
stood in for by separate lock objects (OS file locks exclude handles, not processes)."""

from __future__ import annotations

import contextlib
import random

import pytest
from fakes import RES, FakeApi, http_500, other_holds

from cloudshell_mutex import MutexTimeout, MutexUsageError, protocol
from cloudshell_mutex.lock.cohort import cohort as cohort_module
from cloudshell_mutex.lock.cohort.cohort import CohortMutex, CohortPacing
from cloudshell_mutex.lock.cohort.files import new_file_lock, trust_window
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.lease.lease import ticket_value
from cloudshell_mutex.lock.mutex import handover
from cloudshell_mutex.lock.pacing import CallBudget, FixedPacing
from cloudshell_mutex.lock.protocol import ticket_alias
from cloudshell_mutex.lock.server import catalog

LEASED_MODEL = (protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES)


def cohort(api, clock, directory, owner="driver", **kwargs) -> CohortMutex:
    if api.clock is None:
        api.clock = clock
    kwargs.setdefault("pacing", FixedPacing(0.1))
    kwargs.setdefault("budget", CallBudget(rate=1000, burst=1000, clock=clock))
    kwargs.setdefault("lease", 0)
    names = catalog.FULL if set(api.model_attributes) >= catalog.FULL else catalog.OWNER_ONLY
    catalog.learn(api, protocol.SERVICE_MODEL, names)
    return CohortMutex(
        api,
        RES,
        owner=owner,
        cohort_dir=directory,
        runtime=Runtime(clock, clock.sleep, random.Random(1)),
        **kwargs,
    )


@contextlib.contextmanager
def local_waiter(mutex: CohortMutex, waiter: str = "test-waiter", alive: bool = True):
    """A process of this machine waiting for the local lock: registered, holding its own waiter lock."""
    mark = new_file_lock(mutex._files.waiter_path(waiter))
    if alive:
        mark.acquire()
    with mutex._files.state() as state:
        state.waiters[waiter] = {"pid": 1}
    try:
        yield
    finally:
        with mutex._files.state() as state:
            state.waiters.pop(waiter, None)
        if mark.is_locked:
            mark.release()


def test_an_uncontended_cohort_lock_costs_what_a_plain_one_costs(clock, tmp_path):
    api = FakeApi(clock=clock)
    a = cohort(api, clock, tmp_path)
    a.acquire()
    assert api.calls == ["AddServiceToReservation"] and not a.passed
    a.release()
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails", "RemoveServicesFromReservation"]
    assert not api.services and a.local_state().token is None


def test_a_releaser_with_a_local_waiter_passes_the_server_lock_without_a_call(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "B")
    a.acquire()
    token = a.token
    api.calls.clear()
    with local_waiter(a):
        a.release()
    assert api.calls == []  # the pass: no server call
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == token  # MUTEX stays in place
    state = a.local_state()
    assert state.token == token and state.passes == 1 and state.holder is None
    b.acquire()
    assert api.calls == [] and b.passed and b.token == token and b.locked()
    b.release()  # nobody waits: released to the server, read first
    assert api.calls == ["GetReservationDetails", "RemoveServicesFromReservation"]
    assert not api.services


def test_past_its_bounds_a_cohort_with_nobody_seen_waiting_passes_on_then_yields_blindly(clock, tmp_path):
    api = FakeApi(clock=clock)
    blind = 2 * cohort_module.BLIND_BOUNDS  # passes before it yields whoever waits (K = 2)
    locks = [cohort(api, clock, tmp_path, f"P{i}", max_passes=2, yield_seconds=1.5) for i in range(blind + 2)]
    locks[0].acquire()
    with local_waiter(locks[0]):
        for index, (current, following) in enumerate(zip(locks, locks[1 : blind + 1])):
            api.calls.clear()
            current.release()
            following.acquire()
            assert following.passed
            # Within K passes no call; past them one read, which shows nobody in the queue: passed on.
            assert api.calls == ([] if index < 2 else ["GetReservationDetails"])
        api.calls.clear()
        locks[blind].release()  # BLIND_BOUNDS x K passes: released whoever waits, seen or not
    assert api.calls == ["GetReservationDetails", "RemoveServicesFromReservation"]
    assert locks[blind].local_state().yielded_at is not None
    clock.sleeps.clear()
    api.calls.clear()
    locks[blind + 1].acquire()
    # Held back for yield_seconds (reading now and then) so that other servers' waiters get in; nobody did.
    assert not locks[blind + 1].passed and sum(clock.sleeps) == pytest.approx(1.5)
    assert api.calls == ["GetReservationDetails"] * 3 + ["AddServiceToReservation"]
    locks[blind + 1].release()


def test_past_its_bounds_a_cohort_yields_to_a_waiter_seen_elsewhere_and_lines_up_behind_it(clock, tmp_path):
    api = FakeApi(clock=clock)
    locks = [cohort(api, clock, tmp_path, f"P{i}", max_passes=2, yield_seconds=1.5) for i in range(4)]
    locks[0].acquire()
    with local_waiter(locks[0]):
        for current, following in zip(locks, locks[1:3]):
            current.release()
            following.acquire()
            assert following.passed
        # A waiter on another execution server parks in the queue.
        elsewhere = ticket_alias(protocol.DEFAULT_ALIAS, 0)
        api.services[elsewhere] = {protocol.ATTR_OWNER: ticket_value("Elsewhere@other:1:0000000e", 120, 0)}
        api.calls.clear()
        locks[2].release()  # past K: the read shows the waiter elsewhere, so the lock goes back to the server
    assert api.calls == ["GetReservationDetails"] * 2 + ["RemoveServicesFromReservation"]
    assert locks[2].local_state().yielded_to_queue
    clock.sleeps.clear()
    api.calls.clear()
    # The waiter elsewhere takes its turn a moment later.
    api.later(
        clock.now + 0.3, lambda: api.services.update({protocol.DEFAULT_ALIAS: {protocol.ATTR_OWNER: "E"}})
    )
    api.later(
        clock.now + 0.6, lambda: [api.services.pop(a, None) for a in (protocol.DEFAULT_ALIAS, elsewhere)]
    )
    added = []
    add = api.AddServiceToReservation
    api.AddServiceToReservation = lambda rid, model, alias, attributes=(): (
        added.append(alias) or add(rid, model, alias, attributes)
    )
    start = clock.now
    locks[3].acquire()
    # The next local holder did not hold back with the lock free: it lined up first (a ticket behind the
    # waiter seen, taken by the release's read a moment ago), and was served after that waiter.
    assert added[0] == ticket_alias(protocol.DEFAULT_ALIAS, 1), added
    assert not locks[3].passed and clock.now >= start + 0.6 and sum(clock.sleeps) < 1.5
    locks[3].release()


def test_a_yielding_cohort_that_sees_another_server_take_the_lock_waits_for_it_like_any_waiter(
    clock, tmp_path
):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A", max_passes=0), cohort(api, clock, tmp_path, "B")
    a.acquire()
    with local_waiter(a):
        a.release()  # K = 0: straight back to the server, and the cohort yields
    other_holds(api)  # another execution server's waiter took it at once
    api.late_remove(clock.now + 5)  # ... and releases it 5 s later
    api.calls.clear()
    b.acquire()
    assert api.calls[0] == "GetReservationDetails" and api.calls.count("AddServiceToReservation") > 1
    assert clock.now >= 1000 + 5  # it waited for the other server's turn, not just the yield
    b.release()


def test_no_passes_after_max_pass_seconds(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A", max_pass_seconds=5), cohort(api, clock, tmp_path, "B")
    a.acquire()
    clock.sleep(6)
    # Someone on another execution server waits in the queue (nobody seen: test_past_its_bounds_...).
    elsewhere = ticket_alias(protocol.DEFAULT_ALIAS, 0)
    api.services[elsewhere] = {protocol.ATTR_OWNER: ticket_value("Elsewhere@other:1:0000000e", 120, 0)}
    api.calls.clear()
    with local_waiter(a):
        a.release()
    assert api.calls == ["GetReservationDetails"] * 2 + ["RemoveServicesFromReservation"]
    del api.services[elsewhere]
    b.acquire()
    assert not b.passed
    b.release()


def test_a_dead_waiter_is_not_counted_and_is_dropped(clock, tmp_path):
    api = FakeApi(clock=clock)
    a = cohort(api, clock, tmp_path)
    a.acquire()
    with local_waiter(a, alive=False):  # registered, but its lock is free: its process died
        a.release()
        assert a.local_state().waiters == {}
    assert not api.services  # released to the server: no one to pass it to


def test_a_local_holder_that_died_is_detected_and_the_next_carries_on_after_one_read(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "B")
    a.acquire()
    token = a.token
    a._local.release()  # what the OS does when A's process dies: the local lock is freed, nothing else
    api.calls.clear()
    b.acquire()
    assert b.predecessor is not None and b.predecessor["owner"] == "A"
    assert b.passed and b.token == token
    # Told to the people watching the sandbox (as a break is), then verified, never trusted after a death.
    assert api.calls == ["WriteMessageToReservationOutput", "GetReservationDetails"]
    [line] = api.output
    assert "WARNING: B: the local holder of MUTEX in reservation" in line  # styled as a warning
    assert "(pid " in line and ", A) died holding it" in line and "may be half done" in line
    b.release()
    assert not api.services


def test_a_passed_lock_that_was_taken_meanwhile_is_acquired_from_the_server_again(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "B")
    a.acquire()
    with local_waiter(a):
        a.release()
    del api.services[protocol.DEFAULT_ALIAS]  # a protocol violator removed it (the original snippet's exit)
    other_holds(api)
    clock.sleep(trust_window(0) + 1)  # too old to trust without a read
    assert b.acquire(blocking=False) is False
    assert b.local_state().token is None and b.local_state().holder is None
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"


def test_with_a_lease_the_next_holder_trusts_a_fresh_pass_and_keeps_heartbeating(clock, tmp_path):
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    a, b = cohort(api, clock, tmp_path, "A", lease=3), cohort(api, clock, tmp_path, "B", lease=3)
    a.acquire()
    token = a.token
    assert a.mutex.renew()
    api.calls.clear()
    with local_waiter(a):
        a.release()
    b.acquire()
    assert api.calls == [] and b.passed and b.mutex.leased
    b.ensure_held()
    assert b.renew()  # the new local holder writes the heartbeat of the same acquisition
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == b.token == token
    b.release()
    assert not api.services


def test_with_a_lease_a_pass_older_than_half_the_lease_is_verified_and_beaten_at_once(clock, tmp_path):
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    a, b = cohort(api, clock, tmp_path, "A", lease=3), cohort(api, clock, tmp_path, "B", lease=3)
    a.acquire()
    with local_waiter(a):
        a.release()
    clock.sleep(2)  # > lease / 2: a waiter elsewhere could be close to judging it stale
    api.calls.clear()
    b.acquire()
    assert api.calls == ["GetReservationDetails", "GetReservationDetails", "SetServiceAttributesValues"]
    b.release()


def test_export_is_refused_in_cohort_mode(clock, tmp_path):
    api = FakeApi(clock=clock)
    a = cohort(api, clock, tmp_path)
    with a, pytest.raises(MutexUsageError, match="cannot be exported"):
        a.export()


def test_a_busy_local_lock_makes_a_non_blocking_acquire_false_and_a_blocking_one_time_out(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "B")
    a.acquire()
    api.calls.clear()
    assert b.acquire(blocking=False) is False
    # Both objects are in this test's process: the error says so instead of calling it "another process".
    with pytest.raises(MutexTimeout, match=r"another command of this process \(pid \d+, A\) on this machine"):
        b.acquire(timeout=0.05)  # the local wait is in real time; the virtual clock does not move
    assert api.calls == []  # a local waiter never polls the server
    assert b.local_state().waiters == {}
    a.release()


def test_a_lock_passed_to_a_waiter_that_gave_up_is_released_by_the_next_one_that_gives_up(clock, tmp_path):
    api = FakeApi(clock=clock)
    a, c = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "C")
    a.acquire()
    with local_waiter(a):
        a.release()  # passed; the waiter then timed out without taking it
    c._tidy_orphan()
    assert not api.services and c.local_state().token is None and not c.locked()


def test_tidying_an_orphan_after_a_timed_out_acquire_waits_for_the_state_lock_only_briefly(clock, tmp_path):
    """The acquire's deadline has passed when it tidies: a process stopped inside the state lock must not
    hold it up by a release's whole STATE_WAIT at each step."""
    api = FakeApi(clock=clock)
    a, c = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "C")
    a.acquire()
    with local_waiter(a):
        a.release()  # passed; the waiter then timed out without taking it
    waits = []
    real_state = c._files.state

    def state(timeout=cohort_module.STATE_WAIT):
        waits.append(timeout)
        return real_state(timeout)

    c._files.state = state
    c._tidy_orphan()
    assert not api.services and not c.locked()
    assert len(waits) >= 3 and max(waits) <= cohort_module.STATE_GRACE, waits


@pytest.mark.parametrize(
    "options, error",
    [
        ({"max_passes": -1}, ValueError),
        ({"max_passes": 1.5}, ValueError),
        ({"max_pass_seconds": float("nan")}, ValueError),
        ({"yield_seconds": "1"}, TypeError),
        ({"local_poll": 0}, ValueError),
    ],
)
def test_bad_cohort_options_fail_when_the_lock_is_made(clock, tmp_path, options, error):
    with pytest.raises(error):
        cohort(FakeApi(clock=clock), clock, tmp_path, **options)


def test_a_cohort_dir_that_cannot_be_made_says_what_to_do(clock, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MutexUsageError, match="cohort_dir="):
        cohort(FakeApi(clock=clock), clock, blocker / "sub")


def test_the_cohort_pacing_polls_more_often_the_longer_it_waits():
    pacing = CohortPacing(start=2.5, end=1.0, steps=6, jitter=0)
    delays = [pacing.next_delay(attempt, 0.0, random.Random(1)) for attempt in range(1, 10)]
    assert delays[0] == 2.5 and delays[6:] == [1.0, 1.0, 1.0]
    assert all(a > b for a, b in zip(delays[:6], delays[1:7]))  # the longest waiter polls most
    jittered = CohortPacing(jitter=0.25)
    assert all(0.75 <= jittered.next_delay(50, 0.0, random.Random(seed)) <= 1.25 for seed in range(50))
    with pytest.raises(ValueError):
        CohortPacing(start=1.0, end=2.0)


def test_a_pass_hands_on_the_heartbeats_write_time_not_a_later_read(clock):
    """A read that shows our token is not a heartbeat: a waiter elsewhere judges the lease from the value
    it last saw change. An add whose reply was lost, settled by a read 40 s later, is confirmed as of the
    add's send time, so a successor must not trust it for another trust window from the read."""
    from urllib3.exceptions import ProtocolError

    from cloudshell_mutex import ReservationMutex
    from cloudshell_mutex.lock.server.late_adds import LateAdds

    api = FakeApi(attributes=(protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES), clock=clock)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.FULL)
    mutex = ReservationMutex(
        api, RES, owner="A", runtime=Runtime(clock, clock.sleep, late_adds=LateAdds(clock)), lease=60.0,
        timeout=120.0, budget=CallBudget(rate=1000, burst=1000, clock=clock),
    )  # fmt: skip
    start = clock.now

    def commit_then_reset(rid, model, alias, attributes):
        api.commit_add(rid, model, alias, list(attributes))
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    def reads_fail_for_40_s(rid):
        if clock.now < start + 40:
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [commit_then_reset]
    api.faults["GetReservationDetails"] = [reads_fail_for_40_s] * 1000
    assert mutex.acquire()
    assert clock.now - start >= 40  # settled by a read long after the add
    passed = handover.hand_over(mutex)
    confirmed, lease_seconds = passed.confirmed_at, passed.lease
    assert lease_seconds == 60.0
    assert confirmed - start < 1.0, "the pass must carry the add's send time, not the settling read's"
    assert confirmed + trust_window(60.0) < start + 60.0  # trusted only while no waiter can break it


def _marker_of_a_release_whose_remove_lands_late(api, clock, lock) -> str:
    """Release ``lock`` while its remove lands 2 s late (the holder marks the lock meanwhile): the marker's
    ``Mutex Owner`` as the server had it."""
    from urllib3.exceptions import ProtocolError

    marker, seen = protocol.releasing_alias(protocol.DEFAULT_ALIAS), {}

    def late_and_reset(reservation_id, aliases):
        api.late_remove(clock.now + 2.0)
        clock.now += 0.05
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    def look(method):
        if marker in api.services:
            seen["value"] = api.services[marker][protocol.ATTR_OWNER]

    api.faults["RemoveServicesFromReservation"] = [late_and_reset]
    api.on_call = look
    lock.release()
    api.on_call = None
    assert marker not in api.services and protocol.DEFAULT_ALIAS not in api.services
    return seen.get("value", "")


@pytest.mark.parametrize("how", ["passed", "after a holder that died"])
def test_a_cohort_successor_can_mark_the_lock_releasing_with_the_acquirers_secret(clock, tmp_path, how):
    """The cohort's state file (this machine's disk) carries the secret the token commits to, so whoever holds
    the cohort's server lock next may mark it releasing, and waiters believe it. It is never shown."""
    from cloudshell_mutex.lock.cohort.files import describe_local
    from cloudshell_mutex.lock.holder import proves_release

    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A", request_lifetime=30), cohort(api, clock, tmp_path, "B")
    a.acquire()
    token = a.token
    if how == "passed":
        with local_waiter(a):
            a.release()
    else:
        a._local.release()  # A's process died holding it
    state = a.local_state()
    assert state.token_secret() is not None and state.secret not in repr(state)
    assert state.secret not in describe_local(state, token)
    b.acquire()
    assert b.passed and b.token == token
    value = _marker_of_a_release_whose_remove_lands_late(api, clock, b)
    assert proves_release(value, token), value
    assert b.local_state().secret is None  # gone with the token


def test_a_cohort_state_whose_secret_does_not_fit_its_token_marks_nothing(clock, tmp_path):
    """A secret that the recorded token does not commit to (a damaged file, another token's) is not used:
    the successor then never marks the lock, rather than marking it with a marker nobody believes."""
    api = FakeApi(clock=clock)
    a, b = cohort(api, clock, tmp_path, "A"), cohort(api, clock, tmp_path, "B", request_lifetime=30)
    a.acquire()
    with local_waiter(a):
        a.release()
    with a._files.state() as state:
        state.secret = "00" * 16
    assert a.local_state().token_secret() is None
    b.acquire()
    assert b.passed
    assert _marker_of_a_release_whose_remove_lands_late(api, clock, b) == ""  # no marker added


def test_past_its_bounds_a_read_that_fails_counts_as_someone_waiting_elsewhere(clock, tmp_path):
    # The read that asks whether anyone elsewhere waits gets no answer: the cohort cannot tell, so it does not
    # keep the lock on a guess: it releases it to the server (its own release reads again, and removes).
    api = FakeApi(clock=clock)
    locks = [cohort(api, clock, tmp_path, f"P{i}", max_passes=1) for i in range(3)]
    locks[0].acquire()
    with local_waiter(locks[0]):
        locks[0].release()
        locks[1].acquire()
        assert locks[1].passed
        failed = []

        def no_answer(*args) -> bool:
            if not failed:
                failed.append(clock.now)
                raise http_500()
            return False

        api.faults["GetReservationDetails"] = [no_answer] * 10
        api.calls.clear()
        locks[1].release()  # past K: the read fails, so the lock goes back to the server
    assert failed and api.calls == ["GetReservationDetails"] * 2 + ["RemoveServicesFromReservation"]
    assert protocol.DEFAULT_ALIAS not in api.services
    state = locks[1].local_state()
    assert state.yielded_at is not None and state.yielded_to_queue
    clock.sleeps.clear()
    locks[2].acquire()  # lines up (nobody is there: it adds at once), with no pause
    assert not locks[2].passed and sum(clock.sleeps) < cohort_module.DEFAULT_YIELD_SECONDS
    locks[2].release()
