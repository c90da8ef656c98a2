"""``cloudshell-mutex status`` and ``release`` against the emulator, with the real CloudShellAPISession."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from cloudshell_mutex import MutexLostError, ReservationMutex, cli
from cloudshell_mutex.lock.admin import command

pytestmark = pytest.mark.integration

PASSWORD = "Adm1n-Pw-never-shown"


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip, monkeypatch, tmp_path):
    """An emulator with the original package; the CLI's settings point at it through the environment."""
    emulator = cloudshell_emulator_factory(packages=[original_package_zip], admin_password=PASSWORD)
    monkeypatch.chdir(tmp_path)  # no stray cloudshell_config.yml
    for name in ("CLOUDSHELL_PORT", "CLOUDSHELL_USERNAME", "CLOUDSHELL_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSHELL_HOST", emulator.host)
    monkeypatch.setenv("CLOUDSHELL_API_PORT", str(emulator.port))
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", PASSWORD)
    return emulator


def run(capsys, argv: List[str]):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    return code, out, err


def held_lock(emu, reservation_id: str, name: str = "MUTEX") -> ReservationMutex:
    lock = ReservationMutex(emu.session(), reservation_id, owner="Router A driver", name=name)
    assert lock.acquire(timeout=10)
    return lock


def test_status_shows_holder_label_and_token(emu, capsys):
    reservation_id = emu.create_reservation()
    lock = held_lock(emu, reservation_id)
    code, out, _ = run(capsys, ["status", reservation_id])
    assert code == command.EXIT_OK
    assert "is held by Router A driver" in out and lock.token in out
    assert "held now" in out and "--watch SECONDS reads again" in out  # the command line can watch
    code, out, _ = run(capsys, ["status", reservation_id, "--json"])
    data = json.loads(out)
    assert code == 0 and data["outcome"] == "held" and data["holder"]["token"] == lock.token
    assert data["seen_held_for"] == 0.0 and data["exit_code"] == 0


def test_status_watch_measures_on_this_observers_clock(emu, capsys):
    reservation_id = emu.create_reservation()
    held_lock(emu, reservation_id)
    code, out, _ = run(capsys, ["status", reservation_id, "--watch", "1.2", "--json"])
    data = json.loads(out)
    assert code == 0 and data["holder_changes"] == 0
    assert data["seen_held_for"] >= 1.2 and data["watched_for"] >= 1.2


def test_status_of_a_free_lock_and_another_alias(emu, capsys):
    reservation_id = emu.create_reservation()
    held_lock(emu, reservation_id, name="CONFIG_LOCK")
    code, out, _ = run(capsys, ["status", reservation_id])
    assert code == command.EXIT_NO_LOCK and "is free" in out
    code, out, _ = run(capsys, ["status", reservation_id, "--name", "CONFIG_LOCK"])
    assert code == command.EXIT_OK and "'CONFIG_LOCK'" in out


def test_release_removes_the_holder_and_records_who_whose_and_why(emu, capsys):
    reservation_id = emu.create_reservation()
    lock = held_lock(emu, reservation_id)
    code, out, _ = run(
        capsys, ["release", reservation_id, "--force", "--reason", "driver crashed on exec-02"]
    )
    assert code == command.EXIT_OK
    assert emu.control.reservation(reservation_id)["services"] == []
    output = "\n".join(emu.control.output(reservation_id))
    for text in (out, output):
        assert "admin (cloudshell-mutex release on" in text  # who
        assert lock.token in text and "Router A driver" in text  # whose
        assert "Reason: driver crashed on exec-02" in text  # why
    assert PASSWORD not in output
    with pytest.raises(MutexLostError):  # the holder learns at its release that it lost the lock
        lock.release()


def test_release_without_a_lock_says_so_and_removes_nothing(emu, capsys):
    reservation_id = emu.create_reservation()
    held_lock(emu, reservation_id, name="OTHER")
    code, out, _ = run(capsys, ["release", reservation_id, "--force", "--reason", "cleanup", "--json"])
    assert code == command.EXIT_NO_LOCK and json.loads(out)["outcome"] == "no_lock"
    assert [s["alias"] for s in emu.control.reservation(reservation_id)["services"]] == ["OTHER"]
    assert "nobody held it" in "\n".join(emu.control.output(reservation_id))


