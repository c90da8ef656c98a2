"""What both sides of one :class:`~.rwlock.ReservationRWLock` share, and the mutexes it is built from.

Every alias the read-write lock adds is held by a :class:`~..mutex.mutex.ReservationMutex` of one of three
kinds: a derived mutex (a reader slot, the closer, the writer-waiting marker: aliases derived from the lock's
name), the read group's hold on ``MUTEX``, and the writer's. They differ by class flags, as kazoo's
``ReadLock`` and ``WriteLock`` differ from its ``Lock``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Optional, Type

from .. import protocol
from ..engine import Runtime, Wait
from ..mutex.mutex import ReservationMutex
from ..options import MutexOptions, default_logger
from ..pacing import DefaultPacing, PacingPolicy, cancellation_check
from ..server.alias import LockAlias


class GroupAdds:
    """What a read group does with an add of ``MUTEX`` that may land after its opener gave it up: nothing
    blind. A plain mutex's watcher removes such an add when it lands, but a group's ``MUTEX`` may have been
    joined meanwhile, and only a closer (who sees no reader slot) may remove it. A group that lands with no
    reader is an open group like any other: the next reader joins and closes it, and a waiting writer breaks
    it once it has seen no heartbeat for its lease + margin."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def watch(
        self,
        alias: LockAlias,
        token: str,
        lands_by: float,
        lifetime: float,
        copies: int = 1,
        removing_until: Optional[float] = None,
    ) -> None:
        """Log the add that may still land; it is left to the readers' protocol and the lease. (The
        signature is :meth:`~.late_adds.LateAdds.watch`'s: every watcher is handed the same.)"""
        self.logger.info(
            "cloudshell-mutex: a read group's add of %s (%s) may still land; if it does, readers close it "
            "and a waiting writer breaks it after its lease",
            alias.alias,
            token,
        )


class DerivedMutex(ReservationMutex):
    """A ReservationMutex on an alias this lock derives from its name: a reader slot, the closer, the writer
    waiting (names no public lock may have)."""

    _derived_name = True
    _marks_release = False


class GroupMutex(ReservationMutex):
    """The read group's hold on ``MUTEX``: a ReservationMutex whose tokens carry
    :data:`~.protocol.READ_GROUP_MARK`, and whose adds that may land late are never removed blindly
    (:class:`GroupAdds`)."""

    _token_mark = protocol.READ_GROUP_MARK
    # After an interrupt inside acquire(): never remove the add, even when a read shows it (a plain mutex
    # does): a reader may have joined the group in that instant. The opener's slot is given back and the
    # group closed through MUTEX~c, which removes it only without readers.
    _removes_abandoned_add = False
    _marks_release = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        runtime = kwargs.get("runtime") or Runtime()
        kwargs["runtime"] = dataclasses.replace(
            runtime, late_adds=GroupAdds(default_logger(kwargs.get("logger")))
        )
        super().__init__(*args, **kwargs)


class RWCore:
    """What both sides of one :class:`ReservationRWLock` share: its options, the runtime, the snapshot
    reader on ``MUTEX``, and how to make the mutexes on its aliases."""

    def __init__(
        self,
        api: Any,
        reservation_id: str,
        name: str,
        owner: str,
        options: MutexOptions,
        logger: logging.Logger,
        runtime: Runtime,
        mutex_runtime: Runtime,
    ) -> None:
        self.owner = owner
        self.options = options
        self.logger = logger
        self.runtime = runtime
        self.pacing: PacingPolicy = options.pacing or DefaultPacing()
        #: The caller's cancellation (None: none), asked while a reader waits.
        self.cancelled = cancellation_check(options.cancellation)
        #: The snapshot reader: checks the reservation id and the name (no call is made here).
        self.lock_alias = LockAlias.for_lock(
            api, reservation_id, name, options, logger, runtime.clock, runtime.sleep
        )
        #: What every mutex of this lock is made with (its options replaced per alias).
        self.mutex_args: Dict[str, Any] = {
            "options": options,
            "logger": logger,
            "runtime": mutex_runtime,
        }

    @property
    def name(self) -> str:
        """The lock's alias: the writer's, and the read group's."""
        return self.lock_alias.alias

    @property
    def reservation_id(self) -> str:
        """The reservation the lock is in."""
        return self.lock_alias.reservation_id

    def alias(self, alias: str) -> LockAlias:
        """The calls on ``alias`` of this lock's reservation."""
        return self.lock_alias.sibling(alias)

    def wait(self, blocking: bool, timeout: Any) -> Wait:
        """The wait of one acquire of either side (:meth:`~..engine.Wait.for_acquire`)."""
        return Wait.for_acquire(blocking, timeout, self.options.timeout, self.runtime, self.cancelled)

    def mutex(self, alias: str, kind: str = "derived", **changes: Any) -> ReservationMutex:
        """A mutex of ``kind`` on ``alias`` with this lock's options (``changes`` replaced). Only the writer
        waits in the lock's queue: the derived mutexes (slots, markers, the closer) are held for a few calls,
        and a read group's add is one try, so they poll plainly."""
        args = self.mutex_args
        if kind != "writer":
            changes = {"fair": False, **changes}
        if changes:
            args = {**args, "options": self.options.replace(**changes)}
        make = _KINDS[kind]
        return make(self.lock_alias.api, self.reservation_id, owner=self.owner, name=alias, **args)


_KINDS: Dict[str, Type[ReservationMutex]] = {
    "derived": DerivedMutex,
    "group": GroupMutex,
    "writer": ReservationMutex,
}
