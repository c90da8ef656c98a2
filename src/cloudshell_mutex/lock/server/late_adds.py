"""Adds of ours that may still land after the lock stopped wanting them, watched until they cannot.

An add whose request got no answer (a reset connection, a client timeout) may still be on its way to
the server, or queued in it, and be applied seconds later: after the acquisition timed out, after it
was interrupted, or after the lock that a later add granted was released. Landing then, it re-creates
the lock service with our token, and nobody would ever remove it: every later acquirer would wait
until its timeout. :class:`LateAdds` remembers each such add until it can no longer land
(``lands_by``, from the lock's ``request_lifetime``), reads the alias now and then, and removes the
service if it shows that token. A process that exits first logs one warning per add still unsettled,
with the exact call that removes it.
"""

from __future__ import annotations

import atexit
import contextvars
import dataclasses
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ..engine import Runtime
from ..holder import named_token
from ..options import FRESH_READ_LAG, default_logger
from .alias import LockAlias, Status

#: Seconds between two reads of a watched alias.
SWEEP_INTERVAL = 1.0
#: The name of the watcher's thread (a thread dump, or a journal of calls, tells its calls apart by it).
THREAD_NAME = "cloudshell-mutex-late-adds"


@dataclass
class LateAdd:
    """One add of ours (``token`` on ``alias``) that may land until ``lands_by`` (monotonic)."""

    alias: LockAlias
    token: str
    lands_by: float
    #: The lock's ``request_lifetime``: how long a request without an answer may still land.
    lifetime: float
    #: Copies of the add that got no answer (the client re-sends dropped requests): each may land.
    copies: int = 1
    #: A remove of ours that got no answer may land until then: never send another one before.
    remove_lands_by: Optional[float] = None
    #: No read before then: a read may lag behind a removal of ours (the release's, or this watcher's),
    #: and show our token after it is gone, when the alias may already be someone else's.
    read_after: float = 0.0
    #: Not an add whose reply was lost but a service of ours left behind on purpose (a queue ticket whose
    #: hold ended): removed without a warning, this said at INFO instead.
    leftover: str = ""
    #: The context of the code that handed the add over (its logging context): the watcher's thread does
    #: this entry's work in it, so what it logs reaches the log of the command or script that took the lock.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


def removal_command(alias: LockAlias, token: str) -> str:
    """The exact call that removes a lock service left behind with ``token``, and when to make it."""
    return (
        f"if the service {alias.alias!r} in reservation {alias.reservation_id} has Mutex Owner "
        f"{alias.owner_shown(token)}, remove it: CloudShellAPISession(...)."
        f"RemoveServicesFromReservation({alias.reservation_id!r}, [{alias.alias!r}])"
    )


