"""The shortened stress run (part of ``make test``), and the checkers it relies on.

``make stress`` runs the same harness with 32 processes x 200 acquisitions (docs/reliability.md).
"""

from __future__ import annotations

import pytest
from history import Hold, check
from stress_harness import Chaos, Incarnation, audit, broken_grants, clean, our_package, read_journals, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def ev(seq, alias, op, monotonic=0.0, **attributes):
    return {"seq": seq, "alias": alias, "op": op, "monotonic": monotonic, "attributes": attributes}


def test_the_history_checker_accepts_a_mutex_and_catches_each_violation():
    events = [
        ev(1, "MUTEX", "service_added", 1.0, **{"Mutex Owner": "a"}),
        ev(2, "MUTEX", "service_removed", 3.0, **{"Mutex Owner": "a"}),
        ev(3, "MUTEX", "service_added", 4.0, **{"Mutex Owner": "b"}),
        ev(4, "MUTEX", "service_removed", 6.0, **{"Mutex Owner": "b"}),
    ]
    good = [Hold("A", "a", 0.5, 1.5, 2.5, 3.5), Hold("B", "b", 2.0, 4.5, 5.5, 6.5)]
    assert check(good, events).ok
    # B believed it held from 2.2 (before A let go at 3.0), with no grant during its call: both caught.
    bad = [Hold("A", "a", 0.5, 1.5, 2.5, 3.5), Hold("B", "b", 2.0, 2.2, 5.5, 6.5)]
    verdict = check(bad, events)
    assert verdict.counts()["fail_opens"] == 1 and verdict.counts()["overlaps"] == 1
    # A's lock was removed (by someone) at 3.0 while A believed it held until 3.2.
    cut = [Hold("A", "a", 0.5, 1.5, 3.2, 3.5), Hold("B", "b", 2.0, 4.5, 5.5, 6.5)]
    assert check(cut, events).counts()["cut_holds"] == 1
    # A late add of A's token after its release, never removed: a leak.
    leak = [*events, ev(5, "MUTEX", "service_added", 7.0, **{"Mutex Owner": "a"})]
    assert check(good, leak).counts()["leaks"] >= 1


def test_the_audit_counts_what_it_is_there_to_count():
    w = {"Mutex Owner": "a"}
    clean_log = [
        ev(1, "MUTEX", "service_added", **w),
        ev(2, "COUNTER", "service_attributes_set", Count="1", Writer="a"),
        ev(3, "MUTEX", "service_removed", **w),
    ]
    found = audit(clean_log)
    assert found == dict(
        foreign_removes=0, overlaps=0, lost_updates=0, grants=1, leaks=0, past_lease_writes=0
    )
    cut_short = [ev(1, "MUTEX", "service_added", **w), ev(2, "MUTEX", "service_removed", **w),
                 ev(3, "MUTEX", "service_added", **{"Mutex Owner": "b"}),
                 ev(4, "COUNTER", "service_attributes_set", Count="1", Writer="a")]  # fmt: skip
    found = audit(cut_short)
    assert found["foreign_removes"] == 1 and found["overlaps"] == 1 and found["leaks"] == 1
    assert audit([ev(1, "COUNTER", "service_attributes_set", Count="2", Writer="x")])["lost_updates"] == 1


def test_a_write_after_the_writers_lease_safe_point_is_counted_apart_and_one_before_it_is_an_overlap():
    """A holder paused between its check and its write, longer than its lease, writes after a waiter broke
    it: the one thing a lease cannot prevent (docs/reliability.md). The audit counts it apart; the same
    write landing before the writer's lease-safe point is an overlap."""
    log = [
        ev(1, "MUTEX", "service_added", 1.0, **{"Mutex Owner": "a"}),
        ev(2, "COUNTER", "service_attributes_set", 2.0, Count="1", Writer="a"),
        ev(3, "MUTEX", "service_removed", 15.0, **{"Mutex Owner": "a"}),  # broken after a's lease
        ev(4, "MUTEX", "service_added", 16.0, **{"Mutex Owner": "b"}),
        ev(5, "COUNTER", "service_attributes_set", 17.0, Count="2", Writer="b"),
        ev(6, "COUNTER", "service_attributes_set", 18.0, Count="2", Writer="a"),  # a, resumed
        ev(7, "MUTEX", "service_removed", 19.0, **{"Mutex Owner": "b"}),
    ]
    past = audit(log, {"a": 12.0})
    assert past["past_lease_writes"] == 1 and past["overlaps"] == 0 and past["lost_updates"] == 0
    early = audit(log, {"a": 30.0})
    assert early["past_lease_writes"] == 0 and early["overlaps"] == 1 and early["lost_updates"] == 1


