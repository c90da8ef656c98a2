"""Where the lock's log records go in a driver, with the real cloudshell-logging 2.x and shell-core 6.

cloudshell-logging routes each record by context variables that shell-core's ``LoggingSessionContext`` sets in
the command's context: a record without them goes to ``LOG_PATH/missed_logs.log``, not to the reservation's
file. The lock's background threads (the heartbeat, the late-add watcher) must therefore run in the context of
the command that took the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface
from cloudshell.shell.core.session.logging_session import LoggingSessionContext

from cloudshell_mutex import protocol
from cloudshell_mutex.demo.contexts import resource_command_context
from cloudshell_mutex.driver import ReservationMutexMixin
from cloudshell_mutex.lock.server.alias import LockAlias
from cloudshell_mutex.lock.server.late_adds import LateAdds
from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class Driver(ResourceDriverInterface, ReservationMutexMixin):
    def initialize(self, context):
        pass

    def cleanup(self):
        self.close_reservation_mutex_sessions()


@pytest.fixture
def emu(cloudshell_emulator_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    return cloudshell_emulator_factory(packages=[build_package_bytes(PackageSources.in_tree(ROOT))[0]])


def reservation_log(tmp_path: Path, reservation_id: str) -> str:
    """What the reservation's log files (LOG_PATH/<reservation>/...) hold."""
    files = [p for p in (tmp_path / "logs" / reservation_id).rglob("*.log")]
    assert files, f"no log file for reservation {reservation_id}"
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def missed_logs() -> str:
    """What cloudshell-logging's missed_logs.log holds (its handler is made once per process)."""
    for handler in logging.getLogger("cloudshell").handlers:
        if isinstance(handler, RotatingFileHandler) and handler.baseFilename.endswith("missed_logs.log"):
            handler.flush()
            path = Path(handler.baseFilename)
            return path.read_text(encoding="utf-8") if path.exists() else ""
    return ""


def run_as_a_command(work) -> None:
    """Run ``work`` the way CloudShell runs a command: in a thread of the driver's process, with a context
    of its own."""
    failures = []

    def command():
        try:
            work()
        except BaseException as error:  # shown by the assertion below
            failures.append(error)

    thread = threading.Thread(target=command)
    thread.start()
    thread.join(60)
    assert not thread.is_alive() and not failures, failures


def test_a_heartbeat_warning_from_its_thread_lands_in_the_reservations_log(emu, tmp_path):
    reservation_id = emu.create_reservation("logging")
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), reservation_id, "Router A")
    driver = Driver()

    def command():
        lock = driver.reservation_mutex(context, lease=3, cohort=False)
        with lock:
            emu.control.inject_fault("GetReservationDetails", "error_before_commit")  # the next beat's read
            deadline = time.monotonic() + 20
            while lock._held.heartbeat.beats < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lock._held.heartbeat.beats >= 2

    run_as_a_command(command)
    text = reservation_log(tmp_path, reservation_id)
    assert f"heartbeat of 'MUTEX' in reservation {reservation_id} failed" in text
    assert "cloudshell-mutex-heartbeat" in text  # written by the heartbeat thread itself
    assert reservation_id not in missed_logs()


def test_the_late_add_watcher_logs_to_the_log_of_the_command_that_handed_the_add_over(emu, tmp_path):
    reservation_id = emu.create_reservation("logging")
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), reservation_id, "Router A")
    api = emu.session()
    token = "Router A rewire@exec-02:4711:9f3a1c2b"
    watcher = LateAdds(background=True, interval=0.1)

    def command():
        # An add of the command's whose reply was lost lands after the lock gave it up: the watcher (one
        # thread per process, shared by every lock) removes it and says so.
        logger = LoggingSessionContext.get_logger_with_thread_id(context)
        owner = [AttributeNameValue(protocol.ATTR_OWNER, token)]
        api.AddServiceToReservation(reservation_id, protocol.SERVICE_MODEL, protocol.DEFAULT_ALIAS, owner)
        alias = LockAlias(api, reservation_id, logger=logger)
        watcher.watch(alias, token, time.monotonic() + 1.0, lifetime=5.0)

    run_as_a_command(command)
    deadline = time.monotonic() + 20
    while watcher.pending() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not watcher.pending()
    assert emu.control.reservation(reservation_id)["services"] == []
    text = reservation_log(tmp_path, reservation_id)
    assert "landed after the lock had given it up" in text and token in text
    assert "cloudshell-mutex-late-adds" in text
    assert token not in missed_logs()


def test_the_library_logger_has_a_null_handler():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("cloudshell_mutex").handlers)
