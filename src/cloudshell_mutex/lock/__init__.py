"""The lock's wing: the MUTEX protocol and every lock built on it.

* :mod:`.protocol`: the wire-level names shared with the original Mutex_Package protocol.
* :mod:`.alias`: :class:`~.alias.LockAlias`, the calls on one alias in one reservation; the primitive
  under every lock.
* :mod:`.mutex`: :class:`~.mutex.ReservationMutex`, the exclusive lock (the policy over the primitive).
* :mod:`.options`, :mod:`.pacing`: tuning (one validated options type; pacing policies, call budget).
* :mod:`.lease`, :mod:`.handle`, :mod:`.fencing`, :mod:`.late_adds`: heartbeats and stale-lock
  breaking, the export/adopt handle, the advisory generation, the watcher of adds that may still land.
* :mod:`.queue`: waiting in line (the default; ``fair=False``: plain polling): an advisory queue of
  ticket services, only its head polls, and a call schedule per lock rather than per process.
* :mod:`.waitfor`, :mod:`.holdings`, :mod:`.several`: deadlocks between named locks: the wait-for graph
  one read shows (waiters name what their thread holds, :mod:`.holdings`, in their tickets), and
  :func:`~.several.acquire_all`, several locks in one order.
* :mod:`.cohort`: :class:`~.cohort.CohortMutex`, cohort mode: the processes of one execution server pass
  the lock among themselves (a local file lock and a state file), bounded for other servers' sake.
* :mod:`.operation`, :mod:`.classify`, :mod:`.diagnosis`, :mod:`.holder`, :mod:`.catalog`,
  :mod:`.events`, :mod:`.errors`: the record of one operation, what a failure means, what to tell
  the user, who holds a lock, which attributes the model takes, what to report, and the exceptions.
* :mod:`.rwlock`: :class:`~.rwlock.ReservationRWLock`, shared (read) and exclusive (write) locks built from
  mutexes on reader slots, the read group's ``MUTEX``, a closer and a writer-waiting marker.
* :mod:`.listing`: :func:`~.listing.list_locks`, every lock service in a reservation and what it is.
* :mod:`.admin`, :mod:`.command`: status and force release, shared by the CLI and the service driver.
"""

from __future__ import annotations

import logging

from .cohort.cohort import CohortMutex
from .errors import (
    MutexCancelled,
    MutexDeadlock,
    MutexError,
    MutexHandleError,
    MutexLostError,
    MutexNotInstalled,
    MutexPermissionError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
    ReservationNotActive,
)
from .events import MutexEvent
from .holder import Holder
from .mutex.mutex import ReservationMutex
from .options import LOGGER_NAME, MutexOptions
from .rw.rwlock import ReservationRWLock
from .server.alias import CallResult, LockAlias, Status
from .several import acquire_all

# A library's logger: records reach whatever handlers the application sets up, and never Python's
# last-resort stderr handler when it sets up none (a driver logs to its command's logger instead).
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())

__all__ = [
    "CallResult",
    "CohortMutex",
    "Holder",
    "LockAlias",
    "MutexCancelled",
    "MutexDeadlock",
    "MutexError",
    "MutexEvent",
    "MutexHandleError",
    "MutexLostError",
    "MutexNotInstalled",
    "MutexOptions",
    "MutexPermissionError",
    "MutexReleaseError",
    "MutexTimeout",
    "MutexUsageError",
    "ReservationMutex",
    "ReservationNotActive",
    "ReservationRWLock",
    "Status",
    "acquire_all",
]
