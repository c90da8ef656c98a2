"""The benchmark's figures, computed from synthetic event logs whose answers are known by hand."""

from __future__ import annotations

import math
from typing import Any, Dict, List

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
    Attempt,
    BenchDataError,
    Distribution,
    Window,
    burst_figures,
    held_calls_per_second_of,
    last_release,
    long_hold_figures,
    percentile,
    run_metrics,
)

USERS = {"bench-0": 0, "bench-1": 1, "bench-2": 2}


class Log:
    """A synthetic event log of the emulator's shape (only the fields the metrics read, plus seq)."""

    def __init__(self) -> None:
        self.events: List[Dict[str, Any]] = []

    def add(self, at: float, client: int, alias: str = "MUTEX") -> Log:
        return self._event("service_added", at, client, alias)

    def remove(self, at: float, client: int, alias: str = "MUTEX") -> Log:
        return self._event("service_removed", at, client, alias)

    def _event(self, op: str, at: float, client: int, alias: str) -> Log:
        self.events.append(
            {
                "seq": len(self.events) + 1,
                "monotonic": at,
                "op": op,
                "alias": alias,
                "user": f"bench-{client}",
            }
        )
        return self


def metrics(log: Log, attempts: List[Attempt], end: float = 10.0, counts=None, users=USERS):
    return run_metrics(log.events, attempts, users, Window(0.0, end), counts or {})


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0], 101)


def test_wait_runs_from_the_clients_start_to_the_servers_grant() -> None:
    # Client 0 asks at 0 and gets it at 0.1; client 1 asks at 0.05 and gets it at 1.2, after 0's release.
    log = Log().add(0.1, 0).remove(1.1, 0).add(1.2, 1).remove(2.2, 1)
    m = metrics(log, [Attempt(0, 0.0), Attempt(1, 0.05)], users={"bench-0": 0, "bench-1": 1})
    assert m.grants == 2
    assert m.wait == Distribution(
        count=2, p50=pytest.approx(0.625), p99=pytest.approx(1.1395), max=pytest.approx(1.15)
    )
    assert m.wait.open == 0
    assert m.acquisitions_per_minute == pytest.approx(12.0)  # 2 grants in 10 s


def test_a_client_k_th_grant_answers_its_k_th_attempt() -> None:
    log = Log().add(1.0, 0).remove(1.5, 0).add(3.0, 0).remove(3.5, 0)
    m = metrics(log, [Attempt(0, 2.0), Attempt(0, 0.5)], users={"bench-0": 0})  # reported out of order
    # Waits 0.5 s (0.5 -> 1.0) and 1.0 s (2.0 -> 3.0): the median of the two is 0.75.
    assert (m.wait.count, m.wait.p50, m.wait.max) == (2, pytest.approx(0.75), pytest.approx(1.0))


def test_a_wait_still_open_at_the_window_end_counts_as_a_lower_bound() -> None:
    log = Log().add(0.1, 0)  # client 0 holds it for the whole window; client 1 never gets it
    m = metrics(log, [Attempt(0, 0.0), Attempt(1, 2.0)], end=10.0, users={"bench-0": 0, "bench-1": 1})
    assert m.wait.open == 1
    assert m.wait.max == pytest.approx(8.0)
    assert m.grants_per_client == (1, 0)


def test_grants_and_attempts_outside_the_window_are_not_counted() -> None:
    log = Log().add(0.5, 0).remove(1.0, 0).add(10.5, 1)  # the second grant lands after the window (10 s)
    m = metrics(log, [Attempt(0, 0.2), Attempt(1, 9.0)], users={"bench-0": 0, "bench-1": 1})
    assert m.grants == 1
    assert m.grants_per_client == (1, 0)
    assert m.wait.open == 1  # client 1's wait is open at 10 s


def test_other_aliases_in_the_log_are_ignored() -> None:
    log = Log().add(0.5, 0, alias="COUNTER").add(1.0, 0).remove(2.0, 0).remove(3.0, 0, alias="COUNTER")
    m = metrics(log, [Attempt(0, 0.0)], users={"bench-0": 0})
    assert m.grants == 1
    assert m.handoff_gap.count == 0


def test_handoff_gap_is_measured_only_when_someone_waits() -> None:
    log = (
        Log()
        .add(0.1, 0)
        .remove(1.0, 0)  # client 1 waits since 0.5: gap to its grant at 1.3 is 0.3
        .add(1.3, 1)
        .remove(2.0, 1)  # nobody waits: no gap
        .add(5.0, 2)
        .remove(6.0, 2)  # client 0 waits since 5.5 and is never granted: open gap to the end (10)
    )
    attempts = [Attempt(0, 0.0), Attempt(1, 0.5), Attempt(2, 4.9), Attempt(0, 5.5)]
    m = metrics(log, attempts)
    assert m.handoff_gap.count == 2
    assert m.handoff_gap.open == 1
    assert m.handoff_gap.p50 == pytest.approx((0.3 + 4.0) / 2)
    assert m.handoff_gap.max == pytest.approx(4.0)


