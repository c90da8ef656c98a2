"""ReservationMutex: a lock on a CloudShell reservation that never proceeds without the lock.

The protocol (docs/protocol.md explains it step by step):

* acquire = ``AddServiceToReservation(res, "Mutex Service", alias, [Mutex Owner=<token>, ...])``.
  The server lets only one service per alias exist, so the add succeeds for exactly one caller.
  The token, unique per acquisition, is written *in the same call*, so the service itself says
  who added it: any later doubt ("did my add commit?") is settled by one fresh read.
* release = ``RemoveServicesFromReservation(res, [alias])``, but only while the alias is ours.
  The remove cannot check the owner itself, so ownership is checked just before it, and it is
  sent once: the client's own re-send of a dropped remove could delete a successor's lock.

Compatible with the original snippet (QualiSystemsLab/Reservation-Mutex-Lock): same model, alias and
"success of the add = held" rule, so old and new code exclude each other.

This module is the public face: arguments, nesting, what is held, hand-over. One try of an acquire is
:class:`~.attempt.MutexAttempt`'s, run on the engine's loop (:func:`~.engine.acquire_loop`); a release is
:class:`~.release.ReleaseLoop`'s; what is held is a :class:`~.held.Held`; what they share is
:class:`~.core.LockCore`.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

from .. import diagnosis, events, protocol
from ..engine import LockFace, Runtime, Wait, acquire_loop
from ..errors import MutexDeadlock, MutexUsageError
from ..holder import Holder, make_secret, make_token, releasing_value
from ..lease import lease
from ..operation import Operation
from ..options import UNSET, MutexOptions, default_logger
from ..pacing import CancelledWait, DefaultPacing, ExponentialBackoff, PacingPolicy, cancellation_check
from ..queue import holdings
from ..queue.queue import FairQueue
from ..queue.waitrecord import WaitRecord
from ..server.alias import LockAlias
from ..server.late_adds import with_late_adds
from . import fencing
from .attempt import MutexAttempt
from .core import LockCore
from .handle import HandleInfo, make_handle, parse_handle
from .held import Held
from .release import ReleaseEnd, ReleaseLoop


class ReservationMutex(LockFace):
    """A mutual-exclusion lock on one CloudShell reservation, shared by every process that uses
    the same alias (default ``MUTEX``), including code that runs the original snippet.

    ``api`` is a ``CloudShellAPISession`` (or an object with the same methods). ``owner`` is a short
    label for people ("Router A driver"); each acquisition writes a unique token built from it.
    ``timeout`` (seconds, None = wait forever) bounds a blocking acquire; on timeout
    :class:`~.errors.MutexTimeout` is raised and nothing is removed. The other keyword arguments
    are the tuning options of :class:`~.options.MutexOptions` (or pass ``options=`` one of those),
    validated here. Without ``logger`` the lock logs to ``logging.getLogger("cloudshell_mutex")``.

    One object is one lock handle: do not share it between threads; give each thread its own.

    ``name`` must be a lock's own name (:func:`~.protocol.check_lock_name`): not blank-padded, without the
    ``~`` of the services a lock derives from its name, and ``MUTEX`` only in that spelling.
    """

    #: True for the internal locks on aliases derived from a lock's name (a read-write lock's reader slots,
    #: closer and writer-waiting marker), which no public lock may be named.
    _derived_name = False
    #: Put before every owner token of this kind of lock (a read group's mark).
    _token_mark = ""
    #: False for a hold shared with others (a read group): an add left by an interrupted acquire is never
    #: removed blindly, even when a read shows it, since another may have joined it in that instant.
    _removes_abandoned_add = True
    #: While a release waits for a remove of ours that may still land, add ``~releasing`` (a waiter's timeout
    #: says why the lock stays held). Not for the derived mutexes of a read-write lock, nor for a read group.
    _marks_release = True

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        owner: Optional[str] = "cloudshell-mutex",
        name: str = "MUTEX",
        timeout: Optional[float] = UNSET,
        logger: Optional[logging.Logger] = None,
        *,
        options: Optional[MutexOptions] = None,
        runtime: Optional[Runtime] = None,
        **tuning: Any,
    ) -> None:
        if options is not None and not isinstance(options, MutexOptions):
            raise TypeError(f"options must be a MutexOptions, got {type(options).__name__}")
        if not self._derived_name:
            protocol.check_lock_name(name)
        if timeout is not UNSET:
            tuning["timeout"] = timeout
        base = options if options is not None else MutexOptions()
        self.options = base.replace(**tuning) if tuning else base
        self.logger = default_logger(logger)
        self.owner = "cloudshell-mutex" if owner is None else str(owner)
        self.pacing: PacingPolicy = self.options.pacing or DefaultPacing()
        self.backoff: PacingPolicy = self.options.backoff or ExponentialBackoff()
        #: The clock, sleep, random source and late-add watcher of this lock and its steps (the test seam).
        self.runtime = with_late_adds(runtime, self.logger)
        clock, sleep = self.runtime.clock, self.runtime.sleep
        alias = LockAlias.for_lock(api, reservation_id, name, self.options, self.logger, clock, sleep)
        self._lock_alias = alias
        # The caller's cancellation, heard while a blocking acquire pauses (its Wait's).
        self._cancelled = cancellation_check(self.options.cancellation)
        self._core = LockCore(
            alias, self.options, self.owner, self.logger, self.runtime, self.pacing, self.backoff
        )
        # Fencing: the counter service (created on first use).
        self._counter = alias.sibling(protocol.generation_alias(name))
        # The place in the advisory queue (queue.py); None with fair=False: plain polling by the pacing.
        self._queue: Optional[FairQueue] = None
        if self.options.fair:
            self._queue = FairQueue(
                alias,
                label=self.owner,
                request_lifetime=self.options.request_lifetime,
                runtime=self.runtime,
                looked=self._core.saw_in_line,
                logger=self.logger,
                holding=self._holding,
            )
            self._core.on_read = self._queue.saw  # who waits, remembered for this process's next acquire
        self._part = lease.new_part()
        self._held: Optional[Held] = None
        #: When the caller began waiting for the next acquisition, if earlier than the acquire (a cohort's
        #: local lock; clock time): that acquisition's timeout and "acquired after" count from then.
        self.waiting_since: Optional[float] = None

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a blocking acquire waits by default (None: forever)."""
        return self.options.timeout

    @property
    def calls(self) -> int:
        """API calls made by this object in total (catalog detection included)."""
        return self._core.alias.calls

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current acquisition, or None when not held."""
        return self._held.token if self._held is not None else None

    def locked(self) -> bool:
        """True while *this object* holds the lock, as far as it knows (no call; see docs/protocol.md).

        threading's ``Lock.locked()`` and redis-py's ``Lock.locked()`` say whether *anyone* holds the lock;
        this one is redis-py's ``owned()`` (also here, under that name). Whether anyone holds it:
        ``holder() is not None``.
        """
        return self._held is not None

    @property
    def leased(self) -> bool:
        """True while this object holds the lock with a lease (it heartbeats; waiters may break it)."""
        return self._held is not None and self._held.heartbeat is not None

    def ensure_held(self, read: bool = False, timeout: Optional[float] = 0.0) -> None:
        """Raise :class:`~.errors.MutexLostError` unless this object still holds the lock, as far as it can
        tell: the heartbeat has not seen it taken, and (with a lease) a heartbeat was confirmed less than a
        lease ago, so no waiter can have broken it yet. ``read=True`` adds one fresh read of the owner (and
        one more a second later when it does not show ours: a fresh read may lag behind the server); a read
        that fails transiently is tried again, backing off, for up to ``timeout`` seconds (0: once; None: as
        long as it takes), then raises.

        Call it right before each side effect of a long critical section: it costs no call by default.
        """
        if self._held is None:
            raise diagnosis.not_held_error("ReservationMutex", self.reservation_id, self.name)
        self._held.check(read, Wait.after(timeout, self.runtime.clock, self.runtime.sleep))

    @property
    def generation(self) -> int:
        """An advisory fencing number: larger for every later acquisition of this lock in this reservation
        that asks for it. The first ask per acquisition reads and bumps a counter service
        (``<alias>~generation``, ``Mutex Generation``) under the lock: 2 calls (a read, and a write or the
        add that creates the counter); an acquisition that never asks costs nothing.

        CloudShell does not check it. A protected resource that wants fencing must remember the largest
        generation it has seen and refuse requests that carry a smaller one (docs/protocol.md, "Fencing").
        Needs our Mutex_Package (the model with ``Mutex Generation``); raises
        :class:`~.errors.MutexUsageError` on a model without it, and :class:`~.errors.MutexLostError` when
        the lock is not held any more.
        """
        self.ensure_held()
        held = self._held
        if held.generation is None:
            try:
                number = fencing.bump_generation(self._counter, self.name)
            except fencing.CounterRefused as refused:
                error = MutexUsageError(str(refused), reservation_id=self.reservation_id, alias=self.name)
                raise self._core.news.error(error, self._core.operation(held.token)) from None
            except fencing.CounterFailed as failed:
                raise self._core.diagnose(failed.failure, failed.doing) from None
            self.ensure_held()  # the number is worth something only if we still held the lock meanwhile
            held.generation = number
        return held.generation

    def export(self) -> str:
        """A short string that lets another process join this acquisition (:meth:`adopt`).

        Safe to pass as a driver command's input (letters, digits, ``-_.``); it holds no credentials. Both
        sides then heartbeat the same lease, and either may release; the other notices (its heartbeat finds
        the lock gone: ``on_lost``, :meth:`ensure_held`). Export only while held.
        """
        held = self._held
        if held is None:
            raise diagnosis.export_unheld_error(self.reservation_id, self.name)
        # Whoever releases may be the adopter, which knows nothing of our queue ticket: it goes now (held,
        # so the ticket is surely still ours: no waiter takes a holder's ticket away).
        held.drop_ticket()
        beat = held.heartbeat
        lease_seconds = beat.lease if beat is not None else 0.0
        info = HandleInfo(self.reservation_id, self.name, self.options.model, held.token, lease_seconds)
        return make_handle(info)

    @classmethod
    def adopt(cls, api: Any, handle: str, owner: Optional[str] = None, **kwargs: Any) -> ReservationMutex:
        """Join the acquisition another process exported (:meth:`export`); returns a held lock object.

        The handle is parsed strictly (:class:`~.errors.MutexHandleError`). One fresh read checks that the
        lock still carries the handle's token (else :class:`~.errors.MutexLostError`); when its service has
        a lease, this object writes a heartbeat at once and keeps heartbeating that lease (whatever its own
        ``lease`` option: ``lease=0`` cannot unlease a lock). ``kwargs`` are the constructor's options.
        """
        info = parse_handle(handle)
        kwargs.setdefault("model", info.model)
        kwargs.setdefault("lease", info.lease)
        mutex = cls(api, info.reservation_id, owner=owner or "adopted", name=info.alias, **kwargs)
        mutex._join(info.token)
        return mutex

    def _join(self, token: str, deadline: Optional[Wait] = None, secret: Optional[bytes] = None) -> None:
        """Hold the acquisition ``token`` after one fresh read shows it (see :func:`.handover.join`)."""
        core = self._core
        op = core.operation(token)
        read = core.read_until(op, deadline)
        if not read.ok:
            raise core.diagnose(read.failure, "reading the lock to adopt it")
        holder = read.holder
        if holder is None or holder.token != token:
            op.see_holder(holder)
            error = diagnosis.adopt_lost_error(self.reservation_id, self.name, token, op.holder_label)
            raise core.news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)
        self._held = Held(core, token, read.sent_at, self._part, secret)
        self._held.adopt_lease(holder)
        self._register()
        core.news.event(events.ACQUIRED, op, error="adopted")
        core.news.log(
            logging.INFO, "adopted %s in reservation %s (%s)", self.name, self.reservation_id, token
        )

    def renew(self) -> bool:
        """One heartbeat now (a fresh read, and a write while the lock is ours); True when it was written.
        The background thread does this about every lease/3; long critical sections may call it too."""
        beat = self._held.heartbeat if self._held is not None else None
        return beat is not None and beat.beat().ok

    def holder(self) -> Optional[Holder]:
        """Who holds the lock now, this object or anyone else (one fresh, uncached read), or None when it is
        free: ``holder() is not None`` is what threading's and redis-py's ``locked()`` answer."""
        op = self._core.operation(self.token or "")
        result = self._core.read(op)
        if self._held is not None:
            self._held.confirm(result)
        if not result.ok:
            raise self._core.diagnose(result.failure, "reading the lock holder")
        return result.holder

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Take the lock.

        Blocking (the default), it returns True once held, or raises :class:`~.errors.MutexTimeout`
        when ``timeout`` (default: the constructor's) runs out: it never returns without the lock.
        With ``blocking=False`` it makes exactly one add attempt and returns False when the lock is
        busy (a timeout cannot be given then). Fatal problems raise at once (see :mod:`.errors`).
        """
        wait = Wait.for_acquire(blocking, timeout, self.timeout, self.runtime, self._cancelled)
        if self._held is not None:
            if self.options.reentrant:
                self._held.depth += 1
                return True
            raise diagnosis.held_again_error("ReservationMutex", self.reservation_id, self.name)
        core, clock = self._core, self.runtime.clock
        secret = make_secret()  # kept by this acquisition alone: its token commits to it
        op = core.operation(self._token_mark + make_token(self.owner, secret))
        op.wait = wait
        since, self.waiting_since = self.waiting_since, None  # for this acquisition only
        op.waited_before = 0.0 if since is None else max(0.0, op.start - since)
        beat = lease.heartbeat_value(lease.nonce_of(op.token) or op.token, self._part, 0)
        first_beat = beat if self.options.lease > 0 else ""
        # Plain polling: a thread that holds other locks of the reservation keeps a wait record, so that its
        # wait is seen in the wait-for graph (in the queue, its ticket is that record).
        record = None if self._queue is not None or not blocking else self._wait_record(op.token)
        attempt = MutexAttempt(core, op, blocking, first_beat, queue=self._queue, record=record)
        granted = False  # the hold is in place (Ctrl-C while it was being set up takes the lock back)
        try:
            acquired = acquire_loop(attempt, wait)
            if acquired:
                self._acquired(attempt, secret)
                granted = True
        except CancelledWait:
            # The caller stopped waiting. An add of ours may be in place: take back what a read shows, as
            # after Ctrl-C. Either way, an add that may still land goes to the watcher, as on timeout.
            if op.add_pending or op.add_can_land(clock()):
                attempt.abandon(self._removes_abandoned_add)
            else:
                core.watch_late_add(op)
            error = diagnosis.cancelled_error(op, clock(), self.reservation_id, self.name)
            raise core.news.error(error, op, events.CANCELLED, logging.WARNING, holder=error.holder) from None
        except MutexDeadlock as error:
            core.watch_late_add(op)  # as on timeout: an add of ours that may still land is removed then
            raise core.news.error(error, op, events.DEADLOCK, logging.WARNING) from None
        except Exception:
            core.watch_late_add(op)
            raise
        except BaseException:
            # Ctrl-C (or SystemExit) while an add was on the wire, or just after it: the add may have
            # committed, or still commit, with nobody left to release it. Undo what a read shows.
            attempt.abandon(self._removes_abandoned_add)
            raise
        finally:
            if record is not None:
                record.close()
            if self._queue is not None:
                # Our place in the queue is given up; a granted acquisition keeps the ticket for its release.
                kept = self._queue.leave(granted=granted)
                if kept is not None and self._held is not None:
                    self._held.ticket = kept
        if not acquired:
            core.watch_late_add(op)
        return acquired

    def release(self) -> None:
        """Release the lock if this object holds it; otherwise do nothing (idempotent).

        Raises :class:`~.errors.MutexLostError` when the lock turned out not to be ours any more
        (nothing is removed), and :class:`~.errors.MutexReleaseError` when the remove kept failing
        (the object still holds the lock then, so release() can be called again).
        """
        held = self._held
        if held is None:
            self._core.news.log(
                logging.DEBUG, "release of %s: not held by this object, nothing to do", self.name
            )
            return
        if held.depth > 1:
            held.depth -= 1
            return
        beat = held.heartbeat
        earlier_remove = held.release_op is not None and held.release_op.remove_may_have_landed
        if held.lost and not earlier_remove:
            # A read while held (the heartbeat's, or a check's) saw the lock taken: nothing of ours is there
            # to remove, and the loss was told when it was found.
            error = held.lost_notice(held.lost_to)
            self._forget()
            raise error
        if beat is not None:
            # The heartbeat goes on until the release is settled: a remove of ours whose outcome is unknown
            # may land up to request_lifetime later, and a lease left silent meanwhile would let a waiter
            # break the lock and take it, only for our remove to delete the waiter's.
            beat.releasing = True
        # A release() after a failed one continues it: what the first learned (a remove of ours that may
        # still land) must not be forgotten, or the next remove could delete a successor's lock.
        first = held.release_op is None
        op = held.release_op or self._core.operation(held.token)
        held.release_op = op
        # The ~releasing marker proves itself with the secret: a holder that does not know it (an adopter)
        # never marks, since waiters would not believe it.
        marks = self._marks_release and held.secret is not None
        marker = releasing_value(held.token, held.secret) if marks else None
        loop = ReleaseLoop(self._core, op, held.confirmed_at, held.confirm, marker, held.ticket)
        try:
            end = loop.run()
        finally:
            held.ticket = loop.ticket  # None once removed with the lock (or left to the watcher)
        if first and self._queue is not None and not (op.polls or op.remove_may_have_landed):
            # The hold as the server saw it, which is what the waiters' hints are about: from the granted
            # add's landing to the remove's, about the release's start plus half its round trips (the add's
            # whole round trip is in op.start - since, and the read's and half the remove's are not). Not a
            # release whose remove got no answer: it waited for a fault (up to request_lifetime), not a hold.
            self._queue.held_for((op.start + self.runtime.clock()) / 2 - held.since, held.token)
        self._ended(op, end)

    def _forget(self) -> None:
        """Stop holding without removing the service (no call; see :func:`.handover.detach`)."""
        held, self._held = self._held, None
        if held is not None:
            held.forget()
            holdings.unregister(self)

    # ------------------------------------------------------------------ the ends of an acquire and a release

    def _acquired(self, attempt: MutexAttempt, secret: bytes) -> None:
        op, core = attempt.op, self._core
        if attempt.resolved:  # the read that showed our add tells what the model took (a lease among it)
            core.alias.learn_from(core.last_services.get(self.name), op.token)
        held = Held(core, op.token, attempt.confirmed_at, self._part, secret)
        held.start_heartbeat(attempt.lease_from)
        held.late_add_by = op.add_lands_by if op.add_can_land(self.runtime.clock()) else None
        held.late_copies = op.add_unanswered
        self._held = held
        self._register()
        if attempt.resolved:
            core.news.event(events.RESOLVED, op)
            core.news.log(logging.INFO, "an earlier add of %s turned out to have succeeded", self.name)
        core.news.event(events.ACQUIRED, op)
        core.news.log(
            logging.INFO,
            "acquired %s in reservation %s as %s after %.2f s (%d adds, %d calls)",
            self.name,
            self.reservation_id,
            op.token,
            self.runtime.clock() - op.start + op.waited_before,
            op.adds,
            core.news.calls_of(op),
        )

    # ------------------------------------------------------------------ what the thread holds (deadlocks)

    def _register(self) -> None:
        """Named locks of one's own (not a read-write lock's derived mutexes, nor a read group) are what a
        fair-mode waiter's ticket names as held by its thread (:mod:`.holdings`, :mod:`.waitfor`)."""
        if not self._derived_name and not self._token_mark and self._held is not None:
            holdings.register(self, self._held.token)

    def _wait_record(self, token: str) -> Optional[WaitRecord]:
        core = self._core
        lifetime = self.options.request_lifetime
        return WaitRecord.for_wait(core.alias, token, self.runtime, lifetime, self.logger)

    def _holding(self) -> Tuple[str, ...]:
        """The tokens of the other locks this thread holds in this lock's reservation, for the queue's ticket
        (no call). Not this lock's own: a thread that waits for a lock it holds through another object may be
        waiting for another thread to release that object (a timer), which no read can tell."""
        return holdings.held_tokens(self.api, self.reservation_id, but=self.name)

    def _ended(self, op: Operation, end: ReleaseEnd) -> None:
        """The release is settled: forget the hold, and say how it ended (lost: raise)."""
        core, token = self._core, op.token
        self._forget()
        if end.lost:
            error = diagnosis.lost_error(op, self.reservation_id, self.name)
            core.tell_lost(op.holder_label)
            raise core.news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)
        core.news.event(events.RELEASED, op, error=end.note)
        core.news.log(
            logging.INFO,
            "released %s in reservation %s (%s)%s",
            self.name,
            self.reservation_id,
            token,
            f": {end.note}" if end.note else "",
        )
