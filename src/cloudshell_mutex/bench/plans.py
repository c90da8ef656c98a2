"""What a benchmark run measures: configurations (cells), contenders, windows and repeats.

``quick`` (the default of ``make bench``) runs in about ten minutes on 2 cores; ``full`` is the whole matrix
and takes hours; ``targets`` adds to ``quick`` the cells of the lock's targets (docs/benchmarks.md) that it
leaves out (about 45 minutes); ``smoke`` takes seconds and only shows that the pipeline works. A plan
is plain data, so tests and users can make their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Sequence, Tuple

from .contenders import BASELINE, contender

#: Workloads: a driver working through a list (asks again as soon as it released), or one that
#: thinks between holds (exponential think time with mean = the hold time).
REACQUIRE = "reacquire"
THINK = "think"
WORKLOADS: Dict[str, str] = {REACQUIRE: "re-acquire at once", THINK: "think time (exponential, mean = hold)"}

#: The emulated server's latency for every call: lognormal, median 50 ms (a long tail of slow calls).
LATENCY: Dict[str, object] = {"distribution": "lognormal", "median": 0.05, "sigma": 0.5}

#: Waiters that started less than this many seconds apart are simultaneous for the FIFO inversions: two
#: round trips at the median latency (clients that start together cannot be ordered by the server).
FIFO_TIE = 2 * float(LATENCY["median"])  # type: ignore[arg-type]

#: The contenders of the standard plans; the baseline (original v1) first.
STANDARD_CONTENDERS = (BASELINE, "original-v2", "original-pacing", "default", "fair")
#: Uncontended (N=1) runs: the call count per acquisition with and without the release check.
UNCONTENDED_CONTENDERS = ("default", "release-check-5", "fair")


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

    @property
    def title(self) -> str:
        """``N=8, hold 1 s, re-acquire at once``."""
        return f"N={self.clients}, hold {self.hold:g} s, {WORKLOADS[self.workload]}"


@dataclass(frozen=True)
class Plan:
    """Cells, each with the contenders to run in it, and how often to repeat every run."""

    name: str
    groups: Tuple[Tuple[Cell, Tuple[str, ...]], ...]
    repeats: int

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        for _, names in self.groups:
            for name in names:
                contender(name)  # fails early, naming the known contenders

    def runs(self) -> Iterator[Tuple[int, Cell, str]]:
        """(repeat, cell, contender) in running order: every repeat goes through all the cells, so slow
        drift of the machine spreads over all contenders instead of hitting one."""
        for repeat in range(self.repeats):
            for cell, names in self.groups:
                for name in names:
                    yield repeat, cell, name

    @property
    def run_count(self) -> int:
        """How many runs the plan makes."""
        return self.repeats * sum(len(names) for _, names in self.groups)

    @property
    def max_clients(self) -> int:
        """The most client processes any cell needs."""
        return max(cell.clients for cell, _ in self.groups)

    def estimated_seconds(self, per_run_overhead: float = 1.5) -> float:
        """Measuring time plus a rough per-run overhead (setting up, draining)."""
        per_repeat = sum(
            len(names) * (cell.window + per_run_overhead + cell.hold) for cell, names in self.groups
        )
        return self.repeats * per_repeat


def matrix(
    clients: Sequence[int],
    holds: Sequence[float],
    windows: Dict[float, float],
    contenders: Sequence[str] = STANDARD_CONTENDERS,
    workloads: Sequence[str] = (REACQUIRE, THINK),
) -> Tuple[Tuple[Cell, Tuple[str, ...]], ...]:
    """Every combination of ``clients`` x ``holds`` x ``workloads``, each with ``contenders``."""
    return tuple(
        (Cell(n, hold, workload, windows[hold]), tuple(contenders))
        for hold in holds
        for workload in workloads
        for n in clients
    )


def _uncontended(window: float, contenders: Sequence[str] = UNCONTENDED_CONTENDERS):
    return ((Cell(1, 0.1, REACQUIRE, window), tuple(contenders)),)


QUICK = Plan(
    "quick",
    _uncontended(4.0) + matrix(clients=(2, 8), holds=(0.1, 1.0), windows={0.1: 4.0, 1.0: 8.0}),
    repeats=2,
)

FULL = Plan(
    "full",
    # N=1 is in the matrix (with "default"); the same cell adds the release-check variant.
    _uncontended(30.0, ("release-check-5",))
    + matrix(clients=(1, 2, 8, 32), holds=(0.1, 1.0, 10.0), windows={0.1: 30.0, 1.0: 60.0, 10.0: 240.0}),
    repeats=2,
)

#: The contenders of the targets plan: the baseline, the default and the fair mode.
TARGET_CONTENDERS = (BASELINE, "default", "fair")

#: The cells of the lock's targets that the quick plan leaves out or measures in windows too short for
#: them (N=8 and 32 at hold 1 s and 10 s), for the baseline, the default and the fair mode, once, with
#: shorter windows than the full plan: about 45 minutes.
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

PLANS: Dict[str, Plan] = {p.name: p for p in (QUICK, FULL, TARGETS, BUDGET, SMOKE)}
