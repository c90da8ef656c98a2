"""The engine every lock kind runs on: one wait value, one acquire loop, one face, one hand-over value.

* :class:`Wait` is one wait as one value: the caller's deadline, its cancellation and the pause (kazoo's
  ``_Watch``, etcd's ``ctx``), made once per acquire and handed down whole: a read group's closer, the
  cohort's local wait, the fair queue and the mutex's adds all end and pause by it.
* :func:`acquire_loop` is the one loop that waits (filelock's ``acquire`` over ``_acquire``, kazoo's
  ``acquire`` over ``_inner_acquire``). A lock kind supplies an :class:`Attempt`: what one try is (the
  mutex's add and what settles it, a reader's snapshot and entry, the queue's read and join, the cohort's
  local file lock) and what giving up means. The loop owns the wait between tries, which is where a
  caller's cancellation is heard (:meth:`Wait.pause`).
* :class:`Acquisition` is a held acquisition as a value: what one object hands another when a lock passes
  between them without a call (a cohort's pass, a read group's join, an adopt).
* :class:`LockFace` is what every lock kind shows the same way (Curator's ``InterProcessLock``): a context
  manager over ``acquire``/``release``, and ``locked``/``owned``.
* :class:`Runtime` is the one test seam: the clock, the sleep, the random source and the late-add watcher
  that every step of one lock shares (kazoo's ``client.handler``).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .options import UNSET, check_duration
from .pacing import CANCEL_SLICE, CancelledWait, Protocol


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


class Wait:
    """One wait as one value (etcd's ``ctx``, kazoo's ``_Watch``): when it must end (``at``, on the clock of
    the lock that waits; None: never), how it pauses (``sleep``) and its caller's cancellation (``cancelled``,
    None: none). Made once per acquire by :meth:`for_acquire` and handed down whole: every wait below asks
    it what is left, and pauses through it.
    """

    __slots__ = ("at", "cancelled", "clock", "sleep", "timeout")

    def __init__(
        self,
        at: Optional[float],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        cancelled: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.at = at
        self.clock = clock
        self.sleep = sleep
        self.cancelled = cancelled
        #: The caller's timeout in seconds, for a wait made from one (None: never, or not made so).
        self.timeout: Optional[float] = None

    @classmethod
    def after(
        cls,
        timeout: Optional[float],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        cancelled: Optional[Callable[[], bool]] = None,
    ) -> Wait:
        """``timeout`` seconds from now (None: never)."""
        wait = cls(None if timeout is None else clock() + timeout, clock, sleep, cancelled)
        wait.timeout = timeout
        return wait

    @classmethod
    def now(
        cls, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> Wait:
        """A wait that has already ended: one try, no pause (a non-blocking acquire)."""
        return cls.after(0.0, clock, sleep)

    @classmethod
    def for_acquire(
        cls, blocking: bool, timeout: Any, default: Optional[float], runtime: Runtime, cancelled: Any
    ) -> Wait:
        """The preamble of every lock kind's ``acquire(blocking, timeout)``: ``timeout`` (``UNSET``: the
        lock's ``default``) is checked, and refused for a non-blocking acquire, whose wait has already ended
        and cannot be cancelled. ``cancelled`` is the caller's check (:func:`~.pacing.cancellation_check`)."""
        if timeout is UNSET:
            timeout = default
        elif not blocking:
            raise ValueError("a non-blocking acquire cannot have a timeout; leave timeout out")
        check_duration("timeout", timeout, allow_none=True)
        if not blocking:
            return cls.now(runtime.clock, runtime.sleep)
        return cls.after(timeout, runtime.clock, runtime.sleep, cancelled)

    def left(self) -> Optional[float]:
        """Seconds left, never negative (None: no deadline). What a nested acquire takes as its timeout."""
        return None if self.at is None else max(0.0, self.at - self.clock())

    def passed(self) -> bool:
        """True once the deadline has come."""
        return self.at is not None and self.clock() >= self.at

    def clip(self, seconds: float) -> float:
        """``seconds``, cut so that a wait never runs past the deadline (and never negative)."""
        left = self.left()
        return max(0.0, seconds if left is None else min(seconds, left))

    def sooner(self, seconds: float) -> Wait:
        """This wait, ending ``seconds`` from now if that comes first (a bounded step inside a wait)."""
        bound = self.clock() + seconds
        return Wait(bound if self.at is None else min(self.at, bound), self.clock, self.sleep, self.cancelled)

    def on_real_time(self) -> Wait:
        """The time this wait has left, on this machine's real clock (a wait for a local file lock)."""
        return Wait.after(self.left(), cancelled=self.cancelled)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, never past the deadline. With a cancellation: it is checked first (even for
        0 s) and after every slice of at most :data:`~.pacing.CANCEL_SLICE` seconds, and
        :class:`~.pacing.CancelledWait` is raised once it is True (no server call)."""
        left = self.clip(seconds)
        if self.cancelled is None:
            self.sleep(left)
            return
        while True:
            if self.cancelled():
                raise CancelledWait()
            if left <= 0:
                return
            step = min(left, CANCEL_SLICE)
            self.sleep(step)
            left -= step

    def __repr__(self) -> str:
        left = self.left()
        return "Wait(never)" if left is None else f"Wait(in {left:.3f} s)"


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


def acquire_loop(attempt: Attempt, wait: Wait) -> bool:
    """Try, and pause between tries, until a try is done (True) or the deadline gives up.

    The pause is the wait's (:meth:`Wait.pause`): never past the deadline, and where a caller's cancellation
    raises. A try that needs to wait inside itself gets the same wait.
    """
    while True:
        delay = attempt.try_once()
        if delay is None:
            return True
        if wait.passed():
            return attempt.give_up()
        attempt.waiting()
        wait.pause(delay)


class LockFace:
    """What every lock kind shows the same way: where it is (``api``, ``reservation_id``, ``name``), ``with
    lock:`` acquires and releases, ``owned()`` is ``locked()`` (redis-py's name), and ``repr`` names the lock
    and whether this object holds it. A kind supplies ``acquire``, ``release``, ``locked`` and
    ``_lock_alias``, the calls on its lock's alias (a :class:`~.server.alias.LockAlias`)."""

    _lock_alias: Any

    @property
    def api(self) -> Any:
        """The API session the lock makes its calls with."""
        return self._lock_alias.api

    @property
    def reservation_id(self) -> str:
        """The reservation this lock is in."""
        return str(self._lock_alias.reservation_id)

    @property
    def name(self) -> str:
        """The lock's service alias (``MUTEX`` unless given)."""
        return str(self._lock_alias.alias)

    def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:  # pragma: no cover - each kind's
        """Take the lock (each kind says how)."""
        raise NotImplementedError

    def release(self) -> None:  # pragma: no cover - each kind's
        """Release the lock (each kind says how)."""
        raise NotImplementedError

    def locked(self) -> bool:  # pragma: no cover - each kind's
        """True while *this object* holds the lock, as far as it knows (no call)."""
        raise NotImplementedError

    def owned(self) -> bool:
        """The same as :meth:`locked`: True while this object holds the lock (redis-py's name)."""
        return self.locked()

    def __enter__(self) -> Any:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # A failed release is raised even when the block raised: a lock that may still be held or was lost
        # must not go unnoticed. Python chains the block's exception as __context__.
        self.release()

    def __repr__(self) -> str:
        token = getattr(self, "token", None)
        state = f"held as {token!r}" if self.locked() and token else "held" if self.locked() else "not held"
        return f"<{type(self).__name__} {self.name!r} reservation={self.reservation_id} {state}>"
