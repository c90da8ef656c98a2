"""The lock's tuning options: one type, validated once, when the lock is made.

:class:`MutexOptions` is what ``ReservationMutex(..., **options)`` builds from its keyword arguments,
and what the driver mixin and the orchestration helper pass through. A wrong value raises
``TypeError``/``ValueError`` here, naming the option, instead of failing late (at release time, with
the lock held) or silently (a NaN that turns a check off).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import protocol
from .events import EventHook
from .pacing import CallBudget, PacingPolicy, cancellation_check

#: A fresh read shows a committed change within this many seconds (an assumption: reads of a real server
#: are not known to lag; the emulator's ``stale_fresh_read`` fault tests what the lock does if they do).
#: No decision to remove is taken on a read made sooner than this after a removal of ours.
FRESH_READ_LAG = 1.0

#: The default lease and the shortest one (seconds): see lease.py for why.
DEFAULT_LEASE = 60.0
MIN_LEASE = 1.0

#: A request is never assumed gone sooner than this after it was sent.
MIN_REQUEST_LIFETIME = 1.0

#: Progress messages go to the reservation output that people read: not more often than this.
MIN_PROGRESS_INTERVAL = 1.0

#: The library's logger: a lock given no ``logger`` logs here (the package gives it a NullHandler).
LOGGER_NAME = "cloudshell_mutex"
#: "Left out": an argument that then takes its value from the options (None is a value: wait forever).
UNSET: Any = object()


def default_logger(logger: Optional[logging.Logger]) -> logging.Logger:
    """``logger``, or the library's logger (:data:`LOGGER_NAME`) when it is None."""
    return logger if logger is not None else logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class MutexOptions:
    """How a :class:`~cloudshell_mutex.ReservationMutex` waits, checks and reports.

    * ``timeout``: seconds a blocking acquire may wait (None: forever); then ``MutexTimeout``.
    * ``pacing``: delays between contended attempts (default :class:`~.pacing.DefaultPacing`);
      ``backoff``: delays after transient failures (default :class:`~.pacing.ExponentialBackoff`);
      ``budget``: a :class:`~.pacing.CallBudget` for the calls made while waiting (default: one shared
      by every lock on the same API session in this process).
    * ``verify``: read the owner back after a successful add (one more call per acquisition).
    * ``reentrant``: the holding object may acquire again (counted; the outermost release releases).
    * ``release_check_after``: 0 (the default) reads the owner before every remove. A value > 0 lets
      release skip that read if ownership was confirmed less than this many seconds ago: an
      uncontended acquire + release then costs 2 calls instead of 3, but a lock removed by someone
      else meanwhile (the original snippet does that) is then removed from its next holder, and the
      damage cascades. See docs/protocol.md.
    * ``request_lifetime``: the longest a request that got no answer (a reset connection, a client
      timeout) may still be applied by the server after it was sent. Until then the lock never
      sends a second remove, and keeps watching an add of unknown outcome (docs/protocol.md).
    * ``holder_check_interval``: while waiting, read who holds the lock at most this often.
    * ``progress``/``progress_interval``: write "waiting for MUTEX held by ..." to the reservation
      output, at most every ``progress_interval`` seconds (at least 1).
    * ``release_attempts``: how many rounds a release makes before giving up on transient failures.
    * ``on_event``: called with each :class:`~.events.MutexEvent`.
    * ``model``: the service model to add (``Mutex Service``).
    * ``lease``: seconds (default 60; 0 = no lease). When the server's model has the lease attributes, the
      holder writes the lease and heartbeats about every lease/3 in a background thread; waiters break a
      holder they have seen without a heartbeat for lease + margin. A model without them (the original
      package), or 0, means no lease: never broken automatically. See docs/protocol.md, "Leases".
    * ``fair``: True (the default): waiters line up in an advisory queue of ticket services, only the
      head polls fast, the others read rarely (a budget per lock, not per process), and a releaser that
      asks again goes to the back. Mutual exclusion still rests on the add alone. False: plain polling
      (every waiter polls the add by ``pacing``; whoever asks first after a release wins), for a site
      that measured a case where it does better. See docs/protocol.md, "Waiting in line".
    * ``on_lost``: called with a :class:`~.errors.MutexLostError` when the heartbeat finds the lock taken
      from this holder, or stops renewing it at ``max_hold`` (from the heartbeat thread); ``on_danger``:
      called with the seconds since the last confirmed heartbeat once heartbeats have failed for 2/3 of the
      lease (the lease may lapse soon).
    * ``cancellation``: lets the caller stop a waiting acquire: a CloudShell ``CancellationContext`` (anything
      with ``is_cancelled``), a ``threading.Event`` or a callable returning True once cancelled. A blocking
      acquire checks it between tries and every half second while it sleeps, and raises
      :class:`~.errors.MutexCancelled`, leaving nothing behind. A held lock and a release never look at it.
    * ``max_hold``: seconds (default None: no limit; needs a lease). A holder stops renewing its lease this
      long after it took the lock, so that waiters break it lease + margin later if its command is stuck;
      ``on_lost`` and :meth:`~.mutex.ReservationMutex.ensure_held` tell the holder at once. See
      docs/protocol.md, "Leases".
    """

    timeout: Optional[float] = 300.0
    pacing: Optional[PacingPolicy] = None
    backoff: Optional[PacingPolicy] = None
    budget: Optional[CallBudget] = None
    verify: bool = False
    reentrant: bool = False
    release_check_after: float = 0.0
    request_lifetime: float = 120.0
    holder_check_interval: float = 5.0
    progress: bool = False
    progress_interval: float = 10.0
    release_attempts: int = 5
    on_event: Optional[EventHook] = None
    model: str = protocol.SERVICE_MODEL
    lease: float = DEFAULT_LEASE
    on_lost: Optional[Callable[[Any], None]] = None
    on_danger: Optional[Callable[[float], None]] = None
    fair: bool = True
    cancellation: Any = None
    max_hold: Optional[float] = None

    def __post_init__(self) -> None:
        check_duration("timeout", self.timeout, allow_none=True)
        check_duration("release_check_after", self.release_check_after)
        check_duration("request_lifetime", self.request_lifetime, minimum=MIN_REQUEST_LIFETIME)
        check_duration("holder_check_interval", self.holder_check_interval)
        check_duration("progress_interval", self.progress_interval, minimum=MIN_PROGRESS_INTERVAL)
        for name in ("verify", "reentrant", "progress", "fair"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {type(getattr(self, name)).__name__}")
        attempts = self.release_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise TypeError(f"release_attempts must be a whole number, got {attempts!r}")
        if attempts < 1:
            raise ValueError(f"release_attempts must be at least 1, got {attempts}")
        for name in ("pacing", "backoff"):
            policy = getattr(self, name)
            if policy is not None and not callable(getattr(policy, "next_delay", None)):
                raise TypeError(f"{name} must be a pacing policy (an object with next_delay), got {policy!r}")
        if self.budget is not None and not callable(getattr(self.budget, "reserve", None)):
            raise TypeError(f"budget must be a CallBudget, got {self.budget!r}")
        if self.on_event is not None and not callable(self.on_event):
            raise TypeError("on_event must be a callable that takes a MutexEvent")
        check_duration("lease", self.lease)
        if 0 < self.lease < MIN_LEASE:
            raise ValueError(
                f"lease must be 0 (no lease) or at least {MIN_LEASE:g} seconds, got {self.lease!r}"
            )
        for name in ("on_lost", "on_danger"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"{name} must be a callable, got {getattr(self, name)!r}")
        cancellation_check(self.cancellation)  # raises TypeError for anything it cannot ask
        check_duration("max_hold", self.max_hold, allow_none=True)
        if self.max_hold is not None and self.max_hold <= 0:
            raise ValueError(
                f"max_hold must be a positive number of seconds (or None: no limit), got {self.max_hold!r}"
            )
        if self.max_hold is not None and self.lease <= 0:
            raise ValueError(
                "max_hold needs a lease: a holder without one is never broken, so stopping its renewal "
                f"frees nothing. Set lease (e.g. lease={DEFAULT_LEASE:g}) with max_hold={self.max_hold:g}, "
                "or leave max_hold out"
            )
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("model must be the name of the lock's service model, e.g. 'Mutex Service'")

    def replace(self, **changes: Any) -> MutexOptions:
        """A copy with some options changed (validated again); unknown names raise TypeError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            known = ", ".join(f.name for f in dataclasses.fields(self))
            raise TypeError(f"unknown lock option(s) {sorted(unknown)}; the options are: {known}")
        return dataclasses.replace(self, **changes)


def check_duration(
    name: str, value: Any, *, minimum: float = 0.0, allow_none: bool = False
) -> Optional[float]:
    """Return ``value`` as seconds, or raise: a number (not a bool or a string), finite, >= ``minimum``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " or None" if allow_none else ""
        raise TypeError(f"{name} must be a number of seconds{hint}, got {value!r}")
    if not math.isfinite(value):
        hint = " (use None to wait forever)" if allow_none else ""
        raise ValueError(f"{name} must be a finite number of seconds{hint}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum:g} seconds, got {value!r}")
    return float(value)
