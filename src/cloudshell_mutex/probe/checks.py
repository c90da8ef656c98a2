"""What the lock relies on from a CloudShell server, one check each, asked through the API alone.

``cloudshell-mutex probe`` runs them against a site's server and judges what they saw (:mod:`.verdicts`); the
contract suite (``tests/contract``, ``make test-live``) runs the same functions and asserts on their results,
so each check has one implementation. A check works on aliases its caller owns (no lock user shares them),
leaves nothing of its own behind when its calls are answered, and returns what it saw. An answer that is part
of the question (a refused add, a failed remove) is recorded; a call that fails otherwise (a reset, a
timeout) raises, and the caller decides (the probe then reports the fact as not measured and watches for the
add to land).

Every check takes a session (``CloudShellAPISession`` or anything with its methods) and a reservation id.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue
from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from ..lock import protocol
from ..lock.admin.admin import Permission, permission_from_details
from ..lock.server.alias import LockAlias

#: The only documented answer of GetReservationStatus for an ended sandbox.
COMPLETED = "Completed"
#: What a read-after-write check waits at most for a change to show, and how often it reads meanwhile.
DEFAULT_MAX_WAIT = 8.0
DEFAULT_POLL = 0.25


@dataclass(frozen=True)
class Answer:
    """What one call answered: success, or the server's error code and message (or the exception's type)."""

    ok: bool
    code: str = ""
    message: str = ""

    @classmethod
    def of(cls, call: Callable[[], Any]) -> Answer:
        """Make the call; an API refusal is an answer, any other exception propagates (no answer)."""
        try:
            call()
        except CloudShellAPIError as error:
            return cls(False, str(error.code), str(error.message))
        return cls(True)

    @property
    def contention(self) -> bool:
        """The documented contention answer: code "100" and "already exists"."""
        return (
            not self.ok
            and self.code == protocol.CONTENTION_ERROR_CODE
            and protocol.CONTENTION_MESSAGE_FRAGMENT in self.message
        )

    def __str__(self) -> str:
        return "accepted" if self.ok else f"refused (code {self.code}: {self.message})"


def owner_values(owner: Optional[str], extra: Optional[Dict[str, str]] = None) -> List[Any]:
    """The attribute list of an add: ``Mutex Owner`` (unless None) and the ``extra`` attributes."""
    values = [] if owner is None else [AttributeNameValue(protocol.ATTR_OWNER, owner)]
    return values + [AttributeNameValue(name, value) for name, value in (extra or {}).items()]


def add(
    api: Any, reservation_id: str, alias: str, owner: Optional[str], extra: Optional[Dict[str, str]] = None
) -> Answer:
    """The protocol's acquire on ``alias``: add the Mutex Service with ``Mutex Owner`` (unless None)."""
    return Answer.of(
        lambda: api.AddServiceToReservation(
            reservation_id, protocol.SERVICE_MODEL, alias, owner_values(owner, extra)
        )
    )


def remove(api: Any, reservation_id: str, aliases: Sequence[str]) -> Answer:
    """``RemoveServicesFromReservation`` of ``aliases`` in one call."""
    return Answer.of(lambda: api.RemoveServicesFromReservation(reservation_id, list(aliases)))


def services(api: Any, reservation_id: str, cached: bool = False) -> Dict[str, Any]:
    """The reservation's services by alias, from one read (fresh unless ``cached``)."""
    if cached:
        details = api.GetReservationDetails(reservation_id)
    else:
        details = api.GetReservationDetails(reservation_id, disableCache=True)
    return {service.Alias: service for service in details.ReservationDescription.Services or []}


def attributes(service: Any) -> Dict[str, str]:
    """A service's attribute values by name (``Model.Attribute`` names shortened to ``Attribute``)."""
    return {
        a.Name.rsplit(".", 1)[-1]: "" if a.Value is None else str(a.Value) for a in service.Attributes or []
    }


def owner_in(found: Dict[str, Any], alias: str) -> Optional[str]:
    """The ``Mutex Owner`` of ``alias`` in one read's services ("" without one, None when absent)."""
    service = found.get(alias)
    return None if service is None else attributes(service).get(protocol.ATTR_OWNER, "")


#: How long to wait before a read that judges (a server whose fresh reads lag shows changes that much
#: later), and how: ``(seconds, sleep)``; None: read at once.
Settle = Optional[Tuple[float, Callable[[float], None]]]


