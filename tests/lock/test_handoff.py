"""export()/adopt() on the virtual clock: strict handles, a shared lease, and either side releasing."""

from __future__ import annotations

import pytest
from fakes import RES, FakeApi, http_500, make

from cloudshell_mutex import MutexLostError, MutexUsageError, ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.errors import MutexHandleError
from cloudshell_mutex.lock.mutex import handover
from cloudshell_mutex.lock.mutex.handle import HandleInfo, make_handle, parse_handle
from cloudshell_mutex.lock.options import FRESH_READ_LAG
from cloudshell_mutex.lock.server import catalog

LEASED_MODEL = (protocol.ATTR_OWNER, *protocol.LEASE_ATTRIBUTES)
TOKEN = "Orchestrator@exec-01:77:0123abcd"


def adopt(api, clock, handle, **kwargs):
    return ReservationMutex.adopt(api, handle, owner="driver", runtime=Runtime(clock, clock.sleep), **kwargs)


def test_a_handle_is_short_and_safe_as_a_command_input():
    handle = make_handle(HandleInfo(RES, "MUTEX", protocol.SERVICE_MODEL, TOKEN, 60.0))
    assert len(handle) < 200
    assert set(handle) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
    assert parse_handle(handle) == HandleInfo(RES, "MUTEX", protocol.SERVICE_MODEL, TOKEN, 60.0)


@pytest.mark.parametrize(
    "mangle, why",
    [
        (lambda h: h[:-1], "check does not match"),
        (lambda h: h[: len(h) // 2], "form|check"),
        (lambda h: h.replace("csmx1", "csmx2"), "form"),
        (lambda h: h + " ", "characters"),
        (lambda h: '"' + h + '"', "characters"),
        (lambda h: "", "empty"),
        (lambda h: None, "string"),
        (lambda h: h.split(".")[0] + "." + h.split(".")[1][:-2] + "." + h.split(".")[2], "check"),
    ],
)
def test_truncated_or_altered_handles_get_a_clear_error(mangle, why):
    handle = make_handle(HandleInfo(RES, "MUTEX", protocol.SERVICE_MODEL, TOKEN, 60.0))
    with pytest.raises(MutexHandleError, match=why) as caught:
        parse_handle(mangle(handle))
    assert "mutex.export()" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_forged_handle_with_a_valid_check_but_a_foreign_token_is_refused(clock):
    """The check is no signature: what protects the lock is that adopt() joins only the token it holds."""
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    holder = make(api, clock, lease=3)
    holder.acquire()
    forged = make_handle(HandleInfo(RES, "MUTEX", protocol.SERVICE_MODEL, "Me@evil:1:deadbeef", 3.0))
    with pytest.raises(MutexLostError, match="cannot adopt"):
        adopt(api, clock, forged)
    assert api.services[protocol.DEFAULT_ALIAS][protocol.ATTR_OWNER] == holder.token


def test_export_needs_the_lock_held(clock):
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    with pytest.raises(MutexUsageError, match="acquire"):
        make(api, clock).export()


def test_both_sides_heartbeat_the_same_lease_and_a_release_by_one_is_noticed_by_the_other(clock):
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    orchestrator = make(api, clock, lease=3)
    orchestrator.acquire()
    driver = adopt(api, clock, orchestrator.export())
    assert driver.locked() and driver.token == orchestrator.token and driver.leased
    service = api.services[protocol.DEFAULT_ALIAS]
    beat_driver = service[protocol.ATTR_HEARTBEAT]  # the adopter beat at once
    assert orchestrator.renew() and driver.renew()
    assert service[protocol.ATTR_HEARTBEAT] != beat_driver
    parts = {orchestrator._held.heartbeat.part, driver._held.heartbeat.part}
    assert len(parts) == 2  # each side writes its own part: the value changes with every beat of either
    driver.release()
    assert protocol.DEFAULT_ALIAS not in api.services
    clock.sleep(FRESH_READ_LAG)  # a read sooner may lag behind the lock: it would prove no loss
    assert orchestrator.renew() is False  # the other side notices
    with pytest.raises(MutexLostError):
        orchestrator.ensure_held()
    api.calls.clear()
    with pytest.raises(MutexLostError):
        orchestrator.release()
    assert api.calls == []


def test_an_adopters_failed_first_beat_is_tried_again_at_once(clock):
    """Until its own first heartbeat lands, an adopter cannot tell when the service was last confirmed, so
    ensure_held() treats the lease as lapsing. One failed write must not leave it so until the thread's next
    beat, lease/3 later (a reader that joined a read group on a flaky server was told at its release that
    its lock may be lost)."""
    api = FakeApi(attributes=LEASED_MODEL, clock=clock)
    orchestrator = make(api, clock, lease=3)
    orchestrator.acquire()
    failed = []

    def http_500_once(*args) -> bool:
        if not failed:
            failed.append(clock.now)
            raise http_500()
        return False

    api.faults["SetServiceAttributesValues"] = [http_500_once] * 10
    driver = adopt(api, clock, orchestrator.export())
    assert failed, "the first beat failed"
    driver.ensure_held()  # raised "no heartbeat was confirmed since it was adopted" without the retry
    assert clock.now - failed[0] < 3 / 3  # retried before the thread's next beat
    driver.release()


def test_adopt_of_a_lock_without_a_lease_joins_without_heartbeat(clock):
    api = FakeApi(clock=clock)  # the original model: Mutex Owner only
    orchestrator = make(api, clock)
    orchestrator.acquire()
    catalog.forget()  # the adopting process has learned nothing about the server
    driver = adopt(api, clock, orchestrator.export())
    assert driver.locked() and not driver.leased
    driver.release()
    assert not api.services


@pytest.mark.parametrize("who", ["adopter", "exporter"])
def test_an_adopter_never_marks_the_lock_releasing_and_the_exporter_does(clock, who):
    """The handle holds no secret (it is safe as a command input): an adopter cannot prove a marker, so its
    release never adds one. The exporter, which keeps the secret, marks as any acquirer does."""
    from urllib3.exceptions import ProtocolError

    from cloudshell_mutex.lock.holder import proves_release

    marker = protocol.releasing_alias(protocol.DEFAULT_ALIAS)
    api = FakeApi(clock=clock)
    orchestrator = make(api, clock, request_lifetime=30)
    orchestrator.acquire()
    token, handle = orchestrator.token, orchestrator.export()
    assert handover.acquisition(orchestrator).secret.hex() not in handle
    driver = adopt(api, clock, handle, request_lifetime=30)
    seen = []

    def late_and_reset(reservation_id, aliases):
        api.late_remove(clock.now + 2.0)
        clock.now += 0.05
        raise ProtocolError("Connection aborted.", ConnectionResetError())

    api.faults["RemoveServicesFromReservation"] = [late_and_reset]
    api.on_call = lambda method: seen.extend(api.services.get(marker, {}).values())
    (driver if who == "adopter" else orchestrator).release()
    api.on_call = None
    assert protocol.DEFAULT_ALIAS not in api.services and marker not in api.services
    if who == "adopter":
        assert seen == [] and api.calls.count("AddServiceToReservation") == 1  # the acquire's add only
    else:
        assert seen and proves_release(seen[0], token)
