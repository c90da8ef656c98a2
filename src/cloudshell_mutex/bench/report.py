"""The benchmark's report: the verdicts, a table per configuration (the sites' finite workloads with
tables of their own: makespans, the waiters' calls while a job holds), the fair mode's targets, noise, plots.

Everything here works on :class:`~.runner.RunResult` lists (no I/O but writing the files), so tests can
feed it synthetic results. The repeats are summarised in :mod:`.summary`, the default lock's targets judged
in :mod:`.verdicts`. Plots need matplotlib (the ``dev`` extra); it is imported only to draw them.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..demo.__main__ import SECTION_END as DEMO_END
from ..demo.__main__ import SECTION_START as DEMO_START
from ..lock.queue import tickets
from . import sections
from .contenders import BASELINE, CONTENDERS, PLAIN_POLLING
from .metrics import (
    HELD_CALLS_PER_SECOND_MAX,
    UNFINISHED,
    WORK,
    RunMetrics,
    held_calls_per_second_of,
)
from .plans import (
    BURSTS,
    FIFO_TIE,
    JOB_CONTENDER,
    LATENCY,
    LONG_HOLD,
    REACQUIRE,
    SETUP_BURST_A,
    SETUP_BURST_B,
    THINK,
    WAITER_HOLD,
    WAITER_START,
    WORKLOADS,
    Cell,
    Plan,
)
from .runner import RunResult
from .summary import (
    SHORT_WORKLOADS,
    Metric,
    Summaries,
    Summary,
    calls_by_method,
    calls_per_acquisition,
    calls_per_second,
    calls_per_section,
    fairness,
    gap_p50,
    held_calls_per_second,
    inverted_share,
    longest_windows,
    makespan,
    number,
    paired,
    ratio,
    release_gap,
    short,
    summarise,
    throughput,
    wait_max,
    wait_p50,
    wait_p99,
)
from .verdicts import RULES, verdict_rows, verdicts

MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"

#: The fair mode's starvation target is judged only on runs whose mean client got this many grants.
MIN_GRANTS_FOR_FAIRNESS = 4


# ---------------------------------------------------------------- the fair mode's targets


@dataclass(frozen=True)
class Verdict:
    """One of the fair mode's targets, what was measured, and whether it was met."""

    target: str
    measured: str
    verdict: str


def _verdict(target: str, parts: Sequence[Tuple[str, Optional[bool]]]) -> Verdict:
    """Met when every judged part is, missed when one is not; parts judged None are only named."""
    if not parts:
        return Verdict(target, "not in the plans run (BENCH=quick,targets or BENCH=full)", NOT_MEASURED)
    judged = [ok for _, ok in parts if ok is not None]
    verdict = NOT_MEASURED if not judged else MET if all(judged) else MISSED
    return Verdict(target, "; ".join(text for text, _ in parts), verdict)


def wait_p99_censored(summary: Summary) -> bool:
    """More than 1 % of the waits were still open at the window's end: the p99 may be a lower bound."""
    return any(m.wait.open > 0.01 * m.wait.count for m in summary.runs)


#: The fair mode's targets: at most this share of grants overtakes an earlier waiter ...
FAIR_MAX_INVERTED = 0.05
#: ... and the p99 wait is at most this many times N x hold (a FIFO queue waits about (N - 1) holds).
FAIR_WAIT_FACTOR = 1.5
#: The per-lock call budget (calls/s on the server for one lock, all clients together) at N=32, and the API
#: calls one contended fair acquisition costs whatever the polling: the floor under the fair mode's calls/s.
LOCK_BUDGET = tickets.LOCK_BUDGET
FAIR_ACQUISITION_CALLS = tickets.ACQUISITION_CALLS


FAIR_TEXT = """\
`ReservationMutex(fair=True)` (docs/protocol.md, "Fair mode"), judged on its contended runs. The call
budget is per lock: every client's calls on the server together. One contended fair acquisition costs
at least {calls} calls (the add that found the lock busy, a read, the ticket's add, the granted add, the
ticket's remove, the release's read and remove), so at g grants/s no polling policy gets below
{calls} x g calls/s: with holds of 1 s that floor alone is above {budget:g}/s; it is under the budget only
with holds of about 1.5 s and more. The figure in brackets is that floor for the run's own
throughput. Inversions count every grant, the first round included; clients that start within {tie:g} s
of each other are simultaneous (the server queues them in whatever order their tickets reach it).
"""


