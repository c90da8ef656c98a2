"""EmulatedSite's helpers for trying things locally: the sandbox output as the portal shows it, and the Mutex
Service driver's commands (Lock Status, Force Release) run from the package the emulator imported, with the
installed library (the driver zip bundles part of it: on sys.path it would hide the installed one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cloudshell_mutex import MutexError, ReservationMutex
from cloudshell_mutex.emulated import EmulatedSite
from cloudshell_mutex.packaging.build import PackageSources, build_package

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(cloudshell_emulator_factory, tmp_path, monkeypatch):
    """What `make emulator` gives, on free ports: this tree's package built into dist/ and imported."""
    package = tmp_path / "dist" / "Mutex_Package.zip"
    build_package(PackageSources.in_tree(ROOT), package)
    emu = cloudshell_emulator_factory(packages=[package])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu.add_user("rob", "rob-pw")
    return EmulatedSite(emu.host, emu.port, quali_port=emu.quali_port)


def test_the_mutex_service_commands_run_against_the_emulator(site):
    sandbox_id = site.create_sandbox("Try the Mutex Service driver")
    stuck = ReservationMutex(site.session(), sandbox_id, owner="Crashed driver", lease=0)
    assert stuck.acquire(timeout=10)

    status = site.mutex_service_command(sandbox_id, "Lock Status")
    assert "is held by Crashed driver" in status and stuck.token in status
    assert site.mutex_service_command(sandbox_id, "LockStatus") == status  # the method's name works too

    with pytest.raises(MutexError, match="rob is neither a system administrator"):
        site.mutex_service_command(sandbox_id, "Force Release", reason="stuck", running_user="rob")
    released = site.mutex_service_command(sandbox_id, "Force Release", reason="driver crashed on exec-02")
    assert "force-released 'MUTEX'" in released and "Reason: driver crashed on exec-02" in released
    assert site.output(sandbox_id)[-1] == f"WARNING: {released}"  # the record, without the pane's markup
    assert "is free" in site.mutex_service_command(sandbox_id, "Lock Status")
    assert not any(name.startswith("mutex_service_driver") for name in sys.modules)  # nothing registered


def test_a_wrong_command_or_a_missing_package_says_what_to_do(site, tmp_path):
    sandbox_id = site.create_sandbox()
    with pytest.raises(ValueError, match="its commands: Force Release, Lock Status"):
        site.mutex_service_command(sandbox_id, "Unlock")
    with pytest.raises(FileNotFoundError, match="build it with `make package`"):
        site.mutex_service_command(sandbox_id, "Lock Status", package=tmp_path / "nowhere.zip")


def test_the_output_is_read_as_people_read_it(site):
    sandbox_id = site.create_sandbox()
    api = site.session()
    api.WriteMessageToReservationOutput(sandbox_id, "a &lt;b&gt; c")
    api.WriteMessageToReservationOutput(sandbox_id, '<span style="color: red">warned</span>')
    assert site.output(sandbox_id) == ["a <b> c", "warned"]


def test_print_lock_log_shows_the_locks_lines_and_not_shell_cores_banner(site):
    """A driver command logs through shell-core's per-command logger, which begins with the list of every
    installed package: a local run that turns logging on saw that before each of the lock's lines."""
    import io
    import logging

    from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
    from cloudshell_mutex.emulated import print_lock_log

    class Driver(ReservationMutexMixin):
        @with_reservation_mutex(lease=30)
        def rewire(self, context):
            return "done"

    sandbox_id = site.create_sandbox()
    shown = io.StringIO()
    banner = io.StringIO()  # what a plain logging setup shows of the same command
    plain = logging.StreamHandler(banner)
    logging.getLogger().addHandler(plain)
    handler = print_lock_log(stream=shown)
    try:
        assert Driver().rewire(site.driver_context(sandbox_id)) == "done"
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().removeHandler(plain)
    lines = shown.getvalue().splitlines()
    assert any("cloudshell-mutex: acquired MUTEX" in line for line in lines)
    assert any("cloudshell-mutex: released MUTEX" in line for line in lines)
    assert all("cloudshell-mutex" in line for line in lines)
    assert "Installed Packages" in banner.getvalue()  # the banner is there, and stays out of the lock's lines
