"""The default lock's targets, judged on a benchmark's results: met, missed or not judged, cell by cell.

Each target covers some cells (:data:`TARGETS`); in each, every repeat of the judged contender (``default``)
gives a figure and says met, missed or "cannot tell" (:class:`Repeat`); the repeats together give the
verdict (:func:`combine`). A ratio is taken against the baseline (the original v1) of the *same repeat*,
so drift of the machine between repeats falls on both sides. The rules, stated in the report (:data:`RULES`):

* A run judges only what its window can hold: at least :data:`MIN_GRANTS` grants of every contender
  compared, :data:`MIN_MEAN_GRANTS` per client for the starvation target, :data:`MIN_SAMPLE` waits or
  hand-offs for a percentile, :data:`MIN_HANDOFFS` grants for a call rate, :data:`MIN_READER_TRIES` ended
  waits for the readers stream, a hold of :data:`MIN_LONG_HOLD` seconds for the long hold.
* A percentile of waits is taken over the waits that started in the window's first half (each had half a
  window to end); a figure that is a lower bound (a wait or gap still open when the window closed) decides
  only the way it cannot change: a lower bound over the limit is a miss, one under it tells nothing.
* Figures estimated from a sample (ratios, percentiles, shares, calls) are met or missed when every repeat
  agrees, and not judged when the repeats straddle the threshold. Guarantees (no starvation, mixed parties,
  the readers stream) are missed as soon as one run breaks them.
* The sites' workloads (setup bursts, the long hold, stress) compare the default lock with plain polling
  (``fair=False``) as well as with the original; every contender of a repeat got the same work (the same
  seed), so a ratio is taken repeat by repeat. A burst left undone at its cap has a makespan that is a
  lower bound, and decides only the way it cannot change.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from .contenders import BASELINE, PLAIN_POLLING
from .metrics import (
    CALLS_PER_SECTION,
    HELD_CALLS_PER_SECOND,
    HELD_CALLS_PER_SECOND_MAX,
    MAKESPAN,
    RELEASE_GAP,
    RELEASE_GAP_OPEN,
    UNFINISHED,
    WORK,
    RunMetrics,
)
from .plans import BURSTS, LONG_HOLD, MIXED, REACQUIRE, READERS, STRESS, THINK, Cell
from .summary import Summaries, Summary, calls_by_method, longest_windows, number, short

MET, MISSED, NOT_JUDGED = "met", "missed", "not judged"

#: The contender whose targets these are.
JUDGED = "default"
#: A run with fewer grants (of the judged contender, and of the baseline for a ratio) judges nothing.
MIN_GRANTS = 15
#: The starvation target needs at least this many grants per client on average.
MIN_MEAN_GRANTS = 3
#: A percentile (of waits, of hand-off gaps) needs at least this many of them.
MIN_SAMPLE = 8
#: The readers stream needs at least this many of the lock's waits ended to say that it got in.
MIN_READER_TRIES = 3
#: A call rate needs at least this many grants (hand-offs) in the window, so that it is not the arrival's.
MIN_HANDOFFS = 5
#: The long hold's targets need a hold at least this long: a waiter polls fast in its first seconds (it
#: spins, then parks), and a short hold would judge that rather than a wait behind a job.
MIN_LONG_HOLD = 30.0

RULES = textwrap.fill(
    f"Every target is judged for the `{JUDGED}` contender (unless it names another), in each "
    "configuration it covers, on every repeat; a ratio divides its figure by the original v1's in the "
    "same repeat. The measured column gives the median over the repeats and, in brackets, the lowest and "
    "highest. A run judges only what its window can hold: at least "
    f"{MIN_GRANTS} grants of each contender compared, "
    f"{MIN_MEAN_GRANTS} grants per client on average for the starvation target, {MIN_SAMPLE} waits or "
    f"hand-offs for a percentile, {MIN_HANDOFFS} grants for a call rate, {MIN_READER_TRIES} ended waits of "
    "the lock for the readers stream; "
    "otherwise the run is not judged. A p99 wait is taken over the waits that started in the window's first "
    "half (each had half a window to end). A figure that includes waits still open when the window closed "
    "is a lower bound: over the limit it is a miss, under it it tells nothing. Figures estimated from a "
    "sample (ratios, percentiles, shares, calls) are **met** or **missed** when every repeat agrees and "
    "**not judged** when the repeats straddle the threshold; guarantees (no starvation, mixed parties, the "
    "readers stream) are **missed** as soon as one run breaks them. The sites' workloads (setup bursts, the "
    f"long hold, stress) also compare with plain polling (`{PLAIN_POLLING}`, `fair=False`): every "
    "contender of a repeat gets exactly the same work there (the same seed), so their ratios, too, are "
    "taken repeat by repeat; a burst left undone at its cap has a makespan that is a lower bound; the long "
    f"hold judges holds of {MIN_LONG_HOLD:g} s and more (a waiter's first seconds poll fast by design).",
    width=105,
)


@dataclass(frozen=True)
class Repeat:
    """One repeat's figure for a target: ``ok`` True (met), False (missed) or None (cannot tell: ``why``)."""

    value: float
    ok: Optional[bool]
    why: str = ""


