"""The wait record of a waiter outside the queue that holds other locks: what it waits for, for deadlocks.

A fair-mode waiter's ticket already tells what it waits for and what it holds (:mod:`.queue`). A waiter that
waits outside the queue (a cohort member waiting for its machine's local lock, a ``fair=False`` waiter) and
holds other named locks of the reservation writes the same record as a service of its own,
``<lock>~d~<nonce>`` (:func:`~.protocol.wait_record_alias`), once it has waited
:data:`~.waitfor.DETECT_AFTER`. No queue counts it as a waiter. From then on it reads the reservation every
:data:`~.waitfor.DETECT_INTERVAL` (sooner while a cycle awaits confirmation), judges the wait-for graph
(:class:`~.waitfor.CycleWatch`), and rewrites the record's heartbeat every lease/3 and after each read that
shows it a cycle through its wait; it raises :class:`~.errors.MutexDeadlock` when it is the victim of a
confirmed cycle. The record goes when the wait ends, however it ends; an add or a remove of it without an
answer goes to the late-add watcher (:mod:`.late_adds`), which removes it while it shows our token.
"""

from __future__ import annotations

import logging
import math
from typing import Any, List, Optional, Sequence, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue

from .. import protocol
from ..engine import Runtime, Wait
from ..lease.lease import nonce_of, ticket_value
from ..server.alias import LockAlias, Status
from . import holdings, waitfor
from .tickets import TICKET_LEASE, TicketAlias

__all__ = ["WaitRecord"]

#: What a wait record the late-add watcher settles is, in its messages.
LEFT_RECORD = "the wait record of a wait that has ended"


