"""What an administrator does with a lock: see who holds it, and remove it by force, on the record.

Both the ``cloudshell-mutex status``/``release`` commands and the Mutex Service driver's **Lock Status** and
**Force Release** commands call :func:`lock_status` and :func:`force_release`; they differ only in how they
get a session and how they show the :class:`AdminReport`. Everything goes through
:class:`~.alias.LockAlias`: one fresh read, one remove sent exactly once, one line in the reservation output.

A force release cannot check the owner (the remove has no compare-and-set): it removes whoever holds the
alias when the remove lands. It reads the holder first and names that holder in its record; if the lock
changed hands between that read and the remove (milliseconds), the record names the previous holder. That is
why it is a tool for people, on a lock that is stuck, and never silent.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from .. import protocol
from ..diagnosis import fatal_error, needs_state, reservation_missing
from ..holder import Holder, shown_holder
from ..server.alias import CallResult, LockAlias, Status
from ..server.classify import classify
from ..text import one_line

#: A reason is one line in the sandbox output: longer text is cut.
MAX_REASON_LENGTH = 500
#: Seconds between two reads while ``lock_status`` watches the lock.
WATCH_INTERVAL = 1.0


class Outcome(enum.Enum):
    """What an admin operation came to. The CLI maps each to an exit code (docs/admin.md)."""

    HELD = "held"  # status: someone holds the lock
    FREE = "free"  # status: nobody holds it
    RELEASED = "released"  # release: the holder's service was removed
    NO_LOCK = "no_lock"  # release: nobody held it, nothing was removed
    GONE_MEANWHILE = "gone_meanwhile"  # release: it was held at the read, gone at the remove
    RESERVATION_MISSING = "reservation_missing"
    RESERVATION_ENDED = "reservation_ended"
    REFUSED = "refused"  # release: no --force or no reason
    UNKNOWN = "unknown"  # release: the remove got no answer; it may still be applied
    FAILED = "failed"  # the server refused a call or could not be reached


@dataclass(frozen=True)
class AdminReport:
    """The result of :func:`lock_status` or :func:`force_release`, fit for people and for JSON.

    ``seen_held_for`` is how long *this observer* saw the same holder (same owner token) on its own
    monotonic clock: 0 after a single read, which says "held now" and nothing about since when.
    ``output_written`` says whether the record reached the reservation output (None: nothing to write).
    """

    outcome: Outcome
    reservation_id: str
    alias: str
    message: str
    holder: Optional[Holder] = None
    seen_held_for: Optional[float] = None
    watched_for: float = 0.0
    holder_changes: int = 0
    actor: Optional[str] = None
    reason: Optional[str] = None
    output_written: Optional[bool] = None
    calls: int = 0

    @property
    def held(self) -> Optional[bool]:
        """Whether the lock is held after the operation, as far as it can tell (None: unknown)."""
        if self.outcome in (Outcome.HELD, Outcome.RESERVATION_ENDED):
            return self.holder is not None
        if self.outcome in (Outcome.FREE, Outcome.RELEASED, Outcome.NO_LOCK, Outcome.GONE_MEANWHILE):
            return False
        return None

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (the ``--json`` output)."""
        holder = None
        if self.holder is not None:
            holder = {
                "label": self.holder.label,
                "token": self.holder.token,
                "model": self.holder.model,
                "pid": self.holder.pid,
                "attributes": dict(self.holder.attributes),
            }
        return {
            "outcome": self.outcome.value,
            "reservation_id": self.reservation_id,
            "alias": self.alias,
            "held": self.held,
            "holder": holder,
            "seen_held_for": self.seen_held_for,
            "watched_for": self.watched_for,
            "holder_changes": self.holder_changes,
            "actor": self.actor,
            "reason": self.reason,
            "output_written": self.output_written,
            "message": self.message,
            "calls": self.calls,
        }


def clean_reason(reason: Optional[str]) -> str:
    """``reason`` as one line of visible text of at most :data:`MAX_REASON_LENGTH` characters ("" when
    nothing visible is left: blanks, control or zero-width characters are no reason)."""
    return one_line(reason or "", MAX_REASON_LENGTH)


#: Who may force-release, for the refusal's words.
WHO_MAY_FORCE_RELEASE = "system administrators, and domain administrators of the sandbox's domain"


@dataclass(frozen=True)
class Permission:
    """Whether ``user`` may force-release a lock in a sandbox of ``domain``, and why (for people)."""

    allowed: bool
    user: str
    domain: str
    why: str


def force_release_permission(api: Any, user: str, domain: str) -> Permission:
    """May ``user`` force-release a lock in a sandbox of ``domain``? One ``GetUserDetails(user)`` call.

    Yes for a system administrator (``IsAdmin``) and for a member of a group whose role is ``DomainAdmin`` and
    whose domains (``TestShellDomains``) include ``domain``. ``IsDomainAdmin`` alone is not trusted: which
    domain it speaks of is not documented. A user the server does not describe, or a failed call, is refused:
    a force release removes a lock that someone may still be using.
    """
    user, domain = one_line(user or ""), one_line(domain or "") or "Global"
    if not user:
        return Permission(False, "", domain, "CloudShell did not say which user runs this command")
    try:
        details = api.GetUserDetails(user)
    except Exception as error:  # refused, unknown user, unreachable: the rule cannot be checked
        failure = one_line(classify(error).message)
        return Permission(
            False, user, domain, f"{user}'s role could not be checked (GetUserDetails: {failure})"
        )
    return permission_from_details(details, user, domain)


