"""The emulated Automation API methods: decode parameters, act on the state, render the answer.

Each handler returns None (the client then returns the raw response bytes, as for the real
``AddServiceToReservation``) or an :class:`~.wire.Info` whose type name is the class in
``cloudshell.api.cloudshell_api`` that the client builds from the answer. Scalar fields are XML
attributes and list fields are always-present elements, as in answers captured from a real server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple
from xml.etree.ElementTree import Element

from .messages import ApiError
from .state import (
    LISTED,
    CatalogModel,
    EmulatorState,
    Reservation,
    ResourceRecord,
    Session,
    utcnow,
)
from .wire import (
    Info,
    Params,
    RequestError,
    failure_response,
    format_datetime,
    node,
    success_response,
    text_node,
)

#: Methods callable without a session token (everything else gets HTTP 401 without one).
PUBLIC_METHODS = frozenset({"Logon", "SecureLogon"})


@dataclass
class CallContext:
    """Who calls, and how they want times formatted."""

    state: EmulatorState
    session: Optional[Session]
    datetime_format: Optional[str]
    #: Send every error text but the documented one in its alternative wording (``reword_errors``).
    reword: bool = False
    #: GetReservationDetails shows the reservation as it was this many seconds ago (``stale_fresh_read``).
    staleness: float = 0.0

    @property
    def user(self) -> str:
        """The calling user ('' before logon)."""
        return self.session.user if self.session else ""

    def time(self, value) -> str:
        """A time in the client's ``DateTimeFormat``."""
        return format_datetime(value, self.datetime_format)


Handler = Callable[[CallContext, Params], Optional[Info]]
METHODS: Dict[str, Handler] = {}


def api_method(func: Handler) -> Handler:
    """Register ``func`` as the API method of the same name."""
    METHODS[func.__name__] = func
    return func


def execute(ctx: CallContext, method: str, params: Params) -> Optional[Info]:
    """Run one API call; raise ApiError for a ``Success="false"`` answer."""
    handler = METHODS.get(method)
    if handler is None:
        raise ApiError.of("unknown_command", method=method)
    try:
        _check_domain_of_reservation(ctx, params)
        return handler(ctx, params)
    except RequestError as error:
        raise ApiError.of("invalid_request", problem=str(error)) from None


def _check_domain_of_reservation(ctx: CallContext, params: Params) -> None:
    """A call about a reservation of another domain than the session's is answered as if there were no such
    reservation (stricter: whether a real server lets a session reach other domains' sandboxes is not known;
    the lock always logs on to the sandbox's own domain)."""
    reservation_id = params.text("reservationId", "")
    if not reservation_id or ctx.session is None:
        return
    with ctx.state.lock:
        reservation = ctx.state.reservations.get(reservation_id)
        if reservation is not None and reservation.domain != ctx.session.domain:
            raise ApiError.of("reservation_not_found", reservation_id=reservation_id)


def dispatch(ctx: CallContext, method: str, params: Params) -> Tuple[bytes, Optional[ApiError]]:
    """Run one API call; return the response envelope and, for a ``Success="false"`` one, the error."""
    try:
        return success_response(method, execute(ctx, method, params)), None
    except ApiError as error:
        return failure_response(method, error.code, error.text(ctx.reword)), error


def outcome(failure: Optional[ApiError]) -> Tuple[str, Dict[str, Any]]:
    """How a faulted call ended, for its record: ``("applied", {})`` or ``("failed", {code, message})``."""
    if failure is None:
        return "applied", {}
    return "failed", {"code": failure.code, "message": failure.message}


# ---------------------------------------------------------------------- rendering
def _reservation_fields(ctx: CallContext, reservation: Reservation) -> Dict[str, object]:
    now = utcnow()
    ended = reservation.is_ended(now)
    return {
        "Id": reservation.id,
        "Name": reservation.name,
        "Description": "",
        "StartTime": ctx.time(reservation.start),
        "EndTime": ctx.time(reservation.end),
        "TeardownTime": ctx.time(reservation.end),
        "RecurrenceType": "None",
        "Owner": reservation.owner,
        "Booked": True,
        "Status": reservation.status(now),
        "ProvisioningStatus": "Ready",
        "ActualEndTime": ctx.time(reservation.ended_at or reservation.end) if ended else "",
        "CreateDate": ctx.time(reservation.created),
        "ModificationDate": ctx.time(reservation.created),
        "DomainName": reservation.domain,
    }