def _wait(settle: Settle) -> None:
    if settle is not None and settle[0] > 0:
        settle[1](settle[0])


def _clean(api: Any, reservation_id: str, aliases: Sequence[str]) -> None:
    """Remove what a check added, one alias per call (whatever the server does with a multi-alias remove)."""
    for alias in aliases:
        remove(api, reservation_id, [alias])


# ---------------------------------------------------------------- the model


#: What the model takes: ``lease`` (our package: Mutex Owner, Label and the lease attributes), ``owner`` (the
#: original package of 2017: Mutex Owner only), ``none`` (a Mutex Service without Mutex Owner), ``missing``.
MODEL_KINDS = ("lease", "owner", "none", "missing")


@dataclass(frozen=True)
class ModelCheck:
    """Which attributes an add of the ``Mutex Service`` model takes, and what the refused adds answered."""

    kind: str
    refusals: Tuple[Answer, ...] = ()

    @property
    def has_owner(self) -> bool:
        """True when the model takes ``Mutex Owner``: the lock can tell its own add from anyone else's."""
        return self.kind in ("lease", "owner")


def check_model(api: Any, reservation_id: str, alias: str, owner: str) -> ModelCheck:
    """Add ``alias`` with the lock's attributes, then with ``Mutex Owner`` alone, then with none, until one is
    accepted (removed at once). The catalog is not asked: it may hide the admin-only Mutex family."""
    # What the lock's first add writes (catalog.FULL), a lease of "0" (none) so that no waiter judges it.
    lease = {
        protocol.ATTR_LABEL: "cloudshell-mutex probe",
        protocol.ATTR_LEASE_SECONDS: "0",
        protocol.ATTR_HEARTBEAT: "",
    }
    refusals: List[Answer] = []
    for kind, who, extra in (("lease", owner, lease), ("owner", owner, None), ("none", None, None)):
        answer = add(api, reservation_id, alias, who, extra)
        if answer.ok:
            _clean(api, reservation_id, [alias])
            return ModelCheck(kind, tuple(refusals))
        refusals.append(answer)
    return ModelCheck("missing", tuple(refusals))


# ---------------------------------------------------------------- the add and the remove


@dataclass(frozen=True)
class DuplicateCheck:
    """A second add of a taken alias: what it answered, and the owner a fresh read showed afterwards."""

    answer: Answer
    first_owner: str
    owner_after: Optional[str]

    @property
    def ok(self) -> bool:
        """The documented contention answer, and the first add's service untouched."""
        return self.answer.contention and self.owner_after == self.first_owner


def check_duplicate_add(
    api: Any, reservation_id: str, alias: str, first: str, second: str, settle: Settle = None
) -> DuplicateCheck:
    """Add ``alias`` as ``first``, then again as ``second``; read; remove."""
    added = add(api, reservation_id, alias, first)
    if not added.ok:
        raise RuntimeError(f"the first add of {alias!r} was {added}")
    answer = add(api, reservation_id, alias, second)
    _wait(settle)
    after = owner_in(services(api, reservation_id), alias)
    _clean(api, reservation_id, [alias])
    return DuplicateCheck(answer, first, after)


#: What a remove that names a missing alias next to one that is there does (see the emulator's
#: ``remove_missing`` modes): fails and removes nothing, removes the other and fails, removes it and succeeds.
REMOVE_KINDS = ("refuse_all", "remove_found", "ignore")


@dataclass(frozen=True)
class RemoveCheck:
    """``RemoveServicesFromReservation`` with a missing alias: alone, and next to one that is there."""

    missing_alone: Answer
    with_found: Answer
    found_removed: bool

    @property
    def kind(self) -> str:
        """One of :data:`REMOVE_KINDS`, or ``other`` (it succeeded and removed nothing)."""
        if not self.with_found.ok:
            return "remove_found" if self.found_removed else "refuse_all"
        return "ignore" if self.found_removed else "other"


def check_removes(
    api: Any, reservation_id: str, found: str, missing: str, owner: str, settle: Settle = None
) -> RemoveCheck:
    """Remove ``missing`` (never added) alone; then add ``found`` and remove ``[found, missing]``; read."""
    alone = remove(api, reservation_id, [missing])
    added = add(api, reservation_id, found, owner)
    if not added.ok:
        raise RuntimeError(f"the add of {found!r} was {added}")
    both = remove(api, reservation_id, [found, missing])
    _wait(settle)
    removed = found not in services(api, reservation_id)
    if not removed:
        _clean(api, reservation_id, [found])
    return RemoveCheck(alone, both, removed)


