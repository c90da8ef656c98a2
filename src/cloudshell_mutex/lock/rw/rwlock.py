"""ReservationRWLock: many readers, or one writer, on one reservation; writers are preferred.

Built only from atomic adds of aliases, each one a :class:`~.mutex.ReservationMutex` (so every add gets
its owner token, lease, heartbeat, unknown-outcome and late-add handling), and fresh reads
(docs/protocol.md, "Shared and exclusive locks", has the argument step by step):

* ``MUTEX`` is held by the writer, or by the **read group**: a service whose owner token is marked
  ``read-group#...``. Code that knows only ``MUTEX`` (a plain ReservationMutex, the original snippet) is
  therefore excluded by readers and writers alike.
* ``MUTEX~r1..MUTEX~rK`` are reader slots: a reader holds one for as long as it reads. The first reader
  (holding its slot) adds ``MUTEX`` for the group; later ones **join** when one fresh read shows their own
  slot (so the read is not older than their slot's add), the group's ``MUTEX`` and no closer at work. Each
  member heartbeats the group's ``MUTEX`` (the lease is shared, as with ``adopt``).
* A leaving reader releases its slot, then tries to **close** the group: it takes ``MUTEX~c`` (one closer
  at a time), and when one fresh read shows its ``MUTEX~c`` and no reader slot, removes the group's
  ``MUTEX``. A reader that gave its slot back after seeing a group runs the same close.
* A writer first tries ``MUTEX`` once; if busy it takes ``MUTEX~w`` (writer waiting: readers neither open
  nor join a group while it is there), waits for ``MUTEX``, and gives ``MUTEX~w`` back once it holds it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .. import diagnosis, protocol
from ..engine import LockFace, Runtime
from ..errors import MutexError, MutexTimeout
from ..mutex import handover
from ..options import UNSET, MutexOptions, default_logger
from ..server.late_adds import with_late_adds
from .core import RWCore
from .readlock import ReadLock

__all__ = ["DEFAULT_MAX_READERS", "ReadLock", "ReservationRWLock", "WriteLock"]

#: The default number of reader slots: the most readers that read at the same time.
DEFAULT_MAX_READERS = 8
MAX_READERS_LIMIT = 64


class ReservationRWLock:
    """A shared (read) / exclusive (write) lock on one CloudShell reservation.

    ``rw.read()`` and ``rw.write()`` return the two sides, each a context manager with ``acquire()``/
    ``release()`` like :class:`~.mutex.ReservationMutex`. Many readers hold the read side together; a writer
    holds ``name`` (default ``MUTEX``) alone, so plain mutexes and the original snippet exclude, and are
    excluded by, both sides. ``max_readers`` reader slots bound how many read at once. Other keyword
    arguments are :class:`~.options.MutexOptions` (``timeout``, ``lease``, ``pacing``, ...), used by every
    alias the lock adds. One object is one handle: one thread, and one side held at a time.
    """

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        owner: Optional[str] = "cloudshell-mutex",
        name: str = protocol.DEFAULT_ALIAS,
        timeout: Optional[float] = UNSET,
        logger: Optional[logging.Logger] = None,
        *,
        max_readers: int = DEFAULT_MAX_READERS,
        options: Optional[MutexOptions] = None,
        runtime: Optional[Runtime] = None,
        **tuning: Any,
    ) -> None:
        if isinstance(max_readers, bool) or not isinstance(max_readers, int):
            raise TypeError(f"max_readers must be a whole number of reader slots, got {max_readers!r}")
        if not 1 <= max_readers <= MAX_READERS_LIMIT:
            raise ValueError(f"max_readers must be from 1 to {MAX_READERS_LIMIT}, got {max_readers}")
        if options is not None and not isinstance(options, MutexOptions):
            raise TypeError(f"options must be a MutexOptions, got {type(options).__name__}")
        protocol.check_lock_name(name)
        if timeout is not UNSET:
            tuning["timeout"] = timeout
        base = options if options is not None else MutexOptions()
        self.options = base.replace(**tuning) if tuning else base
        self.logger = default_logger(logger)
        self.owner = "cloudshell-mutex" if owner is None else str(owner)
        self.max_readers = max_readers
        # The mutexes of every alias share the clock, sleep and random source; each has its own late-add
        # watcher unless the runtime names one. The lock's own watches the adds of its breaks.
        mutex_runtime = runtime if runtime is not None else Runtime()
        own = with_late_adds(mutex_runtime, self.logger)
        self._core = RWCore(
            api, reservation_id, name, self.owner, self.options, self.logger, own, mutex_runtime
        )
        self._reader = ReadLock(self._core, max_readers, writing=lambda: self._writer.locked())
        self._writer = WriteLock(self._core, reading=self._reader.locked)

    @property
    def api(self) -> Any:
        """The API session the lock makes its calls with."""
        return self._core.lock_alias.api

    @property
    def reservation_id(self) -> str:
        """The reservation this lock is in."""
        return self._core.reservation_id

    @property
    def name(self) -> str:
        """The lock's alias (``MUTEX`` unless given): the writer's, and the read group's."""
        return self._core.name

    @property
    def calls(self) -> int:
        """API calls made by this object in total (both sides, every alias)."""
        return self._core.lock_alias.calls + self._reader.calls + self._writer.calls

    def read(self) -> ReadLock:
        """The shared side: ``with rw.read(): ...`` reads alongside other readers, never with a writer."""
        return self._reader

    def write(self) -> WriteLock:
        """The exclusive side: ``with rw.write(): ...`` excludes readers, writers and plain mutexes."""
        return self._writer

    def __repr__(self) -> str:
        state = "reading" if self._reader.locked() else "writing" if self._writer.locked() else "not held"
        return f"<ReservationRWLock {self.name!r} reservation={self.reservation_id} {state}>"


