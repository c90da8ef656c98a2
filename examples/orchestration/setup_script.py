"""An example setup script: connect the sandbox's resources in a chain, under the reservation lock.

Drivers may be rewiring the same sandbox while setup runs; the lock makes setup's read-then-connect one
step. CloudShell runs this with the environment variables orch-core's ``Sandbox()`` reads.

To run the step inside the standard setup workflow instead, register the same function:
``sandbox.workflow.add_to_connectivity(connect_resources, None)``.
"""

from __future__ import annotations

from cloudshell.api.cloudshell_api import SetConnectorRequest
from cloudshell.workflow.orchestration.sandbox import Sandbox

from cloudshell_mutex.orchestration import with_sandbox_mutex, write_sandbox_output


@with_sandbox_mutex(owner="Setup", timeout=600)
def connect_resources(sandbox, components):
    """Connect the sandbox's resources in a chain (sorted by name); the whole step holds the lock."""
    api = sandbox.automation_api
    details = api.GetReservationDetails(sandbox.id, disableCache=True).ReservationDescription
    names = sorted(r.Name for r in details.Resources)
    links = [SetConnectorRequest(a, b, "bi", "") for a, b in zip(names, names[1:])]
    if links:
        api.SetConnectorsInReservation(sandbox.id, links)
    write_sandbox_output(sandbox, f"Setup connected {len(links)} pair(s) of resources")


def main():
    """The script's entry point."""
    sandbox = Sandbox()
    connect_resources(sandbox, sandbox.components)


if __name__ == "__main__":
    main()
