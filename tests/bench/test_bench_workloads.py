"""Mixed parties and the readers stream, end to end and tiny: spawned clients against the emulator, each in
its role (bench/plans.py ``role``), the figures of the lock under test only, and their verdict rows."""

from __future__ import annotations

from typing import Dict, List

import pytest

from cloudshell_mutex.bench.contenders import contender
from cloudshell_mutex.bench.plans import MIXED, READERS, Cell, Plan
from cloudshell_mutex.bench.runner import Bench, RunResult
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