@dataclass(frozen=True)
class CaseCheck:
    """An add of the upper-case spelling of an alias whose lower-case spelling is taken."""

    answer: Answer

    @property
    def kind(self) -> str:
        """``exact`` (two aliases), ``insensitive`` (one: contention), or ``other`` (another refusal)."""
        return "exact" if self.answer.ok else "insensitive" if self.answer.contention else "other"


def check_alias_case(api: Any, reservation_id: str, alias: str, owner: str) -> CaseCheck:
    """Add ``alias.lower()``, then ``alias.upper()``; remove what was added."""
    lower, upper = alias.lower(), alias.upper()
    added = add(api, reservation_id, lower, owner)
    if not added.ok:
        raise RuntimeError(f"the add of {lower!r} was {added}")
    answer = add(api, reservation_id, upper, owner)
    _clean(api, reservation_id, [lower, upper] if answer.ok else [lower])
    return CaseCheck(answer)


@dataclass(frozen=True)
class DerivedAliasCheck:
    """An add of an alias with a ``~``, as the services a lock derives from its name have."""

    alias: str
    answer: Answer


def check_derived_alias(api: Any, reservation_id: str, name: str, owner: str) -> DerivedAliasCheck:
    """Add ``<name>~r1`` (a reader slot's form); remove it if it was accepted."""
    alias = protocol.reader_slot_alias(name, 1)
    answer = add(api, reservation_id, alias, owner)
    if answer.ok:
        _clean(api, reservation_id, [alias])
    return DerivedAliasCheck(alias, answer)


# ---------------------------------------------------------------- reads


@dataclass(frozen=True)
class ReadCheck:
    """How soon reads show an add and a remove, in seconds after the call was answered (0.0: the first read
    did; None: not within ``max_wait``). ``cached_lag`` is None too when the cached read was not measured."""

    fresh_lag: Optional[float]
    removal_lag: Optional[float]
    cached_lag: Optional[float]
    cached_measured: bool
    model: str
    owner: str
    max_wait: float

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _first_seen(
    read: Callable[[], bool], max_wait: float, poll: float, sleep: Callable[[float], None]
) -> Optional[float]:
    """Seconds until ``read()`` is True: 0.0 when the first read is, None when none is within ``max_wait``."""
    start = time.monotonic()
    if read():
        return 0.0
    while time.monotonic() - start < max_wait:
        sleep(poll)
        if read():
            return time.monotonic() - start
    return None


def poll_count(max_wait: float, poll: float) -> int:
    """The most reads :func:`_first_seen` makes (for the probe's bound on its calls)."""
    return 2 + int(max_wait / poll)


def check_read_after_write(
    api: Any,
    reservation_id: str,
    alias: str,
    owner: str,
    *,
    cached: bool = False,
    max_wait: float = DEFAULT_MAX_WAIT,
    poll: float = DEFAULT_POLL,
    sleep: Callable[[float], None] = time.sleep,
) -> ReadCheck:
    """Add ``alias``; read fresh (``disableCache``) until the add shows, and (``cached``: after one cached
    read made before the add) read cached until it shows; remove; read fresh until the remove shows."""
    if cached:
        services(api, reservation_id, cached=True)  # the snapshot a cached read then answers from
    added = add(api, reservation_id, alias, owner)
    if not added.ok:
        raise RuntimeError(f"the add of {alias!r} was {added}")
    seen: Dict[str, Any] = {}

    def fresh_shows() -> bool:
        seen.update(services(api, reservation_id))
        return alias in seen

    fresh = _first_seen(fresh_shows, max_wait, poll, sleep)
    cached_lag = None
    if cached:
        cached_lag = _first_seen(
            lambda: alias in services(api, reservation_id, cached=True), max_wait, poll, sleep
        )
    shown = seen.get(alias)
    model = "" if shown is None else str(shown.ServiceName)
    shown_owner = "" if shown is None else attributes(shown).get(protocol.ATTR_OWNER, "")
    removed = remove(api, reservation_id, [alias])
    if not removed.ok:
        raise RuntimeError(f"the remove of {alias!r} was {removed}")
    gone = _first_seen(lambda: alias not in services(api, reservation_id), max_wait, poll, sleep)
    return ReadCheck(fresh, gone, cached_lag, cached, model, shown_owner, max_wait)