@pytest.mark.parametrize(
    "flags, missing",
    [([], "--force and --reason"), (["--force"], "--reason"), (["--reason", "x"], "--force"),
     (["--force", "--reason", "  \n "], "--reason")],
)  # fmt: skip
def test_release_refuses_without_force_and_reason(emu, capsys, flags, missing):
    reservation_id = emu.create_reservation()
    held_lock(emu, reservation_id)
    emu.control.reset_counts()
    code, _, err = run(capsys, ["release", reservation_id, *flags])
    assert code == command.EXIT_REFUSED and "refused" in err and missing in err
    assert len(emu.control.reservation(reservation_id)["services"]) == 1
    assert emu.control.call_counts() == {} or not any(emu.control.call_counts().values())


@pytest.mark.parametrize("subcommand", [["status"], ["release", "--force", "--reason", "r"]])
def test_unknown_and_ended_reservations(emu, capsys, subcommand):
    code, _, err = run(capsys, [subcommand[0], "no-such-reservation", *subcommand[1:]])
    assert code == command.EXIT_RESERVATION and "was not found" in err
    ended = emu.create_reservation()
    emu.session().EndReservation(ended)
    code, _, err = run(capsys, [subcommand[0], ended, *subcommand[1:]])
    assert code == command.EXIT_RESERVATION and "has ended" in err


@pytest.mark.parametrize("subcommand", [["status"], ["release", "--force", "--reason", "r"]])
def test_wrong_password_is_a_logon_error_without_the_password(emu, capsys, monkeypatch, subcommand):
    reservation_id = emu.create_reservation()
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", "Wr0ng-Secret-pw")
    code, out, err = run(capsys, [subcommand[0], reservation_id, *subcommand[1:]])
    assert code == command.EXIT_LOGIN and "logon to the CloudShell Automation API" in err
    assert "'admin'" in err and "Wr0ng-Secret-pw" not in out + err


