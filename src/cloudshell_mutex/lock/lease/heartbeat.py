"""The holder's heartbeat: it keeps one acquisition's lease alive (lease.py says what a lease is).

Every lease/3 (with jitter) a round reads the holder (fresh) and, while the token is ours, rewrites
``Mutex Heartbeat``. ``SetServiceAttributesValues`` has no compare-and-set: between that read and the
write the lock can change hands; the late write then lands on the successor's service, where its nonce
shows it is foreign (:class:`~.lease.StaleWatch` ignores it), and the successor's next beat overwrites it.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from .. import protocol
from ..holder import Holder
from ..options import FRESH_READ_LAG, default_logger
from ..server.alias import LockAlias, Status
from .lease import (
    MAX_BEAT_INTERVAL,
    beat_interval,
    danger_after,
    heartbeat_value,
    new_part,
    nonce_of,
    own_heartbeat,
    stale_margin,
)

__all__ = ["BeatResult", "Heartbeat"]


@dataclass
class BeatResult:
    """What one heartbeat found: ``ok`` (written), ``lost`` (the alias is not ours), or a failure."""

    ok: bool = False
    lost: bool = False
    holder: Optional[Holder] = None
    error: Optional[str] = None


class Heartbeat:
    """Keeps one acquisition's lease alive: reads the holder (fresh), and while it is ours writes the next
    heartbeat value. :meth:`beat` is one round; :meth:`start` runs rounds in a daemon thread about every
    lease/3 (with jitter) until :meth:`stop`. ``confirmed_at`` is when the last successful write was *sent*
    (monotonic): no waiter can judge the lease lapsed before confirmed_at + lease + margin.

    ``renew_until`` (monotonic; None: never) is when renewal stops for good (the lock's ``max_hold``): from
    then on no round writes, ``expired`` is True and ``on_expired`` is called once, unless a release is in
    progress (its remove may land late, and the lease must outlive it).
    """

    def __init__(
        self,
        alias: LockAlias,
        token: str,
        lease: float,
        confirmed_at: float,
        *,
        part: Optional[str] = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Optional[random.Random] = None,
        on_lost: Optional[Callable[[Optional[Holder]], None]] = None,
        on_danger: Optional[Callable[[float], None]] = None,
        logger: Optional[logging.Logger] = None,
        renew_until: Optional[float] = None,
        on_expired: Optional[Callable[[], None]] = None,
    ) -> None:
        self.alias = alias
        self.token = token
        self.nonce = nonce_of(token) or token
        self.part = part or new_part()
        self.lease = lease
        self.confirmed_at = confirmed_at
        #: When the lock was last known to be ours (made now, once it is; then each read that shows our
        #: token, by its sent time). A fresh read may lag (FRESH_READ_LAG) and show the past: one that does
        #: not show our token proves a loss only when sent that long after this.
        self.seen_at = clock()
        self.count = 0
        self.beats = 0  # rounds made (each a read, and a write while ours)
        #: (value, sent_at) of a write that answered only after a waiter could have broken the lease: it may
        #: have landed on a successor's service, so it renews nothing until a read shows its value on ours.
        self.unconfirmed: Optional[Tuple[str, float]] = None
        self.lost = False
        self.lost_to: Optional[Holder] = None
        self.in_danger = False
        #: Set by a release in progress: the alias going away is then most likely our own remove landing,
        #: and the release itself reports what it finds, so neither a loss nor danger is signalled here.
        self.releasing = False
        self.renew_until = renew_until
        #: True once renewal stopped at ``renew_until``: waiters may break the lock lease + margin after the
        #: last write.
        self.expired = False
        self._on_expired = on_expired
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_lost = on_lost
        self._on_danger = on_danger
        self.logger = default_logger(logger)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def value(self) -> str:
        """The heartbeat value to write next."""
        return heartbeat_value(self.nonce, self.part, self.count)

    def beat(self) -> BeatResult:
        """One round: read the holder; write the next value only while the token is ours."""
        with self._lock:
            if self.lost:
                return BeatResult(lost=True, holder=self.lost_to)
            if self.expired or self._until_expiry() <= 0:
                self._expire()
                return BeatResult(error="held for max_hold: the lease is no longer renewed")
            self.beats += 1
            read = self.alias.read()
            if not read.ok:
                return self._failed(read.failure.message if read.failure else "read failed")
            if read.holder is None or read.holder.token != self.token:
                if read.sent_at - FRESH_READ_LAG < self.seen_at:
                    # It may show the lock as it was before it was ours (a lagging read, found when a reader
                    # that had just joined a read group was told its lock was lost): the next beat asks again.
                    return self._failed("a read that may lag behind the lock did not show it")
                self._mark_lost(read.holder)
                return BeatResult(lost=True, holder=read.holder)
            self.seen_at = max(self.seen_at, read.sent_at)
            if self.unconfirmed is not None and own_heartbeat(read.holder) == self.unconfirmed[0]:
                # That write's value is on our own service: it landed there, and no waiter saw it before it
                # was sent.
                self.confirmed_at = max(self.confirmed_at, self.unconfirmed[1])
            self.unconfirmed = None
            self.count += 1
            value = self.value()
            # No waiter breaks the lease before lease + margin after the last confirmed value was sent: a
            # write answered before then landed before any break, on our own service.
            unbroken_until = self.confirmed_at + self.lease + stale_margin(self.lease)
            write = self.alias.set_attributes([(protocol.ATTR_HEARTBEAT, value)])
            if write.ok and (write.answered_at < unbroken_until or math.isinf(self.confirmed_at)):
                # Sent after the read showed our token: no waiter saw this value before write.sent_at.
                self.confirmed_at = write.sent_at
                self.in_danger = False
                return BeatResult(ok=True, holder=read.holder)
            if write.ok:
                # Answered after the lease could have been broken: it may have landed on a successor's service
                # (the write cannot check the owner). The next round's read tells.
                self.unconfirmed = (value, write.sent_at)
                return self._failed("the write answered after the lease could have been broken under it")
            if write.status is Status.MISSING:
                self._mark_lost(None)
                return BeatResult(lost=True)
            return self._failed(write.failure.message if write.failure else "write failed")

    def _failed(self, message: str) -> BeatResult:
        silent = self._clock() - self.confirmed_at
        self.logger.warning(
            "cloudshell-mutex: heartbeat of %r in reservation %s failed (%s); %s",
            self.alias.alias,
            self.alias.reservation_id,
            message,
            "none of ours confirmed yet" if math.isinf(silent) else f"last confirmed {silent:.1f} s ago",
        )
        if silent >= danger_after(self.lease) and not self.in_danger and not self.releasing:
            self.in_danger = True
            _call(self._on_danger, silent, self.logger)
        return BeatResult(error=message)

    def _mark_lost(self, holder: Optional[Holder]) -> None:
        self.lost = True
        self.lost_to = holder
        self._stop.set()
        if not self.releasing:
            _call(self._on_lost, holder, self.logger)

    def _until_expiry(self) -> float:
        """Seconds until renewal stops (MAX_BEAT_INTERVAL when it never does, or while releasing)."""
        if self.renew_until is None or self.releasing:
            return MAX_BEAT_INTERVAL
        return max(0.0, self.renew_until - self._clock())

    def _expire(self) -> None:
        if self.expired:
            return
        self.expired = True
        self._stop.set()
        if self._on_expired is not None:
            try:
                self._on_expired()
            except Exception:  # user code (on_lost) must not break the heartbeat's caller
                self.logger.exception("cloudshell-mutex: lease callback failed")

    def lapsed(self, now: float) -> bool:
        """True when no heartbeat was confirmed for a whole lease: a waiter may be about to break it."""
        return now - self.confirmed_at >= self.lease

    def start(self, first_delay: Optional[float] = None) -> None:
        """Beat in a daemon thread until :meth:`stop` (real time). ``first_delay``: seconds to the first
        beat (default: one interval), so a holder that took over a running lease keeps its schedule."""
        if self._thread is not None:
            return
        # The thread runs in a copy of the context of the code that took the lock: cloudshell-logging 2.x
        # routes records by context variables; a record from a thread without them lands in missed_logs.log.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run,
            args=(self._run, first_delay),
            name="cloudshell-mutex-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def stop(self, wait: float = 5.0) -> None:
        """Stop beating; waits (up to ``wait`` s) for a round in progress to end. Never longer: a call that
        hangs must not hold up a release, and a write of that round landing later is harmless (it lands
        on a removed alias, or on a successor's service, where its foreign nonce is ignored). Safe to call
        from the heartbeat thread itself (an ``on_lost`` callback that releases)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)

    def _run(self, first_delay: Optional[float] = None) -> None:
        delay = beat_interval(self.lease, self._rng) if first_delay is None else max(0.0, first_delay)
        # Wake at max_hold too: the round then stops renewal (and tells the holder) on time.
        while not self._stop.wait(min(delay, self._until_expiry())):
            delay = beat_interval(self.lease, self._rng)
            try:
                self.beat()
            except Exception:  # never let the heartbeat die silently
                self.logger.exception("cloudshell-mutex: heartbeat failed")


def _call(callback: Optional[Callable[..., None]], argument: object, logger: logging.Logger) -> None:
    if callback is None:
        return
    try:
        callback(argument)
    except Exception:  # user code must not stop the heartbeat
        logger.exception("cloudshell-mutex: lease callback failed")


# ---------------------------------------------------------------- breaking a stale lock
