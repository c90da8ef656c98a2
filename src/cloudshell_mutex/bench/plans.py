"""What a benchmark run measures: configurations (cells), contenders, windows and repeats.

``decide`` (the default of ``make bench``) measures the default lock's targets in windows long enough to
judge them, in about fifteen minutes on 2 cores; ``full`` is the whole matrix and takes hours; ``quick`` is
a ten-minute plan of short windows (indications, not verdicts); ``targets`` adds to it the cells of N=8
and 32 at hold 1 s and 10 s (about 45 minutes); ``smoke`` takes seconds and only shows that the pipeline
works. A plan is plain data, so tests and users can make their own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, Iterator, Sequence, Tuple

from .contenders import BASELINE, contender

#: Workloads: a driver working through a list (asks again as soon as it released), or one that
#: thinks between holds (exponential think time with mean = the hold); mixed parties (one client asks
#: again at once, the others pause one hold between holds); a stream of readers (the read side of a
#: ReservationRWLock, back to back and overlapping) that one client of the contender's lock must get past.
REACQUIRE = "reacquire"
THINK = "think"
MIXED = "mixed"
READERS = "readers"
WORKLOADS: Dict[str, str] = {
    REACQUIRE: "re-acquire at once",
    THINK: "think time (exponential, mean = hold)",
    MIXED: "mixed parties (client 0 re-acquires at once, the others pause one hold between holds)",
    READERS: "readers stream (client 0 takes the lock, pausing one hold between holds; the others read)",
}

#: The emulated server's latency for every call: lognormal, median 50 ms (a long tail of slow calls).
LATENCY: Dict[str, object] = {"distribution": "lognormal", "median": 0.05, "sigma": 0.5}

#: Waiters that started less than this many seconds apart are simultaneous for the FIFO inversions: two
#: round trips at the median latency (clients that start together cannot be ordered by the server).
FIFO_TIE = 2 * float(LATENCY["median"])  # type: ignore[arg-type]

#: The contenders of the standard plans; the baseline (original v1) first.
STANDARD_CONTENDERS = (BASELINE, "original-v2", "original-pacing", "default", "fair")
#: Uncontended (N=1) runs: the call count per acquisition with and without the release check.
UNCONTENDED_CONTENDERS = ("default", "release-check-5", "fair")

#: How long a client pauses before an acquisition: not at all, an exponential think time (mean = the
#: hold, before every acquisition), or exactly one hold after each hold (not before the first).
NO_PAUSE, THINK_PAUSE, FIXED_PAUSE = "none", "think", "fixed"


@dataclass(frozen=True)
class Role:
    """What one client does in a run: ``pause`` before each acquisition, ``offset`` seconds before the
    first, and whether it is a ``reader`` (the read side of a ReservationRWLock) or takes the run's lock."""

    pause: str = NO_PAUSE
    reader: bool = False
    offset: float = 0.0

    def pause_seconds(self, rng: random.Random, hold: float, first: bool) -> float:
        """The pause before this acquisition (``first``: the client's first in the run)."""
        if self.pause == THINK_PAUSE:
            return rng.expovariate(1.0 / hold)
        if self.pause == FIXED_PAUSE and not first:
            return hold
        return 0.0


def role(workload: str, client: int, clients: int, hold: float) -> Role:
    """The role of client ``client`` (0-based) of ``clients`` in ``workload``.

    Mixed parties: client 0 is the looper, the others pause. Readers stream: client 0 takes the run's lock
    one hold after the window opens (the read group is formed by then) and pauses one hold between holds;
    the readers start one after the other, ``hold / readers`` apart, so their reads overlap and the group
    never closes on its own.
    """
    if workload == THINK:
        return Role(THINK_PAUSE)
    if workload == MIXED and client > 0:
        return Role(FIXED_PAUSE)
    if workload == READERS:
        if client == 0:
            return Role(FIXED_PAUSE, offset=hold)
        return Role(reader=True, offset=(client - 1) * hold / (clients - 1))
    return Role()


