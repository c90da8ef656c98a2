"""What to tell the user when the lock cannot do its job: the exception, and a message that says what
to do.

Each function builds one error from facts the lock gathered: the classified failure, the
operation's record (:class:`~.operation.Operation`) and, for a reservation problem, the reservation's
state, read by the caller. Nothing here makes calls, logs or emits events. Messages name owner tokens,
never credentials (:func:`~.classify.classify` already cut raw replies off).
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

from . import protocol
from .errors import (
    MutexCancelled,
    MutexError,
    MutexLostError,
    MutexNotInstalled,
    MutexPermissionError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
    ReservationNotActive,
)
from .holder import Holder, sanitize_label
from .operation import Operation
from .server.classify import Classification, ErrorKind

#: Failure kinds that could mean "the reservation is gone": the reservation's status is read to tell.
_MAY_BE_GONE = (ErrorKind.NOT_ACTIVE, ErrorKind.FATAL, ErrorKind.ALIAS_MISSING)


def remove_hint(alias: str, token: str) -> str:
    """How a person removes a lock service left behind by ``token``, with what exists today."""
    if token.startswith(protocol.READ_GROUP_MARK):
        # A read group is shared: other readers may be in it, so a person must not remove it.
        return (
            f"do not remove the service {alias!r} by hand while its Mutex Owner is {token!r}: it is a read "
            "group that other readers may share; it ends by its readers' close or by its lease"
        )
    return (
        f"if the service {alias!r} has Mutex Owner {token!r}, it is this process's: remove it from the "
        "reservation (select it in the sandbox diagram and remove it, or call "
        f"RemoveServicesFromReservation with the alias {alias!r})"
    )


def reservation_missing(reservation_id: str, domain: Optional[str], detail: str = "") -> str:
    """What to say when a reservation is not found: a session sees only the sandboxes of the domain it
    logged on to, so the domain is named and the settings that choose it (the CLI's and a driver's)."""
    where = f" in domain {domain!r}" if domain else ""
    said = f" ({detail})" if detail else ""
    return (
        f"reservation {reservation_id} was not found{where}{said}: check the reservation (sandbox) id, and "
        "log on to the sandbox's own domain (a session sees only its own domain's sandboxes; the CLI's "
        "--domain, a driver context's reservation.domain)"
    )


def needs_state(failure: Classification) -> bool:
    """True when ``failure`` could mean that the reservation is gone: read its state before wording it."""
    return failure.kind in _MAY_BE_GONE


def fatal_error(
    failure: Classification,
    doing: str,
    reservation_id: str,
    alias: str,
    model: str,
    probed: Optional[str],
    state: Optional[str],
    domain: Optional[str] = None,
) -> MutexError:
    """Turn a failure that waiting cannot fix into an error that says what to do.

    ``state`` is the reservation's state ('active', 'ended', 'missing', or None when unknown or not
    read: read it when :func:`needs_state` says so). ``probed`` is what an add without attributes told
    about the model: 'no_owner', 'missing', or None (not tried, or no answer). ``domain`` is the domain the
    session logged on to (a missing reservation may be another domain's).
    """
    where = dict(reservation_id=reservation_id, alias=alias, code=failure.code, api_message=failure.message)
    kind = failure.kind
    # Confirm with the reservation's status rather than trusting message text alone.
    gone = state in ("ended", "missing") or (kind is ErrorKind.NOT_ACTIVE and state is None)
    if kind in _MAY_BE_GONE and gone:
        if state == "ended":
            return ReservationNotActive(
                f"reservation {reservation_id} has ended ({failure.message}); there is nothing to lock. "
                "Lock only while the sandbox is active",
                **where,
            )
        return ReservationNotActive(
            f"{reservation_missing(reservation_id, domain, failure.message)}; there is nothing to lock",
            **where,
        )
    if probed == "no_owner":
        return MutexNotInstalled(
            f"the service model {model!r} on this CloudShell server has no 'Mutex Owner' attribute (a "
            "package built from the original repository's current source, or a model made by hand), and "
            f"owner verification needs it ({failure.message}). Import Mutex_Package.zip (`cloudshell-mutex "
            "install`, or Manage > Import Package as a system administrator): importing it over the "
            "original package is safe, and code that uses the original protocol keeps working",
            **where,
        )
    if probed == "missing" or kind is ErrorKind.NOT_INSTALLED:
        return MutexNotInstalled(
            f"the service model {model!r} is not installed on the CloudShell server, or does not take "
            f"the attributes the lock writes ({failure.message}): import Mutex_Package.zip "
            "(`cloudshell-mutex install`, or Manage > Import Package as a system administrator)",
            **where,
        )
    if kind is ErrorKind.UNAUTHORIZED:
        return MutexPermissionError(
            f"CloudShell no longer accepts this session's login while {doing} in reservation "
            f"{reservation_id} ({failure.message}, also after the client logged on again): the login "
            "token expired or was revoked. Open a new CloudShellAPISession (in a driver, from the "
            "command's context) and try again",
            **where,
        )
    if kind is ErrorKind.PERMISSION:
        return MutexPermissionError(
            f"CloudShell refused {doing} in reservation {reservation_id}: {failure.message}. The "
            "lock needs a session allowed to add and remove services in the reservation (the Mutex "
            "Service family is admin-only: use the admin token of the driver/script context)",
            **where,
        )
    if kind is ErrorKind.TRANSIENT:
        return MutexError(f"CloudShell API unavailable while {doing}: {failure.message}; try again", **where)
    return MutexError(
        f"unexpected CloudShell error while {doing} in reservation {reservation_id}: "
        f"{'code ' + failure.code + ': ' if failure.code else ''}{failure.message}",
        **where,
    )


def note_pending_add(error: MutexError, alias: str, token: str) -> MutexError:
    """Add to ``error`` that an add of ours (``token``) may have committed unseen, and how to clean up."""
    error.args = (f"{error}. An earlier add may have succeeded: {remove_hint(alias, token)}",)
    return error


#: A timeout's advice when the holder has no lease.
UNLEASED_HOLDER_NOTE = (
    "; the holder has no lease (the original protocol, a model without the lease attributes, or lease=0), so "
    "it is never broken automatically: if its process is gone, an administrator removes it with Force "
    "Release (cloudshell-mutex release --force)"
)


def timeout_error(
    op: Operation,
    now: float,
    reservation_id: str,
    alias: str,
    unleased_holder: bool = False,
    releasing_until: Optional[float] = None,
) -> MutexTimeout:
    """The acquisition ran out of time: say who held the lock, and for how long this waiter saw it
    (``unleased_holder``: the holder has no lease, so only an administrator can free it; ``releasing_until``:
    the holder is releasing, and its remove may still land until then, monotonic)."""
    note = UNLEASED_HOLDER_NOTE if unleased_holder else ""
    if releasing_until is not None:
        note = releasing_note(releasing_until - now) + note
    waited = now - op.start + op.waited_before
    limit = waited if op.wait.timeout is None else op.wait.timeout + op.waited_before
    holder = op.holder_label
    held_for = op.held_for(now)
    waiting = f"timed out after {limit:g} s waiting for {alias!r} in reservation {reservation_id}"
    landing = op.add_can_land(now)
    if landing:
        # Who held it, and why (a releasing holder), whatever our own add does: that add explains nothing
        # of the wait.
        seen = "" if holder is None else f"held by {holder}, seen held for {held_for or 0.0:.1f} s{note}; "
        message = (
            f"{waiting}: {seen}an add of this acquisition got no answer and may still be applied for "
            f"{op.add_lands_by - now:.0f} s; this process watches for it and removes it if it lands. If "
            "the process exits before that, " + remove_hint(alias, op.token)
        )
    elif op.add_pending:
        message = (
            f"could not tell whether {alias!r} in reservation {reservation_id} was acquired "
            f"after {limit:g} s: the CloudShell API kept failing ({op.last_error}); "
            + remove_hint(alias, op.token)
        )
    elif op.cycle is not None:
        message = f"{waiting}: {deadlock_note(op.cycle, op.token)}; nothing was removed"
    elif holder is not None:
        message = (
            f"{waiting}: held by {holder}, seen held for {held_for or 0.0:.1f} s; nothing was removed{note}"
        )
    elif op.contentions:
        message = f"{waiting}: it was held at every attempt (holder unknown); nothing was removed"
    elif op.unreachable and not op.unsure_add:
        message = (
            f"{waiting}: the CloudShell server could not be reached ({op.last_error}); no request of this "
            "acquisition reached it, so it left nothing there. Check the server's address and port, and that "
            "it is up"
        )
    else:
        message = f"{waiting}: the CloudShell API kept failing ({op.last_error}); nothing was removed"
    return MutexTimeout(
        message,
        holder=holder,
        held_for=held_for,
        waited=waited,
        token=op.token,
        maybe_held=op.add_pending or landing,
        reservation_id=reservation_id,
        alias=alias,
    )


def deadlock_note(cycle: Any, token: str) -> str:
    """What a timeout says when its wait was part of a wait-for cycle (``cycle``, a :class:`~.waitfor.Cycle`,
    through the wait of ``token``): waiting longer would not help."""
    return (
        f"it waited in a deadlock ({cycle.describe(token)}), which waiting longer would not end: leave the "
        "with blocks of the locks this thread holds (or release them) and retry; take several locks in one "
        "order (cloudshell_mutex.acquire_all) to avoid it"
    )


def releasing_note(left: float) -> str:
    """Why a lock stays held while its holder releases it (see :func:`timeout_error`)."""
    if left <= 0:
        return (
            "; the holder is releasing it, and its remove (which got no answer) should have landed by now: "
            "the holder's process decides once a read shows it"
        )
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + left))
    return (
        "; the holder is releasing it: its remove got no answer and may still land until about "
        f"{until} (in at most {left:.0f} s, the lock's request_lifetime), and the holder sends no second "
        "remove before then (a late one could delete the next holder's lock), so the lock stays held until "
        "that remove lands or its lifetime passes"
    )


def cancelled_error(op: Operation, now: float, reservation_id: str, alias: str) -> MutexCancelled:
    """The caller cancelled the wait; what it took back was taken back, and what may still land is watched."""
    waited = now - op.start + op.waited_before
    if not op.add_can_land(now):
        return cancelled_wait(alias, reservation_id, waited, op.holder_label)
    landing = (
        "an add of this acquisition got no answer and may still be applied for "
        f"{op.add_lands_by - now:.0f} s: this process watches for it and removes it if it lands. If the "
        "process exits before that, " + remove_hint(alias, op.token)
    )
    return cancelled_wait(alias, reservation_id, waited, op.holder_label, landing)


def cancelled_wait(
    alias: str, reservation_id: str, waited: float, holder: Optional[str], left: Optional[str] = None
) -> MutexCancelled:
    """A wait for ``alias`` (a lock, a read lock, a cohort's local lock) that its caller cancelled. ``left``
    says what may still be there; by default nothing is."""
    held = f" (held by {holder})" if holder else ""
    left = left or "it holds nothing, and nothing of this acquisition stays in the reservation"
    return MutexCancelled(
        f"cancelled after {waited:.1f} s waiting for {alias!r} in reservation {reservation_id}{held}; {left}",
        holder=holder,
        waited=waited,
        reservation_id=reservation_id,
        alias=alias,
    )


def expired_error(max_hold: float, lease: float, reservation_id: str, alias: str) -> MutexLostError:
    """The holder kept the lock for ``max_hold``: its heartbeat stopped renewing the lease."""
    return MutexLostError(
        f"{alias!r} in reservation {reservation_id} was held for max_hold ({max_hold:g} s): its lease "
        f"({lease:g} s) is no longer renewed, so a waiter may break the lock about a lease after its last "
        "heartbeat. Stop the work done under it; release() still removes it while it is ours",
        reservation_id=reservation_id,
        alias=alias,
    )


def lost_error(op: Operation, reservation_id: str, alias: str, found_by: str = "release") -> MutexLostError:
    """The lock was no longer this acquisition's (``op.holder`` is who has it now): found by ``found_by``, the
    release, the ``"heartbeat"`` while held, or a ``"read"`` while held (``ensure_held(read=True)``, a nested
    acquire's)."""
    when = {"heartbeat": "when its heartbeat read it", "read": "when a read while it was held showed it"}.get(
        found_by, "at release"
    )
    message = (
        f"{alias!r} in reservation {reservation_id} was no longer held by this acquisition "
        f"({op.token}) {when}; it is held by {op.holder_label or 'nobody'}. Nothing was removed. "
        "Someone removed the lock while it was held (a waiter that judged its lease lapsed, a partner "
        "that adopted and released it, an operator, or code that removes MUTEX without owning it), so "
        "the work done under it may not have been exclusive"
    )
    return MutexLostError(message, reservation_id=reservation_id, alias=alias)


def namesake_error(reservation_id: str, alias: str, other: str) -> MutexUsageError:
    """The add of ``alias`` said "already exists" while a read shows only ``other``, a spelling of it in other
    letter cases: this server takes aliases alike whatever their case, and the two names are one lock."""
    return MutexUsageError(
        f"the server refuses to add {alias!r} in reservation {reservation_id} ('already exists') while the "
        f"reservation shows only {other!r}, which differs from {alias!r} only in letter case: this server "
        "takes aliases alike whatever their case, so both names are one lock. Use one spelling everywhere "
        f"(the one the lock's other users use, e.g. {other!r})",
        reservation_id=reservation_id,
        alias=alias,
    )


def release_error(
    op: Operation, failure: Optional[Classification], doing: str, reservation_id: str, alias: str
) -> MutexReleaseError:
    """Release failed (``failure``, or else the last transient error): the lock may still be held."""
    reason = failure.message if failure is not None else op.last_error
    message = (
        f"could not release {alias!r} in reservation {reservation_id} while {doing}: {reason}. "
        "The lock may still be held: call release() again once the server answers, or "
        + remove_hint(alias, op.token)
    )
    return MutexReleaseError(
        message,
        reservation_id=reservation_id,
        alias=alias,
        code=failure.code if failure else None,
        api_message=failure.message if failure else None,
    )


def broke_stale(
    breaker: str, what: str, alias: str, holder: Holder, lease_seconds: float, seen: float
) -> str:
    """The line a waiter writes (log and reservation output) when it broke a stale holder: ``what`` is
    ``"lock"``, ``"reader slot"`` or the like, ``seen`` how long it saw no heartbeat on its own clock."""
    return (
        f"{sanitize_label(breaker)} broke the stale {what} {alias!r} held by {holder.label} "
        f"(Mutex Owner {holder.token!r}, lease {lease_seconds:g} s): no heartbeat seen for {seen:.1f} s on "
        "this waiter's own clock"
    )


def not_held_error(
    kind: str, reservation_id: str, alias: str, what: str = "acquire it first"
) -> MutexUsageError:
    """A call that needs the lock held, on an object of ``kind`` that does not hold it."""
    return MutexUsageError(
        f"this {kind} does not hold {alias!r} in reservation {reservation_id}: {what}",
        reservation_id=reservation_id,
        alias=alias,
    )


def export_unheld_error(reservation_id: str, alias: str) -> MutexUsageError:
    """export() on an object that does not hold the lock."""
    return MutexUsageError(
        f"export() needs the lock held: acquire {alias!r} first", reservation_id=reservation_id, alias=alias
    )


def held_again_error(kind: str, reservation_id: str, alias: str) -> MutexUsageError:
    """A second acquire by an object of ``kind`` that holds the lock and is not reentrant."""
    return MutexUsageError(
        f"this {kind} already holds {alias!r} in reservation {reservation_id}; release it first, pass "
        "reentrant=True to allow nesting, or use one object per task",
        reservation_id=reservation_id,
        alias=alias,
    )


def lapsed_error(silent: float, lease: float, reservation_id: str, alias: str) -> MutexLostError:
    """No heartbeat was confirmed for ``silent`` seconds (inf: none since an adopt), longer than the lease."""
    how_long = (
        f"since it was adopted (lease {lease:g} s)"
        if math.isinf(silent)
        else f"for {silent:.1f} s, longer than the lease ({lease:g} s)"
    )
    return MutexLostError(
        f"{alias!r} in reservation {reservation_id}: no heartbeat was confirmed {how_long}; a waiter may "
        "have broken the lock. Stop the work done under it; release() tells whether it was",
        reservation_id=reservation_id,
        alias=alias,
    )


def danger_message(silent: float, lease: float, alias: str) -> str:
    """The warning when heartbeats failed for most of the lease."""
    since = "since it was adopted" if math.isinf(silent) else f"for {silent:.1f} s"
    return (
        f"no heartbeat of {alias!r} confirmed {since} (lease {lease:g} s): the lease may lapse; finish or "
        "stop the work done under the lock"
    )


def lost_output_line(owner: str, alias: str, holder_label: Optional[str]) -> str:
    """The sandbox output's line when a held lock was lost: the people watching see it."""
    return (
        f"{sanitize_label(owner)} lost the {alias} lock it held: it is now held by "
        f"{holder_label or 'nobody'} (a lease break, a Force Release, or code that removed it). The work "
        "done under it may not have been exclusive"
    )


def adopt_lost_error(
    reservation_id: str, alias: str, token: str, holder_label: Optional[str]
) -> MutexLostError:
    """An adopt whose read shows the lock is not the handle's acquisition's any more."""
    return MutexLostError(
        f"cannot adopt {alias!r} in reservation {reservation_id}: it is not held by the handle's acquisition "
        f"({token}) any more; it is held by {holder_label or 'nobody'}",
        reservation_id=reservation_id,
        alias=alias,
    )


def read_timeout_error(
    alias: str, reservation_id: str, waited: float, what: str, blocker: Optional[str], blocked_for: float
) -> MutexTimeout:
    """A read lock's acquire ran out of time: ``what`` kept it out, for ``blocked_for`` seconds."""
    return MutexTimeout(
        f"could not read-lock {alias!r} in reservation {reservation_id} within {waited:.1f} s: {what} (for "
        f"{blocked_for:.1f} s). Nothing of this reader was left behind; retry later, or see "
        "`cloudshell-mutex status --all` for who holds what",
        holder=blocker,
        held_for=blocked_for,
        waited=waited,
        reservation_id=reservation_id,
        alias=alias,
    )


#: What a read-write lock's side was asked to do while it may not, and what to do instead.
_RW_SIDE = {
    "reading": "holds {alias!r} for reading: release the read side before writing (a writer waits for every "
    "reader, itself included)",
    "writing": "holds {alias!r} for writing: release it before reading",
    "reading again": "already reads {alias!r}; release it first, or use one object per task",
    "not reading": "does not read {alias!r}: acquire the read side first",
}


def rw_side_error(state: str, reservation_id: str, alias: str) -> MutexUsageError:
    """A ReservationRWLock side used in a ``state`` it cannot be used in (a key of ``_RW_SIDE``)."""
    return MutexUsageError(
        "this ReservationRWLock " + _RW_SIDE[state].format(alias=alias),
        reservation_id=reservation_id,
        alias=alias,
    )


def close_error(error: MutexReleaseError, reservation_id: str, alias: str) -> MutexReleaseError:
    """A read group's close whose remove kept failing: the reader keeps ``MUTEX~c`` until it is settled."""
    closer = protocol.closer_alias(alias)
    return MutexReleaseError(
        f"could not close the read group of {alias!r} in reservation {reservation_id}: "
        f"{error.api_message or 'its remove could not be confirmed'}. "
        f"This reader has stopped reading; it keeps {closer!r} so that no reader joins the group while "
        "its remove may still land: call release() again once the server answers, to finish the close. "
        f"Do not remove {alias!r} by hand: other readers may share the group. If this process ends "
        f"first, {closer!r} ends with its lease and the next reader or a waiting writer settles it",
        reservation_id=reservation_id,
        alias=alias,
        code=error.code,
        api_message=error.api_message,
    )


def cohort_unavailable_error() -> MutexUsageError:
    """Cohort mode on a platform without an OS file lock."""
    return MutexUsageError(
        "cohort mode needs an OS file lock (fcntl or msvcrt), which this platform lacks: use cohort=False"
    )


def cohort_dir_error(directory: str, why: str) -> MutexUsageError:
    """The cohort directory cannot be made."""
    return MutexUsageError(
        f"cannot create the cohort directory {directory} ({why}): pass cohort_dir= a folder on a local disk "
        "that this user can write, or cohort=False"
    )


def cohort_export_error(reservation_id: str, alias: str) -> MutexUsageError:
    """export() of a lock in cohort mode."""
    return MutexUsageError(
        "a lock in cohort mode cannot be exported: the cohort passes it to other processes on this machine. "
        "Use ReservationMutex (cohort=False) for a lock you export",
        reservation_id=reservation_id,
        alias=alias,
    )


def local_timeout_error(
    waited: float,
    who: str,
    lock_path: str,
    reservation_id: str,
    alias: str,
    cycle: Any = None,
    token: str = "",
) -> MutexTimeout:
    """A cohort member ran out of time waiting for the local lock that ``who`` holds (``cycle``: the wait-for
    cycle through the wait of ``token`` that its last look showed, a :class:`~.waitfor.Cycle`)."""
    advice = (
        deadlock_note(cycle, token)
        if cycle is not None
        else "Wait longer (timeout=...), or find out why that process holds it so long"
    )
    return MutexTimeout(
        f"timed out after {waited:.1f} s waiting for {alias!r} in reservation {reservation_id}: {who} on "
        f"this machine holds it in cohort mode (local lock {lock_path}). {advice[0].upper()}{advice[1:]}",
        holder=who,
        waited=waited,
        reservation_id=reservation_id,
        alias=alias,
    )


def state_timeout_error(waited: float, busy: str, reservation_id: str, alias: str) -> MutexTimeout:
    """A cohort member ran out of time waiting for the cohort's state file, which another process keeps."""
    return MutexTimeout(
        f"timed out after {waited:.1f} s waiting for {alias!r} in reservation {reservation_id}: {busy}. Find "
        "that process (another command on this execution server) and let it go on, or use cohort=False",
        waited=waited,
        reservation_id=reservation_id,
        alias=alias,
    )


def other_thread_error(reservation_id: str, alias: str) -> MutexUsageError:
    """A nested acquire in another thread of the command that holds the lock (it would wait for itself)."""
    return MutexUsageError(
        f"{alias!r} in reservation {reservation_id} is held by this same command in another thread, so "
        "taking it here would wait for the command itself: refused. Run the helper in the command's own "
        "thread, or do not take the lock again in a helper that the locked command calls: the command's lock "
        "covers it",
        reservation_id=reservation_id,
        alias=alias,
    )


def other_task_error(reservation_id: str, alias: str) -> MutexUsageError:
    """A nested acquire from an asyncio task while another task of the command is inside through the same
    hold, or holds the lock itself."""
    return MutexUsageError(
        f"{alias!r} in reservation {reservation_id} is held by this command, and another asyncio task of it "
        "is inside through that hold (or holds it itself): two tasks inside at once would not exclude each "
        "other, and waiting here would block the event loop: refused. Run the tasks' locked parts one after "
        "another (await each in turn), or take the lock once around them all and not again in the tasks",
        reservation_id=reservation_id,
        alias=alias,
    )


def nested_lost_error(error: MutexLostError, reservation_id: str, alias: str) -> MutexLostError:
    """A nested acquire whose read found the command's own hold lost (or its lease lapsed or expired)."""
    return MutexLostError(
        f"a nested acquire of {alias!r} in reservation {reservation_id} is not served: the command's own "
        f"hold is not known to be alive. {error}. Stop the command's work under the lock: the rest of it "
        "would not be exclusive either. This acquire added nothing; the command's release says what became "
        "of its hold",
        reservation_id=reservation_id,
        alias=alias,
    )


def served_export_error(reservation_id: str, alias: str) -> MutexUsageError:
    """export() of a nested lock served by its command's acquisition."""
    return MutexUsageError(
        "this lock is served by the acquisition its command already holds: export that lock object",
        reservation_id=reservation_id,
        alias=alias,
    )


def dead_local_holder(
    successor: str, alias: str, reservation_id: str, dead: Dict[str, Any], carry_on: bool, releasing: bool
) -> str:
    """The warning (log and sandbox output) when a cohort's local holder died holding the lock, and what its
    ``successor`` (its owner label) does now."""
    then = (
        "Carrying on under the cohort's server lock after checking it; what it changed may be half done"
        if carry_on
        else "It was releasing the server lock, whose remove may still land: acquiring it from the server"
        if releasing
        else "The cohort held no server lock"
    )
    host = f" on {dead.get('host')}" if dead.get("host") else ""
    return (
        f"{sanitize_label(successor)}: the local holder of {alias} in reservation {reservation_id} "
        f"(pid {dead.get('pid')}{host}, "
        f"{dead.get('owner')}) died holding it; the OS freed its local lock. {then}"
    )