def fair_targets(summaries: Summaries, name: str = "fair") -> List[Verdict]:
    """The fair mode's targets, judged on ``name``'s contended runs: FIFO inversions, p99 wait against
    N x hold, no starvation, and the same per-lock call budget as the default (with the floor that its
    acquisitions alone put under the calls/s, so a miss says whether polling or the hold time is why)."""
    contended = longest_windows(summaries, name, lambda c: c.clients > 1)
    inversions = [
        (
            f"{short(s.cell)}: {100 * s.spread(inverted_share)[1]:.0f} %",
            s.spread(inverted_share)[1] <= FAIR_MAX_INVERTED,
        )
        for s in contended
        if s.values(inverted_share)
    ]
    waits: List[Tuple[str, Optional[bool]]] = []
    for s in contended:
        limit = FAIR_WAIT_FACTOR * s.cell.clients * s.cell.hold
        worst = s.spread(wait_p99)[1]
        if math.isnan(worst):
            continue
        ok: Optional[bool] = worst <= limit
        text = f"{short(s.cell)}: {number(worst)} s (limit {number(limit)} s)"
        if ok and wait_p99_censored(s):
            ok, text = None, text + " (open waits at the window's end: not judged)"
        elif not ok and s.cell.window < limit:
            ok, text = None, text + " (the window is shorter than the limit: not judged)"
        waits.append((text, ok))
    starvation = []
    for s in contended:
        judged = [m.fairness for m in s.runs if m.grants >= MIN_GRANTS_FOR_FAIRNESS * m.clients]
        if judged:
            starvation.append((f"{short(s.cell)}: {min(judged):.2f}", min(judged) >= 0.5))
    rate = []
    for s in longest_windows(summaries, name, lambda c: c.clients == 32):
        worst = max(s.runs, key=lambda m: m.calls_per_second)
        floor = FAIR_ACQUISITION_CALLS * worst.grants / worst.window_seconds
        rate.append(
            (
                f"{short(s.cell)}: {worst.calls_per_second:.1f}/s (its {worst.grants} acquisitions alone: "
                f"{floor:.1f}/s)",
                worst.calls_per_second <= LOCK_BUDGET,
            )
        )
    return [
        _verdict(f"FIFO inversions <= {100 * FAIR_MAX_INVERTED:.0f} % of grants (every run)", inversions),
        _verdict(f"p99 wait <= {FAIR_WAIT_FACTOR:g} x N x hold (every run)", waits),
        _verdict("no client starves: min grants per client >= 0.5 x the mean (every run)", starvation),
        _verdict(f"server calls/s for one lock <= {LOCK_BUDGET:g} at N=32 (every run)", rate),
    ]


# ---------------------------------------------------------------- formatting


def _value(summary: Summary, metric: Metric) -> str:
    """``median`` or ``median (min-max)`` over the repeats."""
    median = summary.median(metric)
    low, high = summary.spread(metric)
    if len(summary.values(metric)) < 2 or low == high:
        return number(median)
    return f"{number(median)} ({number(low)}-{number(high)})"


