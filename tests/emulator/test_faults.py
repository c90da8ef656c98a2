"""Latency with the commit point inside the delay, and injected faults, seen through the real client."""

from __future__ import annotations

import threading
import time

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from urllib3.exceptions import ProtocolError

from cloudshell_mutex.emulator import DROP_AFTER_COMMIT, ERROR_BEFORE_COMMIT, Emulator
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, DUPLICATE_ALIAS_MESSAGE, SERVICE_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(cloudshell_emulator: Emulator) -> Emulator:
    cloudshell_emulator.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    return cloudshell_emulator


def owner(value: str):
    return [AttributeNameValue(ATTR_OWNER, value)]


def test_latency_commits_inside_the_delay(emu: Emulator):
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.configure(latency={"distribution": "fixed", "seconds": 0.6, "commit_fraction": 0.5})
    timeline = {}

    def call() -> None:
        timeline["start"] = time.monotonic()
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
        timeline["end"] = time.monotonic()

    caller = threading.Thread(target=call)
    caller.start()
    while "end" not in timeline:  # the control endpoint has no latency: it watches the commit happen
        if emu.control.reservation(rid)["services"] and "seen" not in timeline:
            timeline["seen"] = time.monotonic()
        time.sleep(0.01)
    caller.join()
    assert timeline["end"] - timeline["start"] >= 0.6
    assert 0.2 <= timeline["seen"] - timeline["start"] <= 0.45  # committed around 0.3 s ...
    assert timeline["end"] - timeline["seen"] >= 0.15  # ... and answered only 0.3 s later
    [event] = emu.control.events(rid)
    assert event["monotonic"] - timeline["start"] == pytest.approx(0.3, abs=0.1)


def test_latency_set_at_start_applies_to_every_call(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory(latency={"distribution": "uniform", "low": 0.05, "high": 0.08})
    api = emu.session()
    started = time.monotonic()
    for _ in range(3):
        api.GetServerDateAndTime()
    assert time.monotonic() - started >= 0.15
    assert emu.control.settings()["latency"]["distribution"] == "uniform"


def test_error_before_commit_is_http_500_and_changes_nothing(emu: Emulator):
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", ERROR_BEFORE_COMMIT)
    with pytest.raises(Exception, match=r"\[500\]") as info:
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert not isinstance(info.value, CloudShellAPIError)
    assert emu.control.events(rid) == []
    assert emu.control.reservation(rid)["services"] == []
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))  # one fault only
    assert len(emu.control.events(rid)) == 1


def test_dropped_response_after_commit_looks_like_contention_to_the_default_client(emu: Emulator):
    """The ambiguous case: the add took effect, the answer was lost, the client's own retry then collides
    with the service it created itself (CloudShellAPISession retries connection errors, max_attempts=3)."""
    api = emu.session()
    rid = emu.create_reservation()
    emu.control.reset_counts()
    emu.control.inject_fault("AddServiceToReservation", DROP_AFTER_COMMIT)
    with pytest.raises(CloudShellAPIError) as info:
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert (info.value.code, info.value.message) == ("100", DUPLICATE_ALIAS_MESSAGE)
    assert emu.control.call_counts()["AddServiceToReservation"] == 2
    [event] = emu.control.events(rid)  # yet the service IS committed, with our owner
    assert (event["op"], event["alias"], event["attributes"][ATTR_OWNER]) == (
        "service_added",
        DEFAULT_ALIAS,
        "me",
    )
    [service] = emu.session().GetReservationDetails(rid, True).ReservationDescription.Services
    assert {a.Name: a.Value for a in service.Attributes}[ATTR_OWNER] == "me"


def test_dropped_response_without_client_retry_is_a_connection_error(emu: Emulator):
    api = emu.session(max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault("*", DROP_AFTER_COMMIT)
    with pytest.raises(ProtocolError):
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert [e["attributes"][ATTR_OWNER] for e in emu.control.events(rid)] == ["me"]
    assert emu.control.faults() == {}
    # A dropped remove also commits: the alias is gone although the caller got no answer.
    emu.control.inject_fault("RemoveServicesFromReservation", DROP_AFTER_COMMIT)
    with pytest.raises(ProtocolError):
        api.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])
    assert [e["op"] for e in emu.control.events(rid)] == ["service_added", "service_removed"]


def test_faults_queued_at_start(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory(faults=[("GetServerDateAndTime", ERROR_BEFORE_COMMIT, 2)])
    api = emu.session()
    for _ in range(2):
        with pytest.raises(Exception, match=r"\[500\]"):
            api.GetServerDateAndTime()
    assert api.GetServerDateAndTime().ServerDateTime
    emu.control.inject_fault("GetServerDateAndTime", ERROR_BEFORE_COMMIT, 5)
    emu.control.clear_faults()
    assert api.GetServerDateAndTime().ServerDateTime