def test_journals_end_a_killed_hold_at_the_kill_and_a_leased_hold_at_its_lease_safe_point(tmp_path):
    killed = tmp_path / "ours-0-0.jsonl"
    killed.write_text(
        '{"t": "acq", "client": "ours-0", "token": "k", "ai": 1.0, "ac": 2.0, "safe": 12.0}\n{"t": "sa'
    )  # the kill cut the last line short
    releasing = tmp_path / "ours-2-0.jsonl"
    releasing.write_text(
        '{"t": "acq", "client": "ours-2", "token": "r", "ai": 1.0, "ac": 2.0, "safe": 12.0}\n'
        '{"t": "releasing", "token": "r", "ri": 3.0}\n'
    )  # killed inside release(): its remove may land after the kill, and that is no cut hold
    paused = tmp_path / "ours-1-0.jsonl"
    paused.write_text(
        '{"t": "acq", "client": "ours-1", "token": "p", "ai": 1.0, "ac": 2.0, "safe": 12.0}\n'
        '{"t": "rel", "token": "p", "ri": 40.0, "rc": 41.0, "outcome": "MutexLostError"}\n'
        '{"t": "end", "error": null, "unsettled": 0, "calls": 9}\n'
    )
    incarnations = [
        Incarnation(0, "ours", 0, None, killed, killed_at=5.0),
        Incarnation(1, "ours", 0, None, paused, pauses=[(3.0, 39.0)]),
        Incarnation(2, "ours", 0, None, releasing, killed_at=4.0),
    ]
    found = read_journals(incarnations)
    holds = {h.token: h for h in found["holds"]}
    assert holds["k"].release_invoked == 5.0 and holds["k"].release_outcome == "killed"
    assert holds["r"].release_invoked == 3.0  # believed until its release call, not until the kill
    assert holds["p"].release_invoked == 12.0  # believed only up to its lease-safe point
    assert found["ends"] == [{"t": "end", "error": None, "unsettled": 0, "calls": 9, "client": "ours-1#0"}]


A_LEASED = {"Mutex Owner": "a", "Mutex Lease Seconds": "10"}


def test_a_released_acquisitions_leftover_that_only_a_breaker_removed_is_a_leak():
    breaker = {"Mutex Owner": "w"}
    log = [
        ev(1, "MUTEX", "service_added", 1.0, **A_LEASED),
        ev(2, "MUTEX", "service_removed", 2.0, **A_LEASED),  # a's release
        ev(3, "MUTEX", "service_added", 3.0, **A_LEASED),  # a's add, landing late
        ev(4, "MUTEX~break", "service_added", 20.0, **breaker),
        ev(5, "MUTEX", "service_removed", 21.0, **A_LEASED),
        ev(6, "MUTEX~break", "service_removed", 22.0, **breaker),
    ]
    holds = [Hold("A", "a", 0.5, 1.5, 1.8, 2.1)]
    assert broken_grants(log, holds, set())["of_live_workers"] == 1
    assert broken_grants(log, holds, {"a"})["of_live_workers"] == 0  # a's process was killed or paused
    assert broken_grants(log, holds, set())["total"] == 1


