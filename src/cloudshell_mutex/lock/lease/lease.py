"""Leases: a holder proves it is alive with heartbeats; a waiter judges a lock stale on its own clock.

The lease is stored on the lock service as a *relative* number of seconds (``Mutex Lease Seconds``),
never as a time of day: no two machines' clocks are ever compared. The holder renews it by rewriting
``Mutex Heartbeat`` about every lease/3 (:class:`Heartbeat`); the value ``<nonce>:<part>:<n>`` names the
acquisition (the token's nonce), the participant that wrote it (the exporter and every adopter each have
their own ``part``) and a counter. A waiter (:class:`StaleWatch`) judges the holder stale only after it has
itself seen the same token and heartbeat, unchanged, for lease + margin on its own monotonic clock. A
heartbeat whose nonce is not the holder's (an expired holder's late write landing on its successor's
service) is ignored: it never counts as the successor's liveness.

``SetServiceAttributesValues`` has no compare-and-set: the heartbeat reads the holder first (fresh) and
writes only while the token is ours. Between that read and the write (one round trip) the lock can change
hands; the late write then lands on the successor's service, where it is recognisably foreign (above) and
changes nothing but the heartbeat value, which the successor's own next beat overwrites.

Breaking (:class:`Breaker`) is done by exactly one waiter at a time: it holds a breaker alias
(``<alias>~break``, itself leased) while it re-reads the stale holder and removes it.
"""

from __future__ import annotations

import math
import random
import re
import secrets
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from .. import protocol
from ..engine import Runtime
from ..holder import Holder, describe_owner, make_token, parse_token
from ..options import DEFAULT_LEASE, FRESH_READ_LAG, MIN_LEASE
from ..server.alias import CallResult, LockAlias, Status

__all__ = ["DEFAULT_LEASE", "MIN_LEASE", "Breaker", "StaleWatch", "lease_of"]

# The default lease (options.DEFAULT_LEASE, 60 s): a holder heartbeats about every lease/3: 2 calls (a
# fresh read and a write) per 20 s = 0.1 calls/s per held lock, a small fraction of one waiter's polling;
# a crashed holder is broken about lease + margin = 75 s after it stopped. Shorter leases recover sooner
# but cost more calls and let a holder that pauses (a VM snapshot, a long GC) lose its lock sooner.
# MIN_LEASE (1 s): shorter leases cannot be kept over a real server's latency.
#: Heartbeat jitter: each interval is lease/3 times a factor in [1 - JITTER, 1 + JITTER].
JITTER = 0.1
#: The longest wait between two heartbeats (seconds), whatever the lease: a thread cannot wait longer than
#: threading.TIMEOUT_MAX, and an absurd lease (1e12 s) made the heartbeat thread die of an OverflowError.
MAX_BEAT_INTERVAL = 3600.0


def stale_margin(lease: float) -> float:
    """Seconds a waiter adds to a lease before judging a holder stale: covers the heartbeat's own latency
    and a slow write, and makes "unchanged for a whole lease" robust to one late beat."""
    return max(1.0, lease / 4)


def beat_interval(lease: float, rng: random.Random) -> float:
    """Seconds until the next heartbeat: lease/3 with jitter, so holders do not beat in lock-step (at most
    :data:`MAX_BEAT_INTERVAL`: beating more often than lease/3 only costs calls)."""
    return min(lease / 3, MAX_BEAT_INTERVAL) * rng.uniform(1 - JITTER, 1 + JITTER)


def danger_after(lease: float) -> float:
    """Seconds without a confirmed heartbeat after which the holder is in the danger zone (two beats
    missed): the lease may lapse soon, and the holder should stop starting side effects."""
    return lease * 2 / 3


# ---------------------------------------------------------------- the values


def lease_of(holder: Optional[Holder]) -> Optional[float]:
    """The holder's lease in seconds, or None when it has none: a model without the attribute (the original
    package), a holder that wrote "0" or no number (older versions, the original snippet). A holder without a
    lease is never judged stale: only a Force Release removes it."""
    if holder is None:
        return None
    raw = holder.attributes.get(protocol.ATTR_LEASE_SECONDS, "")
    try:
        lease = float(raw)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(lease) or lease <= 0:
        return None
    return max(lease, MIN_LEASE)


def nonce_of(token: str) -> Optional[str]:
    """The random part of a token made by this library (None for others)."""
    info = parse_token(token)
    return None if info is None else info.nonce


