"""The repeats of one contender in one cell, summarised: the figures the report and the verdicts share.

No I/O: everything works on :class:`~.runner.RunResult` lists, so tests can feed it synthetic results.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

from .contenders import BASELINE
from .metrics import CALLS_PER_SECTION, HELD_CALLS_PER_SECOND, MAKESPAN, RELEASE_GAP, RunMetrics
from .plans import (
    LONG_HOLD,
    MIXED,
    REACQUIRE,
    READERS,
    SETUP_BURST_A,
    SETUP_BURST_B,
    STRESS,
    THINK,
    WORKLOADS,
    Cell,
)
from .runner import RunResult

#: Short names of the API methods in the call columns.
METHOD_NAMES = {
    "AddServiceToReservation": "add",
    "GetReservationDetails": "read",
    "RemoveServicesFromReservation": "remove",
    "GetServices": "catalog",
    "GetReservationStatus": "status",
    "WriteMessageToReservationOutput": "output",
}

Metric = Callable[[RunMetrics], float]
#: The runs of every contender in every cell, by (cell, contender).
Summaries = Dict[Tuple[Cell, str], "Summary"]


@dataclass(frozen=True)
class Summary:
    """The repeats of one contender in one cell."""

    cell: Cell
    contender: str
    runs: Tuple[RunMetrics, ...]
    ran_without_lock: int

    def values(self, metric: Metric) -> List[float]:
        """``metric`` of every repeat (NaNs left out)."""
        return [v for v in (metric(m) for m in self.runs) if not math.isnan(v)]

    def median(self, metric: Metric) -> float:
        """The median of ``metric`` over the repeats (NaN when no repeat has it)."""
        values = self.values(metric)
        return statistics.median(values) if values else math.nan

    def spread(self, metric: Metric) -> Tuple[float, float]:
        """The lowest and the highest ``metric`` over the repeats."""
        values = self.values(metric)
        return (min(values), max(values)) if values else (math.nan, math.nan)


def summarise(results: Sequence[RunResult]) -> Summaries:
    """Group the runs by (cell, contender), in the order they first ran."""
    grouped: Dict[Tuple[Cell, str], List[RunResult]] = {}
    for result in results:
        grouped.setdefault((result.cell, result.contender), []).append(result)
    return {
        key: Summary(key[0], key[1], tuple(r.metrics for r in runs), sum(r.ran_without_lock for r in runs))
        for key, runs in grouped.items()
    }


def throughput(m: RunMetrics) -> float:
    """Acquisitions per minute."""
    return m.acquisitions_per_minute


def wait_p50(m: RunMetrics) -> float:
    """Median wait, s."""
    return m.wait.p50


def wait_p99(m: RunMetrics) -> float:
    """99th percentile of the wait, s."""
    return m.wait.p99


def wait_max(m: RunMetrics) -> float:
    """Longest wait, s."""
    return m.wait.max


def gap_p50(m: RunMetrics) -> float:
    """Median hand-off gap, s."""
    return m.handoff_gap.p50


def calls_per_acquisition(m: RunMetrics) -> float:
    """API calls per grant."""
    return m.calls_per_acquisition_total


def calls_per_second(m: RunMetrics) -> float:
    """API calls per second on the server."""
    return m.calls_per_second


def fairness(m: RunMetrics) -> float:
    """min grants per client / mean grants per client."""
    return m.fairness


def inverted_share(m: RunMetrics) -> float:
    """Share of grants that overtook an earlier waiter."""
    return m.inverted_grants / m.grants if m.grants else math.nan


def makespan(m: RunMetrics) -> float:
    """A burst's seconds from the first driver's start to the last release."""
    return m.figure(MAKESPAN)


def calls_per_section(m: RunMetrics) -> float:
    """A burst's server calls per section."""
    return m.figure(CALLS_PER_SECTION)


def held_calls_per_second(m: RunMetrics) -> float:
    """The long hold's waiters' calls per second together while the job held."""
    return m.figure(HELD_CALLS_PER_SECOND)


def release_gap(m: RunMetrics) -> float:
    """The long hold's seconds from the job's release to the next grant."""
    return m.figure(RELEASE_GAP)


def paired(
    summaries: Summaries,
    cell: Cell,
    name: str,
    other: str,
    value: Callable[[float, float], float],
    metric: Metric,
) -> List[float]:
    """``value(name's metric, other's metric)`` repeat by repeat in ``cell`` (the k-th run of each: the same
    work in the sites' workloads), NaNs left out; empty when either did not run there."""
    ours, theirs = summaries.get((cell, name)), summaries.get((cell, other))
    if ours is None or theirs is None:
        return []
    values = (value(metric(a), metric(b)) for a, b in zip(ours.runs, theirs.runs))
    return [v for v in values if not math.isnan(v)]


def ratio(summaries: Summaries, cell: Cell, name: str, metric: Metric) -> float:
    """median ``metric`` of ``name`` / that of the baseline (original v1) in ``cell`` (NaN if missing)."""
    ours, base = summaries.get((cell, name)), summaries.get((cell, BASELINE))
    if ours is None or base is None:
        return math.nan
    denominator = base.median(metric)
    if math.isnan(denominator) or denominator == 0:
        return math.nan
    return ours.median(metric) / denominator


def longest_windows(summaries: Summaries, name: str, where: Callable[[Cell], bool]) -> List[Summary]:
    """``name``'s summaries in the cells ``where`` selects; of a configuration measured in windows of
    several lengths (quick and targets plans together), only the longest window counts."""
    longest: Dict[Tuple[int, float, str], Summary] = {}
    for (cell, n), s in summaries.items():
        if n == name and where(cell):
            key = (cell.clients, cell.hold, cell.workload)
            if key not in longest or cell.window > longest[key].cell.window:
                longest[key] = s
    return list(longest.values())


#: The workloads in a few words.
SHORT_WORKLOADS = {
    REACQUIRE: "re-acquire",
    THINK: "think",
    MIXED: "mixed parties",
    READERS: "readers stream",
    SETUP_BURST_A: "setup burst A",
    SETUP_BURST_B: "setup burst B",
    LONG_HOLD: "long hold",
    STRESS: "stress",
}


def short(cell: Cell) -> str:
    """``N=8 hold 1 s re-acquire``: a cell in a few words."""
    workload = SHORT_WORKLOADS.get(cell.workload, WORKLOADS[cell.workload])
    return f"N={cell.clients} hold {cell.hold:g} s {workload}"


def number(value: float) -> str:
    """``value`` with two to three significant digits ("-" for NaN)."""
    if math.isnan(value):
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def calls_by_method(summary: Summary) -> str:
    """The median calls per acquisition of each API method: ``1.00 add, 1.00 read, 1.00 remove``."""
    methods = sorted({method for m in summary.runs for method in m.calls_per_acquisition})
    parts = []
    for method in methods:
        value = statistics.median(m.calls_per_acquisition.get(method, 0.0) for m in summary.runs if m.grants)
        parts.append(f"{value:.2f} {METHOD_NAMES.get(method, method)}")
    return ", ".join(parts) or "-"
