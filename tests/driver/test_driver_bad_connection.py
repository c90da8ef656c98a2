"""A command context that cannot reach or log on to CloudShell: one line naming the context's field to fix.

A wrong token, port, host, domain or reservation used to surface as the client's own exception (a
``CloudShellAPIError`` about a token, a urllib3 ``MaxRetryError`` after nine retry warnings, "check the
reservation id" for a sandbox of another domain). Each now gets a ``MutexError`` of one line that names the
setting and never the token, no retry warning reaches the log, and the CLI's words for the same failure are
the same sentence with its own flags in place of the context's fields.
"""

from __future__ import annotations

import logging
import socket

import pytest
from driver_support import context_for

from cloudshell_mutex import MutexError, MutexPermissionError, ReservationNotActive, cli
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
PASSWORD = "Adm1n-Pw-never-shown"


class Driver(ReservationMutexMixin):
    @with_reservation_mutex(pacing=FAST, timeout=5)
    def rewire(self, context):
        return "done"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def retry_warnings(caplog):
    return [r for r in caplog.records if r.name.startswith("urllib3") and r.levelno >= logging.WARNING]


def failure_of(context, caplog):
    """The error the command raises, after checking what every such error must be."""
    caplog.clear()
    with pytest.raises(MutexError) as raised:
        Driver().rewire(context)
    message = str(raised.value)
    assert "\n" not in message and context.connectivity.admin_auth_token not in message
    assert not retry_warnings(caplog), "retry warnings reached the log"
    return raised.value


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip, monkeypatch, tmp_path):
    emulator = cloudshell_emulator_factory(packages=[original_package_zip], admin_password=PASSWORD)
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    return emulator


def test_each_bad_setting_of_a_context_gets_one_line_that_names_it(emu, caplog):
    caplog.set_level(logging.DEBUG)
    rid = emu.create_reservation()

    context = context_for(emu, rid, token="not-a-token")
    error = failure_of(context, caplog)
    assert isinstance(error, MutexPermissionError)
    assert "failed with the context's admin token in domain 'Global'" in str(error)
    assert "connectivity.admin_auth_token" in str(error) and "reservation.domain" in str(error)

    context = context_for(emu, rid)
    context.connectivity.cloudshell_api_port = str(emu.quali_port)  # the Quali API's port: a common mix-up
    error = failure_of(context, caplog)
    assert "something answered there, but not as the Automation API" in str(error)
    assert "check connectivity.cloudshell_api_port" in str(error) and "not the Quali API's 9000" in str(error)

    context = context_for(emu, rid)
    context.connectivity.server_address = "no-such-host.invalid"
    error = failure_of(context, caplog)
    assert "no host is known by the name 'no-such-host.invalid'" in str(error)
    assert str(error).endswith("check the context's connectivity.server_address")

    context = context_for(emu, rid)
    context.reservation.domain = "Nowhere"
    error = failure_of(context, caplog)
    assert isinstance(error, MutexPermissionError) and "in domain 'Nowhere'" in str(error)

    emu.add_domain("Sales")  # a domain that exists, but not the sandbox's: the sandbox is not seen there
    context = context_for(emu, rid)
    context.reservation.domain = "Sales"
    error = failure_of(context, caplog)
    assert isinstance(error, ReservationNotActive)
    assert f"reservation {rid} was not found in domain 'Sales'" in str(error)
    assert "a driver context's reservation.domain" in str(error)

    error = failure_of(context_for(emu, "0b9c3d1e-no-such-sandbox"), caplog)
    assert isinstance(error, ReservationNotActive) and "check the reservation (sandbox) id" in str(error)
    assert emu.control.reservation(rid)["services"] == []


def test_the_cli_and_the_mixin_say_the_same_of_a_port_where_nothing_listens(
    emu, caplog, capsys, monkeypatch, tmp_path
):
    caplog.set_level(logging.DEBUG)
    rid = emu.create_reservation()
    port = closed_port()
    context = context_for(emu, rid)
    context.connectivity.cloudshell_api_port = str(port)
    from_driver = str(failure_of(context, caplog))

    monkeypatch.chdir(tmp_path)  # no stray cloudshell_config.yml
    for name in ("CLOUDSHELL_PORT", "CLOUDSHELL_USERNAME", "CLOUDSHELL_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", PASSWORD)
    code = cli.main(["status", rid, "--host", emu.host, "--api-port", str(port)])
    from_cli = capsys.readouterr().err.strip().removeprefix("error: ")
    assert code == 6
    assert not retry_warnings(caplog)

    cli_names = ("--host (CLOUDSHELL_HOST)", "--api-port (CLOUDSHELL_API_PORT)")
    context_names = ("the context's connectivity.server_address", "connectivity.cloudshell_api_port")
    for cli_name, context_name in zip(cli_names, context_names):
        assert cli_name in from_cli and context_name in from_driver
        from_cli = from_cli.replace(cli_name, "<setting>")
        from_driver = from_driver.replace(context_name, "<setting>")
    assert from_cli == from_driver
    assert from_cli.startswith(
        f"cannot connect to the CloudShell Automation API at 127.0.0.1:{port}: nothing"
    )