class WaitRecord:
    """The wait record of one waiting acquisition (``token``) for ``lock``, which holds ``holds`` (the tokens
    of other locks it holds in the reservation); its wait began at ``since`` (the runtime's clock). See the
    module's docstring."""

    def __init__(
        self,
        lock: LockAlias,
        token: str,
        holds: Sequence[str],
        runtime: Runtime,
        request_lifetime: float,
        since: float,
        logger: logging.Logger,
    ) -> None:
        self.lock = lock
        self.token = token
        self.holds = tuple(holds)
        self.alias = lock.sibling(protocol.wait_record_alias(lock.alias, nonce_of(token) or "0"), TicketAlias)
        self.runtime = runtime
        self.request_lifetime = request_lifetime
        self.logger = logger
        self.watch = waitfor.CycleWatch(token)
        #: The model refused the record (the original package without ``Mutex Owner``): no detection.
        self.off = False
        self._since = since
        self._looked_at = -math.inf
        self._beats = 0
        self._beat_at = -math.inf
        self._added = False  # the add succeeded (or said "already exists": our own, re-sent by the client)
        self._unsettled: List[Tuple[float, int]] = []  # adds of unknown outcome: (watched until, copies)
        self._told = False  # a deadlock another waiter gives up for was logged

    @classmethod
    def for_wait(
        cls, lock: LockAlias, token: str, runtime: Runtime, request_lifetime: float, logger: logging.Logger
    ) -> Optional[WaitRecord]:
        """The record of a wait for ``lock`` beginning now in this thread, as ``token``, when the thread
        holds other locks of the reservation (:mod:`.holdings`); None when it holds none (no cycle then)."""
        if protocol.DERIVED_MARK in lock.alias:
            return None  # a part of a read-write lock: no lock of the graph
        held = holdings.held_tokens(lock.api, lock.reservation_id, but=lock.alias)
        if not held:
            return None
        return cls(lock, token, held, runtime, request_lifetime, runtime.clock(), logger)

    @property
    def cycle(self) -> Optional[waitfor.Cycle]:
        """The deadlock through this wait that the last read showed, confirmed live (None: none)."""
        return self.watch.confirmed

    def due_in(self) -> float:
        """Seconds until the next look is due (0: now; infinite when the record is off)."""
        if self.off:
            return math.inf
        interval = waitfor.CONFIRM_INTERVAL if self.watch.pending else waitfor.DETECT_INTERVAL
        due = max(self._since + waitfor.DETECT_AFTER, self._looked_at + interval)
        return max(0.0, due - self.runtime.clock())

    def step(self, deadline: Optional[Wait] = None) -> None:
        """One look when it is due (else nothing): add the record (once), read the reservation, judge it, and
        rewrite the heartbeat when due or when a cycle shows. Raises :class:`~.errors.MutexDeadlock` when
        this waiter is the victim of a confirmed cycle. ``deadline``: the wait, whose end no
        call waits past on the call budget."""
        if self.due_in() > 0:
            return
        if not self._added:
            self._add(deadline)
            if self.off:
                return
        read = self.lock.read(paced=True, deadline=deadline)
        self._looked_at = self.runtime.clock()
        if not read.ok:
            return  # judged at the next look; the wait itself deals with a failing server
        confirmed = self.watch.judge(waitfor.wait_for(read.services or {}))
        if self.watch.cycle is not None or self._looked_at - self._beat_at >= TICKET_LEASE / 3:
            self._beat(deadline)
        if confirmed is None:
            return
        if confirmed.victim == self.token:
            raise waitfor.deadlock_error(confirmed, self.token, self.lock.reservation_id, self.lock.alias)
        if not self._told:
            self._told = True
            self.logger.info(
                "cloudshell-mutex: a deadlock through %s (%s); another waiter of it gives up",
                self.lock.alias,
                confirmed.describe(self.token),
            )

    # ------------------------------------------------------------------ as an acquire's way of waiting

    def after_busy(self, op: Any, default: float) -> float:
        """After a busy add: one look when due (raises MutexDeadlock for the victim); ``default`` (the
        pacing's pause), cut to the next look."""
        self.step(op.wait)
        op.cycle = self.cycle
        return min(default, self.due_in())

    def close(self) -> None:
        """The wait ended (however it ended): the record goes, settled by the late-add watcher when its remove
        or an add of it got no answer. Never raises."""
        late_adds, lifetime = self.runtime.late_adds, self.request_lifetime
        try:
            if self._added:
                late_adds.remove_or_watch(self.alias, self.token, lifetime, leftover=LEFT_RECORD)
            for lands_by, copies in self._unsettled:  # a copy may land after our remove: watched
                late_adds.watch(self.alias, self.token, lands_by, lifetime, copies)
        except Exception:  # a record left behind never moves, so it never counts as a wait
            self.logger.debug("cloudshell-mutex: could not remove the wait record", exc_info=True)

    def _value(self) -> str:
        return ticket_value(self.token, TICKET_LEASE, self._beats, self.holds)

    def _add(self, deadline: Optional[Wait]) -> None:
        owner = [AttributeNameValue(protocol.ATTR_OWNER, self._value())]
        clock, lifetime = self.runtime.clock, self.request_lifetime
        # Interrupted on its way (Ctrl-C), the add may still land: close() watches it meanwhile.
        on_the_wire = (clock() + lifetime, 1)
        self._unsettled.append(on_the_wire)
        result = self.alias.try_add(owner, paced=True, deadline=deadline)
        self._unsettled.remove(on_the_wire)
        ours = result.ok or result.status is Status.BUSY  # the alias is this acquisition's alone
        if ours and result.may_land_later:  # a copy without an answer may come back after our remove
            self._unsettled.append((result.lands_by(lifetime), result.unanswered_copies))
        elif not ours:
            until = result.unsettled(lifetime, clock())
            if until is not None:
                self._unsettled.append(until)
        if ours:
            self._added, self._beat_at = True, result.sent_at
        elif result.status is Status.FATAL and result.failure is not None and result.failure.code:
            self.off = True
            self.logger.info(
                "cloudshell-mutex: the server refused a wait record for %s (%s); a deadlock through this "
                "wait cannot be seen",
                self.lock.alias,
                result.failure.message,
            )

    def _beat(self, deadline: Optional[Wait]) -> None:
        self._beats += 1
        written = self.alias.set_attributes(
            [(protocol.ATTR_OWNER, self._value())], paced=True, deadline=deadline
        )
        if written.ok:
            self._beat_at = written.sent_at
