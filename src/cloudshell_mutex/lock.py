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
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import weakref
from typing import Any, Callable, Iterator, List, Optional, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue

from . import catalog, events, protocol
from .classify import Classification, ErrorKind, classify
from .errors import (
    MutexError,
    MutexLostError,
    MutexNotInstalled,
    MutexPermissionError,
    MutexReleaseError,
    MutexTimeout,
    MutexUsageError,
    ReservationNotActive,
)
from .events import EventHook, MutexEvent
from .holder import Holder, read_holder
from .owner_token import make_token, sanitize_label
from .pacing import CallBudget, DefaultPacing, ExponentialBackoff, PacingPolicy, budget_for, clip

#: Reservation states (GetReservationStatus ... .Status) in which nothing can be locked any more.
_ENDED_STATES = frozenset({"completed", "ended", "cancelled", "canceled", "terminated"})

#: CloudShellAPISession re-sends a request whose connection failed, after 1 s, then 2 s
#: (common_cloudshell_api.retry, max_attempts=3). A call that took this long may hide such a re-send,
#: so an earlier copy of it may have committed.
_CLIENT_RETRY_DELAY = 1.0

_send_once_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_send_once_guard = threading.Lock()


@contextlib.contextmanager
def _sent_once(api: Any) -> Iterator[bool]:
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
    with _send_once_guard:
        lock = _send_once_locks.setdefault(api, threading.Lock())
    with lock:
        saved, api._attempts = api._attempts, 1
        try:
            yield False
        finally:
            api._attempts = saved


