"""Exceptions raised by the reservation lock.

Every error the lock raises is a :class:`MutexError`. Errors that no amount of waiting can fix
(the model is not installed, the reservation is gone, permission is denied) are raised at once,
and their message says what to do. None of them is ever raised while this process still holds
the lock without saying so (see :class:`MutexTimeout.maybe_held`).
"""

from __future__ import annotations

from typing import Optional, Tuple

__all__ = [
    "MutexCancelled",
    "MutexDeadlock",
    "MutexError",
    "MutexHandleError",
    "MutexLostError",
    "MutexNotInstalled",
    "MutexPermissionError",
    "MutexReleaseError",
    "MutexTimeout",
    "MutexUsageError",
    "ReservationNotActive",
]


class MutexError(Exception):
    """Base class of every lock error.

    ``code`` and ``api_message`` carry the CloudShell API error that caused it, when there was one
    (``code`` is a string, as the client reports it).
    """

    def __init__(
        self,
        message: str,
        *,
        reservation_id: Optional[str] = None,
        alias: Optional[str] = None,
        code: Optional[str] = None,
        api_message: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.reservation_id = reservation_id
        self.alias = alias
        self.code = code
        self.api_message = api_message


class MutexTimeout(MutexError, TimeoutError):
    """The lock was not acquired before the deadline. Nothing was removed.

    It is also a :class:`TimeoutError` (as filelock's ``Timeout`` and asyncio's are), so ``except
    TimeoutError`` catches it; so does ``except OSError``, TimeoutError's base.

    ``holder`` is the owner label seen last (or None), ``held_for`` how long this waiter saw that
    holder keep the lock (seconds, on this process's monotonic clock), ``waited`` how long it waited.
    ``maybe_held`` is True only when an add's outcome stayed unknown (the server could not be read);
    then ``token`` names the owner value to look for, and the message says how to clean up.
    """

    def __init__(
        self,
        message: str,
        *,
        holder: Optional[str] = None,
        held_for: Optional[float] = None,
        waited: float = 0.0,
        token: Optional[str] = None,
        maybe_held: bool = False,
        **kwargs: Optional[str],
    ) -> None:
        super().__init__(message, **kwargs)
        self.holder = holder
        self.held_for = held_for
        self.waited = waited
        self.token = token
        self.maybe_held = maybe_held


class MutexCancelled(MutexError):
    """The caller cancelled a waiting acquire (a CloudShell command's Stop, an Event, a callable): the lock
    was not acquired, and what the acquisition had put on the server is taken back as after a timeout (an
    add whose outcome is unknown is left to the late-add watcher, which removes it if it lands).

    ``holder`` is the owner label seen last (or None), ``waited`` how long it waited (seconds).
    """

    def __init__(
        self,
        message: str,
        *,
        holder: Optional[str] = None,
        waited: float = 0.0,
        **kwargs: Optional[str],
    ) -> None:
        super().__init__(message, **kwargs)
        self.holder = holder
        self.waited = waited


class MutexDeadlock(MutexError):
    """Waiting would never end: the lock is held by a party that waits, directly or through others, for a
    lock this acquisition's thread holds (a wait-for cycle, seen in one read of the reservation). Exactly one
    waiter of a cycle raises it; the others get their locks once it has let go. Nothing of this acquisition
    is left; the locks the thread holds stay held (leaving their ``with`` blocks releases them).

    ``cycle`` holds one ``(lock, holder label, what that holder waits for)`` per step, starting with the
    lock this acquisition waited for. Waits of this library's mutexes are seen (in the queue, with
    ``fair=False``, and a cohort member's wait for its machine's local lock); a cycle through the original
    code or through read locks is not (docs/protocol.md).
    """

    def __init__(
        self, message: str, *, cycle: Tuple[Tuple[str, str, str], ...] = (), **kwargs: Optional[str]
    ) -> None:
        super().__init__(message, **kwargs)
        self.cycle = cycle


class MutexNotInstalled(MutexError):
    """The server has no ``Mutex Service`` model: import Mutex_Package.zip."""


class ReservationNotActive(MutexError):
    """The reservation was not found or has ended; there is nothing left to lock."""


class MutexPermissionError(MutexError):
    """CloudShell refused the call for this user (or the session could not log on)."""


class MutexReleaseError(MutexError):
    """Release failed after retries: the lock may still be held. The object still holds it, so
    ``release()`` can be called again."""


class MutexLostError(MutexError):
    """At release, the lock was no longer this acquisition's: someone else removed it (a protocol
    violator, an operator's force release, or the original snippet's unconditional remove). Nothing
    was removed. The work done under the lock may not have been exclusive."""


class MutexHandleError(MutexError, ValueError):
    """A lock handle given to ``ReservationMutex.adopt`` is not one that ``export()`` made (truncated,
    altered, or another string altogether)."""


class MutexUsageError(MutexError, RuntimeError):
    """The object was used in a way that cannot be right, e.g. re-entered while held without
    ``reentrant=True``."""
