"""Faults whose outcome the client cannot know: requests that land late, dropped answers on every
mutating call, HTTP 500 on reads, seeded random faults and latency spikes, all through the real client."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, SetConnectorRequest
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from cloudshell_mutex.emulator import DROP_AFTER_COMMIT, ERROR_BEFORE_COMMIT, Emulator
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, DUPLICATE_ALIAS_MESSAGE, SERVICE_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(cloudshell_emulator: Emulator) -> Emulator:
    cloudshell_emulator.add_service_model(SERVICE_MODEL, {ATTR_OWNER: ""})
    cloudshell_emulator.add_resource_model("Switch Model", "Switch")
    return cloudshell_emulator


def owner(value: str) -> List[AttributeNameValue]:
    return [AttributeNameValue(ATTR_OWNER, value)]


def settled(emu: Emulator, fault_id: int, timeout: float = 30.0) -> Dict[str, Any]:
    """The record of a fault once its call has an outcome (polls: the landing time is the server's)."""
    deadline = time.monotonic() + timeout
    while True:
        [record] = [r for r in emu.control.faults_injected() if r["id"] == fault_id]
        if record["outcome"] != "pending" or time.monotonic() > deadline:
            return record
        time.sleep(0.02)


def test_late_remove_deletes_the_alias_re_added_in_between(emu: Emulator):
    """The danger a lock must design around: A's remove is reset and lands only after A removed again
    and B took the alias, so it deletes B's service."""
    a, b = emu.session(max_attempts=1), emu.session(username=emu.admin_user)
    rid = emu.create_reservation()
    a.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("a"))
    emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None)
    with pytest.raises(ProtocolError):
        a.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])
    assert [s["attributes"][ATTR_OWNER] for s in emu.control.reservation(rid)["services"]] == ["a"]
    a.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])  # A tries again: this copy lands at once
    b.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("b"))

    assert emu.control.land_late() == 1
    assert emu.control.reservation(rid)["services"] == []  # B's lock is gone
    events = emu.control.events(rid)
    assert [(e["op"], e["attributes"][ATTR_OWNER]) for e in events] == [
        ("service_added", "a"),
        ("service_removed", "a"),
        ("service_added", "b"),
        ("service_removed", "b"),
    ]
    [record] = emu.control.faults_injected()
    assert events[-1]["late"] is True and events[-1]["fault"] == {"id": record["id"], "kind": "apply_late"}
    assert all("late" not in e for e in events[:-1])
    assert (record["method"], record["reservation_id"], record["source"], record["outcome"]) == (
        "RemoveServicesFromReservation",
        rid,
        "queued",
        "applied",
    )


def test_late_add_lands_by_itself_after_its_delay(emu: Emulator):
    api = emu.session(max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=0.3, reset_after=0.1)
    started = time.monotonic()
    with pytest.raises(ProtocolError):
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("late"))
    assert time.monotonic() - started >= 0.1  # reset only after reset_after
    [injected] = emu.control.faults_injected()
    record = settled(emu, injected["id"])
    assert record["outcome"] == "applied"
    assert record["landed_monotonic"] - record["monotonic"] >= 0.3
    [event] = emu.control.events(rid)
    assert (event["op"], event["attributes"][ATTR_OWNER], event["late"]) == ("service_added", "late", True)


def test_hung_call_times_out_in_the_client_and_a_late_copy_loses_to_the_retry(emu: Emulator):
    """``CloudShellAPISession(..., timeout=1)``: the first copy hangs, the client gives up after 1 s and
    re-sends 1 s later; that copy commits, and the late first copy then meets its own service."""
    api = emu.session(timeout=1)  # default max_attempts=3: the client re-sends on a read timeout
    rid = emu.create_reservation()
    emu.control.reset_counts()
    emu.control.inject_fault("AddServiceToReservation", "apply_late", delay=None, reply="hang")
    started = time.monotonic()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert time.monotonic() - started >= 2.0  # 1 s timeout, then the client's 1 s pause
    assert emu.control.call_counts()["AddServiceToReservation"] == 2
    assert emu.control.land_late() == 1
    [record] = emu.control.faults_injected()
    assert (record["outcome"], record["code"], record["message"]) == (
        "failed",
        "100",
        DUPLICATE_ALIAS_MESSAGE,
    )
    assert [e["op"] for e in emu.control.events(rid)] == ["service_added"]


def test_hung_call_without_client_retry_is_a_read_timeout(emu: Emulator):
    api = emu.session(timeout=1, max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault("SetServiceAttributesValues", "apply_late", delay=None, reply="hang")
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("a"))
    with pytest.raises(ReadTimeoutError):
        api.SetServiceAttributesValues(rid, DEFAULT_ALIAS, owner("b"))
    assert emu.control.reservation(rid)["services"][0]["attributes"][ATTR_OWNER] == "a"
    emu.control.land_late()
    assert emu.control.reservation(rid)["services"][0]["attributes"][ATTR_OWNER] == "b"
    assert api.GetServerDateAndTime().ServerDateTime  # the session still works