def heartbeat_value(nonce: str, part: str, count: int) -> str:
    """``<nonce>:<part>:<count>``: the value one heartbeat writes."""
    return f"{nonce}:{part}:{count}"


def heartbeat_nonce(value: str) -> Optional[str]:
    """The nonce a heartbeat value names, or None when the value is not one."""
    pieces = (value or "").split(":")
    if len(pieces) != 3 or not all(pieces) or not pieces[2].isdigit():
        return None
    return pieces[0]


def own_heartbeat(holder: Holder) -> str:
    """The holder's heartbeat value if it was written by this acquisition, else "" (none, or foreign)."""
    value = holder.attributes.get(protocol.ATTR_HEARTBEAT, "")
    nonce = nonce_of(holder.token)
    return value if nonce is not None and heartbeat_nonce(value) == nonce else ""


def new_part() -> str:
    """A participant id for one heartbeat writer of an acquisition."""
    return secrets.token_hex(2)


#: The heartbeat part written by fair-mode waiters in their tickets (``<nonce>:q:<count>``).
TICKET_PART = "q"


#: Put before each held acquisition's nonce in a ticket's heartbeat part (``q.<nonce>.<nonce>``).
HOLDS_MARK = "."
#: A ticket names at most this many held acquisitions (the latest taken): ``Mutex Owner`` stays short
#: (17 characters each). A cycle through a lock beyond them is not seen (docs/protocol.md, "Deadlocks").
MAX_TICKET_HOLDS = 8
_NONCE = re.compile(r"[0-9a-f]{8,}")


def ticket_value(token: str, lease_seconds: float, count: int, holds: Sequence[str] = ()) -> str:
    """The ``Mutex Owner`` of a ticket: ``<token>#<lease>#<nonce>:q:<count>``; with ``holds`` (the tokens of
    the acquisitions the waiter holds in the reservation) ``<nonce>:q.<held nonce>...:<count>``. The held
    nonces travel in the heartbeat's part, so the value still parses as a ticket with a lease and a heartbeat
    of its own for every release that knows tickets (:func:`parse_ticket` is unchanged)."""
    nonce = nonce_of(token) or token
    held = [n for n in (nonce_of(t) for t in holds) if n is not None][-MAX_TICKET_HOLDS:]
    part = TICKET_PART + "".join(HOLDS_MARK + n for n in held)
    return f"{token}#{lease_seconds:g}#{heartbeat_value(nonce, part, count)}"


def ticket_holds(value: str) -> Tuple[str, ...]:
    """The nonces of the acquisitions a ticket's waiter holds (``()``: none, an older ticket, or a value
    that is not a ticket of ours)."""
    parsed = parse_ticket(value)
    if parsed is None:
        return ()
    part = parsed[2].split(":")[1]
    pieces = part.split(HOLDS_MARK)
    if pieces[0] != TICKET_PART or not all(_NONCE.fullmatch(n) for n in pieces[1:]):
        return ()
    return tuple(pieces[1 : 1 + MAX_TICKET_HOLDS])


def parse_ticket(value: str) -> Optional[Tuple[str, float, str]]:
    """``(token, lease, heartbeat)`` of a ticket value; None when it is not one of ours (foreign, corrupt)."""
    pieces = (value or "").rsplit("#", 2)
    if len(pieces) != 3 or not pieces[0]:
        return None
    token, raw_lease, beat = pieces
    try:
        seconds = float(raw_lease)
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < MIN_LEASE or heartbeat_nonce(beat) is None:
        return None
    return token, seconds, beat


def ticket_holder(holder: Holder) -> Holder:
    """A ticket service as :mod:`.lease` sees a lock holder: the token, the lease and the heartbeat as
    attributes, so :class:`StaleWatch` and :func:`break_stale` judge and break tickets
    unchanged. A value that is not a ticket of ours keeps its raw token and has no lease: never stale."""
    parsed = parse_ticket(holder.token)
    if parsed is None:
        return holder
    token, seconds, beat = parsed
    attributes = {
        protocol.ATTR_OWNER: token,
        protocol.ATTR_LEASE_SECONDS: f"{seconds:g}",
        protocol.ATTR_HEARTBEAT: beat,
    }
    return Holder(holder.alias, token, describe_owner(token), holder.model, attributes)


# ---------------------------------------------------------------- the waiter's judgement