def permission_from_details(details: Any, user: str, domain: str) -> Permission:
    """The rule of :func:`force_release_permission`, applied to ``GetUserDetails(user)``'s answer."""
    user, domain = one_line(user or ""), one_line(domain or "") or "Global"
    if bool(getattr(details, "IsAdmin", False)):
        return Permission(True, user, domain, f"{user} is a system administrator")
    for group in getattr(details, "Groups", None) or []:
        role = str(getattr(group, "GroupRole", "") or "").replace(" ", "").lower()
        domains = {str(getattr(d, "Name", "") or "") for d in getattr(group, "TestShellDomains", None) or []}
        if role == "domainadmin" and domain in domains:
            name = one_line(getattr(group, "Name", ""))
            return Permission(True, user, domain, f"{user} is a domain administrator of {domain!r} ({name})")
    return Permission(
        False,
        user,
        domain,
        f"{user} is neither a system administrator nor a domain administrator of {domain!r}",
    )


def refusal(alias: LockAlias, permission: Permission, actor: str, reason: Optional[str]) -> AdminReport:
    """The report of a force release that ``permission`` does not allow: nothing is read or removed."""
    message = (
        f"refused: Force Release is for {WHO_MAY_FORCE_RELEASE} ({permission.domain!r}), because it "
        f"removes a lock that another command or script may still be using; {permission.why}. Ask one of "
        "them, or let the holder finish (a lock with a lease is broken by its waiters once its holder stops "
        "heartbeating)"
    )
    return AdminReport(
        Outcome.REFUSED, alias.reservation_id, alias.alias, message, actor=actor, reason=clean_reason(reason)
    )


def shown_alias(alias: str) -> str:
    """``alias`` as an administrator's report names it: quoted, anything outside printable ASCII escaped
    (:func:`~.protocol.shown_name`), and, when it is (or belongs to) a name no lock may have, why: a service
    that only looks like ``MUTEX`` must not be taken for it."""
    lock, _ = protocol.alias_kind(alias)
    problem = protocol.lock_name_problem(lock) if lock else None
    note = f" (not a lock name: {problem})" if problem is not None else ""
    return protocol.shown_name(alias) + note


def describe_holder(holder: Holder) -> str:
    """``<label> (Mutex Owner '<token>')``: who holds a lock, for people (an owner value written by other
    code is cut to one short, visible line)."""
    if not holder.token:
        return f"{holder.label} (none written: original protocol v1?)"
    return f"{holder.label} (Mutex Owner {one_line(holder.token)!r})"


def _failure_report(
    alias: LockAlias, result: CallResult, doing: str, state: Optional[str], **extra: Any
) -> AdminReport:
    """A failed call as a report whose message says what to do (worded by :mod:`.diagnosis`)."""
    failure = result.failure
    assert failure is not None
    if state is None and needs_state(failure):
        state = alias.reservation_state()
    if state in ("missing", "ended"):
        return _reservation_report(alias, state, **extra)
    error = fatal_error(
        failure, doing, alias.reservation_id, alias.alias, alias.model, None, state, alias.domain
    )
    return AdminReport(
        Outcome.FAILED, alias.reservation_id, alias.alias, str(error), calls=alias.calls, **extra
    )


def _reservation_report(alias: LockAlias, state: str, **extra: Any) -> AdminReport:
    if state == "missing":
        outcome = Outcome.RESERVATION_MISSING
        message = reservation_missing(alias.reservation_id, alias.domain)
    else:
        outcome = Outcome.RESERVATION_ENDED
        message = f"reservation {alias.reservation_id} has ended: its lock no longer matters"
    return AdminReport(outcome, alias.reservation_id, alias.alias, message, calls=alias.calls, **extra)


