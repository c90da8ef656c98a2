"""One lock alias in one reservation: the calls every lock in this library makes, and nothing else.

:class:`LockAlias` is the shared primitive under the locks (kazoo's recipes share one acquire loop the
same way). It knows how to add the alias's service with an owner token, read who holds it (fresh,
never cached), remove it with the request sent exactly once, read the reservation's state, and count
every call against a call budget. It never decides anything: each call returns a :class:`CallResult`
that says what happened and whether the server may have applied a call whose reply was lost. The
policy (deadlines, pacing, what an unknown outcome means, what to report) belongs to the lock that
uses it, e.g. :class:`~cloudshell_mutex.lock.mutex.mutex.ReservationMutex`.
"""

from __future__ import annotations

import enum
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue

from .. import protocol
from ..engine import Wait
from ..holder import Holder, holders_in, sanitize_label
from ..options import FRESH_READ_LAG
from ..pacing import CallBudget, budget_for
from ..text import output_line
from . import catalog
from .classify import (
    CLIENT_RETRY_DELAY,
    Classification,
    ErrorKind,
    classify,
    copies_sent,
    may_have_resent,
    sent_once,
)

#: Longest reservation id taken (ids are GUIDs); aliases: :data:`.protocol.MAX_ALIAS_LENGTH`.
MAX_NAME_LENGTH = 256
#: Control characters cannot travel in the API's XML (XML 1.0) and have no place in an id or an alias.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: Reservation states (``GetReservationStatus ... .Status``) in which nothing can be locked any more.
ENDED_STATES = frozenset({"completed", "ended", "cancelled", "canceled", "terminated"})


class Status(enum.Enum):
    """What one call on the alias came to."""

    DONE = "done"  # it succeeded: the add was granted, the read answered, the remove removed
    BUSY = "busy"  # add: the alias is taken (code 100, "already exists")
    MISSING = "missing"  # remove: the alias was not there
    TRANSIENT = "transient"  # a failure that a retry may heal (5xx, dropped connection, timeout)
    FATAL = "fatal"  # anything else: see ``failure.kind``


@dataclass(frozen=True)
class CallResult:
    """The outcome of one call.

    ``sent_at`` is when the request went out (after any wait on the call budget) and ``elapsed`` how
    long the call took, on the caller's monotonic clock. ``failure`` classifies the error of a failed
    call. ``resent`` is True when the client may have re-sent the request by itself (it does that for
    dropped connections, 1 s later), so an earlier copy of it may have been applied. ``holder`` is
    what a read found (None: the alias is free).
    """

    status: Status
    sent_at: float
    elapsed: float
    failure: Optional[Classification] = None
    resent: bool = False
    holder: Optional[Holder] = None
    #: A read's every service, by alias (queue tickets and reader slots are services beside the lock's).
    services: Optional[Mapping[str, Holder]] = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.status is Status.DONE

    @property
    def unanswered_copies(self) -> int:
        """How many copies of the request may have got no answer, and so may still be applied later:
        the client re-sends a dropped request 1 s and then 3 s after the first copy."""
        copies = 1 + (self.elapsed >= CLIENT_RETRY_DELAY) + (self.elapsed >= 3 * CLIENT_RETRY_DELAY)
        if not self.resent:
            copies = 1
        if self.failure is not None and self.failure.in_flight:
            return copies
        return copies - 1

    @property
    def may_land_later(self) -> bool:
        """True when the request (or an earlier copy the client sent) got no answer: it may still be on
        its way or queued in the server, and be applied later than this result."""
        return self.unanswered_copies > 0

    @property
    def answered_at(self) -> float:
        """When the answer came (monotonic): the latest moment the server can have served what it shows. A
        slow call, or a copy the client re-sent, shows the server as it was up to then, not at ``sent_at``:
        a waiter that judges a lease counts from here (from ``sent_at`` it broke a holder that a slow read
        showed seconds after it was sent, before that holder's lease had run out)."""
        return self.sent_at + self.elapsed

    def lands_by(self, request_lifetime: float) -> float:
        """Until when (monotonic) the request, if it got no answer, may still be applied."""
        return self.answered_at + request_lifetime

    def unsettled(self, request_lifetime: float, now: float) -> Optional[Tuple[float, int]]:
        """For an add that failed: until when (monotonic) the late-add watcher must watch it, and how many
        copies of it may still land (None: it cannot be in place). A copy without an answer may land until
        ``request_lifetime`` after the call; an answered failure that may have committed is settled by one
        read that does not lag."""
        if self.may_land_later:
            return self.lands_by(request_lifetime), self.unanswered_copies
        if self.may_have_committed:
            return now + 2 * FRESH_READ_LAG, 1
        return None

    @property
    def may_have_committed(self) -> bool:
        """True when the call failed but may have taken effect anyway: the server applied it and the
        reply was lost, or the client re-sent a copy and an earlier one was applied."""
        return self.failure is not None and (self.failure.maybe_committed or self.resent)