# ---------------------------------------------------------------- the race


#: One racer's answer to one add: ``("ok", "", "")``, ``("api_error", code, message)`` or
#: ``("other", exception type, message)``.
Outcome = Tuple[str, str, str]


def race_adds(
    api: Any, reservation_id: str, aliases: Sequence[str], owner: str, wait: Callable[[], Any]
) -> List[Outcome]:
    """One racer: for each alias, ``wait()`` (a barrier shared with the other racers), then add it once."""
    outcomes: List[Outcome] = []
    for alias in aliases:
        wait()
        try:
            api.AddServiceToReservation(reservation_id, protocol.SERVICE_MODEL, alias, owner_values(owner))
            outcomes.append(("ok", "", ""))
        except CloudShellAPIError as error:
            outcomes.append(("api_error", str(error.code), str(error.message)))
        except Exception as error:
            outcomes.append(("other", type(error).__name__, str(error)))
    return outcomes


@dataclass
class RaceCheck:
    """Rounds of adds of one alias by every racer at once: did one win, and is its owner the one stored?"""

    racers: int
    rounds: int
    #: Rounds where more than one add succeeded: (round, the owners told they won).
    double_grants: List[Tuple[int, List[str]]] = field(default_factory=list)
    #: Rounds whose stored owner is not the one winner: (round, winner, stored owner).
    mismatches: List[Tuple[int, str, Optional[str]]] = field(default_factory=list)
    #: Losers' answers other than contention: (round, owner, answer).
    unexpected: List[Tuple[int, str, Outcome]] = field(default_factory=list)
    #: Rounds that cannot be judged: no winner (an add got no answer), (round, stored owner).
    unjudged: List[Tuple[int, Optional[str]]] = field(default_factory=list)
    wins: Dict[str, int] = field(default_factory=dict)

    @property
    def atomic(self) -> bool:
        """No round had two winners, and every winner's service is the one stored."""
        return not self.double_grants and not self.mismatches

    @property
    def clean(self) -> bool:
        """Atomic, and every round judged, every loser told the documented contention."""
        return self.atomic and not self.unexpected and not self.unjudged

    def problems(self) -> List[str]:
        """What went wrong, one line per round (empty when clean)."""
        return (
            [f"round {r}: {len(w)} adds succeeded ({', '.join(w)})" for r, w in self.double_grants]
            + [f"round {r}: {w} was told it won, the server stored {s!r}" for r, w, s in self.mismatches]
            + [f"round {r}: {o} got {a[0]} {a[1]}: {a[2]}" for r, o, a in self.unexpected]
            + [f"round {r}: no add was told it won (stored: {s!r})" for r, s in self.unjudged]
        )

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "atomic": self.atomic, "clean": self.clean}


def judge_race(
    aliases: Sequence[str], outcomes: Dict[str, Sequence[Outcome]], stored: Dict[str, Optional[str]]
) -> RaceCheck:
    """Judge a race: ``outcomes`` maps each racer's owner to its answers (one per alias, in order), ``stored``
    each alias to the ``Mutex Owner`` a fresh read showed afterwards."""
    check = RaceCheck(racers=len(outcomes), rounds=len(aliases))
    for round_, alias in enumerate(aliases):
        winners = [owner for owner, answers in outcomes.items() if answers[round_][0] == "ok"]
        for owner in winners:
            check.wins[owner] = check.wins.get(owner, 0) + 1
        owner_stored = stored.get(alias)
        if len(winners) > 1:
            check.double_grants.append((round_, winners))
        elif winners and owner_stored != winners[0]:
            check.mismatches.append((round_, winners[0], owner_stored))
        elif not winners:
            check.unjudged.append((round_, owner_stored))
        for owner, answers in outcomes.items():
            answer = answers[round_]
            if answer[0] != "ok" and not Answer(False, answer[1], answer[2]).contention:
                check.unexpected.append((round_, owner, answer))
    return check


