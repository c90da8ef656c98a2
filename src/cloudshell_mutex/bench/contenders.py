"""The locks the benchmark compares: each is a name and a factory of a lock object for one client.

A factory gets a :class:`Seat` (the client's own API session, the reservation, the client's number and
the end of the measuring window) and returns a context manager that holds the lock inside ``with``.
Factories run in the worker processes, so they must be importable (module-level functions, or
``functools.partial`` of them). To compare a new variant (a fair mode, a per-lock call budget), add a
:class:`Contender` to :data:`CONTENDERS` and name it in a plan (``plans.py``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict

from ..lock.mutex.mutex import ReservationMutex
from ..lock.pacing import OriginalPacing
from ..lock.rw.rwlock import ReadLock, ReservationRWLock
from .original import OriginalMutex


class WindowClosed(Exception):
    """The run's measuring window closed while the contender was waiting."""


@dataclass(frozen=True)
class Seat:
    """One client's place in one run: its API session, the reservation, its number, the window's end."""

    api: Any
    reservation_id: str
    client: int
    deadline: float  # time.monotonic() at which the window closes

    def remaining(self) -> float:
        """Seconds until the window closes (0 when it has)."""
        return max(0.0, self.deadline - time.monotonic())

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or raise :class:`WindowClosed` when the window closes first."""
        remaining = self.deadline - time.monotonic()
        if seconds < remaining:
            time.sleep(max(0.0, seconds))
            return
        time.sleep(max(0.0, remaining))
        raise WindowClosed


LockFactory = Callable[[Seat], ContextManager[Any]]


@dataclass(frozen=True)
class Contender:
    """A lock under test: a short ``name`` (used in plans and tables), what it is, and its factory.

    ``original`` marks the original snippet's own code, run with its own behaviour (``randint(2, 5)``
    second sleeps, every error taken as "busy", 100 tries then carrying on without the lock).
    """

    name: str
    description: str
    make: LockFactory
    original: bool = False


def _reservation_mutex(seat: Seat, **options: Any) -> ReservationMutex:
    # The lock's own timeout ends its wait when the window closes (MutexTimeout, then WindowClosed).
    return ReservationMutex(
        seat.api,
        seat.reservation_id,
        owner=f"bench client {seat.client}",
        timeout=seat.remaining(),
        **options,
    )


def default_lock(seat: Seat) -> ReservationMutex:
    """``ReservationMutex`` with every option at its default."""
    return _reservation_mutex(seat)


def original_pacing_lock(seat: Seat) -> ReservationMutex:
    """``ReservationMutex(pacing=OriginalPacing())``: our lock, waiting like the original."""
    return _reservation_mutex(seat, pacing=OriginalPacing())


def release_check_lock(seat: Seat) -> ReservationMutex:
    """``ReservationMutex(release_check_after=5)``: the opt-in release without the ownership read."""
    return _reservation_mutex(seat, release_check_after=5.0)


def fair_lock(seat: Seat) -> ReservationMutex:
    """``ReservationMutex(fair=True)``: the default said (spin, then park in the advisory queue)."""
    return _reservation_mutex(seat, fair=True)


def plain_lock(seat: Seat) -> ReservationMutex:
    """``ReservationMutex(fair=False)``: plain polling, no queue."""
    return _reservation_mutex(seat, fair=False)


def reader_lock(seat: Seat) -> ReadLock:
    """The read side of a ``ReservationRWLock`` with default options: a reader of the readers workload."""
    rw = ReservationRWLock(
        seat.api, seat.reservation_id, owner=f"bench reader {seat.client}", timeout=seat.remaining()
    )
    return rw.read()


def _original(seat: Seat, variant: str) -> OriginalMutex:
    # The original's own defaults (100 tries, randint(2, 5) s); only its sleeps end with the window.
    unique = f"bench client {seat.client}:{uuid.uuid4().hex[:8]}"
    return OriginalMutex(
        seat.api, seat.reservation_id, variant=variant, my_unique_name=unique, sleep=seat.sleep
    )


def original_v1(seat: Seat) -> OriginalMutex:
    """The original snippet, variant 1 (no owner)."""
    return _original(seat, "v1")


def original_v2(seat: Seat) -> OriginalMutex:
    """The original snippet, variant 2 (owner, then a cached read)."""
    return _original(seat, "v2")


#: The contender every ratio is taken against.
BASELINE = "original-v1"
#: Plain polling (``fair=False``): what the sites' workloads also compare the default lock with.
PLAIN_POLLING = "plain"

#: Every known contender, by name.
CONTENDERS: Dict[str, Contender] = {
    c.name: c
    for c in (
        Contender("default", "ReservationMutex, default options", default_lock),
        Contender("fair", "ReservationMutex(fair=True): the advisory queue", fair_lock),
        Contender("plain", "ReservationMutex(fair=False): plain polling, no queue", plain_lock),
        Contender("original-pacing", "ReservationMutex(pacing=OriginalPacing())", original_pacing_lock),
        Contender("release-check-5", "ReservationMutex(release_check_after=5)", release_check_lock),
        Contender(
            "original-v1", "the original snippet v1 (its code and randint(2, 5) s sleeps)", original_v1, True
        ),
        Contender(
            "original-v2", "the original snippet v2 (its code and randint(2, 5) s sleeps)", original_v2, True
        ),
    )
}


def contender(name: str) -> Contender:
    """The contender called ``name``, or a ValueError that lists the known ones."""
    try:
        return CONTENDERS[name]
    except KeyError:
        raise ValueError(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}") from None
