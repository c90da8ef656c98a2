"""Unit tests of ReservationMutex's decisions against a small in-memory fake of the API.

The fake is deliberately tiny (atomic add by alias, remove, fresh reads, scripted faults) and the
clock is virtual, so these tests are fast and deterministic. The proof that the lock works is the
integration suite against the emulator with the real client (tests/lock/test_mutex_emulator.py and
tests/lock/test_exclusion.py).
"""

from __future__ import annotations

import logging
import random
from typing import Any, List

import pytest
from cloudshell.api.common_cloudshell_api import UnauthorizedError
from fakes import RES, Clock, FakeApi, api_error, http_500, make, other_holds
from urllib3.exceptions import NewConnectionError, ProtocolError

from cloudshell_mutex import (
    MutexError,
    MutexLostError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
    ReservationMutex,
    protocol,
)
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.errors import MutexNotInstalled, MutexPermissionError, ReservationNotActive
from cloudshell_mutex.lock.holder import parse_token
from cloudshell_mutex.lock.pacing import CallBudget, FixedPacing
from cloudshell_mutex.lock.queue.tickets import memory_for
from cloudshell_mutex.lock.server import catalog

# ---------------------------------------------------------------- the common case


def test_uncontended_cycle_costs_three_calls_and_learns_the_model_from_the_first_add(clock):
    """Add, the ownership read before the remove (the default), remove. The first add of a process writes
    our attributes; the original model refuses them, so it adds once more with Mutex Owner alone, and
    remembers. The catalog is never asked."""
    api = FakeApi()
    for _ in range(3):
        mutex = make(api, clock, warm=False)
        with mutex:
            assert mutex.locked()
            assert api.services[protocol.DEFAULT_ALIAS] == {protocol.ATTR_OWNER: mutex.token}
        assert not mutex.locked()
        assert protocol.DEFAULT_ALIAS not in api.services
    assert api.count("GetServices") == 0
    cycle = ["AddServiceToReservation", "GetReservationDetails", "RemoveServicesFromReservation"]
    assert api.calls == ["AddServiceToReservation", *cycle * 3]


def test_release_check_after_opts_in_to_the_two_call_cycle(clock):
    api = FakeApi()
    mutex = make(api, clock, release_check_after=5)
    with mutex:
        pass
    assert api.calls == ["AddServiceToReservation", "RemoveServicesFromReservation"]


def test_token_is_unique_per_acquisition_and_readable(clock):
    api = FakeApi()
    mutex = make(api, clock)
    tokens = set()
    for _ in range(5):
        mutex.acquire()
        tokens.add(mutex.token)
        info = parse_token(mutex.token)
        assert info is not None and info.label == "Router A driver"
        assert len(info.nonce) == 16  # a commitment to the acquisition's secret (holder.commitment)
        mutex.release()
    assert len(tokens) == 5


def test_lease_attributes_only_when_the_model_has_them(clock):
    api = FakeApi(attributes=(protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES))
    with make(api, clock) as mutex:
        written = api.services[protocol.DEFAULT_ALIAS]
        assert written[protocol.ATTR_OWNER] == mutex.token
        assert written[protocol.ATTR_LABEL] == "Router A driver"
        assert written[protocol.ATTR_LEASE_SECONDS] == "60"  # the default lease
        assert written[protocol.ATTR_HEARTBEAT].endswith(":0")  # the first heartbeat: <nonce>:<part>:0
    catalog.forget()
    original = FakeApi()  # only Mutex Owner: writing more would fail on such a server
    with make(original, clock):
        assert list(original.services[protocol.DEFAULT_ALIAS]) == [protocol.ATTR_OWNER]


def test_custom_alias_and_holder(clock):
    api = FakeApi()
    mutex = make(api, clock, name="MUTEX-connectors")
    assert mutex.holder() is None
    with mutex:
        holder = mutex.holder()
        assert holder.alias == "MUTEX-connectors" and holder.token == mutex.token
        assert "Router A driver" in holder.label
    assert "MUTEX-connectors" not in api.services


# ---------------------------------------------------------------- contention and pacing


def test_non_blocking_makes_one_attempt_and_reads_once(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock)
    api.calls.clear()
    assert mutex.acquire(blocking=False) is False
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails"]
    assert not mutex.locked()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"


