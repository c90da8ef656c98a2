"""Several named locks of one reservation, taken in one order: code that needs them never deadlocks.

Two parties that take locks ``A`` and ``B`` in opposite orders can wait for each other for ever (a fair-mode
waiter sees the cycle and one gives up with :class:`~.errors.MutexDeadlock`, see :mod:`.waitfor`). Parties
that all take them through :func:`acquire_all` take them sorted by name, so no cycle can form.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

from .engine import Wait
from .errors import MutexUsageError
from .options import LOGGER_NAME, UNSET, check_duration
from .protocol import check_lock_name
from .server import catalog

__all__ = ["AcquiredLocks", "acquire_all"]

_LOGGER = logging.getLogger(LOGGER_NAME)


def acquire_all(*locks: Any, timeout: Optional[float] = UNSET) -> AcquiredLocks:
    """Take every lock of ``locks`` (lock objects of one reservation, e.g.
    :class:`~.mutex.ReservationMutex` with distinct ``name``) now, and return them as
    :class:`AcquiredLocks`: ``with acquire_all(a, b):`` releases them at the end of the block (``as`` gives
    them in the order given); a plain call holds them until :meth:`AcquiredLocks.release`.

    They are acquired sorted by name (the one canonical order) and released in the reverse order. When an
    acquire fails part way (a timeout, a deadlock, Ctrl-C), the locks already taken are released and the
    error is raised. ``timeout`` (seconds, None: for ever) bounds the whole: each acquire waits what is left
    of it; without it, each lock waits its own timeout. Raises :class:`~.errors.MutexUsageError` for locks
    of different reservations or servers, or two locks of one name (the second would wait for the first).
    """
    if not locks:
        raise MutexUsageError("acquire_all() needs at least one lock")
    check_duration("timeout", None if timeout is UNSET else timeout, allow_none=True)
    places = {(catalog.server_key(lock.api), lock.reservation_id) for lock in locks}
    if len(places) > 1:
        raise MutexUsageError("acquire_all() takes locks of one reservation on one server")
    names = [check_lock_name(lock.name) for lock in locks]  # the one rule, whatever object holds the name
    twice = sorted({name for name in names if [n.casefold() for n in names].count(name.casefold()) > 1})
    if twice:
        raise MutexUsageError(
            f"acquire_all() got two locks named {twice[0]!r}: the second would wait for the first; "
            "pass each lock once"
        )
    ordered = sorted(locks, key=lambda lock: str(lock.name))
    deadline = None if timeout is UNSET else Wait.after(timeout)  # one deadline for the whole
    taken: List[Any] = []
    try:
        for lock in ordered:
            if deadline is None:
                lock.acquire()
            else:
                lock.acquire(timeout=deadline.left())
            taken.append(lock)
    except BaseException:
        _release_all(taken, raising=False)
        raise
    return AcquiredLocks(tuple(locks), taken)


class AcquiredLocks:
    """The locks :func:`acquire_all` holds. As a context manager it gives them (in the order passed) and
    releases them when the block ends; :meth:`release` does the same after a plain call."""

    def __init__(self, locks: Tuple[Any, ...], taken: List[Any]) -> None:
        self.locks = locks
        self._taken = taken

    def release(self) -> None:
        """Release every lock, in the reverse of the order taken, each even when one fails (the first failure
        is raised). A second call does nothing."""
        taken, self._taken = self._taken, []
        _release_all(taken, raising=True)

    def __enter__(self) -> Tuple[Any, ...]:
        return self.locks

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._taken else "released"
        return f"<AcquiredLocks {[str(lock.name) for lock in self.locks]} {state}>"


def _release_all(taken: List[Any], raising: bool) -> None:
    """Release ``taken`` in reverse order, every one even when one fails; the first failure is raised
    (``raising``) or logged (while another error is on its way)."""
    first: Optional[BaseException] = None
    for lock in reversed(taken):
        try:
            lock.release()
        except Exception as error:
            if first is None:
                first = error
            _LOGGER.warning("cloudshell-mutex: acquire_all could not release %s: %s", lock.name, error)
    if first is not None and raising:
        raise first
