"""A small in-memory fake of the CloudShell API with a virtual clock, for the lock's unit tests.

Atomic add by alias, remove, fresh reads, scripted faults (``api.faults[method]``: callables run in
order before the real behaviour) and requests that land later (``api.later(at, fn)``: run on the first
call at or after virtual time ``at``, the way a delayed request reaches the server between two calls).
The proof that the lock works with the real client is the emulator suite; this fake makes each
decision of the lock deterministic to test.
"""

from __future__ import annotations

import contextlib
import random
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from cloudshell_mutex import ReservationMutex, protocol
from cloudshell_mutex.lock.engine import Runtime
from cloudshell_mutex.lock.pacing import CallBudget, FixedPacing
from cloudshell_mutex.lock.server import catalog

RES = "res-1"


def api_error(message: str, code: str = "100") -> CloudShellAPIError:
    return CloudShellAPIError(code, message, b"")


def http_500() -> Exception:
    return Exception("(Internal Server Error) [500] reason:Internal Server Error")


class Clock:
    """Virtual monotonic time: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class FakeApi:
    """Atomic add-by-alias, remove, fresh reads; `faults[method]` is a list of callables run in order
    before the real behaviour: each gets the call's args and may raise or commit itself."""

    def __init__(
        self, attributes=(protocol.ATTR_OWNER,), listed: bool = True, clock: Optional[Clock] = None
    ) -> None:
        self.clock = clock
        self.scheduled: List[Tuple[float, Callable[[], Any]]] = []
        self.host, self.port = f"fake-{id(self)}", 8029
        self.services: Dict[str, Dict[str, str]] = {}
        self.model_attributes = list(attributes)
        self.listed = listed
        self.ended = False
        self.status = "Started"
        self.calls: List[str] = []
        self.removed: List[str] = []  # the aliases of every remove sent, in order
        self.faults: Dict[str, List[Callable[..., Any]]] = {}
        self.output: List[str] = []
        self.on_call: Optional[Callable[[str], None]] = None

    def later(self, at: float, action: Callable[[], Any]) -> None:
        """Apply ``action`` (a late request) on the first call at or after virtual time ``at``."""
        self.scheduled.append((at, action))
        self.scheduled.sort(key=lambda item: item[0])

    def land_due(self) -> None:
        """Apply the late requests whose time has come (a late request fails quietly: its caller is gone)."""
        while self.scheduled and self.clock is not None and self.scheduled[0][0] <= self.clock.now:
            _, action = self.scheduled.pop(0)
            with contextlib.suppress(CloudShellAPIError):
                action()

    def late_remove(self, at: float) -> None:
        """A remove of the lock alias that reaches the server at ``at``: it removes whatever holds it."""
        self.later(at, lambda: self.services.pop(protocol.DEFAULT_ALIAS, None))

    def _enter(self, method: str, *args: Any) -> bool:
        self.land_due()
        self.calls.append(method)
        if self.on_call:
            self.on_call(method)
        queue = self.faults.get(method)
        if queue:
            return queue.pop(0)(*args)
        return False

    def _check_reservation(self, reservation_id: str) -> None:
        if reservation_id != RES:
            raise api_error(f"Reservation '{reservation_id}' was not found")
        if self.ended:
            raise api_error(f"Reservation '{reservation_id}' has ended")

    # -- API methods (signatures of CloudShellAPISession)
    def GetServices(self, categoryName: str = "", serviceName: str = "") -> Any:
        self._enter("GetServices")
        services = []
        if self.listed:
            attrs = [SimpleNamespace(Name=n) for n in self.model_attributes]
            services.append(SimpleNamespace(Name=protocol.SERVICE_MODEL, Attributes=attrs))
        return SimpleNamespace(Services=services)

    def commit_add(self, reservation_id: str, model: str, alias: str, attributes: list) -> None:
        self._check_reservation(reservation_id)
        if model != protocol.SERVICE_MODEL or (not self.listed and not self.model_attributes):
            raise api_error(f"Service model '{model}' was not found in the catalog")
        if alias in self.services:
            raise api_error(protocol.DUPLICATE_ALIAS_MESSAGE)
        for a in attributes:
            if a.Name not in self.model_attributes:
                raise api_error(f"Attribute '{a.Name}' is not defined on service model '{model}'")
        self.services[alias] = {a.Name: a.Value for a in attributes}

    def AddServiceToReservation(self, reservationId="", serviceName="", alias="", attributes=()) -> Any:
        if self._enter("AddServiceToReservation", reservationId, serviceName, alias, attributes):
            return b"<ok/>"
        self.commit_add(reservationId, serviceName, alias, list(attributes))
        return b"<ok/>"

    def RemoveServicesFromReservation(self, reservationId="", services=()) -> Any:
        self.removed.extend(services)
        if self._enter("RemoveServicesFromReservation", reservationId, services):
            return b"<ok/>"
        self.commit_remove(reservationId, services)
        return b"<ok/>"

    def commit_remove(self, reservation_id: str, aliases) -> None:
        self._check_reservation(reservation_id)
        for alias in aliases:
            if alias not in self.services:
                raise api_error(
                    f"Service with alias '{alias}' was not found in reservation '{reservation_id}'"
                )
        for alias in aliases:
            del self.services[alias]

    def SetServiceAttributesValues(self, reservationId="", serviceAlias="", attributeRequests=()) -> Any:
        if self._enter("SetServiceAttributesValues", reservationId, serviceAlias, attributeRequests):
            return b"<ok/>"
        self._check_reservation(reservationId)
        if serviceAlias not in self.services:
            raise api_error(
                f"Service with alias '{serviceAlias}' was not found in reservation '{reservationId}'"
            )
        for a in attributeRequests:
            if a.Name not in self.model_attributes:
                raise api_error(f"Attribute '{a.Name}' is not defined on service model 'Mutex Service'")
        self.services[serviceAlias].update({a.Name: a.Value for a in attributeRequests})
        return b"<ok/>"

    def GetReservationDetails(self, reservationId="", disableCache=False) -> Any:
        assert disableCache is True, "ownership reads must bypass the cache"
        self._enter("GetReservationDetails", reservationId)
        self._check_reservation(reservationId)
        services = [
            SimpleNamespace(
                Alias=alias,
                ServiceName=protocol.SERVICE_MODEL,
                Attributes=[SimpleNamespace(Name=k, Value=v) for k, v in attrs.items()],
            )
            for alias, attrs in self.services.items()
        ]
        return SimpleNamespace(ReservationDescription=SimpleNamespace(Services=services))

    def GetReservationStatus(self, reservationId="") -> Any:
        self._enter("GetReservationStatus", reservationId)
        if reservationId != RES:
            raise api_error(f"Reservation '{reservationId}' was not found")
        return SimpleNamespace(
            ReservationSlimStatus=SimpleNamespace(Status="Completed" if self.ended else self.status)
        )

    def WriteMessageToReservationOutput(self, reservationId="", message="") -> Any:
        self._enter("WriteMessageToReservationOutput", reservationId)
        self.output.append(message)

    def count(self, method: str) -> int:
        return self.calls.count(method)


