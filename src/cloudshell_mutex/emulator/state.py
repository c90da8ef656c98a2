"""The emulated server's data: the catalog, resources, reservations with their services and connectors,
and (as parts of :class:`EmulatorState`) the accounts and the instrumentation.

Every change and every read of reservation data happens under one lock, so a check and the change it
guards (for example "alias free?" then "insert service") are one atomic step, as on the real server.
Operations raise :class:`ApiError`, which the wire layer turns into a ``Success="false"`` envelope.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .accounts import Accounts, Session  # noqa: F401 (Session: re-exported)
from .instrumentation import EVENT_LOG_LIMIT, EVENT_TAGS, Instrumentation, utcnow  # noqa: F401 (re-exported)
from .messages import (  # noqa: F401 (re-exported: the names other modules and tests know them by)
    CONNECTOR_NOT_FOUND_ERROR,
    DUPLICATE_ALIAS,
    GENERIC_ERROR,
    UNKNOWN_COMMAND_ERROR,
    ApiError,
)

#: How long GetReservationDetails answers from its per-reservation snapshot (the real server: 5 s).
DEFAULT_DETAILS_CACHE_SECONDS = 5.0

CONNECTOR_DIRECTIONS = ("bi", "uni")

#: ``catalog`` modes: what GetServices lists (docs/emulator.md).
PERMISSIVE, STRICT = "permissive", "strict"
CATALOG_MODES = (PERMISSIVE, STRICT)

#: ``ended_reservations`` modes: ``readable`` (reads answer, changes fail) or ``closed`` (every call fails).
READABLE, CLOSED = "readable", "closed"
ENDED_RESERVATION_MODES = (READABLE, CLOSED)

#: ``alias_case`` modes: service aliases compared ``exact`` (as given) or ``insensitive`` to letter case (a
#: real server's behaviour is not known; its database's usual collation ignores case: docs/emulator.md).
EXACT, INSENSITIVE = "exact", "insensitive"
ALIAS_CASE_MODES = (EXACT, INSENSITIVE)

#: How far back a reservation's versions are kept for ``stale_fresh_read`` (seconds).
HISTORY_SECONDS = 30.0

# The answers a real server may give to the questions the site probe asks (docs/emulator.md, "Real-server
# modes"); the first of each pair is the default.
#: ``add_atomicity``: an add checks the alias and inserts in one step (``atomic``), or in two steps
#: :data:`RACY_ADD_WINDOW` apart (``racy``), so that overlapping adds of one alias all succeed.
ATOMIC, RACY = "atomic", "racy"
ADD_ATOMICITY_MODES = (ATOMIC, RACY)
#: Seconds between a ``racy`` add's alias check and its insert.
RACY_ADD_WINDOW = 0.05
#: ``remove_missing``: a RemoveServicesFromReservation that names an alias that is not there fails and
#: removes nothing (``refuse_all``), removes what it finds and then fails (``remove_found``), or removes
#: what it finds and succeeds (``ignore``).
REFUSE_ALL, REMOVE_FOUND, IGNORE = "refuse_all", "remove_found", "ignore"
REMOVE_MISSING_MODES = (REFUSE_ALL, REMOVE_FOUND, IGNORE)
#: ``disable_cache``: a ``disableCache`` read bypasses the details cache (``honored``) or is answered from it
#: like any other read (``ignored``).
HONORED, IGNORED = "honored", "ignored"
DISABLE_CACHE_MODES = (HONORED, IGNORED)
#: ``tilde_aliases``: service aliases with a ``~`` are ``accepted`` or ``refused``.
ACCEPTED, REFUSED = "accepted", "refused"
TILDE_ALIAS_MODES = (ACCEPTED, REFUSED)
#: ``user_groups``: GetUserDetails lists the user's groups with their roles and domains (``listed``), or
#: answers with no groups (``omitted``).
LISTED, OMITTED = "listed", "omitted"
USER_GROUPS_MODES = (LISTED, OMITTED)


@dataclass
class AttributeSpec:
    """An attribute of a catalog model: its type and default value."""

    name: str
    type: str = "String"
    default: str = ""


@dataclass
class CatalogModel:
    """A service or resource model from an imported package."""

    name: str
    family: str
    is_service: bool
    attributes: OrderedDict[str, AttributeSpec]
    drivers: Tuple[str, ...] = ()
    category: str = ""
    admin_only: bool = False


@dataclass
class ServiceRecord:
    """A service instance in a reservation."""

    alias: str
    model: str
    attributes: OrderedDict[str, str]
    position: Tuple[float, float]


@dataclass
class ResourceRecord:
    """A resource in the inventory (CreateResource)."""

    name: str
    family: str
    model: str
    address: str
    folder: str
    description: str
    created_by: str
    attributes: OrderedDict[str, str]


@dataclass
class ConnectorRecord:
    """A connector between two endpoints (resources or service aliases) in a reservation."""

    source: str
    target: str
    direction: str
    alias: str


@dataclass
class Reservation:
    """A reservation and its components."""

    id: str
    name: str
    owner: str
    domain: str
    created: _dt.datetime
    start: _dt.datetime
    end: _dt.datetime
    ended_at: Optional[_dt.datetime] = None
    services: OrderedDict[str, ServiceRecord] = field(default_factory=OrderedDict)
    resources: List[str] = field(default_factory=list)
    connectors: List[ConnectorRecord] = field(default_factory=list)
    output: List[str] = field(default_factory=list)
    #: GetReservationDetails snapshot: (monotonic time taken, copy of the reservation then).
    details_cache: Optional[Tuple[float, Reservation]] = None
    next_position: int = 0
    #: (monotonic time, copy) after each change, the last HISTORY_SECONDS: what a stale read shows.
    versions: Deque[Tuple[float, Reservation]] = field(default_factory=deque)

    def snapshot(self) -> Reservation:
        """A copy of what GetReservationDetails shows, unaffected by later changes (caller holds the lock)."""
        services = OrderedDict(
            (alias, replace(service, attributes=OrderedDict(service.attributes)))
            for alias, service in self.services.items()
        )
        return replace(
            self,
            services=services,
            resources=list(self.resources),
            connectors=list(self.connectors),
            output=[],
            details_cache=None,
            versions=deque(),
        )

    def remember_version(self, now: float) -> None:
        """Keep a copy of the reservation as it is after a change (caller holds the lock)."""
        self.versions.append((now, self.snapshot()))
        # Keep one version older than the horizon: it is what the reservation looked like then.
        while len(self.versions) > 1 and self.versions[1][0] <= now - HISTORY_SECONDS:
            self.versions.popleft()

    def version_at(self, when: float) -> Reservation:
        """The copy in effect at monotonic time ``when`` (the oldest kept one if ``when`` is older)."""
        chosen = self.versions[0][1]
        for taken, version in self.versions:
            if taken > when:
                break
            chosen = version
        return chosen

    def is_ended(self, now: _dt.datetime) -> bool:
        """True once EndReservation ran or the reservation's end time passed."""
        return self.ended_at is not None or now >= self.end

    def status(self, now: _dt.datetime) -> str:
        """The reservation status as the API reports it."""
        return "Completed" if self.is_ended(now) else "Started"


