"""The control endpoint (``/_emulator/<op>`` on the API port, loopback clients only) and its client.

Tests and exclusion checkers use it to change latency and faults at run time and to read what the
server saw: the ordered log of committed service changes, reservation output and call counts.
:class:`EmulatorControl` is a plain HTTP JSON client, so it can be pickled into other processes.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

from .runtime import Runtime
from .state import utcnow


class EmulatorControlError(RuntimeError):
    """The control endpoint refused a request; the message says why."""


def _reservation_snapshot(runtime: Runtime, reservation_id: str) -> Dict[str, Any]:
    state = runtime.state
    with state.lock:
        reservation = state.reservations.get(reservation_id)
        if reservation is None:
            raise KeyError(f"reservation {reservation_id!r} does not exist")
        return {
            "id": reservation.id,
            "name": reservation.name,
            "owner": reservation.owner,
            "status": reservation.status(utcnow()),
            "services": [
                {"alias": s.alias, "model": s.model, "attributes": dict(s.attributes)}
                for s in reservation.services.values()
            ],
            "resources": list(reservation.resources),
            "connectors": [
                {"source": c.source, "target": c.target, "direction": c.direction, "alias": c.alias}
                for c in reservation.connectors
            ],
        }


def _import(runtime: Runtime, p: Dict[str, Any]) -> Dict[str, Any]:
    try:
        data = base64.b64decode(p["zip_base64"], validate=True)
    except (TypeError, binascii.Error):
        raise ValueError("zip_base64 must be the package zip in base64") from None
    return runtime.import_package(data)


class _Payload(dict):
    """A request's JSON object; a missing field is a ValueError that names it."""

    def __missing__(self, key: str) -> Any:
        raise ValueError(f"the field {key!r} is missing")


_OPS: Dict[str, Callable[[Runtime, Dict[str, Any]], Any]] = {
    "settings": lambda rt, p: rt.settings(),
    "configure": lambda rt, p: rt.configure(**p),
    "inject_fault": lambda rt, p: rt.faults.inject(
        p["method"], p["kind"], p.get("count", 1), p.get("params")
    ),
    "clear_faults": lambda rt, p: rt.faults.clear(),
    "faults": lambda rt, p: rt.faults.pending(),
    "faults_injected": lambda rt, p: rt.faults.injected(),
    "land_late": lambda rt, p: rt.land_late(p.get("fault_ids")),
    "events": lambda rt, p: rt.state.instrumentation.events(p.get("reservation_id")),
    "output": lambda rt, p: rt.state.output(p["reservation_id"]),
    "call_counts": lambda rt, p: rt.state.instrumentation.call_counts(),
    "reset_counts": lambda rt, p: rt.state.instrumentation.reset_counts(),
    "overhead": lambda rt, p: rt.state.instrumentation.overhead(),
    "revoke_sessions": lambda rt, p: rt.state.accounts.revoke_sessions(),
    "issue_token": lambda rt, p: rt.state.accounts.issue_auth_token(p.get("user")),
    "add_user": lambda rt, p: rt.state.accounts.add_user(
        p["name"],
        p["password"],
        bool(p.get("admin", False)),
        p.get("domain", "Global"),
        p.get("role", "Regular"),
    ),
    "add_domain": lambda rt, p: rt.state.accounts.add_domain(p["name"]),
    "import_package": _import,
    "reservation": lambda rt, p: _reservation_snapshot(rt, p["reservation_id"]),
}


def handle_control(runtime: Runtime, op: str, payload: Any) -> Tuple[int, Any]:
    """Run one control operation; return (HTTP status, JSON-able result)."""
    handler = _OPS.get(op)
    if handler is None:
        return 404, {"error": f"unknown control operation {op!r}; known: {sorted(_OPS)}"}
    if not isinstance(payload, dict):
        return 400, {"error": "the body must be a JSON object"}
    try:
        return 200, {"result": handler(runtime, _Payload(payload))}
    except KeyError as error:
        return 404 if op in ("output", "reservation") else 400, {"error": str(error.args[0])}
    except (ValueError, TypeError) as error:
        return 400, {"error": str(error)}


