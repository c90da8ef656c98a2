"""The emulator's Automation API over HTTP with the unmodified CloudShellAPISession."""

from __future__ import annotations

import re
import time
from collections import OrderedDict

import pytest
from cloudshell.api.cloudshell_api import (
    AttributeNameValue,
    CloudShellAPISession,
    CreateReservationResponseInfo,
    GetReservationDescriptionResponseInfo,
    LogonResponseInfo,
    ServicesListInfo,
    SetConnectorRequest,
)
from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from cloudshell_mutex.emulator import Emulator, EmulatorControlError
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DEFAULT_ALIAS, DUPLICATE_ALIAS_MESSAGE, SERVICE_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture
def emu(cloudshell_emulator: Emulator) -> Emulator:
    cloudshell_emulator.add_service_model(SERVICE_MODEL, {ATTR_OWNER: "", "Mutex Label": "none"})
    return cloudshell_emulator


@pytest.fixture
def api(emu: Emulator) -> CloudShellAPISession:
    return emu.session()


def api_error(func, *args) -> CloudShellAPIError:
    with pytest.raises(CloudShellAPIError) as info:
        func(*args)
    return info.value


def owner(value: str):
    return [AttributeNameValue(ATTR_OWNER, value)]


def test_logon_returns_typed_token_and_user(emu: Emulator, api: CloudShellAPISession):
    info = api.Logon(emu.admin_user, emu.admin_password, emu.admin_domain)
    assert isinstance(info, LogonResponseInfo)
    assert info.Token.Token and info.User.Name == "admin" and info.User.IsAdmin is True
    assert info.Domain.Name == "Global"


def test_wrong_password_is_an_api_error_at_construction(emu: Emulator):
    with pytest.raises(CloudShellAPIError) as info:
        emu.session(password="wrong")
    assert "Login failed" in info.value.message and "wrong" not in info.value.message


def test_secure_logon_with_an_issued_token(emu: Emulator):
    api = emu.session(username="", password="", token_id=emu.control.issue_token())
    assert api.GetServerDateAndTime().ServerDateTime
    with pytest.raises(CloudShellAPIError, match="token is not valid"):
        emu.session(username="", password="", token_id="forged")


