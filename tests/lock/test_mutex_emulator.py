"""ReservationMutex against the emulator, with the real CloudShellAPISession (single process).

Most tests install the *original* Mutex_Package (only ``Mutex Owner``): that also proves the lock
works on a server that never got our package. Multi-process exclusion is in test_lock_exclusion.py.
"""

from __future__ import annotations

import contextvars
import io
import logging
import time
import zipfile
from pathlib import Path

import pytest

from client_features import CLIENT_RESENDS
from cloudshell_mutex import MutexLostError, MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.errors import MutexNotInstalled, MutexPermissionError, ReservationNotActive
from cloudshell_mutex.lock.pacing import DefaultPacing
from cloudshell_mutex.lock.server import catalog
from original_protocol import OriginalMutex

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip):
    return cloudshell_emulator_factory(packages=[original_package_zip])


@pytest.fixture
def rid(emu):
    return emu.create_reservation("lock tests")


def mutex(api, rid, **kwargs) -> ReservationMutex:
    kwargs.setdefault("pacing", FAST)
    kwargs.setdefault("owner", "test driver")
    return ReservationMutex(api, rid, **kwargs)


def lock_events(emu, rid, alias=protocol.DEFAULT_ALIAS):
    return [
        (e["op"], e["attributes"].get(protocol.ATTR_OWNER))
        for e in emu.control.events(rid)
        if e["alias"] == alias
    ]


def current_owner(emu, rid, alias=protocol.DEFAULT_ALIAS):
    for service in emu.control.reservation(rid)["services"]:
        if service["alias"] == alias:
            return service["attributes"].get(protocol.ATTR_OWNER)
    return None


# ---------------------------------------------------------------- the common case


CYCLE = {"AddServiceToReservation": 1, "GetReservationDetails": 1, "RemoveServicesFromReservation": 1}


def test_uncontended_cycle_costs_three_api_calls(emu, rid):
    """Add, the ownership read before the remove, remove. The first add of a process finds out that the
    original model does not take our attributes (one more add), once per process and server."""
    api = emu.session()
    control = emu.control
    control.reset_counts()
    with mutex(api, rid) as first:
        assert current_owner(emu, rid) == first.token
    assert control.call_counts() == {**CYCLE, "AddServiceToReservation": 2}

    for _ in range(3):  # learned once per process and server
        control.reset_counts()
        with mutex(api, rid):
            pass
        assert control.call_counts() == CYCLE


def test_the_two_call_cycle_is_an_opt_in(emu, rid):
    api = emu.session()
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)
    emu.control.reset_counts()
    with mutex(api, rid, release_check_after=5):
        pass
    assert emu.control.call_counts() == {"AddServiceToReservation": 1, "RemoveServicesFromReservation": 1}
    assert current_owner(emu, rid) is None


def test_writes_only_mutex_owner_on_a_server_with_the_original_package(emu, rid):
    with mutex(emu.session(), rid) as held:
        (service,) = emu.control.reservation(rid)["services"]
        assert service["attributes"] == {protocol.ATTR_OWNER: held.token}


def test_writes_lease_attributes_when_the_installed_model_has_them(cloudshell_emulator_factory):
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(ROOT / "package" / "metadata.xml", "metadata.xml")
        archive.write(ROOT / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    emu = cloudshell_emulator_factory(packages=[package.getvalue()])
    rid = emu.create_reservation()
    api = emu.session()
    emu.control.reset_counts()
    with mutex(api, rid, owner="Router A driver") as held:
        (service,) = emu.control.reservation(rid)["services"]
        attributes = service["attributes"]
        assert attributes[protocol.ATTR_OWNER] == held.token
        assert attributes[protocol.ATTR_LABEL] == "Router A driver"
        assert attributes[protocol.ATTR_LEASE_SECONDS] == "60"  # the default lease
        assert attributes[protocol.ATTR_HEARTBEAT].endswith(":0")
    assert emu.control.call_counts() == CYCLE  # our model takes our attributes at once


def test_holder_reads_fresh_and_names_the_owner(emu, rid):
    api = emu.session()
    lock = mutex(api, rid, owner="Router A driver")
    assert lock.holder() is None
    with lock:
        holder = lock.holder()
        assert holder.token == lock.token and holder.label.startswith("Router A driver")
    with OriginalMutex(
        emu.session(), rid, variant="v2", my_unique_name="legacy driver 7", sleep_range=(0.01, 0.02)
    ):
        assert lock.holder().token == "legacy driver 7"
    with OriginalMutex(emu.session(), rid, variant="v1", sleep_range=(0.01, 0.02)):
        holder = lock.holder()
        assert holder.token == "" and "original protocol v1" in holder.label


# ---------------------------------------------------------------- ambiguity and transient faults


@pytest.mark.client_resend
def test_dropped_after_commit_add_resolves_to_acquired(emu, rid):
    """The add commits, the connection closes without a response, the real client retries by
    itself and its retry gets "already exists" - caused by our own add."""
    api = emu.session()
    control = emu.control
    seen = []
    lock = mutex(api, rid, on_event=seen.append)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)  # as after this process's first add
    control.inject_fault("AddServiceToReservation", "drop_after_commit")
    control.reset_counts()
    assert lock.acquire(timeout=20) is True
    assert current_owner(emu, rid) == lock.token
    assert [e.kind for e in seen] == ["resolved", "acquired"]
    # The client sent the add twice (its own retry); the lock added one fresh read.
    assert control.call_counts() == {"AddServiceToReservation": 2, "GetReservationDetails": 1}
    token = lock.token
    lock.release()
    assert lock_events(emu, rid) == [("service_added", token), ("service_removed", token)]


