"""Fixtures of the contract suite: one ``target`` for the emulator and for a real server.

* No ``CLOUDSHELL_TEST_HOST``: a fresh emulator per test (``cloudshell_emulator_factory``), with the
  Mutex_Package.zip built from this tree imported through ``PackagingRestApiClient``.
* ``CLOUDSHELL_TEST_HOST`` set: that server. The package is imported only with
  ``CLOUDSHELL_TEST_IMPORT_PACKAGE=1``; otherwise the suite checks that the model works and says how to
  install it if not.

Each test gets its own sandbox (``reservation``); at teardown every service still in it is removed,
the suite checks that none is left, and the sandbox is ended.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import pytest
from cloudshell.rest.api import PackagingRestApiClient
from contract_support import (
    ALIAS_PREFIX,
    Target,
    TargetError,
    build_package,
    check_reachable,
    live_target,
    new_reservation,
)

from cloudshell_mutex import protocol
from cloudshell_mutex.probe import checks

INSTALL_HELP = (
    "Import Mutex_Package.zip as a CloudShell admin: `make package` then `cloudshell-mutex install "
    "--host HOST --package dist/Mutex_Package.zip` (or rerun with CLOUDSHELL_TEST_IMPORT_PACKAGE=1), "
    "or import it in CloudShell Portal (Manage > Import Package)."
)


def stop(message: str) -> None:
    """End the whole run at once: a misconfigured or unreachable server fails every test the same way."""
    pytest.exit(f"cloudshell-mutex contract suite: {message}", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
def package_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mutex_Package.zip built from this tree, once per run."""
    try:
        return build_package(tmp_path_factory.mktemp("contract-package"))
    except TargetError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


def import_package(target: Target, package: Path) -> None:
    """Import ``package`` through the Quali API with the PyPI client; TargetError says what failed."""
    check_reachable(
        target.host, target.quali_port, "Quali API", "CLOUDSHELL_TEST_HOST and CLOUDSHELL_TEST_QUALI_PORT"
    )
    try:
        client = PackagingRestApiClient.login(
            target.host, target.user, target.password, target.domain, port=target.quali_port
        )
        client.import_package(str(package))
    except Exception as error:
        raise TargetError(
            f"importing {package.name} through the Quali API at {target.host}:{target.quali_port} as "
            f"{target.user}@{target.domain} failed ({type(error).__name__}: {error}). The import needs a "
            "CloudShell system admin: check CLOUDSHELL_TEST_USER, CLOUDSHELL_TEST_PASSWORD, "
            "CLOUDSHELL_TEST_DOMAIN and CLOUDSHELL_TEST_QUALI_PORT"
        ) from None


def open_session(target: Target) -> Any:
    """A session on ``target``; TargetError says which variables to check when the logon fails."""
    try:
        return target.session()
    except Exception as error:
        raise TargetError(
            f"logon to {target.where()} failed ({type(error).__name__}: {error}). Check "
            "CLOUDSHELL_TEST_USER, CLOUDSHELL_TEST_PASSWORD and CLOUDSHELL_TEST_DOMAIN"
        ) from None


def check_model(target: Target) -> None:
    """Raise TargetError with install instructions unless ``Mutex Service`` can be added with ``Mutex Owner``.

    Asks the add itself, not the catalog: GetServices may hide admin-only families without a category.
    The probe's sandbox is cleaned up and ended whatever happens.
    """
    api = open_session(target)
    reservation_id = new_reservation(api, target, "cloudshell-mutex contract: model check", minutes=10)
    try:
        model = checks.check_model(api, reservation_id, f"{ALIAS_PREFIX}probe", "contract probe")
    finally:
        api.EndReservation(reservation_id)
    if not model.has_owner:
        refused = "; ".join(str(answer) for answer in model.refusals)
        raise TargetError(
            f"the server at {target.where()} cannot add {protocol.SERVICE_MODEL!r} with "
            f"{protocol.ATTR_OWNER!r} ({refused}). {INSTALL_HELP}"
        )


def prepare_live(request: pytest.FixtureRequest) -> Optional[Target]:
    """The real server from the environment: reachable, logged on, package imported if asked, model usable."""
    target = live_target()
    if target is None:
        return None
    check_reachable(
        target.host,
        target.api_port,
        "CloudShell Automation API",
        "CLOUDSHELL_TEST_HOST and CLOUDSHELL_TEST_API_PORT",
        timeout=min(target.timeout, 10.0),
    )
    if os.environ.get("CLOUDSHELL_TEST_IMPORT_PACKAGE", "").strip() == "1":
        import_package(target, request.getfixturevalue("package_zip"))
    check_model(target)
    return target


@pytest.fixture(scope="session")
def live_ready(request: pytest.FixtureRequest) -> Optional[Target]:
    """The live target, prepared once per run (None: use the emulator). Any problem ends the run at once."""
    try:
        return prepare_live(request)
    except TargetError as error:
        message = str(error)
    stop(message)
    return None  # not reached: stop() raises


@pytest.fixture
def target(live_ready: Optional[Target], request: pytest.FixtureRequest) -> Target:
    """The server this test talks to: the live one, or a fresh emulator with the package imported."""
    if live_ready is not None:
        return live_ready
    emulator = request.getfixturevalue("cloudshell_emulator_factory")()
    emulator.add_domain("Contract Domain")  # what a site's admin sets up; the tests only log on to it
    emulated = Target(
        host=emulator.url_host,
        api_port=emulator.port,
        quali_port=emulator.quali_port,
        user=emulator.admin_user,
        password=emulator.admin_password,
        domain=emulator.admin_domain,
        live=False,
        timeout=30.0,
        other_domain="Contract Domain",
    )
    try:
        import_package(emulated, request.getfixturevalue("package_zip"))
        check_model(emulated)
    except TargetError as error:
        message = str(error)
    else:
        return emulated
    pytest.fail(message, pytrace=False)


class Sandbox:
    """One test's sandbox: its id, a session, and a fresh read of its services."""

    def __init__(self, target: Target, api: Any, reservation_id: str) -> None:
        self.target = target
        self.api = api
        self.id = reservation_id
        self.ended = False

    def services(self) -> Dict[str, Any]:
        """Services by alias (fresh read)."""
        return checks.services(self.api, self.id)

    def end(self) -> None:
        """End the sandbox now (teardown then skips it)."""
        self.api.EndReservation(self.id)
        self.ended = True


@pytest.fixture
def sandbox(target: Target, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A new empty sandbox; at teardown every service in it is removed, checked gone, and it is ended."""
    api = target.session()
    name = f"cloudshell-mutex contract {request.node.name}"[:100]
    box = Sandbox(target, api, new_reservation(api, target, name))
    yield box
    if box.ended:
        return
    try:
        left = list(box.services())
        if left:
            api.RemoveServicesFromReservation(box.id, left)
        remaining = list(box.services())
    finally:
        api.EndReservation(box.id)
    assert not remaining, f"teardown could not remove {remaining} from sandbox {box.id}"


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Make an alias no other run can have chosen (live servers are shared)."""
    run = uuid.uuid4().hex[:8]
    return lambda name: f"{ALIAS_PREFIX}{name}-{run}"