def test_waits_until_the_holder_releases(clock):
    api = FakeApi()
    other_holds(api)
    seen = []
    mutex = make(api, clock, on_event=seen.append)

    def release_later(method: str) -> None:
        if method == "AddServiceToReservation" and api.count(method) == 6:
            del api.services[protocol.DEFAULT_ALIAS]

    api.on_call = release_later
    assert mutex.acquire(timeout=30) is True
    assert [e.kind for e in seen] == ["contended", "acquired"]
    assert seen[0].holder.startswith("Other")
    acquired = seen[1]
    assert acquired.attempts == 6
    assert (acquired.reservation_id, acquired.alias, acquired.token) == (RES, "MUTEX", mutex.token)
    assert acquired.waited == pytest.approx(0.5) and acquired.calls == 7  # 6 adds + the first holder read
    assert all(abs(s - 0.1) < 1e-9 for s in clock.sleeps)


def test_timeout_raises_names_holder_and_removes_nothing(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock, holder_check_interval=1.0)
    with pytest.raises(MutexTimeout) as caught:
        mutex.acquire(timeout=2.0)
    error = caught.value
    assert "Other" in str(error) and "nothing was removed" in str(error)
    assert error.holder.startswith("Other") and error.held_for == pytest.approx(2.0, abs=0.2)
    assert not error.maybe_held
    assert api.count("RemoveServicesFromReservation") == 0
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"
    assert sum(clock.sleeps) <= 2.0 + 1e-9  # never sleeps past the deadline
    assert not mutex.locked()


def test_never_sleeps_past_the_deadline_with_slow_pacing(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock, pacing=FixedPacing(50.0))
    with pytest.raises(MutexTimeout):
        mutex.acquire(timeout=3.0)
    assert sum(clock.sleeps) == pytest.approx(3.0)


def test_holder_reads_are_rate_limited(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock, holder_check_interval=1.0)
    with pytest.raises(MutexTimeout):
        mutex.acquire(timeout=5.0)
    adds, reads = api.count("AddServiceToReservation"), api.count("GetReservationDetails")
    assert adds >= 40
    assert 4 <= reads <= 7, reads


def test_final_read_before_timeout_finds_our_own_add(clock):
    """The add committed, its reply was lost, the client's own retry saw "already exists", and the
    first holder read failed: the final read at the deadline must report acquired, not raise."""
    api = FakeApi()
    mutex = make(api, clock, holder_check_interval=100.0)

    def commit_then_client_retry(*args):
        api.commit_add(*args)
        raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)

    def read_fails(*args):
        raise http_500()

    api.faults["AddServiceToReservation"] = [commit_then_client_retry]
    api.faults["GetReservationDetails"] = [read_fails]
    assert mutex.acquire(timeout=2.0) is True
    assert api.count("GetReservationDetails") == 2
    assert api.count("AddServiceToReservation") > 2
    mutex.release()
    assert protocol.DEFAULT_ALIAS not in api.services


# ---------------------------------------------------------------- ambiguity


def test_dropped_after_commit_is_resolved_as_acquired(clock):
    """What the real client does: the add commits, the connection drops, the client retries by
    itself and the retry fails with "already exists" - our own add."""
    api = FakeApi()
    events = []

    def commit_then_client_retry(*args):
        api.commit_add(*args)
        raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)

    api.faults["AddServiceToReservation"] = [commit_then_client_retry]
    mutex = make(api, clock, on_event=events.append)
    api.calls.clear()
    assert mutex.acquire(timeout=10) is True
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails"]
    assert [e.kind for e in events] == ["resolved", "acquired"]
    mutex.release()
    assert api.services == {}


def test_a_slow_contention_is_read_at_once_it_may_be_our_own_resent_add(clock):
    """Waiting behind another holder (holder reads not due for 100 s), our add commits just as the
    holder leaves, the reply is lost and the client re-sends it 1 s later: "already exists". That
    call's duration gives it away; without reading at once we would sit on our own lock."""
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock, holder_check_interval=100.0)

    def holder_leaves_then_commit_and_resend(*args):
        del api.services[protocol.DEFAULT_ALIAS]
        api.commit_add(*args)
        clock.now += 1.0  # the client's retry delay
        raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)

    def on_call(method: str) -> None:
        if method == "AddServiceToReservation" and api.count(method) == 3:
            api.faults["AddServiceToReservation"] = [holder_leaves_then_commit_and_resend]

    api.on_call = on_call
    started = clock.now
    assert mutex.acquire(timeout=30) is True
    assert clock.now - started < 2.0
    assert api.count("AddServiceToReservation") == 3
    mutex.release()
    assert api.services == {}