class _Attempt:
    """Book-keeping of one acquire() or release() call."""

    def __init__(self, token: str, start: float, deadline: Optional[float]) -> None:
        self.token = token
        self.start = start
        self.deadline = deadline
        self.attempts = 0
        self.calls = 0
        self.contentions = 0
        self.transients = 0
        self.contention_delay = 0.0
        self.backoff_delay = 0.0
        # True while an add may have committed without us knowing (its response was lost).
        self.ambiguous = False
        # True when a successful fresh read happened after the last add: nothing new to learn.
        self.read_since_add = False
        # Calls wait on the call budget only while polling: never the first add, never a release.
        self.paced = False
        self.last_read_at: Optional[float] = None  # last successful fresh read
        self.last_read_attempt: Optional[float] = None  # last read tried, successful or not
        self.contended_since: Optional[float] = None
        self.holder: Optional[Holder] = None
        self.holder_since: Optional[float] = None
        self.last_progress: Optional[float] = None
        self.last_error: Optional[str] = None


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
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 seconds, or None to wait forever")
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
        op = _Attempt(self._token or "", self._clock(), None)
        try:
            return self._read(op)
        except Exception as exc:
            raise self._diagnose(op, exc, classify(exc), "reading the lock holder") from exc

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
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 seconds, or None to wait forever")
        start = self._clock()
        deadline = start if not blocking else (None if timeout is None else start + timeout)
        op = _Attempt(make_token(self.owner), start, deadline)
        try:
            return self._acquire(op, blocking)
        except Exception:
            raise
        except BaseException:
            # Ctrl-C (or SystemExit) while an add was on the wire, or just after it: the add may
            # have committed with nobody left to release it. Undo it if a fresh read shows it.
            self._abandon(op)
            raise

    def _acquire(self, op: _Attempt, blocking: bool) -> bool:
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
                resent = self._clock() - sent_at >= _CLIENT_RETRY_DELAY
                if failure.kind is ErrorKind.CONTENTION:
                    # Step 2: contention. It may be our own add, re-sent by the client after it had
                    # committed. So the first contention, a slow one, or any after an unknown outcome
                    # reads the owner; later ones do so every holder_check_interval.
                    if self._on_contention(op, sent_at, resent):
                        return self._acquired(op, op.last_read_at or sent_at, resolved=True)
                    # Freed since the add failed (the read found nobody): retry at once.
                    freed = op.read_since_add and op.holder is None
                    delay = 0.0 if freed else self._next_delay(op)
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
                    raise self._fatal(op, exc, failure, model, "adding the lock service") from exc
            else:
                if not self.verify or self._verified(op):
                    return self._acquired(op, sent_at)
                delay = self._next_delay(op)
            op.paced = True  # from here on, this acquisition polls: its calls wait on the budget

            # Step 5: never proceed without the lock. At the deadline, settle and raise.
            now = self._clock()
            if op.deadline is not None and now >= op.deadline:
                return self._give_up(op, blocking)
            self._write_progress(op, now)
            self._sleep(clip(delay, now, op.deadline))

    def _abandon(self, op: _Attempt) -> None:
        """Best-effort undo after an interrupt inside acquire(): remove our add if it committed."""
        self._token = None
        self._depth = 0
        if op.attempts == 0:
            return
        try:
            holder = read_holder(self._api, self.reservation_id, self.name)
            if holder is not None and holder.token == op.token:
                with _sent_once(self._api):
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
        op = _Attempt(self._token, self._clock(), None)
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
                if op.holder is None or op.holder.token != op.token:
                    # Gone, or someone else's: our earlier remove took effect, or the lock was
                    # taken from us. Either way nothing of ours is left to remove.
                    if removed:
                        self._released(op)
                        return
                    raise self._lost(op)
            sent_at = self._clock()
            may_resend = True
            try:
                with _sent_once(self._api) as may_resend:
                    self._call(op, "RemoveServicesFromReservation", self.reservation_id, [self.name])
            except Exception as exc:
                failure = classify(exc)
                resent = may_resend and self._clock() - sent_at >= _CLIENT_RETRY_DELAY
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
        raise self._release_failed(op, None, None, f"releasing the lock ({self.release_attempts} attempts)")

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

    def _on_contention(self, op: _Attempt, sent_at: float, resent: bool) -> bool:
        """Handle "already exists"; return True when the holder turns out to be this acquisition."""
        op.contentions += 1
        if op.contended_since is None:
            op.contended_since = sent_at
        now = self._clock()
        due = (
            op.contentions == 1
            or op.ambiguous
            or resent
            or op.last_read_attempt is None
            or now - op.last_read_attempt >= self.holder_check_interval
        )
        if due:
            read, holder = self._try_read(op, "reading the lock holder")
            if not read:
                return False  # read again later
            if holder is not None and holder.token == op.token:
                return True
            op.ambiguous = False  # a read after the add shows it is not ours: nothing of ours is pending
            self._note_holder(op, holder)
        if op.contentions == 1:
            self._emit(events.CONTENDED, op, holder=op.holder.label if op.holder else None)
            self._log(
                logging.INFO,
                "%s in reservation %s is held by %s; waiting",
                self.name,
                self.reservation_id,
                op.holder.label if op.holder else "another owner",
            )
        return False

    def _on_transient(self, op: _Attempt, failure: Classification, sent_at: float, resent: bool) -> bool:
        """Back off after a transient failure, then settle an unknown outcome with one fresh read."""
        op.transients += 1
        op.last_error = failure.message
        # "Never sent" describes the client's last copy only; an earlier, re-sent one may have committed.
        op.ambiguous = op.ambiguous or failure.maybe_committed or resent
        self._emit(events.TRANSIENT, op, error=failure.message)
        self._log(logging.WARNING, "transient CloudShell API failure (%s); backing off", failure.message)
        op.backoff_delay = self.backoff.next_delay(op.transients, op.backoff_delay, self._rng)
        self._sleep(clip(op.backoff_delay, self._clock(), op.deadline))
        if not op.ambiguous:
            return False
        read, holder = self._try_read(op, "reading the lock holder")
        if not read:
            return False  # still unknown: the next add (or the final read) will tell
        if holder is not None and holder.token == op.token:
            return True
        op.ambiguous = False
        if holder is not None:
            if op.contended_since is None:
                op.contended_since = sent_at
            self._note_holder(op, holder)
        return False

    def _settled_as_ours(self, op: _Attempt) -> bool:
        """Before raising a fatal error: one fresh read, its own failure ignored. True when it shows
        our token (an earlier add committed after all); a read showing anything else ends the doubt."""
        try:
            holder = self._read(op)
        except Exception as exc:
            op.last_error = classify(exc).message
            return False
        if holder is not None and holder.token == op.token:
            return True
        op.ambiguous = False
        return False

    def _verified(self, op: _Attempt) -> bool:
        """verify=True: read the owner back after a successful add (the original v2's defence
        against a server that grants twice). One more call per acquisition."""
        read, holder = self._try_read(op, "verifying the lock owner")
        if not read:
            # The add succeeded, which is the protocol's definition of holding the lock.
            self._log(logging.WARNING, "could not verify the owner (%s); the add succeeded", op.last_error)
            return True
        if holder is not None and holder.token == op.token:
            return True
        self._log(
            logging.WARNING,
            "the add of %s succeeded but the owner read back is %s; not treating the lock as held",
            self.name,
            holder.label if holder else "nobody",
        )
        if op.contended_since is None:
            op.contended_since = self._clock()
        self._note_holder(op, holder)
        return False

    def _next_delay(self, op: _Attempt) -> float:
        op.contention_delay = self.pacing.next_delay(op.contentions or 1, op.contention_delay, self._rng)
        return op.contention_delay

    def _give_up(self, op: _Attempt, blocking: bool) -> bool:
        # Never raise while holding: if nothing was read since the last add, one final fresh read
        # (no sleep) settles whether that add, or an earlier one whose reply was lost, made us the owner.
        if not op.read_since_add:
            read, holder = self._try_read(op, "reading the lock holder")
            if read and holder is not None and holder.token == op.token:
                return self._acquired(op, op.last_read_at or self._clock(), resolved=True)
            if read:
                op.ambiguous = False
                self._note_holder(op, holder)
        now = self._clock()
        waited = now - op.start
        # blocking=False answers False only for "busy". A failing API is not "busy" (the original's
        # mistake): that raises, like a blocking acquire that ran out of time.
        busy = op.contentions > 0 or op.holder is not None
        if not blocking and busy and not op.ambiguous:
            self._log(logging.DEBUG, "%s is busy; not waiting (blocking=False)", self.name)
            return False
        raise self._timeout(op, now, waited)

    def _timeout(self, op: _Attempt, now: float, waited: float) -> MutexTimeout:
        holder = op.holder.label if op.holder else None
        waiting = (
            f"timed out after {waited:.1f} s waiting for {self.name!r} in reservation {self.reservation_id}"
        )
        held_for = None if op.holder_since is None else now - op.holder_since
        if op.ambiguous:
            message = (
                f"could not tell whether {self.name!r} in reservation {self.reservation_id} was acquired "
                f"after {waited:.1f} s: the CloudShell API kept failing ({op.last_error}). If the service "
                f"{self.name!r} exists with Mutex Owner {op.token!r}, it is this process's: remove it "
                "(cloudshell-mutex release, or RemoveServicesFromReservation)"
            )
        elif holder is not None:
            message = (
                f"{waiting}: held by {holder}, seen held for {held_for or 0.0:.1f} s; nothing was removed"
            )
        elif op.contentions:
            message = f"{waiting}: it was held at every attempt (holder unknown); nothing was removed"
        else:
            message = f"{waiting}: the CloudShell API kept failing ({op.last_error}); nothing was removed"
        self._emit(events.TIMEOUT, op, holder=holder, error=message)
        self._log(logging.WARNING, "%s", message)
        return MutexTimeout(
            message,
            holder=holder,
            held_for=held_for,
            waited=waited,
            token=op.token,
            maybe_held=op.ambiguous,
            reservation_id=self.reservation_id,
            alias=self.name,
        )

    def _acquired(self, op: _Attempt, confirmed_at: float, resolved: bool = False) -> bool:
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

    def _write_progress(self, op: _Attempt, now: float) -> None:
        if not self.progress or now - op.start < self.progress_interval:
            return
        if op.last_progress is not None and now - op.last_progress < self.progress_interval:
            return
        op.last_progress = now
        holder = op.holder.label if op.holder else "another owner"
        held = now - (op.holder_since if op.holder_since is not None else op.start)
        message = f"{sanitize_label(self.owner)}: waiting for {self.name} held by {holder} for {held:.0f} s"
        try:
            self._call(op, "WriteMessageToReservationOutput", self.reservation_id, message)
        except Exception as exc:  # progress is a courtesy; the next add reports real problems
            self._log(logging.DEBUG, "could not write progress to the reservation output: %s", exc)

    # ------------------------------------------------------------------ release steps

    def _release_failure(self, op: _Attempt, exc: Exception, retry: bool, doing: str) -> bool:
        """A failed call in release(): back off and return False to try again (transient), return
        True when the reservation has ended (released: the lock went with it), raise otherwise."""
        failure = classify(exc)
        if failure.kind is ErrorKind.TRANSIENT and retry:
            op.transients += 1
            op.last_error = failure.message
            self._emit(events.TRANSIENT, op, error=failure.message)
            self._sleep(self.backoff.next_delay(op.transients, 0.0, self._rng))
            return False
        if self._reservation_gone(op, failure):
            self._released(op, note="the reservation has ended; the lock went with it")
            return True
        raise self._release_failed(op, exc, failure, doing) from exc

    def _released(self, op: _Attempt, note: Optional[str] = None) -> None:
        token = self._token
        self._token = None
        self._depth = 0
        self._confirmed_at = float("-inf")
        self._emit(events.RELEASED, op, error=note)
        self._log(
            logging.INFO,
            "released %s in reservation %s (%s)%s",
            self.name,
            self.reservation_id,
            token,
            f": {note}" if note else "",
        )

    def _lost(self, op: _Attempt) -> MutexLostError:
        holder = op.holder.label if op.holder else "nobody"
        self._token = None
        self._depth = 0
        self._confirmed_at = float("-inf")
        message = (
            f"{self.name!r} in reservation {self.reservation_id} was no longer held by this acquisition "
            f"({op.token}) at release; it is held by {holder}. Nothing was removed. Someone removed the "
            "lock while it was held (an operator, or code that removes MUTEX without owning it), so the "
            "work done under it may not have been exclusive"
        )
        self._emit(events.LOST, op, holder=None if op.holder is None else holder, error=message)
        self._log(logging.WARNING, "%s", message)
        return MutexLostError(message, reservation_id=self.reservation_id, alias=self.name)

    def _release_failed(
        self, op: _Attempt, exc: Optional[BaseException], failure: Optional[Classification], doing: str
    ) -> MutexReleaseError:
        reason = failure.message if failure is not None else op.last_error
        message = (
            f"could not release {self.name!r} in reservation {self.reservation_id} while {doing}: {reason}. "
            f"The lock may still be held (Mutex Owner {op.token!r}); call release() again, or remove the "
            "service with `cloudshell-mutex release` once the server answers"
        )
        self._emit(events.ERROR, op, error=message)
        self._log(logging.ERROR, "%s", message)
        return MutexReleaseError(
            message,
            reservation_id=self.reservation_id,
            alias=self.name,
            code=failure.code if failure else None,
            api_message=failure.message if failure else None,
        )

    def _reservation_gone(self, op: _Attempt, failure: Classification) -> bool:
        return failure.kind is ErrorKind.NOT_ACTIVE and self._reservation_state(op) != "active"

    # ------------------------------------------------------------------ shared helpers

    def _count_call(self, op: _Attempt) -> None:
        """Book one API call; while polling, first wait for the call budget (never past the deadline)."""
        if op.paced:
            wait = self.budget.reserve()
            if wait > 0:
                self._sleep(clip(wait, self._clock(), op.deadline))
        op.calls += 1
        self.calls += 1

    def _call(self, op: _Attempt, method: str, *args: Any) -> Any:
        self._count_call(op)
        return getattr(self._api, method)(*args)

    def _read(self, op: _Attempt) -> Optional[Holder]:
        """One fresh read of the holder. Records when ownership was last confirmed."""
        self._count_call(op)
        sent_at = op.last_read_attempt = self._clock()
        holder = read_holder(self._api, self.reservation_id, self.name)
        op.last_read_at = sent_at
        op.read_since_add = True
        if holder is not None and self._token is not None and holder.token == self._token:
            self._confirmed_at = sent_at
        return holder

    def _try_read(self, op: _Attempt, doing: str) -> Tuple[bool, Optional[Holder]]:
        """A fresh read during acquire: (True, holder or None), or (False, None) after a transient
        failure (recorded in ``op``). Fatal failures raise."""
        try:
            return True, self._read(op)
        except Exception as exc:
            failure = classify(exc)
            if failure.kind is not ErrorKind.TRANSIENT:
                raise self._fatal(op, exc, failure, None, doing) from exc
            op.transients += 1
            op.last_error = failure.message
            self._log(logging.DEBUG, "fresh read failed (%s)", failure.message)
            return False, None

    def _note_holder(self, op: _Attempt, holder: Optional[Holder]) -> None:
        if holder is None:
            op.holder = None
            op.holder_since = None
            return
        if op.holder is None or op.holder.token != holder.token:
            # First sight of this holder: it has held the lock at least since the contention that
            # preceded this read (this waiter's monotonic clock; no server clocks are compared).
            since = (
                op.contended_since
                if op.holder is None and op.contended_since is not None
                else op.last_read_at
            )
            first = op.holder is None
            op.holder = holder
            op.holder_since = since
            if not first:
                self._emit(events.CONTENDED, op, holder=holder.label)
                self._log(logging.INFO, "%s is now held by %s", self.name, holder.label)

    def _fatal(
        self,
        op: _Attempt,
        exc: BaseException,
        failure: Classification,
        model: Optional[catalog.ModelInfo],
        doing: str,
    ) -> MutexError:
        error = self._diagnose(op, exc, failure, doing, model)
        if op.ambiguous:  # an add of ours may have committed, and no read could tell
            error.args = (
                f"{error}. An earlier add may have succeeded: if {self.name!r} has Mutex Owner "
                f"{op.token!r}, it is this process's; remove it (cloudshell-mutex release)",
            )
        self._emit(events.ERROR, op, error=str(error))
        self._log(logging.ERROR, "%s", error)
        error.__cause__ = exc
        return error

    def _diagnose(
        self,
        op: _Attempt,
        exc: BaseException,
        failure: Classification,
        doing: str,
        model: Optional[catalog.ModelInfo] = None,
    ) -> MutexError:
        """Turn a fatal failure into an error that says what to do."""
        where = dict(
            reservation_id=self.reservation_id,
            alias=self.name,
            code=failure.code,
            api_message=failure.message,
        )
        kind = failure.kind
        if kind in (ErrorKind.NOT_ACTIVE, ErrorKind.FATAL, ErrorKind.ALIAS_MISSING):
            # Confirm with the reservation's status rather than trusting message text alone.
            state = self._reservation_state(op)
            if state in ("ended", "missing") or (kind is ErrorKind.NOT_ACTIVE and state is None):
                what = "has ended" if state == "ended" else "was not found"
                return ReservationNotActive(
                    f"reservation {self.reservation_id} {what} "
                    f"({failure.message}); there is nothing to lock. Check the reservation id, and lock only "
                    "while the sandbox is active",
                    **where,
                )
            if model is not None and not model.listed and kind is not ErrorKind.NOT_ACTIVE:
                kind = ErrorKind.NOT_INSTALLED  # the catalog did not list the model either
        if kind is ErrorKind.NOT_INSTALLED:
            catalog.forget(self._api, self.model)
            return MutexNotInstalled(
                f"the service model {self.model!r} is not installed on the CloudShell server, or lacks an "
                f"attribute the lock writes ({failure.message}): import Mutex_Package.zip "
                "(`cloudshell-mutex install`, or Manage > Import Package as a system administrator)",
                **where,
            )
        if kind is ErrorKind.PERMISSION:
            return MutexPermissionError(
                f"CloudShell refused {doing} in reservation {self.reservation_id}: {failure.message}. The "
                "lock needs a session allowed to add and remove services in the reservation (the Mutex "
                "Service family is admin-only: use the admin token of the driver/script context)",
                **where,
            )
        if kind is ErrorKind.TRANSIENT:
            return MutexError(
                f"CloudShell API unavailable while {doing}: {failure.message}; try again", **where
            )
        return MutexError(
            f"unexpected CloudShell error while {doing} in reservation {self.reservation_id}: "
            f"{'code ' + failure.code + ': ' if failure.code else ''}{failure.message}",
            **where,
        )

    def _reservation_state(self, op: _Attempt) -> Optional[str]:
        """'active', 'ended', 'missing', or None when the status cannot be read."""
        try:
            status = self._call(op, "GetReservationStatus", self.reservation_id).ReservationSlimStatus
        except Exception as exc:
            failure = classify(exc)
            if failure.kind is ErrorKind.NOT_ACTIVE:
                return "missing" if "not found" in failure.message.lower() else "ended"
            return None
        if str(getattr(status, "Status", "") or "").strip().lower() in _ENDED_STATES:
            return "ended"
        return "active"

    def _emit(
        self, kind: str, op: _Attempt, holder: Optional[str] = None, error: Optional[str] = None
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
