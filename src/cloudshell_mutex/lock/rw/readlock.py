"""The read side of :class:`~.rwlock.ReservationRWLock`: a reader takes a slot, then opens or joins the read
group on ``MUTEX``; leaving, it gives the slot back and closes the group when no reader is left in it.

:mod:`.rwlock` has the protocol in its docstring (and docs/protocol.md step by step). The read side is
built from the mutexes it asks :class:`~.core.RWCore` for.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Optional

from .. import diagnosis, protocol
from ..engine import LockFace, Wait, acquire_loop
from ..errors import MutexError, MutexLostError, MutexReleaseError, MutexTimeout
from ..holder import Holder, is_read_group
from ..lease import lease
from ..mutex import handover
from ..mutex.mutex import ReservationMutex
from ..options import FRESH_READ_LAG, UNSET
from ..pacing import CancelledWait, DefaultPacing
from .core import RWCore
from .readview import ReadView

#: Rounds of "take a slot, read, decide" in one attempt to enter before waiting again.
ENTER_ROUNDS = 4
#: Seconds between two looks at a closer's work (it holds ``MUTEX~c`` for a few calls only), and the pacing
#: of a closer waiting for ``MUTEX~c``.
CLOSER_POLL = 0.05
CLOSER_PACING = DefaultPacing(first=0.02, base=0.05, cap=0.25)
#: Reads a closer makes under ``MUTEX~c`` before it gives up (each after a stale slot broken or a lag).
CLOSE_ROUNDS = 6
#: Seconds a release waits for another closer's ``MUTEX~c`` before it leaves the group to that closer (a live
#: one holds it for a few calls; one that holds it longer saw no reader and is removing the group) or, when
#: that closer crashed, to the next reader or a writer's lease break. A release has no caller's deadline.
RELEASE_CLOSE_WAIT = 5.0

#: "The last read did not tell who holds MUTEX" (None means: nobody).
_UNKNOWN: Any = object()


class ReadLock(LockFace):
    """The shared side of a :class:`ReservationRWLock`: one reader slot, and a share of the read group.

    See the module docstring and docs/protocol.md for the protocol; :attr:`calls` counts its API calls.
    """

    def __init__(self, rw: RWCore, max_readers: int, writing: Callable[[], bool]) -> None:
        self._rw = rw
        self._lock_alias = rw.lock_alias
        self._writing = writing  # does the write side of the same lock object hold the lock?
        self.max_readers = max_readers
        name = rw.name
        self._slot_names = [protocol.reader_slot_alias(name, index + 1) for index in range(max_readers)]
        self._slots = [rw.mutex(alias) for alias in self._slot_names]
        # Closers hold MUTEX~c for a few calls and never wait inside: poll it quickly. A close is part of a
        # release (or of taking back a reader's slot): the caller's cancellation never interrupts it.
        self._closer = rw.mutex(
            protocol.closer_alias(name), pacing=CLOSER_PACING, cancellation=None, max_hold=None
        )
        # What this reader sees: its snapshots, its judgement of every holder, its breaks of crashed ones.
        self._view = ReadView(rw.lock_alias, rw.owner, rw.options, rw.logger, rw.runtime, self._slot_names)
        self._slot: Optional[ReservationMutex] = None
        self._group: Optional[ReservationMutex] = None
        self._extra_calls = 0  # calls of group objects that are gone (joined, then released)
        self._deadline = Wait(None)
        #: Why the current acquire() waits (None: nothing seen in its way), and since when.
        self.blocker: Optional[str] = None
        self.blocker_since = 0.0
        self._saw_group = False
        # A close whose remove of the group's MUTEX kept failing: that remove may still land, so this
        # reader keeps the group object (it remembers the remove) and MUTEX~c (its heartbeat keeps joiners
        # out) until release() or acquire() finishes the close.
        self._pending_close: Optional[ReservationMutex] = None
        #: What the current acquire() last waited for besides the snapshot's blocker (its timeout says so).
        self.waited_for: Optional[str] = None

    # ------------------------------------------------------------------ public

    @property
    def calls(self) -> int:
        """API calls made by this side (slots, closer, group, snapshots and breaks)."""
        total = sum(slot.calls for slot in self._slots) + self._closer.calls + self._extra_calls
        total += self._pending_close.calls if self._pending_close is not None else 0
        total += self._view.calls
        return total + (self._group.calls if self._group is not None else 0)

    def locked(self) -> bool:
        """True while *this side* reads (holds a slot and a share of the group; no call)."""
        return self._group is not None

    @property
    def token(self) -> Optional[str]:
        """The read group's owner token while reading, else None."""
        return self._group.token if self._group is not None else None

    @property
    def slot_name(self) -> Optional[str]:
        """The alias of the reader slot this side holds (None: none)."""
        return self._slot.name if self._slot is not None else None

    def ensure_held(self, read: bool = False) -> None:
        """Raise :class:`MutexLostError` unless the group's ``MUTEX`` and this reader's slot are still held,
        as far as their heartbeats tell (``read=True``: one fresh read of the group too)."""
        if self._group is None or self._slot is None:
            raise diagnosis.rw_side_error("not reading", self._rw.reservation_id, self._rw.name)
        self._slot.ensure_held()
        self._group.ensure_held(read)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = UNSET) -> bool:
        """Read alongside other readers. Blocking, returns True or raises :class:`MutexTimeout` (nothing of
        this reader is left behind); with ``blocking=False`` one attempt, False when a writer holds or
        waits for the lock or every slot is taken."""
        rw = self._rw
        deadline = rw.wait(blocking, timeout)
        if self._group is not None:
            raise diagnosis.rw_side_error("reading again", rw.reservation_id, rw.name)
        if self._writing():
            raise diagnosis.rw_side_error("writing", rw.reservation_id, rw.name)
        self._deadline = deadline
        self.waited_for = None
        self.blocker: Optional[str] = None
        self.blocker_since = rw.runtime.clock()
        self._finish_close()  # a release that raised left a close unfinished: finish it first
        if self._slot is not None:  # a release that raised left a slot: finish giving it back first
            self._give_back(self._close_by(deadline))
        entry = _Entry(self, rw, blocking, deadline)
        try:
            return acquire_loop(entry, deadline)
        except CancelledWait:  # between tries: this reader holds nothing here
            what = f"{entry.blocker}; " if entry.blocker else ""
            waited = rw.runtime.clock() - entry.start
            error = diagnosis.cancelled_wait(
                rw.name, rw.reservation_id, waited, None, what + "nothing of this reader was left"
            )
            raise error from None

    def try_entering(self, paced: bool) -> Optional[Dict[str, Holder]]:
        """One snapshot (``paced``: on the call budget) and, if it lets readers in, one try to enter.
        Returns the snapshot (None when the read failed); :meth:`locked` tells whether this reader reads."""
        rw = self._rw
        snap = self._view.snapshot(paced, self._deadline)
        if snap is None:
            return None
        why = self._view.blocker(snap)
        if why != self.blocker:
            self.blocker, self.blocker_since = why, rw.runtime.clock()
            if why is not None:
                rw.logger.info("cloudshell-mutex: read of %s waits: %s", rw.name, why)
        if why is not None and self._view.abandoned_group(snap):
            # A group with no reader left (its readers' last close was skipped on a lagging read, or an add
            # of it landed late) would keep a waiting writer or a queued waiter out until its lease ends.
            self._close(None, self._close_by(self._deadline))
        if why is None:
            self._enter(snap)
        return snap

    def release(self) -> None:
        """Stop reading: give the slot back, then close the group if no other reader is in it.

        Raises :class:`MutexLostError` when the group's ``MUTEX`` was lost meanwhile (broken or removed by
        force: the reading may not have been exclusive of writers), after cleaning up; and
        :class:`~.errors.MutexReleaseError` when a remove kept failing: the reading has ended, but the close
        is unfinished (``MUTEX~c`` stays held so no reader joins meanwhile): call release() again.
        """
        self._finish_close()
        if self._group is None and self._slot is None:
            return
        group, lost = self._group, None
        if group is not None:
            try:
                # One fresh read, as a mutex reads before its remove: a group lost while we read (broken, or
                # removed by force) must not pass silently. Read while we still hold our slot, because
                # after it is given back, the group may be closed legitimately by another reader.
                group.ensure_held(read=True)
            except MutexLostError as error:
                lost = error
            except MutexError as error:  # the read failed: leave the doubt to the heartbeat
                self._rw.logger.debug("cloudshell-mutex: could not check the read group: %s", error)
            # Our share ends here: once our slot is given back, another reader may close the group, and our
            # heartbeat must not take that for a loss.
            handover.stop_heartbeat(group)
        self._saw_group = False  # the member closes below, with its share
        close_by = Wait.after(RELEASE_CLOSE_WAIT, self._rw.runtime.clock)
        self._give_back(close_by)  # raises MutexReleaseError when the slot's remove kept failing: call again
        self._group = None
        if group is not None and self._others_read():
            handover.detach(group)  # another reader reads: it closes the group when it leaves
            self._extra_calls += group.calls
            group = None
        if group is not None:
            try:
                self._close(group, close_by)
            except MutexLostError as error:
                lost = lost or error
            finally:
                if group is not self._pending_close:  # else counted when the close is finished
                    self._extra_calls += group.calls
        if lost is not None:
            raise lost

    def _others_read(self) -> bool:
        """After our slot was given back: does one read show another reader's slot? Then that reader will
        close the group (it gives its slot back after us, and its closer's read shows ours gone), and we
        skip the close (4 calls). This rests on a plain read: one that lags behind both slot removals could
        make both readers skip it; the group then waits, without heartbeats, for the next reader to join and
        close it, or for a writer to break it after its lease + margin."""
        for _ in range(CLOSE_ROUNDS):
            snap = self._view.snapshot(False, self._deadline)
            if snap is None:
                return False  # cannot tell: close
            readers = self._view.readers(snap)
            # A crashed reader's slot would make every reader leave the group to it: break it first.
            if not readers or not self._view.break_stale(snap, readers):
                return bool(readers)
        return False

    # ------------------------------------------------------------------ entering

    def _enter(self, snap: Dict[str, Holder]) -> bool:
        """Take a slot the snapshot shows free; then open the group or join it. True when reading."""
        free = [index for index, alias in enumerate(self._slot_names) if alias not in snap]
        if not free:
            return False
        slot = self._slots[self._rw.runtime.rng.choice(free)]
        try:
            if not slot.acquire(blocking=False):
                return False  # taken since the read
        except MutexTimeout:
            return False  # the API failed; the slot object watches an add that may still land
        self._slot = slot
        self._saw_group = is_read_group(snap.get(self._rw.name))
        try:
            group = self._open_or_join(slot, snap.get(self._rw.name))
        except BaseException:
            self._saw_group = True  # unknown: close to be safe (a close removes only a group without readers)
            self._give_back(self._close_by(self._deadline))
            raise
        if group is None:
            self._give_back(self._close_by(self._deadline))
            return False
        self._group = group
        return True

    def _open_or_join(self, slot: ReservationMutex, mutex_holder: Any) -> Optional[ReservationMutex]:
        rw = self._rw
        rounds = 0
        while rounds < ENTER_ROUNDS:
            rounds += 1
            if mutex_holder is None:  # MUTEX looked free: open a group
                group = rw.mutex(rw.name, "group")
                try:
                    if group.acquire(blocking=False):
                        return group
                except MutexTimeout:
                    pass  # unknown; the next read tells
            snap = self._view.snapshot(True, self._deadline)
            if snap is None:
                mutex_holder = _UNKNOWN
                continue
            mine = snap.get(slot.name)
            if mine is None or mine.token != slot.token:
                # This read does not show our own slot: it lags behind our add, so it cannot show what
                # happened after it either. Decide nothing on it.
                mutex_holder = _UNKNOWN
                rw.runtime.sleep(FRESH_READ_LAG / 4)
                continue
            holder = snap.get(rw.name)
            self._saw_group = self._saw_group or is_read_group(holder)
            if holder is None:
                mutex_holder = None
                continue
            if not is_read_group(holder) or self._view.writer_waiting(snap) is not None:
                return None
            busy = snap.get(protocol.closer_alias(rw.name))
            if busy is None and self._view.breaker_at_work(snap):
                busy = snap.get(protocol.breaker_alias(rw.name))
            if busy is not None:
                # A closer is at work: it may have counted the slots before ours. Keep the slot (the closer
                # then leaves the group to us) and look again when it is done: it never waits for anything.
                # A breaker likewise: it breaks the group only when its re-read shows no slot held.
                self.waited_for = f"{busy.alias} (held by {busy.label}) was at work on the read group"
                if self._deadline.passed():
                    return None
                rounds -= 1
                rw.runtime.sleep(self._deadline.clip(CLOSER_POLL * rw.runtime.rng.uniform(0.5, 1.5)))
                mutex_holder = _UNKNOWN
                continue
            try:
                return self._join(holder)
            except MutexError:  # gone meanwhile, or adopt's read failed: look again
                mutex_holder = _UNKNOWN
        return None

    def _join(self, holder: Holder) -> ReservationMutex:
        """Share the group's acquisition (a read, and with a lease one heartbeat of our own)."""
        rw = self._rw
        group = rw.mutex(rw.name, "group", lease=lease.lease_of(holder) or 0.0)
        handover.join(group, holder.token)
        return group

    def _give_back(self, close_by: Wait) -> None:
        """Release the slot held (if any); after seeing a group, try to close it (this slot may be what
        a closer saw when it decided to leave the group open), waiting for ``MUTEX~c`` until ``close_by``."""
        slot = self._slot
        if slot is not None:
            with contextlib.suppress(MutexLostError):  # broken meanwhile: nothing of ours to remove
                slot.release()
            self._slot = None
        if self._saw_group:
            self._saw_group = False
            self._close(None, close_by)

    # ------------------------------------------------------------------ closing

    def _close(self, group: Optional[ReservationMutex], close_by: Wait) -> None:
        """Remove the group's ``MUTEX`` if no reader slot is held, as the only closer at work.

        ``group`` is this reader's share (or None). ``MUTEX~c`` is waited for until ``close_by``;
        then the group is left to the closer at work, the next closer or its lease. Raises
        :class:`MutexLostError` when that share turns out lost at its removal."""
        rw = self._rw
        closer = self._closer
        try:
            closer.acquire(timeout=close_by.left())
        except MutexTimeout as error:
            self.waited_for = f"{closer.name} (held by {error.holder or 'another reader'}) was at work"
            rw.logger.warning(
                "cloudshell-mutex: could not take %s to close the read group of %s (%s); the group is left "
                "to the next closer or its lease",
                closer.name,
                rw.name,
                error,
            )
            if group is not None:
                handover.detach(group)
            return
        try:
            group = self._close_held(group)
        finally:
            if self._pending_close is None:  # else both stay held until the close is finished
                if group is not None:
                    handover.detach(group)  # another reader is in the group: it closes it
                closer.release()

    def _close_held(self, group: Optional[ReservationMutex]) -> Optional[ReservationMutex]:
        """Under ``MUTEX~c``: returns the share still to detach (None when it was released here)."""
        rw = self._rw
        closer = self._closer
        for _ in range(CLOSE_ROUNDS):
            snap = self._view.snapshot(False, self._deadline)
            if snap is None:
                rw.runtime.sleep(FRESH_READ_LAG / 4)
                continue
            mine = snap.get(closer.name)
            if mine is None or mine.token != closer.token:
                rw.runtime.sleep(FRESH_READ_LAG / 4)  # lags behind our closer's add: shows too little
                continue
            holder = snap.get(rw.name)
            readers = self._view.readers(snap)
            if readers and self._view.break_stale(snap, readers):
                continue  # a crashed reader's slot was removed: look again
            if readers or not is_read_group(holder):
                return group
            if self._view.breaker_at_work(snap):
                # A breaker's re-read may have shown the group before our MUTEX~c: its remove may land after
                # ours, on a group opened meanwhile. Leave the group to it (it sees our MUTEX~c, or breaks).
                return group
            try:
                # No call: a closer paused past its lease may have lost MUTEX~c to a breaker, and a reader may
                # have joined since; its snapshot then proves nothing.
                closer.ensure_held()
            except MutexLostError as error:
                rw.logger.warning("cloudshell-mutex: not closing the read group of %s: %s", rw.name, error)
                return group
            if group is None or group.token != holder.token:
                if group is not None:
                    handover.detach(group)
                try:
                    group = self._join(holder)
                except MutexLostError:
                    return None  # gone meanwhile
                except MutexError as error:  # adopt's read failed: look again
                    rw.logger.debug("cloudshell-mutex: joining the read group to close it: %s", error)
                    group = None
                    rw.runtime.sleep(FRESH_READ_LAG / 4)
                    continue
                joined = group
            else:
                joined = None
            try:
                group.release()  # reads, and removes MUTEX only while it is the group's (sent once)
            except MutexLostError as error:
                # Taken meanwhile (broken or removed by force): nothing of the group's is left to remove.
                # Our own reading ended earlier, checked by release()'s read.
                rw.logger.warning("cloudshell-mutex: closing the read group of %s: %s", rw.name, error)
                return None
            except MutexReleaseError as error:
                # Our remove may still land, later: if we let go of MUTEX~c now, a reader could join the
                # group before it lands and read beside the writer who adds MUTEX next. Keep both.
                self._pending_close = group
                raise self._close_error(error) from error
            finally:
                if joined is not None and joined is not self._pending_close:
                    self._extra_calls += joined.calls
            rw.logger.info("cloudshell-mutex: closed the read group of %s (%s)", rw.name, holder.token)
            return None
        return group

    def _finish_close(self) -> None:
        """Continue a close whose remove kept failing (the group object remembers what it sent), then give
        ``MUTEX~c`` back. Raises :class:`MutexReleaseError` again while the server keeps failing."""
        group = self._pending_close
        if group is None:
            return
        try:
            group.release()
        except MutexLostError as error:
            # Gone, or someone else's, with no remove of ours that could have done it: nothing to remove.
            self._rw.logger.warning(
                "cloudshell-mutex: closing the read group of %s: %s", self._rw.name, error
            )
        except MutexReleaseError as error:
            raise self._close_error(error) from error
        self._pending_close = None
        self._extra_calls += group.calls
        self._closer.release()

    def _close_error(self, error: MutexReleaseError) -> MutexReleaseError:
        return diagnosis.close_error(error, self._rw.reservation_id, self._rw.name)

    def _close_by(self, deadline: Wait) -> Wait:
        """Until when a close inside ``acquire()`` waits for ``MUTEX~c``: the caller's deadline, and at most
        long enough to break a crashed closer's ``MUTEX~c`` (lease + margin). A live closer may hold it
        longer (its remove of the group may land up to request_lifetime later); giving up on it is safe: it
        saw no reader slot and is removing the group (docs/protocol.md, "Why every group closes")."""
        lease_seconds = self._rw.options.lease
        return deadline.sooner(2 * lease_seconds + 10.0 if lease_seconds > 0 else 60.0)