def test_a_fatal_error_of_unknown_outcome_is_settled_before_raising(clock):
    """A 2xx reply without a body (the client raises a plain Exception) may follow a committed add:
    raising MutexError then would leak the lock. One read shows the add was ours."""
    api = FakeApi()
    mutex = make(api, clock)

    def commit_then_empty_reply(*args):
        api.commit_add(*args)
        raise Exception("OK")  # _check_http_response: "if not response.data: raise Exception(reason)"

    api.faults["AddServiceToReservation"] = [commit_then_empty_reply]
    assert mutex.acquire(timeout=5) is True
    mutex.release()
    assert api.services == {}


def test_a_fatal_error_that_committed_nothing_still_raises_after_the_read(clock):
    api = FakeApi()
    mutex = make(api, clock)

    def empty_reply(*args):
        raise Exception("OK")

    api.faults["AddServiceToReservation"] = [empty_reply]
    with pytest.raises(MutexError, match="unexpected CloudShell error"):
        mutex.acquire(timeout=5)
    assert api.count("GetReservationDetails") == 1 and api.services == {}


def test_interrupt_during_acquire_removes_a_committed_add(clock):
    """Ctrl-C while the add's reply is on its way: the add committed, nobody would release it."""
    api = FakeApi()
    mutex = make(api, clock)

    def commit_then_interrupt(*args):
        api.commit_add(*args)
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [commit_then_interrupt]
    with pytest.raises(KeyboardInterrupt):
        mutex.acquire()
    assert api.services == {} and not mutex.locked()
    other_holds(api)  # an interrupt with someone else's lock in place removes nothing

    def interrupt(*args):
        raise KeyboardInterrupt

    api.faults["AddServiceToReservation"] = [interrupt]
    with pytest.raises(KeyboardInterrupt):
        mutex.acquire()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"


def test_non_blocking_raises_when_the_api_fails_rather_than_answering_busy(clock):
    api = FakeApi()

    def refused(*args):
        raise NewConnectionError(None, "Connection refused")

    api.faults["AddServiceToReservation"] = [refused]
    api.faults["GetReservationDetails"] = [refused]
    with pytest.raises(MutexTimeout, match="could not be reached"):  # refused: nothing was sent
        make(api, clock).acquire(blocking=False)


def test_transient_failure_after_commit_is_resolved_by_one_read(clock):
    api = FakeApi()

    def commit_then_drop(*args):
        api.commit_add(*args)
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["AddServiceToReservation"] = [commit_then_drop]
    mutex = make(api, clock)
    api.calls.clear()
    assert mutex.acquire() is True
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails"]
    assert len(clock.sleeps) == 1  # the transient backoff, nothing else


def test_transient_failure_before_commit_retries_the_add(clock):
    api = FakeApi()

    def fail(*args):
        raise http_500()

    api.faults["AddServiceToReservation"] = [fail, fail]
    mutex = make(api, clock)
    api.calls.clear()
    assert mutex.acquire() is True
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails"] * 2 + ["AddServiceToReservation"]


def test_connection_refused_needs_no_settling_read(clock):
    api = FakeApi()

    def refused(*args):
        raise NewConnectionError(None, "Connection refused")

    api.faults["AddServiceToReservation"] = [refused]
    mutex = make(api, clock)
    api.calls.clear()
    assert mutex.acquire() is True
    assert api.calls == ["AddServiceToReservation", "AddServiceToReservation"]


def test_unsettled_ambiguity_at_deadline_says_maybe_held(clock):
    api = FakeApi()

    def commit_then_fail(*args):
        api.commit_add(*args)
        raise http_500()

    def fail(*args):
        raise http_500()

    api.faults["AddServiceToReservation"] = [commit_then_fail] + [fail] * 100
    api.faults["GetReservationDetails"] = [fail] * 100
    mutex = make(api, clock)
    with pytest.raises(MutexTimeout) as caught:
        mutex.acquire(timeout=3.0)
    assert caught.value.maybe_held and caught.value.token in str(caught.value)
    assert api.count("RemoveServicesFromReservation") == 0


