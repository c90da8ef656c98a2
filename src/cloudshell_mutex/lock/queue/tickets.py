"""The fair queue's values: tickets, what one read shows of a lock's queue, how often each waiter reads,
and what this process remembers of each lock. No calls are made here; :mod:`.queue` makes them.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from ..engine import Wait
from ..holder import Holder, proves_release
from ..lease import lease
from ..lease.lease import parse_ticket, ticket_holder
from ..protocol import releasing_alias, ticket_number
from ..server.alias import CallResult, LockAlias

#: A ticket's lease (seconds): its waiter rewrites the heartbeat every lease/3 while it waits. Long,
#: because at N=32 every waiter's heartbeat is a write on the shared server (32 x 3/120 = 0.8 calls/s);
#: a crashed waiter's ticket is removed lease + margin (150 s) after it stopped.
TICKET_LEASE = 120.0
#: The whole lock's call budget (calls/s on the server, all waiters together) that the queue aims for.
LOCK_BUDGET = 5.0
#: Calls one contended acquisition costs whatever the polling: the add that found the lock busy, a read,
#: the ticket's add, the granted add, the release's read and its remove (of the lock and the ticket).
ACQUISITION_CALLS = 6
#: The waiters behind the next in line share at least this many calls/s (the budget's spare, when the
#: acquisitions alone do not exceed it).
MIN_WAIT_RATE = 0.5
#: The head polls the lock's add every period/4, within these bounds (seconds), counted from the send of
#: its last add (from the answer, half a round trip more went into every hand-off on average) ...
HEAD_MIN, HEAD_MAX = 0.1, 1.0
#: ... but at least this long after that add's answer (seconds): a slow server slows the polls down.
HEAD_REST = 0.05
#: A waiter that is not the head reads the reservation at most this often, and at least this rarely.
MIN_INTERVAL, MAX_INTERVAL = 0.25, 30.0
#: The period (seconds from one grant to the next) assumed before a waiter has seen the queue move.
DEFAULT_PERIOD = 1.0
#: A holder that follows one whose release was expected between two reads was granted no earlier than
#: this fraction of a hold before that expected release (the estimate's allowance for holds that vary).
RELEASE_SLACK = 0.2
#: What a hand-off costs on top of a hold, at most, in the cadence the queue paces itself by (seconds).
HANDOFF = 0.25
#: How many recent samples of the period and of the hold time the estimates take the median of.
SAMPLES = 7
#: How long this process remembers that others were queued at its last read of a lock.
MEMORY_SECONDS = 60.0
#: A waiter that saw the lock free at two reads this far apart, with the same head both times, adds
#: anyway: the head is gone or stuck, and the queue must not stall the lock (it is only advisory).
FALLBACK_AFTER = 3.0
#: Once the line was seen to move, the fallback comes after this many cadences (a live head polls the add
#: about once a cadence at that pace), never sooner than FALLBACK_FLOOR seconds nor later than FALLBACK_AFTER.
FALLBACK_CADENCES = 2.0
FALLBACK_FLOOR = 1.0
#: A waiter spins (polls the add with no ticket, queue.py) for at least SPIN_MIN and at most SPIN_MAX seconds.
SPIN_MIN, SPIN_MAX = 1.0, 5.0
#: A ticket that this many waiters were served past is passed (its waiter is gone, stopped or too slow):
#: one is no sign, as the next in line may fall back past a live head asleep on the hold-time hint, and code
#: that does not queue may win a hand-off from it.
PASS_AFTER = 2
#: A grant to an acquisition with no ticket counts against the head only once this process has seen the
#: head's ticket unchanged this long (seconds): a waiter that spins parks within SPIN_MAX of its start (and
#: one pacing interval), and one that starts after the ticket landed sees the line and parks at once, so a
#: grant after that is code that does not queue, not a spinner that won a hand-off from a live head.
TICKETLESS_AFTER = SPIN_MAX + 1.0


class TicketAlias(LockAlias):
    """One ticket alias: a :class:`LockAlias` whose reads show the ticket's token as the holder's, so the
    late-add watcher and the stale-lock breaker work on tickets as they do on the lock."""

    def owner_shown(self, token: str) -> str:
        """A ticket's ``Mutex Owner`` starts with its waiter's token (then its lease and heartbeat)."""
        return f"starting with {token + '#'!r}"

    def read(self, *, paced: bool = False, deadline: Optional[Wait] = None) -> CallResult:
        """One fresh read; the holder of the ticket alias as :func:`ticket_holder` makes it."""
        result = super().read(paced=paced, deadline=deadline)
        if result.holder is None:
            return result
        return dataclasses.replace(result, holder=ticket_holder(result.holder))


# ---------------------------------------------------------------- what one read shows


@dataclass(frozen=True)
class Ticket:
    """One ticket in a read: its number, its alias and its holder (as :func:`ticket_holder` makes it)."""

    number: int
    alias: str
    holder: Holder

    @property
    def token(self) -> str:
        """The token of the acquisition that queued with it."""
        return self.holder.token


@dataclass(frozen=True)
class QueueView:
    """The lock and its queue in one fresh read.

    ``tickets`` are the parseable tickets in queue order, without the one of the lock's holder (it keeps
    its ticket until its release removes it with the lock: the ticket is not a waiter's), and without
    the ones this process passes over (``passed``: see :class:`LockMemory`).
    ``highest`` is the highest ticket number of any value, foreign ones too (-1: none). ``releasing``: the
    holder's ``~releasing`` marker is there (its remove got no answer, and the lock stays held until it
    lands or can no longer land).
    """

    holder: Optional[Holder]
    tickets: Tuple[Ticket, ...]
    highest: int
    at: float
    passed: Tuple[Ticket, ...] = ()
    releasing: bool = False
    #: When the read's answer came (None: at ``at``): the tickets' leases are judged from it.
    answered_at: Optional[float] = None

    def position(self, token: str) -> Optional[int]:
        """1 for the head, 2 for the next, ...; None when ``token`` has no ticket here."""
        for index, ticket in enumerate(self.tickets, 1):
            if ticket.token == token:
                return index
        return None

    def mine(self, token: str) -> List[Ticket]:
        """The tickets of ``token`` (normally one; a late add of ours may make two)."""
        return [t for t in self.tickets if t.token == token]

    def others(self, token: Optional[str]) -> int:
        """How many tickets belong to other acquisitions."""
        return sum(1 for t in self.tickets if t.token != token)

    def passing(self, passed: Mapping[str, str], token: Optional[str]) -> QueueView:
        """This view without the tickets in ``passed`` (alias -> heartbeat; a ticket whose heartbeat moved
        since is kept), and never without ``token``'s: they go to :attr:`passed`."""
        skipped = tuple(t for t in self.tickets if t.token != token and passed.get(t.alias) == _beat_of(t))
        if not skipped:
            return self
        kept = tuple(t for t in self.tickets if t not in skipped)
        return dataclasses.replace(self, tickets=kept, passed=skipped)


