"""Real cloudshell-shell-core command contexts, filled in the way CloudShell fills them for a driver.

The demo and the tests use them to run drivers outside CloudShell, against the emulator: the same classes
(``ResourceCommandContext`` and friends) with the connectivity, resource and reservation a command gets.
Needs the ``[driver]`` extra (cloudshell-shell-core).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Dict, Iterator, Optional


def connectivity_context(host: str, port: int, token: str, quali_port: int = 9000) -> Any:
    """A ``ConnectivityContext``: where the CloudShell API is (``port`` included) and the admin token."""
    from cloudshell.shell.core.driver_context import ConnectivityContext

    return ConnectivityContext(
        server_address=host,
        cloudshell_api_port=str(port),  # CloudShell passes ports as strings
        quali_api_port=str(quali_port),
        admin_auth_token=token,
        cloudshell_version="2026.1.0",
        cloudshell_api_scheme="http",
    )


def resource_details(
    name: str, model: str = "Demo Device", attributes: Optional[Dict[str, str]] = None
) -> Any:
    """A ``ResourceContextDetails`` for the resource a command runs on."""
    from cloudshell.shell.core.driver_context import ResourceContextDetails

    return ResourceContextDetails(
        id=name,
        name=name,
        fullname=name,
        type="Resource",
        address="127.0.0.1",
        model=model,
        family="Demo Family",
        description="",
        attributes=dict(attributes or {}),
        app_context=None,
        networks_info=None,
        shell_standard="",
        shell_standard_version="",
    )


def reservation_details(reservation_id: str, owner: str = "admin", domain: str = "Global") -> Any:
    """A ``ReservationContextDetails`` for the sandbox a command runs in."""
    from cloudshell.shell.core.driver_context import ReservationContextDetails

    return ReservationContextDetails(
        environment_name="Demo",
        environment_path="Demo",
        domain=domain,
        description="",
        owner_user=owner,
        owner_email="",
        reservation_id=reservation_id,
        saved_sandbox_name="",
        saved_sandbox_id="",
        running_user=owner,
        cloud_info_access_key="",
    )


def resource_command_context(
    host: str, port: int, token: str, reservation_id: str, resource: str, remote: bool = False
) -> Any:
    """The context of a command on ``resource`` in a sandbox.

    A ``ResourceCommandContext``, or with ``remote=True`` a ``ResourceRemoteCommandContext`` (a command
    run on a connected resource: the reservation is under ``remote_reservation``).
    """
    from cloudshell.shell.core.driver_context import ResourceCommandContext, ResourceRemoteCommandContext

    connectivity = connectivity_context(host, port, token)
    if remote:
        return ResourceRemoteCommandContext(
            connectivity, resource_details(resource), reservation_details(reservation_id), []
        )
    return ResourceCommandContext(
        connectivity, resource_details(resource), reservation_details(reservation_id), []
    )


def autoload_context(host: str, port: int, token: str, resource: str) -> Any:
    """The context of ``get_inventory`` (autoload): it belongs to no sandbox."""
    from cloudshell.shell.core.driver_context import AutoLoadCommandContext

    return AutoLoadCommandContext(connectivity_context(host, port, token), resource_details(resource))


def sandbox_environment(
    host: str, port: int, token: str, reservation_id: str, user: str = "admin", domain: str = "Global"
) -> Dict[str, str]:
    """The environment variables CloudShell sets for an orchestration script (what orch-core's ``Sandbox()``
    reads): ``qualiConnectivityContext``, ``reservationContext`` and ``reservationLifecycleContext``."""
    connectivity = {
        "serverAddress": host,
        "tsAPIPort": str(port),
        "adminAuthToken": token,
        "adminUser": user,
        "adminPass": "",  # CloudShell sends the token; the helpers read these keys all the same
        "tsAPIScheme": "http",
    }
    reservation = {
        "id": reservation_id,
        "environmentName": "Demo",
        "environmentPath": "Demo",
        "domain": domain,
        "description": "",
        "ownerUser": user,
        "ownerPass": "",
        "savedSandboxId": "",
        "runningUser": user,
        "permittedUsers": [],
        "parameters": {"globalInputs": [], "resourceRequirements": [], "resourceAdditionalInfo": []},
    }
    lifecycle = {
        "reservationId": reservation_id,
        "savedSandboxName": "",
        "savedSandboxDescription": "",
        "currentUserName": user,
    }
    return {
        "qualiConnectivityContext": json.dumps(connectivity),
        "reservationContext": json.dumps(reservation),
        "reservationLifecycleContext": json.dumps(lifecycle),
    }


@contextlib.contextmanager
def scripts_honour_api_port() -> Iterator[None]:
    """Make ``cloudshell_scripts_helpers.get_api_session`` (used by orch-core's ``Sandbox()``) connect to the
    port in ``qualiConnectivityContext.tsAPIPort``.

    The helper ignores that field and always calls port 8029, which is where a real server listens; the
    emulator runs on a free port, so scripts run against it need this. The session is still the real
    ``CloudShellAPISession``.
    """
    from cloudshell.helpers.scripts import cloudshell_scripts_helpers as helpers

    original = helpers.CloudShellAPISession

    def session_on_context_port(*args: Any, **kwargs: Any) -> Any:
        port = helpers.get_connectivity_context_details_dict().get("tsAPIPort")
        if port:
            kwargs.setdefault("port", int(port))
        return original(*args, **kwargs)

    helpers.CloudShellAPISession = session_on_context_port
    try:
        yield
    finally:
        helpers.CloudShellAPISession = original
