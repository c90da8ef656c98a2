"""Deadlocks between named locks: the wait-for graph of one read (lock/waitfor.py), the records in tickets
(lease.ticket_value), what a thread holds (lock/holdings.py), the queue's checks (on the fake API with a
virtual clock) and acquire_all."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest
from fakes import RES, FakeApi, http_500, make
from test_queue import RecordingApi
from urllib3.exceptions import ProtocolError

from cloudshell_mutex import MutexTimeout, MutexUsageError, protocol
from cloudshell_mutex.lock import MutexDeadlock, acquire_all
from cloudshell_mutex.lock.holder import Holder, describe_owner
from cloudshell_mutex.lock.lease import lease
from cloudshell_mutex.lock.lease.lease import MAX_TICKET_HOLDS, parse_ticket, ticket_holds, ticket_value
from cloudshell_mutex.lock.protocol import ticket_alias
from cloudshell_mutex.lock.queue import holdings, queue, waitfor
from cloudshell_mutex.lock.queue import tickets as queue_values
from cloudshell_mutex.lock.queue.waitfor import wait_for

# Tokens: <label>@<host>:<pid>:<nonce>. The victim of a cycle is the member whose nonce is the greatest.
HA, HB, HC = "p1@h:1:000000a1", "p2@h:2:000000b2", "p3@h:3:000000c3"  # holding acquisitions
W1, W2, W3 = "p1@h:1:100000a1", "p2@h:2:200000b2", "p3@h:3:300000c3"  # waiting acquisitions


def _service(alias: str, value: str) -> Holder:
    return Holder(alias, value, describe_owner(value), protocol.SERVICE_MODEL, {protocol.ATTR_OWNER: value})


def _read(holders: Dict[str, str], waits: Dict[str, tuple]) -> Dict[str, Holder]:
    """A read: ``holders`` lock -> token; ``waits`` ticket alias -> (waiter token, held tokens)."""
    services = {alias: _service(alias, token) for alias, token in holders.items()}
    for alias, (token, held) in waits.items():
        services[alias] = _service(alias, ticket_value(token, 120, 0, held))
    return services


@pytest.fixture(autouse=True)
def _forget_memories():
    queue_values._memories.clear()
    yield
    queue_values._memories.clear()


# ---------------------------------------------------------------- the records


def test_a_ticket_naming_held_locks_is_still_a_live_ticket_for_the_current_parser() -> None:
    value = ticket_value(W1, 120, 3, [HA, HB])
    token, seconds, beat = parse_ticket(value)  # what releases that know tickets read
    assert (token, seconds) == (W1, 120.0)
    holder = lease.ticket_holder(_service("A~q~1", value))
    assert lease.own_heartbeat(holder) == beat != ""  # its own heartbeat: judged alive, not foreign
    watch = lease.StaleWatch()
    watch.observe(holder, 0.0)
    watch.observe(lease.ticket_holder(_service("A~q~1", ticket_value(W1, 120, 4, [HA, HB]))), 100.0)
    assert not watch.stale(200.0)  # the next beat is seen as a sign of life
    assert ticket_holds(value) == ("000000a1", "000000b2")
    assert ticket_holds(ticket_value(W1, 120, 3)) == ()  # an older ticket holds nothing
    assert ticket_value(W1, 120, 3) == f"{W1}#120#100000a1:q:3"  # unchanged when nothing is held


def test_a_ticket_names_a_bounded_number_of_held_locks_and_foreign_values_hold_nothing() -> None:
    many = [f"p@h:1:{i:08x}" for i in range(20)]
    value = ticket_value(W1, 120, 0, many)
    assert ticket_holds(value) == tuple(f"{i:08x}" for i in range(20 - MAX_TICKET_HOLDS, 20))  # the latest
    assert len(value) <= len(ticket_value(W1, 120, 0)) + 9 * MAX_TICKET_HOLDS
    for foreign in (
        "",
        "someone else",
        f"{W1}#120#100000a1:q.zz:1",
        f"{W1}#120#100000a1:x.000000a1:1",
        f"{W1}#120#100000a1:q.000000a1.:1",
    ):
        assert ticket_holds(foreign) == ()
    assert ticket_value(W1, 120, 0, ["original code's owner", ""]) == ticket_value(W1, 120, 0)


# ---------------------------------------------------------------- the graph


def test_two_waiters_in_opposite_orders_make_a_cycle_and_both_pick_the_same_victim() -> None:
    read = _read({"A": HA, "B": HB}, {"B~q~1": (W1, [HA]), "A~q~4": (W2, [HB])})
    graph = wait_for(read)
    first, second = graph.cycle_through(W1), graph.cycle_through(W2)
    assert first is not None and second is not None
    assert first.as_tuples() == (("B", "p2 (host h, pid 2)", "A"), ("A", "p1 (host h, pid 1)", "B"))
    assert first.victim == second.victim == W2  # the greatest nonce, whoever computes it
    assert "B is held by p2 (host h, pid 2), which waits for A" in first.describe()
    assert "(this thread)" in first.describe(W1)
    assert len(graph.cycles()) == 1


def test_a_three_lock_cycle_is_found_and_a_chain_is_not_a_cycle() -> None:
    cycle = {"B~q~0": (W1, [HA]), "C~q~0": (W2, [HB]), "A~q~0": (W3, [HC])}
    graph = wait_for(_read({"A": HA, "B": HB, "C": HC}, cycle))
    found = graph.cycle_through(W2)
    assert found is not None and [s.lock for s in found.steps] == ["C", "A", "B"]
    assert found.victim == W3
    chain = {"B~q~0": (W1, [HA]), "C~q~0": (W2, [HB])}  # A -> B -> C, C's holder waits for nothing
    assert wait_for(_read({"A": HA, "B": HB, "C": HC}, chain)).cycles() == []


def test_a_stale_record_never_makes_a_cycle() -> None:
    # W2's ticket names HB, but B is now held by another acquisition: the claim does not count.
    read = _read({"A": HA, "B": "p9@h:9:000000f9"}, {"B~q~1": (W1, [HA]), "A~q~1": (W2, [HB])})
    assert wait_for(read).cycles() == []
    # Two tickets claim the same hold (one left behind by an earlier wait): the edge is not followed.
    left = _read(
        {"A": HA, "B": HB},
        {"B~q~1": (W1, [HA]), "A~q~1": (W2, [HB]), "C~q~1": ("p2@h:2:2222bbbb", [HB])},
    )
    assert wait_for(left).cycles() == []
    # The granted waiter's own ticket, not removed yet, is no wait.
    granted = _read({"A": HA, "B": W1}, {"B~q~1": (W1, [HA]), "A~q~1": (W2, [W1])})
    assert wait_for(granted).cycles() == []


def test_foreign_and_older_tickets_and_the_original_code_make_no_edges() -> None:
    read = _read({"A": HA, "B": "an original snippet's owner"}, {"A~q~1": (W2, [])})
    read["B~q~1"] = _service("B~q~1", "foreign value")
    read["B~q~2"] = _service("B~q~2", ticket_value(W1, 120, 0))  # an older release: holds nothing
    graph = wait_for(read)
    assert graph.edges == {} and graph.cycles() == []
    assert {w.token for w in graph.waiters} == {W1, W2}


def test_a_cycle_that_a_waiter_only_waits_on_is_not_its_own() -> None:
    read = _read(
        {"A": HA, "B": HB, "C": HC},
        {"B~q~1": (W1, [HA]), "A~q~1": (W2, [HB]), "A~q~2": (W3, [HC])},
    )
    graph = wait_for(read)
    assert graph.cycle_through(W1) is not None
    assert graph.cycle_through(W3) is None  # W3 waits for A, in the cycle of W1 and W2, but is not on it


def test_a_wait_record_is_a_waiter_in_the_graph_but_no_queue_counts_it() -> None:
    record = protocol.wait_record_alias("B", "100000a1")
    assert protocol.alias_kind(record) == ("B", "wait record")
    read = _read({"A": HA, "B": HB}, {record: (W1, [HA]), "A~q~4": (W2, [HB])})
    graph = wait_for(read)
    assert {w.ticket for w in graph.waiters} == {record, "A~q~4"}
    assert graph.cycle_through(W1) is not None
    assert queue_values.queue_view(read, "B", 0.0).tickets == ()  # nobody lines up behind it


def _beating(read: Dict[str, Holder], alias: str, token: str, held: list, count: int) -> Dict[str, Holder]:
    """``read`` with the record ``alias`` of ``token`` at heartbeat ``count``."""
    return {**read, alias: _service(alias, ticket_value(token, 120, count, held))}


def test_a_cycle_is_confirmed_only_once_every_other_member_moved_its_record_since_it_was_first_seen() -> None:
    read = _read({"A": HA, "B": HB, "C": HC}, {"B~q~1": (W1, [HA]), "C~q~1": (W2, [HB]), "A~q~1": (W3, [HC])})
    watch = waitfor.CycleWatch(W3)
    assert watch.judge(wait_for(read)) is None and watch.cycle is not None and watch.pending
    assert watch.judge(wait_for(read)) is None  # nobody moved: a dead or departed waiter never completes it
    read = _beating(read, "B~q~1", W1, [HA], 1)
    assert watch.judge(wait_for(read)) is None  # W2 has not moved yet
    read = _beating(read, "C~q~1", W2, [HB], 1)
    confirmed = watch.judge(wait_for(read))
    assert confirmed is not None and confirmed.victim == W3 and not watch.pending
    # The cycle gone (a member left), then back: its members' signs of life count from then on.
    gone = {alias: holder for alias, holder in read.items() if alias != "C~q~1"}
    assert watch.judge(wait_for(gone)) is None and watch.cycle is None
    assert watch.judge(wait_for(read)) is None and watch.pending


# ---------------------------------------------------------------- what a thread holds


def test_a_thread_names_only_what_it_holds_itself(clock) -> None:
    api = FakeApi()
    first = make(api, clock, name="A")
    first.acquire()
    assert holdings.held_tokens(api, RES) == (first.token,)
    seen: List[Any] = []
    worker = threading.Thread(target=lambda: seen.append(holdings.held_tokens(api, RES)))
    worker.start()
    worker.join()
    assert seen == [()]  # another thread holds nothing of this one's
    assert holdings.held_tokens(api, "another reservation") == ()
    first.release()
    assert holdings.held_tokens(api, RES) == ()


# ---------------------------------------------------------------- the queue's checks


def _ours(api: FakeApi, alias: str) -> List[str]:
    return [a for a in api.services if a.startswith(alias + protocol.TICKET_INFIX)]


def test_an_uncontended_acquire_while_holding_another_lock_costs_three_calls(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    api.calls.clear()
    inner = make(api, clock, name="B", fair=True)
    inner.acquire()
    inner.release()
    assert api.calls == ["AddServiceToReservation", "GetReservationDetails", "RemoveServicesFromReservation"]
    outer.release()


def _wait_behind_a_holder(clock, holding: bool, detect_after: float) -> List[str]:
    """The calls of a 30 s wait for B (held by someone else the whole time)."""
    queue_values._memories.clear()
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    if holding:
        outer.acquire()
    api.services["B"] = {protocol.ATTR_OWNER: HB}
    api.calls.clear()
    reads: List[float] = []
    api.on_call = lambda method: reads.append(clock.now) if method == "GetReservationDetails" else None
    waiter = make(api, clock, name="B", fair=True, timeout=30)
    old = waitfor.DETECT_AFTER
    waitfor.DETECT_AFTER = detect_after
    try:
        with pytest.raises(MutexTimeout):
            waiter.acquire()
    finally:
        waitfor.DETECT_AFTER = old
    if holding:
        outer.release()
    return api.calls, reads


@pytest.mark.usefixtures("parked_at_once")  # the parked queue's steps
def test_a_waiter_that_holds_nothing_makes_no_extra_reads_and_one_that_holds_reads_every_few_seconds(
    clock,
) -> None:
    without_checks, _ = _wait_behind_a_holder(clock, holding=False, detect_after=float("inf"))
    nothing_held, _ = _wait_behind_a_holder(clock, holding=False, detect_after=waitfor.DETECT_AFTER)
    assert nothing_held == without_checks
    holding, reads = _wait_behind_a_holder(clock, holding=True, detect_after=waitfor.DETECT_AFTER)
    start = reads[0]
    gaps = [b - a for a, b in zip(reads, reads[1:]) if a >= start + waitfor.DETECT_AFTER]
    assert gaps and max(gaps) <= waitfor.DETECT_INTERVAL * (1 + queue.JITTER) + 0.5, reads
    assert holding.count("GetReservationDetails") > nothing_held.count("GetReservationDetails")


def _cycle_behind(api: FakeApi, other_waiter: str, clock=None, beats: int = 0) -> None:
    """B is held by HB, whose party waits for A (held by us) with ``other_waiter``'s ticket; with ``clock``,
    that party is alive: it rewrites its ticket's heartbeat every second, ``beats`` times."""
    api.services["B"] = {protocol.ATTR_OWNER: HB}
    alias = ticket_alias("A", 0)
    api.services[alias] = {protocol.ATTR_OWNER: ticket_value(other_waiter, 120, 0, [HB])}

    def beat(count: int) -> None:
        if alias in api.services:
            api.services[alias] = {protocol.ATTR_OWNER: ticket_value(other_waiter, 120, count, [HB])}

    for count in range(1, beats + 1):
        api.later(clock.now + count, lambda count=count: beat(count))


