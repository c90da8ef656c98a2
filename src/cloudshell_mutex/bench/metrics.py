"""The benchmark's figures for one run, computed from the server's event log (no I/O, no clocks).

Inputs are what one run leaves behind:

* the emulator's event log of the run's reservation (``service_added`` / ``service_removed`` of the lock's
  alias, each with the server's ``monotonic`` time and the ``user`` who made the call; every client logs
  on as its own user, so the server names the client of every grant);
* the clients' own records of *when they started waiting* (:class:`Attempt`): only the client knows
  that. When it was granted comes from the server's log, never from the client. ``time.monotonic`` is
  one system-wide clock on one machine, so both sides compare;
* the server's call counts for the run's window.

Waits still open when the window closes count with their length so far (a lower bound, flagged
``open``), so a contender that starves its waiters cannot look better by never granting them. The waits
that started in the window's first half are also summarised alone (``early_wait``): each had at least half
a window to end, so one still open is known to be at least that long, and a percentile over them decides
what a percentile over every wait (the last ones cut short by the window) cannot.

A finite run (a setup burst, the long hold: :attr:`.plans.Cell.finite`) has its window from the run's start
to its last release, and figures of its own in :attr:`RunMetrics.figures` (:func:`burst_figures`,
:func:`long_hold_figures`): the makespan and the calls per section of a burst, the waiters' calls per second
while a long hold lasts (from the clients' own record of the calls they sent) and the gap after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

ADDED = "service_added"
REMOVED = "service_removed"


class BenchDataError(ValueError):
    """The event log and the clients' records do not fit together (a bug in the run, not a result)."""


@dataclass(frozen=True)
class Attempt:
    """One acquisition as its client saw it: when it started waiting (``time.monotonic``)."""

    client: int
    start: float


@dataclass(frozen=True)
class Grant:
    """One grant as the server logged it: when the alias was added, and for which client."""

    client: int
    time: float


@dataclass(frozen=True)
class Wait:
    """From an attempt's start to its grant; ``open`` when no grant came before the window closed."""

    client: int
    start: float
    granted: Optional[float]
    seconds: float

    @property
    def open(self) -> bool:
        """No grant before the window closed: ``seconds`` is a lower bound."""
        return self.granted is None