class StaleWatch:
    """One waiter's observation of one alias: who it saw, with which heartbeat, since when (its own clock).

    ``observe`` takes each fresh read; ``stale`` is True only when the same token with the same heartbeat of
    its own has been seen unchanged for the holder's lease + margin. A foreign heartbeat value (another
    acquisition's late write) keeps the last own value: it neither refreshes nor resets the holder.
    """

    def __init__(self) -> None:
        self.key: Optional[Tuple[str, str]] = None
        self.since: Optional[float] = None
        self.lease: Optional[float] = None
        self.holder: Optional[Holder] = None
        # A read group's company (reader slots, closer) as a breaker's re-read last showed it, and since when
        # (break_stale): a group is broken only once its company too shows no sign of life.
        self.company: Optional[Dict[str, Tuple[str, str]]] = None
        self.company_since: Optional[float] = None

    def observe(self, holder: Optional[Holder], now: float) -> None:
        """Take in one fresh read made at ``now`` (monotonic, this process)."""
        if holder is None:
            self.key = self.since = self.lease = self.holder = None
            self.company = self.company_since = None
            return
        beat = own_heartbeat(holder)
        if beat == "" and self.key is not None and self.key[0] == holder.token:
            beat = self.key[1]  # a foreign or missing value changes nothing
        key = (holder.token, beat)
        lease = lease_of(holder)
        if key != self.key or lease != self.lease:
            self.key, self.since, self.lease = key, now, lease
            self.company = self.company_since = None
        self.holder = holder

    def stale(self, now: float) -> bool:
        """True when the holder seen has a lease and has shown no sign of life for lease + margin."""
        at = self.stale_at()
        return at is not None and now >= at

    def stale_at(self) -> Optional[float]:
        """When the holder seen will be judged stale if nothing changes (monotonic; None: never, no lease)."""
        if self.key is None or self.lease is None or self.since is None:
            return None
        return self.since + self.lease + stale_margin(self.lease)

    def unchanged_for(self, now: float) -> float:
        """Seconds this waiter has seen the current (token, heartbeat) unchanged."""
        return 0.0 if self.since is None else now - self.since

    def matches(self, holder: Optional[Holder]) -> bool:
        """True when ``holder`` is still the one judged stale: the same token and the same own heartbeat."""
        if holder is None or self.key is None:
            return False
        beat = own_heartbeat(holder) or self.key[1]
        return (holder.token, beat) == self.key and own_heartbeat(holder) in ("", self.key[1])


@dataclass
class BreakResult:
    """What one attempt to break a stale holder came to.

    ``broken``: the stale holder's service was removed by this breaker. Otherwise ``why`` says what stopped
    it (another breaker at work, the holder came alive or went, the breaker could not be taken in time).
    """

    broken: bool
    why: str


def breaker_lease(lease_option: float) -> float:
    """The lease of the breaker alias of a waiter whose own ``lease`` option is ``lease_option`` (0: none)."""
    return max(lease_option, MIN_LEASE) if lease_option > 0 else DEFAULT_LEASE


