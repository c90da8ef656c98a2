"""Every call the probe makes, counted, timed and sorted by what is known of it.

:class:`RecordingSession` wraps a ``CloudShellAPISession``: each API method call goes through the
:class:`CallLog` it shares with the probe's other sessions (the racers'), which records the method, when it
was sent, how long it took and how it ended (answered, refused, no answer, never sent; the lock's
:func:`~cloudshell_mutex.lock.server.classify.classify`
decides). An add that got no answer may still land: the log
remembers it, so that the clean-up watches for it. The latencies of answered calls are the probe's measure of
the server and of whatever stands in front of it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from ..lock.server.classify import classify

#: How a call ended.
ANSWERED, REFUSED, NO_ANSWER, NOT_SENT = "answered", "refused", "no answer", "never sent"


@dataclass(frozen=True)
class CallRecord:
    """One call: method, when it was sent (monotonic), how long it took, how it ended."""

    method: str
    sent: float
    elapsed: float
    outcome: str


@dataclass(frozen=True)
class UnsureAdd:
    """An add that got no answer: it may land until ``sent`` + the request lifetime."""

    reservation_id: str
    alias: str
    sent: float


#: A test's hook, called with (call number from 1, method, "before" | "after") around each call.
CallHook = Callable[[int, str, str], None]


class CallLog:
    """The calls of one probe run, from every session it uses (thread-safe)."""

    def __init__(self, hook: Optional[CallHook] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.hook = hook
        self.clock = clock
        self.calls: List[CallRecord] = []
        #: Adds that got no answer, by (reservation, alias).
        self.unsure: Dict[Tuple[str, str], UnsureAdd] = {}
        #: Creates that got no answer: when each was sent (the sandbox may exist all the same).
        self.unsure_creates: List[float] = []
        self._lock = threading.Lock()
        self._count = 0

    def call(
        self, method: str, func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Any:
        """Make one call through the log."""
        with self._lock:
            self._count += 1
            number = self._count
        if self.hook is not None:
            self.hook(number, method, "before")  # an interrupt here: nothing was sent
        sent = self.clock()
        outcome = NO_ANSWER
        try:
            result = func(*args, **kwargs)
            outcome = ANSWERED
            return result
        except CloudShellAPIError:
            outcome = REFUSED
            raise
        except Exception as error:
            failure = classify(error)
            outcome = NO_ANSWER if failure.maybe_committed or failure.in_flight else NOT_SENT
            raise
        finally:
            elapsed = self.clock() - sent
            with self._lock:
                self.calls.append(CallRecord(method, sent, elapsed, outcome))
                if outcome == NO_ANSWER and method == "AddServiceToReservation" and len(args) >= 3:
                    self.unsure[(str(args[0]), str(args[2]))] = UnsureAdd(str(args[0]), str(args[2]), sent)
                if outcome == NO_ANSWER and method == "CreateImmediateReservation":
                    self.unsure_creates.append(sent)
            if self.hook is not None and outcome in (ANSWERED, REFUSED):
                self.hook(number, method, "after")  # an interrupt here: answered, the answer never seen

    def count(self) -> int:
        """Calls made so far (the sessions' logons not included)."""
        with self._lock:
            return self._count

    def latencies(self) -> List[float]:
        """Seconds each answered call took (refusals are answers), in the order they were sent."""
        with self._lock:
            return [
                c.elapsed
                for c in sorted(self.calls, key=lambda c: c.sent)
                if c.outcome in (ANSWERED, REFUSED)
            ]

    def unanswered(self) -> List[CallRecord]:
        """Calls that got no answer."""
        with self._lock:
            return [c for c in self.calls if c.outcome == NO_ANSWER]


class RecordingSession:
    """A session whose API calls (public methods, capitalised as the client's are) go through a
    :class:`CallLog`; everything else is the session's own."""

    def __init__(self, api: Any, log: CallLog) -> None:
        self._api = api
        self._log = log

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._api, name)
        if not (callable(attribute) and name[:1].isupper()):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._log.call(name, attribute, args, kwargs)

        return call
