"""The emulator's state rules without HTTP: errors, atomic alias check+insert, cache snapshots, knobs."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import pytest

from cloudshell_mutex.emulator import instrumentation
from cloudshell_mutex.emulator.faults import FaultPlan, LatencyModel
from cloudshell_mutex.emulator.server import is_loopback
from cloudshell_mutex.emulator.state import ApiError, AttributeSpec, CatalogModel, EmulatorState
from cloudshell_mutex.lock.protocol import ATTR_OWNER, DUPLICATE_ALIAS_MESSAGE, SERVICE_MODEL


def make_state(**kwargs) -> EmulatorState:
    state = EmulatorState("admin", "secret", **kwargs)
    state.register_model(
        CatalogModel(
            SERVICE_MODEL,
            "Mutex Service Family",
            True,
            OrderedDict(
                [(ATTR_OWNER, AttributeSpec(ATTR_OWNER)), ("Label", AttributeSpec("Label", default="x"))]
            ),
        )
    )
    return state


def api_error(func, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        func(*args)
    return info.value


def test_error_codes_and_messages_match_the_contract():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    state.add_service(rid, SERVICE_MODEL, "MUTEX", [], "admin")
    cases = [
        ((state.add_service, rid, SERVICE_MODEL, "MUTEX", [], "u"), DUPLICATE_ALIAS_MESSAGE),
        ((state.add_service, "nope", SERVICE_MODEL, "A", [], "u"), "Reservation 'nope' was not found"),
        (
            (state.add_service, rid, "Other", "A", [], "u"),
            "Service model 'Other' was not found in the catalog",
        ),
        (
            (state.add_service, rid, SERVICE_MODEL, "A", [("Color", "1")], "u"),
            "Attribute 'Color' is not defined on service model 'Mutex Service'",
        ),
        (
            (state.remove_services, rid, ["GONE"], "u"),
            f"Service with alias 'GONE' was not found in reservation '{rid}'",
        ),
    ]
    for call, message in cases:
        error = api_error(*call)
        assert (error.code, error.message) == ("100", message)
    state.end_reservation(rid)
    error = api_error(state.add_service, rid, SERVICE_MODEL, "B", [], "u")
    assert (error.code, error.message) == ("100", f"Reservation '{rid}' has ended")


def test_defaults_fill_attributes_not_given():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    service = state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, "me")], "admin")
    assert dict(service.attributes) == {ATTR_OWNER: "me", "Label": "x"}


def test_a_failed_remove_removes_nothing():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    state.add_service(rid, SERVICE_MODEL, "A", [], "admin")
    api_error(state.remove_services, rid, ["A", "MISSING"], "admin")
    assert list(state.reservations[rid].services) == ["A"]


def test_alias_check_and_insert_are_atomic_under_threads():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    wins, start = [], threading.Barrier(16)

    def contend(n: int) -> None:
        start.wait()
        try:
            state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, str(n))], str(n))
            wins.append(n)
        except ApiError:
            pass

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    [event] = state.instrumentation.events(rid)
    assert event["op"] == "service_added" and event["attributes"][ATTR_OWNER] == str(wins[0])


def test_details_snapshot_is_stale_until_it_expires_unless_cache_disabled():
    state = make_state(details_cache_seconds=0.2)
    rid = state.create_reservation("r", "admin", 10, "Global").id

    def aliases(disable_cache: bool):
        return sorted(state.details(rid, disable_cache).services)

    assert aliases(False) == []
    state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, "a")], "admin")
    assert aliases(False) == []  # the snapshot
    assert aliases(True) == ["MUTEX"]
    assert aliases(False) == []  # a disableCache read does not refresh it
    time.sleep(0.25)
    assert aliases(False) == ["MUTEX"]


def test_details_snapshot_is_a_copy_that_later_changes_do_not_reach():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, "a")], "admin")
    snapshot = state.details(rid, False)
    state.set_service_attributes(rid, "MUTEX", [(ATTR_OWNER, "b")], "admin")
    state.add_service(rid, SERVICE_MODEL, "OTHER", [], "admin")
    assert list(snapshot.services) == ["MUTEX"]
    assert snapshot.services["MUTEX"].attributes[ATTR_OWNER] == "a"
    assert state.details(rid, False) is snapshot
    assert state.details(rid, True).services["MUTEX"].attributes[ATTR_OWNER] == "b"


def test_events_are_ordered_and_carry_owner_and_user():
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, "a")], "alice")
    state.set_service_attributes(rid, "MUTEX", [(ATTR_OWNER, "b")], "bob")
    state.remove_services(rid, ["MUTEX"], "carol")
    events = state.instrumentation.events(rid)
    assert [(e["seq"], e["op"], e["attributes"][ATTR_OWNER], e["user"]) for e in events] == [
        (1, "service_added", "a", "alice"),
        (2, "service_attributes_set", "b", "bob"),
        (3, "service_removed", "b", "carol"),
    ]
    assert events[0]["monotonic"] <= events[1]["monotonic"] <= events[2]["monotonic"]


def test_event_log_is_bounded_and_keeps_counting(monkeypatch):
    monkeypatch.setattr(instrumentation, "EVENT_LOG_LIMIT", 4)
    state = make_state()
    rid = state.create_reservation("r", "admin", 10, "Global").id
    for owner in "abc":
        state.add_service(rid, SERVICE_MODEL, "MUTEX", [(ATTR_OWNER, owner)], "alice")
        state.remove_services(rid, ["MUTEX"], "alice")
    # Six changes, four kept: the oldest go first, and seq shows the gap.
    assert [(e["seq"], e["op"], e["attributes"][ATTR_OWNER]) for e in state.instrumentation.events(rid)] == [
        (3, "service_added", "b"),
        (4, "service_removed", "b"),
        (5, "service_added", "c"),
        (6, "service_removed", "c"),
    ]


def test_sessions_expire_and_revoke():
    state = make_state()
    state.accounts.token_ttl = 0.05
    token = state.accounts.logon("admin", "secret", "Global")
    assert state.accounts.session_for(token).user == "admin"
    time.sleep(0.06)
    assert state.accounts.session_for(token) is None
    token = state.accounts.logon("admin", "secret", "Global")
    state.accounts.revoke_sessions()
    assert state.accounts.session_for(token) is None
    assert "Login failed" in api_error(state.accounts.logon, "admin", "wrong", "Global").message


def test_latency_split_puts_the_commit_inside_the_delay():
    model = LatencyModel({"distribution": "fixed", "seconds": 0.4, "commit_fraction": 0.25})
    before, after = model.split()
    assert before == pytest.approx(0.1) and after == pytest.approx(0.3)
    uniform = LatencyModel({"distribution": "uniform", "low": 0.01, "high": 0.02, "seed": 3})
    assert all(0.01 <= uniform.sample() <= 0.02 for _ in range(100))
    assert LatencyModel().split() == (0.0, 0.0)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"distribution": "pareto"}, "not known"),
        ({"distribution": "uniform", "low": 1}, "needs 'high'"),
        ({"distribution": "fixed", "seconds": 1, "commit_fraction": 2}, "between 0 and 1"),
        ({"distribution": "fixed", "seconds": -1}, "must not be negative"),
        ({"distribution": "fixed", "seconds": 1, "typo": 1}, "not understood"),
    ],
)
def test_latency_settings_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        LatencyModel(settings)


def test_fault_plan_queues_per_method_and_wildcard():
    plan = FaultPlan()
    plan.inject("AddServiceToReservation", "drop_after_commit", 2)
    plan.inject("*", "error_before_commit")
    assert plan.take("AddServiceToReservation").kind == "drop_after_commit"
    assert plan.take("GetReservationDetails").kind == "error_before_commit"
    assert plan.take("GetReservationDetails") is None
    assert plan.pending() == {"AddServiceToReservation": ["drop_after_commit"]}
    plan.clear()
    assert plan.take("AddServiceToReservation") is None
    with pytest.raises(ValueError, match="not known"):
        plan.inject("X", "explode")


def test_control_is_loopback_only():
    assert is_loopback("127.0.0.1") and is_loopback("127.5.0.1") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.5") and not is_loopback("192.168.1.2") and not is_loopback("garbage")