class EmulatorControl:
    """Client of a running emulator's control endpoint, e.g. ``EmulatorControl("http://127.0.0.1:8029")``."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"EmulatorControl({self.base_url!r})"

    def _call(self, op: str, payload: Optional[Dict[str, Any]] = None) -> Any:
        request = urllib.request.Request(
            f"{self.base_url}/_emulator/{op}",
            data=json.dumps(payload or {}).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))["result"]
        except urllib.error.HTTPError as error:
            try:
                message = json.loads(error.read().decode("utf-8")).get("error", error.reason)
            except ValueError:
                message = error.reason
            raise EmulatorControlError(f"control {op}: {message}") from None

    def settings(self) -> Dict[str, Any]:
        """The current settings: latency, details_cache_seconds, token_ttl, random_faults, reword_errors,
        the real-server modes, header_timeout, server_version."""
        return self._call("settings")

    def configure(self, **settings: Any) -> Dict[str, Any]:
        """Change settings, e.g. ``latency={"distribution": "uniform", "low": 0.005, "high": 0.02,
        "commit_fraction": 0.5}``, ``details_cache_seconds=5``, ``token_ttl=None``,
        ``random_faults={"seed": 7, "rates": {"spike": 0.05}}``, and the real-server modes
        ``reword_errors=True``, ``catalog="strict"``, ``ended_reservations="closed"``, ``header_timeout=30``,
        ``alias_case="insensitive"``, ``add_atomicity="racy"``, ``remove_missing="remove_found"``,
        ``disable_cache="ignored"``, ``tilde_aliases="refused"``, ``user_groups="omitted"``
        (docs/emulator.md); nothing changes if one is wrong. Returns all settings."""
        return self._call("configure", settings)

    def inject_fault(self, method: str, kind: str, count: int = 1, **params: Any) -> None:
        """Queue ``count`` faults of ``kind`` with ``params`` for the next calls of ``method`` (``"*"``: any).

        ``error_before_commit``: HTTP 500, nothing changes. ``reset_before_commit``: the connection is
        reset without a response, nothing changes. ``drop_after_commit``: the call takes effect, then the
        connection closes without a response. ``apply_late(delay=1.0, delay_max=None, reset_after=0.0,
        reply="reset"|"hang", hang_limit=300)``: no answer; the request takes effect ``delay`` seconds
        (with ``delay_max``: a delay drawn from that range) after it arrived (None: at :meth:`land_late`).
        ``spike(seconds=2.0)``: extra latency before the commit. See docs/emulator.md for all kinds.
        """
        self._call("inject_fault", {"method": method, "kind": kind, "count": count, "params": params})

    def clear_faults(self) -> None:
        """Drop every queued fault and switch the random fault mode off (records and late calls stay)."""
        self._call("clear_faults")

    def faults(self) -> Dict[str, List[str]]:
        """Queued fault kinds per method."""
        return self._call("faults")

    def faults_injected(self) -> List[Dict[str, Any]]:
        """Every fault handed to a call, oldest first: ``{"id", "method", "kind", "params", "source"
        ("queued"/"random"), "reservation_id", "user", "time", "monotonic", "outcome"}``; ``outcome`` is
        ``"pending"`` until the call took effect (``"applied"``), failed (``"failed"``, with ``code`` and
        ``message``) or was discarded at stop; late calls add ``landed_monotonic``."""
        return self._call("faults_injected")

    def land_late(self, fault_ids: Optional[List[int]] = None) -> int:
        """Apply pending ``apply_late`` calls now (those with these fault ids, default all), in arrival
        order; they have landed when this returns. Returns how many landed."""
        return self._call("land_late", {"fault_ids": fault_ids} if fault_ids is not None else {})

    def events(self, reservation_id: Optional[str] = None) -> List[Dict[str, Any]]:
        """The ordered log of committed service changes (optionally of one reservation)."""
        return self._call("events", {"reservation_id": reservation_id} if reservation_id else {})

    def output(self, reservation_id: str) -> List[str]:
        """Messages written with WriteMessageToReservationOutput."""
        return self._call("output", {"reservation_id": reservation_id})

    def call_counts(self) -> Dict[str, int]:
        """API calls received per method since start or :meth:`reset_counts`."""
        return self._call("call_counts")

    def reset_counts(self) -> None:
        """Count calls from zero."""
        self._call("reset_counts")

    def overhead(self) -> Dict[str, float]:
        """The emulator's own time per API call in ms (calls, mean_ms, p50_ms, p99_ms, max_ms), injected
        latency excluded, since start or :meth:`reset_counts`."""
        return self._call("overhead")

    def revoke_sessions(self) -> int:
        """End every logged-on session: the next call of each client gets HTTP 401 and logs on again."""
        return self._call("revoke_sessions")

    def issue_token(self, user: Optional[str] = None) -> str:
        """A token for ``SecureLogon`` / ``CloudShellAPISession(token_id=...)`` (default: the admin)."""
        return self._call("issue_token", {"user": user} if user else {})

    def add_user(
        self, name: str, password: str, admin: bool = False, domain: str = "Global", role: str = "Regular"
    ) -> None:
        """Create or update a user who can log on: a system admin (``admin``), or a member of the group
        ``"<domain> <role>"`` (``role``: ``Regular``, ``DomainAdmin`` or ``External``; made if missing)."""
        payload = {"name": name, "password": password, "admin": admin, "domain": domain, "role": role}
        self._call("add_user", payload)

    def add_domain(self, name: str) -> None:
        """Create a domain (sandboxes are created in the domain their creator's session logged on to)."""
        self._call("add_domain", {"name": name})

    def import_package(self, zip_bytes: bytes) -> Dict[str, Any]:
        """Import a package zip (same validation as the Quali API); raises EmulatorControlError."""
        return self._call("import_package", {"zip_base64": base64.b64encode(zip_bytes).decode("ascii")})

    def reservation(self, reservation_id: str) -> Dict[str, Any]:
        """The live (uncached) state of a reservation, ended ones included."""
        return self._call("reservation", {"reservation_id": reservation_id})