class EmulatorState:
    """Everything the emulated server knows, guarded by one lock, in three parts with one job each:
    :attr:`accounts` (users, sessions, tokens), :attr:`instrumentation` (call counts, overhead, the event
    log) and, in this class, the catalog and the reservations with their services, resources and
    connectors."""

    def __init__(
        self,
        admin_user: str,
        admin_password: str,
        admin_domain: str = "Global",
        details_cache_seconds: float = DEFAULT_DETAILS_CACHE_SECONDS,
    ) -> None:
        self.lock = threading.RLock()
        self.accounts = Accounts(self.lock, admin_user, admin_password, admin_domain)
        self.instrumentation = Instrumentation(self.lock)
        self.details_cache_seconds = float(details_cache_seconds)
        #: What GetServices lists: every service model (permissive) or as the real server most likely
        #: does (strict: only families with a category, admin-only ones to admins only).
        self.catalog_mode = STRICT
        #: Ended reservations: reads still answer (readable) or every call fails (closed).
        self.ended_reservations = READABLE
        #: Service aliases: told apart by letter case (exact) or not (insensitive).
        self.alias_case = EXACT
        #: An add's alias check and insert: one step (atomic) or two (racy).
        self.add_atomicity = ATOMIC
        #: A remove that names a missing alias: refuse_all, remove_found or ignore.
        self.remove_missing = REFUSE_ALL
        #: A disableCache read: fresh (honored) or from the details cache (ignored).
        self.disable_cache = HONORED
        #: Aliases with a ``~``: accepted or refused.
        self.tilde_aliases = ACCEPTED
        #: GetUserDetails: the user's groups listed (with roles and domains) or omitted.
        self.user_groups = LISTED
        self.catalog: OrderedDict[str, CatalogModel] = OrderedDict()
        self.drivers: Dict[str, int] = {}  # driver name -> zip size
        self.resources: OrderedDict[str, ResourceRecord] = OrderedDict()
        self.reservations: OrderedDict[str, Reservation] = OrderedDict()

    def _record(
        self, op: str, reservation: Reservation, service: ServiceRecord, user: str, **extra: Any
    ) -> None:
        """Log a committed service change and keep the new version (caller holds the lock)."""
        self._changed(reservation)
        self.instrumentation.record(
            op, reservation.id, service.alias, service.model, service.attributes, user, **extra
        )

    # ------------------------------------------------------------------ catalog
    def register_model(self, model: CatalogModel) -> None:
        """Add a model, or merge into the same-named one (attributes are added, never removed)."""
        with self.lock:
            existing = self.catalog.get(model.name)
            if existing is not None:
                merged = OrderedDict(existing.attributes)
                merged.update(model.attributes)
                model.attributes = merged
            self.catalog[model.name] = model

    def service_model(self, name: str) -> CatalogModel:
        """The service model called ``name``, or ApiError."""
        model = self.catalog.get(name)
        if model is None or not model.is_service:
            raise ApiError.of("service_model_not_found", model=name)
        return model

    def services(self, category: str = "", name: str = "", user: Optional[str] = None) -> List[CatalogModel]:
        """Catalog service models, optionally filtered by category and name; in the strict catalog mode
        only those in a category, and admin-only families only for admins (``user`` None: an admin)."""
        with self.lock:
            strict = self.catalog_mode == STRICT
            admin = user is None or self.accounts.is_admin(user)
            return [
                model
                for model in self.catalog.values()
                if model.is_service
                and (not name or model.name == name)
                and (not category or model.category == category)
                and not (strict and (not model.category or (model.admin_only and not admin)))
            ]

    # ------------------------------------------------------------------ events
    def create_reservation(self, name: str, owner: str, minutes: int, domain: str) -> Reservation:
        """Start a reservation now for ``minutes``."""
        if minutes <= 0:
            raise ApiError.of("duration_not_positive")
        now = utcnow()
        reservation = Reservation(
            id=str(uuid.uuid4()),
            name=name,
            owner=owner,
            domain=domain,
            created=now,
            start=now,
            end=now + _dt.timedelta(minutes=minutes),
        )
        with self.lock:
            self.reservations[reservation.id] = reservation
            reservation.remember_version(time.monotonic())
        return reservation

    def reservation(self, reservation_id: str, change: bool = True) -> Reservation:
        """A reservation to change (``change``) or to read, or ApiError: unknown, or ended and either
        changed or read in the ``closed`` mode (caller holds the lock)."""
        reservation = self.reservations.get(reservation_id)
        if reservation is None:
            raise ApiError.of("reservation_not_found", reservation_id=reservation_id)
        if (change or self.ended_reservations == CLOSED) and reservation.is_ended(utcnow()):
            raise ApiError.of("reservation_ended", reservation_id=reservation_id)
        return reservation

    def _changed(self, reservation: Reservation) -> None:
        """Note a change of ``reservation`` for stale reads (caller holds the lock)."""
        reservation.remember_version(time.monotonic())

    def end_reservation(self, reservation_id: str) -> None:
        """End a reservation; its later calls fail."""
        with self.lock:
            self.reservation(reservation_id).ended_at = utcnow()

    def current_reservations(self, owner: str = "") -> List[Reservation]:
        """Active reservations, optionally of one owner."""
        now = utcnow()
        with self.lock:
            return [
                r
                for r in self.reservations.values()
                if not r.is_ended(now) and (not owner or r.owner == owner)
            ]

    def details(self, reservation_id: str, disable_cache: bool, staleness: float = 0.0) -> Reservation:
        """GetReservationDetails: a copy of the reservation, from the 5-second snapshot unless disabled.

        Changes made after the snapshot was taken stay invisible to cached reads until it expires.
        A ``disableCache`` read gets a fresh copy and neither uses nor refreshes the snapshot. Copies,
        not rendered answers, are kept, so each caller gets times in its own ``DateTimeFormat``.
        ``staleness`` > 0 (the ``stale_fresh_read`` fault): the reservation as it was that many seconds ago.
        """
        with self.lock:
            reservation = self.reservation(reservation_id, change=False)
            now = time.monotonic()
            if staleness > 0:
                return reservation.version_at(now - staleness)
            disable_cache = disable_cache and self.disable_cache == HONORED
            cached = reservation.details_cache
            if not disable_cache and cached is not None and now - cached[0] < self.details_cache_seconds:
                return cached[1]
            snapshot = reservation.snapshot()
            if not disable_cache:
                reservation.details_cache = (now, snapshot)
            return snapshot

    def write_output(self, reservation_id: str, message: str) -> None:
        """WriteMessageToReservationOutput."""
        with self.lock:
            self.reservation(reservation_id).output.append(message)

    def output(self, reservation_id: str) -> List[str]:
        """Messages written to a reservation's output (ended reservations included)."""
        with self.lock:
            reservation = self.reservations.get(reservation_id)
            if reservation is None:
                raise KeyError(f"reservation {reservation_id!r} does not exist")
            return list(reservation.output)

    # ------------------------------------------------------------------ services
    def _check_attributes(self, model: CatalogModel, names: Iterable[str]) -> None:
        for name in names:
            if name not in model.attributes:
                raise ApiError.of("attribute_not_on_model", attribute=name, model=model.name)

    def add_service(
        self,
        reservation_id: str,
        model_name: str,
        alias: str,
        attributes: Sequence[Tuple[str, str]],
        user: str,
    ) -> ServiceRecord:
        """AddServiceToReservation: the alias check and the insert are one atomic step (in the ``racy``
        mode two steps, :data:`RACY_ADD_WINDOW` apart: every add that passed the check inserts, the last
        one's service stays)."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            model = self.service_model(model_name)
            self._check_attributes(model, (name for name, _ in attributes))
            alias = alias or model.name
            if self.tilde_aliases == REFUSED and "~" in alias:
                raise ApiError.of("alias_not_allowed", alias=alias)
            if self._stored_alias(reservation, alias) is not None:
                raise ApiError.of("duplicate_alias")
            if self.add_atomicity == ATOMIC:
                return self._insert(reservation, model, alias, attributes, user)
        time.sleep(RACY_ADD_WINDOW)  # outside the lock: other adds of the alias pass the check meanwhile
        with self.lock:
            return self._insert(self.reservation(reservation_id), model, alias, attributes, user)

    def _insert(
        self,
        reservation: Reservation,
        model: CatalogModel,
        alias: str,
        attributes: Sequence[Tuple[str, str]],
        user: str,
    ) -> ServiceRecord:
        """Store a new service under ``alias`` (replacing one stored under it: only a racy add finds one)."""
        values = OrderedDict((name, spec.default) for name, spec in model.attributes.items())
        values.update(attributes)
        position = (
            100.0 + 150.0 * (reservation.next_position % 8),
            100.0 + 150.0 * (reservation.next_position // 8),
        )
        reservation.next_position += 1
        service = ServiceRecord(alias, model.name, values, position)
        reservation.services[self._stored_alias(reservation, alias) or alias] = service
        self._record("service_added", reservation, service, user)
        return service

    def _stored_alias(self, reservation: Reservation, alias: str) -> Optional[str]:
        """The alias the service ``alias`` names is stored under (None: none), by the ``alias_case`` mode."""
        if alias in reservation.services or self.alias_case == EXACT:
            return alias if alias in reservation.services else None
        wanted = alias.casefold()
        return next((stored for stored in reservation.services if stored.casefold() == wanted), None)

    def _service(self, reservation: Reservation, alias: str) -> ServiceRecord:
        stored = self._stored_alias(reservation, alias)
        service = None if stored is None else reservation.services[stored]
        if service is None:
            raise ApiError.of("service_not_found", alias=alias, reservation_id=reservation.id)
        return service

    def remove_services(self, reservation_id: str, aliases: Sequence[str], user: str) -> None:
        """RemoveServicesFromReservation. An alias that is not there fails the call and nothing is removed
        (``refuse_all``), or what is there is removed and the call then fails (``remove_found``) or
        succeeds (``ignore``): the ``remove_missing`` mode."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            missing = [alias for alias in aliases if self._stored_alias(reservation, alias) is None]
            if missing and self.remove_missing == REFUSE_ALL:
                raise ApiError.of("service_not_found", alias=missing[0], reservation_id=reservation.id)
            found = [self._service(reservation, alias) for alias in aliases if alias not in missing]
            for service in found:
                if service.alias not in reservation.services:
                    continue  # the same alias listed twice
                del reservation.services[service.alias]
                reservation.connectors = [
                    c for c in reservation.connectors if service.alias not in (c.source, c.target)
                ]
                self._record("service_removed", reservation, service, user)
            if missing and self.remove_missing == REMOVE_FOUND:
                raise ApiError.of("service_not_found", alias=missing[0], reservation_id=reservation.id)

    def set_service_attributes(
        self, reservation_id: str, alias: str, attributes: Sequence[Tuple[str, str]], user: str
    ) -> None:
        """SetServiceAttributesValues: overwrite values (no compare-and-set, as on the real server)."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            service = self._service(reservation, alias)
            self._check_attributes(self.catalog[service.model], (name for name, _ in attributes))
            service.attributes.update(attributes)
            self._record("service_attributes_set", reservation, service, user, changed=dict(attributes))

    # ------------------------------------------------------------------ resources and connectors
    def create_resource(
        self,
        family: str,
        model_name: str,
        name: str,
        address: str,
        folder: str,
        parent: str,
        description: str,
        user: str,
    ) -> ResourceRecord:
        """CreateResource: the model must be a resource model in the catalog; names are unique."""
        if not name:
            raise ApiError.of("resource_name_empty")
        with self.lock:
            model = self.catalog.get(model_name)
            if model is None or model.is_service:
                raise ApiError.of("resource_model_not_found", model=model_name)
            if family and family != model.family:
                raise ApiError.of("resource_model_wrong_family", model=model_name, family=family)
            full_name = f"{parent}/{name}" if parent else name
            if parent and parent not in self.resources:
                raise ApiError.of("resource_not_found", name=parent)
            if full_name in self.resources:
                raise ApiError.of("resource_exists", name=full_name)
            record = ResourceRecord(
                name=full_name,
                family=model.family,
                model=model.name,
                address=address,
                folder=folder,
                description=description,
                created_by=user,
                attributes=OrderedDict((n, spec.default) for n, spec in model.attributes.items()),
            )
            self.resources[full_name] = record
            return record

    def add_resources(self, reservation_id: str, names: Sequence[str], shared: bool) -> List[Tuple[str, str]]:
        """AddResourcesToReservation; returns (resource, conflicting reservation id) pairs."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            for name in names:
                if name not in self.resources:
                    raise ApiError.of("resource_not_found", name=name)
            conflicts: List[Tuple[str, str]] = []
            now = utcnow()
            for name in names:
                if name in reservation.resources:
                    continue
                if not shared:
                    for other in self.reservations.values():
                        if other is not reservation and not other.is_ended(now) and name in other.resources:
                            conflicts.append((name, other.id))
                reservation.resources.append(name)
            self._changed(reservation)
            return conflicts

    def remove_resources(self, reservation_id: str, names: Sequence[str]) -> None:
        """RemoveResourcesFromReservation: every resource must be in the reservation."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            for name in names:
                if name not in reservation.resources:
                    raise ApiError.of("resource_not_in_reservation", name=name, reservation_id=reservation.id)
            for name in names:
                if name in reservation.resources:
                    reservation.resources.remove(name)
                reservation.connectors = [
                    c for c in reservation.connectors if name not in (c.source, c.target)
                ]
            self._changed(reservation)

    def set_connectors(self, reservation_id: str, connectors: Sequence[Mapping[str, str]]) -> None:
        """SetConnectorsInReservation: both endpoints must be in the reservation."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            parsed = []
            for request in connectors:
                source = request.get("SourceResourceFullName", "")
                target = request.get("TargetResourceFullName", "")
                direction = request.get("Direction", "") or "bi"
                for endpoint in (source, target):
                    if endpoint not in reservation.resources and endpoint not in reservation.services:
                        raise ApiError.of(
                            "resource_not_in_reservation", name=endpoint, reservation_id=reservation.id
                        )
                if direction not in CONNECTOR_DIRECTIONS:
                    raise ApiError.of("connector_direction_invalid", direction=direction)
                parsed.append(ConnectorRecord(source, target, direction, request.get("Alias", "")))
            for connector in parsed:
                reservation.connectors = [
                    c
                    for c in reservation.connectors
                    if {c.source, c.target} != {connector.source, connector.target}
                ]
                reservation.connectors.append(connector)
            self._changed(reservation)

    def remove_connectors(self, reservation_id: str, endpoints: Sequence[str]) -> None:
        """RemoveConnectorsFromReservation: ``endpoints`` lists (source, target) pairs, flattened."""
        with self.lock:
            reservation = self.reservation(reservation_id)
            if len(endpoints) % 2:
                raise ApiError.of("endpoints_not_paired")
            pairs = [{endpoints[i], endpoints[i + 1]} for i in range(0, len(endpoints), 2)]
            for pair in pairs:
                if not any({c.source, c.target} == pair for c in reservation.connectors):
                    a, b = sorted(pair) if len(pair) == 2 else (next(iter(pair)),) * 2
                    raise ApiError.of("connector_not_found", a=a, b=b, reservation_id=reservation.id)
            reservation.connectors = [c for c in reservation.connectors if {c.source, c.target} not in pairs]
            self._changed(reservation)