def make(api: FakeApi, clock: Clock, warm: bool = True, **kwargs: Any) -> ReservationMutex:
    """A mutex on the fake with a virtual clock; ``warm``: what the model takes is already learned (by an
    earlier add of this process), so tests count only the calls of the operation they look at."""
    if api.clock is None:
        api.clock = clock
    kwargs.setdefault("pacing", FixedPacing(0.1))
    kwargs.setdefault("budget", CallBudget(rate=1000, burst=1000, clock=clock))
    # The steps of one acquisition (adds, reads, removes), counted call by call: plain polling, so that the
    # queue's tickets do not enter the count. The queue's own steps are test_queue.py's.
    kwargs.setdefault("fair", False)
    runtime = Runtime(clock, clock.sleep, random.Random(1), kwargs.pop("late_adds", None))
    mutex = ReservationMutex(api, RES, owner="Router A driver", runtime=runtime, **kwargs)
    if warm:  # what the model takes is known, as after this process's first add
        names = catalog.FULL if set(api.model_attributes) >= catalog.FULL else catalog.OWNER_ONLY
        catalog.learn(api, protocol.SERVICE_MODEL, names)
        api.calls.clear()
    return mutex


def other_holds(api: FakeApi, token: str = "Other@host:1:deadbeef") -> None:
    api.services[protocol.DEFAULT_ALIAS] = {protocol.ATTR_OWNER: token}