class Breaker:
    """One waiter's breaker of stale holders, for every lock kind: a mutex's holder, a read group's reader
    slots and writer, a queue's tickets. It keeps the breaker alias of each alias it broke (made by
    ``make_alias``) and its judgement of other waiters' breakers there; ``label`` names it in the tokens of
    its breaker services, leased ``lease_seconds`` (:func:`breaker_lease`)."""

    def __init__(
        self,
        make_alias: Callable[[str], LockAlias],
        label: str,
        lease_seconds: float,
        request_lifetime: float,
        runtime: Runtime,
    ) -> None:
        self.label = label
        self.lease_seconds = lease_seconds
        self.request_lifetime = request_lifetime
        self.runtime = runtime
        self._make_alias = make_alias
        self._breakers: Dict[str, LockAlias] = {}
        self._watches: Dict[str, StaleWatch] = {}

    @property
    def calls(self) -> int:
        """API calls made on breaker aliases."""
        return sum(breaker.calls for breaker in self._breakers.values())

    def break_holder(self, lock: LockAlias, watch: StaleWatch) -> BreakResult:
        """Remove the holder of ``lock`` that ``watch`` judged stale, as the only breaker at work. After a
        break, ``watch`` has seen the lock free.

        1. Add the breaker alias (``Mutex Owner``: a new token of ``label``; leased). Busy: another breaker
           is at work; its service is itself removed once this waiter has seen it unchanged for breaker
           lease + margin (a crashed breaker), after a re-read shows it is still the same one.
        2. Wait ``FRESH_READ_LAG``, then re-read the lock: the holder must still be the stale one (same
           token, same heartbeat). The wait makes the read show any break done by the previous breaker (done
           before it gave up its alias, so before this breaker's add): a read that lags could still show the
           dead holder when the lock already is a successor's.
        3. Remove it (sent once), but only within the breaker's own lease, measured from when its add was
           sent: nobody can judge this breaker stale before then, so no second breaker acts meanwhile. A
           remove without an answer is never sent again: the breaker keeps its alias alive (heartbeats) and
           reads until the stale holder is gone or the remove can no longer land.
        4. Remove the breaker alias (after a read shows it is still ours).

        A breaker alias of ours that may be left behind (an add without an answer, a remove that failed, a
        read that could not tell) goes to the late-add watcher, which removes it while it shows its token.
        Each attempt has a token of its own, so the watcher never takes a later attempt's live breaker for
        the leftover it watches.
        """
        if lock.alias not in self._breakers:
            self._breakers[lock.alias] = self._make_alias(protocol.breaker_alias(lock.alias))
        breaker = self._breakers[lock.alias]
        breaker_watch = self._watches.setdefault(lock.alias, StaleWatch())
        clock, lifetime, late_adds = self.runtime.clock, self.request_lifetime, self.runtime.late_adds
        token = make_token(self.label)
        add = breaker.add_owner(token, self.label, lease=self.lease_seconds)
        if not add.ok:
            # Even "busy" may be our own first copy, re-sent by the client after it had committed.
            if add.may_land_later:
                late_adds.watch(breaker, token, add.lands_by(lifetime), lifetime, add.unanswered_copies)
            elif add.may_have_committed:
                late_adds.watch(breaker, token, clock() + 2 * FRESH_READ_LAG, lifetime)
            if add.status is Status.BUSY:
                return _other_breaker(breaker, breaker_watch, self.runtime, lifetime)
            return BreakResult(False, f"could not take the breaker ({_why(add)})")
        try:
            result = self._break_under(lock, breaker, watch, token, add)
        finally:
            _drop_breaker(breaker, add, token, lifetime, self.runtime)
        if result.broken:
            watch.observe(None, clock())
        return result

    def _break_under(
        self, lock: LockAlias, breaker: LockAlias, watch: StaleWatch, token: str, add: CallResult
    ) -> BreakResult:
        """Steps 2 and 3 of :meth:`break_holder`, with the breaker alias held."""
        clock = self.runtime.clock
        self.runtime.sleep(FRESH_READ_LAG)
        read = lock.read()
        if not read.ok:
            return BreakResult(False, f"could not re-read the holder ({_why(read)})")
        if not watch.matches(read.holder):
            watch.observe(read.holder, read.answered_at)
            return BreakResult(False, "the holder is not the stale one any more")
        if read.holder is not None and read.holder.token.startswith(protocol.READ_GROUP_MARK):
            company = _group_company(lock.alias, breaker.alias, token, read.services, watch, clock())
            if company is not None:
                return BreakResult(False, company)
        if clock() - add.sent_at >= self.lease_seconds:
            return BreakResult(False, "breaking took longer than the breaker's lease")
        removed = lock.remove_once()
        if removed.ok:
            return BreakResult(True, "removed")
        if removed.status is Status.MISSING and not removed.resent:
            return BreakResult(False, "the holder went away by itself")
        if not (removed.may_land_later or removed.may_have_committed):
            return BreakResult(False, f"the remove failed ({_why(removed)})")
        lands_by = removed.lands_by(self.request_lifetime)
        return _await_remove(lock, breaker, watch, token, lands_by, clock, self.runtime.sleep)


def _drop_breaker(
    breaker: LockAlias,
    add: CallResult,
    token: str,
    request_lifetime: float,
    runtime: Runtime,
) -> None:
    """Remove our breaker alias (sent once, after a read shows it is still ours). What cannot be settled
    here goes to the watcher: the alias when the read or the remove failed, or when the read may lag behind
    our add; a copy of the add that may still land (the client re-sent it), which would land after the
    remove."""
    mine = breaker.read()
    shown = mine.ok and mine.holder is not None and mine.holder.token == token
    may_lag = mine.ok and mine.holder is None and mine.sent_at - FRESH_READ_LAG < add.sent_at + add.elapsed
    unsettled = not mine.ok or may_lag
    removing_until: Optional[float] = None
    if shown:
        removed = breaker.remove_once()
        unsettled = not (removed.ok or removed.status is Status.MISSING)
        if removed.may_land_later:
            removing_until = removed.lands_by(request_lifetime)
    lifetime, late_adds = request_lifetime, runtime.late_adds
    if unsettled:  # committed: one read that does not lag settles it (after our remove, if one may land)
        late_adds.watch(
            breaker, token, runtime.clock() + 2 * FRESH_READ_LAG, lifetime, removing_until=removing_until
        )
    if add.may_land_later:
        late_adds.watch(breaker, token, add.lands_by(lifetime), lifetime, add.unanswered_copies)


