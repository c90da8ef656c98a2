"""Who holds a lock right now: one fresh (uncached) read of the reservation's services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from . import protocol
from .owner_token import describe_owner, parse_token


@dataclass(frozen=True)
class Holder:
    """The service that holds a lock alias.

    ``token`` is the ``Mutex Owner`` value ("" when the holder wrote none, as the original v1
    snippet does); ``label`` is a short description for people; ``attributes`` holds every attribute
    value of the service.
    """

    alias: str
    token: str
    label: str
    model: str
    attributes: Dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> Optional[int]:
        """The holder's process id, when the token was written by this library."""
        info = parse_token(self.token)
        return None if info is None else info.pid


def read_holder(api: Any, reservation_id: str, alias: str) -> Optional[Holder]:
    """Return the holder of ``alias`` in the reservation, or None when the alias is free.

    Uses ``disableCache=True``: the server caches GetReservationDetails for 5 seconds, and a cached
    answer must never decide who owns a lock (the original v2 snippet's mistake).
    """
    details = api.GetReservationDetails(reservation_id, disableCache=True)
    for service in details.ReservationDescription.Services or []:
        if service.Alias != alias:
            continue
        values = {
            _short_name(a.Name): "" if a.Value is None else str(a.Value) for a in service.Attributes or []
        }
        token = values.get(protocol.ATTR_OWNER, "")
        # Prefer the token (it names host and pid); a foreign token may come with our Label attribute.
        label = describe_owner(token)
        if parse_token(token) is None and values.get(protocol.ATTR_LABEL):
            label = values[protocol.ATTR_LABEL]
        return Holder(alias, token, label, service.ServiceName or "", values)
    return None


def _short_name(name: str) -> str:
    # 2nd-gen style names carry the model as a prefix ("Mutex Service.Mutex Owner").
    return name.rsplit(".", 1)[-1] if name and name.startswith(protocol.SERVICE_MODEL + ".") else name