def test_verify_mode_costs_one_more_call_and_rejects_a_foreign_owner(clock):
    api = FakeApi()
    mutex = make(api, clock, verify=True)
    api.calls.clear()
    mutex.acquire()
    mutex.release()
    read = "GetReservationDetails"
    assert api.calls == ["AddServiceToReservation", read, read, "RemoveServicesFromReservation"]

    def wrong_grant(reservation_id, model, alias, attributes):
        api.services[alias] = {protocol.ATTR_OWNER: "Other@host:1:deadbeef"}  # server "granted twice"
        return True

    api.faults["AddServiceToReservation"] = [wrong_grant]
    with pytest.raises(MutexTimeout):
        mutex.acquire(timeout=1.0)
    assert not mutex.locked()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"


# ---------------------------------------------------------------- fatal errors


def test_missing_model_raises_at_once(clock):
    api = FakeApi(attributes=(), listed=False)
    mutex = make(api, clock)
    with pytest.raises(MutexNotInstalled, match=r"is not installed.*import Mutex_Package\.zip"):
        mutex.acquire()
    assert clock.sleeps == []
    # The add, and one without attributes: refused too, so the model is missing (not only Mutex Owner).
    assert api.count("AddServiceToReservation") == 2


def test_what_was_learned_about_the_model_heals_itself_when_the_model_changes(clock):
    api = FakeApi(attributes=tuple(catalog.FULL))
    mutex = make(api, clock)  # learned: the model takes our attributes
    api.model_attributes = [protocol.ATTR_OWNER]  # the original package re-imported meanwhile
    with mutex:
        assert list(api.services[protocol.DEFAULT_ALIAS]) == [protocol.ATTR_OWNER]
    assert api.calls == [
        "AddServiceToReservation",  # refused: our attributes
        "AddServiceToReservation",  # Mutex Owner alone
        "GetReservationDetails",
        "RemoveServicesFromReservation",
    ]
    assert catalog.accepted(api, protocol.SERVICE_MODEL) == catalog.OWNER_ONLY


def test_a_model_without_mutex_owner_is_named_and_nothing_is_left_behind(clock):
    """The original repository's current source builds a model with no attributes at all."""
    api = FakeApi(attributes=())
    api.listed = True
    mutex = make(api, clock, warm=False)
    with pytest.raises(MutexNotInstalled, match="has no 'Mutex Owner' attribute") as raised:
        mutex.acquire()
    assert "safe" in str(raised.value) and "Mutex_Package.zip" in str(raised.value)
    assert api.services == {}  # the probe's add, without attributes, was removed
    assert catalog.accepted(api, protocol.SERVICE_MODEL) is None


def test_ended_reservation_raises_reservation_not_active(clock):
    api = FakeApi()
    api.ended = True
    with pytest.raises(ReservationNotActive, match="has ended"):
        make(api, clock).acquire()
    assert clock.sleeps == []


def test_unknown_reservation_raises_reservation_not_active(clock):
    api = FakeApi()
    mutex = ReservationMutex(api, "no-such", runtime=Runtime(clock, clock.sleep))
    with pytest.raises(ReservationNotActive, match="not found"):
        mutex.acquire()


def test_a_rejected_login_says_so_rather_than_permission(clock):
    """Two 401s in a row (the client logged on again in between): the login token expired or was
    revoked, which is not a missing permission."""
    api = FakeApi()

    def unauthorized(*args):
        raise UnauthorizedError("(Unauthorized) [401] reason:Unauthorized")

    api.faults["AddServiceToReservation"] = [unauthorized]
    with pytest.raises(MutexPermissionError, match="expired or was revoked") as raised:
        make(api, clock).acquire()
    assert "admin token" not in str(raised.value)


def test_permission_denied_raises_at_once(clock):
    api = FakeApi()

    def denied(*args):
        raise api_error("User 'bob' does not have permission to add services", code="100")

    api.faults["AddServiceToReservation"] = [denied]
    with pytest.raises(MutexPermissionError, match="admin"):
        make(api, clock).acquire()


def test_unknown_api_error_keeps_code_and_message(clock):
    api = FakeApi()

    def odd(*args):
        raise api_error("Something unusual happened", code="151")

    api.faults["AddServiceToReservation"] = [odd]
    with pytest.raises(MutexError) as caught:
        make(api, clock).acquire()
    assert type(caught.value) is MutexError
    assert caught.value.code == "151" and caught.value.api_message == "Something unusual happened"
    assert api.count("GetReservationStatus") == 1  # confirmed the reservation is still active


