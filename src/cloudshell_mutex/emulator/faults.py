"""Realism knobs: per-call latency with the commit point inside the delay, and injected faults.

A real CloudShell server takes time to answer, and the moment a change becomes visible to other
clients lies somewhere inside that time. :class:`LatencyModel` draws one delay per call and splits it
at ``commit_fraction``: the first part is spent before the call takes effect, the rest after it.

:class:`FaultPlan` decides which fault, if any, a call gets: faults queued per API method (taken first,
one per call), then a seeded random draw (:class:`RandomFaults`). Every fault handed out is recorded
(:meth:`FaultPlan.injected`), with what became of the call, so a test can see what it was up against.
:class:`LateCalls` holds requests whose fault says they land later than their answer.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

#: HTTP 500 after the pre-commit delay; nothing changes.
ERROR_BEFORE_COMMIT = "error_before_commit"
#: The connection is reset after the pre-commit delay, without an answer; nothing changes, ever.
RESET_BEFORE_COMMIT = "reset_before_commit"
#: The call takes effect, then the connection closes without an answer.
DROP_AFTER_COMMIT = "drop_after_commit"
#: The connection is reset (or left hanging); the request takes effect ``delay`` seconds after it arrived.
APPLY_LATE = "apply_late"
#: ``seconds`` of extra latency before the commit (e.g. past a client's socket timeout).
SPIKE = "spike"
#: An add whose alias is taken answers success anyway (nothing is stored; the event log shows it).
DOUBLE_GRANT = "double_grant"
#: GetReservationDetails (cached or not) shows the reservation as it was ``ms`` milliseconds ago.
STALE_FRESH_READ = "stale_fresh_read"
#: A ``Success="false"`` answer in SQL deadlock-victim wording; nothing changes.
TRANSIENT_FALSE = "transient_false"
#: No answer until the client gives up; the call takes effect at once if ``commit``, else never.
HANG = "hang"

#: ``inject_fault`` method name that matches every API method.
ANY_METHOD = "*"

#: How many injected faults :meth:`FaultPlan.injected` keeps (the oldest are dropped first).
FAULT_RECORD_LIMIT = 100_000

_DISTRIBUTIONS = {
    "none": (),
    "fixed": ("seconds",),
    "uniform": ("low", "high"),
    "normal": ("mean", "stddev"),
    "exponential": ("mean",),
    "lognormal": ("median", "sigma"),
}


def number(name: str, value: Any) -> float:
    """``value`` as a float, or a ValueError that names the setting."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _seconds(name: str, value: Any) -> float:
    seconds = number(name, value)
    if seconds < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return seconds


def _positive(name: str, value: Any) -> float:
    seconds = number(name, value)
    if seconds <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return seconds


def _optional_seconds(name: str, value: Any) -> Optional[float]:
    return None if value is None else _seconds(name, value)


def _reply(name: str, value: Any) -> str:
    if value not in ("reset", "hang"):
        raise ValueError(f"{name} must be 'reset' or 'hang', got {value!r}")
    return str(value)


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"{name} must be true or false, got {value!r}")


