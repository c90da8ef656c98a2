"""The wait-for graph of a reservation's named locks, from one read: who waits for what, and its cycles.

No calls are made here (:mod:`.queue` and :mod:`.waitrecord` read; this module judges what reads show). A
waiter's record says which lock it waits for: a fair-mode waiter's ticket (``<lock>~q~<n>``), or the wait
record (``<lock>~d~<nonce>``) of a waiter outside the queue (a cohort member waiting for its machine's local
lock, a ``fair=False`` waiter). A waiter that holds other locks of the same reservation names them in its
record, by the nonces of their holders' tokens (:func:`.lease.ticket_holds`). Edges of the graph, all from
the same read:

* waiter ``W`` waits for lock ``L`` (its ticket's lock);
* ``L``'s holder (its ``Mutex Owner`` token) is held by the one waiter whose ticket names that token's
  nonce: ``W`` waits for that waiter.

A ticket's claims count only while the read shows the claimed token as the holder of a lock, and only when
exactly one waiter claims it (a ticket left behind by an earlier wait of the same party makes the edge
ambiguous: it is not followed). So a record that outlived its hold never makes a cycle; a real cycle is
found once every record on it is fresh.

**The victim.** A cycle is found by each of its members on its own reads; exactly one gives up: the
member whose token's nonce (its random part) is the greatest, then the token (:func:`victim_key`). Every
member computes the same from any read that shows the cycle, with no clock compared; the nonce is random
per acquisition, so no owner label always loses.

**Only live waits count** (:class:`CycleWatch`). A record outlives its wait when its waiter died or gave up
and its remove has not landed yet. So the victim gives up only once every other member's record has moved
(its heartbeat rewritten) since the victim first saw the cycle: each member rewrites its record when a read
shows it a cycle through its own wait, so a live cycle is confirmed within a read or two, and a record that
no longer moves never completes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Set, Tuple

from ..errors import MutexDeadlock
from ..holder import Holder, describe_owner
from ..lease.lease import nonce_of, parse_ticket, ticket_holds
from ..protocol import DERIVED_MARK, alias_kind, ticket_number

__all__ = [
    "CONFIRM_INTERVAL",
    "DETECT_AFTER",
    "DETECT_INTERVAL",
    "Cycle",
    "CycleWatch",
    "Step",
    "WaitFor",
    "Waiter",
    "deadlock_error",
    "victim_key",
    "wait_for",
]

#: A waiter that holds other locks of the reservation looks for a deadlock once it has waited this long
#: (seconds): a shorter wait costs no extra read.
DETECT_AFTER = 1.5
#: ... reading the reservation at least this often from then on (seconds).
DETECT_INTERVAL = 2.0
#: ... and this soon after a read that showed a cycle through its wait, not yet confirmed live (seconds).
CONFIRM_INTERVAL = 1.0
#: What a record's kind is in :func:`~.protocol.alias_kind`'s words: a waiter's ticket or wait record.
_RECORD_KINDS = ("queue ticket", "wait record")


@dataclass(frozen=True)
class Waiter:
    """One waiter in a read: the lock it waits for, its record (a ticket or a wait record), its acquisition's
    token and label, the locks it holds (each shown held, in this read, by a token its record names) and its
    record's heartbeat (which moves while the waiter lives and waits)."""

    lock: str
    ticket: str
    token: str
    label: str
    holds: Tuple[str, ...] = ()
    beat: str = ""


@dataclass(frozen=True)
class Step:
    """One step of a cycle: ``lock`` is held by ``holder`` (a label), whose party waits for ``waits_for``
    (as the acquisition ``token``)."""

    lock: str
    holder: str
    waits_for: str
    token: str


