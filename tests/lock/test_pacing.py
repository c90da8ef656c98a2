"""Pacing policies, the call budget and the deadline clip."""

from __future__ import annotations

import random

import pytest

from cloudshell_mutex.lock.engine import Wait
from cloudshell_mutex.lock.pacing import (
    CallBudget,
    DefaultPacing,
    ExponentialBackoff,
    FixedPacing,
    OriginalPacing,
    budget_for,
)


def delays(policy, count: int, seed: int = 7):
    rng = random.Random(seed)
    out, previous = [], 0.0
    for attempt in range(1, count + 1):
        previous = policy.next_delay(attempt, previous, rng)
        out.append(previous)
    return out


def test_original_pacing_is_randint_2_to_5_seconds():
    values = delays(OriginalPacing(), 400)
    assert set(values) == {2.0, 3.0, 4.0, 5.0}


def test_original_pacing_float_bounds_for_short_tests():
    values = delays(OriginalPacing(0.02, 0.05), 200)
    assert all(0.02 <= v <= 0.05 for v in values)
    assert len(set(values)) > 100


def test_default_pacing_is_fast_first_then_jittered_under_a_low_cap():
    policy = DefaultPacing(first=0.05, base=0.1, cap=1.0, fast_attempts=2)
    values = delays(policy, 300)
    assert all(0.025 <= v <= 0.05 for v in values[:2])
    later = values[2:]
    assert all(0.1 <= v <= 1.0 for v in later)
    assert max(later) == pytest.approx(1.0)  # reaches the cap
    assert len({round(v, 6) for v in later}) > 50  # jittered, not lock-step


def test_exponential_backoff_grows_to_its_cap_with_a_floor():
    policy = ExponentialBackoff(base=0.25, cap=4.0)
    rng = random.Random(3)
    for attempt, ceiling in [(1, 0.25), (2, 0.5), (3, 1.0), (5, 4.0), (50, 4.0)]:
        for _ in range(50):
            value = policy.next_delay(attempt, 0.0, rng)
            assert ceiling / 2 <= value <= ceiling


def test_fixed_pacing_jitter_bounds():
    values = delays(FixedPacing(1.0, jitter=0.2), 100)
    assert all(0.8 <= v <= 1.2 for v in values)
    assert delays(FixedPacing(0.3), 3) == [0.3, 0.3, 0.3]


@pytest.mark.parametrize(
    "factory",
    [
        lambda: FixedPacing(-1),
        lambda: OriginalPacing(5, 2),
        lambda: DefaultPacing(base=2, cap=1),
        lambda: ExponentialBackoff(base=0),
        lambda: CallBudget(rate=0),
    ],
)
def test_bad_policy_arguments_are_refused(factory):
    with pytest.raises(ValueError):
        factory()


def test_clip_never_sleeps_past_the_deadline():
    assert Wait(12.0, clock=lambda: 10.0).clip(5.0) == 2.0
    assert Wait(12.0, clock=lambda: 10.0).clip(1.0) == 1.0
    assert Wait(12.0, clock=lambda: 13.0).clip(1.0) == 0.0
    assert Wait(None, clock=lambda: 0.0).clip(-1.0) == 0.0
    assert Wait(None, clock=lambda: 0.0).clip(7.0) == 7.0


def test_call_budget_is_a_token_bucket():
    now = [0.0]
    budget = CallBudget(rate=2.0, burst=3, clock=lambda: now[0])
    assert [budget.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert budget.reserve() == pytest.approx(0.5)  # then 2 calls/s
    assert budget.reserve() == pytest.approx(1.0)
    now[0] += 10.0  # refills, but never above the burst
    assert [budget.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert budget.reserve() > 0
    budget.refund()


def test_default_budget_is_shared_per_api_session():
    class Session:
        pass

    first, second = Session(), Session()
    assert budget_for(first) is budget_for(first)
    assert budget_for(first) is not budget_for(second)
    assert isinstance(budget_for(42), CallBudget)  # not weak-referenceable: a budget of its own