def _beat_of(ticket: Ticket) -> str:
    return lease.own_heartbeat(ticket.holder)  # a ticket's heartbeat, as its waiter wrote it


def queue_view(
    services: Mapping[str, Holder], alias: str, at: float, answered_at: Optional[float] = None
) -> QueueView:
    """The queue of the lock ``alias`` in a read sent at ``at`` (answered at ``answered_at``)."""
    holder = services.get(alias)
    tickets = []
    highest = -1
    for name, service in services.items():
        number = ticket_number(name, alias)
        if number is None:
            continue
        highest = max(highest, number)
        ticket = Ticket(number, name, ticket_holder(service))
        if parse_ticket(service.token) is None:
            continue  # foreign or corrupt: not a waiter, only a number taken
        if holder is not None and ticket.token == holder.token:
            continue  # the holder's own ticket, not removed yet
        tickets.append(ticket)
    tickets.sort(key=lambda t: t.number)
    marker = services.get(releasing_alias(alias))
    releasing = holder is not None and marker is not None and proves_release(marker.token, holder.token)
    return QueueView(holder, tuple(tickets), highest, at, releasing=releasing, answered_at=answered_at)


# ---------------------------------------------------------------- the budget


def harmonic(count: int) -> float:
    """1 + 1/2 + ... + 1/count (0 for count < 1)."""
    return sum(1.0 / i for i in range(1, count + 1))


def head_interval(period: float) -> float:
    """Seconds between the head's adds: a quarter of the period between grants, within the bounds."""
    return min(HEAD_MAX, max(HEAD_MIN, period / 4))