@dataclass(frozen=True)
class Cycle:
    """A wait-for cycle, from the waiter it was looked for: ``steps[0].lock`` is the lock that waiter waits
    for; each step's holder waits for the next step's lock; the last one waits for the first lock."""

    steps: Tuple[Step, ...]

    @property
    def tokens(self) -> Tuple[str, ...]:
        """The waiting acquisitions on the cycle."""
        return tuple(step.token for step in self.steps)

    @property
    def victim(self) -> str:
        """The token of the waiter that gives up (the rule of the module's docstring)."""
        return max(self.tokens, key=victim_key)

    def describe(self, own: Optional[str] = None) -> str:
        """``A is held by X, which waits for B; B is held by Y, which waits for A`` (labels, no secrets; the
        holder whose waiting acquisition is ``own`` is marked "this thread")."""
        return "; ".join(
            f"{s.lock} is held by {s.holder}{' (this thread)' if s.token == own else ''}, "
            f"which waits for {s.waits_for}"
            for s in self.steps
        )

    def as_tuples(self) -> Tuple[Tuple[str, str, str], ...]:
        """``(lock, holder label, what that holder waits for)`` per step."""
        return tuple((s.lock, s.holder, s.waits_for) for s in self.steps)


def deadlock_error(cycle: Cycle, own: str, reservation_id: str, alias: str) -> MutexDeadlock:
    """The error the victim ``own`` raises while waiting for ``alias``: the cycle, and what to do."""
    return MutexDeadlock(
        f"cloudshell-mutex: gave up waiting for {alias} in reservation {reservation_id}: a deadlock. "
        f"{cycle.describe(own)}. None of them would ever get its lock; one waiter of such a cycle gives up "
        "(chosen by a rule every party computes alike) and the others go on. The locks this thread holds are "
        "still held: leave their with blocks (or release them), then retry. To avoid this, take several "
        "locks in one order (cloudshell_mutex.acquire_all).",
        cycle=cycle.as_tuples(),
        reservation_id=reservation_id,
        alias=alias,
    )


def victim_key(token: str) -> Tuple[str, str]:
    """The order the victim rule takes: the greatest wins (the token's random nonce first)."""
    return nonce_of(token) or "", token


@dataclass(frozen=True)
class WaitFor:
    """Who waits for what in one read (:func:`wait_for`)."""

    waiters: Tuple[Waiter, ...]
    #: Each lock's holder in the read, by lock alias.
    holders: Mapping[str, Holder]
    #: For each waiting token, the waiting token it waits for (an edge; absent: none that can be seen).
    edges: Mapping[str, str]

    def waiter(self, token: str) -> Optional[Waiter]:
        """The waiter of ``token`` (None: it has no ticket in this read)."""
        return next((w for w in self.waiters if w.token == token), None)

    def cycle_through(self, token: str) -> Optional[Cycle]:
        """The cycle that passes through ``token``'s wait (None: none in this read)."""
        path = [token]
        current = self.edges.get(token)
        while current is not None and current != token:
            if current in path:
                return None  # a cycle that ``token`` waits on but is not part of: its members find it
            path.append(current)
            current = self.edges.get(current)
        if current is None:
            return None
        by_token = {w.token: w for w in self.waiters}
        steps = []
        for index, member in enumerate(path):
            lock = by_token[member].lock
            following = path[(index + 1) % len(path)]
            steps.append(Step(lock, self.holders[lock].label, by_token[following].lock, following))
        return Cycle(tuple(steps))

    def cycles(self) -> List[Cycle]:
        """Every cycle in the read, once each, from its victim's point of view."""
        found: Dict[frozenset, Cycle] = {}
        for waiter in self.waiters:
            cycle = self.cycle_through(waiter.token)
            if cycle is not None and frozenset(cycle.tokens) not in found:
                found[frozenset(cycle.tokens)] = self.cycle_through(cycle.victim) or cycle
        return list(found.values())


