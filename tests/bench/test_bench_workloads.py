"""Mixed parties and the readers stream, end to end and tiny: spawned clients against the emulator, each in
its role (bench/plans.py ``role``), the figures of the lock under test only, and their verdict rows."""

from __future__ import annotations

import time
from typing import Dict, List

import pytest

from cloudshell_mutex.bench.contenders import contender
from cloudshell_mutex.bench.metrics import (
    CALLS_PER_SECTION,
    HELD_CALLS_PER_SECOND,
    MAKESPAN,
    RELEASE_GAP,
    UNFINISHED,
    WORK,
    held_calls_per_second_of,
)
from cloudshell_mutex.bench.plans import LONG_HOLD, MIXED, READERS, SETUP_BURST_B, Cell, Plan
from cloudshell_mutex.bench.runner import Bench, RunResult, recorded_counts
from cloudshell_mutex.bench.summary import summarise
from cloudshell_mutex.bench.verdicts import verdicts
from cloudshell_mutex.lock import protocol

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOLD = 0.4
MIXED_CELL = Cell(4, HOLD, MIXED, 4.0)
READERS_CELL = Cell(4, HOLD, READERS, 4.0)
#: The smoke-sized plan of both workloads.
TINY = Plan("tiny", ((MIXED_CELL, ("default",)), (READERS_CELL, ("default",))), repeats=1)


def most_at_once(events: List[Dict[str, object]], prefix: str) -> int:
    """The most aliases starting with ``prefix`` present at once, from the server's log."""
    present, most = 0, 0
    for event in sorted(events, key=lambda e: e["seq"]):  # type: ignore[arg-type,return-value]
        if str(event["alias"]).startswith(prefix):
            present += 1 if event["op"] == "service_added" else -1
            most = max(most, present)
    return most


def test_mixed_parties_and_the_readers_stream_run_each_client_in_its_role() -> None:
    results: List[RunResult] = []
    with Bench(TINY.max_clients, progress=lambda line: None) as bench:
        assert bench.emulator is not None
        mixed = bench.execute(MIXED_CELL, contender("default"), 0)
        results.append(RunResult(MIXED_CELL, "default", 0, bench.figures(MIXED_CELL, mixed), 0))
        readers = bench.execute(READERS_CELL, contender("default"), 0, seed=1)
        results.append(RunResult(READERS_CELL, "default", 0, bench.figures(READERS_CELL, readers), 0))
        events = bench.emulator.control.events(readers.spec.reservation_id)

    # Mixed parties: every client takes the lock under test; the pausing ones (1..3) wait one hold after
    # each hold before they ask again, the looper (0) does not wait.
    m = results[0].metrics
    assert m.clients == 4 and len(m.grants_per_client) == 4 and m.grants > 0
    for client in (1, 2, 3):
        report = mixed.reports[client]
        ends = [done for _, done, _, _ in report.holds]
        for end, start in zip(ends, report.starts[1:]):
            assert start - end >= HOLD
    assert mixed.reports[0].starts[0] < mixed.spec.start + HOLD  # the looper asks at once

    # Readers stream: three readers hold the read side together (their slots overlap), and only client 0,
    # which asks one hold into the window, counts: the group's adds of MUTEX are no grants of the lock.
    assert most_at_once(events, protocol.DEFAULT_ALIAS + protocol.READER_SLOT_SUFFIX) >= 2
    group_adds = [e for e in events if e["alias"] == protocol.DEFAULT_ALIAS and e["op"] == "service_added"]
    assert {e["user"] for e in group_adds} - {Bench.user(0)}  # readers added MUTEX for their group
    r = results[1].metrics
    assert r.clients == 1 and len(r.grants_per_client) == 1
    # Client 0's adds in the window (one granted as the window closed falls outside it, as in the metric).
    window = (readers.spec.start, readers.spec.end)
    in_window = [e for e in group_adds if window[0] <= e["monotonic"] <= window[1]]
    assert r.grants == sum(1 for e in in_window if e["user"] == Bench.user(0))
    assert r.wait.count == len(readers.reports[0].starts) >= 1
    assert readers.reports[0].starts[0] >= readers.spec.start + HOLD
    assert all(not report.error for report in readers.reports.values())

    # Both have their verdict rows (judged or not: these windows are far too short to decide).
    rows = {row.target.split(":")[0]: row for row in verdicts(summarise(results))}
    assert rows["mixed parties"].cell == "N=4 hold 0.4 s mixed parties"
    assert rows["readers stream"].cell == "N=4 hold 0.4 s readers stream"


