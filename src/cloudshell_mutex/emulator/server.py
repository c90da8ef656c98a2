"""The HTTP front ends: the Automation API (with the control endpoint) and the Quali API.

Both are stdlib ``ThreadingHTTPServer``s speaking HTTP/1.1 with keep-alive, which is what the clients'
connection pools (urllib3, requests) expect: one thread per open connection, so 64 concurrent
clients are 64 threads. The servers remember their open connections and the threads serving them,
so that stopping the emulator ends idle keep-alive connections and calls in the middle of their
injected latency, and returns only when every thread serving them has finished.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import select
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from .control import handle_control
from .faults import (
    APPLY_LATE,
    DOUBLE_GRANT,
    DROP_AFTER_COMMIT,
    ERROR_BEFORE_COMMIT,
    HANG,
    RESET_BEFORE_COMMIT,
    SPIKE,
    STALE_FRESH_READ,
    TRANSIENT_FALSE,
    Fault,
)
from .messages import ApiError, render
from .methods import PUBLIC_METHODS, CallContext, dispatch, outcome
from .quali import QualiTokens, first_file_part
from .runtime import Runtime
from .state import EVENT_TAGS
from .wire import (
    Params,
    RequestError,
    failure_response,
    parse_authorization,
    parse_request,
    success_response,
)

API_PREFIX = "/resourcemanagerapiservice/"
CONTROL_PREFIX = "/_emulator/"
QUALI_PREFIX = "/api/"
XML_CONTENT_TYPE = "text/xml; charset=utf-8"

#: Largest request body accepted (a package zip is the largest thing anyone sends).
MAX_BODY_BYTES = 64 * 1024 * 1024

#: How long a request body may take to arrive once its headers have (a stalled client is cut off).
BODY_TIMEOUT_SECONDS = 30.0

#: How long stopping waits for the threads serving open connections.
STOP_TIMEOUT_SECONDS = 5.0


def is_loopback(address: str) -> bool:
    """True for a loopback client address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