def test_a_late_add_its_own_watcher_removed_under_a_leftover_breaker_is_not_counted_as_broken():
    """The sixth full run: a breaker alias left behind for minutes, and meanwhile a late add of a released
    acquisition, removed by its own watcher one second after it landed. No waiter breaks a service younger
    than its lease, so that remove is not a break; a service without a lease is never broken at all."""
    breaker = {"Mutex Owner": "w"}
    log = [
        ev(1, "MUTEX~break", "service_added", 0.5, **breaker),  # left behind
        ev(2, "MUTEX", "service_added", 1.0, **A_LEASED),
        ev(3, "MUTEX", "service_removed", 2.0, **A_LEASED),  # a's release
        ev(4, "MUTEX", "service_added", 3.0, **A_LEASED),  # a's add, landing late
        ev(5, "MUTEX", "service_removed", 4.0, **A_LEASED),  # its watcher removes it
        ev(6, "MUTEX", "service_added", 5.0, **{"Mutex Owner": "b"}),  # no lease
        ev(7, "MUTEX", "service_removed", 60.0, **{"Mutex Owner": "b"}),
    ]
    holds = [Hold("A", "a", 0.5, 1.5, 1.8, 2.1), Hold("B", "b", 4.5, 5.5, 59.0, 60.5)]
    assert broken_grants(log, holds, set()) == {"total": 0, "of_live_workers": 0, "tokens": []}


def test_a_late_add_its_own_watcher_removed_after_a_hung_read_is_not_counted_as_broken():
    """A short stress run on CI: a's add was re-sent by the client, and a copy landed after a's release. Its
    late-add watcher's read hung 6 s under a fault, so its remove came after the lease (3 s), while a waiter
    was breaking the same service. The process's journal shows the watcher's own remove: not a break, not a
    leak. Without that journal entry it is one (a lock its process left behind)."""
    leased = {"Mutex Owner": "a", "Mutex Lease Seconds": "3"}
    log = [
        ev(1, "MUTEX", "service_added", 1.0, **leased),
        ev(2, "MUTEX", "service_removed", 2.0, **leased),  # a's release
        ev(3, "MUTEX", "service_added", 2.1, **leased),  # a's re-sent add, landing late
        ev(4, "MUTEX~break", "service_added", 5.8, **{"Mutex Owner": "w"}),  # a waiter judges it stale
        ev(5, "MUTEX", "service_removed", 6.3, **leased),  # a's watcher, after its hung read
    ]
    holds = [Hold("A", "a", 0.5, 1.5, 1.8, 2.1)]
    clean = {"total": 0, "of_live_workers": 0, "tokens": []}
    assert broken_grants(log, holds, set(), {"a": [(6.2, 6.4)]}) == clean
    assert broken_grants(log, holds, set(), {"a": [(1.9, 2.0)]})["of_live_workers"] == 1  # another remove
    assert broken_grants(log, holds, set())["of_live_workers"] == 1


@pytest.mark.client_timeout
def test_short_stress_under_every_fault_with_kills_pauses_and_the_original_protocol_beside(
    cloudshell_emulator_factory,
):
    """8 processes (6 lock, one original v1, one v2) x 10 acquisitions, faults at twice the full run's rate;
    two lock processes killed (SIGKILL, one of them while holding when it can be caught) and restarted, two
    stopped (SIGSTOP) for up to 6 s, longer than their 3 s lease."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    chaos = Chaos(kills=2, pauses=2, gap=(0.3, 1.5), pause=(0.5, 6.0), seed=5)
    result = run(emu, ["ours"] * 6 + ["v1", "v2"], 10, 20261123, 2.0, chaos, lifetime=10, lease=3)
    print(f"\nshort stress: {result}")
    assert sum(result["faults"].values()) >= 10  # faults did happen
    # A kill first, then a pause, in turns (the run may end before the fourth).
    assert result["kills"]["total"] >= 1 and result["pauses"]["total"] >= 1
    assert result["errors"] == []
    assert clean(result), result


def test_the_checkers_catch_a_broken_lock(cloudshell_emulator_factory):
    """Negative control: clients that do not lock at all, beside ones that do."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    result = run(emu, ["ours", "unlocked", "unlocked"], rounds=4, seed=7, scale=0.0)
    assert not clean(result)
    assert result["history"]["fail_opens"] == 8 and result["history"]["overlaps"] > 0
