"""Plans, contenders and the window's end, without a server."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from cloudshell_mutex.bench.__main__ import main, parse_args
from cloudshell_mutex.bench.contenders import BASELINE, CONTENDERS, Seat, WindowClosed, contender
from cloudshell_mutex.bench.original import OriginalMutex
from cloudshell_mutex.bench.plans import (
    BURSTS,
    DECIDE,
    FIXED_PAUSE,
    FULL,
    LONG_HOLD,
    MIXED,
    NO_PAUSE,
    PLANS,
    QUICK,
    REACQUIRE,
    READERS,
    SETUP_BURST_A,
    SETUP_BURST_B,
    SITE,
    SITE_PLAN,
    SMOKE,
    STRESS,
    TARGETS,
    THINK,
    THINK_PAUSE,
    WAITER_HOLD,
    Cell,
    Plan,
    Role,
    Series,
    run_seed,
    schedule,
)
from cloudshell_mutex.bench.verdicts import TARGETS as VERDICT_TARGETS


def test_the_quick_plan_is_a_small_part_of_the_full_matrix() -> None:
    quick = {(c.clients, c.hold, c.workload) for c, _ in QUICK.groups}
    full = {(c.clients, c.hold, c.workload) for c, _ in FULL.groups if c.workload in (REACQUIRE, THINK)}
    assert quick <= full
    assert {n for n, _, _ in full} == {1, 2, 8, 32}
    assert {h for _, h, _ in full} == {0.1, 1.0, 10.0}
    assert {w for _, _, w in full} == {REACQUIRE, THINK}
    # The full plan also runs the mixed parties and the readers stream, with plain polling and the fair mode.
    others = {c.workload: names for c, names in FULL.groups if c.workload not in (REACQUIRE, THINK)}
    assert set(others) == {MIXED, READERS}
    assert all({"default", "plain", "fair"} <= set(names) for names in others.values())
    assert QUICK.max_clients == 8
    assert QUICK.estimated_seconds() < 15 * 60 < FULL.estimated_seconds()
    for plan in (QUICK, FULL):
        names = {name for _, group in plan.groups for name in group}
        assert {BASELINE, "original-v2", "original-pacing", "default", "release-check-5"} <= names


def test_runs_go_through_every_cell_once_per_repeat() -> None:
    a, b = Cell(2, 0.1, REACQUIRE, 1.0), Cell(8, 1.0, THINK, 2.0)
    plan = Plan("p", ((a, ("default", BASELINE)), (b, ("default",))), repeats=2)
    assert list(plan.runs()) == [
        (0, a, "default"),
        (0, a, BASELINE),
        (0, b, "default"),
        (1, a, "default"),
        (1, a, BASELINE),
        (1, b, "default"),
    ]
    assert plan.run_count == 6


def test_bad_plans_and_cells_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown contender 'fifo'; known: default, "):
        Plan("p", ((Cell(2, 1.0, REACQUIRE, 5.0), ("fifo",)),), repeats=1)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        Plan("p", (), repeats=0)
    with pytest.raises(ValueError, match="unknown workload 'burst'"):
        Cell(2, 1.0, "burst", 5.0)
    with pytest.raises(ValueError, match="the long-hold workload needs at least 2 clients"):
        Cell(1, 60.0, LONG_HOLD, 90.0)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        Series(Cell(2, 0.3, SETUP_BURST_B, 30.0), ("default",), 0)
    with pytest.raises(ValueError, match="at least 1 client"):
        Cell(0, 1.0, REACQUIRE, 5.0)
    with pytest.raises(ValueError, match="hold and window must be positive"):
        Cell(2, 0.0, REACQUIRE, 5.0)


def test_contenders_mark_the_original_code() -> None:
    assert contender(BASELINE).original
    assert not contender("default").original
    assert {name for name, c in CONTENDERS.items() if c.original} == {"original-v1", "original-v2"}


def test_a_seat_sleeps_until_the_window_closes_then_raises() -> None:
    open_seat = Seat(api=None, reservation_id="r", client=0, deadline=time.monotonic() + 3600)
    open_seat.sleep(0)  # well inside the window: returns
    assert open_seat.remaining() > 3000
    closed = Seat(api=None, reservation_id="r", client=0, deadline=time.monotonic() - 1)
    with pytest.raises(WindowClosed):
        closed.sleep(60)  # would sleep a minute; the window is closed: raises at once
    assert closed.remaining() == 0


class _AlwaysBusy:
    def AddServiceToReservation(self, *args):
        raise Exception("CloudShell API error 100: Service with given alias already exists")

    def RemoveServicesFromReservation(self, *args):
        pass


def test_the_originals_sleeps_go_through_its_sleep_function_with_randint_2_to_5() -> None:
    slept = []
    original = OriginalMutex(_AlwaysBusy(), "r", attempts=20, sleep=slept.append)
    with original:
        pass
    assert original.gave_up  # the original's defect, kept: it carries on without the lock
    assert len(slept) == 20
    assert all(isinstance(s, int) and 2 <= s <= 5 for s in slept)


def test_the_original_ends_when_its_sleep_function_raises() -> None:
    seat = Seat(api=None, reservation_id="r", client=0, deadline=time.monotonic() - 1)
    original = OriginalMutex(_AlwaysBusy(), "r", sleep=seat.sleep)
    with pytest.raises(WindowClosed):
        original.__enter__()
    assert original.failures == 1 and not original.acquired


def test_an_unknown_plan_is_refused_with_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--plan", "huge"])
    assert exit_info.value.code == 2
    assert (
        "unknown plan 'huge': use one of decide, site, quick, full, targets, budget, smoke"
        in capsys.readouterr().err
    )


def test_several_plans_run_one_after_the_other() -> None:
    assert parse_args(["--plan", "quick, targets"]).plans == ["quick", "targets"]
    targets = {(c.clients, c.hold, c.workload) for c, _ in TARGETS.groups}
    assert targets == {(n, h, w) for n in (8, 32) for h in (1.0, 10.0) for w in (REACQUIRE, THINK)}
    # Where the quick plan has the same configuration, the targets plan measures it in a longer window.
    quick = {(c.clients, c.hold, c.workload): c.window for c, _ in QUICK.groups}
    assert all(c.window > quick.get((c.clients, c.hold, c.workload), 0) for c, _ in TARGETS.groups)


def test_the_fair_mode_runs_in_the_quick_and_targets_plans_beside_the_baseline_and_the_default() -> None:
    for plan in (QUICK, TARGETS):
        contended = [names for cell, names in plan.groups if cell.clients > 1]
        assert contended and all({"original-v1", "default", "fair"} <= set(names) for names in contended)
    # The uncontended cell shows that fair=True costs nothing without contention.
    assert any(cell.clients == 1 and "fair" in names for cell, names in QUICK.groups)


def _cells(plan: Plan):
    return {(c.clients, c.hold, c.workload): (c.window, names) for c, names in plan.groups + plan.once}


def test_make_bench_runs_the_decide_plan_in_about_twenty_five_minutes() -> None:
    assert parse_args([]).plans == ["decide"]
    assert DECIDE.estimated_seconds() < 26 * 60
    assert DECIDE.max_clients == 32
    # The sites' workloads alone are a plan of their own, and most of the decide plan's time is the rest.
    assert SITE_PLAN.series == DECIDE.series == SITE
    assert SITE_PLAN.estimated_seconds() < 11 * 60 < DECIDE.estimated_seconds()
    assert SMOKE.estimated_seconds() < 60


def test_the_decide_plan_judges_its_ratios_on_two_repeats_in_windows_long_enough() -> None:
    assert DECIDE.repeats >= 2
    for cell, names in DECIDE.groups:  # the repeated cells: each judges a ratio against the original
        assert {BASELINE, "default"} <= set(names)
        if cell.hold >= 1:
            assert cell.window >= (40.0 if cell.clients >= 32 else 30.0)
    repeated = {(c.clients, c.hold, c.workload) for c, _ in DECIDE.groups}
    assert {(n, 1.0, w) for n in (2, 8) for w in (REACQUIRE, THINK)} | {(32, 1.0, REACQUIRE)} <= repeated
    assert any(c.hold == 0.1 for c, _ in DECIDE.groups)
    once = _cells(Plan("once", DECIDE.once, repeats=1))
    windows = {(c.clients, c.workload): c.window for c, _ in DECIDE.groups if c.hold == 1.0}
    assert windows[(8, REACQUIRE)] >= 38.0  # 3 grants per client at N=8: the starvation target is judged
    assert once[(4, 1.0, MIXED)] == (60.0, ("default",))
    assert READERS in {w for _, _, w in once} and (32, 10.0, REACQUIRE) in once
    assert once[(32, 10.0, REACQUIRE)][0] >= 60.0
    assert (1, 0.1, REACQUIRE) in once


def test_every_verdict_has_a_configuration_in_the_decide_plan() -> None:
    groups = DECIDE.groups + DECIDE.once + tuple((s.cell, s.contenders) for s in DECIDE.series)
    for target in VERDICT_TARGETS:
        # Every contender a target names runs in a cell it covers (a ratio's baseline too).
        runs = [names for cell, names in groups if target.where(cell) and target.contender in names]
        assert runs, target.text
        if target.ratio is not None:
            assert any(target.against in names for names in runs), target.text


def test_cells_run_once_go_with_the_first_repeat_only() -> None:
    a, b = Cell(2, 0.1, REACQUIRE, 1.0), Cell(4, 1.0, MIXED, 2.0)
    plan = Plan("p", ((a, (BASELINE, "default")),), repeats=2, once=((b, ("default",)),))
    assert list(plan.runs()) == [
        (0, a, BASELINE),
        (0, a, "default"),
        (0, b, "default"),
        (1, a, BASELINE),
        (1, a, "default"),
    ]
    assert plan.run_count == 5 and plan.max_clients == 4
    assert plan.estimated_seconds(per_run_overhead=1.0, per_client=0.5) == 4 * 2.0 + 3.0 + 2.0
    # --repeats (dataclasses.replace of the repeats) changes the repeated cells only.
    assert dataclasses.replace(plan, repeats=3).run_count == 3 * 2 + 1


@pytest.mark.parametrize(
    ("workload", "roles"),
    [
        (REACQUIRE, [Role(), Role(), Role(), Role()]),
        (THINK, [Role(THINK_PAUSE)] * 4),
        (MIXED, [Role(), Role(FIXED_PAUSE), Role(FIXED_PAUSE), Role(FIXED_PAUSE)]),
        # The lock's client enters once the readers hold; the readers start a third of a hold apart.
        (
            READERS,
            [
                Role(FIXED_PAUSE, offset=1.5),
                Role(reader=True, offset=0.0),
                Role(reader=True, offset=0.5),
                Role(reader=True, offset=1.0),
            ],
        ),
    ],
)
def test_each_client_has_its_role_in_the_workload(workload, roles) -> None:
    cell = Cell(4, 1.5, workload, 10.0)
    assert [cell.role(client) for client in range(4)] == roles
    assert cell.measured == ((0,) if workload == READERS else (0, 1, 2, 3))


def test_pauses_fixed_after_each_hold_or_exponential_before_each() -> None:
    rng = random.Random(1)
    fixed = Role(FIXED_PAUSE)
    assert fixed.pause_seconds(rng, 1.0, first=True) == 0.0
    assert fixed.pause_seconds(rng, 1.0, first=False) == 1.0
    assert Role(NO_PAUSE).pause_seconds(rng, 1.0, first=False) == 0.0
    assert Role(THINK_PAUSE).pause_seconds(rng, 1.0, first=True) > 0.0
    with pytest.raises(ValueError, match="the mixed workload needs at least 2 clients"):
        Cell(1, 1.0, MIXED, 5.0)


def test_plain_polling_and_the_readers_are_contenders_of_their_own() -> None:
    assert "ReservationMutex(fair=False)" in contender("plain").description
    assert "fair=True" in contender("fair").description


def _series(workload: str) -> dict:
    """The decide plan's runs of ``workload``: contender -> how many."""
    counts: dict = {}
    for _, cell, name in DECIDE.runs():
        if cell.workload == workload:
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_the_decide_plan_runs_the_sites_workloads_against_plain_polling_and_the_original() -> None:
    cells = {c.workload: c for c in DECIDE.cells}
    # Two shapes of setup burst: 8 drivers x 3 sections at 0.5 s, 16 x 2 at 0.3 s; three repeats each.
    assert (cells[SETUP_BURST_A].clients, cells[SETUP_BURST_A].hold) == (8, 0.5)
    assert (cells[SETUP_BURST_B].clients, cells[SETUP_BURST_B].hold) == (16, 0.3)
    assert (BURSTS[SETUP_BURST_A].sections, BURSTS[SETUP_BURST_A].think) == (3, 1.0)
    assert (BURSTS[SETUP_BURST_B].sections, BURSTS[SETUP_BURST_B].think) == (2, 0.5)
    for burst in BURSTS:
        assert _series(burst) == {BASELINE: 3, "default": 3, "plain": 3}
    # A job holds 60 s with three waiters behind it: the default lock twice, the others once.
    assert (cells[LONG_HOLD].clients, cells[LONG_HOLD].hold) == (4, 60.0)
    assert _series(LONG_HOLD) == {BASELINE: 1, "plain": 1, "default": 2}
    # The stress run's shape, for most of a minute, the default lock against plain polling.
    assert 16 <= cells[STRESS].clients <= 32 and cells[STRESS].window >= 45.0
    assert _series(STRESS) == {"default": 1, "plain": 1}
    assert contender("plain").description.startswith("ReservationMutex(fair=False)")