class _Entry:
    """:meth:`ReadLock.acquire` as the engine's attempt: one try is one snapshot and, if it lets readers
    in, one try to take a slot and open or join the group."""

    def __init__(self, reader: ReadLock, rw: RWCore, blocking: bool, deadline: Wait) -> None:
        self.reader = reader
        self.rw = rw
        self.blocking = blocking
        self.tries = 0
        self.deadline = deadline
        self.start = deadline.clock()
        self.snap: Optional[Dict[str, Holder]] = None
        self.delay = 0.0

    @property
    def blocker(self) -> Optional[str]:
        """What kept the reader out at the last snapshot."""
        return self.reader.blocker

    def try_once(self) -> Optional[float]:
        """None once reading; else the pacing policy's next delay."""
        reader, rw = self.reader, self.rw
        self.snap = reader.try_entering(paced=self.tries > 0)
        self.tries += 1
        if reader.locked():
            rw.logger.info(
                "cloudshell-mutex: reading %s in reservation %s (slot %s, group %s) after %.2f s",
                rw.name,
                rw.reservation_id,
                reader.slot_name or "?",
                reader.token,
                rw.runtime.clock() - self.start,
            )
            return None
        self.delay = rw.pacing.next_delay(self.tries, self.delay, rw.runtime.rng)
        return self.delay

    def waiting(self) -> None:
        """Nothing: a reader writes no progress lines."""

    def give_up(self) -> bool:
        """Non-blocking and read: busy (False). Otherwise the timeout, naming what kept the reader out."""
        if not self.blocking and self.snap is not None:
            return False
        reader, rw = self.reader, self.rw
        now = rw.runtime.clock()
        what = (
            reader.blocker
            or reader.waited_for
            or (
                "the reservation could not be read"
                if self.snap is None
                else "other readers kept taking the free slots first"
            )
        )
        raise diagnosis.read_timeout_error(
            rw.name, rw.reservation_id, now - self.start, what, reader.blocker, now - reader.blocker_since
        )
