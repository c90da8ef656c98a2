"""The report on synthetic results: repeats summarised, ratios, the targets' verdicts, noise, plots."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Dict, Optional, Sequence

import pytest

from cloudshell_mutex.bench.metrics import Distribution, RunMetrics
from cloudshell_mutex.bench.plans import REACQUIRE, THINK, Cell, Plan
from cloudshell_mutex.bench.report import (
    MET,
    MISSED,
    NOT_MEASURED,
    fair_targets,
    noise,
    plot,
    ratio,
    render,
    summarise,
    targets,
    throughput,
    wait_p99,
)
from cloudshell_mutex.bench.results import load_results, save_results
from cloudshell_mutex.bench.runner import RunResult

N2_HOLD1 = Cell(2, 1.0, REACQUIRE, 10.0)
N8_HOLD1 = Cell(8, 1.0, THINK, 10.0)
N32_HOLD1 = Cell(32, 1.0, REACQUIRE, 10.0)
UNCONTENDED = Cell(1, 0.1, REACQUIRE, 10.0)


def figures(
    clients: int = 2,
    per_minute: float = 60.0,
    p99: float = 1.0,
    gap: float = 0.1,
    calls: Optional[Dict[str, float]] = None,
    calls_per_second: float = 2.0,
    per_client: Optional[Sequence[int]] = None,
    open_waits: int = 0,
) -> RunMetrics:
    per_client = tuple(per_client) if per_client is not None else (5,) * clients
    return RunMetrics(
        clients=clients,
        window_seconds=10.0,
        grants=sum(per_client),
        acquisitions_per_minute=per_minute,
        wait=Distribution(count=10, p50=p99 / 4, p99=p99, max=p99 * 1.1, open=open_waits),
        handoff_gap=Distribution(count=5, p50=gap, p99=gap * 2, max=gap * 3),
        calls_per_acquisition=calls if calls is not None else {"AddServiceToReservation": 2.0},
        calls_per_second=calls_per_second,
        grants_per_client=per_client,
        fifo_inversions=0,
        inverted_grants=0,
    )


def result(cell: Cell, contender: str, repeat: int = 0, **kwargs) -> RunResult:
    return RunResult(cell, contender, repeat, figures(clients=cell.clients, **kwargs), ran_without_lock=0)


def verdicts(results):
    return {v.target: v for v in targets(summarise(results))}


def find(found, start: str):
    (match,) = [v for target, v in found.items() if target.startswith(start)]
    return match


def test_ratios_are_taken_on_the_medians_of_the_repeats_against_original_v1() -> None:
    results = [
        result(N2_HOLD1, "original-v1", 0, per_minute=40.0, p99=4.0),
        result(N2_HOLD1, "original-v1", 1, per_minute=50.0, p99=6.0),
        result(N2_HOLD1, "original-v1", 2, per_minute=60.0, p99=5.0),
        result(N2_HOLD1, "default", 0, per_minute=100.0, p99=1.0),
        result(N2_HOLD1, "default", 1, per_minute=90.0, p99=2.0),
    ]
    summaries = summarise(results)
    assert summaries[(N2_HOLD1, "original-v1")].median(throughput) == 50.0
    assert ratio(summaries, N2_HOLD1, "default", throughput) == pytest.approx(95.0 / 50.0)
    assert ratio(summaries, N2_HOLD1, "default", wait_p99) == pytest.approx(1.5 / 5.0)
    assert math.isnan(ratio(summaries, N8_HOLD1, "default", throughput))  # no such cell


def test_n2_targets_are_met_or_missed_by_their_own_margins() -> None:
    results = [
        result(N2_HOLD1, "original-v1", per_minute=50.0, p99=4.0, gap=1.0),
        # 1.3x the throughput (>= 1.2: met), 0.6x the p99 wait (> 0.5: missed), 0.4x the gap (met).
        result(N2_HOLD1, "default", per_minute=65.0, p99=2.4, gap=0.4),
    ]
    found = verdicts(results)
    assert find(found, "N=2, hold 1 s: throughput").verdict == MET
    assert find(found, "N=2, hold 1 s: p99 wait").verdict == MISSED
    assert find(found, "N=2, hold 1 s: hand-off gap").verdict == MET
    assert "0.60x" in find(found, "N=2, hold 1 s: p99 wait").measured
    # Nothing measured at N=8/32 or for the uncontended calls in these results.
    assert find(found, "N=8 and 32, hold 1 s and 10 s: p99").verdict == NOT_MEASURED
    assert find(found, "uncontended").verdict == NOT_MEASURED
    assert find(found, "server calls/s").verdict == NOT_MEASURED


def test_the_large_n_targets_need_every_cell_to_pass() -> None:
    results = [
        result(N8_HOLD1, "original-v1", per_minute=50.0, p99=10.0),
        result(N8_HOLD1, "default", per_minute=55.0, p99=6.0),  # 0.6x: met, 1.1x throughput: met
        result(N32_HOLD1, "original-v1", per_minute=50.0, p99=10.0),
        result(N32_HOLD1, "default", per_minute=45.0, p99=8.0),  # 0.8x: missed, 0.9x throughput: missed
    ]
    found = verdicts(results)
    assert find(found, "N=8 and 32, hold 1 s and 10 s: p99").verdict == MISSED
    assert find(found, "N=8 and 32, hold 1 s and 10 s: throughput").verdict == MISSED
    assert "N=8 hold 1 s think: 0.60x" in find(found, "N=8 and 32, hold 1 s and 10 s: p99").measured
    found = verdicts(results[:2])
    assert find(found, "N=8 and 32, hold 1 s and 10 s: p99").verdict == MET
    assert find(found, "N=8 and 32, hold 1 s and 10 s: throughput").verdict == MET


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        (
            {
                "AddServiceToReservation": 1.0,
                "GetReservationDetails": 1.0,
                "RemoveServicesFromReservation": 1.0,
            },
            MET,
        ),
        # One cycle cut by the window's end (10 grants: a tolerance of 3/10 calls per acquisition).
        (
            {
                "AddServiceToReservation": 1.0,
                "GetReservationDetails": 1.0,
                "RemoveServicesFromReservation": 0.9,
            },
            MET,
        ),
        (
            {
                "AddServiceToReservation": 1.0,
                "GetReservationDetails": 2.0,
                "RemoveServicesFromReservation": 1.0,
            },
            MISSED,
        ),
    ],
)
def test_uncontended_calls_per_acquisition(calls, expected) -> None:
    found = verdicts([result(UNCONTENDED, "default", calls=calls, per_client=[10])])
    assert find(found, "uncontended acquire + release = 3").verdict == expected


def test_release_check_variant_is_judged_against_two_calls() -> None:
    two = {"AddServiceToReservation": 1.0, "RemoveServicesFromReservation": 1.0}
    assert (
        find(
            verdicts([result(UNCONTENDED, "release-check-5", calls=two, per_client=[10])]), "the same"
        ).verdict
        == MET
    )
    three = dict(two, GetReservationDetails=1.0)
    assert (
        find(
            verdicts([result(UNCONTENDED, "release-check-5", calls=three, per_client=[10])]), "the same"
        ).verdict
        == MISSED
    )


def test_starvation_target_looks_at_the_worst_repeat() -> None:
    even = result(N2_HOLD1, "default", 0, per_client=[6, 4])  # min 4 >= 0.5 x mean 5
    starved = result(N2_HOLD1, "default", 1, per_client=[9, 2])  # min 2 < 0.5 x mean 5.5
    assert find(verdicts([even]), "no client starves").verdict == MET
    verdict = find(verdicts([even, starved]), "no client starves")
    assert verdict.verdict == MISSED
    assert "0.36" in verdict.measured  # 2 / 5.5


def test_starvation_is_not_judged_on_windows_too_short_for_it() -> None:
    few = result(N8_HOLD1, "default", per_client=[3, 0, 2, 1, 0, 4, 1, 1])  # 12 grants, 8 clients: < 4 each
    verdict = find(verdicts([few]), "no client starves")
    assert verdict.verdict == NOT_MEASURED
    assert "not judged (fewer than 4 grants per client in the window): N=8 hold 1 s think" in verdict.measured
    enough = result(N2_HOLD1, "default", per_client=[5, 4])
    verdict = find(verdicts([few, enough]), "no client starves")
    assert verdict.verdict == MET
    assert verdict.measured.startswith("N=2 hold 1 s re-acquire: 0.89; not judged")


def test_call_rate_target_at_n32_uses_the_highest_repeat() -> None:
    low = result(N32_HOLD1, "default", 0, calls_per_second=4.0)
    high = result(N32_HOLD1, "default", 1, calls_per_second=6.0)
    assert find(verdicts([low]), "server calls/s").verdict == MET
    assert find(verdicts([low, high]), "server calls/s").verdict == MISSED


def test_noise_is_the_relative_spread_of_the_repeats() -> None:
    results = [
        result(N2_HOLD1, "default", 0, per_minute=10.0),
        result(N2_HOLD1, "default", 1, per_minute=12.0),
        result(N2_HOLD1, "default", 2, per_minute=11.0),
    ]
    rows = {label: (median, largest, count) for label, median, largest, count in noise(summarise(results))}
    assert rows["acquisitions/min"] == (pytest.approx(2 / 11), pytest.approx(2 / 11), 1)
    assert noise(summarise(results[:1])) == []  # one repeat: no spread


def test_render_has_the_targets_a_table_per_configuration_and_the_ratios(tmp_path: Path) -> None:
    results = [
        result(N2_HOLD1, "original-v1", per_minute=50.0, p99=4.0, gap=1.0),
        result(N2_HOLD1, "default", per_minute=100.0, p99=1.0, gap=0.25),
        result(UNCONTENDED, "default", per_client=[10]),
    ]
    plan = Plan("test", ((N2_HOLD1, ("original-v1", "default")), (UNCONTENDED, ("default",))), repeats=1)
    text = render(results, [plan], 60.0, [tmp_path / "plots" / "wait_p99.png"], tmp_path / "benchmarks.md")
    assert "## Targets for the default lock" in text
    assert "### N=2, hold 1 s, re-acquire at once (10 s window, 1 repeat)" in text
    assert "### N=1, hold 0.1 s, re-acquire at once (10 s window, 1 repeat)" in text
    assert "the **test** plan (repeats of every run: test 1)" in text
    assert "original-v1 *(original code)*" in text
    assert "2.00x, 0.25x, 0.25x" in text  # throughput, p99 wait, gap p50 against v1
    assert "randint(2, 5)" in text
    assert "![wait p99](plots/wait_p99.png)" in text
    assert "One repeat per run" in text


def test_plots_are_written_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [
        result(cell, name, repeat, p99=p99 * (1 + repeat / 10))
        # N=8 twice, in windows of two lengths (the quick and the targets plan): one point, the longer.
        for cell in (N2_HOLD1, Cell(8, 1.0, REACQUIRE, 10.0), Cell(8, 1.0, REACQUIRE, 40.0))
        for name, p99 in (("original-v1", 4.0), ("default", 1.0))
        for repeat in range(2)
    ]
    written = plot(summarise(results), tmp_path / "plots")
    assert [p.name for p in written] == ["wait_p99.png", "handoff_gap_p50.png", "calls_per_second.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_targets_judge_the_longest_window_of_a_configuration() -> None:
    short, long = Cell(8, 1.0, THINK, 8.0), Cell(8, 1.0, THINK, 40.0)
    results = [
        result(short, "original-v1", p99=8.0),
        result(short, "default", p99=8.0),  # 1.0x: censored by the short window
        result(long, "original-v1", p99=20.0),
        result(long, "default", p99=10.0),  # 0.5x
    ]
    verdict = find(verdicts(results), "N=8 and 32, hold 1 s and 10 s: p99")
    assert (verdict.measured, verdict.verdict) == ("N=8 hold 1 s think: 0.50x", MET)


def test_results_survive_a_round_trip_through_json(tmp_path: Path) -> None:
    results = [
        result(N2_HOLD1, "original-v1", 0, per_minute=50.0, p99=4.0),
        result(N2_HOLD1, "default", 1, per_minute=65.0, p99=2.0),
    ]
    plan = Plan("quick", ((N2_HOLD1, ("original-v1", "default")),), repeats=2)
    path = save_results(tmp_path / "results.json", results, [plan], 12.5)
    loaded, plans, seconds = load_results(path)
    assert loaded == results
    assert [(p.name, p.repeats) for p in plans] == [("quick", 2)]
    assert seconds == 12.5


def test_a_file_that_is_not_benchmark_results_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"format": 99}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a results file of this benchmark"):
        load_results(path)
    with pytest.raises(ValueError, match="cannot read benchmark results"):
        load_results(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("ours_open", "base_open", "ours_p99", "expected"),
    [
        (0, 0, 5.0, MET),  # 0.5x, nothing open
        (2, 0, 5.0, NOT_MEASURED),  # ours is a lower bound under the limit: it could be worse
        (2, 0, 8.0, MISSED),  # ours is a lower bound and already over the limit
        (0, 2, 5.0, MET),  # the original's is a lower bound: the true ratio is even smaller
        (0, 2, 8.0, NOT_MEASURED),  # over the limit against a lower bound: it could still pass
        (2, 2, 9.0, NOT_MEASURED),  # both open: a ratio of lower bounds says nothing
    ],
)
def test_p99_waits_cut_off_by_the_window_decide_only_one_way(
    ours_open, base_open, ours_p99, expected
) -> None:
    results = [
        result(N8_HOLD1, "original-v1", p99=10.0, open_waits=base_open),
        result(N8_HOLD1, "default", p99=ours_p99, open_waits=ours_open),
    ]
    verdict = find(verdicts(results), "N=8 and 32, hold 1 s and 10 s: p99")
    assert verdict.verdict == expected
    assert ("not judged" in verdict.measured) == (expected == NOT_MEASURED)


def fair_verdicts(results):
    return {v.target.split(" <=")[0].split(":")[0]: v for v in fair_targets(summarise(results))}


def test_the_fair_targets_judge_inversions_waits_against_n_times_hold_and_the_per_lock_budget() -> None:
    def fair(cell: Cell, inverted: int, p99: float, rate: float, grants: int = 40) -> RunResult:
        m = figures(
            clients=cell.clients,
            p99=p99,
            calls_per_second=rate,
            per_client=[grants // cell.clients] * cell.clients,
        )
        m = dataclasses.replace(m, inverted_grants=inverted)
        return RunResult(cell, "fair", 0, m, ran_without_lock=0)

    long_window = Cell(8, 1.0, REACQUIRE, 60.0)
    n32 = Cell(32, 1.0, REACQUIRE, 60.0)
    found = fair_verdicts([fair(long_window, 1, 11.0, 6.0), fair(n32, 1, 40.0, 4.5, grants=64)])
    assert found["FIFO inversions"].verdict == MET  # 1 of 40 and 1 of 64: under 5 %
    assert found["p99 wait"].verdict == MET  # 11 <= 1.5 x 8 x 1 and 40 <= 48
    assert "(limit 12.0 s)" in found["p99 wait"].measured
    assert found["server calls/s for one lock"].verdict == MET
    assert "acquisitions alone" in found["server calls/s for one lock"].measured
    found = fair_verdicts([fair(long_window, 3, 13.0, 6.0), fair(n32, 1, 40.0, 9.0, grants=64)])
    assert found["FIFO inversions"].verdict == MISSED  # 3 of 40
    assert found["p99 wait"].verdict == MISSED
    assert found["server calls/s for one lock"].verdict == MISSED


def test_the_report_has_a_fair_section_only_when_the_fair_mode_ran(tmp_path: Path) -> None:
    plan = Plan("t", ((N2_HOLD1, ("original-v1", "default")),), repeats=1)
    without = render(
        [result(N2_HOLD1, "original-v1"), result(N2_HOLD1, "default")], [plan], 60.0, [], tmp_path / "b.md"
    )
    assert "Targets for the fair mode" not in without
    text = render(
        [result(N2_HOLD1, "original-v1"), result(N2_HOLD1, "fair")], [plan], 60.0, [], tmp_path / "b.md"
    )
    assert "## Targets for the fair mode" in text
    assert "| FIFO inversions <= 5 % of grants (every run) |" in text
    assert "| p99 wait <= 1.5 x N x hold (every run) |" in text