def test_hook_failures_do_not_break_the_lock(clock, caplog):
    api = FakeApi()

    def bad_hook(event):
        raise RuntimeError("hook bug")

    logger = logging.getLogger("test-mutex")
    with (
        caplog.at_level(logging.DEBUG, logger="test-mutex"),
        make(api, clock, on_event=bad_hook, logger=logger),
    ):
        pass
    assert "hook failed" in caplog.text
    assert "acquired MUTEX" in caplog.text and "released MUTEX" in caplog.text


# ---------------------------------------------------------------- release


def test_release_is_idempotent_and_no_op_when_not_held(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock)
    mutex.release()
    assert api.calls == []
    assert api.services  # the other owner's lock is untouched
    del api.services[protocol.DEFAULT_ALIAS]
    mutex.acquire()
    mutex.release()
    mutex.release()
    assert api.count("RemoveServicesFromReservation") == 1


def test_release_reads_first_when_confirmation_is_old_and_never_removes_another_owner(clock):
    api = FakeApi()
    events = []
    mutex = make(api, clock, release_check_after=5.0, on_event=events.append)
    mutex.acquire()
    clock.now += 6.0
    other_holds(api)  # someone removed ours and took it (e.g. the original snippet's unconditional remove)
    with pytest.raises(MutexLostError, match="Nothing was removed"):
        mutex.release()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"
    assert api.count("RemoveServicesFromReservation") == 0
    assert not mutex.locked()
    assert events[-1].kind == "lost"
    mutex.release()  # idempotent afterwards
    assert api.count("RemoveServicesFromReservation") == 0


def test_release_check_after_zero_always_reads(clock):
    api = FakeApi()
    mutex = make(api, clock, release_check_after=0)
    api.calls.clear()
    with mutex:
        pass
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails", "RemoveServicesFromReservation"]


def test_recent_fresh_read_renews_the_confirmation(clock):
    api = FakeApi()
    mutex = make(api, clock, release_check_after=5.0)
    mutex.acquire()
    clock.now += 4.0
    assert mutex.holder().token == mutex.token
    clock.now += 4.0  # 8 s after the add, 4 s after the read
    api.calls.clear()
    mutex.release()
    assert api.calls == ["RemoveServicesFromReservation"]


def test_release_retries_transient_failures_and_settles_committed_removes(clock):
    api = FakeApi()
    mutex = make(api, clock, release_check_after=5)
    mutex.acquire()

    def commit_then_drop(reservation_id, aliases):
        api.commit_remove(reservation_id, aliases)
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["RemoveServicesFromReservation"] = [commit_then_drop]
    api.calls.clear()
    mutex.release()
    # The first read, made right after the remove, may lag behind it: only one made FRESH_READ_LAG later
    # settles that the remove landed (see test_unknown_outcomes.py).
    assert api.calls == ["RemoveServicesFromReservation", "GetReservationDetails", "GetReservationDetails"]
    assert not mutex.locked() and api.services == {}


def test_release_not_found_after_own_committed_remove_counts_as_released(clock):
    api = FakeApi()
    mutex = make(api, clock)
    mutex.acquire()

    def commit_then_client_retry(reservation_id, aliases):
        api.commit_remove(reservation_id, aliases)
        clock.now += 1.0  # a client without the re-send turned off re-sends 1 s later: "not found"
        api.commit_remove(reservation_id, aliases)

    api.faults["RemoveServicesFromReservation"] = [commit_then_client_retry]
    mutex.release()
    assert not mutex.locked() and api.services == {}


def test_release_that_finds_the_alias_already_gone_reports_it_lost(clock):
    """Inside the check window someone removed our MUTEX (the original snippet's unconditional
    remove): our remove answers "not found" at once. That is a lost lock, not a quiet release."""
    api = FakeApi()
    mutex = make(api, clock)
    mutex.acquire()
    del api.services[protocol.DEFAULT_ALIAS]
    with pytest.raises(MutexLostError, match="Nothing was removed"):
        mutex.release()
    assert not mutex.locked()


def test_release_never_re_sends_a_remove_without_a_fresh_read(clock):
    """The remove commits and its reply is lost; the read that should follow fails; meanwhile a waiter
    takes the lock. Removing again on the strength of the old read would delete the waiter's lock."""
    api = FakeApi()
    mutex = make(api, clock, release_check_after=5)
    mutex.acquire()

    def commit_then_drop(reservation_id, aliases):
        api.commit_remove(reservation_id, aliases)
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    def fail_while_a_waiter_acquires(*args):
        other_holds(api)
        raise http_500()

    api.faults["RemoveServicesFromReservation"] = [commit_then_drop]
    api.faults["GetReservationDetails"] = [fail_while_a_waiter_acquires]
    mutex.release()
    assert not mutex.locked()
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"
    assert api.count("RemoveServicesFromReservation") == 1


