"""What the running thread holds: the named locks it holds in each reservation, for its tickets to show.

A waiter in the fair queue names, in its ticket, the locks its party holds in the same reservation, so that
another waiter can see a wait-for cycle (:mod:`.waitfor`). "Its party" is the thread that waits, in its
context: a :class:`~.mutex.ReservationMutex` registers here when an acquisition becomes its own (acquire,
adopt, a cohort's take-over) and leaves on release, hand-over or loss. Entries are kept in a context
variable, replaced on every change (a thread started with a copy of this context is not changed by what this
one does later), and count only in the thread that registered them and while their lock object still holds
that acquisition: a worker thread that inherited the context does not claim the locks of the thread that
started it, and an entry whose lock was let go elsewhere (the heartbeat saw it taken) claims nothing.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ..server import catalog

__all__ = ["held_tokens", "register", "unregister"]


@dataclass(frozen=True)
class _Entry:
    server: str
    reservation_id: str
    alias: str
    token: str
    thread: int
    lock: Any  # a weak reference to the lock object (a lock dropped without release() claims nothing)


_HOLDS: contextvars.ContextVar[Tuple[_Entry, ...]] = contextvars.ContextVar(
    "cloudshell_mutex_holds", default=()
)


def register(lock: Any, token: str) -> None:
    """``lock`` (a ReservationMutex) holds the acquisition ``token`` in this thread from now on."""
    entry = _Entry(
        catalog.server_key(lock.api),
        lock.reservation_id,
        lock.name,
        token,
        threading.get_ident(),
        weakref.ref(lock),
    )
    _HOLDS.set((*(e for e in _HOLDS.get() if e.lock() is not lock and _live(e)), entry))


def unregister(lock: Any) -> None:
    """``lock`` holds nothing any more."""
    entries = _HOLDS.get()
    if any(e.lock() is lock for e in entries):
        _HOLDS.set(tuple(e for e in entries if e.lock() is not lock and _live(e)))


def held_tokens(api: Any, reservation_id: str, but: Optional[str] = None) -> Tuple[str, ...]:
    """The tokens of the acquisitions this thread holds in ``reservation_id`` on ``api``'s server, in the
    order they were taken, without those of the lock ``but`` (no call)."""
    server, thread = catalog.server_key(api), threading.get_ident()
    return tuple(
        e.token
        for e in _HOLDS.get()
        if e.server == server
        and e.reservation_id == reservation_id
        and e.thread == thread
        and e.alias != but
        and _live(e)
    )


def _live(entry: _Entry) -> bool:
    lock = entry.lock()
    return lock is not None and lock.token == entry.token
