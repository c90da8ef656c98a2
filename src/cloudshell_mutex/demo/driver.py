"""The demo's driver: it replaces the resource it runs on with a new one and moves that resource's connectors.

Two instances run at once in one sandbox (one on A, one on B). Each reads the topology, then changes it in
four calls. Without a lock they act on what they read, which the other is changing: calls fail and the
sandbox ends up wired wrong. :meth:`RewireDriver.replace_resource_locked` is the same command under the
reservation lock.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from cloudshell.api.cloudshell_api import SetConnectorRequest
from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface

from cloudshell_mutex.driver import ReservationMutexMixin, context_reservation, with_reservation_mutex


class RewireDriver(ResourceDriverInterface, ReservationMutexMixin):
    """Replace the resource a command runs on, keeping its connections.

    ``after_read`` (optional) runs between reading the topology and changing it: the demo uses it to widen
    the race window on purpose, the same way with and without the lock.
    """

    def __init__(self, after_read: Optional[Callable[[], None]] = None) -> None:
        self.after_read = after_read

    def initialize(self, context: Any) -> None:
        """Nothing to set up."""

    def cleanup(self) -> None:
        """Close the API sessions the driver opened."""
        self.close_reservation_mutex_sessions()

    def replace_resource(self, context: Any, new_resource: str) -> List[str]:
        """Put ``new_resource`` in place of the command's resource; return the peers it was connected to."""
        return self._replace(context, new_resource)

    @with_reservation_mutex(timeout=120)
    def replace_resource_locked(self, context: Any, new_resource: str) -> List[str]:
        """:meth:`replace_resource` under the sandbox's reservation lock."""
        return self._replace(context, new_resource)

    def _replace(self, context: Any, new_resource: str) -> List[str]:
        api = self.cloudshell_api(context)
        reservation_id = context_reservation(context).reservation_id
        old = context.resource.name
        details = api.GetReservationDetails(reservation_id, disableCache=True).ReservationDescription
        peers = [
            c.Target if c.Source == old else c.Source
            for c in details.Connectors
            if old in (c.Source, c.Target)
        ]
        if self.after_read is not None:
            self.after_read()
        api.AddResourcesToReservation(reservation_id, [new_resource])
        if peers:
            api.SetConnectorsInReservation(
                reservation_id, [SetConnectorRequest(new_resource, peer, "bi", "") for peer in peers]
            )
            api.RemoveConnectorsFromReservation(
                reservation_id, [end for peer in peers for end in (old, peer)]
            )
        api.RemoveResourcesFromReservation(reservation_id, [old])
        return peers
