"""One acquisition of an exclusive lock, as the engine's attempt: the add, and what settles it.

Each try (:meth:`MutexAttempt.try_once`) is one add with the owner token written in the same call; its
success is the lock. What the try does with an answer is the protocol (docs/protocol.md):

1. **Added**: held (``verify`` reads the owner back first).
2. **Busy**: maybe our own add, re-sent by the client after it had committed; the first contention, a slow
   one, or any after an unknown outcome reads the owner. A leased holder is judged on this waiter's clock
   and broken when stale. Then the pacing policy's pause, or the fair queue's.
3. **Transient failure**: back off, then settle with one fresh read: the add may have committed.
4. **Fatal**: settle an add that may be ours with one read first; never raise while holding.

At the deadline, :meth:`MutexAttempt.give_up` settles with a last read and raises ``MutexTimeout``.
"""

from __future__ import annotations

import logging
from typing import Optional

from .. import diagnosis, events
from ..holder import namesake, sanitize_label
from ..lease import lease
from ..operation import Operation
from ..queue.queue import FairQueue
from ..queue.waitrecord import WaitRecord
from ..server.alias import CallResult, Status
from .core import UNREAD, LockCore


class MutexAttempt:
    """One blocking or non-blocking acquire of the alias primitive (see the module docstring).

    When a try is done, :attr:`confirmed_at` is when the lock was last confirmed ours (the add, or the
    read that settled it), :attr:`lease_from` when a waiter may first have seen our service, and
    :attr:`resolved` tells that an add of unknown outcome turned out to be ours.
    """

    def __init__(
        self,
        core: LockCore,
        op: Operation,
        blocking: bool,
        first_beat: str,
        queue: Optional[FairQueue] = None,
        record: Optional[WaitRecord] = None,
    ) -> None:
        self.core = core
        self.op = op
        self.blocking = blocking
        self.first_beat = first_beat
        # How a blocking acquire waits after a busy add: in the fair queue, or (outside it, for a thread that
        # holds other locks) with a wait record; neither for plain polling.
        self.queue = queue if blocking else None
        self.record = record if blocking else None
        self.confirmed_at = float("-inf")
        self.lease_from = op.start
        self.resolved = False
        self._started = False
        self._judged_after: Optional[float] = None  # the read the last stale judgement followed
        # Waiting in line: each try is one look at the queue instead of an add (``_first_turn``: before the
        # first add; ``_line_default``: the delay when the queue cannot help).
        self._in_line = False
        self._first_turn = False
        self._line_default = 0.0
        self._add_next = False  # this waiter broke a stale holder: its next try is an add, even in line

    # ------------------------------------------------------------------ the engine's attempt

    def try_once(self) -> Optional[float]:
        """One add and what settles it, or one look while in line: None when the lock is ours, else the
        pause before the next try."""
        op, core = self.op, self.core
        if not self._started:
            self._started = True
            # Others were waiting at our last read: line up behind them before the first add.
            self._in_line = self._first_turn = self.queue is not None and self.queue.lines_up_first()
        # In line, each try is a look; but a holder whose lease has run out on this waiter's clock is judged
        # by an add (and the read after it), by every waiter: a dead head must not leave a dead holder be.
        if self._in_line and not self._add_next and not self._turned_stale(core.runtime.clock()):
            delay = self._turn()
            if delay is not None:  # the next look, or (the turn has come) the pause before the add
                return self._until_progress(self._until_stale(delay))
        # Step 1: the add. Its success is the lock; the owner token travels in the same call.
        op.add_sent()
        self._add_next = False
        add = core.alias.add_owner(
            op.token,
            core.owner,
            lease=core.options.lease,
            heartbeat=self.first_beat,
            paced=op.polling,
            deadline=op.wait,
        )
        op.add_returned(add.sent_at)
        if not add.ok and add.may_have_committed:
            op.add_unknown(add.sent_at)
        if add.may_land_later:
            op.add_in_flight(add.lands_by(core.options.request_lifetime), add.unanswered_copies)
        if add.ok:
            if not core.options.verify or self._verified():
                return self._held(add.sent_at, lease_from=add.sent_at)
            delay = op.next_pause(core.pacing, core.runtime.rng)
        elif add.status is Status.BUSY:
            # Step 2: contention (maybe our own add, re-sent by the client after it had committed).
            if self._on_contention(add):
                return self._held(op.last_read_at or add.sent_at, resolved=True)
            # Freed since the add failed (the read found nobody), or a stale holder broken: retry at once.
            found_free = op.read_since_add and op.holder is None
            broke = not found_free and self._break_if_stale()
            freed = found_free or broke
            # One that broke it adds even from a place in line: the head may have died with the holder (one
            # execution server), and the lock would stand free until the fallback passed it.
            self._add_next = broke
            delay = 0.0 if freed else op.next_pause(core.pacing, core.runtime.rng)
            if self.record is not None and not freed:
                delay = self.record.after_busy(op, delay)
            elif self.queue is not None and not freed:
                head = self.queue.after_busy(op, delay)  # fair=False: no queue, plain polling
                if head is None:  # not the head: wait in line, the first look at once
                    self._in_line, self._line_default = True, delay
                    head = self._turn()
                delay = head
            delay = self._until_progress(self._until_stale(delay))
        elif add.status is Status.TRANSIENT:
            # Step 3: a transient failure. Back off on a separate schedule, then settle with one read.
            if self._on_transient(add):
                return self._held(op.last_read_at or add.sent_at, resolved=True)
            delay = 0.0  # already backed off
        else:
            # Step 4: fatal. A refusal committed nothing, but another failure (a 2xx reply without a
            # readable body), or an earlier unknown outcome, may have left our add: settle with a read.
            op.add_may_be_pending(add.may_have_committed)
            if op.add_pending and self._settled_as_ours():
                return self._held(op.last_read_at or add.sent_at, resolved=True)
            raise core.fatal(op, add.failure, "adding the lock service", probe=True)
        op.start_polling()  # from here on, this acquisition's calls wait on the call budget
        return delay

    def waiting(self) -> None:
        """Progress in the reservation output (when ``progress`` is on), at most every progress_interval.
        A courtesy: the next add reports real problems."""
        op, options = self.op, self.core.options
        now = self.core.runtime.clock()
        if not options.progress or not op.progress_due(now, options.progress_interval):
            return
        held = now - (op.holder_since if op.holder_since is not None else op.start)
        message = (
            f"{sanitize_label(self.core.owner)}: waiting for {self.core.name} held by "
            f"{op.holder_label or 'another owner'} for {held:.0f} s"
        )
        result = self.core.alias.write_output(message, paced=op.polling, deadline=op.wait)
        if not result.ok:
            self.core.news.log(
                logging.DEBUG, "could not write progress to the reservation output: %s", result.failure
            )

    def give_up(self) -> bool:
        """The deadline came. Never raise while holding: if nothing was read since the last add, one final
        fresh read (no sleep) settles whether that add, or an earlier one whose reply was lost, made us the
        owner. ``blocking=False`` answers False only for "busy": a failing API raises, as on timeout."""
        op, core = self.op, self.core
        if op.adds == 0 and self.queue is not None:
            # The deadline came between two looks in a line before the first add: that add is tried once.
            self._in_line = False
            if self.try_once() is None:
                return True
        # No read when the server could not be reached and nothing of ours may be there: it would only wait on
        # the client's retries past the deadline, to settle nothing.
        nothing_to_settle = op.unreachable and not op.add_pending
        if not op.read_since_add and not nothing_to_settle:
            holder = core.poll_read(op, "reading the lock holder")
            if holder is not UNREAD:
                if op.settled_by(holder):
                    self._held(op.last_read_at or core.runtime.clock(), resolved=True)
                    return True
                core.note_holder(op, holder)
        busy = op.contentions > 0 or op.holder is not None
        if not self.blocking and busy and not op.add_pending:
            core.news.log(logging.DEBUG, "%s is busy; not waiting (blocking=False)", core.name)
            return False
        unleased = op.holder is not None and lease.lease_of(op.holder) is None
        # A holder whose remove got no answer keeps the lock until that remove lands or can no longer land.
        since = op.releasing_since if op.holder is not None else None
        releasing = None if since is None else since + core.options.request_lifetime
        now = core.runtime.clock()
        error = diagnosis.timeout_error(
            op, now, core.reservation_id, core.name, unleased_holder=unleased, releasing_until=releasing
        )
        raise core.news.error(error, op, events.TIMEOUT, logging.WARNING, holder=error.holder)

    # ------------------------------------------------------------------ after an interrupt

    def abandon(self, remove: bool = True) -> None:
        """After an interrupt inside acquire() (Ctrl-C, or the caller's cancellation): remove our add if a
        read shows it (``remove``; a read group never removes blindly: a reader may have joined it), and
        hand an add that may still land to the late-add watcher (it warns at exit if it cannot settle it)."""
        op, core = self.op, self.core
        if op.adds == 0:
            return
        clock, lifetime = core.runtime.clock, core.options.request_lifetime
        if op.awaiting_add:  # interrupted before the add answered: it may land any time now
            op.add_in_flight(clock() + lifetime)
        # Our remove of it, while it may still land: the watcher sends no second one before then (it would
        # free the lock, and the first, landing after a successor took it, would delete the successor's).
        removing_until: Optional[float] = None
        try:
            if remove:
                read = core.alias.read()
                if read.ok and op.settled_by(read.holder):  # one copy landed: the others land after it
                    removing_until = clock() + lifetime  # until the remove has answered
                    removed = core.alias.remove_once()
                    removing_until = removed.lands_by(lifetime) if removed.may_land_later else None
                    if removed.ok:
                        core.news.log(
                            logging.WARNING, "acquire interrupted; removed its add of %s", core.name
                        )
                    else:  # the watcher reads again and removes it
                        op.add_in_flight(clock() + lifetime)
                elif not read.ok and op.add_pending:
                    op.add_in_flight(clock() + lifetime)
        except BaseException:  # interrupted again: what is known so far still goes to the watcher
            op.add_in_flight(clock() + lifetime)
            raise
        finally:
            core.watch_late_add(op, removing_until)

    # ------------------------------------------------------------------ the steps

    def _turn(self) -> Optional[float]:
        """One look at the queue while in line. Returns the seconds until the next try (a look while still in
        line; else the add), or None to add in this try: in a line before the first add, that add is tried
        once whatever comes, as the turn comes or the deadline does."""
        op, first = self.op, self._first_turn
        self._first_turn = False
        done, delay = self.queue.step(op, first, 0.0 if first else self._line_default)
        if op.adds == 0 and (done or op.wait.passed()):
            self._in_line = False
            if done and delay > 0 and not op.wait.passed():
                op.wait.pause(delay)
            return None
        self._in_line = not done
        return delay

    def _until_stale(self, delay: float) -> float:
        """``delay``, but the next try no later than the moment the holder turns stale: judged then, not a
        poll later (in line too: the head may be as dead as the holder)."""
        stale_at, now = self.core.watch.stale_at(), self.core.runtime.clock()
        if stale_at is None:
            return delay
        if stale_at > now:
            return min(delay, stale_at - now)
        # Judged stale and not broken (a read group whose reader slots are still being judged): judged again
        # at the next holder check, not at the first poll after it (an old hold's head polls rarely).
        last = self.op.last_read_attempt
        if last is None:
            return delay
        return min(delay, max(0.0, last + self.core.options.holder_check_interval - now))

    def _until_progress(self, delay: float) -> float:
        """``delay``, but with ``progress`` on, the next try no later than the next progress line is due: a
        waiter that polls rarely (a spinning cohort polls every 2.5 s) still writes one every interval."""
        options = self.core.options
        if not options.progress:
            return delay
        due = self.op.progress_at(options.progress_interval)
        return min(delay, max(0.0, due - self.core.runtime.clock()))

    def _held(self, confirmed_at: float, resolved: bool = False, lease_from: Optional[float] = None) -> None:
        self.confirmed_at, self.resolved = confirmed_at, resolved
        # A waiter saw our service no earlier than the add that made it was sent. One resolved by a read was
        # made by an add whose outcome we did not see, the first of which is known.
        if lease_from is None:
            unknown = self.op.unknown_add_since
            lease_from = self.op.start if unknown is None else unknown
        self.lease_from = lease_from
        return None

    def _on_contention(self, add: CallResult) -> bool:
        """Handle "already exists"; True when the holder turns out to be this acquisition."""
        op, core = self.op, self.core
        op.contended(add.sent_at)
        now = core.runtime.clock()
        if add.resent or op.read_due(now, core.options.holder_check_interval) or self._turned_stale(now):
            holder = core.poll_read(op, "reading the lock holder")
            if holder is UNREAD:
                return False  # read again later
            if op.settled_by(holder):
                return True
            if holder is None:
                self._refuse_namesake()
            core.note_holder(op, holder)
            core.watch.observe(holder, op.last_answer_at)  # the lease judgement: this waiter's own clock
        if op.contentions == 1:
            core.news.event(events.CONTENDED, op, holder=op.holder_label)
            core.news.log(
                logging.INFO,
                "%s in reservation %s is held by %s; waiting",
                core.name,
                core.reservation_id,
                op.holder_label or "another owner",
            )
        return False

    def _refuse_namesake(self) -> None:
        """The add said "already exists" and a read shows no service under our alias: if it shows one under
        another spelling, the server takes them alike (case-blind), and waiting would never end."""
        core = self.core
        other = namesake(core.last_services, core.name)
        if other is not None:
            error = diagnosis.namesake_error(core.reservation_id, core.name, other)
            raise core.news.error(error, self.op)

    def _on_transient(self, add: CallResult) -> bool:
        """Back off after a transient failure, then settle an unknown outcome with one fresh read."""
        op, core = self.op, self.core
        op.failed(add.failure.message, reached=add.may_have_committed)
        # "Never sent" describes the client's last copy only; an earlier, re-sent one may have committed.
        op.add_may_be_pending(add.may_have_committed)
        core.news.event(events.TRANSIENT, op, error=add.failure.message)
        core.news.log(
            logging.WARNING, "transient CloudShell API failure (%s); backing off", add.failure.message
        )
        op.wait.pause(op.next_backoff(core.backoff, core.runtime.rng))
        if not op.add_pending:
            return False
        holder = core.poll_read(op, "reading the lock holder")
        if holder is UNREAD:
            return False  # still unknown: the next add (or the final read) will tell
        if op.settled_by(holder):
            return True
        if holder is not None:
            op.saw_contention(add.sent_at)
            core.note_holder(op, holder)
        return False

    def _settled_as_ours(self) -> bool:
        """Before raising a fatal error: one fresh read, its own failure ignored. True when it shows our
        token (an earlier add committed after all); a read showing anything else ends the doubt."""
        read = self.core.read(self.op)
        if not read.ok:
            self.op.last_error = read.failure.message
            return False
        return self.op.settled_by(read.holder)

    def _verified(self) -> bool:
        """verify=True: read the owner back after a successful add (the original v2's defence against a
        server that grants twice). One more call per acquisition."""
        op, core = self.op, self.core
        holder = core.poll_read(op, "verifying the lock owner")
        if holder is UNREAD:  # the add succeeded, which is the protocol's definition of holding the lock
            core.news.log(
                logging.WARNING, "could not verify the owner (%s); the add succeeded", op.last_error
            )
            return True
        if op.is_ours(holder):
            return True
        core.news.log(
            logging.WARNING,
            "the add of %s succeeded but the owner read back is %s; not treating the lock as held",
            core.name,
            holder.label if holder else "nobody",
        )
        op.saw_contention(core.runtime.clock())
        core.note_holder(op, holder)
        return False

    def _turned_stale(self, now: float) -> bool:
        """True when the holder seen turned stale since this waiter last judged it: read it at once (its
        judgement waits for no holder check; a judgement that did not break it waits for the next one)."""
        stale_at = self.core.watch.stale_at()
        judged = self._judged_after
        return stale_at is not None and now >= stale_at and (judged is None or judged < stale_at)

    def _break_if_stale(self) -> bool:
        """After a busy add: judge the holder on this waiter's own clock, from every fresh read it made (its
        own holder checks and its reads in line alike: a waiter that holds other locks reads only in line);
        when it is stale, break it as the only breaker (:class:`~.lease.Breaker`, which reads it again
        first). True when the stale holder is gone (add at once)."""
        op, core = self.op, self.core
        watch = core.watch
        if watch.holder is None or op.last_read_attempt == self._judged_after:
            return False  # nobody seen, or nothing read since the last judgement (a break costs calls)
        self._judged_after = op.last_read_attempt
        now = core.runtime.clock()
        if not watch.stale(now):
            return False
        stale, seen = watch.holder, watch.unchanged_for(now)
        result = core.breaker.break_holder(core.alias, watch)
        if not result.broken:
            core.news.log(logging.DEBUG, "did not break %s: %s", core.name, result.why)
            return result.why == "the holder went away by itself"
        message = diagnosis.broke_stale(
            core.owner, "lock", core.name, stale, lease.lease_of(stale) or 0, seen
        )
        core.news.event(events.BROKEN, op, holder=stale.label, error=message)
        core.news.log(logging.WARNING, "%s", message)
        core.tell_output(message, "the break")
        return True
