"""Cohort mode: processes on one execution server pass the server lock among themselves, with no server call.

CloudShell starts the driver commands of one sandbox setup as separate processes on the same execution
server. In cohort mode (Dice, Marathe and Shavit, "Lock Cohorting", PPoPP 2012) they first take a *local*
lock, one per (server, reservation, alias) on this machine (an OS file lock through ``filelock``: freed by
the OS when its process dies, on Windows too), and only the local holder deals with the CloudShell server.
A releaser that sees local waiters *passes* the server lock (its ``MUTEX`` stays in place, its heartbeat
goes on in the next holder) instead of removing it, at most ``max_passes`` times in a row and for at most
``max_pass_seconds``. Past those bounds it reads the queue: when someone elsewhere waits in it, it removes
the lock and the next local holder lines up behind them (no pause); when nobody is seen, it passes on, up
to BLIND_BOUNDS times the bounds, and then yields to anyone (the local waiters hold back ``yield_seconds``:
plain pollers and the original code leave no trace to see). docs/protocol.md ("Cohort mode") gives the
steps and the guarantees.

The cohort's files on this machine (the local lock, the state, the waiters, the releasing record) are
:mod:`.cohort_files`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional, Union

import filelock

from .. import diagnosis
from ..engine import Acquisition, LockFace, Runtime, Wait, acquire_loop
from ..errors import MutexCancelled, MutexDeadlock, MutexError, MutexLostError, MutexTimeout
from ..holder import make_token
from ..mutex import handover
from ..mutex.mutex import ReservationMutex
from ..options import UNSET, check_duration
from ..pacing import CancelledWait, CohortPacing, cancellation_check
from ..queue.waitrecord import WaitRecord
from ..server import catalog
from ..server.alias import LockAlias
from .files import (
    STATE_GRACE,
    STATE_WAIT,
    CohortFiles,
    CohortState,
    CohortStateBusy,
    LocalWait,
    cohort_available,
    cohort_key,
    default_cohort_dir,
    new_file_lock,
    state_wait,
    sweep_now_and_then,
    trust_window,
)

#: Passes in a row before the cohort gives the server lock back (one server acquisition serves at most
#: 1 + DEFAULT_MAX_PASSES local holders).
DEFAULT_MAX_PASSES = 32
#: Seconds from the cohort's server acquisition after which it stops passing.
DEFAULT_MAX_PASS_SECONDS = 10.0


#: The cohort's default pacing (see :class:`CohortPacing`).
COHORT_PACING = CohortPacing()
#: While waiting, a cohort's poller reads the holder (for the lease judgement) this often.
COHORT_HOLDER_CHECK_INTERVAL = 15.0
#: After giving the lock back because of a bound, local waiters wait up to this long before their add:
#: about the cohort pacing's longest interval, so every waiting execution server has polled meanwhile.
DEFAULT_YIELD_SECONDS = 2.5
#: Past its bounds, a cohort passes on while a read shows nobody in the queue, up to this many times the
#: bounds; then it yields to anyone (``yield_seconds``), for waiters that leave no ticket to see.
BLIND_BOUNDS = 6
#: How often a local waiter tries the local lock (filelock polls); the local hand-off gap is about this
#: divided by the number of waiters plus one.
DEFAULT_LOCAL_POLL = 0.005


class CohortMutex(LockFace):
    """A :class:`~.mutex.ReservationMutex` in cohort mode: processes on this machine that lock the same alias
    in the same reservation on the same server pass the server lock among themselves.

    Use it like a ``ReservationMutex`` (``with``, ``acquire``/``release``, ``ensure_held``, ``holder``,
    ``generation``). It is a class of its own rather than a ``cohort=`` option of ``ReservationMutex``
    because it behaves differently where it matters (a local lock first, passes, no ``export``); the driver
    mixin makes one by default. Options beyond the ``ReservationMutex`` ones:

    * ``cohort_dir``: the folder of the cohort's files; local disk only (default: a per-user folder in the
      temp dir). Processes that should form one cohort must use the same folder.
    * ``pacing`` and ``holder_check_interval``: as for ``ReservationMutex``, but by default
      :class:`CohortPacing` (a poll every 2.5 s at first, every second after a few: only one process per
      machine polls, it waits for a whole cohort's turn, and the longest waiter polls most) and a holder
      read every 15 s.
    * ``max_passes`` (K, default 32) and ``max_pass_seconds`` (T, default 10): a releaser passes the server
      lock to a local waiter only while the cohort has passed it fewer than K times in a row and took it
      from the server less than T seconds ago. Past them, one read tells whether anyone elsewhere waits in
      the queue: then it releases it to the server and the next local holder lines up behind them; if not,
      it passes on, up to :data:`BLIND_BOUNDS` times K and T.
    * ``yield_seconds`` (default 2.5, the cohort pacing's longest interval): past BLIND_BOUNDS times the
      bounds the cohort releases the lock whoever waits, and local waiters hold back until a read shows
      that another execution server took the lock, or for this long, so that waiters that leave no ticket
      (plain polling, the original code) get their turn.
    * ``local_poll``: seconds between a local waiter's tries of the local lock (default 5 ms).

    After an acquire, :attr:`passed` tells whether the lock came from a local pass (no server call) and
    :attr:`predecessor` names a local holder that died holding it (its work may be half done: see
    docs/protocol.md). :meth:`export` is refused: a lock that the cohort passes on cannot also be handed to
    another machine.
    """

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        owner: Optional[str] = "cloudshell-mutex",
        name: str = "MUTEX",
        timeout: Optional[float] = UNSET,
        logger: Optional[logging.Logger] = None,
        *,
        cohort_dir: Optional[Union[str, Path]] = None,
        max_passes: int = DEFAULT_MAX_PASSES,
        max_pass_seconds: float = DEFAULT_MAX_PASS_SECONDS,
        yield_seconds: float = DEFAULT_YIELD_SECONDS,
        local_poll: float = DEFAULT_LOCAL_POLL,
        runtime: Optional[Runtime] = None,
        **options: Any,
    ) -> None:
        if not cohort_available():
            raise diagnosis.cohort_unavailable_error()
        if isinstance(max_passes, bool) or not isinstance(max_passes, int) or max_passes < 0:
            raise ValueError(f"max_passes must be a whole number >= 0 (0: never pass), got {max_passes!r}")
        self.max_passes = max_passes
        self.max_pass_seconds = check_duration("max_pass_seconds", max_pass_seconds)
        self.yield_seconds = check_duration("yield_seconds", yield_seconds)
        self.local_poll = check_duration("local_poll", local_poll, minimum=0.0005)
        if timeout is not UNSET:
            options["timeout"] = timeout
        if options.get("options") is None:
            options.setdefault("pacing", COHORT_PACING)
            options.setdefault("holder_check_interval", COHORT_HOLDER_CHECK_INTERVAL)
        self._mutex = ReservationMutex(
            api, reservation_id, owner=owner, name=name, logger=logger, runtime=runtime, **options
        )
        self.logger = self._mutex.logger
        self._clock = self._mutex.runtime.clock
        self._sleep = self._mutex.runtime.sleep
        # The caller's cancellation, asked while this waits for the local lock or yields to other servers.
        self._cancellation = cancellation_check(self._mutex.options.cancellation)
        # The cohort's own calls: a local waiter's progress lines and its wait record.
        self._lock_alias = LockAlias.for_lock(
            api, self._mutex.reservation_id, name, self._mutex.options, self.logger, self._clock, self._sleep
        )
        self._local_record: Optional[WaitRecord] = None  # the last local wait's (a timeout's words)
        self._nested = 0  # acquires counted on top of the one that holds (reentrant)
        server = catalog.server_key(api)
        self.cohort_dir = Path(cohort_dir) if cohort_dir is not None else default_cohort_dir()
        self._files = CohortFiles(self.cohort_dir, cohort_key(server, self._mutex.reservation_id, name))
        sweep_now_and_then(self.cohort_dir, self.logger)  # idle cohorts' files go (at most once an hour)
        self._where = (server, self._mutex.reservation_id, name)
        self._local = self._files.local_lock()
        self._held = self._holder_written = self.passed = False
        self.predecessor: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ what ReservationMutex has

    @property
    def mutex(self) -> ReservationMutex:
        """The underlying server lock object of this process."""
        return self._mutex

    @property
    def owner(self) -> str:
        """The label of this process's acquisitions."""
        return self._mutex.owner

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a blocking acquire waits by default (None: forever)."""
        return self._mutex.timeout

    @property
    def leased(self) -> bool:
        """True while this object holds the lock with a lease (it heartbeats)."""
        return self._held and self._mutex.leased

    @property
    def options(self) -> Any:
        """The :class:`~.options.MutexOptions` of the server lock."""
        return self._mutex.options

    @property
    def calls(self) -> int:
        """API calls made by this object in total."""
        return self._mutex.calls + self._lock_alias.calls

    @property
    def token(self) -> Optional[str]:
        """The owner token of the server lock while this object holds it (the cohort's acquisition)."""
        return self._mutex.token if self._held else None

    def locked(self) -> bool:
        """True while *this object* holds the lock (no call), as :meth:`ReservationMutex.locked`."""
        return self._held

    def ensure_held(self, read: bool = False, timeout: Optional[float] = 0.0) -> None:
        """As :meth:`ReservationMutex.ensure_held`."""
        self._mutex.ensure_held(read, timeout)

    def holder(self) -> Any:
        """Who holds the server lock now, whoever it is (one fresh read), or None: as
        :meth:`ReservationMutex.holder`."""
        return self._mutex.holder()

    def renew(self) -> bool:
        """One heartbeat now (as :meth:`ReservationMutex.renew`)."""
        return self._mutex.renew()

    @property
    def generation(self) -> int:
        """As :attr:`ReservationMutex.generation`: every local holder that asks gets a larger number."""
        return self._mutex.generation

    def export(self) -> str:
        """Refused: the cohort passes its lock to local processes, so a handle given to another machine
        would let two holders overlap. Use a ``ReservationMutex`` (cohort off) for export/adopt."""
        raise diagnosis.cohort_export_error(self.reservation_id, self.name)

    def local_state(self) -> CohortState:
        """The cohort's state as this machine's files show it now (:class:`CohortStateBusy` when another
        process keeps the state file locked)."""
        with self._files.state() as state:
            return state

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Take the local lock, then the server lock: from the cohort (no call) when it holds it, else from
        the server as :meth:`ReservationMutex.acquire` does. Same contract: True, False (non-blocking, busy)
        or :class:`~.errors.MutexTimeout`."""
        deadline = Wait.for_acquire(
            blocking, timeout, self._mutex.timeout, self._mutex.runtime, self._cancellation
        )
        if self._held:
            if self.options.reentrant:
                self._nested += 1
                return self._mutex.acquire()  # counted, no call
            raise diagnosis.held_again_error("CohortMutex", self.reservation_id, self.name)
        start = self._clock()
        try:
            if not self._take_local(deadline):
                self._tidy_orphan()
                if not blocking:
                    return False
                raise self._local_timeout(start)
        except CohortStateBusy as busy:
            raise self._state_timeout(start, busy) from None
        except CancelledWait:
            holder = self._files.local_holder() + " on this machine, in cohort mode"
            self._tidy_orphan()  # as after a timeout: a lock passed to this waiter meanwhile is not orphaned
            raise self._cancelled(start, holder) from None
        except MutexDeadlock as deadlock:
            self._tidy_orphan()
            self.logger.warning("cloudshell-mutex: %s", deadlock)
            raise
        self._mutex.waiting_since = start  # the local wait counts in the server wait's figures
        try:
            acquired = self._take_server(blocking, deadline)
            if acquired and self.passed:
                what = "cloudshell-mutex: acquired %s in reservation %s after %.2f s, passed in the cohort"
                self.logger.info(what, self.name, self.reservation_id, self._clock() - start)
        except CohortStateBusy as busy:
            self._leave(clear_holder=self._holder_written, timeout=STATE_GRACE)
            raise self._state_timeout(start, busy) from None
        except CancelledWait:  # while yielding to other execution servers: nothing held on the server
            self._leave(clear_holder=True, timeout=STATE_GRACE)
            raise self._cancelled(start, None) from None
        except BaseException:
            self._leave(clear_holder=True, timeout=STATE_GRACE)
            raise
        if not acquired:
            self._leave(clear_holder=True, timeout=STATE_GRACE)
        return acquired

    def _take_local(self, deadline: Wait) -> bool:
        try:  # the common, uncontended case: no registration
            self._local.acquire(timeout=0)
            return True
        except filelock.Timeout:
            if deadline.passed():
                return False
        waiter = f"{os.getpid()}-{secrets.token_hex(4)}"
        mark = new_file_lock(self._files.waiter_path(waiter))
        mark.acquire(timeout=-1)  # its own file: free at once
        try:
            with self._files.state(state_wait(deadline)) as state:
                state.waiters[waiter] = {"pid": os.getpid(), "since": self._clock()}
                holder = state.holder
            return self._wait_local(deadline, holder)
        finally:
            # Best effort: a registration left behind is dropped by the next count, its lock being free.
            with contextlib.suppress(CohortStateBusy), self._files.state(STATE_GRACE) as state:
                state.waiters.pop(waiter, None)
            mark.release()
            with contextlib.suppress(OSError):
                self._files.waiter_path(waiter).unlink()

    def _wait_local(self, deadline: Wait, holder: Optional[Dict[str, Any]]) -> bool:
        """Wait for the local lock (False at the deadline) as a waiter for the server lock does, on the
        engine's loop, on real time: a log line when it begins, progress lines (``progress``), the caller's
        cancellation every half second (``CancelledWait``), and for a thread that holds other locks of the
        reservation a wait record, so that the wait is seen in the wait-for graph (MutexDeadlock)."""
        runtime, lifetime = self._mutex.runtime, self._mutex.options.request_lifetime
        record = WaitRecord.for_wait(self._lock_alias, make_token(self.owner), runtime, lifetime, self.logger)
        self._local_record = record
        member = (self.name, self.owner, self.options)
        wait = LocalWait(member, self._try_local, self._write_progress, deadline, holder, record)
        what = "cloudshell-mutex: %s in reservation %s is held by %s in cohort mode; waiting for it"
        self.logger.info(what, self.name, self.reservation_id, wait.who)
        try:
            return acquire_loop(wait, wait.end)
        finally:
            if record is not None:
                record.close()

    def _try_local(self, seconds: float) -> bool:
        """Try the local lock for up to ``seconds`` (-1: until it is free); True when this object has it."""
        try:
            self._local.acquire(timeout=seconds, poll_interval=self.local_poll)
            return True
        except filelock.Timeout:
            return False

    def _write_progress(self, message: str, deadline: Optional[Wait], warning: bool = False) -> None:
        """One line in the reservation output, progress or a ``warning`` (a courtesy: a failure is logged)."""
        if not self._lock_alias.write_output(message, warning=warning, paced=True, deadline=deadline).ok:
            self.logger.debug("cloudshell-mutex: could not write progress to the reservation output")

    def _take_server(self, blocking: bool, deadline: Wait) -> bool:
        self._holder_written = False
        with self._files.state(state_wait(deadline)) as state:
            self._holder_written = True
            state.server, state.reservation_id, state.alias = self._where
            dead = state.holder  # a live holder clears it before it lets go of the local lock
            token, lease_seconds, confirmed_at = state.token, state.lease, state.confirmed_at
            yielded_at, secret = state.yielded_at, state.token_secret()
            to_queue = state.yielded_to_queue
            state.holder = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "owner": self._mutex.owner,
                "started": time.time(),
            }
        self.passed = False
        self.predecessor = dead
        releasing = token is not None and token == self._files.releasing()
        if releasing:
            # The holder that let go of it was releasing it to the server (and may have died doing so): its
            # remove may still land, so nobody here carries on under this token. Acquire from the server.
            token = None
        if dead is not None:
            note = diagnosis.dead_local_holder(
                self.owner, self.name, self.reservation_id, dead, bool(token), releasing
            )
            self.logger.warning("cloudshell-mutex: %s", note)
            self._write_progress(note, deadline, warning=True)  # the people watching are told, as of a break
        if token is not None and self._join(
            token, lease_seconds, confirmed_at, dead is not None, deadline, secret
        ):
            return True
        if yielded_at is not None and to_queue:
            handover.line_up(self._mutex)  # behind the waiters it was yielded to: no pause, no free lock
        elif yielded_at is not None and blocking:
            self._yield_turn(yielded_at, deadline)
        acquired = self._mutex.acquire(True, deadline.left()) if blocking else self._mutex.acquire(False)
        if acquired:
            self._held = True
            held = handover.acquisition(self._mutex)
            try:
                with self._files.state(state_wait(deadline)) as state:
                    state.keep(held)
                    state.confirmed_at = held.confirmed_at
                    state.since = self._clock()
                    state.passes = 0
                    state.yielded_at = None
                    state.yielded_to_queue = False
            except CohortStateBusy as busy:
                # Held all the same; unrecorded, it is never passed on (release() finds another token there).
                self.logger.warning(
                    "cloudshell-mutex: %s; %s is released to the server, not passed", busy, self.name
                )
        return acquired

    def _yield_turn(self, yielded_at: float, deadline: Wait) -> None:
        """The cohort gave the lock back because of a bound: let other execution servers' waiters in. Wait
        until a read shows that someone else took it (then wait for it like any waiter, at a random phase
        of the pacing, as the others do), or until ``yield_seconds`` passed with nobody taking it (every
        waiter polls within the cohort pacing's cap, so nobody else wants it)."""
        end = yielded_at + self.yield_seconds
        until = deadline.sooner(end - self._clock())
        step = max(self.yield_seconds / 3, 0.05)
        while not until.passed():
            until.pause(step)
            try:
                if self._mutex.holder() is not None:
                    return
            except MutexError:  # the acquire that follows reports what is wrong
                return

    def _join(
        self,
        token: str,
        lease_seconds: float,
        confirmed_at: Optional[float],
        verify: bool,
        deadline: Wait,
        secret: Optional[bytes],
    ) -> bool:
        """Take the cohort's server lock: without a call when its last confirmation is recent, else after
        one read (and, with a lease, a heartbeat). False when it turns out not to be the cohort's any more.
        The state is written waiting for its lock only until ``deadline`` (a record it cannot write costs a
        later holder one verifying read, never exclusion)."""
        fresh = confirmed_at is not None and self._clock() - confirmed_at < trust_window(lease_seconds)
        try:
            if fresh and not verify:
                handover.take_over(self._mutex, Acquisition(token, confirmed_at, lease_seconds, secret))
            else:
                # One read (transient failures waited out until the deadline, as the acquire's own reads
                # are); raises MutexLostError when it is not ours.
                handover.join(self._mutex, token, deadline, secret)
        except MutexLostError:
            wait = state_wait(deadline)
            with contextlib.suppress(CohortStateBusy), self._files.state(wait) as state:
                state.token = state.confirmed_at = state.since = state.secret = None
                state.passes = 0
            self.logger.warning(
                "cloudshell-mutex: the cohort's server lock %s in reservation %s was not held any more; "
                "acquiring it from the server",
                self.name,
                self.reservation_id,
            )
            return False
        if not fresh or verify:
            wait = state_wait(deadline)
            with contextlib.suppress(CohortStateBusy), self._files.state(wait) as state:
                state.confirmed_at = handover.acquisition(self._mutex).confirmed_at
        self.passed = True
        self._held = True
        return True

    def _tidy_orphan(self) -> None:
        """After a local wait that ended without the lock: if the lock was passed to a waiter that then gave
        up (timed out, or died) and nobody holds it locally, take it and release it properly, so that the
        server lock does not stay in place with nobody to heartbeat or remove it."""
        try:
            self._local.acquire(timeout=0)
        except filelock.Timeout:
            return  # someone holds it: they release it
        try:
            with self._files.state(STATE_GRACE) as state:
                orphan = state.token is not None and state.holder is None
        except CohortStateBusy:
            orphan = False  # tidying is a courtesy: the next acquire or the lease deals with it
        if not orphan:
            self._let_go()
            return
        try:  # the acquire's deadline has passed: each state step waits only STATE_GRACE
            if self._take_server(False, Wait.now(self._clock)):
                self._release(STATE_GRACE)
            else:
                self._leave(clear_holder=True, timeout=STATE_GRACE)
        except Exception:  # tidying is a courtesy; the lease (if any) recovers the lock otherwise
            self.logger.warning("cloudshell-mutex: could not release an orphaned cohort lock", exc_info=True)
            if self._held:
                self._leave(clear_holder=True, timeout=STATE_GRACE)

    def _cancelled(self, start: float, holder: Optional[str]) -> MutexCancelled:
        """The caller cancelled the wait for the local lock, or the yield to other execution servers."""
        error = diagnosis.cancelled_wait(self.name, self.reservation_id, self._clock() - start, holder)
        self.logger.warning("cloudshell-mutex: %s", error)
        return error

    def _local_timeout(self, start: float) -> MutexTimeout:
        waited = self._clock() - start
        who, path = self._files.local_holder(), str(self._files.lock_path)
        record = self._local_record
        cycle, token = (None, "") if record is None else (record.cycle, record.token)
        return diagnosis.local_timeout_error(waited, who, path, self.reservation_id, self.name, cycle, token)

    def _state_timeout(self, start: float, busy: CohortStateBusy) -> MutexTimeout:
        return diagnosis.state_timeout_error(self._clock() - start, str(busy), self.reservation_id, self.name)

    # ------------------------------------------------------------------ release

    def release(self) -> None:
        """Pass the server lock to a local waiter (within the bounds) or release it to the server; then let
        go of the local lock. Raises what :meth:`ReservationMutex.release` raises; a release that failed
        with the lock still held (:class:`~.errors.MutexReleaseError`) keeps the local lock too, so that
        release() can be called again."""
        self._release(STATE_WAIT)

    def _release(self, wait: float) -> None:
        """:meth:`release`, waiting at most ``wait`` seconds for the state lock at each step."""
        if not self._held:
            return
        if self._nested > 0:
            self._nested -= 1
            self._mutex.release()  # nested: counted down, no call
            return
        token = self._mutex.token
        waiting, within, unseen = 0, False, False
        try:
            with self._files.state(wait) as state:
                waiting = self._files.live_waiters(state)
                now = self._clock()
                held_for = 0.0 if state.since is None else now - state.since
                # Only a lock the state records as the cohort's is passed on (not one whose record failed).
                ours = state.token == token
                within = ours and state.passes < self.max_passes and held_for < self.max_pass_seconds
                # Past the bounds the cohort yields to waiters it can see, for up to BLIND_BOUNDS times the
                # bounds; beyond, to anyone, blindly (plain pollers and the original code leave no trace).
                unseen = (
                    ours
                    and not within
                    and state.passes < self.max_passes * BLIND_BOUNDS
                    and held_for < self.max_pass_seconds * BLIND_BOUNDS
                )
        except CohortStateBusy as busy:
            self.logger.warning("cloudshell-mutex: %s; releasing %s to the server", busy, self.name)
            wait = STATE_GRACE  # once is enough: the release goes on without the state
        seen = False
        if waiting and unseen:
            seen = handover.others_waiting(self._mutex)  # one read
            within = not seen
        passed = handover.hand_over(self._mutex) if waiting and within else None
        if passed is not None:
            try:
                with self._files.state(wait) as state:
                    state.keep(passed)
                    state.confirmed_at = passed.confirmed_at if math.isfinite(passed.confirmed_at) else None
                    state.passes += 1
                    state.holder = None
            except CohortStateBusy as busy:
                # The state still names the token and this process as its holder: the next local holder takes
                # it for a holder that died and carries on after a verifying read (no call of ours pending).
                self.logger.warning("cloudshell-mutex: %s; passed %s without recording it", busy, self.name)
            self._let_go()
            return
        if token is not None:
            # Before any remove is sent: should this process die with the remove on its way, the next local
            # holder must not carry on under the token (the remove would land under it).
            self._files.mark_releasing(token)
        try:
            self._mutex.release()
        except BaseException:
            if self._mutex.locked():  # a failed release: still held, call release() again
                raise
            self._leave(clear_holder=True, clear_token=True, timeout=wait)
            raise
        self._leave(
            clear_holder=True,
            clear_token=True,
            yielded=bool(waiting) and not within,
            to_queue=seen,
            timeout=wait,
        )

    def _leave(
        self,
        clear_holder: bool,
        clear_token: bool = False,
        yielded: bool = False,
        to_queue: bool = False,
        timeout: float = STATE_WAIT,
    ) -> None:
        try:
            with self._files.state(timeout) as state:
                if clear_holder:
                    state.holder = None
                if clear_token:
                    state.token = state.confirmed_at = state.since = state.secret = None
                    state.passes = 0
                    state.yielded_at = self._clock() if yielded else None
                    state.yielded_to_queue = yielded and to_queue
        except CohortStateBusy as busy:
            # Left as it was: the next local holder finds this process's holder record (a holder that died)
            # and, for a released token, the releasing record, so it acquires from the server.
            self.logger.warning("cloudshell-mutex: %s; left the cohort's state as it was", busy)
        self._let_go()

    def _let_go(self) -> None:
        self._held = False
        if self._local.is_locked:
            self._local.release()