def test_a_release_to_the_same_client_again_is_a_hand_off_too() -> None:
    # The lock's idle time while someone waits, whoever gets it next (here the releaser, again).
    log = Log().add(0.1, 0).remove(1.0, 0).add(1.05, 0)
    attempts = [Attempt(0, 0.0), Attempt(1, 0.5), Attempt(0, 1.02)]
    m = metrics(log, attempts, users={"bench-0": 0, "bench-1": 1})
    assert m.handoff_gap.count == 1
    assert m.handoff_gap.p50 == pytest.approx(0.05)


def test_fifo_inversions_count_later_waiters_granted_earlier() -> None:
    # Waiting order 0, 1, 2 (starts 0.0, 0.1, 0.2); grant order 0, 2, 1: client 2 overtook client 1.
    log = Log().add(0.05, 0).remove(1.0, 0).add(1.1, 2).remove(2.0, 2).add(2.1, 1)
    attempts = [Attempt(0, 0.0), Attempt(1, 0.1), Attempt(2, 0.2)]
    m = metrics(log, attempts)
    assert m.fifo_inversions == 1
    assert m.inverted_grants == 1


def test_fifo_order_has_no_inversions_and_an_open_waiter_counts_as_overtaken() -> None:
    in_order = Log().add(0.05, 0).remove(1.0, 0).add(1.1, 1).remove(2.0, 1).add(2.1, 2)
    attempts = [Attempt(0, 0.0), Attempt(1, 0.1), Attempt(2, 0.2)]
    assert metrics(in_order, attempts).fifo_inversions == 0
    # Client 1 waits from 0.1 and is never granted; clients 0 (again) and 2 are: two grants overtook it.
    starved = Log().add(0.05, 0).remove(1.0, 0).add(1.1, 2).remove(2.0, 2).add(2.1, 0)
    attempts = [Attempt(0, 0.0), Attempt(1, 0.1), Attempt(2, 0.2), Attempt(0, 1.05)]
    m = metrics(starved, attempts)
    assert (m.fifo_inversions, m.inverted_grants) == (2, 2)


def test_grants_per_client_and_fairness_include_clients_never_granted() -> None:
    log = Log().add(0.1, 0).remove(0.2, 0).add(0.3, 0).remove(0.4, 0).add(0.5, 1).remove(0.6, 1)
    attempts = [Attempt(0, 0.0), Attempt(0, 0.25), Attempt(1, 0.01), Attempt(2, 0.02)]
    m = metrics(log, attempts)
    assert m.grants_per_client == (2, 1, 0)
    assert (m.min_grants, m.max_grants) == (0, 2)
    assert m.fairness == 0.0


def test_calls_per_acquisition_by_method_and_calls_per_second_come_from_the_server_counts() -> None:
    log = Log().add(0.1, 0).remove(0.2, 0).add(0.3, 0).remove(0.4, 0)
    counts = {"AddServiceToReservation": 5, "GetReservationDetails": 3, "RemoveServicesFromReservation": 2}
    m = metrics(log, [Attempt(0, 0.0), Attempt(0, 0.25)], counts=counts, users={"bench-0": 0})
    assert m.calls_per_acquisition == {
        "AddServiceToReservation": 2.5,
        "GetReservationDetails": 1.5,
        "RemoveServicesFromReservation": 1.0,
    }
    assert m.calls_per_acquisition_total == 5.0
    assert m.calls_per_second == pytest.approx(1.0)


def test_no_grant_means_no_calls_per_acquisition_and_nan_figures() -> None:
    m = metrics(Log(), [Attempt(0, 1.0)], counts={"AddServiceToReservation": 4}, users={"bench-0": 0})
    assert m.grants == 0
    assert m.calls_per_acquisition == {}
    assert m.calls_per_second == pytest.approx(0.4)
    assert math.isnan(m.fairness)
    assert math.isnan(m.handoff_gap.p50)


def test_a_log_that_does_not_fit_the_clients_records_is_an_error() -> None:
    twice = Log().add(0.1, 0).remove(0.2, 0).add(0.3, 0)
    with pytest.raises(BenchDataError, match="granted 2 times but asked 1 times"):
        metrics(twice, [Attempt(0, 0.0)], users={"bench-0": 0})
    with pytest.raises(BenchDataError, match="never asked"):
        metrics(Log().add(0.1, 1), [Attempt(0, 0.0)], users={"bench-0": 0, "bench-1": 1})
    with pytest.raises(BenchDataError, match="not one of the run's clients"):
        metrics(Log().add(0.1, 7), [Attempt(0, 0.0)], users={"bench-0": 0})
    with pytest.raises(BenchDataError, match="before asking"):
        metrics(Log().add(0.1, 0), [Attempt(0, 0.5)], users={"bench-0": 0})
    with pytest.raises(BenchDataError, match=r"numbered 0\.\.1"):
        metrics(Log(), [], users={"bench-0": 0, "bench-1": 5})
    with pytest.raises(ValueError, match="end after it starts"):
        Window(2.0, 1.0)


