"""How a waiter waits (the default): it spins first, then parks in an advisory queue of ticket services.

``ReservationMutex`` (unless ``fair=False``) calls this module from its acquire loop (docs/protocol.md,
"Waiting in line"). The queue is *advisory*: mutual exclusion still rests on the add of the lock alias
alone. A corrupt, stale, missing or foreign queue costs speed, never safety, and code of the original
protocol (which knows nothing of tickets) keeps competing with the head as before.

* **Spin, then park.** After a busy add a waiter polls the add by the lock's pacing, with no ticket, for a
  few holds (:data:`SPIN_HOLDS`, within :data:`SPIN_MIN` and :data:`SPIN_MAX`): short waits cost what plain
  polling costs and leave no idle hand-off. A wait that grows past that takes a ticket (*parks*), and from
  then on is served in order. A waiter parks at once when its process saw others in line at its last read
  (usually the one after its first busy add: a spin would race them), when it holds other locks of the
  reservation, or when it finds a read group holding the lock (readers keep joining a group until a ticket
  is queued).
* **Long holds** are watched ever more rarely: a hold that has lasted T is likely to last a good part of
  T more, so the head polls no more often than every :data:`AGE_FRACTION` x T (on an old hold, slowing to
  one poll every :data:`OLD_HOLD_POLL` first), and the waiters behind it read every
  :data:`LINE_AGE_FRACTION` x T, waking when a ticket ahead is due to be judged stale.

* **A ticket** is a service ``<alias>~q~<n>`` of the lock's own model whose ``Mutex Owner`` is
  ``<token>#<lease>#<heartbeat>`` (the acquisition's token; the ticket's lease in seconds; a heartbeat
  value of :mod:`.lease`). Everything lives in ``Mutex Owner``, so the original package's model (that
  attribute only) carries tickets too. A waiter reads the reservation once, then adds the ticket after
  the highest number it saw, further on (spread at random) while the add says "already exists": the
  atomic add makes the numbers unique, and their order is the queue's order, without comparing any
  clocks. (The lowest free number would not do: a newcomer would take a number that the head just freed,
  ahead of everyone.)
* **The head** (the lowest ticket) polls the lock's add; the others only read the reservation, rarely:
  the further back, the rarer, so the whole queue stays within a per-lock call budget
  (:func:`wait_interval`), but each at least at half the time it expects to need to reach the front, and
  none before the hold it saw granted can be over (as short as the shortest hold timed lately).
  The ticket of the acquisition that got the lock is no waiter's any more (every view leaves out the
  ticket whose token the lock shows), so the next ticket is the head from the grant on.
  The holder keeps its ticket until its release removes it with the lock, in the same call: one call less
  per acquisition, and none between the grant and the caller's critical section.
* **Going to the back.** This process remembers, per lock, whether others were queued at its last read
  (the release reads the lock anyway). An acquisition that starts while others were seen waiting joins
  the queue before its first add, so a releaser that wants the lock again lines up behind them instead of
  winning the race it would otherwise always win (it asks one round trip after its own release).
* **Abandoned tickets** (a crashed waiter) are removed with the lease rules of :mod:`.lease`: a waiter
  judges the tickets ahead of its own, each stale once it has seen the same ticket and heartbeat unchanged
  for the ticket's lease + margin on its own clock, and removes the first stale one with a
  :class:`.lease.Breaker` (one breaker at a time). Waiters heartbeat their ticket every lease/3 after a
  read that shows it is still theirs.
* **Deadlocks** (:mod:`.waitfor`): a waiter that holds other locks of the reservation (``holding``) names
  them in its ticket; once it has waited :data:`~.waitfor.DETECT_AFTER`, it reads at least every
  :data:`~.waitfor.DETECT_INTERVAL` (the head too). A read that shows a wait-for cycle through its own wait
  makes it rewrite its ticket's heartbeat (a sign of life for the other members) and read again soon; it
  raises :class:`~.errors.MutexDeadlock` when it is the victim of a cycle whose other members all moved their
  records since it first saw it (:class:`~.waitfor.CycleWatch`). A waiter that holds nothing reads as before.
* **Every exit removes the ticket**: a timeout, an error, Ctrl-C (:meth:`FairQueue.leave`), and a hold that
  ends (the release's remove, or :class:`~.held.Held` when the hold ends any other way); a ticket add or
  remove without an answer goes to the late-add watcher (:mod:`.late_adds`), which removes the ticket if
  it shows this acquisition's token.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, List, Optional, Set, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue

from .. import protocol
from ..engine import Runtime
from ..holder import is_read_group
from ..lease import lease
from ..lease.lease import parse_ticket, ticket_value
from ..operation import LANDING_READ_INTERVAL, Operation
from ..options import FRESH_READ_LAG, default_logger
from ..protocol import ticket_alias, ticket_number
from ..server.alias import CallResult, LockAlias, Status
from . import waitfor
from .tickets import (
    HANDOFF,
    HEAD_MIN,
    HEAD_REST,
    LOCK_BUDGET,
    MAX_INTERVAL,
    MIN_INTERVAL,
    SPIN_MAX,
    SPIN_MIN,
    TICKET_LEASE,
    QueueView,
    TicketAlias,
    head_interval,
    memory_for,
    queue_view,
    wait_interval,
)

#: Ticket numbers tried after the first one said "already exists", before reading again.
JOIN_TRIES = 4
#: The head times its polls by the holders' observed tenure (False: it polls every head_interval).
HOLD_HINT = True
#: ... waking this fraction of a tenure before the expected release.
HINT_LEAD = 0.1
#: A read younger than this (seconds) is recent enough to join the queue by.
RECENT = 1.0
#: Jitter of every interval (a fraction), so that waiters do not poll in lock-step.
JITTER = 0.2
#: A new waiter *spins* first: it polls the add by the lock's pacing, as ``fair=False`` does, and takes no
#: ticket. Only a wait that grows past this many holds (within SPIN_MIN and SPIN_MAX seconds) *parks* it in
#: the queue: short waits cost no ticket and leave the lock no idle hand-off; long ones are served in order.
SPIN_HOLDS = 3.0
#: A waiter that has seen nothing move looks again after this many places at the guessed cadence (1 s): a
#: line of short holds (a grant every 0.15-0.3 s) is then seen move by its next look, not slept through.
GUESSED_PLACES = 2
#: A hold that has lasted T seconds is likely to last a good part of T more: once it is older than expected,
#: the head polls every AGE_FRACTION x T (the hand-off gap grows to a few % of the hold, the calls only
#: with its logarithm), and waiters further back read LINE_AGE_FRACTION x T apart; never slower than
#: AGE_MAX (seconds).
AGE_FRACTION = 1 / 40
LINE_AGE_FRACTION = 1 / 10
AGE_MAX = 10.0
#: ... and, from the start of an old hold, the head slows to one poll every OLD_HOLD_POLL seconds as
#: OLD_HOLD_RAMP x T reaches it: few calls on the minute-long holds of a job, a hand-off gap of about 0.8 s
#: on average (up to 1.8 s: the polls are jittered).
OLD_HOLD_POLL = 1.5
OLD_HOLD_RAMP = 1 / 10


#: What a queue ticket the late-add watcher settles for a waiter whose acquire ended is, in its messages.
LEFT_TICKET = "the queue ticket of an acquire that has ended"
LEFT_EXTRA = "an extra queue ticket of a waiter (an add of it was sent twice)"


class FairQueue:
    """One lock object's place in the advisory queue of its lock (see the module docstring).

    The queue runs no loop of its own: waiting in line is tries of the mutex's attempt. The attempt asks
    :meth:`lines_up_first` before its first add and :meth:`after_busy` after each busy add; while in line,
    each of its tries is one :meth:`step`. The mutex calls :meth:`saw` with each of its fresh reads, and
    :meth:`leave` when the acquire ends, however it ends.
    """

    def __init__(
        self,
        lock: LockAlias,
        *,
        label: str,
        request_lifetime: float,
        runtime: Runtime,
        looked: Optional[Callable[[Operation, CallResult], None]] = None,
        logger: Optional[logging.Logger] = None,
        budget: float = LOCK_BUDGET,
        ticket_lease: float = TICKET_LEASE,
        holding: Callable[[], Tuple[str, ...]] = tuple,
    ) -> None:
        self.lock = lock
        self.label = label
        self.budget = budget
        self.ticket_lease = ticket_lease
        self.request_lifetime = request_lifetime
        self.memory = memory_for(lock.api, lock.reservation_id, lock.alias)
        self.logger = default_logger(logger)
        self.runtime = runtime
        self._clock = runtime.clock
        self._rng = runtime.rng
        # Each read in line, ``looked(op, result)``: the mutex takes it as its own holder check.
        self._looked = looked or (lambda op, result: None)
        # The tokens of what this waiter's thread holds in the reservation, named in its ticket.
        self._holding = holding
        self._aliases: Dict[int, TicketAlias] = {}
        # Tickets ahead whose waiter died are broken as a waiting mutex breaks a stale holder.
        self._breaker = lease.Breaker(lock.sibling, label, ticket_lease, request_lifetime, runtime)
        #: The model refused a ticket (no ``Mutex Owner``): this object waits the default way from now on.
        self.off = False
        self._reset()

    def _reset(self) -> None:
        self.token: Optional[str] = None
        self.ticket: Optional[TicketAlias] = None
        self.head = False
        self._beats = 0
        self._beat_at = -math.inf
        self._unsettled: List[Tuple[TicketAlias, float, int]] = []  # ticket adds without an answer
        self._removed: Set[int] = set()  # numbers of ours already removed: never remove one twice
        self._sent_until: Dict[int, float] = {}  # each number we sent an add for: until when a copy may land
        self._dropped: List[TicketAlias] = []  # tickets of ours a read did not show (gone, or a lagging read)
        self._free_seen: Optional[Tuple[float, str]] = None  # (when, head token) the lock was seen free
        self._hinted = False  # the head slept until shortly before the expected release
        self._misses = 0  # the head's polls since then
        self._hinted_for: Optional[str] = None  # the holder whose release both are about
        self._holds: Optional[Tuple[str, ...]] = None  # what this waiter holds (see _claims)
        self._looked_at = -math.inf  # the last read in line
        self._cycles: Optional[waitfor.CycleWatch] = None  # the cycles through our wait (holding others)
        self._cycle_told = False  # a deadlock another waiter gives up for was logged
        self._place: Optional[Tuple[int, float]] = None  # (position, when) at the last look in line

    # ---------------------------------------------------------------- the mutex's hooks

    def saw(self, result: CallResult, token: Optional[str] = None) -> Optional[QueueView]:
        """Take in a fresh read of the lock (the mutex's own, or the queue's): remember who waits."""
        if not result.ok or result.services is None:
            return None
        view = queue_view(result.services, self.lock.alias, result.sent_at, result.answered_at)
        view = self.memory.update(view, token if token is not None else self.token)
        if self.head and self.token is not None and (view.position(self.token) or 1) > 1:
            self.head = False  # a ticket ahead of ours after all (a join from an old read): wait in line
        return view

    def lines_up_first(self) -> bool:
        """True when others were queued at this process's last read of the lock: a blocking acquire lines up
        behind them before its first add (a releaser that asks again goes to the back). Otherwise it adds at
        once: an uncontended lock costs what it always did."""
        return not self.off and self.memory.crowded(self._clock())

    def after_busy(self, op: Operation, default: float) -> Optional[float]:
        """After a busy add: the delay before the next add while this waiter spins (``default``, the lock's
        pacing, also when the queue is off) or is the head (timed to the expected release); None when it
        must park, waiting in line first (:meth:`step`, taking a ticket if it has none)."""
        if self.off:
            return default
        self.token = op.token
        if self.ticket is None and self._spinning(op):
            return default
        if self.ticket is not None and self.head:
            now = self._clock()
            if now >= self._beat_due_at() or self._detect_due(op) or self._look_due_as_old(now):
                view = self._look_and_beat(op)
                if view is not None and view.holder is not None and view.holder.token == op.token:
                    return 0.0  # an add of ours landed late: the next add reads and settles it, no sleep
            if self.ticket is not None:
                return self._detecting(op, self._head_delay(default, op.add_sent_at))
        return None

    def _spinning(self, op: Operation) -> bool:
        """True while this waiter spins rather than parks: it holds no other lock of the reservation (such a
        waiter parks at once, its ticket naming them for the deadlock check), the lock is not held by a read
        group, nobody was queued at this process's last read (:meth:`~.tickets.LockMemory.crowded`), and it
        has waited less than SPIN_HOLDS holds, within SPIN_MIN and SPIN_MAX."""
        if self._claims():
            return False
        if self.memory.crowded(self._clock()):
            # Others wait in line (this process's last read, usually the one after our first busy add, showed
            # them): a spin would only race them for the next hand-off, or let a releaser that lines up first
            # go ahead of us before we park.
            return False
        if is_read_group(op.holder):
            # Readers join a group while no waiter is queued, so no spin outlasts a stream of them: our
            # ticket is what stops new readers (rw/readview.py, waiter_queued).
            return False
        spin = min(SPIN_MAX, max(SPIN_MIN, SPIN_HOLDS * self.memory.hold_estimate()))
        return self._clock() - op.start < spin

    def _claims(self) -> Tuple[str, ...]:
        """The tokens of what this waiter's thread holds in the reservation, asked once per acquisition."""
        if self._holds is None:
            self._holds = tuple(self._holding())
        return self._holds

    def _head_delay(self, default: float, sent_at: Optional[float] = None) -> float:
        """The head's next poll. With :data:`HOLD_HINT` and a holder whose grant this process saw: sleep
        until shortly before its expected release, poll fast around it, slower again after each miss past
        it; else every :func:`head_interval` while the hold is young (SPIN_HOLDS holds), by the lock's
        pacing (``default``) once it is older (the head then costs no more than a plain poller). Past the
        expected release (or with none), never more often than every AGE_FRACTION of the hold's age.
        While the hold is young, each interval counts from ``sent_at`` (the send of the add just answered;
        None: from now), but ends HEAD_REST after now at the earliest; an old hold's from now, as a plain
        poller's pause."""
        now = self._clock()
        spent = 0.0 if sent_at is None or self._old_hold(now) else now - sent_at

        def polls_every(seconds: float) -> float:
            return max(HEAD_REST, seconds - spent)

        regular = max(head_interval(self.memory.cadence()), self._old_hold_floor(now, default))
        release = self.memory.expected_release() if HOLD_HINT else None
        if release is None:
            return polls_every(self._jitter(self._head_aged(regular, now)))
        hold = self.memory.hold_estimate()
        if self._hinted_for != self.memory.holder:
            # Another holder since (a hand-off this head lost): its release is the one to poll around, and to
            # sleep until when reads close together dated its grant (a wide bracket would sleep past it).
            self._hinted_for, self._misses = self.memory.holder, 0
            self._hinted = self._hinted and self.memory.holder_hi - self.memory.holder_lo > hold / 2
        early = release - HINT_LEAD * hold
        if now < early and not self._hinted:
            # Asleep until then, but never past a heartbeat of our ticket (a long hold would otherwise let
            # the waiters behind judge it stale): the head wakes, beats and sleeps again.
            if early - now <= self.ticket_lease / 3:
                self._hinted = True  # then polls: the hint is an estimate
            return min(early - now, self.ticket_lease / 3)
        # Around the expected release: every 1/10 of a hold; past it, slower after each miss.
        fast = max(HEAD_MIN, min(regular, hold / 10))
        if now <= release + HINT_LEAD * hold:
            return polls_every(self._jitter(fast))
        self._misses += 1
        missed = min(regular, fast * 2 ** min(self._misses, 8))
        return polls_every(self._jitter(self._head_aged(missed, now)))

    def _look_due_as_old(self, now: float) -> bool:
        """True when the head is to look before it polls a hold as old (by the lock's pacing, a second or
        more apart): busy adds do not say who holds, and the lock may have changed hands since the read that
        showed the holder (a hand-off the head lost is a young hold). One look (failed or not) as the hold
        turns old, then one each time its age doubles since the last look or read: a hand-off lost at the
        end of a long hold is seen in a fraction of it, for a few reads (the holder checks come on top).
        Never before the hold is OLD_HOLD_POLL old: a look is worth it only where the polls slow down more
        than that (holds timed in milliseconds would otherwise make a look of every other poll)."""
        if not self._old_hold(now):
            return False
        first_seen = self.memory.holder_hi
        looked = max(self._looked_at, self.memory.holder_seen_to)
        return now >= first_seen + max(self._old_age(), OLD_HOLD_POLL, 2 * (looked - first_seen))

    def _old_age(self) -> float:
        """The age (seconds) from which a hold counts as old: SPIN_HOLDS holds."""
        return SPIN_HOLDS * self.memory.hold_estimate()

    def _old_hold(self, now: float) -> bool:
        """True once the hold has surely lasted SPIN_HOLDS holds: from then on it is watched ever more rarely.
        Counted from the first read that showed the holder: a grant between two reads far apart may be as
        recent as the second, and a young hold polled as old leaves the lock free a second at its end."""
        return self.memory.holder_age_at_least(now) >= self._old_age()

    def _old_hold_floor(self, now: float, default: float) -> float:
        """``default`` (the lock's pacing) on an old hold, else 0: the head of an old hold polls, and the next
        in line reads, no more often than a plain poller polls."""
        return default if self._old_hold(now) else 0.0

    def _head_aged(self, seconds: float, now: float) -> float:
        """``seconds``, but on an old hold no less than OLD_HOLD_POLL (reached by OLD_HOLD_RAMP of its age),
        then AGE_FRACTION of its age: the head's hand-off gap stays a few % of the hold."""
        aged = self._aged(seconds, AGE_FRACTION, now)
        if not self._old_hold(now):
            return aged
        return max(aged, min(OLD_HOLD_POLL, OLD_HOLD_RAMP * self.memory.holder_age(now)))

    def _aged(self, seconds: float, fraction: float, now: float) -> float:
        """``seconds``, but no less than ``fraction`` of the holder's age (at most AGE_MAX): a long hold is
        watched ever more rarely, its hand-off gap a few % of its length (AGE_FRACTION)."""
        return max(seconds, min(AGE_MAX, fraction * self.memory.holder_age(now)))

    def held_for(self, seconds: float, token: str) -> None:
        """This process held the lock ``seconds`` (from its grant to its release) as ``token``: a sample of
        the hold time that needs no reads (the others' holds are timed only between reads close enough to
        tell)."""
        self.memory.own_hold(seconds, token)

    def leave(self, granted: bool = False) -> Optional[TicketAlias]:
        """The acquire ended (the lock granted, a timeout, an error, Ctrl-C): give up our place, and hand
        every ticket add of ours without an answer to the late-add watcher. Never raises.

        ``granted``: the lock is ours, and the ticket is returned instead of removed, for the release to
        remove with the lock in one call. It waits no more: every view leaves out the holder's ticket
        (:func:`~.tickets.queue_view`), so the next ticket is the head from the grant on, as if it were gone.
        None when there is no ticket, one that an add still on the wire may bring back, or one that names
        held locks (:mod:`.waitfor`): those are removed now."""
        ticket, unsettled, dropped, token = self.ticket, self._unsettled, self._dropped, self.token
        holds, extras, sent_until = self._holds, self._removed, self._sent_until
        late_adds = self.runtime.late_adds
        self._reset()
        if token is None:
            return None
        kept: Optional[TicketAlias] = None
        try:
            # A ticket that names held locks goes now: should this hold be lost (a lease broken), the ticket
            # would be a waiter's again in every view, and its claims could make a cycle that is not there.
            if (
                ticket is not None
                and granted
                and not holds
                and all(alias is not ticket for alias, _, _ in unsettled)
            ):
                kept = ticket
            elif ticket is not None:
                # Its number may be the next waiter's once gone: no second remove while one may land.
                late_adds.remove_or_watch(ticket, token, self.request_lifetime, leftover=LEFT_TICKET)
            # Each watched until a copy can no longer land, and read at least once (one read that does not
            # lag): a copy may have landed inside a window that passed while we waited.
            settle_from = self._clock() + FRESH_READ_LAG

            def settle(alias: TicketAlias, lands_by: float, copies: int = 1, leftover: str = "") -> None:
                until = max(lands_by, settle_from)
                late_adds.watch(alias, token, until, self.request_lifetime, copies, leftover=leftover)

            for alias in dropped:  # committed long ago: removed if a read shows our token
                settle(alias, -math.inf, leftover=LEFT_TICKET)
            for number in extras:
                # An extra ticket exists because a copy of an add landed that we did not count on; another
                # may land after our remove of it, whatever its answer said.
                settle(self._alias(number), sent_until.get(number, -math.inf), leftover=LEFT_EXTRA)
            for alias, lands_by, copies in unsettled:  # a copy may land after our remove, even of our ticket
                settle(alias, lands_by, copies)
        except Exception:  # a ticket left behind costs speed (others break it later), never safety
            self.logger.debug("cloudshell-mutex: could not remove the queue ticket", exc_info=True)
        return kept

    # ---------------------------------------------------------------- waiting in line

    def step(self, op: Operation, first: bool, default: float) -> Tuple[bool, float]:
        """One look at the queue (a read, and a join or a heartbeat), as one try of the mutex's attempt:
        (True, the delay before the next add) once the wait in line is over, else (False, the seconds until
        the next look). ``first``: before the first add (nobody waiting and the lock free: add at once);
        ``default``: the delay when the queue cannot help (a failing read, tickets refused)."""
        self.token = op.token
        if op.wait.passed():
            return True, 0.0  # the mutex's loop gives up (or, for the first add, tries once)
        view = self._recent_view(self._clock()) if self.ticket is None else None
        view = view or self._look(op)
        if view is None:
            return True, default  # the lock's own loop deals with a failing server
        if view.holder is not None and view.holder.token == op.token:
            # An add of ours landed late (every view hides the holder's ticket, ours too): the lock is ours,
            # and the mutex's add and read settle it. Waiting on would hold it for nobody until our timeout.
            return True, 0.0
        if first and not view.tickets and view.holder is None:
            return True, 0.0  # nobody waits and the lock is free: no ticket needed
        if view.mine(op.token):
            position = view.position(op.token) or 1
        else:
            if not self._join(op, view):
                return True, default
            if self.ticket is None:
                return False, MIN_INTERVAL  # not granted yet (an add without an answer, or numbers taken)
            mine = ticket_number(self.ticket.alias, self.lock.alias)
            if mine != view.highest + 1:
                return False, 0.0  # numbers were taken since that read: read who is ahead of us
            position = 1 + len(view.tickets)
        if position == 1:
            self.head = True
            self._judge_ahead(op, view, position)  # the tickets it passed still go by the lease
            # The head's first add: at once when the lock is free (or shows our own add, landed late), else
            # when the hint expects the release (an add before it would only find the lock busy).
            free = view.holder is None or view.holder.token == op.token
            return True, 0.0 if free else self._detecting(op, self._head_delay(default))
        if self._head_seems_gone(view):
            return True, 0.0
        self._judge_ahead(op, view, position)
        self._beat(op)
        now, waiters = self._clock(), len(view.tickets)
        interval = min(
            wait_interval(position, waiters, self.memory.cadence(), self.budget),
            self._half_way(position, now),
        )
        # On a long hold the line does not move: its reads spread out with the hold's age. The next in line
        # reads no more often than the head polls (a read can only find the head granted by one of the
        # head's polls), and no waiter sleeps past the moment a ticket ahead would be judged stale.
        if position == 2:
            interval = max(interval, self._old_hold_floor(now, default))
        interval = self._jitter(self._aged(interval, LINE_AGE_FRACTION, now))
        interval = max(interval, self._until_hold_over(now))
        interval = min(interval, max(MIN_INTERVAL, self._judged_by(view, position) - now))
        self._place = (position, now)
        wait = self._detecting(op, interval)
        if op.add_can_land(now):
            wait = min(wait, LANDING_READ_INTERVAL)  # its landing makes the lock ours: look as the mutex does
        return False, wait

    def _judged_by(self, view: QueueView, position: int) -> float:
        """When the first ticket ahead of ours would be judged stale if nothing changes (monotonic; inf:
        never): a read then breaks an abandoned ticket on time, however rarely the line reads."""
        return self.memory.judged_by(view.passed + view.tickets[: position - 1])

    def _recent_view(self, now: float) -> Optional[QueueView]:
        """A read of this process made a moment ago (the mutex's after a busy add, or the release's of the
        acquisition before): no need to read again to join."""
        view, self.memory.view = self.memory.view, None
        return view if view is not None and now - view.at < RECENT else None

    def _until_hold_over(self, now: float) -> float:
        """Seconds until the hold this waiter saw granted can be over and the head's add have landed (0:
        unknown, or already), at most until the next heartbeat of our ticket is due and MAX_INTERVAL. Until
        then no ticket leaves the line by a grant, so a look shows the line where it was: the next in line
        reads when it can be the head, not every third of a hold before that. The hold counts as the
        shortest timed lately, or the cadence when the line was seen moving faster (this process's one long
        hold says little of the others')."""
        granted, shortest = self.memory.granted_at(), self.memory.shortest_hold()
        if granted is None or shortest is None or self.memory.holds_own_released():
            # Our own hold, seen by the release's read: it is over, and the next grant comes at once.
            return 0.0
        hold = min(shortest, self.memory.cadence())
        return max(0.0, min(granted + hold + HANDOFF - now, self._beat_due_at() - now, MAX_INTERVAL))

    def _half_way(self, position: int, now: float) -> float:
        """Half the time until this waiter is the head: each look halves the distance, so a line that moves
        faster than the estimates (a burst of short holds) is never read too late, and a slow one costs a
        few reads more, not a turn.

        The time is the faster of two estimates, one cadence per place and the rate this waiter saw the
        line move between its last two looks: either may be off (a rate seen over one departure is mostly
        noise), and a look too late leaves the lock idle for the rest of our turn, where one too early
        costs a call. A process that has learnt no pace (no period sampled, no short hold timed) counts
        :data:`GUESSED_PLACES` places at most, unless its reads showed one holder for that long (a long
        hold: the line does not move): its cadence is then a guess, and a line of short holds moves many
        times faster (a waiter far back slept through dozens of turns on it)."""
        cadence = self.memory.cadence()
        turn = (position - 1) * cadence
        if self._place is not None:
            before, at = self._place
            if before > position and now > at:
                turn = min(turn, (position - 1) * (now - at) / (before - position))
        guess = GUESSED_PLACES * cadence
        if not self.memory.knows_pace() and self.memory.holder_seen_for() < guess:
            turn = min(turn, guess)
        return max(MIN_INTERVAL, turn / 2)

    def _look(self, op: Operation) -> Optional[QueueView]:
        """One fresh read of the reservation: the lock and its queue (None when the read failed)."""
        result = self.lock.read(paced=op.polling, deadline=op.wait)
        self._looked_at = self._clock()
        self._looked(op, result)
        view = self.saw(result, op.token)
        if view is None:
            return None
        mine = view.mine(op.token)
        if mine:
            # The lowest of our tickets is our place; another one (a late add of ours) goes, settled like any
            # remove (a failed or unanswered one is left to the late-add watcher, which removes it while it
            # shows our token), and once: a read that lags may still show one we removed, and its number may
            # be someone else's by now.
            self.ticket = self._alias(mine[0].number)
            for extra in mine[1:]:
                if extra.number not in self._removed:
                    self._removed.add(extra.number)
                    self.runtime.late_adds.remove_or_watch(
                        self._alias(extra.number),
                        op.token,
                        self.request_lifetime,
                        leftover=LEFT_EXTRA,
                    )
            if self._holds:
                self._find_deadlock(op, result)
        elif self.ticket is not None and not self._kept_under_our_hold(view, result, op.token):
            # Removed (judged stale by a waiter behind us), or a read that lags: join again, at the back,
            # and leave the old one to the late-add watcher at the end, which removes it if it is there.
            self._dropped.append(self.ticket)
            self.ticket = None
            self.head = False
        return view

    def _kept_under_our_hold(self, view: QueueView, result: CallResult, token: str) -> bool:
        """True when a read that shows an add of ours landed late (we hold the lock) shows our ticket too,
        still with our token: every view hides the holder's ticket, but it stays ours, for the release to
        remove with the lock. Gone or someone else's by now: dropped, as any ticket a read does not show."""
        if self.ticket is None or view.holder is None or view.holder.token != token:
            return False
        shown = (result.services or {}).get(self.ticket.alias)
        parsed = parse_ticket(shown.token) if shown is not None else None
        return parsed is not None and parsed[0] == token

    def _join(self, op: Operation, view: QueueView) -> bool:
        """Add a ticket after the highest number seen; False when the model refuses tickets."""
        number = view.highest + 1
        value = ticket_value(op.token, self.ticket_lease, 0, self._claims())
        for tries in range(JOIN_TRIES):
            alias = self._alias(number)
            # Interrupted on its way (Ctrl-C), the add may still land: leave() watches it meanwhile.
            on_the_wire = (alias, self._clock() + self.request_lifetime, 1)
            self._unsettled.append(on_the_wire)
            result = alias.try_add(
                [AttributeNameValue(protocol.ATTR_OWNER, value)], paced=op.polling, deadline=op.wait
            )
            self._unsettled.remove(on_the_wire)
            self._sent_until[number] = self._clock() + self.request_lifetime
            until = result.unsettled(self.request_lifetime, self._clock())
            if until is not None:
                self._unsettled.append((alias, *until))
            if result.ok:
                self.ticket, self._beats, self._beat_at = alias, 0, result.sent_at
                return True
            if result.status is Status.BUSY:
                # Others joined at the same moment from the same read: spread out, 4 times wider after
                # each "already exists" (numbers need not be dense), or N waiters that start together
                # would make about N^2 adds on the same few numbers.
                number += 1 + self._rng.randrange(4 ** (tries + 1))
                continue
            if result.status is Status.FATAL and result.failure is not None and result.failure.code:
                # The model takes no Mutex Owner (the attribute-less original package): no queue here.
                self.off = True
                self.logger.info(
                    "cloudshell-mutex: the server refused a queue ticket for %s (%s); waiting without the "
                    "fair queue",
                    self.lock.alias,
                    result.failure.message,
                )
                return False
            return True  # no answer: the next read shows whether it landed (self.ticket stays None)
        return True  # numbers taken meanwhile: the next read shows the new highest

    def _alias(self, number: int) -> TicketAlias:
        alias = self._aliases.get(number)
        if alias is None:
            alias = self._aliases[number] = self.lock.sibling(
                ticket_alias(self.lock.alias, number), TicketAlias
            )
        return alias

    def _head_seems_gone(self, view: QueueView) -> bool:
        """The lock free at two reads :meth:`~.tickets.LockMemory.fallback_after` apart, with the same
        head: add without waiting for it."""
        if view.holder is not None or not view.tickets:
            self._free_seen = None
            return False
        head = view.tickets[0].token
        if self._free_seen is None or self._free_seen[1] != head:
            self._free_seen = (view.at, head)
            return False
        # A hold the head watched as old (SPIN_HOLDS holds from its first read, as _old_hold judges it) was
        # polled by the pacing.
        ended_old = self.memory.ended_hold_in_holds >= SPIN_HOLDS
        return view.at - self._free_seen[0] >= self.memory.fallback_after(after_old_hold=ended_old)

    def _judge_ahead(self, op: Operation, view: QueueView, position: int) -> None:
        """Break the first ticket ahead of ours that this process has seen unchanged for its lease + margin
        (lease.py's rules, one breaker at a time). The judgement is the process's (:class:`LockMemory`), so
        it survives this process's acquisitions: a dead ticket at the head is judged even when every waiter
        passes it (by the fallback) sooner than a lease."""
        now = self._clock()
        ahead = view.passed + view.tickets[: position - 1]  # passed tickets too: gone ones go by the lease
        stale = [t for t in ahead if self.memory.stale(t.alias, now)]
        if not stale:
            return
        dead = stale[0]
        alias = self._alias(dead.number)
        result = self._breaker.break_holder(alias, self.memory.watches[dead.alias])
        if result.broken:
            self.memory.watches.pop(dead.alias, None)
            self.logger.info(
                "cloudshell-mutex: removed the abandoned queue ticket %s (%s)",
                alias.alias,
                dead.holder.label,
            )

    def _look_and_beat(self, op: Operation) -> Optional[QueueView]:
        view = self._look(op)
        if view is not None:
            self._beat(op)
            if self.head:
                self._judge_ahead(op, view, 1)  # the tickets the head passed go by the lease
        return view

    def _beat_due_at(self) -> float:
        """When our ticket's next heartbeat is due: lease/3 after the last one written."""
        return self._beat_at + self.ticket_lease / 3

    def _beat(self, op: Operation, now: bool = False) -> None:
        """Rewrite our ticket's heartbeat every lease/3 (``now``: at once, for a deadlock's other members to
        see us live), right after a read that showed it is ours."""
        if self.ticket is None or (not now and self._clock() < self._beat_due_at()):
            return
        self._beats += 1
        value = ticket_value(op.token, self.ticket_lease, self._beats, self._holds or ())
        written = self.ticket.set_attributes([(protocol.ATTR_OWNER, value)], paced=op.polling)
        if written.ok:
            self._beat_at = written.sent_at

    # ---------------------------------------------------------------- deadlocks (waitfor.py)

    def _detect_interval(self) -> float:
        """Seconds between two deadlock checks: sooner while a cycle through our wait awaits confirmation."""
        pending = self._cycles is not None and self._cycles.pending
        return waitfor.CONFIRM_INTERVAL if pending else waitfor.DETECT_INTERVAL

    def _detect_due(self, op: Operation) -> bool:
        """True when this waiter names held locks, has waited DETECT_AFTER, and read an interval ago."""
        now = self._clock()
        waited, since = now - op.start, now - self._looked_at
        return bool(self._holds) and waited >= waitfor.DETECT_AFTER and since >= self._detect_interval()

    def _detecting(self, op: Operation, seconds: float) -> float:
        """``seconds`` until the next look, but no later than the next deadlock check is due (a waiter that
        names held locks: every check's interval, and not before DETECT_AFTER). Others: ``seconds``."""
        if not self._holds:
            return seconds
        # From the last look, jittered only upwards: the head reads at its next add only once a check is due.
        next_check = self._looked_at + self._detect_interval() * self._rng.uniform(1, 1 + JITTER)
        due = max(next_check, op.start + waitfor.DETECT_AFTER) - self._clock()
        return min(seconds, max(0.0, due))

    def _find_deadlock(self, op: Operation, result: CallResult) -> None:
        """Raise MutexDeadlock when this read confirms a wait-for cycle through our wait whose victim we are;
        a cycle seen, confirmed or not, makes us rewrite our ticket's heartbeat (a sign of life)."""
        if self._cycles is None or self._cycles.token != op.token:
            self._cycles = waitfor.CycleWatch(op.token)
        cycle = op.cycle = self._cycles.judge(waitfor.wait_for(result.services or {}))
        if self._cycles.cycle is None:
            return
        self._beat(op, now=True)  # seen, confirmed or not: a sign of life for the other members
        if cycle is None:
            return
        if cycle.victim != op.token:
            if self._cycle_told:
                return
            self._cycle_told = True
            self.logger.info(
                "cloudshell-mutex: a deadlock through %s (%s); another waiter of it gives up",
                self.lock.alias,
                cycle.describe(op.token),
            )
            return
        raise waitfor.deadlock_error(cycle, op.token, self.lock.reservation_id, self.lock.alias)

    def _jitter(self, seconds: float) -> float:
        return seconds * self._rng.uniform(1 - JITTER, 1 + JITTER)
