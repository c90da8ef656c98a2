"""The default lock's verdicts (bench/verdicts.py) on hand-made results: met, missed or not judged."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import pytest

from cloudshell_mutex.bench.metrics import (
    CALLS_PER_SECTION,
    HELD_CALLS_PER_SECOND,
    HELD_CALLS_PER_SECOND_MAX,
    MAKESPAN,
    RELEASE_GAP,
    RELEASE_GAP_OPEN,
    UNFINISHED,
    WORK,
    Distribution,
    RunMetrics,
)
from cloudshell_mutex.bench.plans import (
    LONG_HOLD,
    MIXED,
    REACQUIRE,
    READERS,
    SETUP_BURST_A,
    SETUP_BURST_B,
    STRESS,
    THINK,
    Cell,
)
from cloudshell_mutex.bench.runner import RunResult
from cloudshell_mutex.bench.summary import number, summarise
from cloudshell_mutex.bench.verdicts import (
    MET,
    MIN_GRANTS,
    MISSED,
    NOT_JUDGED,
    TARGETS,
    Repeat,
    Row,
    combine,
    verdict_rows,
    verdicts,
)

N2_THINK = Cell(2, 1.0, THINK, 30.0)
N8 = Cell(8, 1.0, REACQUIRE, 30.0)
N32 = Cell(32, 1.0, REACQUIRE, 40.0)


def waits(p99: float, count: int = 20, open_count: int = 0) -> Distribution:
    return Distribution(count=count, p50=p99 / 4, p99=p99, max=p99, open=open_count)


def metrics(
    per_client: Sequence[int],
    window: float = 30.0,
    calls: float = 5.0,
    calls_per_second: float = 3.0,
    gap: Optional[Distribution] = None,
    wait: Optional[Distribution] = None,
    early: Optional[Distribution] = None,
    inverted: int = 0,
) -> RunMetrics:
    grants = sum(per_client)
    return RunMetrics(
        clients=len(per_client),
        window_seconds=window,
        grants=grants,
        acquisitions_per_minute=grants * 60.0 / window,
        wait=wait or waits(5.0),
        handoff_gap=gap or Distribution(count=20, p50=0.1, p99=0.3, max=0.4),
        calls_per_acquisition={"AddServiceToReservation": calls},
        calls_per_second=calls_per_second,
        grants_per_client=tuple(per_client),
        fifo_inversions=inverted,
        inverted_grants=inverted,
        early_wait=early or waits(5.0),
    )


def run(cell: Cell, contender: str, repeat: int, m: RunMetrics) -> RunResult:
    return RunResult(cell, contender, repeat, m, ran_without_lock=0)


def rows(results: List[RunResult], start: str) -> Dict[str, Row]:
    """The verdict rows of the target whose text starts with ``start``, by configuration."""
    found = {row.cell: row for row in verdicts(summarise(results)) if row.target.startswith(start)}
    assert found, f"no target starts with {start!r}"
    return found


def only(results: List[RunResult], start: str) -> Row:
    (row,) = rows(results, start).values()
    return row


def throughput_runs(cell: Cell, ours: Sequence[int], base: Sequence[int]) -> List[RunResult]:
    """Runs whose grants are split evenly over the clients: ours and the baseline's, repeat by repeat."""
    results = []
    for repeat, (a, b) in enumerate(zip(ours, base)):
        results.append(run(cell, "original-v1", repeat, metrics([b // cell.clients] * cell.clients)))
        results.append(run(cell, "default", repeat, metrics([a // cell.clients] * cell.clients)))
    return results


@pytest.mark.parametrize(
    ("oks", "guarantee", "expected"),
    [
        ((True, True), False, (MET, "")),
        ((False, False), False, (MISSED, "")),
        ((True, False), False, (NOT_JUDGED, "the repeats straddle the threshold")),
        ((True, False), True, (MISSED, "")),  # a guarantee is broken by one run
        ((True, None), False, (NOT_JUDGED, "too few")),
        ((False, None), True, (MISSED, "")),
        ((), False, (NOT_JUDGED, "no run")),
    ],
)
def test_repeats_combine_into_one_verdict(oks, guarantee, expected) -> None:
    repeats = [Repeat(1.0, ok, "too few" if ok is None else "") for ok in oks]
    assert combine(repeats, guarantee) == expected


def test_a_throughput_ratio_is_taken_against_the_original_of_the_same_repeat() -> None:
    # Repeat 0: 80 / 60, repeat 1: 96 / 80: each ratio 1.33 and 1.2, although 96 / 60 would be 1.6.
    row = only(throughput_runs(N2_THINK, ours=[80, 96], base=[60, 80]), "N=2 with think time")
    assert row.cell == "N=2 hold 1 s think"
    assert row.measured == "1.27x (1.20-1.33)"
    assert row.verdict == NOT_JUDGED and row.why == "the repeats straddle the threshold"  # 1.3x
    assert only(throughput_runs(N2_THINK, [80, 84], [60, 60]), "N=2 with think").verdict == MET
    assert only(throughput_runs(N2_THINK, [60, 70], [60, 60]), "N=2 with think").verdict == MISSED
    both = rows(throughput_runs(N2_THINK, [60, 70], [60, 60]), "throughput >= 0.97")
    assert both["N=2 hold 1 s think"].verdict == MET


def test_a_window_with_too_few_grants_judges_nothing() -> None:
    few = MIN_GRANTS - 1
    row = only(throughput_runs(N2_THINK, ours=[60, 60], base=[few - 1, few - 1]), "N=2 with think time")
    assert (row.verdict, row.why) == (NOT_JUDGED, f"fewer than {MIN_GRANTS} grants in a run")
    assert row.measured != "-"  # the figure is still shown


def test_a_target_without_its_configuration_says_so() -> None:
    row = only(throughput_runs(N2_THINK, [80, 84], [60, 60]), "hold 0.1 s: throughput")
    assert (row.cell, row.verdict, row.why) == ("-", NOT_JUDGED, "not in the plans run")
    # Every target has a row, whatever ran.
    assert {r.target for r in verdicts({})} == {t.text for t in TARGETS}


def test_starvation_is_missed_by_one_starving_run_and_not_judged_on_too_few_grants() -> None:
    even = run(N8, "default", 0, metrics([4] * 8))
    starved = run(N8, "default", 1, metrics([6, 6, 6, 6, 6, 6, 3, 1]))  # 1 < 0.5 x 40 / 8
    assert only([even], "no starvation: min").verdict == MET
    row = only([even, starved], "no starvation: min")
    assert row.verdict == MISSED and row.measured == "0.60 (0.20-1.00)"
    few = run(N8, "default", 0, metrics([3, 3, 3, 3, 2, 2, 2, 2]))  # 20 grants: 2.5 a client
    assert only([few], "no starvation: min").why == "fewer than 3 grants per client"


@pytest.mark.parametrize(
    ("window", "fewest", "expected"),
    [
        (40.0, 1, MET),  # a grant in 40 s: more than one a minute
        (40.0, 0, NOT_JUDGED),  # no grant yet, but the window is shorter than a minute
        (60.0, 0, MISSED),  # a whole minute without a grant
        (120.0, 1, MISSED),  # one grant in two minutes
    ],
)
def test_at_n32_every_client_gets_a_grant_a_minute(window, fewest, expected) -> None:
    cell = dataclasses.replace(N32, window=window)
    m = metrics([fewest] + [2] * 31, window=window)
    assert only([run(cell, "default", 0, m)], "no starvation at N=32").verdict == expected


@pytest.mark.parametrize(
    ("ours_open", "base_open", "ours_p99", "expected"),
    [
        (0, 0, 5.0, MET),  # 0.5x, nothing open
        (2, 0, 5.0, NOT_JUDGED),  # ours is a lower bound under the limit: it could be worse
        (2, 0, 8.0, MISSED),  # ours is a lower bound and already over the limit
        (0, 2, 5.0, MET),  # the original's is a lower bound: the true ratio is even smaller
        (0, 2, 8.0, NOT_JUDGED),  # over the limit against a lower bound: it could still pass
        (2, 2, 9.0, NOT_JUDGED),  # both open: a ratio of lower bounds says nothing
    ],
)
def test_p99_waits_of_the_first_half_decide_only_one_way_when_some_are_open(
    ours_open, base_open, ours_p99, expected
) -> None:
    results = [
        run(N8, "original-v1", 0, metrics([4] * 8, early=waits(10.0, open_count=base_open))),
        run(N8, "default", 0, metrics([4] * 8, early=waits(ours_p99, open_count=ours_open))),
    ]
    row = only(results, "N >= 8: p99 wait")
    assert row.verdict == expected
    assert (row.why != "") == (expected == NOT_JUDGED)


def test_the_p99_is_that_of_the_early_waits_not_of_every_wait() -> None:
    # Every wait (cut short by the window's end) shows 1.0x; the waits of the first half show 0.25x.
    base = metrics([4] * 8, wait=waits(12.0, open_count=5), early=waits(20.0, open_count=0))
    ours = metrics([4] * 8, wait=waits(12.0, open_count=5), early=waits(5.0))
    row = only([run(N8, "original-v1", 0, base), run(N8, "default", 0, ours)], "N >= 8: p99 wait")
    assert (row.measured, row.verdict) == ("0.25x", MET)
    too_few = metrics([4] * 8, early=waits(5.0, count=3))
    row = only([run(N8, "original-v1", 0, base), run(N8, "default", 0, too_few)], "N >= 8: p99 wait")
    assert row.verdict == NOT_JUDGED and "first half" in row.why


def test_calls_fifo_and_hand_off_gap_have_absolute_limits() -> None:
    n32 = [run(N32, "default", r, metrics([1] * 32, window=40.0, calls=c)) for r, c in ((0, 9.5), (1, 10.5))]
    assert only(n32, "server calls per acquisition <= 10").verdict == NOT_JUDGED  # straddles
    n8 = [run(N8, "default", 0, metrics([4] * 8, calls=7.0, inverted=4))]
    assert only(n8, "server calls per acquisition <= 8").verdict == MET
    assert only(n8, "FIFO inversions").measured == "12 %"
    assert only(n8, "FIFO inversions").verdict == MISSED  # 4 of 32 grants
    slow = Distribution(count=20, p50=0.3, p99=0.5, max=0.6)
    assert only([run(N8, "default", 0, metrics([4] * 8, gap=slow))], "hand-off gap").verdict == MISSED
    few = Distribution(count=5, p50=0.1, p99=0.2, max=0.2)
    assert only([run(N8, "default", 0, metrics([4] * 8, gap=few))], "hand-off gap").why.startswith("fewer")
    cut = Distribution(count=10, p50=0.1, p99=9.0, max=9.0, open=6)  # more than half cut by the window
    row = only([run(N8, "default", 0, metrics([4] * 8, gap=cut))], "hand-off gap")
    assert row.verdict == NOT_JUDGED and "open" in row.why


def test_the_call_rate_at_hold_10_s_needs_a_window_of_several_hand_offs() -> None:
    cell = Cell(32, 10.0, REACQUIRE, 60.0)
    six = [1] * 6 + [0] * 26  # six grants in 60 s, one each 10 s

    def row(per_client, rate):
        return only(
            [run(cell, "default", 0, metrics(per_client, window=60.0, calls_per_second=rate))], "hold 10 s"
        )

    assert row(six, 3.5).verdict == MET
    assert (row(six, 4.5).measured, row(six, 4.5).verdict) == ("4.50/s", MISSED)
    arrival = row([1, 1] + [0] * 30, 6.0)  # two grants: the figure is mostly the clients' arrival
    assert (arrival.verdict, arrival.why) == (NOT_JUDGED, "fewer than 5 grants in a run")


@pytest.mark.parametrize(
    ("per_client", "expected"),
    [
        ([24, 10, 9, 9], MET),  # 9 >= 24 / 3
        ([30, 12, 11, 9], MISSED),  # 9 < 30 / 3
        ([6, 2, 2, 2], NOT_JUDGED),  # 12 grants: too few for a verdict
    ],
)
def test_mixed_parties_give_every_pausing_client_a_third_of_the_loopers_grants(per_client, expected):
    cell = Cell(4, 1.0, MIXED, 60.0)
    assert (
        only([run(cell, "default", 0, metrics(per_client, window=60.0))], "mixed parties").verdict == expected
    )


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        (Distribution(count=6, p50=0.4, p99=1.5, max=1.6, open=1), MET),  # 5 ended, none over 2 s
        (Distribution(count=1, p50=14.0, p99=14.0, max=14.0, open=1), MISSED),  # starved: still waiting
        (Distribution(count=3, p50=0.4, p99=1.0, max=1.0, open=1), NOT_JUDGED),  # only 2 ended
    ],
)
def test_the_readers_stream_lets_the_lock_in_within_twice_the_read_time(wait, expected) -> None:
    cell = Cell(4, 1.0, READERS, 15.0)
    m = metrics([wait.count - wait.open], window=15.0, wait=wait)
    row = only([run(cell, "default", 0, m)], "readers stream")
    assert row.verdict == expected
    assert row.measured == f"{number(wait.max)} s longest wait (wait p50 {number(wait.p50)} s)"


@pytest.mark.parametrize(
    ("calls", "grants", "expected"),
    [(3.0, 20, MET), (3.1, 20, MET), (4.0, 20, MISSED), (3.0, 5, NOT_JUDGED)],  # slack: 3 / 20 per cycle
)
def test_the_uncontended_cycle_costs_three_calls(calls, grants, expected) -> None:
    cell = Cell(1, 0.1, REACQUIRE, 6.0)
    m = metrics([grants], window=6.0, calls=calls)
    assert only([run(cell, "default", 0, m)], "uncontended").verdict == expected


def test_only_the_default_contender_is_judged_and_the_table_marks_verdicts() -> None:
    results = [run(N8, "plain", 0, metrics([29, 1, 0, 0, 0, 0, 1, 1]))]  # plain polling starves
    assert only(results, "no starvation: min").why == "not in the plans run"
    table = verdict_rows(verdicts(summarise([run(N8, "default", 0, metrics([4] * 8))])))
    assert table[0] == "| target | configuration | measured | verdict | not judged because |"
    starvation = "| no starvation: min grants per client >= 0.5 x the mean | N=8 hold 1 s re-acquire |"
    assert f"{starvation} 1.00 | **met** |  |" in table
    assert (
        "| hold 0.1 s: throughput >= 0.9 x the original | - | - | not judged | not in the plans run |"
        in table
    )


BURST_A = Cell(8, 0.5, SETUP_BURST_A, 180.0)
BURST_B = Cell(16, 0.3, SETUP_BURST_B, 180.0)
HOLD = Cell(4, 60.0, LONG_HOLD, 120.0)


def burst(span: float, calls: float = 6.0, undone: int = 0, sections: int = 24) -> RunMetrics:
    """A burst run: its makespan, calls per section and sections left undone at the cap."""
    figures = {MAKESPAN: span, WORK: 14.0, CALLS_PER_SECTION: calls, UNFINISHED: float(undone)}
    grants = sections - undone
    return dataclasses.replace(metrics([grants // 8] * 8, window=span), figures=figures)


def burst_runs(cell: Cell, **spans: Sequence[float]) -> List[RunResult]:
    """Runs of each contender (``original_v1``, ``default``, ``plain``) with these makespans, repeat by
    repeat, in the plan's interleaved order."""
    results = []
    for repeat in range(len(next(iter(spans.values())))):
        for name, values in spans.items():
            results.append(run(cell, name.replace("_", "-"), repeat, burst(values[repeat])))
    return results


def test_a_bursts_makespan_is_judged_against_plain_pollings_of_the_same_repeat() -> None:
    # Repeat by repeat (the same work): 20 / 20 and 21 / 20.5 are within 1.05; 21 / 19 (1.11) is not, although
    # the medians (20.5 / 20) would be.
    met = burst_runs(BURST_A, default=[20.0, 21.0, 20.5], plain=[20.0, 20.5, 20.0])
    row = only(met, "setup burst: makespan")
    assert (row.cell, row.verdict) == ("N=8 hold 0.5 s setup burst A", MET)
    assert row.measured.startswith("1.02x (1.00-1.02) (makespan 20.5 s (20.0-21.0)")
    straddles = burst_runs(BURST_A, default=[20.0, 21.0, 20.5], plain=[20.0, 19.0, 20.0])
    assert only(straddles, "setup burst: makespan").why == "the repeats straddle the threshold"
    missed = burst_runs(BURST_B, default=[25.0, 24.0, 26.0], plain=[17.0, 18.0, 17.5])
    assert only(missed, "setup burst: makespan").verdict == MISSED


def test_a_burst_must_be_done_1_4_times_faster_than_by_the_original() -> None:
    results = burst_runs(BURST_A, original_v1=[31.0, 33.0, 30.0], default=[20.0, 21.0, 20.0])
    row = only(results, "setup burst: >= 1.4 x faster")
    assert (row.measured, row.verdict) == ("1.55x (1.50-1.57)", MET)
    slow = burst_runs(BURST_A, original_v1=[26.0, 27.0, 26.0], default=[25.0, 24.0, 26.0])
    assert only(slow, "setup burst: >= 1.4 x faster").verdict == MISSED


def test_an_undone_bursts_makespan_is_a_lower_bound_and_decides_one_way() -> None:
    # The original left sections undone at the cap: its makespan is at least this, so a speed-up over the
    # limit stands, and one under it tells nothing.
    undone = [run(BURST_A, "original-v1", 0, burst(180.0, undone=3)), run(BURST_A, "default", 0, burst(20.0))]
    assert only(undone, "setup burst: >= 1.4 x faster").verdict == MET
    close = [run(BURST_A, "original-v1", 0, burst(25.0, undone=3)), run(BURST_A, "default", 0, burst(20.0))]
    assert only(close, "setup burst: >= 1.4 x faster").why == "a burst left undone at its cap"
    # Our own undone burst: a ratio over the limit against plain polling is a miss all the same.
    ours = [run(BURST_A, "default", 0, burst(180.0, undone=1)), run(BURST_A, "plain", 0, burst(20.0))]
    assert only(ours, "setup burst: makespan").verdict == MISSED


def test_a_burst_costs_at_most_eight_calls_per_section() -> None:
    assert (
        only([run(BURST_B, "default", 0, burst(20.0, calls=7.5))], "setup burst: server calls").verdict == MET
    )
    row = only([run(BURST_B, "default", 0, burst(20.0, calls=12.2))], "setup burst: server calls")
    assert (row.measured, row.verdict) == ("12.2", MISSED)
    tiny = only([run(BURST_B, "default", 0, burst(2.0, calls=4.0, sections=4))], "setup burst: server calls")
    assert (tiny.verdict, tiny.why) == (NOT_JUDGED, f"fewer than {MIN_GRANTS} grants in a run")


def held(rate: float, gap: float, busiest: float = 0.0, gap_open: bool = False) -> RunMetrics:
    """A long hold's run: the waiters' calls/s while held, the busiest waiter's, the gap after the release."""
    figures = {
        HELD_CALLS_PER_SECOND: rate,
        HELD_CALLS_PER_SECOND_MAX: busiest or rate / 3,
        RELEASE_GAP: gap,
        RELEASE_GAP_OPEN: float(gap_open),
    }
    return dataclasses.replace(metrics([1, 1, 1, 1], window=62.0), figures=figures)


def test_the_long_holds_waiters_call_rarely_and_take_the_lock_soon_after_the_release() -> None:
    results = [
        run(HOLD, "default", 0, held(0.9, 0.2, busiest=0.4)),
        run(HOLD, "default", 1, held(1.1, 0.4, busiest=0.3)),
    ]
    rate = only(results, "long hold: the waiters' server calls/s")
    assert (rate.cell, rate.verdict) == ("N=4 hold 60 s long hold", MET)
    assert rate.measured == "1.00/s (0.90-1.10) (the busiest waiter 0.35/s (0.30-0.40))"
    assert only(results, "long hold: from the job's release").verdict == MET
    # Only the default lock is judged: plain polling's figures are shown in its table, not here.
    busy = [run(HOLD, "default", 0, held(2.5, 1.5)), run(HOLD, "plain", 0, held(0.5, 0.1))]
    assert only(busy, "long hold: the waiters' server calls/s").verdict == MISSED
    assert only(busy, "long hold: from the job's release").verdict == MISSED
    # No waiter granted before the run's end: the gap is a lower bound, a miss only over the limit.
    assert only([run(HOLD, "default", 0, held(1.0, 3.0, gap_open=True))], "long hold: from").verdict == MISSED
    row = only([run(HOLD, "default", 0, held(1.0, 0.5, gap_open=True))], "long hold: from")
    assert row.why == "no grant after the release before the run's end"
    # A hold of a few seconds (the smoke plan's) judges the waiters' first, fast polls: not judged.
    short = Cell(2, 2.0, LONG_HOLD, 20.0)
    for target in ("long hold: the waiters'", "long hold: from"):
        row = only([run(short, "default", 0, held(4.0, 2.0))], target)
        assert (row.verdict, row.why) == (NOT_JUDGED, "a hold shorter than 30 s")


def test_the_stress_cells_throughput_is_judged_against_plain_polling() -> None:
    cell = Cell(32, 0.1, STRESS, 60.0)
    results = [
        run(cell, "plain", 0, metrics([10] * 32, window=60.0)),
        run(cell, "default", 0, metrics([9] * 32, window=60.0)),
    ]
    row = only(results, "stress: grants per minute")
    assert (row.measured, row.verdict) == ("0.90x (288/min)", MET)
    results[1] = run(cell, "default", 0, metrics([8] * 32, window=60.0))
    assert only(results, "stress: grants per minute").verdict == MISSED
    # No other target takes the sites' cells for its own.
    site = [
        *results,
        *burst_runs(BURST_A, default=[20.0], plain=[20.0]),
        run(HOLD, "default", 0, held(1, 0.1)),
    ]
    judged = {row.target for row in verdicts(summarise(site)) if row.cell != "-"}
    assert all(t.startswith(("setup burst", "long hold", "stress")) for t in judged)