class WriteLock(LockFace):
    """The exclusive side of a :class:`ReservationRWLock`: holds ``MUTEX`` alone.

    Uncontended it costs what a plain mutex costs (one add; read + remove at release). When ``MUTEX`` is
    busy it holds ``MUTEX~w`` while it waits, so that no new read group opens and the current one drains.
    """

    def __init__(self, rw: RWCore, reading: Callable[[], bool]) -> None:
        self._rw = rw
        self._lock_alias = rw.lock_alias
        self._reading = reading  # does the read side of the same lock object read?
        self._mutex = rw.mutex(rw.name, "writer")
        # Held while the writer waits, however long: never stopped by max_hold (that bounds holding MUTEX).
        self._waiting = rw.mutex(protocol.writer_waiting_alias(rw.name), max_hold=None)

    @property
    def calls(self) -> int:
        """API calls made by this side."""
        return self._mutex.calls + self._waiting.calls

    @property
    def token(self) -> Optional[str]:
        """The owner token of the write hold, or None."""
        return self._mutex.token

    def locked(self) -> bool:
        """True while *this side* holds the lock (no call), as :meth:`ReservationMutex.locked`."""
        return self._mutex.locked()

    def ensure_held(self, read: bool = False) -> None:
        """As :meth:`ReservationMutex.ensure_held`: raise :class:`MutexLostError` unless still held."""
        self._mutex.ensure_held(read)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Take the lock alone. Blocking, returns True or raises :class:`MutexTimeout`; with
        ``blocking=False`` one attempt, False when busy."""
        deadline = self._rw.wait(blocking, timeout)
        if self._reading():
            raise diagnosis.rw_side_error("reading", self._rw.reservation_id, self._rw.name)
        try:
            if self._mutex.acquire(blocking=False):
                return True
        except MutexTimeout:
            if not blocking:
                raise
            # The server failed the one try (an add of it that may still land is the late-add watcher's):
            # wait on, as a blocking mutex waits through transient failures.
        if not blocking:
            return False
        self._waiting.acquire(timeout=deadline.left())
        try:
            return self._mutex.acquire(timeout=deadline.left())
        finally:
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        try:
            self._waiting.release()
        except MutexError as error:
            # Never raise here with MUTEX held. A marker left behind stops heartbeating: readers ignore it
            # once they judge it stale, and the next writer breaks it.
            self._rw.logger.warning(
                "cloudshell-mutex: could not remove %s (%s); it is left to its lease",
                self._waiting.name,
                error,
            )
            handover.detach(self._waiting)

    def release(self) -> None:
        """Release the write hold (as :meth:`ReservationMutex.release`)."""
        self._mutex.release()
