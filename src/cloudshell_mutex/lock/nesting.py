"""Nested use of one lock within one command or script step: served by the lock the command already holds.

A driver command decorated with ``@with_reservation_mutex`` that calls a helper which takes the same lock
(``with self.reservation_mutex(context): ...``) would otherwise wait for itself: the helper's lock object is a
new acquisition, its add finds the command's own ``MUTEX`` (or, in cohort mode, its own local lock), and it
waits out its whole timeout. The locks that the driver mixin and the orchestration helpers make
(:class:`CommandMutex`, :class:`CommandCohortMutex`) remember, in a context variable, which locks the running
command holds: (server, reservation, alias). A nested acquire of one of them in the same thread is served by
the held acquisition (counted, no add) once one fresh read shows that acquisition still holds the lock
(``ensure_held(read=True)``: a second read a moment later when the first does not show it); when the hold
turns out lost, the nested acquire raises :class:`~.errors.MutexLostError`, and the hold is known lost: its
release removes nothing and raises too. In another thread that shares the command's context (a
worker the command started with its context) it is refused at once, because waiting there could wait for the
command itself.

"One command" is one context: CloudShell runs each command in a thread of its own, and threads start with a
context of their own, so two commands of one driver running at the same time still exclude each other, as do
the parallel steps of an orchestration stage. The plain :class:`~.mutex.ReservationMutex` knows nothing of
this: two objects in one thread are two parties there, as they always were.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import catalog, diagnosis
from .cohort import CohortMutex
from .errors import MutexLostError
from .mutex import ReservationMutex
from .options import UNSET

__all__ = ["CommandCohortMutex", "CommandMutex", "held_in_command"]


@dataclass
class _Held:
    """A lock the running command holds: its key, the object that holds it, the thread, and how many nested
    acquires it is serving now."""

    key: Tuple[str, str, str]
    lock: Any
    thread: int
    nested: int = 0


#: The locks held in this context, innermost last. A tuple, replaced on every change, so that a context copied
#: from this one (a thread started with it) is not changed by what this one does later.
_HELD: contextvars.ContextVar[Tuple[_Held, ...]] = contextvars.ContextVar("cloudshell_mutex_held", default=())


def held_in_command(api: Any, reservation_id: str, alias: str) -> Optional[Any]:
    """The lock object through which the running command holds ``alias`` in ``reservation_id`` on ``api``'s
    server, or None."""
    entry = _find((catalog.server_key(api), reservation_id, alias))
    return None if entry is None else entry.lock


def _find(key: Tuple[str, str, str]) -> Optional[_Held]:
    for entry in reversed(_HELD.get()):
        if entry.key == key and entry.lock.locked():  # an entry whose lock was let go elsewhere is stale
            return entry
    return None


class _CommandScoped:
    """What :class:`CommandMutex` and :class:`CommandCohortMutex` add to their lock class: a nested acquire
    within one command is served by the acquisition the command holds (see the module's docstring)."""

    _serving: Optional[_Held] = None

    def _command_key(self) -> Tuple[str, str, str]:
        return catalog.server_key(self.api), self.reservation_id, self.name

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """As the lock class's ``acquire``; when this command already holds the lock through another object,
        it is served by that acquisition (True, no add) once one read shows it alive, or refused at once from
        another thread."""
        if self._serving is None and not super().locked():
            entry = _find(self._command_key())
            if entry is not None and entry.lock is not self:
                if entry.thread != threading.get_ident():
                    raise diagnosis.other_thread_error(self.reservation_id, self.name)
                try:  # served only by a hold one fresh read shows alive
                    entry.lock.ensure_held(read=True)
                except MutexLostError as lost:
                    raise diagnosis.nested_lost_error(lost, self.reservation_id, self.name) from lost
                entry.nested += 1
                self._serving = entry
                return True
        # The lock classes tell "no timeout given" by a sentinel of their own: pass only what was given.
        acquired = super().acquire(*((blocking,) if timeout is UNSET else (blocking, timeout)))
        if acquired and _find(self._command_key()) is None:
            _HELD.set((*_HELD.get(), _Held(self._command_key(), self, threading.get_ident())))
        return acquired

    def release(self) -> None:
        """As the lock class's ``release``; a nested acquire served by the command's lock only ends."""
        serving = self._serving
        if serving is not None:
            serving.nested -= 1
            self._serving = None
            return
        try:
            super().release()
        finally:
            if not super().locked():  # released, or lost (a failed release still holds: it stays recorded)
                _HELD.set(tuple(e for e in _HELD.get() if e.lock is not self))

    # While nested, this object stands for the command's acquisition.

    def locked(self) -> bool:
        """True while this object holds the lock, or is served by the command's acquisition."""
        return self._serving is not None or super().locked()

    @property
    def token(self) -> Optional[str]:
        """The owner token of the acquisition this object holds or is served by."""
        if self._serving is not None:
            return self._serving.lock.token
        return super().token

    @property
    def leased(self) -> bool:
        """True while the acquisition this object holds or is served by has a lease."""
        if self._serving is not None:
            return bool(self._serving.lock.leased)
        return bool(super().leased)

    @property
    def generation(self) -> int:
        """As the lock class's, for the acquisition this object holds or is served by."""
        if self._serving is not None:
            return int(self._serving.lock.generation)
        return int(super().generation)

    def ensure_held(self, read: bool = False) -> None:
        """As the lock class's, for the acquisition this object holds or is served by."""
        if self._serving is not None:
            return self._serving.lock.ensure_held(read)
        return super().ensure_held(read)

    def renew(self) -> bool:
        """As the lock class's, for the acquisition this object holds or is served by."""
        if self._serving is not None:
            return bool(self._serving.lock.renew())
        return bool(super().renew())

    def export(self) -> str:
        """As the lock class's; refused while nested (the handle would be the command's acquisition's)."""
        if self._serving is not None:
            raise diagnosis.served_export_error(self.reservation_id, self.name)
        return str(super().export())


class CommandMutex(_CommandScoped, ReservationMutex):
    """A :class:`~.mutex.ReservationMutex` that a nested use within the same command is served by (see the
    module's docstring). The driver mixin (``cohort=False``) and the orchestration helpers make these."""


class CommandCohortMutex(_CommandScoped, CohortMutex):
    """A :class:`~.cohort.CohortMutex` that a nested use within the same command is served by (see the
    module's docstring). The driver mixin makes these by default."""
