"""ReservationMutex: a lock on a CloudShell reservation that never proceeds without the lock.

The protocol (docs/protocol.md explains it step by step):

* acquire = ``AddServiceToReservation(res, "Mutex Service", alias, [Mutex Owner=<token>, ...])``.
  The server lets only one service per alias exist, so the add succeeds for exactly one caller.
  The token, unique per acquisition, is written *in the same call*, so the service itself says
  who added it: any later doubt ("did my add commit?") is settled by one fresh read.
* release = ``RemoveServicesFromReservation(res, [alias])``, but only while the alias is ours.
  The remove cannot check the owner itself, so ownership is checked just before it, and it is
  sent once: the client's own re-send of a dropped remove could delete a successor's lock.

Compatible with the original snippet (QualiSystemsLab/Reservation-Mutex-Lock): same model, alias and
"success of the add = held" rule, so old and new code exclude each other.

This module is the protocol. Around it: :mod:`.attempt` keeps one acquisition's record,
:mod:`.classify` sorts failures, :mod:`.diagnosis` words the errors, :mod:`.session` knows the
client's hidden re-send, :mod:`.catalog` the installed model, :mod:`.pacing` the waits.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from cloudshell.api.cloudshell_api import AttributeNameValue

from . import catalog, diagnosis, events, protocol, session
from .attempt import Attempt
from .classify import Classification, ErrorKind, classify
from .errors import MutexError, MutexNotInstalled, MutexUsageError
from .events import EventHook, MutexEvent
from .holder import Holder, read_holder
from .owner_token import make_token, sanitize_label
from .pacing import CallBudget, DefaultPacing, ExponentialBackoff, PacingPolicy, budget_for, clip

_E = TypeVar("_E", bound=MutexError)


class ReservationMutex:
    """A mutual-exclusion lock on one CloudShell reservation, shared by every process that uses
    the same alias (default ``MUTEX``), including code that runs the original snippet.

    ``api`` is a ``CloudShellAPISession`` (or an object with the same methods). ``owner`` is a short
    label for people ("Router A driver"); each acquisition writes a unique token built from it.
    ``timeout`` (seconds, None = wait forever) bounds a blocking acquire; on timeout
    :class:`MutexTimeout` is raised and nothing is removed.

    Keyword options:

    * ``pacing``: policy between contended attempts (default :class:`DefaultPacing`);
      ``backoff``: policy after transient failures (default :class:`ExponentialBackoff`);
      ``budget``: a :class:`CallBudget` for the calls made while waiting (default: one shared by
      all locks on this ``api`` in this process).
    * ``verify``: read the owner back after a successful add (one more call per acquisition).
    * ``reentrant``: let the holding object acquire again (counted; released by the outermost release).
      Without it, re-entering raises :class:`MutexUsageError`.
    * ``release_check_after``: release skips its ownership read if ownership was confirmed less
      than this many seconds ago (0 = always read first). See docs/protocol.md for the trade-off.
    * ``holder_check_interval``: while waiting, read the holder at most this often.
    * ``progress``/``progress_interval``: write "waiting for MUTEX held by ..." to the reservation
      output, at most every ``progress_interval`` seconds.
    * ``release_attempts``: how many times a release retries transient failures.
    * ``on_event``: called with a :class:`MutexEvent` for each acquired, contended, released, lost,
      error, timeout, transient and resolved event.

    One object is one lock handle: do not share it between threads; give each thread its own.
    """

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        owner: str = "cloudshell-mutex",
        name: str = protocol.DEFAULT_ALIAS,
        timeout: Optional[float] = 300.0,
        logger: Optional[logging.Logger] = None,
        *,
        pacing: Optional[PacingPolicy] = None,
        backoff: Optional[PacingPolicy] = None,
        budget: Optional[CallBudget] = None,
        verify: bool = False,
        reentrant: bool = False,
        release_check_after: float = 5.0,
        holder_check_interval: float = 5.0,
        progress: bool = False,
        progress_interval: float = 10.0,
        release_attempts: int = 5,
        on_event: Optional[EventHook] = None,
        model: str = protocol.SERVICE_MODEL,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Optional[random.Random] = None,
    ) -> None:
        if api is None or not callable(getattr(api, "AddServiceToReservation", None)):
            # The type only: a mistaken argument (a dict of settings) may hold a password.
            raise TypeError(
                f"api must be a CloudShellAPISession (or have its methods), got {type(api).__name__}"
            )
        if not isinstance(reservation_id, str) or not reservation_id.strip():
            raise ValueError("reservation_id must be the reservation's id (a non-empty string)")
        if not isinstance(name, str) or not name.strip():
            raise ValueError("name (the lock's service alias) must be a non-empty string, e.g. 'MUTEX'")
        _check_timeout(timeout)
        if release_check_after < 0 or holder_check_interval < 0 or progress_interval <= 0:
            raise ValueError(
                "release_check_after and holder_check_interval must be >= 0, progress_interval > 0"
            )
        if release_attempts < 1:
            raise ValueError("release_attempts must be >= 1")
        self._api = api
        self.reservation_id = reservation_id
        self.owner = str(owner)
        self.name = name
        self.timeout = timeout
        self.logger = logger
        self.pacing: PacingPolicy = pacing if pacing is not None else DefaultPacing()
        self.backoff: PacingPolicy = backoff if backoff is not None else ExponentialBackoff()
        self.budget = budget if budget is not None else budget_for(api)
        self.verify = verify
        self.reentrant = reentrant
        self.release_check_after = release_check_after
        self.holder_check_interval = holder_check_interval
        self.progress = progress
        self.progress_interval = progress_interval
        self.release_attempts = release_attempts
        self.on_event = on_event
        self.model = model
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        # The acquisition held now: its token (None = not held), nesting depth, and when a fresh
        # answer from the server last showed the lock is ours (the add itself, or a read).
        self._token: Optional[str] = None
        self._depth = 0
        self._confirmed_at = float("-inf")
        #: API calls made by this object in total (catalog detection included).
        self.calls = 0

    # ------------------------------------------------------------------ public API

    @property
    def token(self) -> Optional[str]:
        """The owner token of the current acquisition, or None when not held."""
        return self._token

    def locked(self) -> bool:
        """True while this object holds the lock (as far as it knows; see docs/protocol.md)."""
        return self._token is not None

    def holder(self) -> Optional[Holder]:
        """Who holds the lock now (one fresh, uncached read), or None when it is free."""
        op = Attempt(self._token or "", self._clock())
        try:
            return self._read(op)
        except Exception as exc:
            raise self._diagnose(op, classify(exc), "reading the lock holder") from exc

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take the lock.

        Blocking (the default), it returns True once held, or raises :class:`MutexTimeout` when
        ``timeout`` (default: the constructor's) runs out: it never returns without the lock.
        With ``blocking=False`` it makes exactly one add attempt and returns False when the lock is
        busy. Fatal problems raise at once (see :mod:`cloudshell_mutex.errors`).
        """
        if self._token is not None:
            if self.reentrant:
                self._depth += 1
                return True
            raise MutexUsageError(
                f"this ReservationMutex already holds {self.name!r} in reservation {self.reservation_id}; "
                "release it first, pass reentrant=True to allow nesting, or use one object per task",
                reservation_id=self.reservation_id,
                alias=self.name,
            )
        if timeout is None:
            timeout = self.timeout
        _check_timeout(timeout)
        start = self._clock()
        deadline = start if not blocking else (None if timeout is None else start + timeout)
        op = Attempt(make_token(self.owner), start, deadline)
        try:
            return self._acquire(op, blocking)
        except Exception:
            raise
        except BaseException:
            # Ctrl-C (or SystemExit) while an add was on the wire, or just after it: the add may
            # have committed with nobody left to release it. Undo it if a fresh read shows it.
            self._abandon(op)
            raise

    def _acquire(self, op: Attempt, blocking: bool) -> bool:
        model, calls = catalog.detect_model(self._api, self.model, self.logger)
        self.calls += calls
        model_from_cache = calls == 0
        attributes = self._add_attributes(model, op.token)

        while True:
            # Step 1: the add. Its success is the lock; the owner token travels in the same call.
            op.attempts += 1
            op.read_since_add = False
            sent_at = self._clock()
            try:
                self._call(
                    op, "AddServiceToReservation", self.reservation_id, self.model, self.name, attributes
                )
            except Exception as exc:
                failure = classify(exc)
                # The client re-sends a dropped request by itself, 1 s later: a call that took that
                # long may have committed an earlier copy of this add.
                resent = session.may_have_resent(self._clock() - sent_at)
                if failure.kind is ErrorKind.CONTENTION:
                    # Step 2: contention. It may be our own add, re-sent by the client after it had
                    # committed. So the first contention, a slow one, or any after an unknown outcome
                    # reads the owner; later ones do so every holder_check_interval.
                    if self._on_contention(op, sent_at, resent):
                        return self._acquired(op, op.last_read_at or sent_at, resolved=True)
                    # Freed since the add failed (the read found nobody): retry at once.
                    freed = op.read_since_add and op.holder is None
                    delay = 0.0 if freed else op.next_pause(self.pacing, self._rng)
                elif failure.kind is ErrorKind.TRANSIENT:
                    # Step 3: transient failure (5xx, dropped connection, timeout). Back off on a
                    # separate schedule, then settle with one fresh read: the add may have committed.
                    if self._on_transient(op, failure, sent_at, resent):
                        return self._acquired(op, op.last_read_at or sent_at, resolved=True)
                    delay = 0.0  # already backed off
                elif failure.kind is ErrorKind.NOT_INSTALLED and model_from_cache and model.listed:
                    # The model changed since this process cached the catalog (package re-imported):
                    # detect it again, once, and retry at once.
                    catalog.forget(self._api, self.model)
                    model, calls = catalog.detect_model(self._api, self.model, self.logger)
                    self.calls += calls
                    op.calls += calls
                    model_from_cache = False
                    attributes = self._add_attributes(model, op.token)
                    continue
                else:
                    # Step 4: fatal. A refusal by the server committed nothing, but another failure
                    # (a 2xx reply without a readable body), or an earlier unknown outcome, may have
                    # left our add in place: never raise while holding. Settle with one read first.
                    op.ambiguous = op.ambiguous or failure.maybe_committed or resent
                    if op.ambiguous and self._settled_as_ours(op):
                        return self._acquired(op, op.last_read_at or sent_at, resolved=True)
                    raise self._fatal(op, failure, model, "adding the lock service") from exc
            else:
                if not self.verify or self._verified(op):
                    return self._acquired(op, sent_at)
                delay = op.next_pause(self.pacing, self._rng)
            op.paced = True  # from here on, this acquisition polls: its calls wait on the budget

            # Step 5: never proceed without the lock. At the deadline, settle and raise.
            now = self._clock()
            if op.deadline is not None and now >= op.deadline:
                return self._give_up(op, blocking)
            self._write_progress(op, now)
            self._sleep(clip(delay, now, op.deadline))

    def _abandon(self, op: Attempt) -> None:
        """Best-effort undo after an interrupt inside acquire(): remove our add if it committed."""
        self._forget()
        if op.attempts == 0:
            return
        try:
            if op.is_ours(read_holder(self._api, self.reservation_id, self.name)):
                with session.sent_once(self._api):
                    self._api.RemoveServicesFromReservation(self.reservation_id, [self.name])
                self._log(logging.WARNING, "acquire interrupted; removed its add of %s", self.name)
        except Exception as exc:
            self._log(
                logging.WARNING,
                "acquire interrupted and the clean-up failed (%s): if %s in reservation %s has "
                "Mutex Owner %s, remove it",
                classify(exc).message,
                self.name,
                self.reservation_id,
                op.token,
            )

    def release(self) -> None:
        """Release the lock if this object holds it; otherwise do nothing (idempotent).

        Raises :class:`MutexLostError` when the lock turned out not to be ours any more (nothing is
        removed), and :class:`MutexReleaseError` when the remove kept failing (the object still
        holds the lock then, so release() can be called again).
        """
        if self._token is None:
            self._log(logging.DEBUG, "release of %s: not held by this object, nothing to do", self.name)
            return
        if self._depth > 1:
            self._depth -= 1
            return
        op = Attempt(self._token, self._clock())
        # Release only what you hold. The remove cannot check the owner, so read first, unless
        # ownership was confirmed a moment ago (the add itself, or a later fresh read). That skip is
        # what makes an uncontended acquire + release cost 2 calls; the window it leaves open (a
        # protocol violator removing and re-adding within it) is documented.
        check = self.release_check_after <= 0 or op.start - self._confirmed_at >= self.release_check_after
        removed = False  # True once a remove of ours may have taken effect (its reply was lost)
        for attempt in range(1, self.release_attempts + 1):
            retry = attempt < self.release_attempts
            if check:
                try:
                    op.holder = self._read(op)
                except Exception as exc:
                    if self._release_failure(op, exc, retry, "checking the lock owner before removing it"):
                        return
                    continue
                if not op.is_ours(op.holder):
                    # Gone, or someone else's: our earlier remove took effect, or the lock was
                    # taken from us. Either way nothing of ours is left to remove.
                    if removed:
                        self._released(op)
                        return
                    raise self._lost(op)
            # The remove, sent once: the client's own re-send could delete a successor's lock.
            sent_at = self._clock()
            may_resend = True
            try:
                with session.sent_once(self._api) as may_resend:
                    self._call(op, "RemoveServicesFromReservation", self.reservation_id, [self.name])
            except Exception as exc:
                failure = classify(exc)
                resent = may_resend and session.may_have_resent(self._clock() - sent_at)
                if failure.kind is ErrorKind.ALIAS_MISSING:
                    # "Not found" after a re-send of ours: our remove took effect. Otherwise the
                    # alias was gone before we removed it: the lock had been taken from us.
                    if removed or resent:
                        self._released(op)
                        return
                    op.holder = None
                    raise self._lost(op) from exc
                if failure.kind is ErrorKind.TRANSIENT:
                    # It may have committed. Never remove again before a fresh read shows the alias
                    # is still ours: in between, a waiter may have taken it.
                    removed = removed or failure.maybe_committed or resent
                    check = True
                if self._release_failure(op, exc, retry, "removing the lock service"):
                    return
            else:
                self._released(op)
                return
        doing = f"releasing the lock ({self.release_attempts} attempts)"
        raise self._report(diagnosis.release_error(op, None, doing, self.reservation_id, self.name), op)

    def __enter__(self) -> ReservationMutex:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # A failed release is raised even when the block raised: a lock that may still be held or
        # was lost must not go unnoticed. Python chains the block's exception as __context__.
        self.release()

    def __repr__(self) -> str:
        state = f"held as {self._token!r}" if self._token else "not held"
        return f"<ReservationMutex {self.name!r} reservation={self.reservation_id} {state}>"

    # ------------------------------------------------------------------ acquire steps

    def _add_attributes(self, model: catalog.ModelInfo, token: str) -> List[AttributeNameValue]:
        attributes = [AttributeNameValue(protocol.ATTR_OWNER, token)]
        # Lease attributes only when the installed model defines them (the original has none).
        # Until leases exist, "0" seconds means "no lease": never to be judged stale.
        if model.has(protocol.ATTR_LABEL):
            attributes.append(AttributeNameValue(protocol.ATTR_LABEL, sanitize_label(self.owner)))
        if model.has(protocol.ATTR_LEASE_SECONDS):
            attributes.append(AttributeNameValue(protocol.ATTR_LEASE_SECONDS, "0"))
        return attributes

    def _on_contention(self, op: Attempt, sent_at: float, resent: bool) -> bool:
        """Handle "already exists"; return True when the holder turns out to be this acquisition."""
        op.contentions += 1
        op.contended(sent_at)
        due = (
            op.contentions == 1
            or op.ambiguous
            or resent
            or op.last_read_attempt is None
            or self._clock() - op.last_read_attempt >= self.holder_check_interval
        )
        if due:
            read, holder = self._try_read(op, "reading the lock holder")
            if not read:
                return False  # read again later
            if op.settled_by(holder):
                return True
            self._note_holder(op, holder)
        if op.contentions == 1:
            self._emit(events.CONTENDED, op, holder=op.holder_label)
            self._log(
                logging.INFO,
                "%s in reservation %s is held by %s; waiting",
                self.name,
                self.reservation_id,
                op.holder_label or "another owner",
            )
        return False

    def _on_transient(self, op: Attempt, failure: Classification, sent_at: float, resent: bool) -> bool:
        """Back off after a transient failure, then settle an unknown outcome with one fresh read."""
        op.failed(failure.message)
        # "Never sent" describes the client's last copy only; an earlier, re-sent one may have committed.
        op.ambiguous = op.ambiguous or failure.maybe_committed or resent
        self._emit(events.TRANSIENT, op, error=failure.message)
        self._log(logging.WARNING, "transient CloudShell API failure (%s); backing off", failure.message)
        self._sleep(clip(op.next_backoff(self.backoff, self._rng), self._clock(), op.deadline))
        if not op.ambiguous:
            return False
        read, holder = self._try_read(op, "reading the lock holder")
        if not read:
            return False  # still unknown: the next add (or the final read) will tell
        if op.settled_by(holder):
            return True
        if holder is not None:
            op.contended(sent_at)
            self._note_holder(op, holder)
        return False

    def _settled_as_ours(self, op: Attempt) -> bool:
        """Before raising a fatal error: one fresh read, its own failure ignored. True when it shows
        our token (an earlier add committed after all); a read showing anything else ends the doubt."""
        try:
            holder = self._read(op)
        except Exception as exc:
            op.last_error = classify(exc).message
            return False
        return op.settled_by(holder)

    def _verified(self, op: Attempt) -> bool:
        """verify=True: read the owner back after a successful add (the original v2's defence
        against a server that grants twice). One more call per acquisition."""
        read, holder = self._try_read(op, "verifying the lock owner")
        if not read:
            # The add succeeded, which is the protocol's definition of holding the lock.
            self._log(logging.WARNING, "could not verify the owner (%s); the add succeeded", op.last_error)
            return True
        if op.is_ours(holder):
            return True
        self._log(
            logging.WARNING,
            "the add of %s succeeded but the owner read back is %s; not treating the lock as held",
            self.name,
            holder.label if holder else "nobody",
        )
        op.contended(self._clock())
        self._note_holder(op, holder)
        return False

    def _give_up(self, op: Attempt, blocking: bool) -> bool:
        # Never raise while holding: if nothing was read since the last add, one final fresh read
        # (no sleep) settles whether that add, or an earlier one whose reply was lost, made us the owner.
        if not op.read_since_add:
            read, holder = self._try_read(op, "reading the lock holder")
            if read and op.settled_by(holder):
                return self._acquired(op, op.last_read_at or self._clock(), resolved=True)
            if read:
                self._note_holder(op, holder)
        now = self._clock()
        # blocking=False answers False only for "busy". A failing API is not "busy" (the original's
        # mistake): that raises, like a blocking acquire that ran out of time.
        busy = op.contentions > 0 or op.holder is not None
        if not blocking and busy and not op.ambiguous:
            self._log(logging.DEBUG, "%s is busy; not waiting (blocking=False)", self.name)
            return False
        error = diagnosis.timeout_error(op, now, self.reservation_id, self.name)
        raise self._report(error, op, events.TIMEOUT, logging.WARNING, holder=error.holder)

    def _acquired(self, op: Attempt, confirmed_at: float, resolved: bool = False) -> bool:
        self._token = op.token
        self._depth = 1
        self._confirmed_at = confirmed_at
        if resolved:
            self._emit(events.RESOLVED, op)
            self._log(logging.INFO, "an earlier add of %s turned out to have succeeded", self.name)
        self._emit(events.ACQUIRED, op)
        self._log(
            logging.INFO,
            "acquired %s in reservation %s as %s after %.2f s (%d attempts, %d calls)",
            self.name,
            self.reservation_id,
            op.token,
            self._clock() - op.start,
            op.attempts,
            op.calls,
        )
        return True

    def _write_progress(self, op: Attempt, now: float) -> None:
        if not self.progress or not op.progress_due(now, self.progress_interval):
            return
        held = now - (op.holder_since if op.holder_since is not None else op.start)
        message = (
            f"{sanitize_label(self.owner)}: waiting for {self.name} held by "
            f"{op.holder_label or 'another owner'} for {held:.0f} s"
        )
        try:
            self._call(op, "WriteMessageToReservationOutput", self.reservation_id, message)
        except Exception as exc:  # progress is a courtesy; the next add reports real problems
            self._log(logging.DEBUG, "could not write progress to the reservation output: %s", exc)

    # ------------------------------------------------------------------ release steps

    def _release_failure(self, op: Attempt, exc: Exception, retry: bool, doing: str) -> bool:
        """A failed call in release(): back off and return False to try again (transient), return
        True when the reservation has ended (released: the lock went with it), raise otherwise."""
        failure = classify(exc)
        if failure.kind is ErrorKind.TRANSIENT and retry:
            op.failed(failure.message)
            self._emit(events.TRANSIENT, op, error=failure.message)
            self._sleep(op.next_backoff(self.backoff, self._rng))
            return False
        if failure.kind is ErrorKind.NOT_ACTIVE and self._reservation_state(op) != "active":
            self._released(op, note="the reservation has ended; the lock went with it")
            return True
        error = diagnosis.release_error(op, failure, doing, self.reservation_id, self.name)
        raise self._report(error, op) from exc

    def _released(self, op: Attempt, note: Optional[str] = None) -> None:
        token = self._token
        self._forget()
        self._emit(events.RELEASED, op, error=note)
        self._log(
            logging.INFO,
            "released %s in reservation %s (%s)%s",
            self.name,
            self.reservation_id,
            token,
            f": {note}" if note else "",
        )

    def _lost(self, op: Attempt) -> MutexError:
        self._forget()
        error = diagnosis.lost_error(op, self.reservation_id, self.name)
        return self._report(error, op, events.LOST, logging.WARNING, holder=op.holder_label)

    def _forget(self) -> None:
        """This object no longer holds the lock (released, lost, or an acquire abandoned)."""
        self._token = None
        self._depth = 0
        self._confirmed_at = float("-inf")

    # ------------------------------------------------------------------ shared helpers

    def _count_call(self, op: Attempt) -> None:
        """Book one API call; while polling, first wait for the call budget (never past the deadline)."""
        if op.paced:
            wait = self.budget.reserve()
            if wait > 0:
                self._sleep(clip(wait, self._clock(), op.deadline))
        op.calls += 1
        self.calls += 1

    def _call(self, op: Attempt, method: str, *args: Any) -> Any:
        self._count_call(op)
        return getattr(self._api, method)(*args)

    def _read(self, op: Attempt) -> Optional[Holder]:
        """One fresh read of the holder. Records when ownership was last confirmed."""
        self._count_call(op)
        sent_at = op.last_read_attempt = self._clock()
        holder = read_holder(self._api, self.reservation_id, self.name)
        op.last_read_at = sent_at
        op.read_since_add = True
        if self._token is not None and holder is not None and holder.token == self._token:
            self._confirmed_at = sent_at
        return holder

    def _try_read(self, op: Attempt, doing: str) -> Tuple[bool, Optional[Holder]]:
        """A fresh read during acquire: (True, holder or None), or (False, None) after a transient
        failure (recorded in ``op``). Fatal failures raise."""
        try:
            return True, self._read(op)
        except Exception as exc:
            failure = classify(exc)
            if failure.kind is not ErrorKind.TRANSIENT:
                raise self._fatal(op, failure, None, doing) from exc
            op.failed(failure.message)
            self._log(logging.DEBUG, "fresh read failed (%s)", failure.message)
            return False, None

    def _note_holder(self, op: Attempt, holder: Optional[Holder]) -> None:
        if op.see_holder(holder):
            self._emit(events.CONTENDED, op, holder=op.holder_label)
            self._log(logging.INFO, "%s is now held by %s", self.name, op.holder_label)

    def _fatal(
        self, op: Attempt, failure: Classification, catalog_info: Optional[catalog.ModelInfo], doing: str
    ) -> MutexError:
        error = self._diagnose(op, failure, doing, catalog_info)
        if op.ambiguous:  # an add of ours may have committed, and no read could tell
            diagnosis.note_pending_add(error, self.name, op.token)
        return self._report(error, op)

    def _diagnose(
        self,
        op: Attempt,
        failure: Classification,
        doing: str,
        catalog_info: Optional[catalog.ModelInfo] = None,
    ) -> MutexError:
        """Turn a fatal failure into an error that says what to do (see :mod:`.diagnosis`)."""
        error = diagnosis.fatal_error(
            failure,
            doing,
            self.reservation_id,
            self.name,
            self.model,
            catalog_info,
            lambda: self._reservation_state(op),
        )
        if isinstance(error, MutexNotInstalled):
            catalog.forget(self._api, self.model)  # detect it again once it is installed
        return error

    def _reservation_state(self, op: Attempt) -> Optional[str]:
        """'active', 'ended', 'missing', or None when the status cannot be read (one counted call)."""
        return diagnosis.reservation_state(
            lambda: self._call(op, "GetReservationStatus", self.reservation_id)
        )

    def _report(
        self,
        error: _E,
        op: Attempt,
        kind: str = events.ERROR,
        level: int = logging.ERROR,
        holder: Optional[str] = None,
    ) -> _E:
        """Emit and log an error about to be raised; return it."""
        self._emit(kind, op, holder=holder, error=str(error))
        self._log(level, "%s", error)
        return error

    def _emit(
        self, kind: str, op: Attempt, holder: Optional[str] = None, error: Optional[str] = None
    ) -> None:
        if self.on_event is None:
            return
        event = MutexEvent(
            kind=kind,
            reservation_id=self.reservation_id,
            alias=self.name,
            token=op.token,
            waited=self._clock() - op.start,
            attempts=op.attempts,
            calls=op.calls,
            holder=holder,
            error=error,
        )
        events.emit(self.on_event, event, self.logger)

    def _log(self, level: int, message: str, *args: Any) -> None:
        if self.logger is not None:
            self.logger.log(level, "cloudshell-mutex: " + message, *args)


def _check_timeout(timeout: Optional[float]) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be >= 0 seconds, or None to wait forever")
