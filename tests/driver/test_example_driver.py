"""examples/driver: the example driver, imported from its file and run against the emulator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cloudshell_mutex import ReservationMutex
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
