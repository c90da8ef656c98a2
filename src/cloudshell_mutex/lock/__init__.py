"""The lock's wing: the MUTEX protocol and every lock built on it.

* :mod:`.protocol`: the wire-level names shared with the original Mutex_Package protocol.
* :mod:`.alias`: :class:`~.alias.LockAlias`, the calls on one alias in one reservation; the primitive
  under every lock.
* :mod:`.mutex`: :class:`~.mutex.ReservationMutex`, the exclusive lock (the policy over the primitive).
* :mod:`.options`, :mod:`.pacing`: tuning (one validated options type; pacing policies, call budget).
* :mod:`.operation`, :mod:`.classify`, :mod:`.diagnosis`, :mod:`.holder`, :mod:`.catalog`,
  :mod:`.events`, :mod:`.errors`: the record of one operation, what a failure means, what to tell
  the user, who holds a lock, which model the server has, what to report, and the exceptions.
"""

from __future__ import annotations

from .alias import CallResult, LockAlias, Status
from .errors import (
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
from .mutex import ReservationMutex
from .options import MutexOptions

__all__ = [
    "CallResult",
    "Holder",
    "LockAlias",
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
    "Status",
]
