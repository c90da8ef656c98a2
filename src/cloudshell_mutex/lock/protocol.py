"""Wire-level constants of the MUTEX protocol.

These names are the compatibility contract with the original, public Mutex_Package protocol
(QualiSystemsLab/Reservation-Mutex-Lock): whoever adds the service alias first holds the lock.
Changing any of them breaks exclusion with code that already runs the original protocol.
"""

from __future__ import annotations

#: Service family and model defined by Mutex_Package (the original and ours).
SERVICE_FAMILY = "Mutex Service Family"
SERVICE_MODEL = "Mutex Service"

#: Alias used by the original protocol. Any shared custom alias works the same way.
DEFAULT_ALIAS = "MUTEX"

#: Attribute set in the add call; holds the acquisition's owner token.
ATTR_OWNER = "Mutex Owner"

#: The mark in front of the owner token of a ReservationRWLock's read group (shared by many readers, so
#: never removed by hand, and broken only with its reader slots in view).
READ_GROUP_MARK = "read-group#"
#: Reader slot ``i`` of lock ``MUTEX`` is ``MUTEX~r<i>``; ``MUTEX~c`` is held by a reader closing the group.
READER_SLOT_SUFFIX = "~r"
GROUP_CLOSER_SUFFIX = "~c"

#: Attributes added by our package for leases (roadmap step 5). A server that has only the original
#: package lacks them, so the lock writes them only when the installed model has them.
ATTR_LEASE_SECONDS = "Mutex Lease Seconds"
ATTR_HEARTBEAT = "Mutex Heartbeat"
ATTR_GENERATION = "Mutex Generation"
ATTR_LABEL = "Mutex Label"

#: Every attribute our package adds, in data-model order.
LEASE_ATTRIBUTES = (ATTR_LABEL, ATTR_LEASE_SECONDS, ATTR_HEARTBEAT, ATTR_GENERATION)

#: Contention: the add failed because the alias is taken. Both parts must match, because the server
#: uses code 100 for unrelated failures too.
CONTENTION_ERROR_CODE = "100"
CONTENTION_MESSAGE_FRAGMENT = "already exists"
DUPLICATE_ALIAS_MESSAGE = "Service with given alias already exists"
