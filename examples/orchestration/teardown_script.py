"""An example teardown script: report a lock left behind, then disconnect everything under the lock.

A command that still holds the lock when teardown starts (it hung, or its execution server died) is
reported to the sandbox output, with who holds it. Teardown does not remove it; it waits a bounded time for
the lock and, if the holder keeps it, says so instead of changing the sandbox under someone's feet.
"""

from __future__ import annotations

from cloudshell.workflow.orchestration.sandbox import Sandbox

from cloudshell_mutex import MutexTimeout
from cloudshell_mutex.orchestration import report_left_behind_lock, sandbox_mutex, write_sandbox_output

#: How long teardown waits for the lock (seconds).
LOCK_TIMEOUT = 120.0


def teardown(sandbox):
    """Report a left-behind lock, then remove every connector while holding the lock."""
    report_left_behind_lock(sandbox)
    api = sandbox.automation_api
    try:
        with sandbox_mutex(sandbox, owner="Teardown", timeout=LOCK_TIMEOUT):
            details = api.GetReservationDetails(sandbox.id, disableCache=True).ReservationDescription
            ends = [end for c in details.Connectors for end in (c.Source, c.Target)]
            if ends:
                api.RemoveConnectorsFromReservation(sandbox.id, ends)
    except MutexTimeout as timeout:
        # The message names the holder as other code wrote it: write_sandbox_output escapes it (the
        # output pane renders HTML).
        write_sandbox_output(sandbox, f"Teardown left the connectors alone: {timeout}")


def main():
    """The script's entry point."""
    teardown(Sandbox())


if __name__ == "__main__":
    main()