def _ratio_text(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def cell_table(summaries: Summaries, cell: Cell) -> List[str]:
    """The markdown table of one configuration: a row per contender."""
    rows = [
        "| contender | acquisitions/min | wait p50 s | wait p99 s | wait max s | hand-off gap p50 s | "
        "calls/acquisition | by method | calls/s | grants per client (min-max, fairness) | "
        "inverted grants | vs original v1: throughput, p99 wait, gap p50 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (c, name), s in summaries.items():
        if c != cell:
            continue
        open_waits = sum(m.wait.open for m in s.runs)
        low = min(m.min_grants for m in s.runs)
        high = max(m.max_grants for m in s.runs)
        worst = min(s.values(fairness), default=math.nan)
        vs = (
            "baseline"
            if name == BASELINE
            else ", ".join(
                _ratio_text(ratio(summaries, cell, name, f)) for f in (throughput, wait_p99, gap_p50)
            )
        )
        label = f"{name} *(original code)*" if CONTENDERS[name].original else name
        if s.ran_without_lock:
            label += f" ({s.ran_without_lock} ran without the lock)"
        rows.append(
            f"| {label} | {_value(s, throughput)} | {_value(s, wait_p50)} | {_value(s, wait_p99)} | "
            f"{_value(s, wait_max)}{f' ({open_waits} open)' if open_waits else ''} | {_value(s, gap_p50)} | "
            f"{_value(s, calls_per_acquisition)} | {calls_by_method(s)} | {_value(s, calls_per_second)} | "
            f"{low}-{high}, {number(worst)} | {_value(s, inverted_share)} | {vs} |"
        )
    return rows


def _label(summary: Summary) -> str:
    label = (
        f"{summary.contender} *(original code)*"
        if CONTENDERS[summary.contender].original
        else summary.contender
    )
    if summary.ran_without_lock:
        label += f" ({summary.ran_without_lock} ran without the lock)"
    return label


def _spread(values: Sequence[float], suffix: str = "") -> str:
    """``median (min-max)`` of some values (NaNs left out; "-" when none)."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "-"
    median, low, high = statistics.median(known), min(known), max(known)
    text = f"{number(median)}{suffix}"
    return text if len(known) < 2 or low == high else f"{text} ({number(low)}-{number(high)})"


def _over(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def burst_table(summaries: Summaries, cell: Cell) -> List[str]:
    """The markdown table of a setup burst: a row per contender, its makespans, and the ratios taken
    repeat by repeat (the same work) against plain polling and the original."""
    rows = [
        "| contender | makespan s | work s | sections undone at the cap | calls/section | by method | "
        "wait p50 s | wait max s | makespan / plain polling's | the original's makespan / this |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (c, name), s in summaries.items():
        if c != cell:
            continue
        undone = sum(int(m.figure(UNFINISHED)) for m in s.runs if not math.isnan(m.figure(UNFINISHED)))
        vs_plain = (
            "-"
            if name == PLAIN_POLLING
            else _spread(paired(summaries, cell, name, PLAIN_POLLING, _over, makespan), "x")
        )
        vs_base = (
            "-"
            if name == BASELINE
            else _spread(paired(summaries, cell, BASELINE, name, _over, makespan), "x")
        )
        rows.append(
            f"| {_label(s)} | {_value(s, makespan)} | {_spread([m.figure(WORK) for m in s.runs])} | "
            f"{undone} | {_value(s, calls_per_section)} | {calls_by_method(s)} | {_value(s, wait_p50)} | "
            f"{_value(s, wait_max)} | {vs_plain} | {vs_base} |"
        )
    return rows


def long_hold_table(summaries: Summaries, cell: Cell) -> List[str]:
    """The markdown table of the long hold: a row per contender, its waiters' calls while the job held and
    the gap after the job's release."""
    waiters = range(1, cell.clients)
    rows = [
        "| contender | runs | waiters' calls/s together while held | each waiter's (median over the runs) | "
        "the busiest waiter's | release to the next grant s | the waiters' wait p50 s | calls per grant |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (c, _), s in summaries.items():
        if c != cell:
            continue
        each = ", ".join(_spread([m.figure(held_calls_per_second_of(w)) for m in s.runs]) for w in waiters)
        rows.append(
            f"| {_label(s)} | {len(s.runs)} | {_value(s, held_calls_per_second)} | {each} | "
            f"{_spread([m.figure(HELD_CALLS_PER_SECOND_MAX) for m in s.runs])} | {_value(s, release_gap)} | "
            f"{_value(s, wait_p50)} | {_value(s, calls_per_acquisition)} ({calls_by_method(s)}) |"
        )
    return rows


def configuration_table(summaries: Summaries, cell: Cell) -> List[str]:
    """The table of ``cell``: a burst's, the long hold's, or the one of the windowed cells."""
    if cell.workload in BURSTS:
        return burst_table(summaries, cell)
    if cell.workload == LONG_HOLD:
        return long_hold_table(summaries, cell)
    return cell_table(summaries, cell)


def _windowed(metric: Metric) -> Metric:
    """``metric`` of windowed runs only: a finite run's rates and waits are of its schedule, not of a
    steady state, and have noise rows of their own."""

    def value(m: RunMetrics) -> float:
        return math.nan if m.figures else metric(m)

    return value


NOISE_METRICS: Tuple[Tuple[str, Metric], ...] = (
    ("acquisitions/min", _windowed(throughput)),
    ("wait p50", _windowed(wait_p50)),
    ("wait p99", _windowed(wait_p99)),
    ("hand-off gap p50", _windowed(gap_p50)),
    ("calls/acquisition", _windowed(calls_per_acquisition)),
    ("calls/s", _windowed(calls_per_second)),
    ("setup burst: makespan", makespan),
    ("setup burst: calls/section", calls_per_section),
    ("long hold: waiters' calls/s while held", held_calls_per_second),
)


def noise(summaries: Summaries) -> List[Tuple[str, float, float, int]]:
    """Per metric: the median and the largest relative spread ((max - min) / median) over the repeats."""
    rows = []
    for label, metric in NOISE_METRICS:
        spreads = []
        for s in summaries.values():
            values = s.values(metric)
            median = s.median(metric)
            if len(values) >= 2 and median > 0:
                spreads.append((max(values) - min(values)) / median)
        if spreads:
            rows.append((label, statistics.median(spreads), max(spreads), len(spreads)))
    return rows


# ---------------------------------------------------------------- plots

PLOTS: Tuple[Tuple[str, str, Metric, bool], ...] = (
    ("wait_p99.png", "p99 wait (s)", wait_p99, True),
    ("handoff_gap_p50.png", "hand-off gap p50 (s)", gap_p50, True),
    ("calls_per_second.png", "server API calls/s", calls_per_second, False),
)


def plot(summaries: Summaries, folder: Path) -> List[Path]:
    """Draw each metric of :data:`PLOTS` against N (a panel per workload and hold); return the files."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = _plotted(summaries)  # the contenders that ran against each other (N > 1)
    compared = [
        cell
        for cell in dict.fromkeys(c for c, _ in summaries)
        if sum((cell, n) in summaries for n in names) > 1
    ]
    # The panels are the windowed workloads against N; the others have tables of their own.
    contested = {
        key: s
        for key, s in summaries.items()
        if key[1] in names and key[0] in compared and key[0].workload in (REACQUIRE, THINK)
    }
    holds = sorted({cell.hold for cell, _ in contested})
    workloads = [w for w in (REACQUIRE, THINK) if any(cell.workload == w for cell, _ in contested)]
    if not contested:
        return []  # nothing to plot against N (a plan of the sites' workloads alone)
    written = []
    for filename, label, metric, log_scale in PLOTS:
        figure, axes = plt.subplots(
            len(workloads),
            len(holds),
            figsize=(max(7.0, 4.2 * len(holds)), 3.4 * len(workloads)),
            squeeze=False,
        )
        ticks = sorted({cell.clients for cell, _ in contested})
        for row, workload in enumerate(workloads):
            for column, hold in enumerate(holds):
                ax = axes[row][column]
                for name in names:
                    # One point per N: of a configuration run in several windows, the longest.
                    chosen = longest_windows(
                        contested, name, lambda c, h=hold, w=workload: c.hold == h and c.workload == w
                    )
                    points = sorted(
                        ((s.cell.clients, s) for s in chosen if not math.isnan(s.median(metric))),
                        key=lambda point: point[0],
                    )
                    if not points:
                        continue
                    xs = [n for n, _ in points]
                    ys = [s.median(metric) for _, s in points]
                    lows = [y - s.spread(metric)[0] for y, (_, s) in zip(ys, points)]
                    highs = [s.spread(metric)[1] - y for y, (_, s) in zip(ys, points)]
                    # One colour per contender in every panel, whichever contenders a panel has.
                    colour = f"C{names.index(name) % 10}"
                    ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=name, color=colour)
                ax.set_xscale("log", base=2)
                ax.set_xticks(ticks)
                ax.set_xticklabels([str(n) for n in ticks])
                ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
                if log_scale:
                    ax.set_yscale("log")
                ax.set_title(f"hold {hold:g} s, {WORKLOADS[workload].split(' (')[0]}", fontsize=9)
                ax.set_xlabel("N (processes)")
                ax.set_ylabel(label)
                ax.grid(True, which="both", alpha=0.3)
        # The legend from every panel: a contender missing from the first panel is still named.
        legend: Dict[str, object] = {}
        for ax in axes.flat:
            for handle, label_text in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label_text, handle)
        labels = [name for name in names if name in legend]
        handles = [legend[name] for name in labels]
        figure.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
        figure.suptitle(f"{label} against N: median of the repeats, bars min-max", fontsize=10)
        figure.tight_layout(rect=(0, 0.06, 1, 0.95))
        path = folder / filename
        figure.savefig(path, dpi=90, metadata={"Software": None})
        plt.close(figure)
        written.append(path)
    return written


def _plotted(summaries: Summaries) -> List[str]:
    names: List[str] = []
    for cell, name in summaries:
        if cell.clients > 1 and name not in names:
            names.append(name)
    return names


# ---------------------------------------------------------------- the document

METHOD = """\
## How it is measured

* **Server:** the embedded emulator (`cloudshell_mutex.emulator`) on loopback, with the original 2017
  package's model (`Mutex Service` with `Mutex Owner` only), so every contender runs on the same model.
  Every call waits a latency drawn from {latency}; a change becomes visible halfway through it.
* **Clients:** N separate OS processes (multiprocessing "spawn"), each with its own `CloudShellAPISession`
  logged on as its own user, so the server's event log names the client of every grant. The processes
  are started once and reused by every run; each takes and releases a lock once before the first run, so
  the lock's once-per-process catalog read is not measured. Every run has a fresh reservation.
* **Workloads:** *re-acquire at once* (a driver working through a list: it asks again the moment it
  released) and *think time* (between holds a client waits an exponential time with mean = the hold).
  *Mixed parties:* client 0 re-acquires at once, the others pause one hold between holds, all with the
  same contender. *Readers stream:* the other clients hold the read side of a `ReservationRWLock`
  (default options) back to back, starting one after the other so that their reads overlap; client 0
  takes the contender's lock one hold into the window and again one hold after each release. Only client
  0's waits and grants are its figures (the readers' group adds `MUTEX` too, but that is no grant of the
  lock under test). A hold is a sleep of the configured length; the window's end cuts the last hold short.
* **The sites' workloads.** Each repeat hands every contender the same seed, so each gets exactly the
  same work (the same offsets, holds and think times) and their figures compare repeat by repeat. A setup
  burst and the long hold end when their work is done; their cap only bounds a run that never finishes.
  * *Setup bursts:* N drivers start within {spread:g} s of each other (uniform offsets); each runs its
    sections with a lognormal hold (median the configuration's hold, sigma {sigma:g}) and an exponential
    think time between them. Shape A: {a_sections} sections, think mean {a_think:g} s.
    Shape B: {b_sections} sections, think mean {b_think:g} s.
    **Makespan:** from the first driver's first acquire to the last section's release on the server;
    **work:** the sum of the holds (no lock can finish the burst in less); **calls/section:** the
    server's calls of the run per section granted.
  * *Long hold:* a job takes the lock (the `{job}` lock whatever the contender, so every contender's
    waiters face the same holder) and holds it for the configuration's hold; the other clients, the
    contender's waiters, start {start_low:g}-{start_high:g} s into the hold and each wants the lock once,
    for {waiter_hold:g} s. **Waiters' calls/s while held:** the API calls the waiters' sessions sent (each
    client notes its own: the server counts calls per method, not per client) from their starts to the
    job's release, over the time from the first start to the release; each waiter's from its own start.
    **Release to the next grant:** from the job's remove to the next add the server committed. The plans
    run the long hold's runs together, each on its own reservation with its own clients: they sleep most
    of a minute, and one minute serves them all.
  * *Stress:* the shape of `make stress` (many processes, short holds, asking again almost at once)
    without its faults, kills, pauses, original-protocol peers and shared counter: holds uniform between
    half and twice the configuration's hold, an exponential think time with mean = the hold, a window;
    its figure is the grants per minute, against plain polling's.
* **Contenders:** {contenders}
* **Where the figures come from.** Grants are the server's `service_added` events of the alias and
  releases its `service_removed` events, with the server's `monotonic` time (one system-wide clock on
  one machine, so it compares with the clients'). Only *when a client started waiting* comes from the
  client. Call counts are the server's, reset just before the window opens and read when it closes.
  * **acquisitions/min:** grants in the window per minute.
  * **wait:** from the acquire call to the server's grant; a client's k-th grant answers its k-th
    acquire. Waits still open at the window's end count with their length so far (a lower bound:
    "open"), so starving a waiter never looks good.
  * **hand-off gap:** a release while someone waits, to the next grant (an open one counts to the
    window's end).
  * **calls/acquisition:** the server's calls in the window per grant, also by method; **calls/s:**
    the server's calls per second for this one lock (with a readers stream, the readers' calls too).
  * **grants per client:** lowest and highest over the clients and repeats; fairness = min / mean
    (the worst repeat).
  * **inverted grants:** share of grants that went to a client while one that started waiting
    earlier still waited (FIFO inversions); waiters that started less than {tie:g} s apart (two
    round trips at the median latency) count as simultaneous.
* Cells are `median (min-max)` over the repeats. Ratios are medians over the baseline's median, the
  baseline being the original v1 snippet: a throughput ratio above 1 and wait and gap ratios below 1
  favour the contender.
* **Code:** `src/cloudshell_mutex/bench/`. A contender is a name and a factory of the lock object
  (`contenders.py`); to compare another variant (a fair mode, a per-lock call budget), add it there and
  name it in a plan (`plans.py`).

## What shapes the results (from the code, not from this run)

* **Re-acquire at once favours the releaser of a polling lock.** A client that releases asks again one
  round trip later, while the others sleep between polls (plain polling, `fair=False`: two quick retries
  after 0.05 s, then jittered delays up to 1 s; the original: 2-5 s). Nothing queues their waiters, so
  in this workload whoever released last usually wins again; the think-time workload shows the lock
  without that advantage, and mixed parties show what it costs the clients that pause.
* **The original v2 stalls.** After its own successful add it reads the *cached* reservation details,
  which under contention still show the previous owner: it believes it lost while holding `MUTEX`, then
  retries its own alias, which keeps failing, until it gives up (100 tries, minutes) and runs without the
  lock. Its runs show a few grants and then none, with everyone else waiting.
* **Polling costs server calls.** Every waiter of plain polling polls on its own (at most 5 calls/s
  per process, its call budget, which is not shared across processes): the server's calls/s grow with N.
  The original polls every 2-5 s: few calls, long waits.
* **The queue.** Waiters of the fair mode (`fair=True`) take numbered ticket services; only the head
  polls the lock's add, the others read the reservation more rarely the further back they are, and a
  releaser that asks again queues behind those already waiting. That makes grants FIFO and the server's
  calls/s nearly independent of N, at the price of a longer hand-off gap than plain polling's (the next
  waiter learns that it is the head only at its next read) and of the queue's own calls (a ticket's add
  and remove per contended acquisition).
