"""What both HTTP front ends and the control endpoint share: the state and the realism knobs."""

from __future__ import annotations

import time
import traceback
from typing import Any, Dict, Mapping, Optional, Sequence

from .faults import Fault, FaultPlan, LateCalls, LatencyModel, number
from .messages import ApiError
from .methods import CallContext, execute, outcome
from .quali import register_package
from .state import EVENT_TAGS, EmulatorState
from .wire import Params

#: The CloudShell version the emulator claims; a package whose metadata names a newer one is refused.
DEFAULT_SERVER_VERSION = "2026.1.0"

_SETTINGS = ("latency", "details_cache_seconds", "token_ttl", "random_faults", "reword_errors")


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

    def configure(self, **settings: Any) -> Dict[str, Any]:
        """Change settings at run time and return all of them.

        ``latency`` (a :class:`LatencyModel` dict, or None for no latency), ``details_cache_seconds``
        (GetReservationDetails snapshot lifetime), ``token_ttl`` (seconds a session token lives, None:
        forever; applies to sessions opened afterwards), ``random_faults`` (a
        :class:`~.faults.RandomFaults` dict, or None for none), ``reword_errors`` (True: every error
        text but the documented one in its alternative wording, see :mod:`.messages`).
        """
        unknown = set(settings) - set(_SETTINGS)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; use {', '.join(_SETTINGS)}")
        # Validate everything before changing anything.
        latency = LatencyModel(settings["latency"]) if "latency" in settings else self.latency
        cache = self.state.details_cache_seconds
        if "details_cache_seconds" in settings:
            cache = number("details_cache_seconds", settings["details_cache_seconds"])
            if cache < 0:
                raise ValueError("details_cache_seconds must not be negative")
        ttl = self.state.accounts.token_ttl
        if "token_ttl" in settings:
            ttl = None if settings["token_ttl"] is None else number("token_ttl", settings["token_ttl"])
            if ttl is not None and ttl <= 0:
                raise ValueError("token_ttl must be positive, or None for tokens that never expire")
        random_faults = self.faults.random
        if "random_faults" in settings:
            plan = FaultPlan()
            plan.set_random(settings["random_faults"])
            random_faults = plan.random
        reword = self.reword_errors
        if "reword_errors" in settings:
            if not isinstance(settings["reword_errors"], bool):
                raise ValueError(f"reword_errors must be true or false, got {settings['reword_errors']!r}")
            reword = settings["reword_errors"]
        self.latency = latency
        self.reword_errors = reword
        self.state.details_cache_seconds = cache
        self.state.accounts.token_ttl = ttl
        self.faults.random = random_faults
        return self.settings()

    def settings(self) -> Dict[str, Any]:
        """The current settings (never credentials)."""
        return {
            "latency": self.latency.to_dict(),
            "details_cache_seconds": self.state.details_cache_seconds,
            "token_ttl": self.state.accounts.token_ttl,
            "random_faults": None if self.faults.random is None else self.faults.random.to_dict(),
            "reword_errors": self.reword_errors,
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