def test_waiters_that_start_within_the_tie_are_simultaneous_for_fifo() -> None:
    from cloudshell_mutex.bench.metrics import Wait, fifo_inversions

    # Client 1 started 0.01 s after client 0 and was granted first: no order the server could keep ...
    waits = [Wait(0, 0.00, 2.0, 2.0), Wait(1, 0.01, 1.0, 0.99), Wait(2, 0.5, 0.8, 0.3)]
    assert fifo_inversions(waits, tie=0.1) == (2, 1)  # ... but client 2 (0.5 s later) overtook both
    assert fifo_inversions(waits) == (3, 2)


def test_the_early_waits_are_those_that_started_in_the_first_half_of_the_window() -> None:
    # Client 0 waits 1 s from 0.5; client 1 from 4.0 until the window's end (open: 6 s so far); client 2
    # starts at 7.0, in the second half: it is among all the waits, not among the early ones.
    log = Log().add(1.5, 0).remove(9.0, 0)
    m = metrics(log, [Attempt(0, 0.5), Attempt(1, 4.0), Attempt(2, 7.0)])
    assert (m.wait.count, m.wait.open) == (3, 2)
    assert (m.early_wait.count, m.early_wait.open) == (2, 1)
    assert m.early_wait.max == pytest.approx(6.0) and m.early_wait.p50 == pytest.approx(3.5)


def test_a_bursts_makespan_work_and_calls_per_section() -> None:
    log = Log().add(1.0, 0).remove(2.0, 0).add(2.1, 1).remove(3.5, 1).add(3.6, 0).remove(4.25, 0)
    assert last_release(log.events) == 4.25
    assert last_release(Log().add(1.0, 0).events) is None
    counts = {"AddServiceToReservation": 5, "GetReservationDetails": 4, "RemoveServicesFromReservation": 3}
    figures = burst_figures(first_start=0.25, end=4.25, sections=3, granted=3, work=2.9, call_counts=counts)
    assert figures == {MAKESPAN: 4.0, WORK: 2.9, CALLS_PER_SECTION: 4.0, UNFINISHED: 0.0}
    # Sections left undone at the cap: the makespan runs to the cap (a lower bound) and says how many.
    cut = burst_figures(first_start=0.25, end=30.0, sections=3, granted=1, work=2.9, call_counts=counts)
    assert cut[MAKESPAN] == 29.75 and cut[UNFINISHED] == 2.0 and cut[CALLS_PER_SECTION] == 12.0
    assert math.isnan(burst_figures(0.0, 1.0, 3, 0, 2.9, counts)[CALLS_PER_SECTION])


def test_the_long_holds_waiters_calls_while_held_and_the_gap_after_the_release() -> None:
    # The job (client 0) holds from 0.1 to 10.1; waiter 1 starts at 0.1 + 1 s, waiter 2 at 2.1 and is
    # granted 0.3 s after the release; waiter 1 after waiter 2.
    log = Log().add(0.1, 0).remove(10.1, 0).add(10.4, 2).remove(10.9, 2).add(11.0, 1).remove(11.5, 1)
    calls_1 = [1.1, 1.2, 3.0, 6.0, 9.0, 10.5, 10.9]  # 5 while held, over 9 s
    calls_2 = [2.1, 2.2, 5.0, 8.0, 10.2]  # 4 while held, over 8 s
    figures = long_hold_figures(log.events, "bench-0", [1.1, 2.1], [calls_1, calls_2], end=11.5)
    assert figures[held_calls_per_second_of(1)] == pytest.approx(5 / 9)
    assert figures[held_calls_per_second_of(2)] == pytest.approx(4 / 8)
    assert figures[HELD_CALLS_PER_SECOND] == pytest.approx(9 / 9)  # all 9 calls from the first start on
    assert figures[HELD_CALLS_PER_SECOND_MAX] == pytest.approx(5 / 9)
    assert figures[RELEASE_GAP] == pytest.approx(0.3) and figures[RELEASE_GAP_OPEN] == 0.0


def test_the_long_holds_gap_is_a_lower_bound_without_a_grant_and_nothing_without_a_release() -> None:
    log = Log().add(0.1, 0).remove(10.1, 0)
    open_gap = long_hold_figures(log.events, "bench-0", [1.0], [[1.0, 5.0]], end=12.0)
    assert open_gap[RELEASE_GAP] == pytest.approx(1.9) and open_gap[RELEASE_GAP_OPEN] == 1.0
    # A waiter whose session recorded no calls (a client without the request hook): not measured.
    unrecorded = long_hold_figures(log.events, "bench-0", [1.0], [[]], end=12.0)
    assert math.isnan(unrecorded[HELD_CALLS_PER_SECOND]) and math.isnan(
        unrecorded[held_calls_per_second_of(1)]
    )
    # Another client's remove is not the job's release; with none of the job's, there is nothing to measure.
    assert long_hold_figures(Log().add(0.1, 0).remove(5.0, 1).events, "bench-0", [1.0], [[2.0]], 9.0) == {}
