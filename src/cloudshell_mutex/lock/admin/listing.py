"""Every lock service in a reservation: what it is, who holds it, how long this observer saw it, its lease.

:func:`list_locks` makes one fresh read (``GetReservationDetails`` with the cache off) and sorts every
service of the lock model by what its alias says:

* ``MUTEX`` (any alias without ``~``): a lock, **exclusive** (a writer, a plain mutex, the original
  snippet) or **shared** (a read group of :class:`~.rwlock.ReservationRWLock`, with its readers);
* ``MUTEX~r<n>``: a reader's slot; ``MUTEX~w``: a writer waiting; ``MUTEX~c``: a reader closing the read
  group; ``MUTEX~q~<n>``: a fair-mode waiter's place in the queue (its owner, lease and heartbeat are
  read from the ticket's value); ``<alias>~break``: a waiter breaking a stale holder;
  ``MUTEX~generation``: the fencing counter; any other ``MUTEX~...``: an internal service, shown as is.

Who waits for what (:mod:`.waitfor`): each fair-mode waiter, the lock it waits for and its holder, and the
locks the waiter holds (named in its ticket); a wait-for cycle among them is shown as a deadlock. Waiters
of the original code and ``fair=False`` waiters have no tickets: they are not shown.

How long a service was held, and whether its holder is alive, can only be *observed*: no time of day is
stored on it. A :class:`LockObserver` that reads again (``status --all --watch``) reports how long it saw the
same holder, and judges leases the way a waiter does (:class:`~.lease.StaleWatch`, its own monotonic clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import diagnosis, protocol
from ..holder import Holder, is_read_group, marker_holder
from ..lease import lease
from ..protocol import KINDS
from ..queue import waitfor
from ..server.alias import LockAlias

__all__ = ["LockInfo", "LockListing", "LockObserver", "list_locks"]


@dataclass(frozen=True)
class LockInfo:
    """One lock service as seen by an observer.

    ``lock`` is the lock it belongs to (``MUTEX`` for ``MUTEX~r3``); ``kind`` one of :data:`KINDS`; ``mode``
    "exclusive" or "shared" for a lock ("" for the others); ``readers`` the labels of a shared lock's reader
    slots; ``seen_for`` how long this observer has seen the same owner token (0 after one read);
    ``lease`` the lease in seconds (None: none, never broken automatically); ``lease_state`` one of "none",
    "unjudged" (seen once), "alive" (a heartbeat was seen), "silent" (no heartbeat seen yet, not stale),
    "stale" (no heartbeat for lease + margin: a waiter may break it), "holder" (a queue ticket of the
    lock's holder: it waits no more, and goes with the lock at the release).
    """

    alias: str
    lock: str
    kind: str
    mode: str
    owner: str
    token: str
    seen_for: float
    lease: Optional[float]
    lease_state: str
    silent_for: float = 0.0
    readers: Tuple[str, ...] = ()
    #: A queue ticket's waiter: the locks it holds (named in its ticket, shown held by it in the read).
    holds: Tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for people (stable: scripts may parse it)."""
        if self.kind == "lock" and self.mode == "shared":
            who = f"shared by {len(self.readers)} reader(s) [{', '.join(self.readers)}]"
        elif self.kind == "lock":
            who = f"exclusive, held by {self.owner}"
        else:
            who = f"{self.kind} of {shown(self.lock)}, held by {self.owner}"
        if self.holds:
            who += f", which holds {', '.join(self.holds)}"
        lease_text = "no lease" if self.lease is None else f"lease {self.lease:g} s {self.lease_state}"
        if self.lease_state == "silent":
            lease_text += f" ({self.silent_for:.1f} s)"
        token = f"Mutex Owner {self.token!r}" if self.token else "no Mutex Owner (original protocol v1?)"
        alias = shown(self.alias)
        if alias != self.alias and protocol.lock_name_problem(self.lock) is not None:
            alias += " (not a lock name: it may look like another, and excludes nothing that uses that one)"
        return f"{alias}: {who}; {token}; seen held {self.seen_for:.1f} s; {lease_text}"

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "alias": self.alias,
            "lock": self.lock,
            "kind": self.kind,
            "mode": self.mode,
            "owner": self.owner,
            "token": self.token,
            "readers": list(self.readers),
            "seen_for": round(self.seen_for, 3),
            "lease": self.lease,
            "lease_state": self.lease_state,
            "silent_for": round(self.silent_for, 3),
            "holds": list(self.holds),
        }


