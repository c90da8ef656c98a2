"""Wire-level constants of the MUTEX protocol.

These names are the compatibility contract with the original, public Mutex_Package protocol
(QualiSystemsLab/Reservation-Mutex-Lock): whoever adds the service alias first holds the lock.
Changing any of them breaks exclusion with code that already runs the original protocol.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, List, Optional, Tuple

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

# ---------------------------------------------------------------- the name table
# Every service a lock derives from its name ``MUTEX`` is named here, and only here.

#: Every alias the lock derives from a lock name carries this mark (reader slots, the closer, the writer
#: waiting, queue tickets, the releasing marker, the breaker, the generation counter), so no lock name may
#: contain it.
DERIVED_MARK = "~"
#: ``MUTEX~r<i>``: reader slot ``i`` (1-based) of a read-write lock, held by one reader while it reads.
READER_SLOT_SUFFIX = "~r"
#: ``MUTEX~c``: held by a reader closing the read group.
GROUP_CLOSER_SUFFIX = "~c"
#: ``MUTEX~w``: a writer waiting (readers neither open nor join a group while it is there).
WRITER_WAITING_SUFFIX = "~w"
#: ``MUTEX~q~<n>``: ticket ``n`` of a fair-mode waiter.
TICKET_INFIX = "~q~"
#: ``MUTEX~d~<nonce>``: the wait record of a waiter that holds other locks of the reservation and waits for
#: ``MUTEX`` outside the queue (a cohort member waiting for its machine's local lock, a ``fair=False``
#: waiter): what it waits for and what it holds, for deadlock detection. No queue counts it as a waiter.
WAIT_RECORD_INFIX = "~d~"
#: ``MUTEX~releasing``: added by a holder whose remove of ``MUTEX`` got no answer and may still land (its
#: ``Mutex Owner`` is the holder's token), so that a waiter that times out meanwhile can say why.
RELEASING_SUFFIX = "~releasing"
#: ``MUTEX~break``: held by a waiter while it breaks a stale holder of ``MUTEX``.
BREAKER_SUFFIX = "~break"
#: ``MUTEX~generation``: the lock's fencing counter.
GENERATION_SUFFIX = "~generation"

#: The kinds of lock service :func:`alias_kind` tells apart, in the order a listing shows them for one lock.
KINDS = (
    "lock",
    "writer waiting",
    "reader slot",
    "queue ticket",
    "wait record",
    "closing",
    "releasing",
    "breaker",
    "generation",
    "internal",
)


def reader_slot_alias(name: str, index: int) -> str:
    """The alias of reader slot ``index`` (1-based) of the lock ``name``."""
    return f"{name}{READER_SLOT_SUFFIX}{index}"


def closer_alias(name: str) -> str:
    """The alias a reader holds while it closes the read group of the lock ``name``."""
    return name + GROUP_CLOSER_SUFFIX


def writer_waiting_alias(name: str) -> str:
    """The alias a writer holds while it waits for the lock ``name``."""
    return name + WRITER_WAITING_SUFFIX


def ticket_alias(name: str, number: int) -> str:
    """The alias of ticket ``number`` of the lock ``name``."""
    return f"{name}{TICKET_INFIX}{number}"


def wait_record_alias(name: str, nonce: str) -> str:
    """The alias of the wait record for the lock ``name`` of the waiting acquisition whose token has
    ``nonce``."""
    return f"{name}{WAIT_RECORD_INFIX}{nonce}"


def releasing_alias(name: str) -> str:
    """The alias of the marker a holder of the lock ``name`` adds while its remove may still land."""
    return name + RELEASING_SUFFIX


def breaker_alias(name: str) -> str:
    """The alias of the breaker service of the lock ``name``."""
    return name + BREAKER_SUFFIX


def generation_alias(name: str) -> str:
    """The alias of the fencing counter of the lock ``name``."""
    return name + GENERATION_SUFFIX


def ticket_number(alias: str, name: str) -> Optional[int]:
    """The number of ``alias`` when it is a ticket of the lock ``name`` (None for any other alias)."""
    # Any length (a number is never refused for its size: a waiter joins after the highest it sees, and must
    # then see its own ticket), ASCII digits only, and written as ticket_alias writes it (no leading zero).
    digits = _after(alias, name + TICKET_INFIX)
    if digits is None or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


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
    digits = _after(alias, name + READER_SLOT_SUFFIX)
    return None if digits is None else int(digits)


def reader_slots(aliases: Iterable[str], name: str) -> List[str]:
    """The reader slots of the lock ``name`` among ``aliases`` (every service of one read), any number."""
    return sorted(alias for alias in aliases if reader_slot_number(alias, name) is not None)


#: What a lock name may be made of: printable ASCII (U+0020..U+007E), less the ``~`` of derived aliases.
LOCK_NAME_CHARACTERS = "printable ASCII (U+0020..U+007E)"
#: The longest service alias taken (aliases are short names on the sandbox diagram) ...
MAX_ALIAS_LENGTH = 256
#: ... and the longest lock name: the aliases it derives (``MUTEX~generation``, tickets) must fit too.
MAX_LOCK_NAME_LENGTH = 200
#: Characters no service alias can carry to the server and show as one line: controls, line and paragraph
#: separators, lone surrogates (XML 1.0 cannot carry most of them).
_UNSENDABLE = frozenset({"Cc", "Zl", "Zp", "Cs"})


def printable_ascii(text: str) -> bool:
    """True when every character of ``text`` is printable ASCII (U+0020..U+007E): read as it is."""
    return all(" " <= ch <= "~" for ch in text)


def escaped(ch: str) -> str:
    """One character as a ``\\uXXXX`` escape (``\\UXXXXXXXX`` beyond the BMP): how a message names a character
    that people could not see or could take for another."""
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"


def shown_name(name: str) -> str:
    """``name`` quoted for a message, with every character outside printable ASCII as a ``\\uXXXX`` escape
    (and ``\\`` and ``'`` escaped): ``'MUTEX\\u200b'`` never shows as ``'MUTEX'``. An ASCII name shows as
    ``repr`` shows it."""
    body = "".join("\\" + ch if ch in "\\'" else ch if " " <= ch <= "~" else escaped(ch) for ch in name)
    return f"'{body}'"


def lock_name_problem(name: str) -> Optional[str]:
    """Why ``name`` may not name a lock, as :func:`check_lock_name` says it (None: it may)."""
    shown = shown_name(name)
    if not name.strip():
        return "name (the lock's service alias) must be a non-empty string, e.g. 'MUTEX'"
    if name != name.strip():
        return (
            f"name {shown} has blanks around it: use {shown_name(name.strip())} (the server would take the "
            "blanks as part of a different alias)"
        )
    odd = next(((i, ch) for i, ch in enumerate(name) if not " " <= ch <= "~"), None)
    if odd is not None:
        position, ch = odd
        category = unicodedata.category(ch)
        what = unicodedata.name(ch, "a control character" if category == "Cc" else f"category {category}")
        looks = _looks_like(name)
        reads = f" (this one reads as {shown_name(looks)})" if looks else ""
        use = shown_name(looks) if looks else f"a name of {LOCK_NAME_CHARACTERS} only, e.g. {DEFAULT_ALIAS!r}"
        return (
            f"name {shown} contains {escaped(ch)} ({what}) at position {position}, and a lock name must be "
            f"{LOCK_NAME_CHARACTERS}: CloudShell shows aliases to people, and a name that looks like another"
            f"{reads} excludes nothing that uses the other; use {use}"
        )
    if len(name) > MAX_LOCK_NAME_LENGTH:
        return (
            f"name (the lock's service alias) must be at most {MAX_LOCK_NAME_LENGTH} characters, e.g. 'MUTEX'"
        )
    if DERIVED_MARK in name:
        return (
            f"name {shown} contains {DERIVED_MARK!r}, which marks the services a lock derives from its name "
            f"(reader slots {DEFAULT_ALIAS}~r1, the closer {DEFAULT_ALIAS}~c, queue tickets, breakers): "
            f"use a name without it, e.g. {shown_name(name.split(DERIVED_MARK)[0].strip() or DEFAULT_ALIAS)}"
        )
    if name != DEFAULT_ALIAS and name.casefold() == DEFAULT_ALIAS.casefold():
        return (
            f"name {shown} differs from {DEFAULT_ALIAS!r} only in letter case: use {DEFAULT_ALIAS!r}, the "
            "alias every other user of the lock (and the original snippet) adds"
        )
    return None


def check_lock_name(name: object) -> str:
    """Return ``name`` if it may name a lock, else raise ``ValueError`` saying why and what to use.

    A lock's name is the alias people see on the sandbox diagram and in its output, so it must not look like
    another: only :data:`LOCK_NAME_CHARACTERS` (``MUTEX\\u200b``, a Cyrillic ``\\u041c`` or fullwidth
    letters would show as ``MUTEX`` and exclude nothing that uses ``MUTEX``), no blanks around it
    (``" MUTEX"`` is a different alias to the server), no ``~`` (the mark of the aliases a lock derives from
    its name: a lock named ``MUTEX~r3`` would be taken for a part of ``MUTEX``'s read-write lock), and
    ``MUTEX`` only in that spelling (whether a server tells aliases apart by case is not known; either way
    ``mutex`` would not exclude the code that uses ``MUTEX``). The error names an offending character as a
    ``\\uXXXX`` escape, never raw.

    Every lock, and every helper that makes one, checks its name here. Administrators' commands on a service
    that exists (status, Force Release) take any alias :func:`check_service_alias` takes instead.
    """
    if not isinstance(name, str):
        raise ValueError("name (the lock's service alias) must be a non-empty string, e.g. 'MUTEX'")
    problem = lock_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


def check_service_alias(alias: object) -> str:
    """Return ``alias`` if it can name a service that exists, for an administrator's command on it
    (``status``, ``release``, the Mutex Service driver's commands), else raise ``ValueError``.

    Looser than :func:`check_lock_name` on purpose: a service whose alias no lock of ours may have (one that
    only looks like ``MUTEX``, made by other code) must still be seen and removed by name. Refused: a blank
    alias, one longer than :data:`MAX_ALIAS_LENGTH`, and characters no alias can carry as one line (controls,
    line separators, lone surrogates).
    """
    if not isinstance(alias, str) or not alias.strip():
        raise ValueError("name (the lock's service alias) must be a non-empty string, e.g. 'MUTEX'")
    if len(alias) > MAX_ALIAS_LENGTH:
        raise ValueError(f"name (the lock's service alias) must be at most {MAX_ALIAS_LENGTH} characters")
    odd = next((ch for ch in alias if unicodedata.category(ch) in _UNSENDABLE), None)
    if odd is not None:
        raise ValueError(
            f"name {shown_name(alias)} contains {escaped(odd)}, a control character or line break, which no "
            "service alias can carry: give the alias as the sandbox shows it, e.g. 'MUTEX'"
        )
    return alias


def _looks_like(name: str) -> str:
    """What people may read ``name`` as, when that is printable ASCII ("" otherwise): compatibility forms
    folded (fullwidth letters, ligatures), accents and invisible characters (zero-width spaces, soft hyphens,
    joiners, bidi marks) dropped."""
    folded = unicodedata.normalize("NFKD", name)
    seen = "".join(ch for ch in folded if unicodedata.category(ch) not in ("Cf", "Mn", "Me")).strip()
    return seen if seen and printable_ascii(seen) else ""


def alias_kind(alias: str) -> Tuple[str, str]:
    """``(lock, kind)`` of a lock service's alias, ``kind`` one of :data:`KINDS` (``("MUTEX", "reader slot")``
    for ``MUTEX~r3``). Any other ``MUTEX~...`` is an ``"internal"`` service of ``MUTEX``."""
    for suffix, kind in (
        (BREAKER_SUFFIX, "breaker"),
        (GENERATION_SUFFIX, "generation"),
        (RELEASING_SUFFIX, "releasing"),
    ):
        if alias.endswith(suffix) and len(alias) > len(suffix):
            return alias[: -len(suffix)], kind
    if DERIVED_MARK not in alias:
        return alias, "lock"
    lock, infix, number = alias.rpartition(TICKET_INFIX)
    if infix and lock and _DIGITS.fullmatch(number):
        return lock, "queue ticket"
    lock, infix, nonce = alias.rpartition(WAIT_RECORD_INFIX)
    if infix and lock and _HEX.fullmatch(nonce):
        return lock, "wait record"
    lock = alias.rsplit(DERIVED_MARK, 1)[0]
    if alias == writer_waiting_alias(lock):
        return lock, "writer waiting"
    if alias == closer_alias(lock):
        return lock, "closing"
    if reader_slot_number(alias, lock) is not None:
        return lock, "reader slot"
    return lock, "internal"


def _after(alias: str, prefix: str) -> Optional[str]:
    """The ASCII digits that follow ``prefix`` in ``alias`` (all of the rest), else None."""
    if not alias.startswith(prefix):
        return None
    digits = alias[len(prefix) :]
    return digits if _DIGITS.fullmatch(digits) else None


_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9a-f]+")
