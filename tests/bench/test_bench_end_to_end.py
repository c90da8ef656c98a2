"""The whole pipeline, tiny: spawned clients against the emulator, the report and its plots written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudshell_mutex.bench.__main__ import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_smoke_plan_writes_the_report_and_the_plots(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    doc, plots = tmp_path / "docs" / "benchmarks.md", tmp_path / "docs" / "benchmarks"
    assert main(["--plan", "smoke", "--doc", str(doc), "--plots", str(plots)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "the **smoke** plan" in text
    assert "### N=2, hold 0.1 s, re-acquire at once (3 s window, 1 repeat)" in text
    # Both contenders measured: a row each, with its grants per minute (from the server's log).
    v1 = re.search(r"^\| original-v1 \*\(original code\)\* \| (\d+)", text, re.MULTILINE)
    assert v1 and int(v1.group(1)) > 0, text
    assert re.search(r"^\| default \| \d+", text, re.MULTILINE), text
    assert re.search(r"^\| fair \| \d+", text, re.MULTILINE), text
    assert "## Targets for the fair mode" in text
    assert "| FIFO inversions <= 5 % of grants (every run) |" in text
    # The verdicts head the page; the uncontended cycle is measured from the server's counts, by method
    # (a 2 s window holds too few cycles to judge it).
    assert text.index("## Verdicts for the default lock") < text.index("## How it is measured")
    cycle = r"\| uncontended acquire \+ release: 3 API calls \| N=1 hold 0\.1 s re-acquire "
    cycle += r"\| \d\.\d\d \([\d.]+ add"
    assert re.search(cycle, text), text
    # The sites' workloads, tiny: a burst of two drivers against plain polling and the original, the
    # default lock's waiter behind a 2 s hold, and a few seconds of stress; each with its table and its
    # verdict rows (far too little work to judge, but measured).
    assert "### N=2, hold 0.3 s, setup burst B (" in text and "(cap 30 s, 1 repeat)" in text
    burst = re.search(r"^\| default \| ([\d.]+) \| ([\d.]+) \| 0 \| ([\d.]+) \|", text, re.MULTILINE)
    assert burst and float(burst.group(1)) > float(burst.group(2)) > 0, text  # makespan > work > 0
    assert re.search(r"^\| original-v1 \*\(original code\)\* \| [\d.]+ \| [\d.]+ \| 0 \|", text, re.MULTILINE)
    assert "### N=2, hold 2 s, long hold (" in text
    assert re.search(r"^\| default \| 1 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", text, re.MULTILINE), text
    assert "### N=3, hold 0.1 s, stress (" in text
    assert re.search(r"^\| plain \| \d+", text, re.MULTILINE), text
    targets = ("setup burst: makespan", "setup burst: >= 1.4", "setup burst: server calls")
    for target in (*targets, "long hold: the", "long hold: from", "stress: grants per minute"):
        assert re.search(rf"^\| {re.escape(target)}.* \| N=\d+ hold [\d.]+ s ", text, re.MULTILINE), target
    for name in ("wait_p99.png", "handoff_gap_p50.png", "calls_per_second.png"):
        assert (plots / name).read_bytes()[:4] == b"\x89PNG"
        assert f"](benchmarks/{name})" in text
    assert "wrote" in capsys.readouterr().out
    # The raw results are saved beside the plots; the same report can be written from them alone.
    again = tmp_path / "again" / "docs"
    argv = ["--from-results", str(plots / "results.json"), "--doc", str(again / "benchmarks.md")]
    assert main([*argv, "--plots", str(again / "benchmarks")]) == 0
    assert (again / "benchmarks.md").read_text(encoding="utf-8") == text
