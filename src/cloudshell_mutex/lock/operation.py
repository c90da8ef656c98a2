"""The record of one lock operation: an ``acquire()``, a ``release()`` or a ``holder()`` read.

Plain book-keeping without I/O: what the operation tried, what it saw, and what it does not know.
The mutex (:mod:`.mutex`) makes the calls and reports each step here through a method; pacing,
progress messages and the error texts (:mod:`.diagnosis`) read the record.
"""

from __future__ import annotations

import random
from typing import Any, Optional

from .engine import Wait
from .holder import Holder
from .pacing import PacingPolicy

#: While an add of ours may still land, a waiter reads the holder at least this often.
LANDING_READ_INTERVAL = 1.0


class Operation:
    """Book-keeping of one acquire(), release() or holder() call on one lock.

    ``adds`` counts the adds sent, ``contentions`` the adds refused because the alias was taken,
    ``transients`` the calls that failed in a way a retry may heal. ``calls_at_start`` is the lock
    alias's call count when the operation began, so ``alias.calls - calls_at_start`` is its cost.
    """

    def __init__(
        self, token: str, start: float, wait: Optional[Wait] = None, calls_at_start: int = 0
    ) -> None:
        self.token = token
        self.start = start
        #: When the operation's waits end (a blocking acquire's; never for a release or a read).
        self.wait = wait if wait is not None else Wait(None)
        self.calls_at_start = calls_at_start
        #: Seconds the caller waited for this acquisition before it began (a cohort's local lock): counted in
        #: what it reports (its timeout's figures, "acquired after"), so that they tell the whole wait.
        self.waited_before = 0.0
        self.adds = 0
        self.contentions = 0
        #: The fair queue read the lock while this acquisition waited in line (its holder check).
        self.seen_in_line = False
        self.transients = 0
        #: The last transient failure was a request that never reached the server (connection refused).
        self.unreachable = False
        self.contention_delay = 0.0  # the pacing policy's previous delay
        self.backoff_delay = 0.0  # the backoff policy's previous delay
        # True while an add of ours may have committed without us knowing (its reply was lost); one
        # fresh read settles it, unless the add may still land later (``add_lands_by``).
        self.add_pending = False
        # True once any add of this operation had an outcome it could not see (reads may lag behind).
        self.unsure_add = False
        # An add or a remove of ours that got no answer may still be applied until then (monotonic).
        self.add_lands_by: Optional[float] = None
        self.add_unanswered = 0  # copies of our adds that got no answer and have not been seen to land
        self.remove_lands_by: Optional[float] = None
        self.remove_sent_at: Optional[float] = None  # the last remove of ours whose outcome is not known
        # True once a remove of ours may have taken effect (its reply was lost, or it may still land).
        self.remove_may_have_landed = False
        self.awaiting_add = False  # an add is on the wire and its call has not returned
        self.add_sent_at: Optional[float] = None  # when the last add whose call returned was sent
        # When the first add whose outcome is unknown was sent: no add before it can have created our service.
        self.unknown_add_since: Optional[float] = None
        self.lag_checked = False  # a read that contradicted us was confirmed by a second one
        self.polls = 0  # reads made while waiting for a remove of ours that may still land
        self.poll_delay = 0.0
        # True when a successful fresh read happened after the last add: nothing new to learn.
        self.read_since_add = False
        # Calls wait on the call budget only while polling: never the first add, never a release.
        self.polling = False
        # A blocking acquire: its caller may cancel it while it pauses between tries (never a release).
        self.last_read_at: Optional[float] = None  # last successful fresh read (when it was sent)
        self.last_answer_at: Optional[float] = None  # ... and when its answer came (lease judgements)
        self.last_read_attempt: Optional[float] = None  # last read tried, successful or not
        self.contended_since: Optional[float] = None
        self.holder: Optional[Holder] = None
        self.holder_since: Optional[float] = None
        #: Since when reads show the holder's ``~releasing`` marker (its remove may still land), or None.
        self.releasing_since: Optional[float] = None
        #: The release's marker service while its remove may still land (added by this operation), and
        #: until when an add of it that got no answer may still land (None: it answered).
        self.releasing_mark: Optional[Any] = None
        self.releasing_mark_lands_by: Optional[float] = None
        self.last_progress: Optional[float] = None
        self.last_error: Optional[str] = None
        #: The deadlock cycle through this wait that the last look for one showed (a
        #: :class:`~.waitfor.Cycle`; None: none): a timeout then says so instead of advising to wait longer.
        self.cycle: Optional[Any] = None

    # ---------------------------------------------------------------- what happened

    def add_sent(self) -> None:
        """An add went out: whatever was read before it is old news."""
        self.adds += 1
        self.read_since_add = False
        self.awaiting_add = True

    def add_returned(self, sent_at: float) -> None:
        """The add sent at ``sent_at`` returned (an answer or an error): it was not interrupted midway."""
        self.awaiting_add = False
        self.add_sent_at = sent_at

    def add_unknown(self, sent_at: float) -> None:
        """The add sent at ``sent_at`` may have committed without our knowing (no answer, or a re-send)."""
        if self.unknown_add_since is None or sent_at < self.unknown_add_since:
            self.unknown_add_since = sent_at

    def read_tried(self, at: float) -> None:
        """A fresh read went out at ``at``."""
        self.last_read_attempt = at

    def read_answered(self, at: float, answered_at: Optional[float] = None) -> None:
        """The fresh read sent at ``at`` answered at ``answered_at`` (None: at once)."""
        self.last_read_at = at
        self.last_answer_at = at if answered_at is None else answered_at
        self.read_since_add = True

    def add_may_be_pending(self, maybe: bool) -> None:
        """An add of ours may have committed unseen (its reply was lost, or the client re-sent it)."""
        self.add_pending = self.add_pending or maybe
        self.unsure_add = self.unsure_add or maybe

    def add_in_flight(self, lands_by: float, copies: int = 1) -> None:
        """``copies`` of an add of ours got no answer: each may still be applied until ``lands_by``."""
        self.add_unanswered += copies
        self.add_lands_by = max(lands_by, self.add_lands_by or lands_by)
        self.unsure_add = True

    def add_landed(self) -> None:
        """A read showed our token: one unanswered copy of our add was applied (the alias is unique,
        so the others, if any, can only land once it is gone)."""
        self.add_unanswered = max(0, self.add_unanswered - 1)

    def remove_unsettled(self, maybe_landed: bool, lands_by: Optional[float] = None) -> None:
        """A remove of ours failed: it may have taken effect, and (``lands_by``) may still land later."""
        self.remove_may_have_landed = self.remove_may_have_landed or maybe_landed
        if lands_by is not None:
            self.remove_may_have_landed = True
            self.remove_lands_by = max(lands_by, self.remove_lands_by or lands_by)

    def still_ours_at(self, now: float) -> None:
        """A fresh read showed our token: every remove of ours that can no longer land did not land."""
        if not self.remove_can_land(now):
            self.remove_may_have_landed = False
            self.remove_lands_by = None

    def add_can_land(self, now: float) -> bool:
        """True while an add of ours that got no answer may still be applied."""
        return self.add_unanswered > 0 and self.add_lands_by is not None and now < self.add_lands_by

    def remove_can_land(self, now: float) -> bool:
        """True while a remove of ours that got no answer may still be applied."""
        return self.remove_lands_by is not None and now < self.remove_lands_by

    def start_polling(self) -> None:
        """From now on this operation polls: its calls wait on the call budget."""
        self.polling = True

    def contended(self, since: float) -> None:
        """An add found the lock taken (its request was sent at ``since``)."""
        self.contentions += 1
        self.saw_contention(since)

    def saw_contention(self, since: float) -> None:
        """Remember when this operation first found the lock taken."""
        if self.contended_since is None:
            self.contended_since = since

    def failed(self, message: str, reached: bool = True) -> None:
        """Record a transient failure (``reached``: False when the request provably never reached the
        server: the connection was refused or never made)."""
        self.transients += 1
        self.last_error = message
        self.unreachable = not reached

    def settled_by(self, holder: Optional[Holder]) -> bool:
        """Take in a fresh read after an add: True when it shows our token. Anything else shows that
        no add of ours is in place (the alias is unique), so nothing of ours is pending any more."""
        if self.is_ours(holder):
            if self.add_pending or self.add_unanswered:
                self.add_landed()
            return True
        self.add_pending = False
        return False

    def see_holder(self, holder: Optional[Holder], at: Optional[float] = None) -> bool:
        """Record the holder a fresh read (sent ``at``; default: the last read answered) showed; True when
        it replaced another holder."""
        if holder is None:
            self.holder = None
            self.holder_since = None
            return False
        if self.holder is not None and self.holder.token == holder.token:
            return False
        # First sight of this holder: it has held the lock at least since the contention that
        # preceded this read (this waiter's monotonic clock; no server clocks are compared).
        first = self.holder is None
        seen_at = self.last_read_at if at is None else at
        self.holder_since = self.contended_since if first and self.contended_since is not None else seen_at
        self.holder = holder
        return not first

    # ---------------------------------------------------------------- what follows from it

    @property
    def holder_label(self) -> Optional[str]:
        """The label of the holder seen last, or None."""
        return self.holder.label if self.holder is not None else None

    def is_ours(self, holder: Optional[Holder]) -> bool:
        """True when ``holder`` carries this operation's token."""
        return holder is not None and holder.token == self.token

    def see_releasing(self, releasing: bool, at: float) -> None:
        """Record whether a read showed the holder's releasing marker (see :attr:`releasing_since`)."""
        if not releasing:
            self.releasing_since = None
        elif self.releasing_since is None:
            self.releasing_since = at

    def held_for(self, now: float) -> Optional[float]:
        """How long this waiter has seen the current holder hold the lock, or None."""
        return None if self.holder_since is None else now - self.holder_since

    def read_due(self, now: float, interval: float) -> bool:
        """True when a holder read is due after a contention: the first one (unless the fair queue read the
        lock meanwhile: :meth:`.LockCore.saw_in_line`), after an unknown outcome, or ``interval``
        after the last read tried (at most a second while an add of ours may still
        land, so that its landing is noticed: the alias is then ours)."""
        if self.add_can_land(now):
            interval = min(interval, LANDING_READ_INTERVAL)
        return (
            (self.contentions == 1 and not self.seen_in_line)
            or self.add_pending
            or self.last_read_attempt is None
            or now - self.last_read_attempt >= interval
        )

    def next_pause(self, pacing: PacingPolicy, rng: random.Random) -> float:
        """The pacing policy's delay before the next add after contention."""
        self.contention_delay = pacing.next_delay(self.contentions or 1, self.contention_delay, rng)
        return self.contention_delay

    def next_poll(self, pacing: PacingPolicy, rng: random.Random) -> float:
        """The delay before the next read while a remove of ours may still land."""
        self.polls += 1
        self.poll_delay = pacing.next_delay(self.polls, self.poll_delay, rng)
        return self.poll_delay

    def next_backoff(self, backoff: PacingPolicy, rng: random.Random) -> float:
        """The backoff policy's delay after the latest transient failure."""
        self.backoff_delay = backoff.next_delay(self.transients, self.backoff_delay, rng)
        return self.backoff_delay

    def progress_due(self, now: float, interval: float) -> bool:
        """True (and noted) when a progress message is due: ``interval`` after the start, then at most
        once per ``interval``."""
        if now < self.progress_at(interval):
            return False
        self.last_progress = now
        return True

    def progress_at(self, interval: float) -> float:
        """When the next progress message is due: ``interval`` after the start, then after the last one."""
        return (self.start if self.last_progress is None else self.last_progress) + interval
