"""The :class:`Emulator`: both servers, started and stopped together, plus test conveniences."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .control import EmulatorControl
from .runtime import DEFAULT_HEADER_TIMEOUT, DEFAULT_SERVER_VERSION, Runtime
from .server import ApiServer, QualiServer
from .state import DEFAULT_DETAILS_CACHE_SECONDS, AttributeSpec, CatalogModel, EmulatorState

PackageSource = Union[str, Path, bytes]


class Emulator:
    """A CloudShell Automation API (XML over HTTP) and Quali API package-import emulator.

    ``port=0`` / ``quali_port=0`` pick free ports; :attr:`port` and :attr:`quali_port` are the bound
    ones after :meth:`start`. ``packages`` (paths or zip bytes) are imported at start, through the same
    code as the Quali API import. ``latency`` is a :class:`~cloudshell_mutex.emulator.faults.LatencyModel`
    settings dict and ``faults`` a list of ``(method, kind[, count[, params]])`` queued at start (see
    :meth:`EmulatorControl.inject_fault`); ``random_faults`` switches the seeded random fault mode on (a
    :class:`~cloudshell_mutex.emulator.faults.RandomFaults` settings dict). Use it as a context manager,
    or call :meth:`start` and :meth:`stop`. The real-server modes (docs/emulator.md): ``reword_errors``
    (every error text but the documented one in other words), ``catalog`` (``"strict"``, the default:
    GetServices lists only those in a category, admin-only ones to admins only; ``"permissive"``: every
    service model),
    ``ended_reservations`` (``"readable"``: reads of an ended reservation answer and changes fail;
    ``"closed"``: every call fails), ``alias_case`` (``"exact"``: service aliases differ by letter case;
    ``"insensitive"``: ``mutex`` and ``MUTEX`` are one alias), ``header_timeout`` (seconds a connection
    may take to send its request headers or sit idle), and the answers a server may give to the site probe's
    questions: ``add_atomicity`` (``"atomic"``, or ``"racy"``: overlapping adds of one alias all succeed),
    ``remove_missing`` (``"refuse_all"``, ``"remove_found"`` or ``"ignore"``: what a remove that names a
    missing alias does), ``disable_cache`` (``"honored"``, or ``"ignored"``: ``disableCache`` reads come from
    the details cache too), ``tilde_aliases`` (``"accepted"`` or ``"refused"``) and ``user_groups``
    (``"listed"``, or ``"omitted"``: GetUserDetails shows no groups, so no roles).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8029,
        quali_port: int = 9000,
        admin_user: str = "admin",
        admin_password: str = "admin",
        admin_domain: str = "Global",
        packages: Iterable[PackageSource] = (),
        latency: Optional[Mapping[str, Any]] = None,
        details_cache_seconds: float = DEFAULT_DETAILS_CACHE_SECONDS,
        server_version: str = DEFAULT_SERVER_VERSION,
        faults: Iterable[Sequence[Any]] = (),
        random_faults: Optional[Mapping[str, Any]] = None,
        reword_errors: bool = False,
        catalog: str = "strict",
        ended_reservations: str = "readable",
        alias_case: str = "exact",
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        add_atomicity: str = "atomic",
        remove_missing: str = "refuse_all",
        disable_cache: str = "honored",
        tilde_aliases: str = "accepted",
        user_groups: str = "listed",
    ) -> None:
        self.host = host
        self.port = port
        self.quali_port = quali_port
        self.admin_user = admin_user
        self.admin_password = admin_password
        self.admin_domain = admin_domain
        self._packages = list(packages)
        state = EmulatorState(admin_user, admin_password, admin_domain, details_cache_seconds)
        self.runtime = Runtime(state, latency=latency, server_version=server_version)
        for fault in faults:  # (method, kind), (method, kind, count) or (method, kind, count, params)
            if isinstance(fault, (str, bytes)) or not 2 <= len(fault) <= 4:
                raise ValueError(f"a fault is (method, kind[, count[, params]]), got {fault!r}")
            self.runtime.faults.inject(*fault)
        self.runtime.configure(
            random_faults=random_faults,
            reword_errors=reword_errors,
            catalog=catalog,
            ended_reservations=ended_reservations,
            alias_case=alias_case,
            header_timeout=header_timeout,
            add_atomicity=add_atomicity,
            remove_missing=remove_missing,
            disable_cache=disable_cache,
            tilde_aliases=tilde_aliases,
            user_groups=user_groups,
        )
        self._api: Optional[ApiServer] = None
        self._quali: Optional[QualiServer] = None
        self._threads: List[threading.Thread] = []
        self._own_session: Any = None

    def __repr__(self) -> str:  # never the password
        return f"Emulator(host={self.host!r}, port={self.port}, quali_port={self.quali_port})"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Emulator:
        """Import the start packages, bind both ports and serve in background threads."""
        if self._api is not None:
            raise RuntimeError("the emulator is already running")
        for package in self._packages:
            self.import_package(package)
        api = ApiServer((self.host, self.port), self.runtime)
        try:
            quali = QualiServer((self.host, self.quali_port), self.runtime)
        except BaseException:
            api.server_close()
            raise
        self._api, self._quali = api, quali
        self.port = api.server_address[1]
        self.quali_port = quali.server_address[1]
        for server, name in ((api, "api"), (quali, "quali")):
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"emulator-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop serving: end every open connection and wait for the threads serving them."""
        for server in (self._api, self._quali):
            if server is not None:
                server.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.runtime.stop()
        self._api = self._quali = None
        self._threads = []
        self._own_session = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between start and stop."""
        return self._api is not None

    # ------------------------------------------------------------------ addresses and clients
    @property
    def url_host(self) -> str:
        """The host as it goes into a URL (IPv6 addresses in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def api_url(self) -> str:
        """Base URL of the Automation API (and of the control endpoint)."""
        return f"http://{self.url_host}:{self.port}"

    @property
    def quali_url(self) -> str:
        """Base URL of the Quali API."""
        return f"http://{self.url_host}:{self.quali_port}"

    @property
    def control(self) -> EmulatorControl:
        """A client of the control endpoint (picklable)."""
        return EmulatorControl(self.api_url)

    def session(self, **kwargs: Any):
        """A real ``CloudShellAPISession`` logged on as the admin (keyword arguments go to it)."""
        from cloudshell.api.cloudshell_api import CloudShellAPISession

        options = {
            "host": self.url_host,
            "username": self.admin_user,
            "password": self.admin_password,
            "domain": self.admin_domain,
            "port": self.port,
        }
        options.update(kwargs)
        return CloudShellAPISession(**options)

    def create_reservation(
        self, name: str = "test", owner: Optional[str] = None, minutes: int = 60, domain: Optional[str] = None
    ) -> str:
        """Create a reservation through the real API call and return its id; in ``domain`` (created when
        missing) rather than the admin's, through a session logged on there, as CloudShell does."""
        if domain is not None and domain != self.admin_domain:
            self.add_domain(domain)
            api = self.session(domain=domain)
        else:
            if self._own_session is None:
                self._own_session = self.session()
            api = self._own_session
        response = api.CreateImmediateReservation(name, owner or self.admin_user, minutes)
        return response.Reservation.Id

    def issue_token(self, user: Optional[str] = None) -> str:
        """A SecureLogon token (what CloudShell passes to drivers as ``admin_auth_token``)."""
        return self.runtime.state.accounts.issue_auth_token(user)

    def add_user(
        self, name: str, password: str, admin: bool = False, domain: str = "Global", role: str = "Regular"
    ) -> None:
        """Create or update a user: a system admin (``admin``), or a member of the group ``"<domain> <role>"``
        (``role``: ``Regular``, ``DomainAdmin`` or ``External``), which reaches ``domain``."""
        self.runtime.state.accounts.add_user(name, password, admin, domain, role)

    def add_domain(self, name: str) -> None:
        """Create a domain (nothing happens when it exists); system admins may log on to every domain."""
        self.runtime.state.accounts.add_domain(name)

    # ------------------------------------------------------------------ catalog
    def import_package(self, package: PackageSource) -> Dict[str, Any]:
        """Import a package zip (path or bytes) with the Quali API import's validation and registration."""
        if isinstance(package, bytes):
            return self.runtime.import_package(package)
        try:
            return self.runtime.import_package(Path(package).read_bytes())
        except ValueError as error:  # PackageError: say which zip it is about
            raise type(error)(f"{package}: {error}") from None

    def add_service_model(
        self,
        name: str,
        attributes: Optional[Mapping[str, str]] = None,
        family: str = "Custom Service Family",
        category: str = "",
        admin_only: bool = False,
    ) -> None:
        """Register a service model directly (attribute name -> default), without a package; ``category``
        and ``admin_only`` matter to GetServices in the strict catalog mode."""
        specs = OrderedDict((n, AttributeSpec(n, "String", str(v))) for n, v in (attributes or {}).items())
        model = CatalogModel(name, family, True, specs, category=category, admin_only=admin_only)
        self.runtime.state.register_model(model)

    def add_resource_model(
        self, name: str, family: str = "Generic Family", attributes: Optional[Mapping[str, str]] = None
    ) -> None:
        """Register a resource model directly (for CreateResource), without a package."""
        specs = OrderedDict((n, AttributeSpec(n, "String", str(v))) for n, v in (attributes or {}).items())
        self.runtime.state.register_model(CatalogModel(name, family, False, specs))