@dataclass(frozen=True)
class FaultKind:
    """A fault kind: what it does (``doc``) and its parameters with their defaults and checks."""

    name: str
    doc: str
    params: Mapping[str, Tuple[Any, Callable[[str, Any], Any]]] = field(default_factory=dict)
    #: A check of the parameters together (after each was checked alone), raising a ValueError.
    together: Optional[Callable[[str, Dict[str, Any]], None]] = None

    def check(self, params: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """The parameters with defaults filled in, or a ValueError naming the bad one."""
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"fault {self.name} parameters must be a mapping, got {params!r}")
        given = dict(params or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            known = sorted(self.params) or "none"
            raise ValueError(f"fault {self.name} does not take {unknown}; its parameters: {known}")
        checked = {
            name: check(f"fault {self.name} {name}", given[name]) if name in given else default
            for name, (default, check) in self.params.items()
        }
        if self.together is not None:
            self.together(f"fault {self.name}", checked)
        return checked


def _late_delays(where: str, params: Dict[str, Any]) -> None:
    """``delay_max`` makes ``delay`` the low end of a range: both numbers, low first."""
    if params["delay_max"] is None:
        return
    if params["delay"] is None:
        raise ValueError(f"{where} delay_max needs a delay (the range's low end), not delay=None")
    if params["delay_max"] < params["delay"]:
        raise ValueError(
            f"{where} delay_max ({params['delay_max']:g}) must not be less than delay ({params['delay']:g})"
        )


def drawn(kind: str, params: Mapping[str, Any], rng: random.Random) -> Dict[str, Any]:
    """The parameters one call gets: an ``apply_late`` with a ``delay_max`` gets a delay drawn uniformly
    from [delay, delay_max] (the record shows the drawn one); anything else, ``params`` as they are."""
    chosen = dict(params)
    if kind == APPLY_LATE and chosen.get("delay_max") is not None:
        chosen["delay"] = rng.uniform(chosen["delay"], chosen["delay_max"])
    return chosen


_HANG_LIMIT = (300.0, _positive)

#: Every fault kind, by name.
FAULT_KINDS: Dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind(ERROR_BEFORE_COMMIT, "HTTP 500 after the pre-commit delay; nothing changes"),
        FaultKind(
            RESET_BEFORE_COMMIT,
            "the connection is reset after the pre-commit delay, without an answer; the request never "
            "takes effect",
        ),
        FaultKind(DROP_AFTER_COMMIT, "the call takes effect, then the connection closes without an answer"),
        FaultKind(
            APPLY_LATE,
            "the connection is reset after reset_after seconds (or, with reply='hang', left unanswered "
            "until the client gives up); the request takes effect delay seconds after it arrived "
            "(delay=None: when the control endpoint's land_late says so; with delay_max, a delay drawn "
            "uniformly from [delay, delay_max] for each call)",
            {
                "delay": (1.0, _optional_seconds),
                "delay_max": (None, _optional_seconds),
                "reset_after": (0.0, _seconds),
                "reply": ("reset", _reply),
                "hang_limit": _HANG_LIMIT,
            },
            together=_late_delays,
        ),
        FaultKind(
            SPIKE, "seconds of extra latency before the call takes effect", {"seconds": (2.0, _positive)}
        ),
        FaultKind(
            DOUBLE_GRANT,
            "an add whose alias is taken answers success; the existing service stays as it is and the "
            "event log records a service_double_granted event with the caller's attributes",
        ),
        FaultKind(
            STALE_FRESH_READ,
            "GetReservationDetails, even with disableCache, shows the reservation as it was ms ago",
            {"ms": (500.0, _positive)},
        ),
        FaultKind(
            TRANSIENT_FALSE,
            "a Success=false answer in SQL Server's deadlock-victim wording; nothing changes",
            {"process_id": (57, _whole)},
        ),
        FaultKind(
            HANG,
            "no answer until the client gives up (or hang_limit); with commit=true the call takes effect "
            "at once, else never",
            {"commit": (False, _flag), "hang_limit": _HANG_LIMIT},
        ),
    )
}


def fault_kind(kind: Any) -> FaultKind:
    """The :class:`FaultKind` called ``kind``, or a ValueError listing the known ones."""
    known = FAULT_KINDS.get(kind) if isinstance(kind, str) else None
    if known is None:
        raise ValueError(f"fault kind {kind!r} is not known; use one of {sorted(FAULT_KINDS)}")
    return known


