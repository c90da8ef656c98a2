"""What both HTTP front ends and the control endpoint share: the state and the realism knobs."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .faults import Fault, FaultPlan, LateCalls, LatencyModel, RandomFaults, number
from .messages import ApiError
from .methods import CallContext, execute, outcome
from .quali import register_package
from .state import (
    ADD_ATOMICITY_MODES,
    ALIAS_CASE_MODES,
    CATALOG_MODES,
    DISABLE_CACHE_MODES,
    ENDED_RESERVATION_MODES,
    EVENT_TAGS,
    REMOVE_MISSING_MODES,
    TILDE_ALIAS_MODES,
    USER_GROUPS_MODES,
    EmulatorState,
)
from .wire import Params

#: The CloudShell version the emulator claims; a package whose metadata names a newer one is refused.
DEFAULT_SERVER_VERSION = "2026.1.0"

#: How long a connection may take to send a request's headers (and how long it may sit idle between
#: requests) before the server closes it.
DEFAULT_HEADER_TIMEOUT = 30.0


def _checked_cache(value: Any) -> float:
    cache = number("details_cache_seconds", value)
    if cache < 0:
        raise ValueError("details_cache_seconds must not be negative")
    return cache


def _checked_ttl(value: Any) -> Optional[float]:
    ttl = None if value is None else number("token_ttl", value)
    if ttl is not None and ttl <= 0:
        raise ValueError("token_ttl must be positive, or None for tokens that never expire")
    return ttl


def _checked_flag(name: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value

    return check


def _checked_choice(name: str, choices: Sequence[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return str(value)

    return check


def _checked_positive(name: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        seconds = number(name, value)
        if seconds <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        return seconds

    return check


def _checked_random(value: Any) -> Optional[RandomFaults]:
    return None if value is None else RandomFaults(value)


#: The real-server modes that live on the state, by setting name (docs/emulator.md, "Real-server modes").
_STATE_MODES = {
    "catalog": "catalog_mode",
    "ended_reservations": "ended_reservations",
    "alias_case": "alias_case",
    "add_atomicity": "add_atomicity",
    "remove_missing": "remove_missing",
    "disable_cache": "disable_cache",
    "tilde_aliases": "tilde_aliases",
    "user_groups": "user_groups",
}

#: Every setting: how a value is checked (and converted). Documented in docs/emulator.md.
_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "latency": LatencyModel,
    "details_cache_seconds": _checked_cache,
    "token_ttl": _checked_ttl,
    "random_faults": _checked_random,
    "reword_errors": _checked_flag("reword_errors"),
    "catalog": _checked_choice("catalog", CATALOG_MODES),
    "ended_reservations": _checked_choice("ended_reservations", ENDED_RESERVATION_MODES),
    "alias_case": _checked_choice("alias_case", ALIAS_CASE_MODES),
    "add_atomicity": _checked_choice("add_atomicity", ADD_ATOMICITY_MODES),
    "remove_missing": _checked_choice("remove_missing", REMOVE_MISSING_MODES),
    "disable_cache": _checked_choice("disable_cache", DISABLE_CACHE_MODES),
    "tilde_aliases": _checked_choice("tilde_aliases", TILDE_ALIAS_MODES),
    "user_groups": _checked_choice("user_groups", USER_GROUPS_MODES),
    "header_timeout": _checked_positive("header_timeout"),
}


class Runtime:
    """The emulated server: its state, latency model, fault plan, late requests and package import."""

    def __init__(
        self,
        state: EmulatorState,
        latency: Optional[Mapping[str, Any]] = None,
        server_version: str = DEFAULT_SERVER_VERSION,
    ) -> None:
        self.state = state
        self.faults = FaultPlan()
        self.late = LateCalls()
        self.latency = LatencyModel(latency)
        self.server_version = server_version
        #: Send every error text but the documented one in its alternative wording (docs/emulator.md).
        self.reword_errors = False
        #: Seconds a connection may take to send its request headers, or sit idle between requests.
        self.header_timeout = DEFAULT_HEADER_TIMEOUT

    def configure(self, **settings: Any) -> Dict[str, Any]:
        """Change settings at run time and return all of them; nothing changes if one is wrong.

        ``latency`` (a :class:`LatencyModel` dict, or None for no latency), ``details_cache_seconds``
        (GetReservationDetails snapshot lifetime), ``token_ttl`` (seconds a session token lives, None:
        forever; applies to sessions opened afterwards), ``random_faults`` (a
        :class:`~.faults.RandomFaults` dict, or None for none), ``reword_errors`` (True: every error
        text but the documented one in its alternative wording, see :mod:`.messages`), ``catalog``
        (``"permissive"`` or ``"strict"``), ``ended_reservations`` (``"readable"`` or ``"closed"``),
        ``alias_case`` (``"exact"`` or ``"insensitive"``), ``add_atomicity`` (``"atomic"`` or ``"racy"``),
        ``remove_missing`` (``"refuse_all"``, ``"remove_found"`` or ``"ignore"``), ``disable_cache``
        (``"honored"`` or ``"ignored"``), ``tilde_aliases`` (``"accepted"`` or ``"refused"``), ``user_groups``
        (``"listed"`` or ``"omitted"``), ``header_timeout`` (seconds; applies to connections opened
        afterwards).
        """
        unknown = set(settings) - set(_CHECKS)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; use {', '.join(_CHECKS)}")
        checked = {name: _CHECKS[name](value) for name, value in settings.items()}
        for name, value in checked.items():
            if name == "latency":
                self.latency = value
            elif name == "details_cache_seconds":
                self.state.details_cache_seconds = value
            elif name == "token_ttl":
                self.state.accounts.token_ttl = value
            elif name == "random_faults":
                self.faults.random = value
            elif name in _STATE_MODES:
                setattr(self.state, _STATE_MODES[name], value)
            else:  # reword_errors, header_timeout
                setattr(self, name, value)
        return self.settings()

    def settings(self) -> Dict[str, Any]:
        """The current settings (never credentials)."""
        return {
            "latency": self.latency.to_dict(),
            "details_cache_seconds": self.state.details_cache_seconds,
            "token_ttl": self.state.accounts.token_ttl,
            "random_faults": None if self.faults.random is None else self.faults.random.to_dict(),
            "reword_errors": self.reword_errors,
            **{name: getattr(self.state, attribute) for name, attribute in _STATE_MODES.items()},
            "header_timeout": self.header_timeout,
            "server_version": self.server_version,
        }

    def apply_late(self, fault: Fault, ctx: CallContext, method: str, params: Params) -> None:
        """Make a call take effect ``fault.params["delay"]`` seconds after now (None: on :meth:`land_late`),
        against the state as it is then; the outcome goes into the fault's record."""

        def land() -> None:
            tags = EVENT_TAGS.set({"fault": {"id": fault.id, "kind": fault.kind}, "late": True})
            try:
                execute(ctx, method, params)
                failure: Optional[ApiError] = None
            except ApiError as error:
                failure = error
            except Exception as error:  # an emulator bug: record it rather than kill the late-call worker
                traceback.print_exc()
                self.faults.settle(fault.id, "error", message=repr(error))
                return
            finally:
                EVENT_TAGS.reset(tags)
            result, details = outcome(failure)
            self.faults.settle(fault.id, result, landed_monotonic=time.monotonic(), **details)

        delay = fault.params["delay"]
        self.late.schedule(fault.id, None if delay is None else time.monotonic() + delay, land)

    def record_double_grant(self, ctx: CallContext, params: Params) -> None:
        """Log the add that a ``double_grant`` fault answered with success although its alias was taken:
        nothing is stored, but the event log shows the second holder (with the attributes it sent)."""
        model = params.text("serviceName", "")
        alias = params.text("alias", "") or model
        attributes = dict(params.name_values("attributes", required=False))
        with self.state.lock:
            self.state.instrumentation.record(
                "service_double_granted", params.text("reservationId", ""), alias, model, attributes, ctx.user
            )

    def land_late(self, fault_ids: Optional[Sequence[int]] = None) -> int:
        """Apply pending late calls now (those of ``fault_ids``, default all); return how many landed."""
        if fault_ids is not None and (
            isinstance(fault_ids, (str, bytes))
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in fault_ids)
        ):
            raise ValueError(f"fault_ids must be a list of fault ids (whole numbers), got {fault_ids!r}")
        return self.late.land(fault_ids)

    def stop(self) -> None:
        """Forget late calls that have not landed (the emulator stops; they never will)."""
        for fault_id in self.late.stop():
            self.faults.settle(fault_id, "discarded")

    def import_package(self, zip_bytes: bytes) -> Dict[str, Any]:
        """Validate and register a package zip (the Quali API import); raises PackageError."""
        return register_package(self.state, self.server_version, zip_bytes)
