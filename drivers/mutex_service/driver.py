"""The Mutex Service driver: **Lock Status** and **Force Release** on the lock's own service in a sandbox.

CloudShell runs it on an execution server (Python 3.9) from the driver zip in Mutex_Package.zip. The
library is on no package index, so the zip bundles ``cloudshell_mutex`` (its lock wing and the driver mixin;
drivers.toml ``bundle``); ``requirements.txt`` brings the CloudShell clients.

A Mutex Service in a sandbox *is* a lock: its alias (``MUTEX`` by default) is the lock's name, and the
command context names it (``context.resource.name``). Both commands therefore act on that alias and on
nothing else. The session is built from the context (server, admin token and the context's API port) by
:class:`~cloudshell_mutex.driver.ReservationMutexMixin`.
"""

from __future__ import annotations

from typing import Any, List

from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface

from cloudshell_mutex.driver import ReservationMutexMixin, context_reservation
from cloudshell_mutex.lock.admin.admin import (
    AdminReport,
    Outcome,
    force_release,
    force_release_permission,
    lock_status,
)
from cloudshell_mutex.lock.admin.listing import list_locks
from cloudshell_mutex.lock.errors import MutexError, MutexUsageError
from cloudshell_mutex.lock.protocol import check_service_alias
from cloudshell_mutex.lock.server.alias import LockAlias
from cloudshell_mutex.lock.text import MAX_OUTPUT_LENGTH, html_text, one_line

#: Outcomes a command reports as its answer; the others fail the command (CloudShell shows it as an error).
_ANSWERS = {Outcome.HELD, Outcome.FREE, Outcome.RELEASED, Outcome.NO_LOCK, Outcome.GONE_MEANWHILE}
#: Socket timeout of the commands' session: an admin command should not hang on a stuck server.
API_TIMEOUT = 60.0
#: The longest answer a command gives (characters): the portal shows it in the output pane.
MAX_ANSWER_LENGTH = 20000


def answer_text(lines: List[str]) -> str:
    """A command's answer for the output pane, which renders HTML: each line one visible line of text (values
    written by other code, such as a 100 kB ``Mutex Owner``, are cut), escaped; at most
    :data:`MAX_ANSWER_LENGTH` characters in all."""
    shown: List[str] = []
    size = 0
    for number, line in enumerate(lines):
        indent = "  " if line.startswith("  ") else ""
        text = indent + one_line(line, MAX_OUTPUT_LENGTH)
        if size + len(text) > MAX_ANSWER_LENGTH:
            shown.append(f"... ({len(lines) - number} more lines not shown)")
            break
        shown.append(text)
        size += len(text) + 1
    return html_text("\n".join(shown))


class MutexServiceDriver(ResourceDriverInterface, ReservationMutexMixin):
    """Commands on a Mutex Service: who holds this lock, and removing it by force, on the record."""

    def initialize(self, context: Any) -> None:
        """Nothing to prepare: sessions are opened per command context."""

    def cleanup(self) -> None:
        """Close the API sessions the commands opened."""
        self.close_reservation_mutex_sessions()

    def LockStatus(self, context: Any) -> str:  # CloudShell calls commands by name
        """Who holds this service's lock: the holder's label, its owner token and what this read can tell."""
        alias = self._lock_alias(context)
        report = lock_status(alias)
        lines = [report.message]
        if report.holder is not None:
            lines += [f"  {name}: {value}" for name, value in sorted(report.holder.attributes.items())]
        if report.outcome in _ANSWERS:
            # Every lock in the sandbox (read groups and their readers, writers waiting, ...): one more read.
            try:
                lines += ["", *list_locks(alias.api, alias.reservation_id, alias.model).lines()]
            except MutexError as error:
                lines += ["", f"could not list the other lock services: {error}"]
        return self._answer(report, answer_text(lines))

    def ForceRelease(self, context: Any, reason: str) -> str:  # CloudShell calls commands by name
        """Remove this service's lock, whoever holds it, and write who released whose lock and why to
        the reservation output. ``reason`` is required. Only system administrators and domain administrators
        of the sandbox's domain may (the running user's ``GetUserDetails``); others are refused, told why."""
        reservation = context_reservation(context)
        # The user who runs the command, as CloudShell names them (not the sandbox's owner): the driver itself
        # runs with the context's admin token for whoever clicks, so the rule is checked here.
        user = str(getattr(reservation, "running_user", "") or "").strip()
        domain = str(getattr(reservation, "domain", "") or "Global")
        actor = f"{user or 'an unnamed user'} (Mutex Service command Force Release)"
        alias = self._lock_alias(context)
        report = force_release(
            alias, actor, reason, authorize=lambda: force_release_permission(alias.api, user, domain)
        )
        return self._answer(report, report.message)

    def _lock_alias(self, context: Any) -> LockAlias:
        """The lock this service is: its alias in the command's reservation, on a session from the context."""
        reservation = context_reservation(context)
        alias = str(getattr(getattr(context, "resource", None), "name", "") or "").strip()
        if not alias:
            raise MutexUsageError("the command context names no service (context.resource.name is empty)")
        try:
            # Any alias a service can have: a Mutex Service whose alias only looks like MUTEX (made by other
            # code) must still be shown and force-released; the report says that it is no lock name.
            check_service_alias(alias)
        except ValueError as error:
            raise MutexUsageError(str(error)) from None
        api = self.cloudshell_api(context, timeout=API_TIMEOUT)
        return LockAlias(api, str(reservation.reservation_id).strip(), alias)

    @staticmethod
    def _answer(report: AdminReport, text: str) -> str:
        text = text if "\n" in text else answer_text([text])
        if report.outcome in _ANSWERS:
            return text
        raise MutexError(text, reservation_id=report.reservation_id, alias=report.alias)
