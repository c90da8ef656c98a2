"""Leases on the virtual clock: the heartbeat, the waiter's judgement, breaking, and the holder's signals.

Each test drives one decision deterministically with the in-memory fake (``fakes.py``); the same
behaviour across OS processes against the emulator is in ``test_lease_processes.py``.
"""

from __future__ import annotations

import pytest
from fakes import RES, FakeApi, api_error, http_500, make
from urllib3.exceptions import ProtocolError

from cloudshell_mutex import MutexError, MutexLostError, MutexTimeout, MutexUsageError, protocol
from cloudshell_mutex.lock.holder import Holder
from cloudshell_mutex.lock.lease import lease
from cloudshell_mutex.lock.lease.lease import StaleWatch, stale_margin
from cloudshell_mutex.lock.options import FRESH_READ_LAG

LEASED_MODEL = (protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES)
STALE = "Crashed driver@exec-01:4242:deadbeef"
BREAKER = protocol.breaker_alias(protocol.DEFAULT_ALIAS)


def leased_api() -> FakeApi:
    return FakeApi(attributes=LEASED_MODEL)


def hold(api: FakeApi, token: str = STALE, lease_seconds: str = "2", beat: str = "deadbeef:aa01:3") -> None:
    api.services[protocol.DEFAULT_ALIAS] = {
        protocol.ATTR_OWNER: token,
        protocol.ATTR_LEASE_SECONDS: lease_seconds,
        protocol.ATTR_HEARTBEAT: beat,
    }


def holder(token: str = STALE, beat: str = "deadbeef:aa01:3", lease_seconds: str = "2") -> Holder:
    attributes = {
        protocol.ATTR_OWNER: token,
        protocol.ATTR_LEASE_SECONDS: lease_seconds,
        protocol.ATTR_HEARTBEAT: beat,
    }
    return Holder(protocol.DEFAULT_ALIAS, token, "x", protocol.SERVICE_MODEL, attributes)


# ---------------------------------------------------------------- the waiter's judgement


def test_stale_only_after_the_same_token_and_heartbeat_for_lease_plus_margin():
    watch = StaleWatch()
    watch.observe(holder(), 100.0)
    limit = 2 + stale_margin(2)
    assert not watch.stale(100.0 + limit - 0.01)
    assert watch.stale(100.0 + limit)
    watch.observe(holder(beat="deadbeef:aa01:4"), 100.0 + limit)  # a new heartbeat: alive again
    assert not watch.stale(100.0 + limit + 1)
    assert watch.stale(100.0 + 2 * limit)


def test_a_foreign_heartbeat_never_counts_as_the_holders_liveness():
    """An expired holder's late heartbeat lands on its successor's service: it names another nonce."""
    successor = "Next@exec-02:7:0badf00d"
    watch = StaleWatch()
    watch.observe(holder(successor, beat="0badf00d:bb02:5"), 0.0)
    watch.observe(holder(successor, beat="deadbeef:aa01:9"), 2.0)  # the late write of the old holder
    assert watch.stale(2 + stale_margin(2))
    assert watch.matches(holder(successor, beat="deadbeef:aa01:9"))
    assert not watch.matches(holder(successor, beat="0badf00d:bb02:6"))


@pytest.mark.parametrize("value", ["0", "", "abc", "-5", "nan", "inf"])
def test_a_holder_without_a_lease_is_never_stale(value):
    watch = StaleWatch()
    watch.observe(holder(lease_seconds=value), 0.0)
    assert lease.lease_of(watch.holder) is None
    assert not watch.stale(1e9)


def test_a_new_token_restarts_the_judgement():
    watch = StaleWatch()
    watch.observe(holder(), 0.0)
    watch.observe(holder("Next@exec-02:7:0badf00d", beat="0badf00d:bb02:0"), 3.0)
    assert not watch.stale(3.0 + 2.9)
    assert watch.stale(3.0 + 2 + stale_margin(2))


# ---------------------------------------------------------------- the heartbeat


def test_the_holder_writes_its_lease_and_heartbeats_only_while_ours(clock):
    api = leased_api()
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    service = api.services[protocol.DEFAULT_ALIAS]
    assert service[protocol.ATTR_LEASE_SECONDS] == "3"
    nonce = lease.nonce_of(mutex.token)
    assert lease.heartbeat_nonce(service[protocol.ATTR_HEARTBEAT]) == nonce
    api.calls.clear()
    assert mutex.renew() is True
    assert api.calls == ["GetReservationDetails", "SetServiceAttributesValues"]
    assert service[protocol.ATTR_HEARTBEAT].endswith(":1")
    mutex.release()
    assert not api.services


