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

This module is the policy: deadlines, pacing, what an unknown outcome means, what to report. The
calls themselves are :class:`~.alias.LockAlias`'s; :class:`~.operation.Operation` keeps the record of
one acquire or release, :mod:`.diagnosis` words the errors.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Callable, Mapping, Optional, Tuple

from . import diagnosis, events, fencing, lease, protocol
from .alias import CallResult, LockAlias, Status
from .classify import Classification, ErrorKind
from .errors import MutexError, MutexLostError, MutexUsageError
from .events import Reporter
from .handle import HandleInfo, make_handle, parse_handle
from .holder import Holder, make_token, namesake, sanitize_label
from .late_adds import LateAdds, late_adds_for
from .lease import Heartbeat, StaleWatch
from .operation import Operation
from .options import FRESH_READ_LAG, UNSET, MutexOptions, check_duration, default_logger
from .pacing import (
    CancelledWait,
    DefaultPacing,
    ExponentialBackoff,
    PacingPolicy,
    cancellation_check,
    clip,
    pause,
)
from .queue import FairQueue

#: The suffix of the alias of a lock's generation counter service.

#: How many times an adopted lock tries its first heartbeat of its own before leaving it to the thread.
ADOPTED_BEAT_TRIES = 3

#: The logger the lock writes to unless it is given one.