class LatencyModel:
    """A delay distribution (seconds) and where inside the delay the call commits.

    Settings are a dict, as the control endpoint carries them:
    ``{"distribution": "uniform", "low": 0.005, "high": 0.02, "commit_fraction": 0.5, "seed": 1}``.
    Distributions: ``none``, ``fixed`` (``seconds``), ``uniform`` (``low``, ``high``),
    ``normal`` (``mean``, ``stddev``; clipped at 0), ``exponential`` (``mean``), ``lognormal``
    (``median``, ``sigma``: the log of the delay is normal around log(median), a long tail of slow calls).
    ``methods`` maps an API method (or ``GetReservationDetails:uncached``, a ``disableCache`` read) to its
    own settings of the same form, e.g. ``{"distribution": "fixed", "seconds": 0.005, "methods":
    {"GetReservationDetails:uncached": {"distribution": "lognormal", "median": 0.05, "sigma": 0.5}}}``.
    """

    def __init__(self, settings: Optional[Mapping[str, Any]] = None, _nested: bool = False) -> None:
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
        methods = settings.pop("methods", None) or {}
        if not isinstance(methods, Mapping) or (methods and _nested):
            raise ValueError("latency methods must map API method names to latency settings (one level deep)")
        self.per_method = {str(name): LatencyModel(sub, _nested=True) for name, sub in methods.items()}
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
        if self.per_method:
            result["methods"] = {name: model.to_dict() for name, model in self.per_method.items()}
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
            if d == "lognormal":
                return rnd.lognormvariate(math.log(p["median"]), p["sigma"]) if p["median"] > 0 else 0.0
            return rnd.expovariate(1.0 / p["mean"]) if p["mean"] > 0 else 0.0

    def split(self, *keys: str) -> Tuple[float, float]:
        """Draw a delay and return ``(before_commit, after_commit)`` seconds, from the settings of the
        first of ``keys`` (method names) that has its own, else from the default ones."""
        model = next((self.per_method[k] for k in keys if k in self.per_method), self)
        total = model.sample()
        before = total * model.commit_fraction
        return before, total - before


@dataclass(frozen=True)
class Fault:
    """One fault handed to one call: its record ``id`` (:meth:`FaultPlan.injected`), kind and parameters."""

    id: int
    kind: str
    params: Mapping[str, Any]


def _rates(where: str, value: Any) -> Dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must map fault kinds to probabilities, e.g. {{'apply_late': 0.02}}")
    rates = {}
    for kind, rate in value.items():
        fault_kind(kind)
        probability = number(f"{where} {kind}", rate)
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"{where} {kind} must be a probability between 0 and 1, got {rate!r}")
        rates[kind] = probability
    if sum(rates.values()) > 1.0 + 1e-9:
        raise ValueError(
            f"{where} add up to {sum(rates.values()):g}; a call gets one fault at most, so at most 1"
        )
    return rates


