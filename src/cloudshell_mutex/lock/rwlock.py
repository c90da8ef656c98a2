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

import contextlib
import logging
import random
import time
from typing import Any, Callable, Dict, List, Optional

from . import diagnosis, lease, protocol
from .alias import LockAlias, Status
from .engine import Deadline, Runtime, acquire_loop
from .errors import MutexError, MutexLostError, MutexReleaseError, MutexTimeout, MutexUsageError
from .holder import Holder, is_read_group
from .late_adds import LateAdds, late_adds_for
from .lease import StaleWatch
from .mutex import ReservationMutex
from .options import FRESH_READ_LAG, UNSET, MutexOptions, check_duration, default_logger
from .pacing import CancelledWait, DefaultPacing, PacingPolicy, cancellation_check, pause

__all__ = ["DEFAULT_MAX_READERS", "ReadLock", "ReservationRWLock", "WriteLock"]

#: The default number of reader slots: the most readers that read at the same time.
DEFAULT_MAX_READERS = 8
MAX_READERS_LIMIT = 64
#: Rounds of "take a slot, read, decide" in one attempt to enter before waiting again.
ENTER_ROUNDS = 4
#: Seconds between two looks at a closer's work (it holds ``MUTEX~c`` for a few calls only), and the pacing
#: of a closer waiting for ``MUTEX~c``.
CLOSER_POLL = 0.05
CLOSER_PACING = DefaultPacing(first=0.02, base=0.05, cap=0.25)
#: Reads a closer makes under ``MUTEX~c`` before it gives up (each after a stale slot broken or a lag).
CLOSE_ROUNDS = 6
#: Seconds a release waits for another closer's ``MUTEX~c`` before it leaves the group to that closer (a live
#: one holds it for a few calls; one that holds it longer saw no reader and is removing the group) or, when
#: that closer crashed, to the next reader or a writer's lease break. A release has no caller's deadline.
RELEASE_CLOSE_WAIT = 5.0

#: "The last read did not tell who holds MUTEX" (None means: nobody).
_UNKNOWN: Any = object()


class _GroupAdds:
    """What a read group does with an add of ``MUTEX`` that may land after its opener gave it up: nothing
    blind. A plain mutex's watcher removes such an add when it lands, but a group's ``MUTEX`` may have been
    joined meanwhile, and only a closer (who sees no reader slot) may remove it. A group that lands with no
    reader is an open group like any other: the next reader joins and closes it, and a waiting writer breaks
    it once it has seen no heartbeat for its lease + margin."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def watch(
        self,
        alias: LockAlias,
        token: str,
        lands_by: float,
        lifetime: float,
        copies: int = 1,
        removing_until: Optional[float] = None,
    ) -> None:
        """Log the add that may still land; it is left to the readers' protocol and the lease. (The
        signature is :meth:`~.late_adds.LateAdds.watch`'s: every watcher is handed the same.)"""
        self.logger.info(
            "cloudshell-mutex: a read group's add of %s (%s) may still land; if it does, readers close it "
            "and a waiting writer breaks it after its lease",
            alias.alias,
            token,
        )


class _PartMutex(ReservationMutex):
    """A ReservationMutex on an alias this lock derives from its name: a reader slot, the closer, the writer
    waiting (names no public lock may have)."""

    _derived_name = True


