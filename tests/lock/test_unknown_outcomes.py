"""A request whose outcome is unknown is never forgotten before it is resolved (roadmap step 5).

Every test here is a scenario in which the lock used to let two parties hold, or leave a lock behind:
a request that got no answer (a reset connection, a client timeout, an interrupt) lands *later* than
its error, after the lock acted on a read that did not show it yet. The fake applies such a request at
a chosen virtual time (``api.later``), so each scenario is deterministic.
"""

from __future__ import annotations

import logging

import pytest
from fakes import RES, FakeApi, http_500, make, other_holds
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from cloudshell_mutex import MutexLostError, MutexReleaseError, MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.holder import (
    make_secret,
    make_token,
    named_token,
    parse_token,
    proves_release,
    releasing_value,
)
from cloudshell_mutex.lock.options import MutexOptions
from cloudshell_mutex.lock.server.alias import LockAlias
from cloudshell_mutex.lock.server.late_adds import LateAdds

MUTEX = protocol.DEFAULT_ALIAS
OTHER = "Other@host:1:deadbeef"


def show_the_past(api: FakeApi, clock, past: dict) -> None:
    """The read being answered shows ``past`` (a read that lags); the next call sees the present again."""
    current = api.services
    api.services = past
    api.later(clock.now, lambda: setattr(api, "services", current))


def reset() -> ProtocolError:
    return ProtocolError("Connection aborted.", ConnectionResetError())


def remove_landing_late(api: FakeApi, clock, delay: float, alias: str = MUTEX):
    """A remove fault: the request removes ``alias`` ``delay`` s later; the client sees a reset at once."""

    def fault(reservation_id, aliases):
        api.later(clock.now + delay, lambda: api.services.pop(alias, None))
        clock.now += 0.05
        raise reset()

    return fault


def owner(api: FakeApi):
    return api.services.get(MUTEX, {}).get(protocol.ATTR_OWNER)


# ---------------------------------------------------------------- removes that land late


def test_a_remove_that_lands_late_is_waited_for_and_never_sent_twice(clock):
    """Scenario 1: the remove is delayed 2 s in the network and its connection reset after 50 ms.
    Removing again on a read that still shows our lock would let a waiter in between the two removes,
    and the late one would delete the waiter's lock."""
    api = FakeApi(clock=clock)
    mutex = make(api, clock)
    mutex.acquire()

    def delayed_and_reset(reservation_id, aliases):
        api.late_remove(clock.now + 2.0)
        clock.now += 0.05
        raise reset()

    api.faults["RemoveServicesFromReservation"] = [delayed_and_reset]
    mutex.release()
    assert not mutex.locked()
    # One remove of the lock; meanwhile the releasing marker told waiters why it stayed held, and went.
    assert api.removed == [MUTEX, protocol.releasing_alias(MUTEX)]
    assert protocol.releasing_alias(MUTEX) not in api.services
    assert 2.0 <= clock.now - 1000.0 < 4.0  # it waited for the late remove, not for the request lifetime
    other_holds(api)  # a waiter takes the lock after the release ...
    clock.now += 600
    api.land_due()
    assert owner(api) == OTHER  # ... and nothing of ours can remove it any more


def test_a_remove_that_never_lands_is_sent_again_only_after_the_request_lifetime(clock):
    api = FakeApi(clock=clock)
    mutex = make(api, clock, request_lifetime=10)
    mutex.acquire()
    sent = []

    def lost(reservation_id, aliases):
        sent.append(clock.now)
        raise ReadTimeoutError(None, "/x", "Read timed out.")  # the client's timeout; it never lands

    api.faults["RemoveServicesFromReservation"] = [lost, lambda *args: sent.append(clock.now)]
    mutex.release()
    assert not mutex.locked() and MUTEX not in api.services
    assert len(sent) == 2 and sent[1] - sent[0] >= 10


def remove_lost_then_landing_before_a_waiter(api: FakeApi, clock, lifetime: float, lands_by: list):
    """A remove fault: no answer (the client's timeout); the remove lands just before it can no longer land
    (``lifetime`` after it, noted in ``lands_by``), and a waiter takes the lock at once."""

    def fault(reservation_id, aliases):
        lands_by.append(clock.now + lifetime)
        api.later(clock.now + lifetime - 0.2, lambda: api.services.pop(MUTEX, None))
        api.later(clock.now + lifetime - 0.1, lambda: other_holds(api))
        raise ReadTimeoutError(None, "/x", "Read timed out.")

    return fault