@dataclass(frozen=True)
class Row:
    """One target in one configuration: the figure of every repeat, the verdict and, if not judged, why."""

    target: str
    cell: str
    measured: str
    verdict: str
    why: str = ""


def combine(repeats: Sequence[Repeat], guarantee: bool = False) -> Tuple[str, str]:
    """The verdict of a target's repeats in one configuration, and why it was not judged."""
    oks = [r.ok for r in repeats]
    if not repeats:
        return NOT_JUDGED, "no run"
    if guarantee and False in oks:
        return MISSED, ""
    if all(ok is True for ok in oks):
        return MET, ""
    if all(ok is False for ok in oks):
        return MISSED, ""
    if None in oks:
        return NOT_JUDGED, next(r.why for r in repeats if r.ok is None)
    return NOT_JUDGED, "the repeats straddle the threshold"


@dataclass(frozen=True)
class Unit:
    """How a target's figure reads: ``fmt`` for the number, then ``suffix``."""

    fmt: Callable[[float], str] = number
    suffix: str = ""

    def spread(self, values: Sequence[float]) -> str:
        """``median (min-max)`` of the repeats' figures (NaNs left out), the suffix after the median."""
        known = [v for v in values if not math.isnan(v)]
        if not known:
            return "-"
        median, low, high = statistics.median(known), min(known), max(known)
        text = f"{self.fmt(median)}{self.suffix}"
        return text if low == high else f"{text} ({self.fmt(low)}-{self.fmt(high)})"


