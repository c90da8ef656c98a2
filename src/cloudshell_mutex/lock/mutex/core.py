"""The core of one exclusive lock on one alias: what its acquire and release steps share.

:class:`LockCore` is built once per :class:`~.mutex.ReservationMutex`; the acquire try
(:mod:`.attempt`), the release loop (:mod:`.release`) and the held acquisition (:mod:`.held`) all work
through it: the alias's calls, the options, the news (events and log), the runtime and the breaker. It
holds no state of an acquisition: that is the :class:`~.operation.Operation`'s (what one acquire or
release learned) and the :class:`~.held.Held`'s (what is held now).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from .. import diagnosis, events, protocol
from ..engine import Runtime, Wait
from ..errors import MutexError
from ..events import Reporter
from ..holder import Holder, proves_release, sanitize_label
from ..lease.lease import Breaker, StaleWatch, breaker_lease
from ..operation import Operation
from ..options import FRESH_READ_LAG, MutexOptions
from ..pacing import PacingPolicy
from ..server.alias import CallResult, LockAlias, Status
from ..server.classify import Classification, ErrorKind


class LockCore:
    """What every step of one lock uses: see the module docstring."""

    def __init__(
        self,
        alias: LockAlias,
        options: MutexOptions,
        owner: str,
        logger: logging.Logger,
        runtime: Runtime,
        pacing: PacingPolicy,
        backoff: PacingPolicy,
    ) -> None:
        self.alias = alias
        self.options = options
        self.owner = owner
        self.logger = logger
        self.runtime = runtime
        self.pacing = pacing
        self.backoff = backoff
        self.news = Reporter(alias, logger, options.on_event, runtime.clock)
        # The breaker of stale holders (one breaker at a time) and this waiter's judgement of the holder.
        self.breaker = Breaker(
            alias.sibling, owner, breaker_lease(options.lease), options.request_lifetime, runtime
        )
        self.watch = StaleWatch()
        #: Called with every fresh read of the lock (the fair queue remembers who waits).
        self.on_read: Callable[[CallResult], None] = lambda result: None
        #: Every service of the last fresh read (a case-blind server shows our lock under another spelling).
        self.last_services: Mapping[str, Holder] = {}

    @property
    def name(self) -> str:
        """The lock's alias."""
        return self.alias.alias

    @property
    def reservation_id(self) -> str:
        """The reservation the lock is in."""
        return self.alias.reservation_id

    def operation(self, token: str) -> Operation:
        """A new record of one acquire, release or read of this lock, starting now."""
        return Operation(token, self.runtime.clock(), calls_at_start=self.alias.calls)

    def read(self, op: Operation) -> CallResult:
        """One fresh read of the holder, recorded in ``op``."""
        result = self.alias.read(paced=op.polling, deadline=op.wait)
        self._took(op, result)
        self.on_read(result)
        if result.ok:
            op.read_answered(result.sent_at, result.answered_at)
        return result

    def read_until(self, op: Operation, deadline: Optional[Wait]) -> CallResult:
        """One fresh read; a transient failure is backed off and read again until ``deadline`` (a
        :class:`~.engine.Wait`; None: one read), as an acquire's reads are."""
        read = self.read(op)
        while not read.ok and read.failure.kind is ErrorKind.TRANSIENT and deadline is not None:
            op.failed(read.failure.message, reached=read.may_have_committed)
            if deadline.passed():
                break
            self.runtime.sleep(deadline.clip(op.next_backoff(self.backoff, self.runtime.rng)))
            read = self.read(op)
        return read

    def saw_in_line(self, op: Operation, result: CallResult) -> None:
        """A fresh read the fair queue made while ``op`` waits in line: it shows the holder as the mutex's
        own holder check would, so it counts as one (no second read at the next contention), and it feeds
        the lease judgement and the releasing marker. It does not count as a read after our add: only the
        mutex's own reads settle whether an add of ours made us the holder."""
        self._took(op, result)
        op.seen_in_line = True
        holder = result.holder if result.ok else None
        if holder is not None and op.is_ours(holder):
            # An add of ours landed late: the queue stops waiting, and the next busy add must read to settle
            # it (a read in line counts as a holder check, so none would be due: the add would spin).
            op.add_may_be_pending(True)
        elif holder is not None:
            # Silently: a waiter in line sees every hand-off, and says so only in its progress.
            op.see_holder(holder, result.sent_at)
            self.watch.observe(holder, result.answered_at)

    def _took(self, op: Operation, result: CallResult) -> None:
        """What every fresh read of the lock tells ``op``: that it was tried, and whether the holder it shows
        is releasing: its ``~releasing`` marker shows the secret the holder's token commits to. Anyone can
        read the token, so a marker with the token alone (a forgery, an older release's) says nothing."""
        self.last_services = result.services or {}
        op.read_tried(result.sent_at)
        if result.ok:
            marker = self.last_services.get(protocol.releasing_alias(self.name))
            holder = result.holder
            releasing = holder is not None and marker is not None
            releasing = releasing and proves_release(marker.token, holder.token)
            op.see_releasing(releasing, result.sent_at)

    def poll_read(self, op: Operation, doing: str) -> Any:
        """A fresh read while acquiring: the holder (or None), or :data:`UNREAD` after a transient failure
        (recorded in ``op``). Fatal failures raise."""
        result = self.read(op)
        if result.ok:
            return result.holder
        if result.status is not Status.TRANSIENT:
            raise self.fatal(op, result.failure, doing)
        op.failed(result.failure.message, reached=result.may_have_committed)
        self.news.log(logging.DEBUG, "fresh read failed (%s)", result.failure.message)
        return UNREAD

    def note_holder(self, op: Operation, holder: Optional[Holder]) -> None:
        """Record the holder a read showed; report a new one."""
        if op.see_holder(holder):
            self.news.event(events.CONTENDED, op, holder=op.holder_label)
            self.news.log(logging.INFO, "%s is now held by %s", self.name, op.holder_label)

    def fatal(self, op: Operation, failure: Classification, doing: str, probe: bool = False) -> MutexError:
        """The error to raise for a fatal failure during ``op``, reported."""
        error = self.diagnose(failure, doing, probe)
        if op.add_pending:  # an add of ours may have committed, and no read could tell
            diagnosis.note_pending_add(error, self.name, op.token)
        return self.news.error(error, op)

    def diagnose(self, failure: Classification, doing: str, probe: bool = False) -> MutexError:
        """Turn a fatal failure into an error that says what to do (see :mod:`.diagnosis`).

        The reservation's state is read when the failure could mean it is gone; a refused add on an
        active reservation is followed by one add *without* attributes, which tells, whatever the
        server's wording, whether the model is missing or only lacks ``Mutex Owner``.
        """
        state = self.alias.reservation_state() if diagnosis.needs_state(failure) else None
        # Only a refusal about the model, or one with the generic code whose words are unknown.
        about_model = failure.kind is ErrorKind.NOT_INSTALLED or (
            failure.kind is ErrorKind.FATAL and failure.code == protocol.CONTENTION_ERROR_CODE
        )
        probed = self.alias.probe_model() if probe and state in ("active", None) and about_model else None
        model = self.options.model
        return diagnosis.fatal_error(
            failure, doing, self.reservation_id, self.name, model, probed, state, self.alias.domain
        )

    def watch_late_add(self, op: Operation, removing_until: Optional[float] = None) -> None:
        """An acquire that ends without the lock: an add of it that may still land is watched, and so,
        for as long as fresh reads may lag, is one whose outcome it could not see. ``removing_until``: a
        remove of ours that got no answer may land until then; the watcher sends none before."""
        now, lifetime = self.runtime.clock(), self.options.request_lifetime
        late_adds = self.runtime.late_adds
        if op.add_can_land(now):
            late_adds.watch(
                self.alias,
                op.token,
                op.add_lands_by,
                lifetime,
                op.add_unanswered,
                removing_until=removing_until,
            )
        elif op.unsure_add:
            lands_by = now + 2 * FRESH_READ_LAG
            late_adds.watch(self.alias, op.token, lands_by, lifetime, removing_until=removing_until)

    def tell_output(self, message: str, what: str, warning: bool = True) -> None:
        """One line in the sandbox output for the people watching it (a courtesy: a failure is logged)."""
        if not self.alias.write_output(message, warning=warning).ok:
            self.news.log(logging.DEBUG, "could not write %s to the reservation output", what)

    def tell_lost(self, holder_label: Optional[str]) -> None:
        """One warning line in the sandbox output: the people watching it see that a held lock was lost
        (broken by a waiter, force-released, removed by other code), not only the log."""
        self.tell_output(diagnosis.lost_output_line(self.owner, self.name, holder_label), "the lost lock")

    def labelled(self, text: str) -> str:
        """``text`` after this lock's owner label, as the output shows whose line it is."""
        return f"{sanitize_label(self.owner)}{text}"


#: :meth:`LockCore.poll_read`'s answer when the read failed transiently (None means "read: it is free").
UNREAD: Any = object()