* **A burst's makespan is its work plus its hand-offs.** The holds cannot overlap, so a burst takes at
  least the sum of its holds; what a lock adds is the time from each release to the next grant, and the
  waits of drivers that arrive while the lock is free. The original's waiters sleep 2-5 s between tries,
  so once few drivers are left the lock often lies free; a long hold shows the other side: how often
  waiters ask while nothing can change.
* **The release reads before it removes.** The lock's release removes `MUTEX` only after a read shows it
  is still its own (docs/protocol.md says why it must); the original removes at once. The remove waits
  for that round trip, and so does the next holder: at short holds it is a good part of every cycle.
  `release-check-5` (`release_check_after=5`) skips the read on a hold confirmed within 5 s; the decide
  plan runs it beside the default lock at hold 0.1 s, and the difference is what the read costs.
"""


def render(
    results: Sequence[RunResult], plans: Sequence[Plan], seconds: float, plots: Sequence[Path], doc: Path
) -> str:
    """The whole markdown document."""
    summaries = summarise(results)
    names = " and ".join(f"**{plan.name}**" for plan in plans)
    repeats = ", ".join(f"{plan.name} {plan.repeats}" for plan in plans)
    series = {(s.cell, name) for plan in plans for s in plan.series for name in s.contenders}
    once = sum(len(s.runs) == 1 for key, s in summaries.items() if key not in series)
    if once and max(plan.repeats for plan in plans) > 1:
        repeats += f", except {once} run{'s' if once > 1 else ''} made once"
    counts = dict.fromkeys(
        f"{SHORT_WORKLOADS[s.cell.workload]} {s.repeats} ({', '.join(s.contenders)})"
        for plan in plans
        for s in plan.series
    )
    if counts:
        repeats += "; the sites' workloads: " + ", ".join(counts)
    lines = [
        "# Benchmarks against the original code",
        "",
        "Written by `make bench` (`python -m cloudshell_mutex.bench`); do not edit by hand, run it again.",
        "",
        f"This one: the {names} plan{'s' if len(plans) > 1 else ''} (repeats of every run: {repeats}), "
        f"{len(results)} runs in {seconds / 60:.1f} min, on {os.cpu_count()} cores, "
        f"Python {platform.python_version()} ({platform.system()}); the raw results are saved "
        "beside the plots as `results.json` (`python -m cloudshell_mutex.bench --from-results PATH` writes "
        "this page again from them).",
        "",
        "* `make bench`: the decide plan (about 25 minutes): the default lock's targets in windows long",
        "  enough to judge them, against the original twice each, with mixed parties and a readers stream",
        "  (`BENCH=full` runs plain polling, `fair=False`, beside them); then the workloads sites run",
        "  (setup bursts, a job's long hold, the stress run's throughput) against plain polling and the",
        "  original in the same run. `python -m cloudshell_mutex.bench --plan site` runs those alone (about",
        "  ten minutes). Then the stalls (`python -m cloudshell_mutex.bench.stalls`, about 16 minutes; the",
        "  section near the end of this page): dead, slow and unlucky parties, against `fair=False`.",
        "* `make bench BENCH=full`: the whole matrix (N = 1, 2, 8, 32; hold 0.1, 1, 10 s; every contender;",
        "  hours), then the cohort and the readers-and-writers benchmarks.",
        "* `make bench BENCH=quick`: short windows in ten minutes (indications, not verdicts);",
        "  `BENCH=quick,targets` adds N=8 and 32 at hold 1 s and 10 s (about 45 minutes).",
        "",
        "These are emulator figures: a real server's latency and load will change them, and the client",
        "processes share the machine's cores with the emulator, so large N also measure a busy machine.",
        "",
        "## Verdicts for the default lock",
        "",
        RULES.rstrip(),
        "",
        *verdict_rows(verdicts(summaries)),
        "",
        METHOD.format(
            latency=_latency_text(),
            tie=FIFO_TIE,
            spread=BURSTS[SETUP_BURST_A].spread,
            sigma=BURSTS[SETUP_BURST_A].sigma,
            a_sections=BURSTS[SETUP_BURST_A].sections,
            a_think=BURSTS[SETUP_BURST_A].think,
            b_sections=BURSTS[SETUP_BURST_B].sections,
            b_think=BURSTS[SETUP_BURST_B].think,
            job=JOB_CONTENDER,
            start_low=WAITER_START[0],
            start_high=WAITER_START[1],
            waiter_hold=WAITER_HOLD,
            contenders="; ".join(
                f"`{c.name}`: {c.description}"
                for c in CONTENDERS.values()
                if any(c.name == n for _, n in summaries)
            )
            + ". The original's code runs as it was, with its `randint(2, 5)` second sleeps between tries: "
            "that is the original code's behaviour, not a setting of this benchmark.",
        ).rstrip(),
    ]
    if any(name == "fair" for _, name in summaries):
        lines += [
            "",
            "## Targets for the fair mode",
            "",
            FAIR_TEXT.format(calls=FAIR_ACQUISITION_CALLS, budget=LOCK_BUDGET, tie=FIFO_TIE).rstrip(),
            "",
            *verdict_table(fair_targets(summaries)),
        ]
    lines += ["", "## How noisy the figures are", ""]
    rows = noise(summaries)
    if rows:
        lines += [
            "Relative spread of a figure over the repeats of one contender in one configuration, "
            "(max - min) / median, over all configurations:",
            "",
            "| figure | median spread | largest spread | configurations |",
            "|---|---|---|---|",
        ]
        lines += [f"| {label} | {100 * m:.0f} % | {100 * x:.0f} % | {n} |" for label, m, x, n in rows]
        lines += [
            "",
            "Short windows hold few grants when holds are long, so their p99 is close to their maximum and",
            "moves with a single slow hand-off: the quick plan's ratios are indications; the decide plan's",
            "windows are sized for its verdicts, which say where the repeats disagree.",
        ]
    else:
        lines.append("One repeat per run: no spread to report. Run with more repeats to see the noise.")
    lines += ["", "## Results per configuration", ""]
    for cell in dict.fromkeys(cell for cell, _ in summaries):
        count = max(len(s.runs) for (c, _), s in summaries.items() if c == cell)
        span = f"cap {cell.window:g} s" if cell.finite else f"{cell.window:g} s window"
        heading = f"### {cell.title} ({span}, {count} repeat{'s' if count > 1 else ''})"
        lines += [heading, "", *configuration_table(summaries, cell), ""]
    if plots:
        lines += ["## Plots", ""]
        for path in plots:
            relative = os.path.relpath(path, doc.parent).replace(os.sep, "/")
            lines += [f"![{path.stem.replace('_', ' ')}]({relative})", ""]
    return "\n".join(lines).rstrip() + "\n"


def verdict_table(verdicts: Sequence[Verdict]) -> List[str]:
    """The markdown table of some targets' verdicts."""
    rows = ["| target | measured | verdict |", "|---|---|---|"]
    for verdict in verdicts:
        mark = {"met": "**met**", "missed": "**missed**"}.get(verdict.verdict, verdict.verdict)
        rows.append(f"| {verdict.target} | {verdict.measured} | {mark} |")
    return rows


