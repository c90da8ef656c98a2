"""The stalls bench (bench/stalls.py): its verdicts, its section of the report, and short end-to-end runs
(separate processes killed for real, the emulator, the real client)."""

from __future__ import annotations

import random
import time

import pytest

from cloudshell_mutex.bench import stalls
from cloudshell_mutex.bench.report import kept_sections
from cloudshell_mutex.bench.stalls import (
    MARK_END,
    MARK_START,
    SCENARIOS,
    ClientPlan,
    Harness,
    Outcome,
    ScenarioResult,
    client_of,
    table,
    write_section,
)
from cloudshell_mutex.lock.queue.tickets import FALLBACK_AFTER


def result(name: str, default, plain) -> ScenarioResult:
    return ScenarioResult(SCENARIOS[name], [Outcome(*d) for d in default], [Outcome(*p) for p in plain])


def test_recovery_is_met_within_the_slack_and_missed_beyond_it_in_every_repeat():
    assert result("dead-holder-and-head", [(8.4,), (9.0,)], [(8.0,), (8.6,)]).verdict() == "met"
    assert result("dead-holder-and-head", [(11.0,), (12.0,)], [(8.0,), (8.6,)]).verdict() == "missed"
    assert result("dead-holder-and-head", [(8.0,), (12.0,)], [(8.0,), (8.6,)]).verdict() == "not judged"


def test_throughput_is_held_to_a_share_of_plain_pollings_and_runs_off_their_script_are_not_judged():
    assert result("bimodal", [(39.0,), (40.0,)], [(40.0,), (41.0,)]).verdict() == "met"
    assert result("bimodal", [(30.0,), (31.0,)], [(40.0,), (41.0,)]).verdict() == "missed"
    off_script = result("dead-waiters", [(0.0, "the kill hit the holder", False)], [(300.0,)])
    assert off_script.verdict() == "not judged"
    assert "(the kill hit the holder)" in table([off_script])[2]


def test_the_section_replaces_itself_and_the_main_report_keeps_it(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nmain report\n", encoding="utf-8")
    write_section(doc, [result("bimodal", [(39.0,)], [(40.0,)])], seed=0, scale=1.0)
    write_section(doc, [result("slow-client", [(300.0,)], [(200.0,)])], seed=0, scale=1.0)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nmain report\n")
    assert text.count(MARK_START) == 1 and text.count(MARK_END) == 1
    assert "slow-client" in text and "**bimodal**" not in text
    kept = kept_sections(text)
    assert kept.startswith(MARK_START) and "| **slow-client**" in kept and kept.endswith(MARK_END + "\n")


def test_a_plan_draws_its_holds_by_their_shares_and_tokens_name_their_client():
    plan = ClientPlan(True, 6.0, ((0.7, 2.0), (0.3, 0.01)))
    rng = random.Random(1)
    draws = [plan.hold(rng) for _ in range(2000)]
    assert set(draws) == {2.0, 0.01}
    assert 0.65 < draws.count(2.0) / len(draws) < 0.75
    assert client_of("stall-client-11@host:42:0123abcd") == 11
    assert client_of("warm-up@host:42:0123abcd") is None and client_of("") is None


class _Lagging:
    """A harness whose clients' reports lag the server: client 3 was granted, its report not in yet."""

    plans = [None] * 6

    def __init__(self) -> None:
        self.killed: tuple = ()

    def holding(self) -> dict:
        return {0: False, 1: False, 2: False, 3: False, 4: False, 5: False}

    def holder(self) -> int:
        return 3

    def drain(self, until: float) -> None:
        pass

    def kill(self, *clients: int) -> float:
        self.killed = clients
        return 0.0


def test_the_waiters_killed_leave_out_the_holder_the_server_shows_before_their_reports_do():
    for seed in range(20):  # without the server's holder, client 3 is drawn for most seeds
        h = _Lagging()
        _, note, valid = stalls.kill_waiters(h, seed, count=5)
        assert 3 not in h.killed and valid, (seed, note)


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_waiter_is_gone_and_the_survivors_go_on():
    plans = [ClientPlan(True, 6.0, ((1.0, 0.1),)) for _ in range(3)]
    # A dead waiter's ticket may be the head: the survivors pass it once the lock stayed free FALLBACK_AFTER
    # between two reads, not after its lease (150 s).
    within = FALLBACK_AFTER + 3.0
    # The clients' reports lag a grant, and a hand-off comes every few tenths of a second: the kill may hit a
    # client granted a moment ago, or one whose add lands after it died (kill_waiters says so; a holder's
    # death is another scenario). Try again.
    for seed in range(5):
        with Harness(plans, seed=seed) as h:
            start = h.open(window=2.0 + stalls.IN_FLIGHT_SECONDS + within + 2.0)
            h.drain(start + 2.0)
            killed_at, _, waited = stalls.kill_waiters(h, seed, count=1)
            if not waited:
                continue
            (victim,) = h.killed
            h.drain(killed_at + within)
            assert h.holder() != victim
            assert h.grants(killed_at + 0.5, killed_at + within) == h.grants(
                killed_at + 0.5, killed_at + within, excluded=(victim,)
            )
            # Counted once the victim's last request has landed: its ticket may be the head by then.
            assert h.grants(killed_at + stalls.IN_FLIGHT_SECONDS, killed_at + within, excluded=(victim,)) > 0
            assert not h.holding().get(victim, False)  # it died waiting
            return
    pytest.fail("every kill hit the holder, or an add of the victim's landed after it died")


@pytest.mark.integration
@pytest.mark.slow
def test_the_cli_runs_a_scenario_with_both_locks_and_writes_its_section(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    began = time.monotonic()
    code = stalls.main(["--scenarios", "dead-ticket", "--repeats", "1", "--scale", "0.15", "--doc", str(doc)])
    assert code == 0 and time.monotonic() - began < 120
    text = doc.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| **dead-ticket**"))
    assert "grants/min" in row and "(" not in row.split("|")[2]  # the default's run went by its script
    assert "dead-ticket, default, repeat 1: " in text and "added before" in text


def test_unknown_scenarios_are_refused_with_the_known_ones_named(capsys):
    with pytest.raises(SystemExit):
        stalls.main(["--scenarios", "dead-head"])
    assert "dead-holder-and-head" in capsys.readouterr().err
