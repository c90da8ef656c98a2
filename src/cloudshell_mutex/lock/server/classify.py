"""Sort an exception from the CloudShell API client into what the lock should do about it.

The original snippet treated every exception as "busy". Here each failure gets one kind:

* ``CONTENTION``: the alias is taken (code "100" *and* "already exists"); pace and retry.
* ``TRANSIENT``: HTTP 5xx (and 408, 429), connection errors, timeouts; back off, then settle with
  a fresh read, because the call may have committed before its response was lost.
* everything else is fatal for the lock and raised at once.

Only the "already exists" text of the real server is known. The other fragments below match the
emulator's messages and plausible server wording; callers confirm "reservation gone" with
``GetReservationStatus`` instead of trusting message text alone.

The client also does something behind the caller's back: it re-sends a request whose connection
failed, after 1 s and then 2 s (``common_cloudshell_api.retry``, ``max_attempts=3``). For an add that is
harmless but hides an outcome; for a remove it is dangerous. :func:`copies_sent`, :func:`may_have_resent`
and :func:`sent_once` hold what the lock needs to know about it.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import re
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

from cloudshell.api.common_cloudshell_api import CloudShellAPIError

try:
    from cloudshell.api.common_cloudshell_api import UnauthorizedError
except ImportError:  # clients before 2024.1 do not check the HTTP status (see _classify_unreadable)

    class UnauthorizedError(Exception):  # type: ignore[no-redef]
        """Stands in for the client's class, which older clients do not have (never raised by them)."""


from .. import protocol

try:  # the API client depends on urllib3; stay importable if a caller passes a look-alike API object
    from urllib3.exceptions import ConnectTimeoutError as _ConnectTimeout
    from urllib3.exceptions import HTTPError as _Urllib3Error
    from urllib3.exceptions import MaxRetryError as _MaxRetryError
    from urllib3.exceptions import NewConnectionError as _NewConnectionError
except ImportError:  # pragma: no cover
    _Urllib3Error = _MaxRetryError = _NewConnectionError = _ConnectTimeout = ()  # type: ignore


class ErrorKind(enum.Enum):
    """What a failed API call means for the lock."""

    CONTENTION = "contention"
    TRANSIENT = "transient"
    NOT_INSTALLED = "not_installed"
    NOT_ACTIVE = "not_active"
    PERMISSION = "permission"
    UNAUTHORIZED = "unauthorized"  # HTTP 401 after the client's own re-logon: the login is not valid
    ALIAS_MISSING = "alias_missing"
    FATAL = "fatal"


@dataclass(frozen=True)
class Classification:
    """The kind of a failure, plus what the caller needs to report it.

    ``maybe_committed`` is False only when the call provably changed nothing: the request never
    reached the server (connection refused, connect timeout, bad host), or the server refused it
    (a ``Success="false"`` answer, 401, other 4xx). Then a failed add needs no settling read.

    ``in_flight`` is True when no answer came from the server for the request (a reset connection, a
    read timeout, a gateway's 502 or 504): it may still be queued or on its way, and be applied
    *later* than this error. A request the server answered, even with an error, cannot land later.
    """

    kind: ErrorKind
    code: Optional[str]
    message: str
    maybe_committed: bool = True
    in_flight: bool = False


#: The client raises a plain Exception("(Internal Server Error) [500] reason:...") for non-2xx statuses
#: other than 401. Server errors, "request timeout" and "too many requests" heal with time.
_HTTP_RETRYABLE = re.compile(r"\[(5\d\d|408|429)\]")
_HTTP_4XX = re.compile(r"\[4\d\d\]")
#: A gateway answered instead of the server: the request may still be on its way to it.
_HTTP_GATEWAY = re.compile(r"\[(502|504)\]")
#: Quoted input the server echoes in its messages (a reservation id, an alias): never classified, so
#: an id that contains "already exists" or "not found" cannot make an error look like another.
_ECHOED = re.compile(r"'[^']*'|\"[^\"]*\"")

_NOT_ACTIVE_FRAGMENTS = ("has ended", "has been ended", "is not active", "already ended")
_PERMISSION_FRAGMENTS = (
    "permission",
    "not authorized",
    "unauthorized",
    "access denied",
    "not allowed",
    "privilege",
    "forbidden",
    # The client logs on again after a 401; a failed logon (expired admin token, changed password)
    # raises the server's logon error, whose wording is not documented.
    "login",
    "logon",
    "log on",
    "credential",
    "password",
    "authenticat",
)
#: Server-side hiccups that a retry fixes (SQL Server deadlock victims, timeouts inside the server).
_TRANSIENT_API_FRAGMENTS = ("deadlock", "timeout expired", "timed out", "try again")


