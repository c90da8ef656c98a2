"""cloudshell-mutex: a reservation lock for Quali CloudShell that never proceeds without the lock.

The public surface: the locks (:class:`ReservationMutex`, :class:`ReservationRWLock`, and cohort mode,
:class:`CohortMutex`), their options, :func:`acquire_all` (several named locks in one order), and every
error the lock raises (all :class:`MutexError`; also in :mod:`cloudshell_mutex.lock.errors`). The rest is
importable from its module: :class:`~.lock.events.MutexEvent` from
:mod:`cloudshell_mutex.lock.events`, :class:`~.lock.holder.Holder` from :mod:`cloudshell_mutex.lock.holder`,
tuning knobs (pacing policies, the call budget) from :mod:`cloudshell_mutex.lock.pacing`; the wire names of
the protocol are :mod:`cloudshell_mutex.lock.protocol` (also ``cloudshell_mutex.protocol``).
"""

from __future__ import annotations

from .lock import protocol
from .lock.cohort.cohort import CohortMutex
from .lock.errors import (
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
from .lock.mutex.mutex import ReservationMutex
from .lock.options import MutexOptions
from .lock.rw.rwlock import ReservationRWLock
from .lock.several import acquire_all

__version__ = "0.1.0"

__all__ = [
    "CohortMutex",
    "MutexCancelled",
    "MutexDeadlock",
    "MutexError",
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
    "__version__",
    "acquire_all",
    "protocol",
]
