"""Instrumentation of the emulated server: call counts, the emulator's own time per call, the event log.

One part of :class:`~.state.EmulatorState`; it shares the state's lock, so an event is logged in the
same atomic step as the change it describes.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import time
from collections import deque
from typing import Any, ContextManager, Deque, Dict, List, Mapping, Optional

#: Fields added to every event the current call records (e.g. the fault it got); set per call by the server.
EVENT_TAGS: contextvars.ContextVar[Optional[Dict[str, Any]]] = contextvars.ContextVar(
    "emulator_event_tags", default=None
)

#: How many service changes the event log keeps; older ones are dropped first.
EVENT_LOG_LIMIT = 200_000


def utcnow() -> _dt.datetime:
    """The server's wall clock (UTC)."""
    return _dt.datetime.now(_dt.timezone.utc)


class Instrumentation:
    """What the server saw: calls per method, its own time per call, the ordered log of service changes."""

    def __init__(self, lock: ContextManager[Any]) -> None:
        self.lock = lock
        # Bounded, so that an emulator left running for days does not grow without limit; "seq" keeps
        # counting, so a checker sees a gap rather than a silently shortened history.
        self._events: Deque[Dict[str, Any]] = deque(maxlen=EVENT_LOG_LIMIT)
        self._event_seq = 0
        self._call_counts: Dict[str, int] = {}
        # The emulator's own time per API call (injected latency excluded), most recent calls only.
        self._overheads: Deque[float] = deque(maxlen=100_000)

    def count_call(self, method: str) -> None:
        """Count one received call of ``method``."""
        with self.lock:
            self._call_counts[method] = self._call_counts.get(method, 0) + 1

    def call_counts(self) -> Dict[str, int]:
        """Calls received per API method."""
        with self.lock:
            return dict(self._call_counts)

    def reset_counts(self) -> None:
        """Start counting from zero (call counts and overhead samples)."""
        with self.lock:
            self._call_counts.clear()
            self._overheads.clear()

    def record_overhead(self, seconds: float) -> None:
        """Remember how long the emulator itself spent on one call."""
        with self.lock:
            self._overheads.append(seconds)

    def overhead(self) -> Dict[str, float]:
        """Statistics of the emulator's own per-call time in milliseconds (injected latency excluded)."""
        with self.lock:
            samples = sorted(self._overheads)
        if not samples:
            return {"calls": 0}
        n = len(samples)
        return {
            "calls": n,
            "mean_ms": 1000.0 * sum(samples) / n,
            "p50_ms": 1000.0 * samples[n // 2],
            "p99_ms": 1000.0 * samples[min(n - 1, (n * 99) // 100)],
            "max_ms": 1000.0 * samples[-1],
        }

    def record(
        self,
        op: str,
        reservation_id: str,
        alias: str,
        model: str,
        attributes: Mapping[str, str],
        user: str,
        **extra: Any,
    ) -> None:
        """Append a committed service change to the ordered log (caller holds the lock)."""
        event = {
            "seq": self._event_seq + 1,
            "time": utcnow().isoformat(),
            "monotonic": time.monotonic(),
            "reservation_id": reservation_id,
            "op": op,
            "alias": alias,
            "model": model,
            "attributes": dict(attributes),
            "user": user,
        }
        event.update(extra)
        event.update(EVENT_TAGS.get() or {})
        self._event_seq += 1
        self._events.append(event)

    def events(self, reservation_id: Optional[str] = None) -> List[Dict[str, Any]]:
        """The ordered log of committed service changes (the latest ``EVENT_LOG_LIMIT`` of them)."""
        with self.lock:
            return [dict(e) for e in self._events if reservation_id in (None, e["reservation_id"])]