def read_answered_after(api: FakeApi, clock, lands_by: list) -> None:
    """The read sent 0.5-0.2 s before ``lands_by[0]`` sees the server then, and answers after lands_by."""

    def slow_read(method):
        if (
            method == "GetReservationDetails"
            and lands_by
            and lands_by[0] - 0.5 <= clock.now < lands_by[0] - 0.2
        ):
            clock.now = lands_by[0] + 0.3

    api.on_call = slow_read


def released_with_a_late_add(clock, delay: float, lifetime: float):
    """A lock acquired by its retry after a first add was delayed ``delay`` s and reset, then released: the
    late add is still on its way. Returns the fake, the watcher and the acquisition's token."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=lifetime)
    api.faults["AddServiceToReservation"] = [delayed_add(api, clock, delay)]
    mutex.acquire()
    token = mutex.token
    mutex.release()
    return api, late, token


def test_a_releasing_markers_add_copy_that_lands_after_the_markers_remove_is_removed(clock):
    """The release's remove gets no answer, so it marks the lock as releasing. The marker's add succeeds, but
    only on the client's re-send (a reset 1 s in): the first copy lands after the release removed the marker.
    Answered with success, the add was taken as settled, and that copy stayed in the sandbox for good."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    mutex.acquire()
    marker = protocol.releasing_alias(MUTEX)
    api.faults["RemoveServicesFromReservation"] = [remove_landing_late(api, clock, 2.0)]

    def resent_after_a_reset(reservation_id, model, alias, attributes):
        copy = list(attributes)
        api.later(clock.now + 6.0, lambda: api.commit_add(reservation_id, model, alias, copy))
        clock.now += 1.1  # the client's re-send, 1 s after the reset of the first copy
        return False  # the re-sent copy is added now, with an answer

    api.faults["AddServiceToReservation"] = [resent_after_a_reset]
    mutex.release()
    assert marker not in api.services  # the release took its marker away ...
    clock.now += 10
    api.land_due()
    assert marker in api.services  # ... and the first copy landed after it
    late.sweep()
    clock.now += 30
    late.sweep()
    assert marker not in api.services


def test_a_read_answered_after_our_remove_could_land_but_sent_before_proves_nothing(clock):
    """A release's remove gets no answer and may land until lands_by. A read sent just before its landing but
    answered after lands_by still shows our lock: it saw the server before the remove landed, so the remove
    may have landed since, and a waiter taken the lock. Judged by its answer's time, the release removed
    again, and deleted the waiter's lock."""
    api = FakeApi(clock=clock)
    mutex = make(api, clock, request_lifetime=5)
    mutex.acquire()
    lands_by: list = []
    api.faults["RemoveServicesFromReservation"] = [
        remove_lost_then_landing_before_a_waiter(api, clock, 5, lands_by)
    ]
    read_answered_after(api, clock, lands_by)
    mutex.release()
    assert owner(api) == OTHER and api.removed.count(MUTEX) == 1


def test_the_watcher_never_removes_again_on_a_read_sent_before_its_first_remove_could_land(clock):
    """The late-add watcher's remove of a late add gets no answer; a read sent before that remove could land
    but answered after still shows the late add. A second remove could land on a waiter's lock."""
    api, late, token = released_with_a_late_add(clock, delay=2.0, lifetime=5)
    clock.now += 2.5  # the late add lands after the release
    api.land_due()
    assert owner(api) == token
    lands_by: list = []
    api.faults["RemoveServicesFromReservation"] = [
        remove_lost_then_landing_before_a_waiter(api, clock, 5, lands_by)
    ]
    late.sweep()
    assert lands_by, "the watcher removed the late add"
    read_answered_after(api, clock, lands_by)
    for _ in range(80):
        clock.now += 0.1
        late.sweep()
    assert owner(api) == OTHER and api.removed.count(MUTEX) == 2  # the release's, and the watcher's one


