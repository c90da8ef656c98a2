"""Wire-level constants of the MUTEX protocol.

These names are the compatibility contract with the original, public Mutex_Package protocol
(QualiSystemsLab/Reservation-Mutex-Lock): whoever adds the service alias first holds the lock.
Changing any of them breaks exclusion with code that already runs the original protocol.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional

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

#: Every alias the lock derives from a lock name carries this mark (reader slots, the closer, the writer
#: waiting, queue tickets, the breaker, the generation counter), so no lock name may contain it.
DERIVED_MARK = "~"

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


def reader_slot_number(alias: str, name: str) -> Optional[int]:
    """The number of ``alias`` when it is a reader slot of the lock ``name`` (``MUTEX~r<digits>``), else None.

    Any number counts, whatever ``max_readers`` the reader that added it chose: two readers with different
    ``max_readers`` must still see each other's slots."""
    prefix = name + READER_SLOT_SUFFIX
    if not alias.startswith(prefix):
        return None
    digits = alias[len(prefix) :]
    return int(digits) if _DIGITS.fullmatch(digits) else None


def reader_slots(aliases: Iterable[str], name: str) -> List[str]:
    """The reader slots of the lock ``name`` among ``aliases`` (every service of one read), any number."""
    return sorted(alias for alias in aliases if reader_slot_number(alias, name) is not None)


def check_lock_name(name: object) -> str:
    """Return ``name`` if it may name a lock, else raise ``ValueError`` saying why and what to use.

    Refused: a name with blanks around it (``" MUTEX"`` would be a different alias from ``MUTEX`` to the
    server, and invisible to people), a name with ``~`` (the mark of the aliases a lock derives from its name:
    a lock named ``MUTEX~r3`` or ``MUTEX~c`` would be taken for a part of ``MUTEX``'s read-write lock), and a
    spelling of ``MUTEX`` in other letter cases (whether a CloudShell server tells aliases apart by case is
    not known; either way ``mutex`` would not exclude the code that uses ``MUTEX``).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name (the lock's service alias) must be a non-empty string, e.g. 'MUTEX'")
    if name != name.strip():
        raise ValueError(
            f"name {name!r} has blanks around it: use {name.strip()!r} (the server would take the blanks as "
            "part of a different alias)"
        )
    if DERIVED_MARK in name:
        raise ValueError(
            f"name {name!r} contains {DERIVED_MARK!r}, which marks the services a lock derives from its name "
            f"(reader slots {DEFAULT_ALIAS}~r1, the closer {DEFAULT_ALIAS}~c, queue tickets, breakers): "
            f"use a name without it, e.g. {name.split(DERIVED_MARK)[0].strip() or DEFAULT_ALIAS!r}"
        )
    if name != DEFAULT_ALIAS and name.casefold() == DEFAULT_ALIAS.casefold():
        raise ValueError(
            f"name {name!r} differs from {DEFAULT_ALIAS!r} only in letter case: use {DEFAULT_ALIAS!r}, the "
            "alias every other user of the lock (and the original snippet) adds"
        )
    return name


_DIGITS = re.compile(r"[0-9]+")
