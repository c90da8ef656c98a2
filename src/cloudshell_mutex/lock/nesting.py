"""Nested use of one lock within one command or script step: served by the lock the command already holds.

A driver command decorated with ``@with_reservation_mutex`` that calls a helper which takes the same lock
(``with self.reservation_mutex(context): ...``) would otherwise wait for itself: the helper's lock object is a
new acquisition, its add finds the command's own ``MUTEX`` (or, in cohort mode, its own local lock), and it
waits out its whole timeout. The locks that the driver mixin and the orchestration helpers make
(:class:`CommandMutex`, :class:`CommandCohortMutex`) remember, in a context variable, which locks the running
command holds: (server, reservation, alias). A nested acquire of one of them in the same thread is served by
the held acquisition (counted, no add) once one fresh read shows that acquisition still holds the lock
(``ensure_held(read=True)``: a second read a moment later when the first does not show it). When the hold
turns out lost, the nested acquire raises :class:`~.errors.MutexLostError`, and the hold is known lost: its
release removes nothing and raises too.

What is refused at once with :class:`~.errors.MutexUsageError`, because waiting there would wait for the
command itself:

* a nested acquire in another thread that shares the command's context (a worker started with
  ``contextvars.copy_context()``);
* a mixin lock made with the command's own context object (CloudShell hands each command a context object of
  its own; a helper thread of the command is passed that same object) while that command holds the lock in
  another thread, whatever that thread's context (a ``threading.Thread`` or a ``ThreadPoolExecutor`` worker).
  A process-wide record of the mixin locks held, each with its context object, tells; it holds the locks
  weakly, so a lock object that is gone holds nothing;
* a nested acquire from an asyncio task while another task of the command is inside through the same hold,
  or holds the lock itself: two tasks inside at once would not exclude each other.

"One command" is one context: CloudShell runs each command in a thread of its own, with a context object of
its own, so two commands of one driver running at the same time still exclude each other, as do the parallel
steps of an orchestration stage (which share one ``Sandbox`` object, so only the context-variable rule applies
to scripts: a script's helper thread must run in ``contextvars.copy_context()`` to be refused rather than
wait). The plain :class:`~.mutex.ReservationMutex` knows nothing of this: two objects in one thread are two
parties there, as they always were.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import diagnosis
from .cohort.cohort import CohortMutex
from .errors import MutexLostError
from .mutex.mutex import ReservationMutex
from .options import UNSET
from .server import catalog

__all__ = ["CommandCohortMutex", "CommandMutex", "held_in_command"]

_Key = Tuple[str, str, str]


@dataclass
class _Held:
    """A lock the running command holds: its key, the object that holds it, the thread and the asyncio task
    (None: plain code) that took it, how many nested acquires it is serving now, and the one other task of the
    same loop being served now (with its depth)."""

    key: _Key
    lock: Any
    thread: int
    task: Any = None
    nested: int = 0
    task_served: Any = None
    task_depth: int = 0

    def admits(self, task: Any) -> bool:
        """May ``task`` (None: plain code) be served now? The holder's own flow may; another task only while
        the holder is plain code and no other task is inside through this hold."""
        if task is None or task is self.task:
            return True
        return self.task is None and self.task_served in (None, task)


#: The locks held in this context, innermost last. A tuple, replaced on every change, so that a context copied
#: from this one (a thread started with it) is not changed by what this one does later.
_HELD: contextvars.ContextVar[Tuple[_Held, ...]] = contextvars.ContextVar("cloudshell_mutex_held", default=())


class _ContextHolds:
    """The mixin locks held in this process, by (server, reservation, alias): whose command context object
    holds each. Thread-safe; it holds the locks weakly (a lock object that is gone holds nothing)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[_Key, Any] = weakref.WeakValueDictionary()

    def hold(self, key: _Key, lock: Any) -> None:
        """``lock`` holds ``key`` now."""
        with self._guard:
            self._locks[key] = lock

    def let_go(self, key: _Key, lock: Any) -> None:
        """``lock`` holds ``key`` no more (a lock that took over from it meanwhile stays recorded)."""
        with self._guard:
            if self._locks.get(key) is lock:
                del self._locks[key]

    def holder(self, key: _Key) -> Optional[Any]:
        """The mixin lock that holds ``key`` in this process, or None."""
        with self._guard:
            return self._locks.get(key)


_COMMAND_HOLDS = _ContextHolds()


def held_in_command(api: Any, reservation_id: str, alias: str) -> Optional[Any]:
    """The lock object through which the running command holds ``alias`` in ``reservation_id`` on ``api``'s
    server, or None."""
    entry = _find((catalog.server_key(api), reservation_id, alias))
    return None if entry is None else entry.lock