def wait_rate(waiters: int, period: float, budget: float = LOCK_BUDGET) -> float:
    """Calls/s left to the waiters behind the next in line: the lock's budget minus the head's polling,
    the acquisitions themselves and the tickets' heartbeats (at least :data:`MIN_WAIT_RATE`)."""
    spent = 1.0 / head_interval(period) + ACQUISITION_CALLS / period + waiters * 3.0 / TICKET_LEASE
    return max(MIN_WAIT_RATE, budget - spent)


def wait_interval(position: int, waiters: int, period: float, budget: float = LOCK_BUDGET) -> float:
    """Seconds between two reads of the waiter at ``position`` (2 = next after the head) of ``waiters``.

    * The next in line reads every period/3 (as often as the head polls, at short holds): it becomes the
      head when the head is granted, and must learn it before the lock is free again.
    * The waiter at position p > 2 reads every (p - 2) x c, with c chosen so that all of them together
      make :func:`wait_rate` calls/s (the sum of 1/((p - 2) c) is harmonic(waiters - 2) / c), but c is
      never more than one period: a waiter must not sleep through its own turn, or the lock stands free.
      When the budget asks for more than a period (holds short against the queue's length), the budget
      yields: the lock cannot be both within it and moving (docs/protocol.md has the figures).
    * Nobody reads more often than its turn can come: (p - 1) periods away, so every (p - 1) x period/2.
    """
    if position <= 2:
        return min(MAX_INTERVAL, max(HEAD_MIN, period / 3))
    spacing = min(period, harmonic(waiters - 2) / wait_rate(waiters, period, budget))
    interval = max((position - 2) * spacing, (position - 1) * period / 2)
    return min(MAX_INTERVAL, max(MIN_INTERVAL, interval))


def queue_calls_per_second(waiters: int, period: float, budget: float = LOCK_BUDGET) -> float:
    """The calls/s a queue of ``waiters`` makes while it waits (polling, reads, heartbeats; not the
    acquisitions themselves): what :func:`wait_interval` and :func:`head_interval` add up to."""
    if waiters < 1:
        return 0.0
    total = 1.0 / head_interval(period) + waiters * 3.0 / TICKET_LEASE
    for position in range(2, waiters + 1):
        total += 1.0 / wait_interval(position, waiters, period, budget)
    return total


# ---------------------------------------------------------------- what this process remembers