def test_no_heartbeat_on_a_model_without_the_lease_attributes(clock):
    api = FakeApi()  # the original package: Mutex Owner only
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    assert not mutex.leased and mutex.renew() is False
    assert "SetServiceAttributesValues" not in api.calls
    mutex.release()


def test_lease_zero_writes_no_lease_and_no_heartbeat(clock):
    api = leased_api()
    mutex = make(api, clock, lease=0)
    with mutex:
        assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_LEASE_SECONDS] == "0"
        assert not mutex.leased


def test_a_heartbeat_that_finds_the_lock_taken_reports_the_loss_and_release_removes_nothing(clock):
    api = leased_api()
    lost, events = [], []
    mutex = make(api, clock, lease=3, on_lost=lost.append, on_event=events.append)
    mutex.acquire()
    hold(api, "Next@exec-02:7:0badf00d", beat="0badf00d:bb02:0")  # broken and taken meanwhile
    clock.sleep(FRESH_READ_LAG)  # (a read sooner may lag: it proves no loss)
    api.calls.clear()
    assert mutex.renew() is False
    # No write onto the successor's service; one warning line for the people watching the sandbox output.
    assert api.calls == ["GetReservationDetails", "WriteMessageToReservationOutput"]
    (line,) = api.output
    assert "WARNING: Router A driver lost the MUTEX lock it held: it is now held by Next" in line
    assert len(lost) == 1 and isinstance(lost[0], MutexLostError)
    assert [e.kind for e in events][-1] == "lost"
    with pytest.raises(MutexLostError, match="heartbeat"):
        mutex.ensure_held()
    api.calls.clear()
    with pytest.raises(MutexLostError):
        mutex.release()
    assert api.calls == []  # nothing removed, not even read again
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Next@exec-02:7:0badf00d"
    assert not mutex.locked()


def test_danger_zone_after_failed_heartbeats_then_ensure_held_refuses(clock):
    api = leased_api()
    dangers, events = [], []
    mutex = make(api, clock, lease=3, on_danger=dangers.append, on_event=events.append)
    mutex.acquire()
    mutex.ensure_held()
    api.faults["GetReservationDetails"] = [lambda *a: (_ for _ in ()).throw(Exception("timed out"))] * 5
    clock.sleep(1.0)
    mutex.renew()
    assert dangers == []  # one beat missed
    clock.sleep(1.0)
    mutex.renew()
    assert dangers == [pytest.approx(2.0)]  # 2/3 of the lease without a confirmed heartbeat
    assert "danger" in [e.kind for e in events]
    mutex.ensure_held()  # not lapsed yet
    clock.sleep(1.0)
    with pytest.raises(MutexLostError, match="longer than the lease"):
        mutex.ensure_held()


def _late_write(api: FakeApi, clock, successor: bool):
    """A heartbeat write that answers 0.6 s late; meanwhile (``successor``) a waiter breaks the lapsed lease
    and takes the lock: the write lands on the successor's service (a write cannot check the owner)."""

    def write(reservation_id, alias, requests):
        clock.now += 0.6
        if successor:
            api.services[protocol.DEFAULT_ALIAS] = {protocol.ATTR_OWNER: "Successor@host:2:0000beef"}
        return False

    return write


def test_a_heartbeat_write_answered_after_the_lease_could_be_broken_renews_nothing(clock):
    """A holder whose beats failed past lease + margin, whose next read still shows its lock, writes its
    heartbeat; the write answers late, having landed on the service of a waiter that broke the lease
    meanwhile. It must not renew: the holder would trust a lock it lost until its next beat."""
    api = leased_api()
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    clock.sleep(3 + stale_margin(3) - 0.3)  # the beats failed (a server outage) until just before the break
    api.faults["SetServiceAttributesValues"] = [_late_write(api, clock, successor=True)]
    mutex.renew()
    with pytest.raises(MutexLostError):
        mutex.ensure_held()


