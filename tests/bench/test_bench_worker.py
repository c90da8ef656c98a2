"""One client's run without a server: a finite schedule followed section by section, its calls recorded."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, List

from cloudshell_mutex.bench.contenders import contender
from cloudshell_mutex.bench.plans import JOB_CONTENDER, LONG_HOLD, SETUP_BURST_B, WAITER_HOLD, schedule
from cloudshell_mutex.bench.worker import RunSpec, record_calls, run_client


class FreeLock:
    """A session whose lock is always free: every API method goes through ``_sendRequest``, as the
    client's do."""

    def __init__(self) -> None:
        self.sent: List[str] = []

    def _sendRequest(self, operation: str, message: str) -> str:
        self.sent.append(operation)
        return "ok"

    def AddServiceToReservation(self, *args: Any) -> str:
        return self._sendRequest("AddServiceToReservation", "")

    def RemoveServicesFromReservation(self, *args: Any) -> str:
        return self._sendRequest("RemoveServicesFromReservation", "")


def spec(workload: str, hold: float, clients: int, seed: int = 3) -> RunSpec:
    start = time.monotonic() + 0.05
    return RunSpec("r", contender("original-v1"), workload, hold, start, start + 30.0, seed, clients)


def test_a_burst_driver_runs_its_schedule_and_reports_its_calls() -> None:
    api = FreeLock()
    calls = record_calls(api)
    calls.append((-1.0, "GetReservationDetails"))  # a call of an earlier run: not this run's
    run = spec(SETUP_BURST_B, 0.01, 2)
    report = run_client(api, 1, run, calls)
    mine = schedule(SETUP_BURST_B, 0.01, 2, 1, run.seed)
    assert report.error is None and report.acquired == len(mine.holds) == len(report.starts)
    # The driver starts at its offset and thinks its pauses between sections.
    assert report.starts[0] >= run.start + mine.offset
    assert report.starts[1] - report.holds[0][1] >= mine.pauses[1]
    # Every call its session sent (an add and a remove per section), when it sent it.
    assert api.sent == ["AddServiceToReservation", "RemoveServicesFromReservation"] * 2
    assert [method for _, method in report.calls] == api.sent
    assert all(run.start <= t <= time.monotonic() for t, _ in report.calls)


def test_the_long_holds_job_takes_the_default_lock_whatever_the_runs_contender() -> None:
    from cloudshell_mutex.bench.worker import _plan

    run = spec(LONG_HOLD, 2.0, 2)
    offset, sections, make = _plan(0, run)
    assert (offset, list(sections), make) == (0.0, [(0.0, 2.0)], contender(JOB_CONTENDER).make)
    # The waiter takes the run's contender (the original's plain add), once, for the waiter's hold.
    api = FreeLock()
    report = run_client(api, 1, run, record_calls(api))
    assert report.acquired == 1 and api.sent[0] == "AddServiceToReservation"
    assert report.holds[0][1] - report.holds[0][0] >= WAITER_HOLD
    assert report.starts[0] >= run.start + schedule(LONG_HOLD, 2.0, 2, 1, run.seed).offset


def test_a_session_without_the_request_method_is_not_counted() -> None:
    class Bare:
        pass

    assert record_calls(Bare()) == []


def test_a_client_of_runs_together_takes_its_place_in_its_own_run() -> None:
    # Process 3 is client 1 of a run whose clients are processes 2 and 3: it does what that run's client 1
    # does, and reports as client 1.
    api = FreeLock()
    run = dataclasses.replace(spec(SETUP_BURST_B, 0.01, 2), first=2)
    report = run_client(api, 3, run, record_calls(api))
    assert report.client == 1 and report.acquired == len(schedule(SETUP_BURST_B, 0.01, 2, 1, run.seed).holds)