@dataclass
class LockMemory:
    """What this process learned about one lock from its reads: whether others were queued at the last
    read, and the period between grants (estimated from how fast the head's ticket number advances)."""

    others: int = 0
    seen_at: float = -math.inf
    period: float = DEFAULT_PERIOD
    #: The numbers of the tickets waiting at the last read, in queue order, and when its head was first seen.
    numbers: Tuple[int, ...] = ()
    lowest_at: float = -math.inf
    #: The last read's view, taken (and forgotten) by the next waiter that joins.
    view: Optional[QueueView] = None
    #: The lock's holder at the last read, and when it was granted: after ``holder_lo`` (the read before,
    #: which showed another holder or none) and by ``holder_hi`` (the read that showed it first).
    holder: Optional[str] = None
    holder_lo: float = -math.inf
    holder_hi: float = -math.inf
    #: ... and the last read that showed it.
    holder_seen_to: float = -math.inf
    #: How many holds (by the estimate then) the holder before it was surely seen holding (from the first
    #: read that showed it to the last one): a head polls an old hold rarely, so after one the lock may
    #: stand free a while before a live head comes.
    ended_hold_in_holds: float = 0.0
    #: How long holders hold the lock (seconds; None: not seen yet), from holders seen to come and go
    #: between reads close enough together to tell: the head times its polls by it.
    tenure: Optional[float] = None
    #: The latest samples of each: the estimates are their medians, so that one hold stretched by a fault
    #: (a release waiting out its remove, a lease broken after a crash) does not make every waiter sleep
    #: through its turn afterwards, as an average would.
    period_samples: Deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=SAMPLES))
    tenure_samples: Deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=SAMPLES))
    #: This process's stale judgement of each ticket it sees (lease.py's rules, on its own clock).
    watches: Dict[str, lease.StaleWatch] = dataclasses.field(default_factory=dict)
    #: Tickets this process passes over (alias -> heartbeat): the lock went to waiters behind each, so its
    #: waiter is gone, stuck or too slow. Passed until its heartbeat moves.
    passed: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: The line at the last read (passed tickets left out), and how many grants went past each ticket in
    #: it, unchanged (alias -> (heartbeat, grants)).
    line: Tuple[Ticket, ...] = ()
    overtaken: Dict[str, Tuple[str, int]] = dataclasses.field(default_factory=dict)
    #: Tokens seen holding the lock lately: a ticket of one of them is no waiter's (an acquisition waits
    #: once), but the ticket a holder kept for its release, left behind when the hold was lost.
    former_holders: Deque[str] = dataclasses.field(default_factory=lambda: deque(maxlen=SAMPLES * 2))
    #: A read showed the holder releasing (its remove got no answer) during its hold (``stretched``), or
    #: since the head was first seen (``stalled``): that hold, and that time, are a fault's, which lasts up to
    #: the request lifetime (minutes), not samples of how long holders hold or how often the lock moves.
    #: ``stalled`` also marks a head whose turn began before this process saw the queue (no sample).
    stretched: bool = False
    stalled: bool = False
    #: The token of this process's hold that ended last: a read before its release still shows it holding.
    released: Optional[str] = None

    def crowded(self, now: float) -> bool:
        """True when others were queued at this process's last read, not long ago."""
        return self.others > 0 and now - self.seen_at < MEMORY_SECONDS

    def expect_others(self, now: float) -> None:
        """Another process of this machine saw others waiting (a cohort that yielded the lock to them): the
        next acquire lines up behind them, as after a read of our own that showed them."""
        self.others, self.seen_at = max(self.others, 1), now

    def update(self, view: QueueView, token: Optional[str]) -> QueueView:
        """Take in a read: who waits, and how far the head moved since the last read. Returns the view
        without the tickets this process passes over (``token``'s own ticket is never passed)."""
        granted = view.holder is not None and view.holder.token != self.holder
        self._observe_holder(view)
        self._observe_tickets(view)
        # Passed tickets still count as others waiting: a releaser that passed a live head goes behind it.
        self.others = view.others(token)
        view = self._pass_heads(view, token, granted)
        self.seen_at = view.at
        self.view = view
        ahead, self.numbers = self.numbers, tuple(t.number for t in view.tickets)
        if not view.tickets:
            return view
        lowest, previous = view.tickets[0].number, ahead[0] if ahead else None
        # How many of the tickets seen last have left from the front since: numbers need not be dense
        # (simultaneous joins spread out), so the numbers' difference would count grants that never were.
        moved = sum(1 for number in ahead if number < lowest)
        self.stalled = self.stalled or view.releasing
        if previous is not None and moved and view.at > self.lowest_at and not self.stalled:
            sample = (view.at - self.lowest_at) / moved
            self.period = _median_of(self.period_samples, min(600.0, max(0.05, sample)))
        if lowest != previous:
            # When this head was first seen: its turn began then if a read before showed another head. One
            # seen at this process's first read may have waited in front long before (a hold nobody saw
            # start): it dates the next sample from now, as if the read before had shown the turn change.
            self.lowest_at = view.at
            self.stalled = view.releasing or previous is None
        return view

    def _pass_heads(self, view: QueueView, token: Optional[str], granted: bool) -> QueueView:
        """The head polls the lock from the moment it is the head, so a waiter served past a ticket that
        stayed, with the same heartbeat, from one read to the next says its waiter is not polling: gone (a
        crash leaves its ticket for a lease, 150 s), stopped, or beaten by code that does not queue. Waiting
        for it would cost every hand-off the fallback; this process passes it instead, until its
        heartbeat moves. Only speed is at stake: a passed waiter that is alive still polls as the head, and
        exclusion rests on the add alone."""
        present = {t.alias: _beat_of(t) for t in view.tickets}
        for alias in [a for a, beat in self.passed.items() if present.get(a) != beat]:
            del self.passed[alias]  # gone, or alive after all
        for ticket in view.tickets:
            if ticket.token in self.former_holders and ticket.token != token:
                self.passed[ticket.alias] = _beat_of(ticket)  # a lost hold's: nobody polls for it
        grantee = view.holder.token if granted and view.holder is not None else None
        for ticket in self._overtaken(present, grantee):
            # A live head may lose one hand-off (to a fallback, or to code that does not queue): passed only
            # once PASS_AFTER waiters went past it.
            beat = _beat_of(ticket)
            seen, times = self.overtaken.get(ticket.alias, (beat, 0))
            times = times + 1 if seen == beat else 1
            self.overtaken[ticket.alias] = (beat, times)
            if times >= PASS_AFTER:
                self.passed[ticket.alias] = beat
        self.overtaken = {a: o for a, o in self.overtaken.items() if present.get(a) == o[0]}
        # Judged on the view every lock object of this process shares (its own ticket included).
        self.line = view.passing(self.passed, None).tickets
        return view.passing(self.passed, token)

    def _overtaken(self, present: Mapping[str, str], grantee: Optional[str]) -> List[Ticket]:
        """The tickets of the last read's line, still there unchanged, that a waiter went past since: once for
        each ticket behind them that left the line (granted: the holder's ticket is no waiter's; or
        released and removed; or, rarely, a waiter that gave up), and the head once more for a grant to an
        acquisition with no ticket there (``grantee``), once the head's ticket has stood TICKETLESS_AFTER:
        sooner, waiters that spin win hand-offs from a live head that polls too, and a head passed for that
        would lose its place to the whole line until its next heartbeat (up to 40 s); later, such grants are
        mostly code that does not queue (a newcomer's first add landing in a hand-off gap is one too).
        Grants between reads that no read saw held count too: a read every few short holds still passes the
        tickets of waiters that died together."""
        stayed = [t for t in self.line if present.get(t.alias) == _beat_of(t)]
        past: List[Ticket] = []
        for left in (t for t in self.line if t.alias not in present):
            past.extend(t for t in stayed if t.number < left.number)
        head = self.line[0] if self.line else None
        if grantee is not None and head in stayed and all(t.token != grantee for t in self.line):
            # Seen unchanged since ``since``; the grant came after the last read (seen_at) at the earliest.
            since = self.watches[head.alias].since if head.alias in self.watches else None
            if since is not None and self.seen_at - since >= TICKETLESS_AFTER:
                past.append(head)
        return past

    def _observe_holder(self, view: QueueView) -> None:
        token = view.holder.token if view.holder is not None else None
        if token == self.holder:
            self.holder_seen_to = view.at
            self.stretched = self.stretched or view.releasing
            return
        if self.holder is not None:
            held, estimate = self.holder_seen_for(), self.hold_estimate()
            self.ended_hold_in_holds = held / estimate if estimate > 0 else math.inf
        self.holder_seen_to = view.at
        if token is not None:
            self.former_holders.append(token)
        granted_after = self.seen_at
        previous_end = self.expected_release()
        if token is not None and previous_end is not None and self.seen_at < previous_end < view.at:
            # Granted after the previous holder released, so about when that release was expected, not
            # anywhere since the last read: reads far apart (a waiter far back) still time the head's polls.
            granted_after = max(self.seen_at, previous_end - RELEASE_SLACK * self.hold_estimate())
        start = self.granted_at()
        if start is not None:
            # The previous holder released between the last read and this one: a tenure sample when both
            # its start and its end are known to within a third of it.
            sample = (self.seen_at + view.at) / 2 - start
            known = max(self.holder_hi - self.holder_lo, view.at - self.seen_at)
            if sample > 0 and known <= sample / 2 and not self.stretched:
                self.tenure = _median_of(self.tenure_samples, sample)
        self.holder, self.holder_lo, self.holder_hi = token, granted_after, view.at
        self.stretched = view.releasing

    def _observe_tickets(self, view: QueueView) -> None:
        seen = {t.alias for t in view.tickets}
        for alias in [a for a in self.watches if a not in seen]:
            del self.watches[alias]  # gone (or the holder's): a ticket that comes back is judged afresh
        for ticket in view.tickets:
            seen_at = view.at if view.answered_at is None else view.answered_at
            self.watches.setdefault(ticket.alias, lease.StaleWatch()).observe(ticket.holder, seen_at)

    def judged_by(self, tickets: Sequence[Ticket]) -> float:
        """The earliest moment one of ``tickets`` would be judged stale if nothing changes (monotonic;
        inf: never, none with a lease)."""
        due = (self.watches[t.alias].stale_at() for t in tickets if t.alias in self.watches)
        return min((at for at in due if at is not None), default=math.inf)

    def stale(self, alias: str, now: float) -> bool:
        """True when this process has seen the ticket ``alias`` unchanged for its lease + margin."""
        watch = self.watches.get(alias)
        return watch is not None and watch.stale(now)

    def holds_own_released(self) -> bool:
        """True when the holder seen last is this process's hold that ended last (a read made before its
        release): that hold is over, whatever the reads say."""
        return self.released is not None and self.holder == self.released

    def own_hold(self, seconds: float, token: Optional[str] = None) -> None:
        """Take in a hold of this process's own (``token``'s), timed from its grant to its release."""
        self.released = token
        if math.isfinite(seconds) and seconds >= 0:
            self.tenure = _median_of(self.tenure_samples, seconds)

    def cadence(self) -> float:
        """The time from one grant to the next that the queue paces itself by: the period seen, but never
        more than a hold plus :data:`HANDOFF` once the hold time is known. The period includes the queue's
        own hand-offs, so a queue slowed down (a dead head, faults) would otherwise read more slowly, hand on
        more slowly, and slow itself down further."""
        if self.tenure is None:
            return self.period
        return min(self.period, self.tenure + HANDOFF)

    def fallback_after(self, after_old_hold: bool = False) -> float:
        """How long the lock must stay free with the same head before a waiter behind it adds anyway:
        :data:`FALLBACK_AFTER` until this process has seen the line move, or after a hold the head watched
        as old (it polls such a hold by the lock's pacing, a second or more apart); else a couple of
        cadences (a dead head at short holds would otherwise leave the lock idle for ten hand-offs). Its
        own holds alone are no pace of the line."""
        if after_old_hold or not self.period_samples:
            return FALLBACK_AFTER
        return min(FALLBACK_AFTER, max(FALLBACK_FLOOR, FALLBACK_CADENCES * self.cadence()))

    def knows_pace(self) -> bool:
        """True once this process has seen the queue move, or timed holds shorter than the period it
        assumes: its :meth:`cadence` is then more than :data:`DEFAULT_PERIOD`'s guess."""
        return bool(self.period_samples) or (self.tenure is not None and self.tenure + HANDOFF < self.period)

    def holder_seen_for(self) -> float:
        """How long the holder seen last has been seen holding, from the first read that showed it to the
        last one (0 at a single read, or with no holder)."""
        return self.holder_age_at_least(self.holder_seen_to)

    def hold_estimate(self) -> float:
        """How long a holder holds: the tenure seen, else the period between grants (a queue that does
        not run dry hands the lock on about once a period)."""
        return self.tenure if self.tenure is not None else self.period

    def shortest_hold(self) -> Optional[float]:
        """The shortest of the latest holds timed (seconds; None: none timed yet)."""
        return min(self.tenure_samples) if self.tenure_samples else None

    def granted_at(self) -> Optional[float]:
        """When the holder seen last was granted (monotonic: between the read before and the first read
        that showed it), or None when no read saw it come (or there is no holder)."""
        if self.holder is None or not math.isfinite(self.holder_lo):
            return None
        return (self.holder_lo + self.holder_hi) / 2

    def holder_age(self, now: float) -> float:
        """How long the holder seen last has held the lock by ``now``: from its grant when a read saw it
        come, else from the first read that showed it (a lower bound); 0 when none was seen."""
        if self.holder is None:
            return 0.0
        granted = self.granted_at()
        return max(0.0, now - (self.holder_hi if granted is None else granted))

    def holder_age_at_least(self, now: float) -> float:
        """How long the holder seen last has surely held the lock by ``now``: from the first read that showed
        it (its grant may lie anywhere between the read before and that one); 0 when none was seen."""
        return max(0.0, now - self.holder_hi) if self.holder is not None else 0.0

    def expected_release(self) -> Optional[float]:
        """When the holder seen last is expected to release (monotonic), or None when unknown. Only holds
        timed from both ends make the estimate: the period between grants includes the time a head sat in
        front of a hold whose start nobody saw, and a hint taken from it would put the head to sleep through
        the hand-offs of short holds."""
        granted = self.granted_at()
        if granted is None or self.tenure is None:
            return None
        return granted + self.hold_estimate()


def _median_of(samples: Deque[float], sample: float) -> float:
    samples.append(sample)
    return float(median(samples))


_memories: weakref.WeakKeyDictionary[Any, Dict[Tuple[str, str], LockMemory]] = weakref.WeakKeyDictionary()
_memories_lock = threading.Lock()


def memory_for(api: Any, reservation_id: str, alias: str) -> LockMemory:
    """This process's memory of one lock (per API session, reservation and alias)."""
    with _memories_lock:
        try:
            locks = _memories.setdefault(api, {})
        except TypeError:  # not weak-referenceable: nothing is remembered across lock objects
            return LockMemory()
        return locks.setdefault((reservation_id, alias), LockMemory())


# ---------------------------------------------------------------- one waiter's place