def test_call_without_valid_token_gets_401_and_client_logs_on_again(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    emu.control.reset_counts()
    assert emu.control.revoke_sessions() >= 1
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    # First attempt refused (401), then Logon, then the retried call.
    assert emu.control.call_counts() == {"AddServiceToReservation": 2, "Logon": 1}
    assert [e["op"] for e in emu.control.events(rid)] == ["service_added"]


def test_expired_tokens_also_relogon_through_the_client(emu: Emulator):
    emu.control.configure(token_ttl=0.2)
    api = emu.session()
    time.sleep(0.3)
    emu.control.reset_counts()
    assert api.GetServerDateAndTime().ServerDateTime
    assert emu.control.call_counts() == {"GetServerDateAndTime": 2, "Logon": 1}


def test_secure_logon_session_relogons_with_its_token(emu: Emulator):
    api = emu.session(username="", password="", token_id=emu.control.issue_token())
    emu.control.revoke_sessions()
    emu.control.reset_counts()
    assert api.GetServerDateAndTime().ServerDateTime
    assert emu.control.call_counts() == {"GetServerDateAndTime": 2, "SecureLogon": 1}


def test_reservation_lifecycle(emu: Emulator, api: CloudShellAPISession):
    created = api.CreateImmediateReservation("lock test", "admin", 30)
    assert isinstance(created, CreateReservationResponseInfo)
    rid = created.Reservation.Id
    assert created.Reservation.Name == "lock test" and created.Reservation.Owner == "admin"
    assert api.GetReservationStatus(rid).ReservationSlimStatus.Status == "Started"
    assert rid in [r.Id for r in api.GetCurrentReservations("admin").Reservations]
    assert rid not in [r.Id for r in api.GetCurrentReservations("somebody-else").Reservations]
    api.EndReservation(rid)
    assert rid not in [r.Id for r in api.GetCurrentReservations("").Reservations]
    assert emu.control.reservation(rid)["status"] == "Completed"


def test_ended_and_unknown_reservations_fail_every_reservation_call(emu: Emulator, api: CloudShellAPISession):
    emu.control.configure(ended_reservations="closed")  # the stricter mode: reads fail too
    rid = emu.create_reservation()
    api.GetReservationDetails(rid)  # a cached snapshot must not outlive the reservation either
    api.EndReservation(rid)
    calls = [
        (api.GetReservationDetails, rid, True),
        (api.GetReservationDetails, rid, False),
        (api.GetReservationStatus, rid),
        (api.AddServiceToReservation, rid, SERVICE_MODEL, DEFAULT_ALIAS, []),
        (api.RemoveServicesFromReservation, rid, [DEFAULT_ALIAS]),
        (api.SetServiceAttributesValues, rid, DEFAULT_ALIAS, owner("x")),
        (api.GetReservationServicesPositions, rid),
        (api.WriteMessageToReservationOutput, rid, "hi"),
        (api.AddResourcesToReservation, rid, ["r1"]),
        (api.RemoveResourcesFromReservation, rid, ["r1"]),
        (api.SetConnectorsInReservation, rid, [SetConnectorRequest("a", "b", "bi", "")]),
        (api.RemoveConnectorsFromReservation, rid, ["a", "b"]),
        (api.EndReservation, rid),
    ]
    for func, *args in calls:
        error = api_error(func, *args)
        assert (error.code, error.message) == ("100", f"Reservation '{rid}' has ended"), func.__name__
        error = api_error(func, "no-such-id", *args[1:])
        assert (error.code, error.message) == ("100", "Reservation 'no-such-id' was not found"), func.__name__


def test_ended_reservations_answer_reads_and_refuse_changes_by_default(
    emu: Emulator, api: CloudShellAPISession
):
    assert emu.control.settings()["ended_reservations"] == "readable"
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("holder"))
    api.EndReservation(rid)
    assert api.GetReservationStatus(rid).ReservationSlimStatus.Status == "Completed"
    details = api.GetReservationDetails(rid, True).ReservationDescription
    assert details.Status == "Completed"
    assert [s.Alias for s in details.Services] == [DEFAULT_ALIAS]
    assert [p.ResourceName for p in api.GetReservationServicesPositions(rid).ResourceDiagramLayouts] == [
        DEFAULT_ALIAS
    ]
    changes = [
        (api.AddServiceToReservation, rid, SERVICE_MODEL, "OTHER", []),
        (api.RemoveServicesFromReservation, rid, [DEFAULT_ALIAS]),
        (api.SetServiceAttributesValues, rid, DEFAULT_ALIAS, owner("x")),
        (api.WriteMessageToReservationOutput, rid, "hi"),
        (api.EndReservation, rid),
    ]
    for func, *args in changes:
        error = api_error(func, *args)
        assert (error.code, error.message) == ("100", f"Reservation '{rid}' has ended"), func.__name__
    error = api_error(api.GetReservationDetails, "no-such-id", True)
    assert error.message == "Reservation 'no-such-id' was not found"


def test_duplicate_alias_is_contention(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    raw = api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("first"))
    assert isinstance(raw, bytes) and b'Success="true"' in raw
    error = api_error(api.AddServiceToReservation, rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("second"))
    assert (error.code, error.message) == ("100", DUPLICATE_ALIAS_MESSAGE)
    assert isinstance(error.rawxml, bytes)
    assert str(error) == f"CloudShell API error 100: {DUPLICATE_ALIAS_MESSAGE}"