class RandomFaults:
    """A seeded random fault mode: each call of a method in scope draws at most one fault.

    Settings: ``{"seed": 7, "rates": {"apply_late": 0.02, "spike": 0.05}, "methods": [...],
    "method_rates": {"GetReservationDetails": {"error_before_commit": 0.1}}, "params": {"spike":
    {"seconds": 1.5}}}``. ``rates`` apply to every method in ``methods`` (default: every method but
    ``Logon``/``SecureLogon``); ``method_rates`` replace them for one method; ``users`` (default: everyone)
    limits the mode to calls of those users, so a test can keep one client fault-free. The same seed and
    the same sequence of calls give the same faults.
    """

    #: Logging on is left alone unless named: a session that cannot log on tests nothing.
    DEFAULT_EXCLUDED = ("Logon", "SecureLogon")

    def __init__(self, settings: Mapping[str, Any]) -> None:
        if not isinstance(settings, Mapping):
            raise ValueError("random faults must be a mapping such as {'seed': 7, 'rates': {'spike': 0.05}}")
        settings = dict(settings)
        unknown = sorted(set(settings) - {"seed", "rates", "methods", "method_rates", "params", "users"})
        if unknown:
            raise ValueError(f"random fault settings not understood: {unknown}; use seed, rates, methods, "
                             "method_rates, params, users")  # fmt: skip
        users = settings.get("users")
        if users is not None and (isinstance(users, str) or not all(isinstance(u, str) for u in users)):
            raise ValueError("random fault users must be a list of user names")
        self.users = None if users is None else list(users)
        self.seed = settings.get("seed")
        self.rates = _rates("random fault rates", settings.get("rates", {}))
        methods = settings.get("methods")
        if methods is not None and (
            isinstance(methods, str) or not all(isinstance(m, str) and m for m in methods)
        ):
            raise ValueError("random fault methods must be a list of API method names")
        self.methods = None if methods is None else list(methods)
        method_rates = settings.get("method_rates", {})
        if not isinstance(method_rates, Mapping):
            raise ValueError("random fault method_rates must map method names to rates")
        self.method_rates = {
            str(m): _rates(f"random fault method_rates[{m}]", r) for m, r in method_rates.items()
        }
        params = settings.get("params", {})
        if not isinstance(params, Mapping):
            raise ValueError("random fault params must map fault kinds to their parameters")
        self.params = {kind: fault_kind(kind).check(p) for kind, p in params.items()}
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def to_dict(self) -> Dict[str, Any]:
        """The settings, in the form the constructor takes."""
        result: Dict[str, Any] = {"seed": self.seed, "rates": dict(self.rates)}
        if self.methods is not None:
            result["methods"] = list(self.methods)
        if self.method_rates:
            result["method_rates"] = {m: dict(r) for m, r in self.method_rates.items()}
        if self.params:
            result["params"] = {k: dict(p) for k, p in self.params.items()}
        if self.users is not None:
            result["users"] = list(self.users)
        return result

    def draw(self, method: str, user: str = "") -> Optional[Tuple[str, Dict[str, Any]]]:
        """``(kind, params)`` for this call of ``method`` by ``user``, or None."""
        if self.users is not None and user not in self.users:
            return None
        rates = self.method_rates.get(method)
        if rates is None:
            in_scope = (
                method in self.methods if self.methods is not None else method not in self.DEFAULT_EXCLUDED
            )
            if not in_scope:
                return None
            rates = self.rates
        if not rates:
            return None
        with self._lock:
            point = self._random.random()
        for kind, rate in sorted(rates.items()):  # sorted: the same seed picks the same kind
            if point < rate:
                with self._lock:  # a range's draw comes from the same seeded source
                    return kind, drawn(
                        kind, self.params.get(kind) or fault_kind(kind).check(None), self._random
                    )
            point -= rate
        return None


