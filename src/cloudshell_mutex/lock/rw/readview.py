"""What one reader of a read-write lock sees: fresh snapshots of every service of the lock, its judgement of
each holder on its own clock (:class:`~.lease.StaleWatch`), and the breaks of crashed readers and writers.

No decision here takes or leaves anything of the reader's own: :mod:`.readlock` decides, from what this
view says (who blocks readers, whether a group was abandoned, whether a closer or breaker is at work).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from .. import diagnosis, protocol
from ..engine import Runtime, Wait
from ..errors import MutexError
from ..holder import Holder, is_read_group
from ..lease import lease
from ..lease.lease import StaleWatch
from ..options import MutexOptions
from ..queue.tickets import FALLBACK_AFTER, queue_view
from ..server.alias import LockAlias, Status


class ReadView:
    """One reader's view of the lock ``lock_alias`` names (see the module docstring). ``slot_names`` are the
    reader slots this reader may take (other readers may have more)."""

    def __init__(
        self,
        lock_alias: LockAlias,
        owner: str,
        options: MutexOptions,
        logger: logging.Logger,
        runtime: Runtime,
        slot_names: List[str],
    ) -> None:
        self.lock_alias = lock_alias
        self.name = lock_alias.alias
        self.owner = owner
        self.options = options
        self.logger = logger
        self.runtime = runtime
        self.slot_names = slot_names
        # For breaking a crashed reader's slot (any reader's) or a crashed writer: the alias, made when first
        # needed, judged on this reader's clock from every snapshot it reads, broken as a waiting mutex
        # breaks its holder.
        self._targets: Dict[str, LockAlias] = {}
        self._watches: Dict[str, StaleWatch] = {}
        self._breaker = lease.Breaker(
            lock_alias.sibling, owner, lease.breaker_lease(options.lease), options.request_lifetime, runtime
        )
        # The queue's tickets (each judged with its own lease), and the head seen while MUTEX was free.
        self._tickets: Dict[str, StaleWatch] = {}
        self._free_head: Optional[Tuple[str, float]] = None  # (ticket alias, first seen at) with MUTEX free

    @property
    def calls(self) -> int:
        """API calls of this view's breaks (its snapshots are the lock alias's)."""
        return sum(target.calls for target in self._targets.values()) + self._breaker.calls

    def snapshot(self, paced: bool, deadline: Wait) -> Optional[Dict[str, Holder]]:
        """One fresh read of every service (None after a transient failure); feeds the stale watches."""
        result = self.lock_alias.read(paced=paced, deadline=deadline)
        if not result.ok:
            if result.status is Status.TRANSIENT:
                self.logger.debug(
                    "cloudshell-mutex: reading %s failed (%s)", self.name, result.failure.message
                )
                return None
            raise self._fatal(result.failure, "reading the reservation's lock services")
        services = result.services or {}
        watched = {
            self.name,
            protocol.writer_waiting_alias(self.name),
            protocol.closer_alias(self.name),
            protocol.breaker_alias(self.name),
        }
        watched.update(protocol.reader_slots(services, self.name), self._watches)
        for alias in watched:
            self._watch(alias).observe(services.get(alias), result.answered_at)
        queued = {t.alias: t.holder for t in queue_view(services, self.name, result.sent_at).tickets}
        for alias in set(queued) | set(self._tickets):
            self._tickets.setdefault(alias, StaleWatch()).observe(queued.get(alias), result.answered_at)
        self._free_head = self._head_while_free(services, queued, result.sent_at)
        return services

    def _head_while_free(
        self, services: Dict[str, Holder], queued: Dict[str, Holder], at: float
    ) -> Optional[Tuple[str, float]]:
        """(head ticket, since when) while MUTEX is free with the same ticket at the head, else None."""
        head = next(iter(queued), None)  # the queue view's tickets come in queue order
        if head is None or self.name in services:
            return None
        if self._free_head is not None and self._free_head[0] == head:
            return self._free_head
        return (head, at)

    def readers(self, snap: Dict[str, Holder]) -> List[str]:
        """Every reader slot the snapshot shows, whatever ``max_readers`` the reader that took it had."""
        return protocol.reader_slots(snap, self.name)

    def writer_waiting(self, snap: Dict[str, Holder]) -> Optional[Holder]:
        """The writer-waiting marker, unless this reader has judged it stale (a crashed writer's)."""
        marker = snap.get(protocol.writer_waiting_alias(self.name))
        if marker is None or self._watch(marker.alias).stale(self.runtime.clock()):
            return None
        return marker

    def waiter_queued(self, snap: Dict[str, Holder]) -> Optional[Holder]:
        """The first waiter in the lock's queue (a plain mutex or a writer waits in line: docs/protocol.md),
        so that a stream of readers cannot starve it. Not a ticket this reader has judged stale, nor a head
        that has left ``MUTEX`` free for :data:`~.tickets.FALLBACK_AFTER` (gone or stuck: the queue is only
        advisory, as its own waiters treat it)."""
        now = self.runtime.clock()
        for ticket in queue_view(snap, self.name, now).tickets:
            if self._tickets.get(ticket.alias, StaleWatch()).stale(now):
                continue
            free = self._free_head
            if free is not None and free[0] == ticket.alias and now - free[1] >= FALLBACK_AFTER:
                continue
            return ticket.holder
        return None

    def breaker_at_work(self, snap: Dict[str, Holder]) -> bool:
        """True when the snapshot shows someone breaking ``MUTEX`` (a waiter that judged the group stale),
        unless this reader has judged that breaker's service stale (a crashed breaker's)."""
        marker = snap.get(protocol.breaker_alias(self.name))
        if marker is None:
            return False
        watch, now = self._watch(marker.alias), self.runtime.clock()
        return not lease.breaker_crashed(watch, now, self.options.request_lifetime)

    def blocker(self, snap: Dict[str, Holder]) -> Optional[str]:
        """Why this snapshot lets no reader in (None: a reader may try)."""
        holder = snap.get(self.name)
        if holder is not None and not is_read_group(holder):
            if self.break_stale(snap, [self.name]):  # a crashed writer's, judged as a waiting mutex would
                return None
            return f"{self.name} is held by {holder.label}"
        waiting = self.writer_waiting(snap)
        if waiting is not None:
            return f"a writer is waiting ({waiting.label})"
        queued = self.waiter_queued(snap)
        if queued is not None:
            return f"a waiter is queued for {self.name} ({queued.label})"
        if all(alias in snap for alias in self.slot_names):
            if self.break_stale(snap, self.slot_names):
                return None
            return f"all {len(self.slot_names)} reader slots are taken"
        return None

    def abandoned_group(self, snap: Dict[str, Holder]) -> bool:
        """A writer waits, or a waiter is queued for the lock, and this read shows a read group with no reader
        slot held and nobody at work on it: no new reader comes in while they wait, so none would close it.
        A closer or breaker at work (the last reader closing, most often) is left to it: a second close
        would only wait for its ``MUTEX~c``."""
        holder = snap.get(self.name)
        if not is_read_group(holder) or self.readers(snap):
            return False
        if self.closer_at_work(snap) or self.breaker_at_work(snap):
            return False
        return self.writer_waiting(snap) is not None or self.waiter_queued(snap) is not None

    def closer_at_work(self, snap: Dict[str, Holder]) -> bool:
        """True when the snapshot shows ``MUTEX~c`` that this reader has not judged stale (a crashed closer's:
        the next close breaks it by the lease rules)."""
        marker = snap.get(protocol.closer_alias(self.name))
        return marker is not None and not self._watch(marker.alias).stale(self.runtime.clock())

    def break_stale(self, snap: Dict[str, Holder], aliases: List[str]) -> bool:
        """Break each of ``aliases`` (reader slots, or a writer's ``MUTEX``) that this reader has seen
        unchanged (token and heartbeat) for its lease + margin, as a waiting mutex breaks a stale holder (one
        breaker at a time, on the record). True when one was. A holder without a lease is never broken."""
        broken = False
        for alias in aliases:
            watch = self._watch(alias)
            holder = snap.get(alias)
            if holder is None or not watch.stale(self.runtime.clock()):
                continue
            seen = watch.unchanged_for(self.runtime.clock())
            if alias not in self._targets:
                self._targets[alias] = self.lock_alias.sibling(alias)
            target = self._targets[alias]
            if not self._breaker.break_holder(target, watch).broken:
                continue
            broken = True
            what = "lock" if alias == self.name else "reader slot"
            lease_seconds = lease.lease_of(holder) or 0
            message = diagnosis.broke_stale(self.owner, what, alias, holder, lease_seconds, seen)
            self.logger.warning("cloudshell-mutex: %s", message)
            target.write_output(message, warning=True)
        return broken

    def _watch(self, alias: str) -> StaleWatch:
        return self._watches.setdefault(alias, StaleWatch())

    def _fatal(self, failure: Any, doing: str) -> MutexError:
        state = self.lock_alias.reservation_state() if diagnosis.needs_state(failure) else None
        model = self.options.model
        return diagnosis.fatal_error(
            failure,
            doing,
            self.lock_alias.reservation_id,
            self.name,
            model,
            None,
            state,
            self.lock_alias.domain,
        )