def test_series_have_their_own_repeats_interleaved_with_the_plans_rounds() -> None:
    a, b = Cell(2, 0.1, REACQUIRE, 1.0), Cell(2, 0.3, SETUP_BURST_B, 30.0)
    plan = Plan(
        "p", ((a, ("default",)),), repeats=2, series=(Series(b, ("default", "plain"), 3, seconds=5.0),)
    )
    assert list(plan.runs()) == [
        (0, a, "default"),
        (0, b, "default"),
        (0, b, "plain"),
        (1, a, "default"),
        (1, b, "default"),
        (1, b, "plain"),
        (2, b, "default"),
        (2, b, "plain"),
    ]
    assert plan.run_count == 8 and plan.cells == (a, b)
    # A finite cell's runs are estimated by the series' seconds, not by its cap.
    assert plan.estimated_seconds(per_run_overhead=1.0, per_client=0.0) == 2 * 2.0 + 6 * 6.0
    # --repeats changes the plan's repeated cells, not the series.
    assert dataclasses.replace(plan, repeats=1).run_count == 1 + 6


def test_every_contender_of_a_repeat_gets_the_same_work_in_the_sites_workloads() -> None:
    burst = Cell(8, 0.5, SETUP_BURST_A, 180.0)
    window = Cell(8, 1.0, THINK, 30.0)
    # The seed of a site cell depends on the repeat alone, not on the run's place in the plan.
    assert run_seed(0, 3, 1, burst) == run_seed(0, 4, 1, burst) != run_seed(0, 5, 2, burst)
    assert run_seed(0, 3, 1, window) != run_seed(0, 4, 1, window)
    seed = run_seed(0, 1, 0, burst)
    first = [burst.schedule(client, seed) for client in range(8)]
    assert first == [burst.schedule(client, seed) for client in range(8)]
    assert first != [burst.schedule(client, run_seed(0, 1, 1, burst)) for client in range(8)]
    assert burst.work(seed) == pytest.approx(sum(sum(s.holds) for s in first))


