"""One command, one lock: a helper that takes the command's lock again is served (one read); a helper in a
thread of its own, or a second asyncio task inside at the same time, is refused at once; two commands still
exclude each other; a command that waits says so (progress, logs), also while it waits on this machine."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface
from driver_support import context_for

from cloudshell_mutex import MutexTimeout, MutexUsageError
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Driver(ResourceDriverInterface, ReservationMutexMixin):
    def __init__(self, cohort_dir, cohort=True) -> None:
        self.options = {"cohort_dir": cohort_dir, "pacing": FAST} if cohort else {"pacing": FAST}
        self.reservation_mutex_cohort = cohort
        self.seen = []

    def initialize(self, context):
        pass

    def cleanup(self):
        self.close_reservation_mutex_sessions()

    @with_reservation_mutex(timeout=5)
    def reconfigure(self, context):
        return self.apply_settings(context)

    def apply_settings(self, context):
        """A helper that also runs on its own, so it takes the lock itself."""
        with self.reservation_mutex(context, timeout=5, **self.options) as lock:
            self.seen.append((lock.locked(), lock.token))
            return lock.token


def adds(emu, rid):
    return [e for e in emu.control.events(rid) if e["op"] == "service_added" and e["alias"] == "MUTEX"]


@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_a_helper_that_takes_the_commands_lock_again_is_served_at_once(emu, tmp_path, cohort):
    rid = emu.create_reservation("nesting")
    driver = Driver(tmp_path / "cohort", cohort)
    started = time.monotonic()
    token = driver.reconfigure(context_for(emu, rid))
    assert time.monotonic() - started < 3  # it never waits for itself (its timeout is 5 s)
    assert driver.seen == [(True, token)] and token.startswith("Router A reconfigure@")
    assert len(adds(emu, rid)) == 1  # one acquisition, served twice
    assert emu.control.reservation(rid)["services"] == []  # released once, by the command


def test_two_commands_of_one_driver_running_at_once_still_exclude_each_other(emu, tmp_path):
    rid = emu.create_reservation("nesting")
    driver = Driver(tmp_path / "cohort")
    intervals = []

    class Slow(Driver):
        @with_reservation_mutex(timeout=30)
        def slow(self, context):
            begin = time.monotonic()
            self.apply_settings(context)  # nested: served by this command's lock
            time.sleep(0.3)
            intervals.append((begin, time.monotonic()))

    slow = Slow(tmp_path / "cohort")
    threads = [threading.Thread(target=slow.slow, args=(context_for(emu, rid),)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(intervals) == 3
    intervals.sort()
    assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:])), intervals
    assert driver.seen == []


def test_a_thread_sharing_the_commands_context_is_refused_at_once(emu, tmp_path):
    rid = emu.create_reservation("nesting")
    driver = Driver(tmp_path / "cohort")
    context = context_for(emu, rid)
    errors = []

    with driver.reservation_mutex(context, **driver.options):
        worker_context = contextvars.copy_context()  # a worker started with the command's context

        def worker():
            try:
                driver.apply_settings(context)
            except MutexUsageError as error:
                errors.append(error)

        thread = threading.Thread(target=worker_context.run, args=(worker,))
        started = time.monotonic()
        thread.start()
        thread.join(10)
        assert time.monotonic() - started < 3
    assert len(errors) == 1 and "held by this same command in another thread" in str(errors[0])


def test_driver_commands_write_progress_by_default_every_10_s_at_most(emu, tmp_path):
    rid = emu.create_reservation("progress")
    lock = Driver(tmp_path / "cohort").reservation_mutex(context_for(emu, rid))
    assert lock.options.progress is True and lock.options.progress_interval == 10
    assert (
        Driver(tmp_path, cohort=False)
        .reservation_mutex(context_for(emu, rid), progress=False)
        .options.progress
        is False
    )


@pytest.mark.parametrize("cohort", [True, False], ids=["local-holder", "server-holder"])
def test_a_waiting_command_writes_the_scripts_progress_words_and_counts_its_whole_wait(emu, tmp_path, cohort):
    rid = emu.create_reservation("progress")
    handler = ListHandler()
    logger = logging.getLogger(f"test-progress-{cohort}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    holder = Driver(tmp_path / "cohort", cohort)
    waiter = Driver(tmp_path / "cohort", cohort)
    held = threading.Event()

    def hold():
        with holder.reservation_mutex(context_for(emu, rid, "Router B"), command="hold", **holder.options):
            held.set()
            time.sleep(2.6)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    options = dict(waiter.options, progress_interval=1, logger=logger, timeout=30)
    with waiter.reservation_mutex(context_for(emu, rid), command="rewire", **options):
        pass
    thread.join(10)
    progress = [line for line in emu.control.output(rid) if "waiting for MUTEX held by" in line]
    assert progress and all(
        line.startswith("Router A rewire: waiting for MUTEX held by Router B") for line in progress
    )
    if cohort:
        assert "this process on this execution server" in progress[0]
        assert any(
            "held by Router B hold (this process on this execution server) in cohort mode" in line
            for line in handler.lines
        )
    acquired = [line for line in handler.lines if "acquired MUTEX" in line]
    assert acquired, handler.lines
    waited = float(acquired[-1].split(" after ")[1].split(" s")[0])
    assert waited >= 1.5, acquired  # the whole wait, the local one included (not "after 0.00 s")


# ---------------------------------------------------------------- helper threads without its context


class Threaded(Driver):
    """A command that runs its locking helper in a thread of its own (no copy of its context variables)."""

    @with_reservation_mutex(timeout=30)
    def reconfigure_in_a_thread(self, context, runner):
        if runner == "executor":
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(self.apply_settings, context).exception(60)
        errors = []

        def helper():
            try:
                self.apply_settings(context)
            except Exception as error:
                errors.append(error)

        thread = threading.Thread(target=helper)
        thread.start()
        thread.join(60)
        return errors[0] if errors else None


@pytest.mark.parametrize("runner", ["thread", "executor"])
@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_a_helper_thread_given_the_commands_context_is_refused_at_once(emu, tmp_path, cohort, runner):
    rid = emu.create_reservation("helper thread")
    driver = Threaded(tmp_path / "cohort", cohort)
    started = time.monotonic()
    error = driver.reconfigure_in_a_thread(context_for(emu, rid), runner)
    print(f"helper refused after {time.monotonic() - started:.2f} s (its timeout: 5 s)")
    assert isinstance(error, MutexUsageError), error  # not a MutexTimeout after waiting for its own command
    message = str(error)
    assert "held by this same command in another thread" in message
    assert "Run the helper in the command's own thread" in message and "another command" not in message
    assert driver.seen == []
    assert len(adds(emu, rid)) == 1  # the helper added nothing
    assert emu.control.reservation(rid)["services"] == []  # the command released its lock as usual


def test_a_command_with_its_own_context_still_waits_for_another_command_of_the_same_driver(emu, tmp_path):
    """Two commands of one driver object in one process: each has its own context object, so the second
    one's lock waits for the first (excluded), in a thread of its own and without the first's context."""
    rid = emu.create_reservation("two commands")
    driver = Driver(tmp_path / "cohort")
    first, second = context_for(emu, rid), context_for(emu, rid, "Router B")
    with driver.reservation_mutex(first, timeout=5, **driver.options) as held:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                lambda: driver.reservation_mutex(second, timeout=1, **driver.options).acquire()
            ).exception(60)
        assert held.locked()
    assert isinstance(waiting, MutexTimeout), waiting  # it waited for the other command: excluded


# ---------------------------------------------------------------- asyncio tasks of one command


class Tasks(Driver):
    """A command that fans out into asyncio tasks which each take the command's lock again."""

    @with_reservation_mutex(timeout=30)
    def fan_out(self, context, together):
        return asyncio.run(self._steps(context, together))

    async def _steps(self, context, together):
        inside, most, outcomes = set(), [0], {}

        async def step(number):
            try:
                with self.reservation_mutex(context, timeout=5, **self.options):
                    inside.add(number)
                    most[0] = max(most[0], len(inside))
                    await asyncio.sleep(0.2)  # another task runs meanwhile
                    inside.discard(number)
                outcomes[number] = "served"
            except MutexUsageError as error:
                outcomes[number] = str(error)

        if together:
            await asyncio.gather(step(0), step(1))
        else:
            await step(0)
            await asyncio.create_task(step(1))
        return most[0], outcomes


