"""How long to wait between attempts: pluggable pacing policies and a per-client call budget.

CloudShell has no notifications, so a waiter learns that the lock is free only by trying again.
Short waits shorten the hand-off gap; every try is a call on a server that the whole site shares.
The policies here trade these off; the lock never sleeps past its caller's deadline whatever a
policy returns, and a caller that cancels its wait is heard within a second (:func:`cancellation_check`;
the pause is :meth:`~.engine.Wait.pause`).

A policy is any object with ``next_delay(attempt, previous, rng) -> seconds``; ``attempt`` counts
retries from 1, ``previous`` is the delay this policy returned last time (0.0 before the first).
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from typing import Any, Callable, Optional

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    Protocol = object  # type: ignore


class PacingPolicy(Protocol):
    """The interface of a pacing policy."""

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Seconds to sleep before retry number ``attempt`` (1-based)."""


class FixedPacing:
    """The same delay every time, optionally with +/- ``jitter`` (a fraction) to desynchronise waiters."""

    def __init__(self, interval: float, jitter: float = 0.0) -> None:
        if interval < 0 or not 0 <= jitter <= 1:
            raise ValueError("FixedPacing needs interval >= 0 and 0 <= jitter <= 1")
        self.interval = interval
        self.jitter = jitter

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Return ``interval``, jittered."""
        return self.interval * (1 + self.jitter * rng.uniform(-1, 1))

    def __repr__(self) -> str:
        return f"FixedPacing(interval={self.interval}, jitter={self.jitter})"


class OriginalPacing:
    """The original snippet's policy: sleep ``randint(2, 5)`` seconds between tries.

    Kept so that benchmarks can compare against it. Integer bounds use ``randint`` exactly as the
    original did; float bounds (for short tests) draw uniformly.
    """

    def __init__(self, low: float = 2, high: float = 5) -> None:
        if not 0 <= low <= high:
            raise ValueError("OriginalPacing needs 0 <= low <= high")
        self.low = low
        self.high = high

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Return a random whole number of seconds in [low, high] (uniform for float bounds)."""
        if isinstance(self.low, int) and isinstance(self.high, int):
            return float(rng.randint(self.low, self.high))
        return rng.uniform(self.low, self.high)

    def __repr__(self) -> str:
        return f"OriginalPacing(low={self.low}, high={self.high})"


class DefaultPacing:
    """Fast at first, then decorrelated jitter under a low cap.

    Locks guard short sections more often than long ones, so the first ``fast_attempts`` retries
    come after about ``first`` seconds. After that each delay is drawn from
    ``[base, 3 * previous]`` and capped at ``cap``: jitter keeps waiters from retrying in lock-step,
    and the low cap keeps the gap between a release and the next grant short (a high cap lets
    newcomers overtake old waiters; see docs/protocol.md).
    """

    def __init__(
        self, first: float = 0.05, base: float = 0.1, cap: float = 1.0, fast_attempts: int = 2
    ) -> None:
        if not (first >= 0 and 0 < base <= cap and fast_attempts >= 0):
            raise ValueError("DefaultPacing needs first >= 0, 0 < base <= cap and fast_attempts >= 0")
        self.first = first
        self.base = base
        self.cap = cap
        self.fast_attempts = fast_attempts

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Return the next delay: ~``first`` while fast, then min(cap, U(base, 3 * previous))."""
        if attempt <= self.fast_attempts:
            return rng.uniform(self.first / 2, self.first)
        return min(self.cap, rng.uniform(self.base, max(self.base, previous * 3)))

    def __repr__(self) -> str:
        return (
            f"DefaultPacing(first={self.first}, base={self.base}, cap={self.cap}, "
            f"fast_attempts={self.fast_attempts})"
        )


class ExponentialBackoff:
    """Capped backoff with "equal jitter": ``t = min(cap, base * 2**(attempt-1))``, sleep U(t/2, t).

    The default for transient failures (5xx, dropped connections): a struggling server should see
    fewer calls, not more, and the lower bound keeps the retry from being immediate.
    """

    def __init__(self, base: float = 0.25, cap: float = 5.0) -> None:
        if not 0 < base <= cap:
            raise ValueError("ExponentialBackoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Return the next backoff delay."""
        ceiling = min(self.cap, self.base * 2 ** min(max(attempt - 1, 0), 32))
        return rng.uniform(ceiling / 2, ceiling)

    def __repr__(self) -> str:
        return f"ExponentialBackoff(base={self.base}, cap={self.cap})"


