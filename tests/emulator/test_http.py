"""The emulator's HTTP layer under bad input and at shutdown: clear refusals, no hangs, no leftovers."""

from __future__ import annotations

import socket
import threading
import time
from typing import List

import pytest
from urllib3.exceptions import ProtocolError

from cloudshell_mutex.emulator import Emulator, server

pytestmark = pytest.mark.integration


def exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, then read until the server closes the connection (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(request)
        received: List[bytes] = []
        try:
            while True:
                chunk = connection.recv(65536)
                if not chunk:
                    return b"".join(received)
                received.append(chunk)
        except socket.timeout:
            return b"".join(received) + b"<still open>"


def post(emu: Emulator, headers: str, body: bytes = b"") -> bytes:
    token = emu.session().authentication.xmlrpc_token
    head = (
        "POST /ResourceManagerApiService/GetServerDateAndTime HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: MachineName=test;Token={token}\r\n{headers}\r\n"
    )
    return exchange(emu.port, head.encode() + body)


@pytest.mark.parametrize(
    "headers, status, message",
    [
        ("Content-Length: 999999999\r\n", b"413", b"request body too large"),
        ("Content-Length: lots\r\n", b"400", b"Content-Length is not a number"),
        ("Transfer-Encoding: chunked\r\n", b"411", b"send the request body with a Content-Length"),
    ],
)
def test_unreadable_bodies_are_refused_and_the_connection_closes(
    cloudshell_emulator: Emulator, headers: str, status: bytes, message: bytes
):
    """What follows a refused body must not be read as the next request: one answer, then EOF."""
    smuggled = b"GET /_emulator/settings HTTP/1.1\r\nHost: test\r\n\r\n"
    answer = post(cloudshell_emulator, headers, b"17\r\n<GetServerDateAndTime/>\r\n0\r\n\r\n" + smuggled)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert message in answer and b"Connection: close" in answer
    assert answer.count(b"HTTP/1.1") == 1 and not answer.endswith(b"<still open>")


def test_a_stalled_body_is_cut_off(cloudshell_emulator: Emulator, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(server, "BODY_TIMEOUT_SECONDS", 0.3)
    started = time.monotonic()
    answer = post(cloudshell_emulator, "Content-Length: 100\r\n", b"<GetServerDateAndTime>")
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.3 s" in answer
    assert time.monotonic() - started < 3


def test_stop_ends_calls_in_flight_and_leaves_no_threads_or_ports():
    before = set(threading.enumerate())
    emu = Emulator(port=0, quali_port=0).start()
    api = emu.session(max_attempts=1)
    emu.control.configure(latency={"distribution": "fixed", "seconds": 30})
    outcome: List[BaseException] = []

    def call() -> None:
        try:
            api.GetServerDateAndTime()
        except BaseException as error:  # reported through the assertions below
            outcome.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    while emu.control.call_counts().get("GetServerDateAndTime", 0) < 1:
        time.sleep(0.01)
    started = time.monotonic()
    emu.stop()
    assert time.monotonic() - started < 2  # the call's 30 s latency did not hold up stop()
    caller.join(timeout=5)
    assert [type(error) for error in outcome] == [ProtocolError]  # dropped, never answered
    assert set(threading.enumerate()) - before == set()
    for port in (emu.port, emu.quali_port):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))  # free again


def test_a_quali_login_that_is_not_utf8_is_a_failed_login(cloudshell_emulator: Emulator):
    body = b"username=admin&password=\xff\xfe"
    answer = exchange(
        cloudshell_emulator.quali_port,
        b"PUT /API/Auth/Login HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body),
    )
    assert answer.startswith(b"HTTP/1.1 401") and b"Login failed" in answer
