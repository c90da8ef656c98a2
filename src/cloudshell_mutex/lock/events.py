"""Structured events that the lock reports to an ``on_event`` hook."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

#: Event kinds, in the order an acquisition can emit them.
CONTENDED = "contended"  # the alias is taken; holder names the owner read (None if unread)
TRANSIENT = "transient"  # a call failed in a way that a retry may fix
RESOLVED = "resolved"  # an add whose outcome was unknown turned out to be ours
ACQUIRED = "acquired"
TIMEOUT = "timeout"
CANCELLED = "cancelled"  # the caller cancelled the wait; nothing of the acquisition is left
ERROR = "error"  # a fatal error was raised
RELEASED = "released"
LOST = "lost"  # the lock was not ours any more (at release, or seen by the heartbeat); nothing was removed
BROKEN = "broken"  # this waiter removed a stale holder (holder: its label; error: what it saw)
DANGER = "danger"  # heartbeats failed for 2/3 of the lease: it may lapse soon
EXPIRED = "expired"  # held for max_hold: the lease is no longer renewed, so waiters may break it
DEADLOCK = "deadlock"  # this waiter gave up: a wait-for cycle through it (error: the cycle)

EVENT_KINDS = (
    CONTENDED,
    TRANSIENT,
    RESOLVED,
    ACQUIRED,
    TIMEOUT,
    CANCELLED,
    ERROR,
    RELEASED,
    LOST,
    BROKEN,
    DANGER,
    EXPIRED,
    DEADLOCK,
)


@dataclass(frozen=True)
class MutexEvent:
    """One thing that happened to one acquisition.

    ``waited`` is seconds since acquire() (or, for release events, release()) started, ``attempts``
    the add attempts so far, ``calls`` the API calls this acquisition (or release) made so far, not
    counting the once-per-process catalog read. ``holder`` is the other owner's label (contended,
    timeout, lost); ``error`` the message of an error, timeout or transient failure, or a note.
    """

    kind: str
    reservation_id: str
    alias: str
    token: Optional[str]
    waited: float = 0.0
    attempts: int = 0
    calls: int = 0
    holder: Optional[str] = None
    error: Optional[str] = None


EventHook = Callable[[MutexEvent], None]


def emit(hook: Optional[EventHook], event: MutexEvent, logger: Optional[logging.Logger]) -> None:
    """Call the hook; a failing hook is logged and never breaks the lock."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:  # the hook is user code: it must not leak or corrupt the lock
        if logger is not None:
            logger.exception("cloudshell-mutex: on_event hook failed for %s event", event.kind)


_E = TypeVar("_E", bound=BaseException)


class Reporter:
    """Where one lock's news goes: its ``on_event`` hook and its logger.

    ``calls`` in events count the API calls of the operation so far (the alias's count since the
    operation began). ``alias`` is the lock's :class:`~.alias.LockAlias` and each ``op`` an
    :class:`~.operation.Operation`; they are not imported here, so that every module may report.
    """

    def __init__(
        self,
        alias: Any,
        logger: logging.Logger,
        on_event: Optional[EventHook] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alias = alias
        self.logger = logger
        self.on_event = on_event
        self._clock = clock

    def calls_of(self, op: Any) -> int:
        """The API calls ``op`` made so far."""
        return self.alias.calls - op.calls_at_start

    def event(self, kind: str, op: Any, holder: Optional[str] = None, error: Optional[str] = None) -> None:
        """Send one event about ``op`` to the hook (if any)."""
        if self.on_event is None:
            return
        event = MutexEvent(
            kind=kind,
            reservation_id=self.alias.reservation_id,
            alias=self.alias.alias,
            token=op.token,
            waited=self._clock() - op.start,
            attempts=op.adds,
            calls=self.calls_of(op),
            holder=holder,
            error=error,
        )
        emit(self.on_event, event, self.logger)

    def log(self, level: int, message: str, *args: Any) -> None:
        """Log one line, marked as the lock's."""
        self.logger.log(level, "cloudshell-mutex: " + message, *args)

    def error(
        self,
        error: _E,
        op: Any,
        kind: str = ERROR,
        level: int = logging.ERROR,
        holder: Optional[str] = None,
    ) -> _E:
        """Emit and log an error about to be raised; return it."""
        self.event(kind, op, holder=holder, error=str(error))
        self.log(level, "%s", error)
        return error
