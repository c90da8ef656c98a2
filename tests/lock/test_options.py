"""Every lock option is checked when the lock is made, in one place (MutexOptions): a wrong value
fails at once, naming the option, never later with the lock held or silently (scenario 6 of step 5)."""

from __future__ import annotations

import logging
import math

import pytest
from fakes import RES, FakeApi, make

from cloudshell_mutex import MutexOptions, MutexTimeout, ReservationMutex
from cloudshell_mutex.lock.engine import Runtime


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"release_attempts": 2.5}, TypeError, "release_attempts must be a whole number"),
        ({"release_attempts": True}, TypeError, "release_attempts"),
        ({"release_attempts": 0}, ValueError, "release_attempts must be at least 1"),
        ({"release_check_after": math.nan}, ValueError, "release_check_after must be a finite"),
        ({"release_check_after": -1}, ValueError, "release_check_after must be at least 0"),
        ({"timeout": math.nan}, ValueError, "timeout must be a finite number of seconds .use None"),
        ({"timeout": math.inf}, ValueError, "timeout must be a finite"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds or None"),
        ({"timeout": -1}, ValueError, "timeout must be at least 0"),
        ({"holder_check_interval": "1"}, TypeError, "holder_check_interval"),
        ({"progress_interval": 1e-9}, ValueError, "progress_interval must be at least 1"),
        ({"request_lifetime": 0.1}, ValueError, "request_lifetime must be at least 1"),
        ({"verify": "yes"}, TypeError, "verify must be True or False"),
        ({"pacing": 0.5}, TypeError, "pacing must be a pacing policy"),
        ({"on_event": "print"}, TypeError, "on_event must be a callable"),
        ({"model": ""}, ValueError, "model must be the name"),
        ({"retries": 3}, TypeError, "unknown lock option.*retries"),
        ({"reservation_id": ""}, ValueError, "reservation_id"),
        ({"name": " "}, ValueError, "name"),
        ({"cancellation": "stop"}, TypeError, "cancellation must be the command's CancellationContext"),
        ({"cancellation": True}, TypeError, "cancellation must be"),
        ({"max_hold": 600, "lease": 0}, ValueError, "max_hold needs a lease.*Set lease"),
        ({"max_hold": 0}, ValueError, "max_hold must be a positive number"),
        ({"max_hold": "600"}, TypeError, "max_hold must be a number of seconds"),
        ({"max_hold": math.inf}, ValueError, "max_hold must be a finite"),
    ],
)
def test_bad_options_fail_when_the_lock_is_made(kwargs, error, message):
    args = {"api": FakeApi(), "reservation_id": RES, **kwargs}
    with pytest.raises(error, match=message):
        ReservationMutex(**args)


def test_options_can_be_made_once_and_passed_through():
    options = MutexOptions(timeout=30, verify=True)
    mutex = ReservationMutex(FakeApi(), RES, options=options, holder_check_interval=2)
    assert mutex.timeout == 30 and mutex.options.verify and mutex.options.holder_check_interval == 2
    assert options.holder_check_interval == 5.0  # the shared options object is not changed
    with pytest.raises(TypeError, match="options must be a MutexOptions"):
        ReservationMutex(FakeApi(), RES, options={"timeout": 3})


def test_a_non_blocking_acquire_cannot_have_a_timeout(clock):
    """As threading.Lock: acquire(blocking=False, timeout=5) is a contradiction, not a 5 s wait."""
    mutex = make(FakeApi(), clock)
    with pytest.raises(ValueError, match="non-blocking"):
        mutex.acquire(blocking=False, timeout=5)
    with pytest.raises(ValueError, match="timeout must be a finite"):
        mutex.acquire(timeout=math.nan)


def test_owner_none_and_non_ascii_labels_read_back_as_given(clock):
    api = FakeApi()
    assert make(api, clock).owner == "Router A driver"
    unnamed = ReservationMutex(api, RES, owner=None)
    assert unnamed.owner == "cloudshell-mutex"
    mutex = ReservationMutex(api, RES, owner="Routeur é Köln", runtime=Runtime(clock, clock.sleep))
    with mutex:
        assert mutex.token.startswith("Routeur é Köln@")
        assert mutex.holder().label.startswith("Routeur é Köln (host")


def test_the_timeout_message_names_the_timeout_given(clock):
    api = FakeApi()
    api.services["MUTEX"] = {"Mutex Owner": "Other@host:1:deadbeef"}
    mutex = make(api, clock)
    with pytest.raises(MutexTimeout, match=r"timed out after 2 s waiting"):
        mutex.acquire(timeout=2)


def test_the_lock_logs_to_the_cloudshell_mutex_logger_by_default(clock, caplog):
    mutex = make(FakeApi(), clock)
    with caplog.at_level(logging.INFO, logger="cloudshell_mutex"), mutex:
        pass
    messages = [r.getMessage() for r in caplog.records if r.name == "cloudshell_mutex"]
    assert any("acquired MUTEX" in m for m in messages) and any("released MUTEX" in m for m in messages)