class _GroupMutex(ReservationMutex):
    """The read group's hold on ``MUTEX``: a ReservationMutex whose tokens carry
    :data:`~.protocol.READ_GROUP_MARK`, and whose adds that may land late are never removed blindly
    (:class:`_GroupAdds`)."""

    _token_mark = protocol.READ_GROUP_MARK
    # After an interrupt inside acquire(): never remove the add, even when a read shows it (a plain mutex
    # does): a reader may have joined the group in that instant. The opener's slot is given back and the
    # group closed through MUTEX~c, which removes it only without readers.
    _removes_abandoned_add = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["late_adds"] = _GroupAdds(default_logger(kwargs.get("logger")))
        super().__init__(*args, **kwargs)


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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Optional[random.Random] = None,
        late_adds: Optional[LateAdds] = None,
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
        # Watches the breaker adds of this lock's breaks (each alias's mutex has its own for its adds).
        runtime = Runtime(
            clock,
            sleep,
            rng if rng is not None else random.Random(),
            late_adds if late_adds is not None else late_adds_for(clock, self.logger),
        )
        self._parts = RWParts(api, reservation_id, name, self.owner, self.options, self.logger, runtime)
        self._parts.mutex_args["late_adds"] = late_adds
        self._reader = ReadLock(self._parts, max_readers, writing=lambda: self._writer.locked())
        self._writer = WriteLock(self._parts, reading=self._reader.locked)

    @property
    def api(self) -> Any:
        """The API session the lock makes its calls with."""
        return self._parts.lock_alias.api

    @property
    def reservation_id(self) -> str:
        """The reservation this lock is in."""
        return self._parts.reservation_id

    @property
    def name(self) -> str:
        """The lock's alias (``MUTEX`` unless given): the writer's, and the read group's."""
        return self._parts.name

    @property
    def calls(self) -> int:
        """API calls made by this object in total (both sides, every alias)."""
        return self._parts.lock_alias.calls + self._reader.calls + self._writer.calls

    def read(self) -> ReadLock:
        """The shared side: ``with rw.read(): ...`` reads alongside other readers, never with a writer."""
        return self._reader

    def write(self) -> WriteLock:
        """The exclusive side: ``with rw.write(): ...`` excludes readers, writers and plain mutexes."""
        return self._writer

    def __repr__(self) -> str:
        state = "reading" if self._reader.locked() else "writing" if self._writer.locked() else "not held"
        return f"<ReservationRWLock {self.name!r} reservation={self.reservation_id} {state}>"


class RWParts:
    """What both sides of one :class:`ReservationRWLock` share: its options, the runtime, the snapshot
    reader on ``MUTEX``, and how to make the mutexes on its aliases."""

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        name: str,
        owner: str,
        options: MutexOptions,
        logger: logging.Logger,
        runtime: Runtime,
    ) -> None:
        self.owner = owner
        self.options = options
        self.logger = logger
        self.runtime = runtime
        self.pacing: PacingPolicy = options.pacing or DefaultPacing()
        #: The caller's cancellation (None: none), asked while a reader waits.
        self.cancelled = cancellation_check(options.cancellation)
        #: The snapshot reader: checks the reservation id and the name (no call is made here).
        self.lock_alias = self.alias(name, api, reservation_id)
        #: What every mutex of this lock is made with (its options replaced per alias).
        self.mutex_args: Dict[str, Any] = {
            "options": options,
            "logger": logger,
            "clock": runtime.clock,
            "sleep": runtime.sleep,
            "rng": runtime.rng,
        }

    @property
    def name(self) -> str:
        """The lock's alias: the writer's, and the read group's."""
        return self.lock_alias.alias

    @property
    def reservation_id(self) -> str:
        """The reservation the lock is in."""
        return self.lock_alias.reservation_id

    def alias(self, alias: str, api: Any = None, reservation_id: Optional[str] = None) -> LockAlias:
        """The calls on ``alias`` of this lock's reservation."""
        return LockAlias(
            api if api is not None else self.lock_alias.api,
            reservation_id if reservation_id is not None else self.reservation_id,
            alias,
            self.options.model,
            budget=self.options.budget,
            logger=self.logger,
            clock=self.runtime.clock,
            sleep=self.runtime.sleep,
        )

    def mutex(self, alias: str, kind: type = _PartMutex, **changes: Any) -> ReservationMutex:
        """A mutex on ``alias`` with this lock's options (``changes`` replaced)."""
        args = self.mutex_args
        if changes:
            args = {**args, "options": self.options.replace(**changes)}
        return kind(self.lock_alias.api, self.reservation_id, owner=self.owner, name=alias, **args)

    def deadline(self, blocking: bool, timeout: Any) -> Deadline:
        """The deadline of one acquire of either side."""
        if timeout is UNSET:
            timeout = self.options.timeout
        elif not blocking:
            raise ValueError("a non-blocking acquire cannot have a timeout; leave timeout out")
        check_duration("timeout", timeout, allow_none=True)
        clock = self.runtime.clock
        return Deadline.now(clock) if not blocking else Deadline.after(timeout, clock)

    def fatal(self, failure: Any, doing: str) -> MutexError:
        """The error for a fatal failure of a snapshot read."""
        state = self.lock_alias.reservation_state() if diagnosis.needs_state(failure) else None
        return diagnosis.fatal_error(
            failure, doing, self.reservation_id, self.name, self.options.model, None, state
        )