def test_late_calls_land_in_arrival_order_and_unlanded_ones_are_discarded_at_stop(emu: Emulator):
    api = emu.session(max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "apply_late", count=2, delay=None)
    for name in ("first", "second"):
        with pytest.raises(ProtocolError):
            api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner(name))
    first, second = emu.control.faults_injected()
    assert emu.control.land_late([first["id"]]) == 1
    assert [e["attributes"][ATTR_OWNER] for e in emu.control.events(rid)] == ["first"]
    assert emu.control.faults_injected()[1] == dict(second)  # still pending
    emu.stop()
    assert emu.runtime.faults.injected()[1]["outcome"] == "discarded"


# ------------------------------------------------------------------ dropped answers on every change
def _resources(api, rid: str) -> None:
    for name in ("sw1", "sw2"):
        api.CreateResource("Switch", "Switch Model", name, "10.0.0.1", "", "", "")
    api.AddResourcesToReservation(rid, ["sw1", "sw2"])


Step = Callable[[Any, str], Any]
Check = Callable[[Emulator, str], bool]

MUTATING_CALLS: Dict[str, tuple] = {
    "AddServiceToReservation": (
        lambda api, rid: None,
        lambda api, rid: api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("x")),
        lambda emu, rid: len(emu.control.reservation(rid)["services"]) == 1,
    ),
    "RemoveServicesFromReservation": (
        lambda api, rid: api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("x")),
        lambda api, rid: api.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS]),
        lambda emu, rid: emu.control.reservation(rid)["services"] == [],
    ),
    "SetServiceAttributesValues": (
        lambda api, rid: api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("x")),
        lambda api, rid: api.SetServiceAttributesValues(rid, DEFAULT_ALIAS, owner("y")),
        lambda emu, rid: emu.control.reservation(rid)["services"][0]["attributes"][ATTR_OWNER] == "y",
    ),
    "WriteMessageToReservationOutput": (
        lambda api, rid: None,
        lambda api, rid: api.WriteMessageToReservationOutput(rid, "hello"),
        lambda emu, rid: emu.control.output(rid) == ["hello"],
    ),
    "CreateResource": (
        lambda api, rid: None,
        lambda api, rid: api.CreateResource("Switch", "Switch Model", "sw9", "10.0.0.9", "", "", ""),
        lambda emu, rid: "sw9" in emu.runtime.state.resources,
    ),
    "AddResourcesToReservation": (
        lambda api, rid: api.CreateResource("Switch", "Switch Model", "sw1", "10.0.0.1", "", "", ""),
        lambda api, rid: api.AddResourcesToReservation(rid, ["sw1"]),
        lambda emu, rid: emu.control.reservation(rid)["resources"] == ["sw1"],
    ),
    "RemoveResourcesFromReservation": (
        _resources,
        lambda api, rid: api.RemoveResourcesFromReservation(rid, ["sw1"]),
        lambda emu, rid: emu.control.reservation(rid)["resources"] == ["sw2"],
    ),
    "SetConnectorsInReservation": (
        _resources,
        lambda api, rid: api.SetConnectorsInReservation(rid, [SetConnectorRequest("sw1", "sw2", "bi", "up")]),
        lambda emu, rid: len(emu.control.reservation(rid)["connectors"]) == 1,
    ),
    "RemoveConnectorsFromReservation": (
        lambda api, rid: (
            _resources(api, rid),
            api.SetConnectorsInReservation(rid, [SetConnectorRequest("sw1", "sw2", "bi", "up")]),
        ),
        lambda api, rid: api.RemoveConnectorsFromReservation(rid, ["sw1", "sw2"]),
        lambda emu, rid: emu.control.reservation(rid)["connectors"] == [],
    ),
    "EndReservation": (
        lambda api, rid: None,
        lambda api, rid: api.EndReservation(rid),
        lambda emu, rid: emu.control.reservation(rid)["status"] == "Completed",
    ),
}


@pytest.mark.parametrize("method", sorted(MUTATING_CALLS))
def test_drop_after_commit_commits_every_mutating_call(emu: Emulator, method: str):
    setup, call, committed = MUTATING_CALLS[method]
    api = emu.session(max_attempts=1)
    rid = emu.create_reservation()
    setup(api, rid)
    assert not committed(emu, rid)
    emu.control.inject_fault(method, DROP_AFTER_COMMIT)
    with pytest.raises(ProtocolError):
        call(api, rid)
    assert committed(emu, rid)
    [record] = emu.control.faults_injected()
    assert (record["method"], record["kind"], record["outcome"]) == (method, DROP_AFTER_COMMIT, "applied")


