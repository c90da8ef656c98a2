"""Realism knobs: per-call latency with the commit point inside the delay, and injected faults.

A real CloudShell server takes time to answer, and the moment a change becomes visible to other
clients lies somewhere inside that time. :class:`LatencyModel` draws one delay per call and splits it
at ``commit_fraction``: the first part is spent before the call takes effect, the rest after it.
:class:`FaultPlan` holds queued faults per API method: an HTTP 500 before the commit, or a response
dropped after the commit (the ambiguous case, where the client cannot know whether its call took effect).
"""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

#: Fault kinds and what they do.
ERROR_BEFORE_COMMIT = "error_before_commit"
DROP_AFTER_COMMIT = "drop_after_commit"
FAULT_KINDS = (ERROR_BEFORE_COMMIT, DROP_AFTER_COMMIT)

#: ``inject_fault`` method name that matches every API method.
ANY_METHOD = "*"

_DISTRIBUTIONS = {
    "none": (),
    "fixed": ("seconds",),
    "uniform": ("low", "high"),
    "normal": ("mean", "stddev"),
    "exponential": ("mean",),
}


def number(name: str, value: Any) -> float:
    """``value`` as a float, or a ValueError that names the setting."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


class LatencyModel:
    """A delay distribution (seconds) and where inside the delay the call commits.

    Settings are a dict, as the control endpoint carries them:
    ``{"distribution": "uniform", "low": 0.005, "high": 0.02, "commit_fraction": 0.5, "seed": 1}``.
    Distributions: ``none``, ``fixed`` (``seconds``), ``uniform`` (``low``, ``high``),
    ``normal`` (``mean``, ``stddev``; clipped at 0), ``exponential`` (``mean``).
    """

    def __init__(self, settings: Optional[Mapping[str, Any]] = None) -> None:
        if settings is not None and not isinstance(settings, Mapping):
            raise ValueError(
                f"latency must be a mapping such as {{'distribution': 'fixed', 'seconds': 0.01}}, "
                f"got {settings!r}"
            )
        settings = dict(settings or {"distribution": "none"})
        distribution = str(settings.pop("distribution", "none"))
        if distribution not in _DISTRIBUTIONS:
            raise ValueError(
                f"latency distribution {distribution!r} is not known; use one of {sorted(_DISTRIBUTIONS)}"
            )
        commit_fraction = number("latency commit_fraction", settings.pop("commit_fraction", 0.5))
        if not 0.0 <= commit_fraction <= 1.0:
            raise ValueError(f"latency commit_fraction must be between 0 and 1, got {commit_fraction}")
        seed = settings.pop("seed", None)
        params: Dict[str, float] = {}
        for name in _DISTRIBUTIONS[distribution]:
            if name not in settings:
                raise ValueError(f"latency distribution {distribution!r} needs {name!r}")
            value = number(f"latency {name}", settings.pop(name))
            if value < 0:
                raise ValueError(f"latency {name} must not be negative, got {value}")
            params[name] = value
        if settings:
            raise ValueError(f"latency settings not understood: {sorted(settings)}")
        if distribution == "uniform" and params["low"] > params["high"]:
            raise ValueError("latency low must not exceed high")
        self.distribution = distribution
        self.params = params
        self.commit_fraction = commit_fraction
        self.seed = seed
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def to_dict(self) -> Dict[str, Any]:
        """The settings, in the form the constructor takes."""
        result: Dict[str, Any] = {"distribution": self.distribution, **self.params}
        result["commit_fraction"] = self.commit_fraction
        if self.seed is not None:
            result["seed"] = self.seed
        return result

    def sample(self) -> float:
        """Draw one call's total delay in seconds."""
        with self._lock:  # random.Random is not documented as thread-safe for every method
            rnd = self._random
            d, p = self.distribution, self.params
            if d == "none":
                return 0.0
            if d == "fixed":
                return p["seconds"]
            if d == "uniform":
                return rnd.uniform(p["low"], p["high"])
            if d == "normal":
                return max(0.0, rnd.gauss(p["mean"], p["stddev"]))
            return rnd.expovariate(1.0 / p["mean"]) if p["mean"] > 0 else 0.0

    def split(self) -> Tuple[float, float]:
        """Draw a delay and return ``(before_commit, after_commit)`` seconds."""
        total = self.sample()
        before = total * self.commit_fraction
        return before, total - before


class FaultPlan:
    """Queued faults per API method; each call takes at most one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: Dict[str, Deque[str]] = {}

    def inject(self, method: str, kind: str, count: int = 1) -> None:
        """Queue ``count`` faults of ``kind`` for the next calls of ``method`` (``"*"``: any method)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not known; use one of {list(FAULT_KINDS)}")
        if not method or not isinstance(method, str):
            raise ValueError("fault method must be an API method name or '*'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"fault count must be a whole number of at least 1, got {count!r}")
        with self._lock:
            self._queues.setdefault(method, deque()).extend([kind] * count)

    def take(self, method: str) -> Optional[str]:
        """Remove and return the fault for this call of ``method``, or None."""
        with self._lock:
            for key in (method, ANY_METHOD):
                queue = self._queues.get(key)
                if queue:
                    return queue.popleft()
        return None

    def clear(self) -> None:
        """Drop every queued fault."""
        with self._lock:
            self._queues.clear()

    def pending(self) -> Dict[str, List[str]]:
        """The queued faults per method."""
        with self._lock:
            return {method: list(queue) for method, queue in self._queues.items() if queue}