def test_a_late_heartbeat_write_that_landed_on_our_lock_renews_at_the_next_beat(clock):
    api = leased_api()
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    clock.sleep(3 + stale_margin(3) - 0.3)
    api.faults["SetServiceAttributesValues"] = [_late_write(api, clock, successor=False)]
    mutex.renew()  # nobody broke it: the write landed on our lock, but only a read can tell
    with pytest.raises(MutexLostError, match="longer than the lease"):
        mutex.ensure_held()
    clock.sleep(0.5)
    mutex.renew()  # the read shows that write's value on our lock: renewed from when it was sent
    mutex.ensure_held()
    mutex.release()


def test_ensure_held_with_a_read_sees_a_removed_lock(clock):
    api = leased_api()
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    mutex.ensure_held(read=True)
    api.services.clear()
    with pytest.raises(MutexLostError):
        mutex.ensure_held(read=True)


# ---------------------------------------------------------------- breaking


def test_a_waiter_breaks_a_stale_holder_after_lease_plus_margin_on_its_own_clock(clock):
    api = leased_api()
    hold(api)
    events = []
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30, on_event=events.append)
    start = clock.now
    assert mutex.acquire() is True
    waited = clock.now - start
    # lease + margin, one poll, and the breaker's wait for reads that may lag (FRESH_READ_LAG)
    assert 2 + stale_margin(2) <= waited <= 2 + stale_margin(2) + 0.5 + 0.2 + FRESH_READ_LAG
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == mutex.token
    assert BREAKER not in api.services  # the breaker was released
    kinds = [e.kind for e in events]
    assert kinds.index("broken") < kinds.index("acquired")
    (broken,) = [e for e in events if e.kind == "broken"]
    assert "Crashed driver" in broken.holder and STALE in broken.error
    assert any("broke the stale lock" in line and STALE in line for line in api.output)


def test_a_stale_holder_is_judged_when_it_turns_stale_not_at_the_next_holder_check(clock):
    api = leased_api()
    hold(api)
    mutex = make(api, clock, lease=2, holder_check_interval=5, timeout=30)  # the default holder check
    start = clock.now
    assert mutex.acquire() is True
    waited = clock.now - start
    # Seen at the first contention; stale lease + margin later: read and broken then (not 5 s after the
    # first read, when the next holder check would be due).
    assert 2 + stale_margin(2) <= waited <= 2 + stale_margin(2) + 0.2 + FRESH_READ_LAG
    mutex.release()


def test_a_holder_a_slow_read_shows_is_judged_from_the_answer_not_from_when_the_read_went_out(clock):
    """A read may show the server as it was seconds after it was sent (a slow server, a copy the client
    re-sent): a holder that came while the read was on its way has been seen since the answer only, and is
    never broken before its lease + margin have passed since it came."""
    api = leased_api()
    api.services[protocol.DEFAULT_ALIAS] = {protocol.ATTR_OWNER: "a job without a lease"}
    came: list = []
    removed: list = []

    def slow_read(*args):  # sent now; the job leaves and a holder comes 4.5 s later; answered at 5 s
        clock.now += 4.5
        hold(api)
        came.append(clock.now)
        clock.now += 0.5
        return False

    def remove(reservation_id, aliases):
        removed.append((clock.now, list(aliases)))
        return False

    api.faults["GetReservationDetails"] = [slow_read]
    api.faults["RemoveServicesFromReservation"] = [remove]
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30)
    assert mutex.acquire() is True
    ((broken_at, aliases),) = removed[:1]
    assert aliases == [protocol.DEFAULT_ALIAS]
    # From the read's dispatch it would be broken 1.5 s after it came (the bug the stress run caught).
    assert broken_at - came[0] >= 2 + stale_margin(2)
    mutex.release()


def test_a_living_holder_is_never_broken(clock):
    api = leased_api()
    hold(api)
    beats = iter(range(4, 10_000))

    def heartbeat(method):  # the holder beats every second of virtual time
        if method == "GetReservationDetails" and int(clock.now) % 1 == 0:
            api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_HEARTBEAT] = f"deadbeef:aa01:{next(beats)}"

    api.on_call = heartbeat
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=20)
    with pytest.raises(MutexTimeout):
        mutex.acquire()
    assert api.count("RemoveServicesFromReservation") == 0
    assert BREAKER not in api.services