def _latency_text() -> str:
    parameters = ", ".join(
        f"{k} {1000 * float(v):g} ms" if k in ("median", "mean", "low", "high", "seconds") else f"{k} {v}"
        for k, v in LATENCY.items()
        if k != "distribution"
    )
    return f"a {LATENCY['distribution']} distribution ({parameters})"


def kept_sections(document: str) -> str:
    """The sections of ``document`` that other benches wrote (cohort.py, rwmix.py, stalls.py, the demo),
    markers included, in the page's order."""
    markers = (sections.COHORT, sections.RWMIX, sections.STALLS, (DEMO_START, DEMO_END))
    return "\n".join(found for found in (sections.section_of(document, m) for m in markers) if found)


def write_report(
    results: Sequence[RunResult],
    plans: Sequence[Plan],
    seconds: float,
    doc: Path,
    plots_folder: Optional[Path],
) -> List[Path]:
    """Write the markdown document (and the plots, unless ``plots_folder`` is None); return the files."""
    plots = plot(summarise(results), plots_folder) if plots_folder is not None else []
    doc.parent.mkdir(parents=True, exist_ok=True)
    # The cohort, readers-and-writers and stalls benches and the demo write their own sections: keep them.
    kept = kept_sections(doc.read_text(encoding="utf-8")) if doc.exists() else ""
    text = render(results, plans, seconds, plots, doc)
    doc.write_text(text + ("\n" + kept if kept else ""), encoding="utf-8")
    return [doc, *plots]
