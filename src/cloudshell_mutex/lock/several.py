"""Several named locks of one reservation, taken in one order: code that needs them never deadlocks.

Two parties that take locks ``A`` and ``B`` in opposite orders can wait for each other for ever (a fair-mode
waiter sees the cycle and one gives up with :class:`~.errors.MutexDeadlock`, see :mod:`.waitfor`). Parties
that all take them through :func:`acquire_all` take them sorted by name, so no cycle can form.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple

from . import catalog
from .engine import Deadline
from .errors import MutexUsageError
from .options import LOGGER_NAME, UNSET, check_duration
from .protocol import check_lock_name

__all__ = ["acquire_all"]

_LOGGER = logging.getLogger(LOGGER_NAME)


@contextmanager
def acquire_all(*locks: Any, timeout: Optional[float] = UNSET) -> Iterator[Tuple[Any, ...]]:
    """Hold every lock of ``locks`` (lock objects of one reservation, e.g.
    :class:`~.mutex.ReservationMutex` with distinct ``name``) for the ``with`` block; yields them in the
    order given.

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
    deadline = None if timeout is UNSET else Deadline.after(timeout)  # one deadline for the whole
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
    try:
        yield tuple(locks)
    finally:
        _release_all(taken, raising=True)


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