@pytest.mark.parametrize("check_after", [0, 5])
def test_release_after_a_failed_release_continues_it(clock, check_after):
    """Scenario 2: the remove committed but its reply was lost, the reads then failed, so release gave
    up with MutexReleaseError. A waiter took the free lock. The retried release must not remove it."""
    if True:
        api = FakeApi(clock=clock)
        mutex = make(api, clock, release_check_after=check_after)
        mutex.acquire()

        def commit_then_drop(reservation_id, aliases):
            api.commit_remove(reservation_id, aliases)
            raise reset()

        def fail(*args):
            raise http_500()

        api.faults["RemoveServicesFromReservation"] = [commit_then_drop]
        passes = [] if check_after else [lambda *args: False]  # the read before the remove works
        api.faults["GetReservationDetails"] = [*passes, *[fail] * 5]
        with pytest.raises(MutexReleaseError):
            mutex.release()
        assert mutex.locked()  # it may still be held: release() can be called again
        other_holds(api)
        mutex.release()
        assert not mutex.locked()
        assert owner(api) == OTHER
        assert api.removed.count(MUTEX) == 1


def test_by_default_release_reads_first_so_a_foreign_remove_costs_one_lost_lock(clock):
    """Scenario 3: the original snippet removes MUTEX without owning it; someone takes the free lock.
    Our release reads first (the default), finds it is not ours, and removes nothing."""
    api = FakeApi(clock=clock)
    mutex = make(api, clock)
    mutex.acquire()
    del api.services[MUTEX]
    other_holds(api)
    with pytest.raises(MutexLostError):
        mutex.release()
    assert owner(api) == OTHER
    assert api.count("RemoveServicesFromReservation") == 0


# ---------------------------------------------------------------- adds that land late


def delayed_add(api, clock, delay):
    """An add fault: the request reaches the server ``delay`` s later; the client sees a reset."""

    def fault(reservation_id, model, alias, attributes):
        api.later(clock.now + delay, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
        clock.now += 0.05
        raise reset()

    return fault


def test_the_watcher_forgets_only_the_adds_it_is_told_to_forget(clock):
    """What the test plugin does when its emulators stop: their watched adds go, without a call."""
    late = LateAdds(clock)
    apis = [FakeApi(clock=clock), FakeApi(clock=clock)]
    for index, api in enumerate(apis):
        log = logging.getLogger("t")
        alias = LockAlias.for_lock(api, RES, MUTEX, MutexOptions(), log, clock, clock.sleep)
        late.watch(alias, f"token {index}", clock.now + 30, 30)
    assert late.forget(lambda entry: entry.alias.api is apis[0]) == 1
    assert [entry.token for entry in late.pending()] == ["token 1"]
    assert apis[0].calls == [] and apis[1].calls == []


def test_an_add_that_lands_after_release_is_removed_by_the_watcher(clock):
    """Scenario 4: the first add is delayed and reset; the retry acquires, the work is done, the lock
    released; then the late add lands and re-creates MUTEX with our token. Nobody else would remove it."""
    api, late, token = released_with_a_late_add(clock, delay=3.0, lifetime=30)
    assert MUTEX not in api.services
    (entry,) = late.pending()
    assert entry.token == token
    clock.now += 5
    late.sweep()  # its read lets the late add land, shows our token, and removes it
    assert MUTEX not in api.services
    assert api.count("RemoveServicesFromReservation") == 2
    clock.now += 60
    late.sweep()
    assert late.pending() == []  # it can no longer land: the watch ends


def test_a_timeout_with_an_add_in_flight_hands_it_to_the_watcher(clock):
    api = FakeApi(clock=clock)
    other_holds(api)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    api.faults["AddServiceToReservation"] = [delayed_add(api, clock, 8.0)]
    with pytest.raises(MutexTimeout) as raised:
        mutex.acquire(timeout=2)
    assert raised.value.maybe_held
    assert "watches" in str(raised.value)
    del api.services[MUTEX]  # the holder leaves; our late add lands on the free alias
    clock.now += 10
    late.sweep()
    assert MUTEX not in api.services


def test_an_interrupt_while_the_add_is_at_the_server_is_cleaned_up(clock):
    """Scenario 5: Ctrl-C before the add's reply; the undo's read sees nothing yet; then the add lands."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late)

    def interrupted(reservation_id, model, alias, attributes):
        api.later(clock.now + 0.5, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [interrupted]
    with pytest.raises(KeyboardInterrupt):
        mutex.acquire()
    assert not mutex.locked()
    clock.now += 1
    late.sweep()
    assert MUTEX not in api.services


def test_a_second_interrupt_during_the_undo_still_leaves_the_add_to_the_watcher(clock):
    """Ctrl-C in the backoff after an add whose reply was lost (it committed); the undo's read shows it, and
    a second Ctrl-C comes while the undo's remove is on its way. The add must still go to the watcher (else
    nobody removes it, and no warning at exit names it), and the watcher must not remove it again while
    that interrupted remove may still land."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)

    def committed_then_reset(reservation_id, model, alias, attributes):
        api.commit_add(reservation_id, model, alias, list(attributes))
        raise reset()

    def interrupted(*args):
        raise KeyboardInterrupt

    def interrupted_sleep(seconds):
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [committed_then_reset]
    api.faults["RemoveServicesFromReservation"] = [interrupted]
    mutex.runtime.sleep = interrupted_sleep  # the first Ctrl-C: in the backoff after the reset
    with pytest.raises(KeyboardInterrupt):
        mutex.acquire()
    mutex.runtime.sleep = clock.sleep
    token = owner(api)
    assert token is not None and not mutex.locked()
    (entry,) = late.pending()
    assert entry.token == token and entry.remove_lands_by is not None
    for _ in range(29):  # the interrupted remove may land until request_lifetime after it was sent
        clock.now += 1
        late.sweep()
        assert owner(api) == token and api.removed.count(MUTEX) == 1
    for _ in range(5):
        clock.now += 1
        late.sweep()
    assert MUTEX not in api.services and late.pending() == []


