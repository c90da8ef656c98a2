"""The cohort benchmark: figures from synthetic hold records, the report section, the pipeline, tiny."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cloudshell_mutex.bench import cohort as bench_cohort
from cloudshell_mutex.bench.cohort import CohortCell, cohort_metrics, existing_section, insert_section
from cloudshell_mutex.bench.contenders import default_lock
from cloudshell_mutex.bench.metrics import BenchDataError
from cloudshell_mutex.bench.runner import Execution
from cloudshell_mutex.bench.worker import ClientReport, RunSpec

CELL = CohortCell(servers=2, per_server=2, hold=0.1, window=10.0)


def execution(holds_by_client, counts=None) -> Execution:
    from cloudshell_mutex.bench.contenders import Contender

    spec = RunSpec("res", Contender("x", "x", default_lock), "reacquire", 0.1, 100.0, 110.0, 0)
    reports = {c: ClientReport(c, holds=list(h)) for c, h in holds_by_client.items()}
    return Execution(spec, reports, counts or {"AddServiceToReservation": 4, "GetReservationDetails": 6})


def test_figures_come_from_the_clients_hold_records():
    run = execution(
        {
            0: [(100.0, 100.1, False, 1), (100.3, 100.4, False, 2)],
            1: [(100.102, 100.2, True, 0)],  # passed within server 0: a 2 ms gap
            2: [(100.5, 100.6, False, 1)],
            3: [(100.604, 100.7, True, 0), (111.0, 111.1, True, 0)],  # the last starts after the window
        }
    )
    m = cohort_metrics("cohort", CELL, run)
    assert m.holds == 5 and m.passed == 2
    assert m.holds_per_server == (3, 2) and m.fairness == pytest.approx(2 / 2.5)
    assert m.gap.p50 == pytest.approx(0.003)  # gaps 2 ms and 4 ms
    assert m.calls_per_passed_acquisition == 0
    assert m.calls_per_second == pytest.approx(1.0) and m.calls_per_acquisition == pytest.approx(2.0)
    assert m.holds_per_minute == pytest.approx(30.0)


def test_overlapping_holds_are_a_bench_error_not_a_result():
    run = execution({0: [(100.0, 100.2, False, 1)], 2: [(100.1, 100.3, False, 1)]})
    with pytest.raises(BenchDataError, match="overlap"):
        cohort_metrics("default", CELL, run)


def test_without_passes_the_gap_is_not_a_number():
    m = cohort_metrics("default", CELL, execution({0: [(100.0, 100.1, False, 3)]}))
    assert math.isnan(m.gap.p50) and math.isnan(m.calls_per_passed_acquisition)


def test_the_section_is_inserted_replaced_and_kept():
    section = bench_cohort.render_section(
        [
            cohort_metrics(
                "cohort", CELL, execution({0: [(100.0, 100.1, False, 1)], 1: [(100.1, 100.2, True, 0)]})
            )
        ],
        "smoke",
        3.0,
    )
    assert "local gap p50 <= 5 ms with 0 server calls" in section
    page = insert_section("# Benchmarks\n\nbody\n", section)
    assert page.startswith("# Benchmarks") and existing_section(page) == section
    replaced = insert_section(page, section.replace("smoke", "quick"))
    assert replaced.count(bench_cohort.SECTION_START) == 1 and "--plan quick" in replaced


def test_the_main_report_keeps_the_cohort_section(tmp_path: Path):
    from cloudshell_mutex.bench.report import write_report

    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        insert_section("# old\n", bench_cohort.SECTION_START + "\nkept\n" + bench_cohort.SECTION_END)
    )
    write_report([], [], 1.0, doc, None)
    assert "\nkept\n" in doc.read_text(encoding="utf-8")


@pytest.mark.integration
@pytest.mark.slow
def test_the_smoke_plan_measures_passes_and_writes_the_section(tmp_path: Path):
    doc, results = tmp_path / "benchmarks.md", tmp_path / "benchmarks" / "cohort.json"
    assert bench_cohort.main(["--plan", "smoke", "--doc", str(doc), "--results", str(results)]) == 0
    runs, plan, _ = bench_cohort.load(results)
    assert plan == "smoke" and {r.contender for r in runs} == {"default", "cohort"}
    cohort_run = next(r for r in runs if r.contender == "cohort")
    assert cohort_run.passed > 0 and cohort_run.calls_per_passed_acquisition == 0
    text = doc.read_text(encoding="utf-8")
    assert "## Cohort mode (several execution servers)" in text
    assert bench_cohort.main(["--from-results", "--doc", str(doc), "--results", str(results)]) == 0
    assert doc.read_text(encoding="utf-8") == text