@pytest.mark.parametrize("cohort", [True, False], ids=["cohort", "no-cohort"])
def test_two_tasks_of_one_command_are_never_inside_at_once(emu, tmp_path, cohort):
    rid = emu.create_reservation("tasks")
    most, outcomes = Tasks(tmp_path / "cohort", cohort).fan_out(context_for(emu, rid), together=True)
    assert most == 1, outcomes  # never both inside through the command's hold
    assert outcomes[0] == "served"
    assert "another asyncio task of it is inside" in outcomes[1] and "await each in turn" in outcomes[1]
    assert len(adds(emu, rid)) == 1 and emu.control.reservation(rid)["services"] == []


def test_tasks_of_one_command_that_take_turns_are_each_served(emu, tmp_path):
    rid = emu.create_reservation("tasks")
    most, outcomes = Tasks(tmp_path / "cohort").fan_out(context_for(emu, rid), together=False)
    assert most == 1 and outcomes == {0: "served", 1: "served"}
    assert len(adds(emu, rid)) == 1 and emu.control.reservation(rid)["services"] == []


def test_a_task_that_holds_the_lock_nests_and_another_task_is_refused(emu, tmp_path):
    rid = emu.create_reservation("tasks")
    driver = Driver(tmp_path / "cohort")
    context = context_for(emu, rid)
    outcomes = {}

    async def nest(who):
        try:
            with driver.reservation_mutex(context, timeout=5, **driver.options):
                outcomes[who] = "served"
        except MutexUsageError as error:
            outcomes[who] = str(error)

    async def holder(entered, done):
        with driver.reservation_mutex(context, timeout=5, **driver.options):
            await nest("holder nested")  # its own flow: served
            await asyncio.create_task(nest("subtask"))  # a task it starts holding the lock: its context too
            entered.set()
            await done.wait()

    async def other(entered, done):  # started before the lock was taken: without its context variables
        await entered.wait()
        await nest("other task")
        done.set()

    async def main():
        entered, done = asyncio.Event(), asyncio.Event()
        await asyncio.gather(holder(entered, done), other(entered, done))

    asyncio.run(main())
    assert outcomes["holder nested"] == "served"
    assert "(or holds it itself)" in outcomes["subtask"] and "(or holds it itself)" in outcomes["other task"]
    assert len(adds(emu, rid)) == 1 and emu.control.reservation(rid)["services"] == []
