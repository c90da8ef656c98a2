"""Runs a plan: one embedded emulator, one spawned process per client, one fresh reservation per run.

Every client logs on as its own user, so the server's event log names the client of every grant. The
processes are started once and reused by every run (starting 32 Python processes takes longer than a
short run); each warms up once, so the lock's once-per-process catalog read is not measured. Call
counts are reset just before a window opens and read the moment it closes; a finite run's (a setup burst,
the long hold) are read once every client has reported its schedule done, so they hold the whole run.
Finite runs may also take place together (:meth:`Bench.execute_together`), each with its own reservation
and client processes; each then counts its calls from what its clients recorded sending.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..emulator import Emulator
from ..lock import protocol
from .contenders import Contender, contender
from .metrics import (
    CALLS_PER_SECTION,
    HELD_CALLS_PER_SECOND,
    MAKESPAN,
    RELEASE_GAP,
    Attempt,
    RunMetrics,
    Window,
    burst_figures,
    last_release,
    long_hold_figures,
    run_metrics,
)
from .plans import FIFO_TIE, LATENCY, LONG_HOLD, Cell, Plan, run_seed
from .worker import ClientReport, RunSpec, serve

#: How long before the window opens the run is handed to the clients.
LEAD_SECONDS = 0.5
#: How long a client may take to start, log on or finish a run after its window closed.
STARTUP_TIMEOUT = 180.0
DRAIN_TIMEOUT = 120.0
BENCH_PASSWORD = "bench"  # a throw-away password of the throw-away emulator's users


class BenchError(RuntimeError):
    """A benchmark client failed; the message says which and why."""


@dataclass(frozen=True)
class RunResult:
    """One run: its configuration, contender, repeat, figures and what the clients reported."""

    cell: Cell
    contender: str
    repeat: int
    metrics: RunMetrics
    ran_without_lock: int  # acquisitions that carried on without the lock (the original's defect)


@dataclass(frozen=True)
class Execution:
    """What one run left behind: its spec, each client's report, the server's call counts of the window."""

    spec: RunSpec
    reports: Dict[int, ClientReport]
    counts: Dict[str, int]


Progress = Callable[[str], None]


class Bench:
    """The emulator and the client processes of one benchmark; a context manager."""

    def __init__(
        self, clients: int, latency: Optional[Dict[str, Any]] = None, progress: Progress = print
    ) -> None:
        self.clients = clients
        self.latency = dict(LATENCY if latency is None else latency)
        self.progress = progress
        self.emulator: Optional[Emulator] = None
        self._processes: List[Any] = []
        self._commands: List[Any] = []
        self._results: Any = None

    def __enter__(self) -> Bench:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @staticmethod
    def user(client: int) -> str:
        """The user name client ``client`` logs on with."""
        return f"bench-{client}"

    def _start(self) -> None:
        emulator = Emulator(host="127.0.0.1", port=0, quali_port=0)
        self.emulator = emulator.start()
        # The original 2017 package's model (only Mutex Owner), which every contender can use.
        emulator.add_service_model(protocol.SERVICE_MODEL, {protocol.ATTR_OWNER: ""})
        for client in range(self.clients):
            emulator.control.add_user(self.user(client), BENCH_PASSWORD, admin=True)
        context = multiprocessing.get_context("spawn")
        self._results = context.Queue()
        self.progress(f"starting {self.clients} client processes")
        for client in range(self.clients):
            commands = context.Queue()
            address = (emulator.host, emulator.port, self.user(client), BENCH_PASSWORD, emulator.admin_domain)
            process = context.Process(
                target=serve, args=(client, address, commands, self._results), name=f"bench-client-{client}"
            )
            process.start()
            self._processes.append(process)
            self._commands.append(commands)
        self._collect("ready", range(self.clients), STARTUP_TIMEOUT)
        warmup = emulator.create_reservation("bench warm-up")
        for commands in self._commands:
            commands.put(("warmup", warmup))
        self._collect("warm", range(self.clients), STARTUP_TIMEOUT)
        # The latency applies from here on: logging on and warming up need not wait for it.
        emulator.control.configure(latency=self.latency)

    def _collect(self, kind: str, clients: Any, timeout: float) -> Dict[int, Any]:
        expected = set(clients)
        answers: Dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while expected - answers.keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(
                    f"clients {sorted(expected - answers.keys())} did not answer within {timeout:g} s"
                )
            try:
                got, client, payload = self._results.get(timeout=min(remaining, 1.0))
            except Exception:  # queue.Empty: look at the processes and wait on
                dead = [p.name for p in self._processes if not p.is_alive()]
                if dead:
                    raise BenchError(f"client processes ended unexpectedly: {', '.join(dead)}") from None
                continue
            if got == "failed":
                raise BenchError(f"client {client} failed:\n{payload}")
            if got != kind:
                raise BenchError(f"client {client} answered {got!r} while {kind!r} was expected")
            answers[client] = payload
        return answers

    def run(self, cell: Cell, contender_name: str, repeat: int, seed: int = 0) -> RunResult:
        """One run of ``contender_name`` in ``cell``, on a fresh reservation."""
        (result,) = self.run_together([(cell, contender_name, repeat, seed)])
        return result

    def run_together(self, runs: Sequence[Tuple[Cell, str, int, int]]) -> List[RunResult]:
        """``(cell, contender, repeat, seed)`` runs at the same time (finite cells, when more than one),
        each on a fresh reservation with its own clients."""
        executed = self.execute_together(
            [(cell, contender(name), repeat, seed) for cell, name, repeat, seed in runs]
        )
        return [
            RunResult(
                cell,
                name,
                repeat,
                self.figures(cell, run),
                sum(r.ran_without_lock for r in run.reports.values()),
            )
            for (cell, name, repeat, _), run in zip(runs, executed)
        ]

    def figures(self, cell: Cell, run: Execution) -> RunMetrics:
        """The figures of one run of ``cell``, from the server's log, for the clients that took the run's
        lock (:attr:`.plans.Cell.measured`, numbered 0.. in that order): a reader's adds of the alias are its
        read group's, not grants of the lock under test, so they are left out with its waits."""
        emulator = self.emulator
        assert emulator is not None, "use Bench as a context manager"
        numbers = {client: index for index, client in enumerate(cell.measured)}
        first = run.spec.first  # the run's client k is process first + k, logged on as that one's user
        users = {self.user(first + client): index for client, index in numbers.items()}
        readers = {self.user(first + client) for client in range(cell.clients) if client not in numbers}
        events = [e for e in emulator.control.events(run.spec.reservation_id) if e.get("user") not in readers]
        attempts = [Attempt(numbers[c], s) for c, r in run.reports.items() if c in numbers for s in r.starts]
        if not cell.finite:
            window = Window(run.spec.start, run.spec.end)
            return run_metrics(events, attempts, users, window, run.counts, fifo_tie=FIFO_TIE)
        # A finite run's window ends at its last release, or at the cap when a section was left undone.
        done = sum(r.acquired for r in run.reports.values())
        sections = sum(len(cell.schedule(c, run.spec.seed).holds) for c in range(cell.clients))
        released = last_release(events)
        end = released if done == sections and released is not None else run.spec.end
        window = Window(run.spec.start, max(end, run.spec.start + 1e-3))
        metrics = run_metrics(events, attempts, users, window, run.counts, fifo_tie=FIFO_TIE)
        if cell.workload == LONG_HOLD:
            waiters = range(1, cell.clients)
            figures = long_hold_figures(
                events,
                self.user(first),
                [run.reports[c].starts[0] if run.reports[c].starts else run.spec.end for c in waiters],
                [[t for t, _ in run.reports[c].calls] for c in waiters],
                window.end,
            )
        else:
            starts = [r.starts[0] for r in run.reports.values() if r.starts]
            first = min(starts, default=run.spec.start)
            figures = burst_figures(
                first, window.end, sections, metrics.grants, cell.work(run.spec.seed), run.counts
            )
        return dataclasses.replace(metrics, figures=figures)

    def execute(self, cell: Cell, lock: Contender, repeat: int, seed: int = 0) -> Execution:
        """One run of ``lock`` in ``cell`` on a fresh reservation: what the clients reported, and the
        server's call counts of the window (no figures: :meth:`run` and the cohort bench make those)."""
        (run,) = self.execute_together([(cell, lock, repeat, seed)])
        return run

    def execute_together(self, runs: Sequence[Tuple[Cell, Contender, int, int]]) -> List[Execution]:
        """``(cell, lock, repeat, seed)`` runs at the same time, each on a fresh reservation with client
        processes of its own (the first run's are 0.., the next one's follow): one run of any cell, or
        several of finite cells. One run counts its calls on the server; several share the server, so each
        counts the calls its clients recorded sending (the same calls: nothing but its clients calls it)."""
        emulator = self.emulator
        assert emulator is not None, "use Bench as a context manager"
        needed = sum(cell.clients for cell, _, _, _ in runs)
        if needed > self.clients:
            raise ValueError(f"the runs need {needed} clients; this bench has {self.clients}")
        if len(runs) > 1 and not all(cell.finite for cell, _, _, _ in runs):
            raise ValueError(
                "only finite cells' runs can take place together: a window's counts are the server's"
            )
        reservations = [
            emulator.create_reservation(f"bench {cell.title} {lock.name} #{repeat + 1}")
            for cell, lock, repeat, _ in runs
        ]
        start = time.monotonic() + LEAD_SECONDS
        specs, first = [], 0
        for (cell, lock, _, seed), reservation_id in zip(runs, reservations):
            specs.append(
                RunSpec(
                    reservation_id=reservation_id,
                    contender=lock,
                    workload=cell.workload,
                    hold=cell.hold,
                    start=start,
                    end=start + cell.window,
                    seed=seed,
                    clients=cell.clients,
                    first=first,
                )
            )
            first += cell.clients
        for spec in specs:
            for commands in self._commands[spec.first : spec.first + spec.clients]:
                commands.put(spec)
        time.sleep(max(0.0, start - 0.1 - time.monotonic()))
        emulator.control.reset_counts()
        cells = [cell for cell, _, _, _ in runs]
        if all(cell.finite for cell in cells):
            # The clients report when their schedules are done (or the cap ends them): every call is theirs.
            longest = max(cell.window for cell in cells)
            reports: Dict[int, ClientReport] = self._collect(
                "report", range(needed), LEAD_SECONDS + longest + DRAIN_TIMEOUT
            )
            counts = emulator.control.call_counts()
        else:
            (cell,) = cells
            time.sleep(max(0.0, specs[0].end - time.monotonic()))
            counts = emulator.control.call_counts()  # the window's calls only: the drain is not counted
            reports = self._collect("report", range(needed), cell.hold + DRAIN_TIMEOUT)
        executions = []
        for spec, (cell, lock, _, _) in zip(specs, runs):
            # Each run's clients numbered from 0, as its workload numbers them.
            own = {c - spec.first: reports[c] for c in range(spec.first, spec.first + spec.clients)}
            errors = [f"client {c}: {r.error}" for c, r in sorted(own.items()) if r.error]
            if errors:
                raise BenchError(f"{lock.name} in {cell.title}:\n" + "\n".join(errors))
            executions.append(
                Execution(spec, own, counts if len(runs) == 1 else recorded_counts(own.values()))
            )
        return executions

    def close(self) -> None:
        """Stop the clients (politely, then by force) and the emulator."""
        for commands in self._commands:
            with contextlib.suppress(Exception):  # a queue of a dead process: nothing to tell it
                commands.put(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._processes, self._commands = [], []
        if self.emulator is not None:
            self.emulator.stop()
            self.emulator = None


def recorded_counts(reports: Iterable[ClientReport]) -> Dict[str, int]:
    """Calls per API method, from what the clients recorded sending."""
    counts: Dict[str, int] = {}
    for report in reports:
        for _, method in report.calls:
            counts[method] = counts.get(method, 0) + 1
    return counts


def run_plans(
    plans: Sequence[Plan], progress: Progress = print, seed: int = 0
) -> Tuple[List[RunResult], float]:
    """Every run of ``plans``, one batch after the other on one emulator (:meth:`.plans.Plan.batches`: a
    run alone, or runs together); returns the results and the seconds."""
    began = time.monotonic()
    results: List[RunResult] = []
    batches = [batch for plan in plans for batch in plan.batches()]
    total = sum(len(batch) for batch in batches)
    with Bench(max(plan.max_clients for plan in plans), progress=progress) as bench:
        for batch in batches:
            numbered = [(len(results) + k, run) for k, run in enumerate(batch, 1)]
            runs = [
                (cell, name, repeat, run_seed(seed, index, repeat, cell))
                for index, (repeat, cell, name) in numbered
            ]
            for (index, _), result in zip(numbered, bench.run_together(runs)):
                name = f"{result.contender} #{result.repeat + 1}"
                if len(batch) > 1:
                    name += f" (together with {len(batch) - 1} more)"
                progress(f"[{index}/{total}] {result.cell.title}, {name}: {_progress(result)}")
                results.append(result)
    return results, time.monotonic() - began


def _progress(result: RunResult) -> str:
    """A run's main figures in a line."""
    m = result.metrics
    if result.cell.workload == LONG_HOLD:
        return (
            f"waiters {m.figure(HELD_CALLS_PER_SECOND):.2f} calls/s while held, "
            f"{m.figure(RELEASE_GAP):.2f} s from the release to the next grant"
        )
    if result.cell.finite:
        return f"makespan {m.figure(MAKESPAN):.1f} s, {m.figure(CALLS_PER_SECTION):.1f} calls/section"
    return (
        f"{m.acquisitions_per_minute:.0f} acquisitions/min, p99 wait {m.wait.p99:.2f} s, "
        f"{m.calls_per_second:.1f} calls/s"
    )
