"""The fault plan without HTTP: parameters, the seeded random mode, late calls, the CLI's fault syntax."""

from __future__ import annotations

import argparse
import threading
import time

import pytest

from cloudshell_mutex.emulator.command import _fault, _random_faults
from cloudshell_mutex.emulator.faults import FAULT_KINDS, FaultPlan, LateCalls, RandomFaults


def test_fault_parameters_get_defaults_and_are_checked():
    plan = FaultPlan()
    plan.inject("RemoveServicesFromReservation", "apply_late", params={"delay": 2})
    fault = plan.take("RemoveServicesFromReservation", "r1")
    assert (fault.kind, dict(fault.params)) == (
        "apply_late",
        {"delay": 2.0, "delay_max": None, "reset_after": 0.0, "reply": "reset", "hang_limit": 300.0},
    )
    [record] = plan.injected()
    assert (record["id"], record["reservation_id"], record["outcome"]) == (fault.id, "r1", "pending")
    plan.settle(fault.id, "applied")
    assert plan.injected()[0]["outcome"] == "applied"
    for kind, params, message in [
        ("apply_late", {"delay": -1}, "must not be negative"),
        ("apply_late", {"reply": "ignore"}, "'reset' or 'hang'"),
        ("apply_late", {"dealy": 1}, r"does not take \['dealy'\]"),
        ("apply_late", {"delay": 3, "delay_max": 1}, r"delay_max \(1\) must not be less than delay \(3\)"),
        ("apply_late", {"delay": None, "delay_max": 3}, "delay_max needs a delay"),
        ("reset_before_commit", {"delay": 1}, "its parameters: none"),
        ("spike", {"seconds": 0}, "must be positive"),
        ("drop_after_commit", {"delay": 1}, "its parameters: none"),
        ("explode", {}, "not known"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan.inject("X", kind, params=params)


def test_a_late_delay_range_is_drawn_per_call_from_the_seed_and_recorded():
    """``delay_max`` makes each late call's delay a uniform draw from [delay, delay_max]; random faults draw
    it from their seed (the same seed and calls give the same delays), and the record shows the drawn one."""
    settings = {
        "seed": 5,
        "rates": {"apply_late": 1.0},
        "params": {"apply_late": {"delay": 1, "delay_max": 3}},
    }
    first, second = FaultPlan(), FaultPlan()
    first.set_random(settings)
    second.set_random(settings)
    delays = [first.take("RemoveServicesFromReservation").params["delay"] for _ in range(100)]
    assert delays == [second.take("RemoveServicesFromReservation").params["delay"] for _ in range(100)]
    assert all(1.0 <= d <= 3.0 for d in delays) and min(delays) < 1.5 and max(delays) > 2.5
    assert [r["params"]["delay"] for r in first.injected()] == delays
    queued = FaultPlan()
    queued.inject("*", "apply_late", count=50, params={"delay": 1, "delay_max": 1.2})
    assert all(1.0 <= queued.take("X").params["delay"] <= 1.2 for _ in range(50))


def test_random_faults_draw_one_kind_per_call_repeatably():
    settings = {"seed": 3, "rates": {"spike": 0.3, "error_before_commit": 0.3}}
    first, second = RandomFaults(settings), RandomFaults(settings)
    draws = [first.draw("AddServiceToReservation") for _ in range(200)]
    assert draws == [second.draw("AddServiceToReservation") for _ in range(200)]
    kinds = [d[0] if d else None for d in draws]
    assert {"spike", "error_before_commit", None} == set(kinds)
    assert 30 < kinds.count(None) < 130
    assert first.draw("Logon") is None  # logging on is out of scope unless named
    scoped = RandomFaults({"seed": 1, "rates": {"spike": 1.0}, "methods": ["Logon"]})
    assert scoped.draw("Logon")[0] == "spike" and scoped.draw("GetServerDateAndTime") is None


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"rates": {"spike": 1.5}}, "between 0 and 1"),
        ({"rates": {"spike": 0.6, "apply_late": 0.6}}, "add up to 1.2"),
        ({"rates": {"boom": 0.1}}, "not known"),
        ({"methods": "AddServiceToReservation"}, "list of API method names"),
        ({"params": {"spike": {"seconds": -1}}}, "must be positive"),
        ({"sede": 1}, "not understood"),
    ],
)
def test_random_fault_settings_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        RandomFaults(settings)


def test_late_calls_run_at_their_time_and_land_on_demand_in_arrival_order():
    late = LateCalls()
    ran = []
    done = threading.Event()
    late.schedule(1, time.monotonic() + 0.05, lambda: (ran.append("timed"), done.set()))
    late.schedule(2, None, lambda: ran.append("held-a"))
    late.schedule(3, None, lambda: ran.append("held-b"))
    assert done.wait(10)
    assert ran == ["timed"] and late.pending() == 2
    assert late.land([3]) == 1 and ran[-1] == "held-b"
    late.schedule(4, time.monotonic() + 3600, lambda: ran.append("far"))
    assert late.land() == 2 and ran[-2:] == ["held-a", "far"]
    late.schedule(5, None, lambda: ran.append("never"))
    assert late.stop() == [5] and "never" not in ran


def test_cli_fault_syntax_takes_parameters():
    assert _fault("RemoveServicesFromReservation:apply_late:2:delay=3,reply=hang") == (
        "RemoveServicesFromReservation",
        "apply_late",
        2,
        {"delay": 3, "reply": "hang"},
    )
    assert _fault("*:drop_after_commit") == ("*", "drop_after_commit", 1, {})
    assert _fault("X:apply_late:1:delay=null")[3] == {"delay": None}
    for text, message in [
        ("X", "METHOD:KIND"),
        ("X:apply_late:1:delay", "NAME=VALUE"),
        ("X:apply_late:1:delay=-2", "must not be negative"),
        ("X:nope", "not known"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            _fault(text)
    assert _random_faults('{"seed": 7, "rates": {"spike": 0.1}}')["seed"] == 7
    with pytest.raises(argparse.ArgumentTypeError, match="random faults"):
        _random_faults('{"rates": {"spike": 2}}')
    assert set(FAULT_KINDS) >= {"error_before_commit", "drop_after_commit", "apply_late", "spike"}
    assert _fault("RemoveServicesFromReservation:apply_late:1:delay=1,delay_max=3")[3] == {
        "delay": 1,
        "delay_max": 3,
    }


def test_random_faults_can_be_limited_to_some_users():
    from cloudshell_mutex.emulator.faults import FaultPlan

    plan = FaultPlan()
    plan.set_random({"seed": 1, "rates": {"error_before_commit": 1.0}, "users": ["noisy"]})
    assert plan.take("AddServiceToReservation", "r", "noisy").kind == "error_before_commit"
    assert plan.take("AddServiceToReservation", "r", "quiet") is None
    assert [r["user"] for r in plan.injected()] == ["noisy"]  # a fault's record names its caller
    assert plan.random.to_dict()["users"] == ["noisy"]
