"""What a benchmark run measures: configurations (cells), contenders, windows and repeats.

``decide`` (the default of ``make bench``) measures the default lock's targets in windows long enough to
judge them, and the workloads sites run (:data:`SITE`), in about 25 minutes on 2 cores; ``site`` is those
workloads alone (about ten minutes); ``full`` is the whole matrix and takes hours; ``quick`` is a ten-minute
plan of short windows (indications, not verdicts); ``targets`` adds to it the cells of N=8 and 32 at hold
1 s and 10 s (about 45 minutes); ``smoke`` takes a minute and only shows that the pipeline works. A plan is
plain data, so tests and users can make their own.

Two kinds of cell: most run for a measuring *window* and count what happened in it; a *finite* cell
(:data:`FINITE`: the setup bursts and the long hold) gives every client a fixed list of sections drawn from
the run's seed (:func:`schedule`) and ends when the last one is released, its ``window`` only a cap.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .contenders import BASELINE, PLAIN_POLLING, contender

#: Workloads: a driver working through a list (asks again as soon as it released), or one that
#: thinks between holds (exponential think time with mean = the hold); mixed parties (one client asks
#: again at once, the others pause one hold between holds); a stream of readers (the read side of a
#: ReservationRWLock, back to back and overlapping) that one client of the contender's lock must get past.
REACQUIRE = "reacquire"
THINK = "think"
MIXED = "mixed"
READERS = "readers"
#: The workloads CloudShell sites run (:data:`SITE`): a sandbox's setup starting its drivers together, in
#: two shapes (:data:`BURSTS`); a job holding the lock a minute while others queue behind it; the stress
#: run's many processes with short holds (``make stress`` without its faults, kills and pauses).
SETUP_BURST_A = "setup-burst-a"
SETUP_BURST_B = "setup-burst-b"
LONG_HOLD = "long-hold"
STRESS = "stress"
WORKLOADS: Dict[str, str] = {
    REACQUIRE: "re-acquire at once",
    THINK: "think time (exponential, mean = hold)",
    MIXED: "mixed parties (client 0 re-acquires at once, the others pause one hold between holds)",
    READERS: "readers stream (client 0 takes the lock, pausing one hold between holds; the others read)",
    SETUP_BURST_A: "setup burst A (drivers start within 1 s, 3 sections each, think mean 1 s)",
    SETUP_BURST_B: "setup burst B (drivers start within 1 s, 2 sections each, think mean 0.5 s)",
    LONG_HOLD: "long hold (a job holds once; the others start within 2 s and want it once for 0.5 s)",
    STRESS: "stress (holds uniform 0.5-2 x hold, think exponential, mean = hold)",
}


@dataclass(frozen=True)
class Burst:
    """The shape of a setup burst: each driver starts within ``spread`` s of the run's start (uniform), then
    runs ``sections`` locked sections; a section holds a lognormal time (median = the cell's hold, ``sigma``)
    and the driver thinks an exponential time (mean ``think`` s) between its sections."""

    sections: int
    think: float
    spread: float = 1.0
    sigma: float = 0.5


#: The two shapes of setup burst (the cells give the drivers and the median hold: 8 x 0.5 s and 16 x 0.3 s).
BURSTS: Dict[str, Burst] = {
    SETUP_BURST_A: Burst(sections=3, think=1.0),
    SETUP_BURST_B: Burst(sections=2, think=0.5),
}

#: The long hold's job (client 0) takes this contender's lock whatever the run's contender, so that every
#: contender's waiters queue behind the same holder.
JOB_CONTENDER = "default"
#: Each waiter of the long hold starts this many seconds into the job's hold (uniform; at most half the
#: hold, so that a short hold in a test still has them waiting), and holds the lock this long, once.
WAITER_START = (0.5, 2.0)
WAITER_HOLD = 0.5

#: The cells whose clients work through a fixed schedule and whose run ends when it is done.
FINITE = (SETUP_BURST_A, SETUP_BURST_B, LONG_HOLD)

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
    first, whether it is a ``reader`` (the read side of a ReservationRWLock) or takes the run's lock, and
    whether its holds are ``varied`` (uniform between half and twice the cell's hold) or all the hold."""

    pause: str = NO_PAUSE
    reader: bool = False
    offset: float = 0.0
    varied: bool = False

    def pause_seconds(self, rng: random.Random, hold: float, first: bool) -> float:
        """The pause before this acquisition (``first``: the client's first in the run)."""
        if self.pause == THINK_PAUSE:
            return rng.expovariate(1.0 / hold)
        if self.pause == FIXED_PAUSE and not first:
            return hold
        return 0.0

    def hold_seconds(self, rng: random.Random, hold: float) -> float:
        """How long this acquisition holds the lock (drawn after its pause, so the draws of a client that
        holds the cell's hold every time are the same as before holds could vary)."""
        return rng.uniform(hold / 2, 2 * hold) if self.varied else hold

    def sections(self, rng: random.Random, hold: float) -> Iterator[Tuple[float, float]]:
        """(pause before, hold) of each acquisition, without end: the window's end stops the client."""
        first = True
        while True:
            pause = self.pause_seconds(rng, hold, first)
            yield pause, self.hold_seconds(rng, hold)
            first = False


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
    if workload == STRESS:
        return Role(THINK_PAUSE, varied=True)
    return Role()


@dataclass(frozen=True)
class Schedule:
    """What one client of a finite cell does: waits ``offset`` s from the run's start, then takes the lock
    once per hold in ``holds``, pausing ``pauses[k]`` s before the k-th (the first pause is 0); ``job``: it
    takes the lock of :data:`JOB_CONTENDER`, not the run's contender."""

    offset: float
    holds: Tuple[float, ...]
    pauses: Tuple[float, ...]
    job: bool = False

    def sections(self) -> Iterator[Tuple[float, float]]:
        """(pause before, hold) of each section."""
        return iter(zip(self.pauses, self.holds))

    @property
    def work(self) -> float:
        """Seconds of holding the schedule asks for."""
        return sum(self.holds)


def schedule(workload: str, hold: float, clients: int, client: int, seed: int) -> Schedule:
    """The sections of client ``client`` of ``clients`` in a finite ``workload`` (:data:`FINITE`).

    Drawn from ``seed``, the workload and the client alone, before anything runs: every contender run with
    the same seed gets exactly the same work, whatever it does with it (a contender's waiting never moves
    a later draw).
    """
    if workload not in FINITE:
        raise ValueError(f"the {workload} workload has no schedule: its clients work until the window ends")
    rng = random.Random(f"{seed}:{workload}:{client}")  # a str seed is hashed deterministically
    if workload == LONG_HOLD:
        if client == 0:
            return Schedule(0.0, (hold,), (0.0,), job=True)
        low, high = WAITER_START
        return Schedule(rng.uniform(low, min(high, hold / 2)), (WAITER_HOLD,), (0.0,))
    burst = BURSTS[workload]
    offset = rng.uniform(0.0, burst.spread)
    holds = tuple(rng.lognormvariate(math.log(hold), burst.sigma) for _ in range(burst.sections))
    thinks = tuple(rng.expovariate(1.0 / burst.think) for _ in range(burst.sections - 1))
    return Schedule(offset, holds, (0.0, *thinks))


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
        if self.workload in (MIXED, READERS, LONG_HOLD) and self.clients < 2:
            raise ValueError(f"the {self.workload} workload needs at least 2 clients, got {self.clients}")
        if self.workload == LONG_HOLD and self.hold < 2 * WAITER_START[0]:
            raise ValueError(
                f"the long hold needs a hold of at least {2 * WAITER_START[0]:g} s, got {self.hold}"
            )

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

    @property
    def finite(self) -> bool:
        """The run ends when its schedules are done (``window`` is only a cap), not when a window closes."""
        return self.workload in FINITE

    def schedule(self, client: int, seed: int) -> Schedule:
        """Client ``client``'s sections in a run with ``seed`` (finite cells only)."""
        return schedule(self.workload, self.hold, self.clients, client, seed)

    def work(self, seed: int) -> float:
        """Seconds of holding all the clients' schedules ask for in a run with ``seed``."""
        return sum(self.schedule(client, seed).work for client in range(self.clients))


def run_seed(seed: int, index: int, repeat: int, cell: Cell) -> int:
    """The seed of a run (the ``index``-th of the plan, in ``repeat``): the cells of the sites' workloads
    (:data:`SITE_WORKLOADS`) give every contender of a repeat the same one, so each gets exactly the same
    work and their figures compare repeat by repeat; the others draw a seed per run, as they always did."""
    if cell.workload in SITE_WORKLOADS:
        return seed * 1000 + repeat
    return seed + index


#: The workloads of the sites (:data:`SITE`); each repeat of them hands every contender the same seed.
SITE_WORKLOADS = (*FINITE, STRESS)

#: A cell and the contenders to run in it.
Group = Tuple[Cell, Tuple[str, ...]]


#: One run of a plan: (repeat, cell, contender).
Run = Tuple[int, Cell, str]


@dataclass(frozen=True)
class Series:
    """A cell's contenders run ``repeats`` times, whatever the plan's repeats (a plan's ``--repeats``
    leaves them alone), interleaved with the plan's other cells: the k-th run of each contender falls in
    the plan's k-th round. ``seconds``: about how long one run takes, for the plan's estimate (a finite
    cell ends long before its cap); None: the cell's window.

    ``together``: every run of the series (and of the plan's other such series of the same cell) takes
    place at once, in the first round, each on its own reservation with its own client processes: for a
    finite cell whose clients are idle most of a run (the long hold: a job sleeping a minute, waiters
    polling a few times a second), so that its minute is spent once, not once per run. Its runs see the
    same machine at the same moment, and each counts its own calls (the server's counts are of all of them).
    """

    cell: Cell
    contenders: Tuple[str, ...]
    repeats: int
    seconds: Optional[float] = None
    together: bool = False

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.together and not self.cell.finite:
            raise ValueError(f"only a finite cell's runs can take place together, not {self.cell.workload}'s")

    @property
    def run_seconds(self) -> float:
        """How long one of its runs takes, about."""
        return self.cell.window if self.seconds is None else self.seconds


#: Seconds a run costs beyond its window (handing it out, the last release, collecting the reports), and
#: seconds per client process to start it and warm it up: measured on 2 cores (a quick and budget run,
#: 92 runs and 32 processes, took 70 s beyond its windows).
RUN_OVERHEAD = 0.75
CLIENT_STARTUP = 0.5


@dataclass(frozen=True)
class Plan:
    """Cells, each with the contenders to run in it, how often to repeat every run, the cells run
    ``once`` (in the first repeat: cells judged on every run alone, or shown beside the others), and the
    ``series``: cells with their own number of repeats."""

    name: str
    groups: Tuple[Group, ...]
    repeats: int
    once: Tuple[Group, ...] = ()
    series: Tuple[Series, ...] = ()

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        for _, names in self.groups + self.once + tuple((s.cell, s.contenders) for s in self.series):
            for name in names:
                contender(name)  # fails early, naming the known contenders

    @property
    def rounds(self) -> int:
        """How many times the plan goes through its cells: its repeats, or a longer series'."""
        return max([self.repeats, *(s.repeats for s in self.series)])

    def batches(self) -> Iterator[Tuple[Run, ...]]:
        """The runs in running order, in batches of runs that take place at the same time (one run each,
        but for the series run ``together``): every repeat goes through all the cells, so slow drift of
        the machine spreads over all contenders instead of hitting one."""
        together: Dict[Cell, List[Run]] = {}
        for s in self.series:
            if s.together:
                runs = [(repeat, s.cell, name) for repeat in range(s.repeats) for name in s.contenders]
                together.setdefault(s.cell, []).extend(runs)
        for repeat in range(self.rounds):
            groups = (self.groups if repeat < self.repeats else ()) + (self.once if repeat == 0 else ())
            for cell, names in groups:
                for name in names:
                    yield ((repeat, cell, name),)
            for s in self.series:
                if not s.together and repeat < s.repeats:
                    for name in s.contenders:
                        yield ((repeat, s.cell, name),)
                elif s.together and repeat == 0 and s.cell in together:
                    yield tuple(together.pop(s.cell))

    def runs(self) -> Iterator[Run]:
        """(repeat, cell, contender) in running order (:meth:`batches`, one after the other)."""
        for batch in self.batches():
            yield from batch

    @property
    def run_count(self) -> int:
        """How many runs the plan makes."""
        return (
            self.repeats * sum(len(names) for _, names in self.groups)
            + sum(len(names) for _, names in self.once)
            + sum(s.repeats * len(s.contenders) for s in self.series)
        )

    @property
    def max_clients(self) -> int:
        """The most client processes any batch of runs needs."""
        return max(sum(cell.clients for _, cell, _ in batch) for batch in self.batches())

    @property
    def cells(self) -> Tuple[Cell, ...]:
        """Every cell of the plan, in the order of its first run."""
        return tuple(dict.fromkeys(cell for _, cell, _ in self.runs()))

    def estimated_seconds(
        self, per_run_overhead: float = RUN_OVERHEAD, per_client: float = CLIENT_STARTUP
    ) -> float:
        """Measuring time plus a per-run overhead and the client processes' start (a batch of runs
        together takes as long as its longest)."""
        seconds = {(s.cell, name): s.run_seconds for s in self.series for name in s.contenders}
        measuring = sum(
            max(seconds.get((cell, name), cell.window) for _, cell, name in batch) + per_run_overhead
            for batch in self.batches()
        )
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


#: The contenders of the sites' workloads: the baseline, the default lock and plain polling (``fair=False``).
SITE_CONTENDERS = (BASELINE, "default", PLAIN_POLLING)

#: The workloads CloudShell sites run, as the decide plan measures them (``--plan site``: these alone, about
#: ten minutes). The setup bursts three times per contender: a makespan moves with the draws, and each
#: repeat's draws are the same for every contender (:func:`run_seed`), so a repeat compares them on the same
#: work. The long hold twice for the default lock and once for the others, whose figures are only shown
#: beside it: a minute's hold per run, its four runs take place together (16 processes, mostly asleep), or
#: they alone would add three minutes. The stress cell once per contender, in 45 s windows (a minute would
#: take the plan past 25 minutes): 32 processes are granted about a hundred times and more in them. The caps
#: leave the original v1 room to finish (its 2-5 s sleeps); ``seconds`` are what the runs took on 2 cores
#: (the original's bursts longer, plain polling's shorter).
SITE = (
    Series(Cell(8, 0.5, SETUP_BURST_A, 180.0), SITE_CONTENDERS, 3, seconds=24.0),
    Series(Cell(16, 0.3, SETUP_BURST_B, 180.0), SITE_CONTENDERS, 3, seconds=24.0),
    Series(Cell(4, 60.0, LONG_HOLD, 120.0), (BASELINE, PLAIN_POLLING), 1, seconds=66.0, together=True),
    Series(Cell(4, 60.0, LONG_HOLD, 120.0), ("default",), 2, seconds=66.0, together=True),
    Series(Cell(32, 0.1, STRESS, 45.0), ("default", PLAIN_POLLING), 1),
)

#: The release without its read (``release_check_after=5``), beside the default where holds are short: the
#: difference is what the release's read costs (docs/protocol.md, "Why the release reads before it removes").
RELEASE_UNREAD = "release-check-5"

#: The decide plan (``make bench``). Twice, the cells that judge a ratio against the original, each window
#: holding enough grants for its verdict: 30 s at hold 1 s, 38 s at N=8 re-acquiring (three grants per
#: client, which the starvation target needs) and at N=32 (a round of the queue: about a grant per client),
#: 12 s at hold 0.1 s (the queue grants about two a second there; :data:`RELEASE_UNREAD` beside it). Once:
#: the uncontended cycle (with :data:`RELEASE_UNREAD` too), mixed parties (60 s), the readers stream
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
        _group(8, 0.1, REACQUIRE, 12.0, *DECIDE_CONTENDERS, RELEASE_UNREAD),
    ),
    repeats=2,
    once=(
        _group(1, 0.1, REACQUIRE, 6.0, "default", RELEASE_UNREAD),
        _group(4, 1.0, MIXED, 60.0, "default"),
        _group(4, 1.0, READERS, 15.0, "default"),
        _group(32, 10.0, REACQUIRE, 60.0, "default"),
    ),
    series=SITE,
)

#: The sites' workloads alone (``--plan site``): what the decide plan adds to the targets' cells.
SITE_PLAN = Plan("site", (), repeats=1, series=SITE)

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
    # The sites' workloads, tiny: a burst of 2 drivers, long holds of 2 s with one waiter (two at once), 3 s
    # of stress.
    series=(
        Series(Cell(2, 0.3, SETUP_BURST_B, 30.0), SITE_CONTENDERS, 1, seconds=5.0),
        Series(Cell(2, 2.0, LONG_HOLD, 20.0), ("default", PLAIN_POLLING), 1, seconds=4.0, together=True),
        Series(Cell(3, 0.1, STRESS, 3.0), ("default", PLAIN_POLLING), 1),
    ),
)

PLANS: Dict[str, Plan] = {p.name: p for p in (DECIDE, SITE_PLAN, QUICK, FULL, TARGETS, BUDGET, SMOKE)}
