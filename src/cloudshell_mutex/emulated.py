"""Run your own driver commands and orchestration scripts against the emulator (``make emulator``).

:class:`EmulatedSite` stands for a CloudShell site that the emulator plays: it creates sandboxes, and
builds what CloudShell hands your code there: a driver command's ``context`` (shell-core's real
``ResourceCommandContext``, with an admin token) and a script's environment (what orch-core's
``Sandbox()`` reads)::

    site = EmulatedSite()                              # make emulator's defaults: 127.0.0.1:8029, admin/admin
    sandbox_id = site.create_sandbox("Try my driver")
    MyDriver().my_command(site.driver_context(sandbox_id, "Router A"))
    with site.script_environment(sandbox_id):
        sandbox = Sandbox()                            # orch-core, as in a setup script

Needs the ``[driver]`` extra (cloudshell-shell-core). It talks to the emulator over HTTP only: the emulator
runs in its own process (``make emulator``), or in yours (``Emulator(...).start()``, then pass its ports).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

from .demo.contexts import (
    autoload_context,
    connectivity_context,
    reservation_details,
    resource_details,
    sandbox_environment,
    scripts_honour_api_port,
)

__all__ = ["DEFAULT_HOST", "DEFAULT_PASSWORD", "DEFAULT_PORT", "EmulatedSite", "autoload_context"]

#: Where ``make emulator`` listens, and its admin (``cloudshell-mutex emulator``'s defaults).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8029
DEFAULT_QUALI_PORT = 9000
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"


class EmulatedSite:
    """A CloudShell site played by the emulator at ``host:port`` (the Automation API), logged on as
    ``user``/``password`` (a system admin, as CloudShell's own token is). Defaults: ``make emulator``'s."""

    def __init__(
        self,
        host: Optional[str] = None,
        port: Optional[int] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        domain: str = "Global",
        quali_port: Optional[int] = None,
    ) -> None:
        self.host = host or DEFAULT_HOST
        self.port = int(port or DEFAULT_PORT)
        self.quali_port = int(quali_port or DEFAULT_QUALI_PORT)
        self.user = user or DEFAULT_USER
        self.password = password if password is not None else DEFAULT_PASSWORD
        self.domain = domain

    def __repr__(self) -> str:  # never the password
        return (
            f"EmulatedSite(host={self.host!r}, port={self.port}, user={self.user!r}, domain={self.domain!r})"
        )

    def session(self, domain: Optional[str] = None) -> Any:
        """A real ``CloudShellAPISession``, logged on (in ``domain``, default the site's)."""
        from cloudshell.api.cloudshell_api import CloudShellAPISession

        return CloudShellAPISession(
            self.host, self.user, self.password, domain or self.domain, port=self.port
        )

    def create_sandbox(self, name: str = "Try it", minutes: int = 60, domain: Optional[str] = None) -> str:
        """Create a sandbox that starts now (``CreateImmediateReservation``) and return its id."""
        return self.session(domain).CreateImmediateReservation(name, self.user, minutes).Reservation.Id

    def token(self, user: Optional[str] = None) -> str:
        """An admin auth token, as CloudShell puts in a context (``admin_auth_token``): from the emulator's
        control endpoint, so the emulator must run on this machine."""
        from .emulator.control import EmulatorControl

        return str(EmulatorControl(f"http://{self.host}:{self.port}").issue_token(user or self.user))

    def driver_context(
        self,
        sandbox_id: str,
        resource: str = "Router A",
        *,
        running_user: Optional[str] = None,
        domain: Optional[str] = None,
        remote: bool = False,
    ) -> Any:
        """The ``context`` CloudShell passes a command on ``resource`` in the sandbox: a shell-core
        ``ResourceCommandContext`` (``remote=True``: a ``ResourceRemoteCommandContext``) with the site's
        address and port, a fresh admin token, and ``running_user`` (default: the site's user) as the user who
        runs the command."""
        from cloudshell.shell.core.driver_context import ResourceCommandContext, ResourceRemoteCommandContext

        connectivity = connectivity_context(self.host, self.port, self.token(), self.quali_port)
        reservation = reservation_details(sandbox_id, owner=self.user, domain=domain or self.domain)
        reservation.running_user = self.user if running_user is None else running_user
        kind = ResourceRemoteCommandContext if remote else ResourceCommandContext
        return kind(connectivity, resource_details(resource), reservation, [])

    @contextlib.contextmanager
    def script_environment(self, sandbox_id: str, domain: Optional[str] = None) -> Iterator[None]:
        """Within the block, the environment CloudShell gives an orchestration script in the sandbox
        (``qualiConnectivityContext``, ``reservationContext``, ``reservationLifecycleContext``), so that
        orch-core's ``Sandbox()`` works; the scripts helper connects to the site's port. Restored after."""
        values = sandbox_environment(
            self.host, self.port, self.token(), sandbox_id, user=self.user, domain=domain or self.domain
        )
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            with scripts_honour_api_port():
                yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