@dataclass(frozen=True)
class Cell:
    """One configuration: ``clients`` processes holding ``hold`` s each, in ``workload``, for ``window`` s."""

    clients: int
    hold: float
    workload: str
    window: float

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"a cell needs at least 1 client, got {self.clients}")
        if not self.hold > 0 or not self.window > 0:
            raise ValueError(f"hold and window must be positive, got hold={self.hold}, window={self.window}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; use one of {', '.join(WORKLOADS)}")
        if self.workload in (MIXED, READERS) and self.clients < 2:
            raise ValueError(f"the {self.workload} workload needs at least 2 clients, got {self.clients}")

    @property
    def title(self) -> str:
        """``N=8, hold 1 s, re-acquire at once``."""
        return f"N={self.clients}, hold {self.hold:g} s, {WORKLOADS[self.workload]}"

    def role(self, client: int) -> Role:
        """What client ``client`` does in this cell."""
        return role(self.workload, client, self.clients, self.hold)

    @property
    def measured(self) -> Tuple[int, ...]:
        """The clients that take the run's lock (readers only make the others wait), in order."""
        return tuple(c for c in range(self.clients) if not self.role(c).reader)


#: A cell and the contenders to run in it.
Group = Tuple[Cell, Tuple[str, ...]]

#: Seconds a run costs beyond its window (handing it out, the last release, collecting the reports), and
#: seconds per client process to start it and warm it up: measured on 2 cores (a quick and budget run,
#: 92 runs and 32 processes, took 70 s beyond its windows).
RUN_OVERHEAD = 0.75
CLIENT_STARTUP = 0.5


@dataclass(frozen=True)
class Plan:
    """Cells, each with the contenders to run in it, how often to repeat every run, and the cells run
    ``once`` (in the first repeat: cells judged on every run alone, or shown beside the others)."""

    name: str
    groups: Tuple[Group, ...]
    repeats: int
    once: Tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        for _, names in self.groups + self.once:
            for name in names:
                contender(name)  # fails early, naming the known contenders

    def runs(self) -> Iterator[Tuple[int, Cell, str]]:
        """(repeat, cell, contender) in running order: every repeat goes through all the cells, so slow
        drift of the machine spreads over all contenders instead of hitting one."""
        for repeat in range(self.repeats):
            for cell, names in self.groups + (self.once if repeat == 0 else ()):
                for name in names:
                    yield repeat, cell, name

    @property
    def run_count(self) -> int:
        """How many runs the plan makes."""
        return self.repeats * sum(len(names) for _, names in self.groups) + sum(
            len(names) for _, names in self.once
        )

    @property
    def max_clients(self) -> int:
        """The most client processes any cell needs."""
        return max(cell.clients for cell, _ in self.groups + self.once)

    def estimated_seconds(
        self, per_run_overhead: float = RUN_OVERHEAD, per_client: float = CLIENT_STARTUP
    ) -> float:
        """Measuring time plus a per-run overhead and the client processes' start."""
        measuring = sum(cell.window + per_run_overhead for _, cell, _ in self.runs())
        return measuring + per_client * self.max_clients


def matrix(
    clients: Sequence[int],
    holds: Sequence[float],
    windows: Dict[float, float],
    contenders: Sequence[str] = STANDARD_CONTENDERS,
    workloads: Sequence[str] = (REACQUIRE, THINK),
) -> Tuple[Group, ...]:
    """Every combination of ``clients`` x ``holds`` x ``workloads``, each with ``contenders``."""
    return tuple(
        (Cell(n, hold, workload, windows[hold]), tuple(contenders))
        for hold in holds
        for workload in workloads
        for n in clients
    )


def _uncontended(window: float, contenders: Sequence[str] = UNCONTENDED_CONTENDERS) -> Tuple[Group, ...]:
    return ((Cell(1, 0.1, REACQUIRE, window), tuple(contenders)),)


#: The contenders of the decide plan's ratio cells: the baseline and the default lock.
DECIDE_CONTENDERS = (BASELINE, "default")


def _group(clients: int, hold: float, workload: str, window: float, *names: str) -> Group:
    return (Cell(clients, hold, workload, window), names)