@pytest.mark.parametrize("lease_seconds", ["0", None])
def test_a_holder_without_a_lease_is_never_broken_and_the_timeout_says_force_release(clock, lease_seconds):
    api = leased_api()
    api.services[protocol.DEFAULT_ALIAS] = {protocol.ATTR_OWNER: STALE}
    if lease_seconds is not None:
        api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_LEASE_SECONDS] = lease_seconds
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30)
    with pytest.raises(MutexTimeout, match=r"never broken automatically.*release --force"):
        mutex.acquire()
    assert api.count("RemoveServicesFromReservation") == 0
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == STALE


def test_the_holder_coming_alive_between_judgement_and_remove_is_not_broken(clock):
    """Right before removing, the breaker re-reads: a new heartbeat means the holder is alive."""
    api = leased_api()
    hold(api)

    def beat_on_breaker_add(reservation, model, alias, attributes):
        if alias == BREAKER:  # the holder beats while the breaker takes its alias
            api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_HEARTBEAT] = "deadbeef:aa01:99"
        return False

    api.faults["AddServiceToReservation"] = [beat_on_breaker_add] * 1000
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=3.6)
    with pytest.raises(MutexTimeout):
        mutex.acquire()
    assert api.count("RemoveServicesFromReservation") == 1  # only its own breaker alias
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == STALE
    assert BREAKER not in api.services


def test_only_one_breaker_at_a_time_and_a_crashed_breaker_is_removed_once_its_remove_cannot_land(clock):
    api = leased_api()
    hold(api)
    crashed = "Other waiter@exec-03:9:c0ffee00"
    api.services[BREAKER] = {protocol.ATTR_OWNER: crashed, protocol.ATTR_LEASE_SECONDS: "2"}
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30, request_lifetime=10)
    start = clock.now
    assert mutex.acquire() is True
    # It first waited for the other breaker: seen unchanged for its lease + margin, it has crashed, but it
    # removes only within its lease, and that remove may land up to a request's lifetime (10 s) later.
    assert clock.now - start >= 2 + 10
    assert BREAKER not in api.services
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == mutex.token


def test_a_crashed_breakers_remove_that_fails_is_left_to_the_watcher_and_never_sent_twice(clock):
    api = leased_api()
    hold(api)
    crashed = "Other waiter@exec-03:9:c0ffee00"
    api.services[BREAKER] = {protocol.ATTR_OWNER: crashed, protocol.ATTR_LEASE_SECONDS: "2"}
    removes = []

    def lost_reply(reservation_id, aliases) -> bool:
        if aliases == [BREAKER] and api.services.get(BREAKER, {}).get(protocol.ATTR_OWNER) == crashed:
            removes.append(clock.now)
            if len(removes) == 1:  # applied 30 s later; the reply never comes
                api.later(clock.now + 30, lambda: api.services.pop(BREAKER, None))
                raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=120, request_lifetime=40)
    _sweeping(api, mutex)  # the watcher sweeps after every sleep
    api.faults["RemoveServicesFromReservation"] = [lost_reply] * 100
    assert mutex.acquire() is True  # once the remove landed: the breaker alias was free again
    # Sent once: a second remove while the first may land could delete a live breaker that took the alias.
    assert len(removes) == 1
    assert BREAKER not in api.services
    mutex.release()


def test_the_stale_holders_late_release_does_not_remove_its_successor(clock):
    """The expired holder resumes: its release reads first, sees the successor, and removes nothing."""
    api = leased_api()
    old = make(api, clock, lease=2)
    old.acquire()
    waiter = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30)
    assert waiter.acquire() is True  # old never heartbeats (paused): broken after lease + margin
    assert old.renew() is False  # it resumes: its heartbeat sees the loss and writes nothing
    with pytest.raises(MutexLostError):
        old.release()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == waiter.token
    waiter.release()


def test_the_expired_holders_late_heartbeat_write_is_ignored_by_the_next_waiter(clock):
    """The old holder read its token, paused, and its write landed on the successor's service."""
    api = leased_api()
    successor = "Next@exec-02:7:0badf00d"
    hold(api, successor, beat="0badf00d:bb02:1")
    lands = [clock.now + 1.0 + 0.5 * k for k in range(8)]
    for k, at in enumerate(lands):  # late foreign heartbeats keep arriving
        api.later(
            at,
            lambda k=k: api.services[protocol.DEFAULT_ALIAS].update(
                {protocol.ATTR_HEARTBEAT: f"deadbeef:aa01:{k}"}
            ),
        )
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30)
    start = clock.now
    assert mutex.acquire() is True  # the successor itself is dead: foreign beats did not keep it alive
    assert clock.now - start <= 2 + stale_margin(2) + 0.5 + 0.2 + FRESH_READ_LAG