def lock_status(
    alias: LockAlias,
    watch: float = 0.0,
    *,
    interval: float = WATCH_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> AdminReport:
    """Who holds ``alias`` now; with ``watch`` > 0, keep reading for that many seconds.

    Reads are fresh (never the server's 5-second cache). While watching, ``seen_held_for`` grows as long
    as the same owner token is seen, and starts again at 0 when the holder changes.
    """
    state = alias.reservation_state()
    if state == "missing":
        return _reservation_report(alias, state)
    start: Optional[float] = None
    first_seen: Optional[float] = None
    holder: Optional[Holder] = None
    changes = 0
    while True:
        result = alias.read()
        now = clock()
        if not result.ok:
            return _failure_report(alias, result, "reading the lock", state)
        if start is None:
            start = now  # the watch counts from the first answer: a holder seen all along is seen that long
        shown = shown_holder(result.holder)  # a releasing marker's secret is never reported
        token = None if shown is None else shown.token
        if first_seen is None or token != (None if holder is None else holder.token):
            changes += first_seen is not None
            first_seen = now
        holder = shown
        if now - start >= watch:
            break
        sleep(max(0.0, min(interval, start + watch - now)))
    watched = clock() - start if watch > 0 else 0.0
    held_for = None if holder is None else now - first_seen
    if state == "ended":
        report = _reservation_report(alias, state)
        return AdminReport(
            report.outcome,
            alias.reservation_id,
            alias.alias,
            report.message
            + (f"; {shown_alias(alias.alias)} is still held by {describe_holder(holder)}" if holder else ""),
            holder=holder,
            seen_held_for=held_for,
            watched_for=watched,
            holder_changes=changes,
            calls=alias.calls,
        )
    where = f"{shown_alias(alias.alias)} in reservation {alias.reservation_id}"
    if holder is None:
        message = f"{where} is free (nobody holds the lock)"
        if changes:
            message += f"; the holder changed {changes} time(s) in {watched:.1f} s of watching"
        return AdminReport(
            Outcome.FREE, alias.reservation_id, alias.alias, message, None, None, watched, changes,
            calls=alias.calls,
        )  # fmt: skip
    if watch > 0:
        seen = f"seen held for {held_for:.1f} s by this observer ({watched:.1f} s of watching"
        seen += f", {changes} holder change(s))" if changes else ")"
    else:
        seen = "held now (one read: it cannot tell since when)"
    message = f"{where} is held by {describe_holder(holder)}: {seen}"
    return AdminReport(
        Outcome.HELD, alias.reservation_id, alias.alias, message, holder, held_for, watched, changes,
        calls=alias.calls,
    )  # fmt: skip


def force_release(
    alias: LockAlias,
    actor: str,
    reason: Optional[str],
    *,
    authorize: Optional[Callable[[], Permission]] = None,
) -> AdminReport:
    """Remove whoever holds ``alias``, and write who released whose lock, and why, to the reservation output.

    ``actor`` names the person (and the tool) for the record. A blank ``reason`` is refused before any
    call; then ``authorize`` (e.g. :func:`force_release_permission` of the running user) decides, and a
    refusal says who may and why. The holder is read first (fresh) and named; the remove is sent exactly
    once (:meth:`LockAlias.remove_once`); the record is written whatever the outcome, so that a force
    release is never silent.
    """
    why = clean_reason(reason)
    if not why:
        return AdminReport(
            Outcome.REFUSED,
            alias.reservation_id,
            alias.alias,
            "a force release needs a reason (it goes to the reservation output for the sandbox's users)",
            actor=actor,
        )
    if authorize is not None:
        permission = authorize()
        if not permission.allowed:
            return refusal(alias, permission, actor, reason)
    extra: Dict[str, Any] = {"actor": actor, "reason": why}
    state = alias.reservation_state()
    if state in ("missing", "ended"):
        return _reservation_report(alias, state, **extra)
    read = alias.read()
    if not read.ok:
        return _failure_report(alias, read, "reading the lock before a force release", state, **extra)
    holder = shown_holder(read.holder)
    where = f"{shown_alias(alias.alias)} in reservation {alias.reservation_id}"
    if holder is None:
        record = f"{actor} asked to force-release {where}; nobody held it, nothing was removed. Reason: {why}"
        return _recorded(alias, Outcome.NO_LOCK, record, None, extra)
    whose = describe_holder(holder)
    removed = alias.remove_once()
    if removed.status is Status.DONE:
        record = f"{actor} force-released {where}, held by {whose}. Reason: {why}"
        return _recorded(alias, Outcome.RELEASED, record, holder, extra)
    if removed.status is Status.MISSING and not removed.may_land_later:
        record = (
            f"{actor} asked to force-release {where}, held by {whose}; it was released before the remove "
            f"landed, nothing was removed. Reason: {why}"
        )
        return _recorded(alias, Outcome.GONE_MEANWHILE, record, holder, extra)
    failure = removed.failure
    assert failure is not None
    if removed.may_land_later:
        record = (
            f"{actor} tried to force-release {where}, held by {whose}; the remove got no answer "
            f"({failure.message}) and may still be applied. Reason: {why}. Check with Lock Status "
            "(cloudshell-mutex status) before trying again"
        )
        return _recorded(alias, Outcome.UNKNOWN, record, holder, extra)
    report = _failure_report(alias, removed, "removing the lock", state, **extra)
    record = (
        f"{actor} tried to force-release {where}, held by {whose}, and failed: {report.message}. "
        f"Reason: {why}"
    )
    return _recorded(alias, report.outcome, record, holder, extra)


def _recorded(
    alias: LockAlias, outcome: Outcome, record: str, holder: Optional[Holder], extra: Dict[str, Any]
) -> AdminReport:
    """Write ``record`` to the reservation output (a warning, unless nothing was there to remove) and return
    it as the report's message."""
    written = alias.write_output(record, warning=outcome is not Outcome.NO_LOCK).ok
    message = record if written else f"{record} (could not write this to the reservation output)"
    return AdminReport(
        outcome, alias.reservation_id, alias.alias, message, holder, output_written=written,
        calls=alias.calls, **extra,
    )  # fmt: skip