class LateAdds:
    """The adds this process still watches; thread-safe. One per process (:func:`process_late_adds`)
    sweeps in a daemon thread; tests make their own and call :meth:`sweep`."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        logger: Optional[logging.Logger] = None,
        background: bool = False,
        interval: float = SWEEP_INTERVAL,
    ) -> None:
        self._clock = clock
        self.logger = default_logger(logger)
        self._background = background
        self._interval = interval
        self._entries: List[LateAdd] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def watch(
        self,
        alias: LockAlias,
        token: str,
        lands_by: float,
        lifetime: float,
        copies: int = 1,
        removing_until: Optional[float] = None,
        leftover: str = "",
    ) -> None:
        """Watch an add of ``token`` that may land until ``lands_by``; nothing to do once that passed.
        ``lifetime`` is how long a request without an answer may still land (a remove this makes).
        ``removing_until``: a remove of ours without an answer may land until then; no second one before.
        ``leftover``: what the service is, when it is no late add but ours left behind (said at INFO)."""
        if lands_by <= self._clock():
            return
        with self._lock:
            for entry in self._entries:
                if entry.alias is alias and entry.token == token:
                    entry.lands_by = max(entry.lands_by, lands_by)
                    entry.copies = max(entry.copies, copies)
                    if removing_until is not None:
                        entry.remove_lands_by = max(entry.remove_lands_by or removing_until, removing_until)
                    return
            entry = LateAdd(
                alias,
                token,
                lands_by,
                lifetime,
                max(1, copies),
                remove_lands_by=removing_until,
                leftover=leftover,
            )
            entry.read_after = self._clock() + FRESH_READ_LAG
            self._entries.append(entry)
            if self._background and self._thread is None:
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
        self._wake.set()

    def remove_or_watch(self, alias: LockAlias, token: str, lifetime: float, leftover: str = "") -> None:
        """Remove ``alias`` (a service of ours with ``token``: a queue ticket, a marker; ``leftover`` says
        what it is) once, now. When the remove fails or gets no answer, the service may still be there:
        watch it, and remove it while it shows ``token``, but never while that first remove may still land
        (the alias may be someone else's by then)."""
        removed = alias.remove_once()
        if removed.ok or removed.status is Status.MISSING:
            return
        removing = removed.lands_by(lifetime) if removed.may_land_later else None
        self.watch(
            alias, token, self._clock() + lifetime, lifetime, removing_until=removing, leftover=leftover
        )

    def forget(self, which: Callable[[LateAdd], bool]) -> int:
        """Stop watching the adds ``which`` picks, with no call and no warning; return how many. For a test
        harness whose server is gone with the services (its port may serve another server next)."""
        with self._lock:
            kept = [entry for entry in self._entries if not which(entry)]
            forgotten = len(self._entries) - len(kept)
            self._entries[:] = kept
        return forgotten

    def pending(self) -> List[LateAdd]:
        """The adds still watched."""
        with self._lock:
            return list(self._entries)

    def sweep(self) -> None:
        """Read each watched alias once: remove a late add that landed, forget those that can no longer."""
        for entry in self.pending():
            # A copy each time: a context cannot be entered by two threads at once (a script's settle() and
            # the watcher's thread may sweep together).
            if entry.context.copy().run(self._settle, entry):
                with self._lock:
                    if entry in self._entries:
                        self._entries.remove(entry)

    def _settle(self, entry: LateAdd) -> bool:
        """One look at one watched add; True once it is settled."""
        alias = entry.alias
        if self._clock() < entry.read_after:
            return False
        read = alias.read()
        now = self._clock()
        if not read.ok:
            # Unreadable: it may have landed. Keep trying a while past lands_by, then say so and stop.
            if now >= entry.lands_by + entry.lifetime:
                self._warn_unsettled(entry, f"the server could not be read ({read.failure.message})")
                return True
            return False
        # A releasing marker of ours shows the token with its secret after it: named_token sees the token.
        if read.holder is None or named_token(read.holder.token) != entry.token:
            # A read shows the server as it was when the read was sent, less the lag of a fresh read: only
            # one sent that long after lands_by proves the add did not land (stopping on the answer's time
            # missed an add that landed while a slow read was on its way, and left it for good).
            seen_up_to = read.sent_at - FRESH_READ_LAG
            return seen_up_to >= entry.lands_by and not _can_land(entry.remove_lands_by, now)
        if _can_land(entry.remove_lands_by, read.sent_at - FRESH_READ_LAG):
            # Our remove of it may still land, or may have landed after what this read saw (it may be as old
            # as its dispatch less the lag): never send a second one meanwhile.
            return False
        result = alias.remove_once()
        if result.ok or result.status is Status.MISSING:
            entry.copies -= 1  # that copy landed; another may still come until lands_by
            entry.read_after = self._clock() + FRESH_READ_LAG
            if entry.leftover:
                self._logger_of(entry).info(
                    "cloudshell-mutex: removed %r in reservation %s (%s)",
                    alias.alias,
                    alias.reservation_id,
                    entry.leftover,
                )
                return entry.copies <= 0 or now >= entry.lands_by
            self._logger_of(entry).warning(
                "cloudshell-mutex: an add of %r in reservation %s whose reply was lost landed after the "
                "lock had given it up (Mutex Owner %s); removed it",
                alias.alias,
                alias.reservation_id,
                entry.token,
            )
            return entry.copies <= 0 or now >= entry.lands_by
        if result.may_land_later:
            entry.remove_lands_by = result.lands_by(entry.lifetime)
        return False

    def settle(self, timeout: float) -> bool:
        """Sweep until no add is watched or ``timeout`` seconds pass (real time); True when none is left.

        For a process about to exit on purpose (a script's end): waiting here lets a late add be
        removed instead of warned about.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.sweep()
            if not self.pending():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self._interval, max(0.0, deadline - time.monotonic())))

    def warn_unsettled(self) -> None:
        """Log one warning per add still watched (the process is exiting: nobody will watch it)."""
        for entry in self.pending():
            entry.context.copy().run(self._warn_unsettled, entry, "the process exited before it could tell")

    def _logger_of(self, entry: LateAdd) -> logging.Logger:
        """The logger of the lock that handed ``entry`` over (its alias's), else this watcher's."""
        return entry.alias.logger or self.logger

    def _warn_unsettled(self, entry: LateAdd, why: str) -> None:
        logger = self._logger_of(entry)
        where = f"{entry.alias.alias!r} in reservation {entry.alias.reservation_id}"
        what = (
            f"{entry.leftover} ({where}) may be left behind"
            if entry.leftover
            else f"an add of {where} whose reply was lost may still land or have landed"
        )
        message = f"cloudshell-mutex: {what} ({why}); " + removal_command(entry.alias, entry.token)
        logger.warning("%s", message)
        if not _heard(logger):
            # The library's logger has only a NullHandler: an application that set up no logging would never
            # see how to remove a lock left behind. Say it on stderr, as Python's last-resort handler would.
            print(message, file=sys.stderr, flush=True)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.sweep()
            except Exception:  # never let the watcher die: it is the last line against a leaked lock
                self.logger.exception("cloudshell-mutex: watching late adds failed")


def _heard(logger: logging.Logger) -> bool:
    """True when a WARNING on ``logger`` reaches a handler other than a NullHandler."""
    current: Optional[logging.Logger] = logger
    while current is not None:
        for handler in current.handlers:
            if not isinstance(handler, logging.NullHandler) and handler.level <= logging.WARNING:
                return True
        current = current.parent if current.propagate else None
    return False


def _can_land(lands_by: Optional[float], now: float) -> bool:
    return lands_by is not None and now < lands_by


_process_late_adds: Optional[LateAdds] = None
_process_lock = threading.Lock()


def late_adds_for(clock: Callable[[], float], logger: Optional[logging.Logger] = None) -> LateAdds:
    """The watcher a lock uses unless given one: this process's on the real clock; on a virtual clock
    (tests), a watcher of its own that sweeps only when told to."""
    return process_late_adds() if clock is time.monotonic else LateAdds(clock, logger)


def with_late_adds(runtime: Optional[Runtime], logger: Optional[logging.Logger] = None) -> Runtime:
    """``runtime`` (None: the real clock, sleep and a new random source), with the watcher a lock uses
    unless the runtime names one (:func:`late_adds_for`)."""
    runtime = runtime if runtime is not None else Runtime()
    if runtime.late_adds is None:
        runtime = dataclasses.replace(runtime, late_adds=late_adds_for(runtime.clock, logger))
    return runtime


def started_late_adds() -> Optional[LateAdds]:
    """This process's watcher if a lock has started it, else None (nothing is started here)."""
    return _process_late_adds


def process_late_adds() -> LateAdds:
    """This process's watcher: sweeps in a daemon thread, warns about what is left at exit."""
    global _process_late_adds
    with _process_lock:
        if _process_late_adds is None:
            _process_late_adds = LateAdds(background=True)
            atexit.register(_process_late_adds.warn_unsettled)
        return _process_late_adds
