"""``cloudshell-mutex install`` against the emulator's Quali API, then the real Automation API client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from cloudshell.rest.api import PackagingRestApiClient

from cloudshell_mutex import cli, protocol

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Emu-S3cret-pw"
WRONG = "Wrong-S3cret-pw"
LEASE_DEFAULTS = {
    protocol.ATTR_LABEL: "",
    protocol.ATTR_LEASE_SECONDS: "0",
    protocol.ATTR_HEARTBEAT: "",
    protocol.ATTR_GENERATION: "0",
}


@pytest.fixture(scope="module")
def built_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built from this tree by `cloudshell-mutex package`, as `make package` does."""
    output = tmp_path_factory.mktemp("dist") / "Mutex_Package.zip"
    assert cli.main(["package", "--root", str(ROOT), "--output", str(output)]) == 0
    return output


@pytest.fixture
def emulator(cloudshell_emulator_factory: Callable):
    return cloudshell_emulator_factory(admin_password=SECRET)


def install(emu, package: Path, capsys: pytest.CaptureFixture, password: str = SECRET) -> Tuple[int, str]:
    argv = ["install", "--host", emu.host, "--port", str(emu.quali_port), "--username", emu.admin_user]
    code = cli.main([*argv, "--password", password, "--package", str(package)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def mutex_attributes(session, reservation_id: str) -> Dict[str, str]:
    details = session.GetReservationDetails(reservation_id, True).ReservationDescription
    (service,) = [s for s in details.Services if s.Alias == protocol.DEFAULT_ALIAS]
    assert service.ServiceName == protocol.SERVICE_MODEL
    return {attribute.Name: attribute.Value for attribute in service.Attributes}


def acquire(session, reservation_id: str, attributes: List[AttributeNameValue]) -> None:
    session.AddServiceToReservation(
        reservation_id, protocol.SERVICE_MODEL, protocol.DEFAULT_ALIAS, attributes
    )


def test_install_then_the_mutex_protocol_works(emulator, built_package: Path, capsys) -> None:
    session = emulator.session()
    reservation_id = emulator.create_reservation()
    owner = [AttributeNameValue(protocol.ATTR_OWNER, "x")]
    with pytest.raises(CloudShellAPIError, match="was not found in the catalog"):
        acquire(session, reservation_id, owner)

    code, output = install(emulator, built_package, capsys)
    assert code == 0, output
    assert f"imported {built_package} into {emulator.host}:{emulator.quali_port}" in output
    assert SECRET not in output

    acquire(session, reservation_id, owner)
    assert mutex_attributes(session, reservation_id) == {protocol.ATTR_OWNER: "x", **LEASE_DEFAULTS}


def test_settings_from_environment_and_cloudshell_config(
    emulator, built_package: Path, tmp_path: Path
) -> None:
    """The console entry in a subprocess: host/port from the environment, credentials from the yml."""
    (tmp_path / "cloudshell_config.yml").write_text(
        f"install:\n  host: 192.0.2.1\n  port: 1\n  username: {emulator.admin_user}\n"
        f"  password: {SECRET}\n  domain: {emulator.admin_domain}\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSHELL_")}
    environment.update(CLOUDSHELL_HOST=emulator.host, CLOUDSHELL_PORT=str(emulator.quali_port))
    result = subprocess.run(
        [sys.executable, "-m", "cloudshell_mutex.cli", "install", "--package", str(built_package)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    session = emulator.session()
    reservation_id = emulator.create_reservation()
    acquire(session, reservation_id, [AttributeNameValue(protocol.ATTR_OWNER, "y")])
    assert mutex_attributes(session, reservation_id)[protocol.ATTR_OWNER] == "y"


def test_upgrade_over_the_original_package(emulator, built_package: Path, original_package_zip: Path, capsys):
    session = emulator.session()
    code, output = install(emulator, original_package_zip, capsys)
    assert code == 0, output
    before = emulator.create_reservation()
    label = [AttributeNameValue(protocol.ATTR_OWNER, "old"), AttributeNameValue(protocol.ATTR_LABEL, "l")]
    with pytest.raises(CloudShellAPIError, match="is not defined on service model"):
        acquire(session, before, label)
    acquire(session, before, label[:1])
    assert mutex_attributes(session, before) == {protocol.ATTR_OWNER: "old"}

    code, output = install(emulator, built_package, capsys)
    assert code == 0, output
    after = emulator.create_reservation()
    acquire(session, after, label)
    assert mutex_attributes(session, after) == {
        **LEASE_DEFAULTS,
        protocol.ATTR_OWNER: "old",
        protocol.ATTR_LABEL: "l",
    }
    # Old code, which sets only Mutex Owner, still excludes new code on the same alias.
    with pytest.raises(CloudShellAPIError, match=protocol.DUPLICATE_ALIAS_MESSAGE):
        acquire(session, after, [AttributeNameValue(protocol.ATTR_OWNER, "other")])


def test_wrong_password(emulator, built_package: Path, capsys) -> None:
    code, output = install(emulator, built_package, capsys, password=WRONG)
    assert code == 1
    assert (
        f"error: login to the Quali API at http://{emulator.host}:{emulator.quali_port}/API/ failed for user "
        f"'{emulator.admin_user}' in domain 'Global': wrong username, password or domain"
    ) in output
    assert WRONG not in output and SECRET not in output


def test_a_refusal_inside_an_http_200_is_an_error(cloudshell_emulator_factory, built_package: Path, capsys):
    """A server older than the package's ServerVersion answers 200 with Success false."""
    emulator = cloudshell_emulator_factory(admin_password=SECRET, server_version="9.0.0")
    # The client on its own reports success: it checks only the HTTP status.
    client = PackagingRestApiClient.login(
        emulator.host, emulator.admin_user, SECRET, emulator.admin_domain, emulator.quali_port
    )
    assert client.import_package(built_package) is None

    code, output = install(emulator, built_package, capsys)
    assert code == 1
    assert "error: the server refused the package: metadata.xml: ServerVersion 9.3.0 is newer" in output
    session = emulator.session()
    with pytest.raises(CloudShellAPIError, match="was not found in the catalog"):
        acquire(session, emulator.create_reservation(), [AttributeNameValue(protocol.ATTR_OWNER, "x")])


def test_an_html_answer_is_explained_not_dumped(emulator, built_package: Path, capsys) -> None:
    """The emulator's Automation API port answers the login with an HTML error page, as a wrong port does."""
    argv = ["install", "--host", emulator.host, "--port", str(emulator.port), "--password", SECRET]
    code = cli.main([*argv, "--package", str(built_package)])
    captured = capsys.readouterr()
    assert (code, captured.out) == (1, "")
    assert captured.err == (
        f"error: login to the Quali API at http://{emulator.host}:{emulator.port}/API/ failed: an HTML page "
        "instead of a Quali API answer (is this the Quali API's port, 9000?)\n"
    )


@pytest.mark.parametrize("field", ["--username", "--domain"])
def test_a_password_written_into_the_user_or_domain_is_masked(
    emulator, built_package: Path, capsys, field: str
) -> None:
    argv = ["install", "--host", emulator.host, "--port", str(emulator.quali_port), "--password", SECRET]
    cli.main([*argv, field, f"admin:{WRONG}@{emulator.host}", "--package", str(built_package)])
    captured = capsys.readouterr()
    # The emulator refuses that user (an error line) and accepts any domain (the success line): both echo it.
    assert f"'admin:********@{emulator.host}'" in captured.out + captured.err
    assert WRONG not in captured.out + captured.err and SECRET not in captured.out + captured.err


def test_a_password_that_is_the_user_name_does_not_hide_the_user(
    cloudshell_emulator_factory, built_package, capsys
):
    """admin/admin (the emulator's default, and a new server's): the summary named the user '********'."""
    emu = cloudshell_emulator_factory()
    code, output = install(emu, built_package, capsys, password="admin")
    assert code == 0, output
    assert "as 'admin' in domain 'Global'" in output
