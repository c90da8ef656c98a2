"""The acquisition a lock object holds now: its token, its heartbeat, and what it tells when it is lost.

A :class:`Held` exists from the moment an acquire (or a take-over, or an adopt) makes the lock ours until
the release is settled. It is state, not policy: the release loop (:mod:`.release`) decides when it ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from .. import diagnosis, events, protocol
from ..engine import Acquisition, Wait
from ..errors import MutexLostError
from ..holder import Holder
from ..lease import lease
from ..lease.heartbeat import Heartbeat
from ..operation import Operation
from ..options import FRESH_READ_LAG
from ..server.alias import CallResult, LockAlias
from .core import LockCore

#: How many times an adopted lock tries its first heartbeat of its own before leaving it to the thread.
ADOPTED_BEAT_TRIES = 3


class Held:
    """One held acquisition of one lock object (see the module docstring).

    ``confirmed_at`` is when a fresh answer from the server last showed the lock is ours (the add, or a
    read). ``depth`` counts nested acquires of a reentrant lock. ``late_add_by``: until then an earlier add
    of this acquisition, sent without an answer, may still land (``late_copies`` of it). ``release_op``: a
    release that raised, which the next release() continues, knowing what it knew. ``secret``: the one the
    token commits to, when this object knows it (the acquirer, a cohort successor; not an adopter).
    """

    def __init__(
        self, core: LockCore, token: str, confirmed_at: float, part: str, secret: Optional[bytes] = None
    ) -> None:
        self.core = core
        self.token = token
        self.secret = secret
        self.confirmed_at = confirmed_at
        self.part = part
        self.depth = 1
        self.late_add_by: Optional[float] = None
        self.late_copies = 0
        self.release_op: Optional[Operation] = None
        self.heartbeat: Optional[Heartbeat] = None
        self.generation: Optional[int] = None
        #: When the hold began: the granted add was sent then (this process's clock).
        self.since = confirmed_at
        #: The queue ticket this acquisition waited with (``ticket_value`` with our token), kept until the
        #: release removes it with the lock; removed by :meth:`drop_ticket` when the hold ends otherwise.
        self.ticket: Optional[LockAlias] = None
        # A loss found by a check (held or unleased alike) or by the heartbeat thread: told once, by whichever
        # finds it first.
        self._lost = False
        self._lost_to: Optional[Holder] = None
        self._lost_by_read = False
        self._loss_guard = threading.Lock()

    # ------------------------------------------------------------------ what is held

    @property
    def lost(self) -> bool:
        """True once a fresh read (a check's, or the heartbeat's) showed the lock is not ours any more."""
        beat = self.heartbeat
        return self._lost or (beat is not None and beat.lost)

    @property
    def lost_to(self) -> Optional[Holder]:
        """Who held the lock when it was found lost (None: nobody, or not lost)."""
        beat = self.heartbeat
        return self._lost_to if self._lost or beat is None else beat.lost_to

    def _first_news_of_loss(self, holder: Optional[Holder], by_read: bool) -> bool:
        """Record the loss (found by a check's read, or by the heartbeat); True for the first finder only, who
        tells the log, the events and the output."""
        with self._loss_guard:
            if self._lost:
                return False
            self._lost, self._lost_to, self._lost_by_read = True, holder, by_read
            return True

    def confirm(self, result: CallResult) -> None:
        """A fresh read that shows our token confirms the lock is still ours."""
        if result.ok and result.holder is not None and result.holder.token == self.token:
            self.confirmed_at = result.sent_at

    @property
    def trusted_since(self) -> float:
        """When this lock was last confirmed in a way that counts for a successor's trust.

        With a lease, only the send time of the write that put the current heartbeat value there (the add,
        or the last beat): a waiter on another machine judges staleness from that value, however many reads
        showed the token since. A read is not a heartbeat. Without a lease nothing but Force Release takes
        the lock, so the last read that showed our token counts as well."""
        beat = self.heartbeat
        return beat.confirmed_at if beat is not None else self.confirmed_at

    def acquisition(self) -> Acquisition:
        """This hold as a value another object can take over."""
        beat = self.heartbeat
        return Acquisition(
            self.token, self.trusted_since, beat.lease if beat is not None else 0.0, self.secret
        )

    def passable(self) -> bool:
        """True when the hold may pass to another object without a remove: held once, nothing of ours
        unsettled on the wire, and the lease (if any) surely alive."""
        if self.depth != 1 or self.late_add_by is not None or self.release_op is not None or self.lost:
            return False
        beat = self.heartbeat
        return beat is None or not (beat.expired or beat.lapsed(self.core.runtime.clock()))

    def check(self, read: bool, deadline: Optional[Wait] = None) -> None:
        """:meth:`~.mutex.ReservationMutex.ensure_held` for a held lock (``deadline``: until when a read that
        fails transiently is tried again; None: once). A read that shows the lock taken makes the hold lost,
        leased or not: the release then removes nothing, and the sandbox output is told once."""
        core, beat = self.core, self.heartbeat
        if self.lost:
            raise self.lost_notice(self.lost_to)
        if beat is not None and beat.expired:
            raise self.expired_notice()
        if beat is not None and beat.lapsed(core.runtime.clock()):
            silent = core.runtime.clock() - beat.confirmed_at
            raise diagnosis.lapsed_error(silent, beat.lease, core.reservation_id, core.name)
        if not read:
            return
        op = core.operation(self.token)
        result = core.read_until(op, deadline)
        if result.ok and (result.holder is None or result.holder.token != self.token):
            # A fresh read may lag and show the lock as it was before it was ours: ask once more,
            # FRESH_READ_LAG later, before calling it lost (as release() does).
            core.runtime.sleep(FRESH_READ_LAG)
            result = core.read_until(op, deadline)
        if not result.ok:
            raise core.diagnose(result.failure, "checking the lock owner")
        if result.holder is None or result.holder.token != self.token:
            self.found_lost(result.holder)
            raise self.lost_notice(result.holder)
        self.confirm(result)

    def found_lost(self, holder: Optional[Holder]) -> None:
        """A read while held showed ``holder`` (None: nobody) in place of our token: the hold is lost. The
        heartbeat writes no more, release() removes nothing and reports nothing more, so the log, the events
        and the sandbox output are told now (once, whoever finds it first)."""
        if not self._first_news_of_loss(holder, by_read=True):
            return
        beat = self.heartbeat
        if beat is not None:
            beat.lost, beat.lost_to = True, holder
        self.lost_notice(holder, report=True)
        self.core.tell_lost(holder.label if holder is not None else None)

    # ------------------------------------------------------------------ the lease

    def start_heartbeat(
        self, confirmed_at: float, lease_seconds: Optional[float] = None, first_delay: Optional[float] = None
    ) -> None:
        """With a lease on a model that takes it: heartbeat (a daemon thread on the real clock; on a virtual
        clock, tests call renew()). ``lease_seconds``: the service's lease when it is not our option's."""
        core = self.core
        max_hold = core.options.max_hold
        if lease_seconds is None:
            if core.options.lease <= 0 or not core.alias.takes(protocol.ATTR_HEARTBEAT):
                if max_hold is not None:
                    core.news.log(
                        logging.WARNING,
                        "max_hold (%g s) has no effect on %s: the server's Mutex Service model has no lease "
                        "attributes (the original package), so nobody can break the lock; import "
                        "cloudshell-mutex's Mutex_Package.zip",
                        max_hold,
                        core.name,
                    )
                return
            lease_seconds = core.options.lease
        clock = core.runtime.clock
        self.heartbeat = Heartbeat(
            core.alias,
            self.token,
            lease_seconds,
            confirmed_at,
            part=self.part,
            clock=clock,
            rng=core.runtime.rng,
            on_lost=self._on_heartbeat_lost,
            on_danger=self._on_danger,
            logger=core.logger,
            renew_until=None if max_hold is None else clock() + max_hold,
            on_expired=self._on_expired,
        )
        self.heartbeat.count = 0
        if core.runtime.real_time:
            self.heartbeat.start(first_delay)

    def adopt_lease(self, holder: Holder) -> None:
        """Heartbeat the lease the service carries, whatever our own ``lease`` option says (a party that
        holds a leased lock and never heartbeats would have it broken under it by the first waiter).

        Until a beat of ours lands we cannot tell when the service's last heartbeat was written, so the
        lease counts as lapsing any moment, and the thread's next try is lease/3 away: a failed first beat
        is tried again at once, a few times (without this, a reader that joined a read group on a flaky
        server was told its lock may be lost at its release)."""
        holder_lease = lease.lease_of(holder)
        if holder_lease is None or protocol.ATTR_HEARTBEAT not in holder.attributes:
            return
        self.start_heartbeat(float("-inf"), holder_lease)
        beat, pause = self.heartbeat, holder_lease / 30
        for _ in range(ADOPTED_BEAT_TRIES if beat is not None else 0):
            result = beat.beat()
            if result.ok or result.lost:
                return
            self.core.runtime.sleep(pause)
            pause *= 2

    def drop_ticket(self) -> None:
        """Remove our queue ticket now (one call), while the lock is surely still ours: no waiter removes a
        holder's ticket, so its number cannot be a newcomer's (an export, a hand-over within the cohort).
        A remove without an answer goes to the watcher."""
        ticket, self.ticket = self.ticket, None
        if ticket is None:
            return
        try:
            lifetime = self.core.options.request_lifetime
            self.core.runtime.late_adds.remove_or_watch(
                ticket, self.token, lifetime, leftover="the queue ticket of a hold passed on or exported"
            )
        except Exception:  # a ticket left behind costs speed (waiters pass it, then break it), never safety
            self.core.news.log(logging.DEBUG, "could not remove the queue ticket %s", ticket.alias)

    def forget(self) -> None:
        """The hold has ended (released, lost, passed on, or an acquire abandoned). An add of it that may
        still land is handed to the late-add watcher first, and so is a queue ticket still kept: the hold
        may have been lost long ago, the ticket removed by waiters as abandoned and its number taken by a
        newcomer, so it goes only while a read shows it ours. The heartbeat stops."""
        core = self.core
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            lifetime = core.options.request_lifetime
            core.runtime.late_adds.watch(
                ticket,
                self.token,
                core.runtime.clock() + FRESH_READ_LAG,
                lifetime,
                leftover="the queue ticket of a hold that has ended",
            )
        if self.late_add_by is not None:
            lifetime = core.options.request_lifetime
            core.runtime.late_adds.watch(core.alias, self.token, self.late_add_by, lifetime, self.late_copies)
        if self.heartbeat is not None:
            self.heartbeat.stop()

    # ------------------------------------------------------------------ what it tells

    def lost_notice(self, holder: Optional[Holder], report: bool = False) -> MutexLostError:
        """The error that says a read while held (the heartbeat's, or a check's) found the lock taken by
        ``holder`` (reported if ``report``)."""
        core = self.core
        op = core.operation(self.token)
        op.see_holder(holder)
        found_by = "read" if self._lost_by_read else "heartbeat"
        error = diagnosis.lost_error(op, core.reservation_id, core.name, found_by)
        if report:
            core.news.error(error, op, events.LOST, logging.WARNING, holder=op.holder_label)
        return error

    def expired_notice(self) -> MutexLostError:
        """The error that says ``max_hold`` passed and the lease is no longer renewed."""
        core, beat = self.core, self.heartbeat
        lease_seconds = beat.lease if beat is not None else core.options.lease
        max_hold = core.options.max_hold or 0.0
        return diagnosis.expired_error(max_hold, lease_seconds, core.reservation_id, core.name)

    def _on_heartbeat_lost(self, holder: Optional[Holder]) -> None:
        first = self._first_news_of_loss(
            holder, by_read=False
        )  # a check may have found it first, and told already
        error = self.lost_notice(holder, report=first)
        if first:
            self.core.tell_lost(holder.label if holder is not None else None)
        if self.core.options.on_lost is not None:
            self.core.options.on_lost(error)

    def _on_expired(self) -> None:
        """max_hold passed (the heartbeat thread): say so in the log, the events, the sandbox output and
        ``on_lost``: the holder's command may be stuck, and waiters break the lock soon."""
        core = self.core
        error = self.expired_notice()
        core.news.error(error, core.operation(self.token), events.EXPIRED, logging.WARNING)
        core.tell_output(core.labelled(f": {error}"), "the expired lease")
        if core.options.on_lost is not None:
            core.options.on_lost(error)

    def _on_danger(self, silent: float) -> None:
        core = self.core
        message = diagnosis.danger_message(silent, core.options.lease, core.name)
        core.news.event(events.DANGER, core.operation(self.token), error=message)
        core.news.log(logging.WARNING, "%s", message)
        if core.options.on_danger is not None:
            core.options.on_danger(silent)