@pytest.mark.parametrize("method", ["GetReservationDetails", "GetReservationStatus"])
def test_error_before_commit_on_reads_is_http_500(emu: Emulator, method: str):
    api = emu.session()
    rid = emu.create_reservation()
    read = getattr(api, method)
    emu.control.inject_fault(method, ERROR_BEFORE_COMMIT)
    with pytest.raises(Exception, match=r"\[500\]") as info:
        read(rid)
    assert not isinstance(info.value, CloudShellAPIError)
    assert read(rid)  # one fault only
    [record] = emu.control.faults_injected()
    assert (record["method"], record["kind"], record["reservation_id"]) == (method, ERROR_BEFORE_COMMIT, rid)


def test_reset_before_commit_answers_nothing_and_never_applies(emu: Emulator):
    """The request that got no answer and will never land: the client sees a reset (its own re-send, the
    next copy, takes effect), and without the re-send nothing changes, then or later."""
    rid = emu.create_reservation()
    once = emu.session(max_attempts=1)
    once.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("a"))
    emu.control.inject_fault("RemoveServicesFromReservation", "reset_before_commit")
    with pytest.raises(ProtocolError):
        once.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])
    assert emu.control.land_late() == 0  # nothing held back to land later
    assert [s["attributes"][ATTR_OWNER] for s in emu.control.reservation(rid)["services"]] == ["a"]
    [record] = emu.control.faults_injected()
    assert (record["kind"], record["outcome"]) == ("reset_before_commit", "not_applied")
    emu.control.reset_counts()
    emu.control.inject_fault("RemoveServicesFromReservation", "reset_before_commit")
    emu.session().RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])  # the client's re-send removes it
    assert emu.control.call_counts()["RemoveServicesFromReservation"] == 2
    assert [e["op"] for e in emu.control.events(rid)] == ["service_added", "service_removed"]


def test_a_late_delay_range_lands_each_call_within_it(emu: Emulator):
    api = emu.session(max_attempts=1)
    rid = emu.create_reservation()
    emu.control.inject_fault(
        "AddServiceToReservation", "apply_late", delay=0.2, delay_max=0.6, reset_after=0.05
    )
    with pytest.raises(ProtocolError):
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("late"))
    [injected] = emu.control.faults_injected()
    assert 0.2 <= injected["params"]["delay"] <= 0.6 and injected["params"]["delay_max"] == 0.6
    record = settled(emu, injected["id"])
    assert record["outcome"] == "applied"
    assert record["landed_monotonic"] - record["monotonic"] >= injected["params"]["delay"]


# ------------------------------------------------------------------ random faults and spikes
def _failures(emu: Emulator, calls: int) -> List[int]:
    api = emu.session()
    failed = []
    for i in range(calls):
        try:
            api.GetServerDateAndTime()
        except Exception:
            failed.append(i)
    return failed


def test_random_faults_are_repeatable_from_their_seed(cloudshell_emulator_factory):
    settings = {"seed": 7, "rates": {ERROR_BEFORE_COMMIT: 0.4}, "methods": ["GetServerDateAndTime"]}
    first = cloudshell_emulator_factory(random_faults=settings)
    second = cloudshell_emulator_factory()
    second.control.configure(random_faults=settings)
    failed = _failures(first, 30)
    assert 0 < len(failed) < 30
    assert _failures(second, 30) == failed
    records = first.control.faults_injected()
    assert len(records) == len(failed) and {r["source"] for r in records} == {"random"}
    assert first.control.settings()["random_faults"]["rates"] == {ERROR_BEFORE_COMMIT: 0.4}
    first.control.configure(random_faults=None)
    assert _failures(first, 10) == []


def test_latency_spike_outlasts_the_client_timeout_and_commits_late(emu: Emulator):
    api = emu.session(timeout=1, max_attempts=1)
    rid = emu.create_reservation()
    emu.control.configure(
        random_faults={
            "seed": 1,
            "rates": {},
            "method_rates": {"AddServiceToReservation": {"spike": 1.0}},
            "params": {"spike": {"seconds": 1.5}},
        }
    )
    with pytest.raises(ReadTimeoutError):
        api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("slow"))
    [injected] = emu.control.faults_injected()
    assert (injected["kind"], injected["params"], injected["source"]) == ("spike", {"seconds": 1.5}, "random")
    assert settled(emu, injected["id"])["outcome"] == "applied"
    [event] = emu.control.events(rid)
    assert event["fault"] == {"id": injected["id"], "kind": "spike"}
    assert api.GetServerDateAndTime().ServerDateTime  # other methods are not in scope


def test_faults_with_parameters_queued_at_start(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory(faults=[("GetServerDateAndTime", "spike", 1, {"seconds": 0.2})])
    started = time.monotonic()
    emu.session().GetServerDateAndTime()
    assert time.monotonic() - started >= 0.2
    [record] = emu.control.faults_injected()
    assert (record["kind"], record["params"], record["outcome"]) == ("spike", {"seconds": 0.2}, "applied")
    with pytest.raises(ValueError, match=r"\(method, kind\[, count\[, params\]\]\)"):
        Emulator(faults=[("GetServerDateAndTime",)])