def test_reservation_checks_are_unchanged_by_leases(clock):
    api = leased_api()
    mutex = make(api, clock, lease=2)
    api.faults["AddServiceToReservation"] = [
        lambda *a: (_ for _ in ()).throw(api_error(f"Reservation '{RES}' has ended"))
    ]
    api.ended = True
    with pytest.raises(Exception, match="ended"):
        mutex.acquire()


# ---------------------------------------------------------------- fencing


def test_generation_grows_with_every_acquisition_that_asks_and_costs_nothing_otherwise(clock):
    api = leased_api()
    api.model_attributes.append(protocol.ATTR_GENERATION)
    mutex = make(api, clock, lease=0)
    seen = []
    for asks in (True, False, True, True):
        mutex.acquire()
        api.calls.clear()
        if asks:
            seen.append(mutex.generation)
            calls = len(api.calls)
            assert calls == 2  # a read, and the add that creates the counter or a write (protocol.md)
            assert mutex.generation == seen[-1]  # asked twice: read and bumped once
            assert len(api.calls) == calls
        else:
            assert api.calls == []
        mutex.release()
    assert seen == [1, 2, 3]
    assert api.services[protocol.DEFAULT_ALIAS + "~generation"][protocol.ATTR_GENERATION] == "3"


def test_a_counter_add_that_lands_without_an_answer_or_late_keeps_the_generation_growing(clock):
    """The counter's first add commits and loses its answer: a read finds the counter and the write follows
    (4 calls). Then, in a fresh reservation's counter, an add that lands 2 s after its error: that ask fails
    and says so, the late add lands meanwhile, and the next asks still grow."""
    api = leased_api()
    api.model_attributes.append(protocol.ATTR_GENERATION)
    api.clock = clock
    counter = protocol.DEFAULT_ALIAS + "~generation"
    mutex = make(api, clock, lease=0)

    def lost_answer(reservation_id, model, alias, attributes):
        api.commit_add(reservation_id, model, alias, list(attributes))
        raise http_500()

    mutex.acquire()
    api.faults["AddServiceToReservation"] = [lost_answer]
    api.calls.clear()
    first = mutex.generation
    assert len(api.calls) == 4 and api.services[counter][protocol.ATTR_GENERATION] == str(first)
    mutex.release()

    del api.services[counter]

    def lands_late(reservation_id, model, alias, attributes):
        api.later(clock.now + 2.0, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
        raise http_500()

    mutex.acquire()
    api.faults["AddServiceToReservation"] = [lands_late]
    with pytest.raises(MutexError, match="generation counter"):
        mutex.generation  # noqa: B018
    clock.sleep(3.0)
    assert mutex.generation == 2  # the late add's 1, bumped
    mutex.release()
    mutex.acquire()
    assert mutex.generation == 3
    mutex.release()


def test_generation_on_the_original_model_says_what_to_install(clock):
    api = FakeApi()
    mutex = make(api, clock)
    mutex.acquire()
    with pytest.raises(MutexUsageError, match=r"Mutex Generation.*cloudshell-mutex install"):
        mutex.generation  # noqa: B018
    mutex.release()


def test_generation_needs_the_lock_held(clock):
    api = leased_api()
    with pytest.raises(MutexUsageError, match="acquire"):
        make(api, clock).generation  # noqa: B018


def test_a_breakers_remove_without_an_answer_is_waited_for_and_never_sent_twice(clock):
    """The remove of the stale holder is delayed 2 s and its connection reset: a second remove could land
    after the next holder took the lock. The breaker keeps its alias alive and reads until it lands."""
    api = leased_api()
    hold(api)

    def delayed_and_reset(reservation_id, aliases):
        if aliases == [protocol.DEFAULT_ALIAS]:
            api.late_remove(clock.now + 2.0)
            clock.now += 0.05
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["RemoveServicesFromReservation"] = [delayed_and_reset] * 10
    removes = []
    api.on_call = lambda method: (
        removes.append(clock.now) if method == "RemoveServicesFromReservation" else None
    )
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=30)
    assert mutex.acquire() is True
    assert len(removes) == 2  # the stale holder's (once) and the breaker's own alias
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == mutex.token
    assert BREAKER not in api.services
    beats = api.calls.count("SetServiceAttributesValues")
    assert beats >= 1  # the breaker kept its alias alive while it waited


