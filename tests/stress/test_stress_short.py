"""The shortened stress run (part of ``make test``), and the checkers it relies on.

``make stress`` runs the same harness with 32 processes x 200 acquisitions (docs/reliability.md).
"""

from __future__ import annotations

import pytest
from history import Hold, check
from stress_harness import audit, clean, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def ev(seq, alias, op, monotonic=0.0, **attributes):
    return {"seq": seq, "alias": alias, "op": op, "monotonic": monotonic, "attributes": attributes}


def test_the_history_checker_accepts_a_mutex_and_catches_each_violation():
    events = [
        ev(1, "MUTEX", "service_added", 1.0, **{"Mutex Owner": "a"}),
        ev(2, "MUTEX", "service_removed", 3.0, **{"Mutex Owner": "a"}),
        ev(3, "MUTEX", "service_added", 4.0, **{"Mutex Owner": "b"}),
        ev(4, "MUTEX", "service_removed", 6.0, **{"Mutex Owner": "b"}),
    ]
    good = [Hold("A", "a", 0.5, 1.5, 2.5, 3.5), Hold("B", "b", 2.0, 4.5, 5.5, 6.5)]
    assert check(good, events).ok
    # B believed it held from 2.2 (before A let go at 3.0), with no grant during its call: both caught.
    bad = [Hold("A", "a", 0.5, 1.5, 2.5, 3.5), Hold("B", "b", 2.0, 2.2, 5.5, 6.5)]
    verdict = check(bad, events)
    assert verdict.counts()["fail_opens"] == 1 and verdict.counts()["overlaps"] == 1
    # A's lock was removed (by someone) at 3.0 while A believed it held until 3.2.
    cut = [Hold("A", "a", 0.5, 1.5, 3.2, 3.5), Hold("B", "b", 2.0, 4.5, 5.5, 6.5)]
    assert check(cut, events).counts()["cut_holds"] == 1
    # A late add of A's token after its release, never removed: a leak.
    leak = [*events, ev(5, "MUTEX", "service_added", 7.0, **{"Mutex Owner": "a"})]
    assert check(good, leak).counts()["leaks"] >= 1


def test_the_audit_counts_what_it_is_there_to_count():
    w = {"Mutex Owner": "a"}
    clean_log = [
        ev(1, "MUTEX", "service_added", **w),
        ev(2, "COUNTER", "service_attributes_set", Count="1", Writer="a"),
        ev(3, "MUTEX", "service_removed", **w),
    ]
    found = audit(clean_log)
    assert found == {"foreign_removes": 0, "overlaps": 0, "lost_updates": 0, "grants": 1, "leaks": 0}
    cut_short = [ev(1, "MUTEX", "service_added", **w), ev(2, "MUTEX", "service_removed", **w),
                 ev(3, "MUTEX", "service_added", **{"Mutex Owner": "b"}),
                 ev(4, "COUNTER", "service_attributes_set", Count="1", Writer="a")]  # fmt: skip
    found = audit(cut_short)
    assert found["foreign_removes"] == 1 and found["overlaps"] == 1 and found["leaks"] == 1
    assert audit([ev(1, "COUNTER", "service_attributes_set", Count="2", Writer="x")])["lost_updates"] == 1


@pytest.mark.client_timeout
def test_short_stress_under_every_fault_with_the_original_protocol_beside(
    cloudshell_emulator_factory, original_package_zip
):
    """8 processes (6 lock, one original v1, one v2) x 8 acquisitions, faults at twice the full run's rate."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    result = run(emu, ["ours"] * 6 + ["v1", "v2"], rounds=8, seed=20261123, scale=2.0)
    print(f"\nshort stress: {result}")
    assert sum(result["faults"].values()) >= 10  # faults did happen
    assert result["errors"] == []
    assert clean(result), result


def test_the_checkers_catch_a_broken_lock(cloudshell_emulator_factory, original_package_zip):
    """Negative control: clients that do not lock at all, beside ones that do."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    result = run(emu, ["ours", "unlocked", "unlocked"], rounds=4, seed=7, scale=0.0)
    assert not clean(result)
    assert result["history"]["fail_opens"] == 8 and result["history"]["overlaps"] > 0
