"""Error classification: contention, transient and fatal failures are told apart."""

from __future__ import annotations

import socket

import pytest
from cloudshell.api.common_cloudshell_api import CloudShellAPIError, UnauthorizedError
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError, ReadTimeoutError

from cloudshell_mutex.classify import ErrorKind, classify


def api(message: str, code: str = "100") -> CloudShellAPIError:
    return CloudShellAPIError(code, message, b"<Response/>")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (api("Service with given alias already exists"), ErrorKind.CONTENTION),
        (api("Service with given alias already exists", code="102"), ErrorKind.FATAL),  # code must be 100 too
        (api("Reservation 'abc' was not found"), ErrorKind.NOT_ACTIVE),
        (api("Reservation 'abc' has ended"), ErrorKind.NOT_ACTIVE),
        (api("Service model 'Mutex Service' was not found in the catalog"), ErrorKind.NOT_INSTALLED),
        (
            api("Attribute 'Mutex Label' is not defined on service model 'Mutex Service'"),
            ErrorKind.NOT_INSTALLED,
        ),
        (api("Service with alias 'MUTEX' was not found in reservation 'abc'"), ErrorKind.ALIAS_MISSING),
        (api("User does not have permission to perform this operation"), ErrorKind.PERMISSION),
        (api("Transaction (Process ID 52) was deadlocked on lock resources"), ErrorKind.TRANSIENT),
        (api("Command 'Foo' does not exist", code="101"), ErrorKind.FATAL),
        (UnauthorizedError("(Unauthorized) [401] reason:Unauthorized"), ErrorKind.PERMISSION),
        (Exception("(Internal Server Error) [500] reason:Internal Server Error"), ErrorKind.TRANSIENT),
        (Exception("(Service Unavailable) [503] reason:Service Unavailable"), ErrorKind.TRANSIENT),
        (Exception("(Not Found) [404] reason:Not Found"), ErrorKind.FATAL),
        (ProtocolError("Connection aborted.", ConnectionResetError()), ErrorKind.TRANSIENT),
        (ReadTimeoutError(None, "/x", "Read timed out."), ErrorKind.TRANSIENT),
        (socket.timeout("timed out"), ErrorKind.TRANSIENT),
        (ConnectionResetError(), ErrorKind.TRANSIENT),
        (ValueError("bad"), ErrorKind.FATAL),
    ],
)
def test_kinds(exc, kind):
    assert classify(exc).kind is kind


def test_api_error_keeps_code_and_message():
    result = classify(api("Something odd", code="151"))
    assert (result.kind, result.code, result.message) == (ErrorKind.FATAL, "151", "Something odd")


def test_requests_that_never_left_cannot_have_committed():
    refused = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")
    assert classify(refused).maybe_committed is False
    assert classify(MaxRetryError(None, "/x", refused)).maybe_committed is False
    dropped = ProtocolError("Connection aborted.", ConnectionResetError())
    assert classify(dropped).maybe_committed is True
    assert classify(Exception("(Internal Server Error) [500] reason:x")).maybe_committed is True
