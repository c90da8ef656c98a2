"""The report on synthetic results: repeats summarised, ratios, the verdicts' place, noise, plots, JSON."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path
from typing import Dict, Optional, Sequence

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
    held_calls_per_second_of,
)
from cloudshell_mutex.bench.plans import (
    LONG_HOLD,
    MIXED,
    REACQUIRE,
    READERS,
    SETUP_BURST_A,
    STRESS,
    THINK,
    Cell,
    Plan,
    Series,
)
from cloudshell_mutex.bench.report import (
    MET,
    MISSED,
    fair_targets,
    noise,
    plot,
    ratio,
    render,
    summarise,
    throughput,
    wait_p99,
)
from cloudshell_mutex.bench.results import load_results, save_results
from cloudshell_mutex.bench.runner import RunResult
from cloudshell_mutex.bench.verdicts import verdicts

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
        early_wait=Distribution(count=10, p50=p99 / 4, p99=p99, max=p99 * 1.1, open=open_waits),
    )


def result(cell: Cell, contender: str, repeat: int = 0, **kwargs) -> RunResult:
    return RunResult(cell, contender, repeat, figures(clients=cell.clients, **kwargs), ran_without_lock=0)


def p99_row(results):
    (row,) = [r for r in verdicts(summarise(results)) if r.target.startswith("N >= 8: p99 wait")]
    return row


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
        result(UNCONTENDED, "default", per_client=[20]),
    ]
    plan = Plan("test", ((N2_HOLD1, ("original-v1", "default")), (UNCONTENDED, ("default",))), repeats=1)
    text = render(results, [plan], 60.0, [tmp_path / "plots" / "wait_p99.png"], tmp_path / "benchmarks.md")
    # The verdicts come first, with their rules, before the method and the tables.
    assert text.index("## Verdicts for the default lock") < text.index("## How it is measured")
    assert "| target | configuration | measured | verdict | not judged because |" in text
    row = "| uncontended acquire + release: 3 API calls | N=1 hold 0.1 s re-acquire | 2.00 (2.00 add) | "
    assert row + "**missed** |  |" in text
    assert "straddle the threshold" in text
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
    row = p99_row(results)
    assert (row.cell, row.measured, row.verdict) == ("N=8 hold 1 s think", "0.50x", MET)


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


def test_results_saved_before_the_early_waits_were_measured_still_load(tmp_path: Path) -> None:
    results = [result(N8_HOLD1, "original-v1", p99=20.0), result(N8_HOLD1, "default", p99=5.0)]
    plan = Plan("decide", ((N8_HOLD1, ("original-v1", "default")),), repeats=1)
    path = save_results(tmp_path / "results.json", results, [plan], 1.0)
    document = json.loads(path.read_text(encoding="utf-8"))
    for run in document["runs"]:
        del run["metrics"]["early_wait"]
    path.write_text(json.dumps(document), encoding="utf-8")
    loaded, plans, _ = load_results(path)
    assert all(r.metrics.early_wait.count == 0 for r in loaded)
    assert plans[0].once  # the decide plan's own cells, by its name
    assert "first half" in p99_row(loaded).why  # not judged: those waits were not measured


def test_a_file_that_is_not_benchmark_results_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"format": 99}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a results file of this benchmark"):
        load_results(path)
    with pytest.raises(ValueError, match="cannot read benchmark results"):
        load_results(tmp_path / "missing.json")


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


def _user_docs_check():
    """tests/release/test_user_docs.py, whose word list the report is held to."""
    path = Path(__file__).resolve().parents[1] / "release" / "test_user_docs.py"
    spec = importlib.util.spec_from_file_location("user_docs_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_whole_report_speaks_of_the_product_alone(tmp_path: Path) -> None:
    # Every kind of section: verdicts (ratios, mixed parties, readers), the fair mode, noise, the tables.
    cells = [N2_HOLD1, N8_HOLD1, Cell(4, 1.0, MIXED, 60.0), Cell(4, 1.0, READERS, 15.0), UNCONTENDED]
    results = [
        result(cell, name, repeat)
        for cell in cells
        for name in ("original-v1", "default", "plain", "fair")
        for repeat in range(2)
    ]
    plan = Plan("decide", tuple((cell, ("original-v1", "default", "plain", "fair")) for cell in cells), 2)
    doc = tmp_path / "benchmarks.md"
    doc.write_text(render(results, [plan], 60.0, [], doc), encoding="utf-8")
    text = doc.read_text(encoding="utf-8")
    assert (
        "## Targets for the fair mode" in text
        and "| mixed parties: " in text
        and "| readers stream: " in text
    )
    assert _user_docs_check().offences(doc) == []


def test_a_rewrite_of_the_report_keeps_the_sections_other_benches_and_the_demo_wrote() -> None:
    from cloudshell_mutex.bench.report import kept_sections
    from cloudshell_mutex.demo.__main__ import SECTION_END, SECTION_START

    demo = f"{SECTION_START}\n## `make demo`\n\n... **8.9 s** ...\n{SECTION_END}"
    document = f"# Benchmarks\n\nold tables\n\n{demo}\n"
    assert kept_sections(document) == demo + "\n"


BURST = Cell(8, 0.5, SETUP_BURST_A, 180.0)
HOLD = Cell(4, 60.0, LONG_HOLD, 120.0)
STRESS_CELL = Cell(32, 0.1, STRESS, 60.0)
SITE_TEST = Plan(
    "site",
    (),
    1,
    series=(
        Series(BURST, ("original-v1", "default", "plain"), 2),
        Series(HOLD, ("default",), 1),
        Series(STRESS_CELL, ("default", "plain"), 1),
    ),
)


def site_results() -> list:
    """Two repeats of a burst (the original, the default lock, plain polling), a long hold, stress."""
    results = []
    for repeat, spans in enumerate(((30.0, 20.0, 20.5), (33.0, 22.0, 21.0))):
        for name, span in zip(("original-v1", "default", "plain"), spans):
            figures = {MAKESPAN: span, WORK: 14.5, CALLS_PER_SECTION: 6.0, UNFINISHED: 0.0}
            r = result(BURST, name, repeat, per_client=[3] * 8)
            results.append(dataclasses.replace(r, metrics=dataclasses.replace(r.metrics, figures=figures)))
    held = {
        HELD_CALLS_PER_SECOND: 0.9,
        HELD_CALLS_PER_SECOND_MAX: 0.4,
        RELEASE_GAP: 0.3,
        RELEASE_GAP_OPEN: 0.0,
        **{held_calls_per_second_of(w): 0.3 for w in (1, 2, 3)},
    }
    r = result(HOLD, "default", per_client=[1] * 4)
    results.append(dataclasses.replace(r, metrics=dataclasses.replace(r.metrics, figures=held)))
    results.append(result(STRESS_CELL, "plain", per_minute=600.0, per_client=[10] * 32))
    results.append(result(STRESS_CELL, "default", per_minute=570.0, per_client=[10] * 32))
    return results


def test_the_sites_workloads_have_their_verdicts_and_tables_of_their_own(tmp_path: Path) -> None:
    results = site_results()
    text = render(results, [SITE_TEST], 600.0, [], tmp_path / "benchmarks.md")
    # The verdicts: the makespan against plain polling's and the original's, repeat by repeat.
    assert (
        "| setup burst: makespan <= 1.05 x plain polling's (`plain`, `fair=False`) | N=8 hold 0.5 s " in text
    )
    assert "| 1.01x (0.98-1.05) (makespan 21.0 s (20.0-22.0), work 14.5 s) | **met** |" in text
    assert "| setup burst: >= 1.4 x faster than the original (its makespan / ours) | N=8 hold 0.5 s " in text
    assert "| 1.50x | **met** |" in text
    assert (
        "| long hold: the waiters' server calls/s together while the job holds <= 1.5 | N=4 hold 60 s" in text
    )
    assert (
        "| stress: grants per minute >= 0.9 x plain polling's (`plain`) | N=32 hold 0.1 s stress | 0.95x"
        in text
    )
    # The repeats, the sites' own counts included.
    assert (
        "setup burst A 2 (original-v1, default, plain), long hold 1 (default), stress 1 (default, plain)"
        in text
    )
    # A finite cell is headed by its cap, and has a table of its own.
    assert (
        "### N=8, hold 0.5 s, setup burst A (drivers start within 1 s, 3 sections each, think mean 1 s) "
        in text
    )
    assert "(cap 180 s, 2 repeats)" in text
    assert "| contender | makespan s | work s | sections undone at the cap | calls/section |" in text
    assert "| default | 21.0 (20.0-22.0) | 14.5 | 0 | 6.00 |" in text
    # ... with the ratios taken repeat by repeat: 20 / 20.5 and 22 / 21; 30 / 20 and 33 / 22.
    assert "| 1.01x (0.98-1.05) | 1.50x |" in text
    assert "### N=4, hold 60 s, long hold" in text and "(cap 120 s, 1 repeat)" in text
    assert "| default | 1 | 0.90 | 0.30, 0.30, 0.30 | 0.40 | 0.30 |" in text
    # The stress cell is a windowed one: the usual table.
    assert (
        "### N=32, hold 0.1 s, stress (holds uniform 0.5-2 x hold, think exponential, mean = hold) "
        "(60 s window" in text
    )
    # The method says what the sites' workloads are.
    assert (
        "**The sites' workloads.**" in text
        and "*Long hold:* a job takes the lock (the `default` lock" in text
    )
    doc = tmp_path / "site.md"
    doc.write_text(text, encoding="utf-8")
    assert _user_docs_check().offences(doc) == []


def test_the_sites_workloads_are_not_plotted_and_have_noise_rows_of_their_own(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    summaries = summarise(site_results())
    assert plot(summaries, tmp_path / "plots") == []  # nothing against N: no panels, no files
    rows = {label: (median, largest, count) for label, median, largest, count in noise(summaries)}
    # The bursts' makespans spread over the repeats; their rates and waits are not a steady state's.
    assert rows["setup burst: makespan"][2] == 3
    assert "acquisitions/min" not in rows


def test_the_sites_figures_survive_a_round_trip_through_json(tmp_path: Path) -> None:
    results = site_results()
    path = save_results(tmp_path / "results.json", results, [SITE_TEST], 600.0)
    loaded, _, _ = load_results(path)
    assert loaded == results
    assert loaded[0].metrics.figure(MAKESPAN) == 30.0 and math.isnan(loaded[-1].metrics.figure(MAKESPAN))
