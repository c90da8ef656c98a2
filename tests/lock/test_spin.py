"""Spin, then park (lock/queue/queue.py), on the fake API with a virtual clock.

A waiter first polls the add by the lock's pacing with no ticket (it *spins*); only a wait that grows past
a few holds takes a ticket and *parks*. The polls of the head, and the reads of the waiters behind it, slow
down as the hold they wait for ages. The queue's own steps, once parked, are test_queue.py's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List, Tuple

import pytest
from fakes import FakeApi, make, other_holds
from urllib3.exceptions import ProtocolError

from cloudshell_mutex import MutexTimeout, protocol
from cloudshell_mutex.lock.lease.lease import ticket_value
from cloudshell_mutex.lock.pacing import DefaultPacing, FixedPacing
from cloudshell_mutex.lock.protocol import ticket_alias
from cloudshell_mutex.lock.queue import queue
from cloudshell_mutex.lock.queue.tickets import TICKET_LEASE

MUTEX = protocol.DEFAULT_ALIAS
ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = ROOT / "docs" / "protocol.md"


class TimedApi(FakeApi):
    """The fake, recording (virtual time, method, alias) of every add and read."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log: List[Tuple[float, str, str]] = []

    def AddServiceToReservation(self, reservationId="", serviceName="", alias="", attributes=()) -> Any:
        self.log.append((self.clock.now, "add", alias))
        return super().AddServiceToReservation(reservationId, serviceName, alias, attributes)

    def GetReservationDetails(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append((self.clock.now, "read", ""))
        return super().GetReservationDetails(*args, **kwargs)

    def ticket_adds(self) -> List[float]:
        return [at for at, kind, alias in self.log if kind == "add" and protocol.TICKET_INFIX in alias]

    def lock_adds(self) -> List[float]:
        return [at for at, kind, alias in self.log if kind == "add" and alias == MUTEX]


def lose_the_first_ticket_reply(api: TimedApi, clock: Any, late: List[str], landed: List[str]) -> None:
    """The first ticket add's reply is lost (a connection reset) and the add lands 30 s later, after the
    acquire's 20 s timeout: its alias goes to ``late`` at the send, to ``landed`` when it commits."""

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if protocol.TICKET_INFIX in alias and not late:
            late.append(alias)
            copy = list(attributes)

            def land() -> None:
                api.commit_add(reservation_id, model, alias, copy)
                landed.append(alias)

            api.later(clock.now + 30, land)
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 100


def test_a_short_wait_is_spun_with_no_ticket(clock) -> None:
    api = TimedApi(clock=clock)
    other_holds(api)
    lock = make(api, clock, fair=True, timeout=60)
    api.later(clock.now + 0.6, lambda: api.services.pop(MUTEX))
    lock.acquire()
    assert api.ticket_adds() == []  # no ticket, no ticket remove: a short wait costs what plain polling does
    assert len(api.lock_adds()) >= 3  # it polled the add (every 0.1 s, the test's pacing)
    lock.release()
    assert not api.services


def test_a_wait_that_grows_past_the_spin_parks_with_a_ticket(clock) -> None:
    api = TimedApi(clock=clock)
    other_holds(api)
    lock = make(api, clock, fair=True, timeout=60)
    start = clock.now
    api.later(start + 20, lambda: api.services.pop(MUTEX))
    lock.acquire()
    [parked] = api.ticket_adds()
    # Parked once the spin was over: SPIN_HOLDS holds (the hold time unknown: the default period), within
    # SPIN_MIN and SPIN_MAX; it polled the add until then.
    assert start + queue.SPIN_MIN <= parked <= start + queue.SPIN_MAX + 0.5
    assert [at for at in api.lock_adds() if at < parked]
    lock.release()
    assert not api.services  # the ticket went with the lock


def test_a_waiter_that_holds_another_lock_parks_at_once(clock) -> None:
    # Its ticket names what it holds: the deadlock check reads the wait-for graph from tickets.
    api = TimedApi(clock=clock)
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    other_holds(api)
    lock = make(api, clock, fair=True, timeout=60)
    start = clock.now
    api.later(start + 5, lambda: api.services.pop(MUTEX))
    lock.acquire()
    assert api.ticket_adds() and api.ticket_adds()[0] <= start + 0.5
    lock.release()
    outer.release()


@pytest.mark.parametrize("fault", [None, "reply lost, lands 30 s later"])
def test_a_waiter_that_finds_others_in_line_parks_at_once(clock, fault) -> None:
    # A spin would race the waiters already parked for the next hand-off (a newcomer winning it overtakes
    # them), or let a releaser that lines up first go ahead of it: it joins the line behind them instead.
    # Its ticket's add is sent sooner than a spinner's: one whose reply is lost and that lands after the wait
    # ended is the late-add watcher's, removed once a read shows it.
    api = TimedApi(clock=clock)
    other_holds(api)
    head = ticket_alias(MUTEX, 0)
    api.services[head] = {protocol.ATTR_OWNER: ticket_value("Head@host:7:0badcafe", TICKET_LEASE, 0)}
    lock = make(api, clock, fair=True, timeout=20)
    start, late, landed = clock.now, [], []

    if fault:
        lose_the_first_ticket_reply(api, clock, late, landed)
    with pytest.raises(MutexTimeout):
        lock.acquire()  # the holder never leaves
    # One busy add and the read after it (it shows the ticket), then our ticket: no spin of adds.
    calls = [(kind, protocol.TICKET_INFIX in alias) for _, kind, alias in api.log]
    assert calls[:3] == [("add", False), ("read", False), ("add", True)], calls[:8]
    assert api.ticket_adds()[0] < start + queue.SPIN_MIN
    watcher = lock.runtime.late_adds
    while clock.now < start + 45:
        clock.sleep(1.0)
        watcher.sweep()
    assert landed == late and bool(late) == bool(fault)  # the lost add landed, after the wait ended
    assert [alias for alias in api.services if protocol.TICKET_INFIX in alias] == [head]  # only the head's


@pytest.mark.parametrize("fault", [None, "reply lost, lands 30 s later"])
def test_a_waiter_behind_a_read_group_parks_at_once(clock, fault) -> None:
    # Readers join a group while no ticket is queued (rw/readview.py, waiter_queued): a spin would only let
    # more of them in. The ticket's add is the one a waiter makes after its spin: one whose reply is lost and
    # that lands long after the wait ended is the late-add watcher's, removed once a read shows it.
    api = TimedApi(clock=clock)
    other_holds(api, protocol.READ_GROUP_MARK + "Reader@host:1:deadbeef")
    lock = make(api, clock, fair=True, timeout=20)
    start, late, landed = clock.now, [], []

    if fault:
        lose_the_first_ticket_reply(api, clock, late, landed)
    with pytest.raises(MutexTimeout):
        lock.acquire()  # the group never leaves
    # One busy add and the read after it, then the ticket: no spin (it would last 1-5 s, polling the add).
    calls = [(kind, protocol.TICKET_INFIX in alias) for _, kind, alias in api.log]
    assert calls[:3] == [("add", False), ("read", False), ("add", True)], calls[:8]
    watcher = lock.runtime.late_adds
    while clock.now < start + 45:
        clock.sleep(1.0)
        watcher.sweep()
    assert landed == late and bool(late) == bool(fault)  # the lost add landed, after the wait ended
    assert [alias for alias in api.services if protocol.TICKET_INFIX in alias] == []  # nothing left behind


def test_the_heads_polls_slow_down_as_the_hold_ages(clock) -> None:
    api = TimedApi(clock=clock)
    other_holds(api)  # a hold whose start nobody saw, and no hold time learned
    lock = make(api, clock, fair=True, timeout=300)
    start = clock.now
    with pytest.raises(MutexTimeout):
        lock.acquire()
    adds = [at - start for at in api.lock_adds()]
    early = [at for at in adds if 10 <= at < 40]
    late = [at for at in adds if 200 <= at < 230]
    assert len(late) * 3 < len(early), (len(early), len(late))
    # Each gap no more than OLD_HOLD_POLL, or AGE_FRACTION of the hold's age (as seen from the first read)
    # once that is longer, with jitter.
    for before, after in zip(adds, adds[1:]):
        if before > queue.SPIN_MAX:
            longest = max(queue.OLD_HOLD_POLL, min(queue.AGE_MAX, queue.AGE_FRACTION * after))
            assert after - before <= longest * (1 + queue.JITTER) + 0.5, (before, after)
    # ... and the whole 300 s wait made fewer than a call a second (the head polls about (1 + ln(T / t0)) /
    # AGE_FRACTION times over a hold of T: ~150 here), where polling every 0.25 s would make 1,200.
    assert len(api.log) < 300


def test_the_waiters_behind_the_head_read_ever_more_rarely_as_the_hold_ages(clock) -> None:
    api = TimedApi(clock=clock)
    other_holds(api)
    head = ticket_alias(MUTEX, 0)
    api.services[head] = {protocol.ATTR_OWNER: ticket_value("Head@host:7:0badcafe", TICKET_LEASE, 0)}

    def beat(count: int) -> None:  # the head is alive: its heartbeat moves
        if head in api.services:
            api.services[head] = {
                protocol.ATTR_OWNER: ticket_value("Head@host:7:0badcafe", TICKET_LEASE, count)
            }

    for count in range(1, 10):
        api.later(clock.now + 30 * count, lambda count=count: beat(count))
    lock = make(api, clock, fair=True, timeout=240)
    start = clock.now
    with pytest.raises(MutexTimeout):
        lock.acquire()
    reads = [at - start for at, kind, _ in api.log if kind == "read"]
    early = [at for at in reads if 10 <= at < 40]
    late = [at for at in reads if 180 <= at < 210]
    assert early and len(late) < len(early), (len(early), len(late))
    # Once the hold is old, the next in line too reads LINE_AGE_FRACTION of its age apart (AGE_MAX at most):
    # the whole line then makes a few calls a minute, whatever the head costs.
    for before, after in zip(reads, reads[1:]):
        if before > 20 and after < 235:  # not the reads of the timeout's leaving
            least = min(queue.AGE_MAX, queue.LINE_AGE_FRACTION * before) * (1 - queue.JITTER) - 0.5
            assert after - before >= least, (before, after)


def test_the_next_in_line_reads_no_more_often_than_the_head_of_an_old_hold_polls(clock) -> None:
    # Once the hold is older than a few holds the head polls by the lock's pacing (1 s here), not every
    # period/4: a read of the next in line can only find the head granted by one of those polls, so it reads
    # no more often (it read every period/3 = 0.33 s before: ~30 reads in these 10 s).
    api = TimedApi(clock=clock)
    other_holds(api)
    head = ticket_alias(MUTEX, 0)
    api.services[head] = {protocol.ATTR_OWNER: ticket_value("Head@host:7:0badcafe", TICKET_LEASE, 0)}
    lock = make(api, clock, fair=True, timeout=20, pacing=FixedPacing(1.0))
    start = clock.now
    with pytest.raises(MutexTimeout):
        lock.acquire()
    assert api.ticket_adds(), "it never parked: the test did not test the line"
    reads = [at - start for at, kind, _ in api.log if kind == "read"]
    window = [at for at in reads if 8 <= at < 18]  # parked by SPIN_MAX; the hold old past 3 holds
    assert 5 <= len(window) <= 10 / (1 - queue.JITTER) + 1, window


def _cost_table() -> List[Tuple[int, int, int]]:
    """protocol.md's "What a waiter costs the server": (wait s, default calls, fair=False calls) per row."""
    text = PROTOCOL_MD.read_text(encoding="utf-8").split("### What a waiter costs the server", 1)[1]
    rows = re.findall(r"^\| (\d+) s \| (\d+) \| (\d+) \|", text.split("\n#", 1)[0], re.M)
    return [(int(wait), int(default), int(plain)) for wait, default, plain in rows]


def _waiter_calls(clock: Any, fair: bool, wait: float) -> int:
    """The calls of one waiter in a fresh process behind a hold of unknown start that ends ``wait`` s after
    it came, with its release."""
    api = FakeApi(clock=clock)
    other_holds(api)
    lock = make(api, clock, fair=fair, timeout=wait + 100, pacing=DefaultPacing())
    api.later(clock.now + wait, lambda: api.services.pop(MUTEX))
    lock.acquire()
    lock.release()
    return len(api.calls)


def test_protocol_md_says_what_a_waiter_costs(clock) -> None:
    table = _cost_table()
    assert [wait for wait, _, _ in table] == [1, 3, 10, 30, 60, 300]
    for wait, default, plain in table:
        assert (_waiter_calls(clock, True, wait), _waiter_calls(clock, False, wait)) == (default, plain), wait
    # The README rounds the default's column to tens past the first minute.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"about (\d+) calls over a 3 s wait, (\d+) over a minute and (\d+) over five", readme)
    assert said is not None
    default = {wait: calls for wait, calls, _ in table}
    assert tuple(map(int, said.groups())) == (default[3], round(default[60], -1), round(default[300], -1))
