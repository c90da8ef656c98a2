"""Passing a held mutex between lock objects without a call: what the cohort, the read groups and adopt use.

These steps are not the user's: a :class:`~.mutex.ReservationMutex` shows only what its caller needs, and
the lock kinds built from mutexes (:mod:`..cohort`, :mod:`..rw`) hand its hold over here. The hold itself is
a :class:`~.held.Held`; what passes between two objects is an :class:`~..engine.Acquisition`.
"""

from __future__ import annotations

from typing import Optional

from .. import events
from ..engine import Acquisition, Wait
from .held import Held
from .mutex import ReservationMutex


def acquisition(mutex: ReservationMutex) -> Optional[Acquisition]:
    """The held acquisition as a value (token, last confirmation that counts for a successor, lease), or
    None when not held. No call."""
    held: Optional[Held] = mutex._held
    return held.acquisition() if held is not None else None


def join(
    mutex: ReservationMutex, token: str, deadline: Optional[Wait] = None, secret: Optional[bytes] = None
) -> None:
    """Make ``mutex`` hold the acquisition ``token`` after one fresh read shows it (``adopt``; a cohort
    member carrying on after a holder that died). With ``deadline``, transient read failures are backed off
    and read again until it, as an acquire's reads are (None: one read). ``secret``: the one the token
    commits to, when known (a cohort's state keeps it; an export handle does not). Raises
    :class:`~..errors.MutexLostError` when the read shows another holder or none."""
    mutex._join(token, deadline, secret)


def take_over(mutex: ReservationMutex, passed: Acquisition) -> None:
    """Make ``mutex`` hold ``passed``, which another object on this machine handed over (:func:`hand_over`),
    without a call: a trusted adopt. Its confirmation is recent enough that no waiter can have broken it;
    the heartbeat goes on from there, keeping the passer's schedule."""
    core = mutex._core
    held = Held(core, passed.token, passed.confirmed_at, mutex._part, passed.secret)
    mutex._held = held
    mutex._register()
    if passed.lease > 0:
        due = passed.confirmed_at + passed.lease / 3 - core.runtime.clock()
        held.start_heartbeat(passed.confirmed_at, passed.lease, first_delay=due)
    core.news.event(events.ACQUIRED, core.operation(passed.token), error="passed within the cohort")


def hand_over(mutex: ReservationMutex) -> Optional[Acquisition]:
    """Stop holding without removing the service, so that another object can :func:`take_over` it: stops
    the heartbeat. None when the lock must not be passed (not held, nested, lost, the lease may have
    lapsed, or a call of ours may still land): then release() it."""
    held: Optional[Held] = mutex._held
    if held is None or not held.passable():
        return None
    beat = held.heartbeat
    if beat is not None:
        beat.stop()
        if beat.lost:  # the round that was running found it taken
            return None
    passed = held.acquisition()
    op = mutex._core.operation(held.token)
    held.drop_ticket()  # still held, so still ours: the next holder in the cohort knows nothing of it
    mutex._forget()
    mutex._core.news.event(events.RELEASED, op, error="passed within the cohort")
    return passed


def detach(mutex: ReservationMutex) -> None:
    """Stop holding without removing the service (no call): for an acquisition shared with other
    participants (``adopt``, a read group) when another participant removes it. The heartbeat stops; an add
    that may still land goes to the watcher."""
    mutex._forget()


def stop_heartbeat(mutex: ReservationMutex) -> None:
    """Stop heartbeating (no call) while the lock stays held: for a participant of a shared acquisition whose
    share ends before the lock is removed (a reader leaving its read group), so that its heartbeat does not
    report the lock lost when another participant removes it."""
    held: Optional[Held] = mutex._held
    if held is not None and held.heartbeat is not None:
        held.heartbeat.stop()


def others_waiting(mutex: ReservationMutex) -> bool:
    """One fresh read: True when the lock's queue shows a waiter of another acquisition (someone parked, on
    this machine or another), or when the read cannot tell (a failed read, or ``fair=False``: plain pollers
    leave no trace). A cohort that passes the lock past its bounds asks this first: it yields only to a
    waiter it can see."""
    queue = mutex._queue
    if queue is None or queue.off:
        return True
    result = mutex._core.alias.read()
    view = queue.saw(result, mutex.token)
    return view is None or view.others(mutex.token) > 0


def line_up(mutex: ReservationMutex) -> None:
    """Make the next acquire of ``mutex`` line up in the queue before its first add (no call), as a releaser
    that saw others waiting does: the cohort's next holder after the cohort yielded the lock to waiters
    elsewhere goes behind them, with no pause in which the lock stands free."""
    if mutex._queue is not None:
        mutex._queue.memory.expect_others(mutex._core.runtime.clock())