def _sweeping(api: FakeApi, mutex, fail_first_breaker_remove: bool = False) -> list:
    """The late-add watcher's daemon thread, on virtual time: it sweeps after every sleep of the waiter.
    Returns the owner tokens of the breaker services removed, in order (a failed remove is not counted)."""
    removed_breakers = []
    failed = []
    sleep = mutex.runtime.sleep

    def sleep_and_sweep(seconds: float) -> None:
        sleep(seconds)
        mutex.runtime.late_adds.sweep()

    def record(reservation_id, aliases) -> bool:
        if aliases == [BREAKER] and BREAKER in api.services:
            if fail_first_breaker_remove and not failed:
                failed.append(api.services[BREAKER][protocol.ATTR_OWNER])
                raise http_500()  # not applied
            removed_breakers.append(api.services[BREAKER][protocol.ATTR_OWNER])
        return False

    mutex.runtime.sleep = sleep_and_sweep
    api.faults["RemoveServicesFromReservation"] = [record] * 1000
    return removed_breakers


def test_a_breaker_add_without_an_answer_that_lands_late_is_removed_by_the_watcher(clock):
    """Found by make stress: a breaker add whose reply was lost landed after the breaker gave up, and stayed
    until another waiter judged it a crashed breaker a lease + margin later, holding up the break. Now the
    watcher removes it once it lands, and the next attempt, with a token of its own, breaks at once."""
    api = leased_api()
    hold(api)
    landed = []

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if alias == BREAKER and not landed:
            landed.append({a.Name: a.Value for a in attributes}[protocol.ATTR_OWNER])
            api.later(clock.now + 0.2, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 1000
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=60)
    removed_breakers = _sweeping(api, mutex)
    start = clock.now
    assert mutex.acquire() is True
    # The leftover was removed by the watcher soon after it landed, then a new breaker broke the holder: no
    # second wait of lease + margin for a "crashed breaker" that was our own lost add.
    assert clock.now - start < 2 * (2 + stale_margin(2))
    assert len(removed_breakers) == 2
    assert removed_breakers[0] == landed[0] and removed_breakers[1] != landed[0]  # each attempt its own token
    assert BREAKER not in api.services and not mutex.runtime.late_adds.pending()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == mutex.token


def test_a_breaker_alias_whose_remove_failed_is_removed_by_the_watcher(clock):
    """The breaker's remove of its own alias fails (HTTP 500, not applied): the alias would stay until a
    waiter judged it a crashed breaker. The watcher removes it."""
    api = leased_api()
    hold(api)
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=60)
    removed_breakers = _sweeping(api, mutex, fail_first_breaker_remove=True)
    assert mutex.acquire() is True
    assert BREAKER in api.services and not removed_breakers  # left behind by the failed remove
    for _ in range(3):
        clock.sleep(1.0)
        mutex.runtime.late_adds.sweep()
    assert BREAKER not in api.services and len(removed_breakers) == 1
    mutex.release()


def test_a_breakers_own_remove_that_lands_late_is_waited_for_by_the_watcher_and_never_sent_twice(clock):
    """The breaker's remove of its own alias commits 3 s late and its connection is reset: the watcher
    takes the alias over but sends no second remove while the first may still land (a second one could
    land after another breaker took the alias, and remove that breaker's)."""
    api = leased_api()
    hold(api)
    mutex = make(api, clock, lease=2, holder_check_interval=0.5, timeout=60)
    removed_breakers = _sweeping(api, mutex)
    record = api.faults["RemoveServicesFromReservation"][0]
    late = []

    def late_and_reset(reservation_id, aliases) -> bool:
        if aliases == [BREAKER] and not late:
            late.append(api.services[BREAKER][protocol.ATTR_OWNER])
            api.later(clock.now + 3.0, lambda: record(reservation_id, aliases) or api.services.pop(BREAKER))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return record(reservation_id, aliases)

    api.faults["RemoveServicesFromReservation"] = [late_and_reset] * 1000
    assert mutex.acquire() is True
    assert late and BREAKER in api.services and mutex.runtime.late_adds.pending()
    for _ in range(130):  # the watch ends once our remove can no longer land (request_lifetime, 120 s)
        clock.sleep(1.0)
        mutex.runtime.late_adds.sweep()
    assert BREAKER not in api.services and not mutex.runtime.late_adds.pending()
    assert removed_breakers == late  # removed once: by the late remove, not by a second one
    assert api.calls.count("RemoveServicesFromReservation") == 2  # the holder's, and the breaker's once
    mutex.release()


