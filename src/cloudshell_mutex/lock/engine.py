"""The engine every lock kind runs on: one deadline, one acquire loop, one hand-over value.

* :class:`Deadline` is the caller's timeout as one value, handed down to every wait below it (kazoo's
  ``_Watch``): a read group's closer, the cohort's local wait, the fair queue and the mutex's adds all end
  by it, and none converts between absolute and relative time on its own.
* :func:`acquire_loop` is the one loop that waits (filelock's ``acquire`` over ``_acquire``, kazoo's
  ``acquire`` over ``_inner_acquire``). A lock kind supplies an :class:`Attempt`: what one try is (the
  mutex's add and what settles it, a reader's snapshot and entry, the queue's read and join, the cohort's
  local file lock) and what giving up means. The loop owns the deadline and the pause between tries, which
  is where a caller's cancellation is heard (:func:`~.pacing.pause`).
* :class:`Acquisition` is a held acquisition as a value: what one object hands another when a lock passes
  between them without a call (a cohort's pass, a read group's join, an adopt).
* :class:`Runtime` is the one test seam: the clock, the sleep, the random source and the late-add watcher
  that every part of one lock shares (kazoo's ``client.handler``).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .pacing import Protocol


@dataclass
class Runtime:
    """What time and chance are for one lock and all its parts: tests swap them in one place."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    #: The watcher that removes an add of ours landing after we gave up (a :class:`~.late_adds.LateAdds`,
    #: not imported here: the engine sits below the calls it runs).
    late_adds: Any = None

    @property
    def real_time(self) -> bool:
        """True on the real monotonic clock (heartbeat threads run only then; tests renew() by hand)."""
        return self.clock is time.monotonic


class Deadline:
    """When a wait must end, on the clock of the lock that waits (``at`` None: never).

    Made once per acquire from the caller's timeout and handed down; every wait asks it what is left.
    """

    __slots__ = ("at", "clock")

    def __init__(self, at: Optional[float], clock: Callable[[], float] = time.monotonic) -> None:
        self.at = at
        self.clock = clock

    @classmethod
    def after(cls, timeout: Optional[float], clock: Callable[[], float] = time.monotonic) -> Deadline:
        """``timeout`` seconds from now (None: never)."""
        return cls(None if timeout is None else clock() + timeout, clock)

    @classmethod
    def now(cls, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """A deadline that has already come: one try, no wait (a non-blocking acquire)."""
        return cls(clock(), clock)

    def left(self) -> Optional[float]:
        """Seconds left, never negative (None: no deadline). What a nested acquire takes as its timeout."""
        return None if self.at is None else max(0.0, self.at - self.clock())

    def passed(self) -> bool:
        """True once the deadline has come."""
        return self.at is not None and self.clock() >= self.at

    def clip(self, seconds: float) -> float:
        """``seconds``, cut so that a wait never runs past the deadline."""
        left = self.left()
        return max(0.0, seconds if left is None else min(seconds, left))

    def sooner(self, seconds: float) -> Deadline:
        """This deadline, or ``seconds`` from now if that comes first (a bounded step inside a wait)."""
        bound = self.clock() + seconds
        return Deadline(bound if self.at is None else min(self.at, bound), self.clock)

    def __repr__(self) -> str:
        left = self.left()
        return "Deadline(never)" if left is None else f"Deadline(in {left:.3f} s)"


@dataclass(frozen=True)
class Acquisition:
    """A held acquisition, as one lock object hands it to another without a call.

    ``token`` is the owner token the service carries. ``confirmed_at`` (the monotonic clock of this
    machine) is the send time of the last write that confirmed it, the add or a heartbeat: a waiter
    elsewhere judges the lease from that write, so a successor trusts the lock only so long after it
    (``-inf``: unknown). ``lease`` is the service's lease in seconds (0: none, nobody breaks it).
    ``secret`` is the acquisition's secret, which the token commits to (:mod:`.holder`): whoever has it may
    mark the lock ``~releasing`` so that waiters believe it (None: unknown; such a holder never marks).
    Never shown.
    """

    token: str
    confirmed_at: float = -math.inf
    lease: float = 0.0
    secret: Optional[bytes] = field(default=None, repr=False, compare=False)


class Attempt(Protocol):
    """What a lock kind tells :func:`acquire_loop`: one try, and what the deadline means for it."""

    def try_once(self) -> Optional[float]:
        """One try. None when it is done (the lock is held, or the wait is over); otherwise the seconds to
        pause before the next try (0: at once)."""

    def waiting(self) -> None:
        """Between two tries, before the pause (progress for the people watching). May do nothing."""

    def give_up(self) -> bool:
        """The deadline has come after a try that was not done: raise the timeout, or return what
        acquire() answers (False: busy, for a non-blocking acquire; True: a last check found it held)."""


def acquire_loop(attempt: Attempt, deadline: Deadline, pause: Callable[[float], None]) -> bool:
    """Try, and pause between tries, until a try is done (True) or the deadline gives up.

    ``pause(seconds)`` sleeps and is where a caller's cancellation raises (:func:`~.pacing.pause`); the
    pause never runs past the deadline. A try that needs to wait inside itself gets the same deadline.
    """
    while True:
        delay = attempt.try_once()
        if delay is None:
            return True
        if deadline.passed():
            return attempt.give_up()
        attempt.waiting()
        pause(deadline.clip(delay))


class HeldLock(Protocol):
    """What a lock kind built from mutexes asks of each (:class:`~.mutex.ReservationMutex`): the read side
    of a read-write lock knows its slots, closer and group by this, and so needs no import of the mutex."""

    @property
    def name(self) -> str:
        """The mutex's alias."""

    @property
    def token(self) -> Optional[str]:
        """The owner token while held, else None."""

    @property
    def calls(self) -> int:
        """API calls made."""

    def acquire(self, blocking: bool = True, timeout: Any = ...) -> bool:
        """Take it (see ReservationMutex.acquire)."""

    def release(self) -> None:
        """Release it (see ReservationMutex.release)."""

    def ensure_held(self, read: bool = False) -> None:
        """Raise MutexLostError unless still held."""

    def detach(self) -> None:
        """Stop holding without removing the service."""

    def stop_heartbeat(self) -> None:
        """Stop heartbeating while still held."""

    def join(self, token: str, deadline: Optional[Deadline] = None) -> None:
        """Hold ``token`` after a read shows it."""