def wait_for(services: Mapping[str, Holder]) -> WaitFor:
    """The wait-for graph of one fresh read's services (every service of the reservation, by alias)."""
    holders = {alias: holder for alias, holder in services.items() if DERIVED_MARK not in alias}
    by_nonce: Dict[str, Optional[str]] = {}  # a holder token's nonce -> its lock (None: seen twice)
    for alias, holder in holders.items():
        nonce = nonce_of(holder.token)
        if nonce is not None:
            by_nonce[nonce] = None if nonce in by_nonce else alias
    tickets: Dict[str, List[Tuple[int, Waiter]]] = {}
    for name, service in services.items():
        lock, kind = alias_kind(name)
        parsed = parse_ticket(service.token) if kind in _RECORD_KINDS else None
        if parsed is None:
            continue  # not a waiter's record, or a foreign or corrupt one
        token, _, beat = parsed
        holder = holders.get(lock)
        if holder is not None and holder.token == token:
            continue  # granted: the holder's own ticket, not removed yet
        # A claim on the lock it waits for itself is no edge (never written: another thread may release it).
        held = {by_nonce.get(nonce) for nonce in ticket_holds(service.token)} - {None, lock}
        waiter = Waiter(lock, name, token, describe_owner(token), tuple(sorted(h for h in held if h)), beat)
        tickets.setdefault(token, []).append((ticket_number(name, lock) or 0, waiter))
    waiters = []
    for entries in tickets.values():
        if len({waiter.lock for _, waiter in entries}) == 1:  # one acquisition waits for one lock
            waiters.append(min(entries, key=lambda entry: entry[0])[1])
    claims: Dict[str, Set[str]] = {}
    for waiter in waiters:
        for lock in waiter.holds:
            claims.setdefault(lock, set()).add(waiter.token)
    edges = {}
    for waiter in waiters:
        claimants = claims.get(waiter.lock, set())
        if len(claimants) == 1:
            edges[waiter.token] = next(iter(claimants))
    waiters.sort(key=lambda w: (w.lock, ticket_number(w.ticket, w.lock) or 0))
    return WaitFor(tuple(waiters), holders, edges)


class CycleWatch:
    """One waiting acquisition's judgement of the cycles through its wait, across its reads (the module's
    docstring: only live waits count).

    :meth:`judge` takes each read's graph; :attr:`cycle` is the cycle through this wait in the last read
    (None: none), confirmed or not (the waiter rewrites its own record while there is one), and
    :attr:`confirmed` the same cycle once its members have shown signs of life: only such a cycle is called a
    deadlock, by a victim or by a timeout's words.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.cycle: Optional[Cycle] = None
        self.confirmed: Optional[Cycle] = None
        # The other members' highest record heartbeat counts since this cycle was first seen, and which have
        # moved since: a count above the first one seen. An older count (a lagging read, a record re-created
        # by an add that landed late after its waiter gave up) is no sign of life.
        self._first: Dict[str, int] = {}
        self._moved: Set[str] = set()

    def judge(self, graph: WaitFor) -> Optional[Cycle]:
        """Take in one read's graph; return the cycle through this wait once every other member of it has
        moved its record since this waiter first saw it (None: no cycle, or not confirmed yet)."""
        cycle = graph.cycle_through(self.token)
        if cycle is None:
            self.cycle = self.confirmed = None
            self._first, self._moved = {}, set()
            return None
        others = set(cycle.tokens) - {self.token}
        counts = {w.token: _beat_count(w.beat) for w in graph.waiters if w.token in others}
        if self.cycle is None or set(self.cycle.tokens) != set(cycle.tokens):
            self._first, self._moved = counts, set()  # a new cycle: its members' signs of life start now
        else:
            self._moved |= {token for token, count in counts.items() if count > self._first.get(token, count)}
        self.cycle = cycle
        self.confirmed = cycle if self._moved >= others else None
        return self.confirmed

    @property
    def pending(self) -> bool:
        """True while the last read showed a cycle through this wait that is not confirmed yet."""
        return self.cycle is not None and self.confirmed is None


def _beat_count(beat: str) -> int:
    """The counter of a record's heartbeat value (``<nonce>:<part>:<count>``; -1 when it has none)."""
    count = beat.rsplit(":", 1)[-1]
    return int(count) if count.isdigit() else -1