def test_an_on_lost_callback_may_release_from_the_heartbeat(clock):
    api = leased_api()
    holder_box = []

    def release_on_loss(error):
        with pytest.raises(MutexLostError):
            holder_box[0].release()

    mutex = make(api, clock, lease=3, on_lost=release_on_loss)
    holder_box.append(mutex)
    mutex.acquire()
    api.services.clear()
    clock.sleep(FRESH_READ_LAG)
    assert mutex.renew() is False
    assert not mutex.locked()


def _lagging_once(api: FakeApi, clock):
    """A fault for one read: it shows the reservation as it was before the lock was taken (lagging)."""

    def lagging(*args) -> bool:
        service = api.services.pop(protocol.DEFAULT_ALIAS)
        api.later(clock.now, lambda: api.services.__setitem__(protocol.DEFAULT_ALIAS, service))
        return False

    return lagging


def test_a_heartbeat_read_that_may_lag_behind_the_lock_reports_no_loss(clock):
    """Right after the lock is taken (or adopted: a reader joining a read group beats at once), a fresh read
    may show the reservation as it was before: that is no loss. The next beat, later, asks again."""
    api = leased_api()
    lost = []
    mutex = make(api, clock, lease=3, on_lost=lost.append)
    mutex.acquire()
    api.faults["GetReservationDetails"] = [_lagging_once(api, clock)]
    assert mutex.renew() is False  # not confirmed ...
    assert not lost and mutex.locked()  # ... and not lost
    clock.sleep(FRESH_READ_LAG)
    assert mutex.renew() is True
    mutex.ensure_held()
    mutex.release()


def test_ensure_held_with_a_read_asks_again_when_the_read_may_lag(clock):
    api = leased_api()
    mutex = make(api, clock, lease=3)
    mutex.acquire()
    api.faults["GetReservationDetails"] = [_lagging_once(api, clock)]
    api.calls.clear()
    mutex.ensure_held(read=True)  # raised MutexLostError on the one lagging read
    assert api.calls == ["GetReservationDetails", "GetReservationDetails"]
    assert mutex.renew() is True
    mutex.release()


def test_a_release_whose_remove_may_still_land_keeps_the_lease_alive_until_it_is_settled(clock):
    """A remove of unknown outcome can land up to request_lifetime later. Were the heartbeat silent
    meanwhile, a waiter could break the lock after lease + margin and take it, and our remove would then
    delete the waiter's lock. So the heartbeat goes on until the release is settled, and the remove of our
    own that lands is not reported as a loss."""
    api = leased_api()
    api.clock = clock
    lost = []
    mutex = make(api, clock, lease=3, on_lost=lost.append)
    mutex.acquire()
    beat = mutex._held.heartbeat
    seen = []

    def heartbeat_thread(method: str) -> None:
        # The daemon thread's stand-in on virtual time: it beats every second while it has not been stopped.
        if method != "SetServiceAttributesValues" and not beat._stop.is_set() and clock.now - beat_at[0] >= 1:
            beat_at[0] = clock.now
            beat.beat()
            service = api.services.get(protocol.DEFAULT_ALIAS)
            if service is not None:
                seen.append(service[protocol.ATTR_HEARTBEAT])

    beat_at = [clock.now]

    def reset_after_commit(reservation_id, aliases) -> bool:
        api.late_remove(clock.now + 10 * 3)  # lands well after lease + margin
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["RemoveServicesFromReservation"] = [reset_after_commit]
    api.on_call = heartbeat_thread
    mutex.release()
    assert not api.services  # our remove landed; release waited for it and sent no second one
    assert api.removed.count(protocol.DEFAULT_ALIAS) == 1
    assert len(set(seen)) >= 10, "the lease must stay alive while our remove may still land"
    assert beat._stop.is_set() and not lost  # stopped once settled; our own remove is no loss
