"""ReservationRWLock and list_locks on the target server: what the RW protocol needs from it.

Readers share the read group's ``MUTEX``, a writer is excluded while they read and gets in after them, and
nothing is left behind: reader slots, the closer and the writer-waiting marker are all removed. On a real
server this is also the check that one ``GetReservationDetails`` answer shows a reader its own slot right
after the add (the protocol decides only on such reads).
"""

from __future__ import annotations

import pytest

from cloudshell_mutex import ReservationRWLock, protocol
from cloudshell_mutex.lock.admin.listing import list_locks
from cloudshell_mutex.lock.holder import is_read_group

pytestmark = [pytest.mark.integration, pytest.mark.contract]

MUTEX = protocol.DEFAULT_ALIAS


def test_readers_share_the_lock_a_writer_waits_and_nothing_is_left_behind(sandbox) -> None:
    before = set(sandbox.services())
    first = ReservationRWLock(sandbox.api, sandbox.id, owner="contract reader 1", timeout=60)
    second = ReservationRWLock(sandbox.api, sandbox.id, owner="contract reader 2", timeout=60)
    writer = ReservationRWLock(sandbox.api, sandbox.id, owner="contract writer", timeout=60)
    with first.read(), second.read():
        assert first.read().token == second.read().token
        listing = {info.alias: info for info in list_locks(sandbox.api, sandbox.id).locks}
        assert listing[MUTEX].mode == "shared" and len(listing[MUTEX].readers) == 2
        assert not writer.write().acquire(blocking=False)
    with writer.write() as side:
        listing = {info.alias: info for info in list_locks(sandbox.api, sandbox.id).locks}
        assert listing[MUTEX].mode == "exclusive" and listing[MUTEX].token == side.token
        assert not first.read().acquire(blocking=False)
    assert set(sandbox.services()) == before


def test_the_read_groups_mutex_is_a_plain_mutex_service_to_the_original_protocol(sandbox) -> None:
    reader = ReservationRWLock(sandbox.api, sandbox.id, owner="contract reader", timeout=60)
    with reader.read():
        service = sandbox.services()[MUTEX]
        assert service.ServiceName == protocol.SERVICE_MODEL
        owner = {a.Name.rsplit(".", 1)[-1]: a.Value for a in service.Attributes}[protocol.ATTR_OWNER]
        assert owner == reader.read().token
        assert is_read_group(_holder(owner))
        listing = {info.alias: info for info in list_locks(sandbox.api, sandbox.id).locks}
        assert listing[MUTEX].mode == "shared" and listing[MUTEX].token == owner


def _holder(token: str):
    from cloudshell_mutex.lock.holder import Holder

    return Holder(MUTEX, token, "", protocol.SERVICE_MODEL)
