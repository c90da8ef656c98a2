"""An example CloudShell driver that changes its sandbox under the reservation lock.

Two commands on a "patch panel" resource:

* ``connect(peer)`` connects this resource to ``peer`` unless they are connected already. The check and the
  change must happen as one step, or two commands running at once both see "not connected" (or worse,
  one removes what the other just made), so the block runs under ``self.reservation_mutex(context)``.
* ``disconnect_all()`` removes every connector of this resource; the whole command runs under the lock
  (``@with_reservation_mutex``).

Both commands take ``cancellation_context`` and drivermetadata.xml sets ``EnableCancellation="true"``: while a
command waits for the lock, the portal's Stop ends the wait within a second (``MutexCancelled``, nothing left
in the sandbox). The lock picks the argument up by itself; the work under a held lock is never interrupted.

Every driver, setup script or teardown script that uses the same alias (``MUTEX``) takes turns with these
commands, across execution servers. Packaged like any shell: driver.py, drivermetadata.xml and
requirements.txt at the driver zip's root.
"""

from __future__ import annotations

from cloudshell.api.cloudshell_api import SetConnectorRequest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface

from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex


class PatchPanelDriver(ResourceDriverInterface, ReservationMutexMixin):
    """Connects and disconnects the resource it runs on, one command at a time per sandbox."""

    def initialize(self, context):
        """Nothing to set up."""

    def cleanup(self):
        """Close the API sessions the lock opened."""
        self.close_reservation_mutex_sessions()

    def connect(self, context, peer, cancellation_context=None):
        """Connect this resource to ``peer`` (a resource in the sandbox) if they are not connected yet."""
        api = self.cloudshell_api(context)
        reservation_id = context.reservation.reservation_id
        me = context.resource.name
        with self.reservation_mutex(context, timeout=600):
            details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
            if any({c.Source, c.Target} == {me, peer} for c in details.Connectors):
                return f"{me} and {peer} are already connected"
            api.SetConnectorsInReservation(reservation_id, [SetConnectorRequest(me, peer, "bi", "")])
        return f"connected {me} to {peer}"

    @with_reservation_mutex(timeout=600)
    def disconnect_all(self, context, cancellation_context=None):
        """Remove every connector of this resource."""
        api = self.cloudshell_api(context)
        reservation_id = context.reservation.reservation_id
        me = context.resource.name
        details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
        ends = [end for c in details.Connectors if me in (c.Source, c.Target) for end in (c.Source, c.Target)]
        if ends:
            api.RemoveConnectorsFromReservation(reservation_id, ends)
        return f"removed {len(ends) // 2} connector(s) of {me}"
