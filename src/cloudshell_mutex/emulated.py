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
    print("\n".join(site.output(sandbox_id)))          # the sandbox output, as the portal shows it
    print(site.mutex_service_command(sandbox_id, "Lock Status"))  # the Mutex Service driver's commands

Needs the ``[driver]`` extra (cloudshell-shell-core). It talks to the emulator over HTTP only: the emulator
runs in its own process (``make emulator``), or in yours (``Emulator(...).start()``, then pass its ports).
"""

from __future__ import annotations

import contextlib
import html
import io
import logging
import os
import re
import sys
import types
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple, Union
from xml.etree import ElementTree

from .demo.contexts import (
    autoload_context,
    connectivity_context,
    reservation_details,
    resource_details,
    sandbox_environment,
    scripts_honour_api_port,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PASSWORD",
    "DEFAULT_PORT",
    "EmulatedSite",
    "autoload_context",
    "print_lock_log",
]

#: Where ``make emulator`` listens, and its admin (``cloudshell-mutex emulator``'s defaults).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8029
DEFAULT_QUALI_PORT = 9000
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"
#: The package ``make emulator`` builds and imports (relative to the checkout it runs in).
DEFAULT_PACKAGE = Path("dist") / "Mutex_Package.zip"
#: The Mutex Service driver in the package, and its model.
MUTEX_SERVICE_DRIVER = "Mutex Service Driver"
MUTEX_SERVICE_MODEL = "Mutex Service"


def print_lock_log(level: int = logging.INFO, stream: Optional[TextIO] = None) -> logging.Handler:
    """For a local run: print the lock's own log lines (``cloudshell-mutex: acquired ...``, waits, breaks) to
    ``stream`` (stderr), and nothing else. A driver command logs through shell-core's per-command logger,
    whose first lines list every installed package; those stay in its files under ``LOG_PATH``. Returns the
    handler (``logging.getLogger().removeHandler(handler)`` stops it)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    handler.addFilter(lambda record: record.getMessage().startswith("cloudshell-mutex"))
    logging.getLogger().addHandler(handler)
    lock_logger = logging.getLogger("cloudshell_mutex")  # a lock given no logger logs here
    if lock_logger.getEffectiveLevel() > level:
        lock_logger.setLevel(level)
    return handler


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

    def output(self, sandbox_id: str) -> List[str]:
        """The sandbox's output pane as people read it in the portal: one string per line written with
        ``WriteMessageToReservationOutput`` (the lock's progress lines, breaks, force releases), without
        markup. The API has no call that reads it back; the emulator's control endpoint does."""
        from .emulator.control import EmulatorControl

        lines = EmulatorControl(f"http://{self.host}:{self.port}").output(sandbox_id)
        return [html.unescape(re.sub(r"<[^>]*>", "", line)) for line in lines]

    def mutex_service_command(
        self,
        sandbox_id: str,
        command: str,
        *,
        alias: str = "MUTEX",
        running_user: Optional[str] = None,
        package: Union[str, Path, None] = None,
        **parameters: str,
    ) -> str:
        """Run a command of the Mutex Service driver (``"Lock Status"``, ``"Force Release"`` with
        ``reason=``) on the lock service ``alias`` of the sandbox, as CloudShell runs it when someone clicks
        it there: its ``driver.py`` taken from ``package`` (default ``dist/Mutex_Package.zip``, the one
        ``make emulator`` imports), run with this installed library, with the context of a command on that
        service (``running_user``: who clicks; default the site's user). Returns the command's answer; a
        command that fails raises :class:`~cloudshell_mutex.MutexError` with the text the portal shows.

        The driver's zip is not put on ``sys.path``: it bundles part of this library, which would hide the
        installed one."""
        driver_class, commands = _mutex_service_driver(Path(package) if package else DEFAULT_PACKAGE)
        method = commands.get(command, command if command in commands.values() else None)
        if method is None:
            known = ", ".join(sorted(commands))
            raise ValueError(f"the Mutex Service driver has no command {command!r}; its commands: {known}")
        context = self.driver_context(sandbox_id, alias, running_user=running_user)
        context.resource.model = MUTEX_SERVICE_MODEL
        context.resource.family = "Mutex Service Family"
        driver = driver_class()
        driver.initialize(context)
        try:
            return str(getattr(driver, method)(context, **parameters))
        finally:
            driver.cleanup()

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


def _mutex_service_driver(package: Path) -> Tuple[type, Dict[str, str]]:
    """The Mutex Service driver's class, loaded from the package zip's driver zip (its ``driver.py`` only:
    the installed library serves its imports), and its commands (display name -> method name)."""
    try:
        data = package.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{package}: not found; build it with `make package` (or `cloudshell-mutex package`), or pass "
            "package= the Mutex_Package.zip the emulator imported"
        ) from None
    inner = f"Resource Drivers - Python/{MUTEX_SERVICE_DRIVER}.zip"
    with (
        zipfile.ZipFile(io.BytesIO(data)) as archive,
        zipfile.ZipFile(io.BytesIO(archive.read(inner))) as zip_,
    ):
        metadata = ElementTree.fromstring(zip_.read("drivermetadata.xml"))
        source = zip_.read("driver.py").decode("utf-8")
    commands = {
        element.get("DisplayName") or element.get("Name", ""): element.get("Name", "")
        for element in metadata.iter("Command")
    }
    module = types.ModuleType("mutex_service_driver")
    module.__file__ = f"{package}!{inner}!driver.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # the package's own driver code
    return module.MutexServiceDriver, commands
