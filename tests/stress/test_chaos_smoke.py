"""A tiny chaos round (part of ``make test``): the harness of ``make chaos`` works, and the lock stays safe.

It asserts safety and the harness's accounting, never liveness: how many sections run under faults is what
``make chaos`` measures (docs/reliability.md, "Liveness under faults"), not something a test may time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_harness import run
from chaos_timeline import BODY, FREE, RELEASING, UNKNOWN_YET, Worker, causes, lock_states, stalls

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["default", "plain"])
def test_a_tiny_chaos_round_is_safe_and_every_section_is_accounted_for(tmp_path, mode):
    result = run(seed=3, mode=mode, workers=2, sections=3, request_lifetime=5, journals=str(tmp_path))
    assert result["safety"]["ok"], result["safety"]
    assert result["worker_errors"] == [] and result["hung_workers"] == []
    assert result["left_in_reservation"] == []  # nothing of the lock's left once every worker settled
    sections = result["sections"]
    classes = ("ran", "timeout", "release_error", "lost", "other")
    assert sections["total"] == 6 and sum(sections[c] for c in classes) == 6
    assert sum(sections["ran_per_worker"]) == sections["ran"]
    assert sum(result["faults"]["by_kind"].values()) > 0  # the faults reached the workers' calls
    assert result["lock_src_seen"] == [str(Path(__file__).resolve().parents[2] / "src")]
    assert (tmp_path / "timeline.txt").exists() and (tmp_path / "events.json").exists()


def _section(number, start, end, outcome, **times):
    return {"t": "sec", "i": number, "start": start, "end": end, "outcome": outcome, **times}


def test_a_timeout_spent_behind_a_release_waiting_for_its_remove_is_charged_to_that_remove():
    """Worker 0 holds from 1 to 3 and releases from 3 to 125 (its remove met reset_before_commit, so the
    release waited out the request lifetime); worker 1's acquire ran from 2 to 32 and timed out naming it."""
    holder = Worker(0)
    holder.sections.append(_section(0, 0.5, 125.0, "ran", token="a", acquired=1.2, releasing=3.0))
    holder.calls.append({"m": "RemoveServicesFromReservation", "a": ["MUTEX"], "s": 3.1, "e": 3.2, "r": "x"})
    waiter = Worker(1)
    named = "timed out ...: held by worker 0 ...; the holder is releasing it: its remove got no answer"
    waiter.sections.append(_section(0, 2.0, 32.0, "timeout", error=named))
    waiter.sections.append(_section(1, 32.0, 62.0, "timeout", error="timed out ...: held by worker 0"))
    grants = [("a", 1.0, 124.9, {})]
    spans = lock_states(grants, [holder, waiter], until=130.0)
    assert [(s.state, s.start, s.end) for s in spans] == [
        (UNKNOWN_YET, 1.0, 1.2),
        (BODY, 1.2, 3.0),
        (RELEASING, 3.0, 124.9),
        (FREE, 124.9, 130.0),
    ]
    faults = {(0, 0): [{"kind": "reset_before_commit", "id": 9}]}
    found = causes(spans, [holder, waiter], faults)
    assert found["by_cause"] == {"held: releasing (remove: reset_before_commit)": 2}
    assert (
        found["timeouts_in_a_release_stall_naming_it"],
        found["timeouts_in_a_release_stall_not_naming_it"],
    ) == (
        1,
        1,
    )
    [stall] = stalls(spans, [holder, waiter], faults)[:1]
    assert stall["seconds"] == 123.9 and stall["cause"] == "held: releasing (remove: reset_before_commit)"
