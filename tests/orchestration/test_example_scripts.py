"""examples/orchestration: the setup and teardown scripts, run with orch-core's real Sandbox against the
emulator, with the environment variables CloudShell sets for scripts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cloudshell_mutex import ReservationMutex
from cloudshell_mutex.demo.contexts import sandbox_environment, scripts_honour_api_port

pytestmark = pytest.mark.integration
pytest.importorskip("cloudshell.workflow.orchestration.sandbox")  # orch-core is in .venv only

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "orchestration"


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sandbox(cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    emu.add_resource_model("Switch", "Switches")
    api = emu.session()
    for name in ("S1", "S2", "S3"):
        api.CreateResource("Switches", "Switch", name, "")
    rid = emu.create_reservation("example scripts")
    api.AddResourcesToReservation(rid, ["S1", "S2", "S3"])
    for key, value in sandbox_environment(emu.host, emu.port, emu.issue_token(), rid).items():
        monkeypatch.setenv(key, value)
    with scripts_honour_api_port():
        yield emu, rid


def connectors(emu, rid):
    return sorted(
        "--".join(sorted((c["source"], c["target"]))) for c in emu.control.reservation(rid)["connectors"]
    )


def lock_owners(emu, rid):
    events = emu.control.events(rid)
    return [
        e["attributes"].get("Mutex Owner", "").split("@")[0] for e in events if e["op"] == "service_added"
    ]


def test_setup_then_teardown(sandbox):
    emu, rid = sandbox
    load_example("setup_script").main()
    assert connectors(emu, rid) == ["S1--S2", "S2--S3"]
    assert "Setup connected 2 pair(s) of resources" in emu.control.output(rid)
    load_example("teardown_script").main()
    assert connectors(emu, rid) == []
    assert lock_owners(emu, rid) == ["Setup", "Teardown"]
    assert not [line for line in emu.control.output(rid) if "left behind" in line]


def test_teardown_reports_a_left_behind_lock_and_does_not_touch_the_sandbox(sandbox, monkeypatch):
    emu, rid = sandbox
    load_example("setup_script").main()
    stuck = ReservationMutex(emu.session(), rid, owner="Switch driver")
    stuck.acquire()
    teardown = load_example("teardown_script")
    monkeypatch.setattr(teardown, "LOCK_TIMEOUT", 0.5)
    teardown.main()
    output = emu.control.output(rid)
    assert any("left behind: held by Switch driver" in line for line in output)
    assert any(line.startswith("Teardown left the connectors alone:") for line in output)
    assert connectors(emu, rid) == ["S1--S2", "S2--S3"]
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == ["MUTEX"]
    stuck.release()
