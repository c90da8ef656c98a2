"""cloudshell-mutex: a reservation lock for Quali CloudShell that never proceeds without the lock.

The public surface: the lock (and its cohort mode, :class:`CohortMutex`), its options and events, and its
errors. Tuning knobs (pacing policies,
the call budget) live in :mod:`cloudshell_mutex.lock.pacing`; the wire names of the protocol in
:mod:`cloudshell_mutex.lock.protocol` (also importable as ``cloudshell_mutex.protocol``).
"""

from __future__ import annotations

from .lock import protocol
from .lock.cohort import CohortMutex
from .lock.errors import (
    MutexCancelled,
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
from .lock.events import MutexEvent
from .lock.holder import Holder
from .lock.mutex import ReservationMutex
from .lock.options import MutexOptions
from .lock.rwlock import ReservationRWLock

__version__ = "0.1.0"

__all__ = [
    "CohortMutex",
    "Holder",
    "MutexCancelled",
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
    "__version__",
    "protocol",
]