def _attribute_list(tag: str, values) -> Element:
    return node(tag, children=[node("Attribute", {"Name": n, "Value": v}) for n, v in values.items()])


def _render_details(ctx: CallContext, reservation: Reservation) -> Element:
    """The ``ReservationDescription`` element, shaped like a GetReservationDetails answer captured from a
    real server: scalars as attributes, SetupStage as a child element, empty lists present."""
    fields = _reservation_fields(ctx, reservation)
    fields["SavedSandboxId"] = ""
    services = [
        node(
            "Service",
            {"ServiceName": s.model, "Alias": s.alias, "Address": "", "ResourceLiveStatusName": ""},
            [_attribute_list("Attributes", s.attributes)],
        )
        for s in reservation.services.values()
    ]
    connectors = [
        node(
            "Connector",
            {
                "Alias": c.alias,
                "Type": "",
                "Direction": c.direction,
                "Source": c.source,
                "Target": c.target,
                "State": "Disconnected",
            },
        )
        for c in reservation.connectors
    ]
    resources = [_reserved_resource(ctx.state.resources[name], reservation) for name in reservation.resources]
    children = [
        node("Resources", children=resources),
        node("Conflicts"),
        node("Connectors", children=connectors),
        node("ReservationLiveStatus", {"ReservationId": reservation.id}),
        text_node("SetupStage", "None"),
        node("Services", children=services),
    ]
    return node("ReservationDescription", fields, children)


def _reserved_resource(resource: ResourceRecord, reservation: Reservation) -> Element:
    return node(
        "ReservedResource",
        {
            "Name": resource.name,
            "FolderFullPath": resource.folder,
            "FullAddress": resource.address,
            "Shared": False,
            "Availability": "Available",
            "Locked": False,
            "Released": False,
            "ResourceFamilyName": resource.family,
            "ResourceModelName": resource.model,
            "CreatedByUser": resource.created_by,
            "CreatedInDomain": reservation.domain,
            "CreatedInReservation": "",
        },
    )


def _service_info(model: CatalogModel) -> Element:
    attributes = [
        node(
            "Attribute",
            {
                "Name": spec.name,
                "Type": spec.type,
                "IsRequired": False,
                "DefaultValue": spec.default,
                "PossibleValues": "",
                "RestrictedValues": "",
            },
        )
        for spec in model.attributes.values()
    ]
    return node(
        "Service",
        {"Name": model.name, "CategoryFullPath": model.category, "Description": ""},
        [node("Attributes", children=attributes)],
    )


# ---------------------------------------------------------------------- logon and time
def _user_fields(ctx: CallContext, user: str, domain: str) -> Dict[str, object]:
    accounts = ctx.state.accounts
    is_admin = accounts.is_admin(user)
    return {
        "Name": user,
        "IsAdmin": is_admin,
        "IsActive": True,
        "DomainName": domain,
        "IsDomainAdmin": is_admin or accounts.is_domain_admin(user, domain),
        "Email": "",
        "Timezone": "UTC",
    }


def _logon_info(ctx: CallContext, token: str, user: str, domain: str) -> Info:
    return Info(
        "LogonResponseInfo",
        [
            node("Domain", {"Name": domain, "Description": "", "DomainId": domain}),
            node("User", _user_fields(ctx, user, domain)),
            node("Token", {"Token": token}),
        ],
    )