def check_add_race(
    sessions: Sequence[Any],
    reservation_id: str,
    aliases: Sequence[str],
    owners: Sequence[str],
    settle: Settle = None,
) -> RaceCheck:
    """Race ``sessions`` (one thread each, owner ``owners[i]``) over ``aliases``, a barrier before each round;
    read once; judge; remove every alias in one call (each is there, so every server removes them all).

    Threads, not processes: each session has its own connection, so the server sees the adds arrive
    together; the contract suite races processes with :func:`race_adds` too."""
    barrier = threading.Barrier(len(sessions))
    results: Dict[str, List[Outcome]] = {}
    errors: List[BaseException] = []

    def racer(api: Any, owner: str) -> None:
        try:
            results[owner] = race_adds(api, reservation_id, aliases, owner, lambda: barrier.wait(timeout=120))
        except BaseException as error:  # told to the caller's thread below; the other racers stop
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=racer, args=pair, daemon=True) for pair in zip(sessions, owners)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:  # Ctrl-C: stop the racers, and let each finish the add it has on the wire
        barrier.abort()
        for thread in threads:
            thread.join()
        raise
    first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), None)
    if first is not None:
        raise first
    if len(results) < len(owners):
        raise RuntimeError("a racer stopped without answers")
    _wait(settle)
    found = services(sessions[0], reservation_id)
    stored = {alias: owner_in(found, alias) for alias in aliases}
    present = [alias for alias in aliases if alias in found]
    if present:
        remove(sessions[0], reservation_id, present)
    return judge_race(aliases, results, stored)


# ---------------------------------------------------------------- users and sandboxes


@dataclass(frozen=True)
class RolesCheck:
    """``GetUserDetails`` of the probing user: whether it lists groups with roles and domains (what Force
    Release's rule reads), and what the rule makes of this user in ``domain``."""

    is_admin: bool
    groups: int
    roles: int
    permission: Permission


def check_user_details(api: Any, user: str, domain: str) -> RolesCheck:
    """One ``GetUserDetails(user)``."""
    details = api.GetUserDetails(user)
    groups = list(getattr(details, "Groups", None) or [])
    roles = [g for g in groups if getattr(g, "GroupRole", "")]
    return RolesCheck(
        bool(getattr(details, "IsAdmin", False)),
        len(groups),
        len(roles),
        permission_from_details(details, user, domain),
    )


def check_output(api: Any, reservation_id: str, message: str) -> Answer:
    """``WriteMessageToReservationOutput`` (the lock's progress messages) is accepted, sent the one way the
    product writes the output (:meth:`LockAlias.write_output`: one escaped line). A call that got no answer
    raises :class:`ConnectionError` (no answer, as :meth:`Answer.of` lets other exceptions through)."""
    result = LockAlias(api, reservation_id).write_output(message)
    if result.ok:
        return Answer(True)
    failure = result.failure
    if failure is None or failure.code is None:
        raise ConnectionError(failure.message if failure else "the output write got no answer")
    return Answer(False, failure.code, failure.message)


@dataclass(frozen=True)
class EndedCheck:
    """What an ended sandbox says: its statuses until ``Completed`` (or the refusal of the status read), and
    whether it refuses an add."""

    statuses: Tuple[str, ...]
    status_refused: Optional[Answer]
    add: Answer

    @property
    def completed(self) -> bool:
        """The status read answered ``Completed``."""
        return bool(self.statuses) and self.statuses[-1] == COMPLETED


def check_ended_sandbox(
    api: Any,
    reservation_id: str,
    alias: str,
    *,
    max_wait: float = DEFAULT_MAX_WAIT,
    poll: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> EndedCheck:
    """After ``EndReservation``: read the status until ``Completed`` (at most ``max_wait``), then add
    ``alias`` (it must be refused; removed if it was not)."""
    statuses: List[str] = []
    refused: Optional[Answer] = None

    def completed() -> bool:
        nonlocal refused
        try:
            statuses.append(str(api.GetReservationStatus(reservation_id).ReservationSlimStatus.Status))
        except CloudShellAPIError as error:
            refused = Answer(False, str(error.code), str(error.message))
            return True
        return statuses[-1] == COMPLETED

    _first_seen(completed, max_wait, poll, sleep)
    answer = add(api, reservation_id, alias, "after the end")
    if answer.ok:
        _clean(api, reservation_id, [alias])
    return EndedCheck(tuple(statuses), refused, answer)