def classify(exc: BaseException) -> Classification:
    """Return the :class:`Classification` of an exception raised by a CloudShell API call."""
    if isinstance(exc, CloudShellAPIError):
        return _classify_api_error(exc)
    # An unreadable reply comes as Exception("... reason:OK data:b'<raw reply>'"); the raw reply
    # of a (re-)logon holds the session token, so it never goes into messages or logs.
    message = str(exc).split(" data:", 1)[0]
    if isinstance(exc, UnauthorizedError):
        # The client already logged on again once and retried; a second 401 means the login itself
        # is no longer accepted (an expired or revoked token), which waiting will not heal.
        return Classification(ErrorKind.UNAUTHORIZED, None, message, maybe_committed=False)
    if isinstance(exc, ValueError) and _Urllib3Error and isinstance(exc, _Urllib3Error):
        # A bad host (LocationValueError): configuration, not a hiccup, so fatal at once rather
        # than retried until the timeout. Nothing was sent.
        return Classification(ErrorKind.FATAL, None, message, maybe_committed=False)
    if type(exc) is Exception and message.startswith(_OLD_CLIENT_PREFIX):
        return _classify_unreadable(message)
    if _is_transport_error(exc):
        sent = not _never_sent(exc)
        return Classification(ErrorKind.TRANSIENT, None, message, maybe_committed=sent, in_flight=sent)
    if type(exc) is Exception and _HTTP_RETRYABLE.search(message):
        gateway = _HTTP_GATEWAY.search(message) is not None
        return Classification(ErrorKind.TRANSIENT, None, message, in_flight=gateway)
    # Other statuses: refused before anything happened. A 2xx whose body is empty or unreadable
    # (also a plain Exception) is another matter: the call may well have committed.
    refused = type(exc) is Exception and _HTTP_4XX.search(message) is not None
    return Classification(
        ErrorKind.FATAL, None, f"{type(exc).__name__}: {message}", maybe_committed=not refused
    )


#: Clients before 2024.1 read any answer as XML; a non-XML body (a 401 or 500 page) raises this.
_OLD_CLIENT_PREFIX = "Invalid Request: "
_OLD_CLIENT_UNAUTHORIZED = ("401", "unauthorized", "log on again", "logon again")


def _classify_unreadable(message: str) -> Classification:
    """An old client's ``Exception("Invalid Request: <body>")``: the server answered with something that
    is not an API answer. Such clients neither log on again after a 401 nor tell 401 from 500 apart, so
    the body decides: a 401 page means the login is not (or no longer) accepted; anything else is taken
    for a server error, which may heal and may have committed (the server answered: it cannot land later).
    """
    body = message[len(_OLD_CLIENT_PREFIX) :][:200]
    if any(fragment in body.lower() for fragment in _OLD_CLIENT_UNAUTHORIZED):
        return Classification(ErrorKind.UNAUTHORIZED, None, f"HTTP 401: {body}", maybe_committed=False)
    return Classification(ErrorKind.TRANSIENT, None, f"an answer that is not an API answer: {body}")


def _classify_api_error(exc: CloudShellAPIError) -> Classification:
    code = None if exc.code is None else str(exc.code)
    message = exc.message or ""
    text = _ECHOED.sub("''", message).lower()

    def kind_of() -> ErrorKind:
        # Code 100 is generic: "Resource 'x' already exists" is not contention. The documented text
        # names the service alias.
        if (
            code == protocol.CONTENTION_ERROR_CODE
            and protocol.CONTENTION_MESSAGE_FRAGMENT in text
            and ("alias" in text or text.startswith("service"))
        ):
            return ErrorKind.CONTENTION
        if any(fragment in text for fragment in _TRANSIENT_API_FRAGMENTS):
            return ErrorKind.TRANSIENT
        if "not found" in text and "service model" in text:
            return ErrorKind.NOT_INSTALLED
        if "is not defined on service model" in text or ("attribute" in text and "not defined" in text):
            return ErrorKind.NOT_INSTALLED
        if "not found" in text and "alias" in text:
            return ErrorKind.ALIAS_MISSING
        # The reservation itself, not something "in reservation 'x'" that was not found.
        if text.startswith("reservation") and ("not found" in text or "does not exist" in text):
            return ErrorKind.NOT_ACTIVE
        if any(fragment in text for fragment in _NOT_ACTIVE_FRAGMENTS):
            return ErrorKind.NOT_ACTIVE
        if any(fragment in text for fragment in _PERMISSION_FRAGMENTS):
            return ErrorKind.PERMISSION
        return ErrorKind.FATAL

    kind = kind_of()
    # The server answered Success="false": it refused the call, unless the failure was a hiccup
    # inside it (a deadlock victim, a timeout), which may strike after the change.
    return Classification(kind, code, message, maybe_committed=kind is ErrorKind.TRANSIENT)