def test_an_add_left_unsettled_at_exit_is_named_in_one_warning(clock, caplog):
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late)

    def interrupted(*args):
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [interrupted]
    with pytest.raises(KeyboardInterrupt):
        mutex.acquire()
    (entry,) = late.pending()
    with caplog.at_level(logging.WARNING, logger="cloudshell_mutex"):
        late.warn_unsettled()
    (record,) = caplog.records
    message = record.getMessage()
    for part in (RES, repr(MUTEX), entry.token, f"RemoveServicesFromReservation({RES!r}, [{MUTEX!r}])"):
        assert part in message


def test_an_answered_failure_is_settled_by_one_read_and_not_watched(clock):
    """A 500 is an answer: the request cannot land later, so one read settles it (no watch)."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late)

    def fail(*args):
        raise http_500()

    api.faults["AddServiceToReservation"] = [fail]
    mutex.acquire()
    mutex.release()
    assert late.pending() == []


def test_the_watcher_never_removes_on_a_read_that_may_lag_behind_a_removal_of_ours(clock):
    """Found by the 32-process stress run: right after our release, a fresh read that lags still shows our
    token, while a waiter already holds the lock. Removing then would delete the waiter's lock."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    api.faults["AddServiceToReservation"] = [delayed_add(api, clock, 20.0)]
    mutex.acquire()
    token = mutex.token
    mutex.release()
    released_at = clock.now
    other_holds(api)  # a waiter takes the free lock at once

    def lagging_read(*args):  # for up to a second, a read shows the past: our token, before our remove
        if clock.now - released_at < 1.0:
            show_the_past(api, clock, {MUTEX: {protocol.ATTR_OWNER: token}})

    api.faults["GetReservationDetails"] = [lagging_read] * 10
    late.sweep()  # at once: no read is trusted this soon after our removal
    clock.now += 0.5
    late.sweep()
    assert owner(api) == OTHER
    clock.now += 1.0
    late.sweep()
    assert owner(api) == OTHER and api.removed.count(MUTEX) == 1


