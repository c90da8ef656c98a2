"""Bad input through the driver mixin, ``@with_reservation_mutex`` and the Mutex Service driver's commands.

XML specials, non-ASCII, control characters and 10 kB strings where a driver puts names (the resource name
becomes the owner label; the lock's alias; Force Release's reason), malformed reservation ids in the
context, objects that are not a context, bad durations: each gets a clear error before any lock call, or
works, and leaves no lock behind. The owner label is checked for any text with Hypothesis on the test fake;
the rest against the emulator with the real client.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudshell_mutex import MutexError, MutexUsageError, protocol
from cloudshell_mutex.demo.contexts import resource_command_context
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.lock.errors import ReservationNotActive
from cloudshell_mutex.lock.holder import MAX_LABEL_LENGTH, parse_token
from cloudshell_mutex.lock.pacing import DefaultPacing

FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)
ROOT = Path(__file__).resolve().parents[2]
ODD = ["<MUTEX>&'\"", "Routeur é 東京", "tab\there\x00nul\x07bell\x1b[31m", "x" * 10_000, "@:@:", "   "]
ODD_IDS = ["xml", "non-ascii", "control", "10kB", "token-syntax", "blank"]
BAD_DURATIONS = [-1, float("nan"), float("inf"), "10", True]


class Driver(ReservationMutexMixin):
    """A driver as a shell author writes it: one command with the mixin, one with the decorator."""

    def __init__(self, api=None) -> None:
        self.api = api  # a test fake instead of a real session, when given
        self.ran = 0

    def _reservation_mutex_session(self, key):
        return self.api if self.api is not None else super()._reservation_mutex_session(key)

    def rewire(self, context, **options):
        with self.reservation_mutex(context, pacing=FAST, **options) as lock:
            self.ran += 1
            return lock.token, lock.holder()

    @with_reservation_mutex(pacing=FAST, timeout=10)
    def decorated(self, context):
        self.ran += 1
        return "done"


def context(host="127.0.0.1", port=8029, token="t0k3n", rid="res-1", resource="Router A"):
    return resource_command_context(host, port, token, rid, resource)


# ---------------------------------------------------------------- owner labels from resource names


@given(st.text(max_size=400))
@settings(max_examples=150, deadline=None)
def test_any_resource_name_becomes_a_safe_owner_label_and_the_lock_leaves_nothing(resource):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "lock"))
    from fakes import RES, FakeApi

    api = FakeApi()
    driver = Driver(api)
    token, holder = driver.rewire(context(rid=RES, resource=resource))
    info = parse_token(token)
    assert info is not None and 0 < len(info.label) <= MAX_LABEL_LENGTH
    assert not any(ord(c) < 32 or c in "<>&'\"" for c in info.label)
    assert holder.token == token
    assert protocol.DEFAULT_ALIAS not in api.services


@pytest.mark.integration
@pytest.mark.parametrize("resource", ODD, ids=ODD_IDS)
def test_odd_resource_names_work_through_the_mixin_and_the_decorator(emu_driver, resource):
    emu, rid = emu_driver
    driver = Driver()
    ctx = context(emu.host, emu.port, emu.issue_token(), rid, resource)
    token, holder = driver.rewire(ctx)
    assert holder.token == token
    assert driver.decorated(ctx) == "done" and driver.ran == 2
    driver.close_reservation_mutex_sessions()
    assert emu.control.reservation(rid)["services"] == []


# ---------------------------------------------------------------- aliases, reservation ids, contexts


@pytest.mark.integration
@pytest.mark.parametrize("name", ["MUTEX<&>'\"", "A lock: #1 \\ 100%", "a" * 200])
def test_odd_one_line_aliases_work_through_the_mixin(emu_driver, name):
    emu, rid = emu_driver
    driver = Driver()
    ctx = context(emu.host, emu.port, emu.issue_token(), rid)
    with driver.reservation_mutex(ctx, name, pacing=FAST) as lock:
        assert lock.holder().alias == name
    driver.close_reservation_mutex_sessions()
    assert emu.control.reservation(rid)["services"] == []


@pytest.mark.parametrize("name", ["", "  ", "MU\nTEX", "nul\x00", "x" * 300, None, 7])
def test_aliases_that_cannot_be_one_are_refused_before_any_call(name):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "lock"))
    from fakes import RES, FakeApi

    api = FakeApi()
    driver = Driver(api)
    with pytest.raises(ValueError, match="alias"):
        driver.reservation_mutex(context(rid=RES), name)
    with pytest.raises(ValueError, match="alias"):  # as the driver's module is imported, not at a command

        class Decorated(Driver):
            @with_reservation_mutex(name=name)
            def command(self, context):
                self.ran += 1

    assert driver.ran == 0 and api.calls == []


@pytest.mark.parametrize("rid", ["", "   "])
def test_a_context_without_a_reservation_id_is_refused(rid):
    with pytest.raises(MutexUsageError, match="belongs to no reservation"):
        Driver().reservation_mutex(context(rid=rid))


@pytest.mark.parametrize("rid", ["line\nbreak", "nul\x00", "x" * 300])
def test_reservation_ids_that_cannot_be_one_are_refused_before_any_call(rid):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "lock"))
    from fakes import FakeApi

    api = FakeApi()
    with pytest.raises(ValueError, match="reservation_id"):
        Driver(api).reservation_mutex(context(rid=rid))
    assert api.calls == []


@pytest.mark.integration
@pytest.mark.parametrize("rid", ["not-a-uuid", "x' or '1'='1", "<Reservation/>", "é" * 100])
def test_ids_of_no_reservation_get_a_clear_error_through_the_decorator(emu_driver, rid):
    emu, _ = emu_driver
    driver = Driver()
    with pytest.raises(ReservationNotActive, match="was not found"):
        driver.decorated(context(emu.host, emu.port, emu.issue_token(), rid))
    assert driver.ran == 0
    driver.close_reservation_mutex_sessions()


@pytest.mark.parametrize("thing", [None, "a context", {"reservation": {"reservation_id": "r"}}, 42, object()])
def test_things_that_are_not_a_command_context_are_refused(thing):
    with pytest.raises(MutexUsageError, match="belongs to no reservation"):
        Driver().reservation_mutex(thing)
    with pytest.raises((MutexUsageError, TypeError)):
        Driver().decorated(thing)


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize("value", BAD_DURATIONS[:5], ids=["negative", "nan", "inf", "string", "bool"])
@pytest.mark.parametrize("option", ["timeout", "lease", "request_lifetime"])
def test_bad_durations_through_the_mixin_and_the_decorator_are_refused_before_any_call(option, value):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "lock"))
    from fakes import RES, FakeApi

    api = FakeApi()
    with pytest.raises((TypeError, ValueError), match=option):
        Driver(api).reservation_mutex(context(rid=RES), **{option: value})

    class Decorated(Driver):
        @with_reservation_mutex(**{option: value})
        def command(self, context):
            self.ran += 1

    decorated = Decorated(api)
    with pytest.raises((TypeError, ValueError), match=option):
        decorated.command(context(rid=RES))
    assert decorated.ran == 0 and api.calls == []


@pytest.mark.parametrize("option", ["timeout", "lease", "request_lifetime", "holder_check_interval"])
def test_absurd_durations_through_the_mixin_work(option, monkeypatch):
    """10**12 s (31,700 years) is a mistake more often than not, but it is a duration: the lock works with
    it. A lease that long once killed the heartbeat thread (a wait past threading.TIMEOUT_MAX)."""
    import sys
    import threading

    from cloudshell_mutex.lock.server.catalog import FULL

    sys.path.insert(0, str(ROOT / "tests" / "lock"))
    from fakes import RES, FakeApi

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    api = FakeApi(attributes=[protocol.ATTR_OWNER, *sorted(FULL)])  # our model: the lease is kept
    token, holder = Driver(api).rewire(context(rid=RES), **{option: 10**12}, on_danger=died.append)
    assert holder.token == token and protocol.DEFAULT_ALIAS not in api.services
    driver = Driver(api)
    with driver.reservation_mutex(context(rid=RES), pacing=FAST, **{option: 10**12}) as lock:
        threading.Event().wait(0.3)  # the heartbeat thread's first wait has begun
        lock.ensure_held()
    assert died == []


# ---------------------------------------------------------------- the Mutex Service driver's commands


def mutex_service_driver():
    spec = importlib.util.spec_from_file_location(
        "mutex_service_driver", ROOT / "drivers" / "mutex_service" / "driver.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MutexServiceDriver()


@pytest.mark.integration
@pytest.mark.parametrize("reason", [*ODD[:4], "multi\nline\nreason"], ids=[*ODD_IDS[:4], "multi-line"])
def test_force_release_with_odd_reasons_releases_and_writes_a_clean_record(emu_driver, reason):
    emu, rid = emu_driver
    holder = Driver()
    ctx = context(emu.host, emu.port, emu.issue_token(), rid, resource="<Holder> é")
    lock = holder.reservation_mutex(ctx, pacing=FAST)
    lock.acquire()
    service = mutex_service_driver()
    command = context(emu.host, emu.port, emu.issue_token(), rid, resource=protocol.DEFAULT_ALIAS)
    status = service.LockStatus(command)
    assert lock.token in status
    answer = service.ForceRelease(command, reason)
    assert lock.token in answer and "force-released" in answer
    assert emu.control.reservation(rid)["services"] == []
    output = "\n".join(emu.control.output(rid))
    assert "force-released" in output
    assert not any(c in output for c in "\x00\x07\x1b")  # control characters never reach the output
    assert len(output) < 5_000  # a 10 kB reason is cut, not copied whole into every user's output
    service.cleanup()
    holder.close_reservation_mutex_sessions()


@pytest.mark.integration
@pytest.mark.parametrize("reason", ["", "   ", None, "\x00\x07"])
def test_force_release_without_a_real_reason_is_refused_and_removes_nothing(emu_driver, reason):
    emu, rid = emu_driver
    holder = Driver()
    lock = holder.reservation_mutex(context(emu.host, emu.port, emu.issue_token(), rid), pacing=FAST)
    lock.acquire()
    service = mutex_service_driver()
    command = context(emu.host, emu.port, emu.issue_token(), rid, resource=protocol.DEFAULT_ALIAS)
    with pytest.raises(MutexError, match="needs a reason"):
        service.ForceRelease(command, reason)
    assert lock.holder().token == lock.token
    lock.release()
    service.cleanup()
    holder.close_reservation_mutex_sessions()


@pytest.mark.integration
@pytest.mark.parametrize("alias", ["MUTEX<&>'\"", "A lock: #1 \\ 100%", "a" * 200])
def test_the_commands_on_a_service_with_an_odd_alias_act_on_that_alias(emu_driver, alias):
    emu, rid = emu_driver
    holder = Driver()
    ctx = context(emu.host, emu.port, emu.issue_token(), rid)
    lock = holder.reservation_mutex(ctx, alias, pacing=FAST)
    lock.acquire()
    service = mutex_service_driver()
    command = context(emu.host, emu.port, emu.issue_token(), rid, resource=alias)
    assert lock.token in service.LockStatus(command)
    assert lock.token in service.ForceRelease(command, "stuck <driver> & é")
    assert emu.control.reservation(rid)["services"] == []
    service.cleanup()
    holder.close_reservation_mutex_sessions()


@pytest.mark.integration
@pytest.mark.parametrize("alias", ["MUTEX\u200b", "\u041cUTEX"])
def test_the_commands_on_a_look_alike_service_show_it_escaped_and_remove_only_it(emu_driver, alias):
    """A Mutex Service whose alias only looks like MUTEX (made by other code: no lock of ours takes such a
    name) is still the service the commands run on: shown escaped and flagged, removed by its own alias."""
    from cloudshell.api.cloudshell_api import AttributeNameValue

    emu, rid = emu_driver
    api = emu.session()
    for service, owner in ((protocol.DEFAULT_ALIAS, "holder@h:1:0123456789abcdef"), (alias, "other code")):
        attributes = [AttributeNameValue(protocol.ATTR_OWNER, owner)]
        api.AddServiceToReservation(rid, protocol.SERVICE_MODEL, service, attributes)
    service = mutex_service_driver()
    command = context(emu.host, emu.port, emu.issue_token(), rid, resource=alias)
    status = service.LockStatus(command)
    shown = protocol.shown_name(alias)
    assert f"{shown} (not a lock name: " in status and "'other code'" in status
    assert alias not in status and status.isascii()  # never the look-alike itself
    answer = service.ForceRelease(command, "a look-alike of MUTEX")
    assert "force-released" in answer and shown in answer
    assert [s["alias"] for s in emu.control.reservation(rid)["services"]] == [protocol.DEFAULT_ALIAS]
    service.cleanup()


@pytest.mark.integration
@pytest.mark.parametrize("rid", ["not-a-uuid", "<Reservation/>", "line\nbreak"])
def test_the_commands_in_a_context_with_a_malformed_reservation_id_fail_clearly(emu_driver, rid):
    emu, _ = emu_driver
    service = mutex_service_driver()
    command = context(emu.host, emu.port, emu.issue_token(), rid, resource=protocol.DEFAULT_ALIAS)
    for run in (lambda: service.LockStatus(command), lambda: service.ForceRelease(command, "why")):
        with pytest.raises((MutexError, ValueError)) as raised:
            run()
        assert "reservation" in str(raised.value).lower()
    service.cleanup()


@pytest.fixture
def emu_driver(cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    return emu, emu.create_reservation("bad input")