@dataclass(frozen=True)
class Window:
    """The measuring window on the shared monotonic clock."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"a window must end after it starts, got {self.start} .. {self.end}")

    @property
    def seconds(self) -> float:
        """Its length."""
        return self.end - self.start

    def __contains__(self, moment: float) -> bool:
        return self.start <= moment <= self.end


@dataclass(frozen=True)
class Distribution:
    """p50, p99 and max of some durations in seconds, and how many of them are lower bounds (open)."""

    count: int
    p50: float
    p99: float
    max: float
    open: int = 0

    @classmethod
    def of(cls, values: Sequence[float], open_count: int = 0) -> Distribution:
        """The summary of ``values`` (NaN for an empty list)."""
        ordered = sorted(values)
        return cls(
            count=len(ordered),
            p50=percentile(ordered, 50),
            p99=percentile(ordered, 99),
            max=ordered[-1] if ordered else math.nan,
            open=open_count,
        )


#: No waits at all (and the figure of results saved before ``early_wait`` was measured).
NO_WAITS = Distribution(count=0, p50=math.nan, p99=math.nan, max=math.nan)


@dataclass(frozen=True)
class RunMetrics:
    """Every figure of one run (one contender, one configuration, one repeat)."""

    clients: int
    window_seconds: float
    grants: int
    acquisitions_per_minute: float
    wait: Distribution
    handoff_gap: Distribution
    calls_per_acquisition: Dict[str, float]
    calls_per_second: float
    grants_per_client: Tuple[int, ...]
    fifo_inversions: int
    inverted_grants: int
    early_wait: Distribution = NO_WAITS  # the waits that started in the window's first half
    # A finite run's own figures, by the names below (MAKESPAN, ...); none in a window's run.
    figures: Dict[str, float] = field(default_factory=dict)

    def figure(self, name: str) -> float:
        """The finite run's figure called ``name`` (NaN when the run has none)."""
        return self.figures.get(name, math.nan)

    @property
    def calls_per_acquisition_total(self) -> float:
        """All API calls in the window per grant."""
        return sum(self.calls_per_acquisition.values())

    @property
    def min_grants(self) -> int:
        """Grants of the client that got fewest."""
        return min(self.grants_per_client) if self.grants_per_client else 0

    @property
    def max_grants(self) -> int:
        """Grants of the client that got most."""
        return max(self.grants_per_client) if self.grants_per_client else 0

    @property
    def fairness(self) -> float:
        """min grants per client / mean grants per client (1 = even; the target is >= 0.5)."""
        if not self.grants_per_client or self.grants == 0:
            return math.nan
        return self.min_grants / (self.grants / len(self.grants_per_client))


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of sorted values, interpolated linearly between ranks (NaN if empty)."""
    if not ordered:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100, got {q}")
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def grants_and_removes(
    events: Sequence[Mapping[str, object]], alias: str, clients_by_user: Mapping[str, int]
) -> Tuple[List[Grant], List[float]]:
    """The lock's grants (with their client) and removes, in the server's commit order."""
    grants: List[Grant] = []
    removes: List[float] = []
    for event in sorted(events, key=lambda e: e["seq"]):  # type: ignore[arg-type,return-value]
        if event["alias"] != alias:
            continue
        if event["op"] == ADDED:
            user = str(event["user"])
            if user not in clients_by_user:
                raise BenchDataError(f"a grant to user {user!r}, who is not one of the run's clients")
            grants.append(Grant(clients_by_user[user], float(event["monotonic"])))  # type: ignore[arg-type]
        elif event["op"] == REMOVED:
            removes.append(float(event["monotonic"]))  # type: ignore[arg-type]
    return grants, removes


def pair_waits(attempts: Sequence[Attempt], grants: Sequence[Grant], window: Window) -> List[Wait]:
    """Match each client's attempts, in order, to its grants in the window, in order.

    A client waits for one acquisition at a time, so its k-th grant answers its k-th attempt. Attempts
    without a grant are open waits, counted until the window's end.
    """
    starts: Dict[int, List[float]] = {}
    for attempt in attempts:
        if attempt.start in window:
            starts.setdefault(attempt.client, []).append(attempt.start)
    granted: Dict[int, List[float]] = {}
    for grant in grants:
        if grant.time in window:
            granted.setdefault(grant.client, []).append(grant.time)
    waits: List[Wait] = []
    for client, client_starts in sorted(starts.items()):
        client_starts.sort()
        client_grants = sorted(granted.pop(client, []))
        if len(client_grants) > len(client_starts):
            raise BenchDataError(
                f"client {client} was granted {len(client_grants)} times but asked {len(client_starts)} times"
            )
        for index, start in enumerate(client_starts):
            if index < len(client_grants):
                grant_time = client_grants[index]
                if grant_time < start:
                    raise BenchDataError(
                        f"client {client} was granted at {grant_time} before asking at {start}"
                    )
                waits.append(Wait(client, start, grant_time, grant_time - start))
            else:
                waits.append(Wait(client, start, None, window.end - start))
    if granted:
        raise BenchDataError(f"grants to clients that never asked: {sorted(granted)}")
    return waits


def handoff_gaps(waits: Sequence[Wait], grants: Sequence[Grant], removes: Sequence[float], window: Window):
    """For each release while someone waited: the time to the next grant (or to the window's end, open).

    Returns ``(gaps, open_count)``.
    """
    grant_times = sorted(g.time for g in grants)
    gaps: List[float] = []
    open_count = 0
    for removed in removes:
        if removed not in window:
            continue
        waiting = any(w.start < removed and (w.granted is None or w.granted > removed) for w in waits)
        if not waiting:
            continue
        following = next((t for t in grant_times if t > removed), None)
        if following is not None and following in window:
            gaps.append(following - removed)
        else:
            gaps.append(window.end - removed)
            open_count += 1
    return gaps, open_count


def fifo_inversions(waits: Sequence[Wait], tie: float = 0.0) -> Tuple[int, int]:
    """Pairs where a waiter that started later was granted earlier, and grants that overtook anyone.

    An open wait counts as granted after every grant of the window. Waiters that started less than ``tie``
    seconds apart count as simultaneous (requests sent within one round trip have no order the server
    could keep). Returns ``(pairs, inverted_grants)``.
    """
    ordered = sorted(waits, key=lambda w: w.start)
    pairs = 0
    inverted = 0
    for later_index, later in enumerate(ordered):
        if later.granted is None:
            continue
        overtaken = sum(
            1
            for earlier in ordered[:later_index]
            if earlier.start < later.start - tie
            and (earlier.granted is None or earlier.granted > later.granted)
        )
        pairs += overtaken
        inverted += overtaken > 0
    return pairs, inverted


def run_metrics(
    events: Sequence[Mapping[str, object]],
    attempts: Sequence[Attempt],
    clients_by_user: Mapping[str, int],
    window: Window,
    call_counts: Mapping[str, int],
    alias: str = "MUTEX",
    fifo_tie: float = 0.0,
) -> RunMetrics:
    """Every figure of one run (see the module docstring for what comes from where)."""
    clients = len(clients_by_user)
    if sorted(clients_by_user.values()) != list(range(clients)):
        raise BenchDataError(
            f"clients must be numbered 0..{clients - 1}, got {sorted(clients_by_user.values())}"
        )
    grants, removes = grants_and_removes(events, alias, clients_by_user)
    in_window = [g for g in grants if g.time in window]
    waits = pair_waits(attempts, in_window, window)
    gaps, open_gaps = handoff_gaps(waits, grants, removes, window)
    pairs, inverted = fifo_inversions(waits, fifo_tie)
    per_client = [0] * clients
    for grant in in_window:
        per_client[grant.client] += 1
    count = len(in_window)
    early = [w for w in waits if w.start <= window.start + window.seconds / 2]
    return RunMetrics(
        clients=clients,
        window_seconds=window.seconds,
        grants=count,
        acquisitions_per_minute=count * 60.0 / window.seconds,
        wait=Distribution.of([w.seconds for w in waits], sum(w.open for w in waits)),
        handoff_gap=Distribution.of(gaps, open_gaps),
        calls_per_acquisition={m: n / count for m, n in sorted(call_counts.items())} if count else {},
        calls_per_second=sum(call_counts.values()) / window.seconds,
        grants_per_client=tuple(per_client),
        fifo_inversions=pairs,
        inverted_grants=inverted,
        early_wait=Distribution.of([w.seconds for w in early], sum(w.open for w in early)),
    )


# ---------------------------------------------------------------- finite runs

#: A burst's figures: seconds from the first driver's start to the last section's release (to the cap when
#: sections were left undone: a lower bound), the seconds of holding its schedules asked for, the server's
#: calls of the run per section granted, and the sections not granted before the cap.
MAKESPAN = "makespan"
WORK = "work"
CALLS_PER_SECTION = "calls_per_section"
UNFINISHED = "unfinished"
#: The long hold's figures: the waiters' API calls per second from their start to the job's release, all
#: of them together and the busiest one's; from the job's release to the next grant (to the run's end when
#: none came: a lower bound, flagged by RELEASE_GAP_OPEN = 1).
HELD_CALLS_PER_SECOND = "held_calls_per_second"
HELD_CALLS_PER_SECOND_MAX = "held_calls_per_second_max"
RELEASE_GAP = "release_gap"
RELEASE_GAP_OPEN = "release_gap_open"


def held_calls_per_second_of(waiter: int) -> str:
    """The name of waiter ``waiter``'s (1..) calls per second while the job held."""
    return f"{HELD_CALLS_PER_SECOND}_{waiter}"


def last_release(events: Sequence[Mapping[str, object]], alias: str = "MUTEX") -> Optional[float]:
    """When the alias was last removed (the server's time), or None."""
    removes = [float(e["monotonic"]) for e in events if e["alias"] == alias and e["op"] == REMOVED]  # type: ignore[arg-type]
    return max(removes) if removes else None


def burst_figures(
    first_start: float,
    end: float,
    sections: int,
    granted: int,
    work: float,
    call_counts: Mapping[str, int],
) -> Dict[str, float]:
    """A burst's figures (:data:`MAKESPAN`, ...): ``first_start`` is when the first driver asked, ``end``
    the last release (or the cap, when sections were left undone), ``sections`` the sections the schedules
    hold, ``granted`` those the server granted, ``call_counts`` the server's calls of the whole run."""
    calls = sum(call_counts.values())
    return {
        MAKESPAN: end - first_start,
        WORK: work,
        CALLS_PER_SECTION: calls / granted if granted else math.nan,
        UNFINISHED: float(sections - granted),
    }


def long_hold_figures(
    events: Sequence[Mapping[str, object]],
    job_user: str,
    waiter_starts: Sequence[float],
    waiter_calls: Sequence[Sequence[float]],
    end: float,
    alias: str = "MUTEX",
) -> Dict[str, float]:
    """The long hold's figures (:data:`HELD_CALLS_PER_SECOND`, ...) from the server's log of the run, the
    job's user, each waiter's start and the times of the calls it sent (waiter k at index k - 1), and the
    run's end. Waiter k's rate is its calls from its start to the job's release over that time; together,
    all their calls in those spans over the time from the first start to the release."""
    ordered = sorted(events, key=lambda e: e["seq"])  # type: ignore[arg-type,return-value]
    ours = [e for e in ordered if e["alias"] == alias]
    release_index = next(
        (i for i, e in enumerate(ours) if e["op"] == REMOVED and e["user"] == job_user), None
    )
    if release_index is None:  # the job never released (the cap came first): nothing to measure
        return {}
    released = float(ours[release_index]["monotonic"])  # type: ignore[arg-type]
    figures: Dict[str, float] = {}
    rates = []
    total = 0
    for waiter, (start, calls) in enumerate(zip(waiter_starts, waiter_calls), 1):
        held = [t for t in calls if start <= t <= released]
        total += len(held)
        rate = len(held) / (released - start) if released > start and calls else math.nan
        figures[held_calls_per_second_of(waiter)] = rate
        rates.append(rate)
    first = min(waiter_starts, default=released)
    known = [r for r in rates if not math.isnan(r)]
    figures[HELD_CALLS_PER_SECOND] = total / (released - first) if known and released > first else math.nan
    figures[HELD_CALLS_PER_SECOND_MAX] = max(known) if known else math.nan
    grant = next((e for e in ours[release_index + 1 :] if e["op"] == ADDED), None)
    if grant is None:
        figures[RELEASE_GAP], figures[RELEASE_GAP_OPEN] = end - released, 1.0
    else:
        figures[RELEASE_GAP], figures[RELEASE_GAP_OPEN] = float(grant["monotonic"]) - released, 0.0  # type: ignore[arg-type]
    return figures
