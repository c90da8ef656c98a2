"""examples/driver: the example driver, imported from its file and run against the emulator.

Its commands declare ``cancellation_context``: they also run in a process of their own, as on an execution
server, with shell-core's real ``CancellationContext``, which a thread flips when the test says (as CloudShell
does when someone clicks Stop). ``@with_reservation_mutex`` and ``self.reservation_mutex(context)`` pick the
argument up by themselves, whether shell-core passes it by keyword or by position.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Dict

import pytest
from cloudshell.shell.core.driver_context import CancellationContext

from cloudshell_mutex import MutexCancelled, ReservationMutex
from cloudshell_mutex.demo.contexts import resource_command_context

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "driver" / "driver.py"


def load_example():
    spec = importlib.util.spec_from_file_location("example_patch_panel_driver", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sandbox(cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    emu.add_resource_model("Patch Panel", "Panels")
    api = emu.session()
    for name in ("P1", "P2", "P3"):
        api.CreateResource("Panels", "Patch Panel", name, "")
    rid = emu.create_reservation("example driver")
    api.AddResourcesToReservation(rid, ["P1", "P2", "P3"])
    return emu, rid


def connectors(emu, rid):
    return sorted(
        "--".join(sorted((c["source"], c["target"]))) for c in emu.control.reservation(rid)["connectors"]
    )


def lock_ops(emu, rid):
    return [
        (e["op"], e["attributes"].get("Mutex Owner", ""))
        for e in emu.control.events(rid)
        if e["alias"] == "MUTEX"
    ]


def test_example_driver_commands_run_under_the_lock(sandbox):
    emu, rid = sandbox
    driver = load_example().PatchPanelDriver()
    driver.initialize(None)

    def context(resource):
        return resource_command_context(emu.host, emu.port, emu.issue_token(), rid, resource)

    assert driver.connect(context("P1"), "P2") == "connected P1 to P2"
    assert driver.connect(context("P1"), "P3") == "connected P1 to P3"
    assert driver.connect(context("P2"), "P1") == "P2 and P1 are already connected"
    assert connectors(emu, rid) == ["P1--P2", "P1--P3"]
    assert driver.disconnect_all(context("P1")) == "removed 2 connector(s) of P1"
    assert connectors(emu, rid) == []
    driver.cleanup()
    owners = [owner.split("@")[0] for op, owner in lock_ops(emu, rid) if op == "service_added"]
    assert owners == ["P1 connect", "P1 connect", "P2 connect", "P1 disconnect_all"]
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == []


def test_example_driver_waits_for_a_holder(sandbox):
    emu, rid = sandbox
    driver = load_example().PatchPanelDriver()
    holder = ReservationMutex(emu.session(), rid, owner="setup script")
    holder.acquire()
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), rid, "P1")
    lock = driver.reservation_mutex(context, timeout=0.5)
    assert not lock.acquire(blocking=False)  # the driver's lock is the same MUTEX the script holds
    holder.release()
    assert driver.connect(context, "P2") == "connected P1 to P2"


# ---------------------------------------------------------------- the Stop button


def command_worker(host: str, port: int, token: str, rid: str, command: str, how: str, stop, out) -> None:
    """Run one command of the example driver, cancelled through a real CancellationContext when ``stop``."""
    report: Dict[str, Any] = {"error": None}
    try:
        cancellation = CancellationContext()

        def click_stop() -> None:
            stop.wait(120)
            cancellation.is_cancelled = True

        threading.Thread(target=click_stop, daemon=True).start()
        driver = load_example().PatchPanelDriver()
        context = resource_command_context(host, port, token, rid, "P1")
        arguments = ("P2",) if command == "connect" else ()
        out.put("running")
        try:
            if how == "keyword":
                getattr(driver, command)(context, *arguments, cancellation_context=cancellation)
            else:
                getattr(driver, command)(context, *arguments, cancellation)
            report["finished"] = True
        except MutexCancelled as error:
            report["cancelled_at"] = time.monotonic()
            report["message"] = str(error)
        driver.cleanup()
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
    out.put(report)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, how",
    [("connect", "keyword"), ("disconnect_all", "positional"), ("disconnect_all", "keyword")],
)
def test_stop_ends_a_commands_wait_for_the_lock_within_a_second(sandbox, command, how):
    emu, rid = sandbox
    holder = ReservationMutex(emu.session(), rid, owner="Setup")
    holder.acquire()
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    args = (emu.host, emu.port, emu.issue_token(), rid, command, how, stop, out)
    process = ctx.Process(target=command_worker, args=args, daemon=True)
    process.start()
    try:
        assert out.get(timeout=60) == "running"
        time.sleep(2.0)  # the command waits (its timeout is 600 s)
        stop.set()
        clicked = time.monotonic()
        report = out.get(timeout=60)
    finally:
        process.join(30)
        process.kill()
    assert report["error"] is None, report["error"]
    assert "cancelled_at" in report, report  # MutexCancelled, not a finished command nor a timeout
    print(
        f"\n{command} ({how}): Stop ended the wait {(report['cancelled_at'] - clicked) * 1000:.0f} ms later"
    )
    assert 0 <= report["cancelled_at"] - clicked < 1.0
    assert "held by Setup" in report["message"]
    services = emu.control.reservation(rid)["services"]
    assert [(s["alias"], s["attributes"]["Mutex Owner"]) for s in services] == [("MUTEX", holder.token)]
    assert emu.control.reservation(rid)["connectors"] == []  # the command did nothing
    holder.release()


def test_a_cancellation_never_interrupts_the_work_under_a_held_lock(sandbox):
    """Already cancelled, an uncontended command still takes the lock and finishes (the check is made only
    while waiting): cancelling work in progress is the command's own business."""
    emu, rid = sandbox
    stopped = CancellationContext()
    stopped.is_cancelled = True
    driver = load_example().PatchPanelDriver()
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), rid, "P1")
    assert driver.connect(context, "P2", cancellation_context=stopped) == "connected P1 to P2"
    assert driver.disconnect_all(context, stopped) == "removed 1 connector(s) of P1"
    assert emu.control.reservation(rid)["services"] == []
    driver.cleanup()


def test_the_example_driver_declares_cancellation_for_its_locking_commands():
    root = ElementTree.parse(EXAMPLE.parent / "drivermetadata.xml").getroot()
    commands = {c.get("Name"): c.get("EnableCancellation") for c in root.iter("Command")}
    assert commands == {"connect": "true", "disconnect_all": "true"}
