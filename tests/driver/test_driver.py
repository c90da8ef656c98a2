"""ReservationMutexMixin and @with_reservation_mutex on real shell-core contexts, against the emulator."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface
from driver_support import context_for

from cloudshell_mutex import MutexTimeout, MutexUsageError, ReservationMutex
from cloudshell_mutex.demo.contexts import autoload_context
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


class Driver(ResourceDriverInterface, ReservationMutexMixin):
    """A driver as a shell author writes it."""

    def __init__(self) -> None:
        self.seen = []

    def initialize(self, context):
        pass

    def cleanup(self):
        self.close_reservation_mutex_sessions()

    def rewire(self, context):
        with self.reservation_mutex(context, pacing=FAST) as lock:
            self.seen.append(lock.holder())
            return lock.token

    @with_reservation_mutex
    def bare_command(self, context, value):
        self.seen.append(self._holder_now(context))
        return value * 2

    @with_reservation_mutex(name="CONFIG", timeout=1, pacing=FAST)
    def configured_command(self, context):
        self.seen.append(self._holder_now(context, alias="CONFIG"))

    @with_reservation_mutex
    def failing_command(self, context):
        raise RuntimeError("device said no")

    def _holder_now(self, context, alias="MUTEX"):
        return self.reservation_mutex(context, alias, owner="observer").holder()


@pytest.fixture
def rid(emu):
    return emu.create_reservation("driver tests")


def services(emu, rid):
    return [s["alias"] for s in emu.control.reservation(rid)["services"]]


def test_the_session_uses_the_contexts_api_port_and_token(emu, rid):
    assert emu.port != 8029  # shell-core's CloudShellSessionContext would call 8029 and fail here
    driver = Driver()
    token = driver.rewire(context_for(emu, rid))
    assert token.startswith("Router A rewire@")  # resource name and command name
    assert driver.seen[0].token == token
    assert services(emu, rid) == []
    assert [e["op"] for e in emu.control.events(rid) if e["alias"] == "MUTEX"] == [
        "service_added",
        "service_removed",
    ]


def test_remote_command_context_locks_the_remote_reservation(emu, rid):
    driver = Driver()
    token = driver.rewire(context_for(emu, rid, resource="Port 3", remote=True))
    assert token.startswith("Port 3 rewire@")
    assert services(emu, rid) == []


def test_autoload_context_is_refused_before_any_call(emu):
    driver = Driver()
    emu.control.reset_counts()
    context = autoload_context(emu.host, emu.port, emu.issue_token(), "Router A")
    with pytest.raises(MutexUsageError, match="AutoLoadCommandContext belongs to no reservation"):
        driver.reservation_mutex(context)
    assert emu.control.call_counts() == {}


def test_a_bad_api_port_gets_a_clear_error(emu, rid):
    context = context_for(emu, rid)
    context.connectivity.cloudshell_api_port = "not-a-port"
    with pytest.raises(MutexUsageError, match="cloudshell_api_port is 'not-a-port'"):
        Driver().reservation_mutex(context)


def test_decorator_holds_the_lock_for_the_whole_command(emu, rid):
    driver = Driver()
    assert driver.bare_command(context_for(emu, rid), 21) == 42
    assert driver.bare_command(context=context_for(emu, rid), value=1) == 2
    assert [h.token.split("@")[0] for h in driver.seen] == ["Router A bare_command"] * 2
    assert services(emu, rid) == []


def test_decorator_options_reach_the_lock(emu, rid):
    driver = Driver()
    driver.configured_command(context_for(emu, rid))
    assert driver.seen[0].alias == "CONFIG"
    assert driver.seen[0].token.startswith("Router A configured_command@")
    # timeout=1 reached the lock: a held CONFIG makes the command time out instead of waiting 300 s.
    other = ReservationMutex(emu.session(), rid, owner="someone else", name="CONFIG")
    other.acquire()
    try:
        with pytest.raises(MutexTimeout) as caught:
            driver.configured_command(context_for(emu, rid))
        assert 1 <= caught.value.waited < 30
    finally:
        other.release()


def test_decorator_releases_when_the_command_fails(emu, rid):
    with pytest.raises(RuntimeError, match="device said no"):
        Driver().failing_command(context_for(emu, rid))
    assert services(emu, rid) == []


def test_decorator_on_a_class_without_the_mixin_says_what_to_do(emu, rid):
    class Plain:
        @with_reservation_mutex
        def command(self, context):
            return 1

    with pytest.raises(TypeError, match="add it to the driver class's bases"):
        Plain().command(context_for(emu, rid))


def test_sessions_are_reused_per_token_and_closed_by_cleanup(emu, rid):
    driver = Driver()
    token = emu.issue_token()
    emu.control.reset_counts()
    for _ in range(3):
        driver.rewire(context_for(emu, rid, token=token))
    assert emu.control.call_counts()["SecureLogon"] == 1
    driver.rewire(context_for(emu, rid))  # a new token (a new command run): a new session
    assert emu.control.call_counts()["SecureLogon"] == 2
    driver.cleanup()
    assert "_reservation_mutex_sessions" not in vars(driver)
    driver.rewire(context_for(emu, rid, token=token))  # usable again after cleanup
    assert emu.control.call_counts()["SecureLogon"] == 3


def test_logs_go_to_the_command_log_and_never_hold_the_token(emu, rid, tmp_path, caplog):
    token = emu.issue_token()
    caplog.set_level(logging.DEBUG)
    Driver().rewire(context_for(emu, rid, token=token))
    log_files = list((tmp_path / "logs" / rid).rglob("*.log"))
    assert log_files, "LoggingSessionContext writes under $LOG_PATH/<reservation id>/"
    text = "".join(Path(f).read_text(errors="replace") for f in log_files) + caplog.text
    assert "MUTEX" in text
    assert token not in text


def test_the_commands_own_session_has_no_socket_timeout_and_the_locks_has_one(emu, rid):
    driver = Driver()
    context = context_for(emu, rid)
    own = driver.cloudshell_api(context)
    assert driver.cloudshell_api(context) is own  # reused
    lock_api = driver.reservation_mutex(context).api
    assert lock_api is not own
    # urllib3's pool-wide timeout: none for the command (ExecuteCommand may run long), 60 s for the lock.
    assert own._http.connection_pool_kw.get("timeout") is None
    assert lock_api._http.connection_pool_kw.get("timeout") == Driver.reservation_mutex_api_timeout == 60.0
    assert own.port == lock_api.port == str(emu.port)


def test_options_given_positionally_to_the_decorator_are_refused():
    with pytest.raises(TypeError, match=r"by keyword: @with_reservation_mutex\(name=...\)"):
        with_reservation_mutex("CONFIG")


def test_concurrent_commands_on_one_driver_object_take_turns(emu, rid):
    # CloudShell runs commands of a SupportsConcurrentCommands driver in threads of one driver object.
    intervals = []

    class Concurrent(Driver):
        @with_reservation_mutex(pacing=FAST)
        def slow_command(self, context):
            start = time.monotonic()
            time.sleep(0.2)
            intervals.append((start, time.monotonic()))

    driver = Concurrent()
    token = emu.issue_token()
    threads = [
        threading.Thread(target=driver.slow_command, args=(context_for(emu, rid, token=token),))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    spans = sorted(intervals)
    assert len(spans) == 3
    assert all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:]))
    assert len(vars(driver)["_reservation_mutex_sessions"]) == 1  # one session for the token, however raced


class RWDriver(Driver):
    def look(self, context):
        with self.reservation_rwlock(context, pacing=FAST).read() as side:
            return side.token

    def change(self, context):
        with self.reservation_rwlock(context, pacing=FAST).write() as side:
            return side.token


def test_reservation_rwlock_reads_together_and_writes_alone(emu, rid):
    driver = RWDriver()
    context = context_for(emu, rid)
    first = driver.reservation_rwlock(context, pacing=FAST)
    second = driver.reservation_rwlock(context, pacing=FAST)
    with first.read(), second.read():
        assert first.read().token == second.read().token  # one read group
        assert first.read().token.startswith("read-group#Router A test_reservation_rwlock")
        assert sorted(a for a in services(emu, rid) if "~r" in a) == sorted(
            [first.read()._slot.name, second.read()._slot.name]
        )
        assert not driver.reservation_rwlock(context, pacing=FAST).write().acquire(blocking=False)
    assert driver.look(context).startswith("read-group#Router A look@")
    assert driver.change(context).startswith("Router A change@")
    assert services(emu, rid) == []
    driver.cleanup()