def test_with_the_client_re_send_off_a_slow_not_found_is_still_a_lost_lock(clock):
    """Only a client that may re-send explains "not found" by a re-send; with it off, a slow server
    answering "not found" means the lock was taken from us, and that must not pass silently."""
    api = FakeApi()
    api._attempts = 3
    mutex = make(api, clock)
    mutex.acquire()

    def slow_not_found(reservation_id, aliases):
        del api.services[protocol.DEFAULT_ALIAS]  # a violator removed it meanwhile
        clock.now += 1.5
        return False  # the real remove: "not found"

    api.faults["RemoveServicesFromReservation"] = [slow_not_found]
    with pytest.raises(MutexLostError):
        mutex.release()


def test_remove_is_sent_once_by_the_client(clock):
    """CloudShellAPISession re-sends a dropped request after 1 s (its ``_attempts``); for the remove
    that re-send could delete a successor's lock, so the lock turns it off for that call only."""
    api = FakeApi()
    api._attempts = 3
    seen = []

    def record(*args):
        seen.append(api._attempts)
        return False  # then the real remove

    mutex = make(api, clock)
    mutex.acquire()
    api.faults["RemoveServicesFromReservation"] = [record]
    mutex.release()
    assert seen == [1] and api._attempts == 3
    assert api.services == {}


def test_release_that_keeps_failing_raises_and_stays_held(clock):
    api = FakeApi()
    mutex = make(api, clock, release_attempts=3)
    mutex.acquire()

    def fail(*args):
        raise http_500()

    api.faults["RemoveServicesFromReservation"] = [fail] * 3
    with pytest.raises(MutexReleaseError, match="may still be held"):
        mutex.release()
    assert mutex.locked() and protocol.DEFAULT_ALIAS in api.services
    mutex.release()  # the server answers again
    assert not mutex.locked() and api.services == {}


class RecordingBackoff:
    """Doubles the previous delay, so it only grows if the lock passes the previous delay back."""

    def __init__(self) -> None:
        self.seen: List[Any] = []

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        self.seen.append((attempt, previous))
        return previous * 2 if previous else 0.5


def test_release_backoff_follows_the_pacing_contract(clock):
    api = FakeApi()
    backoff = RecordingBackoff()
    mutex = make(api, clock, release_attempts=4, backoff=backoff)
    mutex.acquire()

    def fail(*args):
        raise http_500()

    api.faults["RemoveServicesFromReservation"] = [fail] * 3
    mutex.release()
    # Each call gets the attempt number and the delay the policy returned last time.
    assert backoff.seen == [(1, 0.0), (2, 0.5), (3, 1.0)]
    assert not mutex.locked() and api.services == {}


def test_release_after_reservation_ended_is_quiet(clock):
    api = FakeApi()
    mutex = make(api, clock)
    mutex.acquire()
    api.ended = True
    mutex.release()
    assert not mutex.locked()


def test_with_block_exception_still_releases(clock):
    api = FakeApi()
    with pytest.raises(ZeroDivisionError), make(api, clock):
        1 / 0  # noqa: B018
    assert api.services == {}


# ---------------------------------------------------------------- usage


def test_reentry_is_an_error_unless_reentrant(clock):
    api = FakeApi()
    mutex = make(api, clock)
    with mutex, pytest.raises(MutexUsageError, match="reentrant=True"):
        mutex.acquire()
    assert api.services == {}

    nested = make(api, clock, reentrant=True)
    with nested:
        with nested:
            assert nested.locked()
        assert nested.locked() and protocol.DEFAULT_ALIAS in api.services
    assert not nested.locked() and api.services == {}
    assert api.count("AddServiceToReservation") == 1


def test_api_must_look_like_a_session():
    with pytest.raises(TypeError, match="CloudShellAPISession"):
        ReservationMutex(object(), RES)
    with pytest.raises(TypeError) as caught:  # a mistaken settings dict: its secrets stay out
        ReservationMutex({"host": "cs", "password": "s3cret"}, RES)
    assert "s3cret" not in str(caught.value)