#: The decide plan (``make bench``). Twice, the cells that judge a ratio against the original, each window
#: holding enough grants for its verdict: 30 s at hold 1 s, 38 s at N=8 re-acquiring (three grants per
#: client, which the starvation target needs) and at N=32 (a round of the queue: about a grant per client),
#: 12 s at hold 0.1 s (the queue grants about two a second there). Once: the
#: uncontended cycle, mixed parties (60 s), the readers stream
#: (15 s: several tries of the lock, or one wait already far over its limit) and N=32 at hold 10 s (60 s:
#: six hand-offs, so the arrival of all 32 is not the whole window). N=32 with think time is left to the
#: full plan: with it this plan would take about 18 minutes.
DECIDE = Plan(
    "decide",
    (
        _group(2, 1.0, REACQUIRE, 30.0, *DECIDE_CONTENDERS),
        _group(8, 1.0, REACQUIRE, 38.0, *DECIDE_CONTENDERS),
        _group(2, 1.0, THINK, 30.0, *DECIDE_CONTENDERS),
        _group(8, 1.0, THINK, 30.0, *DECIDE_CONTENDERS),
        _group(32, 1.0, REACQUIRE, 40.0, *DECIDE_CONTENDERS),
        _group(8, 0.1, REACQUIRE, 12.0, *DECIDE_CONTENDERS),
    ),
    repeats=2,
    once=(
        _group(1, 0.1, REACQUIRE, 6.0, "default"),
        _group(4, 1.0, MIXED, 60.0, "default"),
        _group(4, 1.0, READERS, 15.0, "default"),
        _group(32, 10.0, REACQUIRE, 60.0, "default"),
    ),
)

QUICK = Plan(
    "quick",
    _uncontended(4.0) + matrix(clients=(2, 8), holds=(0.1, 1.0), windows={0.1: 4.0, 1.0: 8.0}),
    repeats=2,
)

FULL = Plan(
    "full",
    # N=1 is in the matrix (with "default"); the same cell adds the release-check variant.
    _uncontended(30.0, ("release-check-5",))
    + matrix(
        clients=(1, 2, 8, 32),
        holds=(0.1, 1.0, 10.0),
        windows={0.1: 30.0, 1.0: 60.0, 10.0: 240.0},
        contenders=(*STANDARD_CONTENDERS, "plain"),
    )
    + (
        _group(4, 1.0, MIXED, 60.0, BASELINE, "default", "plain", "fair"),
        _group(4, 1.0, READERS, 60.0, "default", "plain", "fair"),
    ),
    repeats=2,
)

#: The contenders of the targets plan: the baseline, the default and the fair mode.
TARGET_CONTENDERS = (BASELINE, "default", "fair")

#: The cells of N=8 and 32 at hold 1 s and 10 s that the quick plan leaves out or measures in windows too
#: short for them, for the baseline, the default and the fair mode, once, with shorter windows than the
#: full plan: about 45 minutes.
TARGETS = Plan(
    "targets",
    matrix(clients=(8, 32), holds=(1.0,), windows={1.0: 40.0}, contenders=TARGET_CONTENDERS)
    + matrix(clients=(8, 32), holds=(10.0,), windows={10.0: 150.0}, contenders=TARGET_CONTENDERS),
    repeats=1,
)

#: The per-lock call budget's cell (N=32, hold 1 s) for the baseline, the default and the fair mode, once: a
#: few minutes, where the targets plan takes most of an hour (``make bench BENCH=quick,budget``).
BUDGET = Plan(
    "budget",
    matrix(clients=(32,), holds=(1.0,), windows={1.0: 40.0}, contenders=TARGET_CONTENDERS),
    repeats=1,
)

#: Seconds, not minutes: checks that the whole pipeline works here (the tests run it), measures little.
SMOKE = Plan(
    "smoke",
    _uncontended(2.0, ("default",))
    + matrix(
        clients=(2,),
        holds=(0.1,),
        windows={0.1: 3.0},
        contenders=(BASELINE, "default", "fair"),
        workloads=(REACQUIRE,),
    ),
    repeats=1,
)

PLANS: Dict[str, Plan] = {p.name: p for p in (DECIDE, QUICK, FULL, TARGETS, BUDGET, SMOKE)}