def _group_company(
    alias: str,
    breaker_alias: str,
    token: str,
    services: Optional[Mapping[str, Holder]],
    watch: StaleWatch,
    now: float,
) -> Optional[str]:
    """Why a stale read group must not be broken on this re-read (None: break it).

    A reader joins a group on a read that shows its own slot and no breaker (nor closer) at work; a closer
    removes it on a read that shows its own closer service. So the breaker decides only on a re-read that
    shows its own breaker service (every slot added before it is in view), and only when that read shows no
    reader slot and no closer that has shown a sign of life (a change) for their lease + margin."""
    mine = (services or {}).get(breaker_alias)
    if mine is None or mine.token != token:
        return "the re-read does not show this breaker's own service (it lags)"
    company = {
        name: (holder.token, holder.attributes.get(protocol.ATTR_HEARTBEAT, ""))
        for name, holder in (services or {}).items()
        if name == protocol.closer_alias(alias) or protocol.reader_slot_number(name, alias) is not None
    }
    if not company:
        return None
    if company != watch.company or watch.company_since is None:
        watch.company, watch.company_since = company, now
        return "reader slots or a closer are held (judging them)"
    leases = [lease_of((services or {})[name]) for name in company]
    if any(seconds is None for seconds in leases):
        return "reader slots or a closer without a lease are held"
    longest = max(seconds for seconds in leases if seconds is not None)
    if now - watch.company_since < longest + stale_margin(longest):
        return "reader slots or a closer are held"
    return None


def breaker_crashed(watch: StaleWatch, now: float, request_lifetime: float) -> bool:
    """True when the breaker ``watch`` has seen crashed and its remove can no longer land: a breaker removes
    only within its lease from its add (which nobody saw earlier), but that remove may land up to a
    request's lifetime later, on whoever holds the lock then."""
    if not watch.stale(now) or watch.lease is None:
        return False
    return watch.unchanged_for(now) >= watch.lease + request_lifetime


def _other_breaker(
    breaker: LockAlias, breaker_watch: StaleWatch, runtime: Runtime, request_lifetime: float
) -> BreakResult:
    """The breaker alias is taken: wait for that breaker, or remove it once it is judged crashed (settled like
    any remove: a failed or unanswered one is left to the late-add watcher, never sent twice)."""
    clock = runtime.clock
    read = breaker.read()
    now = clock()
    if not read.ok:
        return BreakResult(False, "another breaker is at work")
    breaker_watch.observe(read.holder, now)
    if read.holder is None:
        return BreakResult(False, "another breaker just finished")
    if not breaker_crashed(breaker_watch, now, request_lifetime):
        return BreakResult(False, "another breaker is at work")
    again = breaker.read()  # right before the remove: still the same crashed breaker?
    if again.ok and again.holder is not None and breaker_watch.matches(again.holder):
        crashed, late_adds = again.holder.token, runtime.late_adds
        if any(e.alias is breaker and e.token == crashed for e in late_adds.pending()):
            return BreakResult(False, "our remove of a crashed breaker may still land")  # the watcher's now
        late_adds.remove_or_watch(breaker, crashed, request_lifetime, leftover="a crashed breaker")
        breaker_watch.observe(None, clock())
        return BreakResult(False, "removed a crashed breaker")
    return BreakResult(False, "another breaker is at work")


def _await_remove(
    lock: LockAlias,
    breaker: LockAlias,
    watch: StaleWatch,
    token: str,
    lands_by: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> BreakResult:
    """Our remove of the stale holder got no answer: read until the holder is gone (broken) or the remove
    can no longer land (not broken; the next round judges again), keeping the breaker alive meanwhile."""
    nonce = nonce_of(token) or token
    count = 0
    while clock() < lands_by:
        read = lock.read()
        if read.ok and not watch.matches(read.holder):
            return BreakResult(True, "removed (the remove landed late)")
        count += 1
        breaker.set_attributes([(protocol.ATTR_HEARTBEAT, heartbeat_value(nonce, "brk", count))])
        sleep(1.0)
    return BreakResult(False, "the remove did not land")


def _why(result: object) -> str:
    failure = getattr(result, "failure", None)
    return failure.message if failure is not None else result.status.value