def test_progress_is_written_to_the_reservation_output_rate_limited(clock):
    api = FakeApi()
    other_holds(api)
    mutex = make(api, clock, progress=True, progress_interval=2.0)
    with pytest.raises(MutexTimeout):
        mutex.acquire(timeout=7.0)
    assert 2 <= len(api.output) <= 3, api.output
    assert api.output[0].startswith("Router A driver: waiting for MUTEX held by Other")
    assert api.output[0].endswith(" s")


def test_call_budget_never_delays_an_uncontended_cycle_or_a_release(clock):
    """The budget limits polling. The first add and the release are not polling: delaying a release
    because waiters in the same process used up the budget would hold everyone up."""
    api = FakeApi()
    budget = CallBudget(rate=0.1, burst=1, clock=clock)
    for _ in range(3):
        budget.reserve()  # other waiters in this process used it up
    mutex = make(api, clock, budget=budget, release_check_after=0)
    with mutex:
        pass
    assert clock.sleeps == []


def test_call_budget_slows_a_waiter(clock):
    api = FakeApi()
    other_holds(api)
    budget = CallBudget(rate=2.0, burst=2, clock=clock)
    mutex = make(api, clock, pacing=FixedPacing(0.0), budget=budget, holder_check_interval=100)
    with pytest.raises(MutexTimeout):
        mutex.acquire(timeout=10.0)
    calls = len(api.calls)
    assert calls <= 1 + 1 + 2 + 2 * 10 + 1, calls  # the first add and read, the burst, 2/s, the final read


class TickingClock(Clock):
    """Virtual time that also moves a little on every reading (as time.monotonic does between two calls)."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def test_the_timeout_message_names_the_timeout_given_on_a_clock_that_moves():
    """The message names the caller's timeout, not the deadline less the moments the preamble took."""
    clock = TickingClock()
    api = FakeApi()
    api.services["MUTEX"] = {"Mutex Owner": "Other@host:1:deadbeef"}
    mutex = make(api, clock)
    with pytest.raises(MutexTimeout, match=r"timed out after 2 s waiting"):
        mutex.acquire(timeout=2)


def test_a_non_blocking_acquire_backs_off_a_transient_failure_on_the_runtime_sleep(clock):
    """runtime= is the one seam: a non-blocking acquire's (0 s) back-off sleeps with the runtime's sleep,
    never time.sleep."""
    api = FakeApi()

    def fail(*_):
        raise http_500()

    api.faults["AddServiceToReservation"] = [fail]
    mutex = make(api, clock)
    with pytest.raises(MutexTimeout, match="kept failing"):  # the add's outcome stayed unknown
        mutex.acquire(blocking=False)
    assert clock.sleeps == [0.0]


def test_a_young_hold_is_no_licence_to_skip_the_releases_read(clock):
    # The original snippet removes the MUTEX it finds after about 200 s of waiting, whoever holds it, so it
    # may remove ours a moment after our add (no lease of ours is involved), and another process takes it.
    api = FakeApi()
    mutex = make(api, clock)
    mutex.acquire()
    clock.now += 0.2
    other_holds(api)
    with pytest.raises(MutexLostError, match="Nothing was removed"):
        mutex.release()  # the read shows it is not ours: the other holder's lock stays
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == "Other@host:1:deadbeef"
    # Without the read (release_check_after: confirmed 0.2 s ago), the other holder's lock is removed.
    api = FakeApi()
    skipping = make(api, clock, release_check_after=5.0)
    skipping.acquire()
    clock.now += 0.2
    other_holds(api)
    skipping.release()
    assert protocol.DEFAULT_ALIAS not in api.services  # removed from under its holder: the cascade


def test_only_a_release_whose_remove_was_answered_tells_the_queue_its_hold_is_over(clock):
    # The queue skips the wait for a hold this process released (LockMemory.released). A remove whose answer
    # was lost after the server committed it may also land later than its error: that release is no sample,
    # and the queue keeps waiting as for anyone's hold.
    api = FakeApi()
    mutex = make(api, clock, fair=True)
    mutex.acquire()
    token = mutex.token
    mutex.release()
    memory = memory_for(api, RES, protocol.DEFAULT_ALIAS)
    assert memory.released == token

    mutex.acquire()

    def commit_then_drop(reservation_id, aliases):
        api.commit_remove(reservation_id, aliases)
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["RemoveServicesFromReservation"] = [commit_then_drop]
    mutex.release()
    assert not mutex.locked() and memory.released == token  # still the first hold's, not this one's
