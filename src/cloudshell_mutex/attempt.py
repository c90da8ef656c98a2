"""The record of one acquire() or release() call: what it tried, what it saw, what it does not know.

Plain book-keeping without I/O. The lock (lock.py) makes the calls and updates the record; the
pacing, the progress messages and the error messages (diagnosis.py) read it.
"""

from __future__ import annotations

import random
from typing import Optional

from .holder import Holder
from .pacing import PacingPolicy


class Attempt:
    """Book-keeping of one acquire() or release() call, or of one holder() read."""

    def __init__(self, token: str, start: float, deadline: Optional[float] = None) -> None:
        self.token = token
        self.start = start
        self.deadline = deadline
        self.attempts = 0  # adds sent
        self.calls = 0
        self.contentions = 0
        self.transients = 0
        self.contention_delay = 0.0  # the pacing policy's previous delay
        self.backoff_delay = 0.0  # the backoff policy's previous delay
        # True while an add may have committed without us knowing (its response was lost).
        self.ambiguous = False
        # True when a successful fresh read happened after the last add: nothing new to learn.
        self.read_since_add = False
        # Calls wait on the call budget only while polling: never the first add, never a release.
        self.paced = False
        self.last_read_at: Optional[float] = None  # last successful fresh read
        self.last_read_attempt: Optional[float] = None  # last read tried, successful or not
        self.contended_since: Optional[float] = None
        self.holder: Optional[Holder] = None
        self.holder_since: Optional[float] = None
        self.last_progress: Optional[float] = None
        self.last_error: Optional[str] = None

    @property
    def holder_label(self) -> Optional[str]:
        """The label of the holder seen last, or None."""
        return self.holder.label if self.holder is not None else None

    def is_ours(self, holder: Optional[Holder]) -> bool:
        """True when ``holder`` carries this acquisition's token."""
        return holder is not None and holder.token == self.token

    def settled_by(self, holder: Optional[Holder]) -> bool:
        """Take in a fresh read after an add: True when it shows our token. Anything else shows that
        no add of ours is in place (the alias is unique), so nothing of ours is pending any more."""
        if self.is_ours(holder):
            return True
        self.ambiguous = False
        return False

    def failed(self, message: str) -> None:
        """Record a transient failure."""
        self.transients += 1
        self.last_error = message

    def contended(self, since: float) -> None:
        """Remember when this acquisition first found the lock taken."""
        if self.contended_since is None:
            self.contended_since = since

    def see_holder(self, holder: Optional[Holder]) -> bool:
        """Record the holder a fresh read showed; True when it replaced another holder."""
        if holder is None:
            self.holder = None
            self.holder_since = None
            return False
        if self.holder is not None and self.holder.token == holder.token:
            return False
        # First sight of this holder: it has held the lock at least since the contention that
        # preceded this read (this waiter's monotonic clock; no server clocks are compared).
        first = self.holder is None
        self.holder_since = (
            self.contended_since if first and self.contended_since is not None else self.last_read_at
        )
        self.holder = holder
        return not first

    def held_for(self, now: float) -> Optional[float]:
        """How long this waiter has seen the current holder hold the lock, or None."""
        return None if self.holder_since is None else now - self.holder_since

    def next_pause(self, pacing: PacingPolicy, rng: random.Random) -> float:
        """The pacing policy's delay before the next add after contention."""
        self.contention_delay = pacing.next_delay(self.contentions or 1, self.contention_delay, rng)
        return self.contention_delay

    def next_backoff(self, backoff: PacingPolicy, rng: random.Random) -> float:
        """The backoff policy's delay after the latest transient failure."""
        self.backoff_delay = backoff.next_delay(self.transients, self.backoff_delay, rng)
        return self.backoff_delay

    def progress_due(self, now: float, interval: float) -> bool:
        """True (and noted) when a progress message is due: ``interval`` after the start, then at most
        once per ``interval``."""
        if now - self.start < interval:
            return False
        if self.last_progress is not None and now - self.last_progress < interval:
            return False
        self.last_progress = now
        return True
