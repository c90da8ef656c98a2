"""What both HTTP front ends and the control endpoint share: the state and the realism knobs."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .faults import FaultPlan, LatencyModel, number
from .state import EmulatorState

#: The CloudShell version the emulator claims; a package whose metadata names a newer one is refused.
DEFAULT_SERVER_VERSION = "2026.1.0"


class Runtime:
    """The emulated server: its state, latency model, fault plan and package import."""

    def __init__(
        self,
        state: EmulatorState,
        latency: Optional[Mapping[str, Any]] = None,
        server_version: str = DEFAULT_SERVER_VERSION,
    ) -> None:
        self.state = state
        self.faults = FaultPlan()
        self.latency = LatencyModel(latency)
        self.server_version = server_version

    def configure(self, **settings: Any) -> Dict[str, Any]:
        """Change settings at run time and return all of them.

        ``latency`` (a :class:`LatencyModel` dict, or None for no latency), ``details_cache_seconds``
        (GetReservationDetails snapshot lifetime), ``token_ttl`` (seconds a session token lives, None:
        forever; applies to sessions opened afterwards).
        """
        unknown = set(settings) - {"latency", "details_cache_seconds", "token_ttl"}
        if unknown:
            raise ValueError(
                f"unknown settings {sorted(unknown)}; use latency, details_cache_seconds, token_ttl"
            )
        # Validate everything before changing anything.
        latency = LatencyModel(settings["latency"]) if "latency" in settings else self.latency
        cache = self.state.details_cache_seconds
        if "details_cache_seconds" in settings:
            cache = number("details_cache_seconds", settings["details_cache_seconds"])
            if cache < 0:
                raise ValueError("details_cache_seconds must not be negative")
        ttl = self.state.token_ttl
        if "token_ttl" in settings:
            ttl = None if settings["token_ttl"] is None else number("token_ttl", settings["token_ttl"])
            if ttl is not None and ttl <= 0:
                raise ValueError("token_ttl must be positive, or None for tokens that never expire")
        self.latency = latency
        self.state.details_cache_seconds = cache
        self.state.token_ttl = ttl
        return self.settings()

    def settings(self) -> Dict[str, Any]:
        """The current settings (never credentials)."""
        return {
            "latency": self.latency.to_dict(),
            "details_cache_seconds": self.state.details_cache_seconds,
            "token_ttl": self.state.token_ttl,
            "server_version": self.server_version,
        }

    def import_package(self, zip_bytes: bytes) -> Dict[str, Any]:
        """Validate and register a package zip (the Quali API import); raises PackageError."""
        from .quali import register_package

        return register_package(self, zip_bytes)