def test_error_before_commit_backs_off_and_acquires(emu, rid):
    api = emu.session()
    control = emu.control
    seen = []
    lock = mutex(api, rid, on_event=seen.append)
    control.inject_fault("AddServiceToReservation", "error_before_commit", count=2)
    assert lock.acquire(timeout=20) is True
    assert [e.kind for e in seen] == ["transient", "transient", "acquired"]
    token = lock.token
    lock.release()
    assert lock_events(emu, rid) == [("service_added", token), ("service_removed", token)]


def test_dropped_after_commit_remove_counts_as_released(emu, rid):
    api = emu.session()
    lock = mutex(api, rid)
    lock.acquire()
    emu.control.inject_fault("RemoveServicesFromReservation", "drop_after_commit")
    lock.release()
    assert not lock.locked()
    assert current_owner(emu, rid) is None
    lock.release()  # idempotent


# ---------------------------------------------------------------- fatal errors


def test_missing_model_raises_at_once_with_the_fix(cloudshell_emulator):
    emu = cloudshell_emulator  # no package imported
    rid = emu.create_reservation()
    api = emu.session()
    started = time.monotonic()
    with pytest.raises(MutexNotInstalled, match=r"import Mutex_Package\.zip"):
        mutex(api, rid, timeout=60).acquire()
    assert time.monotonic() - started < 2.0
    # With our attributes, with Mutex Owner alone, and with none: all refused, so the model is missing.
    assert emu.control.call_counts().get("AddServiceToReservation") == 3


def test_ended_reservation_raises(emu, rid):
    api = emu.session()
    api.EndReservation(rid)
    started = time.monotonic()
    with pytest.raises(ReservationNotActive, match="has ended"):
        mutex(api, rid, timeout=60).acquire()
    assert time.monotonic() - started < 2.0


def test_unknown_reservation_raises(emu):
    with pytest.raises(ReservationNotActive, match="not found"):
        mutex(emu.session(), "00000000-0000-0000-0000-000000000000", timeout=60).acquire()


# ---------------------------------------------------------------- waiting, timeout, release safety


def test_timeout_raises_names_the_holder_and_removes_nothing(emu, rid):
    holder = mutex(emu.session(), rid, owner="Router B driver")
    holder.acquire()
    waiter = mutex(emu.session(), rid, owner="Router A driver")
    started = time.monotonic()
    with pytest.raises(MutexTimeout) as caught:
        waiter.acquire(timeout=0.6)
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 1.5
    assert "Router B driver" in str(caught.value) and "nothing was removed" in str(caught.value)
    assert caught.value.held_for >= 0.5 and not caught.value.maybe_held
    assert not waiter.locked()
    assert current_owner(emu, rid) == holder.token
    assert lock_events(emu, rid) == [("service_added", holder.token)]
    waiter.release()  # not held: removes nothing
    assert current_owner(emu, rid) == holder.token
    holder.release()


def test_non_blocking_makes_one_attempt(emu, rid):
    holder = mutex(emu.session(), rid)
    holder.acquire()
    api = emu.session()
    other = mutex(api, rid)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)  # as after this process's first add
    emu.control.reset_counts()
    assert other.acquire(blocking=False) is False
    assert emu.control.call_counts() == {"AddServiceToReservation": 1, "GetReservationDetails": 1}
    holder.release()
    assert other.acquire(blocking=False) is True
    other.release()


