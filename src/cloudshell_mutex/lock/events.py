"""Structured events that the lock reports to an ``on_event`` hook."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

#: Event kinds, in the order an acquisition can emit them.
CONTENDED = "contended"  # the alias is taken; holder names the owner read (None if unread)
TRANSIENT = "transient"  # a call failed in a way that a retry may fix
RESOLVED = "resolved"  # an add whose outcome was unknown turned out to be ours
ACQUIRED = "acquired"
TIMEOUT = "timeout"
ERROR = "error"  # a fatal error was raised
RELEASED = "released"
LOST = "lost"  # at release, the lock was not ours any more; nothing was removed

EVENT_KINDS = (CONTENDED, TRANSIENT, RESOLVED, ACQUIRED, TIMEOUT, ERROR, RELEASED, LOST)


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