def _find(key: _Key) -> Optional[_Held]:
    for entry in reversed(_HELD.get()):
        if entry.key == key and entry.lock.locked():  # an entry whose lock was let go elsewhere is stale
            return entry
    return None


def _running_task() -> Any:
    """The asyncio task running in this thread, or None (no loop runs here, or plain code). asyncio is asked
    only when something imported it: the plain path costs nothing."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        return None


class _CommandScoped:
    """What :class:`CommandMutex` and :class:`CommandCohortMutex` add to their lock class: a nested acquire
    within one command is served by the acquisition the command holds (see the module's docstring).
    ``command_context``: the driver command's context object (the mixin's locks), or None (scripts)."""

    _serving: Optional[_Held] = None
    _served_task: Any = None
    _holding_thread: Optional[int] = None

    def __init__(self, *args: Any, command_context: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command_context = command_context

    @property
    def command_context(self) -> Any:
        """The driver command's context object this lock was made with (None: not a driver command's)."""
        return self._command_context

    @property
    def holding_thread(self) -> Optional[int]:
        """The thread (its ident) that took the lock this object holds last (None: it never held it)."""
        return self._holding_thread

    def _command_key(self) -> _Key:
        return catalog.server_key(self.api), self.reservation_id, self.name

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """As the lock class's ``acquire``; when this command already holds the lock through another object,
        it is served by that acquisition (True, no add) once one read shows it alive, or refused at once
        (see the module's docstring)."""
        key = self._command_key()
        if self._serving is None and not super().locked():
            entry = _find(key)
            if entry is not None and entry.lock is not self:
                # The read that shows the hold alive waits out a failing server as the acquire would.
                waits = (self.timeout if timeout is UNSET else timeout) if blocking else 0.0
                self._serve(entry, waits)
                return True
            self._refuse_a_helper_of_the_holder(key)
        # The lock classes tell "no timeout given" by a sentinel of their own: pass only what was given.
        acquired = super().acquire(*((blocking,) if timeout is UNSET else (blocking, timeout)))
        if acquired:
            self._holding_thread = threading.get_ident()
            if _find(key) is None:
                _HELD.set((*_HELD.get(), _Held(key, self, self._holding_thread, _running_task())))
            if self._command_context is not None:
                _COMMAND_HOLDS.hold(key, self)
        return acquired

    def _serve(self, entry: _Held, timeout: Optional[float]) -> None:
        """Be served by ``entry``'s acquisition, or raise: from another thread or another task (usage), or
        when one read shows the hold lost (:class:`~.errors.MutexLostError`, and the hold is known lost); a
        read that fails transiently is tried again for up to ``timeout`` seconds."""
        if entry.thread != threading.get_ident():
            raise diagnosis.other_thread_error(self.reservation_id, self.name)
        task = _running_task()
        if not entry.admits(task):
            raise diagnosis.other_task_error(self.reservation_id, self.name)
        try:
            entry.lock.ensure_held(read=True, timeout=timeout)
        except MutexLostError as lost:
            raise diagnosis.nested_lost_error(lost, self.reservation_id, self.name) from lost
        entry.nested += 1
        if task is not None and task is not entry.task:
            entry.task_served, entry.task_depth = task, entry.task_depth + 1
            self._served_task = task
        self._serving = entry

    def _refuse_a_helper_of_the_holder(self, key: _Key) -> None:
        """A mixin lock made with the context object of the command that holds the lock, taken where that
        command's context variables do not reach (a helper thread, or an asyncio task started before the
        lock was taken): it would wait for its own command."""
        context = self._command_context
        if context is None:
            return
        holder = _COMMAND_HOLDS.holder(key)
        if holder is None or holder is self or holder.command_context is not context or not holder.locked():
            return
        if holder.holding_thread == threading.get_ident():
            raise diagnosis.other_task_error(self.reservation_id, self.name)
        raise diagnosis.other_thread_error(self.reservation_id, self.name)

    def release(self) -> None:
        """As the lock class's ``release``; a nested acquire served by the command's lock only ends."""
        serving = self._serving
        if serving is not None:
            serving.nested -= 1
            if self._served_task is not None and serving.task_served is self._served_task:
                serving.task_depth -= 1
                if serving.task_depth == 0:
                    serving.task_served = None
            self._serving = self._served_task = None
            return
        try:
            super().release()
        finally:
            if not super().locked():  # released, or lost (a failed release still holds: it stays recorded)
                _HELD.set(tuple(e for e in _HELD.get() if e.lock is not self))
                _COMMAND_HOLDS.let_go(self._command_key(), self)

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

    def ensure_held(self, read: bool = False, timeout: Optional[float] = 0.0) -> None:
        """As the lock class's, for the acquisition this object holds or is served by."""
        if self._serving is not None:
            return self._serving.lock.ensure_held(read, timeout)
        return super().ensure_held(read, timeout)

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