def test_add_service_validates_model_and_attributes(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    error = api_error(api.AddServiceToReservation, rid, "Nope Service", DEFAULT_ALIAS, [])
    assert error.message == "Service model 'Nope Service' was not found in the catalog"
    error = api_error(
        api.AddServiceToReservation, rid, SERVICE_MODEL, DEFAULT_ALIAS, [AttributeNameValue("X", "1")]
    )
    assert error.message == f"Attribute 'X' is not defined on service model '{SERVICE_MODEL}'"
    assert emu.control.events(rid) == []


def test_details_are_typed_and_defaults_fill_missing_attributes(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    details = api.GetReservationDetails(rid, True)
    assert isinstance(details, GetReservationDescriptionResponseInfo)
    description = details.ReservationDescription
    assert description.Id == rid and description.Status == "Started"
    [service] = description.Services
    assert (service.ServiceName, service.Alias) == (SERVICE_MODEL, DEFAULT_ALIAS)
    assert {a.Name: a.Value for a in service.Attributes} == {ATTR_OWNER: "me", "Mutex Label": "none"}
    assert service.Attributes[0].Name == ATTR_OWNER and service.Attributes[0].Value == "me"


def test_details_have_the_shape_of_an_answer_captured_from_a_real_server(
    emu: Emulator, api: CloudShellAPISession
):
    """Scalars as attributes, SetupStage as a child element, ReservationLiveStatus, and list elements
    present even when empty (as in the GetReservationDetails answer in cloudshell-orch-core's tests)."""
    import urllib.request
    from xml.etree import ElementTree

    rid = emu.create_reservation("shape")
    request = urllib.request.Request(
        f"{emu.api_url}/ResourceManagerApiService/GetReservationDetails",
        data=f"<GetReservationDetails><reservationId>{rid}</reservationId></GetReservationDetails>".encode(),
        headers={"Authorization": f"MachineName=test;Token={api.authentication.xmlrpc_token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        root = ElementTree.fromstring(response.read())
    ns = "{http://schemas.qualisystems.com/ResourceManagement/ApiCommandResult.xsd}"
    description = root.find(f"{ns}ResponseInfo/{ns}ReservationDescription")
    assert (description.get("Id"), description.get("Booked"), description.get("Status")) == (
        rid,
        "true",
        "Started",
    )
    assert description.find(f"{ns}SetupStage").text == "None"
    assert description.find(f"{ns}ReservationLiveStatus").get("ReservationId") == rid
    for empty_list in ("Resources", "Conflicts", "Connectors", "Services"):
        element = description.find(f"{ns}{empty_list}")
        assert element is not None and len(element) == 0, empty_list
    typed = api.GetReservationDetails(rid, True).ReservationDescription
    assert (typed.SetupStage, typed.ReservationLiveStatus.ReservationId) == ("None", rid)
    assert (typed.Services, typed.Resources, typed.Connectors, typed.Conflicts) == ([], [], [], [])


def test_cached_details_answer_each_caller_in_its_own_datetime_format(emu: Emulator):
    """The cache keeps the reservation, not the first caller's rendered answer."""
    rid = emu.create_reservation()
    us = emu.session(datetimeformat="MM/dd/yyyy HH:mm")
    iso = emu.session(datetimeformat="yyyy-MM-dd HH:mm:ss")
    assert re.fullmatch(
        r"\d\d/\d\d/\d{4} \d\d:\d\d", us.GetReservationDetails(rid).ReservationDescription.StartTime
    )
    start = iso.GetReservationDetails(rid).ReservationDescription.StartTime  # from the cache
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", start), start


def test_missing_parameters_are_clear_api_errors(api: CloudShellAPISession):
    error = api_error(
        api.generateAPIRequest,
        OrderedDict([("method_name", "AddServiceToReservation"), ("serviceName", SERVICE_MODEL)]),
    )
    assert (error.code, error.message) == ("100", "Invalid request: parameter 'reservationId' is missing")
    error = api_error(api.generateAPIRequest, OrderedDict([("method_name", "RemoveServicesFromReservation"),
                                                            ("reservationId", "r")]))  # fmt: skip
    assert error.message == "Invalid request: parameter 'services' is missing"


def test_details_cache_is_a_five_second_snapshot(emu: Emulator, api: CloudShellAPISession):
    assert emu.control.settings()["details_cache_seconds"] == 5.0
    rid = emu.create_reservation()
    assert api.GetReservationDetails(rid).ReservationDescription.Services == []  # snapshot taken
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("me"))
    assert api.GetReservationDetails(rid).ReservationDescription.Services == []  # stale: the v2 weakness
    assert api.GetReservationDetails(rid, False).ReservationDescription.Services == []
    fresh = api.GetReservationDetails(rid, True).ReservationDescription.Services
    assert [s.Alias for s in fresh] == [DEFAULT_ALIAS]
    emu.control.configure(details_cache_seconds=0.2)
    time.sleep(0.25)
    assert [s.Alias for s in api.GetReservationDetails(rid).ReservationDescription.Services] == [
        DEFAULT_ALIAS
    ]


def test_set_attributes_and_remove(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, owner("a"))
    api.SetServiceAttributesValues(rid, DEFAULT_ALIAS, owner("b"))
    [service] = api.GetReservationDetails(rid, True).ReservationDescription.Services
    assert {a.Name: a.Value for a in service.Attributes}[ATTR_OWNER] == "b"
    error = api_error(api.SetServiceAttributesValues, rid, DEFAULT_ALIAS, [AttributeNameValue("Y", "1")])
    assert error.message == f"Attribute 'Y' is not defined on service model '{SERVICE_MODEL}'"
    error = api_error(api.SetServiceAttributesValues, rid, "OTHER", owner("c"))
    assert error.message == f"Service with alias 'OTHER' was not found in reservation '{rid}'"
    api.RemoveServicesFromReservation(rid, [DEFAULT_ALIAS])
    error = api_error(api.RemoveServicesFromReservation, rid, [DEFAULT_ALIAS])
    assert (error.code, error.message) == (
        "100",
        f"Service with alias '{DEFAULT_ALIAS}' was not found in reservation '{rid}'",
    )
    events = emu.control.events(rid)
    assert [(e["op"], e["attributes"][ATTR_OWNER]) for e in events] == [
        ("service_added", "a"),
        ("service_attributes_set", "b"),
        ("service_removed", "b"),
    ]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert all(e["user"] == "admin" and e["model"] == SERVICE_MODEL for e in events)


def test_get_services_lists_catalog_models_with_attributes(emu: Emulator, api: CloudShellAPISession):
    emu.control.configure(catalog="permissive")  # the strict default hides a family without a category
    services = api.GetServices("", SERVICE_MODEL)
    assert isinstance(services, ServicesListInfo)
    [info] = services.Services
    assert info.Name == SERVICE_MODEL
    assert [(a.Name, a.DefaultValue) for a in info.Attributes] == [(ATTR_OWNER, ""), ("Mutex Label", "none")]
    assert api.GetServices("", "Unknown Model").Services == []
    assert [s.Name for s in api.GetServices("", "").Services] == [SERVICE_MODEL]


def test_service_positions_list_aliases(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, "A", [])
    api.AddServiceToReservation(rid, SERVICE_MODEL, "B", [])
    layouts = api.GetReservationServicesPositions(rid).ResourceDiagramLayouts
    assert [layout.ResourceName for layout in layouts] == ["A", "B"]
    assert all(isinstance(layout.X, float) for layout in layouts)


def test_output_is_readable_through_control(emu: Emulator, api: CloudShellAPISession):
    rid = emu.create_reservation()
    api.WriteMessageToReservationOutput(rid, "waiting for MUTEX <held by x>")
    api.WriteMessageToReservationOutput(rid, "acquired")
    assert emu.control.output(rid) == ["waiting for MUTEX <held by x>", "acquired"]
    with pytest.raises(EmulatorControlError, match="does not exist"):
        emu.control.output("nope")


def test_unknown_method_is_a_clear_api_error(api: CloudShellAPISession):
    error = api_error(api.generateAPIRequest, {"method_name": "MakeCoffee"})
    assert (error.code, error.message) == ("101", "Command 'MakeCoffee' does not exist")


def test_resources_and_connectors(emu: Emulator, api: CloudShellAPISession):
    emu.add_resource_model("Switch Model", family="Switch", attributes={"Vendor": "acme"})
    created = api.CreateResource("Switch", "Switch Model", "sw1", "10.0.0.1", "", "", "a switch")
    assert (created.Name, created.ResourceModelName, created.Address) == ("sw1", "Switch Model", "10.0.0.1")
    assert [(a.Name, a.Value) for a in created.ResourceAttributes] == [("Vendor", "acme")]
    bare = api.CreateResource("Switch", "Switch Model", "sw2", "10.0.0.2", "", "", "")
    # Empty fields arrive as '' (not None) and the domain is the caller's, as from a real server.
    assert (bare.Description, bare.FolderFullPath, bare.DriverName) == ("", "", "")
    assert (bare.CreatedInDomain, bare.Locked, bare.Version) == ("Global", False, 1)
    assert (
        "already exists" in api_error(api.CreateResource, "", "Switch Model", "sw1", "", "", "", "").message
    )
    assert (
        "not found in the catalog" in api_error(api.CreateResource, "", "Nope", "x", "", "", "", "").message
    )

    rid = emu.create_reservation()
    api.AddServiceToReservation(rid, SERVICE_MODEL, DEFAULT_ALIAS, [])
    assert api.AddResourcesToReservation(rid, ["sw1", "sw2"]).Conflicts == []
    error = api_error(api.SetConnectorsInReservation, rid, [SetConnectorRequest("sw1", "sw9", "bi", "")])
    assert (error.code, error.message) == ("100", f"Resource 'sw9' is not in reservation '{rid}'")
    api.SetConnectorsInReservation(
        rid,
        [
            SetConnectorRequest("sw1", "sw2", "bi", "uplink"),
            SetConnectorRequest("sw1", DEFAULT_ALIAS, "uni", ""),
        ],
    )
    description = api.GetReservationDetails(rid, True).ReservationDescription
    assert sorted(r.Name for r in description.Resources) == ["sw1", "sw2"]
    assert [(c.Source, c.Target, c.Direction, c.Alias) for c in description.Connectors] == [
        ("sw1", "sw2", "bi", "uplink"),
        ("sw1", DEFAULT_ALIAS, "uni", ""),
    ]
    api.RemoveConnectorsFromReservation(rid, ["sw2", "sw1"])
    error = api_error(api.RemoveConnectorsFromReservation, rid, ["sw2", "sw1"])
    assert error.code == "123" and "was not found" in error.message
    other = emu.create_reservation()
    conflicts = api.AddResourcesToReservation(other, ["sw1"]).Conflicts
    assert [(c.ResourceName, c.ConflictWith) for c in conflicts] == [("sw1", rid)]
    api.RemoveResourcesFromReservation(rid, ["sw1"])
    error = api_error(api.RemoveResourcesFromReservation, rid, ["sw1"])
    assert error.message == f"Resource 'sw1' is not in reservation '{rid}'"
    snapshot = emu.control.reservation(rid)
    assert snapshot["resources"] == ["sw2"] and snapshot["connectors"] == []


def test_control_rejects_bad_settings_clearly(emu: Emulator):
    with pytest.raises(EmulatorControlError, match="distribution 'zipf' is not known"):
        emu.control.configure(latency={"distribution": "zipf"})
    with pytest.raises(EmulatorControlError, match="unknown settings"):
        emu.control.configure(colour="red")
    with pytest.raises(EmulatorControlError, match="fault kind"):
        emu.control.inject_fault("AddServiceToReservation", "explode")
    with pytest.raises(EmulatorControlError, match="latency must be a mapping"):
        emu.control.configure(latency=[0.1])
    with pytest.raises(EmulatorControlError, match="details_cache_seconds must be a number, got 'soon'"):
        emu.control.configure(details_cache_seconds="soon")
    with pytest.raises(EmulatorControlError, match="fault count must be a whole number"):
        emu.control.inject_fault("AddServiceToReservation", "drop_after_commit", "2")  # type: ignore[arg-type]
    assert emu.control.faults() == {}  # nothing was half-applied


@pytest.mark.parametrize(
    "op, body, message",
    [
        ("inject_fault", b'{"kind": "x"}', "the field 'method' is missing"),
        ("import_package", b'{"zip_base64": "not base64!"}', "zip_base64 must be the package zip in base64"),
    ],
)
def test_control_says_what_is_wrong_with_a_request(emu: Emulator, op: str, body: bytes, message: str):
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{emu.api_url}/_emulator/{op}", data=body)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    assert json.loads(info.value.read()) == {"error": message}


def test_stop_closes_keep_alive_connections(cloudshell_emulator_factory):
    emu = cloudshell_emulator_factory()
    api = emu.session(max_attempts=1)
    assert api.GetServerDateAndTime().ServerDateTime
    emu.stop()
    with pytest.raises(Exception):  # noqa: B017 - any connection failure; the point is: no answer
        api.GetServerDateAndTime()


def test_control_endpoint_refuses_non_loopback_clients(emu: Emulator):
    """The handler, fed a request that claims a remote client address (tests bind loopback only)."""
    import socket

    from cloudshell_mutex.emulator.server import ApiRequestHandler, ApiServer

    server = ApiServer(("127.0.0.1", 0), emu.runtime)
    try:
        for client_ip, expected in (("192.0.2.7", b"403"), ("127.0.0.1", b"200")):
            with socket.create_server(("127.0.0.1", 0)) as listener:
                ours = socket.create_connection(listener.getsockname())
                theirs, _ = listener.accept()
            with ours, theirs:
                ours.sendall(b"POST /_emulator/settings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                ours.shutdown(socket.SHUT_WR)
                ApiRequestHandler(theirs, (client_ip, 40000), server)
                theirs.shutdown(socket.SHUT_WR)
                status_line = ours.makefile("rb").readline()
            assert status_line.split()[1] == expected, (client_ip, status_line)
    finally:
        server.server_close()


def test_control_client_pickles_for_other_processes(emu: Emulator, api: CloudShellAPISession):
    import pickle

    api.GetServerDateAndTime()
    control = pickle.loads(pickle.dumps(emu.control))
    assert control.base_url == emu.api_url
    assert control.call_counts()["GetServerDateAndTime"] == 1
