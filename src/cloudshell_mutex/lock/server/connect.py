"""Opening a CloudShell API session, and one line that says which setting to fix when it cannot be opened.

``CloudShellAPISession`` logs on in its constructor, so a wrong host, port, token, user, password or domain
surfaces there as a raw client exception: a urllib3 ``MaxRetryError`` after the client's three tries (each
logged by urllib3 as a retry warning), a ``CloudShellAPIError`` about a token, or an HTTP status from
something that is not the Automation API. :func:`open_session` turns each into a :class:`SessionFailure`
whose message names the setting, in the words of whoever passes :class:`SettingNames`: the CLI names its
flags, the driver mixin its context's fields, and the sentences are the same.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Set

from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from .classify import ErrorKind, classify

try:  # urllib3 2 tells an unknown host apart; 1.x words it in the message only
    from urllib3.exceptions import NameResolutionError as _NameResolution
except ImportError:  # pragma: no cover
    _NameResolution = ()  # type: ignore[assignment,misc]
try:
    from urllib3.exceptions import ConnectTimeoutError as _ConnectTimeout
    from urllib3.exceptions import MaxRetryError as _MaxRetry
    from urllib3.exceptions import NewConnectionError as _NewConnection
except ImportError:  # pragma: no cover
    _ConnectTimeout = _MaxRetry = _NewConnection = ()  # type: ignore[assignment,misc]

__all__ = ["AUTOMATION_API_PORT", "SessionFailure", "SettingNames", "describe_failure", "open_session"]

#: Where the Automation API listens by default, and the Quali API (package import), its usual mix-up.
AUTOMATION_API_PORT = 8029
QUALI_API_PORT = 9000
#: What a resolver says of a host it does not know (urllib3 1.x has no class for it).
_UNKNOWN_HOST = re.compile(
    r"name or service not known|getaddrinfo failed|nodename nor servname|no address", re.I
)
#: Longest server text quoted in a message.
_MAX_SERVER_TEXT = 200


@dataclass(frozen=True)
class SettingNames:
    """How the user names each connection setting, for messages: the CLI's flags, a driver context's
    fields. ``who`` says as whom the session logs on (never a secret)."""

    host: str
    port: str
    credentials: str
    domain: str
    who: str


class SessionFailure(Exception):
    """The session could not be opened. ``logon`` is True when the server answered and refused the logon
    (credentials or domain), False when it could not be reached or was not the Automation API."""

    def __init__(self, message: str, logon: bool) -> None:
        super().__init__(message)
        self.logon = logon


class _QuietRetries(logging.Filter):
    """Drops urllib3's "Retrying ..." warnings of the threads that are opening a session: the failure is
    told once, by the line this module words (nine retry warnings used to come before it)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: Set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.threads


_QUIET = _QuietRetries()
_QUIET_GUARD = threading.Lock()
logging.getLogger("urllib3.connectionpool").addFilter(_QUIET)


@contextlib.contextmanager
def _quiet_retries() -> Iterator[None]:
    me = threading.get_ident()
    with _QUIET_GUARD:
        _QUIET.threads.add(me)
    try:
        yield
    finally:
        with _QUIET_GUARD:
            _QUIET.threads.discard(me)


def open_session(
    make: Callable[[], Any],
    host: str,
    port: int,
    domain: str,
    names: SettingNames,
    secrets: tuple = (),
) -> Any:
    """``make()`` (a ``CloudShellAPISession`` constructor call, which logs on), or :class:`SessionFailure`
    naming the setting to fix. ``secrets`` (a password, a token) are masked in any server text quoted."""
    try:
        with _quiet_retries():
            return make()
    except Exception as error:
        raise describe_failure(error, host, port, domain, names, secrets) from None


def describe_failure(
    error: BaseException, host: str, port: int, domain: str, names: SettingNames, secrets: tuple = ()
) -> SessionFailure:
    """The :class:`SessionFailure` for ``error``, raised while logging on to ``host:port`` in ``domain``."""
    where = f"the CloudShell Automation API at {host}:{port}"
    ports = f"the Automation API, {AUTOMATION_API_PORT} by default; not the Quali API's {QUALI_API_PORT}"
    text = _server_text(error, secrets)
    failure = classify(error)
    if isinstance(error, CloudShellAPIError) or failure.kind is ErrorKind.UNAUTHORIZED:
        return SessionFailure(
            f"logon to {where} failed {names.who} in domain {domain!r}: {text}; "
            f"check {names.credentials} and {names.domain}",
            logon=True,
        )
    reason = error.reason if _MaxRetry and isinstance(error, _MaxRetry) else error
    if (_NameResolution and isinstance(reason, _NameResolution)) or _UNKNOWN_HOST.search(str(reason)):
        return SessionFailure(
            f"cannot connect to {where}: no host is known by the name {host!r}; check {names.host}",
            logon=False,
        )
    if _ConnectTimeout and isinstance(reason, _ConnectTimeout) and not isinstance(reason, _NewConnection):
        return SessionFailure(
            f"cannot connect to {where}: no answer to the connection (a wrong host, or a firewall); "
            f"check {names.host} and {names.port} ({ports})",
            logon=False,
        )
    if _answered(text):
        return SessionFailure(
            f"cannot connect to {where}: something answered there, but not as the Automation API ({text}); "
            f"check {names.port} ({ports})",
            logon=False,
        )
    if failure.kind is ErrorKind.TRANSIENT:
        return SessionFailure(
            f"cannot connect to {where}: nothing answers there ({text}); check {names.host} and {names.port} "
            f"({ports}), and that the server runs",
            logon=False,
        )
    return SessionFailure(
        f"cannot connect to {where}: {text}; check {names.host} and {names.port} ({ports})", logon=False
    )


def _answered(text: str) -> bool:
    """True when ``text`` is an HTTP status or a reply that is not an API answer: something listens there."""
    return bool(re.search(r"\[\d{3}\]", text)) or "not an API answer" in text


def _server_text(error: BaseException, secrets: tuple) -> str:
    failure = classify(error)
    text = failure.message
    reason = getattr(error, "reason", None)
    if _MaxRetry and isinstance(error, _MaxRetry) and reason is not None:
        text = str(reason).split(": ", 1)[-1]  # the cause, not urllib3's "Max retries exceeded with url"
    for secret in secrets:
        if secret:
            text = text.replace(str(secret), "********")
    text = " ".join(text.split()).rstrip(". ")
    return text if len(text) <= _MAX_SERVER_TEXT else text[: _MAX_SERVER_TEXT - 3] + "..."
