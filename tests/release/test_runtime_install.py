"""``pip install cloudshell-mutex`` alone, in a clean Python 3.9 virtualenv: the lock, the driver mixin and
the orchestration helper import and take the lock against the emulator; the command line says which extra
it needs instead of failing with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from release_support import run, venv_python

pytestmark = [pytest.mark.dist, pytest.mark.integration]

#: What the extras bring and the runtime install must not (the CLI's, the packaging's, the driver extra's).
NOT_AT_RUNTIME = {
    "cloudshell-rest-api", "requests", "requests-toolbelt", "alive-progress", "attrs", "pyyaml", "tomli",
    "cloudshell-shell-core", "cloudshell-logging", "jsonpickle",
}  # fmt: skip

#: Runs in the runtime-only virtualenv: the three ways in, each taking the lock once.
SCRIPT = """
import importlib.util, json, sys, types

host, port, user, password, token, rid = sys.argv[1:7]
from cloudshell.api.cloudshell_api import CloudShellAPISession
from cloudshell_mutex import CohortMutex, MutexTimeout, ReservationMutex, ReservationRWLock, __version__
from cloudshell_mutex.driver import ReservationMutexMixin, with_reservation_mutex
from cloudshell_mutex.orchestration import report_left_behind_lock, sandbox_mutex

api = CloudShellAPISession(host=host, username=user, password=password, domain="Global", port=int(port))
with ReservationMutex(api, rid, owner="Runtime lock", timeout=30) as lock:
    assert lock.owned() and lock.holder() is not None

class Driver(ReservationMutexMixin):
    @with_reservation_mutex(timeout=30)
    def rewire(self, context):
        pass

# A driver gets shell-core's context classes; the mixin reads only these fields.
context = types.SimpleNamespace(
    connectivity=types.SimpleNamespace(server_address=host, cloudshell_api_port=port, admin_auth_token=token),
    resource=types.SimpleNamespace(name="Router A"),
    reservation=types.SimpleNamespace(reservation_id=rid, domain="Global", owner_user=user),
)
driver = Driver()
driver.rewire(context)
driver.close_reservation_mutex_sessions()

sandbox = types.SimpleNamespace(automation_api=api, id=rid)
with sandbox_mutex(sandbox, owner="Setup", timeout=30):
    pass

print(json.dumps({
    "python": list(sys.version_info[:2]),
    "version": __version__,
    "timeout_is_timeouterror": issubclass(MutexTimeout, TimeoutError),
    "extras_present": [
        m for m in ("yaml", "tomli", "cloudshell.rest", "cloudshell.shell") if importlib.util.find_spec(m)
    ],
}))
"""


def installed(venv: Path) -> set:
    listed = run([str(venv_python(venv)), "-m", "pip", "list", "--format=json"])
    assert listed.returncode == 0, listed.stderr
    return {item["name"].lower().replace("_", "-") for item in json.loads(listed.stdout)}


def test_the_runtime_install_has_none_of_the_extras(runtime_venv: Path) -> None:
    names = installed(runtime_venv)
    assert {"cloudshell-mutex", "cloudshell-automation-api", "filelock"} <= names
    assert not names & NOT_AT_RUNTIME
    checked = run([str(venv_python(runtime_venv)), "-m", "pip", "check"])
    assert checked.returncode == 0, checked.stdout


def test_the_lock_the_mixin_and_the_helper_work_with_the_runtime_install_alone(
    runtime_venv: Path, cloudshell_emulator_factory, original_package_zip, tmp_path: Path
) -> None:
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    reservation_id = emu.create_reservation("runtime")
    (tmp_path / "script.py").write_text(SCRIPT)
    logon = [emu.host, str(emu.port), emu.admin_user, emu.admin_password]
    arguments = [*logon, emu.issue_token(), reservation_id]
    result = run([str(venv_python(runtime_venv)), str(tmp_path / "script.py"), *arguments], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["python"] == [3, 9]
    assert report["timeout_is_timeouterror"] is True
    assert report["extras_present"] == []  # neither the CLI's modules nor shell-core are there
    owners = [
        event["attributes"].get("Mutex Owner", "").split("@")[0]
        for event in emu.control.events(reservation_id)
        if event["alias"] == "MUTEX" and event["op"] == "service_added"
    ]
    assert owners == ["Runtime lock", "Router A rewire", "Setup"]
    assert emu.control.reservation(reservation_id)["services"] == []


@pytest.mark.parametrize("arguments", [["--help"], ["install"], ["status", "some-reservation"], ["package"]])
def test_the_command_line_names_the_extra_to_install(runtime_venv: Path, arguments) -> None:
    command = runtime_venv / "bin" / "cloudshell-mutex"
    result = run([str(command), *arguments])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: the cloudshell-mutex command needs the 'cli' extra")
    assert "pip install 'cloudshell-mutex[cli]'" in result.stderr
