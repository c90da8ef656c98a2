"""Runs a plan: one embedded emulator, one spawned process per client, one fresh reservation per run.

Every client logs on as its own user, so the server's event log names the client of every grant. The
processes are started once and reused by every run (starting 32 Python processes takes longer than a
short run); each warms up once, so the lock's once-per-process catalog read is not measured. Call
counts are reset just before a window opens and read the moment it closes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..emulator import Emulator
from ..lock import protocol
from .contenders import Contender, contender
from .metrics import Attempt, RunMetrics, Window, run_metrics
from .plans import FIFO_TIE, LATENCY, Cell, Plan
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
        run = self.execute(cell, contender(contender_name), repeat, seed)
        return RunResult(
            cell,
            contender_name,
            repeat,
            self.figures(cell, run),
            sum(r.ran_without_lock for r in run.reports.values()),
        )

    def figures(self, cell: Cell, run: Execution) -> RunMetrics:
        """The figures of one run of ``cell``, from the server's log, for the clients that took the run's
        lock (:attr:`.plans.Cell.measured`, numbered 0.. in that order): a reader's adds of the alias are its
        read group's, not grants of the lock under test, so they are left out with its waits."""
        emulator = self.emulator
        assert emulator is not None, "use Bench as a context manager"
        numbers = {client: index for index, client in enumerate(cell.measured)}
        users = {self.user(client): index for client, index in numbers.items()}
        readers = {self.user(client) for client in range(cell.clients) if client not in numbers}
        events = [e for e in emulator.control.events(run.spec.reservation_id) if e.get("user") not in readers]
        attempts = [Attempt(numbers[c], s) for c, r in run.reports.items() if c in numbers for s in r.starts]
        window = Window(run.spec.start, run.spec.end)
        return run_metrics(events, attempts, users, window, run.counts, fifo_tie=FIFO_TIE)

    def execute(self, cell: Cell, lock: Contender, repeat: int, seed: int = 0) -> Execution:
        """One run of ``lock`` in ``cell`` on a fresh reservation: what the clients reported, and the
        server's call counts of the window (no figures: :meth:`run` and the cohort bench make those)."""
        if cell.clients > self.clients:
            raise ValueError(f"the cell needs {cell.clients} clients; this bench has {self.clients}")
        emulator = self.emulator
        assert emulator is not None, "use Bench as a context manager"
        contender_name = lock.name
        reservation_id = emulator.create_reservation(f"bench {cell.title} {contender_name} #{repeat + 1}")
        start = time.monotonic() + LEAD_SECONDS
        spec = RunSpec(
            reservation_id=reservation_id,
            contender=lock,
            workload=cell.workload,
            hold=cell.hold,
            start=start,
            end=start + cell.window,
            seed=seed,
            clients=cell.clients,
        )
        for commands in self._commands[: cell.clients]:
            commands.put(spec)
        time.sleep(max(0.0, start - 0.1 - time.monotonic()))
        emulator.control.reset_counts()
        time.sleep(max(0.0, spec.end - time.monotonic()))
        counts = emulator.control.call_counts()  # the window's calls only: the drain is not counted
        reports: Dict[int, ClientReport] = self._collect(
            "report", range(cell.clients), cell.hold + DRAIN_TIMEOUT
        )
        errors = [f"client {c}: {r.error}" for c, r in sorted(reports.items()) if r.error]
        if errors:
            raise BenchError(f"{contender_name} in {cell.title}:\n" + "\n".join(errors))
        return Execution(spec, reports, counts)

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


def run_plans(
    plans: Sequence[Plan], progress: Progress = print, seed: int = 0
) -> Tuple[List[RunResult], float]:
    """Every run of ``plans``, one after the other on one emulator; returns the results and the seconds."""
    began = time.monotonic()
    results: List[RunResult] = []
    runs = [run for plan in plans for run in plan.runs()]
    with Bench(max(plan.max_clients for plan in plans), progress=progress) as bench:
        for index, (repeat, cell, name) in enumerate(runs, 1):
            result = bench.run(cell, name, repeat, seed=seed + index)
            m = result.metrics
            progress(
                f"[{index}/{len(runs)}] {cell.title}, {name} #{repeat + 1}: "
                f"{m.acquisitions_per_minute:.0f} acquisitions/min, p99 wait {m.wait.p99:.2f} s, "
                f"{m.calls_per_second:.1f} calls/s"
            )
            results.append(result)
    return results, time.monotonic() - began
