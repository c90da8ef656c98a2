"""The emulator's wire format against the real client's own serializer and parser (no server)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import OrderedDict

import pytest
from cloudshell.api.cloudshell_api import (
    AttributeNameValue,
    CloudShellAPISession,
    GetReservationDescriptionResponseInfo,
    ResourceInfo,
    SetConnectorRequest,
)
from cloudshell.api.common_cloudshell_api import CommonAPIRequest, CommonApiResult

from cloudshell_mutex.emulator.methods import METHODS, CallContext
from cloudshell_mutex.emulator.state import ApiError, EmulatorState
from cloudshell_mutex.emulator.wire import (
    Info,
    Params,
    RequestError,
    failure_response,
    format_datetime,
    node,
    parse_authorization,
    parse_request,
    success_response,
)


def client() -> CloudShellAPISession:
    """A client object for its (de)serialization methods only; it never connects."""
    return object.__new__(CloudShellAPISession)


def serialize(method: str, **params) -> bytes:
    return client()._serialize_request(OrderedDict(params), method).encode("utf-8")


def client_parse(body: bytes) -> CommonApiResult:
    api = client()
    return api._deserialize_response(api._remove_xml_namespace(body))


def test_scalars_lists_and_name_values_as_the_client_sends_them():
    body = serialize(
        "AddServiceToReservation",
        reservationId="r-1",
        serviceName="Mutex Service",
        alias="MUTEX",
        attributes=CommonAPIRequest.toContainer([AttributeNameValue("Mutex Owner", "a & <b>")]),
    )
    params = parse_request(body, "AddServiceToReservation")
    assert params.text("reservationId") == "r-1"
    assert params.text("alias") == "MUTEX"
    assert params.name_values("attributes") == [("Mutex Owner", "a & <b>")]


def test_empty_list_bool_and_int_parameters():
    body = serialize(
        "X",
        attributes=CommonAPIRequest.toContainer([]),
        disableCache=True,
        shared=False,
        durationInMinutes=15,
    )
    params = parse_request(body, "X")
    assert params.name_values("attributes") == []
    assert params.flag("disableCache") is True
    assert params.flag("shared") is False
    assert params.number("durationInMinutes") == 15


def test_string_lists_and_request_objects():
    body = serialize(
        "X",
        services=["MUTEX", "OTHER"],
        connectors=CommonAPIRequest.toContainer([SetConnectorRequest("a", "b", "bi", "link")]),
    )
    params = parse_request(body, "X")
    assert params.strings("services") == ["MUTEX", "OTHER"]
    assert params.records("connectors") == [
        {"SourceResourceFullName": "a", "TargetResourceFullName": "b", "Direction": "bi", "Alias": "link"}
    ]


def test_parameters_are_required_unless_a_default_is_given():
    params = parse_request(b"<X><alias /></X>", "X")
    assert params.text("alias") == ""  # present and empty: the client sends '' like this
    with pytest.raises(RequestError, match="parameter 'reservationId' is missing"):
        params.text("reservationId")
    with pytest.raises(RequestError, match="parameter 'services' is missing"):
        params.strings("services")
    assert params.text("domainName", "") == ""
    assert params.name_values("attributes", required=False) == []


def test_bad_requests_are_refused_clearly():
    with pytest.raises(RequestError, match="not valid XML"):
        parse_request(b"<X>", "X")
    with pytest.raises(RequestError, match="URL names 'Y'"):
        parse_request(b"<X/>", "Y")
    with pytest.raises(RequestError, match="true or false"):
        parse_request(b"<X><flag>maybe</flag></X>", "X").flag("flag")


def test_failure_envelope_is_read_by_the_client_as_code_and_message():
    result = client_parse(
        failure_response("AddServiceToReservation", "100", "Service with given alias already exists")
    )
    assert result.success is False
    assert result.error_code == "100"
    assert result.error == "Service with given alias already exists"


def test_success_envelope_becomes_the_typed_response_class():
    info = node(
        "ReservationDescription",
        {"Id": "r-1", "Name": "test", "Booked": True},
        [
            node(
                "Services",
                children=[
                    node(
                        "Service",
                        {"ServiceName": "Mutex Service", "Alias": "MUTEX"},
                        [
                            node(
                                "Attributes",
                                children=[node("Attribute", {"Name": "Mutex Owner", "Value": ""})],
                            )
                        ],
                    )
                ],
            )
        ],
    )
    result = client_parse(
        success_response("GetReservationDetails", Info("GetReservationDescriptionResponseInfo", [info]))
    )
    assert result.success is True
    assert isinstance(result.response_info, GetReservationDescriptionResponseInfo)
    description = result.response_info.ReservationDescription
    assert (description.Id, description.Booked) == ("r-1", True)
    service = description.Services[0]
    assert (service.ServiceName, service.Alias) == ("Mutex Service", "MUTEX")
    assert [(a.Name, a.Value) for a in service.Attributes] == [("Mutex Owner", "")]
    assert description.Resources == [] and description.Connectors == []


def test_response_info_fields_are_attributes_so_empty_strings_stay_strings():
    """An empty child element would reach the client as None; an empty attribute stays ''."""
    body = success_response(
        "CreateResource",
        Info(
            "ResourceInfo",
            [node("ResourceAttributes", children=[node("ResourceAttribute", {"Name": "A", "Value": ""})])],
            {"Name": "sw1", "Description": "", "Locked": False, "Version": 1},
        ),
    )
    assert b'<ResponseInfo xsi:type="ResourceInfo" Name="sw1"' in body
    info = client_parse(body).response_info
    assert isinstance(info, ResourceInfo)
    assert (info.Name, info.Description, info.Locked, info.Version) == ("sw1", "", False, 1)
    assert [(a.Name, a.Value) for a in info.ResourceAttributes] == [("A", "")]


def test_success_without_response_info_is_what_the_client_returns_raw():
    body = success_response("AddServiceToReservation")
    assert client_parse(body).response_info is None
    assert b'Success="true"' in body


def test_authorization_header_token():
    assert parse_authorization("MachineName=host:8029;Token=abc") == "abc"
    assert parse_authorization("MachineName=host:8029;Token=") is None
    assert parse_authorization(None) is None


def test_datetime_follows_the_clients_dotnet_format():
    moment = dt.datetime(2026, 1, 2, 15, 4, 5, 678000, tzinfo=dt.timezone.utc)
    assert format_datetime(moment, "MM/dd/yyyy HH:mm") == "01/02/2026 15:04"
    assert format_datetime(moment, "yyyy-MM-dd HH:mm:ss.fff") == "2026-01-02 15:04:05.678"
    assert format_datetime(moment, "hh:mm tt") == "03:04 PM"


class _RecordingParams(Params):
    """Params that remember which names a handler read."""

    def __init__(self, values) -> None:
        super().__init__(values)
        self.read = set()

    def _get(self, name, default):
        self.read.add(name)
        return super()._get(name, default)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_handlers_read_only_parameters_the_client_sends(method: str):
    """Every emulated method, called through the real client with its defaults: the emulator reads
    the parameters by the names the client serializes, and requires none that the client leaves out."""
    api = client()
    api.use_webapi_endpoint = False
    sent = {}

    def capture(kwargs):
        sent.update(kwargs)

    api.generateAPIRequest = capture
    getattr(api, method)()
    name = sent.pop("method_name")
    assert name == method
    params = _RecordingParams(parse_request(serialize(method, **sent), method)._values)
    state = EmulatorState("admin", "secret")
    with contextlib.suppress(ApiError):  # e.g. no such reservation: the parameters were read before that
        METHODS[method](CallContext(state, None, None), params)
    assert params.read <= set(sent), (params.read, set(sent))
    assert params.read or not sent