def test_a_burst_and_a_long_hold_follow_their_schedules_and_count_every_call() -> None:
    burst, hold = Cell(3, 0.2, SETUP_BURST_B, 60.0), Cell(3, 2.0, LONG_HOLD, 30.0)
    with Bench(3, progress=lambda line: None) as bench:
        assert bench.emulator is not None
        ran = bench.execute(burst, contender("plain"), 0, seed=11)
        b = bench.figures(burst, ran)
        burst_events = bench.emulator.control.events(ran.spec.reservation_id)
        held = bench.execute(hold, contender("plain"), 0, seed=11)
        h = bench.figures(hold, held)
        hold_events = bench.emulator.control.events(held.spec.reservation_id)

    # The burst: each driver ran its schedule's sections, from its offset on; the run ended when they were
    # done, and its window is from the start to the last release.
    for client, report in ran.reports.items():
        mine = burst.schedule(client, 11)
        assert report.acquired == len(mine.holds) == len(report.starts)
        assert report.starts[0] >= ran.spec.start + mine.offset
    removes = [e["monotonic"] for e in burst_events if e["op"] == "service_removed" and e["alias"] == "MUTEX"]
    assert b.grants == 6 and b.figure(UNFINISHED) == 0 and b.window_seconds == max(removes) - ran.spec.start
    first = min(r.starts[0] for r in ran.reports.values())
    assert b.figure(MAKESPAN) == pytest.approx(max(removes) - first)
    assert b.figure(WORK) == pytest.approx(burst.work(11)) and b.figure(WORK) < b.figure(MAKESPAN)
    # The server's calls of the run are the drivers' own, every one of them: what each client recorded.
    assert ran.counts == recorded_counts(ran.reports.values())
    assert b.figure(CALLS_PER_SECTION) == pytest.approx(sum(ran.counts.values()) / 6)

    # The long hold: the job (client 0, the default lock even in plain polling's run) is granted first and
    # holds the hold; the waiters each take the lock once after its release.
    adds = [e for e in hold_events if e["alias"] == "MUTEX" and e["op"] == "service_added"]
    assert adds[0]["user"] == Bench.user(0) and {e["user"] for e in adds[1:]} == {
        Bench.user(1),
        Bench.user(2),
    }
    assert held.reports[0].holds[0][1] - held.reports[0].holds[0][0] >= 2.0
    assert all(held.reports[c].acquired == 1 for c in (1, 2))
    assert held.counts == recorded_counts(held.reports.values())
    for waiter in (1, 2):
        assert h.figure(held_calls_per_second_of(waiter)) > 0  # plain polling polls while the job holds
    assert h.figure(HELD_CALLS_PER_SECOND) > 0 and 0 < h.figure(RELEASE_GAP) < 2.0


def test_long_holds_together_each_have_their_reservation_clients_and_counts() -> None:
    hold = Cell(2, 2.0, LONG_HOLD, 20.0)
    runs = [
        (hold, contender("default"), 0, 5),
        (hold, contender("plain"), 0, 5),
        (hold, contender("default"), 1, 6),
    ]
    with Bench(6, progress=lambda line: None) as bench:
        assert bench.emulator is not None
        began = time.monotonic()
        executions = bench.execute_together(runs)
        took = time.monotonic() - began
        events = [bench.emulator.control.events(run.spec.reservation_id) for run in executions]
        figures = [bench.figures(hold, run) for run in executions]

    assert took < 2 * (hold.hold + 2.0)  # at once, not one after the other (each takes over 2 s)
    assert len({run.spec.reservation_id for run in executions}) == 3
    for index, (run, log, m) in enumerate(zip(executions, events, figures)):
        # Run k's clients are processes 2k and 2k + 1: its job and its waiter, on its own reservation.
        users = [e["user"] for e in log if e["alias"] == "MUTEX" and e["op"] == "service_added"]
        assert users == [Bench.user(2 * index), Bench.user(2 * index + 1)]
        assert sorted(run.reports) == [0, 1] and run.spec.first == 2 * index
        # Its calls are those its own clients recorded (the server's counts are of all three runs).
        assert run.counts == recorded_counts(run.reports.values())
        assert m.grants == 2 and 0 < m.figure(RELEASE_GAP) < hold.hold