@api_method
def GetUserDetails(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetUserDetails(username) -> UserInfo, with ``Groups`` (``GroupInfo``: ``Name``, ``GroupRole``,
    ``TestShellDomains``; none in the ``user_groups="omitted"`` mode). A system admin reads anyone's; others
    only their own (stricter: not known)."""
    accounts = ctx.state.accounts
    user = p.text("username")
    if user != ctx.user and not accounts.is_admin(ctx.user):
        raise ApiError.of("user_details_denied", caller=ctx.user, user=user)
    if not accounts.user_exists(user):
        raise ApiError.of("user_not_found", user=user)
    groups = [
        node(
            "Group",
            {"Name": group.name, "Description": "", "GroupRole": group.role},
            [
                node(
                    "TestShellDomains",
                    children=[
                        node("TestShellDomain", {"Name": d, "Description": "", "Id": d})
                        for d in sorted(group.domains)
                    ],
                ),
                node("Users"),
            ],
        )
        for group in accounts.groups_of(user)
        if ctx.state.user_groups == LISTED
    ]
    home = (
        accounts.admin_domain
        if accounts.is_admin(user)
        else next((d for g in accounts.groups_of(user) for d in sorted(g.domains)), accounts.admin_domain)
    )
    return Info("UserInfo", [node("Groups", children=groups)], _user_fields(ctx, user, home))


@api_method
def Logon(ctx: CallContext, p: Params) -> Optional[Info]:
    """Logon(username, password, domainName) -> LogonResponseInfo."""
    user, domain = p.text("username"), p.text("domainName", "") or ctx.state.accounts.admin_domain
    token = ctx.state.accounts.logon(user, p.text("password"), domain)
    return _logon_info(ctx, token, user, domain)


@api_method
def SecureLogon(ctx: CallContext, p: Params) -> Optional[Info]:
    """SecureLogon(token, domainName) -> LogonResponseInfo."""
    domain = p.text("domainName", "") or ctx.state.accounts.admin_domain
    session_token = ctx.state.accounts.secure_logon(p.text("token"), domain)
    session = ctx.state.accounts.session_for(session_token)
    return _logon_info(ctx, session_token, session.user if session else "", domain)


@api_method
def GetServerDateAndTime(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetServerDateAndTime() -> ServerTimeInfo (UTC, in the client's DateTimeFormat)."""
    return Info("ServerTimeInfo", fields={"ServerDateTime": ctx.time(utcnow())})


# ---------------------------------------------------------------------- reservations
@api_method
def CreateImmediateReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """CreateImmediateReservation(reservationName, owner, durationInMinutes, ...).

    Returns CreateReservationResponseInfo.
    """
    reservation = ctx.state.create_reservation(
        name=p.text("reservationName"),
        owner=p.text("owner", "") or ctx.user,
        minutes=p.number("durationInMinutes"),
        domain=ctx.session.domain if ctx.session else ctx.state.accounts.admin_domain,
    )
    return Info("CreateReservationResponseInfo", [node("Reservation", _reservation_fields(ctx, reservation))])


@api_method
def EndReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """EndReservation(reservationId, unmap)."""
    ctx.state.end_reservation(p.text("reservationId"))
    return None


@api_method
def GetReservationDetails(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetReservationDetails(reservationId, disableCache) -> GetReservationDescriptionResponseInfo."""
    reservation = ctx.state.details(p.text("reservationId"), p.flag("disableCache"), ctx.staleness)
    return Info("GetReservationDescriptionResponseInfo", [_render_details(ctx, reservation)])


@api_method
def GetReservationStatus(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetReservationStatus(reservationId) -> ReservationSlimStatusInfo."""
    with ctx.state.lock:
        reservation = ctx.state.reservation(p.text("reservationId"), change=False)
        fields = _reservation_fields(ctx, reservation)
    status = {
        "ReservationId": reservation.id,
        "StartTime": fields["StartTime"],
        "EndTime": fields["EndTime"],
        "Status": fields["Status"],
        "ProvisioningStatus": fields["ProvisioningStatus"],
        "Booked": True,
        "SetupStage": "None",
    }
    return Info("ReservationSlimStatusInfo", [node("ReservationSlimStatus", status)])


@api_method
def GetCurrentReservations(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetCurrentReservations(reservationOwner) -> GetActiveReservationsResponseInfo."""
    reservations = ctx.state.current_reservations(p.text("reservationOwner", ""))
    items = [node("Reservation", _reservation_fields(ctx, r)) for r in reservations]
    return Info("GetActiveReservationsResponseInfo", [node("Reservations", children=items)])


# ---------------------------------------------------------------------- services
@api_method
def GetServices(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetServices(categoryName, serviceName) -> ServicesListInfo with attribute definitions."""
    models = ctx.state.services(p.text("categoryName", ""), p.text("serviceName", ""), ctx.user)
    return Info("ServicesListInfo", [node("Services", children=[_service_info(m) for m in models])])


@api_method
def AddServiceToReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """AddServiceToReservation(reservationId, serviceName, alias, attributes)."""
    ctx.state.add_service(
        p.text("reservationId"),
        p.text("serviceName"),
        p.text("alias", ""),
        p.name_values("attributes", required=False),
        ctx.user,
    )
    return None


@api_method
def RemoveServicesFromReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """RemoveServicesFromReservation(reservationId, services)."""
    ctx.state.remove_services(p.text("reservationId"), p.strings("services"), ctx.user)
    return None


@api_method
def SetServiceAttributesValues(ctx: CallContext, p: Params) -> Optional[Info]:
    """SetServiceAttributesValues(reservationId, serviceAlias, attributeRequests)."""
    ctx.state.set_service_attributes(
        p.text("reservationId"), p.text("serviceAlias"), p.name_values("attributeRequests"), ctx.user
    )
    return None


@api_method
def GetReservationServicesPositions(ctx: CallContext, p: Params) -> Optional[Info]:
    """GetReservationServicesPositions(reservationId) -> ReservationDiagramLayoutResponseInfo.

    Services only, as the real server answers.
    """
    with ctx.state.lock:
        reservation = ctx.state.reservation(p.text("reservationId"), change=False)
        items = [
            node("ResourceDiagramLayout", {"ResourceName": s.alias, "X": s.position[0], "Y": s.position[1]})
            for s in reservation.services.values()
        ]
    return Info("ReservationDiagramLayoutResponseInfo", [node("ResourceDiagramLayouts", children=items)])


@api_method
def WriteMessageToReservationOutput(ctx: CallContext, p: Params) -> Optional[Info]:
    """WriteMessageToReservationOutput(reservationId, message)."""
    ctx.state.write_output(p.text("reservationId"), p.text("message"))
    return None


# ---------------------------------------------------------------------- resources and connectors
@api_method
def CreateResource(ctx: CallContext, p: Params) -> Optional[Info]:
    """CreateResource(resourceFamily, resourceModel, resourceName, resourceAddress, ...) -> ResourceInfo."""
    resource = ctx.state.create_resource(
        family=p.text("resourceFamily", ""),
        model_name=p.text("resourceModel"),
        name=p.text("resourceName"),
        address=p.text("resourceAddress", ""),
        folder=p.text("folderFullPath", ""),
        parent=p.text("parentResourceFullPath", ""),
        description=p.text("resourceDescription", ""),
        user=ctx.user,
    )
    now = ctx.time(utcnow())
    model = ctx.state.catalog[resource.model]
    attributes = [
        node("ResourceAttribute", {"Name": n, "Value": v, "Type": model.attributes[n].type})
        for n, v in resource.attributes.items()
    ]
    fields = {
        "Name": resource.name,
        "DriverName": model.drivers[0] if model.drivers else "",
        "FolderFullPath": resource.folder,
        "Address": resource.address,
        "FullAddress": resource.address,
        "RootAddress": resource.address,
        "ResourceFamilyName": resource.family,
        "ResourceModelName": resource.model,
        "Locked": False,
        "Excluded": False,
        "Description": resource.description,
        "Permission": "RW",
        "CreatedByUser": resource.created_by,
        "CreatedInDomain": ctx.session.domain if ctx.session else ctx.state.accounts.admin_domain,
        "CreateDate": now,
        "ModificationDate": now,
        "Version": 1,
    }
    return Info("ResourceInfo", [node("ResourceAttributes", children=attributes)], fields)


def _conflicts(conflicts: List[Tuple[str, str]]) -> Info:
    items = [
        node("ResourceConflict", {"ResourceName": name, "ConflictType": "Reservation", "ConflictWith": other})
        for name, other in conflicts
    ]
    return Info("ReserveResourcesResponseInfo", [node("Conflicts", children=items)])


@api_method
def AddResourcesToReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """AddResourcesToReservation(reservationId, resourcesFullPath, shared) -> ReserveResourcesResponseInfo."""
    return _conflicts(
        ctx.state.add_resources(p.text("reservationId"), p.strings("resourcesFullPath"), p.flag("shared"))
    )


@api_method
def RemoveResourcesFromReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """RemoveResourcesFromReservation(reservationId, resourcesFullPath, deleteDeployedApps)."""
    ctx.state.remove_resources(p.text("reservationId"), p.strings("resourcesFullPath"))
    return _conflicts([])


@api_method
def SetConnectorsInReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """SetConnectorsInReservation(reservationId, connectors: [SetConnectorRequest])."""
    ctx.state.set_connectors(p.text("reservationId"), p.records("connectors"))
    return None


@api_method
def RemoveConnectorsFromReservation(ctx: CallContext, p: Params) -> Optional[Info]:
    """RemoveConnectorsFromReservation(reservationId, endpoints: [source, target, ...])."""
    ctx.state.remove_connectors(p.text("reservationId"), p.strings("endpoints"))
    return None
