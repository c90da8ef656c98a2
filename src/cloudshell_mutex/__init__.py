"""cloudshell-mutex: a reservation lock for Quali CloudShell that never proceeds without the lock.

The public surface: the locks (:class:`ReservationMutex`, :class:`ReservationRWLock`, and cohort mode,
:class:`CohortMutex`), their options, and the errors a caller handles. The rest is importable from its
module: every error (``MutexNotInstalled``, ``ReservationNotActive``, ``MutexPermissionError``,
``MutexHandleError``, ``MutexDeadlock``) from :mod:`cloudshell_mutex.lock.errors`, ``acquire_all`` (several
named locks in one order) from :mod:`cloudshell_mutex.lock`, :class:`~.lock.events.MutexEvent` from
:mod:`cloudshell_mutex.lock.events`, :class:`~.lock.holder.Holder` from :mod:`cloudshell_mutex.lock.holder`,
tuning knobs (pacing policies, the call budget) from :mod:`cloudshell_mutex.lock.pacing`; the wire names of
the protocol are :mod:`cloudshell_mutex.lock.protocol` (also ``cloudshell_mutex.protocol``).
"""

from __future__ import annotations

from .lock import protocol
from .lock.cohort import CohortMutex
from .lock.errors import (
    MutexCancelled,
    MutexError,
    MutexLostError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
)
from .lock.mutex import ReservationMutex
from .lock.options import MutexOptions
from .lock.rwlock import ReservationRWLock

__version__ = "0.1.0"

__all__ = [
    "CohortMutex",
    "MutexCancelled",
    "MutexError",
    "MutexLostError",
    "MutexOptions",
    "MutexReleaseError",
    "MutexTimeout",
    "MutexUsageError",
    "ReservationMutex",
    "ReservationRWLock",
    "__version__",
    "protocol",
]
