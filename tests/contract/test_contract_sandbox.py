"""Sandbox calls the lock uses around the alias: progress messages, and what an ended sandbox says."""

from __future__ import annotations

import pytest
from contract_support import end_seconds

from cloudshell_mutex.probe import checks

pytestmark = [pytest.mark.integration, pytest.mark.contract]


def test_write_message_to_reservation_output_works(sandbox) -> None:
    # The lock's progress messages ("waiting for MUTEX held by ...") go through this call. Reading
    # the output back has no call the suite can rely on, so the claim is that the call is accepted.
    answer = checks.check_output(sandbox.api, sandbox.id, "cloudshell-mutex contract suite: output works")
    assert answer.ok, f"WriteMessageToReservationOutput was {answer}"


def test_an_ended_sandbox_reports_completed_and_refuses_changes(sandbox, unique) -> None:
    status = sandbox.api.GetReservationStatus(sandbox.id).ReservationSlimStatus.Status
    assert status != checks.COMPLETED, "a sandbox that has just started already says Completed"
    sandbox.end()

    # A real server may run a teardown first; Completed is what it answers once the sandbox ended.
    ended = checks.check_ended_sandbox(
        sandbox.api, sandbox.id, unique("late"), max_wait=end_seconds(), poll=1.0
    )
    if ended.status_refused is not None:
        # The emulator's closed mode refuses every call on an ended sandbox (see docs/emulator.md). The facts
        # file says a real server answers Completed: demand that there.
        assert not sandbox.target.live, (
            f"GetReservationStatus of an ended sandbox failed: {ended.status_refused}"
        )
    else:
        assert ended.completed, (
            f"the sandbox did not say {checks.COMPLETED} within {end_seconds()} s of EndReservation "
            f"(statuses: {list(ended.statuses)}); raise CLOUDSHELL_TEST_END_SECONDS if its teardown is long"
        )
    # Changes fail; the wording is not documented, so only the failure is checked.
    assert not ended.add.ok
