"""The reservation lock for orchestration scripts (setup, teardown, any sandbox script).

Works with a cloudshell-orch-core ``Sandbox`` or any object with ``.automation_api`` (a
``CloudShellAPISession``) and ``.id`` (the reservation id); it does not import orch-core::

    from cloudshell.workflow.orchestration.sandbox import Sandbox
    from cloudshell_mutex.orchestration import (
        report_left_behind_lock, sandbox_mutex, with_sandbox_mutex, write_sandbox_output,
    )

    sandbox = Sandbox()
    with sandbox_mutex(sandbox, owner="Setup"):
        ...                                              # one block under the lock

    sandbox.workflow.add_to_configuration(with_sandbox_mutex(configure_routers), None)  # a whole step
    sandbox.workflow.add_to_teardown(report_left_behind_lock, None)                     # teardown report
    write_sandbox_output(sandbox, f"Teardown left the connectors alone: {timeout}")    # a safe output line
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional, Tuple, TypeVar, cast

from cloudshell_mutex import MutexError, ReservationMutex, ReservationRWLock
from cloudshell_mutex.lock.holder import Holder
from cloudshell_mutex.lock.nesting import CommandMutex
from cloudshell_mutex.lock.protocol import check_lock_name
from cloudshell_mutex.lock.server.alias import LockAlias
from cloudshell_mutex.lock.text import MAX_OUTPUT_LENGTH, one_line

__all__ = [
    "report_left_behind_lock",
    "sandbox_lock",
    "sandbox_mutex",
    "sandbox_rwlock",
    "with_sandbox_mutex",
    "write_sandbox_output",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Lock options that suit scripts: people watch the sandbox's output pane while setup runs.
SCRIPT_DEFAULTS = {"progress": True}


def _sandbox_parts(sandbox: Any) -> Tuple[Any, str]:
    api = getattr(sandbox, "automation_api", None)
    reservation_id = getattr(sandbox, "id", None)
    if api is None or not isinstance(reservation_id, str) or not reservation_id.strip():
        raise TypeError(
            f"sandbox must be a cloudshell-orch-core Sandbox or an object with .automation_api (a "
            f"CloudShellAPISession) and .id (the reservation id), got {type(sandbox).__name__}"
        )
    return api, reservation_id.strip()


def sandbox_lock(
    sandbox: Any, owner: str = "orchestration", name: str = "MUTEX", **options: Any
) -> ReservationMutex:
    """A :class:`ReservationMutex` on the sandbox's reservation, not acquired yet.

    Uses the sandbox's session and its ``logger`` (when it has one); writes "waiting for ..." to the
    sandbox output while it waits (``progress=True`` unless given). Options go to :class:`ReservationMutex`.
    A helper that takes the same lock while the step holds it is served by the step's acquisition once one
    read shows it still held (:mod:`cloudshell_mutex.lock.nesting`). A helper thread that takes it must run
    in ``contextvars.copy_context()``: it is then refused at once, instead of waiting for its own step.
    """
    api, reservation_id = _sandbox_parts(sandbox)
    for key, value in SCRIPT_DEFAULTS.items():
        options.setdefault(key, value)
    if "logger" not in options and getattr(sandbox, "logger", None) is not None:
        options["logger"] = sandbox.logger
    return CommandMutex(api, reservation_id, owner=owner, name=name, **options)


def sandbox_rwlock(
    sandbox: Any, owner: str = "orchestration", name: str = "MUTEX", **options: Any
) -> ReservationRWLock:
    """A :class:`ReservationRWLock` on the sandbox's reservation: ``with sandbox_rwlock(sandbox).read():``
    for steps that only look at the sandbox, ``.write()`` for steps that change it. Same defaults and
    options as :func:`sandbox_lock` (plus ``max_readers``)."""
    api, reservation_id = _sandbox_parts(sandbox)
    for key, value in SCRIPT_DEFAULTS.items():
        options.setdefault(key, value)
    if "logger" not in options and getattr(sandbox, "logger", None) is not None:
        options["logger"] = sandbox.logger
    return ReservationRWLock(api, reservation_id, owner=owner, name=name, **options)


@contextlib.contextmanager
def sandbox_mutex(
    sandbox: Any, owner: str = "orchestration", name: str = "MUTEX", **options: Any
) -> Iterator[ReservationMutex]:
    """Hold the sandbox's reservation lock for the ``with`` block; yields the held lock.

    ``owner`` labels the holder for people ("Setup", "Teardown"); ``name`` is the lock's alias. Every
    other option goes to :class:`ReservationMutex` (``timeout``, ``pacing``, ...). Raises what
    :meth:`ReservationMutex.acquire` raises (:class:`MutexTimeout` and friends); never runs the block
    without the lock.
    """
    with sandbox_lock(sandbox, owner, name, **options) as lock:
        yield lock


def with_sandbox_mutex(
    function: Optional[_F] = None, *, owner: Optional[str] = None, name: str = "MUTEX", **options: Any
) -> Any:
    """Wrap a workflow function ``fn(sandbox, components)`` so the whole step runs under the lock.

    Bare (``with_sandbox_mutex(fn)``, ``@with_sandbox_mutex``) or with options
    (``with_sandbox_mutex(owner="Routers", timeout=900)(fn)``). The owner label defaults to the function's
    name. Steps of one stage run in parallel threads in orch-core; wrapped steps take turns, and so do
    drivers and other scripts that use the same alias.
    """

    check_lock_name(name)  # when the script defines the step, not when the stage runs it

    def decorate(step: _F) -> _F:
        label = owner if owner is not None else step.__name__

        @functools.wraps(step)
        def run_locked(sandbox: Any, components: Any) -> Any:
            with sandbox_mutex(sandbox, label, name, **options):
                return step(sandbox, components)

        return cast(_F, run_locked)

    if function is not None:
        if not callable(function):  # @with_sandbox_mutex("Setup"): the alias given positionally
            raise TypeError("with_sandbox_mutex takes its options by keyword: @with_sandbox_mutex(owner=...)")
        return decorate(function)
    return decorate


def report_left_behind_lock(sandbox: Any, components: Any = None, name: str = "MUTEX") -> Optional[Holder]:
    """Report a lock still held when teardown runs: who holds it and when that was seen (server time).

    Writes one line to the sandbox output (and its logger) and returns the :class:`Holder`, or returns
    None when the lock is free. It only reports: it never removes the lock, because a holder may still be
    working (a command that outlived its caller) and removing it would let a second party in. Taking over
    a left-behind lock is the job of leases and an explicit force release, not of teardown.

    Signature ``(sandbox, components)`` so that it is a workflow function itself:
    ``sandbox.workflow.add_to_teardown(report_left_behind_lock, None)``. A failed read is reported, not
    raised, so that teardown goes on.
    """
    api, reservation_id = _sandbox_parts(sandbox)
    logger = getattr(sandbox, "logger", None)
    lock = ReservationMutex(api, reservation_id, owner="teardown check", name=name, logger=logger)
    try:
        holder = lock.holder()
    except MutexError as error:
        _report(sandbox, logger, f"Could not check whether the {name} lock was left behind: {error}")
        return None
    if holder is None:
        return None
    seen_at = _server_time(api)
    parts = [f"The {name} lock was left behind: held by {holder.label}"]
    heartbeat = holder.attributes.get("Mutex Heartbeat", "")
    if heartbeat:
        parts.append(f"(last heartbeat {heartbeat})")
    parts.append(f"as seen at {seen_at} (server time)." if seen_at else "as seen now.")
    parts.append(
        "Teardown only reports it and does not remove it. If its holder is gone, an admin removes it with "
        "the Mutex Service's Force Release command (with a reason) or cloudshell-mutex release --force."
    )
    _report(sandbox, logger, " ".join(parts))
    return holder


def write_sandbox_output(sandbox: Any, message: str, *, warning: bool = False) -> bool:
    """Write ``message`` (plain text) as one line to the sandbox's output pane; True when it was written.

    The pane renders HTML, and a message about a lock often quotes what other code wrote (a holder's label in
    a :class:`MutexTimeout`), so the line goes the lock's own way (:meth:`LockAlias.write_output
    <cloudshell_mutex.lock.server.alias.LockAlias.write_output>`): invisible characters removed, cut to a sane
    length, escaped; a ``warning`` is styled to stand out. A failed write is not raised (the output is a
    courtesy): it returns False.
    """
    api, reservation_id = _sandbox_parts(sandbox)
    output = LockAlias(api, reservation_id, logger=getattr(sandbox, "logger", None))
    return output.write_output(message, warning=warning).ok


def _server_time(api: Any) -> str:
    try:
        return str(api.GetServerDateAndTime().ServerDateTime)
    except Exception:  # the time only decorates the report; the report matters more
        return ""


def _report(sandbox: Any, logger: Any, message: str) -> None:
    """``message`` to the logger (one line) and to the output pane."""
    if logger is not None:
        logger.warning("%s", one_line(message, MAX_OUTPUT_LENGTH))
    if not write_sandbox_output(sandbox, message) and logger is not None:
        logger.warning("could not write to the reservation output")
