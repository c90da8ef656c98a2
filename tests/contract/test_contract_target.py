"""Pointing the suite at a server: bad settings and unreachable hosts fail at once, with what to check.

These tests need no server: they point the suite at a loopback port that is bound but not
listening, where every connection is refused.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Dict, Iterator

import pytest
import urllib3
from contract_support import ROOT, Target, TargetError, check_reachable, live_target

pytestmark = [pytest.mark.integration, pytest.mark.contract]

SECRET = "Contract-S3cret-pw"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else gets it) but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def live_env(port: int) -> Dict[str, str]:
    """This environment pointed at 127.0.0.1:``port`` (the caller's own CLOUDSHELL_TEST_* dropped)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CLOUDSHELL_TEST_")}
    env.update(
        CLOUDSHELL_TEST_HOST="127.0.0.1", CLOUDSHELL_TEST_API_PORT=str(port), CLOUDSHELL_TEST_PASSWORD=SECRET
    )
    return env


def test_check_reachable_names_the_address_and_the_variables(closed_port: int) -> None:
    with pytest.raises(TargetError) as caught:
        check_reachable("127.0.0.1", closed_port, "CloudShell Automation API", "CLOUDSHELL_TEST_API_PORT")
    message = str(caught.value)
    assert f"127.0.0.1:{closed_port}" in message
    assert "CLOUDSHELL_TEST_API_PORT" in message and "CLOUDSHELL_TEST_HOST" in message


@pytest.mark.parametrize(
    "change, complaint",
    [
        ({"CLOUDSHELL_TEST_PASSWORD": ""}, "CLOUDSHELL_TEST_PASSWORD is not"),
        ({"CLOUDSHELL_TEST_API_PORT": "80x"}, "CLOUDSHELL_TEST_API_PORT='80x' must be a whole number"),
        ({"CLOUDSHELL_TEST_QUALI_PORT": "70000"}, "CLOUDSHELL_TEST_QUALI_PORT='70000' must be"),
    ],
)
def test_bad_settings_say_which_variable(change: Dict[str, str], complaint: str) -> None:
    env = {**live_env(8029), **change}
    with pytest.raises(TargetError, match=complaint) as caught:
        live_target(env)
    assert SECRET not in str(caught.value)


def test_settings_and_defaults() -> None:
    target = live_target(live_env(8029))
    assert target is not None
    assert (target.host, target.api_port, target.quali_port) == ("127.0.0.1", 8029, 9000)
    assert (target.user, target.domain, target.live) == ("admin", "Global", True)
    assert SECRET not in repr(target)
    assert live_target({}) is None  # no CLOUDSHELL_TEST_HOST: the emulator


@pytest.mark.client_timeout
def test_sessions_time_out_on_a_server_that_never_answers() -> None:
    """A server that accepts connections but never answers passes the TCP check: the session's own
    timeout must end the call (the client sets none of its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nobody reads or answers
        port = silent.getsockname()[1]
        check_reachable("127.0.0.1", port, "silent server", "nothing")
        target = Target("127.0.0.1", port, 9000, "admin", SECRET, "Global", live=True, timeout=0.5)
        with pytest.raises(urllib3.exceptions.HTTPError) as caught:
            target.session(max_attempts=1)  # the constructor logs on: the first call
    assert isinstance(caught.value, urllib3.exceptions.ReadTimeoutError) or isinstance(
        getattr(caught.value, "reason", None), urllib3.exceptions.ReadTimeoutError
    ), repr(caught.value)


def test_the_suite_fails_at_once_against_an_unreachable_server(closed_port: int) -> None:
    """The whole path: pytest on a contract test, with the variables pointing at a closed port."""
    test = (
        "tests/contract/test_contract_alias.py"
        "::test_adding_an_existing_alias_fails_with_code_100_already_exists"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", test],
        cwd=ROOT,
        env=live_env(closed_port),
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a hang, not a speed claim
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"cannot reach the CloudShell Automation API at 127.0.0.1:{closed_port}" in output, output
    assert "CLOUDSHELL_TEST_HOST and CLOUDSHELL_TEST_API_PORT" in output, output
    assert SECRET not in output
