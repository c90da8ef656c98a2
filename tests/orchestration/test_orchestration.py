"""sandbox_mutex, with_sandbox_mutex and report_left_behind_lock with orch-core's real Sandbox, against
the emulator (the Sandbox reads the environment variables CloudShell sets for a script)."""

from __future__ import annotations

import contextvars
import threading
import time
from types import SimpleNamespace

import pytest

from cloudshell_mutex import ReservationMutex
from cloudshell_mutex.demo.contexts import sandbox_environment, scripts_honour_api_port
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.orchestration import report_left_behind_lock, sandbox_mutex, with_sandbox_mutex

pytestmark = pytest.mark.integration

# orch-core is installed (without its pins) in .venv only; the Python 3.9 unit run deselects this module.
Sandbox = pytest.importorskip("cloudshell.workflow.orchestration.sandbox").Sandbox
Workflow = pytest.importorskip("cloudshell.workflow.orchestration.workflow").Workflow

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.05)


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


@pytest.fixture
def rid(emu):
    return emu.create_reservation("orchestration tests")


@pytest.fixture
def sandbox(emu, rid, monkeypatch, tmp_path):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    for key, value in sandbox_environment(emu.host, emu.port, emu.issue_token(), rid).items():
        monkeypatch.setenv(key, value)
    with scripts_honour_api_port():
        return Sandbox()


def lock_ops(emu, rid, alias="MUTEX"):
    return [
        (e["op"], e["attributes"].get("Mutex Owner", ""))
        for e in emu.control.events(rid)
        if e["alias"] == alias
    ]


def aliases(emu, rid):
    return [s["alias"] for s in emu.control.reservation(rid)["services"]]


def test_sandbox_mutex_holds_the_lock_of_the_real_sandbox(emu, rid, sandbox):
    assert sandbox.id == rid
    with sandbox_mutex(sandbox, owner="Setup") as lock:
        holder = lock.holder()
        assert holder.label.startswith("Setup (host ")
        assert aliases(emu, rid) == ["MUTEX"]
    assert aliases(emu, rid) == []
    assert [op for op, _ in lock_ops(emu, rid)] == ["service_added", "service_removed"]


def test_any_object_with_automation_api_and_id_works(emu, rid):
    script = SimpleNamespace(automation_api=emu.session(), id=rid)
    with sandbox_mutex(script, owner="My script", name="CONFIG") as lock:
        assert lock.holder().alias == "CONFIG"
    assert aliases(emu, rid) == []


def run_stage(sandbox, steps):
    """Run ``steps`` as one configuration stage with orch-core's own stage runner (parallel threads)."""
    for step in steps:
        sandbox.workflow.add_to_configuration(step, None)
    sandbox._execute_stage(sandbox.workflow._configuration_functions, Workflow.CONFIGURATION_STAGE_NAME)


def test_wrapped_steps_of_one_stage_take_turns(emu, rid, sandbox):
    intervals = {}

    def step(label):
        def configure(sandbox, components):
            start = time.monotonic()
            time.sleep(0.2)
            intervals[label] = (start, time.monotonic())

        configure.__name__ = label
        return with_sandbox_mutex(configure, pacing=FAST)

    run_stage(sandbox, [step("routers"), step("switches")])
    assert sorted(intervals) == ["routers", "switches"]
    first, second = sorted(intervals.values())
    assert first[1] <= second[0]
    ops = lock_ops(emu, rid)
    assert [op for op, _ in ops] == ["service_added", "service_removed"] * 2
    assert sorted(owner.split("@")[0] for op, owner in ops if op == "service_added") == [
        "routers",
        "switches",
    ]


def test_unwrapped_steps_of_one_stage_do_run_at_once(sandbox):
    # The control for the test above: orch-core really runs a stage's steps in parallel.
    together = threading.Barrier(2, timeout=30)
    met = []

    def step(sandbox, components):
        together.wait()
        met.append(True)

    run_stage(sandbox, [step, step])
    assert met == [True, True]


def test_decorator_with_options_labels_the_holder(emu, rid, sandbox):
    seen = []

    @with_sandbox_mutex(owner="Connect routes", name="ROUTES")
    def connect(sandbox, components):
        seen.append(ReservationMutex(sandbox.automation_api, sandbox.id, name="ROUTES").holder())
        return "done"

    assert connect(sandbox, None) == "done"
    assert connect.__name__ == "connect"
    assert seen[0].token.startswith("Connect routes@")
    assert aliases(emu, rid) == []


def test_teardown_reports_a_left_behind_lock_and_leaves_it(emu, rid, sandbox):
    stuck = ReservationMutex(emu.session(), rid, owner="Router A driver")
    stuck.acquire()
    sandbox.workflow.add_to_teardown(report_left_behind_lock, None)
    sandbox.execute_teardown()
    report = [line for line in emu.control.output(rid) if "left behind" in line]
    assert len(report) == 1
    assert "held by Router A driver (host " in report[0]
    assert "(server time)" in report[0]
    assert "does not remove it" in report[0] and "Force Release" in report[0]  # and what can
    assert aliases(emu, rid) == ["MUTEX"]  # reported, not removed
    stuck.release()


def test_teardown_report_is_silent_when_the_lock_is_free(emu, rid, sandbox):
    assert report_left_behind_lock(sandbox) is None
    assert not [line for line in emu.control.output(rid) if "MUTEX" in line]


def test_teardown_report_survives_an_unreadable_sandbox(emu, rid, sandbox):
    emu.session().EndReservation(rid, False)
    assert report_left_behind_lock(sandbox, None) is None  # reported to the log, not raised


def test_sandbox_rwlock_reads_together_and_writes_alone(emu, rid, sandbox):
    from cloudshell_mutex.orchestration import sandbox_rwlock

    first = sandbox_rwlock(sandbox, owner="Setup", pacing=FAST)
    second = sandbox_rwlock(SimpleNamespace(automation_api=emu.session(), id=rid), owner="Check", pacing=FAST)
    with first.read(), second.read():
        assert first.read().token == second.read().token
        assert "MUTEX" in aliases(emu, rid)
    with first.write() as side:
        assert side.token.startswith("Setup@")
        assert not second.read().acquire(blocking=False)
    assert aliases(emu, rid) == []


def test_a_steps_helper_is_served_in_its_thread_and_refused_at_once_in_a_thread_with_its_context(
    emu, rid, sandbox
):
    """A step's nested sandbox_mutex is served after one read; a helper thread run in a copy of the step's
    context variables is refused at once; one without that copy is a party of its own and waits (docs)."""
    outcomes = {}

    def helper(name):
        try:
            with sandbox_mutex(sandbox, owner=name, timeout=1, pacing=FAST):
                outcomes[name] = "served"
        except Exception as error:
            outcomes[name] = type(error).__name__

    with sandbox_mutex(sandbox, owner="Configure"):
        helper("nested")
        copied = threading.Thread(target=contextvars.copy_context().run, args=(helper, "copied context"))
        bare = threading.Thread(target=helper, args=("bare thread",))
        for thread in (copied, bare):
            thread.start()
            thread.join(30)
    assert outcomes == {
        "nested": "served",
        "copied context": "MutexUsageError",
        "bare thread": "MutexTimeout",
    }
    assert [op for op, _ in lock_ops(emu, rid)] == ["service_added", "service_removed"]
