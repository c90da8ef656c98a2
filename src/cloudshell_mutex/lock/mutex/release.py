"""The one release loop: remove the lock service, but only while it is ours, and only once.

``RemoveServicesFromReservation`` cannot check the owner, so each remove follows a fresh read that shows
our token (unless ``release_check_after`` says ownership was confirmed a moment ago). A remove is sent
once: the client's own re-send of a dropped remove could delete a successor's lock. A remove whose outcome
is unknown is never followed by a second one while it may still land; reads tell when it did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from cloudshell.api.cloudshell_api import AttributeNameValue

from .. import diagnosis, events, protocol
from ..holder import named_token
from ..lease.lease import parse_ticket
from ..operation import Operation
from ..options import FRESH_READ_LAG
from ..server.alias import CallResult, LockAlias, Status
from ..server.classify import Classification, ErrorKind
from .core import LockCore


@dataclass(frozen=True)
class ReleaseEnd:
    """How a release ended: ``lost`` (the lock was not ours any more: nothing was removed) or released,
    with a ``note`` when the reservation's end took the lock with it."""

    lost: bool = False
    note: Optional[str] = None


class ReleaseLoop:
    """One release() of a held lock (see the module docstring). :meth:`run` returns how it ended, or
    raises :class:`~.errors.MutexReleaseError` when the remove kept failing (the lock is still held then,
    and ``op`` remembers what this release learned, for the next release() to continue it)."""

    def __init__(
        self,
        core: LockCore,
        op: Operation,
        confirmed_at: float,
        confirm: Callable[[CallResult], None],
        marker: Optional[str] = None,
        ticket: Optional[LockAlias] = None,
    ) -> None:
        self.core = core
        self.op = op
        self.confirmed_at = confirmed_at  # when the lock was last confirmed ours, before this release
        self.confirm = confirm  # told of every read: one that shows our token confirms the hold
        #: The ``Mutex Owner`` of the MUTEX~releasing this adds while the lock waits for a remove of ours (the
        #: token and the secret it commits to, which waiters check); None: never mark.
        self.marker = marker
        #: A MUTEX~releasing that a read showed naming our token, which we did not add (a forgery, or an older
        #: release's marker): ours by the token, so it goes at the end, as ours does (no waiter believes it).
        self.stray_mark: Optional[LockAlias] = None
        #: The queue ticket the acquisition waited with: removed with the lock in its first remove, when the
        #: read before it shows the ticket ours. None once that remove was sent (or when there is none).
        self.ticket = ticket
        #: Our ticket, after a remove of it with the lock answered "not found": the next read tells which.
        self.both_missing: Optional[LockAlias] = None
        self.failures = 0

    def run(self) -> ReleaseEnd:
        """Read, remove once, and read again until the release is settled. While a remove of ours may still
        land, the ``~releasing`` marker tells waiters why the lock stays held."""
        try:
            end = self._settle()
        except BaseException as error:
            if self.both_missing is not None:  # no read told which was gone: the watcher finds out
                self._ticket_unsettled(self.both_missing, None)
            # An error leaves the lock held: the next release() continues this operation, marker and all.
            # Ctrl-C leaves nobody to continue it: the late-add watcher takes the marker away.
            if not isinstance(error, Exception):
                self._unmark(remove=False)
            raise
        self._unmark()
        return end

    def _mark_releasing(self) -> None:
        """Add ``MUTEX~releasing`` with our token and secret, once per release: only waiters' messages depend
        on it, so a refusal or a failure changes nothing else (an add without an answer is watched, and
        removed)."""
        core, op = self.core, self.op
        if op.releasing_mark is not None or self.marker is None:
            return
        mark = core.alias.sibling(protocol.releasing_alias(core.name))
        added = mark.try_add([AttributeNameValue(protocol.ATTR_OWNER, self.marker)])
        if added.status is Status.BUSY:
            # An earlier release's marker, whose remove may still land and so is not sent again: we hold the
            # lock, so that marker is stale; it names this release from now on (waiters ignore other tokens).
            added = mark.set_attributes([(protocol.ATTR_OWNER, self.marker)])
        if added.ok or added.may_have_committed or added.may_land_later:
            op.releasing_mark = mark
            # An add that succeeded may still have an earlier copy on its way (the client re-sent it): that
            # copy could land after our remove of the marker, so it is watched as a failed add is.
            if not added.ok or added.may_land_later:
                op.releasing_mark_lands_by = added.lands_by(core.options.request_lifetime)
        else:
            core.news.log(logging.DEBUG, "could not mark %s as releasing: %s", core.name, added.failure)

    def _unmark(self, remove: bool = True) -> None:
        """Take the marker away (``remove``), or leave it to the late-add watcher, which removes it while it
        shows our token; an add of it that got no answer is watched too. A marker of our token that we did not
        add goes the same way (one remove: only one service can have the alias)."""
        core, op = self.core, self.op
        mark, lands_by = op.releasing_mark or self.stray_mark, op.releasing_mark_lands_by
        self.stray_mark = None
        if mark is None:
            return
        op.releasing_mark = op.releasing_mark_lands_by = None
        late_adds, lifetime = core.runtime.late_adds, core.options.request_lifetime
        if lands_by is not None:
            late_adds.watch(mark, op.token, lands_by, lifetime)
        if remove:
            late_adds.remove_or_watch(mark, op.token, lifetime)
        else:
            late_adds.watch(mark, op.token, core.runtime.clock() + FRESH_READ_LAG, lifetime)

    def _settle(self) -> ReleaseEnd:
        core, op = self.core, self.op
        clock, sleep = core.runtime.clock, core.runtime.sleep
        check_after = core.options.release_check_after
        check = check_after <= 0 or op.start - self.confirmed_at >= check_after or op.remove_may_have_landed
        while True:
            if check:
                read = core.read(op)
                self.confirm(read)
                if not read.ok:
                    end = self._failed(read.failure, "checking the lock owner")
                    if end is not None:
                        return end
                    continue
                self._see_stray_mark(read)
                op.see_holder(read.holder)
                missing, self.both_missing = self.both_missing, None
                if missing is not None:
                    # Our remove of both answered "not found". Neither there now: a server that removes what
                    # it finds of a list may have removed our lock with it (the ticket was the one gone). Our
                    # ticket still there: the remove took nothing, so the lock was gone before it (lost).
                    if not op.is_ours(read.holder) and not _shows(read, missing, op.token):
                        op.remove_unsettled(True)
                    self._ticket_unsettled(missing, None)  # only now: the watcher could remove it first
                if not op.is_ours(read.holder):
                    # Gone, or someone else's: a remove of ours took effect, or the lock was taken from us.
                    if op.remove_may_have_landed:
                        # Unless the read may lag behind that remove (it may show the lock as it was before
                        # we held it while our remove is still on its way), or the remove failed without a
                        # later landing and may not have committed at all.
                        settled_at = (op.remove_sent_at or float("-inf")) + FRESH_READ_LAG
                        if read.sent_at < settled_at:
                            sleep(max(0.0, settled_at - clock()))
                            continue
                        return ReleaseEnd()
                    if not op.lag_checked:
                        # A fresh read may lag behind the commits: ask once more before calling it lost.
                        op.lag_checked = True
                        sleep(FRESH_READ_LAG)
                        continue
                    return ReleaseEnd(lost=True)
                # What the read saw may be as old as its dispatch less the lag of a fresh read: only then was
                # the lock surely still ours (taken after the answer, our remove could land between the two).
                seen = read.sent_at - FRESH_READ_LAG
                if op.remove_can_land(seen):
                    # Still ours, but our earlier remove may still land: a second remove now could land
                    # after a waiter took the lock, and delete the waiter's. Read again later, and say why.
                    self._mark_releasing()
                    sleep(op.next_poll(core.pacing, core.runtime.rng))
                    continue
                op.still_ours_at(seen)
            # With it, in the same call, the queue ticket we waited with (one call less per acquisition): when
            # this read showed it ours, or with no read (release_check_after), as the lock is taken to be.
            ticket = self.ticket if not check or _shows(read, self.ticket, op.token) else None
            # The remove, sent once: the client's own re-send could delete a successor's lock.
            op.remove_sent_at = clock()
            try:
                result = core.alias.remove_once(also=() if ticket is None else (ticket.alias,))
            except BaseException:
                # Ctrl-C (or SystemExit) while the remove was on its way: it may still land. A release()
                # after this one continues this operation, so it waits for that instead of removing again.
                op.remove_unsettled(True, clock() + core.options.request_lifetime)
                if ticket is not None:
                    self._ticket_unsettled(ticket, op.remove_lands_by)
                raise
            if result.ok:
                if ticket is not None:
                    self.ticket = None
                return ReleaseEnd()
            if ticket is not None and result.status is Status.MISSING:
                # One of the two was gone (the ticket, taken by hand, or the lock): a read tells which, but
                # only one that cannot lag behind this remove (a lagging one that still showed our lock
                # would have us remove it again, maybe after a successor took it).
                self.ticket, self.both_missing, check = None, ticket, True
                # The remove may have committed as late as its answer came.
                sleep(max(0.0, result.answered_at + FRESH_READ_LAG - clock()))
                continue
            if ticket is not None:
                # Gone or not, now or later: the watcher removes it while it shows our token (a second remove
                # could take a newcomer's ticket of the same number).
                lifetime = core.options.request_lifetime
                self._ticket_unsettled(ticket, result.lands_by(lifetime) if result.may_land_later else None)
            if result.status is Status.MISSING:
                # "Not found" after a re-send of ours: our remove took effect. Otherwise the alias was gone
                # before we removed it: the lock had been taken from us.
                if op.remove_may_have_landed or result.resent:
                    return ReleaseEnd()
                op.see_holder(None)
                return ReleaseEnd(lost=True)
            check = True  # never remove again before a fresh read shows the alias is still ours
            if result.may_land_later:
                op.remove_unsettled(True, clock() + core.options.request_lifetime)
                continue  # not a failure yet: the reads above tell whether it lands
            op.remove_unsettled(result.may_have_committed)
            end = self._failed(result.failure, "removing the lock service")
            if end is not None:
                return end

    def _see_stray_mark(self, read: CallResult) -> None:
        """Remember a ``MUTEX~releasing`` that ``read`` shows naming our token when we added none."""
        core, op = self.core, self.op
        alias = protocol.releasing_alias(core.name)
        shown = (read.services or {}).get(alias)
        if op.releasing_mark is None and shown is not None and named_token(shown.token) == op.token:
            self.stray_mark = self.stray_mark or core.alias.sibling(alias)

    def _ticket_unsettled(self, ticket: LockAlias, lands_by: Optional[float]) -> None:
        """A remove of the lock with our ticket failed or got no answer: the ticket goes to the late-add
        watcher, never to a second remove while the first may land (its number may be a newcomer's)."""
        self.ticket = None
        lifetime = self.core.options.request_lifetime
        late_adds, now = self.core.runtime.late_adds, self.core.runtime.clock()
        late_adds.watch(
            ticket,
            self.op.token,
            now + FRESH_READ_LAG,
            lifetime,
            removing_until=lands_by,
            leftover="the queue ticket of a released hold, whose remove with the lock failed",
        )

    def _failed(self, failure: Classification, doing: str) -> Optional[ReleaseEnd]:
        """A failed call: back off and return None to try again (transient, within ``release_attempts``);
        released when the reservation has ended (the lock went with it); raise otherwise."""
        core, op = self.core, self.op
        self.failures += 1
        if failure.kind is ErrorKind.TRANSIENT and self.failures < core.options.release_attempts:
            op.failed(failure.message)
            core.news.event(events.TRANSIENT, op, error=failure.message)
            core.runtime.sleep(op.next_backoff(core.backoff, core.runtime.rng))
            return None
        # Whatever the server's words: a reservation that has ended took the lock with it.
        if diagnosis.needs_state(failure) and core.alias.reservation_state() in ("ended", "missing"):
            return ReleaseEnd(note="the reservation has ended; the lock went with it")
        if failure.kind is ErrorKind.TRANSIENT:
            doing = f"{doing} ({self.failures} failed calls)"
        error = diagnosis.release_error(op, failure, doing, core.reservation_id, core.name)
        raise core.news.error(error, op)


def _shows(read: CallResult, ticket: Optional[LockAlias], token: str) -> bool:
    """True when ``read`` shows ``ticket`` as a queue ticket of ``token``."""
    if ticket is None or not read.ok or read.services is None:
        return False
    service = read.services.get(ticket.alias)
    parsed = None if service is None else parse_ticket(service.token)
    return parsed is not None and parsed[0] == token