class FaultPlan:
    """Which fault each call gets: queued faults per API method first, then the random mode.

    Every fault handed out is recorded with an id; :meth:`settle` notes what became of the call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: Dict[str, Deque[Tuple[str, Dict[str, Any]]]] = {}
        self.random: Optional[RandomFaults] = None
        self._records: Deque[Dict[str, Any]] = deque(maxlen=FAULT_RECORD_LIMIT)
        self._by_id: Dict[int, Dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._rng = random.Random()  # draws within a queued fault's range (random faults use their seed's)

    def inject(
        self, method: str, kind: str, count: int = 1, params: Optional[Mapping[str, Any]] = None
    ) -> None:
        """Queue ``count`` faults of ``kind`` with ``params`` for the next calls of ``method`` ("*": any)."""
        checked = fault_kind(kind).check(params)
        if not method or not isinstance(method, str):
            raise ValueError("fault method must be an API method name or '*'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"fault count must be a whole number of at least 1, got {count!r}")
        with self._lock:
            self._queues.setdefault(method, deque()).extend((kind, dict(checked)) for _ in range(count))

    def set_random(self, settings: Optional[Mapping[str, Any]]) -> None:
        """Switch the random mode on (a :class:`RandomFaults` settings dict) or off (None)."""
        self.random = None if settings is None else RandomFaults(settings)

    def take(self, method: str, reservation_id: str = "", user: str = "") -> Optional[Fault]:
        """The fault for this call of ``method`` by ``user`` (recorded), or None."""
        with self._lock:
            chosen: Optional[Tuple[str, Dict[str, Any]]] = None
            source = "queued"
            for key in (method, ANY_METHOD):
                queue = self._queues.get(key)
                if queue:
                    chosen = queue.popleft()
                    break
        if chosen is None and self.random is not None:
            chosen, source = self.random.draw(method, user), "random"
        if chosen is None:
            return None
        kind, params = chosen
        with self._lock:
            if source == "queued":
                params = drawn(kind, params, self._rng)
            fault = Fault(next(self._ids), kind, params)
            record = {
                "id": fault.id,
                "method": method,
                "kind": kind,
                "params": dict(params),
                "source": source,
                "reservation_id": reservation_id,
                "user": user,
                "time": time.time(),
                "monotonic": time.monotonic(),
                "outcome": "pending",
            }
            if len(self._records) == self._records.maxlen:
                self._by_id.pop(self._records[0]["id"], None)
            self._records.append(record)
            self._by_id[fault.id] = record
        return fault

    def settle(self, fault_id: int, outcome: str, **details: Any) -> None:
        """Note what became of the call that got fault ``fault_id`` (e.g. ``"applied"``, ``"failed"``)."""
        with self._lock:
            record = self._by_id.get(fault_id)
            if record is not None:
                record["outcome"] = outcome
                record.update(details)

    def injected(self) -> List[Dict[str, Any]]:
        """Every fault handed out (the latest ``FAULT_RECORD_LIMIT``), oldest first, with its outcome."""
        with self._lock:
            return [dict(r, params=dict(r["params"])) for r in self._records]

    def clear(self) -> None:
        """Drop every queued fault and switch the random mode off (the records stay)."""
        with self._lock:
            self._queues.clear()
            self.random = None

    def pending(self) -> Dict[str, List[str]]:
        """The queued fault kinds per method."""
        with self._lock:
            return {method: [kind for kind, _ in queue] for method, queue in self._queues.items() if queue}


class LateCalls:
    """Requests that take effect later than their answer, in order of when they are due.

    One worker thread applies them at their due time; entries without a due time wait for :meth:`land`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: List[Tuple[float, int, int, Callable[[], None]]] = []  # (due, seq, fault id, action)
        self._held: Dict[int, Tuple[int, Callable[[], None]]] = {}  # fault id -> (seq, action)
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def schedule(self, fault_id: int, due: Optional[float], action: Callable[[], None]) -> None:
        """Run ``action`` at monotonic time ``due`` (None: when :meth:`land` is called)."""
        with self._cond:
            self._stopped = False
            if due is None:
                self._held[fault_id] = (next(self._seq), action)
                return
            heapq.heappush(self._due, (due, next(self._seq), fault_id, action))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="emulator-late-calls", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._due else self._due[0][0] - time.monotonic())
                if self._stopped:
                    return
                action = heapq.heappop(self._due)[3]
            action()  # outside the condition: the action takes the state lock

    def land(self, fault_ids: Optional[Sequence[int]] = None) -> int:
        """Apply now, in arrival order, the late requests of ``fault_ids`` (default: every pending one,
        timed ones too); return how many. The caller's thread applies them, so they have landed on return."""
        with self._cond:
            chosen = []
            for fault_id, (seq, action) in list(self._held.items()):
                if fault_ids is None or fault_id in fault_ids:
                    chosen.append((seq, action))
                    del self._held[fault_id]
            keep = []
            for entry in self._due:
                if fault_ids is None or entry[2] in fault_ids:
                    chosen.append((entry[1], entry[3]))
                else:
                    keep.append(entry)
            heapq.heapify(keep)
            self._due = keep
        for _, action in sorted(chosen, key=lambda item: item[0]):
            action()
        return len(chosen)

    def pending(self) -> int:
        """How many late requests have not landed yet."""
        with self._cond:
            return len(self._due) + len(self._held)

    def stop(self) -> List[int]:
        """Forget every pending late request (they never land) and end the worker; return their fault ids."""
        with self._cond:
            dropped = [entry[2] for entry in self._due] + list(self._held)
            self._due, self._held = [], {}
            self._stopped = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        return dropped
