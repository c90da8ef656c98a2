"""The reservation lock for CloudShell drivers (cloudshell-shell-core command contexts).

A driver class lists :class:`ReservationMutexMixin` next to ``ResourceDriverInterface``; each command then
takes the lock of its own sandbox with one line::

    class RouterDriver(ResourceDriverInterface, ReservationMutexMixin):
        def change_topology(self, context):
            with self.reservation_mutex(context):
                ...

        @with_reservation_mutex(timeout=600)
        def reconnect(self, context, port):
            ...  # the whole command runs under the lock

The session is built from the context's connectivity (server address, admin token and **the context's
API port**: shell-core's ``CloudShellSessionContext`` always uses 8029), the reservation from
``context.reservation`` or, for remote commands, ``context.remote_reservation``, the logger from
shell-core's ``LoggingSessionContext`` when it is installed, and the owner label from the resource's
name and the command's name. Sessions are reused per (server, port, token) by one driver object and
closed by :meth:`ReservationMutexMixin.close_reservation_mutex_sessions`; the token is never logged.
The lock's sessions have a socket timeout (``reservation_mutex_api_timeout``), so a hung call cannot outlive
the lock's timeout; :meth:`ReservationMutexMixin.cloudshell_api` gives the command its own session without
one, as CloudShell's does, because commands such as ``ExecuteCommand`` may run for long.

A command that declares ``cancellation_context`` (and ``EnableCancellation="true"`` in drivermetadata.xml)
gets CloudShell's Stop button: the lock picks that argument up by itself and stops waiting within a second
of it, raising :class:`~cloudshell_mutex.MutexCancelled`. The work under a held lock is never interrupted.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar, Union, cast

from cloudshell_mutex import (
    MutexError,
    MutexPermissionError,
    MutexUsageError,
    ReservationMutex,
    ReservationRWLock,
)
from cloudshell_mutex.lock.cohort.cohort import CohortMutex, cohort_available
from cloudshell_mutex.lock.nesting import CommandCohortMutex, CommandMutex
from cloudshell_mutex.lock.protocol import check_lock_name
from cloudshell_mutex.lock.server.connect import SessionFailure, SettingNames, open_session

__all__ = ["ReservationMutexMixin", "context_reservation", "with_reservation_mutex"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: The CloudShell API port when the context names none (CloudShell's own default).
DEFAULT_API_PORT = 8029
#: Sessions one driver object keeps open at most (one per server/port/token; tokens change rarely).
MAX_CACHED_SESSIONS = 8
#: The argument shell-core fills with the command's ``CancellationContext`` (the portal's Stop button).
CANCELLATION_ARGUMENT = "cancellation_context"

#: (scheme, host, port, domain, token, socket timeout)
_SessionKey = Tuple[str, str, int, str, str, Optional[float]]

#: A command context's connection settings, as messages name them (the CLI names its flags in the same words).
CONTEXT_SETTINGS = SettingNames(
    host="the context's connectivity.server_address",
    port="connectivity.cloudshell_api_port",
    credentials=(
        "the context's connectivity.admin_auth_token (pass the context CloudShell gave this command: its "
        "token is for that server)"
    ),
    domain="reservation.domain",
    who="with the context's admin token",
)


def context_reservation(context: Any) -> Any:
    """The reservation details of a driver command context.

    ``context.reservation`` for a ``ResourceCommandContext``, ``context.remote_reservation`` for a
    ``ResourceRemoteCommandContext``. Raises :class:`MutexUsageError` for contexts that belong to no
    sandbox (``AutoLoadCommandContext``, ``InitCommandContext``, ``UnreservedResourceCommandContext``).
    """
    for field in ("reservation", "remote_reservation"):
        reservation = getattr(context, field, None)
        if reservation is not None and str(getattr(reservation, "reservation_id", "") or "").strip():
            return reservation
    raise MutexUsageError(
        f"a {type(context).__name__} belongs to no reservation, so it has no reservation lock: take the lock "
        "only in commands that run in a sandbox (ResourceCommandContext or ResourceRemoteCommandContext), "
        "not in initialize, get_inventory (autoload) or commands on unreserved resources"
    )


def _api_port(connectivity: Any) -> int:
    value = getattr(connectivity, "cloudshell_api_port", None)
    if value in (None, ""):
        return DEFAULT_API_PORT
    try:
        port = int(str(value).strip())
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise MutexUsageError(
            f"the context's connectivity.cloudshell_api_port is {value!r}; it must be the CloudShell API "
            f"port (a number from 1 to 65535, {DEFAULT_API_PORT} by default)"
        )
    return port


def _session_key(context: Any, domain: str, timeout: Optional[float]) -> _SessionKey:
    connectivity = getattr(context, "connectivity", None)
    host = str(getattr(connectivity, "server_address", "") or "").strip()
    token = str(getattr(connectivity, "admin_auth_token", "") or "")
    if not host or not token:
        raise MutexUsageError(
            "the context's connectivity has no server_address or admin_auth_token; pass the context that "
            "CloudShell gave the command (not a hand-made one without connectivity)"
        )
    scheme = str(getattr(connectivity, "cloudshell_api_scheme", "") or "http").strip().lower()
    return scheme, host, _api_port(connectivity), domain, token, timeout


def _open_session(key: _SessionKey) -> Any:
    """A session logged on with the context's token; a context that cannot log on (a wrong server, port,
    token or domain) gets one line that names the context's field to check, not the client's exception."""
    from cloudshell.api.cloudshell_api import CloudShellAPISession

    scheme, host, port, domain, token, timeout = key
    extra = {} if timeout is None else {"timeout": timeout}  # urllib3's socket timeout; the client sets none

    def logon() -> Any:
        return CloudShellAPISession(
            host=host,
            username=None,
            password=None,
            domain=domain,
            token_id=token,
            port=port,
            cloudshell_api_scheme=scheme,
            **extra,
        )

    try:
        return open_session(logon, host, port, domain, CONTEXT_SETTINGS, secrets=(token,))
    except SessionFailure as failure:
        kind = MutexPermissionError if failure.logon else MutexError
        raise kind(str(failure)) from None


def _close_session(api: Any) -> None:
    # CloudShellAPISession has no close(); its connections live in a urllib3 PoolManager.
    pool = getattr(api, "_http", None)
    if pool is not None and callable(getattr(pool, "clear", None)):
        pool.clear()


def _context_logger(context: Any) -> Optional[logging.Logger]:
    try:
        from cloudshell.shell.core.session.logging_session import LoggingSessionContext
    except ImportError:  # shell-core is the [driver] extra; without it the lock logs nowhere
        return None
    try:
        return LoggingSessionContext.get_logger_with_thread_id(context)
    except Exception:  # a context shell-core does not know (a subclass, a test double): no log file
        return None


def _calling_frame(depth: int) -> Any:
    """The frame of whoever called the caller of this function, ``depth`` calls further up (None past the
    top)."""
    frame = inspect.currentframe()
    for _ in range(depth + 2):
        frame = frame.f_back if frame is not None else None
    return frame


def _calling_command(frame: Any) -> str:
    return frame.f_code.co_name if frame is not None else ""


def _calling_cancellation(frame: Any) -> Any:
    """The ``cancellation_context`` argument of the command in ``frame`` (shell-core passes it to commands
    that declare it), or None."""
    if frame is None:
        return None
    code = frame.f_code
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return frame.f_locals.get(CANCELLATION_ARGUMENT) if CANCELLATION_ARGUMENT in arguments else None


class ReservationMutexMixin:
    """Gives a CloudShell driver :meth:`reservation_mutex`: the lock of the sandbox a command runs in.

    List it next to ``ResourceDriverInterface`` in the driver's bases. It keeps no state that the driver
    must initialise; call :meth:`close_reservation_mutex_sessions` from the driver's ``cleanup()``.
    ``reservation_mutex_api_timeout`` (seconds, None = none) is the socket timeout of the locks'
    sessions, so that a hung call cannot outlive the lock's timeout.
    """

    reservation_mutex_api_timeout: Optional[float] = 60.0
    #: Cohort mode (docs/protocol.md, "Cohort mode"): the commands running on one execution server pass the
    #: lock among themselves without server calls. On by default; set False to turn it off for a driver.
    reservation_mutex_cohort: bool = True
    #: While a command waits, "<owner>: waiting for MUTEX held by ... for N s" goes to the sandbox output at
    #: most every ``progress_interval`` seconds (10 by default), the words scripts write: a command that waits
    #: minutes must not look hung. Set False to turn it off for a driver (or pass ``progress=False``).
    reservation_mutex_progress: bool = True

    def reservation_mutex(
        self,
        context: Any,
        name: str = "MUTEX",
        *,
        command: Optional[str] = None,
        cohort: Optional[bool] = None,
        cancellation_context: Any = None,
        **options: Any,
    ) -> Union[ReservationMutex, CohortMutex]:
        """The lock on the sandbox of this command's ``context`` (not acquired yet).

        ``name`` is the lock's service alias. ``command`` names the command in the owner label
        (default: the calling method's name); ``owner=`` replaces the whole label. Other keyword
        options go to :class:`ReservationMutex` (``timeout``, ``pacing``, ``logger``, ...), and in cohort
        mode to :class:`~cloudshell_mutex.CohortMutex` (``cohort_dir``, ``max_passes``, ...).

        A helper that takes the same lock while the command holds it (a decorated command calling a locking
        helper) is served by the command's acquisition once one read shows it still held, without waiting for
        itself; in a thread of its own, or in a second asyncio task inside at the same time, it is refused at
        once (:mod:`cloudshell_mutex.lock.nesting`). Progress lines go to the sandbox output while it waits
        (``progress=True`` unless given; the class's ``reservation_mutex_progress``).

        ``cancellation_context`` is the command's ``CancellationContext``; by default the calling command's
        own ``cancellation_context`` argument. While the lock waits, the portal's Stop ends the wait within a
        second with :class:`~cloudshell_mutex.MutexCancelled` (nothing is left in the sandbox); a held lock is
        never interrupted. ``cancellation=`` (an Event, a callable) replaces it.

        ``cohort`` (default: the class's ``reservation_mutex_cohort``, True) makes it a ``CohortMutex``:
        every command runs in its own process on an execution server, the case cohort mode is for, and it
        is safe there (a local folder; ``export()`` is refused with a clear error, so a command that
        exports its lock passes ``cohort=False``). It stays off where the platform has no OS file lock.
        """
        check_lock_name(name)  # before the session is opened
        api, reservation_id = self._lock_arguments(context, command, cancellation_context, options)
        if "options" not in options:  # a whole MutexOptions given says what it wants itself
            options.setdefault("progress", self.reservation_mutex_progress)
        if cohort is None:
            cohort = self.reservation_mutex_cohort and cohort_available()
        # The context object is the command's identity: a helper thread of the command is passed the same one.
        if cohort:
            return CommandCohortMutex(api, reservation_id, name=name, command_context=context, **options)
        return CommandMutex(api, reservation_id, name=name, command_context=context, **options)

    def reservation_rwlock(
        self,
        context: Any,
        name: str = "MUTEX",
        *,
        command: Optional[str] = None,
        cancellation_context: Any = None,
        **options: Any,
    ) -> ReservationRWLock:
        """A :class:`ReservationRWLock` on the sandbox of this command's ``context``: ``with
        self.reservation_rwlock(context).read(): ...`` for commands that only look, ``.write()`` for those
        that change the sandbox. Arguments as :meth:`reservation_mutex` (plus ``max_readers``)."""
        check_lock_name(name)  # before the session is opened
        api, reservation_id = self._lock_arguments(context, command, cancellation_context, options)
        return ReservationRWLock(api, reservation_id, name=name, **options)

    def _lock_arguments(
        self, context: Any, command: Optional[str], cancellation_context: Any, options: Dict[str, Any]
    ) -> Tuple[Any, str]:
        """The session and reservation id of ``context``; fills in ``owner``, ``logger`` and ``cancellation``
        (the calling command's, unless given) in ``options``."""
        caller = _calling_frame(1)  # the command that called reservation_mutex or reservation_rwlock
        reservation = context_reservation(context)
        reservation_id = str(reservation.reservation_id).strip()
        domain = str(getattr(reservation, "domain", "") or "Global")
        api = self._reservation_mutex_session(
            _session_key(context, domain, self.reservation_mutex_api_timeout)
        )
        if "owner" not in options:
            resource = str(getattr(getattr(context, "resource", None), "name", "") or "driver")
            label = command if command is not None else _calling_command(caller)
            options["owner"] = f"{resource} {label}".strip()
        if "logger" not in options:
            options["logger"] = _context_logger(context)
        if "cancellation" not in options:
            cancellation = (
                cancellation_context if cancellation_context is not None else _calling_cancellation(caller)
            )
            if cancellation is not None:
                options["cancellation"] = cancellation
        return api, reservation_id

    def cloudshell_api(self, context: Any, timeout: Optional[float] = None) -> Any:
        """A ``CloudShellAPISession`` for the command's own calls: what shell-core's
        ``CloudShellSessionContext`` gives, but on the context's API port; reused by this object per token.

        ``timeout`` is its socket timeout in seconds; None (the default, as in CloudShell's own sessions)
        suits calls that run for long, such as ``ExecuteCommand``.
        """
        reservation = getattr(context, "reservation", None) or getattr(context, "remote_reservation", None)
        domain = str(getattr(reservation, "domain", "") or "Global")
        return self._reservation_mutex_session(_session_key(context, domain, timeout))

    def close_reservation_mutex_sessions(self) -> None:
        """Close the API sessions this object opened (call it from the driver's ``cleanup()``)."""
        sessions = self.__dict__.pop("_reservation_mutex_sessions", None)
        for api in (sessions or {}).values():
            _close_session(api)

    def _reservation_mutex_session(self, key: _SessionKey) -> Any:
        # Commands of one driver object may run in parallel threads (SupportsConcurrentCommands).
        guard = self.__dict__.setdefault("_reservation_mutex_guard", threading.Lock())
        with guard:
            sessions: OrderedDict = self.__dict__.setdefault("_reservation_mutex_sessions", OrderedDict())
            api = sessions.get(key)
            if api is not None:
                sessions.move_to_end(key)
                return api
        # Logging on is a network call: not under the guard. Two threads may both open one; the first kept
        # wins and the other is closed.
        api = _open_session(key)
        with guard:
            sessions = self.__dict__.setdefault("_reservation_mutex_sessions", OrderedDict())
            kept = sessions.setdefault(key, api)
            if kept is not api:
                _close_session(api)
                return kept
            while len(sessions) > MAX_CACHED_SESSIONS:
                _close_session(sessions.popitem(last=False)[1])
        return api


def with_reservation_mutex(function: Optional[_F] = None, *, name: str = "MUTEX", **options: Any) -> Any:
    """Run a whole driver command under the reservation lock of its sandbox.

    Use it bare (``@with_reservation_mutex``) or with options (``@with_reservation_mutex(timeout=600)``;
    ``name`` and every :meth:`ReservationMutexMixin.reservation_mutex` option). The command must be a
    method of a :class:`ReservationMutexMixin` driver whose first argument after ``self`` is the context
    (or that takes ``context=``); the owner label names the command. A command that declares
    ``cancellation_context`` can be stopped while it waits for the lock (:meth:`reservation_mutex`).
    """

    check_lock_name(name)  # when the driver's module is imported, not at the first command

    def decorate(command: _F) -> _F:
        signature = inspect.signature(command)

        @functools.wraps(command)
        def run_locked(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(self, ReservationMutexMixin):
                raise TypeError(
                    f"@with_reservation_mutex is on {command.__qualname__}, but {type(self).__name__} does "
                    "not subclass ReservationMutexMixin: add it to the driver class's bases"
                )
            bound = signature.bind(self, *args, **kwargs)
            context = bound.arguments.get("context")
            if context is None:
                positional = list(bound.arguments.values())
                context = positional[1] if len(positional) > 1 else None
            if context is None:
                raise TypeError(f"{command.__qualname__} needs the command context as its first argument")
            cancellation = bound.arguments.get(CANCELLATION_ARGUMENT)
            lock = self.reservation_mutex(
                context, name, command=command.__name__, cancellation_context=cancellation, **options
            )
            with lock:
                return command(self, *args, **kwargs)

        return cast(_F, run_locked)

    if function is not None:
        if not callable(function):  # @with_reservation_mutex("CONFIG"): the alias given positionally
            raise TypeError(
                "with_reservation_mutex takes its options by keyword: @with_reservation_mutex(name=...)"
            )
        return decorate(function)
    return decorate
