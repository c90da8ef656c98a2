"""Sandbox calls the lock uses around the alias: progress messages, and what an ended sandbox says."""

from __future__ import annotations

import time

import pytest
from cloudshell.api.common_cloudshell_api import CloudShellAPIError
from contract_support import add_mutex, end_seconds

pytestmark = [pytest.mark.integration, pytest.mark.contract]

#: The only documented answer of GetReservationStatus for an ended sandbox (facts file).
COMPLETED = "Completed"


def test_write_message_to_reservation_output_works(sandbox) -> None:
    # The lock's progress messages ("waiting for MUTEX held by ...") go through this call. Reading
    # the output back has no call the suite can rely on, so the claim is that the call is accepted.
    sandbox.api.WriteMessageToReservationOutput(sandbox.id, "cloudshell-mutex contract suite: output works")


def test_an_ended_sandbox_reports_completed_and_refuses_changes(sandbox, unique) -> None:
    status = sandbox.api.GetReservationStatus(sandbox.id).ReservationSlimStatus.Status
    assert status != COMPLETED, "a sandbox that has just started already says Completed"
    sandbox.end()

    # A real server may run a teardown first; Completed is what it answers once the sandbox ended.
    deadline = time.monotonic() + end_seconds()
    seen = []
    while True:
        try:
            status = sandbox.api.GetReservationStatus(sandbox.id).ReservationSlimStatus.Status
        except CloudShellAPIError as error:
            # The emulator refuses every call on an ended sandbox (its stricter choice, see
            # docs/emulator.md). The facts file says a real server answers Completed: demand that there.
            assert not sandbox.target.live, f"GetReservationStatus of an ended sandbox failed: {error}"
            break
        seen.append(status)
        if status == COMPLETED:
            break
        assert time.monotonic() < deadline, (
            f"the sandbox did not say {COMPLETED} within {end_seconds()} s of EndReservation (statuses: "
            f"{seen}); raise CLOUDSHELL_TEST_END_SECONDS if its teardown is long"
        )
        time.sleep(1.0)

    # Changes fail; the wording is not documented, so only the failure is checked.
    with pytest.raises(CloudShellAPIError):
        add_mutex(sandbox.api, sandbox.id, unique("late"), "after the end")