def _is_transport_error(exc: BaseException) -> bool:
    # socket.timeout and ConnectionError are OSError subclasses; http.client raises
    # RemoteDisconnected/IncompleteRead when the server closes without a full response.
    transport = (socket.timeout, TimeoutError, ConnectionError, http.client.HTTPException)
    if isinstance(exc, transport):
        return True
    return bool(_Urllib3Error) and isinstance(exc, _Urllib3Error)


def _never_sent(exc: BaseException) -> bool:
    """True when the request cannot have reached the server (so it cannot have committed)."""
    if not _Urllib3Error:  # pragma: no cover
        return isinstance(exc, ConnectionRefusedError)
    reason = exc.reason if isinstance(exc, _MaxRetryError) else exc
    return isinstance(reason, (_NewConnectionError, _ConnectTimeout, ConnectionRefusedError))


# ---------------------------------------------------------------- the client's hidden re-send

#: The client's first re-send comes this many seconds after a failed copy. A call that took this
#: long may hide such a re-send, so an earlier copy of it may have committed.
CLIENT_RETRY_DELAY = 1.0

_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def may_have_resent(elapsed: float) -> bool:
    """True when a call that took ``elapsed`` seconds may include a re-send by the client (what the lock
    assumes when :func:`copies_sent` cannot tell)."""
    return elapsed >= CLIENT_RETRY_DELAY


class _Copies(threading.local):
    """The copies of the current call that this thread's client sent: for each, whether it may have reached
    the server (False: the connection was refused or never made, so nothing of it can commit)."""

    reached: Optional[List[bool]] = None


_copies = _Copies()


class _CountingPool:
    """The client's connection pool (``api._http``), telling :func:`copies_sent` about each copy of a request
    the client sends (its retry loop calls ``request`` once per copy). Everything else is the pool's own."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def request(self, *args: Any, **kwargs: Any) -> Any:
        """The pool's ``request``, noting whether this copy may have reached the server."""
        try:
            response = self._pool.request(*args, **kwargs)
        except BaseException as error:
            _note(not _never_sent(error))
            raise
        _note(True)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _note(reached: bool) -> None:
    if _copies.reached is not None:
        _copies.reached.append(reached)


@contextlib.contextmanager
def copies_sent(api: Any) -> Iterator[Optional[List[bool]]]:
    """For one call on ``api`` in this thread: yields a list that, once the call returned or raised, holds one
    entry per copy the client sent (True: it may have reached the server), or None when the session is not one
    whose copies can be told (then :func:`may_have_resent` decides from the call's duration).

    A connection that was refused cannot have delivered anything: an acquire against a server that cannot be
    reached makes no request of unknown outcome (nothing to settle, nothing to warn about at exit), however
    often the client tried. The pool is wrapped once per session, and only counts: it changes no request."""
    pool = getattr(api, "_http", None)
    if pool is None or not callable(getattr(pool, "request", None)):
        yield None
        return
    if not isinstance(pool, _CountingPool):
        with _locks_guard:  # two threads may wrap the same session at once: wrap it once
            if not isinstance(api._http, _CountingPool):
                api._http = _CountingPool(api._http)
    outer, _copies.reached = _copies.reached, []
    try:
        yield _copies.reached
    finally:
        _copies.reached = outer


@contextlib.contextmanager
def sent_once(api: Any) -> Iterator[bool]:
    """Turn off the client's own re-send for one call (the remove); yield whether one may still happen.

    If a remove commits and its reply is lost, the client re-sends it 1 s later; by then a waiter
    may have added the alias, and the re-sent remove deletes the *waiter's* lock. So the remove goes
    out once, and the lock retries it itself, only after a fresh read shows the alias is still ours.
    ``_attempts`` is the session's private copy of ``max_attempts``; it is set back afterwards, under
    a per-session lock so that concurrent removes on one session cannot restore the wrong value.
    """
    if not isinstance(getattr(api, "_attempts", None), int):
        yield True  # not a CloudShellAPISession: whatever it does, it cannot be turned off
        return
    with _locks_guard:
        lock = _locks.setdefault(api, threading.Lock())
    with lock:
        saved, api._attempts = api._attempts, 1
        try:
            yield False
        finally:
            api._attempts = saved