def test_a_burst_drivers_schedule_has_the_shapes_sections_start_and_draws() -> None:
    shape = BURSTS[SETUP_BURST_A]
    plans = [schedule(SETUP_BURST_A, 0.5, 8, client, seed) for seed in range(50) for client in range(8)]
    assert all(len(p.holds) == shape.sections == len(p.pauses) for p in plans)
    assert all(p.pauses[0] == 0.0 and 0.0 <= p.offset <= shape.spread and not p.job for p in plans)
    holds = sorted(h for p in plans for h in p.holds)
    thinks = [t for p in plans for t in p.pauses[1:]]
    assert holds[len(holds) // 2] == pytest.approx(0.5, rel=0.15)  # lognormal, median = the cell's hold
    assert sum(thinks) / len(thinks) == pytest.approx(shape.think, rel=0.2)  # exponential, mean 1 s
    with pytest.raises(ValueError, match="the think workload has no schedule"):
        schedule(THINK, 1.0, 2, 0, 0)


def test_the_long_holds_job_holds_once_and_its_waiters_start_early_in_the_hold() -> None:
    job = schedule(LONG_HOLD, 60.0, 4, 0, 7)
    assert job.job and job.holds == (60.0,) and job.offset == 0.0
    for client in (1, 2, 3):
        waiter = schedule(LONG_HOLD, 60.0, 4, client, 7)
        assert not waiter.job and waiter.holds == (WAITER_HOLD,) and 0.5 <= waiter.offset <= 2.0
    # A short hold (the smoke plan's) keeps its waiter inside the first half of it.
    assert 0.5 <= schedule(LONG_HOLD, 2.0, 2, 1, 7).offset <= 1.0


def test_the_stress_role_varies_its_holds_and_keeps_the_think_roles_draws() -> None:
    stress = Cell(32, 0.1, STRESS, 60.0).role(5)
    assert stress == Role(THINK_PAUSE, varied=True)
    sections = stress.sections(random.Random(3), 0.1)
    holds = [next(sections)[1] for _ in range(200)]
    assert min(holds) >= 0.05 and max(holds) <= 0.2 and len(set(holds)) > 100
    # A think-time client draws its pauses as it always did (its holds draw nothing).
    rng, again = random.Random(4), random.Random(4)
    think = Role(THINK_PAUSE).sections(rng, 1.0)
    assert [next(think) for _ in range(5)] == [(again.expovariate(1.0), 1.0) for _ in range(5)]


def test_the_smoke_plan_has_a_tiny_run_of_each_sites_workload() -> None:
    workloads = {cell.workload for cell in SMOKE.cells}
    assert {SETUP_BURST_B, LONG_HOLD, STRESS} <= workloads
    assert max(cell.window for cell in SMOKE.cells) <= 30.0
    assert set(PLANS) >= {"decide", "site", "smoke"}


def test_runs_together_take_place_in_one_batch_at_the_first_round() -> None:
    a, hold = Cell(2, 0.1, REACQUIRE, 1.0), Cell(4, 60.0, LONG_HOLD, 120.0)
    series = (
        Series(hold, (BASELINE, "plain"), 1, seconds=66.0, together=True),
        Series(hold, ("default",), 2, seconds=65.0, together=True),
    )
    plan = Plan("p", ((a, ("default",)),), repeats=2, series=series)
    assert list(plan.batches()) == [
        ((0, a, "default"),),
        ((0, hold, BASELINE), (0, hold, "plain"), (0, hold, "default"), (1, hold, "default")),
        ((1, a, "default"),),
    ]
    # Four runs of four clients at once: 16 processes; the batch takes as long as its longest run.
    assert plan.run_count == 6 and plan.max_clients == 16
    assert plan.estimated_seconds(per_run_overhead=1.0, per_client=0.0) == 2 * 2.0 + 67.0
    with pytest.raises(ValueError, match="only a finite cell's runs can take place together"):
        Series(Cell(32, 0.1, STRESS, 60.0), ("default",), 1, together=True)
    # The decide plan runs its long holds so: one minute for all four.
    (batch,) = [b for b in DECIDE.batches() if len(b) > 1]
    assert {cell.workload for _, cell, _ in batch} == {LONG_HOLD} and len(batch) == 4