def test_waiter_gets_the_lock_when_the_holder_releases_and_writes_progress(emu, rid):
    import threading

    holder = mutex(emu.session(), rid, owner="Router B driver")
    holder.acquire()
    timer = threading.Timer(2.5, holder.release)
    timer.start()
    waiter = mutex(emu.session(), rid, owner="Router A driver", progress=True, progress_interval=1.0)
    try:
        assert waiter.acquire(timeout=10) is True
    finally:
        timer.join()
    waiter.release()
    output = emu.control.output(rid)
    assert output, "no progress message was written"
    assert output[0].startswith("Router A driver: waiting for MUTEX held by Router B driver")
    assert len(output) <= 3  # rate-limited


def test_release_never_removes_another_owners_mutex(emu, rid):
    """The original snippet gives up after N tries, runs unlocked and removes MUTEX on exit - ours.
    Then someone else takes the lock. Our release must find that out and remove nothing."""
    ours = mutex(emu.session(), rid, owner="Router A driver", release_check_after=0)
    ours.acquire()
    our_token = ours.token
    with OriginalMutex(emu.session(), rid, variant="v1", attempts=2, sleep_range=(0.01, 0.02)) as legacy:
        assert legacy.gave_up  # ran without the lock: the defect this project fixes
    assert current_owner(emu, rid) is None  # ... and removed our MUTEX on exit
    successor = mutex(emu.session(), rid, owner="Router B driver")
    successor.acquire()
    successor_token = successor.token
    with pytest.raises(MutexLostError, match="Nothing was removed"):
        ours.release()
    assert not ours.locked()
    assert current_owner(emu, rid) == successor.token
    ours.release()  # idempotent: still removes nothing
    assert current_owner(emu, rid) == successor.token
    successor.release()
    removed = [owner for op, owner in lock_events(emu, rid) if op == "service_removed"]
    assert removed == [our_token, successor_token]  # the first removal was the original snippet's


def test_a_hold_that_a_check_finds_lost_is_told_once_and_its_release_removes_nothing(emu, rid):
    """Without a lease (the original package) too: ensure_held(read=True) that sees another holder makes the
    hold lost: one line in the sandbox output, and a release that raises and removes nothing, not even
    when release_check_after would let it remove without reading."""
    ours = mutex(emu.session(), rid, owner="Router A driver", release_check_after=60)
    ours.acquire()
    emu.session().RemoveServicesFromReservation(rid, [protocol.DEFAULT_ALIAS])  # a Force Release
    successor = mutex(emu.session(), rid, owner="Router B driver")
    successor.acquire()
    with pytest.raises(MutexLostError, match="Router B driver"):
        ours.ensure_held(read=True)
    with pytest.raises(MutexLostError):
        ours.ensure_held()  # known lost: no call needed
    with pytest.raises(MutexLostError, match="Nothing was removed"):
        ours.release()
    assert current_owner(emu, rid) == successor.token
    lost_lines = [line for line in emu.control.output(rid) if "Router A driver lost the MUTEX lock" in line]
    assert len(lost_lines) == 1 and "Router B driver" in lost_lines[0]
    successor.release()


def test_release_after_the_check_window_reads_the_owner_first(emu, rid):
    api = emu.session()
    lock = mutex(api, rid, release_check_after=0.2)
    lock.acquire()
    time.sleep(0.3)
    emu.control.reset_counts()
    lock.release()
    assert emu.control.call_counts() == {"GetReservationDetails": 1, "RemoveServicesFromReservation": 1}


def test_verify_mode_costs_one_more_call(emu, rid):
    api = emu.session()
    lock = mutex(api, rid, verify=True)
    catalog.learn(api, protocol.SERVICE_MODEL, catalog.OWNER_ONLY)  # as after this process's first add
    emu.control.reset_counts()
    with lock:
        pass
    assert emu.control.call_counts() == {**CYCLE, "GetReservationDetails": 2}


def test_v2_stale_cache_stall_still_excludes(emu, rid):
    """The original v2 reads *cached* details after its add. A stale cache shows the previous owner,
    so v2 thinks it "lost the race" while its own MUTEX is in place, retries until it gives up and
    then runs - still holding MUTEX. Exclusion holds (we are kept out) though v2 stalls."""
    first = OriginalMutex(
        emu.session(), rid, variant="v2", my_unique_name="legacy A", sleep_range=(0.01, 0.02)
    )
    with first:
        assert first.acquired  # its cached read now shows legacy A as the owner for 5 s
    stalled = OriginalMutex(
        emu.session(), rid, variant="v2", my_unique_name="legacy B", attempts=3, sleep_range=(0.01, 0.02)
    )
    ours = mutex(emu.session(), rid)
    with stalled:
        assert stalled.gave_up and not stalled.acquired
        assert current_owner(emu, rid) == "legacy B"
        assert ours.acquire(blocking=False) is False
    assert ours.acquire(blocking=False) is True
    ours.release()


