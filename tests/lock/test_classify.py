"""Error classification: contention, transient and fatal failures are told apart."""

from __future__ import annotations

import http.client
import socket

import pytest
from cloudshell.api.common_cloudshell_api import CloudShellAPIError, UnauthorizedError
from urllib3.exceptions import (
    LocationValueError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from cloudshell_mutex.emulator.messages import DOCUMENTED, MESSAGES
from cloudshell_mutex.lock.server.classify import ErrorKind, classify


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
        (UnauthorizedError("(Unauthorized) [401] reason:Unauthorized"), ErrorKind.UNAUTHORIZED),
        (Exception("(Internal Server Error) [500] reason:Internal Server Error"), ErrorKind.TRANSIENT),
        (Exception("(Service Unavailable) [503] reason:Service Unavailable"), ErrorKind.TRANSIENT),
        (Exception("(Not Found) [404] reason:Not Found"), ErrorKind.FATAL),
        (ProtocolError("Connection aborted.", ConnectionResetError()), ErrorKind.TRANSIENT),
        (ReadTimeoutError(None, "/x", "Read timed out."), ErrorKind.TRANSIENT),
        (socket.timeout("timed out"), ErrorKind.TRANSIENT),
        (ConnectionResetError(), ErrorKind.TRANSIENT),
        (ValueError("bad"), ErrorKind.FATAL),
        (Exception("(Too Many Requests) [429] reason:Too Many Requests"), ErrorKind.TRANSIENT),
        (Exception("(Request Timeout) [408] reason:Request Timeout"), ErrorKind.TRANSIENT),
        (Exception("OK"), ErrorKind.FATAL),  # a 2xx without a body: unknown, settled by the lock
        (api("Login failed: the token has expired"), ErrorKind.PERMISSION),
        (api("Username or password is incorrect"), ErrorKind.PERMISSION),
        (LocationValueError("No host specified."), ErrorKind.FATAL),  # configuration: never heals
        (http.client.RemoteDisconnected("Remote end closed connection"), ErrorKind.TRANSIENT),
        # The server echoes input: an id or alias that reads like another error changes nothing.
        (api("Reservation 'x already exists' was not found"), ErrorKind.NOT_ACTIVE),
        (
            api("Service with alias 'permission denied' was not found in reservation 'r'"),
            ErrorKind.ALIAS_MISSING,
        ),
        (api('Reservation "deadlock" has ended'), ErrorKind.NOT_ACTIVE),
        # Clients before 2024.1 read a non-XML body (a 401 or 500 page) as "Invalid Request".
        (
            Exception("Invalid Request: b'Unauthorized: the token is missing, unknown or expired'"),
            ErrorKind.UNAUTHORIZED,
        ),
        (Exception("Invalid Request: b'Internal Server Error'"), ErrorKind.TRANSIENT),
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


@pytest.mark.parametrize(
    ("exc", "maybe_committed"),
    [
        (api("Service with given alias already exists"), False),  # the server refused the call
        (api("User does not have permission to perform this operation"), False),
        (api("Transaction (Process ID 52) was deadlocked on lock resources"), True),
        (UnauthorizedError("(Unauthorized) [401] reason:Unauthorized"), False),
        (Exception("(Not Found) [404] reason:Not Found"), False),
        (Exception("OK"), True),  # a 2xx reply without a body: the call may have committed
        (LocationValueError("No host specified."), False),
    ],
)
def test_which_failed_calls_may_have_committed(exc, maybe_committed):
    assert classify(exc).maybe_committed is maybe_committed


def test_a_raw_reply_never_reaches_the_message():
    """The client's unreadable-reply error embeds the raw body; a logon reply holds the session token."""
    raw = b'<Response CommandName="Logon"><ResponseInfo><Token Token="SESSION-TOKEN-123"/>'
    failure = classify(Exception(f"OK (OK) [200] reason:OK data:{raw!s}"))
    assert "SESSION-TOKEN-123" not in failure.message
    assert failure.kind is ErrorKind.FATAL and failure.maybe_committed


@pytest.mark.parametrize(
    ("exc", "in_flight"),
    [
        (ProtocolError("Connection aborted.", ConnectionResetError()), True),  # no answer: may land later
        (ReadTimeoutError(None, "/x", "Read timed out."), True),
        (Exception("(Bad Gateway) [502] reason:Bad Gateway"), True),  # a gateway answered, not the server
        (Exception("(Gateway Timeout) [504] reason:Gateway Timeout"), True),
        (
            Exception("(Internal Server Error) [500] reason:Internal Server Error"),
            False,
        ),  # the server answered
        (MaxRetryError(None, "/x", NewConnectionError(None, "refused")), False),  # never sent
        (api("Service with given alias already exists"), False),
    ],
)
def test_requests_without_an_answer_may_land_later(exc, in_flight):
    assert classify(exc).in_flight is in_flight


# ---------------------------------------------------------------- every message the emulator sends

#: What the lock must make of each message of the emulator's registry, as the client raises it.
EXPECTED_KINDS = {
    "duplicate_alias": ErrorKind.CONTENTION,
    "logon_failed": ErrorKind.PERMISSION,
    "token_invalid": ErrorKind.PERMISSION,
    "duration_not_positive": ErrorKind.FATAL,
    "reservation_not_found": ErrorKind.NOT_ACTIVE,
    "reservation_ended": ErrorKind.NOT_ACTIVE,
    "service_model_not_found": ErrorKind.NOT_INSTALLED,
    "attribute_not_on_model": ErrorKind.NOT_INSTALLED,
    "service_not_found": ErrorKind.ALIAS_MISSING,
    "resource_name_empty": ErrorKind.FATAL,
    "resource_model_not_found": ErrorKind.FATAL,
    "resource_model_wrong_family": ErrorKind.FATAL,
    "resource_not_found": ErrorKind.FATAL,
    "resource_exists": ErrorKind.FATAL,  # "already exists", but not code 100 + the alias text
    "resource_not_in_reservation": ErrorKind.FATAL,
    "connector_direction_invalid": ErrorKind.FATAL,
    "endpoints_not_paired": ErrorKind.FATAL,
    "connector_not_found": ErrorKind.FATAL,
    "unknown_command": ErrorKind.FATAL,
    "alias_not_allowed": ErrorKind.FATAL,  # a server that refuses "~" in aliases: the lock must not retry
    "invalid_request": ErrorKind.FATAL,
    "deadlock_victim": ErrorKind.TRANSIENT,
    "http_unauthorized": ErrorKind.UNAUTHORIZED,
    "http_injected_error": ErrorKind.TRANSIENT,
    "http_internal_error": ErrorKind.TRANSIENT,
    "http_no_endpoint": ErrorKind.FATAL,
    "http_chunked_body": ErrorKind.FATAL,
    "http_bad_length": ErrorKind.FATAL,
    "http_body_too_large": ErrorKind.FATAL,
    "http_body_timeout": ErrorKind.TRANSIENT,
    # Logon and user look-ups (the Force Release rule): the real wording is unknown, so nothing retries on
    # it; the lock stops and shows the server's message.
    "domain_not_found": ErrorKind.FATAL,
    "logon_domain_denied": ErrorKind.FATAL,
    "user_not_found": ErrorKind.FATAL,
    "user_details_denied": ErrorKind.FATAL,
}


def as_raised(message) -> BaseException:
    """The exception CloudShellAPISession raises for one of the emulator's messages."""
    text = message.example()
    if message.layer == "api":
        return api(text, code=message.code)
    status = int(message.code)
    if status == 401:
        return UnauthorizedError(f"(Unauthorized) [401] reason:{text}")
    return Exception(f"(Error) [{status}] reason:{text}")


@pytest.mark.parametrize("name", sorted(n for n, m in MESSAGES.items() if m.layer != "quali"))
def test_every_emulator_message_is_sorted_into_the_right_kind(name):
    assert name in EXPECTED_KINDS, f"a new emulator message {name!r}: say what the lock must make of it"
    assert classify(as_raised(MESSAGES[name])).kind is EXPECTED_KINDS[name]


def test_the_only_documented_text_is_the_contention():
    documented = [m for m in MESSAGES.values() if m.origin == DOCUMENTED]
    assert [m.name for m in documented] == ["duplicate_alias"]
    assert classify(as_raised(documented[0])).kind is ErrorKind.CONTENTION