def _times(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


def _percent(value: float) -> str:
    return f"{100 * value:.0f}"


#: The units of the targets' figures: a number, a ratio, seconds, a share, a rate.
PLAIN = Unit()
TIMES = Unit(_times, "x")
SECONDS = Unit(number, " s")
PERCENT = Unit(_percent, " %")
PER_SECOND = Unit(number, "/s")


# ---------------------------------------------------------------- one repeat, per target

#: Judges one run of a cell (a repeat); a ratio's judge gets the baseline's run of the same repeat too.
Judge = Callable[[RunMetrics, Cell], Repeat]
RatioJudge = Callable[[RunMetrics, RunMetrics], Repeat]


def _judged(value: float, ok: bool, *runs: RunMetrics) -> Repeat:
    """``ok`` for ``value``, unless a run holds too few grants to say."""
    if min(m.grants for m in runs) < MIN_GRANTS:
        return Repeat(value, None, f"fewer than {MIN_GRANTS} grants in a run")
    return Repeat(value, ok)


def at_most(metric: Callable[[RunMetrics], float], limit: float) -> Judge:
    """A figure of the run that must be at most ``limit``."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        value = metric(m) if m.grants else math.nan
        return _judged(value, value <= limit, m)

    return judge


def rate_at_most(limit: float) -> Judge:
    """The server's calls/s for the lock at most ``limit``, over a window that saw several hand-offs (the
    clients' arrival costs calls too, and a window of it alone would judge that)."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        if m.grants < MIN_HANDOFFS:
            return Repeat(m.calls_per_second, None, f"fewer than {MIN_HANDOFFS} grants in a run")
        return Repeat(m.calls_per_second, m.calls_per_second <= limit)

    return judge


def inverted_share(m: RunMetrics) -> float:
    """The share of grants that overtook an earlier waiter."""
    return m.inverted_grants / m.grants


def uncontended_calls(expected: int) -> Judge:
    """``expected`` API calls per uncontended acquire + release; the window's end may cut one cycle, whose
    calls are counted while its grant may not be, so ``expected / grants`` of slack."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        value = m.calls_per_acquisition_total
        return _judged(value, m.grants > 0 and abs(value - expected) <= expected / m.grants, m)

    return judge


def starvation(m: RunMetrics, cell: Cell) -> Repeat:
    """min grants per client >= half the mean."""
    if m.grants < MIN_MEAN_GRANTS * m.clients:
        return Repeat(m.fairness, None, f"fewer than {MIN_MEAN_GRANTS} grants per client")
    return Repeat(m.fairness, m.fairness >= 0.5)


def per_minute(m: RunMetrics, cell: Cell) -> Repeat:
    """Every client at least one grant per minute of the window."""
    value = m.min_grants * 60.0 / m.window_seconds
    if value >= 1:
        return Repeat(value, True)
    if m.window_seconds < 60:
        return Repeat(value, None, "a client without a grant in a window shorter than a minute")
    return Repeat(value, False)


def gap_p50_at_most(limit: float) -> Judge:
    """The median hand-off gap at most ``limit`` (a lower bound when half the gaps were cut open)."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        gaps = m.handoff_gap
        if gaps.count < MIN_SAMPLE:
            return Repeat(gaps.p50, None, f"fewer than {MIN_SAMPLE} hand-offs")
        ok = gaps.p50 <= limit
        if ok and gaps.open >= gaps.count / 2:
            return Repeat(gaps.p50, None, "half the hand-offs still open at the window's end")
        return Repeat(gaps.p50, ok)

    return judge


def mixed_parties(m: RunMetrics, cell: Cell) -> Repeat:
    """Every pausing client (1..) gets at least a third of the looper's (client 0) grants."""
    looper, pausers = m.grants_per_client[0], m.grants_per_client[1:]
    value = min(pausers) / looper if looper else math.inf
    return _judged(value, value >= 1 / 3, m)


def readers_stream(m: RunMetrics, cell: Cell) -> Repeat:
    """The lock's longest wait (an open one with its length so far) at most 2 x the read time."""
    value = m.wait.max
    if value > 2 * cell.hold:
        return Repeat(value, False)
    if m.wait.count - m.wait.open < MIN_READER_TRIES:
        return Repeat(value, None, f"fewer than {MIN_READER_TRIES} waits of the lock ended")
    return Repeat(value, True)


def ratio_at_least(metric: Callable[[RunMetrics], float], limit: float) -> RatioJudge:
    """Ours / the baseline's of the same repeat, at least ``limit``."""

    def judge(ours: RunMetrics, base: RunMetrics) -> Repeat:
        value = metric(ours) / metric(base) if metric(base) else math.nan
        return _judged(value, value >= limit, ours, base)

    return judge


def early_p99_at_most(limit: float) -> RatioJudge:
    """Ours / the baseline's p99 of the waits that started in the first half of the window, at most
    ``limit``; a side with such waits still open is a lower bound and decides only one way."""

    def judge(ours: RunMetrics, base: RunMetrics) -> Repeat:
        a, b = ours.early_wait, base.early_wait
        value = a.p99 / b.p99 if b.p99 else math.nan
        if min(a.count, b.count) < MIN_SAMPLE:
            return Repeat(value, None, f"fewer than {MIN_SAMPLE} waits in the window's first half")
        ok = value <= limit
        if (ok and a.open) or (not ok and b.open):
            return Repeat(value, None, "waits of the first half still open at the window's end")
        return _judged(value, ok, ours, base)

    return judge


def _makespan(m: RunMetrics) -> float:
    return m.figure(MAKESPAN)


def _undone(m: RunMetrics) -> bool:
    """A burst with sections left undone at its cap: its makespan is a lower bound."""
    return m.figure(UNFINISHED) > 0


def makespan_ratio_at_most(limit: float) -> RatioJudge:
    """Our makespan / the other contender's of the same repeat (the same work), at most ``limit``; an
    undone burst's makespan is a lower bound and decides only the way it cannot change."""

    def judge(ours: RunMetrics, other: RunMetrics) -> Repeat:
        value = _makespan(ours) / _makespan(other) if _makespan(other) else math.nan
        ok = value <= limit
        if (ok and _undone(ours)) or (not ok and _undone(other)):
            return Repeat(value, None, "a burst left undone at its cap")
        return _judged(value, ok, ours, other)

    return judge


def speedup_at_least(limit: float) -> RatioJudge:
    """The baseline's makespan / ours of the same repeat (how many times faster the same work was done),
    at least ``limit``; an undone burst's makespan is a lower bound, as above."""

    def judge(ours: RunMetrics, base: RunMetrics) -> Repeat:
        value = _makespan(base) / _makespan(ours) if _makespan(ours) else math.nan
        ok = value >= limit
        if (ok and _undone(ours)) or (not ok and _undone(base)):
            return Repeat(value, None, "a burst left undone at its cap")
        return _judged(value, ok, ours, base)

    return judge


def _short_hold(cell: Cell) -> Optional[str]:
    """Why a long hold's run is too short to judge, or None."""
    return f"a hold shorter than {MIN_LONG_HOLD:g} s" if cell.hold < MIN_LONG_HOLD else None


def held_rate_at_most(limit: float) -> Judge:
    """The long hold's waiters' calls per second together while the job held, at most ``limit``."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        value = m.figure(HELD_CALLS_PER_SECOND)
        if math.isnan(value):
            return Repeat(value, None, "no calls of the waiters recorded")
        short = _short_hold(cell)
        return Repeat(value, None, short) if short else Repeat(value, value <= limit)

    return judge


def release_gap_at_most(limit: float) -> Judge:
    """From the long hold's release to the next grant, at most ``limit``; with no grant before the run's
    end the gap is a lower bound (a miss when over the limit)."""

    def judge(m: RunMetrics, cell: Cell) -> Repeat:
        value = m.figure(RELEASE_GAP)
        if math.isnan(value):
            return Repeat(value, None, "the job did not release before the cap")
        short = _short_hold(cell)
        if short:
            return Repeat(value, None, short)
        ok = value <= limit
        if ok and m.figure(RELEASE_GAP_OPEN) == 1:
            return Repeat(value, None, "no grant after the release before the run's end")
        return Repeat(value, ok)

    return judge


# ---------------------------------------------------------------- the targets


def _contended(cell: Cell) -> bool:
    return cell.clients > 1 and cell.workload in (REACQUIRE, THINK)


def _hold(hold: float) -> Callable[[Cell], bool]:
    return lambda cell: _contended(cell) and cell.hold == hold


@dataclass(frozen=True)
class Target:
    """A target: the cells it covers, how one repeat is judged (alone, or as a ``ratio`` against the
    baseline's run of the same repeat), how its figure reads, and what else its row shows."""

    text: str
    where: Callable[[Cell], bool]
    judge: Optional[Judge] = None
    ratio: Optional[RatioJudge] = None
    unit: Unit = PLAIN
    guarantee: bool = False
    extra: Optional[Callable[[Summary], str]] = None
    contender: str = JUDGED
    against: str = BASELINE  # the contender a ratio is taken against

    def repeats(self, summaries: Summaries, summary: Summary) -> List[Repeat]:
        """Every repeat of ``summary`` judged (none for a ratio without the other contender in the cell)."""
        if self.ratio is None:
            assert self.judge is not None, "a target judges alone or as a ratio"
            return [self.judge(m, summary.cell) for m in summary.runs]
        base = summaries.get((summary.cell, self.against))
        if base is None:
            return []
        return [self.ratio(ours, theirs) for ours, theirs in zip(summary.runs, base.runs)]

    def rows(self, summaries: Summaries) -> List[Row]:
        """A row per configuration the target covers (one saying so when the results have none)."""
        rows = []
        for summary in longest_windows(summaries, self.contender, self.where):
            repeats = self.repeats(summaries, summary)
            if not repeats:
                continue
            verdict, why = combine(repeats, self.guarantee)
            measured = self.unit.spread([r.value for r in repeats])
            if self.extra is not None:
                measured += f" ({self.extra(summary)})"
            rows.append(Row(self.text, short(summary.cell), measured, verdict, why))
        return rows or [Row(self.text, "-", "-", NOT_JUDGED, "not in the plans run")]


def _at_least_8(cell: Cell) -> bool:
    return _contended(cell) and cell.clients >= 8 and cell.hold >= 1


def _n(clients: int, hold: float = 1.0, workload: Optional[str] = None) -> Callable[[Cell], bool]:
    def where(cell: Cell) -> bool:
        return _hold(hold)(cell) and cell.clients == clients and workload in (None, cell.workload)

    return where


def _reader_wait_p50(summary: Summary) -> str:
    return "wait p50 " + SECONDS.spread([m.wait.p50 for m in summary.runs])


def _throughput(m: RunMetrics) -> float:
    return m.acquisitions_per_minute


def _burst(cell: Cell) -> bool:
    return cell.workload in BURSTS


def _makespan_and_work(summary: Summary) -> str:
    return (
        f"makespan {SECONDS.spread([_makespan(m) for m in summary.runs])}, "
        f"work {SECONDS.spread([m.figure(WORK) for m in summary.runs])}"
    )


def _busiest_waiter(summary: Summary) -> str:
    return "the busiest waiter " + PER_SECOND.spread(
        [m.figure(HELD_CALLS_PER_SECOND_MAX) for m in summary.runs]
    )


def _grants_per_minute(summary: Summary) -> str:
    return Unit(number, "/min").spread([m.acquisitions_per_minute for m in summary.runs])


#: The default lock's targets, in the order of the report's table.
TARGETS: Tuple[Target, ...] = (
    Target(
        "uncontended acquire + release: 3 API calls",
        lambda c: c.clients == 1,
        uncontended_calls(3),
        extra=calls_by_method,
    ),
    Target(
        "the same with `release_check_after=5`: 2 API calls",
        lambda c: c.clients == 1,
        uncontended_calls(2),
        extra=calls_by_method,
        contender="release-check-5",
    ),
    Target(
        "no starvation: min grants per client >= 0.5 x the mean",
        lambda c: _hold(1.0)(c) and c.clients < 32,
        starvation,
        guarantee=True,
    ),
    Target(
        "no starvation at N=32: every client at least one grant per minute",
        lambda c: _hold(1.0)(c) and c.clients >= 32,
        per_minute,
        unit=Unit(number, "/min (the client with fewest)"),
        guarantee=True,
    ),
    Target("FIFO inversions <= 10 % of grants", _hold(1.0), at_most(inverted_share, 0.1), unit=PERCENT),
    Target(
        "server calls per acquisition <= 8 at N=8",
        _n(8),
        at_most(lambda m: m.calls_per_acquisition_total, 8),
    ),
    Target(
        "server calls per acquisition <= 10 at N=32",
        _n(32),
        at_most(lambda m: m.calls_per_acquisition_total, 10),
    ),
    Target(
        "hold 10 s, N=32: server calls/s for the lock <= 4",
        _n(32, 10.0),
        rate_at_most(4),
        unit=PER_SECOND,
    ),
    Target(
        "throughput >= 0.97 x the original",
        lambda c: _contended(c) and c.hold >= 1,
        ratio=ratio_at_least(_throughput, 0.97),
        unit=TIMES,
    ),
    Target(
        "N=2 with think time: throughput >= 1.3 x the original",
        _n(2, workload=THINK),
        ratio=ratio_at_least(_throughput, 1.3),
        unit=TIMES,
    ),
    Target(
        "hold 0.1 s: throughput >= 0.9 x the original",
        _hold(0.1),
        ratio=ratio_at_least(_throughput, 0.9),
        unit=TIMES,
    ),
    Target(
        "the same without the release's read (`release-check-5`): the gap to the row above is what it costs",
        _hold(0.1),
        ratio=ratio_at_least(_throughput, 0.9),
        unit=TIMES,
        contender="release-check-5",
    ),
    Target("hand-off gap p50 <= 0.25 s", _hold(1.0), gap_p50_at_most(0.25), unit=SECONDS),
    Target(
        "N >= 8: p99 wait <= 0.5 x the original's",
        _at_least_8,
        ratio=early_p99_at_most(0.5),
        unit=TIMES,
    ),
    Target(
        "mixed parties: every pausing client >= 1/3 of the looper's grants",
        lambda c: c.workload == MIXED,
        mixed_parties,
        unit=Unit(number, " (the pausing client with fewest / the looper)"),
        guarantee=True,
    ),
    Target(
        "readers stream: the lock gets in within 2 x the read time",
        lambda c: c.workload == READERS,
        readers_stream,
        unit=Unit(number, " s longest wait"),
        guarantee=True,
        extra=_reader_wait_p50,
    ),
    Target(
        f"setup burst: makespan <= 1.05 x plain polling's (`{PLAIN_POLLING}`, `fair=False`)",
        _burst,
        ratio=makespan_ratio_at_most(1.05),
        unit=TIMES,
        extra=_makespan_and_work,
        against=PLAIN_POLLING,
    ),
    Target(
        "setup burst: >= 1.4 x faster than the original (its makespan / ours)",
        _burst,
        ratio=speedup_at_least(1.4),
        unit=TIMES,
    ),
    Target(
        "setup burst: server calls per section <= 8",
        _burst,
        at_most(lambda m: m.figure(CALLS_PER_SECTION), 8),
    ),
    Target(
        "long hold: the waiters' server calls/s together while the job holds <= 1.5",
        lambda c: c.workload == LONG_HOLD,
        held_rate_at_most(1.5),
        unit=PER_SECOND,
        extra=_busiest_waiter,
    ),
    Target(
        "long hold: from the job's release to the next grant <= 1 s",
        lambda c: c.workload == LONG_HOLD,
        release_gap_at_most(1.0),
        unit=SECONDS,
    ),
    Target(
        f"stress: grants per minute >= 0.9 x plain polling's (`{PLAIN_POLLING}`)",
        lambda c: c.workload == STRESS,
        ratio=ratio_at_least(_throughput, 0.9),
        unit=TIMES,
        extra=_grants_per_minute,
        against=PLAIN_POLLING,
    ),
)


def verdicts(summaries: Summaries) -> List[Row]:
    """Every target's rows, in the order of :data:`TARGETS`."""
    return [row for target in TARGETS for row in target.rows(summaries)]


def verdict_rows(rows: Sequence[Row]) -> List[str]:
    """The markdown table of the verdicts."""
    lines = ["| target | configuration | measured | verdict | not judged because |", "|---|---|---|---|---|"]
    for row in rows:
        mark = f"**{row.verdict}**" if row.verdict != NOT_JUDGED else row.verdict
        lines.append(f"| {row.target} | {row.cell} | {row.measured} | {mark} | {row.why} |")
    return lines
