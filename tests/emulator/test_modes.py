"""Real-server behaviours as modes, and the fault kinds that imitate a real server's bad moments."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from urllib3.exceptions import ReadTimeoutError

from cloudshell_mutex.emulator import Emulator, EmulatorControl
from cloudshell_mutex.emulator.command import PASSWORD_ENV, admin_password
from cloudshell_mutex.emulator.faults import LatencyModel
from cloudshell_mutex.emulator.messages import MESSAGES, render
from cloudshell_mutex.emulator.state import Reservation, utcnow
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, SERVICE_MODEL


@pytest.fixture
def emu(cloudshell_emulator: Emulator) -> Emulator:
    cloudshell_emulator.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    return cloudshell_emulator


def owner(value: str):
    return [AttributeNameValue(ATTR_OWNER, value)]


def listed(api: CloudShellAPISession):
    return sorted(s.Name for s in api.GetServices("", "").Services)


# ------------------------------------------------------------------ catalog
@pytest.mark.integration
def test_strict_catalog_lists_only_categorised_families_and_hides_admin_only_ones(
    cloudshell_emulator: Emulator, original_package_zip: Path
):
    emu = cloudshell_emulator
    emu.import_package(original_package_zip)  # Mutex Service: admin-only family, no category
    emu.add_service_model("Open Service", category="Networking")
    emu.add_service_model("Admin Service", category="Networking", admin_only=True)
    emu.control.add_user("bob", "pw-bob")
    admin, bob = emu.session(), emu.session(username="bob", password="pw-bob")
    everything = ["Admin Service", SERVICE_MODEL, "Open Service"]
    assert listed(admin) == ["Admin Service", "Open Service"] and listed(bob) == ["Open Service"]  # strict
    assert emu.control.configure(catalog="permissive")["catalog"] == "permissive"
    assert listed(admin) == listed(bob) == everything

    assert emu.control.configure(catalog="strict")["catalog"] == "strict"
    assert listed(admin) == ["Admin Service", "Open Service"]
    assert listed(bob) == ["Open Service"]
    assert admin.GetServices("", SERVICE_MODEL).Services == []
    rid = emu.create_reservation()
    bob.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("bob"))  # not listed, still usable
    assert emu.control.reservation(rid)["services"][0]["model"] == SERVICE_MODEL


# ------------------------------------------------------------------ fault kinds
@pytest.mark.integration
def test_double_grant_answers_success_stores_nothing_and_shows_in_the_log(emu: Emulator):
    first, second = emu.session(), emu.session()
    rid = emu.create_reservation()
    first.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("first"))
    emu.control.inject_fault("AddServiceToReservation", "double_grant")
    raw = second.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("second"))
    assert b'Success="true"' in raw
    [service] = emu.control.reservation(rid)["services"]
    assert service["attributes"][ATTR_OWNER] == "first"
    [record] = emu.control.faults_injected()
    events = emu.control.events(rid)
    assert [(e["op"], e["attributes"][ATTR_OWNER]) for e in events] == [
        ("service_added", "first"),
        ("service_double_granted", "second"),
    ]
    assert events[1]["fault"] == {"id": record["id"], "kind": "double_grant"}
    assert (record["outcome"], record["double_granted"]) == ("applied", True)


@pytest.mark.integration
def test_stale_fresh_read_shows_an_older_version(emu: Emulator):
    api = emu.session()
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("a"))
    # Older than every change: the reservation as it was when created.
    emu.control.inject_fault("GetReservationDetails", "stale_fresh_read", ms=60_000)
    assert api.GetReservationDetails(rid, True).ReservationDescription.Services == []
    assert [s.Alias for s in api.GetReservationDetails(rid, True).ReservationDescription.Services] == [
        DEFAULT_ALIAS
    ]


def test_reservation_versions_answer_as_of_a_time():
    now = utcnow()
    reservation = Reservation("r", "n", "o", "Global", now, now, now)
    reservation.remember_version(10.0)
    reservation.output.append("x")  # stands for a change
    reservation.remember_version(20.0)
    assert reservation.version_at(5.0) is reservation.versions[0][1]
    assert reservation.version_at(15.0) is reservation.versions[0][1]
    assert reservation.version_at(20.0) is reservation.versions[1][1]
    reservation.remember_version(100.0)  # versions older than the horizon go, but one older stays
    assert [t for t, _ in reservation.versions] == [20.0, 100.0]


@pytest.mark.integration
@pytest.mark.parametrize("reword", [False, True])
def test_transient_false_is_a_deadlock_victim_answer_that_changes_nothing(emu: Emulator, reword: bool):
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.configure(reword_errors=reword)
    emu.control.inject_fault("AddServiceToReservation", "transient_false")
    with pytest.raises(CloudShellAPIError) as info:
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert info.value.code == "100"
    assert info.value.message == render("deadlock_victim", reword, process_id=57)
    assert ("deadlock victim" in info.value.message) and (
        "Rerun the transaction" in info.value.message
    ) != reword
    assert emu.control.reservation(rid)["services"] == []
    assert emu.control.faults_injected()[0]["outcome"] == "not_applied"


@pytest.mark.integration
@pytest.mark.parametrize("commit", [False, True])
def test_hang_gives_no_answer_until_the_client_times_out(emu: Emulator, commit: bool):
    api = emu.session(timeout=1, max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "hang", commit=commit)
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert time.monotonic() - started >= 1.0
    assert len(emu.control.reservation(rid)["services"]) == int(commit)
    assert emu.control.faults_injected()[0]["outcome"] == ("applied" if commit else "not_applied")


# ------------------------------------------------------------------ latency
def test_lognormal_latency_is_given_by_its_median():
    model = LatencyModel({"distribution": "lognormal", "median": 0.05, "sigma": 0.5, "seed": 1})
    samples = sorted(model.sample() for _ in range(2001))
    assert 0.045 < samples[1000] < 0.055
    assert samples[-1] > 0.1  # a long tail
    with pytest.raises(ValueError, match="needs 'sigma'"):
        LatencyModel({"distribution": "lognormal", "median": 0.05})


def test_latency_per_method_and_for_uncached_reads():
    model = LatencyModel(
        {
            "distribution": "fixed",
            "seconds": 0.01,
            "methods": {
                "GetReservationDetails:uncached": {"distribution": "fixed", "seconds": 0.3},
                "AddServiceToReservation": {"distribution": "fixed", "seconds": 0.1, "commit_fraction": 1},
            },
        }
    )
    assert sum(model.split("GetReservationDetails:uncached", "GetReservationDetails")) == pytest.approx(0.3)
    assert sum(model.split("GetReservationDetails")) == pytest.approx(0.01)
    assert model.split("AddServiceToReservation") == pytest.approx((0.1, 0.0))
    assert LatencyModel(model.to_dict()).to_dict() == model.to_dict()
    with pytest.raises(ValueError, match="one level deep"):
        LatencyModel({"methods": {"X": {"methods": {"Y": {}}}}})


@pytest.mark.integration
def test_an_uncached_read_can_be_the_slowest_call(emu: Emulator):
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.configure(
        latency={"methods": {"GetReservationDetails:uncached": {"distribution": "fixed", "seconds": 0.4}}}
    )
    started = time.monotonic()
    api.GetReservationDetails(rid, True)
    assert time.monotonic() - started >= 0.4


# ------------------------------------------------------------------ connections and the CLI
@pytest.mark.integration
def test_a_connection_that_never_finishes_its_headers_is_closed(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory(header_timeout=0.3)
    assert emu.control.settings()["header_timeout"] == 0.3
    with socket.create_connection(("127.0.0.1", emu.port), timeout=30) as sock:
        sock.sendall(b"POST /ResourceManagerApiService/Logon HTTP/1.1\r\nHost: x\r\n")  # no blank line
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, without an answer
    assert time.monotonic() - started >= 0.25
    assert emu.session().GetServerDateAndTime().ServerDateTime  # everyone else is served


def test_admin_password_comes_from_the_option_then_the_environment():
    assert admin_password("opt", {PASSWORD_ENV: "env"}) == "opt"
    assert admin_password(None, {PASSWORD_ENV: "env"}) == "env"
    assert admin_password(None, {}) == "admin"


@pytest.mark.integration
def test_cli_takes_the_password_from_the_environment_and_the_modes_from_options():
    secret = "Env-secret-4711"
    command = [
        sys.executable, "-m", "cloudshell_mutex.cli", "emulator", "--port", "0", "--quali-port", "0",
        "--catalog", "strict", "--ended-reservations", "closed", "--reword-errors", "--header-timeout", "7",
        "--alias-case", "insensitive", "--add-atomicity", "racy", "--remove-missing", "ignore",
        "--disable-cache", "ignored", "--tilde-aliases", "refused", "--user-groups", "omitted",
    ]  # fmt: skip
    env = dict(os.environ, **{PASSWORD_ENV: secret})
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = process.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", first).group(1))
        CloudShellAPISession("127.0.0.1", "admin", secret, "Global", port=port)
        settings = EmulatorControl(f"http://127.0.0.1:{port}").settings()
        assert (settings["catalog"], settings["ended_reservations"]) == ("strict", "closed")
        assert (settings["reword_errors"], settings["header_timeout"]) == (True, 7.0)
        modes = (
            "alias_case",
            "add_atomicity",
            "remove_missing",
            "disable_cache",
            "tilde_aliases",
            "user_groups",
        )
        assert [settings[mode] for mode in modes] == [
            "insensitive",
            "racy",
            "ignore",
            "ignored",
            "refused",
            "omitted",
        ]
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert secret not in first + rest
    help_text = subprocess.run(
        [sys.executable, "-m", "cloudshell_mutex.cli", "emulator", "--help"], capture_output=True, text=True
    ).stdout
    assert PASSWORD_ENV in help_text


def test_only_the_documented_text_survives_rewording():
    assert [m.name for m in MESSAGES.values() if m.example(True) == m.example()] == ["duplicate_alias"]
