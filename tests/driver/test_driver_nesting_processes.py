"""One command, one context object: the driver mixin in separate OS processes (spawn), against the emulator.

Each child process is an execution server's driver host: two commands of one driver object run at the same
time in it (two threads, each with its own context object, as CloudShell runs them) and take the lock over
and over, each also through a nested helper in its own thread (served); a command also runs its helper in a
``threading.Thread`` and in a ``ThreadPoolExecutor`` (no copy of its context variables), which is refused
at once instead of waiting out its timeout for its own command. Two such processes run at once, with cohort
mode on (the default) and off. Exclusion is checked on the server's ordered output: every command's work
is one ``enter``/``exit`` pair that nobody else's interleaves.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Tuple

import pytest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface

from cloudshell_mutex import MutexUsageError
from cloudshell_mutex.demo.contexts import resource_command_context
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
JOURNAL = "nesting journal"
#: Each command's rounds in each process.
ROUNDS = 4
#: A helper that is not refused waits this long for its own command (then MutexTimeout): the test's failure.
HELPER_TIMEOUT = 10.0
TIMEOUT = 120.0

Site = Tuple[str, int, str]  # host, API port, admin token


class JournalDriver(ResourceDriverInterface, ReservationMutexMixin):
    """A driver whose commands take the sandbox's lock and note, in the sandbox output, when their work begins
    and ends; its helper takes the lock again."""

    def __init__(self, cohort: bool, cohort_dir: str) -> None:
        self.reservation_mutex_cohort = cohort
        self.options = {"cohort_dir": cohort_dir, "pacing": FAST} if cohort else {"pacing": FAST}

    def initialize(self, context):
        pass

    def cleanup(self):
        self.close_reservation_mutex_sessions()

    @with_reservation_mutex(timeout=TIMEOUT)
    def rewire(self, context, who):
        api = self.cloudshell_api(context)
        rid = context.reservation.reservation_id
        api.WriteMessageToReservationOutput(rid, f"{JOURNAL} enter {who}")
        self.apply_settings(context)  # nested, in the command's own thread: served
        time.sleep(0.05)
        api.WriteMessageToReservationOutput(rid, f"{JOURNAL} exit {who}")

    @with_reservation_mutex(timeout=TIMEOUT)
    def rewire_in_a_helper_thread(self, context, runner):
        started = time.monotonic()
        if runner == "executor":
            with ThreadPoolExecutor(1) as pool:
                error = pool.submit(self.apply_settings, context).exception(TIMEOUT)
        else:
            errors: List[BaseException] = []
            thread = threading.Thread(target=lambda: _catch(errors, self.apply_settings, context))
            thread.start()
            thread.join(TIMEOUT)
            error = errors[0] if errors else None
        return error, time.monotonic() - started

    def apply_settings(self, context):
        """A helper that also runs on its own, so it takes the lock itself."""
        with self.reservation_mutex(context, timeout=HELPER_TIMEOUT, **self.options) as lock:
            return lock.token


def _catch(errors: List[BaseException], function: Any, *args: Any) -> None:
    try:
        function(*args)
    except BaseException as error:
        errors.append(error)


def driver_host(index: int, site: Site, rid: str, cohort: bool, cohort_dir: str, results) -> None:
    """One execution server's driver host: a command's helper threads, then two commands at once."""
    report: Dict[str, Any] = {"index": index, "error": None, "refusals": {}}
    try:
        host, port, token = site
        driver = JournalDriver(cohort, cohort_dir)

        def context(resource: str) -> Any:  # a context object of its own for every command
            return resource_command_context(host, port, token, rid, resource)

        for runner in ("thread", "executor"):
            error, seconds = driver.rewire_in_a_helper_thread(context(f"Router {index}"), runner)
            report["refusals"][runner] = (type(error).__name__, str(error), seconds)

        def command(resource: str) -> None:
            for round_ in range(ROUNDS):
                driver.rewire(context(resource), f"{resource}#{round_}")

        errors: List[BaseException] = []
        commands = [
            threading.Thread(target=_catch, args=(errors, command, f"P{index}-{name}")) for name in "AB"
        ]
        for thread in commands:
            thread.start()
        for thread in commands:
            thread.join(TIMEOUT)
        if errors:
            raise errors[0]
        driver.cleanup()
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    results.put(report)


@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_helper_threads_are_refused_at_once_and_commands_still_take_turns_across_processes(
    emu, tmp_path, cohort
):
    rid = emu.create_reservation("one command, one context")
    site = (emu.host, emu.port, emu.issue_token())
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    processes = [
        ctx.Process(target=driver_host, args=(i, site, rid, cohort, str(tmp_path / "cohort"), results))
        for i in range(2)
    ]
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=TIMEOUT * 2) for _ in processes]
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    assert not [r["error"] for r in reports if r["error"]], reports

    for report in reports:
        for runner, (kind, message, seconds) in report["refusals"].items():
            print(f"process {report['index']}, {runner}: {kind} after {seconds:.2f} s")
            assert kind == MutexUsageError.__name__, (runner, kind, message)
            assert "held by this same command in another thread" in message, message
            assert "another command" not in message, message

    journal = [line.split(JOURNAL, 1)[1].split() for line in emu.control.output(rid) if JOURNAL in line]
    assert len(journal) == 2 * 2 * 2 * ROUNDS  # processes x commands x (enter, exit) x rounds
    for (step, who), (next_step, next_who) in zip(journal[::2], journal[1::2]):
        assert (step, next_step, next_who) == ("enter", "exit", who), journal  # nobody else inside meanwhile
    assert emu.control.reservation(rid)["services"] == []


# ---------------------------------------------------------------- a lost hold is never passed on


def lost_holder(site: Site, rid: str, cohort_dir: str, removed, results) -> None:
    """Hold the lock as a command; once it was removed behind its back, nest (refused), then release."""
    report: Dict[str, Any] = {"index": "holder", "error": None}
    try:
        host, port, token = site
        driver = JournalDriver(True, cohort_dir)
        context = resource_command_context(host, port, token, rid, "Router A")
        lock = driver.reservation_mutex(context, command="reconfigure", timeout=TIMEOUT, **driver.options)
        lock.acquire()
        results.put({"index": "held", "error": None})
        removed.wait(TIMEOUT)
        for step, action in (("nested", lambda: driver.apply_settings(context)), ("release", lock.release)):
            try:
                action()
                report[step] = "ok"
            except Exception as error:
                report[step] = type(error).__name__
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    results.put(report)


def local_waiter(site: Site, rid: str, cohort_dir: str, results) -> None:
    """A command on the same execution server: it waits for the local lock, then says what it holds."""
    report: Dict[str, Any] = {"index": "waiter", "error": None}
    try:
        host, port, token = site
        driver = JournalDriver(True, cohort_dir)
        context = resource_command_context(host, port, token, rid, "Router B")
        with driver.reservation_mutex(context, command="rewire", timeout=TIMEOUT, **driver.options) as lock:
            holder = lock.holder()
            report.update(passed=lock.passed, ours=holder is not None and holder.token == lock.token)
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    results.put(report)


def test_a_hold_a_nested_acquire_found_lost_is_not_passed_to_the_next_local_command(emu, tmp_path):
    """Without a lease (the original package): the holder's release must not hand a removed lock to a local
    waiter, which would carry on with no MUTEX on the server; the waiter acquires from the server."""
    rid = emu.create_reservation("lost hold, local waiter")
    site = (emu.host, emu.port, emu.issue_token())
    cohort_dir = str(tmp_path / "cohort")
    ctx = multiprocessing.get_context("spawn")
    results, removed = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=lost_holder, args=(site, rid, cohort_dir, removed, results))
    waiter = ctx.Process(target=local_waiter, args=(site, rid, cohort_dir, results))
    holder.start()
    try:
        assert results.get(timeout=TIMEOUT) == {"index": "held", "error": None}
        emu.session().RemoveServicesFromReservation(rid, ["MUTEX"])  # a Force Release
        waiter.start()
        local = CohortMutex(emu.session(), rid, cohort_dir=cohort_dir)
        deadline = time.monotonic() + TIMEOUT
        while not local.local_state().waiters and time.monotonic() < deadline:
            time.sleep(0.05)  # until the waiter waits for the local lock
        removed.set()
        reports = {r["index"]: r for r in (results.get(timeout=TIMEOUT), results.get(timeout=TIMEOUT))}
    finally:
        for process in (holder, waiter):
            process.join(10)
            if process.is_alive():
                process.kill()
    assert not [r["error"] for r in reports.values() if r["error"]], reports
    assert reports["holder"]["nested"] == reports["holder"]["release"] == "MutexLostError"
    assert reports["waiter"] == {"index": "waiter", "error": None, "passed": False, "ours": True}
    assert emu.control.reservation(rid)["services"] == []
