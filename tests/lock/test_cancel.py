"""Cancellation of a waiting acquire on a virtual clock: where it is asked, what it costs (no calls), what it
leaves (nothing), and what it never interrupts (a held lock, a release, a non-blocking try)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from fakes import Clock, FakeApi, make, other_holds

from cloudshell_mutex import MutexCancelled, MutexError, protocol
from cloudshell_mutex.lock.engine import Wait
from cloudshell_mutex.lock.pacing import CANCEL_SLICE, CancelledWait, FixedPacing, cancellation_check


class StopAfter:
    """A callable cancellation that turns True once the clock reaches ``at``."""

    def __init__(self, clock: Clock, at: float) -> None:
        self.clock, self.at, self.asked = clock, at, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.clock() >= self.at


def test_every_kind_of_cancellation_is_understood():
    context = SimpleNamespace(is_cancelled=False)  # shell-core's CancellationContext: a plain attribute
    event = threading.Event()
    method = SimpleNamespace(is_cancelled=lambda: event.is_set())
    checks = [cancellation_check(source) for source in (context, event, method, event.is_set)]
    assert [check() for check in checks] == [False] * 4
    context.is_cancelled = True
    event.set()
    assert [check() for check in checks] == [True] * 4
    assert cancellation_check(None) is None
    with pytest.raises(TypeError, match="CancellationContext"):
        cancellation_check(object())


def test_a_pause_is_sliced_and_stops_at_the_first_slice_after_the_cancellation(clock):
    stop = StopAfter(clock, clock() + 1.2)
    with pytest.raises(CancelledWait):
        Wait(None, clock, clock.sleep, stop).pause(30.0)
    assert all(step <= CANCEL_SLICE for step in clock.sleeps)
    assert sum(clock.sleeps) == pytest.approx(1.5)  # the slice in which it was cancelled, and no more
    clock.sleeps.clear()
    Wait(None, clock, clock.sleep).pause(30.0)  # nothing to ask: one sleep, as before
    assert clock.sleeps == [30.0]


def test_a_waiter_cancelled_in_a_long_pause_raises_within_half_a_second_without_a_call(clock):
    api = FakeApi(clock=clock)
    other_holds(api)
    start = clock()
    stop = StopAfter(clock, start + 10.0)
    mutex = make(api, clock, pacing=FixedPacing(60.0), holder_check_interval=600, cancellation=stop)
    with pytest.raises(MutexCancelled, match=r"cancelled after 10\.\d s .*held by Other.*nothing") as caught:
        mutex.acquire(timeout=300)
    assert isinstance(caught.value, MutexError) and not isinstance(caught.value, TimeoutError)
    assert clock() - start <= 10.0 + CANCEL_SLICE
    assert caught.value.holder.startswith("Other") and caught.value.waited == pytest.approx(
        10.0, abs=CANCEL_SLICE
    )
    # One add, one read of the holder: the sliced sleep asked the cancellation only.
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails"]
    assert stop.asked > 10
    assert list(api.services) == [protocol.DEFAULT_ALIAS] and not mutex.locked()


def test_an_uncontended_or_non_blocking_acquire_and_a_release_never_ask(clock):
    api = FakeApi(clock=clock)
    asked = []
    mutex = make(api, clock, cancellation=lambda: asked.append(1) or True)
    assert mutex.acquire()  # free: the first add takes it, cancelled or not
    mutex.release()
    other_holds(api)
    assert mutex.acquire(blocking=False) is False  # one try, nothing to interrupt
    assert asked == []