@dataclass(frozen=True)
class LockListing:
    """Every lock service of one reservation at one read, with what the observer knows of them."""

    reservation_id: str
    locks: Tuple[LockInfo, ...]
    watched_for: float = 0.0
    calls: int = 0
    other_services: int = field(default=0)
    #: Who waits for what: one ``(waiter, lock, holder, held locks)`` per fair-mode waiter.
    waits: Tuple[Tuple[str, str, str, Tuple[str, ...]], ...] = ()
    #: Wait-for cycles (:class:`~.waitfor.Cycle`), each with the label of the waiter that gives up.
    deadlocks: Tuple[Tuple[waitfor.Cycle, str], ...] = ()

    def lines(self) -> List[str]:
        """The listing for people: a header, then one line per lock service."""
        if not self.locks:
            return [f"no lock services in reservation {self.reservation_id} (nothing is locked)"]
        watched = f", watched {self.watched_for:.1f} s" if self.watched_for > 0 else " (one read)"
        header = f"{len(self.locks)} lock service(s) in reservation {self.reservation_id}{watched}:"
        lines = [header] + [f"  {info.describe()}" for info in self.locks]
        if self.waits:
            lines.append("who waits for what (fair-mode waiters; original code and fair=False are not seen):")
        for waiter, lock, holder, holds in self.waits:
            held = f"; it holds {', '.join(holds)}" if holds else ""
            lines.append(f"  {waiter} waits for {shown(lock)} (held by {holder}){held}")
        for cycle, victim in self.deadlocks:
            lines.append(f"  DEADLOCK: {cycle.describe()}. {victim} gives up")
        return lines

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (``status --all --json``)."""
        return {
            "reservation_id": self.reservation_id,
            "watched_for": round(self.watched_for, 3),
            "calls": self.calls,
            "locks": [info.as_dict() for info in self.locks],
            "waits": [
                {"waiter": waiter, "lock": lock, "holder": holder, "holds": list(holds)}
                for waiter, lock, holder, holds in self.waits
            ],
            "deadlocks": [
                {"cycle": [list(step) for step in cycle.as_tuples()], "gives_up": victim}
                for cycle, victim in self.deadlocks
            ],
        }


class LockObserver:
    """Reads a reservation's lock services again and again, remembering what it saw on its own clock."""

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        model: str = protocol.SERVICE_MODEL,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._alias = LockAlias(api, reservation_id, protocol.DEFAULT_ALIAS, model, clock=clock)
        self.model = model
        self._clock = clock
        self._started: Optional[float] = None
        self._first_seen: Dict[str, Tuple[str, float]] = {}
        self._watches: Dict[str, lease.StaleWatch] = {}
        self._beat_seen: Dict[str, bool] = {}

    def observe(self) -> LockListing:
        """One fresh read; raises :class:`~.errors.MutexError` (saying what to do) when it fails."""
        result = self._alias.read()
        if not result.ok:
            state = self._alias.reservation_state() if diagnosis.needs_state(result.failure) else None
            raise diagnosis.fatal_error(
                result.failure,
                "reading the reservation's lock services",
                self._alias.reservation_id,
                self._alias.alias,
                self.model,
                None,
                state,
                self._alias.domain,
            )
        now = result.answered_at  # what the judgements count from: see CallResult.answered_at
        if self._started is None:
            self._started = now
        services = {alias: h for alias, h in (result.services or {}).items() if h.model == self.model}
        for alias in list(self._first_seen):
            if alias not in services:
                del self._first_seen[alias]
                self._watches.pop(alias, None)
                self._beat_seen.pop(alias, None)
        graph = waitfor.wait_for(services)
        holds = {waiter.ticket: waiter.holds for waiter in graph.waiters}
        infos = [
            self._info(alias, holder, services, now, holds.get(alias, ()))
            for alias, holder in services.items()
        ]
        infos.sort(key=_order)
        free = "nobody (free)"
        waits = tuple(
            (w.label, w.lock, graph.holders[w.lock].label if w.lock in graph.holders else free, w.holds)
            for w in graph.waiters
        )
        deadlocks = tuple(
            (cycle, next(w.label for w in graph.waiters if w.token == cycle.victim))
            for cycle in graph.cycles()
        )
        return LockListing(
            self._alias.reservation_id,
            tuple(infos),
            watched_for=now - self._started,
            calls=self._alias.calls,
            other_services=len(result.services or {}) - len(services),
            waits=waits,
            deadlocks=deadlocks,
        )

    def _info(
        self, alias: str, holder: Holder, services: Dict[str, Holder], now: float, holds: Tuple[str, ...]
    ) -> LockInfo:
        lock, kind = protocol.alias_kind(alias)
        if kind in ("queue ticket", "wait record"):
            holder = lease.ticket_holder(holder)  # its token, lease and heartbeat travel in its one value
        elif kind == "releasing":
            holder = marker_holder(holder)  # the holder it names, not the secret it shows
        first = self._first_seen.get(alias)
        if first is None or first[0] != holder.token:
            first = self._first_seen[alias] = (holder.token, now)
            self._beat_seen[alias] = False
        watch = self._watches.setdefault(alias, lease.StaleWatch())
        before = watch.key
        watch.observe(holder, now)
        if before is not None and before[0] == holder.token and before != watch.key:
            self._beat_seen[alias] = True  # the same holder with a new heartbeat of its own: alive
        lease_seconds = lease.lease_of(holder)
        silent = watch.unchanged_for(now)
        owner_of_lock = services.get(lock) if kind == "queue ticket" else None
        if owner_of_lock is not None and owner_of_lock.token == holder.token:
            state = "holder"  # not heartbeaten while it holds: never judged
        elif lease_seconds is None:
            state = "none"
        elif watch.stale(now):
            state = "stale"
        elif self._beat_seen.get(alias):
            state = "alive"
        elif now - first[1] <= 0:
            state = "unjudged"
        else:
            state = "silent"
        mode, readers = "", ()
        if kind == "lock":
            mode = "shared" if is_read_group(holder) else "exclusive"
            if mode == "shared":
                readers = tuple(
                    h.label
                    for a, h in sorted(services.items())
                    if protocol.alias_kind(a) == (alias, "reader slot")
                )
        return LockInfo(
            alias,
            lock,
            kind,
            mode,
            holder.label,
            holder.token,
            now - first[1],
            lease_seconds,
            state,
            silent,
            readers,
            holds,
        )


def shown(alias: str) -> str:
    """``alias`` as a listing shows it: as it is when printable ASCII (every lock name of ours is), else
    quoted with the rest as ``\\uXXXX`` escapes (:func:`~.protocol.shown_name`): a service that only looks
    like ``MUTEX`` (``MUTEX\\u200b``, made by other code) never shows as ``MUTEX``."""
    return alias if protocol.printable_ascii(alias) else protocol.shown_name(alias)


def _order(info: LockInfo) -> Tuple[str, int, int, str]:
    number = protocol.reader_slot_number(info.alias, info.lock)
    if number is None:
        number = protocol.ticket_number(info.alias, info.lock)
    return info.lock, KINDS.index(info.kind), number or 0, info.alias


def list_locks(api: Any, reservation_id: str, model: str = protocol.SERVICE_MODEL) -> LockListing:
    """Every lock service in the reservation, from one fresh read (``seen_for`` is 0: one read tells "held
    now", not since when; use a :class:`LockObserver` to watch). Raises :class:`~.errors.MutexError`."""
    return LockObserver(api, reservation_id, model).observe()