class WriteLock:
    """The exclusive side of a :class:`ReservationRWLock`: holds ``MUTEX`` alone.

    Uncontended it costs what a plain mutex costs (one add; read + remove at release). When ``MUTEX`` is
    busy it holds ``MUTEX~w`` while it waits, so that no new read group opens and the current one drains.
    """

    def __init__(self, rw: RWParts, reading: Callable[[], bool]) -> None:
        self._rw = rw
        self._reading = reading  # does the read side of the same lock object read?
        self._mutex = rw.mutex(rw.name, ReservationMutex)
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

    def owned(self) -> bool:
        """The same as :meth:`locked` (redis-py's name)."""
        return self.locked()

    def ensure_held(self, read: bool = False) -> None:
        """As :meth:`ReservationMutex.ensure_held`: raise :class:`MutexLostError` unless still held."""
        self._mutex.ensure_held(read)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Take the lock alone. Blocking, returns True or raises :class:`MutexTimeout`; with
        ``blocking=False`` one attempt, False when busy."""
        deadline = self._rw.deadline(blocking, timeout)
        if self._reading():
            raise MutexUsageError(
                f"this ReservationRWLock holds {self._rw.name!r} for reading: release the read side before "
                "writing (a writer waits for every reader, itself included)",
                reservation_id=self._rw.reservation_id,
                alias=self._rw.name,
            )
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
            self._waiting.detach()

    def release(self) -> None:
        """Release the write hold (as :meth:`ReservationMutex.release`)."""
        self._mutex.release()

    def __enter__(self) -> WriteLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.release()


class ReadLock:
    """The shared side of a :class:`ReservationRWLock`: one reader slot, and a share of the read group.

    See the module docstring and docs/protocol.md for the protocol; :attr:`calls` counts its API calls.
    """

    def __init__(self, rw: RWParts, max_readers: int, writing: Callable[[], bool]) -> None:
        self._rw = rw
        self._writing = writing  # does the write side of the same lock object hold the lock?
        self.max_readers = max_readers
        name = rw.name
        self._slot_names = [protocol.reader_slot_alias(name, index + 1) for index in range(max_readers)]
        self._slots = [rw.mutex(alias) for alias in self._slot_names]
        # Closers hold MUTEX~c for a few calls and never wait inside: poll it quickly. A close is part of a
        # release (or of taking back a reader's slot): the caller's cancellation never interrupts it.
        self._closer = rw.mutex(
            protocol.closer_alias(name), pacing=CLOSER_PACING, cancellation=None, max_hold=None
        )
        # For breaking a crashed reader's slot (any reader's: others may have more slots than this one) or a
        # crashed writer: the alias, made when first needed, judged on this reader's clock from every
        # snapshot it reads (lease.StaleWatch) and broken as a waiting mutex breaks its holder.
        self._slot_aliases: Dict[str, LockAlias] = {}
        self._watches: Dict[str, StaleWatch] = {}
        lifetime = rw.options.request_lifetime
        self._breaker = lease.Breaker(
            rw.alias, rw.owner, lease.breaker_lease(rw.options.lease), lifetime, rw.runtime
        )
        self._slot: Optional[ReservationMutex] = None
        self._group: Optional[ReservationMutex] = None
        self._extra_calls = 0  # calls of group objects that are gone (joined, then released)
        self._deadline = Deadline(None)
        #: Why the current acquire() waits (None: nothing seen in its way), and since when.
        self.blocker: Optional[str] = None
        self.blocker_since = 0.0
        self._saw_group = False
        # A close whose remove of the group's MUTEX kept failing: that remove may still land, so this
        # reader keeps the group object (it remembers the remove) and MUTEX~c (its heartbeat keeps joiners
        # out) until release() or acquire() finishes the close.
        self._pending_close: Optional[ReservationMutex] = None
        #: What the current acquire() last waited for besides the snapshot's blocker (its timeout says so).
        self.waited_for: Optional[str] = None

    # ------------------------------------------------------------------ public

    @property
    def calls(self) -> int:
        """API calls made by this side (slots, closer, group, snapshots and breaks)."""
        total = sum(slot.calls for slot in self._slots) + self._closer.calls + self._extra_calls
        total += self._pending_close.calls if self._pending_close is not None else 0
        total += sum(a.calls for a in self._slot_aliases.values()) + self._breaker.calls
        return total + (self._group.calls if self._group is not None else 0)

    def locked(self) -> bool:
        """True while *this side* reads (holds a slot and a share of the group; no call)."""
        return self._group is not None

    def owned(self) -> bool:
        """The same as :meth:`locked` (redis-py's name)."""
        return self.locked()

    @property
    def token(self) -> Optional[str]:
        """The read group's owner token while reading, else None."""
        return self._group.token if self._group is not None else None

    @property
    def slot_name(self) -> Optional[str]:
        """The alias of the reader slot this side holds (None: none)."""
        return self._slot.name if self._slot is not None else None

    def ensure_held(self, read: bool = False) -> None:
        """Raise :class:`MutexLostError` unless the group's ``MUTEX`` and this reader's slot are still held,
        as far as their heartbeats tell (``read=True``: one fresh read of the group too)."""
        if self._group is None or self._slot is None:
            raise MutexUsageError(
                f"this ReservationRWLock does not read {self._rw.name!r}: acquire the read side first",
                reservation_id=self._rw.reservation_id,
                alias=self._rw.name,
            )
        self._slot.ensure_held()
        self._group.ensure_held(read)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Read alongside other readers. Blocking, returns True or raises :class:`MutexTimeout` (nothing of
        this reader is left behind); with ``blocking=False`` one attempt, False when a writer holds or
        waits for the lock or every slot is taken."""
        rw = self._rw
        deadline = rw.deadline(blocking, timeout)
        if self._group is not None:
            raise MutexUsageError(
                f"this ReservationRWLock already reads {rw.name!r}; release it first, or use one object "
                "per task",
                reservation_id=rw.reservation_id,
                alias=rw.name,
            )
        if self._writing():
            raise MutexUsageError(
                f"this ReservationRWLock holds {rw.name!r} for writing: release it before reading",
                reservation_id=rw.reservation_id,
                alias=rw.name,
            )
        self._deadline = deadline
        self.waited_for = None
        self.blocker: Optional[str] = None
        self.blocker_since = rw.runtime.clock()
        self._finish_close()  # a release that raised left a close unfinished: finish it first
        if self._slot is not None:  # a release that raised left a slot: finish giving it back first
            self._give_back(self._close_by(deadline))
        entry = _Entry(self, rw, blocking, deadline)
        try:
            return acquire_loop(
                entry, deadline, lambda seconds: pause(seconds, rw.runtime.sleep, rw.cancelled)
            )
        except CancelledWait:  # between tries: this reader holds nothing here
            what = f"{entry.blocker}; " if entry.blocker else ""
            waited = rw.runtime.clock() - entry.start
            error = diagnosis.cancelled_wait(
                rw.name, rw.reservation_id, waited, None, what + "nothing of this reader was left"
            )
            raise error from None

    def try_entering(self, paced: bool) -> Optional[Dict[str, Holder]]:
        """One snapshot (``paced``: on the call budget) and, if it lets readers in, one try to enter.
        Returns the snapshot (None when the read failed); :meth:`locked` tells whether this reader reads."""
        rw = self._rw
        snap = self._snapshot(paced=paced)
        if snap is None:
            return None
        why = self._blocker(snap)
        if why != self.blocker:
            self.blocker, self.blocker_since = why, rw.runtime.clock()
            if why is not None:
                rw.logger.info("cloudshell-mutex: read of %s waits: %s", rw.name, why)
        if why is not None and self._abandoned_group(snap):
            # A group with no reader left (its readers' last close was skipped on a lagging read, or an add
            # of it landed late) would keep a waiting writer out until its lease ends.
            self._close(None, self._close_by(self._deadline))
        if why is None:
            self._enter(snap)
        return snap

    def release(self) -> None:
        """Stop reading: give the slot back, then close the group if no other reader is in it.

        Raises :class:`MutexLostError` when the group's ``MUTEX`` was lost meanwhile (broken or removed by
        force: the reading may not have been exclusive of writers), after cleaning up; and
        :class:`~.errors.MutexReleaseError` when a remove kept failing: the reading has ended, but the close
        is unfinished (``MUTEX~c`` stays held so no reader joins meanwhile): call release() again.
        """
        self._finish_close()
        if self._group is None and self._slot is None:
            return
        group, lost = self._group, None
        if group is not None:
            try:
                # One fresh read, as a mutex reads before its remove: a group lost while we read (broken, or
                # removed by force) must not pass silently. Read while we still hold our slot, because
                # after it is given back, the group may be closed legitimately by another reader.
                group.ensure_held(read=True)
            except MutexLostError as error:
                lost = error
            except MutexError as error:  # the read failed: leave the doubt to the heartbeat
                self._rw.logger.debug("cloudshell-mutex: could not check the read group: %s", error)
            # Our share ends here: once our slot is given back, another reader may close the group, and our
            # heartbeat must not take that for a loss.
            group.stop_heartbeat()
        self._saw_group = False  # the member closes below, with its share
        close_by = Deadline.after(RELEASE_CLOSE_WAIT, self._rw.runtime.clock)
        self._give_back(close_by)  # raises MutexReleaseError when the slot's remove kept failing: call again
        self._group = None
        if group is not None and self._others_read():
            group.detach()  # another reader reads: it closes the group when it leaves
            self._extra_calls += group.calls
            group = None
        if group is not None:
            try:
                self._close(group, close_by)
            except MutexLostError as error:
                lost = lost or error
            finally:
                if group is not self._pending_close:  # else counted when the close is finished
                    self._extra_calls += group.calls
        if lost is not None:
            raise lost

    def _others_read(self) -> bool:
        """After our slot was given back: does one read show another reader's slot? Then that reader will
        close the group (it gives its slot back after us, and its closer's read shows ours gone), and we
        skip the close (4 calls). This rests on a plain read: one that lags behind both slot removals could
        make both readers skip it; the group then waits, without heartbeats, for the next reader to join and
        close it, or for a writer to break it after its lease + margin."""
        for _ in range(CLOSE_ROUNDS):
            snap = self._snapshot(paced=False)
            if snap is None:
                return False  # cannot tell: close
            readers = self._readers(snap)
            # A crashed reader's slot would make every reader leave the group to it: break it first.
            if not readers or not self._break_stale(snap, readers):
                return bool(readers)
        return False

    def __enter__(self) -> ReadLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.release()

    # ------------------------------------------------------------------ entering

    def _snapshot(self, paced: bool) -> Optional[Dict[str, Holder]]:
        """One fresh read of every service (None after a transient failure); feeds the stale watches."""
        rw = self._rw
        result = rw.lock_alias.read(paced=paced, deadline=self._deadline.at)
        if not result.ok:
            if result.status is Status.TRANSIENT:
                rw.logger.debug("cloudshell-mutex: reading %s failed (%s)", rw.name, result.failure.message)
                return None
            raise rw.fatal(result.failure, "reading the reservation's lock services")
        services = result.services or {}
        watched = {
            rw.name,
            protocol.writer_waiting_alias(rw.name),
            protocol.closer_alias(rw.name),
            protocol.breaker_alias(rw.name),
        }
        watched.update(protocol.reader_slots(services, rw.name), self._watches)
        for alias in watched:
            self._watch(alias).observe(services.get(alias), result.sent_at)
        return services

    def _readers(self, snap: Dict[str, Holder]) -> List[str]:
        """Every reader slot the snapshot shows, whatever ``max_readers`` the reader that took it had."""
        return protocol.reader_slots(snap, self._rw.name)

    def _watch(self, alias: str) -> StaleWatch:
        return self._watches.setdefault(alias, StaleWatch())

    def _writer_waiting(self, snap: Dict[str, Holder]) -> Optional[Holder]:
        """The writer-waiting marker, unless this reader has judged it stale (a crashed writer's)."""
        marker = snap.get(protocol.writer_waiting_alias(self._rw.name))
        if marker is None or self._watch(marker.alias).stale(self._rw.runtime.clock()):
            return None
        return marker

    def _breaker_at_work(self, snap: Dict[str, Holder]) -> bool:
        """True when the snapshot shows someone breaking ``MUTEX`` (a waiter that judged the group stale),
        unless this reader has judged that breaker's service stale (a crashed breaker's)."""
        marker = snap.get(protocol.breaker_alias(self._rw.name))
        if marker is None:
            return False
        # A breaker removes only within its lease, but that remove may land up to a request's lifetime later.
        watch, now = self._watch(marker.alias), self._rw.runtime.clock()
        return not (watch.stale(now) and watch.unchanged_for(now) >= self._rw.options.request_lifetime)

    def _blocker(self, snap: Dict[str, Holder]) -> Optional[str]:
        """Why this snapshot lets no reader in (None: a reader may try)."""
        rw = self._rw
        holder = snap.get(rw.name)
        if holder is not None and not is_read_group(holder):
            if self._break_stale(snap, [rw.name]):  # a crashed writer's, judged as a waiting mutex would
                return None
            return f"{rw.name} is held by {holder.label}"
        waiting = self._writer_waiting(snap)
        if waiting is not None:
            return f"a writer is waiting ({waiting.label})"
        if all(alias in snap for alias in self._slot_names):
            if self._break_stale(snap, self._slot_names):
                return None
            return f"all {self.max_readers} reader slots are taken"
        return None

    def _abandoned_group(self, snap: Dict[str, Holder]) -> bool:
        """A writer waits, and this read shows a read group with no reader slot held."""
        holder = snap.get(self._rw.name)
        return is_read_group(holder) and self._writer_waiting(snap) is not None and not self._readers(snap)

    def _enter(self, snap: Dict[str, Holder]) -> bool:
        """Take a slot the snapshot shows free; then open the group or join it. True when reading."""
        free = [index for index, alias in enumerate(self._slot_names) if alias not in snap]
        if not free:
            return False
        slot = self._slots[self._rw.runtime.rng.choice(free)]
        try:
            if not slot.acquire(blocking=False):
                return False  # taken since the read
        except MutexTimeout:
            return False  # the API failed; the slot object watches an add that may still land
        self._slot = slot
        self._saw_group = is_read_group(snap.get(self._rw.name))
        try:
            group = self._open_or_join(slot, snap.get(self._rw.name))
        except BaseException:
            self._saw_group = True  # unknown: close to be safe (a close removes only a group without readers)
            self._give_back(self._close_by(self._deadline))
            raise
        if group is None:
            self._give_back(self._close_by(self._deadline))
            return False
        self._group = group
        return True

    def _open_or_join(self, slot: ReservationMutex, mutex_holder: Any) -> Optional[ReservationMutex]:
        rw = self._rw
        rounds = 0
        while rounds < ENTER_ROUNDS:
            rounds += 1
            if mutex_holder is None:  # MUTEX looked free: open a group
                group = rw.mutex(rw.name, _GroupMutex)
                try:
                    if group.acquire(blocking=False):
                        return group
                except MutexTimeout:
                    pass  # unknown; the next read tells
            snap = self._snapshot(paced=True)
            if snap is None:
                mutex_holder = _UNKNOWN
                continue
            mine = snap.get(slot.name)
            if mine is None or mine.token != slot.token:
                # This read does not show our own slot: it lags behind our add, so it cannot show what
                # happened after it either. Decide nothing on it.
                mutex_holder = _UNKNOWN
                rw.runtime.sleep(FRESH_READ_LAG / 4)
                continue
            holder = snap.get(rw.name)
            self._saw_group = self._saw_group or is_read_group(holder)
            if holder is None:
                mutex_holder = None
                continue
            if not is_read_group(holder) or self._writer_waiting(snap) is not None:
                return None
            busy = snap.get(protocol.closer_alias(rw.name))
            if busy is None and self._breaker_at_work(snap):
                busy = snap.get(protocol.breaker_alias(rw.name))
            if busy is not None:
                # A closer is at work: it may have counted the slots before ours. Keep the slot (the closer
                # then leaves the group to us) and look again when it is done: it never waits for anything.
                # A breaker likewise: it breaks the group only when its re-read shows no slot held.
                self.waited_for = f"{busy.alias} (held by {busy.label}) was at work on the read group"
                if self._deadline.passed():
                    return None
                rounds -= 1
                rw.runtime.sleep(self._deadline.clip(CLOSER_POLL * rw.runtime.rng.uniform(0.5, 1.5)))
                mutex_holder = _UNKNOWN
                continue
            try:
                return self._join(holder)
            except MutexError:  # gone meanwhile, or adopt's read failed: look again
                mutex_holder = _UNKNOWN
        return None

    def _join(self, holder: Holder) -> ReservationMutex:
        """Share the group's acquisition (a read, and with a lease one heartbeat of our own)."""
        rw = self._rw
        group = rw.mutex(rw.name, _GroupMutex, lease=lease.lease_of(holder) or 0.0)
        group.join(holder.token)
        return group

    def _give_back(self, close_by: Deadline) -> None:
        """Release the slot held (if any); after seeing a group, try to close it (this slot may be what
        a closer saw when it decided to leave the group open), waiting for ``MUTEX~c`` until ``close_by``."""
        slot = self._slot
        if slot is not None:
            with contextlib.suppress(MutexLostError):  # broken meanwhile: nothing of ours to remove
                slot.release()
            self._slot = None
        if self._saw_group:
            self._saw_group = False
            self._close(None, close_by)

    # ------------------------------------------------------------------ closing

    def _close(self, group: Optional[ReservationMutex], close_by: Deadline) -> None:
        """Remove the group's ``MUTEX`` if no reader slot is held, as the only closer at work.

        ``group`` is this reader's share (or None). ``MUTEX~c`` is waited for until ``close_by``;
        then the group is left to the closer at work, the next closer or its lease. Raises
        :class:`MutexLostError` when that share turns out lost at its removal."""
        rw = self._rw
        closer = self._closer
        try:
            closer.acquire(timeout=close_by.left())
        except MutexTimeout as error:
            self.waited_for = f"{closer.name} (held by {error.holder or 'another reader'}) was at work"
            rw.logger.warning(
                "cloudshell-mutex: could not take %s to close the read group of %s (%s); the group is left "
                "to the next closer or its lease",
                closer.name,
                rw.name,
                error,
            )
            if group is not None:
                group.detach()
            return
        try:
            group = self._close_held(group)
        finally:
            if self._pending_close is None:  # else both stay held until the close is finished
                if group is not None:
                    group.detach()  # another reader is in the group: it closes it
                closer.release()

    def _close_held(self, group: Optional[ReservationMutex]) -> Optional[ReservationMutex]:
        """Under ``MUTEX~c``: returns the share still to detach (None when it was released here)."""
        rw = self._rw
        closer = self._closer
        for _ in range(CLOSE_ROUNDS):
            snap = self._snapshot(paced=False)
            if snap is None:
                rw.runtime.sleep(FRESH_READ_LAG / 4)
                continue
            mine = snap.get(closer.name)
            if mine is None or mine.token != closer.token:
                rw.runtime.sleep(FRESH_READ_LAG / 4)  # lags behind our closer's add: shows too little
                continue
            holder = snap.get(rw.name)
            readers = self._readers(snap)
            if readers and self._break_stale(snap, readers):
                continue  # a crashed reader's slot was removed: look again
            if readers or not is_read_group(holder):
                return group
            if self._breaker_at_work(snap):
                # A breaker's re-read may have shown the group before our MUTEX~c: its remove may land after
                # ours, on a group opened meanwhile. Leave the group to it (it sees our MUTEX~c, or breaks).
                return group
            try:
                # No call: a closer paused past its lease may have lost MUTEX~c to a breaker, and a reader may
                # have joined since; its snapshot then proves nothing.
                closer.ensure_held()
            except MutexLostError as error:
                rw.logger.warning("cloudshell-mutex: not closing the read group of %s: %s", rw.name, error)
                return group
            if group is None or group.token != holder.token:
                if group is not None:
                    group.detach()
                try:
                    group = self._join(holder)
                except MutexLostError:
                    return None  # gone meanwhile
                except MutexError as error:  # adopt's read failed: look again
                    rw.logger.debug("cloudshell-mutex: joining the read group to close it: %s", error)
                    group = None
                    rw.runtime.sleep(FRESH_READ_LAG / 4)
                    continue
                joined = group
            else:
                joined = None
            try:
                group.release()  # reads, and removes MUTEX only while it is the group's (sent once)
            except MutexLostError as error:
                # Taken meanwhile (broken or removed by force): nothing of the group's is left to remove.
                # Our own reading ended earlier, checked by release()'s read.
                rw.logger.warning("cloudshell-mutex: closing the read group of %s: %s", rw.name, error)
                return None
            except MutexReleaseError as error:
                # Our remove may still land, later: if we let go of MUTEX~c now, a reader could join the
                # group before it lands and read beside the writer who adds MUTEX next. Keep both.
                self._pending_close = group
                raise self._close_error(error) from error
            finally:
                if joined is not None and joined is not self._pending_close:
                    self._extra_calls += joined.calls
            rw.logger.info("cloudshell-mutex: closed the read group of %s (%s)", rw.name, holder.token)
            return None
        return group

    def _finish_close(self) -> None:
        """Continue a close whose remove kept failing (the group object remembers what it sent), then give
        ``MUTEX~c`` back. Raises :class:`MutexReleaseError` again while the server keeps failing."""
        group = self._pending_close
        if group is None:
            return
        try:
            group.release()
        except MutexLostError as error:
            # Gone, or someone else's, with no remove of ours that could have done it: nothing to remove.
            self._rw.logger.warning(
                "cloudshell-mutex: closing the read group of %s: %s", self._rw.name, error
            )
        except MutexReleaseError as error:
            raise self._close_error(error) from error
        self._pending_close = None
        self._extra_calls += group.calls
        self._closer.release()

    def _close_error(self, error: MutexReleaseError) -> MutexReleaseError:
        rw = self._rw
        closer = protocol.closer_alias(rw.name)
        return MutexReleaseError(
            f"could not close the read group of {rw.name!r} in reservation {rw.reservation_id}: "
            f"{error.api_message or 'its remove could not be confirmed'}. "
            f"This reader has stopped reading; it keeps {closer!r} so that no reader joins the group while "
            "its remove may still land: call release() again once the server answers, to finish the close. "
            f"Do not remove {rw.name!r} by hand: other readers may share the group. If this process ends "
            f"first, {closer!r} ends with its lease and the next reader or a waiting writer settles it",
            reservation_id=rw.reservation_id,
            alias=rw.name,
            code=error.code,
            api_message=error.api_message,
        )

    def _close_by(self, deadline: Deadline) -> Deadline:
        """Until when a close inside ``acquire()`` waits for ``MUTEX~c``: the caller's deadline, and at most
        long enough to break a crashed closer's ``MUTEX~c`` (lease + margin). A live closer may hold it
        longer (its remove of the group may land up to request_lifetime later); giving up on it is safe: it
        saw no reader slot and is removing the group (docs/protocol.md, "Why every group closes")."""
        lease_seconds = self._rw.options.lease
        return deadline.sooner(2 * lease_seconds + 10.0 if lease_seconds > 0 else 60.0)

    # ------------------------------------------------------------------ crashed readers

    def _break_stale(self, snap: Dict[str, Holder], aliases: List[str]) -> bool:
        """Break each of ``aliases`` (reader slots, or a writer's ``MUTEX``) that this reader has seen
        unchanged (token and heartbeat) for its lease + margin, as a waiting mutex breaks a stale holder (one
        breaker at a time, on the record). True when one was. A holder without a lease is never broken."""
        rw = self._rw
        broken = False
        for alias in aliases:
            watch = self._watch(alias)
            holder = snap.get(alias)
            if holder is None or not watch.stale(rw.runtime.clock()):
                continue
            seen = watch.unchanged_for(rw.runtime.clock())
            target = self._part_alias(alias)
            if not self._breaker.break_holder(target, watch).broken:
                continue
            broken = True
            what = "lock" if alias == rw.name else "reader slot"
            message = diagnosis.broke_stale(rw.owner, what, alias, holder, lease.lease_of(holder) or 0, seen)
            rw.logger.warning("cloudshell-mutex: %s", message)
            target.write_output(message, warning=True)
        return broken

    def _part_alias(self, alias: str) -> LockAlias:
        if alias not in self._slot_aliases:
            self._slot_aliases[alias] = self._rw.alias(alias)
        return self._slot_aliases[alias]


class _Entry:
    """:meth:`ReadLock.acquire` as the engine's attempt: one try is one snapshot and, if it lets readers
    in, one try to take a slot and open or join the group."""

    def __init__(self, reader: ReadLock, rw: RWParts, blocking: bool, deadline: Deadline) -> None:
        self.reader = reader
        self.rw = rw
        self.blocking = blocking
        self.tries = 0
        self.deadline = deadline
        self.start = deadline.clock()
        self.snap: Optional[Dict[str, Holder]] = None
        self.delay = 0.0

    @property
    def blocker(self) -> Optional[str]:
        """What kept the reader out at the last snapshot."""
        return self.reader.blocker

    def try_once(self) -> Optional[float]:
        """None once reading; else the pacing policy's next delay."""
        reader, rw = self.reader, self.rw
        self.snap = reader.try_entering(paced=self.tries > 0)
        self.tries += 1
        if reader.locked():
            rw.logger.info(
                "cloudshell-mutex: reading %s in reservation %s (slot %s, group %s) after %.2f s",
                rw.name,
                rw.reservation_id,
                reader.slot_name or "?",
                reader.token,
                rw.runtime.clock() - self.start,
            )
            return None
        self.delay = rw.pacing.next_delay(self.tries, self.delay, rw.runtime.rng)
        return self.delay

    def waiting(self) -> None:
        """Nothing: a reader writes no progress lines."""

    def give_up(self) -> bool:
        """Non-blocking and read: busy (False). Otherwise the timeout, naming what kept the reader out."""
        if not self.blocking and self.snap is not None:
            return False
        reader, rw = self.reader, self.rw
        now = rw.runtime.clock()
        what = (
            reader.blocker
            or reader.waited_for
            or (
                "the reservation could not be read"
                if self.snap is None
                else "other readers kept taking the free slots first"
            )
        )
        raise diagnosis.read_timeout_error(
            rw.name, rw.reservation_id, now - self.start, what, reader.blocker, now - reader.blocker_since
        )