class CohortPacing:
    """How the one process per machine that waits on the server polls: it waits for another *cohort*, which
    keeps the lock for up to K holds or T seconds, so polling faster than every second or two only costs
    server calls (the server's load grows with the number of execution servers, not processes).

    The delay *shrinks* as the wait grows, from ``start`` to ``end`` over ``steps`` polls (+/- ``jitter``):
    at each release the execution server that has waited longest polls most often, so it is the likeliest
    to get the lock. A growing backoff does the opposite (the longest waiter polls least often and starves);
    a fixed rate leaves it to chance, which starved a server for whole windows in the benchmark.
    """

    def __init__(self, start: float = 2.5, end: float = 1.0, steps: int = 6, jitter: float = 0.25) -> None:
        if not (0 < end <= start and steps >= 1 and 0 <= jitter < 1):
            raise ValueError("CohortPacing needs 0 < end <= start, steps >= 1 and 0 <= jitter < 1")
        self.start, self.end, self.steps, self.jitter = start, end, steps, jitter

    def next_delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """``start`` at the first retry, ``end`` from the ``steps``-th on, linearly between; jittered."""
        share = min(1.0, max(0, attempt - 1) / self.steps)
        return (self.start + (self.end - self.start) * share) * (1 + self.jitter * rng.uniform(-1, 1))

    def __repr__(self) -> str:
        return f"CohortPacing(start={self.start}, end={self.end}, steps={self.steps}, jitter={self.jitter})"


class CallBudget:
    """A token bucket: at most ``rate`` API calls per second on average, bursts up to ``burst``.

    The lock spends it on the calls it makes while waiting (re-adds, holder reads, progress); the
    first add and the release never wait on it. Shared by every lock that uses the same API session
    in one process (see :func:`budget_for`), so a process with many waiters stays polite to the
    server. Thread-safe.
    """

    def __init__(
        self, rate: float = 5.0, burst: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("CallBudget needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one call from the budget; return how long to wait before making it (0 if none)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self) -> None:
        """Give back a reserved call that was not made (e.g. the deadline came first)."""
        with self._lock:
            self._tokens = min(self.burst, self._tokens + 1)

    def __repr__(self) -> str:
        return f"CallBudget(rate={self.rate}, burst={self.burst})"


_budgets: weakref.WeakKeyDictionary[Any, CallBudget] = weakref.WeakKeyDictionary()
_budgets_lock = threading.Lock()


def budget_for(api: Any) -> CallBudget:
    """The default budget of one API session: shared by all locks made with that session."""
    with _budgets_lock:
        try:
            budget = _budgets.get(api)
            if budget is None:
                budget = _budgets[api] = CallBudget()
            return budget
        except TypeError:  # not weak-referenceable: a budget of its own
            return CallBudget()


#: While a wait can be cancelled, it sleeps in slices of at most this many seconds and checks between them.
CANCEL_SLICE = 0.5


class CancelledWait(Exception):
    """Internal: a cancellable pause found its caller cancelled. The lock that paused turns it into
    :class:`~.errors.MutexCancelled` once it has taken back what its acquisition left behind."""


def cancellation_check(source: Any) -> Optional[Callable[[], bool]]:
    """The check for the ``cancellation`` option: None for None, else a callable that is True once cancelled.

    ``source`` is CloudShell's ``CancellationContext`` (any object with ``is_cancelled``, an attribute or a
    method), a ``threading.Event`` (set = cancelled) or a callable returning a bool. Anything else raises
    ``TypeError``.
    """
    if source is None:
        return None
    if isinstance(source, threading.Event):
        return source.is_set
    if hasattr(source, "is_cancelled"):

        def cancelled() -> bool:
            flag = source.is_cancelled
            return bool(flag() if callable(flag) else flag)

        return cancelled
    if callable(source):
        return lambda: bool(source())
    raise TypeError(
        "cancellation must be the command's CancellationContext (an object with is_cancelled), a "
        f"threading.Event or a callable that returns True once cancelled, got {type(source).__name__}"
    )
