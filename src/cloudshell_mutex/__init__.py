"""cloudshell-mutex: a reservation lock for Quali CloudShell that never proceeds without the lock."""

from __future__ import annotations

from .errors import (
    MutexError,
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
from .lock import ReservationMutex
from .pacing import CallBudget, DefaultPacing, ExponentialBackoff, FixedPacing, OriginalPacing

__version__ = "0.1.0"

__all__ = [
    "CallBudget",
    "DefaultPacing",
    "ExponentialBackoff",
    "FixedPacing",
    "Holder",
    "MutexError",
    "MutexEvent",
    "MutexLostError",
    "MutexNotInstalled",
    "MutexPermissionError",
    "MutexReleaseError",
    "MutexTimeout",
    "MutexUsageError",
    "OriginalPacing",
    "ReservationMutex",
    "ReservationNotActive",
    "__version__",
]