class ReservationMutex:
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

    #: Seconds the caller already waited for this acquisition elsewhere (a cohort's local lock): counted in
    #: the "acquired after" figure, so that it tells the whole wait.
    _waited_before = 0.0

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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Optional[random.Random] = None,
        late_adds: Optional[LateAdds] = None,
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
        self._alias = LockAlias(
            api,
            reservation_id,
            name,
            self.options.model,
            budget=self.options.budget,
            logger=self.logger,
            clock=clock,
            sleep=sleep,
        )
        self.owner = "cloudshell-mutex" if owner is None else str(owner)
        self.pacing: PacingPolicy = self.options.pacing or DefaultPacing()
        self.backoff: PacingPolicy = self.options.backoff or ExponentialBackoff()
        self._clock = clock
        self._sleep = sleep
        # The caller's cancellation (None: none), asked only while a blocking acquire waits.
        self._cancelled = cancellation_check(self.options.cancellation)
        self._rng = rng if rng is not None else random.Random()
        self._late_adds = late_adds if late_adds is not None else late_adds_for(clock, self.logger)
        self._news = Reporter(self._alias, self.logger, self.options.on_event, clock)
        # Leases: the breaker of stale holders (one breaker at a time), this waiter's judgement of the holder,
        # and the held acquisition's heartbeat (None: no lease).
        self._breaker = lease.Breaker(
            self._alias.sibling,
            self.owner,
            lease.breaker_lease(self.options.lease),
            self.options.request_lifetime,
            self._late_adds,
            clock,
            sleep,
        )
        # Fencing: the counter service (created on first use) and this acquisition's generation, if asked.
        self._counter = self._alias.sibling(protocol.generation_alias(name))
        self._generation: Optional[int] = None
        # The fair mode's place in the advisory queue (queue.py); None: the default pacing alone.
        self._queue: Optional[FairQueue] = None
        if self.options.fair:
            self._queue = FairQueue(
                self._alias,
                label=self.owner,
                request_lifetime=self.options.request_lifetime,
                late_adds=self._late_adds,
                clock=clock,
                sleep=sleep,
                wait=self._pause,
                rng=self._rng,
                logger=self.logger,
            )
        self._watch = StaleWatch()
        self._heartbeat: Optional[Heartbeat] = None
        self._part = lease.new_part()
        # The acquisition held now: its token (None = not held), nesting depth, and when a fresh
        # answer from the server last showed the lock is ours (the add itself, or a read).
        self._token: Optional[str] = None
        self._depth = 0
        self._confirmed_at = float("-inf")
        # Until then an earlier add of the held acquisition, sent without an answer, may still land.
        self._late_add_by: Optional[float] = None
        self._late_copies = 0
        # A release that raised MutexReleaseError: the next release() continues it, knowing what it knew.
        self._release_op: Optional[Operation] = None
        # Every service of the last fresh read (a case-blind server shows our lock under another spelling).
        self._last_services: Mapping[str, Holder] = {}

    # ------------------------------------------------------------------ public API

    @property
    def api(self) -> Any:
        """The API session the lock makes its calls with."""
        return self._alias.api

    @property
    def reservation_id(self) -> str:
        """The reservation this lock is in."""
        return self._alias.reservation_id

    @property
    def name(self) -> str:
        """The lock's service alias (``MUTEX`` unless given)."""
        return self._alias.alias

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a blocking acquire waits by default (None: forever)."""
        return self.options.timeout

    @property
    def calls(self) -> int:
        """API calls made by this object in total (catalog detection included)."""
        return self._alias.calls

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current acquisition, or None when not held."""
        return self._token

    def locked(self) -> bool:
        """True while *this object* holds the lock, as far as it knows (no call; see docs/protocol.md).

        threading's ``Lock.locked()`` and redis-py's ``Lock.locked()`` say whether *anyone* holds the lock;
        this one is redis-py's ``owned()`` (also here, under that name). Whether anyone holds it:
        ``holder() is not None``.
        """
        return self._token is not None

    def owned(self) -> bool:
        """The same as :meth:`locked`: True while this object holds the lock (redis-py's name)."""
        return self.locked()

    @property
    def leased(self) -> bool:
        """True while this object holds the lock with a lease (it heartbeats; waiters may break it)."""
        return self._heartbeat is not None

    def ensure_held(self, read: bool = False) -> None:
        """Raise :class:`~.errors.MutexLostError` unless this object still holds the lock, as far as it can
        tell: the heartbeat has not seen it taken, and (with a lease) a heartbeat was confirmed less than a
        lease ago, so no waiter can have broken it yet. ``read=True`` adds one fresh read of the owner (and
        one more a second later when it does not show ours: a fresh read may lag behind the server).

        Call it right before each side effect of a long critical section: it costs no call by default.
        """
        if self._token is None:
            raise MutexUsageError(
                f"this ReservationMutex does not hold {self.name!r} in reservation {self.reservation_id}: "
                "acquire it first",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
        beat = self._heartbeat
        if beat is not None and beat.lost:
            raise self._lost_notice(beat.lost_to)
        if beat is not None and beat.expired:
            raise self._expired_notice()
        if beat is not None and beat.lapsed(self._clock()):
            silent = self._clock() - beat.confirmed_at
            how_long = (
                f"since it was adopted (lease {beat.lease:g} s)"
                if math.isinf(silent)
                else f"for {silent:.1f} s, longer than the lease ({beat.lease:g} s)"
            )
            raise MutexLostError(
                f"{self.name!r} in reservation {self.reservation_id}: no heartbeat was confirmed {how_long}; "
                "a waiter may have broken the lock. Stop the work done under it; release() tells whether "
                "it was",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
        if read:
            result = self._alias.read()
            if result.ok and (result.holder is None or result.holder.token != self._token):
                # A fresh read may lag and show the lock as it was before it was ours: ask once more,
                # FRESH_READ_LAG later, before calling it lost (as release() does).
                self._sleep(FRESH_READ_LAG)
                result = self._alias.read()
            if not result.ok:
                raise self._diagnose(result.failure, "checking the lock owner")
            if result.holder is None or result.holder.token != self._token:
                notice = self._lost_notice(result.holder)
                if beat is not None:  # release() then reports nothing more: tell the output now
                    beat.lost, beat.lost_to = True, result.holder
                    self._tell_lost(result.holder.label if result.holder else None)
                raise notice

    @property
    def generation(self) -> int:
        """An advisory fencing number: larger for every later acquisition of this lock in this reservation
        that asks for it. The first ask per acquisition reads and bumps a counter service
        (``<alias>~generation``, ``Mutex Generation``) under the lock: 2 calls (3 the first time in a
        reservation); an acquisition that never asks costs nothing.

        CloudShell does not check it. A protected resource that wants fencing must remember the largest
        generation it has seen and refuse requests that carry a smaller one (docs/protocol.md, "Fencing").
        Needs our Mutex_Package (the model with ``Mutex Generation``); raises
        :class:`~.errors.MutexUsageError` on a model without it, and :class:`~.errors.MutexLostError` when
        the lock is not held any more.
        """
        if self._generation is None:
            self.ensure_held()
            try:
                self._generation = fencing.bump_generation(self._counter, self.name)
            except fencing.CounterRefused as refused:
                error = MutexUsageError(str(refused), reservation_id=self.reservation_id, alias=self.name)
                raise self._news.error(error, self._operation(self._token or "")) from None
            except fencing.CounterFailed as failed:
                raise self._diagnose(failed.failure, failed.doing) from None
            self.ensure_held()  # the number is worth something only if we still held the lock meanwhile
        return self._generation

    def export(self) -> str:
        """A short string that lets another process join this acquisition (:meth:`adopt`).

        Safe to pass as a driver command's input (letters, digits, ``-_.``); it holds no credentials. Both
        sides then heartbeat the same lease, and either may release; the other notices (its heartbeat finds
        the lock gone: ``on_lost``, :meth:`ensure_held`). Export only while held.
        """
        if self._token is None:
            raise MutexUsageError(
                f"export() needs the lock held: acquire {self.name!r} first",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
        lease_seconds = self._heartbeat.lease if self._heartbeat is not None else 0.0
        info = HandleInfo(self.reservation_id, self.name, self.options.model, self._token, lease_seconds)
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
        mutex._adopt(info.token)
        return mutex

    def _adopt(self, token: str, until: Optional[float] = None) -> None:
        """Hold ``token`` after one read shows it (:meth:`adopt`). ``until`` (monotonic): transient read
        failures are backed off and read again until then, as an acquire's reads are (None: one read)."""
        op = self._operation(token)
        read = self._read(op)
        while not read.ok and read.failure.kind is ErrorKind.TRANSIENT and until is not None:
            op.failed(read.failure.message)
            now = self._clock()
            if now >= until:
                break
            self._sleep(min(op.next_backoff(self.backoff, self._rng), until - now))
            read = self._read(op)
        if not read.ok:
            raise self._diagnose(read.failure, "reading the lock to adopt it")
        holder = read.holder
        if holder is None or holder.token != token:
            op.see_holder(holder)
            error = MutexLostError(
                f"cannot adopt {self.name!r} in reservation {self.reservation_id}: it is not held by the "
                f"handle's acquisition ({token}) any more; it is held by {op.holder_label or 'nobody'}",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
            raise self._news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)
        self._token = token
        self._depth = 1
        self._confirmed_at = read.sent_at
        holder_lease = lease.lease_of(holder)
        # The lease is the service's, whatever this object's own ``lease`` option says: a party that holds a
        # leased lock and never heartbeats would have it broken under it by the first waiter.
        if holder_lease is not None and protocol.ATTR_HEARTBEAT in holder.attributes:
            self._start_heartbeat(token, float("-inf"), holder_lease)
            self._first_own_beat(holder_lease)
        self._news.event(events.ACQUIRED, op, error="adopted")
        self._news.log(
            logging.INFO, "adopted %s in reservation %s (%s)", self.name, self.reservation_id, token
        )

    def _first_own_beat(self, holder_lease: float) -> None:
        """An adopted lock's first heartbeat of our own. Until one lands we cannot tell when the service's
        last heartbeat was written, so the lease counts as lapsing any moment (ensure_held() raises), and the
        thread's next try is lease/3 away: a failed one is tried again at once, a few times (without this, a
        reader that joined a read group on a flaky server was told its lock may be lost at its release)."""
        beat, pause = self._heartbeat, holder_lease / 30
        for _ in range(ADOPTED_BEAT_TRIES if beat is not None else 0):
            result = beat.beat()
            if result.ok or result.lost:
                return
            self._sleep(pause)
            pause *= 2

    # ------------------------------------------------------------------ cohort hand-off (lock/cohort.py)

    def _cohort_join(self, token: str, confirmed_at: float, lease_seconds: float) -> None:
        """Hold the acquisition ``token`` that another process on this machine passed on, without a call
        (a trusted adopt). The cohort's state says its last confirmation (:meth:`_cohort_confirmed_at`)
        was sent at ``confirmed_at`` on this machine's monotonic clock, recently enough that no waiter can
        have broken it; the heartbeat goes on from there, keeping the passer's schedule."""
        self._token = token
        self._depth = 1
        self._confirmed_at = confirmed_at
        if lease_seconds > 0:
            due = confirmed_at + lease_seconds / 3 - self._clock()
            self._start_heartbeat(token, confirmed_at, lease_seconds, first_delay=due)
        op = self._operation(token)
        self._news.event(events.ACQUIRED, op, error="passed within the cohort")

    def _cohort_pass(self) -> Optional[Tuple[str, float, float]]:
        """Stop holding without removing the service, so that another process on this machine can
        :meth:`_cohort_join` it: stops the heartbeat and forgets the token. Returns (token, last
        confirmation, lease seconds), or None when the lock must not be passed (not held, nested, lost,
        the lease may have lapsed, or an add of it may still land): then release() it."""
        beat = self._heartbeat
        if self._token is None or self._depth != 1 or self._late_add_by is not None:
            return None
        if self._release_op is not None:  # a release that failed: its remove may still land
            return None
        if beat is not None and (beat.lost or beat.expired or beat.lapsed(self._clock())):
            return None
        if beat is not None:
            beat.stop()
            if beat.lost:  # the round that was running found it taken
                return None
        token = self._token
        confirmed = self._cohort_confirmed_at()
        lease_seconds = beat.lease if beat is not None else 0.0
        op = self._operation(token)
        self.detach()
        self._news.event(events.RELEASED, op, error="passed within the cohort")
        return token, confirmed, lease_seconds

    def _cohort_confirmed_at(self) -> float:
        """When this lock was last confirmed in a way that counts for a local successor's trust window.

        With a lease, only the send time of the write that put the current heartbeat value there (the add,
        or the last beat): a waiter on another machine judges staleness from that value, however many
        reads showed the token since. A read is not a heartbeat. Without a lease nothing but Force Release
        takes the lock, so the last read that showed our token counts as well."""
        beat = self._heartbeat
        if beat is not None:
            return beat.confirmed_at
        return self._confirmed_at

    def renew(self) -> bool:
        """One heartbeat now (a fresh read, and a write while the lock is ours); True when it was written.
        The background thread does this about every lease/3; long critical sections may call it too."""
        if self._heartbeat is None:
            return False
        return self._heartbeat.beat().ok

    def holder(self) -> Optional[Holder]:
        """Who holds the lock now, this object or anyone else (one fresh, uncached read), or None when it is
        free: ``holder() is not None`` is what threading's and redis-py's ``locked()`` answer."""
        op = self._operation(self._token or "")
        result = self._read(op)
        if not result.ok:
            raise self._diagnose(result.failure, "reading the lock holder")
        return result.holder

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Take the lock.

        Blocking (the default), it returns True once held, or raises :class:`~.errors.MutexTimeout`
        when ``timeout`` (default: the constructor's) runs out: it never returns without the lock.
        With ``blocking=False`` it makes exactly one add attempt and returns False when the lock is
        busy (a timeout cannot be given then). Fatal problems raise at once (see :mod:`.errors`).
        """
        if timeout is UNSET:
            timeout = self.timeout
        elif not blocking:
            raise ValueError("a non-blocking acquire cannot have a timeout; leave timeout out")
        check_duration("timeout", timeout, allow_none=True)
        if self._token is not None:
            if self.options.reentrant:
                self._depth += 1
                return True
            raise MutexUsageError(
                f"this ReservationMutex already holds {self.name!r} in reservation {self.reservation_id}; "
                "release it first, pass reentrant=True to allow nesting, or use one object per task",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
        op = self._operation(self._new_token())
        op.deadline = op.start if not blocking else (None if timeout is None else op.start + timeout)
        op.cancellable = blocking
        try:
            acquired = self._acquire(op, blocking)
        except CancelledWait:
            # The caller stopped waiting. An add of ours may be in place: take back what a read shows, as
            # after Ctrl-C. Either way, an add that may still land goes to the watcher, as on timeout.
            if op.add_pending or op.add_can_land(self._clock()):
                self._abandon(op)
            else:
                self._watch_late_add(op)
            error = diagnosis.cancelled_error(op, self._clock(), self.reservation_id, self.name)
            raise self._news.error(
                error, op, events.CANCELLED, logging.WARNING, holder=error.holder
            ) from None
        except Exception:
            self._watch_late_add(op)
            raise
        except BaseException:
            # Ctrl-C (or SystemExit) while an add was on the wire, or just after it: the add may
            # have committed, or still commit, with nobody left to release it. Undo what a read shows.
            self._abandon(op)
            raise
        finally:
            if self._queue is not None:
                self._queue.leave()  # acquired or not: our place in the queue is given up
        if not acquired:
            self._watch_late_add(op)
        return acquired

    def release(self) -> None:
        """Release the lock if this object holds it; otherwise do nothing (idempotent).

        Raises :class:`~.errors.MutexLostError` when the lock turned out not to be ours any more
        (nothing is removed), and :class:`~.errors.MutexReleaseError` when the remove kept failing
        (the object still holds the lock then, so release() can be called again).
        """
        if self._token is None:
            self._news.log(logging.DEBUG, "release of %s: not held by this object, nothing to do", self.name)
            return
        if self._depth > 1:
            self._depth -= 1
            return
        beat = self._heartbeat
        earlier_remove = self._release_op is not None and self._release_op.remove_may_have_landed
        if beat is not None:
            if beat.lost and not earlier_remove:
                # The heartbeat saw the lock taken: nothing of ours is there to remove.
                beat.stop()
                error = self._lost_notice(beat.lost_to, report=False)
                self._forget()
                raise error
            # The heartbeat goes on until the release is settled (_forget stops it): a remove of ours whose
            # outcome is unknown may land up to request_lifetime later, and a lease left silent meanwhile
            # would let a waiter break the lock and take it, only for our remove to delete the waiter's.
            beat.releasing = True
        # A release() after a failed one continues it: what the first learned (a remove of ours that
        # may still land) must not be forgotten, or the next remove could delete a successor's lock.
        op = self._release_op or self._operation(self._token)
        self._release_op = op
        # Release only what you hold. The remove cannot check the owner, so read first (unless the
        # opt-in release_check_after says ownership was confirmed a moment ago, and nothing of an
        # earlier remove is unsettled).
        check_after = self.options.release_check_after
        check = check_after <= 0 or op.start - self._confirmed_at >= check_after or op.remove_may_have_landed
        failures = 0
        while True:
            if check:
                read = self._read(op)
                if not read.ok:
                    failures += 1
                    if self._release_failure(op, read.failure, failures, "checking the lock owner"):
                        return
                    continue
                op.see_holder(read.holder)
                if not op.is_ours(read.holder):
                    # Gone, or someone else's: a remove of ours took effect, or the lock was taken
                    # from us. Either way nothing of ours is left to remove.
                    if op.remove_may_have_landed:
                        # Unless the read may lag behind that remove: then it may show the lock as it was
                        # before we held it, while our remove is still on its way (found by make stress).
                        # Also for a remove that failed without a later landing: it may not have
                        # committed at all (found by make stress: a lock left behind until a lease break).
                        settled_at = (op.remove_sent_at or float("-inf")) + FRESH_READ_LAG
                        if read.sent_at < settled_at:
                            self._sleep(max(0.0, settled_at - self._clock()))
                            continue
                        return self._released(op)
                    if not op.lag_checked:
                        # A fresh read may lag behind the commits: ask once more before calling it lost.
                        op.lag_checked = True
                        self._sleep(FRESH_READ_LAG)
                        continue
                    raise self._lost(op)
                now = self._clock()
                if op.remove_can_land(now):
                    # Still ours, but our earlier remove may still land: a second remove now could
                    # land after a waiter took the lock, and delete the waiter's. Read again later.
                    self._sleep(op.next_poll(self.pacing, self._rng))
                    continue
                op.still_ours_at(now)
            # The remove, sent once: the client's own re-send could delete a successor's lock.
            op.remove_sent_at = self._clock()
            try:
                result = self._alias.remove_once()
            except BaseException:
                # Ctrl-C (or SystemExit) while the remove was on its way: it may still land. A release()
                # after this one continues this operation, so it waits for that instead of removing again.
                op.remove_unsettled(True, self._clock() + self.options.request_lifetime)
                raise
            if result.ok:
                return self._released(op)
            if result.status is Status.MISSING:
                # "Not found" after a re-send of ours: our remove took effect. Otherwise the alias
                # was gone before we removed it: the lock had been taken from us.
                if op.remove_may_have_landed or result.resent:
                    return self._released(op)
                op.see_holder(None)
                raise self._lost(op)
            check = True  # never remove again before a fresh read shows the alias is still ours
            if result.may_land_later:
                op.remove_unsettled(True, self._clock() + self.options.request_lifetime)
                continue  # not a failure yet: the reads above tell whether it lands
            op.remove_unsettled(result.may_have_committed)
            failures += 1
            if self._release_failure(op, result.failure, failures, "removing the lock service"):
                return

    def detach(self) -> None:
        """Stop holding without removing the service (no call): for an acquisition shared with other
        participants (:meth:`adopt`, a read group of :class:`~.rwlock.ReservationRWLock`) when another
        participant removes it. The heartbeat stops; an add that may still land goes to the watcher."""
        if self._token is not None:
            self._forget()

    def stop_heartbeat(self) -> None:
        """Stop heartbeating (no call) while the lock stays held by this object: for a participant of a
        shared acquisition whose share ends before the lock is removed (a reader leaving its read group), so
        that its heartbeat does not report the lock lost when another participant removes it."""
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def _new_token(self) -> str:
        """The owner token of a new acquisition (a lock that marks its tokens overrides this)."""
        return make_token(self.owner)

    def __enter__(self) -> ReservationMutex:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # A failed release is raised even when the block raised: a lock that may still be held or
        # was lost must not go unnoticed. Python chains the block's exception as __context__.
        self.release()

    def __repr__(self) -> str:
        state = f"held as {self._token!r}" if self._token else "not held"
        return f"<ReservationMutex {self.name!r} reservation={self.reservation_id} {state}>"

    # ------------------------------------------------------------------ acquire steps

    def _acquire(self, op: Operation, blocking: bool) -> bool:
        queue = self._queue if blocking else None
        if queue is not None:
            # Others were waiting at our last read: line up behind them (progress written meanwhile).
            queue.before_first_add(op, lambda: self._write_progress(op, self._clock()))
        while True:
            # Step 1: the add. Its success is the lock; the owner token travels in the same call.
            op.add_sent()
            add = self._alias.add_owner(
                op.token,
                self.owner,
                lease=self.options.lease,
                heartbeat=self._first_beat(op.token),
                paced=op.polling,
                deadline=op.deadline,
            )
            op.add_returned()
            if not add.ok and add.may_have_committed:
                op.add_unknown(add.sent_at)
            if add.may_land_later:
                lands_by = add.lands_by(self.options.request_lifetime)
                op.add_in_flight(lands_by, add.unanswered_copies)
            if add.ok:
                if not self.options.verify or self._verified(op):
                    return self._acquired(op, add.sent_at, lease_from=add.sent_at)
                delay = op.next_pause(self.pacing, self._rng)
            elif add.status is Status.BUSY:
                # Step 2: contention. It may be our own add, re-sent by the client after it had
                # committed (``add.resent``). So the first contention, a slow one, or any after an
                # unknown outcome reads the owner; later ones do so every holder_check_interval.
                if self._on_contention(op, add):
                    return self._acquired(op, op.last_read_at or add.sent_at, resolved=True)
                # Freed since the add failed (the read found nobody), or a stale holder broken: retry at once.
                freed = (op.read_since_add and op.holder is None) or self._break_if_stale(op)
                delay = 0.0 if freed else op.next_pause(self.pacing, self._rng)
                if queue is not None and not freed:
                    # The fair mode: wait in line, or poll as the head.
                    delay = queue.pause(op, delay, lambda: self._write_progress(op, self._clock()))
            elif add.status is Status.TRANSIENT:
                # Step 3: transient failure (5xx, dropped connection, timeout). Back off on a
                # separate schedule, then settle with one fresh read: the add may have committed.
                if self._on_transient(op, add):
                    return self._acquired(op, op.last_read_at or add.sent_at, resolved=True)
                delay = 0.0  # already backed off
            else:
                # Step 4: fatal. A refusal by the server committed nothing, but another failure
                # (a 2xx reply without a readable body), or an earlier unknown outcome, may have
                # left our add in place: never raise while holding. Settle with one read first.
                op.add_may_be_pending(add.may_have_committed)
                if op.add_pending and self._settled_as_ours(op):
                    return self._acquired(op, op.last_read_at or add.sent_at, resolved=True)
                raise self._fatal(op, add.failure, "adding the lock service", probe=True)
            op.start_polling()  # from here on, this acquisition's calls wait on the budget

            # Step 5: never proceed without the lock. At the deadline, settle and raise.
            now = self._clock()
            if op.deadline is not None and now >= op.deadline:
                return self._give_up(op, blocking)
            self._write_progress(op, now)
            self._pause(op, clip(delay, now, op.deadline))  # a caller that cancels is heard here

    def _pause(self, op: Operation, seconds: float) -> None:
        """Sleep between tries. A blocking acquire's caller may cancel meanwhile: checked now and every half
        second (no call), raising :class:`~.pacing.CancelledWait`, which acquire() turns into
        :class:`~.errors.MutexCancelled` after taking back what the acquisition left."""
        pause(seconds, self._sleep, self._cancelled if op.cancellable else None)

    def _on_contention(self, op: Operation, add: CallResult) -> bool:
        """Handle "already exists"; return True when the holder turns out to be this acquisition."""
        op.contended(add.sent_at)
        if add.resent or op.read_due(self._clock(), self.options.holder_check_interval):
            holder = self._poll_read(op, "reading the lock holder")
            if holder is _UNREAD:
                return False  # read again later
            if op.settled_by(holder):
                return True
            if holder is None:
                self._refuse_namesake(op)
            self._note_holder(op, holder)
            self._watch.observe(holder, op.last_read_at)  # the lease judgement: this waiter's own clock
        if op.contentions == 1:
            self._news.event(events.CONTENDED, op, holder=op.holder_label)
            self._news.log(
                logging.INFO,
                "%s in reservation %s is held by %s; waiting",
                self.name,
                self.reservation_id,
                op.holder_label or "another owner",
            )
        return False

    def _refuse_namesake(self, op: Operation) -> None:
        """The add said "already exists" and a read shows no service under our alias: if it shows one under
        another spelling of it, the server takes them alike (case-blind), and waiting would never end (each
        read would show the lock free, each add would be refused)."""
        other = namesake(self._last_services, self.name)
        if other is not None:
            raise self._news.error(diagnosis.namesake_error(self.reservation_id, self.name, other), op)

    def _on_transient(self, op: Operation, add: CallResult) -> bool:
        """Back off after a transient failure, then settle an unknown outcome with one fresh read."""
        op.failed(add.failure.message)
        # "Never sent" describes the client's last copy only; an earlier, re-sent one may have committed.
        op.add_may_be_pending(add.may_have_committed)
        self._news.event(events.TRANSIENT, op, error=add.failure.message)
        self._news.log(
            logging.WARNING, "transient CloudShell API failure (%s); backing off", add.failure.message
        )
        self._pause(op, clip(op.next_backoff(self.backoff, self._rng), self._clock(), op.deadline))
        if not op.add_pending:
            return False
        holder = self._poll_read(op, "reading the lock holder")
        if holder is _UNREAD:
            return False  # still unknown: the next add (or the final read) will tell
        if op.settled_by(holder):
            return True
        if holder is not None:
            op.saw_contention(add.sent_at)
            self._note_holder(op, holder)
        return False

    def _settled_as_ours(self, op: Operation) -> bool:
        """Before raising a fatal error: one fresh read, its own failure ignored. True when it shows
        our token (an earlier add committed after all); a read showing anything else ends the doubt."""
        read = self._read(op)
        if not read.ok:
            op.last_error = read.failure.message
            return False
        return op.settled_by(read.holder)

    def _verified(self, op: Operation) -> bool:
        """verify=True: read the owner back after a successful add (the original v2's defence
        against a server that grants twice). One more call per acquisition."""
        holder = self._poll_read(op, "verifying the lock owner")
        if holder is _UNREAD:
            # The add succeeded, which is the protocol's definition of holding the lock.
            self._news.log(
                logging.WARNING, "could not verify the owner (%s); the add succeeded", op.last_error
            )
            return True
        if op.is_ours(holder):
            return True
        self._news.log(
            logging.WARNING,
            "the add of %s succeeded but the owner read back is %s; not treating the lock as held",
            self.name,
            holder.label if holder else "nobody",
        )
        op.saw_contention(self._clock())
        self._note_holder(op, holder)
        return False

    def _give_up(self, op: Operation, blocking: bool) -> bool:
        # Never raise while holding: if nothing was read since the last add, one final fresh read
        # (no sleep) settles whether that add, or an earlier one whose reply was lost, made us the owner.
        if not op.read_since_add:
            holder = self._poll_read(op, "reading the lock holder")
            if holder is not _UNREAD:
                if op.settled_by(holder):
                    return self._acquired(op, op.last_read_at or self._clock(), resolved=True)
                self._note_holder(op, holder)
        # blocking=False answers False only for "busy". A failing API is not "busy" (the original's
        # mistake): that raises, like a blocking acquire that ran out of time.
        busy = op.contentions > 0 or op.holder is not None
        if not blocking and busy and not op.add_pending:
            self._news.log(logging.DEBUG, "%s is busy; not waiting (blocking=False)", self.name)
            return False
        note = ""
        if op.holder is not None and lease.lease_of(op.holder) is None:
            note = (
                "; the holder has no lease (the original protocol, a model without the lease attributes, or "
                "lease=0), so it is never broken automatically: if its process is gone, an administrator "
                "removes it with Force Release (cloudshell-mutex release --force)"
            )
        error = diagnosis.timeout_error(op, self._clock(), self.reservation_id, self.name, note)
        raise self._news.error(error, op, events.TIMEOUT, logging.WARNING, holder=error.holder)

    def _acquired(
        self, op: Operation, confirmed_at: float, resolved: bool = False, lease_from: Optional[float] = None
    ) -> bool:
        self._token = op.token
        self._depth = 1
        self._confirmed_at = confirmed_at
        # A waiter saw our service no earlier than the add that made it was sent. One resolved by a read was
        # made by an add whose outcome we did not see, the first of which is known (counting from the start
        # of the whole wait gave up, as lapsed, a lock just taken after waiting longer than the lease).
        if lease_from is None:
            lease_from = op.start if op.unknown_add_since is None else op.unknown_add_since
        self._start_heartbeat(op.token, lease_from)
        self._late_add_by = op.add_lands_by if op.add_can_land(self._clock()) else None
        self._late_copies = op.add_unanswered
        if resolved:
            self._news.event(events.RESOLVED, op)
            self._news.log(logging.INFO, "an earlier add of %s turned out to have succeeded", self.name)
        self._news.event(events.ACQUIRED, op)
        self._news.log(
            logging.INFO,
            "acquired %s in reservation %s as %s after %.2f s (%d adds, %d calls)",
            self.name,
            self.reservation_id,
            op.token,
            self._clock() - op.start + self._waited_before,
            op.adds,
            self._news.calls_of(op),
        )
        return True

    def _abandon(self, op: Operation) -> None:
        """After an interrupt inside acquire() (Ctrl-C, or the caller's cancellation): remove our add if a
        read shows it, and hand an add that may still land to the late-add watcher (which warns at exit if it
        cannot settle it)."""
        if op.adds == 0:
            return
        if op.awaiting_add:  # interrupted before the add answered: it may land any time now
            op.add_in_flight(self._clock() + self.options.request_lifetime)
        read = self._alias.read()
        if read.ok and op.settled_by(read.holder):  # one copy of our add landed: the others land after it
            result = self._alias.remove_once()
            if result.ok:
                self._news.log(logging.WARNING, "acquire interrupted; removed its add of %s", self.name)
            else:  # the watcher reads again and removes it
                op.add_in_flight(self._clock() + self.options.request_lifetime)
        elif not read.ok and op.add_pending:
            op.add_in_flight(self._clock() + self.options.request_lifetime)
        self._watch_late_add(op)

    def _write_progress(self, op: Operation, now: float) -> None:
        if not self.options.progress or not op.progress_due(now, self.options.progress_interval):
            return
        held = now - (op.holder_since if op.holder_since is not None else op.start)
        message = (
            f"{sanitize_label(self.owner)}: waiting for {self.name} held by "
            f"{op.holder_label or 'another owner'} for {held:.0f} s"
        )
        # Progress is a courtesy; the next add reports real problems.
        result = self._alias.write_output(message, paced=op.polling, deadline=op.deadline)
        if not result.ok:
            self._news.log(
                logging.DEBUG, "could not write progress to the reservation output: %s", result.failure
            )

    # ------------------------------------------------------------------ release steps

    def _release_failure(self, op: Operation, failure: Classification, failures: int, doing: str) -> bool:
        """The ``failures``-th failed call in release(): back off and return False to try again
        (transient), return True when the reservation has ended (released: the lock went with it),
        raise otherwise. The object then still holds the lock, and its next release() continues."""
        if failure.kind is ErrorKind.TRANSIENT and failures < self.options.release_attempts:
            op.failed(failure.message)
            self._news.event(events.TRANSIENT, op, error=failure.message)
            self._sleep(op.next_backoff(self.backoff, self._rng))
            return False
        # Whatever the server's words: a reservation that has ended took the lock with it.
        if diagnosis.needs_state(failure) and self._alias.reservation_state() in ("ended", "missing"):
            self._released(op, note="the reservation has ended; the lock went with it")
            return True
        if failure.kind is ErrorKind.TRANSIENT:
            doing = f"{doing} ({failures} failed calls)"
        error = diagnosis.release_error(op, failure, doing, self.reservation_id, self.name)
        raise self._news.error(error, op)

    def _released(self, op: Operation, note: Optional[str] = None) -> None:
        token = self._token
        self._forget()
        self._news.event(events.RELEASED, op, error=note)
        self._news.log(
            logging.INFO,
            "released %s in reservation %s (%s)%s",
            self.name,
            self.reservation_id,
            token,
            f": {note}" if note else "",
        )

    def _lost(self, op: Operation) -> MutexError:
        self._forget()
        error = diagnosis.lost_error(op, self.reservation_id, self.name)
        self._tell_lost(op.holder_label)
        return self._news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)

    def _tell_lost(self, holder_label: Optional[str]) -> None:
        """One warning line in the sandbox output: the people watching it see that a held lock was lost
        (broken by a waiter, force-released, removed by other code), not only the log."""
        message = (
            f"{sanitize_label(self.owner)} lost the {self.name} lock it held: it is now held by "
            f"{holder_label or 'nobody'} (a lease break, a Force Release, or code that removed it). The "
            "work done under it may not have been exclusive"
        )
        if not self._alias.write_output(message, warning=True).ok:
            self._news.log(logging.DEBUG, "could not write the lost lock to the reservation output")

    def _forget(self) -> None:
        """This object no longer holds the lock (released, lost, or an acquire abandoned). An add of
        the acquisition that may still land is handed to the late-add watcher first."""
        if self._token is not None and self._late_add_by is not None:
            self._late_adds.watch(
                self._alias, self._token, self._late_add_by, self.options.request_lifetime, self._late_copies
            )
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self._token = None
        self._generation = None
        self._depth = 0
        self._confirmed_at = float("-inf")
        self._late_add_by = None
        self._release_op = None

    def _watch_late_add(self, op: Operation) -> None:
        """An acquire that ends without the lock: an add of it that may still land is watched, and so,
        for as long as fresh reads may lag, is one whose outcome it could not see."""
        now, lifetime = self._clock(), self.options.request_lifetime
        if op.add_can_land(now):
            self._late_adds.watch(self._alias, op.token, op.add_lands_by, lifetime, op.add_unanswered)
        elif op.unsure_add:
            self._late_adds.watch(self._alias, op.token, now + 2 * FRESH_READ_LAG, lifetime)

    # ------------------------------------------------------------------ leases

    def _first_beat(self, token: str) -> str:
        nonce = lease.nonce_of(token) or token
        return lease.heartbeat_value(nonce, self._part, 0) if self.options.lease > 0 else ""

    def _start_heartbeat(
        self,
        token: str,
        confirmed_at: float,
        lease_seconds: Optional[float] = None,
        first_delay: Optional[float] = None,
    ) -> None:
        """With a lease on a model that takes it: heartbeat (a daemon thread on the real clock; with a
        virtual clock, tests call renew()). ``lease_seconds``: an adopted lock's lease, from its service."""
        max_hold = self.options.max_hold
        if lease_seconds is None:
            if self.options.lease <= 0 or not self._alias.takes(protocol.ATTR_HEARTBEAT):
                if max_hold is not None:
                    self._news.log(
                        logging.WARNING,
                        "max_hold (%g s) has no effect on %s: the server's Mutex Service model has no lease "
                        "attributes (the original package), so nobody can break the lock; import "
                        "cloudshell-mutex's Mutex_Package.zip",
                        max_hold,
                        self.name,
                    )
                return
            lease_seconds = self.options.lease
        self._heartbeat = Heartbeat(
            self._alias,
            token,
            lease_seconds,
            confirmed_at,
            part=self._part,
            clock=self._clock,
            rng=self._rng,
            on_lost=self._on_heartbeat_lost,
            on_danger=self._on_danger,
            logger=self.logger,
            renew_until=None if max_hold is None else self._clock() + max_hold,
            on_expired=self._on_expired,
        )
        self._heartbeat.count = 0
        if self._clock is time.monotonic:
            self._heartbeat.start(first_delay)

    def _lost_notice(self, holder: Optional[Holder], report: bool = False) -> MutexLostError:
        op = self._operation(self._token or "")
        op.see_holder(holder)
        error = diagnosis.lost_error(op, self.reservation_id, self.name, by_heartbeat=True)
        if report:
            self._news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)
        return error

    def _on_heartbeat_lost(self, holder: Optional[Holder]) -> None:
        error = self._lost_notice(holder, report=True)
        self._tell_lost(holder.label if holder is not None else None)
        if self.options.on_lost is not None:
            self.options.on_lost(error)

    def _expired_notice(self) -> MutexLostError:
        beat = self._heartbeat
        lease_seconds = beat.lease if beat is not None else self.options.lease
        return diagnosis.expired_error(
            self.options.max_hold or 0.0, lease_seconds, self.reservation_id, self.name
        )

    def _on_expired(self) -> None:
        """max_hold passed (the heartbeat thread): renewal stopped. Say so in the log, the events, the sandbox
        output and ``on_lost``: the holder's command may be stuck, and waiters break the lock soon."""
        error = self._expired_notice()
        op = self._operation(self._token or "")
        self._news.error(error, op, events.EXPIRED, logging.WARNING)
        message = f"{sanitize_label(self.owner)}: {error}"
        if not self._alias.write_output(message, warning=True).ok:
            self._news.log(logging.DEBUG, "could not write the expired lease to the reservation output")
        if self.options.on_lost is not None:
            self.options.on_lost(error)

    def _on_danger(self, silent: float) -> None:
        op = self._operation(self._token or "")
        message = (
            f"no heartbeat of {self.name!r} confirmed "
            f"{'since it was adopted' if math.isinf(silent) else f'for {silent:.1f} s'} (lease "
            f"{self.options.lease:g} s): the lease may lapse; finish or stop the work done under the lock"
        )
        self._news.event(events.DANGER, op, error=message)
        self._news.log(logging.WARNING, "%s", message)
        if self.options.on_danger is not None:
            self.options.on_danger(silent)

    def _break_if_stale(self, op: Operation) -> bool:
        """After a read while waiting: judge the holder on this waiter's own clock; when it is stale (a lease,
        and the same token and heartbeat for lease + margin), break it as the only breaker. True when the
        stale holder is gone (retry the add at once)."""
        if not op.read_since_add or self._watch.holder is None:
            return False
        now = self._clock()
        if not self._watch.stale(now):
            return False
        stale = self._watch.holder
        seen = self._watch.unchanged_for(now)
        result = self._breaker.break_holder(self._alias, self._watch)
        if not result.broken:
            self._news.log(logging.DEBUG, "did not break %s: %s", self.name, result.why)
            return result.why == "the holder went away by itself"
        message = diagnosis.broke_stale(
            self.owner, "lock", self.name, stale, lease.lease_of(stale) or 0, seen
        )
        self._news.event(events.BROKEN, op, holder=stale.label, error=message)
        self._news.log(logging.WARNING, "%s", message)
        written = self._alias.write_output(message, warning=True)
        if not written.ok:
            self._news.log(logging.DEBUG, "could not write the break to the reservation output")
        return True

    # ------------------------------------------------------------------ shared helpers

    def _operation(self, token: str) -> Operation:
        return Operation(token, self._clock(), calls_at_start=self._alias.calls)

    def _read(self, op: Operation) -> CallResult:
        """One fresh read of the holder, recorded in ``op``; a read showing our token confirms that
        the lock is still ours."""
        result = self._alias.read(paced=op.polling, deadline=op.deadline)
        self._last_services = result.services or {}
        op.read_tried(result.sent_at)
        if self._queue is not None:
            self._queue.saw(result)  # who waits, remembered for this process's next acquisition
        if result.ok:
            op.read_answered(result.sent_at)
            if self._token is not None and result.holder is not None and result.holder.token == self._token:
                self._confirmed_at = result.sent_at
        return result

    def _poll_read(self, op: Operation, doing: str) -> Any:
        """A fresh read while acquiring: the holder (or None), or ``_UNREAD`` after a transient
        failure (recorded in ``op``). Fatal failures raise."""
        result = self._read(op)
        if result.ok:
            return result.holder
        if result.status is not Status.TRANSIENT:
            raise self._fatal(op, result.failure, doing)
        op.failed(result.failure.message)
        self._news.log(logging.DEBUG, "fresh read failed (%s)", result.failure.message)
        return _UNREAD

    def _note_holder(self, op: Operation, holder: Optional[Holder]) -> None:
        if op.see_holder(holder):
            self._news.event(events.CONTENDED, op, holder=op.holder_label)
            self._news.log(logging.INFO, "%s is now held by %s", self.name, op.holder_label)

    def _fatal(self, op: Operation, failure: Classification, doing: str, probe: bool = False) -> MutexError:
        error = self._diagnose(failure, doing, probe)
        if op.add_pending:  # an add of ours may have committed, and no read could tell
            diagnosis.note_pending_add(error, self.name, op.token)
        return self._news.error(error, op)

    def _diagnose(self, failure: Classification, doing: str, probe: bool = False) -> MutexError:
        """Turn a fatal failure into an error that says what to do (see :mod:`.diagnosis`).

        The reservation's state is read when the failure could mean it is gone; a refused add on an
        active reservation is followed by one add *without* attributes, which tells, whatever the
        server's wording, whether the model is missing or only lacks ``Mutex Owner``.
        """
        state = self._alias.reservation_state() if diagnosis.needs_state(failure) else None
        # Only a refusal about the model, or one with the generic code whose words are unknown.
        about_model = failure.kind is ErrorKind.NOT_INSTALLED or (
            failure.kind is ErrorKind.FATAL and failure.code == protocol.CONTENTION_ERROR_CODE
        )
        probed = self._alias.probe_model() if probe and state in ("active", None) and about_model else None
        model = self.options.model
        return diagnosis.fatal_error(failure, doing, self.reservation_id, self.name, model, probed, state)


#: ``_poll_read``'s answer when the read failed transiently (None means "read: the alias is free").
_UNREAD: Any = object()