def test_the_watcher_ends_a_watch_only_on_a_read_sent_after_the_add_can_no_longer_land(clock):
    """The watch of a late add ends once the add can no longer land; what a read shows is the server's state
    when the read was *made* (minus the lag of a fresh read), not when its answer came back. A slow read
    sent just before the add lands, and answered after ``lands_by``, does not show it: ending the watch on
    it left the add on the server for good (every later acquirer then waits until its timeout)."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    api.faults["AddServiceToReservation"] = [delayed_add(api, clock, 29.9)]  # lands within its lifetime
    mutex.acquire()
    token = mutex.token
    mutex.release()
    (entry,) = late.pending()
    clock.now = entry.lands_by - 0.2

    def slow_read(*args):  # made before the add lands, answered after it can no longer land
        clock.now = entry.lands_by + 0.5

    api.faults["GetReservationDetails"] = [slow_read]
    late.sweep()
    assert owner(api) is None  # the read showed nothing ...
    api.land_due()
    assert owner(api) == token  # ... but the add had landed meanwhile: it must still be watched
    for _ in range(5):
        clock.now += 1.0
        late.sweep()
    assert MUTEX not in api.services
    assert late.pending() == []


def test_a_holder_resolved_by_a_read_after_a_long_wait_starts_its_lease_at_the_unknown_add_not_at_the_wait(
    clock,
):
    """Found by the stress run (30 of 6,400 acquisitions): a waiter waits longer than its lease, then an add
    gets no answer but commits, and a read shows our token. The lease was counted from the start of the
    *wait*, so the new holder's first ensure_held() said it may have lost the lock it had just taken, and it
    gave it up. Only adds whose outcome is unknown can have created the service: the lease counts from the
    first of those."""
    from cloudshell_mutex.lock.server import catalog

    api = FakeApi(attributes=[protocol.ATTR_OWNER, *sorted(catalog.FULL)], clock=clock)
    other_holds(api)
    mutex = make(api, clock, lease=10, holder_check_interval=1)

    def freed_then_reset(reservation_id, model, alias, attributes):
        del api.services[MUTEX]  # the holder left; our add commits, its reply is lost
        api.commit_add(reservation_id, model, alias, list(attributes))
        clock.now += 0.05
        raise reset()

    api.on_call = lambda method: (
        api.faults.setdefault("AddServiceToReservation", [freed_then_reset])
        if method == "AddServiceToReservation" and clock.now - 1000.0 > 30 and MUTEX in api.services
        and api.services[MUTEX][protocol.ATTR_OWNER] == OTHER
        else None
    )  # fmt: skip
    mutex.acquire()
    assert clock.now - 1000.0 > 30  # it waited three leases
    assert owner(api) == mutex.token
    mutex.ensure_held()  # held, and no waiter can have judged it stale yet
    mutex.release()
    assert MUTEX not in api.services


def test_a_waiter_that_times_out_while_the_holder_releases_says_so_only_for_a_marker_that_proves_it(clock):
    """The holder's remove got no answer and may still land: it keeps the lock until then, and marks it
    MUTEX~releasing with its token and the secret the token commits to. A waiter that times out says why it
    waited. Anyone can read the holder's token, so a marker with the token alone (a forgery, or an older
    release's marker) says nothing, nor does one with another secret, another token, or one for a token of an
    older release (an 8-digit nonce: short enough to search for a secret that fits)."""
    secret = make_secret()
    holder = make_token("Other", secret)
    older = "Other@host:1:deadbeef"
    cases = [
        (holder, releasing_value(holder, secret), True),
        (holder, holder, False),  # the visible token alone: a forgery
        (holder, releasing_value(holder, make_secret()), False),
        (holder, releasing_value("someone else@vm:1:ab", secret), False),
        (holder, holder + "#" + "0" * 31, False),
        (older, older, False),  # an older release's marker
        (older, releasing_value(older, secret), False),
    ]
    for holder_token, marker_value, releasing in cases:
        api = FakeApi(clock=clock)
        api.services[MUTEX] = {protocol.ATTR_OWNER: holder_token}
        api.services[protocol.releasing_alias(MUTEX)] = {protocol.ATTR_OWNER: marker_value}
        waiter = make(api, clock, timeout=5, holder_check_interval=1)
        with pytest.raises(MutexTimeout) as raised:
            waiter.acquire()
        assert ("the holder is releasing it" in str(raised.value)) is releasing, str(raised.value)
        assert ("may still land until about" in str(raised.value)) is releasing
        assert secret.hex() not in str(raised.value)
        assert api.removed == []  # nothing of anyone's removed


def test_the_holders_own_marker_proves_itself_and_its_secret_is_nowhere_else(clock, caplog):
    """The marker a holder adds is believed by waiters (the token's nonce commits to the secret it shows),
    and that secret appears in the marker only: not in the token, the log or an error."""
    caplog.set_level(logging.DEBUG)
    api = FakeApi(clock=clock)
    mutex = make(api, clock, request_lifetime=30)
    mutex.acquire()
    token = mutex.token
    seen = {}

    def look(method):
        marker = api.services.get(protocol.releasing_alias(MUTEX))
        if marker is not None:
            seen["marker"] = marker[protocol.ATTR_OWNER]

    api.faults["RemoveServicesFromReservation"] = [remove_landing_late(api, clock, 2.0)]
    api.on_call = look
    mutex.release()
    value = seen["marker"]
    assert proves_release(value, token) and named_token(value) == token
    secret = value.rsplit("#", 1)[1]
    assert len(secret) == 32 and secret not in token and secret not in caplog.text
    assert len(parse_token(token).nonce) == 16


@pytest.mark.parametrize("forged_value", ["token", "token#secret of another"])
@pytest.mark.parametrize("marker_remove", ["answers", "lands late", "no answer"])
def test_a_forged_marker_naming_the_holders_token_goes_at_its_release(clock, forged_value, marker_remove):
    """A marker someone else added with the holder's visible token is believed by no waiter, and goes with
    the holder's release: it names our token, so it is ours to remove. Its remove is settled like any other:
    one remove, and when that gets no answer, nothing more while it may land (the watcher then removes the
    marker while it still names our token). The next holder's MUTEX is never touched."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    mutex.acquire()
    token = mutex.token
    marker = protocol.releasing_alias(MUTEX)
    forged = token if forged_value == "token" else releasing_value(token, make_secret())
    api.services[marker] = {protocol.ATTR_OWNER: forged}

    def no_answer(reservation_id, aliases):
        raise reset()

    fault = {
        "answers": [],
        "lands late": [remove_landing_late(api, clock, 2.0, marker)],
        "no answer": [no_answer],
    }[marker_remove]
    api.faults["RemoveServicesFromReservation"] = [lambda *args: False, *fault]  # MUTEX's remove answers
    mutex.release()
    assert not mutex.locked() and MUTEX not in api.services
    assert api.removed == [MUTEX, marker]
    other_holds(api)  # the next holder
    if marker_remove != "answers":
        late.sweep()
        assert api.removed.count(marker) == 1  # no second remove while the first may land
        clock.now += 31
        late.sweep()
    assert marker not in api.services and owner(api) == OTHER
    assert api.removed.count(marker) == (2 if marker_remove == "no answer" else 1)
    assert api.removed.count(MUTEX) == 1
    clock.now += 60
    late.sweep()
    assert late.pending() == [] and owner(api) == OTHER


def test_a_forged_marker_in_place_while_the_remove_may_land_is_overwritten_by_the_holders_proof(clock):
    """The holder's remove got no answer, and a forged marker holds the alias of its own: the holder's add
    of its marker is refused (busy). It holds the lock, so any marker is stale: it writes its proof over the
    forgery, waiters meanwhile name the release (a real one), and the marker goes once the release is
    settled."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    mutex.acquire()
    marker = protocol.releasing_alias(MUTEX)
    token = mutex.token
    api.services[marker] = {protocol.ATTR_OWNER: token}
    told, shown = [], []

    def waiter_times_out(method):
        # After the holder's own add of its marker (refused: the forgery holds the alias), while its remove
        # may still land.
        if method == "GetReservationDetails" and api.count("AddServiceToReservation") >= 2:
            api.on_call = None
            shown.append(api.services[marker][protocol.ATTR_OWNER])
            waiter = ReservationMutex(
                api, RES, owner="waiter", fair=False, timeout=0.5,
                runtime=Runtime(clock, clock.sleep, late_adds=late),
                holder_check_interval=0.1,
            )  # fmt: skip
            with pytest.raises(MutexTimeout) as raised:
                waiter.acquire()
            told.append(str(raised.value))

    api.faults["RemoveServicesFromReservation"] = [remove_landing_late(api, clock, 3.0)]
    api.on_call = waiter_times_out
    mutex.release()
    assert shown and shown[0].startswith(token + "#"), shown  # the token with the holder's secret
    assert told and "the holder is releasing it" in told[0], told
    assert api.calls.count("AddServiceToReservation") >= 3  # the acquire, the holder's marker, the waiter
    assert MUTEX not in api.services and marker not in api.services
    assert api.removed.count(MUTEX) == 1 and api.removed.count(marker) == 1


@pytest.mark.parametrize("remove_answers", [True, False])
def test_a_releasing_marker_whose_add_lands_late_is_removed_and_never_touches_the_lock(clock, remove_answers):
    """The marker is a call like any other: its add may land after the release is settled (then the
    watcher removes it while it shows our token), and its remove may get no answer (then no second remove
    is sent while it may land). MUTEX, the next holder's by then, is never touched."""
    api = FakeApi(clock=clock)
    late = LateAdds(clock)
    mutex = make(api, clock, late_adds=late, request_lifetime=30)
    mutex.acquire()
    token = mutex.token
    marker = protocol.releasing_alias(MUTEX)

    def no_answer(reservation_id, aliases):
        raise reset()

    api.faults["RemoveServicesFromReservation"] = [remove_landing_late(api, clock, 2.0)] + (
        [] if remove_answers else [no_answer]
    )
    api.faults["AddServiceToReservation"] = [delayed_add(api, clock, 10.0)]  # the marker lands after it all
    mutex.release()
    assert not mutex.locked() and marker not in api.services
    assert api.removed == [MUTEX, marker]  # the marker was not there yet: its remove removed nothing
    other_holds(api)  # the next holder
    clock.now += 11
    late.sweep()  # the marker's add has landed with our token
    if not remove_answers:  # ... but our remove of it may still land: no second one before then
        assert named_token(api.services[marker][protocol.ATTR_OWNER]) == token
        assert api.removed.count(marker) == 1
        clock.now += 30
        late.sweep()
    assert marker not in api.services
    assert api.removed.count(marker) == 2 and api.removed.count(MUTEX) == 1
    assert owner(api) == OTHER
    clock.now += 60
    late.sweep()
    assert late.pending() == [] and owner(api) == OTHER
    assert token not in str(api.services)


def test_release_never_calls_its_late_remove_landed_on_a_read_that_may_lag_behind_it(clock):
    """Found by make stress (the second run with kills and pauses: one overlap). The remove was reset and
    applied 1.2 s later; the release's next read lagged and showed the holder *before* us, so the release
    called its remove landed and returned. Our service was still there: the late-add watcher (an earlier add
    of the same acquisition had got no answer) took it for that add and removed it, a waiter took the lock,
    and our remove, landing at last, deleted the waiter's lock. A read that shows the lock is not ours proves
    our remove landed only when it was sent FRESH_READ_LAG after that remove."""
    api = FakeApi(clock=clock)
    mutex = make(api, clock)
    mutex.acquire()
    start = clock.now

    def delayed_and_reset(reservation_id, aliases):
        api.late_remove(clock.now + 1.2)
        clock.now += 0.05
        raise reset()

    def lagging_read(*args):  # shows the lock as it was before we held it
        show_the_past(api, clock, {MUTEX: {protocol.ATTR_OWNER: OTHER}})

    api.faults["RemoveServicesFromReservation"] = [delayed_and_reset]
    api.faults["GetReservationDetails"] = [lambda *args: None, lagging_read]
    mutex.release()
    assert not mutex.locked()
    assert api.scheduled == []  # our remove had landed when release() returned ...
    assert clock.now - start >= 1.2
    assert api.removed.count(MUTEX) == 1  # ... and it was never sent twice
    other_holds(api)
    clock.now += 600
    api.land_due()
    assert owner(api) == OTHER


def test_release_never_calls_a_failed_remove_landed_on_a_read_that_may_lag_behind_it(clock):
    """Found by the last make stress run (a live worker's lock left to a lease break): the remove failed in
    a way that may or may not have committed (an HTTP 500), nothing of it could land later, and the next
    read lagged, showing the holder before us. The release called the remove landed and returned while
    our service stayed. Only a read sent FRESH_READ_LAG after the remove may prove it landed."""
    api = FakeApi(clock=clock)
    mutex = make(api, clock)
    mutex.acquire()

    def failed_without_committing(reservation_id, aliases):
        raise http_500()

    def lagging_read(*args):  # shows the lock as it was before we held it
        show_the_past(api, clock, {MUTEX: {protocol.ATTR_OWNER: OTHER}})

    api.faults["RemoveServicesFromReservation"] = [failed_without_committing]
    api.faults["GetReservationDetails"] = [lambda *args: None, lagging_read]
    mutex.release()
    assert not mutex.locked()
    assert MUTEX not in api.services  # our service is gone: release removed it after all
    assert api.count("RemoveServicesFromReservation") == 2
