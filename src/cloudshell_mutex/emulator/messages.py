"""Every error text the emulator sends, in one place: the registry the lock's tests can check against.

A :class:`Message` has a ``name``, a ``code`` (the ``<ErrorCode>`` of a ``Success="false"`` answer, or
the HTTP status for ``layer="http"``/``"quali"`` texts), a ``template`` with named fields, and an
``origin``: ``"documented"`` for the one text CloudShell documents (code 100 "Service with given alias
already exists"), ``"guess"`` for everything else. Like the real server, messages echo the caller's
input (a reservation id, an alias), so render them with the fields filled in::

    render("reservation_not_found", reservation_id="abc")   # "Reservation 'abc' was not found"
    MESSAGES["reservation_not_found"].example()              # rendered with example fields

Each message also has a ``reworded`` template (a different, still sensible wording with the same fields
and code) that the emulator sends in its ``reword_errors`` mode, so tests can show that a client does
not depend on guessed text. The documented text is never reworded. This module knows nothing about any
client of the emulator.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

#: Generic error code (the real server uses it for unrelated failures too).
GENERIC_ERROR = "100"
UNKNOWN_COMMAND_ERROR = "101"
CONNECTOR_NOT_FOUND_ERROR = "123"

DOCUMENTED = "documented"
GUESS = "guess"

#: The one documented error text (code 100): the alias is taken.
DUPLICATE_ALIAS = "Service with given alias already exists"


def _fields(template: str) -> Tuple[str, ...]:
    return tuple(sorted({name for _, name, _, _ in string.Formatter().parse(template) if name}))


@dataclass(frozen=True)
class Message:
    """One error text the emulator can send: where it appears, its code, its wording(s), its origin."""

    name: str
    code: str
    template: str
    reworded: str
    example_fields: Mapping[str, Any] = field(default_factory=dict)
    origin: str = GUESS
    #: ``"api"``: a ``Success="false"`` answer; ``"http"``: an Automation API HTTP error body;
    #: ``"quali"``: a Quali API (port 9000) answer.
    layer: str = "api"
    note: str = ""

    @property
    def fields(self) -> Tuple[str, ...]:
        """The names of the fields the template needs."""
        return _fields(self.template)

    def render(self, reword: bool = False, **fields: Any) -> str:
        """The text with ``fields`` filled in (``reword``: the alternative wording)."""
        missing = sorted(set(self.fields) - set(fields))
        if missing:
            raise ValueError(f"message {self.name!r} needs the fields {missing}")
        return (self.reworded if reword else self.template).format(**fields)

    def example(self, reword: bool = False) -> str:
        """The text rendered with its example fields."""
        return self.render(reword, **self.example_fields)

    def matches(self, text: str, reword: bool = False) -> bool:
        """True when ``text`` is this message with some fields filled in (in either wording if
        ``reword`` is None)."""
        wordings = (False, True) if reword is None else (reword,)
        return any(_pattern(self.reworded if r else self.template).fullmatch(text) for r in wordings)


def _pattern(template: str) -> re.Pattern[str]:
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name:
            parts.append("(?s:.*?)")
    return re.compile("".join(parts))


_RID = {"reservation_id": "0a1b2c3d-0000-4000-8000-00000000abcd"}

_MESSAGES = (
    Message(
        "duplicate_alias",
        GENERIC_ERROR,
        DUPLICATE_ALIAS,
        DUPLICATE_ALIAS,
        origin=DOCUMENTED,
        note="the lock protocol's contention answer; never reworded",
    ),
    Message(
        "logon_failed",
        GENERIC_ERROR,
        "Login failed for user '{user}'. Please make sure the username and password are correct.",
        "User '{user}' could not be authenticated: wrong user name or password.",
        {"user": "admin"},
    ),
    Message(
        "token_invalid",
        GENERIC_ERROR,
        "Login failed: the token is not valid. Log on with a valid token.",
        "Authentication token rejected; request a new token and log on again.",
    ),
    Message(
        "domain_not_found",
        GENERIC_ERROR,
        "Domain '{domain}' was not found",
        "There is no domain named '{domain}'",
        {"domain": "Sales"},
    ),
    Message(
        "logon_domain_denied",
        GENERIC_ERROR,
        "User '{user}' has no access to domain '{domain}'",
        "Login refused: '{user}' is not a member of any group of domain '{domain}'",
        {"user": "alice", "domain": "Sales"},
        note="stricter: a user logs on only to a domain one of their groups is linked to (admins: any)",
    ),
    Message(
        "user_not_found",
        GENERIC_ERROR,
        "User '{user}' was not found",
        "There is no user named '{user}'",
        {"user": "alice"},
    ),
    Message(
        "user_details_denied",
        GENERIC_ERROR,
        "User '{caller}' may not read the details of user '{user}'",
        "Permission denied: '{caller}' is not allowed to read the details of '{user}'",
        {"caller": "alice", "user": "bob"},
        note="stricter: GetUserDetails of another user needs a system admin; one's own details are readable",
    ),
    Message(
        "duration_not_positive",
        GENERIC_ERROR,
        "Reservation duration must be a positive number of minutes",
        "Invalid duration: a reservation must last at least one minute",
    ),
    Message(
        "reservation_not_found",
        GENERIC_ERROR,
        "Reservation '{reservation_id}' was not found",
        "No reservation with id '{reservation_id}' exists",
        _RID,
    ),
    Message(
        "reservation_ended",
        GENERIC_ERROR,
        "Reservation '{reservation_id}' has ended",
        "Sandbox '{reservation_id}' is no longer active; it cannot be changed",
        _RID,
        note="changes to an ended reservation (the real wording is not documented)",
    ),
    Message(
        "service_model_not_found",
        GENERIC_ERROR,
        "Service model '{model}' was not found in the catalog",
        "Unknown service '{model}': it is not in the service catalog",
        {"model": "Mutex Service"},
    ),
    Message(
        "attribute_not_on_model",
        GENERIC_ERROR,
        "Attribute '{attribute}' is not defined on service model '{model}'",
        "Service '{model}' has no attribute named '{attribute}'",
        {"attribute": "Mutex Owner", "model": "Mutex Service"},
    ),
    Message(
        "service_not_found",
        GENERIC_ERROR,
        "Service with alias '{alias}' was not found in reservation '{reservation_id}'",
        "Reservation '{reservation_id}' contains no service called '{alias}'",
        {"alias": "MUTEX", **_RID},
    ),
    Message(
        "alias_not_allowed",
        GENERIC_ERROR,
        "Alias '{alias}' contains invalid characters",
        "'{alias}' is not a valid service alias",
        {"alias": "MUTEX~r1"},
        note="sent only in the tilde_aliases='refused' mode",
    ),
    Message(
        "resource_name_empty",
        GENERIC_ERROR,
        "Resource name must not be empty",
        "A resource needs a name",
    ),
    Message(
        "resource_model_not_found",
        GENERIC_ERROR,
        "Resource model '{model}' was not found in the catalog",
        "Unknown resource model '{model}'",
        {"model": "Switch Model"},
    ),
    Message(
        "resource_model_wrong_family",
        GENERIC_ERROR,
        "Resource model '{model}' does not belong to family '{family}'",
        "Family '{family}' has no model called '{model}'",
        {"model": "Switch Model", "family": "Router"},
    ),
    Message(
        "resource_not_found",
        GENERIC_ERROR,
        "Resource '{name}' was not found",
        "No resource named '{name}' exists",
        {"name": "sw1"},
    ),
    Message(
        "resource_exists",
        GENERIC_ERROR,
        "Resource '{name}' already exists",
        "The name '{name}' is taken by another resource",
        {"name": "sw1"},
        note="contains 'already exists' with code 100, like contention: a client must look at more than that",
    ),
    Message(
        "resource_not_in_reservation",
        GENERIC_ERROR,
        "Resource '{name}' is not in reservation '{reservation_id}'",
        "'{name}' is not part of reservation '{reservation_id}'",
        {"name": "sw1", **_RID},
    ),
    Message(
        "connector_direction_invalid",
        GENERIC_ERROR,
        "Connector direction '{direction}' is not valid; use 'bi' or 'uni'",
        "Unknown connector direction '{direction}' (expected 'bi' or 'uni')",
        {"direction": "both"},
    ),
    Message(
        "endpoints_not_paired",
        GENERIC_ERROR,
        "Endpoints must come in pairs: source, target, source, target, ...",
        "Give connector endpoints as source/target pairs",
    ),
    Message(
        "connector_not_found",
        CONNECTOR_NOT_FOUND_ERROR,
        "Connector between '{a}' and '{b}' was not found in reservation '{reservation_id}'",
        "Reservation '{reservation_id}' has no connector from '{a}' to '{b}'",
        {"a": "sw1", "b": "sw2", **_RID},
        note="code 123 is seen in public code; the text is a guess",
    ),
    Message(
        "unknown_command",
        UNKNOWN_COMMAND_ERROR,
        "Command '{method}' does not exist",
        "The API has no command called '{method}'",
        {"method": "NoSuchCommand"},
        note="code 101 is seen in public code; the text is a guess",
    ),
    Message(
        "invalid_request",
        GENERIC_ERROR,
        "Invalid request: {problem}",
        "The request could not be read: {problem}",
        {"problem": "parameter 'reservationId' is missing"},
    ),
    Message(
        "deadlock_victim",
        GENERIC_ERROR,
        "Transaction (Process ID {process_id}) was deadlocked on lock resources with another process and has "
        "been chosen as the deadlock victim. Rerun the transaction.",
        "The database chose this request (process {process_id}) as a deadlock victim; run it again.",
        {"process_id": 57},
        note="SQL Server's wording, as the server could pass it on: a transient failure (transient_false)",
    ),
    # ---------------------------------------------------------------- HTTP-level texts (port 8029)
    Message(
        "http_unauthorized",
        "401",
        "Unauthorized: the token is missing, unknown or expired; log on again",
        "Not authenticated: log on to get a valid token",
        layer="http",
        note="the client looks only at the status (401: re-logon), never at this body",
    ),
    Message(
        "http_injected_error",
        "500",
        "Internal Server Error (injected fault before commit)",
        "The server failed to process the request (injected fault before commit)",
        layer="http",
    ),
    Message(
        "http_internal_error",
        "500",
        "emulator internal error in {method}: {error}",
        "the emulator failed in {method}: {error}",
        {"method": "GetServerDateAndTime", "error": "RuntimeError('bug')"},
        layer="http",
        note="an emulator bug, never a simulated server behaviour",
    ),
    Message(
        "http_no_endpoint",
        "404",
        "No such endpoint: {path}",
        "Nothing is served at {path}",
        {"path": "/nowhere"},
        layer="http",
    ),
    Message(
        "http_chunked_body",
        "411",
        "send the request body with a Content-Length (chunked bodies are not supported)",
        "a Content-Length is required (chunked request bodies are refused)",
        layer="http",
    ),
    Message(
        "http_bad_length",
        "400",
        "Content-Length is not a number: {value}",
        "the Content-Length header {value} is not a number",
        {"value": "'abc'"},
        layer="http",
    ),
    Message(
        "http_body_too_large",
        "413",
        "request body too large: {length} bytes (at most {limit})",
        "the request body of {length} bytes exceeds the limit of {limit}",
        {"length": 70000000, "limit": 67108864},
        layer="http",
    ),
    Message(
        "http_body_timeout",
        "408",
        "the request body did not arrive within {seconds:g} s",
        "gave up waiting {seconds:g} s for the request body",
        {"seconds": 30.0},
        layer="http",
    ),
    # ---------------------------------------------------------------- Quali API (port 9000)
    Message(
        "quali_login_failed",
        "401",
        "Login failed: the username or password is not correct",
        "Authentication failed for the given user name and password",
        layer="quali",
    ),
    Message(
        "quali_unauthorized",
        "401",
        "Unauthorized: log in through /API/Auth/Login first",
        "Not logged in: call /API/Auth/Login for a token",
        layer="quali",
    ),
    Message(
        "quali_import_not_admin",
        "200",
        "Importing packages requires a system administrator",
        "Only system administrators may import packages",
        layer="quali",
        note="HTTP 200 with {'Success': false, 'ErrorMessage': ...}, as the real import answers failures",
    ),
    Message(
        "quali_import_no_file",
        "200",
        "No package file in the request (multipart field 'file')",
        "The upload holds no package file (multipart field 'file')",
        layer="quali",
    ),
)

#: Every message, by name.
MESSAGES: Dict[str, Message] = {message.name: message for message in _MESSAGES}


def render(name: str, /, reword: bool = False, **fields: Any) -> str:
    """The text of message ``name`` with ``fields`` filled in; ``reword``: the alternative wording."""
    try:
        message = MESSAGES[name]
    except KeyError:
        raise ValueError(f"no message called {name!r}; known: {sorted(MESSAGES)}") from None
    return message.render(reword, **fields)


class ApiError(Exception):
    """An API-level failure: the client raises ``CloudShellAPIError(code, message)`` for it.

    Build it from the registry with :meth:`of`; ``ApiError(code, message)`` is for texts outside it.
    """

    def __init__(self, code: str, message: str, name: str = "", fields: Mapping[str, Any] = ()) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.name = name
        self.fields = dict(fields)

    @classmethod
    def of(cls, name: str, /, **fields: Any) -> ApiError:
        """The error for registry message ``name`` with ``fields`` (the default wording in ``.message``)."""
        return cls(MESSAGES[name].code, render(name, **fields), name, fields)

    def text(self, reword: bool = False) -> str:
        """The message as sent: reworded when asked and the message comes from the registry."""
        if reword and self.name:
            return render(self.name, True, **self.fields)
        return self.message