class LockAlias:
    """One alias (default ``MUTEX``) of the lock's service model in one reservation.

    ``api`` is a ``CloudShellAPISession`` (or an object with its methods). Every call is counted in
    :attr:`calls`; a call made with ``paced=True`` first waits on the :class:`~.pacing.CallBudget`
    (never past ``deadline``), which is how waiters stay polite to the shared server.
    """

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        alias: str = protocol.DEFAULT_ALIAS,
        model: str = protocol.SERVICE_MODEL,
        *,
        budget: Optional[CallBudget] = None,
        logger: Optional[logging.Logger] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if api is None or not callable(getattr(api, "AddServiceToReservation", None)):
            # The type only: a mistaken argument (a dict of settings) may hold a password.
            raise TypeError(
                f"api must be a CloudShellAPISession (or have its methods), got {type(api).__name__}"
            )
        if not isinstance(reservation_id, str) or not reservation_id.strip():
            raise ValueError("reservation_id must be the reservation's id (a non-empty string)")
        if len(reservation_id) > MAX_NAME_LENGTH or _CONTROL.search(reservation_id):
            raise ValueError(
                "reservation_id must be the reservation's id, e.g. 'a1b2c3d4-...' (one line of at most "
                f"{MAX_NAME_LENGTH} characters); got {len(reservation_id)} characters"
            )
        # Any alias a service can have: a lock checks its own name (protocol.check_lock_name) before this, and
        # an administrator's command must reach a service whatever its alias (one that only looks like MUTEX).
        protocol.check_service_alias(alias)
        self.api = api
        self.reservation_id = reservation_id
        self.alias = alias
        self.model = model
        self.budget = budget if budget is not None else budget_for(api)
        self.logger = logger
        self._clock = clock
        self._sleep = sleep
        #: API calls made through this object (catalog reads included).
        self.calls = 0

    @classmethod
    def for_lock(
        cls,
        api: Any,
        reservation_id: str,
        alias: str,
        options: Any,
        logger: Optional[logging.Logger] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> LockAlias:
        """The calls of a lock with ``options`` (a :class:`~.options.MutexOptions`: its model and its call
        budget) on ``alias``."""
        return cls(
            api,
            reservation_id,
            alias,
            options.model,
            budget=options.budget,
            logger=logger,
            clock=clock,
            sleep=sleep,
        )

    def sibling(self, alias: str, kind: Optional[Callable[..., LockAlias]] = None) -> LockAlias:
        """A :class:`LockAlias` (or ``kind``, one of its subclasses) for ``alias`` beside this one: the same
        session, reservation, model, call budget, logger and clock (a breaker, a ticket, a counter)."""
        return (kind or LockAlias)(
            self.api,
            self.reservation_id,
            alias,
            self.model,
            budget=self.budget,
            logger=self.logger,
            clock=self._clock,
            sleep=self._sleep,
        )

    # ---------------------------------------------------------------- the model

    def add_owner(
        self,
        token: str,
        label: str,
        *,
        lease: float = 0.0,
        heartbeat: str = "",
        paced: bool = False,
        deadline: Optional[Wait] = None,
    ) -> CallResult:
        """The lock's add: ``Mutex Owner`` = ``token``, plus our attributes while the model takes them:
        the label, the lease (seconds; 0 = none) and the first heartbeat value.

        What the model takes is learned from the adds (:mod:`.catalog`): when the server refuses an add
        with our attributes (an API refusal, which changed nothing), the add is made once more with
        ``Mutex Owner`` alone. A model that was replaced meanwhile (a package re-imported) is learned
        again the same way. One or two calls.
        """
        known = catalog.accepted(self.api, self.model)
        names = catalog.FULL if known is None else known
        attributes = self._owner_attributes(names, token, label, lease, heartbeat)
        result = self.try_add(attributes, paced=paced, deadline=deadline)
        refused = result.status is Status.FATAL and result.failure.code is not None
        if refused and names != catalog.OWNER_ONLY:
            names = catalog.OWNER_ONLY
            attributes = self._owner_attributes(names, token, label, lease, heartbeat)
            result = self.try_add(attributes, paced=paced, deadline=deadline)
        if result.ok or (refused and result.status is Status.BUSY):
            # Refused with our attributes and then busy with Mutex Owner alone: the refusal is what says what
            # the model takes (as after an accepted add), or every poll of a waiter would cost two calls.
            catalog.learn(self.api, self.model, names)
        elif result.status is Status.FATAL and known is not None:
            catalog.forget(self.api, self.model)  # learn it again next time
        return result

    def probe_model(self) -> Optional[str]:
        """After an add with ``Mutex Owner`` was refused: one add *without* attributes tells, whatever the
        server's wording, 'no_owner' (accepted or busy: the model exists but lacks ``Mutex Owner``),
        'missing' (refused too), or None (no answer). An accepted probe holds the alias for a moment: it
        is removed at once (it is ours: the add succeeded)."""
        probe = self.try_add([])
        if probe.ok:
            removed = self.remove_once()
            if not (removed.ok or removed.status is Status.MISSING) and self.logger is not None:
                self.logger.warning(
                    "cloudshell-mutex: could not remove the attribute-less %s added to test the model (%s): "
                    "remove it",
                    self.alias,
                    removed.failure.message,
                )
            return "no_owner"
        if probe.status is Status.BUSY:
            return "no_owner"
        return "missing" if probe.status is Status.FATAL and probe.failure.code is not None else None

    def _owner_attributes(
        self, names: FrozenSet[str], token: str, label: str, lease: float, heartbeat: str
    ) -> List[AttributeNameValue]:
        attributes = [AttributeNameValue(protocol.ATTR_OWNER, token)]
        if protocol.ATTR_LABEL in names:
            attributes.append(AttributeNameValue(protocol.ATTR_LABEL, sanitize_label(label)))
        if protocol.ATTR_LEASE_SECONDS in names:
            # "0" means "no lease": such a holder is never judged stale.
            attributes.append(AttributeNameValue(protocol.ATTR_LEASE_SECONDS, _seconds(lease)))
        if protocol.ATTR_HEARTBEAT in names and heartbeat:
            attributes.append(AttributeNameValue(protocol.ATTR_HEARTBEAT, heartbeat))
        return attributes

    def owner_shown(self, token: str) -> str:
        """How the ``Mutex Owner`` of this alias's service shows the acquisition ``token``, for people."""
        return repr(token)

    def learn_from(self, service: Optional[Holder], token: str) -> None:
        """An add of ours whose answer was lost, shown by a read (``service`` carries ``token``): the
        attributes it shows are what the model took, as an answered add would have told (:mod:`.catalog`).
        Without this, a lock whose first add in a process was settled by a read carried the lease that add
        wrote, and its holder, thinking the model had none, never heartbeat it: waiters broke it."""
        if service is None or service.token != token or catalog.accepted(self.api, self.model) is not None:
            return
        catalog.learn(
            self.api, self.model, (frozenset(service.attributes) & catalog.FULL) | catalog.OWNER_ONLY
        )

    def takes(self, attribute: str) -> bool:
        """True when this process learned that the server's model takes ``attribute`` (from an add)."""
        known = catalog.accepted(self.api, self.model)
        return known is not None and attribute in known

    # ---------------------------------------------------------------- the calls

    def try_add(
        self, attributes: Sequence[Any], *, paced: bool = False, deadline: Optional[Wait] = None
    ) -> CallResult:
        """``AddServiceToReservation`` of the alias: DONE means the lock is ours (the alias is unique),
        BUSY that it is taken. After a failure, ``may_have_committed`` says whether our add may be in
        place all the same (the client re-sends dropped requests by itself)."""
        return self._send(
            "AddServiceToReservation",
            (self.reservation_id, self.model, self.alias, list(attributes)),
            paced,
            deadline,
            busy=ErrorKind.CONTENTION,
        )

    def read(self, *, paced: bool = False, deadline: Optional[Wait] = None) -> CallResult:
        """Who holds the alias now: one ``GetReservationDetails`` with the cache disabled.

        The server caches that call for 5 seconds, and a cached answer must never decide who owns a
        lock (the original v2 snippet's mistake). ``holder`` is None when the alias is free;
        ``services`` holds every service of the reservation by alias, as this one read saw them together
        (a snapshot of several lock aliases: queue tickets, reader slots).
        """
        return self._send(
            "GetReservationDetails", (self.reservation_id,), paced, deadline, read=True, disableCache=True
        )

    def remove_once(
        self, *, also: Sequence[str] = (), paced: bool = False, deadline: Optional[Wait] = None
    ) -> CallResult:
        """``RemoveServicesFromReservation`` of the alias (and of the aliases ``also``, in the same call),
        sent exactly once.

        The remove cannot check the owner: whoever holds the alias when it lands loses it. If its
        reply is lost, the client would re-send it a second later, when a waiter may hold the alias;
        so the client's re-send is off, and the caller decides after a fresh read. MISSING: the
        alias was not there (``resent`` then means an earlier copy of ours may have removed it). With
        ``also``, MISSING says only that one of them was missing: whether the others went is not known
        (a server may remove none of them, or those that exist), and a read must tell.
        """
        with sent_once(self.api) as may_resend:
            result = self._send(
                "RemoveServicesFromReservation",
                (self.reservation_id, [self.alias, *also]),
                paced,
                deadline,
                missing=ErrorKind.ALIAS_MISSING,
            )
        if not may_resend and result.resent:
            result = CallResult(result.status, result.sent_at, result.elapsed, result.failure, False)
        return result

    def set_attributes(
        self, values: Sequence[Tuple[str, str]], *, paced: bool = False, deadline: Optional[Wait] = None
    ) -> CallResult:
        """``SetServiceAttributesValues`` on the alias's service: overwrite ``(name, value)`` pairs.

        There is no compare-and-set: the values land on whoever holds the alias when the call lands.
        MISSING: the alias was not there.
        """
        attributes = [AttributeNameValue(name, value) for name, value in values]
        return self._send(
            "SetServiceAttributesValues",
            (self.reservation_id, self.alias, attributes),
            paced,
            deadline,
            missing=ErrorKind.ALIAS_MISSING,
        )

    def write_output(
        self, message: str, *, warning: bool = False, paced: bool = False, deadline: Optional[Wait] = None
    ) -> CallResult:
        """``WriteMessageToReservationOutput``: a line in the sandbox output that people watch.

        ``message`` is plain text; the pane renders HTML, so it is made one safe line here
        (:func:`~.text.output_line`: invisible characters removed, cut, escaped) and a ``warning`` (a
        break, a forced release, a lost lock) is styled to stand out."""
        line = output_line(message, warning)
        return self._send("WriteMessageToReservationOutput", (self.reservation_id, line), paced, deadline)

    @property
    def domain(self) -> str:
        """The domain the session logged on to ("" when unknown): it sees only that domain's sandboxes."""
        return str(getattr(self.api, "domain", "") or "")

    def reservation_state(self) -> Optional[str]:
        """'active', 'ended', 'missing', or None when the status cannot be read (one counted call).

        Message text alone is not trusted to say that a reservation is gone; this read confirms it.
        """
        self.calls += 1
        try:
            status = self.api.GetReservationStatus(self.reservation_id).ReservationSlimStatus
        except Exception as exc:
            failure = classify(exc)
            if failure.kind is ErrorKind.NOT_ACTIVE and "ended" in failure.message.lower():
                return "ended"
            if failure.kind in (ErrorKind.NOT_ACTIVE, ErrorKind.FATAL) and failure.code is not None:
                # The server refused to read this reservation, whatever its words: there is none to lock.
                return "missing"
            return None
        if str(getattr(status, "Status", "") or "").strip().lower() in ENDED_STATES:
            return "ended"
        return "active"

    # ---------------------------------------------------------------- plumbing

    def _send(
        self,
        method: str,
        args: tuple,
        paced: bool,
        deadline: Optional[Wait],
        *,
        busy: Optional[ErrorKind] = None,
        missing: Optional[ErrorKind] = None,
        read: bool = False,
        **kwargs: Any,
    ) -> CallResult:
        if paced:
            wait = self.budget.reserve()
            if wait > 0:
                self._sleep(max(0.0, wait) if deadline is None else deadline.clip(wait))
        self.calls += 1
        sent_at = self._clock()
        with copies_sent(self.api) as copies:
            try:
                answer = getattr(self.api, method)(*args, **kwargs)
            except Exception as exc:
                elapsed = self._clock() - sent_at
                failure = classify(exc)
                if failure.kind is busy and busy is not None:
                    status = Status.BUSY
                elif failure.kind is missing and missing is not None:
                    status = Status.MISSING
                elif failure.kind is ErrorKind.TRANSIENT:
                    status = Status.TRANSIENT
                else:
                    status = Status.FATAL
                return CallResult(status, sent_at, elapsed, failure, _resent(copies, elapsed))
        elapsed = self._clock() - sent_at
        services = holders_in(answer) if read else None
        holder = services.get(self.alias) if services is not None else None
        # A success may come from the client's re-send: then an earlier copy got no answer.
        return CallResult(
            Status.DONE, sent_at, elapsed, resent=_resent(copies, elapsed), holder=holder, services=services
        )

    def __repr__(self) -> str:
        return f"<LockAlias {self.alias!r} reservation={self.reservation_id}>"


def _resent(copies: Optional[List[bool]], elapsed: float) -> bool:
    """True when a copy the client sent before the last may have reached the server (and so be applied, or
    answered in its place): told by :func:`~.classify.copies_sent` when it can, else by the duration."""
    if copies is None:
        return may_have_resent(elapsed)
    return any(copies[:-1])


def _seconds(value: float) -> str:
    """A number of seconds as the Numeric attribute's text: "60", "2.5"."""
    return f"{value:g}"