def test_the_victim_raises_mutex_deadlock_keeps_what_it_holds_and_leaves_no_ticket(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    _cycle_behind(api, "p2@h:2:00000000", clock, beats=60)  # the smallest nonce: we are the victim
    inner = make(api, clock, name="B", fair=True, timeout=120)
    start = clock.now
    with pytest.raises(MutexDeadlock) as raised:
        inner.acquire()
    # The first look, and one more once the other member was seen to move (a sign of life).
    detection = waitfor.DETECT_AFTER + (waitfor.DETECT_INTERVAL + waitfor.CONFIRM_INTERVAL) * (
        1 + queue.JITTER
    )
    assert clock.now - start <= detection + 1
    assert [step[0] for step in raised.value.cycle] == ["B", "A"]
    assert raised.value.alias == "B" and "deadlock" in str(raised.value)
    assert _ours(api, "B") == []  # our ticket is gone
    assert api.services["A"][protocol.ATTR_OWNER] == outer.token  # what we hold stays held
    outer.release()


def test_a_cycle_through_a_member_that_never_moves_is_no_deadlock_and_the_timeout_does_not_call_it_one(
    clock,
) -> None:
    # The other member's ticket stays, unchanged: its waiter died (its locks go by their leases), or gave up
    # and its remove has not landed. Waiting longer may well end it: the timeout names the holder.
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    _cycle_behind(api, "p2@h:2:00000000")  # we would be the victim
    inner = make(api, clock, name="B", fair=True, timeout=60)
    with pytest.raises(MutexTimeout) as raised:
        inner.acquire()
    message = str(raised.value)
    assert "deadlock" not in message and "held by p2" in message
    assert _ours(api, "B") == []
    outer.release()


def test_an_older_heartbeat_is_no_sign_of_life() -> None:
    """A member's record seen at count 1, then at count 0 (a lagging read, or the record re-created by an
    add of it that landed after its waiter gave up): it has not moved."""
    read = _read({"A": HA, "B": HB}, {"B~q~1": (W1, [HA]), "A~q~1": (W2, [HB])})
    watch = waitfor.CycleWatch(W2)
    watch.judge(wait_for(_beating(read, "B~q~1", W1, [HA], 1)))
    assert watch.judge(wait_for(_beating(read, "B~q~1", W1, [HA], 0))) is None
    assert watch.judge(wait_for(_beating(read, "B~q~1", W1, [HA], 1))) is None
    assert watch.judge(wait_for(_beating(read, "B~q~1", W1, [HA], 2))) is not None


def test_a_cohort_members_local_timeout_in_a_cycle_does_not_advise_waiting_longer() -> None:
    from cloudshell_mutex.lock import diagnosis

    cycle = wait_for(
        _read({"A": HA, "B": HB}, {"B~d~100000a1": (W1, [HA]), "A~q~4": (W2, [HB])})
    ).cycle_through(W1)
    plain = diagnosis.local_timeout_error(30.0, "pid 7 (x)", "/tmp/l.lock", RES, "B")
    assert "Wait longer" in str(plain)
    in_cycle = diagnosis.local_timeout_error(30.0, "pid 7 (x)", "/tmp/l.lock", RES, "B", cycle, W1)
    assert (
        "Wait longer" not in str(in_cycle)
        and "deadlock" in str(in_cycle)
        and "(this thread)" in str(in_cycle)
    )


def test_a_member_rewrites_its_ticket_when_a_read_shows_it_a_cycle(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    _cycle_behind(api, "p2@h:2:ffffffff")  # the other one is the victim: we wait on
    values: List[str] = []
    api.on_call = lambda method: values.extend(
        v["Mutex Owner"] for a, v in api.services.items() if a.startswith("B" + protocol.TICKET_INFIX)
    )
    inner = make(api, clock, name="B", fair=True, timeout=20)
    with pytest.raises(MutexTimeout):
        inner.acquire()
    beats = {parse_ticket(v)[2] for v in values}
    assert len(beats) >= 5  # a sign of life after each read that showed the cycle (lease/3 would be one)
    outer.release()


def test_a_plain_polling_waiter_that_holds_a_lock_keeps_a_wait_record_and_its_victim_gives_up(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=False)
    outer.acquire()
    _cycle_behind(api, "p2@h:2:00000000", clock, beats=60)
    records: List[str] = []
    api.on_call = lambda method: records.extend(a for a in api.services if protocol.WAIT_RECORD_INFIX in a)
    inner = make(api, clock, name="B", fair=False, timeout=60)
    start = clock.now
    with pytest.raises(MutexDeadlock) as raised:
        inner.acquire()
    assert clock.now - start <= waitfor.DETECT_AFTER + 2 * waitfor.DETECT_INTERVAL + 1
    assert [step[0] for step in raised.value.cycle] == ["B", "A"]
    assert len(set(records)) == 1 and records[0].startswith("B" + protocol.WAIT_RECORD_INFIX)
    assert not any(protocol.WAIT_RECORD_INFIX in a for a in api.services)  # the record went
    assert not any(protocol.TICKET_INFIX in a and a.startswith("B") for a in api.services)  # no queue
    outer.release()


@pytest.mark.parametrize("record", [protocol.WAIT_RECORD_INFIX, protocol.TICKET_INFIX])
def test_ctrl_c_while_a_record_add_is_on_its_way_leaves_it_to_the_watcher(clock, record) -> None:
    """The add committed, and Ctrl-C struck before its answer: the record (a wait record outside the queue,
    a ticket in it) is watched and removed, not left in the sandbox."""
    api = RecordingApi()
    fair = record == protocol.TICKET_INFIX
    outer = make(api, clock, name="A", fair=fair)
    outer.acquire()
    api.services["B"] = {protocol.ATTR_OWNER: HB}

    def committed_then_interrupted(reservation_id, model, alias, attributes) -> bool:
        if record in alias:
            api.commit_add(reservation_id, model, alias, list(attributes))
            raise KeyboardInterrupt
        return False

    api.faults["AddServiceToReservation"] = [committed_then_interrupted] * 40
    inner = make(api, clock, name="B", fair=fair, timeout=30)
    with pytest.raises(KeyboardInterrupt):
        inner.acquire()
    assert any(record in a for a in api.services)  # it landed
    watcher = inner.runtime.late_adds
    for _ in range(5):
        clock.sleep(1.0)
        watcher.sweep()
    assert not any(record in a for a in api.services)
    outer.release()


@pytest.mark.parametrize("record", [protocol.WAIT_RECORD_INFIX, protocol.TICKET_INFIX])
def test_an_answered_record_add_is_settled_by_one_read_not_watched_for_a_request_lifetime(
    clock, record
) -> None:
    api = RecordingApi()
    fair = record == protocol.TICKET_INFIX
    outer = make(api, clock, name="A", fair=fair)
    outer.acquire()
    api.services["B"] = {protocol.ATTR_OWNER: HB}
    failed: List[str] = []

    def answered_500(reservation_id, model, alias, attributes) -> bool:
        if record in alias and not failed:
            failed.append(alias)
            raise http_500()  # an answer: applied or not, it cannot land later
        return False

    api.faults["AddServiceToReservation"] = [answered_500] * 40
    inner = make(api, clock, name="B", fair=fair, timeout=10)
    with pytest.raises(MutexTimeout):
        inner.acquire()
    assert failed
    watcher = inner.runtime.late_adds
    for _ in range(5):
        clock.sleep(1.0)
        watcher.sweep()
    assert [e for e in watcher.pending() if e.alias.alias == failed[0]] == []  # no watch of 120 s
    outer.release()


def test_a_wait_record_add_that_lands_late_is_removed_by_the_watcher(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=False)
    outer.acquire()
    api.services["B"] = {protocol.ATTR_OWNER: HB}
    late: List[float] = []

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if protocol.WAIT_RECORD_INFIX in alias and not late:
            late.append(clock.now)
            api.later(clock.now + 30, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 40
    inner = make(api, clock, name="B", fair=False, timeout=10)
    with pytest.raises(MutexTimeout):
        inner.acquire()
    watcher = inner.runtime.late_adds
    while clock.now < late[0] + 40:
        clock.sleep(1.0)
        watcher.sweep()
    assert not any(protocol.WAIT_RECORD_INFIX in a for a in api.services)
    outer.release()


def test_a_member_that_is_not_the_victim_waits_on_and_gets_its_lock(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    other = "p2@h:2:ffffffff"  # the greatest nonce: the other waiter is the victim
    _cycle_behind(api, other)

    def victim_gives_up() -> None:
        del api.services[ticket_alias("A", 0)]
        del api.services["B"]

    api.later(clock.now + 20, victim_gives_up)
    inner = make(api, clock, name="B", fair=True, timeout=120)
    inner.acquire()
    assert clock.now >= 20
    inner.release()
    outer.release()


def test_a_victims_ticket_add_that_lands_late_is_removed_by_the_watcher(clock) -> None:
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    _cycle_behind(api, "p2@h:2:00000000", clock, beats=60)
    late: List[float] = []

    def lost_reply(reservation_id, model, alias, attributes) -> bool:
        if alias.startswith("B" + protocol.TICKET_INFIX) and not late:
            late.append(clock.now)
            # The server applies it 30 s later; the reply never comes.
            api.later(clock.now + 30, lambda: api.commit_add(reservation_id, model, alias, list(attributes)))
            raise ProtocolError("Connection aborted.", ConnectionResetError())
        return False

    api.faults["AddServiceToReservation"] = [lost_reply] * 5
    inner = make(api, clock, name="B", fair=True, timeout=120)
    with pytest.raises(MutexDeadlock):
        inner.acquire()
    watcher = inner.runtime.late_adds
    while clock.now < late[0] + 40:
        clock.sleep(1.0)
        watcher.sweep()
    assert _ours(api, "B") == []  # the late ticket landed and was removed
    outer.release()


def test_a_thread_that_waits_for_a_lock_it_holds_through_another_object_is_not_judged(clock) -> None:
    # Another thread may release the first object (a timer does, in tests): no read can tell, so a ticket
    # never names the lock its waiter waits for, and a claim on it is no edge.
    api = RecordingApi()
    outer = make(api, clock, name="A", fair=True)
    outer.acquire()
    again = make(api, clock, name="A", fair=True, timeout=30)
    values: List[str] = []
    api.on_call = lambda method: values.extend(
        v["Mutex Owner"] for a, v in api.services.items() if protocol.TICKET_INFIX in a
    )
    with pytest.raises(MutexTimeout):
        again.acquire()
    assert values and all(ticket_holds(v) == () for v in values)
    outer.release()
    claims_itself = _read({"A": HA}, {"A~q~1": (W1, [HA])})
    assert wait_for(claims_itself).cycles() == []


# ---------------------------------------------------------------- acquire_all


class _Lock:
    def __init__(self, name: str, log: List[str], fail: bool = False, api: Any = None) -> None:
        self.name, self.log, self.fail = name, log, fail
        self.api, self.reservation_id = api or FakeApi.__new__(FakeApi), RES
        self.api.host, self.api.port = "server", 8029

    def acquire(self, timeout: Any = None) -> bool:
        if self.fail:
            raise MutexTimeout(f"{self.name} busy")
        self.log.append(f"+{self.name}")
        return True

    def release(self) -> None:
        self.log.append(f"-{self.name}")


def test_acquire_all_takes_locks_sorted_by_name_and_releases_them_in_reverse() -> None:
    log: List[str] = []
    c, a, b = _Lock("C", log), _Lock("A", log), _Lock("B", log)
    with acquire_all(c, a, b) as taken:
        assert taken == (c, a, b)
        log.append("work")
    assert log == ["+A", "+B", "+C", "work", "-C", "-B", "-A"]


def test_acquire_all_releases_what_it_took_when_one_fails() -> None:
    log: List[str] = []
    with (
        pytest.raises(MutexTimeout),
        acquire_all(_Lock("C", log, fail=True), _Lock("A", log), _Lock("B", log)),
    ):
        log.append("work")
    assert log == ["+A", "+B", "-B", "-A"]


def test_acquire_all_refuses_two_locks_of_one_name_or_of_two_reservations() -> None:
    log: List[str] = []
    with (
        pytest.raises(MutexUsageError, match="two locks named"),
        acquire_all(_Lock("A", log), _Lock("A", log)),
    ):
        pass
    other = _Lock("B", log)
    other.reservation_id = "another"
    with pytest.raises(MutexUsageError, match="one reservation"), acquire_all(_Lock("A", log), other):
        pass
    with pytest.raises(MutexUsageError), acquire_all():
        pass
    assert log == []


def test_acquire_all_as_a_plain_call_holds_the_locks_until_release() -> None:
    """Called without ``with`` it takes the locks at once (it used to be a context manager that did nothing
    until entered), and ``release()`` gives them back in reverse order, once."""
    log: List[str] = []
    a, b = _Lock("A", log), _Lock("B", log)
    held = acquire_all(b, a)
    assert log == ["+A", "+B"] and held.locks == (b, a)
    held.release()
    held.release()  # a second release does nothing
    assert log == ["+A", "+B", "-B", "-A"]
    assert "released" in repr(held)


def test_acquire_all_and_every_error_are_importable_from_the_package() -> None:
    import cloudshell_mutex

    assert cloudshell_mutex.acquire_all is acquire_all
    assert cloudshell_mutex.MutexDeadlock is MutexDeadlock