def test_release_after_the_reservation_ended_is_quiet(emu, rid):
    api = emu.session()
    seen = []
    lock = mutex(api, rid, release_check_after=0, on_event=seen.append)
    lock.acquire()
    api.EndReservation(rid)
    lock.release()  # the lock went with the reservation: nothing is leaked, nothing to raise
    assert not lock.locked()
    assert seen[-1].kind == "released" and "ended" in seen[-1].error


def test_a_dropped_remove_is_not_resent_into_a_successors_lock(emu, rid):
    """The remove commits, the connection drops, and a waiter takes the lock at once. The real client
    re-sends a dropped request 1 s later; for the remove that would delete the *waiter's* MUTEX."""
    import threading

    holder = mutex(emu.session(), rid, owner="Router A driver")
    holder.acquire()
    holder_token = holder.token
    waiter = mutex(emu.session(), rid, owner="Router B driver")
    seen = {}

    def wait_then_hold() -> None:
        waiter.acquire(timeout=10)
        seen["token"] = waiter.token
        time.sleep(1.5)  # longer than the client's 1 s retry delay
        seen["owner during hold"] = current_owner(emu, rid)
        waiter.release()

    thread = threading.Thread(target=wait_then_hold)
    thread.start()
    time.sleep(0.2)  # the waiter is polling
    emu.control.inject_fault("RemoveServicesFromReservation", "drop_after_commit")
    holder.release()
    thread.join(timeout=20)
    assert not holder.locked() and not waiter.locked()
    assert seen["owner during hold"] == seen["token"]
    assert lock_events(emu, rid) == [
        ("service_added", holder_token),
        ("service_removed", holder_token),
        ("service_added", seen["token"]),
        ("service_removed", seen["token"]),
    ]


# ---------------------------------------------------------------- observability


def test_cloudshell_logging_logger_records_the_cycle_without_secrets(
    cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch
):
    """A logger from cloudshell-logging's get_qs_logger (what drivers and scripts pass) receives the
    acquired and released lines in its file; neither the password nor the session token appear."""
    from cloudshell.logging import qs_logger

    password = "Pa55-for-log-test-7f3e"
    emu = cloudshell_emulator_factory(packages=[original_package_zip], admin_password=password)
    rid = emu.create_reservation("logging")
    logs = tmp_path / "logs"
    monkeypatch.setenv("LOG_PATH", str(logs))
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")  # every line the lock writes goes to the file
    category = f"cloudshell-mutex-test-{rid}"

    def cycle():
        # get_qs_logger sets context variables; the copied context keeps them out of other tests.
        logger = qs_logger.get_qs_logger(log_group=rid, log_category=category, log_file_prefix="Mutex Test")
        api = emu.session()
        with mutex(api, rid, logger=logger) as held:
            token = held.token
        return logger, api.authentication.xmlrpc_token, token

    logger, session_token, token = contextvars.copy_context().run(cycle)
    try:
        log_file = Path(qs_logger.get_log_path(logger))
        for handler in logger.handlers:
            handler.flush()
        assert logs / rid in log_file.parents and log_file.name.startswith("Mutex_Test--")
        text = log_file.read_text()
        assert f"cloudshell-mutex: acquired MUTEX in reservation {rid} as {token}" in text
        assert f"cloudshell-mutex: released MUTEX in reservation {rid} ({token})" in text
        assert session_token
        for written in logs.rglob("*"):  # the log file, and any debug or "missed" log beside it
            if written.is_file():
                content = written.read_text()
                assert password not in content and session_token not in content, written
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        qs_logger._LOGGER_CONTAINER.pop(rid, None)
        logging.Logger.manager.loggerDict.pop(category, None)


def test_a_revoked_login_is_healed_by_the_client_or_named(emu, rid):
    """New clients log on again after a 401 by themselves; old ones (before 2024.1) cannot, and turn the
    401 page into ``Exception("Invalid Request: ...")``: the lock then says the login is not accepted."""
    lock = mutex(emu.session(), rid)
    emu.control.revoke_sessions()
    if CLIENT_RESENDS:  # clients that re-send also log on again
        assert lock.acquire(timeout=5)
        lock.release()
    else:
        with pytest.raises(MutexPermissionError, match="expired or was revoked"):
            lock.acquire(timeout=5)