class _TrackingServer(ThreadingHTTPServer):
    """A threading HTTP server that can end its open connections and their threads when it stops."""

    daemon_threads = True  # an emulator that is never stopped must not keep its process alive
    block_on_close = False  # stop() joins the connection threads itself, with a time limit
    request_queue_size = 256

    def __init__(self, address: Tuple[str, int], handler: type, runtime: Runtime) -> None:
        self.runtime = runtime
        #: Set by stop(): calls waiting out their injected latency give up at once.
        self.stopping = threading.Event()
        self._connections: Dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:  # type: ignore[override]
        """Clients that hang up mid-answer are normal (timeouts, killed processes): stay quiet then."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, socket.timeout)):
            return
        super().handle_error(request, client_address)

    def process_request(self, request, client_address) -> None:  # type: ignore[override]
        """Serve the connection in its own thread, and remember both."""
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"{type(self).__name__}-connection",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def shutdown_request(self, request) -> None:  # type: ignore[override]
        """Forget a connection whose thread has finished with it, and close it."""
        with self._connections_lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Stop accepting, end every open connection (idle keep-alive ones and calls in their latency
        included), wait for the threads that served them, then close the listening socket."""
        self.stopping.set()
        self.shutdown()
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    """Shared plumbing: HTTP/1.1, quiet logs, bodies and answers."""

    protocol_version = "HTTP/1.1"
    # Headers and body are written separately: with Nagle on, the client's delayed ACK adds ~40 ms a call.
    disable_nagle_algorithm = True
    server: _TrackingServer

    def setup(self) -> None:
        """Give the connection the header timeout: a client that never finishes its request headers (or
        idles between requests) is cut off, as real servers do, instead of holding a thread forever."""
        self.timeout = self.server.runtime.header_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: request lines could carry tokens, and tests run thousands of calls."""

    def read_body(self) -> Optional[bytes]:
        """The request body, or None after refusing the request and closing the connection.

        A body whose length is unknown (chunked, or a bad ``Content-Length``), too large, or that does
        not arrive in time is refused; the connection then closes, because what is left of that body
        must not be read as the next request.
        """
        if self.headers.get("Transfer-Encoding"):
            self.refuse(411, self.text("http_chunked_body"))
            return None
        length_header = self.headers.get("Content-Length")
        try:
            length = int(length_header) if length_header is not None else 0
        except ValueError:
            self.refuse(400, self.text("http_bad_length", value=repr(length_header)))
            return None
        if length < 0 or length > MAX_BODY_BYTES:
            self.refuse(413, self.text("http_body_too_large", length=length, limit=MAX_BODY_BYTES))
            return None
        if not length:
            return b""
        self.connection.settimeout(BODY_TIMEOUT_SECONDS)
        try:
            body = self.rfile.read(length)
        except (socket.timeout, TimeoutError):
            body = None
        finally:
            with contextlib.suppress(OSError):
                self.connection.settimeout(self.timeout)
        if body is None or len(body) < length:
            self.refuse(408, self.text("http_body_timeout", seconds=BODY_TIMEOUT_SECONDS))
            return None
        return body

    def send_body(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        """Answer with a body; keep-alive stays on unless ``close``."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def text(self, name: str, **fields: Any) -> str:
        """Message ``name`` of :mod:`.messages`, worded as the emulator's ``reword_errors`` mode says."""
        return render(name, self.server.runtime.reword_errors, **fields)

    def send_text(self, status: int, text: str) -> None:
        """Answer with plain text."""
        self.send_body(status, text.encode("utf-8"), "text/plain; charset=utf-8")

    def refuse(self, status: int, text: str) -> None:
        """Answer a request that cannot be read, then close the connection."""
        with contextlib.suppress(OSError):
            self.send_body(status, text.encode("utf-8"), "text/plain; charset=utf-8", close=True)
        self.close_connection = True

    def wait(self, seconds: float) -> bool:
        """Spend injected latency; False when the emulator stops meanwhile (the caller then drops the
        connection instead of answering)."""
        return not (seconds and self.server.stopping.wait(seconds))

    def wait_for_client_to_leave(self, limit: float) -> None:
        """Send nothing until the client closes its end (its timeout), the emulator stops, or ``limit``
        seconds pass."""
        deadline = time.monotonic() + limit
        while not self.server.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                # select() works on sockets on Windows too. The client sends nothing while it waits for
                # this answer, so a readable socket is its EOF (it gave up).
                readable, _, _ = select.select([self.connection], [], [], min(0.1, remaining))
            except (OSError, ValueError):
                return
            if readable:
                return

    def send_json(self, status: int, value: Any) -> None:
        """Answer with JSON."""
        self.send_body(status, json.dumps(value).encode("utf-8"), "application/json; charset=utf-8")

    def drop_connection(self) -> None:
        """Close the connection without any response (the client sees it disconnect)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class ApiRequestHandler(_Handler):
    """``POST /ResourceManagerApiService/<Method>`` and the control endpoint ``/_emulator/<op>``."""

    def do_POST(self) -> None:
        """An API call, or a control operation."""
        path = urlsplit(self.path).path
        if path.startswith(CONTROL_PREFIX):
            self._control(path[len(CONTROL_PREFIX) :])
            return
        if not path.lower().startswith(API_PREFIX) or "/" in path[len(API_PREFIX) :].strip("/"):
            body = self.read_body()
            if body is not None:
                self.send_text(404, self.text("http_no_endpoint", path=path))
            return
        started = time.perf_counter()
        body = self.read_body()
        if body is not None:
            self._api_call(path[len(API_PREFIX) :].strip("/"), body, started)

    def do_GET(self) -> None:
        """A control operation with its fields in the query string."""
        path = urlsplit(self.path).path
        if path.startswith(CONTROL_PREFIX):
            self._control(path[len(CONTROL_PREFIX) :])
        else:
            self.send_text(404, self.text("http_no_endpoint", path=path))

    def _api_call(self, method: str, body: bytes, started: float) -> None:
        """Answer one API call and record the emulator's own time on it (from the parsed request headers
        to the written response, injected latency excluded)."""
        slept = self._api_call_inner(method, body)
        if slept is not None:
            self.server.runtime.state.instrumentation.record_overhead(time.perf_counter() - started - slept)

    def _api_call_inner(self, method: str, body: bytes) -> Optional[float]:
        """Answer one API call; return the injected latency slept (None: not a measured call)."""
        runtime = self.server.runtime
        state = runtime.state
        state.instrumentation.count_call(method)
        session = state.accounts.session_for(parse_authorization(self.headers.get("Authorization")))
        if method not in PUBLIC_METHODS and session is None:
            self.send_text(401, self.text("http_unauthorized"))
            return None
        try:
            params = parse_request(body, method)
        except RequestError as error:
            invalid = ApiError.of("invalid_request", problem=str(error))
            answer = failure_response(method, invalid.code, invalid.text(runtime.reword_errors))
            self.send_body(200, answer, XML_CONTENT_TYPE)
            return None

        try:
            reservation_id = params.text("reservationId", "")
            uncached = method == "GetReservationDetails" and params.flag("disableCache")
        except RequestError:
            reservation_id, uncached = "", False
        fault = runtime.faults.take(method, reservation_id, session.user if session is not None else "")
        ctx = CallContext(state, session, self.headers.get("DateTimeFormat"), runtime.reword_errors)
        if fault is not None:
            if fault.kind == APPLY_LATE:
                runtime.apply_late(fault, ctx, method, params)
                self._answer_never(fault)
                return None
            if fault.kind == HANG and not fault.params["commit"]:
                self._settle(fault, "not_applied")
                self._hang(fault)
                return None
            if fault.kind == STALE_FRESH_READ:
                ctx.staleness = fault.params["ms"] / 1000.0
        before, after = runtime.latency.split(*((f"{method}:uncached",) if uncached else ()), method)
        if fault is not None and fault.kind == SPIKE:
            before += fault.params["seconds"]
        if not self.wait(before):
            self._settle(fault, "discarded")
            self.drop_connection()
            return None
        if fault is not None and fault.kind in (ERROR_BEFORE_COMMIT, TRANSIENT_FALSE):
            self._refuse_before_commit(fault, method)
            return before
        if fault is not None and fault.kind == RESET_BEFORE_COMMIT:
            self._settle(fault, "not_applied")
            self.drop_connection()
            return None
        response = self._commit(ctx, method, params, fault)
        if response is None:
            return None
        if fault is not None and fault.kind == HANG:
            self._hang(fault)
            return None
        if (fault is not None and fault.kind == DROP_AFTER_COMMIT) or not self.wait(after):
            self.drop_connection()
            return None
        self.send_body(200, response, XML_CONTENT_TYPE)
        return before + after

    def _refuse_before_commit(self, fault: Fault, method: str) -> None:
        """Answer a call that fails before it takes effect: HTTP 500, or a deadlock-victim API error."""
        if fault.kind == ERROR_BEFORE_COMMIT:
            self._settle(fault, "not_applied")
            self.send_text(500, self.text("http_injected_error"))
            return
        transient = ApiError.of("deadlock_victim", process_id=fault.params["process_id"])
        self._settle(fault, "not_applied", code=transient.code, message=transient.message)
        answer = failure_response(method, transient.code, transient.text(self.server.runtime.reword_errors))
        self.send_body(200, answer, XML_CONTENT_TYPE)

    def _commit(
        self, ctx: CallContext, method: str, params: Params, fault: Optional[Fault]
    ) -> Optional[bytes]:
        """Run the call (a ``double_grant`` turns a taken alias into success) and settle its fault; return
        the answer, or None after answering an emulator bug with HTTP 500."""
        tags = EVENT_TAGS.set({"fault": {"id": fault.id, "kind": fault.kind}} if fault is not None else {})
        try:
            response, failure = dispatch(ctx, method, params)
            granted = fault is not None and fault.kind == DOUBLE_GRANT
            if granted and failure is not None and failure.name == "duplicate_alias":
                self.server.runtime.record_double_grant(ctx, params)
                response, failure = success_response(method), None
            else:
                granted = False
        except Exception as error:  # an emulator bug: say so instead of dropping the connection
            traceback.print_exc()
            self.send_text(500, self.text("http_internal_error", method=method, error=repr(error)))
            return None
        finally:
            EVENT_TAGS.reset(tags)
        if fault is not None:
            result, details = outcome(failure)
            if fault.kind == DOUBLE_GRANT:
                details["double_granted"] = granted
            self._settle(fault, result, **details)
        return response

    def _settle(self, fault: Optional[Fault], outcome_name: str, **details: Any) -> None:
        """Note what became of a faulted call in its record (see FaultPlan.injected)."""
        if fault is not None:
            self.server.runtime.faults.settle(fault.id, outcome_name, **details)

    def _hang(self, fault: Fault) -> None:
        """Answer nothing until the client gives up, then close the connection."""
        self.wait_for_client_to_leave(fault.params["hang_limit"])
        self.drop_connection()

    def _answer_never(self, fault: Fault) -> None:
        """Reset the connection after ``reset_after`` seconds, or (``reply="hang"``) leave the call
        unanswered until the client gives up, the emulator stops or ``hang_limit`` passes."""
        if fault.params["reply"] == "hang":
            self.wait_for_client_to_leave(fault.params["hang_limit"])
        else:
            self.wait(fault.params["reset_after"])
        self.drop_connection()

    def _control(self, op: str) -> None:
        if not is_loopback(self.client_address[0]):
            if self.read_body() is not None:
                self.send_json(403, {"error": "the control endpoint answers loopback clients only"})
            return
        payload: Any = {}
        if self.command == "POST":
            body = self.read_body()
            if body is None:
                return
            if body:
                try:
                    payload = json.loads(body.decode("utf-8"))
                except ValueError:
                    self.send_json(400, {"error": "the body must be JSON"})
                    return
        else:
            payload = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        status, result = handle_control(self.server.runtime, op.strip("/"), payload)
        self.send_json(status, result)


class QualiRequestHandler(_Handler):
    """The Quali API subset the packaging client uses."""

    server: QualiServer

    def _body_for(self, endpoint: str) -> Optional[bytes]:
        """The request body when the path is ``/API/<endpoint>`` (any case), else None after a 404."""
        path = urlsplit(self.path).path
        body = self.read_body()
        if body is not None and path.lower().rstrip("/") != QUALI_PREFIX + endpoint:
            self.send_text(404, self.text("http_no_endpoint", path=path))
            return None
        return body

    def do_PUT(self) -> None:
        """``PUT /API/Auth/Login``: a token for the package import."""
        body = self._body_for("auth/login")
        if body is None:
            return
        form = {
            k: v[-1]
            for k, v in parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True).items()
        }
        if self.headers.get("Content-Type", "").startswith("application/json") and body:
            try:
                form = {str(k): str(v) for k, v in json.loads(body.decode("utf-8")).items()}
            except (ValueError, AttributeError):
                form = {}
        state = self.server.runtime.state
        user = form.get("username", "")
        token = form.get("token", "")
        if token:
            user = state.accounts.auth_token_user(token) or ""
            ok = bool(user)
        else:
            ok = state.accounts.check_password(user, form.get("password", ""))
        if not ok:
            self.send_text(401, self.text("quali_login_failed"))
            return
        self.send_json(200, self.server.tokens.issue(user))

    def do_POST(self) -> None:
        """``POST /API/Package/ImportPackage``: validate and register a package zip."""
        body = self._body_for("package/importpackage")
        if body is None:
            return
        user = self.server.tokens.user(self.headers.get("Authorization"))
        if user is None:
            self.send_text(401, self.text("quali_unauthorized"))
            return
        runtime = self.server.runtime
        if not runtime.state.accounts.is_admin(user):
            self.send_json(200, {"Success": False, "ErrorMessage": self.text("quali_import_not_admin")})
            return
        data = first_file_part(self.headers.get("Content-Type", ""), body)
        if data is None:
            self.send_json(200, {"Success": False, "ErrorMessage": self.text("quali_import_no_file")})
            return
        try:
            runtime.import_package(data)
        except ValueError as error:  # PackageError names the file and the problem
            self.send_json(200, {"Success": False, "ErrorMessage": str(error)})
            return
        self.send_json(200, {"Success": True, "ErrorMessage": None})


class ApiServer(_TrackingServer):
    """The Automation API server (port 8029)."""

    def __init__(self, address: Tuple[str, int], runtime: Runtime) -> None:
        super().__init__(address, ApiRequestHandler, runtime)


class QualiServer(_TrackingServer):
    """The Quali API server (port 9000)."""

    def __init__(self, address: Tuple[str, int], runtime: Runtime) -> None:
        self.tokens = QualiTokens()
        super().__init__(address, QualiRequestHandler, runtime)