def test_unreachable_server_and_the_quali_port_are_connection_errors(emu, capsys, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    code, _, err = run(capsys, ["status", "r1", "--api-port", str(closed)])
    assert code == command.EXIT_CONNECTION and "cannot connect" in err and "--api-port" in err
    # The Quali API answers HTTP, but not the Automation API: a common mix-up of the two ports.
    code, _, err = run(capsys, ["status", "r1", "--api-port", str(emu.quali_port)])
    assert code == command.EXIT_CONNECTION and "not the Quali API's 9000" in err


def test_settings_come_from_cloudshell_config_except_its_quali_port(emu, capsys, monkeypatch, tmp_path):
    reservation_id = emu.create_reservation()
    monkeypatch.delenv("CLOUDSHELL_PASSWORD")
    monkeypatch.delenv("CLOUDSHELL_HOST")
    (tmp_path / "cloudshell_config.yml").write_text(
        f"install:\n  host: {emu.host}\n  port: {emu.quali_port}\n  username: admin\n"
        f"  password: {PASSWORD}\n  domain: Global\n"
    )
    code, out, _ = run(capsys, ["status", reservation_id])
    assert code == command.EXIT_NO_LOCK and "is free" in out
    monkeypatch.delenv("CLOUDSHELL_API_PORT")  # the default 8029, never the file's Quali port
    args = cli.build_parser().parse_args(["status", reservation_id])
    assert command.resolve_connection(args).api_port == command.DEFAULT_API_PORT


def test_bad_settings_exit_2_with_what_to_do(emu, capsys, monkeypatch):
    monkeypatch.delenv("CLOUDSHELL_PASSWORD")
    code, _, err = run(capsys, ["status", "r1"])
    assert code == 2 and "CLOUDSHELL_PASSWORD" in err
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", PASSWORD)
    code, _, err = run(capsys, ["status", "r1", "--api-port", "80290"])
    assert code == 2 and "not a TCP port number" in err
    code, _, err = run(capsys, ["release", "r1", "--name", " ", "--force", "--reason", "x"])
    assert code == 2 and "must not be blank" in err
    code, _, err = run(capsys, ["status", "r1", "--watch", "-1"])
    assert code == 2 and "--watch" in err


def test_help_shows_examples_and_exit_codes():
    for subcommand in ("status", "release"):
        result = subprocess.run(
            [sys.executable, "-m", "cloudshell_mutex.cli", subcommand, "--help"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "120"},
        )  # fmt: skip
        assert result.returncode == 0
        assert f"cloudshell-mutex {subcommand} 0b9c3d1e-" in result.stdout
        assert "exit codes:" in result.stdout and "CLOUDSHELL_API_PORT" in result.stdout


def test_the_installed_entry_point_releases(emu, tmp_path: Path):
    reservation_id = emu.create_reservation()
    held_lock(emu, reservation_id)
    result = subprocess.run(
        [sys.executable, "-m", "cloudshell_mutex.cli", "release", reservation_id,
         "--force", "--reason", "stuck"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "force-released 'MUTEX'" in result.stdout and PASSWORD not in result.stdout + result.stderr


def test_release_checks_the_user_it_logs_on_as(emu, capsys):
    """The Mutex Service driver's rule: system admins, and domain admins of the sandbox's domain."""
    emu.add_user("rob", "rob-pw", domain="Sales")
    emu.add_user("dana", "dana-pw", domain="Sales", role="DomainAdmin")
    reservation_id = emu.create_reservation(domain="Sales")
    lock = ReservationMutex(emu.session(domain="Sales"), reservation_id, owner="Router A driver")
    assert lock.acquire(timeout=10)
    argv = ["release", reservation_id, "--force", "--reason", "stuck", "--domain", "Sales"]
    code, _, err = run(capsys, [*argv, "--username", "rob", "--password", "rob-pw"])
    assert code == command.EXIT_REFUSED
    assert "refused: Force Release is for system administrators, and domain administrators" in err
    assert "rob is neither a system administrator nor a domain administrator of 'Sales'" in err
    assert [s["alias"] for s in emu.control.reservation(reservation_id)["services"]] == ["MUTEX"]
    code, out, _ = run(capsys, [*argv, "--username", "dana", "--password", "dana-pw"])
    assert code == command.EXIT_OK and "force-released 'MUTEX'" in out
    assert emu.control.reservation(reservation_id)["services"] == []


def test_a_sandbox_of_another_domain_is_not_found_from_global_and_the_error_says_where_to_look(emu, capsys):
    reservation_id = emu.create_reservation(domain="Sales")
    code, _, err = run(capsys, ["status", reservation_id])
    assert code == command.EXIT_RESERVATION and "was not found in domain 'Global'" in err
    assert "log on to the sandbox's own domain" in err and "the CLI's --domain" in err
    code, out, _ = run(capsys, ["status", reservation_id, "--domain", "Sales"])
    assert code == command.EXIT_NO_LOCK and "is free" in out


def test_a_releasing_markers_secret_is_never_shown_by_status_or_release(emu, capsys):
    from cloudshell.api.cloudshell_api import AttributeNameValue

    from cloudshell_mutex import protocol
    from cloudshell_mutex.lock.holder import make_secret, make_token, releasing_value

    reservation_id = emu.create_reservation()
    secret = make_secret()
    token = make_token("holder", secret)
    marker = protocol.releasing_alias("MUTEX")
    value = [AttributeNameValue(protocol.ATTR_OWNER, releasing_value(token, secret))]
    emu.session().AddServiceToReservation(reservation_id, protocol.SERVICE_MODEL, marker, value)
    outputs = []
    for argv in (
        ["status", reservation_id, "--name", marker],
        ["status", reservation_id, "--name", marker, "--json"],
        ["release", reservation_id, "--name", marker, "--force", "--reason", "stuck"],
    ):
        _, out, err = run(capsys, argv)
        outputs.append(out + err)
    assert all(token in text for text in outputs[:2])  # the token it names is shown
    assert not any(secret.hex() in text for text in outputs)
    assert not any(secret.hex() in line for line in emu.control.output(reservation_id))
